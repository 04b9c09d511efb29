//! libFuzzer harness for every target of `sncl-fuzz`: the environment
//! variable `SNCL_FUZZ_TARGET` names the one to run (scripts/fuzz.sh sets
//! it), so one instrumented build serves them all.
#![no_main]

use std::sync::OnceLock;

fn chosen() -> sncl_fuzz::Target {
    static TARGET: OnceLock<sncl_fuzz::Target> = OnceLock::new();
    *TARGET.get_or_init(|| {
        let name = std::env::var("SNCL_FUZZ_TARGET").unwrap_or_default();
        sncl_fuzz::target(&name).unwrap_or_else(|| {
            let names: Vec<&str> = sncl_fuzz::TARGETS.iter().map(|t| t.0).collect();
            panic!("SNCL_FUZZ_TARGET={name:?} is not a target; one of {names:?}")
        })
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| chosen()(data));
