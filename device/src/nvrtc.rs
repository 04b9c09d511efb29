//! Run-time compilation of sncl's CUDA C++ kernels with NVRTC, and a cache
//! of the results.
//!
//! [`compile`] builds a translation unit for one GPU architecture: a CUBIN
//! for `sm_XY` where NVRTC can make one, else PTX for `compute_XY` (which
//! the driver compiles when the module is loaded). Options:
//! `--gpu-architecture`, `-std=c++17`, `--fmad=false` (no fused
//! multiply-add contraction: results must match the CPU's bit for bit) and
//! `--include-path` for the CUDA headers (`cuda_fp16.h`, `cuda_bf16.h`:
//! the directory the caller names, `SNCL_CUDA_INCLUDE` through a
//! communicator's configuration, else [`cuda_include_dir`]).
//!
//! Results are cached in memory for the process and on disk in
//! `$XDG_CACHE_HOME/sncl/kernels` (else `~/.cache/sncl/kernels`; directory
//! mode 0700, files 0600, written to a temporary file and renamed into
//! place), keyed by the SHA-256 of the source, the headers, the NVRTC
//! version, the architecture and the options. A damaged or unreadable
//! cache entry is ignored and rebuilt.
//!
//! NVRTC is loaded at run time: `libnvrtc.so.13`, then `libnvrtc.so.12`,
//! then `libnvrtc.so` (see the CUDA backend's module docs).

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use sha2::{Digest, Sha256};

use crate::cuda::nvrtc_lib::{self, Nvrtc};
use crate::toolkit_paths::{cuda_roots, process_var};
use crate::{Arch, DeviceError, Result};

/// What one compilation produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompiledModule {
    /// The CUBIN for `sm_XY`, where NVRTC made one.
    pub cubin: Option<Vec<u8>>,
    /// The PTX (for `sm_XY` or, where the CUBIN failed, `compute_XY`).
    pub ptx: String,
    /// NVRTC's log (warnings; empty when there were none).
    pub log: String,
    /// The target it was built for: `"sm_90"` or `"compute_90"`.
    pub target: String,
}

/// The loaded NVRTC's version, `(major, minor)`.
pub fn version() -> Result<(i32, i32)> {
    nvrtc_lib::get().map(|n| n.version)
}

/// Compiles `source` (with sncl's own `headers` as (include name, text))
/// for `arch`, or returns the cached result of an identical earlier
/// compilation. A compile error is [`DeviceError::Compile`] with NVRTC's
/// log; no NVRTC is [`DeviceError::NoNvrtc`].
pub fn compile(source: &str, headers: &[(&str, &str)], arch: Arch) -> Result<CompiledModule> {
    compile_with(source, headers, arch, &[], None)
}

/// [`compile`] with `extra` NVRTC options after sncl's own (e.g.
/// `kernels::cuda::dtype_options`, `-D` macros; they are part of the cache
/// key) and the CUDA headers from `include` (else [`cuda_include_dir`]).
pub fn compile_with(
    source: &str,
    headers: &[(&str, &str)],
    arch: Arch,
    extra: &[String],
    include: Option<&Path>,
) -> Result<CompiledModule> {
    let nvrtc = nvrtc_lib::get()?;
    let include = match include {
        Some(dir) => {
            if !dir.join("cuda_fp16.h").exists() {
                tracing::warn!(dir = %dir.display(), "SNCL_CUDA_INCLUDE has no cuda_fp16.h; using it anyway");
            }
            Some(dir.to_path_buf())
        }
        None => cuda_include_dir_for(Some(nvrtc)),
    };
    let sm = format!("sm_{}{}", arch.major, arch.minor);
    let mut options = options(&sm, include.as_deref());
    options.extend_from_slice(extra);
    let key = cache_key(nvrtc.version, source, headers, &options);

    if let Some(m) = memory().lock().ok().and_then(|c| c.get(&key).cloned()) {
        return Ok((*m).clone());
    }
    let disk = disk_dir();
    if let Some(m) = disk.as_deref().and_then(|d| disk_read(d, &key)) {
        tracing::debug!(target = %m.target, "sncl kernels from the disk cache");
        remember(key, &m);
        return Ok(m);
    }

    if include.is_none() {
        tracing::warn!(
            "no CUDA headers (cuda_fp16.h) found; set SNCL_CUDA_INCLUDE if the kernels need them"
        );
    }
    let started = Instant::now();
    let module = build(nvrtc, source, headers, arch, &sm, options, extra)?;
    tracing::info!(
        target = %module.target,
        ?extra,
        cubin = module.cubin.is_some(),
        ms = started.elapsed().as_millis() as u64,
        nvrtc = ?nvrtc.version,
        "compiled the sncl device kernels with NVRTC"
    );
    if let Some(dir) = disk.as_deref() {
        if let Err(e) = disk_write(dir, &key, &module) {
            tracing::warn!(dir = %dir.display(), error = %e, "could not write the kernel cache");
        }
    }
    remember(key, &module);
    Ok(module)
}

/// The options for target `target` (`sm_XY` or `compute_XY`).
fn options(target: &str, include: Option<&Path>) -> Vec<String> {
    let mut o = vec![
        format!("--gpu-architecture={target}"),
        "-std=c++17".to_string(),
        "--fmad=false".to_string(),
    ];
    if let Some(dir) = include {
        o.push(format!("--include-path={}", dir.display()));
    }
    o
}

/// Compiles for `sm_XY`; where that fails, for `compute_XY` (PTX only).
fn build(
    nvrtc: &Nvrtc,
    source: &str,
    headers: &[(&str, &str)],
    arch: Arch,
    sm: &str,
    options: Vec<String>,
    extra: &[String],
) -> Result<CompiledModule> {
    const NAME: &str = "sncl_kernels.cu";
    let what = match extra {
        [] => "the sncl device kernels".to_string(),
        extra => format!("the sncl device kernels ({})", extra.join(" ")),
    };
    let fail = |arch: &str, log: String| DeviceError::Compile {
        what: what.clone(),
        arch: arch.to_string(),
        log,
    };
    let sm_log = match nvrtc.compile(NAME, source, headers, &options, true) {
        Err(e) => return Err(fail(sm, e)),
        Ok(Ok(out)) => {
            return Ok(CompiledModule {
                cubin: out.cubin,
                ptx: out.ptx,
                log: out.log,
                target: sm.to_string(),
            })
        }
        Ok(Err(log)) => log,
    };
    let compute = format!("compute_{}{}", arch.major, arch.minor);
    let mut ptx_options = options;
    ptx_options[0] = format!("--gpu-architecture={compute}");
    tracing::debug!(%sm, %compute, "CUBIN build failed; trying PTX");
    match nvrtc.compile(NAME, source, headers, &ptx_options, false) {
        Err(e) => Err(fail(&compute, e)),
        Ok(Ok(out)) => Ok(CompiledModule {
            cubin: None,
            ptx: out.ptx,
            log: out.log,
            target: compute,
        }),
        // The source is wrong: the first log says why.
        Ok(Err(_)) => Err(fail(sm, sm_log)),
    }
}

/// The directory holding `cuda_fp16.h` that [`compile`] passes to NVRTC
/// where the caller names none: `include` beside the loaded NVRTC (the
/// toolkit's `lib64/../include`, the `nvidia/cu13` wheel's `lib/../include`,
/// the CUDA 12 wheels' `nvidia/cuda_runtime/include`); else
/// `$CUDA_HOME/include`, `$CUDA_PATH/include`, `/usr/local/cuda/include`,
/// `/usr/include`. `None` where none has the header.
pub fn cuda_include_dir() -> Option<PathBuf> {
    cuda_include_dir_for(nvrtc_lib::get().ok())
}

fn cuda_include_dir_for(nvrtc: Option<&Nvrtc>) -> Option<PathBuf> {
    let mut tries = Vec::new();
    if let Some(lib) = nvrtc.and_then(Nvrtc::dir) {
        tries.push(lib.join("../include"));
        tries.push(lib.join("../../cuda_runtime/include"));
    }
    tries.extend(cuda_roots().into_iter().map(|root| root.join("include")));
    tries.push("/usr/include".into());
    tries
        .into_iter()
        .find(|d| d.join("cuda_fp16.h").exists())
        .map(|d| d.canonicalize().unwrap_or(d))
}

/// The cache key: SHA-256 over every input, each length-prefixed.
fn cache_key(
    version: (i32, i32),
    source: &str,
    headers: &[(&str, &str)],
    options: &[String],
) -> [u8; 32] {
    let mut h = Sha256::new();
    let mut field = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    field(b"sncl-nvrtc-cache-v1");
    field(format!("nvrtc {}.{}", version.0, version.1).as_bytes());
    field(source.as_bytes());
    for (name, text) in headers {
        field(name.as_bytes());
        field(text.as_bytes());
    }
    for o in options {
        field(o.as_bytes());
    }
    h.finalize().into()
}

type MemoryCache = Mutex<HashMap<[u8; 32], Arc<CompiledModule>>>;

fn memory() -> &'static MemoryCache {
    static CACHE: OnceLock<MemoryCache> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

fn remember(key: [u8; 32], module: &CompiledModule) {
    if let Ok(mut c) = memory().lock() {
        c.insert(key, Arc::new(module.clone()));
    }
}

/// `$XDG_CACHE_HOME/sncl/kernels` or `~/.cache/sncl/kernels`, created with
/// mode 0700; `None` (no disk cache) where there is no such place or it is
/// writable by others.
fn disk_dir() -> Option<PathBuf> {
    let base = process_var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| process_var("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    let dir = base.join("sncl").join("kernels");
    if let Err(e) = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
    {
        tracing::warn!(dir = %dir.display(), error = %e, "no kernel cache directory");
        return None;
    }
    match std::fs::metadata(&dir) {
        Ok(m) if m.permissions().mode() & 0o022 == 0 => Some(dir),
        Ok(m) => {
            tracing::warn!(
                dir = %dir.display(),
                mode = format!("{:o}", m.permissions().mode() & 0o777),
                "the kernel cache directory is writable by others; not using it"
            );
            None
        }
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "no kernel cache directory");
            None
        }
    }
}

const MAGIC: &[u8; 8] = b"SNCLKC01";

fn file_name(key: &[u8; 32]) -> String {
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    format!("{hex}.bin")
}

/// Entry layout: MAGIC, then length-prefixed target, cubin (length
/// u64::MAX = none), ptx and log, then the SHA-256 of everything before it.
fn encode(m: &CompiledModule) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    let mut put = |bytes: Option<&[u8]>| match bytes {
        Some(b) => {
            out.extend_from_slice(&(b.len() as u64).to_le_bytes());
            out.extend_from_slice(b);
        }
        None => out.extend_from_slice(&u64::MAX.to_le_bytes()),
    };
    put(Some(m.target.as_bytes()));
    put(m.cubin.as_deref());
    put(Some(m.ptx.as_bytes()));
    put(Some(m.log.as_bytes()));
    let sum: [u8; 32] = Sha256::digest(&out).into();
    out.extend_from_slice(&sum);
    out
}

fn decode(bytes: &[u8]) -> Option<CompiledModule> {
    let body_len = bytes.len().checked_sub(32)?;
    let (body, sum) = bytes.split_at(body_len);
    if Sha256::digest(body).as_slice() != sum || !body.starts_with(MAGIC) {
        return None;
    }
    let mut rest = &body[MAGIC.len()..];
    let mut take = || -> Option<Option<Vec<u8>>> {
        let (len, tail) = rest.split_first_chunk::<8>()?;
        let len = u64::from_le_bytes(*len);
        if len == u64::MAX {
            rest = tail;
            return Some(None);
        }
        let len = usize::try_from(len).ok()?;
        if len > tail.len() {
            return None;
        }
        let (v, tail) = tail.split_at(len);
        rest = tail;
        Some(Some(v.to_vec()))
    };
    let target = String::from_utf8(take()??).ok()?;
    let cubin = take()?;
    let ptx = String::from_utf8(take()??).ok()?;
    let log = String::from_utf8(take()??).ok()?;
    rest.is_empty().then_some(CompiledModule {
        cubin,
        ptx,
        log,
        target,
    })
}

fn disk_read(dir: &Path, key: &[u8; 32]) -> Option<CompiledModule> {
    let path = dir.join(file_name(key));
    let bytes = std::fs::read(&path).ok()?;
    let m = decode(&bytes);
    if m.is_none() {
        tracing::warn!(path = %path.display(), "ignoring a damaged kernel cache entry");
    }
    m
}

fn disk_write(dir: &Path, key: &[u8; 32], m: &CompiledModule) -> std::io::Result<()> {
    let name = file_name(key);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let tmp = dir.join(format!(".{name}.{}.{nanos}.tmp", std::process::id()));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&encode(m))?;
        f.sync_all()?;
        std::fs::rename(&tmp, dir.join(&name))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(cubin: Option<Vec<u8>>) -> CompiledModule {
        CompiledModule {
            cubin,
            ptx: ".version 8.0\n.entry k()".into(),
            log: "warning: x".into(),
            target: "sm_90".into(),
        }
    }

    #[test]
    fn cache_entries_round_trip_and_reject_damage() {
        for m in [sample(Some(vec![1, 2, 3, 0, 255])), sample(None)] {
            let bytes = encode(&m);
            assert_eq!(decode(&bytes), Some(m.clone()));
            for i in [0, 9, bytes.len() / 2, bytes.len() - 1] {
                let mut bad = bytes.clone();
                bad[i] ^= 1;
                assert_eq!(decode(&bad), None, "flipped byte {i}");
            }
            assert_eq!(decode(&bytes[..bytes.len() - 1]), None);
        }
        assert_eq!(decode(&[]), None);
    }

    #[test]
    fn cache_key_changes_with_every_input() {
        let opts = options("sm_90", None);
        let base = cache_key((13, 0), "src", &[("a.h", "x")], &opts);
        assert_eq!(base, cache_key((13, 0), "src", &[("a.h", "x")], &opts));
        assert_ne!(base, cache_key((12, 8), "src", &[("a.h", "x")], &opts));
        assert_ne!(base, cache_key((13, 0), "src2", &[("a.h", "x")], &opts));
        assert_ne!(base, cache_key((13, 0), "src", &[("a.h", "y")], &opts));
        assert_ne!(base, cache_key((13, 0), "src", &[], &opts));
        let sm80 = options("sm_80", None);
        assert_ne!(base, cache_key((13, 0), "src", &[("a.h", "x")], &sm80));
        // Length prefixes keep field boundaries apart.
        assert_ne!(
            cache_key((13, 0), "ab", &[("c", "")], &opts),
            cache_key((13, 0), "a", &[("bc", "")], &opts)
        );
    }

    #[test]
    fn disk_entries_are_private_and_atomic() {
        let dir = std::env::temp_dir().join(format!("sncl-nvrtc-cache-{}", std::process::id()));
        std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        let key = [7u8; 32];
        let m = sample(Some(vec![9; 100]));
        disk_write(&dir, &key, &m).unwrap();
        let path = dir.join(file_name(&key));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(disk_read(&dir, &key), Some(m.clone()));
        // Overwriting replaces the entry; no temporary files stay behind.
        let m2 = sample(None);
        disk_write(&dir, &key, &m2).unwrap();
        assert_eq!(disk_read(&dir, &key), Some(m2));
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        // A truncated entry is ignored.
        std::fs::write(&path, b"SNCLKC01").unwrap();
        assert_eq!(disk_read(&dir, &key), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
