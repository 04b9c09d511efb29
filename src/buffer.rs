//! One typed API over every memory kind: a collective takes any
//! [`Buffer`] (input) and [`BufferMut`] (output) whose elements are the
//! same [`Element`] type, wherever they live, as NCCL takes any pointer.
//!
//! * host memory: `&[T]`, `&Vec<T>`, `&[T; N]` as inputs, their `&mut`
//!   forms as inputs or outputs;
//! * sncl device memory: [`DeviceSlice`] / [`DeviceSliceMut`] (by value or
//!   by reference), typed views of a [`DeviceBuffer`] ordered on a stream,
//!   or of raw device pointers through [`DeviceSlice::from_raw`] (unsafe);
//! * cudarc's `&CudaSlice<T>`, `CudaView<T>` and their mutable forms
//!   (feature `cuda`), ordered on the receive slice's stream.
//!
//! Buffers are passed by value: references to host memory and device
//! views only borrow, so a [`crate::Scope`] keeps what they borrow until
//! its operations are done.
//!
//! A buffer says where it lives ([`Buffer::location`]: its memory kind, its
//! device and stream), its length in elements and, through
//! [`Buffer::Elem`], its data type. Host buffers run on the caller's thread
//! (blocking forms) or the progress thread ([`crate::Scope`]); device
//! buffers run in the order of their stream, as NCCL's calls do
//! ([`crate::device`]).
//!
//! ```no_run
//! use sncl::device::{Backend, DeviceBuffer, DeviceSlice, DeviceSliceMut, StreamHandle};
//! # let comm = sncl::Communicator::from_env()?;
//! let dev = comm.bind_default_device(Backend::Cuda)?;
//! let send = DeviceBuffer::new(&dev, 1024 * 4).expect("allocation");
//! let mut recv = DeviceBuffer::new(&dev, 1024 * 4).expect("allocation");
//! let stream = StreamHandle(0); // the legacy default stream
//! comm.scope(|s| {
//!     let send = DeviceSlice::<f32>::new(&send, stream);
//!     let recv = DeviceSliceMut::<f32>::new(&mut recv, stream);
//!     // The same call as on host slices.
//!     s.all_reduce(send, recv, sncl::ReduceOp::Sum)?.wait()
//! })?;
//! # Ok::<(), sncl::Error>(())
//! ```

use std::marker::PhantomData;
use std::sync::Arc;

use comm_core::transport::registry::MemoryKind;

use crate::Element;
use ::device::{Device, DeviceBuffer, DevicePtr, StreamHandle};

/// The device a buffer lives on: an open sncl device, or a cudarc context
/// (the communicator binds to it on first use).
#[derive(Clone)]
pub enum DeviceId {
    /// A device opened through sncl ([`crate::device::open`]).
    Open(Arc<dyn Device>),
    /// A cudarc context's device (feature `cuda`).
    #[cfg(feature = "cuda")]
    Cuda(Arc<cudarc::driver::CudaContext>),
}

/// The stream a device buffer's operations are ordered on.
#[derive(Clone)]
pub enum Stream {
    /// A raw stream handle of the buffer's device (a `CUstream`; 0 is the
    /// legacy default stream).
    Handle(StreamHandle),
    /// A cudarc stream (feature `cuda`): cudarc's per-slice events are
    /// honoured (see the `cuda` feature's notes in [`crate::device`]).
    #[cfg(feature = "cuda")]
    Cuda(Arc<cudarc::driver::CudaStream>),
}

impl Stream {
    /// The raw handle of the stream.
    pub fn handle(&self) -> StreamHandle {
        match self {
            Stream::Handle(h) => *h,
            #[cfg(feature = "cuda")]
            Stream::Cuda(s) => StreamHandle(s.cu_stream() as usize as u64),
        }
    }
}

/// Where a buffer's elements live.
#[derive(Clone)]
pub enum Location {
    /// Host memory of this process.
    Host,
    /// Memory of `device`, used in the order of `stream`.
    Device {
        /// The device.
        device: DeviceId,
        /// The stream operations on the buffer are ordered on.
        stream: Stream,
    },
}

impl Location {
    /// The memory kind (what a transport moves).
    pub fn kind(&self) -> MemoryKind {
        match self {
            Location::Host => MemoryKind::Host,
            Location::Device { .. } => MemoryKind::Device,
        }
    }
}

/// Something kept alive while an operation is being enqueued (cudarc's
/// event guards: they record the slice's events when dropped).
trait Hold {}
impl<T: ?Sized> Hold for T {}

/// A buffer's address, lent to one operation ([`Buffer::lend`]).
pub struct Lent<'a> {
    pub(crate) addr: usize,
    _hold: Option<Box<dyn Hold + 'a>>,
}

impl<'a> Lent<'a> {
    /// The address `addr` (a host address, or a device address of the
    /// buffer's device).
    #[inline]
    pub fn new(addr: usize) -> Lent<'a> {
        Lent { addr, _hold: None }
    }

    /// The address `addr`, keeping `hold` alive until the operation is
    /// enqueued (then dropped).
    pub fn holding(addr: usize, hold: impl Sized + 'a) -> Lent<'a> {
        Lent {
            addr,
            _hold: Some(Box::new(hold)),
        }
    }
}

/// A typed buffer an operation reads: the input of every collective.
///
/// # Safety
/// Implementors promise that [`Buffer::lend`] returns the address of
/// [`Buffer::len`] elements of [`Buffer::Elem`] at the [`Buffer::location`]
/// they report, readable (device memory: by work on the lent stream) for as
/// long as the buffer stays borrowed.
pub unsafe trait Buffer {
    /// The element type (its [`crate::DataType`] is `Elem::DTYPE`).
    type Elem: Element;
    /// Length in elements.
    fn len(&self) -> usize;
    /// Whether the buffer holds no element.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Where the elements live.
    fn location(&self) -> Location;
    /// The memory kind alone (cheaper than [`Buffer::location`]).
    #[inline]
    fn kind(&self) -> MemoryKind {
        self.location().kind()
    }
    /// The address of the first element for an operation ordered on
    /// `stream` (device buffers; host buffers get [`None`]).
    fn lend<'a>(&'a self, stream: Option<&'a Stream>) -> Lent<'a>;
}

/// A typed buffer an operation writes: the output of every collective.
///
/// # Safety
/// As [`Buffer`], and the lent address is writable, by the operation only,
/// for as long as the buffer stays mutably borrowed.
pub unsafe trait BufferMut: Buffer {
    /// The address of the first element for an operation that writes it,
    /// ordered on `stream` (device buffers).
    fn lend_mut<'a>(&'a mut self, stream: Option<&'a Stream>) -> Lent<'a>;
}

/// Host memory, by reference: slices, vectors and arrays (`&` as input,
/// `&mut` as input or output). Owned containers are not buffers: an
/// operation queued in a [`crate::Scope`] would outlive them.
macro_rules! host {
    (@input [$($g:tt)*] $ty:ty) => {
        // SAFETY: the slice a reference derefs to addresses its `len()`
        // initialised elements in this process's memory, readable while
        // the reference lives.
        unsafe impl<'r, $($g)*> Buffer for $ty {
            type Elem = T;
            fn len(&self) -> usize {
                <[T]>::len(&self[..])
            }
            fn location(&self) -> Location {
                Location::Host
            }
            #[inline]
            fn kind(&self) -> MemoryKind {
                MemoryKind::Host
            }
            #[inline]
            fn lend<'a>(&'a self, _: Option<&'a Stream>) -> Lent<'a> {
                Lent::new(self[..].as_ptr() as usize)
            }
        }
    };
    ($(impl[$($g:tt)*] $ty:ty, $mut_ty:ty;)*) => {$(
        host!(@input [$($g)*] $ty);
        host!(@input [$($g)*] $mut_ty);
        // SAFETY: as for the inputs; a `&mut` borrow gives exclusive write
        // access.
        unsafe impl<'r, $($g)*> BufferMut for $mut_ty {
            #[inline]
            fn lend_mut<'a>(&'a mut self, _: Option<&'a Stream>) -> Lent<'a> {
                Lent::new(self[..].as_mut_ptr() as usize)
            }
        }
    )*};
}
host! {
    impl[T: Element] &'r [T], &'r mut [T];
    impl[T: Element] &'r Vec<T>, &'r mut Vec<T>;
    impl[T: Element, const N: usize] &'r [T; N], &'r mut [T; N];
}

/// A typed, read-only view of device memory, ordered on a stream: `len`
/// elements of `T` at a device address of `device`.
#[derive(Clone)]
pub struct DeviceSlice<'a, T> {
    device: Arc<dyn Device>,
    ptr: DevicePtr,
    len: usize,
    stream: StreamHandle,
    _borrow: PhantomData<(&'a (), T)>,
}

/// A typed, writable view of device memory, ordered on a stream.
pub struct DeviceSliceMut<'a, T> {
    view: DeviceSlice<'a, T>,
    _borrow: PhantomData<&'a mut ()>,
}

impl<'a, T: Element> DeviceSlice<'a, T> {
    /// Every whole element of `T` in `buf`, used on `stream`.
    pub fn new(buf: &'a DeviceBuffer, stream: StreamHandle) -> DeviceSlice<'a, T> {
        DeviceSlice {
            device: buf.device().clone(),
            ptr: buf.ptr(),
            len: buf.bytes() / T::DTYPE.size(),
            stream,
            _borrow: PhantomData,
        }
    }

    /// `len` elements of `T` at `ptr` on `device`, used on `stream`.
    ///
    /// # Safety
    /// `ptr` is a live allocation of `device` holding at least `len`
    /// elements of `T`, which stays live and is not written by anything not
    /// ordered on `stream` while the view or an operation using it exists
    /// (a [`crate::Scope`] waits for its operations before it ends).
    pub unsafe fn from_raw(
        device: Arc<dyn Device>,
        ptr: DevicePtr,
        len: usize,
        stream: StreamHandle,
    ) -> DeviceSlice<'a, T> {
        DeviceSlice {
            device,
            ptr,
            len,
            stream,
            _borrow: PhantomData,
        }
    }

    /// The elements `range` of this view (panics when out of bounds, as
    /// slicing does).
    pub fn slice(&self, range: std::ops::Range<usize>) -> DeviceSlice<'a, T> {
        assert!(
            range.start <= range.end && range.end <= self.len,
            "device slice range {range:?} out of bounds of {} elements",
            self.len
        );
        DeviceSlice {
            ptr: DevicePtr(self.ptr.0 + (range.start * T::DTYPE.size()) as u64),
            len: range.end - range.start,
            ..self.clone()
        }
    }

    /// The device address of the first element.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }
}

impl<'a, T: Element> DeviceSliceMut<'a, T> {
    /// Every whole element of `T` in `buf`, written on `stream`.
    pub fn new(buf: &'a mut DeviceBuffer, stream: StreamHandle) -> DeviceSliceMut<'a, T> {
        Self::shared(buf, stream)
    }

    /// A writable view of a buffer the caller only holds shared: the old
    /// device forms' calling convention (`&DeviceBuffer` outputs).
    pub(crate) fn shared(buf: &'a DeviceBuffer, stream: StreamHandle) -> DeviceSliceMut<'a, T> {
        DeviceSliceMut {
            view: DeviceSlice::new(buf, stream),
            _borrow: PhantomData,
        }
    }

    /// `len` writable elements of `T` at `ptr` on `device`, on `stream`.
    ///
    /// # Safety
    /// As [`DeviceSlice::from_raw`], and nothing else reads or writes the
    /// range while an operation writes it.
    pub unsafe fn from_raw(
        device: Arc<dyn Device>,
        ptr: DevicePtr,
        len: usize,
        stream: StreamHandle,
    ) -> DeviceSliceMut<'a, T> {
        DeviceSliceMut {
            // SAFETY: forwarded from the caller.
            view: unsafe { DeviceSlice::from_raw(device, ptr, len, stream) },
            _borrow: PhantomData,
        }
    }

    /// The elements `range` of this view, keeping its borrow (panics when
    /// out of bounds).
    pub fn narrow(self, range: std::ops::Range<usize>) -> DeviceSliceMut<'a, T> {
        DeviceSliceMut {
            view: self.view.slice(range),
            _borrow: PhantomData,
        }
    }

    /// The elements `range` (panics when out of bounds).
    pub fn slice_mut(&mut self, range: std::ops::Range<usize>) -> DeviceSliceMut<'_, T> {
        DeviceSliceMut {
            view: self.view.slice(range),
            _borrow: PhantomData,
        }
    }

    /// A read-only view of the same elements, for as long as this one is
    /// borrowed.
    pub fn as_slice(&self) -> DeviceSlice<'_, T> {
        DeviceSlice {
            _borrow: PhantomData,
            ..self.view.clone()
        }
    }

    /// The device address of the first element.
    pub fn ptr(&self) -> DevicePtr {
        self.view.ptr
    }
}

/// Device views, by value (they only borrow) and by reference.
macro_rules! device_views {
    ($($ty:ty => |$v:ident| $view:expr;)*) => {$(
        // SAFETY: the constructors take a live `DeviceBuffer` (sized by its
        // bytes) or the caller's promise (`from_raw`); `slice` stays within
        // bounds.
        unsafe impl<T: Element> Buffer for $ty {
            type Elem = T;
            fn len(&self) -> usize {
                let $v = self;
                $view.len
            }
            fn location(&self) -> Location {
                let $v = self;
                let view = $view;
                Location::Device {
                    device: DeviceId::Open(view.device.clone()),
                    stream: Stream::Handle(view.stream),
                }
            }
            fn lend<'a>(&'a self, _: Option<&'a Stream>) -> Lent<'a> {
                let $v = self;
                Lent::new($view.ptr.0 as usize)
            }
        }
    )*};
}
device_views! {
    DeviceSlice<'_, T> => |v| v;
    &DeviceSlice<'_, T> => |v| *v;
    DeviceSliceMut<'_, T> => |v| &v.view;
    &mut DeviceSliceMut<'_, T> => |v| &v.view;
}

// SAFETY: a mutable view is built from `&mut DeviceBuffer`, from the
// caller's promise (`from_raw`) or, crate-internally, for an operation
// that alone writes it.
unsafe impl<T: Element> BufferMut for DeviceSliceMut<'_, T> {
    fn lend_mut<'a>(&'a mut self, s: Option<&'a Stream>) -> Lent<'a> {
        Buffer::lend(&*self, s)
    }
}

// SAFETY: as above, through the reference.
unsafe impl<T: Element> BufferMut for &mut DeviceSliceMut<'_, T> {
    fn lend_mut<'a>(&'a mut self, s: Option<&'a Stream>) -> Lent<'a> {
        Buffer::lend(&**self, s)
    }
}

/// The first `len` elements of a buffer (the deprecated forms, which took a
/// count and allowed longer buffers).
pub(crate) struct Prefix<B> {
    inner: B,
    len: usize,
}

impl<B: Buffer> Prefix<B> {
    /// The first `len` elements of `inner`; `None` where it is shorter.
    pub(crate) fn new(inner: B, len: usize) -> Option<Prefix<B>> {
        (len <= inner.len()).then_some(Prefix { inner, len })
    }
}

// SAFETY: the first `len <= inner.len()` elements of a buffer are lent by
// the buffer itself (`new` checks the length).
unsafe impl<B: Buffer> Buffer for Prefix<B> {
    type Elem = B::Elem;
    fn len(&self) -> usize {
        self.len
    }
    fn location(&self) -> Location {
        self.inner.location()
    }
    fn lend<'a>(&'a self, stream: Option<&'a Stream>) -> Lent<'a> {
        self.inner.lend(stream)
    }
}

// SAFETY: as above, writable through the buffer itself.
unsafe impl<B: BufferMut> BufferMut for Prefix<B> {
    fn lend_mut<'a>(&'a mut self, stream: Option<&'a Stream>) -> Lent<'a> {
        self.inner.lend_mut(stream)
    }
}

/// A device buffer of a [`crate::Group`], kept until the group is queued
/// (cudarc's guards record their events when the lent address is dropped,
/// after the operation is on the stream).
pub(crate) trait GroupBuffer {
    /// The buffer's location (device and stream).
    fn location(&self) -> Location;
    /// Its address for the group, ordered on `stream`.
    fn lend_on<'s>(&'s mut self, stream: &'s Stream) -> Lent<'s>;
}

/// A buffer a group sends.
struct Sent<B>(B);
/// A buffer a group receives into.
struct Received<B>(B);

impl<B: Buffer> GroupBuffer for Sent<B> {
    fn location(&self) -> Location {
        self.0.location()
    }
    fn lend_on<'s>(&'s mut self, stream: &'s Stream) -> Lent<'s> {
        self.0.lend(Some(stream))
    }
}

impl<B: BufferMut> GroupBuffer for Received<B> {
    fn location(&self) -> Location {
        self.0.location()
    }
    fn lend_on<'s>(&'s mut self, stream: &'s Stream) -> Lent<'s> {
        self.0.lend_mut(Some(stream))
    }
}

/// One transfer of a [`crate::Group`] on device memory.
pub(crate) struct GroupDeviceOp<'a> {
    pub(crate) peer: usize,
    pub(crate) is_send: bool,
    pub(crate) count: usize,
    pub(crate) dtype: comm_core::DataType,
    pub(crate) buf: Box<dyn GroupBuffer + 'a>,
}

impl<'a> GroupDeviceOp<'a> {
    /// A send of `buf` (device memory) to `peer`.
    pub(crate) fn send<B: Buffer + 'a>(buf: B, peer: usize) -> GroupDeviceOp<'a> {
        GroupDeviceOp {
            peer,
            is_send: true,
            count: buf.len(),
            dtype: <B::Elem as Element>::DTYPE,
            buf: Box::new(Sent(buf)),
        }
    }

    /// A receive into `buf` (device memory) from `peer`.
    pub(crate) fn recv<B: BufferMut + 'a>(buf: B, peer: usize) -> GroupDeviceOp<'a> {
        GroupDeviceOp {
            peer,
            is_send: false,
            count: buf.len(),
            dtype: <B::Elem as Element>::DTYPE,
            buf: Box::new(Received(buf)),
        }
    }
}
