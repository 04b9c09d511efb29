//! The emulated device's [`Device`] calls: each checks its arguments, then
//! queues the work on the stream's worker.

use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Instant;

use kernels::{DataType, ReduceOp};

use super::device::{lock, Emu};
use super::memory::{Origin, Span, MAX_ALLOC};
use super::shm::{decode_handle, ShmMap};
use super::stream::{Host, Op, Stream, SyncError};
use crate::{
    Arch, Backend, Device, DeviceError, DevicePtr, EventHandle, IpcHandle, PointerKind, Result,
    StreamHandle,
};

impl Device for Emu {
    fn backend(&self) -> Backend {
        Backend::Emu
    }

    fn ordinal(&self) -> usize {
        self.ordinal
    }

    fn name(&self) -> String {
        "emu".into()
    }

    fn arch(&self) -> Arch {
        Arch { major: 0, minor: 0 }
    }

    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        self.check()?;
        let oom = DeviceError::OutOfMemory {
            ordinal: self.ordinal,
            bytes,
        };
        if bytes > MAX_ALLOC {
            return Err(oom);
        }
        let map = ShmMap::create(bytes).map_err(|e| match e.raw_os_error() {
            Some(libc::ENOSPC | libc::ENOMEM | libc::EFBIG) => oom,
            _ => DeviceError::Call {
                ordinal: self.ordinal,
                call: "alloc",
                detail: format!("creating the shared-memory file of {bytes} bytes: {e}"),
            },
        })?;
        let ptr = self
            .memory
            .insert(map, Origin::Alloc)
            .map_err(|detail| self.invalid("alloc", detail))?;
        tracing::trace!(ordinal = self.ordinal, bytes, ?ptr, "emulated alloc");
        Ok(ptr)
    }

    unsafe fn free(&self, ptr: DevicePtr) -> Result<()> {
        let r = self.memory.remove(ptr, Origin::Alloc);
        self.after_release(r.map(drop).map_err(|d| self.invalid("free", d)))
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<NonNull<u8>> {
        self.check()?;
        self.memory
            .alloc_pinned(bytes)
            .ok_or(DeviceError::OutOfMemory {
                ordinal: self.ordinal,
                bytes,
            })
    }

    unsafe fn free_pinned(&self, ptr: NonNull<u8>, bytes: usize) -> Result<()> {
        let r = self.memory.free_pinned(ptr, bytes);
        self.after_release(r.map_err(|d| self.invalid("free_pinned", d)))
    }

    fn create_stream(&self) -> Result<StreamHandle> {
        self.check()?;
        let id = self.new_handle();
        let name = format!("sncl-emu{}-s{id}", self.ordinal);
        let stream = Stream::start(self.state.clone(), name).map_err(|e| DeviceError::Call {
            ordinal: self.ordinal,
            call: "create_stream",
            detail: format!("starting the stream's worker thread: {e}"),
        })?;
        lock(&self.streams).insert(id, Arc::new(stream));
        tracing::debug!(
            ordinal = self.ordinal,
            stream = id,
            "created an emulated stream"
        );
        Ok(StreamHandle(id))
    }

    unsafe fn destroy_stream(&self, stream: StreamHandle) -> Result<()> {
        let s = lock(&self.streams).remove(&stream.0).ok_or_else(|| {
            self.invalid(
                "destroy_stream",
                format!("{stream:?} is not a live stream of this device"),
            )
        });
        let r = s.map(|s| {
            // Queued work still runs (as on CUDA); the worker ends after it.
            if let Some(w) = s.close() {
                lock(&self.retired).push(w);
            }
            tracing::debug!(
                ordinal = self.ordinal,
                stream = stream.0,
                "destroyed an emulated stream"
            );
        });
        self.after_release(r)
    }

    fn synchronize(&self, stream: StreamHandle, deadline: Instant) -> Result<()> {
        let start = Instant::now();
        let s = self.stream("synchronize", stream)?;
        match s.synchronize(deadline) {
            Ok(()) => self.check(),
            Err(SyncError::Timeout { pending }) => {
                // A fault elsewhere may be why the work stalls: report it.
                self.check()?;
                Err(DeviceError::Timeout {
                    ordinal: self.ordinal,
                    what: format!(
                        "synchronize of {stream:?} ({pending} operation(s) still queued)"
                    ),
                    ms: deadline.saturating_duration_since(start).as_millis() as u64,
                })
            }
            Err(SyncError::Gone) => {
                self.check()?;
                Err(DeviceError::Call {
                    ordinal: self.ordinal,
                    call: "synchronize",
                    detail: format!("the worker of {stream:?} ended with work queued"),
                })
            }
        }
    }

    fn is_capturing(&self, stream: StreamHandle) -> Result<bool> {
        self.check()?;
        self.stream("is_capturing", stream).map(|_| false)
    }

    unsafe fn copy_h2d_async(
        &self,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        let call = "copy_h2d_async";
        if src.is_null() && bytes > 0 {
            return Err(self.invalid(call, "the host source is null".into()));
        }
        let dst = self.span(call, dst, bytes)?;
        let src = Host {
            ptr: src as *mut u8,
            keep: None,
        };
        let op = Op::Copy {
            dst: dst.into(),
            src,
            bytes,
        };
        self.enqueue(call, stream, op)
    }

    unsafe fn copy_d2h_async(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        let call = "copy_d2h_async";
        if dst.is_null() && bytes > 0 {
            return Err(self.invalid(call, "the host destination is null".into()));
        }
        let src = self.span(call, src, bytes)?;
        let dst = Host {
            ptr: dst,
            keep: None,
        };
        let op = Op::Copy {
            dst,
            src: src.into(),
            bytes,
        };
        self.enqueue(call, stream, op)
    }

    unsafe fn copy_d2d_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        let call = "copy_d2d_async";
        let (dst, src) = (self.span(call, dst, bytes)?, self.span(call, src, bytes)?);
        if dst.overlaps(&src) && !dst.same(&src) {
            return Err(self.invalid(call, "the ranges partially overlap".into()));
        }
        let op = Op::Copy {
            dst: dst.into(),
            src: src.into(),
            bytes,
        };
        self.enqueue(call, stream, op)
    }

    fn create_event(&self) -> Result<EventHandle> {
        self.check()?;
        let id = self.new_handle();
        lock(&self.events).insert(id, Arc::default());
        Ok(EventHandle(id))
    }

    unsafe fn destroy_event(&self, event: EventHandle) -> Result<()> {
        let r = lock(&self.events)
            .remove(&event.0)
            .map(drop)
            .ok_or_else(|| {
                self.invalid(
                    "destroy_event",
                    format!("{event:?} is not a live event of this device"),
                )
            });
        self.after_release(r)
    }

    fn record_event(&self, event: EventHandle, stream: StreamHandle) -> Result<()> {
        self.check()?;
        let e = self.event("record_event", event)?;
        self.stream("record_event", stream)?;
        let generation = e.next_record();
        self.enqueue(
            "record_event",
            stream,
            Op::Record {
                event: e,
                generation,
            },
        )
    }

    fn event_done(&self, event: EventHandle) -> Result<bool> {
        self.check()?;
        let done = self.event("event_done", event)?.is_done();
        // The fault may have run just before the event's record was dropped.
        self.check()?;
        Ok(done)
    }

    fn stream_wait_event(&self, stream: StreamHandle, event: EventHandle) -> Result<()> {
        self.check()?;
        let e = self.event("stream_wait_event", event)?;
        let generation = e.last_record();
        if generation == 0 {
            // Never recorded: nothing to wait for (as on CUDA).
            return self.stream("stream_wait_event", stream).map(drop);
        }
        self.enqueue(
            "stream_wait_event",
            stream,
            Op::WaitEvent {
                event: e,
                generation,
            },
        )
    }

    fn event_elapsed_ms(&self, start: EventHandle, end: EventHandle) -> Result<f32> {
        self.check()?;
        let call = "event_elapsed_ms";
        let at = |h: EventHandle| -> Result<Instant> {
            self.event(call, h)?.completed_at().ok_or_else(|| {
                self.invalid(
                    call,
                    format!(
                        "{h:?} has not completed a record (expected a recorded, finished event)"
                    ),
                )
            })
        };
        let (a, b) = (at(start)?, at(end)?);
        let ms = if b >= a {
            (b - a).as_secs_f64() * 1e3
        } else {
            -((a - b).as_secs_f64() * 1e3)
        };
        Ok(ms as f32)
    }

    unsafe fn stream_write_u32(
        &self,
        stream: StreamHandle,
        addr: *mut u32,
        value: u32,
    ) -> Result<()> {
        let call = "stream_write_u32";
        let keep = (self.memory.pinned_u32(addr as usize)).map_err(|d| self.invalid(call, d))?;
        let op = Op::WriteU32 {
            addr,
            value,
            _keep: keep,
        };
        self.enqueue(call, stream, op)
    }

    unsafe fn stream_wait_u32(
        &self,
        stream: StreamHandle,
        addr: *const u32,
        value: u32,
    ) -> Result<()> {
        let call = "stream_wait_u32";
        let keep = (self.memory.pinned_u32(addr as usize)).map_err(|d| self.invalid(call, d))?;
        let op = Op::WaitU32 {
            addr,
            value,
            _keep: keep,
        };
        self.enqueue(call, stream, op)
    }

    unsafe fn reduce_copy(
        &self,
        stream: StreamHandle,
        dtype: DataType,
        op: ReduceOp,
        srcs: &[DevicePtr],
        dsts: &[DevicePtr],
        count: usize,
    ) -> Result<()> {
        let call = "reduce_copy";
        crate::checks::reduce_copy_args(self.ordinal, srcs.len(), dsts.len(), dtype, op)?;
        let bytes = self.elements(call, dtype, count)?;
        let spans = |ptrs: &[DevicePtr]| -> Result<Vec<Span>> {
            ptrs.iter().map(|&p| self.span(call, p, bytes)).collect()
        };
        let (s, d) = (spans(srcs)?, spans(dsts)?);
        for (j, dst) in d.iter().enumerate() {
            let bad_src = s.iter().any(|src| dst.overlaps(src) && !dst.same(src));
            let bad_dst = d[..j].iter().any(|other| dst.overlaps(other));
            if bad_src || bad_dst {
                return Err(self.invalid(
                    call,
                    format!(
                        "destination {j} ({:?}) overlaps {}; a destination may only equal a \
                         source",
                        dsts[j],
                        if bad_src {
                            "a source partially"
                        } else {
                            "another destination"
                        }
                    ),
                ));
            }
        }
        let op = Op::ReduceCopy {
            dtype,
            op,
            srcs: s,
            dsts: d,
            count,
        };
        self.enqueue(call, stream, op)
    }

    unsafe fn direct_all_reduce(
        &self,
        stream: StreamHandle,
        op: &crate::DirectAllReduce<'_>,
    ) -> Result<()> {
        let call = "direct_all_reduce";
        let kernel = op.check(
            self.ordinal,
            crate::direct::launch_limits(crate::Backend::Emu).0,
        )?;
        let bytes = self.elements(call, op.dtype, op.shared_count())?;
        let mut keep = Vec::new();
        let mut host = |p: DevicePtr, len: usize| -> Result<u64> {
            let span = self.span(call, p, len)?;
            let at = span.host() as u64;
            keep.push(span);
            Ok(at)
        };
        let flag_bytes = op.flag_bytes();
        let mut args = crate::direct::DirectArgs::new(op, |_| 0, 0);
        for r in 0..op.nranks() {
            args.inputs[r] = host(op.inputs[r], bytes)?;
            args.outputs[r] = host(op.outputs[r], bytes)?;
            args.flags[r] = host(op.flags[r], flag_bytes)?;
        }
        if let Some(s) = op.scratch {
            args.scratch = host(s, bytes)?;
        }
        if let Some(st) = op.staged {
            let (source, result) = st.extents(op.count, op.nranks(), op.rank);
            args.source = host(st.source, self.elements(call, op.dtype, source)?)?;
            args.result = host(st.result, self.elements(call, op.dtype, result)?)?;
        }
        let last = op.control as usize + 4 * (crate::direct::CONTROL_WORDS - 1);
        let control = self
            .memory
            .pinned_u32(op.control as usize)
            .and_then(|c| self.memory.pinned_u32(last).map(|_| c))
            .map_err(|d| self.invalid(call, format!("the control block: {d}")))?;
        args.control = op.control as u64;
        let op = Op::Direct {
            kernel,
            args: Box::new(args),
            grid: op.grid,
            _keep: keep,
            _control: control,
        };
        self.enqueue(call, stream, op)
    }

    unsafe fn divide(
        &self,
        stream: StreamHandle,
        dtype: DataType,
        data: DevicePtr,
        count: usize,
        divisor: usize,
    ) -> Result<()> {
        let call = "divide";
        crate::checks::divisor(self.ordinal, divisor)?;
        let bytes = self.elements(call, dtype, count)?;
        let data = self.span(call, data, bytes)?;
        let op = Op::Divide {
            dtype,
            data,
            count,
            divisor,
        };
        self.enqueue(call, stream, op)
    }

    unsafe fn codec(&self, stream: StreamHandle, op: &crate::CodecOp<'_>) -> Result<()> {
        let call = "codec";
        let mut keep = Vec::new();
        let launches = crate::codec::plan(self.ordinal, op, |ptr, bytes, align, what| {
            if bytes == 0 {
                return Ok(0);
            }
            crate::codec::check_align(self.ordinal, ptr, align, what)?;
            let span = self.span(call, ptr, bytes)?;
            let host = span.host() as u64;
            keep.push(span);
            Ok(host)
        })?;
        let op = Op::Codec {
            launches,
            _keep: keep,
        };
        self.enqueue(call, stream, op)
    }

    fn ipc_export(&self, ptr: DevicePtr) -> Result<IpcHandle> {
        self.check()?;
        let region = self
            .memory
            .region_at(ptr)
            .map_err(|d| self.invalid("ipc_export", d))?;
        if region.origin != Origin::Alloc {
            return Err(self.invalid(
                "ipc_export",
                format!("{ptr:?} was imported; only allocations made here can be exported"),
            ));
        }
        tracing::debug!(
            ordinal = self.ordinal,
            ?ptr,
            "exported an emulated allocation"
        );
        Ok(region.map.handle())
    }

    fn ipc_import(&self, handle: &IpcHandle) -> Result<DevicePtr> {
        self.check()?;
        let call = "ipc_import";
        let (name, len) = decode_handle(handle).map_err(|d| self.invalid(call, d))?;
        let map = ShmMap::open(&name, len).map_err(|e| {
            self.invalid(
                call,
                format!("opening {handle:?} (shared-memory file {name}): {e}"),
            )
        })?;
        let ptr = self
            .memory
            .insert(map, Origin::Import)
            .map_err(|d| self.invalid(call, d))?;
        tracing::debug!(
            ordinal = self.ordinal,
            ?ptr,
            len,
            "imported an emulated allocation"
        );
        Ok(ptr)
    }

    unsafe fn ipc_close(&self, ptr: DevicePtr) -> Result<()> {
        let r = self.memory.remove(ptr, Origin::Import);
        self.after_release(r.map(drop).map_err(|d| self.invalid("ipc_close", d)))
    }

    fn can_access_peer(&self, peer: usize) -> Result<bool> {
        self.check()?;
        let vis = &self.visibility;
        match (vis.visible.get(self.ordinal), vis.visible.get(peer)) {
            (Some(a), Some(b)) => Ok(a == b || vis.peer_access),
            _ => Err(self.invalid(
                "can_access_peer",
                format!(
                    "no emulated device {peer} is visible here ({:?})",
                    vis.visible
                ),
            )),
        }
    }

    fn enable_peer_access(&self, _peer: usize) -> Result<()> {
        self.check()
    }

    fn inject_fault(&self, what: &str) -> Result<()> {
        self.check()?;
        tracing::debug!(
            ordinal = self.ordinal,
            what,
            "fault injected into the next operation"
        );
        *lock(&self.pending_fault) = Some(what.to_string());
        Ok(())
    }

    fn pointer_kind(&self, addr: u64) -> Result<PointerKind> {
        Ok(super::pointer::kind(self, addr))
    }

    fn allocation_range(&self, addr: u64) -> Result<(DevicePtr, usize)> {
        self.check()?;
        let call = "allocation_range";
        if let PointerKind::Host = super::pointer::kind(self, addr) {
            return Err(self.invalid(call, format!("{addr:#x} is host memory, not device memory")));
        }
        let (base, _, region) = self
            .memory
            .holder(DevicePtr(addr), 0)
            .map_err(|d| self.invalid(call, d))?;
        Ok((base, region.map.len()))
    }

    // ---- dma-buf export: the allocation's shared-memory file, so the
    // emulated NIC (transport-rdma's EmuVerbs) of this or a peer process
    // can map it.

    fn dmabuf_supported(&self) -> Result<bool> {
        self.check()?;
        Ok(true)
    }

    fn dmabuf_export(&self, ptr: DevicePtr, bytes: usize) -> Result<crate::DmaBuf> {
        self.check()?;
        let call = "dmabuf_export";
        let (base, id, region) = self
            .memory
            .holder(ptr, bytes)
            .map_err(|d| self.invalid(call, d))?;
        if super::is_marked_managed(id) {
            // As cuMemGetHandleForAddressRange: the range must come from
            // cuMemAlloc or a VMM reservation.
            return Err(self.invalid(
                call,
                format!("the allocation holding {ptr:?} is managed memory, which has no dma-buf"),
            ));
        }
        if super::export_refused(id) {
            return Err(self.invalid(
                call,
                format!("the allocation holding {ptr:?} has no dma-buf (emulated refusal)"),
            ));
        }
        let fd = region
            .map
            .reopen()
            .map_err(|e| self.invalid(call, format!("reopening {ptr:?}'s file: {e}")))?;
        Ok(crate::DmaBuf {
            fd,
            offset: 0,
            base,
            len: region.map.len(),
            id,
        })
    }

    fn allocation_id(&self, ptr: DevicePtr) -> Result<u64> {
        self.memory
            .live_id(ptr)
            .map_err(|d| self.invalid("allocation_id", d))
    }

    fn is_managed(&self, ptr: DevicePtr) -> Result<bool> {
        let id = self
            .memory
            .live_id(ptr)
            .map_err(|d| self.invalid("is_managed", d))?;
        Ok(super::is_marked_managed(id))
    }

    // The emulated GPU reports no ordering of GPUDirect writes
    // (`..._ORDERING_NONE`), so consumers must flush; flushes are counted.

    fn gpudirect_flush_needed(&self) -> Result<bool> {
        self.check()?;
        Ok(true)
    }

    fn flush_gpudirect_writes(&self) -> Result<()> {
        self.check()?;
        super::GPUDIRECT_FLUSHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    fn pci_bus_id(&self) -> Result<String> {
        self.check()?;
        Ok(super::pci_bus_id_of(self.visibility.visible[self.ordinal]))
    }

    fn ordinal_of_pci_bus_id(&self, bus_id: &str) -> Result<Option<usize>> {
        self.check()?;
        let vis = &self.visibility.visible;
        Ok(vis
            .iter()
            .position(|&p| super::pci_bus_id_of(p).eq_ignore_ascii_case(bus_id)))
    }
}
