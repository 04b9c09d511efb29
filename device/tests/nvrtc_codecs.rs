//! NVRTC checks of the codec kernels without a GPU: the codec source
//! (kernels/cuda/sncl_codec.cu) compiles for sm_80 and sm_90, holds every
//! kernel `kernels::cuda_codec` names, and ptxas -v reports no spills.
//! Compile times are printed. Helpers: common/nvrtc.rs (skips, saying why,
//! where pip cannot install NVRTC).

#[path = "common/nvrtc.rs"]
mod nvrtc_common;

use nvrtc_common::{compile_timed, in_child, ptxas_check, sm, spill_counts, ARCHES};

#[test]
fn codec_kernels_compile_for_sm80_and_sm90_without_spills() {
    if !in_child("codec_kernels_compile_for_sm80_and_sm90_without_spills") {
        return;
    }
    let names = kernels::cuda_codec::kernel_names();
    for arch in ARCHES {
        let (m, ms) = compile_timed(
            kernels::cuda_codec::CODEC_SOURCE,
            &kernels::cuda_codec::codec_headers(),
            arch,
        );
        eprintln!(
            "sncl codec kernels, {}: {ms:.0} ms, target {}, cubin {} bytes, ptx {} bytes",
            sm(arch),
            m.target,
            m.cubin.as_ref().map_or(0, Vec::len),
            m.ptx.len()
        );
        assert!(m.cubin.is_some(), "no CUBIN for {}", sm(arch));
        let missing: Vec<&String> = names
            .iter()
            .filter(|n| !m.ptx.contains(&format!(".entry {n}(")))
            .collect();
        assert!(
            missing.is_empty(),
            "{} of {} codec kernels missing from the PTX for {}: {missing:?}",
            missing.len(),
            names.len(),
            sm(arch)
        );
        assert_eq!(
            m.ptx.matches(".entry ").count(),
            names.len(),
            "the PTX holds kernels kernels::cuda_codec does not name"
        );
        ptxas_check(&m.ptx, arch, "sncl_codec");
    }
}

#[test]
fn spill_lines_parse() {
    let log = "ptxas info    : Function properties for k\n    0 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n";
    assert_eq!(spill_counts(log), vec![8, 4]);
}
