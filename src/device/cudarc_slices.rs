//! cudarc's device memory in the typed API (feature `cuda`): `&CudaSlice<T>`,
//! `CudaView<T>` (inputs) and `&mut CudaSlice<T>`, `CudaViewMut<T>`
//! (outputs, also inputs) are [`crate::Buffer`]s; an operation runs on the
//! stream of its receive slice.
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
//!     s.all_reduce(&grads, &mut summed, sncl::ReduceOp::Sum)?
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
use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut,
};

use super::{Backend, Device};
use crate::buffer::{Buffer, BufferMut, DeviceId, Lent, Location, Prefix, Stream};
use crate::work::{Scope, Work};
use crate::{Communicator, Element};

/// The stream an operation on `slice` is ordered on: the operation's
/// (a cudarc stream: [`crate::Buffer`]'s placement refuses a mix of
/// cudarc and raw streams), else the slice's own.
fn on<'a, T>(
    slice: &'a impl cudarc::driver::DeviceSlice<T>,
    stream: Option<&'a Stream>,
) -> &'a cudarc::driver::CudaStream {
    match stream {
        Some(Stream::Cuda(s)) => s,
        _ => slice.stream(),
    }
}

/// cudarc slices and views as inputs: where they live, and their address
/// taken through cudarc, which makes the operation's stream wait for
/// earlier writes of the slice and, when the guard drops after the
/// operation was enqueued, records the slice's read event there.
macro_rules! cudarc_inputs {
    ($(impl<$($l:lifetime),*> $ty:ty => $target:ty;)*) => {$(
        // SAFETY: cudarc's slices address `len()` elements of `T` on their
        // context's device, live while borrowed; reads on the lent stream
        // are ordered after the slice's earlier writes by cudarc's events.
        unsafe impl<$($l,)* T: Element> Buffer for $ty {
            type Elem = T;
            fn len(&self) -> usize {
                let this: &$target = self;
                cudarc::driver::DeviceSlice::len(this)
            }
            fn location(&self) -> Location {
                let this: &$target = self;
                let stream = cudarc::driver::DeviceSlice::stream(this);
                Location::Device {
                    device: DeviceId::Cuda(stream.context().clone()),
                    stream: Stream::Cuda(stream.clone()),
                }
            }
            fn lend<'a>(&'a self, stream: Option<&'a Stream>) -> Lent<'a> {
                let this: &'a $target = self;
                let (ptr, guard) = DevicePtr::device_ptr(this, on(this, stream));
                Lent::holding(ptr as usize, guard)
            }
        }
    )*};
}

/// cudarc slices and views as outputs: the write is ordered after earlier
/// reads and writes of the slice, and recorded as its last write.
macro_rules! cudarc_outputs {
    ($(impl<$($l:lifetime),*> $ty:ty => $target:ty;)*) => {$(
        // SAFETY: as for the inputs, borrowed mutably.
        unsafe impl<$($l,)* T: Element> BufferMut for $ty {
            fn lend_mut<'a>(&'a mut self, stream: Option<&'a Stream>) -> Lent<'a> {
                let this: &'a mut $target = self;
                let own: *const CudaStream = Arc::as_ptr(cudarc::driver::DeviceSlice::stream(this));
                let stream: &'a CudaStream = match stream {
                    Some(Stream::Cuda(s)) => s,
                    // SAFETY: the slice holds its stream's `Arc` for as
                    // long as it lives, and it stays borrowed for 'a; the
                    // raw pointer only frees the slice for the mutable
                    // borrow below, which does not replace its stream.
                    _ => unsafe { &*own },
                };
                let (ptr, guard) = DevicePtrMut::device_ptr_mut(this, stream);
                Lent::holding(ptr as usize, guard)
            }
        }
    )*};
}
cudarc_inputs! {
    impl<'r> &'r CudaSlice<T> => CudaSlice<T>;
    impl<'r> &'r mut CudaSlice<T> => CudaSlice<T>;
    impl<'v> CudaView<'v, T> => CudaView<'v, T>;
    impl<'r, 'v> &'r CudaView<'v, T> => CudaView<'v, T>;
    impl<'v> CudaViewMut<'v, T> => CudaViewMut<'v, T>;
    impl<'r, 'v> &'r CudaViewMut<'v, T> => CudaViewMut<'v, T>;
    impl<'r, 'v> &'r mut CudaViewMut<'v, T> => CudaViewMut<'v, T>;
}
cudarc_outputs! {
    impl<'r> &'r mut CudaSlice<T> => CudaSlice<T>;
    impl<'v> CudaViewMut<'v, T> => CudaViewMut<'v, T>;
    impl<'r, 'v> &'r mut CudaViewMut<'v, T> => CudaViewMut<'v, T>;
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

    /// Checks that this communicator is bound to (or binds it to) the CUDA
    /// device of `ctx`, for the operation `op`.
    pub(crate) fn bind_or_check_cuda(
        &self,
        op: &'static str,
        ctx: &Arc<CudaContext>,
    ) -> Result<()> {
        let inner = &self.inner;
        if self.device.get().is_none() {
            if let Err(e) = self.bind_cuda_context(ctx.clone()) {
                if self.device.get().is_none() {
                    return Err(e);
                }
            }
        }
        let bound = self.bound_device().ok_or_else(|| Error::InvalidArgument {
            rank: inner.rank,
            op,
            detail: "no device is bound to this communicator".into(),
        })?;
        if bound.backend() != Backend::Cuda || bound.ordinal() != ctx.ordinal() {
            return Err(Error::InvalidArgument {
                rank: inner.rank,
                op,
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
}

/// The forms before the one typed API, kept for one release, with their
/// old counts: the count comes from one slice (as it did), the other may be
/// longer.
impl<'scope> Scope<'scope, '_> {
    /// `buf` cut to its first `len` elements, or an error naming `what`
    /// where it is shorter.
    fn at_least<B: Buffer>(
        &self,
        coll: Collective,
        what: &str,
        buf: B,
        len: usize,
    ) -> Result<Prefix<B>> {
        let got = buf.len();
        Prefix::new(buf, len).ok_or_else(|| Error::InvalidArgument {
            rank: self.comm.rank(),
            op: coll.name(),
            detail: format!("the {what} slice has {got} elements, expected at least {len}"),
        })
    }

    /// All-reduce on cudarc slices (`recv` at least as long as `send`).
    #[deprecated(note = "use Scope::all_reduce: cudarc slices are sncl::Buffers")]
    pub fn all_reduce_cuda<T: Element, S, R>(
        &'scope self,
        send: &'scope S,
        recv: &'scope mut R,
        op: ReduceOp,
    ) -> Result<Work<'scope>>
    where
        &'scope S: Buffer<Elem = T>,
        &'scope mut R: BufferMut<Elem = T>,
    {
        let n = Buffer::len(&send);
        let recv = self.at_least(Collective::AllReduce, "receive", recv, n)?;
        self.all_reduce(send, recv, op)
    }

    /// In-place all-reduce on a cudarc slice.
    #[deprecated(note = "use Scope::all_reduce_in_place: cudarc slices are sncl::Buffers")]
    pub fn all_reduce_cuda_in_place<T: Element, B>(
        &'scope self,
        buf: &'scope mut B,
        op: ReduceOp,
    ) -> Result<Work<'scope>>
    where
        &'scope mut B: BufferMut<Elem = T>,
    {
        self.all_reduce_in_place(buf, op)
    }

    /// Reduce-scatter on cudarc slices (`send` at least size × `recv`).
    #[deprecated(note = "use Scope::reduce_scatter: cudarc slices are sncl::Buffers")]
    pub fn reduce_scatter_cuda<T: Element, S, R>(
        &'scope self,
        send: &'scope S,
        recv: &'scope mut R,
        op: ReduceOp,
    ) -> Result<Work<'scope>>
    where
        &'scope S: Buffer<Elem = T>,
        &'scope mut R: BufferMut<Elem = T>,
    {
        let n = Buffer::len(&recv).saturating_mul(self.comm.size());
        let send = self.at_least(Collective::ReduceScatter, "send", send, n)?;
        self.reduce_scatter(send, recv, op)
    }

    /// All-gather on cudarc slices (`recv` at least size × `send`).
    #[deprecated(note = "use Scope::all_gather: cudarc slices are sncl::Buffers")]
    pub fn all_gather_cuda<T: Element, S, R>(
        &'scope self,
        send: &'scope S,
        recv: &'scope mut R,
    ) -> Result<Work<'scope>>
    where
        &'scope S: Buffer<Elem = T>,
        &'scope mut R: BufferMut<Elem = T>,
    {
        let n = Buffer::len(&send).saturating_mul(self.comm.size());
        let recv = self.at_least(Collective::AllGather, "receive", recv, n)?;
        self.all_gather(send, recv)
    }

    /// Broadcast on cudarc slices: `send`'s length on every rank, `recv` at
    /// least as long.
    #[deprecated(note = "use Scope::broadcast_from: cudarc slices are sncl::Buffers")]
    pub fn broadcast_cuda<T: Element, S, R>(
        &'scope self,
        send: &'scope S,
        recv: &'scope mut R,
        root: usize,
    ) -> Result<Work<'scope>>
    where
        &'scope S: Buffer<Elem = T>,
        &'scope mut R: BufferMut<Elem = T>,
    {
        let n = Buffer::len(&send);
        let recv = self.at_least(Collective::Broadcast, "receive", recv, n)?;
        self.broadcast_from(send, recv, root)
    }

    /// Reduce on cudarc slices (the root's `recv` at least as long as
    /// `send`; others' unused).
    #[deprecated(note = "use Scope::reduce: cudarc slices are sncl::Buffers")]
    pub fn reduce_cuda<T: Element, S, R>(
        &'scope self,
        send: &'scope S,
        recv: &'scope mut R,
        op: ReduceOp,
        root: usize,
    ) -> Result<Work<'scope>>
    where
        &'scope S: Buffer<Elem = T>,
        &'scope mut R: BufferMut<Elem = T>,
    {
        let n = Buffer::len(&send);
        let n = if self.comm.rank() == root {
            n
        } else {
            n.min(Buffer::len(&recv))
        };
        let recv = self.at_least(Collective::Reduce, "receive", recv, n)?;
        self.reduce(send, recv, op, root)
    }
}
