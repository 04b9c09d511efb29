//! Compressed all-reduce on device buffers: the algorithm of
//! [`crate::compressed`] with the codecs run by the device's codec kernels
//! ([`Device::codec`]) and the encoded bytes moved by the device
//! collectives, so only encoded bytes cross the staging path and the data
//! never visits the host.
//!
//! Every step is enqueued on the caller's stream in order — encode, an
//! all-to-all of encoded parts, the owner's decode-and-sum and re-encode, an
//! all-gather of the reduced encodings, decode (top-k: encode, all-gather,
//! decode-and-add) — and the call returns once the stream has run them
//! (with the communicator's timeout as the deadline), like the host form.
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
//! their largest size and their headers read back (one host round trip)
//! before they are decoded.

use std::sync::Arc;
use std::time::Instant;

use comm_core::{DataType, Error, ReduceOp, Result};
use compress::Codec;

use crate::device::{device_error, Device, DeviceBuffer, DeviceError, DevicePtr, StreamHandle};
use crate::work::RawWork;
use crate::{Communicator, CompressScope};
use ::device::codec::{self as dcodec, CodecOp};

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
/// and the deadline; allocations made for the call live until it returns
/// (after the stream has run everything that uses them).
struct Ctx<'a> {
    dev: &'a Arc<dyn Device>,
    stream: StreamHandle,
    rank: usize,
    deadline: Instant,
    temps: Vec<DeviceBuffer>,
    works: Vec<RawWork>,
    /// Top-k decode workspaces, whose first u32 is the decode's status.
    statuses: Vec<DevicePtr>,
    /// Host zeros being copied to the device (kept until the stream has
    /// run the copies).
    zeros: Vec<Vec<u8>>,
}

impl Ctx<'_> {
    fn err(&self, what: &str, e: DeviceError) -> Error {
        device_error(self.rank, self.dev, (OP, None), what, e)
    }

    /// A device buffer of `bytes` (at least 1), kept for the call; for
    /// buffers every byte of which is written before it is read or sent.
    fn alloc(&mut self, bytes: usize, what: &str) -> Result<DevicePtr> {
        let buf = DeviceBuffer::new(self.dev, bytes.max(1))
            .map_err(|e| self.err(&format!("allocating {what}"), e))?;
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

    /// The byte lengths (4 + 8k) of the `n` top-k encodings gathered at
    /// `all`, `stride` bytes apart, from their headers; waits for the
    /// stream (the gather) first.
    fn topk_lengths(&mut self, all: DevicePtr, stride: usize, n: usize) -> Result<Vec<usize>> {
        let mut heads = vec![[0u8; 4]; n];
        for (r, h) in heads.iter_mut().enumerate() {
            // SAFETY: `all` holds n × stride bytes (stride ≥ 4); `h` lives
            // until the synchronisation below.
            unsafe {
                self.dev
                    .copy_d2h_async(h.as_mut_ptr(), all.add(r * stride), 4, self.stream)
            }
            .map_err(|e| self.err("reading the top-k headers", e))?;
        }
        self.dev
            .synchronize(self.stream, self.deadline)
            .map_err(|e| self.err("reading the top-k headers", e))?;
        heads
            .iter()
            .enumerate()
            .map(|(r, h)| {
                let len = 4 + 8 * u32::from_le_bytes(*h) as usize;
                if len > stride {
                    return Err(Error::InvalidArgument {
                        rank: self.rank,
                        op: OP,
                        detail: format!(
                            "rank {r}'s top-k encoding claims {len} bytes, at most {stride} fit"
                        ),
                    });
                }
                Ok(len)
            })
            .collect()
    }

    /// A workspace for one codec operation.
    fn workspace(&mut self, codec: &Codec, n: usize) -> Result<DevicePtr> {
        self.zeroed(dcodec::workspace_bytes(codec, n), "a codec workspace")
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
        let dev = self.bound_device().ok_or_else(|| {
            invalid(
                "no device is bound to this communicator (call Communicator::bind_device)".into(),
            )
        })?;
        let mut cx = Ctx {
            dev: &dev,
            stream,
            rank,
            deadline: Instant::now() + self.inner.config.timeout,
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
                    }
                    let (local, nodes) = (node.size(), replicas.size());
                    let unit = local * nodes;
                    let padded = count.div_ceil(unit) * unit;
                    let full = cx.alloc(padded * 4, "the padded buffer")?;
                    // SAFETY: `buf` holds `count` f32 (the caller's
                    // contract), `full` at least as many.
                    unsafe { dev.copy_d2d_async(full, buf, count * 4, stream) }
                        .map_err(|e| cx.err("copying into the padded buffer", e))?;
                    cx.zero(full.add(count * 4), (padded - count) * 4, "the padding")?;
                    let shard_len = padded / local;
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
                None => cross_tier(&mut cx, self, buf, count, codec, feedback)?,
            }
            if op == ReduceOp::Avg && count > 0 {
                // SAFETY: `buf` holds `count` f32.
                unsafe { dev.divide(stream, DataType::Float32, buf, count, self.size()) }
                    .map_err(|e| cx.err("dividing for avg", e))?;
            }
            Ok(())
        })();
        // Every enqueued collective ends (or fails) before the stream is
        // waited for and the temporaries are freed.
        let mut first = result.err();
        for w in cx.works.drain(..) {
            if let Err(e) = w.wait() {
                first.get_or_insert(e);
            }
        }
        if let Err(e) = dev.synchronize(stream, cx.deadline) {
            first.get_or_insert(cx.err("waiting for the stream", e));
        }
        if let Some(e) = first {
            return Err(e);
        }
        for &ws in &cx.statuses {
            let mut status = 0u32;
            // SAFETY: `ws` is a live workspace of at least 4 bytes;
            // `status` is a live u32 and the copy is synchronised below.
            unsafe { dev.copy_d2h_async((&mut status as *mut u32).cast(), ws, 4, stream) }
                .map_err(|e| cx.err("reading a top-k decode status", e))?;
            dev.synchronize(stream, cx.deadline)
                .map_err(|e| cx.err("reading a top-k decode status", e))?;
            if let Some(why) = dcodec::decode_status(status) {
                return Err(Error::InvalidArgument {
                    rank,
                    op: OP,
                    detail: format!("a peer's encoded data does not decode: {why}"),
                });
            }
        }
        Ok(())
    }

    /// The safe form of [`Communicator::all_reduce_compressed_device_raw`]
    /// on `count` f32 of a [`DeviceBuffer`] of the bound device (the first
    /// call binds the communicator to the buffer's device).
    #[allow(clippy::too_many_arguments)]
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
        // at least `count` f32 (checked above), borrowed mutably for the
        // call, which returns only after the stream has used it.
        unsafe {
            self.all_reduce_compressed_device_raw(
                buf.ptr(),
                count,
                op,
                codec,
                feedback,
                scope,
                stream,
            )
        }
    }
}

/// Sums the `len` f32 at `data` over `comm` moving only encoded bytes (the
/// device form of `compressed::cross_tier`).
fn cross_tier(
    cx: &mut Ctx<'_>,
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
        // at most that, their length is in their header (the count k):
        // read the gathered headers (the one host round trip).
        let lens: Vec<usize> = match codec {
            Codec::TopK { sampled: true, .. } => cx.topk_lengths(all, enc_len, n)?,
            _ => vec![enc_len; n],
        };
        cx.zero(data, len * 4, "the sum")?;
        for (r, &actual) in lens.iter().enumerate() {
            let ws = cx.workspace(codec, len)?;
            cx.statuses.push(ws);
            cx.codec(
                &CodecOp::Decode {
                    codec,
                    srcs: &[all.add(r * enc_len)],
                    enc_len: actual,
                    n: len,
                    dst: data,
                    add: true,
                    workspace: ws,
                },
                "decoding top-k",
            )?;
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
