//! Tensor fusion on device buffers: [`DeviceBucketer`] packs gradients
//! that live on the communicator's device into device buckets (device to
//! device copies on the caller's stream) and all-reduces each bucket on the
//! device as soon as it is full, with the same deterministic policy as the
//! host [`crate::Bucketer`] ([`BucketConfig`]: first bucket, cap, tensor
//! count, dtypes apart).
//!
//! Stream order: a bucket's packing copies run after the work already on
//! the stream (the backward kernels that produced the gradients); its
//! all-reduce after the packing; [`DeviceBucketer::finish`] copies each
//! reduced bucket back into its tensors on the stream and returns once the
//! stream has run everything (the buckets are then freed).

use std::collections::HashMap;
use std::time::Instant;

use comm_core::{DataType, Error, Result};

use crate::device::{device_error, DeviceBuffer, DeviceError, DevicePtr, StreamHandle};
use crate::{BucketConfig, Communicator, Element, RawWork};

const OP: &str = "device_bucketer";

/// An open or launched bucket: its tensors, then (once launched) its
/// device storage.
struct DeviceBucket<'g> {
    bytes: usize,
    /// (tensor, offset in the bucket, bytes).
    members: Vec<(&'g DeviceBuffer, usize, usize)>,
    storage: Option<DeviceBuffer>,
}

/// Gradient fusion for device buffers (see the module documentation).
/// Tensors are borrowed for `'g` (they must outlive the step); all ranks
/// must add the same sequence of tensor sizes and types.
pub struct DeviceBucketer<'c, 'g> {
    comm: &'c Communicator,
    cfg: BucketConfig,
    stream: StreamHandle,
    open: HashMap<DataType, DeviceBucket<'g>>,
    in_flight: Vec<(DeviceBucket<'g>, RawWork)>,
    launched: usize,
}

impl std::fmt::Debug for DeviceBucketer<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBucketer")
            .field("cfg", &self.cfg)
            .field("in_flight", &self.in_flight.len())
            .finish()
    }
}

impl<'c, 'g> DeviceBucketer<'c, 'g> {
    /// A bucketer for `comm` (bound to a device, or bound to the first
    /// tensor's device) whose work is ordered on `stream`.
    pub fn new(comm: &'c Communicator, cfg: BucketConfig, stream: StreamHandle) -> Self {
        DeviceBucketer {
            comm,
            cfg,
            stream,
            open: HashMap::new(),
            in_flight: Vec::new(),
            launched: 0,
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

    /// Adds the first `count` elements of `grad` (of type `T`); launches
    /// its bucket when full.
    pub fn add<T: Element>(&mut self, grad: &'g DeviceBuffer, count: usize) -> Result<()> {
        self.comm.bind_or_check(OP, "a gradient", grad.device())?;
        let bytes = count
            .checked_mul(T::DTYPE.size())
            .filter(|&b| b <= grad.bytes())
            .ok_or_else(|| {
                self.invalid(format!(
                    "a gradient of {} bytes cannot hold {count} × {}",
                    grad.bytes(),
                    T::DTYPE.name()
                ))
            })?;
        let cap = self.cap();
        let bucket = self.open.entry(T::DTYPE).or_insert_with(|| DeviceBucket {
            bytes: 0,
            members: Vec::new(),
            storage: None,
        });
        bucket.members.push((grad, bucket.bytes, bytes));
        bucket.bytes += bytes;
        let full = bucket.bytes >= cap
            || self
                .cfg
                .cycle_tensors
                .is_some_and(|c| bucket.members.len() >= c);
        if full {
            self.launch(T::DTYPE)?;
        }
        Ok(())
    }

    /// Packs the open bucket of `dtype` on the device and starts its
    /// all-reduce.
    fn launch(&mut self, dtype: DataType) -> Result<()> {
        let Some(mut bucket) = self.open.remove(&dtype) else {
            return Ok(());
        };
        if bucket.bytes == 0 {
            return Ok(());
        }
        let dev = self
            .comm
            .bound_device()
            .ok_or_else(|| self.invalid("no device is bound".into()))?;
        let device_err =
            |what: &str, e: DeviceError| device_error(self.comm.rank(), &dev, (OP, None), what, e);
        let storage = DeviceBuffer::new(&dev, bucket.bytes)
            .map_err(|e| device_err("allocating a bucket", e))?;
        for &(grad, off, len) in &bucket.members {
            // SAFETY: `grad` holds at least `len` bytes (checked in `add`)
            // and is borrowed for 'g; `storage` holds the bucket's bytes.
            unsafe { dev.copy_d2d_async(storage.ptr().add(off), grad.ptr(), len, self.stream) }
                .map_err(|e| device_err("packing a gradient into its bucket", e))?;
        }
        let p: DevicePtr = storage.ptr();
        bucket.storage = Some(storage);
        // SAFETY: the bucket's storage is owned by `in_flight` until
        // `finish` (or Drop) has waited for the work and synchronised the
        // stream.
        let work = unsafe {
            self.comm.all_reduce_device_raw(
                p,
                p,
                bucket.bytes / dtype.size(),
                dtype,
                self.cfg.op,
                self.stream,
            )
        }?;
        self.in_flight.push((bucket, work));
        self.launched += 1;
        Ok(())
    }

    /// Launches every open bucket (in data-type order, the same on every
    /// rank).
    pub fn flush(&mut self) -> Result<()> {
        let mut open: Vec<DataType> = self.open.keys().copied().collect();
        open.sort();
        for d in open {
            self.launch(d)?;
        }
        Ok(())
    }

    /// Flushes, waits for every bucket, copies the reduced values back
    /// into the tensors (on the stream) and returns when the stream has
    /// run them. The bucketer is then ready for the next step.
    pub fn finish(&mut self) -> Result<()> {
        self.flush()?;
        let dev = self.comm.bound_device();
        let mut first_err: Option<Error> = None;
        let buckets: Vec<_> = self.in_flight.drain(..).collect();
        for (bucket, work) in &buckets {
            if let Err(e) = work.wait() {
                first_err.get_or_insert(e);
                continue;
            }
            let (Some(dev), Some(storage)) = (&dev, &bucket.storage) else {
                continue;
            };
            for &(grad, off, len) in &bucket.members {
                // SAFETY: as in `launch`; the copy runs after the
                // all-reduce (the stream waits for it).
                if let Err(e) = unsafe {
                    dev.copy_d2d_async(grad.ptr(), storage.ptr().add(off), len, self.stream)
                } {
                    first_err.get_or_insert(device_error(
                        self.comm.rank(),
                        dev,
                        (OP, None),
                        "copying a reduced bucket back into its gradients",
                        e,
                    ));
                }
            }
        }
        self.sync(&dev, &mut first_err);
        drop(buckets);
        self.launched = 0;
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Waits for the stream (so buckets can be freed).
    fn sync(
        &self,
        dev: &Option<std::sync::Arc<dyn crate::device::Device>>,
        first: &mut Option<Error>,
    ) {
        if let Some(dev) = dev {
            let deadline = Instant::now() + self.comm.inner.config.timeout;
            if let Err(e) = dev.synchronize(self.stream, deadline) {
                first.get_or_insert(device_error(
                    self.comm.rank(),
                    dev,
                    (OP, None),
                    "waiting for the stream",
                    e,
                ));
            }
        }
    }

    /// Buckets launched and not yet finished.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }
}

impl Drop for DeviceBucketer<'_, '_> {
    fn drop(&mut self) {
        for (_, work) in &self.in_flight {
            let _ = work.wait();
        }
        let mut ignored = None;
        self.sync(&self.comm.bound_device(), &mut ignored);
        self.in_flight.clear();
    }
}
