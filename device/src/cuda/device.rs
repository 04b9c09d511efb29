//! [`CudaDevice`]: the [`Device`] trait on one CUDA device.

use std::collections::HashMap;
use std::ffi::{c_uint, c_void};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::sys::{self, CUcontext, CUdevice, CUdevice_attribute, CUevent, CUstream};
use cudarc::driver::CudaContext;
use kernels::{DataType, ReduceOp};

use super::driver;
use super::launch::{self, Kernels, ReduceCopyArgs};
use crate::{
    Arch, Backend, Device, DeviceError, DevicePtr, EventHandle, IpcHandle, PointerKind, Result,
    StreamHandle,
};
use kernels::cuda::BLOCK_THREADS as BLOCK;

/// Page-locked host memory flags: portable (pinned for every context) and
/// mapped (so `cuMemHostGetDevicePointer` works without relying on unified
/// addressing); never write-combined, since the host reads it.
const PINNED_FLAGS: c_uint = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;

/// One CUDA device: its context, its properties, and its kernels: one
/// module per dtype, compiled with NVRTC for that dtype alone
/// (`kernels::cuda::dtype_options`) and loaded on the first reduce or
/// divide of that dtype.
pub struct CudaDevice {
    ordinal: usize,
    dev: CUdevice,
    ctx: CUcontext,
    /// The user's context, when wrapped with [`CudaDevice::from_context`];
    /// `None` when this value retained the primary context itself.
    user: Option<Arc<CudaContext>>,
    name: String,
    arch: Arch,
    sm_count: u32,
    /// The loaded module of each source and dtype used so far.
    kernels: Mutex<HashMap<(Source, DataType), Kernels>>,
    /// The codec module (`kernels::cuda_codec::CODEC_SOURCE`), compiled
    /// and loaded on the first [`Device::codec`].
    codec: Mutex<Option<Kernels>>,
    /// The CUDA headers' directory [`Device::load_kernels`] was given,
    /// for every compile on this device (none: found by NVRTC's side).
    cuda_include: Mutex<Option<std::path::PathBuf>>,
    /// Live pinned allocations of [`Device::alloc_pinned`]: host base ->
    /// (bytes, device address), so that stream memory operations on them
    /// need no `cuMemHostGetDevicePointer` per call.
    pinned: Mutex<std::collections::BTreeMap<usize, (usize, u64)>>,
}

// SAFETY: the raw handles (context, module, functions) are driver objects
// that the CUDA driver API lets any thread use; every call makes the context
// current on the calling thread first, and the kernel table is behind a
// mutex.
unsafe impl Send for CudaDevice {}
// SAFETY: as above; no method hands out interior references.
unsafe impl Sync for CudaDevice {}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.ordinal)
            .field("name", &self.name)
            .field("arch", &self.arch)
            .field("sm_count", &self.sm_count)
            .field("user_context", &self.user.is_some())
            .finish()
    }
}

/// Which kernel source a module was compiled from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Source {
    /// `kernels::cuda::REDUCE_SOURCE`: reduce-copy and divide.
    Reduce,
    /// `kernels::cuda::DIRECT_SOURCE`: the direct all-reduce.
    Direct,
}

/// Threads a block of the direct all-reduce kernels.
const DIRECT_BLOCK: u32 = crate::direct::launch_limits(crate::Backend::Cuda).0;

fn stream(s: StreamHandle) -> CUstream {
    s.0 as usize as CUstream
}

fn event(e: EventHandle) -> CUevent {
    e.0 as usize as CUevent
}

impl CudaDevice {
    /// Opens device `ordinal` with its primary context (see
    /// [`crate::cuda::open`] for the errors).
    pub fn open(ordinal: usize) -> Result<CudaDevice> {
        super::probe::probe(ordinal)?;
        let dev = driver::device_get(ordinal)?;
        let ctx = driver::primary_retain(ordinal, dev)?;
        match CudaDevice::with_context(ordinal, dev, ctx, None) {
            Ok(d) => Ok(d),
            Err(e) => {
                if let Err(r) = driver::primary_release(ordinal, dev) {
                    tracing::warn!(error = %r, "releasing the primary context after a failed open");
                }
                Err(e)
            }
        }
    }

    /// Wraps a context the caller made with cudarc. The device keeps `ctx`
    /// alive; the same probes as [`CudaDevice::open`] run first.
    pub fn from_context(ctx: Arc<CudaContext>) -> Result<CudaDevice> {
        let ordinal = ctx.ordinal();
        super::probe::probe(ordinal)?;
        let (dev, raw) = (ctx.cu_device(), ctx.cu_ctx());
        CudaDevice::with_context(ordinal, dev, raw, Some(ctx))
    }

    fn with_context(
        ordinal: usize,
        dev: CUdevice,
        ctx: CUcontext,
        user: Option<Arc<CudaContext>>,
    ) -> Result<CudaDevice> {
        driver::set_current(ordinal, ctx)?;
        let attr = |a| driver::attribute(ordinal, dev, a);
        let major = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let sms = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        // Only informative (see the module docs): CUDA 12 reports the legacy
        // v1 memory-operation API here.
        let memops_v1 = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1);
        let name = driver::device_name(ordinal, dev)?;
        let arch = Arch {
            major: major.max(0) as u32,
            minor: minor.max(0) as u32,
        };
        tracing::info!(
            ordinal,
            %name,
            sm = format!("{}{}", arch.major, arch.minor),
            sms,
            memops_v1 = ?memops_v1.ok(),
            "CUDA device opened"
        );
        Ok(CudaDevice {
            ordinal,
            dev,
            ctx,
            user,
            name,
            arch,
            sm_count: sms.max(1) as u32,
            kernels: Mutex::new(HashMap::new()),
            codec: Mutex::new(None),
            cuda_include: Mutex::new(None),
            pinned: Mutex::new(std::collections::BTreeMap::new()),
        })
    }

    /// Makes this device's context current on the calling thread.
    fn bind(&self) -> Result<()> {
        match super::scope::entered() {
            e if e == self.ctx as usize => return Ok(()),
            // Another device's scope: making this context current ends
            // what that scope knew.
            0 => {}
            _ => super::scope::leave(0),
        }
        driver::set_current(self.ordinal, self.ctx)
    }

    /// The device address of host address `p`: from the table of pinned
    /// allocations made here, else asked of the driver.
    fn device_address(&self, p: *mut c_void) -> Result<u64> {
        let addr = p as usize;
        let known = self
            .pinned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .range(..=addr)
            .next_back()
            .filter(|(&base, &(bytes, _))| addr < base + bytes)
            .map(|(&base, &(_, dev))| dev + (addr - base) as u64);
        match known {
            Some(d) => Ok(d),
            None => driver::host_device_ptr(self.ordinal, p),
        }
    }

    /// Launches kernel `name` of `dtype` with `params`, compiling and
    /// loading `dtype`'s module on its first use.
    ///
    /// # Safety
    /// As for [`driver::launch`].
    unsafe fn launch(
        &self,
        source: Source,
        dtype: DataType,
        name: &str,
        (grid, block): (u32, u32),
        s: StreamHandle,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        self.bind()?;
        let f = self.with_module(source, dtype, |k| k.function(self.ordinal, name))?;
        // SAFETY: the caller's contract; `f` belongs to this context.
        unsafe { driver::launch(self.ordinal, f, grid, block, stream(s), params) }
    }

    /// Runs `f` on the loaded module of `source` for `dtype`, compiling
    /// (or reading from the NVRTC cache) and loading it first if needed.
    /// The context is current on the calling thread.
    fn with_module<R>(
        &self,
        source: Source,
        dtype: DataType,
        f: impl FnOnce(&mut Kernels) -> Result<R>,
    ) -> Result<R> {
        let mut guard = self
            .kernels
            .lock()
            .map_err(|_| self.poisoned("kernel table"))?;
        let table = match guard.entry((source, dtype)) {
            std::collections::hash_map::Entry::Occupied(k) => k.into_mut(),
            std::collections::hash_map::Entry::Vacant(slot) => {
                let text = match source {
                    Source::Reduce => kernels::cuda::REDUCE_SOURCE,
                    Source::Direct => kernels::cuda::DIRECT_SOURCE,
                };
                let module = crate::nvrtc::compile_with(
                    text,
                    kernels::cuda::HEADERS,
                    self.arch,
                    &kernels::cuda::dtype_options(dtype),
                    self.include_dir()?.as_deref(),
                )?;
                let m = driver::module_load(self.ordinal, &launch::image(&module))?;
                tracing::debug!(
                    ordinal = self.ordinal,
                    dtype = dtype.name(),
                    ?source,
                    target = %module.target,
                    "kernels loaded"
                );
                slot.insert(Kernels::new(m))
            }
        };
        f(table)
    }

    /// Runs `f` on the loaded codec module, compiling and loading it first
    /// if needed. The context is current on the calling thread.
    fn with_codec_module<R>(&self, f: impl FnOnce(&mut Kernels) -> Result<R>) -> Result<R> {
        let mut guard = self
            .codec
            .lock()
            .map_err(|_| self.poisoned("codec kernel table"))?;
        let table = match guard.as_mut() {
            Some(t) => t,
            None => {
                let module = crate::nvrtc::compile_with(
                    kernels::cuda_codec::CODEC_SOURCE,
                    &kernels::cuda_codec::codec_headers(),
                    self.arch,
                    &[],
                    self.include_dir()?.as_deref(),
                )?;
                let m = driver::module_load(self.ordinal, &launch::image(&module))?;
                tracing::debug!(ordinal = self.ordinal, target = %module.target, "codec kernels loaded");
                guard.insert(Kernels::new(m))
            }
        };
        f(table)
    }
}

impl CudaDevice {
    /// The error for a lock a panic poisoned.
    fn poisoned(&self, what: &str) -> DeviceError {
        DeviceError::Fault {
            ordinal: self.ordinal,
            detail: format!("the {what}'s lock was poisoned by a panic"),
        }
    }

    /// The CUDA headers' directory compiles on this device use, if
    /// [`Device::load_kernels`] was given one.
    fn include_dir(&self) -> Result<Option<std::path::PathBuf>> {
        Ok(self
            .cuda_include
            .lock()
            .map_err(|_| self.poisoned("CUDA include directory"))?
            .clone())
    }
}

impl CudaDevice {
    /// Runs a codec plan's launches on stream `s`, compiling and loading
    /// the codec module on first use.
    ///
    /// # Safety
    /// Every address in the launches is a live device range sized for
    /// what the plan does with it.
    unsafe fn launch_codec(
        &self,
        s: StreamHandle,
        launches: &mut [kernels::cuda_codec::Launch],
    ) -> Result<()> {
        if launches.is_empty() {
            return Ok(());
        }
        self.bind()?;
        self.with_codec_module(|table| {
            let block = kernels::cuda::BLOCK_THREADS;
            for l in launches.iter_mut() {
                let f = table.function(self.ordinal, &l.kernel)?;
                let grid = match l.items {
                    kernels::cuda_codec::Items::Single => 1,
                    kernels::cuda_codec::Items::Many(m) => {
                        m.div_ceil(u64::from(block))
                            .clamp(1, u64::from(self.sm_count) * 8) as u32
                    }
                };
                let mut params = [launch::param(&mut l.args)];
                // SAFETY: one parameter, `SnclCodecArgs` by value (CodecArgs is
                // its repr(C) mirror); the caller vouches for its addresses.
                unsafe { driver::launch(self.ordinal, f, grid, block, stream(s), &mut params)? };
            }
            Ok(())
        })
    }

    /// Every kernel name of `source` for `dtype` (see
    /// [`Device::load_kernels`]).
    fn kernel_names(source: Source, dtype: DataType) -> Vec<String> {
        let mut names: Vec<String> = match source {
            Source::Reduce => kernels::cuda::reduce_copy_kernels()
                .filter(|(d, _, _)| *d == dtype)
                .map(|(_, _, name)| name)
                .chain([kernels::cuda::divide_kernel(dtype)])
                .collect(),
            Source::Direct => ReduceOp::ALL
                .into_iter()
                .filter_map(|op| kernels::cuda::direct_kernel(dtype, op))
                .collect(),
        };
        names.sort();
        names.dedup();
        names
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        if let Err(e) = self.bind() {
            tracing::warn!(ordinal = self.ordinal, error = %e, "dropping a CUDA device");
            return;
        }
        // A poisoned table still holds loaded modules: unload them too.
        let table = self.kernels.get_mut().unwrap_or_else(|p| p.into_inner());
        let modules = std::mem::take(table);
        for ((source, dtype), k) in modules {
            // SAFETY: the module is this device's and unloaded once (taken
            // out of the table); every owner of work on it has synchronised
            // before dropping the device (it outlives its buffers and
            // streams by the trait's contract).
            if let Err(e) = unsafe { driver::module_unload(self.ordinal, k.module) } {
                tracing::warn!(dtype = dtype.name(), ?source, error = %e, "unloading the sncl kernels");
            }
        }
        let codec = self.codec.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = codec.take() {
            // SAFETY: as for the dtype modules above.
            if let Err(e) = unsafe { driver::module_unload(self.ordinal, k.module) } {
                tracing::warn!(error = %e, "unloading the sncl codec kernels");
            }
        }
        if self.user.is_none() {
            if let Err(e) = driver::primary_release(self.ordinal, self.dev) {
                tracing::warn!(error = %e, "releasing the primary context");
            }
        }
    }
}

impl Device for CudaDevice {
    fn backend(&self) -> Backend {
        Backend::Cuda
    }

    fn ordinal(&self) -> usize {
        self.ordinal
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    fn arch(&self) -> Arch {
        self.arch
    }

    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        self.bind()?;
        // cuMemAlloc refuses 0 bytes; one byte gives a distinct pointer.
        driver::mem_alloc(self.ordinal, bytes.max(1)).map(DevicePtr)
    }

    unsafe fn free(&self, ptr: DevicePtr) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller's contract (from `alloc`, freed once, idle).
        unsafe { driver::mem_free(self.ordinal, ptr.0) }
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<NonNull<u8>> {
        self.bind()?;
        let p = driver::host_alloc(self.ordinal, bytes.max(1), PINNED_FLAGS)?;
        let p = NonNull::new(p.cast::<u8>()).ok_or_else(|| DeviceError::Call {
            ordinal: self.ordinal,
            call: "cuMemHostAlloc",
            detail: "returned success and a null pointer".into(),
        })?;
        let dev = match driver::host_device_ptr(self.ordinal, p.as_ptr().cast()) {
            Ok(d) => d,
            Err(e) => {
                // SAFETY: allocated just above, not handed out, freed once.
                let _ = unsafe { driver::host_free(self.ordinal, p.as_ptr().cast()) };
                return Err(e);
            }
        };
        self.pinned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(p.as_ptr() as usize, (bytes.max(1), dev));
        Ok(p)
    }

    unsafe fn free_pinned(&self, ptr: NonNull<u8>, _bytes: usize) -> Result<()> {
        self.bind()?;
        self.pinned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(ptr.as_ptr() as usize));
        // SAFETY: the caller's contract (from `alloc_pinned`, freed once).
        unsafe { driver::host_free(self.ordinal, ptr.as_ptr().cast()) }
    }

    fn create_stream(&self) -> Result<StreamHandle> {
        self.bind()?;
        driver::stream_create(self.ordinal).map(|s| StreamHandle(s as usize as u64))
    }

    unsafe fn destroy_stream(&self, s: StreamHandle) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller's contract.
        unsafe { driver::stream_destroy(self.ordinal, stream(s)) }
    }

    fn synchronize(&self, s: StreamHandle, deadline: Instant) -> Result<()> {
        self.bind()?;
        let start = Instant::now();
        let mut pause = Duration::from_micros(1);
        loop {
            if driver::stream_done(self.ordinal, stream(s))? {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(DeviceError::Timeout {
                    ordinal: self.ordinal,
                    what: format!("synchronizing stream {:#x}", s.0),
                    ms: deadline.saturating_duration_since(start).as_millis() as u64,
                });
            }
            if pause < Duration::from_micros(64) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(pause.min(deadline - now));
            }
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    fn direct_resident_blocks(&self) -> Result<Option<u64>> {
        self.bind()?;
        let (block, _) = crate::direct::launch_limits(crate::Backend::Cuda);
        let name = kernels::cuda::direct_kernel(DataType::Float32, kernels::ReduceOp::Sum)
            .ok_or_else(|| self.poisoned("direct kernel name"))?;
        let f = self.with_module(Source::Direct, DataType::Float32, |k| {
            k.function(self.ordinal, &name)
        })?;
        let per_sm = driver::occupancy(self.ordinal, f, block)?;
        Ok(Some(u64::from(per_sm) * u64::from(self.sm_count)))
    }

    fn enter(&self) -> Result<crate::Entered> {
        if driver::current_context()? != self.ctx {
            driver::set_current(self.ordinal, self.ctx)?;
        }
        Ok(crate::Entered {
            cuda_outer: Some(super::scope::enter(self.ctx as usize)),
            _thread: std::marker::PhantomData,
        })
    }

    fn is_capturing(&self, s: StreamHandle) -> Result<bool> {
        self.bind()?;
        driver::stream_capturing(self.ordinal, stream(s))
    }

    unsafe fn copy_h2d_async(
        &self,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
        s: StreamHandle,
    ) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller's contract.
        unsafe { driver::copy_h2d(self.ordinal, dst.0, src.cast(), bytes, stream(s)) }
    }

    unsafe fn copy_d2h_async(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        bytes: usize,
        s: StreamHandle,
    ) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller's contract.
        unsafe { driver::copy_d2h(self.ordinal, dst.cast(), src.0, bytes, stream(s)) }
    }

    unsafe fn copy_d2d_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        s: StreamHandle,
    ) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller's contract.
        unsafe { driver::copy_d2d(self.ordinal, dst.0, src.0, bytes, stream(s)) }
    }

    fn create_event(&self) -> Result<EventHandle> {
        self.bind()?;
        driver::event_create(self.ordinal).map(|e| EventHandle(e as usize as u64))
    }

    unsafe fn destroy_event(&self, e: EventHandle) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller's contract.
        unsafe { driver::event_destroy(self.ordinal, event(e)) }
    }

    fn record_event(&self, e: EventHandle, s: StreamHandle) -> Result<()> {
        self.bind()?;
        driver::event_record(self.ordinal, event(e), stream(s))
    }

    fn event_done(&self, e: EventHandle) -> Result<bool> {
        self.bind()?;
        driver::event_done(self.ordinal, event(e))
    }

    fn stream_wait_event(&self, s: StreamHandle, e: EventHandle) -> Result<()> {
        self.bind()?;
        driver::stream_wait_event(self.ordinal, stream(s), event(e))
    }

    fn event_elapsed_ms(&self, start: EventHandle, end: EventHandle) -> Result<f32> {
        self.bind()?;
        driver::event_elapsed(self.ordinal, event(start), event(end))
    }

    unsafe fn stream_write_u32(&self, s: StreamHandle, addr: *mut u32, value: u32) -> Result<()> {
        self.bind()?;
        let dptr = self.device_address(addr.cast())?;
        // SAFETY: `dptr` maps the caller's live pinned word.
        unsafe { driver::stream_write(self.ordinal, stream(s), dptr, value) }
    }

    unsafe fn stream_wait_u32(&self, s: StreamHandle, addr: *const u32, value: u32) -> Result<()> {
        self.bind()?;
        let dptr = self.device_address(addr.cast_mut().cast())?;
        // SAFETY: `dptr` maps the caller's live pinned word.
        unsafe { driver::stream_wait_geq(self.ordinal, stream(s), dptr, value) }
    }

    unsafe fn reduce_copy(
        &self,
        s: StreamHandle,
        dtype: DataType,
        op: ReduceOp,
        srcs: &[DevicePtr],
        dsts: &[DevicePtr],
        count: usize,
    ) -> Result<()> {
        let name =
            crate::checks::reduce_copy_args(self.ordinal, srcs.len(), dsts.len(), dtype, op)?;
        if count == 0 {
            return Ok(());
        }
        let mut args = ReduceCopyArgs::new(srcs, dsts, count);
        let grid = launch::grid(count, dtype.size(), self.sm_count);
        let mut params = [launch::param(&mut args)];
        // SAFETY: one parameter, the ABI struct by value; the pointers in it
        // are the caller's live ranges of `count` elements.
        unsafe { self.launch(Source::Reduce, dtype, &name, (grid, BLOCK), s, &mut params) }
    }

    unsafe fn divide(
        &self,
        s: StreamHandle,
        dtype: DataType,
        data: DevicePtr,
        count: usize,
        divisor: usize,
    ) -> Result<()> {
        crate::checks::divisor(self.ordinal, divisor)?;
        if count == 0 {
            return Ok(());
        }
        let mut ptr = data.0;
        let mut n = count as u64;
        let mut d = divisor as u64;
        let grid = launch::grid(count, dtype.size(), self.sm_count);
        let mut params = [
            launch::param(&mut ptr),
            launch::param(&mut n),
            launch::param(&mut d),
        ];
        let name = kernels::cuda::divide_kernel(dtype);
        // SAFETY: three parameters matching `sncl_divide_<dtype>(void*,
        // unsigned long long, unsigned long long)`; `data` is the caller's
        // live range of `count` elements.
        unsafe { self.launch(Source::Reduce, dtype, &name, (grid, BLOCK), s, &mut params) }
    }

    unsafe fn direct_all_reduce(
        &self,
        s: StreamHandle,
        op: &crate::DirectAllReduce<'_>,
    ) -> Result<()> {
        let name = op.check(self.ordinal, DIRECT_BLOCK)?;
        if op.count == 0 {
            return Ok(());
        }
        self.bind()?;
        let control = self.device_address(op.control.cast())?;
        let mut args = crate::direct::DirectArgs::new(op, |p| p.0, control);
        let mut params = [launch::param(&mut args)];
        // SAFETY: one parameter, the ABI struct by value; the caller's
        // contract covers every address in it. The grid (at most
        // DIRECT_MAX_BLOCKS blocks) stays co-resident with the peers'.
        unsafe {
            self.launch(
                Source::Direct,
                op.dtype,
                &name,
                (op.grid, DIRECT_BLOCK),
                s,
                &mut params,
            )
        }
    }

    unsafe fn codec(&self, s: StreamHandle, op: &crate::CodecOp<'_>) -> Result<()> {
        let mut launches = crate::codec::plan(self.ordinal, op, |ptr, bytes, align, what| {
            if bytes > 0 {
                crate::codec::check_align(self.ordinal, ptr, align, what)?;
            }
            Ok(ptr.0)
        })?;
        // SAFETY: the caller's contract: every range is live and sized as
        // the plan (checked against the codec and n above) uses it.
        unsafe { self.launch_codec(s, &mut launches) }
    }

    fn ipc_export(&self, ptr: DevicePtr) -> Result<IpcHandle> {
        self.bind()?;
        driver::ipc_get(self.ordinal, ptr.0).map(IpcHandle)
    }

    fn ipc_import(&self, handle: &IpcHandle) -> Result<DevicePtr> {
        self.bind()?;
        driver::ipc_open(self.ordinal, &handle.0).map(DevicePtr)
    }

    unsafe fn ipc_close(&self, ptr: DevicePtr) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller's contract.
        unsafe { driver::ipc_close(self.ordinal, ptr.0) }
    }

    fn can_access_peer(&self, peer: usize) -> Result<bool> {
        if peer == self.ordinal {
            return Ok(true);
        }
        self.bind()?;
        driver::can_access_peer(self.ordinal, peer)
    }

    fn enable_peer_access(&self, peer: usize) -> Result<()> {
        if peer == self.ordinal {
            return Ok(());
        }
        self.bind()?;
        driver::enable_peer_access(self.ordinal, peer)
    }

    fn allocation_range(&self, addr: u64) -> Result<(DevicePtr, usize)> {
        let not_ours = |detail: String| DeviceError::InvalidArgument {
            ordinal: self.ordinal,
            call: "allocation_range",
            detail,
        };
        match self.pointer_kind(addr)? {
            PointerKind::Device { ordinal } if ordinal == self.ordinal => {
                self.bind()?;
                driver::address_range(self.ordinal, addr)
                    .map(|(base, bytes)| (DevicePtr(base), bytes))
            }
            PointerKind::Device { ordinal } => Err(not_ours(format!(
                "{addr:#x} is memory of device {ordinal}, not of device {}",
                self.ordinal
            ))),
            PointerKind::Host => Err(not_ours(format!(
                "{addr:#x} is host memory (or freed device memory, which the driver cannot tell \
                 apart), not device memory"
            ))),
            PointerKind::Stale { detail } => Err(not_ours(detail)),
        }
    }

    fn mps_enabled(&self) -> bool {
        let attr = CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MPS_ENABLED;
        driver::attribute(self.ordinal, self.dev, attr).is_ok_and(|v| v != 0)
    }

    fn load_kernels(&self, cuda_include: Option<&std::path::Path>) -> Result<()> {
        if let Some(dir) = cuda_include {
            *self
                .cuda_include
                .lock()
                .map_err(|_| self.poisoned("CUDA include directory"))? = Some(dir.to_path_buf());
        }
        self.bind()?;
        let started = std::time::Instant::now();
        let mut functions = 0;
        for dtype in DataType::ALL {
            for source in [Source::Reduce, Source::Direct] {
                let names = CudaDevice::kernel_names(source, dtype);
                if names.is_empty() {
                    continue;
                }
                self.with_module(source, dtype, |k| {
                    for name in &names {
                        k.function(self.ordinal, name)?;
                    }
                    Ok(())
                })?;
                functions += names.len();
            }
        }
        let codec = kernels::cuda_codec::kernel_names();
        self.with_codec_module(|k| {
            for name in &codec {
                k.function(self.ordinal, name)?;
            }
            Ok(())
        })?;
        functions += codec.len();
        tracing::info!(
            ordinal = self.ordinal,
            functions,
            ms = started.elapsed().as_millis() as u64,
            "every sncl kernel loaded"
        );
        Ok(())
    }

    fn inject_fault(&self, what: &str) -> Result<()> {
        Err(DeviceError::Unsupported {
            what: format!("fault injection ({what}) on CUDA device {}", self.ordinal),
            why: "only the emulated device injects faults".into(),
        })
    }

    fn pointer_kind(&self, addr: u64) -> Result<PointerKind> {
        super::pointer::kind(self.ordinal, addr, || self.bind())
    }

    // ---- dma-buf export (GPUDirect RDMA): see `dmabuf.rs`.

    fn dmabuf_supported(&self) -> Result<bool> {
        self.bind()?;
        super::dmabuf::supported(self.ordinal, self.dev)
    }

    fn create_ipc_event(&self) -> Result<(EventHandle, IpcHandle)> {
        self.bind()?;
        driver::ipc_event_create(self.ordinal)
            .map(|(e, h)| (EventHandle(e as usize as u64), IpcHandle(h)))
    }

    fn open_ipc_event(&self, handle: &IpcHandle) -> Result<EventHandle> {
        self.bind()?;
        driver::ipc_event_open(self.ordinal, &handle.0).map(|e| EventHandle(e as usize as u64))
    }

    fn dmabuf_export(&self, ptr: DevicePtr, bytes: usize) -> Result<crate::DmaBuf> {
        self.bind()?;
        super::dmabuf::export(self.ordinal, ptr.0, bytes)
    }

    fn allocation_id(&self, ptr: DevicePtr) -> Result<u64> {
        self.bind()?;
        super::dmabuf::buffer_id(self.ordinal, ptr.0)
    }

    fn is_managed(&self, ptr: DevicePtr) -> Result<bool> {
        self.bind()?;
        super::dmabuf::is_managed(self.ordinal, ptr.0)
    }

    fn gpudirect_flush_needed(&self) -> Result<bool> {
        super::dmabuf::flush_needed(self.ordinal, self.dev)
    }

    fn flush_gpudirect_writes(&self) -> Result<()> {
        self.bind()?;
        super::dmabuf::flush_writes(self.ordinal, self.dev)
    }

    fn pci_bus_id(&self) -> Result<String> {
        driver::pci_bus_id(self.ordinal)
    }

    fn ordinal_of_pci_bus_id(&self, bus_id: &str) -> Result<Option<usize>> {
        driver::ordinal_of_pci_bus_id(self.ordinal, bus_id)
    }
}
