//! Modules and functions: what NVRTC produced for sncl's kernel sources,
//! matched by name to the same sources compiled for the host.
//!
//! Rules (Driver API, "Module Management"; CUDA C++ Programming Guide,
//! "Lazy Loading"):
//! * `cuModuleLoadData` takes a CUBIN (an ELF image) or NUL-terminated PTX;
//!   anything else is `CUDA_ERROR_INVALID_IMAGE`;
//! * `cuModuleGetFunction` of a name the module lacks is
//!   `CUDA_ERROR_NOT_FOUND`;
//! * loading code into a context may synchronise the device: with
//!   `CUDA_MODULE_LOADING=EAGER` in `cuModuleLoadData`, with LAZY (the
//!   default since CUDA 12.2 on Linux) at each function's first lookup —
//!   "Loading kernels might require context synchronization";
//! * `cuModuleUnload` frees the module's device memory (synchronising, as
//!   a free may).

use std::collections::HashSet;
use std::ffi::{c_char, CStr};
use std::sync::{Arc, Mutex};

use crate::config::Loading;
use crate::handles::{lock, Table};
use crate::host_kernels::Family;
use crate::{config, context, report, sync, CUresult, Res};

/// A loaded module.
pub struct Module {
    /// Its context.
    pub context: u64,
    /// Its device.
    pub device: usize,
    /// The kernel names in its image.
    pub names: HashSet<String>,
    /// The functions already loaded (lazy loading).
    pub loaded: Mutex<HashSet<String>>,
}

/// A function of a module.
pub struct Function {
    /// Its module's handle.
    pub module: u64,
    /// Its context.
    pub context: u64,
    /// Its device.
    pub device: usize,
    /// Its name.
    pub name: std::ffi::CString,
    /// Which host kernel family runs it.
    pub family: Family,
}

/// Every live module.
pub static MODULES: Table<Module> = Table::new(0x0d0d_0000_0000);
/// Every function looked up.
pub static FUNCTIONS: Table<Function> = Table::new(0x0f0f_0000_0000);

/// The kernel names in a PTX text: `.entry NAME(`.
fn ptx_entries(text: &str) -> HashSet<String> {
    text.split(".entry")
        .skip(1)
        .filter_map(|rest| {
            let name: String = rest
                .trim_start()
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '$')
                .collect();
            (!name.is_empty()).then_some(name)
        })
        .collect()
}

/// The function symbols of a CUBIN.
fn cubin_entries(image: &[u8]) -> Res<HashSet<String>> {
    use object::{Object, ObjectSymbol, SymbolKind};
    let file = object::File::parse(image).map_err(|_| CUresult::CUDA_ERROR_INVALID_IMAGE)?;
    Ok(file
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.is_global())
        .filter_map(|s| s.name().ok().map(str::to_string))
        .collect())
}

/// The length of the ELF image at `p`: its section header table ends it
/// (NVRTC's CUBINs put it last).
///
/// # Safety
/// `p` points at a complete ELF64 image.
unsafe fn elf_len(p: *const u8) -> usize {
    // SAFETY: the caller's contract; the ELF64 header is 64 bytes.
    let h = unsafe { std::slice::from_raw_parts(p, 64) };
    let shoff = u64::from_le_bytes(h[0x28..0x30].try_into().expect("8 bytes")) as usize;
    let shentsize = u16::from_le_bytes([h[0x3a], h[0x3b]]) as usize;
    let shnum = u16::from_le_bytes([h[0x3c], h[0x3d]]) as usize;
    let phoff = u64::from_le_bytes(h[0x20..0x28].try_into().expect("8 bytes")) as usize;
    let phentsize = u16::from_le_bytes([h[0x36], h[0x37]]) as usize;
    let phnum = u16::from_le_bytes([h[0x38], h[0x39]]) as usize;
    (shoff + shentsize * shnum)
        .max(phoff + phentsize * phnum)
        .max(64)
}

/// `cuModuleLoadData`.
///
/// # Safety
/// `image` is null or points at a CUBIN or a NUL-terminated PTX text.
pub unsafe fn load_data(image: *const u8) -> Res<u64> {
    let ctx = context::current()?;
    if image.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's contract: at least 4 bytes of either form.
    let magic = unsafe { std::slice::from_raw_parts(image, 4) };
    let names = if magic == b"\x7fELF" {
        // SAFETY: the caller's contract (a whole ELF image).
        let len = unsafe { elf_len(image) };
        // SAFETY: as above, `len` bytes from the image's own headers.
        cubin_entries(unsafe { std::slice::from_raw_parts(image, len) })?
    } else {
        // SAFETY: the caller's contract: NUL-terminated PTX.
        let text = unsafe { CStr::from_ptr(image as *const c_char) };
        let text = text
            .to_str()
            .map_err(|_| CUresult::CUDA_ERROR_INVALID_IMAGE)?;
        if !text.contains(".version") || !text.contains(".target") {
            return Err(CUresult::CUDA_ERROR_INVALID_IMAGE);
        }
        ptx_entries(text)
    };
    if config::get().loading == Loading::Eager {
        sync::device(ctx.device, "cuModuleLoadData")?;
    }
    report::event("module_loads");
    let eager = config::get().loading == Loading::Eager;
    let loaded = if eager { names.clone() } else { HashSet::new() };
    Ok(MODULES.insert(Arc::new(Module {
        context: ctx.handle,
        device: ctx.device,
        names,
        loaded: Mutex::new(loaded),
    })))
}

/// `cuModuleGetFunction`.
pub fn get_function(module: u64, name: &CStr) -> Res<u64> {
    let ctx = context::current()?;
    let m = MODULES.get(module)?;
    if m.context != ctx.handle {
        return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
    }
    let text = name.to_str().map_err(|_| CUresult::CUDA_ERROR_NOT_FOUND)?;
    if !m.names.contains(text) {
        return Err(CUresult::CUDA_ERROR_NOT_FOUND);
    }
    let family = Family::of(name).ok_or_else(|| {
        crate::log_line(&format!(
            "cuModuleGetFunction: kernel {text} has no host build in the model"
        ));
        CUresult::CUDA_ERROR_NOT_FOUND
    })?;
    let first = !lock(&m.loaded).contains(text);
    if first {
        // Lazy loading: this function's code is loaded now.
        sync::device(m.device, "cuModuleGetFunction")?;
        lock(&m.loaded).insert(text.to_string());
        report::event("function_loads");
    }
    Ok(FUNCTIONS.insert(Arc::new(Function {
        module,
        context: m.context,
        device: m.device,
        name: name.to_owned(),
        family,
    })))
}

/// `cuModuleUnload`.
pub fn unload(module: u64) -> Res<()> {
    let m = MODULES.get(module)?;
    sync::device(m.device, "cuModuleUnload")?;
    // The module's function handles die with it: a launch checks that its
    // module is still loaded.
    MODULES.remove(module)?;
    report::event("module_unloads");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptx_entries_are_found() {
        let ptx = ".version 8.0\n.target sm_90\n.visible .entry sncl_divide_f32(\n.param .u64 a\n)\n.entry k2 (";
        let names = ptx_entries(ptx);
        assert!(names.contains("sncl_divide_f32"), "{names:?}");
        assert!(names.contains("k2"), "{names:?}");
        assert_eq!(names.len(), 2);
    }
}
