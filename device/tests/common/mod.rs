//! Helpers of the device test suite: choosing the backend, owned streams,
//! copies that wait, test data.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use device::{Backend, Device, DeviceBuffer, DevicePtr, StreamHandle};
use kernels::DataType;

/// How long any one wait of the suite may take.
pub const WAIT: Duration = Duration::from_secs(30);

/// A deadline [`WAIT`] from now.
pub fn deadline() -> Instant {
    Instant::now() + WAIT
}

/// The backend under test: `SNCL_TEST_DEVICE` (`emu` by default, `cuda`).
pub fn backend() -> Backend {
    let name = std::env::var("SNCL_TEST_DEVICE").unwrap_or_else(|_| "emu".into());
    Backend::from_name(&name)
        .unwrap_or_else(|| panic!("SNCL_TEST_DEVICE={name:?}: expected \"emu\" or \"cuda\""))
}

/// Opens device 0 of the backend under test, or says why the test skips:
/// no usable CUDA device, or a build without the `emu` feature. With
/// `SNCL_TEST_DEVICE_REQUIRED=1` (set by `scripts/gpu-check.sh`) a device
/// that cannot be opened fails the test instead of skipping it.
pub fn open() -> Option<Arc<dyn Device>> {
    let backend = backend();
    match device::open(backend, 0) {
        Ok(dev) => Some(dev),
        Err(e) if std::env::var("SNCL_TEST_DEVICE_REQUIRED").is_ok_and(|v| v == "1") => {
            panic!(
                "SNCL_TEST_DEVICE_REQUIRED=1 and {} device 0 cannot be opened: {e}",
                backend.name()
            )
        }
        Err(e) if backend == Backend::Cuda => {
            eprintln!("skipping: SNCL_TEST_DEVICE=cuda but CUDA device 0 cannot be opened: {e}");
            None
        }
        Err(e) if !cfg!(feature = "emu") => {
            eprintln!(
                "skipping: this build has no `emu` feature (run `cargo test -p device --features \
                 emu`): {e}"
            );
            None
        }
        Err(e) => panic!("opening emulated device 0: {e}"),
    }
}

/// A device with one stream, destroyed on drop.
pub struct Ctx {
    pub dev: Arc<dyn Device>,
    pub stream: StreamHandle,
}

impl Ctx {
    /// Opens the device under test and creates a stream (None: skip).
    pub fn new() -> Option<Ctx> {
        let dev = open()?;
        let stream = dev.create_stream().expect("create_stream");
        Some(Ctx { dev, stream })
    }

    /// Whether the backend is the emulator (emulator-only checks).
    pub fn is_emu(&self) -> bool {
        self.dev.backend() == Backend::Emu
    }

    /// Another stream on the same device, destroyed on drop.
    pub fn other_stream(&self) -> Ctx {
        let stream = self.dev.create_stream().expect("create_stream");
        Ctx {
            dev: self.dev.clone(),
            stream,
        }
    }

    pub fn sync(&self) {
        self.dev
            .synchronize(self.stream, deadline())
            .expect("synchronize");
    }

    /// A device buffer of `bytes`.
    pub fn buffer(&self, bytes: usize) -> DeviceBuffer {
        DeviceBuffer::new(&self.dev, bytes).expect("alloc")
    }

    /// Copies `data` to `dst` and waits.
    pub fn upload(&self, dst: DevicePtr, data: &[u8]) {
        // SAFETY: `data` outlives the copy (synchronised below); the caller
        // passes a device range of `data.len()` bytes.
        unsafe {
            self.dev
                .copy_h2d_async(dst, data.as_ptr(), data.len(), self.stream)
                .expect("copy_h2d_async");
        }
        self.sync();
    }

    /// Copies `out.len()` bytes from `src` into `out` and waits.
    pub fn download_into(&self, out: &mut [u8], src: DevicePtr) {
        // SAFETY: `out` is valid and untouched until the copy completes
        // (synchronised below); the caller passes a device range.
        unsafe {
            self.dev
                .copy_d2h_async(out.as_mut_ptr(), src, out.len(), self.stream)
                .expect("copy_d2h_async");
        }
        self.sync();
    }

    /// `bytes` bytes from `src`.
    pub fn download(&self, src: DevicePtr, bytes: usize) -> Vec<u8> {
        let mut out = vec![0u8; bytes];
        self.download_into(&mut out, src);
        out
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: created in `new`/`other_stream`, destroyed only here; the
        // tests synchronise (or abandon a faulted device) before dropping.
        let _ = unsafe { self.dev.destroy_stream(self.stream) };
    }
}

/// A `u32` flag in pinned host memory, for stream value operations.
pub struct Flag {
    dev: Arc<dyn Device>,
    ptr: std::ptr::NonNull<u8>,
}

impl Flag {
    pub fn new(dev: &Arc<dyn Device>) -> Flag {
        let ptr = dev.alloc_pinned(64).expect("alloc_pinned");
        let flag = Flag {
            dev: dev.clone(),
            ptr,
        };
        for i in 0..16 {
            flag.word(i).store(0, Ordering::Release);
        }
        flag
    }

    /// Word `i` (0 to 15) of the block.
    pub fn word(&self, i: usize) -> &AtomicU32 {
        assert!(i < 16);
        // SAFETY: the block is 64 bytes, 4-byte aligned, and lives as long
        // as self; all accesses (host and device) are atomic.
        unsafe { AtomicU32::from_ptr((self.ptr.as_ptr() as *mut u32).add(i)) }
    }

    pub fn addr(&self, i: usize) -> *mut u32 {
        self.word(i).as_ptr()
    }
}

impl Drop for Flag {
    fn drop(&mut self) {
        // SAFETY: from alloc_pinned with 64 bytes, freed once; tests
        // synchronise the streams that use it before dropping.
        let _ = unsafe { self.dev.free_pinned(self.ptr, 64) };
    }
}

/// A small deterministic generator (xorshift64*).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next().to_ne_bytes());
        }
        v.truncate(n);
        v
    }
}

/// (exponent bits, mantissa bits) of a float type.
fn float_layout(dtype: DataType) -> Option<(u32, u32)> {
    match dtype {
        DataType::Float16 => Some((5, 10)),
        DataType::Bfloat16 => Some((8, 7)),
        DataType::Float32 => Some((8, 23)),
        DataType::Float64 => Some((11, 52)),
        DataType::Float8e4m3 => Some((4, 3)),
        DataType::Float8e5m2 => Some((5, 2)),
        _ => None,
    }
}

/// `count` elements of `dtype`: random bits for integers; for floats
/// mostly values of magnitude 1/8 to 8 with random sign and mantissa, and
/// one in 32 random bits (NaN, infinities, subnormals, huge values).
pub fn data(dtype: DataType, count: usize, rng: &mut Rng) -> Vec<u8> {
    let size = dtype.size();
    let Some((ebits, mbits)) = float_layout(dtype) else {
        return rng.bytes(count * size);
    };
    let bias = (1u64 << (ebits - 1)) - 1;
    let mut out = Vec::with_capacity(count * size);
    for _ in 0..count {
        let r = rng.next();
        let bits = if r.is_multiple_of(32) {
            rng.next()
        } else {
            let sign = (r >> 8) & 1;
            let exp = bias - 3 + (r >> 9) % 7;
            let mant = rng.next() & ((1u64 << mbits) - 1);
            (sign << (ebits + mbits)) | (exp << mbits) | mant
        };
        out.extend_from_slice(&bits.to_ne_bytes()[..size]);
    }
    out
}

/// Whether the element bits are a NaN.
fn is_nan(dtype: DataType, e: &[u8]) -> bool {
    let Some((ebits, mbits)) = float_layout(dtype) else {
        return false;
    };
    let mut b = [0u8; 8];
    b[..e.len()].copy_from_slice(e);
    let bits = u64::from_ne_bytes(b);
    if dtype == DataType::Float8e4m3 {
        // E4M3FN: only S.1111.111 is NaN (no infinities).
        return bits & 0x7f == 0x7f;
    }
    let exp = (bits >> mbits) & ((1 << ebits) - 1);
    exp == (1 << ebits) - 1 && bits & ((1 << mbits) - 1) != 0
}

/// Panics unless `got` equals `want` bit for bit, except that any NaN
/// matches any NaN (a GPU may produce another NaN payload than the CPU).
pub fn assert_same(dtype: DataType, got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if got == want {
        return;
    }
    let size = dtype.size();
    for (i, (g, w)) in got.chunks(size).zip(want.chunks(size)).enumerate() {
        if g != w && !(is_nan(dtype, g) && is_nan(dtype, w)) {
            panic!("{what}: element {i} is {g:02x?}, expected {w:02x?}");
        }
    }
}
