//! The device bucketer before the one typed API, kept for one release: a
//! thin wrapper of [`crate::Bucketer`] over views of [`DeviceBuffer`]s.
#![allow(deprecated)]

use comm_core::{Error, Result};

use crate::buffer::DeviceSliceMut;
use crate::device::{DeviceBuffer, StreamHandle};
use crate::{BucketConfig, Bucketer, Communicator, Element};

/// Gradient fusion for device buffers, ordered on one stream.
#[deprecated(note = "use Bucketer, adding DeviceSliceMut views of the gradients")]
#[derive(Debug)]
pub struct DeviceBucketer<'c, 'g> {
    fused: Bucketer<'c, 'g>,
    comm: &'c Communicator,
    cfg: BucketConfig,
    stream: StreamHandle,
    added: usize,
}

impl<'c, 'g> DeviceBucketer<'c, 'g> {
    /// A bucketer for `comm` whose work is ordered on `stream`.
    pub fn new(comm: &'c Communicator, cfg: BucketConfig, stream: StreamHandle) -> Self {
        DeviceBucketer {
            fused: Bucketer::new(comm, cfg.clone()),
            comm,
            cfg,
            stream,
            added: 0,
        }
    }

    /// Adds the first `count` elements of `grad` (of type `T`).
    pub fn add<T: Element>(&mut self, grad: &'g DeviceBuffer, count: usize) -> Result<()> {
        if count
            .checked_mul(T::DTYPE.size())
            .is_none_or(|b| b > grad.bytes())
        {
            return Err(Error::InvalidArgument {
                rank: self.comm.rank(),
                op: "device_bucketer",
                detail: format!(
                    "a gradient of {} bytes cannot hold {count} × {}",
                    grad.bytes(),
                    T::DTYPE.name()
                ),
            });
        }
        self.added += 1;
        let view = DeviceSliceMut::<T>::shared(grad, self.stream).narrow(0..count);
        self.fused.add(self.added - 1, view)
    }

    /// Launches every open bucket.
    pub fn flush(&mut self) -> Result<()> {
        self.fused.flush()
    }

    /// Waits for every bucket and copies the results back into the
    /// gradients.
    pub fn finish(&mut self) -> Result<()> {
        self.added = 0;
        let next = Bucketer::new(self.comm, self.cfg.clone());
        std::mem::replace(&mut self.fused, next).finish()
    }

    /// Buckets launched and not yet finished.
    pub fn in_flight(&self) -> usize {
        self.fused.in_flight()
    }
}
