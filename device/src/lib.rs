//! What the sncl runtime needs of a device, as one small object-safe trait
//! ([`Device`]), with two backends:
//!
//! * [`Backend::Cuda`]: CUDA through cudarc (driver API and NVRTC loaded at
//!   run time, so it builds everywhere and fails with an error where no
//!   driver is found);
//! * [`Backend::Emu`] (feature `emu`): an emulated device in host memory for
//!   tests and CI only. It is never chosen by default.
//!
//! Device memory is addressed by [`DevicePtr`] (a `CUdeviceptr` on CUDA; an
//! opaque address into the emulator's allocations on `emu`). The runtime
//! never dereferences a `DevicePtr`; every access goes through the trait.
//! Work is ordered on streams ([`StreamHandle`]); completion is observed with
//! events or with stream value operations on a `u32` in pinned host memory.

use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Instant;

use kernels::{DataType, ReduceOp};

mod error;
pub use error::DeviceError;

/// Results of the device layer.
pub type Result<T> = std::result::Result<T, DeviceError>;

/// The most sources or destinations of one [`Device::reduce_copy`].
pub const MAX_REDUCE_ARGS: usize = 8;

/// Which implementation of [`Device`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// A CUDA GPU through cudarc.
    Cuda,
    /// The emulated device (feature `emu`; tests only).
    Emu,
}

impl Backend {
    /// The name used in settings and command lines: `"cuda"` or `"emu"`.
    pub const fn name(self) -> &'static str {
        match self {
            Backend::Cuda => "cuda",
            Backend::Emu => "emu",
        }
    }

    /// Parses `"cuda"` or `"emu"`.
    pub fn from_name(name: &str) -> Option<Backend> {
        match name {
            "cuda" => Some(Backend::Cuda),
            "emu" => Some(Backend::Emu),
            _ => None,
        }
    }
}

/// A device address. Offsets are in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevicePtr(pub u64);

/// `{:#x}`: the address in hex, on one line (messages).
impl std::fmt::LowerHex for DevicePtr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::LowerHex::fmt(&self.0, f)
    }
}

impl DevicePtr {
    /// The address `bytes` further on.
    pub const fn add(self, bytes: usize) -> DevicePtr {
        DevicePtr(self.0 + bytes as u64)
    }
}

/// A stream: a raw `CUstream` on CUDA, a stream id on `emu`. Work enqueued on
/// one stream runs in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StreamHandle(pub u64);

/// An event: a raw `CUevent` on CUDA, an event id on `emu`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EventHandle(pub u64);

/// An exported device allocation, to be opened by another process on the
/// same machine (`CUipcMemHandle`'s 64 bytes on CUDA).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpcHandle(pub [u8; 64]);

impl std::fmt::Debug for IpcHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IpcHandle(")?;
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "..)")
    }
}

/// A device's compute capability (`major`, `minor`); `(0, 0)` on `emu`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Arch {
    /// Major version (9 for sm_90).
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

/// What the runtime needs of one device. Object-safe: the runtime holds an
/// `Arc<dyn Device>`.
///
/// Every method returns a [`DeviceError`] that names the call and what was
/// expected; none panics on a missing driver, a bad handle or a device fault.
/// Asynchronous methods (`*_async`, `reduce_copy`, `divide`, stream value
/// operations) only enqueue: errors found later surface at the next
/// synchronising call ([`Device::synchronize`], [`Device::event_done`]).
/// A scope from [`Device::enter`]: while it lives, the device's context
/// is known to be current on this thread. Dropping it ends the scope (the
/// context stays current, as after any call).
#[derive(Debug, Default)]
pub struct Entered {
    /// The CUDA backend's scope: the context entered before this one on
    /// this thread (0: none), put back when the scope ends.
    pub(crate) cuda_outer: Option<usize>,
    /// A scope belongs to its thread (it ends there).
    pub(crate) _thread: std::marker::PhantomData<*const ()>,
}

impl Drop for Entered {
    fn drop(&mut self) {
        if let Some(outer) = self.cuda_outer.take() {
            cuda::scope::leave(outer);
        }
    }
}

pub trait Device: Send + Sync + std::fmt::Debug {
    /// The backend.
    fn backend(&self) -> Backend;
    /// The device ordinal this value is bound to.
    fn ordinal(&self) -> usize;
    /// A human-readable name ("NVIDIA H200", "emu").
    fn name(&self) -> String;
    /// The compute capability.
    fn arch(&self) -> Arch;

    /// Allocates `bytes` of device memory (contents undefined). Zero bytes
    /// gives a valid, distinct pointer.
    fn alloc(&self, bytes: usize) -> Result<DevicePtr>;
    /// Frees memory from [`Device::alloc`].
    ///
    /// # Safety
    /// `ptr` came from `alloc` on this device, is freed once, and no
    /// enqueued work still uses it.
    unsafe fn free(&self, ptr: DevicePtr) -> Result<()>;
    /// Allocates `bytes` of page-locked host memory the device can copy to
    /// and from asynchronously (not write-combined: the host reads it).
    fn alloc_pinned(&self, bytes: usize) -> Result<NonNull<u8>>;
    /// Frees memory from [`Device::alloc_pinned`].
    ///
    /// # Safety
    /// `ptr` came from `alloc_pinned` on this device with this length, is
    /// freed once, and no enqueued work still uses it.
    unsafe fn free_pinned(&self, ptr: NonNull<u8>, bytes: usize) -> Result<()>;

    /// Creates a stream owned by the caller.
    fn create_stream(&self) -> Result<StreamHandle>;
    /// Destroys a stream from [`Device::create_stream`].
    ///
    /// # Safety
    /// The stream was created here, is destroyed once, and nobody enqueues
    /// on it afterwards.
    unsafe fn destroy_stream(&self, stream: StreamHandle) -> Result<()>;
    /// Waits until all work enqueued on `stream` has completed, or fails
    /// with [`DeviceError::Timeout`] at `deadline`.
    fn synchronize(&self, stream: StreamHandle, deadline: Instant) -> Result<()>;
    /// Whether `stream` is being captured into a CUDA graph (device
    /// collectives refuse such streams).
    fn is_capturing(&self, stream: StreamHandle) -> Result<bool>;
    /// Makes this device's context current on the calling thread for the
    /// life of the returned scope, so that the calls made inside it skip
    /// their own check (one `cuCtxGetCurrent`, and a `cuCtxSetCurrent`
    /// only where another context was current, instead of a
    /// `cuCtxSetCurrent` per call: NCCL's enqueue likewise sets the device
    /// once). Nothing to do on backends without contexts.
    fn enter(&self) -> Result<Entered> {
        Ok(Entered::default())
    }
    /// How many blocks of the direct kernels' launch shape
    /// ([`direct::launch_limits`]) the device runs at once (SMs × blocks an
    /// SM holds, from the occupancy API): the most blocks the direct
    /// kernels of all ranks sharing the device may launch together, since
    /// their blocks wait on each other. `None`: no limit (the emulated
    /// device runs a launch's blocks one after the other).
    fn direct_resident_blocks(&self) -> Result<Option<u64>> {
        Ok(None)
    }

    /// Enqueues a copy of `bytes` from host memory to the device.
    ///
    /// # Safety
    /// `src` is valid for reads of `bytes` until the copy completes (pinned
    /// memory for true asynchrony); `dst` is a live device range.
    unsafe fn copy_h2d_async(
        &self,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()>;
    /// Enqueues a copy of `bytes` from the device to host memory.
    ///
    /// # Safety
    /// `dst` is valid for writes of `bytes` until the copy completes and
    /// nothing else touches it meanwhile; `src` is a live device range.
    unsafe fn copy_d2h_async(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()>;
    /// Enqueues a device-to-device copy (ranges may not partially overlap).
    ///
    /// # Safety
    /// Both are live device ranges of `bytes`.
    unsafe fn copy_d2d_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()>;

    /// Creates an event (timing enabled).
    fn create_event(&self) -> Result<EventHandle>;
    /// Destroys an event.
    ///
    /// # Safety
    /// Created here, destroyed once, not used afterwards.
    unsafe fn destroy_event(&self, event: EventHandle) -> Result<()>;
    /// Records `event` on `stream`.
    fn record_event(&self, event: EventHandle, stream: StreamHandle) -> Result<()>;
    /// Whether the work before the event's last record has completed.
    fn event_done(&self, event: EventHandle) -> Result<bool>;
    /// Makes `stream` wait for `event` (no host blocking).
    fn stream_wait_event(&self, stream: StreamHandle, event: EventHandle) -> Result<()>;
    /// Milliseconds between two completed events.
    fn event_elapsed_ms(&self, start: EventHandle, end: EventHandle) -> Result<f32>;

    /// Enqueues a write of `value` to the `u32` at `addr` (pinned host
    /// memory from [`Device::alloc_pinned`]) when the stream reaches it.
    ///
    /// # Safety
    /// `addr` is aligned, inside a live pinned allocation of this device.
    unsafe fn stream_write_u32(
        &self,
        stream: StreamHandle,
        addr: *mut u32,
        value: u32,
    ) -> Result<()>;
    /// Enqueues a wait: the stream does not run past this point until the
    /// `u32` at `addr` is at or past `value` in the driver's cyclic sense,
    /// `(int32_t)(*addr - value) >= 0` (`CU_STREAM_WAIT_VALUE_GEQ`), so
    /// values may wrap past 2^32. The host writes it (with a release store)
    /// to let the stream go on. No CUDA callback thread blocks.
    ///
    /// # Safety
    /// As for [`Device::stream_write_u32`].
    unsafe fn stream_wait_u32(
        &self,
        stream: StreamHandle,
        addr: *const u32,
        value: u32,
    ) -> Result<()>;

    /// Enqueues `dsts[j][i] = srcs[0][i] op srcs[1][i] op ...` for
    /// `i < count`, for every destination j (1 to [`MAX_REDUCE_ARGS`] of
    /// each; one source is a copy). The fold is left to right and rounds
    /// after every operation exactly as successive calls of the CPU
    /// `kernels::reduce_into` would (f16/bf16 computed in f32 and rounded to
    /// nearest even per step; the CPU's NaN rule for min/max), so results
    /// are bit-identical to the CPU's. `Avg` reduces as a sum; call
    /// [`Device::divide`] once at the end. A destination may equal a source
    /// (in place); other overlaps are not allowed.
    ///
    /// # Safety
    /// Every pointer is a live device range of `count` elements.
    unsafe fn reduce_copy(
        &self,
        stream: StreamHandle,
        dtype: DataType,
        op: ReduceOp,
        srcs: &[DevicePtr],
        dsts: &[DevicePtr],
        count: usize,
    ) -> Result<()>;
    /// Enqueues `data[i] /= divisor` (the final step of `Avg`; integers
    /// truncate), bit-identical to the CPU's `kernels::divide`.
    ///
    /// # Safety
    /// `data` is a live device range of `count` elements.
    unsafe fn divide(
        &self,
        stream: StreamHandle,
        dtype: DataType,
        data: DevicePtr,
        count: usize,
        divisor: usize,
    ) -> Result<()>;

    /// Exports the allocation that starts at `ptr` (from [`Device::alloc`])
    /// for other processes of this machine.
    fn ipc_export(&self, ptr: DevicePtr) -> Result<IpcHandle>;
    /// Opens another process's exported allocation; returns its address in
    /// this process.
    fn ipc_import(&self, handle: &IpcHandle) -> Result<DevicePtr>;
    /// Closes an address from [`Device::ipc_import`].
    ///
    /// # Safety
    /// `ptr` came from `ipc_import` here, is closed once, and no enqueued
    /// work still uses it.
    unsafe fn ipc_close(&self, ptr: DevicePtr) -> Result<()>;
    /// Whether this device can map memory of device `peer` (same backend)
    /// directly: `cuDeviceCanAccessPeer` on CUDA (always true for the
    /// same ordinal); always true on `emu`.
    fn can_access_peer(&self, peer: usize) -> Result<bool>;
    /// Enables access from this device's context to device `peer`'s memory
    /// (`cuCtxEnablePeerAccess`); nothing for the same ordinal, on `emu`,
    /// or where it is already enabled.
    fn enable_peer_access(&self, peer: usize) -> Result<()>;

    /// Enqueues a codec operation on device buffers ([`CodecOp`]: encode,
    /// with or without error feedback; decode or decode-and-add of one or
    /// several encodings; fused fp16/bf16 decode-sum-encode) in the
    /// `compress` crate's formats, bit-identical to the CPU codecs. Every
    /// step runs on `stream`; nothing waits for the host. Bad arguments
    /// (unsupported codec, misaligned or short ranges, a missing workspace)
    /// are errors before anything is enqueued; see [`crate::codec`] for the
    /// workspace and the top-k decode status. The default answers
    /// [`DeviceError::Unsupported`].
    ///
    /// # Safety
    /// Every pointer in `op` is a live device range of the size the
    /// operation needs until it completes; inputs and outputs do not
    /// overlap.
    unsafe fn codec(&self, stream: StreamHandle, op: &CodecOp<'_>) -> Result<()> {
        let _ = stream;
        Err(DeviceError::Unsupported {
            what: format!("{} on {}", op.codec().name(), self.backend().name()),
            why: "this backend has no codec kernels".into(),
        })
    }

    /// Enqueues this rank's kernel of a direct all-reduce over IPC memory
    /// ([`DirectAllReduce`]: one-shot or two-shot, reading the peers'
    /// buffers through their mappings, synchronised by the flag areas). The
    /// kernel waits on its peers' kernels: it ends once every peer has done
    /// its share, or when the host sets the control block's abort word.
    /// Bad arguments are errors before anything is enqueued. The default
    /// answers [`DeviceError::Unsupported`].
    ///
    /// # Safety
    /// Every address in `op` is a live range of this device or an open IPC
    /// mapping (inputs, outputs and scratch of `count` elements, flag areas
    /// of [`DirectAllReduce::flag_bytes`]) and the control block is a live pinned
    /// allocation of [`direct::CONTROL_WORDS`] words, until the kernel ends;
    /// every rank launches the same operation with the same epoch.
    unsafe fn direct_all_reduce(
        &self,
        stream: StreamHandle,
        op: &DirectAllReduce<'_>,
    ) -> Result<()> {
        let _ = (stream, op);
        Err(DeviceError::Unsupported {
            what: format!("direct all-reduce on {}", self.backend().name()),
            why: "this backend has no direct all-reduce kernels".into(),
        })
    }

    /// Whether kernels of different processes may run on this device at
    /// the same time (MPS). Without it, a kernel that spins on a flag
    /// another process's kernel sets waits for a kernel that cannot start
    /// until it ends (MPS guide: "A kernel from one CUDA context cannot
    /// execute concurrently with a kernel from another CUDA context").
    /// CUDA: `CU_DEVICE_ATTRIBUTE_MPS_ENABLED` (false where the driver does
    /// not know it); the default, for the emulated device whose processes
    /// each run kernels on threads of their own: true.
    fn mps_enabled(&self) -> bool {
        true
    }

    /// Loads every kernel this device's collectives and codecs can launch
    /// (every module, every function looked up) now, so that no operation
    /// loads one later: under CUDA's lazy loading (the default) a
    /// function's first lookup may synchronise the device (Programming
    /// Guide, "Lazy Loading"), which deadlocks while a stream waits on the
    /// host. Modules come from the NVRTC disk cache after the first
    /// compile. `cuda_include` names the directory of the CUDA headers the
    /// kernels compile with (`SNCL_CUDA_INCLUDE`, `DeviceSettings::
    /// cuda_include`; none: found beside NVRTC or the toolkit); later
    /// compiles on this device use it too. Backends without modules do
    /// nothing (the default).
    fn load_kernels(&self, cuda_include: Option<&std::path::Path>) -> Result<()> {
        let _ = cuda_include;
        Ok(())
    }

    /// Test double only: makes the next enqueued operation on this device
    /// fail with [`DeviceError::Fault`] carrying `what`. The CUDA backend
    /// answers [`DeviceError::Unsupported`].
    fn inject_fault(&self, what: &str) -> Result<()>;

    /// What memory `addr` is ([`PointerKind`]): host memory, device memory
    /// of which device of this backend, or a stale address of this
    /// backend's device space. CUDA asks `cuPointerGetAttribute` (memory
    /// type, device ordinal; memory the driver does not know is host
    /// memory, and a freed device pointer cannot be told from it); the
    /// emulated device answers from its address registry. The address is
    /// never dereferenced.
    fn pointer_kind(&self, addr: u64) -> Result<PointerKind>;

    /// The live allocation of this device that holds `addr`: its base and
    /// length in bytes, so that a collective's arguments can be checked
    /// before anything is enqueued. [`DeviceError::InvalidArgument`] says
    /// what `addr` is instead (host memory, another device's memory, not a
    /// live allocation); [`DeviceError::Unsupported`] (the default): this
    /// backend cannot tell, and nothing is checked.
    fn allocation_range(&self, addr: u64) -> Result<(DevicePtr, usize)> {
        let _ = addr;
        Err(DeviceError::Unsupported {
            what: format!("allocation ranges on {}", self.backend().name()),
            why: "this backend does not look pointers up".into(),
        })
    }

    // ---- dma-buf export (GPUDirect RDMA): the NIC registers device
    // memory through a dma-buf file descriptor (`ibv_reg_dmabuf_mr`).
    // The defaults answer "not supported", so a backend without them
    // stages device pieces through host memory.

    /// Whether this device exports its memory as dma-buf file descriptors
    /// ([`Device::dmabuf_export`]): CUDA's
    /// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED` (driver, kernel ≥ 5.12 and
    /// GPU permitting) and the driver's `cuMemGetHandleForAddressRange`;
    /// always on `emu`. The default is `false`.
    fn dmabuf_supported(&self) -> Result<bool> {
        Ok(false)
    }

    /// Exports the device allocation that holds `ptr .. ptr + bytes` as a
    /// dma-buf ([`DmaBuf`]: a file descriptor owned by the caller, and the
    /// device address range it maps). CUDA rounds the allocation out to
    /// host pages and calls `cuMemGetHandleForAddressRange(..,
    /// CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, ..)`; `emu` hands out the
    /// allocation's shared-memory file. A range that is not inside one
    /// live allocation is an error. The default answers
    /// [`DeviceError::Unsupported`].
    fn dmabuf_export(&self, ptr: DevicePtr, bytes: usize) -> Result<DmaBuf> {
        let _ = (ptr, bytes);
        Err(DeviceError::Unsupported {
            what: format!("dma-buf export on {}", self.backend().name()),
            why: "this backend does not export device memory as dma-buf".into(),
        })
    }

    /// Whether `ptr` is managed (unified) memory, which migrates between
    /// host and device (CUDA's `CU_POINTER_ATTRIBUTE_IS_MANAGED`; the
    /// emulated device answers what `emu::mark_managed` said). A NIC must
    /// not register it through nvidia-peermem: the registration would pin
    /// whichever host pages back it at that moment. The default is
    /// `false` (a backend without managed memory).
    fn is_managed(&self, ptr: DevicePtr) -> Result<bool> {
        let _ = ptr;
        Ok(false)
    }

    /// An identifier of the live allocation that holds `ptr`, never
    /// reused for another allocation while the process lives (CUDA's
    /// `CU_POINTER_ATTRIBUTE_BUFFER_ID`; the allocation id on `emu`): a
    /// cached registration of an exported allocation is still right only
    /// while this answers its [`DmaBuf::id`]. A freed address is an error.
    fn allocation_id(&self, ptr: DevicePtr) -> Result<u64> {
        let _ = ptr;
        Err(DeviceError::Unsupported {
            what: format!("allocation ids on {}", self.backend().name()),
            why: "this backend does not export device memory as dma-buf".into(),
        })
    }

    /// Creates an event that other processes of this machine can wait for,
    /// and exports it: CUDA's `cuEventCreate(CU_EVENT_INTERPROCESS |
    /// CU_EVENT_DISABLE_TIMING)` and `cuIpcGetEventHandle` (the driver API
    /// requires both flags for an interprocess event). Record and wait for
    /// it as any event ([`Device::record_event`],
    /// [`Device::stream_wait_event`]); destroy it with
    /// [`Device::destroy_event`]. Without MPS this is how work of two
    /// processes sharing a device is ordered on the device with no kernel
    /// spinning and no host thread in between. The default answers
    /// [`DeviceError::Unsupported`].
    fn create_ipc_event(&self) -> Result<(EventHandle, IpcHandle)> {
        Err(DeviceError::Unsupported {
            what: format!("interprocess events on {}", self.backend().name()),
            why: "this backend does not share events between processes".into(),
        })
    }

    /// Opens another process's event from [`Device::create_ipc_event`]
    /// (`cuIpcOpenEventHandle`; a handle exported by this process cannot be
    /// opened here: same-process peers use the event itself). Waiting for
    /// it waits for the exporter's latest record issued before the wait
    /// (as `cuStreamWaitEvent` does for any event). Destroy it with
    /// [`Device::destroy_event`]. The default answers
    /// [`DeviceError::Unsupported`].
    fn open_ipc_event(&self, handle: &IpcHandle) -> Result<EventHandle> {
        let _ = handle;
        Err(DeviceError::Unsupported {
            what: format!("interprocess events on {}", self.backend().name()),
            why: "this backend does not share events between processes".into(),
        })
    }

    /// Whether RDMA writes into this device's memory (GPUDirect RDMA) must
    /// be flushed before the device's own later work reads them: CUDA's
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING` below
    /// `..._OWNER` (the CUDA driver API: with `..._NONE` a consumer must
    /// flush; NCCL flushes after each GPUDirect receive). The default (no
    /// dma-buf export) is `false`.
    fn gpudirect_flush_needed(&self) -> Result<bool> {
        Ok(false)
    }

    /// Makes every GPUDirect RDMA write whose completion was seen before
    /// this call visible to this device's work enqueued after it:
    /// `cuFlushGPUDirectRDMAWrites(TARGET_CURRENT_CTX, TO_OWNER)` (needs
    /// `CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST` in
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS`); `emu`
    /// counts (`emu::gpudirect_flushes`). The default answers
    /// [`DeviceError::Unsupported`].
    fn flush_gpudirect_writes(&self) -> Result<()> {
        Err(DeviceError::Unsupported {
            what: format!("GPUDirect RDMA write flushes on {}", self.backend().name()),
            why: "this backend does not export device memory as dma-buf".into(),
        })
    }

    // --- Device identity across processes (nvlink's automatic choice) ---

    /// The device's PCI bus id (`cuDeviceGetPCIBusId`, e.g.
    /// `"0000:1B:00.0"`): unlike the ordinal, it names one device in every
    /// process of the machine, whatever `CUDA_VISIBLE_DEVICES` says. The
    /// emulated device answers a stable fake id per emulated device. The
    /// default answers [`DeviceError::Unsupported`].
    fn pci_bus_id(&self) -> Result<String> {
        Err(DeviceError::Unsupported {
            what: format!(
                "the PCI bus id of {} device {}",
                self.backend().name(),
                self.ordinal()
            ),
            why: "this backend does not report one".into(),
        })
    }

    /// The ordinal, in this process, of the device with PCI bus id `bus_id`
    /// of this backend (`cuDeviceGetByPCIBusId`): `Ok(None)` where this
    /// process cannot see that device (not in `CUDA_VISIBLE_DEVICES`, or an
    /// id of no device). The default answers [`DeviceError::Unsupported`].
    fn ordinal_of_pci_bus_id(&self, bus_id: &str) -> Result<Option<usize>> {
        Err(DeviceError::Unsupported {
            what: format!("finding device {bus_id:?} on {}", self.backend().name()),
            why: "this backend does not map PCI bus ids".into(),
        })
    }
}

/// A device allocation exported as a dma-buf ([`Device::dmabuf_export`]):
/// byte `offset` of the file `fd` holds device address `base`, and the
/// export covers `len` bytes from there (page-aligned on CUDA). Closing
/// `fd` (dropping this value) leaves the allocation as it is; a NIC
/// registration made from it keeps its own reference.
#[derive(Debug)]
pub struct DmaBuf {
    /// The dma-buf file descriptor.
    pub fd: std::os::fd::OwnedFd,
    /// Where `base` lies in the dma-buf.
    pub offset: u64,
    /// The first device address exported.
    pub base: DevicePtr,
    /// Bytes exported from `base`.
    pub len: usize,
    /// The allocation's [`Device::allocation_id`].
    pub id: u64,
}

/// Opens device `ordinal` of `backend`.
///
/// `Cuda` fails with [`DeviceError::NoDriver`], [`DeviceError::NoDevice`],
/// [`DeviceError::NoNvrtc`] or [`DeviceError::DriverTooOld`] where CUDA is
/// not usable, never with a panic. `Emu` needs the `emu` feature.
pub fn open(backend: Backend, ordinal: usize) -> Result<Arc<dyn Device>> {
    match backend {
        Backend::Cuda => cuda::open(ordinal),
        Backend::Emu => open_emu(ordinal),
    }
}

/// How many devices `backend` has: the driver's count on `Cuda` (the same
/// errors as [`open`] where CUDA is not usable), 8 on `Emu` (`emu::DEVICES`).
pub fn device_count(backend: Backend) -> Result<usize> {
    match backend {
        Backend::Cuda => cuda::device_count(),
        Backend::Emu => emu_count(),
    }
}

/// The device current on the calling thread, if the backend has such a
/// notion: on `Cuda` the device of the current context (what
/// `cudaSetDevice` selected, or a cudarc context bound to this thread); on
/// `Emu` always `None`.
pub fn current_device(backend: Backend) -> Result<Option<usize>> {
    match backend {
        Backend::Cuda => cuda::current_device(),
        Backend::Emu => Ok(None),
    }
}

/// Whether this process may run device operations at all: a CUDA driver
/// library loads (no device is touched: nothing is initialised), or an
/// emulated device was opened. Transports that only pay off for device
/// memory (nvlink) are offered only then, so a host-only run keeps its
/// host transports' names.
pub fn devices_possible() -> bool {
    cuda::driver_present() || emu_opened()
}

#[cfg(feature = "emu")]
fn emu_opened() -> bool {
    emu::opened()
}

#[cfg(not(feature = "emu"))]
fn emu_opened() -> bool {
    false
}

#[cfg(feature = "emu")]
fn emu_count() -> Result<usize> {
    Ok(emu::DEVICES)
}

#[cfg(not(feature = "emu"))]
fn emu_count() -> Result<usize> {
    open_emu(0).map(|_| 0)
}

#[cfg(feature = "emu")]
fn open_emu(ordinal: usize) -> Result<Arc<dyn Device>> {
    emu::open(ordinal)
}

#[cfg(not(feature = "emu"))]
fn open_emu(_ordinal: usize) -> Result<Arc<dyn Device>> {
    Err(DeviceError::Unsupported {
        what: "the emulated device".into(),
        why: "this build has no `emu` feature (it is a test double)".into(),
    })
}

mod buffer;
pub use buffer::{DeviceBuffer, PinnedBuffer};
pub mod codec;
pub use codec::CodecOp;
pub mod direct;
pub use direct::{DirectAllReduce, Staged, StagedCollective};
mod checks;
mod pointer;
pub use pointer::PointerKind;
mod queue;
mod toolkit_paths;
pub use queue::DeviceQueue;

pub mod cuda;
#[cfg(feature = "emu")]
pub mod emu;
pub mod nvrtc;
