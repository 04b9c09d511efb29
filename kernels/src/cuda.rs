//! The CUDA C++ sources of sncl's device kernels and their names. The same
//! sources are compiled by NVRTC for a GPU and, with `-DSNCL_HOST_EMU`, for
//! the host (the emulated device and the CPU checks).
//!
//! ABI: `sncl_reduce_copy_<dtype>_<op>(SnclReduceCopyArgs)` (up to
//! [`MAX_ARGS`] sources and destinations, `count` elements; see
//! `kernels/cuda/sncl_reduce.cu`) and
//! `sncl_divide_<dtype>(void* data, unsigned long long count, unsigned long long divisor)`.

use crate::{DataType, ReduceOp};

/// The reduce kernels' translation unit.
pub const REDUCE_SOURCE: &str = include_str!("../cuda/sncl_reduce.cu");

/// sncl's own headers that [`REDUCE_SOURCE`] includes, as (name, text), for
/// NVRTC's in-memory headers. The sources need no CUDA header (no include
/// path). The host shim (`sncl_host_emu.h`, included only with
/// `SNCL_HOST_EMU`) is not among them.
pub const HEADERS: &[(&str, &str)] =
    &[("sncl_device.cuh", include_str!("../cuda/sncl_device.cuh"))];

/// The direct all-reduce kernels' translation unit (nvlink version 2:
/// one-shot and two-shot over peers' IPC buffers; see
/// `kernels/cuda/sncl_direct.cu`). It includes only [`HEADERS`] and takes
/// [`dtype_options`] as [`REDUCE_SOURCE`] does.
pub const DIRECT_SOURCE: &str = include_str!("../cuda/sncl_direct.cu");

/// The most ranks of one direct all-reduce (`SNCL_DIRECT_MAX_RANKS`).
pub const DIRECT_MAX_RANKS: usize = 8;

/// The most blocks of one direct all-reduce launch, and the `u64`
/// counters of a rank's flag area (`SNCL_DIRECT_MAX_BLOCKS`).
pub const DIRECT_MAX_BLOCKS: usize = 64;

/// Bytes of LL lines in one block's slot of the LL region
/// (`SNCL_DIRECT_LL_BLOCK_BYTES`): at 4 lines of 8 bytes per 16 bytes of
/// data, 8 KiB of a block's data per operation.
pub const DIRECT_LL_BLOCK_BYTES: usize = 16384;

/// Which direct all-reduce a kernel runs (`SnclDirectArgs::algo`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DirectAlgo {
    /// Every rank reads every input whole and folds them (small messages).
    OneShot = 1,
    /// Rank r folds slice r, then every rank copies the other slices
    /// (medium and large messages).
    TwoShot = 2,
    /// One-shot through the kernel path's lane with NCCL's low-latency
    /// protocol: data and flag in one 8-byte store, no fence and no
    /// "ready" round (the smallest messages; staged, one round).
    LowLatency = 3,
}

impl DirectAlgo {
    /// `"oneshot"`, `"twoshot"` or `"ll"` (settings, logs, benchmarks).
    pub const fn name(self) -> &'static str {
        match self {
            DirectAlgo::OneShot => "oneshot",
            DirectAlgo::TwoShot => "twoshot",
            DirectAlgo::LowLatency => "ll",
        }
    }
}

/// The direct all-reduce kernel for `dtype` and `op`: `None` for the
/// bitwise ops (not offered); avg maps to the sum kernel (then a divide).
pub fn direct_kernel(dtype: DataType, op: ReduceOp) -> Option<String> {
    let op = match op {
        ReduceOp::Avg => ReduceOp::Sum,
        ReduceOp::Sum | ReduceOp::Prod | ReduceOp::Max | ReduceOp::Min => op,
        _ => return None,
    };
    op.supports(dtype)
        .then(|| format!("sncl_direct_all_reduce_{}_{}", dtype.name(), op.name()))
}

/// The most sources or destinations of one reduce-copy.
pub const MAX_ARGS: usize = 8;

/// The block size sncl launches its kernels with.
pub const BLOCK_THREADS: u32 = 256;

/// Every reduce-copy kernel's name with its dtype and op (avg has none: it
/// runs the sum kernel, then a divide).
pub fn reduce_copy_kernels() -> impl Iterator<Item = (DataType, ReduceOp, String)> {
    DataType::ALL.into_iter().flat_map(|dtype| {
        ReduceOp::ALL
            .into_iter()
            .filter_map(move |op| reduce_copy_kernel(dtype, op).map(|name| (dtype, op, name)))
    })
}

/// The reduce-copy kernel for `dtype` and `op`: `None` where the op is not
/// defined for the type; avg maps to the sum kernel.
pub fn reduce_copy_kernel(dtype: DataType, op: ReduceOp) -> Option<String> {
    if !op.supports(dtype) {
        return None;
    }
    let op = if op == ReduceOp::Avg {
        ReduceOp::Sum
    } else {
        op
    };
    Some(format!("sncl_reduce_copy_{}_{}", dtype.name(), op.name()))
}

/// The divide kernel (avg's final step) for `dtype`.
pub fn divide_kernel(dtype: DataType) -> String {
    format!("sncl_divide_{}", dtype.name())
}

/// The NVRTC options that compile [`REDUCE_SOURCE`] for `dtype` alone:
/// `-DSNCL_ONLY_DTYPE=<n>` with `n` the dtype's `ncclDataType_t` value. The
/// module then holds exactly `dtype`'s reduce-copy kernels
/// ([`reduce_copy_kernel`]) and its [`divide_kernel`]; without the option
/// the source holds every dtype's.
pub fn dtype_options(dtype: DataType) -> Vec<String> {
    vec![format!("-DSNCL_ONLY_DTYPE={}", dtype as u8)]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The source's per-dtype blocks use the same numbers as
    /// [`dtype_options`]: block `SNCL_WANT_DTYPE(n)` instantiates exactly
    /// the kernels of the dtype whose value is `n`.
    #[test]
    fn dtype_blocks_match_dtype_options() {
        for dtype in DataType::ALL {
            let opt = &dtype_options(dtype)[0];
            let n = opt.strip_prefix("-DSNCL_ONLY_DTYPE=").expect(opt);
            let guard = format!("#if SNCL_WANT_DTYPE({n})\n");
            let start = REDUCE_SOURCE
                .find(&guard)
                .unwrap_or_else(|| panic!("no {guard:?}"));
            let block = &REDUCE_SOURCE[start + guard.len()..];
            let block = &block[..block.find("#endif").expect("the block ends")];
            let name = dtype.name();
            assert!(
                block.contains(&format!("KERNELS(SNCL_DEFINE_REDUCE_KERNEL, {name})\n")),
                "{name}: {block}"
            );
            assert!(
                block.contains(&format!("SNCL_DEFINE_DIVIDE_KERNEL({name})\n")),
                "{name}: {block}"
            );
            let int = ReduceOp::BitAnd.supports(dtype);
            assert_eq!(block.contains("SNCL_INT_KERNELS"), int, "{name}: {block}");
            assert_eq!(block.matches("SNCL_DEFINE_").count(), 2, "{name}: {block}");
        }
        assert_eq!(
            REDUCE_SOURCE.matches("#if SNCL_WANT_DTYPE(").count(),
            DataType::ALL.len()
        );
    }

    /// Every `#include "..."` NVRTC sees (outside the host shim's `#ifdef`)
    /// is in [`HEADERS`], and every header is used.
    #[test]
    fn headers_cover_the_includes() {
        let mut texts = vec![REDUCE_SOURCE];
        texts.extend(HEADERS.iter().map(|(_, t)| *t));
        let mut included = std::collections::BTreeSet::new();
        for text in texts {
            let mut host_only = 0;
            for line in text.lines().map(str::trim) {
                if line.starts_with("#if") {
                    host_only += usize::from(host_only > 0 || line == "#ifdef SNCL_HOST_EMU");
                } else if line.starts_with("#else") && host_only == 1 {
                    host_only = 0;
                } else if line.starts_with("#endif") {
                    host_only = host_only.saturating_sub(1);
                } else if let Some(rest) = line.strip_prefix("#include \"") {
                    if host_only == 0 {
                        included.insert(rest.trim_end_matches('"').to_string());
                    }
                }
            }
        }
        let names: std::collections::BTreeSet<_> =
            HEADERS.iter().map(|(n, _)| n.to_string()).collect();
        assert_eq!(included, names);
        assert!(
            !REDUCE_SOURCE.contains("#include <"),
            "NVRTC gets no include path"
        );
    }

    /// The direct source's per-dtype blocks use [`dtype_options`]'s
    /// numbers, its limits are the Rust side's, and it includes only
    /// [`HEADERS`] outside the host shim.
    #[test]
    fn direct_source_matches_the_rust_side() {
        for dtype in DataType::ALL {
            let n = dtype as u8;
            let guard = format!("#if SNCL_DIRECT_WANT({n})\n");
            let start = DIRECT_SOURCE
                .find(&guard)
                .unwrap_or_else(|| panic!("no {guard:?}"));
            let block = &DIRECT_SOURCE[start + guard.len()..];
            let block = &block[..block.find("#endif").expect("the block ends")];
            assert_eq!(
                block.trim(),
                format!(
                    "#define SNCL_DIRECT_EMITTED\nSNCL_DIRECT_OPS(SNCL_DEFINE_DIRECT_KERNEL, {})",
                    dtype.name()
                )
            );
            assert!(direct_kernel(dtype, ReduceOp::Sum).is_some());
        }
        assert!(DIRECT_SOURCE.contains(&format!(
            "#define SNCL_DIRECT_MAX_RANKS {DIRECT_MAX_RANKS}\n"
        )));
        assert!(DIRECT_SOURCE.contains(&format!(
            "#define SNCL_DIRECT_MAX_BLOCKS {DIRECT_MAX_BLOCKS}\n"
        )));
        assert!(DIRECT_SOURCE.contains(&format!(
            "#define SNCL_DIRECT_LL_BLOCK_BYTES {DIRECT_LL_BLOCK_BYTES}\n"
        )));
        assert!(DIRECT_SOURCE.contains("#include \"sncl_device.cuh\"\n"));
        assert_eq!(
            direct_kernel(DataType::Float32, ReduceOp::Avg).as_deref(),
            Some("sncl_direct_all_reduce_float_sum")
        );
        assert_eq!(direct_kernel(DataType::Int32, ReduceOp::BitAnd), None);
    }

    #[test]
    fn names_cover_every_supported_pair_once() {
        let names: Vec<_> = reduce_copy_kernels().map(|(_, _, n)| n).collect();
        let unique: std::collections::BTreeSet<_> = names.iter().cloned().collect();
        // 12 dtypes x (sum prod max min) + 6 integer dtypes x 3 bitwise; avg
        // shares sum's kernel.
        assert_eq!(unique.len(), 12 * 4 + 6 * 3);
        assert_eq!(
            reduce_copy_kernel(DataType::Float32, ReduceOp::Avg).as_deref(),
            Some("sncl_reduce_copy_float_sum")
        );
        assert_eq!(
            reduce_copy_kernel(DataType::Float16, ReduceOp::BitAnd),
            None
        );
    }
}
