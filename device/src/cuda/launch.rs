//! Kernel launches: the reduce-copy ABI struct, the launch shape, and the
//! per-device module with its functions looked up once by name.

use std::collections::HashMap;
use std::ffi::{c_void, CString};

use cudarc::driver::sys::{CUfunction, CUmodule};
use kernels::cuda::{BLOCK_THREADS, MAX_ARGS};

use super::driver;
use crate::nvrtc::CompiledModule;
use crate::{DevicePtr, Result};

/// Rust mirror of the kernels' `SnclReduceCopyArgs` (passed by value as the
/// reduce-copy kernels' only parameter): 8 + 8 pointers, the element
/// count, and how many sources and destinations are used.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ReduceCopyArgs {
    pub(crate) srcs: [u64; MAX_ARGS],
    pub(crate) dsts: [u64; MAX_ARGS],
    pub(crate) count: u64,
    pub(crate) nsrcs: i32,
    pub(crate) ndsts: i32,
}

const _: () = assert!(std::mem::size_of::<ReduceCopyArgs>() == 144);
const _: () = assert!(std::mem::align_of::<ReduceCopyArgs>() == 8);
const _: () = assert!(MAX_ARGS == crate::MAX_REDUCE_ARGS);

impl ReduceCopyArgs {
    /// The struct for `srcs` and `dsts` (1 to [`MAX_ARGS`] of each, checked
    /// by the caller); unused slots are null.
    pub(crate) fn new(srcs: &[DevicePtr], dsts: &[DevicePtr], count: usize) -> ReduceCopyArgs {
        let mut a = ReduceCopyArgs {
            count: count as u64,
            nsrcs: srcs.len() as i32,
            ndsts: dsts.len() as i32,
            ..Default::default()
        };
        for (slot, p) in a.srcs.iter_mut().zip(srcs) {
            *slot = p.0;
        }
        for (slot, p) in a.dsts.iter_mut().zip(dsts) {
            *slot = p.0;
        }
        a
    }
}

/// The grid for `count` elements of `elem_size` bytes: one 16-byte pack per
/// thread per block-stride, at most 8 blocks per SM (the kernels loop over
/// the rest), at least one block.
pub(crate) fn grid(count: usize, elem_size: usize, sm_count: u32) -> u32 {
    let per_pack = (16 / elem_size.max(1)).max(1) as u64;
    let per_block = u64::from(BLOCK_THREADS) * per_pack;
    let blocks = (count as u64).div_ceil(per_block);
    let cap = u64::from(sm_count.max(1)) * 8;
    blocks.clamp(1, cap) as u32
}

/// The bytes `cuModuleLoadData` takes: the CUBIN, else the PTX with its
/// terminating NUL.
pub(crate) fn image(m: &CompiledModule) -> Vec<u8> {
    match &m.cubin {
        Some(c) => c.clone(),
        None => {
            let mut p = m.ptx.as_bytes().to_vec();
            p.push(0);
            p
        }
    }
}

/// A loaded module and the functions found in it so far.
pub(crate) struct Kernels {
    pub(crate) module: CUmodule,
    functions: HashMap<String, CUfunction>,
}

impl Kernels {
    pub(crate) fn new(module: CUmodule) -> Kernels {
        Kernels {
            module,
            functions: HashMap::new(),
        }
    }

    /// The function `name`, looked up in the module on first use.
    pub(crate) fn function(&mut self, ordinal: usize, name: &str) -> Result<CUfunction> {
        if let Some(f) = self.functions.get(name) {
            return Ok(*f);
        }
        let c = CString::new(name).map_err(|_| crate::DeviceError::InvalidArgument {
            ordinal,
            call: "cuModuleGetFunction",
            detail: format!("kernel name {name:?} contains a NUL byte"),
        })?;
        let f = driver::module_function(ordinal, self.module, &c)?;
        self.functions.insert(name.to_string(), f);
        Ok(f)
    }
}

/// Pointers to each kernel parameter, as `cuLaunchKernel` takes them.
pub(crate) fn param<T>(v: &mut T) -> *mut c_void {
    (v as *mut T).cast()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_layout_matches_the_c_struct() {
        let a = ReduceCopyArgs::new(&[DevicePtr(0x10), DevicePtr(0x20)], &[DevicePtr(0x30)], 77);
        assert_eq!(std::mem::size_of_val(&a), 144);
        // Field offsets of the C struct: srcs 0, dsts 64, count 128,
        // nsrcs 136, ndsts 140.
        let base = &a as *const ReduceCopyArgs as usize;
        assert_eq!(&a.dsts as *const _ as usize - base, 64);
        assert_eq!(&a.count as *const _ as usize - base, 128);
        assert_eq!(&a.nsrcs as *const _ as usize - base, 136);
        assert_eq!(&a.ndsts as *const _ as usize - base, 140);
        assert_eq!(a.srcs[..3], [0x10, 0x20, 0]);
        assert_eq!(a.dsts[..2], [0x30, 0]);
        assert_eq!((a.count, a.nsrcs, a.ndsts), (77, 2, 1));
    }

    #[test]
    fn grid_covers_small_counts_and_caps_large_ones() {
        assert_eq!(grid(0, 4, 132), 1);
        assert_eq!(grid(1, 4, 132), 1);
        // 256 threads x 4 floats per 16-byte pack = 1024 per block.
        assert_eq!(grid(1024, 4, 132), 1);
        assert_eq!(grid(1025, 4, 132), 2);
        assert_eq!(grid(1 << 30, 4, 132), 132 * 8);
        // 1-byte types: 16 per pack; 8-byte: 2.
        assert_eq!(grid(4096, 1, 132), 1);
        assert_eq!(grid(4096, 8, 132), 8);
        assert_eq!(grid(usize::MAX, 2, 0), 8);
    }

    #[test]
    fn ptx_images_are_nul_terminated() {
        let m = CompiledModule {
            cubin: None,
            ptx: ".entry k".into(),
            log: String::new(),
            target: "compute_90".into(),
        };
        assert_eq!(image(&m).last(), Some(&0));
        let c = CompiledModule {
            cubin: Some(vec![1, 2]),
            ..m
        };
        assert_eq!(image(&c), vec![1, 2]);
    }
}
