//! The C ABI's string inputs under proptest: arbitrary bytes and mutated
//! valid inputs, as sncl-fuzz does for every other decoder of outside bytes
//! (docs/FUZZING.md). These targets live here because only this crate can
//! call the C functions from Rust (it has no rlib for sncl-fuzz to link).

use std::ffi::{c_char, c_int, CString};

use comm_core::settings::SETTINGS;
use proptest::prelude::*;
use sncl_bootstrap::{UniqueId, UNIQUE_ID_BYTES};

use crate::*;

/// `snclGetSetting` with a name from the input and a buffer of
/// `data[0] % 64` bytes: success only for a declared name, `isSet` 0 or 1.
fn capi_get_setting(data: &[u8]) {
    let (sel, rest) = data.split_first().map_or((0, data), |(s, r)| (*s, r));
    let nul = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    let name = CString::new(&rest[..nul]).expect("no NUL before nul");
    let mut value = vec![0 as c_char; 64];
    let size = (sel % 64) as usize;
    let mut is_set: c_int = -1;
    // SAFETY: name is NUL-terminated; value has 64 >= size writable bytes.
    let r = unsafe { snclGetSetting(name.as_ptr(), value.as_mut_ptr(), size, &mut is_set) };
    if r == snclResult_t::snclSuccess {
        assert!(is_set == 0 || is_set == 1);
        assert!(comm_core::settings::lookup(name.to_str().expect("UTF-8")).is_some());
    }
}

/// `snclCommInitRank` with unique-id bytes from the input that the decoder
/// refuses (a valid id would start a real bootstrap): must be
/// `snclInvalidArgument`, never a crash, and the handle stays NULL.
fn capi_unique_id(data: &[u8]) {
    let mut b = [0u8; UNIQUE_ID_BYTES];
    let n = data.len().min(UNIQUE_ID_BYTES);
    b[..n].copy_from_slice(&data[..n]);
    if UniqueId::from_bytes(&b).is_ok() {
        return;
    }
    let id = snclUniqueId {
        internal: b.map(|x| x as c_char),
    };
    let mut comm: snclComm_t = std::ptr::null_mut();
    // SAFETY: comm is writable storage for a handle.
    let r = unsafe { snclCommInitRank(&mut comm, 2, id, 0) };
    assert_eq!(r, snclResult_t::snclInvalidArgument);
    assert!(comm.is_null());
}

/// Valid inputs of each target.
fn seeds(name: &str) -> Vec<Vec<u8>> {
    match name {
        "capi_get_setting" => SETTINGS
            .iter()
            .map(|s| [&[63u8][..], s.name.as_bytes()].concat())
            .collect(),
        _ => {
            let id = UniqueId::new(([127, 0, 0, 1], 29500).into()).expect("a unique id");
            vec![id.to_bytes().to_vec(), id.to_hex().into_bytes()]
        }
    }
}

/// Arbitrary bytes, or a seed with a few bytes overwritten (and maybe cut).
fn input(name: &'static str) -> impl Strategy<Value = Vec<u8>> {
    let seeds = seeds(name);
    let mutated = (
        0..seeds.len(),
        proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        any::<prop::sample::Index>(),
    )
        .prop_map(move |(i, edits, cut)| {
            let mut v = seeds[i].clone();
            for (at, b) in edits {
                let k = at.index(v.len());
                v[k] = b;
            }
            if cut.index(4) == 0 {
                v.truncate(cut.index(v.len() + 1));
            }
            v
        });
    prop_oneof![proptest::collection::vec(any::<u8>(), 0..300), mutated]
}

/// 8192 inputs per target, or `PROPTEST_CASES` (the long runs of
/// docs/FUZZING.md).
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8192)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn get_setting_survives_any_name(data in input("capi_get_setting")) {
        capi_get_setting(&data);
    }

    #[test]
    fn init_rank_refuses_any_bad_unique_id(data in input("capi_unique_id")) {
        capi_unique_id(&data);
    }
}
