//! cudarc's device memory in the typed API (feature `cuda`): collectives on
//! `CudaSlice<T>`, `CudaView<T>` and `CudaViewMut<T>`, ordered on the
//! stream of the receive slice.
//!
//! cudarc tracks, per slice, the last write and read with events (unless
//! the user disabled that for the context). The operation honours it: the
//! pointers are taken with cudarc's `device_ptr` / `device_ptr_mut` on the
//! operation's stream, which makes that stream wait for earlier writes of
//! the input (and earlier reads and writes of the output), and cudarc
//! records the slices' events on the stream after the operation was
//! enqueued — after the wait that holds the stream until the collective
//! is done — so later cudarc work on either slice, on any stream, runs
//! after the collective.
//!
//! The communicator must be bound to the slices' CUDA device (the first
//! operation binds it to the receive slice's context when it is not bound
//! yet); slices of another device are refused with an error.
//!
//! ```no_run
//! use std::sync::Arc;
//! use cudarc::driver::CudaContext;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let comm = sncl::Communicator::from_env()?;
//! let ctx = CudaContext::new(0)?;
//! let stream = ctx.default_stream();
//! let grads = stream.clone_htod(&vec![1.0f32; 1 << 20])?;
//! let mut summed = stream.alloc_zeros::<f32>(1 << 20)?;
//! comm.scope(|s| {
//!     s.all_reduce_cuda(&grads, &mut summed, sncl::ReduceOp::Sum)?
//!         .wait()
//! })?;
//! let host = stream.clone_dtoh(&summed)?;
//! assert_eq!(host[0], comm.size() as f32);
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;

use comm_core::wire::Collective;
use comm_core::{Error, ReduceOp, Result};
use cudarc::driver::{CudaContext, CudaStream, DeviceSlice};

use super::{Backend, Device, DevicePtr, StreamHandle};
use crate::work::{Scope, Work};
use crate::{Communicator, Element};

/// The sncl stream handle of a cudarc stream (a raw `CUstream`).
fn handle(stream: &CudaStream) -> StreamHandle {
    StreamHandle(stream.cu_stream() as usize as u64)
}

impl Communicator {
    /// Binds this communicator to the device of a cudarc context (the
    /// context is kept alive by the binding; sncl's own allocations and
    /// kernels then live in that context).
    pub fn bind_cuda_context(&self, ctx: Arc<CudaContext>) -> Result<Arc<dyn Device>> {
        let rank = self.inner.rank;
        let ordinal = ctx.ordinal();
        let dev: Arc<dyn Device> = Arc::new(
            ::device::cuda::CudaDevice::from_context(ctx).map_err(|e| Error::Device {
                rank,
                op: "bind_cuda_context",
                seq: None,
                device: format!("cuda device {ordinal}"),
                what: "wrapping the cudarc context".into(),
                detail: e.to_string(),
            })?,
        );
        self.bind_device(dev.clone())?;
        Ok(dev)
    }
}

impl<'scope> Scope<'scope, '_> {
    /// Checks that the communicator is bound to (or binds it to) the CUDA
    /// device of `ctx`.
    fn cuda_binding(&self, coll: Collective, ctx: &Arc<CudaContext>) -> Result<()> {
        let inner = &self.comm.inner;
        if inner.device.get().is_none() {
            if let Err(e) = self.comm.bind_cuda_context(ctx.clone()) {
                if inner.device.get().is_none() {
                    return Err(e);
                }
            }
        }
        let bound = self
            .comm
            .bound_device()
            .ok_or_else(|| Error::InvalidArgument {
                rank: inner.rank,
                op: coll.name(),
                detail: "no device is bound to this communicator".into(),
            })?;
        if bound.backend() != Backend::Cuda || bound.ordinal() != ctx.ordinal() {
            return Err(Error::InvalidArgument {
                rank: inner.rank,
                op: coll.name(),
                detail: format!(
                    "the slices live on cuda device {}, the communicator is bound to {} device {}",
                    ctx.ordinal(),
                    bound.backend().name(),
                    bound.ordinal()
                ),
            });
        }
        Ok(())
    }

    /// One operation from `send` to `recv` on `recv`'s stream (see the
    /// module's documentation for the ordering).
    fn cuda_op<T, S, R>(
        &'scope self,
        coll: Collective,
        count: usize,
        how: (ReduceOp, usize),
        send: &'scope S,
        recv: &'scope mut R,
    ) -> Result<Work<'scope>>
    where
        T: Element,
        S: cudarc::driver::DevicePtr<T>,
        R: cudarc::driver::DevicePtrMut<T>,
    {
        let stream = recv.stream().clone();
        self.cuda_binding(coll, stream.context())?;
        let (send_bytes, recv_bytes) = (send.num_bytes(), recv.num_bytes());
        let (sp, _read) = send.device_ptr(&stream);
        let (rp, _written) = recv.device_ptr_mut(&stream);
        // `_read` / `_written` record cudarc's events on `stream` when they
        // drop, i.e. after the operation and its stream wait are enqueued.
        self.device_op_on(
            coll,
            T::DTYPE,
            count,
            how,
            [(DevicePtr(sp), send_bytes), (DevicePtr(rp), recv_bytes)],
            handle(&stream),
        )
    }

    /// All-reduce of every element of `send` into `recv` (as long as
    /// `send`), on `recv`'s stream.
    pub fn all_reduce_cuda<T: Element, S, R>(
        &'scope self,
        send: &'scope S,
        recv: &'scope mut R,
        op: ReduceOp,
    ) -> Result<Work<'scope>>
    where
        S: cudarc::driver::DevicePtr<T>,
        R: cudarc::driver::DevicePtrMut<T>,
    {
        let count = DeviceSlice::len(send);
        self.cuda_op(Collective::AllReduce, count, (op, 0), send, recv)
    }

    /// In-place all-reduce of every element of `buf`, on its stream.
    pub fn all_reduce_cuda_in_place<T: Element, B>(
        &'scope self,
        buf: &'scope mut B,
        op: ReduceOp,
    ) -> Result<Work<'scope>>
    where
        B: cudarc::driver::DevicePtrMut<T>,
    {
        let stream = buf.stream().clone();
        self.cuda_binding(Collective::AllReduce, stream.context())?;
        let (count, bytes) = (DeviceSlice::len(buf), buf.num_bytes());
        let (p, _written) = buf.device_ptr_mut(&stream);
        let at = (DevicePtr(p), bytes);
        self.device_op_on(
            Collective::AllReduce,
            T::DTYPE,
            count,
            (op, 0),
            [at, at],
            handle(&stream),
        )
    }

    /// Reduce-scatter: `send` holds size × n elements, `recv` (n elements)
    /// gets this rank's reduced block.
    pub fn reduce_scatter_cuda<T: Element, S, R>(
        &'scope self,
        send: &'scope S,
        recv: &'scope mut R,
        op: ReduceOp,
    ) -> Result<Work<'scope>>
    where
        S: cudarc::driver::DevicePtr<T>,
        R: cudarc::driver::DevicePtrMut<T>,
    {
        let count = DeviceSlice::len(recv);
        self.cuda_op(Collective::ReduceScatter, count, (op, 0), send, recv)
    }

    /// All-gather: every rank's `send` (n elements) into `recv` (size × n).
    pub fn all_gather_cuda<T: Element, S, R>(
        &'scope self,
        send: &'scope S,
        recv: &'scope mut R,
    ) -> Result<Work<'scope>>
    where
        S: cudarc::driver::DevicePtr<T>,
        R: cudarc::driver::DevicePtrMut<T>,
    {
        let count = DeviceSlice::len(send);
        self.cuda_op(Collective::AllGather, count, (ReduceOp::Sum, 0), send, recv)
    }

    /// Broadcast of `root`'s `send` into every rank's `recv` (as long as
    /// `send`).
    pub fn broadcast_cuda<T: Element, S, R>(
        &'scope self,
        send: &'scope S,
        recv: &'scope mut R,
        root: usize,
    ) -> Result<Work<'scope>>
    where
        S: cudarc::driver::DevicePtr<T>,
        R: cudarc::driver::DevicePtrMut<T>,
    {
        let count = DeviceSlice::len(send);
        self.cuda_op(
            Collective::Broadcast,
            count,
            (ReduceOp::Sum, root),
            send,
            recv,
        )
    }

    /// Reduce of every element of `send` into `root`'s `recv`.
    pub fn reduce_cuda<T: Element, S, R>(
        &'scope self,
        send: &'scope S,
        recv: &'scope mut R,
        op: ReduceOp,
        root: usize,
    ) -> Result<Work<'scope>>
    where
        S: cudarc::driver::DevicePtr<T>,
        R: cudarc::driver::DevicePtrMut<T>,
    {
        let count = DeviceSlice::len(send);
        self.cuda_op(Collective::Reduce, count, (op, root), send, recv)
    }
}
