//! The compressed all-reduce's one entry for every memory kind
//! ([`Communicator::all_reduce_compressed`]): the buffer's type says which
//! implementation runs (host codecs, `src/compressed.rs`; device codec
//! kernels, `src/compressed_device.rs`) and which error feedback it keeps.

use comm_core::{ReduceOp, Result};
use compress::{Codec, ErrorFeedback};

use crate::buffer::{BufferMut, DeviceSliceMut, Location};
use crate::compressed_device::DeviceFeedback;
use crate::device::DevicePtr;
use crate::{Communicator, CompressScope};

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

/// The device form for any device buffer: checks (or binds) its device,
/// then runs the device codec kernels on its stream and waits for them.
fn on_device<B: BufferMut<Elem = f32>>(
    mut buf: B,
    comm: &Communicator,
    (op, codec, scope): (ReduceOp, &Codec, CompressScope),
    feedback: Option<&mut DeviceFeedback>,
) -> Result<()> {
    let Location::Device { device, stream } = buf.location() else {
        unreachable!("a device buffer")
    };
    comm.bind_or_check_id("all_reduce_compressed", "the buffer", &device)?;
    let len = buf.len();
    // cudarc's guard (in `lent`) records the slice's events after the call.
    let lent = buf.lend_mut(Some(&stream));
    // SAFETY: the buffer lends `len` f32 of the bound device (checked
    // above), borrowed mutably for this call, which returns once the
    // stream has run the work.
    unsafe {
        comm.all_reduce_compressed_device_raw(
            DevicePtr(lent.addr as u64),
            len,
            op,
            codec,
            feedback,
            scope,
            stream.handle(),
        )
    }
}

/// Device buffers: sncl's views and cudarc's slices.
macro_rules! device_compress {
    ($(impl<$($l:lifetime),*> $ty:ty;)*) => {$(
        impl<$($l),*> private::Sealed for $ty {}
        impl<$($l),*> CompressBuffer for $ty {
            type Feedback = DeviceFeedback;
            fn all_reduce_compressed(
                self,
                comm: &Communicator,
                how: (ReduceOp, &Codec, CompressScope),
                feedback: Option<&mut DeviceFeedback>,
            ) -> Result<()> {
                on_device(self, comm, how, feedback)
            }
        }
    )*};
}
device_compress! {
    impl<'a> DeviceSliceMut<'a, f32>;
}
#[cfg(feature = "cuda")]
device_compress! {
    impl<'r> &'r mut cudarc::driver::CudaSlice<f32>;
    impl<'v> cudarc::driver::CudaViewMut<'v, f32>;
}
