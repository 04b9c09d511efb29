//! Device memory in the C ABI: the device backend, the devices it opened
//! (each with its default stream), the current device of a thread, what
//! memory a buffer is, what a `snclStream_t` is (the registries of the
//! streams sncl made), and the allocations of `snclMemAlloc`.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use ::device::{Backend, Device, PointerKind, StreamHandle};

use super::error::CError;
use super::stream::snclStream;
use super::stream::StreamShared;
use super::types::{snclResult_t, snclStream_t};
use sncl_rs::ConfigFromEnv;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(super) type R<T = ()> = Result<T, CError>;

/// A device error as a C error (`snclUnhandledCudaError`).
pub(super) fn dev_error(what: &str, e: ::device::DeviceError) -> CError {
    CError::new(snclResult_t::snclUnhandledCudaError, format!("{what}: {e}"))
}

/// The process's device backend: set by `snclSetDeviceBackend` before the
/// first use of device memory, else CUDA.
static BACKEND: OnceLock<Backend> = OnceLock::new();

/// Chooses the backend; an error once another one is in use.
pub(super) fn set_backend(b: Backend) -> R {
    let got = *BACKEND.get_or_init(|| b);
    if got != b {
        return Err(CError::usage(format!(
            "the device backend is already {} (chosen by an earlier call, or by the first use of \
             device memory); snclSetDeviceBackend must come first",
            got.name()
        )));
    }
    if b == Backend::Emu {
        // Fails here, not at the first buffer, in a build without it.
        ::device::device_count(b).map_err(|e| dev_error("selecting the emulated device", e))?;
    }
    Ok(())
}

/// The backend in use.
pub(super) fn backend() -> Backend {
    *BACKEND.get_or_init(|| Backend::Cuda)
}

/// An opened device and the stream a NULL `snclStream_t` means on it.
pub(super) struct Dev {
    pub dev: Arc<dyn Device>,
    /// CUDA: the legacy default stream (0); emulated: a stream made at open.
    pub default_stream: StreamHandle,
}

impl Dev {
    /// "cuda device 0", for messages.
    pub fn label(&self) -> String {
        format!(
            "{} device {}",
            self.dev.backend().name(),
            self.dev.ordinal()
        )
    }

    /// Waits for `stream` up to the settings' timeout.
    pub fn synchronize(&self, stream: StreamHandle) -> R {
        let timeout = sncl_rs::Config::from_env().map_err(CError::from)?.timeout;
        self.dev
            .synchronize(stream, Instant::now() + timeout)
            .map_err(|e| dev_error(&format!("synchronizing a stream of {}", self.label()), e))
    }
}

type Opened = Mutex<HashMap<usize, Arc<Dev>>>;

fn opened() -> &'static Opened {
    static OPENED: OnceLock<Opened> = OnceLock::new();
    OPENED.get_or_init(Opened::default)
}

/// Device `ordinal` of the backend, opened once per process (so every
/// call sees the same device object, as the emulated device's addresses
/// require).
pub(super) fn device(ordinal: usize) -> R<Arc<Dev>> {
    let mut open = lock(opened());
    if let Some(d) = open.get(&ordinal) {
        return Ok(d.clone());
    }
    let b = backend();
    let dev = ::device::open(b, ordinal)
        .map_err(|e| dev_error(&format!("opening {} device {ordinal}", b.name()), e))?;
    let default_stream = match b {
        Backend::Cuda => StreamHandle(0),
        Backend::Emu => dev.create_stream().map_err(|e| {
            dev_error(
                &format!("creating the default stream of emu device {ordinal}"),
                e,
            )
        })?,
    };
    tracing::debug!(backend = b.name(), ordinal, "C ABI opened a device");
    let d = Arc::new(Dev {
        dev,
        default_stream,
    });
    open.insert(ordinal, d.clone());
    Ok(d)
}

thread_local! {
    /// The device `snclSetDevice` made current on this thread.
    static CURRENT: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Makes `ordinal` this thread's current device (CUDA: also its context).
pub(super) fn set_current(ordinal: usize) -> R {
    let b = backend();
    let count = ::device::device_count(b)
        .map_err(|e| dev_error(&format!("counting the {} devices", b.name()), e))?;
    if ordinal >= count {
        return Err(CError::invalid(format!(
            "device {ordinal} does not exist: the {} backend has {count} device(s)",
            b.name()
        )));
    }
    device(ordinal)?;
    CURRENT.with(|c| c.set(Some(ordinal)));
    Ok(())
}

/// This thread's current device: `snclSetDevice`'s, else (CUDA) the
/// current context's, else 0.
pub(super) fn current() -> R<usize> {
    if let Some(o) = CURRENT.with(Cell::get) {
        return Ok(o);
    }
    let b = backend();
    let cur = ::device::current_device(b)
        .map_err(|e| dev_error(&format!("asking for the current {} device", b.name()), e))?;
    Ok(cur.unwrap_or(0))
}

/// The emulated device that answers pointer queries first: device 0, or
/// why there is none (asked once).
fn probe() -> Result<Arc<Dev>, String> {
    static PROBE: OnceLock<Result<Arc<Dev>, String>> = OnceLock::new();
    PROBE.get_or_init(|| device(0).map_err(|e| e.msg)).clone()
}

/// Why no device backend is available, if none is.
pub(super) fn unavailable() -> Option<String> {
    match backend() {
        Backend::Cuda => ::device::device_count(Backend::Cuda)
            .err()
            .map(|e| e.to_string()),
        Backend::Emu => probe().err(),
    }
}

/// What memory a buffer is.
pub(super) enum Mem {
    Host,
    Device(Arc<Dev>),
}

/// Classifies `ptr` (named `what` in errors); NULL is host memory.
pub(super) fn kind(what: &str, ptr: *const u8) -> R<Mem> {
    if ptr.is_null() {
        return Ok(Mem::Host);
    }
    let addr = ptr as u64;
    let answer = match backend() {
        Backend::Cuda => cuda_kind(addr),
        Backend::Emu => emu_kind(addr),
    }
    .map_err(|e| dev_error(&format!("asking what memory {what} {ptr:?} is"), e))?;
    match answer {
        PointerKind::Host => Ok(Mem::Host),
        PointerKind::Device { ordinal } => Ok(Mem::Device(device(ordinal)?)),
        PointerKind::Stale { detail } => Err(CError::invalid(format!(
            "{what} {ptr:?} is not live device memory ({detail}); allocate it with snclMemAlloc \
             and keep it until the operation completes"
        ))),
    }
}

/// CUDA: the driver answers without a device (so no context is made
/// current on the caller's thread); where it wants a current context, the
/// current device answers. No driver: host memory.
fn cuda_kind(addr: u64) -> Result<PointerKind, ::device::DeviceError> {
    match ::device::cuda::pointer::pointer_kind(addr) {
        Ok(k) => Ok(k),
        Err(first) => match current().ok().and_then(|o| device(o).ok()) {
            Some(d) => d.dev.pointer_kind(addr),
            None => Err(first),
        },
    }
}

/// The emulated device: each device object knows only its own
/// allocations, so every one opened is asked.
fn emu_kind(addr: u64) -> Result<PointerKind, ::device::DeviceError> {
    let Ok(probe) = probe() else {
        return Ok(PointerKind::Host);
    };
    let mut answer = probe.dev.pointer_kind(addr)?;
    if !answer.is_device() {
        let others: Vec<_> = lock(opened()).values().cloned().collect();
        for d in others {
            let k = d.dev.pointer_kind(addr)?;
            if k.is_device() {
                answer = k;
                break;
            }
        }
    }
    Ok(answer)
}

/// Where all of an operation's buffers are: host memory, or one device.
/// Mixed host and device buffers, or buffers of two devices, are errors.
pub(super) fn route(bufs: &[(&str, *const u8)]) -> R<Option<Arc<Dev>>> {
    let mut host: Option<&str> = None;
    let mut dev: Option<(&str, Arc<Dev>)> = None;
    for &(what, p) in bufs.iter().filter(|(_, p)| !p.is_null()) {
        match kind(what, p)? {
            Mem::Host => host = host.or(Some(what)),
            Mem::Device(d) => match &dev {
                None => dev = Some((what, d)),
                Some((w, first)) if !Arc::ptr_eq(first, &d) => {
                    return Err(CError::invalid(format!(
                        "{w} is memory of {} but {what} of {}; an operation's buffers live on \
                         one device",
                        first.label(),
                        d.label()
                    )))
                }
                Some(_) => {}
            },
        }
    }
    match (host, dev) {
        (Some(h), Some((w, d))) => Err(CError::invalid(format!(
            "{w} is memory of {} but {h} is host memory; an operation's buffers are all host \
             memory or all device memory",
            d.label()
        ))),
        (_, d) => Ok(d.map(|(_, d)| d)),
    }
}

/// The streams sncl made: host streams (`snclStreamCreate`) and device
/// streams (`snclDeviceStreamCreate`: the handle C sees, with the device's
/// ordinal and the device's own handle).
#[derive(Default)]
struct Streams {
    host: HashSet<usize>,
    device: HashMap<usize, (usize, StreamHandle)>,
}

fn streams() -> MutexGuard<'static, Streams> {
    static STREAMS: OnceLock<Mutex<Streams>> = OnceLock::new();
    lock(STREAMS.get_or_init(Mutex::default))
}

/// Registers a host stream handle.
pub(super) fn add_host_stream(h: snclStream_t) {
    streams().host.insert(h as usize);
}

/// Unregisters a host stream handle; false if it is none.
pub(super) fn remove_host_stream(h: snclStream_t) -> bool {
    streams().host.remove(&(h as usize))
}

/// Registers a stream made on device `ordinal`; returns the handle C sees:
/// the CUstream itself on CUDA; on the emulated device, whose stream ids
/// are per device, the id tagged with the device.
pub(super) fn add_device_stream(real: StreamHandle, ordinal: usize) -> snclStream_t {
    let c = match backend() {
        Backend::Cuda => real.0,
        Backend::Emu => real.0 | ((ordinal as u64 + 1) << 40),
    };
    streams().device.insert(c as usize, (ordinal, real));
    c as usize as snclStream_t
}

/// Unregisters a device stream; its device and own handle if it was one.
pub(super) fn remove_device_stream(h: snclStream_t) -> Option<(usize, StreamHandle)> {
    streams().device.remove(&(h as usize))
}

/// The device and the device's own handle of a device stream:
/// `snclDeviceStreamCreate`'s record, else (a CUDA stream of the
/// application) the handle itself, taken as one of the current device (or
/// of `fallback`, the buffers' device, when given).
pub(super) fn resolve_stream(h: StreamHandle, fallback: Option<usize>) -> R<(usize, StreamHandle)> {
    let known = streams().device.get(&(h.0 as usize)).copied();
    match (known, fallback) {
        (Some(k), _) => Ok(k),
        (None, Some(o)) => Ok((o, h)),
        (None, None) => Ok((current()?, h)),
    }
}

/// What a `snclStream_t` is.
pub(super) enum StreamArg {
    /// NULL.
    Null,
    /// A host stream from `snclStreamCreate`.
    Host(Arc<StreamShared>),
    /// Anything else: a CUDA stream (or an emulated device's stream).
    Device(StreamHandle),
}

/// Tells a `snclStream_t` apart.
///
/// # Safety
/// A handle in the host registry is a live `snclStream` (not destroyed
/// concurrently with this call).
pub(super) unsafe fn stream_arg(h: snclStream_t) -> StreamArg {
    if h.is_null() {
        return StreamArg::Null;
    }
    if streams().host.contains(&(h as usize)) {
        // SAFETY: registered by snclStreamCreate (a Box<snclStream> made
        // with Box::into_raw) and not yet destroyed, per the contract.
        let s = unsafe { &*(h as *const snclStream) };
        return StreamArg::Host(s.shared.clone());
    }
    StreamArg::Device(StreamHandle(h as u64))
}

/// The allocations of `snclMemAlloc`, by address, with their device and
/// size.
fn allocs() -> MutexGuard<'static, HashMap<u64, (usize, usize)>> {
    static ALLOCS: OnceLock<Mutex<HashMap<u64, (usize, usize)>>> = OnceLock::new();
    lock(ALLOCS.get_or_init(Mutex::default))
}

/// Allocates `bytes` on the current device.
pub(super) fn alloc(bytes: usize) -> R<u64> {
    let d = device(current()?)?;
    let p = d
        .dev
        .alloc(bytes)
        .map_err(|e| dev_error(&format!("allocating {bytes} bytes on {}", d.label()), e))?;
    allocs().insert(p.0, (d.dev.ordinal(), bytes));
    Ok(p.0)
}

/// The live `snclMemAlloc` allocation holding `addr`: (start, bytes).
pub(super) fn allocation_of(addr: u64) -> Option<(u64, usize)> {
    allocs()
        .iter()
        .find(|(&start, &(_, bytes))| addr >= start && addr - start < bytes.max(1) as u64)
        .map(|(&start, &(_, bytes))| (start, bytes))
}

/// Frees an allocation of [`alloc`] (the caller checked that no window
/// holds it: `snclMemFree`).
pub(super) fn free(addr: u64) -> R {
    let Some((ordinal, _)) = allocs().remove(&addr) else {
        return Err(CError::invalid(format!(
            "{addr:#x} is not an allocation of snclMemAlloc (or was freed already)"
        )));
    };
    let d = device(ordinal)?;
    // Work on the default stream may still use it (NCCL's ncclMemFree
    // also frees at once; the caller orders it): wait for that stream. The
    // memory is freed either way (it is out of the registry: a retry could
    // not free it), and a failed wait is reported after.
    let waited = d.synchronize(d.default_stream);
    // SAFETY: allocated by `alloc` on this device and removed from the
    // registry above, so freed once; the caller guarantees no other queued
    // work uses it (snclMemFree's contract).
    unsafe { d.dev.free(::device::DevicePtr(addr)) }
        .map_err(|e| dev_error(&format!("freeing {addr:#x} on {}", d.label()), e))?;
    waited
}
