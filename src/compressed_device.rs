//! Compressed all-reduce on device buffers: the algorithm of
//! [`crate::compressed`] with the codecs run by the device's codec kernels
//! ([`Device::codec`]) and the encoded bytes moved by the device
//! collectives, so only encoded bytes cross the staging path and the data
//! never visits the host.
//!
//! Every step is enqueued on the caller's stream in order — encode, an
//! all-to-all of encoded parts, the owner's decode-and-sum and re-encode, an
//! all-gather of the reduced encodings, decode (top-k: encode, all-gather,
//! decode-and-add). [`Communicator::enqueue_all_reduce_compressed_device`]
//! returns once they are enqueued, with a [`CompressedDeviceWork`] that
//! owns the call's temporaries; its `wait` (or drop) waits for the stream
//! (with the communicator's timeout as the deadline) and reports a peer's
//! undecodable encoding. [`Communicator::all_reduce_compressed_device`] is
//! both in one call, like the host form.
//! Results are bit-identical to [`Communicator::all_reduce_compressed`] on
//! the same data (the kernels are bit-identical to the `compress` crate and
//! the operand order is the same); the error-feedback residual lives in
//! device memory ([`DeviceFeedback`]).
//!
//! The owner's step is fused for fp16 / bf16 (one decode-sum-encode pass
//! over up to 8 encodings); other codecs decode-and-add into an f32
//! scratch, then re-encode.
//!
//! Codecs: fp16, bf16, int8 (nearest and stochastic), top-k exact and
//! sampled. Sampled top-k encodings vary in length: they are gathered at
//! their largest size and decoded by their headers on the device
//! ([`CodecOp::DecodeTopK`]), with no host round trip.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use comm_core::{DataType, Error, ReduceOp, Result};
use compress::Codec;

use crate::device::{device_error, Device, DeviceBuffer, DeviceError, DevicePtr, StreamHandle};
use crate::work::RawWork;
use crate::{Communicator, CompressScope};
use ::device::codec::{self as dcodec, CodecOp};
use sncl_runtime::device::binding::Binding;

const OP: &str = "all_reduce_compressed";

/// The error-feedback residual of one tensor, in device memory (the
/// device counterpart of [`compress::ErrorFeedback`]). Keep one per tensor
/// and pass it to every call; it is (re)allocated, zeroed, when the
/// length it covers changes.
#[derive(Default)]
pub struct DeviceFeedback {
    residual: Option<DeviceBuffer>,
    len: usize,
}

impl std::fmt::Debug for DeviceFeedback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceFeedback")
            .field("len", &self.len)
            .finish()
    }
}

impl DeviceFeedback {
    /// No residual yet (the first call starts from zero).
    pub fn new() -> DeviceFeedback {
        DeviceFeedback::default()
    }

    /// The residual (`len` f32 on the device), once a call made one.
    pub fn residual(&self) -> Option<&DeviceBuffer> {
        self.residual.as_ref()
    }

    /// Elements the residual covers (0 before the first call).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no residual is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets the residual (the next call starts from zero).
    pub fn reset(&mut self) {
        self.residual = None;
        self.len = 0;
    }
}

/// One call's device context: the device, the caller's stream, the rank
/// and the timeout; the call's temporaries live until the stream has run
/// everything that uses them ([`Ctx::finish`]), then go back to the
/// binding for the next call (a free synchronises the device).
struct Ctx {
    dev: Arc<dyn Device>,
    binding: Arc<Binding>,
    stream: StreamHandle,
    rank: usize,
    timeout: Duration,
    /// This call's temporaries, taken or allocated before it enqueued
    /// anything ([`Ctx::prepare`]), in the order the call uses them.
    prepared: std::collections::VecDeque<DeviceBuffer>,
    temps: Vec<DeviceBuffer>,
    works: Vec<RawWork>,
    /// Top-k decode workspaces, whose first u32 is the decode's status.
    statuses: Vec<DevicePtr>,
    /// Host zeros being copied to the device (kept until the stream has
    /// run the copies).
    zeros: Vec<Vec<u8>>,
}

impl Ctx {
    /// Waits for the enqueued collectives and the stream, then checks the
    /// top-k decodes' statuses (the first error met is returned). The
    /// temporaries may be freed after this returns.
    fn finish(&mut self) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        let mut first = None;
        // Every enqueued collective ends (or fails) before the stream is
        // waited for and the temporaries are freed.
        for w in self.works.drain(..) {
            if let Err(e) = w.wait() {
                first.get_or_insert(e);
            }
        }
        if let Err(e) = self.dev.synchronize(self.stream, deadline) {
            first.get_or_insert(self.err("waiting for the stream", e));
        } else {
            // The stream ran everything that used them.
            let mut kept = std::mem::take(&mut self.temps);
            kept.extend(self.prepared.drain(..));
            self.binding.keep_temporaries(kept);
        }
        self.zeros.clear();
        if let Some(e) = first {
            self.statuses.clear();
            return Err(e);
        }
        for ws in std::mem::take(&mut self.statuses) {
            let mut status = 0u32;
            // SAFETY: `ws` is a live workspace of at least 4 bytes (a
            // temporary of this context); `status` is a live u32 and the
            // copy is synchronised below.
            unsafe {
                self.dev
                    .copy_d2h_async((&mut status as *mut u32).cast(), ws, 4, self.stream)
            }
            .map_err(|e| self.err("reading a top-k decode status", e))?;
            self.dev
                .synchronize(self.stream, deadline)
                .map_err(|e| self.err("reading a top-k decode status", e))?;
            if let Some(why) = dcodec::decode_status(status) {
                return Err(Error::InvalidArgument {
                    rank: self.rank,
                    op: OP,
                    detail: format!("a peer's encoded data does not decode: {why}"),
                });
            }
        }
        Ok(())
    }

    fn err(&self, what: &str, e: DeviceError) -> Error {
        device_error(self.rank, &self.dev, (OP, None), what, e)
    }

    /// Takes or allocates every temporary of the call (`sizes`, in the
    /// order it uses them: [`cross_tier_temporaries`]) before the call
    /// enqueues anything: an allocation may synchronise the device, which
    /// must not happen while the call's own collectives park the stream.
    /// Each is the smallest one the binding kept from earlier calls that
    /// fits, else a new one; those this call does not use go back at once.
    fn prepare(&mut self, sizes: &[usize]) -> Result<()> {
        let mut spare = self.binding.take_temporaries();
        let mut taken = Ok(());
        for &bytes in sizes {
            let bytes = bytes.max(1);
            let fits = (0..spare.len())
                .filter(|&i| spare[i].bytes() >= bytes)
                .min_by_key(|&i| spare[i].bytes());
            let buf = match fits {
                Some(i) => spare.swap_remove(i),
                None => match DeviceBuffer::new(&self.dev, bytes) {
                    Ok(b) => b,
                    Err(e) => {
                        taken = Err(self.err("allocating the call's temporaries", e));
                        break;
                    }
                },
            };
            self.prepared.push_back(buf);
        }
        self.binding.keep_temporaries(spare);
        taken
    }

    /// A device buffer of `bytes` (at least 1), kept for the call: the
    /// next prepared one; for buffers every byte of which is written
    /// before it is read or sent.
    fn alloc(&mut self, bytes: usize, what: &str) -> Result<DevicePtr> {
        let bytes = bytes.max(1);
        let buf = match self.prepared.pop_front() {
            Some(b) if b.bytes() >= bytes => b,
            other => {
                // `call_temporaries` and the call disagree: still correct,
                // but this allocation may meet a parked stream.
                tracing::warn!(
                    rank = self.rank,
                    bytes,
                    prepared = ?other.as_ref().map(DeviceBuffer::bytes),
                    "compressed device all-reduce: {what} was not prepared before the call \
                     enqueued work (a bug: please report it)"
                );
                debug_assert!(false, "{what}: {bytes} bytes not prepared ({other:?})");
                // Kept with the call's own (the stream may not use it,
                // but it goes back to the binding with them).
                self.temps.extend(other);
                DeviceBuffer::new(&self.dev, bytes)
                    .map_err(|e| self.err(&format!("allocating {what}"), e))?
            }
        };
        let p = buf.ptr();
        self.temps.push(buf);
        Ok(p)
    }

    /// A zeroed device buffer of `bytes` (at least 1), kept for the call:
    /// an accumulator, or a buffer sent with bytes nothing writes.
    fn zeroed(&mut self, bytes: usize, what: &str) -> Result<DevicePtr> {
        let p = self.alloc(bytes, what)?;
        self.zero(p, bytes, what)?;
        Ok(p)
    }

    /// Zeroes `bytes` at `p` in stream order.
    fn zero(&mut self, p: DevicePtr, bytes: usize, what: &str) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let zeros = vec![0u8; bytes];
        // SAFETY: `p` is a live device range of `bytes` (the caller's
        // buffer or a temporary of this context); `zeros` is kept in the
        // context, which lives until the stream has been synchronised.
        unsafe {
            self.dev
                .copy_h2d_async(p, zeros.as_ptr(), bytes, self.stream)
        }
        .map_err(|e| self.err(&format!("zeroing {what}"), e))?;
        self.zeros.push(zeros);
        Ok(())
    }

    /// Runs a codec operation on the stream.
    fn codec(&self, op: &CodecOp<'_>, what: &str) -> Result<()> {
        // SAFETY: every range in `op` is a live device range of the size
        // the operation needs (the caller's buffer or a temporary of this
        // context), kept until the stream is synchronised at the end.
        unsafe { self.dev.codec(self.stream, op) }.map_err(|e| self.err(what, e))
    }

    /// A workspace for one codec operation.
    fn workspace(&mut self, codec: &Codec, n: usize) -> Result<DevicePtr> {
        self.zeroed(dcodec::workspace_bytes(codec, n), "a codec workspace")
    }
}

/// A compressed all-reduce on device buffers that is enqueued on its
/// stream ([`Communicator::enqueue_all_reduce_compressed_device`]): it owns
/// the call's device temporaries and the collectives it enqueued. [`wait`]
/// (or dropping it, which logs what `wait` would return) waits for them and
/// the stream, then checks that every peer's top-k encoding decoded; the
/// result is in the buffer once it returns `Ok` (and, ordered on the
/// stream, for any work enqueued after the call).
///
/// [`wait`]: CompressedDeviceWork::wait
#[must_use = "dropping it waits for the stream; call wait() to see errors"]
pub struct CompressedDeviceWork<'a> {
    cx: Option<Ctx>,
    _borrows: PhantomData<&'a mut ()>,
}

impl std::fmt::Debug for CompressedDeviceWork<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompressedDeviceWork")
            .field("pending", &self.cx.is_some())
            .finish()
    }
}

impl CompressedDeviceWork<'_> {
    /// Waits until the stream has run the all-reduce (the communicator's
    /// timeout as the deadline) and reports its outcome.
    pub fn wait(mut self) -> Result<()> {
        match self.cx.take() {
            Some(mut cx) => cx.finish(),
            None => Ok(()),
        }
    }
}

impl Drop for CompressedDeviceWork<'_> {
    fn drop(&mut self) {
        if let Some(mut cx) = self.cx.take() {
            if let Err(e) = cx.finish() {
                tracing::warn!(error = %e, "a compressed device all-reduce dropped unwaited failed");
            }
        }
    }
}

impl Communicator {
    /// All-reduce (sum or avg) of `count` f32 at `buf` on the bound
    /// device, with `codec` on the scarce tier (as
    /// [`Communicator::all_reduce_compressed`]), ordered on `stream`.
    /// Returns when the result is in `buf`. Every rank passes the same
    /// codec, count and scope.
    ///
    /// # Safety
    /// `buf` is a live device range of `count` f32 on the communicator's
    /// device, not used by other work until this call returns.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_reduce_compressed_device_raw(
        &self,
        buf: DevicePtr,
        count: usize,
        op: ReduceOp,
        codec: &Codec,
        feedback: Option<&mut DeviceFeedback>,
        scope: CompressScope,
        stream: StreamHandle,
    ) -> Result<()> {
        // SAFETY: the caller's contract, for longer than the work (waited
        // for here).
        unsafe {
            self.enqueue_all_reduce_compressed_device_raw(
                buf, count, op, codec, feedback, scope, stream,
            )
        }?
        .wait()
    }

    /// [`Communicator::all_reduce_compressed_device_raw`] that returns once
    /// every step is enqueued on `stream`, with the handle that completes
    /// it.
    /// Errors found while enqueueing are returned after what was enqueued
    /// has run.
    ///
    /// # Safety
    /// `buf` is a live device range of `count` f32 on the communicator's
    /// device, and `feedback`'s residual is not used or dropped, until the
    /// handle's `wait` returns or it is dropped; nothing unordered with
    /// `stream` uses `buf` meanwhile.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn enqueue_all_reduce_compressed_device_raw(
        &self,
        buf: DevicePtr,
        count: usize,
        op: ReduceOp,
        codec: &Codec,
        feedback: Option<&mut DeviceFeedback>,
        scope: CompressScope,
        stream: StreamHandle,
    ) -> Result<CompressedDeviceWork<'static>> {
        let rank = self.rank();
        let invalid = |detail: String| Error::InvalidArgument {
            rank,
            op: OP,
            detail,
        };
        if !matches!(op, ReduceOp::Sum | ReduceOp::Avg) {
            return Err(invalid(format!(
                "{} is not supported with compression (sum or avg)",
                op.name()
            )));
        }
        self.check_codec_deterministic(codec, OP)?;
        let binding = self
            .device
            .get()
            .map(|a| a.binding.clone())
            .ok_or_else(|| {
                invalid(
                    "no device is bound to this communicator (call Communicator::bind_device)"
                        .into(),
                )
            })?;
        let dev = binding.dev.clone();
        let mut cx = Ctx {
            dev: dev.clone(),
            prepared: std::collections::VecDeque::new(),
            binding,
            stream,
            rank,
            timeout: self.inner.config.timeout,
            temps: Vec::new(),
            works: Vec::new(),
            statuses: Vec::new(),
            zeros: Vec::new(),
        };
        let layout = match scope {
            CompressScope::Hier => self.compress_layout()?,
            CompressScope::Flat => None,
        };
        let result = (|| -> Result<()> {
            match layout {
                Some(l) => {
                    let [node, replicas] = l.comms();
                    for c in [node, replicas] {
                        if c.bound_device().is_none() {
                            c.bind_device(dev.clone())?;
                        }
                        // Their device links before anything is enqueued.
                        c.connect_device()?;
                    }
                    let (local, nodes) = (node.size(), replicas.size());
                    let unit = local * nodes;
                    let padded = count.div_ceil(unit) * unit;
                    let shard_len = padded / local;
                    let mut sizes = vec![padded * 4, shard_len * 4];
                    sizes.extend(cross_tier_temporaries(
                        replicas,
                        shard_len,
                        codec,
                        feedback.as_deref(),
                    ));
                    cx.prepare(&sizes)?;
                    let full = cx.alloc(padded * 4, "the padded buffer")?;
                    // SAFETY: `buf` holds `count` f32 (the caller's
                    // contract), `full` at least as many.
                    unsafe { dev.copy_d2d_async(full, buf, count * 4, stream) }
                        .map_err(|e| cx.err("copying into the padded buffer", e))?;
                    cx.zero(full.add(count * 4), (padded - count) * 4, "the padding")?;
                    let shard = cx.alloc(shard_len * 4, "the node shard")?;
                    // SAFETY: `full` holds local × shard_len f32 and
                    // `shard` shard_len, both kept until the end.
                    let w = unsafe {
                        node.reduce_scatter_device_raw(
                            full,
                            shard,
                            shard_len,
                            DataType::Float32,
                            ReduceOp::Sum,
                            stream,
                        )
                    }?;
                    cx.works.push(w);
                    cross_tier(&mut cx, replicas, shard, shard_len, codec, feedback)?;
                    // SAFETY: as above.
                    let w = unsafe {
                        node.all_gather_device_raw(
                            shard,
                            full,
                            shard_len,
                            DataType::Float32,
                            stream,
                        )
                    }?;
                    cx.works.push(w);
                    // SAFETY: as above.
                    unsafe { dev.copy_d2d_async(buf, full, count * 4, stream) }
                        .map_err(|e| cx.err("copying the result out of the padded buffer", e))?;
                }
                None => {
                    // The device links before anything is enqueued.
                    self.connect_device()?;
                    cx.prepare(&cross_tier_temporaries(
                        self,
                        count,
                        codec,
                        feedback.as_deref(),
                    ))?;
                    cross_tier(&mut cx, self, buf, count, codec, feedback)?
                }
            }
            if op == ReduceOp::Avg && count > 0 {
                // SAFETY: `buf` holds `count` f32.
                unsafe { dev.divide(stream, DataType::Float32, buf, count, self.size()) }
                    .map_err(|e| cx.err("dividing for avg", e))?;
            }
            Ok(())
        })();
        if let Err(e) = result {
            // What was enqueued runs before the temporaries go; the first
            // error is the one reported.
            if let Err(later) = cx.finish() {
                tracing::debug!(error = %later, "after a failed compressed device all-reduce");
            }
            return Err(e);
        }
        Ok(CompressedDeviceWork {
            cx: Some(cx),
            _borrows: PhantomData,
        })
    }

    /// Deprecated: [`Communicator::all_reduce_compressed`] takes device
    /// views (`DeviceSliceMut`) and cudarc slices. The safe form of
    /// [`Communicator::all_reduce_compressed_device_raw`]
    /// on `count` f32 of a [`DeviceBuffer`] of the bound device (the first
    /// call binds the communicator to the buffer's device): returns when
    /// the result is in `buf`.
    #[allow(clippy::too_many_arguments)]
    #[deprecated(note = "use Communicator::all_reduce_compressed with a DeviceSliceMut view")]
    pub fn all_reduce_compressed_device(
        &self,
        buf: &mut DeviceBuffer,
        count: usize,
        op: ReduceOp,
        codec: &Codec,
        feedback: Option<&mut DeviceFeedback>,
        scope: CompressScope,
        stream: StreamHandle,
    ) -> Result<()> {
        self.enqueue_all_reduce_compressed_device(buf, count, op, codec, feedback, scope, stream)?
            .wait()
    }

    /// [`Communicator::all_reduce_compressed_device`] that returns once the
    /// steps are enqueued on `stream`, like the plain device collectives;
    /// the handle borrows the buffer and the residual until it is waited
    /// for (or dropped, which waits).
    #[allow(clippy::too_many_arguments)]
    pub fn enqueue_all_reduce_compressed_device<'a>(
        &'a self,
        buf: &'a mut DeviceBuffer,
        count: usize,
        op: ReduceOp,
        codec: &Codec,
        feedback: Option<&'a mut DeviceFeedback>,
        scope: CompressScope,
        stream: StreamHandle,
    ) -> Result<CompressedDeviceWork<'a>> {
        let rank = self.rank();
        let invalid = |detail: String| Error::InvalidArgument {
            rank,
            op: OP,
            detail,
        };
        self.bind_or_check(OP, "the buffer", buf.device())?;
        let need = count.checked_mul(4).filter(|&b| b <= buf.bytes());
        if need.is_none() {
            return Err(invalid(format!(
                "the buffer has {} bytes, expected at least {count} f32",
                buf.bytes()
            )));
        }
        // SAFETY: `buf` is a live device buffer of the bound device holding
        // at least `count` f32 (checked above); it and the residual stay
        // borrowed mutably by the returned handle, which waits for the
        // stream before it goes.
        let mut work = unsafe {
            self.enqueue_all_reduce_compressed_device_raw(
                buf.ptr(),
                count,
                op,
                codec,
                feedback,
                scope,
                stream,
            )
        }?;
        Ok(CompressedDeviceWork {
            cx: work.cx.take(),
            _borrows: PhantomData,
        })
    }
}

/// The temporaries [`cross_tier`] takes, in its order (kept in step with
/// it: a temporary it takes that is not here is allocated late, with a
/// warning, and fails a debug build's tests).
fn cross_tier_temporaries(
    comm: &Communicator,
    len: usize,
    codec: &Codec,
    feedback: Option<&DeviceFeedback>,
) -> Vec<usize> {
    let n = comm.size();
    let mut sizes = Vec::new();
    if n == 1 || len == 0 {
        return sizes;
    }
    let ws = |m: usize| dcodec::workspace_bytes(codec, m);
    if feedback.is_some_and(|f| f.len != len || f.residual.is_none()) {
        sizes.push(len * 4);
    }
    if let Codec::TopK { .. } = codec {
        let enc_len = codec.max_encoded_len(len);
        sizes.extend([enc_len, ws(len), enc_len * n]);
        sizes.extend(std::iter::repeat_n(ws(len), n));
        return sizes;
    }
    let part = len.div_ceil(n);
    let part_len = |j: usize| ((j + 1) * part).min(len) - (j * part).min(len);
    let stride = codec.max_encoded_len(part);
    let part_workspaces = (0..n).filter(|&j| part_len(j) > 0).map(|j| ws(part_len(j)));
    sizes.push(stride * n);
    sizes.extend(part_workspaces.clone());
    sizes.extend([stride * n, stride]);
    let m = part_len(comm.rank());
    let fused = matches!(codec, Codec::Fp16 | Codec::Bf16) && n <= kernels::cuda_codec::MAX_SRCS;
    if m > 0 && !fused {
        sizes.extend([m * 4, ws(m), ws(m)]);
    }
    sizes.push(stride * n);
    sizes.extend(part_workspaces);
    sizes
}

/// Sums the `len` f32 at `data` over `comm` moving only encoded bytes (the
/// device form of `compressed::cross_tier`).
fn cross_tier(
    cx: &mut Ctx,
    comm: &Communicator,
    data: DevicePtr,
    len: usize,
    codec: &Codec,
    feedback: Option<&mut DeviceFeedback>,
) -> Result<()> {
    let n = comm.size();
    if n == 1 || len == 0 {
        return Ok(());
    }
    let residual = match feedback {
        Some(f) => {
            if f.len != len || f.residual.is_none() {
                let p = cx.zeroed(len * 4, "the error-feedback residual")?;
                // Keep it in the feedback rather than in the call's
                // temporaries.
                f.residual = cx.temps.pop();
                f.len = len;
                debug_assert_eq!(f.residual.as_ref().map(DeviceBuffer::ptr), Some(p));
            }
            f.residual.as_ref().map(DeviceBuffer::ptr)
        }
        None => None,
    };
    let stream = cx.stream;
    if let Codec::TopK { .. } = codec {
        let enc_len = codec.max_encoded_len(len);
        let enc = cx.zeroed(enc_len, "the top-k encoding")?;
        let ws = cx.workspace(codec, len)?;
        cx.codec(
            &CodecOp::Encode {
                codec,
                src: data,
                n: len,
                dst: enc,
                seed: None,
                feedback: residual,
                workspace: ws,
            },
            "encoding top-k",
        )?;
        let all = cx.alloc(enc_len * n, "the gathered top-k encodings")?;
        // SAFETY: `enc` holds enc_len bytes, `all` n × enc_len; both kept
        // until the end of the call.
        let w = unsafe { comm.all_gather_device_raw(enc, all, enc_len, DataType::Uint8, stream) }?;
        cx.works.push(w);
        // Exact top-k encodings are exactly `enc_len` long; sampled ones are
        // at most that, their length is in their header (the count k),
        // which the decode kernels read on the device.
        cx.zero(data, len * 4, "the sum")?;
        for r in 0..n {
            let ws = cx.workspace(codec, len)?;
            cx.statuses.push(ws);
            let src = all.add(r * enc_len);
            let op = match codec {
                Codec::TopK { sampled: true, .. } => CodecOp::DecodeTopK {
                    codec,
                    src,
                    max_len: enc_len,
                    n: len,
                    dst: data,
                    add: true,
                    workspace: ws,
                },
                _ => CodecOp::Decode {
                    codec,
                    srcs: std::slice::from_ref(&src),
                    enc_len,
                    n: len,
                    dst: data,
                    add: true,
                    workspace: ws,
                },
            };
            cx.codec(&op, "decoding top-k")?;
        }
        return Ok(());
    }
    // Dense: part j of every rank goes to rank j.
    let part = len.div_ceil(n);
    let bounds = |j: usize| (j * part).min(len)..((j + 1) * part).min(len);
    let stride = codec.max_encoded_len(part);
    let send = cx.zeroed(stride * n, "the encoded parts")?;
    for j in 0..n {
        let b = bounds(j);
        if b.is_empty() {
            continue;
        }
        let ws = cx.workspace(codec, b.len())?;
        cx.codec(
            &CodecOp::Encode {
                codec,
                src: data.add(b.start * 4),
                n: b.len(),
                dst: send.add(j * stride),
                seed: None,
                feedback: residual.map(|r| r.add(b.start * 4)),
                workspace: ws,
            },
            "encoding a part",
        )?;
    }
    let recv = cx.alloc(stride * n, "the received parts")?;
    // SAFETY: `send` and `recv` hold n × stride bytes, kept until the end.
    let w = unsafe {
        comm.enqueue_device(crate::DeviceOp::new(
            comm_core::wire::Collective::AllToAll,
            DataType::Uint8,
            stride,
            send,
            recv,
            stream,
        ))
    }?;
    cx.works.push(w);
    let mine = bounds(comm.rank());
    let own = cx.zeroed(stride, "the reduced part's encoding")?;
    if !mine.is_empty() {
        let m = mine.len();
        let enc_len = codec.max_encoded_len(m);
        let srcs: Vec<DevicePtr> = (0..n).map(|r| recv.add(r * stride)).collect();
        let fused =
            matches!(codec, Codec::Fp16 | Codec::Bf16) && n <= kernels::cuda_codec::MAX_SRCS;
        if fused {
            // One pass: decode, sum in f32 from +0, re-encode.
            cx.codec(
                &CodecOp::DecodeSumEncode {
                    codec,
                    srcs: &srcs,
                    n: m,
                    dst: own,
                    sum: None,
                },
                "summing and re-encoding the received parts",
            )?;
        } else {
            let acc = cx.zeroed(m * 4, "the reduced part")?;
            let ws = cx.workspace(codec, m)?;
            for batch in srcs.chunks(kernels::cuda_codec::MAX_SRCS) {
                cx.codec(
                    &CodecOp::Decode {
                        codec,
                        srcs: batch,
                        enc_len,
                        n: m,
                        dst: acc,
                        add: true,
                        workspace: ws,
                    },
                    "summing the received parts",
                )?;
            }
            let ws = cx.workspace(codec, m)?;
            cx.codec(
                &CodecOp::Encode {
                    codec,
                    src: acc,
                    n: m,
                    dst: own,
                    seed: None,
                    feedback: None,
                    workspace: ws,
                },
                "re-encoding the reduced part",
            )?;
        }
    }
    let gathered = cx.alloc(stride * n, "the gathered parts")?;
    // SAFETY: `own` holds stride bytes, `gathered` n × stride.
    let w = unsafe { comm.all_gather_device_raw(own, gathered, stride, DataType::Uint8, stream) }?;
    cx.works.push(w);
    for j in 0..n {
        let b = bounds(j);
        if b.is_empty() {
            continue;
        }
        let ws = cx.workspace(codec, b.len())?;
        cx.codec(
            &CodecOp::Decode {
                codec,
                srcs: &[gathered.add(j * stride)],
                enc_len: codec.max_encoded_len(b.len()),
                n: b.len(),
                dst: data.add(b.start * 4),
                add: false,
                workspace: ws,
            },
            "decoding the gathered parts",
        )?;
    }
    Ok(())
}
