//! Tensor fusion: many gradients packed into buckets, each bucket's
//! all-reduce started as soon as it is full (or on flush), results written
//! back per tensor. Defaults follow PyTorch DDP: a first bucket of 1 MiB (so
//! communication starts early in the backward pass), then 25 MiB; dtypes
//! are bucketed apart.
//!
//! Every decision is a function of the sequence of `add` calls, so all
//! ranks launch the same buckets in the same order. A wall-clock cycle
//! time (Horovod) would differ between ranks and needs a negotiation round;
//! `cycle_tensors` is the deterministic stand-in: a bucket also launches
//! once it holds that many tensors.

use std::collections::HashMap;

use comm_core::wire::Collective;
use comm_core::{DataType, Error, ReduceOp, Result};

use crate::{as_bytes, Communicator, Element, RawOp, RawWork};

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

struct Bucket {
    dtype: DataType,
    /// 8-byte aligned storage so any element type can be viewed in place.
    words: Vec<u64>,
    bytes: usize,
    members: Vec<(usize, usize, usize)>, // (tensor id, byte offset, byte length)
}

impl Bucket {
    fn new(dtype: DataType) -> Bucket {
        Bucket {
            dtype,
            words: Vec::new(),
            bytes: 0,
            members: Vec::new(),
        }
    }

    fn push(&mut self, id: usize, data: &[u8]) {
        let start = self.bytes;
        self.bytes += data.len();
        self.words.resize(self.bytes.div_ceil(8), 0);
        // SAFETY: `words` holds at least `bytes` bytes (resized just above)
        // and u64 storage may be viewed as bytes.
        let view = unsafe {
            std::slice::from_raw_parts_mut(self.words.as_mut_ptr() as *mut u8, self.bytes)
        };
        view[start..].copy_from_slice(data);
        self.members.push((id, start, data.len()));
    }

    fn view(&self) -> &[u8] {
        // SAFETY: as in `push`: `words` covers `bytes` bytes.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr() as *const u8, self.bytes) }
    }
}

/// Packs tensors into buckets and all-reduces each bucket asynchronously.
///
/// ```no_run
/// # let comm = sncl::Communicator::from_env()?;
/// let mut b = sncl::Bucketer::new(&comm, sncl::BucketConfig::default());
/// for (id, grad) in [vec![1.0f32; 1000], vec![2.0; 5000]].iter().enumerate() {
///     b.add(id, grad)?; // communication of full buckets starts here
/// }
/// b.finish(|id, reduced: &[f32]| { /* write back tensor `id` */ })?;
/// # Ok::<(), sncl::Error>(())
/// ```
pub struct Bucketer<'c> {
    comm: &'c Communicator,
    cfg: BucketConfig,
    open: HashMap<DataType, Bucket>,
    in_flight: Vec<(Bucket, RawWork)>,
    launched: usize,
}

impl<'c> Bucketer<'c> {
    /// A bucketer over `comm`.
    pub fn new(comm: &'c Communicator, cfg: BucketConfig) -> Bucketer<'c> {
        Bucketer {
            comm,
            cfg,
            open: HashMap::new(),
            in_flight: Vec::new(),
            launched: 0,
        }
    }

    fn cap(&self) -> usize {
        if self.launched == 0 {
            self.cfg.first_cap_bytes
        } else {
            self.cfg.cap_bytes
        }
    }

    /// Adds a ready gradient (copied into its dtype's bucket); launches the
    /// bucket's all-reduce when it reaches the cap. Every rank must add the
    /// same tensors in the same order.
    pub fn add<T: Element>(&mut self, id: usize, grad: &[T]) -> Result<()> {
        let cap = self.cap();
        let bucket = self
            .open
            .entry(T::DTYPE)
            .or_insert_with(|| Bucket::new(T::DTYPE));
        bucket.push(id, as_bytes(grad));
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

    fn launch(&mut self, dtype: DataType) -> Result<()> {
        let Some(bucket) = self.open.remove(&dtype) else {
            return Ok(());
        };
        if bucket.bytes == 0 {
            return Ok(());
        }
        let mut op = RawOp::new(Collective::AllReduce, dtype, bucket.bytes / dtype.size());
        op.op = self.cfg.op;
        op.send = bucket.words.as_ptr() as *const u8;
        op.recv = bucket.words.as_ptr() as *mut u8;
        // SAFETY: the bucket's storage is owned by `in_flight` (its heap
        // buffer does not move) until the work completes: `finish` and Drop
        // wait for every in-flight work before the storage is freed.
        let work = unsafe { self.comm.enqueue_raw(op) };
        self.in_flight.push((bucket, work));
        self.launched += 1;
        Ok(())
    }

    /// Launches every open bucket (in data-type order, the same on every rank).
    pub fn flush(&mut self) -> Result<()> {
        let mut open: Vec<DataType> = self.open.keys().copied().collect();
        open.sort();
        for d in open {
            self.launch(d)?;
        }
        Ok(())
    }

    /// Flushes, waits for every bucket and hands each tensor's reduced
    /// values to `write_back(id, values)` (tensors of type `T`; buckets of
    /// other types are waited for and skipped). The bucketer is then ready
    /// for the next step.
    pub fn finish<T: Element>(&mut self, mut write_back: impl FnMut(usize, &[T])) -> Result<()> {
        self.flush()?;
        let mut first_err: Option<Error> = None;
        for (bucket, work) in self.in_flight.drain(..) {
            if let Err(e) = work.wait() {
                first_err.get_or_insert(e);
                continue;
            }
            if bucket.dtype != T::DTYPE {
                continue;
            }
            let bytes = bucket.view();
            for &(id, off, len) in &bucket.members {
                let n = len / T::DTYPE.size();
                // SAFETY: the bucket storage is 8-byte aligned and `off` is a
                // multiple of the element size (tensors of one dtype are
                // packed back to back), so the slice is aligned and in bounds.
                let vals =
                    unsafe { std::slice::from_raw_parts(bytes.as_ptr().add(off) as *const T, n) };
                write_back(id, vals);
            }
        }
        self.launched = 0;
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Buckets launched and not yet finished.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }
}

impl Drop for Bucketer<'_> {
    fn drop(&mut self) {
        for (_, work) in self.in_flight.drain(..) {
            let _ = work.wait();
        }
    }
}
