//! Tensor fusion: many gradients packed into buckets, each bucket's
//! all-reduce started as soon as it is full (or on flush), the results
//! written back into the gradients. Defaults follow PyTorch DDP: a first
//! bucket of 1 MiB (so communication starts early in the backward pass),
//! then 25 MiB; dtypes are bucketed apart.
//!
//! One [`Bucketer`] for every memory kind ([`crate::Buffer`]): host
//! gradients are copied into a host bucket when added; device gradients
//! are packed into a device bucket on their stream when the bucket
//! launches (device to device copies after the work already on the
//! stream, i.e. the backward kernels that produced them), and
//! [`Bucketer::finish`] copies every reduced bucket back into its
//! gradients and returns once they hold the results (device: once the
//! stream has run the copies). Host and device gradients go to separate
//! buckets; device gradients of one bucketer share one stream.
//!
//! Every decision is a function of the sequence of `add` calls, so all
//! ranks launch the same buckets in the same order. A wall-clock cycle
//! time (Horovod) would differ between ranks and needs a negotiation round;
//! `cycle_tensors` is the deterministic stand-in: a bucket also launches
//! once it holds that many tensors.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Instant;

use comm_core::transport::registry::MemoryKind;
use comm_core::wire::Collective;
use comm_core::{DataType, Error, ReduceOp, Result};

use crate::buffer::{BufferMut, Lent, Location, Stream};
use crate::device::{device_error, Device, DeviceBuffer, DevicePtr};
use crate::{Communicator, Element, RawOp, RawWork};

const OP: &str = "bucketer";

/// Bucketing policy.
#[derive(Clone, Debug)]
pub struct BucketConfig {
    /// Bucket size cap in bytes (default 25 MiB).
    pub cap_bytes: usize,
    /// Cap of the first bucket (default 1 MiB).
    pub first_cap_bytes: usize,
    /// Launch a bucket once it holds this many tensors (`None`: only the
    /// byte cap or a flush launch it).
    pub cycle_tensors: Option<usize>,
    /// The reduction (sum or avg, as DDP averages gradients).
    pub op: ReduceOp,
}

impl Default for BucketConfig {
    fn default() -> Self {
        BucketConfig {
            cap_bytes: 25 << 20,
            first_cap_bytes: 1 << 20,
            cycle_tensors: None,
            op: ReduceOp::Avg,
        }
    }
}

/// A gradient of any memory kind and element type, kept (with its borrow)
/// until its results are written back.
trait Gradient {
    fn bytes(&self) -> usize;
    /// The gradient lent for a copy ordered on `stream` (device); keep it
    /// until the copy is enqueued (cudarc's guards record the slice's
    /// events when it drops).
    fn lend_for_copy<'a>(&'a mut self, stream: Option<&'a Stream>) -> Lent<'a>;
}

impl<B: BufferMut> Gradient for B {
    fn bytes(&self) -> usize {
        self.len() * B::Elem::DTYPE.size()
    }
    fn lend_for_copy<'a>(&'a mut self, stream: Option<&'a Stream>) -> Lent<'a> {
        self.lend_mut(stream)
    }
}

/// A bucket's storage: host memory (8-byte words, so any element type can
/// be viewed in place) or, once launched, a device buffer.
enum Storage {
    Host(Vec<u64>),
    Device(Option<DeviceBuffer>),
}

struct Bucket<'g> {
    dtype: DataType,
    storage: Storage,
    bytes: usize,
    /// (gradient, byte offset in the bucket).
    members: Vec<(Box<dyn Gradient + 'g>, usize)>,
}

impl Bucket<'_> {
    fn host_bytes(&mut self) -> &mut [u8] {
        let Storage::Host(words) = &mut self.storage else {
            unreachable!("a host bucket")
        };
        words.resize(self.bytes.div_ceil(8), 0);
        // SAFETY: `words` holds at least `bytes` bytes (resized just above)
        // and u64 storage may be viewed as bytes.
        unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr() as *mut u8, self.bytes) }
    }
}

/// Packs gradients into buckets and all-reduces each bucket
/// asynchronously; the results land in the gradients at
/// [`Bucketer::finish`].
///
/// ```no_run
/// # let comm = sncl::Communicator::from_env()?;
/// let mut grads = vec![vec![1.0f32; 1000], vec![2.0; 5000]];
/// let mut b = sncl::Bucketer::new(&comm, sncl::BucketConfig::default());
/// for (id, grad) in grads.iter_mut().enumerate() {
///     b.add(id, grad)?; // communication of full buckets starts here
/// }
/// b.finish()?; // every gradient now holds its all-reduced values
/// # Ok::<(), sncl::Error>(())
/// ```
pub struct Bucketer<'c, 'g> {
    comm: &'c Communicator,
    cfg: BucketConfig,
    /// The stream of the device gradients (the first one's).
    stream: Option<Stream>,
    open: HashMap<(DataType, MemoryKind), Bucket<'g>>,
    in_flight: Vec<(Bucket<'g>, RawWork)>,
    launched: usize,
    _grads: PhantomData<&'g mut ()>,
}

impl std::fmt::Debug for Bucketer<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bucketer")
            .field("cfg", &self.cfg)
            .field("in_flight", &self.in_flight.len())
            .finish()
    }
}

impl<'c, 'g> Bucketer<'c, 'g> {
    /// A bucketer over `comm`.
    pub fn new(comm: &'c Communicator, cfg: BucketConfig) -> Bucketer<'c, 'g> {
        Bucketer {
            comm,
            cfg,
            stream: None,
            open: HashMap::new(),
            in_flight: Vec::new(),
            launched: 0,
            _grads: PhantomData,
        }
    }

    fn invalid(&self, detail: String) -> Error {
        Error::InvalidArgument {
            rank: self.comm.rank(),
            op: OP,
            detail,
        }
    }

    fn cap(&self) -> usize {
        if self.launched == 0 {
            self.cfg.first_cap_bytes
        } else {
            self.cfg.cap_bytes
        }
    }

    /// Adds a ready gradient (host: copied into its bucket now; device:
    /// packed when its bucket launches) and launches the bucket's
    /// all-reduce when it reaches the cap; the reduced values are written
    /// back into `grad` by [`Bucketer::finish`]. Every rank must add the
    /// same tensors (sizes, types, memory kinds) in the same order; `id`
    /// names the tensor in errors.
    pub fn add<B: BufferMut + 'g>(&mut self, id: usize, grad: B) -> Result<()> {
        let dtype = B::Elem::DTYPE;
        let location = crate::Buffer::location(&grad);
        let kind = location.kind();
        if let Location::Device { device, stream } = &location {
            self.comm.bind_or_check_id(OP, "a gradient", device)?;
            match &self.stream {
                None => self.stream = Some(stream.clone()),
                Some(s) if s.handle() == stream.handle() => {}
                Some(s) => {
                    return Err(self.invalid(format!(
                        "gradient {id} is ordered on stream {:#x}, the bucketer's device \
                         gradients on {:#x}; one bucketer, one stream",
                        stream.handle().0,
                        s.handle().0
                    )))
                }
            }
        }
        let cap = self.cap();
        let bucket = self.open.entry((dtype, kind)).or_insert_with(|| Bucket {
            dtype,
            storage: match kind {
                MemoryKind::Host => Storage::Host(Vec::new()),
                MemoryKind::Device => Storage::Device(None),
            },
            bytes: 0,
            members: Vec::new(),
        });
        let mut grad: Box<dyn Gradient + 'g> = Box::new(grad);
        let (at, len) = (bucket.bytes, grad.bytes());
        bucket.bytes += len;
        if kind == MemoryKind::Host && len > 0 {
            let src = grad.lend_for_copy(None).addr as *const u8;
            // SAFETY: a host gradient lends `len` readable bytes at `src`
            // (`Buffer`'s contract), borrowed for 'g.
            let values = unsafe { std::slice::from_raw_parts(src, len) };
            bucket.host_bytes()[at..].copy_from_slice(values);
        }
        bucket.members.push((grad, at));
        let full = bucket.bytes >= cap
            || self
                .cfg
                .cycle_tensors
                .is_some_and(|c| bucket.members.len() >= c);
        if full {
            self.launch((dtype, kind))?;
        }
        Ok(())
    }

    /// The bound device, for the device buckets.
    fn device(&self) -> Result<Arc<dyn Device>> {
        self.comm
            .bound_device()
            .ok_or_else(|| self.invalid("no device is bound".into()))
    }

    /// Starts the all-reduce of the open bucket `key` (device buckets are
    /// packed first, on the gradients' stream).
    fn launch(&mut self, key: (DataType, MemoryKind)) -> Result<()> {
        let Some(mut bucket) = self.open.remove(&key) else {
            return Ok(());
        };
        if bucket.bytes == 0 {
            return Ok(());
        }
        let dtype = bucket.dtype;
        let mut op = RawOp::new(Collective::AllReduce, dtype, bucket.bytes / dtype.size());
        op.op = self.cfg.op;
        let work = match key.1 {
            MemoryKind::Host => {
                let p = bucket.host_bytes().as_mut_ptr();
                (op.send, op.recv) = (p as *const u8, p);
                // SAFETY: the bucket's storage is owned by `in_flight` (its
                // heap buffer does not move) until the work completes:
                // `finish` and Drop wait for every in-flight work first.
                unsafe { self.comm.enqueue_raw(op) }
            }
            MemoryKind::Device => {
                let launched = self.launch_device(&mut bucket, &op);
                if launched.is_err() {
                    // Packing copies may be queued into the storage that
                    // goes with the bucket: let the stream finish first.
                    let _ = self.sync();
                }
                launched?
            }
        };
        self.in_flight.push((bucket, work));
        self.launched += 1;
        Ok(())
    }

    /// Packs a device bucket on the gradients' stream and starts its
    /// all-reduce.
    fn launch_device(&self, bucket: &mut Bucket<'g>, op: &RawOp) -> Result<RawWork> {
        let dev = self.device()?;
        let stream = self.stream.clone().expect("a device gradient set it");
        let fail = |what: &str, e| device_error(self.comm.rank(), &dev, (OP, None), what, e);
        let storage =
            DeviceBuffer::new(&dev, bucket.bytes).map_err(|e| fail("allocating a bucket", e))?;
        let p = storage.ptr();
        bucket.storage = Storage::Device(Some(storage));
        for (grad, at) in &mut bucket.members {
            let len = grad.bytes();
            let src = grad.lend_for_copy(Some(&stream));
            // SAFETY: the gradient lends `len` bytes on this device, borrowed
            // for 'g; the bucket's storage (kept with it until the stream
            // ran its work) holds the bucket's bytes.
            unsafe {
                dev.copy_d2d_async(p.add(*at), DevicePtr(src.addr as u64), len, stream.handle())
            }
            .map_err(|e| fail("packing a gradient into its bucket", e))?;
        }
        // SAFETY: the bucket's storage is owned by `in_flight` until
        // `finish` (or Drop) has waited for the work and the stream.
        unsafe {
            self.comm
                .all_reduce_device_raw(p, p, op.count, op.dtype, op.op, stream.handle())
        }
    }

    /// Launches every open bucket (in data-type order, host first, the
    /// same on every rank).
    pub fn flush(&mut self) -> Result<()> {
        let mut open: Vec<(DataType, MemoryKind)> = self.open.keys().copied().collect();
        open.sort_by_key(|&(d, k)| (d, k == MemoryKind::Device));
        for key in open {
            self.launch(key)?;
        }
        Ok(())
    }

    /// Flushes, waits for every bucket and writes each gradient's reduced
    /// values back into it (device: on the stream, returning once the
    /// stream has run the copies), which ends the gradients' borrows (a
    /// step's bucketer; make another for the next step). The first error
    /// is returned; later buckets are still waited for.
    pub fn finish(mut self) -> Result<()> {
        let flushed = self.flush();
        let mut first_err = flushed.err();
        let mut buckets: Vec<_> = self.in_flight.drain(..).collect();
        let mut device_copies = false;
        for (bucket, work) in &mut buckets {
            // Whatever the result, a device bucket's storage stays until the
            // stream has run everything queued on it.
            device_copies |= matches!(bucket.storage, Storage::Device(Some(_)));
            if let Err(e) = work.wait() {
                first_err.get_or_insert(e);
                continue;
            }
            if let Err(e) = self.write_back(bucket) {
                first_err.get_or_insert(e);
            }
        }
        if device_copies {
            if let Err(e) = self.sync() {
                first_err.get_or_insert(e);
            }
        }
        drop(buckets);
        first_err.map_or(Ok(()), Err)
    }

    /// Copies a reduced bucket into its gradients.
    fn write_back(&self, bucket: &mut Bucket<'g>) -> Result<()> {
        let Bucket {
            storage, members, ..
        } = bucket;
        match storage {
            Storage::Host(words) => {
                let base = words.as_ptr() as *const u8;
                for (grad, at) in members {
                    let len = grad.bytes();
                    if len == 0 {
                        continue;
                    }
                    let dst = grad.lend_for_copy(None).addr as *mut u8;
                    // SAFETY: the bucket's words hold `at + len` bytes; the
                    // gradient lends `len` writable bytes at `dst` for 'g,
                    // and it does not overlap the bucket.
                    unsafe { std::ptr::copy_nonoverlapping(base.add(*at), dst, len) };
                }
                Ok(())
            }
            Storage::Device(Some(storage)) => {
                let dev = self.device()?;
                let stream = self.stream.clone().expect("a device gradient set it");
                for (grad, at) in members {
                    let len = grad.bytes();
                    let dst = grad.lend_for_copy(Some(&stream));
                    // SAFETY: as in `launch_device`; the copy runs after the
                    // all-reduce (the stream waits for it), and `dst`
                    // (cudarc's guard) drops after it is enqueued.
                    unsafe {
                        let to = DevicePtr(dst.addr as u64);
                        dev.copy_d2d_async(to, storage.ptr().add(*at), len, stream.handle())
                    }
                    .map_err(|e| {
                        device_error(
                            self.comm.rank(),
                            &dev,
                            (OP, None),
                            "copying a reduced bucket back into its gradients",
                            e,
                        )
                    })?;
                }
                Ok(())
            }
            Storage::Device(None) => Ok(()),
        }
    }

    /// Waits for the device gradients' stream (so buckets can be freed).
    fn sync(&self) -> Result<()> {
        let (Some(dev), Some(stream)) = (self.comm.bound_device(), &self.stream) else {
            return Ok(());
        };
        let deadline = Instant::now() + self.comm.inner.config.timeout;
        dev.synchronize(stream.handle(), deadline).map_err(|e| {
            device_error(
                self.comm.rank(),
                &dev,
                (OP, None),
                "waiting for the stream",
                e,
            )
        })
    }

    /// Buckets launched and not yet finished.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }
}

impl Drop for Bucketer<'_, '_> {
    fn drop(&mut self) {
        for (_, work) in &self.in_flight {
            let _ = work.wait();
        }
        if self
            .in_flight
            .iter()
            .any(|(b, _)| matches!(b.storage, Storage::Device(_)))
        {
            let _ = self.sync();
        }
        self.in_flight.clear();
    }
}
