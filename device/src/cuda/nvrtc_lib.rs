//! NVRTC, opened at run time by sncl itself (not through cudarc).
//!
//! cudarc's loader derives the NVRTC file names it tries from its CUDA
//! version feature: with `cuda-12080` it tries `libnvrtc.so`,
//! `libnvrtc.so.12`, `.11`, ... but never `libnvrtc.so.13`, and it panics
//! when a symbol is missing. sncl needs NVRTC 13 (the CUDA 13 toolkit and
//! the `nvidia-cuda-nvrtc` 13 wheel ship only `libnvrtc.so.13`) and NVRTC
//! 12, so this module opens `libnvrtc.so.13`, then `libnvrtc.so.12`, then
//! `libnvrtc.so`, by name (the loader's search path: `LD_LIBRARY_PATH`,
//! the cache) and then under `$CUDA_HOME`, `$CUDA_PATH` and
//! `/usr/local/cuda`. The handful of functions used have the same C ABI in
//! NVRTC 12 and 13, and every one is resolved when the library is opened,
//! so a missing symbol is an error, not a panic.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::{DeviceError, Result};

/// File names tried, newest first.
const NAMES: [&str; 3] = ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];

type NvrtcResult = c_int;
type Program = *mut c_void;

/// The NVRTC entry points sncl calls, resolved once.
struct Api {
    get_error_string: unsafe extern "C" fn(NvrtcResult) -> *const c_char,
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> NvrtcResult,
    create_program: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> NvrtcResult,
    destroy_program: unsafe extern "C" fn(*mut Program) -> NvrtcResult,
    compile_program: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> NvrtcResult,
    get_ptx_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    get_ptx: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    get_cubin_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    get_cubin: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    get_log_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    get_log: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
}

/// The opened library: its entry points, its version and where it was found.
pub(crate) struct Nvrtc {
    api: Api,
    // Keeps the entry points above valid; never unloaded.
    _lib: libloading::Library,
    /// `(major, minor)` from `nvrtcVersion`.
    pub(crate) version: (i32, i32),
    /// The file that was opened (a bare name where the loader's search found
    /// it, a full path otherwise).
    pub(crate) path: PathBuf,
}

impl std::fmt::Debug for Nvrtc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nvrtc")
            .field("version", &self.version)
            .field("path", &self.path)
            .finish()
    }
}

/// What a successful compile produced.
pub(crate) struct Output {
    pub(crate) ptx: String,
    pub(crate) cubin: Option<Vec<u8>>,
    pub(crate) log: String,
}

/// NVRTC, opened on first use; the error is kept and repeated.
pub(crate) fn get() -> Result<&'static Nvrtc> {
    static LIB: OnceLock<std::result::Result<Nvrtc, String>> = OnceLock::new();
    LIB.get_or_init(open)
        .as_ref()
        .map_err(|detail| DeviceError::NoNvrtc {
            detail: detail.clone(),
        })
}

/// The files to try, in order.
fn candidates() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = NAMES.iter().map(PathBuf::from).collect();
    for root in crate::toolkit_paths::cuda_roots() {
        for sub in ["lib64", "lib"] {
            for name in NAMES {
                out.push(root.join(sub).join(name));
            }
        }
    }
    out
}

fn open() -> std::result::Result<Nvrtc, String> {
    let mut tried = Vec::new();
    for path in candidates() {
        if path.is_absolute() && !path.exists() {
            continue;
        }
        // SAFETY: loading NVRTC runs its initialisers, which only set up the
        // library's own state; nothing else in this process defines these
        // symbols.
        match unsafe { libloading::Library::new(&path) } {
            Ok(lib) => return resolve(lib, path),
            Err(e) => tried.push(format!("{}: {e}", path.display())),
        }
    }
    Err(format!(
        "tried {}; install CUDA 12 or 13 (NVRTC) or put the directory holding libnvrtc.so.13 on LD_LIBRARY_PATH",
        tried.join("; ")
    ))
}

fn resolve(lib: libloading::Library, path: PathBuf) -> std::result::Result<Nvrtc, String> {
    macro_rules! sym {
        ($name:literal) => {{
            // SAFETY: the symbol is NVRTC's C function of that name, and the
            // field it is stored in has the function's C signature (nvrtc.h,
            // identical in NVRTC 12 and 13). The pointer stays valid because
            // the library is stored beside it and never unloaded.
            let s = unsafe { lib.get(concat!($name, "\0").as_bytes()) };
            *s.map_err(|e| format!("{}: missing {}: {e}", path.display(), $name))?
        }};
    }
    let api = Api {
        get_error_string: sym!("nvrtcGetErrorString"),
        version: sym!("nvrtcVersion"),
        create_program: sym!("nvrtcCreateProgram"),
        destroy_program: sym!("nvrtcDestroyProgram"),
        compile_program: sym!("nvrtcCompileProgram"),
        get_ptx_size: sym!("nvrtcGetPTXSize"),
        get_ptx: sym!("nvrtcGetPTX"),
        get_cubin_size: sym!("nvrtcGetCUBINSize"),
        get_cubin: sym!("nvrtcGetCUBIN"),
        get_log_size: sym!("nvrtcGetProgramLogSize"),
        get_log: sym!("nvrtcGetProgramLog"),
    };
    let (mut major, mut minor) = (0, 0);
    // SAFETY: both out-pointers point at live c_ints.
    let r = unsafe { (api.version)(&mut major, &mut minor) };
    if r != 0 {
        return Err(format!("{}: nvrtcVersion returned {r}", path.display()));
    }
    tracing::debug!(path = %path.display(), major, minor, "NVRTC loaded");
    Ok(Nvrtc {
        api,
        _lib: lib,
        version: (major, minor),
        path,
    })
}

/// A program handle destroyed on drop.
struct ProgramGuard<'a> {
    nvrtc: &'a Nvrtc,
    prog: Program,
}

impl Drop for ProgramGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: `prog` came from nvrtcCreateProgram and is destroyed once,
        // here.
        unsafe { (self.nvrtc.api.destroy_program)(&mut self.prog) };
    }
}

impl Nvrtc {
    /// The directory the library was found in, where known (for finding
    /// the CUDA headers beside it).
    pub(crate) fn dir(&self) -> Option<PathBuf> {
        if self.path.is_absolute() {
            return self.path.parent().map(Path::to_path_buf);
        }
        let name = self.path.file_name()?;
        let paths = crate::toolkit_paths::process_var("LD_LIBRARY_PATH")?;
        std::env::split_paths(&paths).find(|d| d.join(name).exists())
    }

    fn error(&self, call: &str, r: NvrtcResult) -> String {
        // SAFETY: nvrtcGetErrorString accepts any value and returns a
        // static NUL-terminated string (or null).
        let text = unsafe { (self.api.get_error_string)(r) };
        let text = if text.is_null() {
            "unknown error".to_string()
        } else {
            // SAFETY: non-null, NUL-terminated and static (see above).
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned()
        };
        format!("{call} failed: {text} ({r})")
    }

    /// Compiles `source` (program name `name`) with `headers` as
    /// (include name, text) and `options`. `Ok(Err(log))` is a compile
    /// error with NVRTC's log; `Err` is a failure of NVRTC itself.
    pub(crate) fn compile(
        &self,
        name: &str,
        source: &str,
        headers: &[(&str, &str)],
        options: &[String],
        want_cubin: bool,
    ) -> std::result::Result<std::result::Result<Output, String>, String> {
        let cstr = |s: &str, what: &str| {
            CString::new(s).map_err(|_| format!("{what} contains a NUL byte"))
        };
        let c_source = cstr(source, "the kernel source")?;
        let c_name = cstr(name, "the program name")?;
        let c_headers = headers
            .iter()
            .map(|(n, t)| Ok((cstr(n, "a header name")?, cstr(t, "a header")?)))
            .collect::<std::result::Result<Vec<_>, String>>()?;
        let header_texts: Vec<*const c_char> = c_headers.iter().map(|(_, t)| t.as_ptr()).collect();
        let header_names: Vec<*const c_char> = c_headers.iter().map(|(n, _)| n.as_ptr()).collect();
        let c_options = options
            .iter()
            .map(|o| cstr(o, "an option"))
            .collect::<std::result::Result<Vec<_>, String>>()?;
        let option_ptrs: Vec<*const c_char> = c_options.iter().map(|o| o.as_ptr()).collect();
        let count =
            |n: usize| c_int::try_from(n).map_err(|_| "too many headers or options".to_string());

        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: every pointer is a live NUL-terminated string owned by the
        // vectors above for the whole call; the header arrays have
        // `headers.len()` entries each.
        let r = unsafe {
            (self.api.create_program)(
                &mut prog,
                c_source.as_ptr(),
                c_name.as_ptr(),
                count(header_texts.len())?,
                or_null(&header_texts),
                or_null(&header_names),
            )
        };
        if r != 0 {
            return Err(self.error("nvrtcCreateProgram", r));
        }
        let guard = ProgramGuard { nvrtc: self, prog };
        // SAFETY: `prog` is live; the options array has `option_ptrs.len()`
        // live strings.
        let compiled = unsafe {
            (self.api.compile_program)(guard.prog, count(option_ptrs.len())?, option_ptrs.as_ptr())
        };
        let log = self.read(
            &guard,
            "nvrtcGetProgramLog",
            self.api.get_log_size,
            self.api.get_log,
        )?;
        let log = text(log);
        if compiled != 0 {
            let why = self.error("nvrtcCompileProgram", compiled);
            return Ok(Err(format!("{why}\n{log}")));
        }
        let ptx = text(self.read(
            &guard,
            "nvrtcGetPTX",
            self.api.get_ptx_size,
            self.api.get_ptx,
        )?);
        let cubin = if want_cubin {
            let bin = self.read(
                &guard,
                "nvrtcGetCUBIN",
                self.api.get_cubin_size,
                self.api.get_cubin,
            )?;
            (!bin.is_empty()).then_some(bin)
        } else {
            None
        };
        Ok(Ok(Output { ptx, cubin, log }))
    }

    /// Reads one of the program's outputs through its size/get pair.
    fn read(
        &self,
        guard: &ProgramGuard<'_>,
        call: &str,
        size_fn: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
        get_fn: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    ) -> std::result::Result<Vec<u8>, String> {
        let mut size = 0usize;
        // SAFETY: `guard.prog` is live; `size` is a live out-pointer.
        let r = unsafe { size_fn(guard.prog, &mut size) };
        if r != 0 {
            return Err(self.error(call, r));
        }
        let mut buf = vec![0u8; size];
        if size > 0 {
            // SAFETY: `buf` has exactly the `size` bytes NVRTC asked for.
            let r = unsafe { get_fn(guard.prog, buf.as_mut_ptr().cast()) };
            if r != 0 {
                return Err(self.error(call, r));
            }
        }
        Ok(buf)
    }
}

/// The array's start, or null for no entries (as nvrtc.h documents).
fn or_null(v: &[*const c_char]) -> *const *const c_char {
    if v.is_empty() {
        std::ptr::null()
    } else {
        v.as_ptr()
    }
}

/// NVRTC's NUL-terminated text as a String.
fn text(mut bytes: Vec<u8>) -> String {
    while bytes.last() == Some(&0) {
        bytes.pop();
    }
    String::from_utf8_lossy(&bytes).into_owned()
}
