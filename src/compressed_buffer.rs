//! The compressed all-reduce's one entry for every memory kind
//! ([`Communicator::all_reduce_compressed`]): the buffer's type says which
//! implementation runs (host codecs, `src/compressed.rs`; device codec
//! kernels, `src/compressed_device.rs`) and which error feedback it keeps.

use comm_core::{ReduceOp, Result};
use compress::{Codec, ErrorFeedback};

use crate::buffer::{BufferMut, DeviceId, DeviceSliceMut, Location};
use crate::compressed_device::DeviceFeedback;
use crate::{Buffer, Communicator, CompressScope};

impl Communicator {
    /// All-reduce of `buf` (sum or avg) with `codec` on the scarce tier,
    /// for f32 buffers of any memory kind ([`CompressBuffer`]: host slices
    /// and vectors, sncl device views, cudarc slices). `feedback`, kept by
    /// the caller per tensor ([`ErrorFeedback`] for host buffers,
    /// [`crate::DeviceFeedback`] for device ones), carries what compression
    /// dropped into the next call. Every rank must pass the same codec and
    /// length. Device buffers: returns when the result is in the buffer.
    pub fn all_reduce_compressed<B: CompressBuffer>(
        &self,
        buf: B,
        op: ReduceOp,
        codec: &Codec,
        feedback: Option<&mut B::Feedback>,
        scope: CompressScope,
    ) -> Result<()> {
        buf.all_reduce_compressed(self, (op, codec, scope), feedback)
    }
}

/// An f32 buffer the compressed all-reduce takes, with the error-feedback
/// state of its memory kind: host slices and vectors ([`ErrorFeedback`]),
/// sncl device views and cudarc slices ([`DeviceFeedback`], a
/// residual in device memory).
pub trait CompressBuffer: BufferMut<Elem = f32> + private::Sealed {
    /// What carries the dropped remainder to the next call.
    type Feedback;
    #[doc(hidden)]
    fn all_reduce_compressed(
        self,
        comm: &Communicator,
        how: (ReduceOp, &Codec, CompressScope),
        feedback: Option<&mut Self::Feedback>,
    ) -> Result<()>;
}

mod private {
    pub trait Sealed {}
}

macro_rules! host_compress {
    ($($ty:ty),*) => {$(
        impl private::Sealed for $ty {}
        impl CompressBuffer for $ty {
            type Feedback = ErrorFeedback;
            fn all_reduce_compressed(
                self,
                comm: &Communicator,
                (op, codec, scope): (ReduceOp, &Codec, CompressScope),
                feedback: Option<&mut ErrorFeedback>,
            ) -> Result<()> {
                comm.all_reduce_compressed_host(self, op, codec, feedback, scope)
            }
        }
    )*};
}
host_compress!(&mut [f32], &mut Vec<f32>);

impl private::Sealed for DeviceSliceMut<'_, f32> {}
impl CompressBuffer for DeviceSliceMut<'_, f32> {
    type Feedback = DeviceFeedback;
    fn all_reduce_compressed(
        self,
        comm: &Communicator,
        (op, codec, scope): (ReduceOp, &Codec, CompressScope),
        feedback: Option<&mut DeviceFeedback>,
    ) -> Result<()> {
        let Location::Device {
            device: DeviceId::Open(dev),
            stream,
        } = self.location()
        else {
            unreachable!("a device view")
        };
        comm.bind_or_check("all_reduce_compressed", "the buffer", &dev)?;
        // SAFETY: the view lends `len` f32 of the bound device (checked
        // above), borrowed mutably for this call, which returns once the
        // stream has run the work.
        unsafe {
            comm.all_reduce_compressed_device_raw(
                self.ptr(),
                self.len(),
                op,
                codec,
                feedback,
                scope,
                stream.handle(),
            )
        }
    }
}

#[cfg(feature = "cuda")]
macro_rules! cudarc_compress {
    ($(impl<$($l:lifetime),*> $ty:ty;)*) => {$(
        impl<$($l),*> private::Sealed for $ty {}
        impl<$($l),*> CompressBuffer for $ty {
            type Feedback = DeviceFeedback;
            fn all_reduce_compressed(
                mut self,
                comm: &Communicator,
                (op, codec, scope): (ReduceOp, &Codec, CompressScope),
                feedback: Option<&mut DeviceFeedback>,
            ) -> Result<()> {
                let Location::Device { device: DeviceId::Cuda(ctx), stream } = self.location() else {
                    unreachable!("a cudarc slice")
                };
                comm.bind_or_check_cuda("all_reduce_compressed", &ctx)?;
                let len = self.len();
                // cudarc's guard records the slice's events after the call.
                let lent = self.lend_mut(Some(&stream));
                // SAFETY: the slice lends `len` f32 of the bound device,
                // borrowed mutably for this call, which returns once the
                // stream has run the work.
                unsafe {
                    comm.all_reduce_compressed_device_raw(
                        crate::device::DevicePtr(lent.addr as u64),
                        len,
                        op,
                        codec,
                        feedback,
                        scope,
                        stream.handle(),
                    )
                }
            }
        }
    )*};
}
#[cfg(feature = "cuda")]
cudarc_compress! {
    impl<'r> &'r mut cudarc::driver::CudaSlice<f32>;
    impl<'v> cudarc::driver::CudaViewMut<'v, f32>;
}
