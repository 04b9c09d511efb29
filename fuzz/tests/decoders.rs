//! Every decoder of outside bytes under proptest (arbitrary byte strings
//! and mutated valid inputs), quick enough for every CI run, plus a replay
//! of every crash input ever found (`fuzz/regressions/`). The long runs use
//! the `sncl-fuzz` driver (docs/FUZZING.md).

use proptest::prelude::*;
use sncl_fuzz::{seeds, target, TARGETS};

/// Arbitrary bytes, or a seed with a few bytes overwritten.
fn input(name: &'static str) -> impl Strategy<Value = Vec<u8>> {
    let seeds = seeds(name);
    let mutated = (
        0..seeds.len().max(1),
        proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        any::<prop::sample::Index>(),
    )
        .prop_map(move |(i, edits, cut)| {
            let mut v = seeds.get(i).cloned().unwrap_or_default();
            if !v.is_empty() {
                for (at, b) in edits {
                    let k = at.index(v.len());
                    v[k] = b;
                }
                if cut.index(4) == 0 {
                    let n = cut.index(v.len() + 1);
                    v.truncate(n);
                }
            }
            v
        });
    prop_oneof![proptest::collection::vec(any::<u8>(), 0..300), mutated]
}

macro_rules! decoder_props {
    ($($name:ident: $cases:expr),* $(,)?) => {$(
        proptest! {
            #![proptest_config(ProptestConfig { cases: $cases, failure_persistence: None, ..ProptestConfig::default() })]
            #[test]
            fn $name(data in input(stringify!($name))) {
                (target(stringify!($name)).expect("target exists"))(&data);
            }
        }
    )*};
}

decoder_props! {
    store_frame: 32768,
    store_request: 32768,
    store_client: 32768,
    store_client_socket: 256,
    tcp_greeting: 32768,
    tcp_hello: 32768,
    tcp_hello_signed: 32768,
    tcp_ack: 32768,
    tcp_data: 32768,
    piece_header: 32768,
    shm_slot_header: 32768,
    nvlink_board: 32768,
    gdr_board: 32768,
    topofile: 32768,
    unique_id: 32768,
    settings_value: 8192,
    settings_file: 8192,
    agreement_set: 32768,
    setup_record: 32768,
}

#[test]
fn every_target_has_a_property_test_and_seeds() {
    let src = include_str!("decoders.rs");
    for (name, _) in TARGETS {
        assert!(
            src.contains(&format!("    {name}: ")),
            "{name} has no property test"
        );
        assert!(!seeds(name).is_empty(), "{name} has no seeds");
    }
}

/// Crash inputs found by the fuzzer, named `<target>-<anything>.bin`.
#[test]
fn regressions_do_not_crash() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("regressions");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("fuzz/regressions exists") {
        let path = entry.expect("readable entry").path();
        let file = path
            .file_name()
            .and_then(|f| f.to_str())
            .unwrap_or_default()
            .to_owned();
        let Some((name, _)) = file.split_once('-') else {
            continue;
        };
        let t = target(name).unwrap_or_else(|| panic!("{file}: no target {name}"));
        t(&std::fs::read(&path).expect("readable"));
        n += 1;
    }
    eprintln!("replayed {n} regression input(s)");
}
