//! Codec operations on device buffers ([`CodecOp`], run by
//! [`Device::codec`](crate::Device::codec)): the `compress` crate's formats
//! encoded and decoded by the device kernels of `kernels/cuda/sncl_codec.cu`,
//! bit-identical to the CPU codecs, so host and device ranks interoperate.
//!
//! What the compressed collectives need, each one call on the operation's
//! stream (no host round trip):
//!
//! * [`CodecOp::Encode`]: encode `n` f32; with `feedback` (the residual in
//!   device memory) it is one error-feedback step exactly as
//!   `compress::ErrorFeedback::encode_with_feedback`: the source is
//!   compensated in place, encoded, and the residual becomes what decoding
//!   the encoding gives back short of it.
//! * [`CodecOp::Decode`]: decode one or several encodings and sum them into
//!   an f32 buffer (overwrite or add), as successive `decode` /
//!   `decode_add` calls (the owner's step of a compressed reduce-scatter).
//! * [`CodecOp::DecodeSumEncode`]: fp16/bf16 only: decode, sum in f32 and
//!   re-encode in one pass (the owner's reduce-and-re-encode step).
//!
//! Every codec runs on the device: fp16, bf16, int8 (nearest and
//! stochastic; the seed as `compress::Codec::encode_seeded`), top-k exact
//! and sampled (the same indices as `compress`; a sampled encoding's length
//! is data-dependent: its `u32` header says `k`, within
//! `codec.max_encoded_len(n)`).
//!
//! Workspace: encodes and top-k decodes need device scratch memory of
//! [`workspace_bytes`] (8-byte aligned; the caller keeps one per stream).
//! After a top-k decode completes, the `u32` at the workspace's start is its
//! validation status ([`decode_status`]); on bad input the output is left
//! untouched.

use compress::Codec;
use kernels::cuda_codec::{self, DeviceCodec, Launch};

use crate::{DeviceError, DevicePtr, Result};

/// One codec operation on device buffers. Pointers are device ranges that
/// must stay live until the operation completes; inputs and outputs must
/// not overlap (except as stated).
#[derive(Clone, Copy, Debug)]
pub enum CodecOp<'a> {
    /// Encodes the `n` f32 at `src` into `dst` (`codec.max_encoded_len(n)`
    /// bytes; exactly the encoding). With `feedback` (`n` f32, the residual)
    /// `src` is compensated in place first and the residual updated after.
    Encode {
        /// The codec.
        codec: &'a Codec,
        /// `n` f32 (4-byte aligned); modified in place with `feedback`.
        src: DevicePtr,
        /// Elements.
        n: usize,
        /// The encoding (2-byte aligned for fp16/bf16).
        dst: DevicePtr,
        /// int8-sr: as `Codec::encode_seeded` (`Some`) or `Codec::encode`.
        seed: Option<u64>,
        /// The error-feedback residual: `n` f32, 4-byte aligned.
        feedback: Option<DevicePtr>,
        /// [`workspace_bytes`] of scratch.
        workspace: DevicePtr,
    },
    /// `dst = dec(srcs[0]) + dec(srcs[1]) + ...` (left to right in f32), or
    /// with `add` `dst += ...`. Top-k takes exactly one source.
    Decode {
        /// The codec.
        codec: &'a Codec,
        /// The encodings, 1 to [`cuda_codec::MAX_SRCS`], `enc_len` bytes each.
        srcs: &'a [DevicePtr],
        /// Bytes of each encoding (dense codecs: exactly
        /// `codec.max_encoded_len(n)`; top-k: its actual length).
        enc_len: usize,
        /// Elements.
        n: usize,
        /// `n` f32, 4-byte aligned.
        dst: DevicePtr,
        /// Add to `dst` instead of overwriting it.
        add: bool,
        /// [`workspace_bytes`] of scratch (used by top-k only).
        workspace: DevicePtr,
    },
    /// A top-k decode ([`CodecOp::Decode`] with one source) of an encoding
    /// whose length its header gives (`4 + 8k`, at most `max_len` bytes):
    /// a peer's sampled top-k encoding received at its largest size, decoded
    /// without reading its header back to the host first. A header that
    /// claims more than `max_len` bytes (or `k > n`, or bad indices) sets
    /// the workspace's status and leaves `dst` untouched.
    DecodeTopK {
        /// A top-k codec (exact or sampled).
        codec: &'a Codec,
        /// The encoding.
        src: DevicePtr,
        /// Bytes readable at `src` (at least the 4-byte header).
        max_len: usize,
        /// Elements.
        n: usize,
        /// `n` f32, 4-byte aligned.
        dst: DevicePtr,
        /// Add to `dst` instead of overwriting it.
        add: bool,
        /// [`workspace_bytes`] of scratch; its first `u32` is the status.
        workspace: DevicePtr,
    },
    /// fp16/bf16: `dst = enc(dec(srcs[0]) + dec(srcs[1]) + ...)`, summed in
    /// f32 from +0 (as `decode_add` into zeros then `encode`); the f32 sum
    /// also to `sum` when given.
    DecodeSumEncode {
        /// [`Codec::Fp16`] or [`Codec::Bf16`].
        codec: &'a Codec,
        /// The encodings, 1 to [`cuda_codec::MAX_SRCS`], `2n` bytes each.
        srcs: &'a [DevicePtr],
        /// Elements.
        n: usize,
        /// The re-encoded sum, `2n` bytes.
        dst: DevicePtr,
        /// Optionally the f32 sum, `n` f32.
        sum: Option<DevicePtr>,
    },
}

impl CodecOp<'_> {
    /// The codec.
    pub fn codec(&self) -> &Codec {
        match self {
            CodecOp::Encode { codec, .. }
            | CodecOp::Decode { codec, .. }
            | CodecOp::DecodeTopK { codec, .. }
            | CodecOp::DecodeSumEncode { codec, .. } => codec,
        }
    }
}

/// Bytes of device workspace a [`CodecOp`] with `codec` on `n` elements
/// needs (0 for fp16/bf16).
pub fn workspace_bytes(codec: &Codec, n: usize) -> usize {
    let dc = match *codec {
        Codec::Fp16 => DeviceCodec::Fp16,
        Codec::Bf16 => DeviceCodec::Bf16,
        Codec::Int8 { block, stochastic } => DeviceCodec::Int8 {
            block: block as u64,
            stochastic,
        },
        Codec::TopK { sampled, .. } => {
            let k = codec.topk_k(n).unwrap_or(0) as u64;
            if sampled {
                DeviceCodec::TopKSampled { k }
            } else {
                DeviceCodec::TopKExact { k }
            }
        }
        Codec::Mx { element } => DeviceCodec::Mx {
            format: mx_format(element),
        },
    };
    cuda_codec::workspace_bytes(&dc, n as u64) as usize
}

/// What a top-k decode's status word means (`None` for 0, valid input).
pub fn decode_status(status: u32) -> Option<String> {
    if status == 0 {
        return None;
    }
    let mut why = Vec::new();
    for (bit, text) in [
        (1, "shorter than the 4-byte header"),
        (2, "count k larger than the element count"),
        (3, "length is not 4 + 8k (or more than the bytes given)"),
        (4, "an index out of range"),
        (8, "indices not strictly ascending"),
    ] {
        let hit = if bit < 4 {
            status & 3 == bit
        } else {
            status & bit != 0
        };
        if hit {
            why.push(text);
        }
    }
    Some(format!("corrupt top-k encoding: {}", why.join(", ")))
}

/// The device form of `codec` for `n` elements.
fn device_codec(ordinal: usize, codec: &Codec, n: usize) -> Result<DeviceCodec> {
    let invalid = |detail: String| DeviceError::InvalidArgument {
        ordinal,
        call: "codec",
        detail,
    };
    Ok(match *codec {
        Codec::Fp16 => DeviceCodec::Fp16,
        Codec::Bf16 => DeviceCodec::Bf16,
        Codec::Int8 { block, stochastic } => {
            if block == 0 || block > compress::MAX_INT8_BLOCK {
                return Err(invalid(format!(
                    "int8 block size {block}; expected 1 to {}",
                    compress::MAX_INT8_BLOCK
                )));
            }
            DeviceCodec::Int8 {
                block: block as u64,
                stochastic,
            }
        }
        Codec::TopK { ratio, sampled } => {
            if !(ratio > 0.0 && ratio <= 1.0) {
                return Err(invalid(format!("top-k ratio {ratio}; expected (0, 1]")));
            }
            if u32::try_from(n).is_err() {
                return Err(invalid(format!(
                    "top-k of {n} elements; indices are u32 (at most 2^32 - 1 elements)"
                )));
            }
            let k = codec.topk_k(n).unwrap_or(0) as u64;
            if sampled {
                DeviceCodec::TopKSampled { k }
            } else {
                DeviceCodec::TopKExact { k }
            }
        }
        Codec::Mx { element } => DeviceCodec::Mx {
            format: mx_format(element),
        },
    })
}

/// The device kernels' number for an MX element format.
fn mx_format(element: compress::MxElement) -> u64 {
    match element {
        compress::MxElement::E4M3 => cuda_codec::MX_E4M3,
        compress::MxElement::E5M2 => cuda_codec::MX_E5M2,
        compress::MxElement::E2M1 => cuda_codec::MX_E2M1,
    }
}

/// Checks `op` and builds its launches. `map(ptr, bytes, align, what)`
/// checks a device range (live, `align`-aligned) and gives the address the
/// kernels see.
pub(crate) fn plan(
    ordinal: usize,
    op: &CodecOp<'_>,
    mut map: impl FnMut(DevicePtr, usize, usize, &str) -> Result<u64>,
) -> Result<Vec<Launch>> {
    let invalid = |detail: String| DeviceError::InvalidArgument {
        ordinal,
        call: "codec",
        detail,
    };
    let f32s = |n: usize| {
        n.checked_mul(4)
            .ok_or_else(|| invalid(format!("{n} f32 elements overflow")))
    };
    let nsrcs = |srcs: &[DevicePtr], most: usize| {
        if !(1..=most).contains(&srcs.len()) {
            return Err(invalid(format!(
                "{} encoded inputs; expected 1 to {most}",
                srcs.len()
            )));
        }
        Ok(())
    };
    // Alignment the encoded bytes need.
    let enc_align = |dc: &DeviceCodec| match dc {
        DeviceCodec::Fp16 | DeviceCodec::Bf16 => 2,
        _ => 1,
    };
    match *op {
        CodecOp::Encode {
            codec,
            src,
            n,
            dst,
            seed,
            feedback,
            workspace,
        } => {
            let dc = device_codec(ordinal, codec, n)?;
            let bytes = f32s(n)?;
            let enc = dc.encoded_len(n as u64) as usize;
            let src = map(src, bytes, 4, "the source")?;
            let dst = map(dst, enc, enc_align(&dc), "the encoding")?;
            let work_len = cuda_codec::workspace_bytes(&dc, n as u64) as usize;
            let work = map(workspace, work_len, 8, "the workspace")?;
            let seed = match dc {
                DeviceCodec::Int8 {
                    stochastic: true, ..
                } => cuda_codec::kernel_seed(seed),
                _ => 0,
            };
            Ok(match feedback {
                None => cuda_codec::encode_plan(&dc, src, dst, n as u64, seed, work),
                Some(r) => {
                    let r = map(r, bytes, 4, "the residual")?;
                    cuda_codec::feedback_encode_plan(&dc, src, r, dst, n as u64, seed, work)
                }
            })
        }
        CodecOp::Decode {
            codec,
            srcs,
            enc_len,
            n,
            dst,
            add,
            workspace,
        } => {
            let mut dc = device_codec(ordinal, codec, n)?;
            if let DeviceCodec::TopKExact { k } | DeviceCodec::TopKSampled { k } = &mut dc {
                nsrcs(srcs, 1)?;
                // Sized from the length given; the kernels validate it.
                *k = (enc_len.saturating_sub(4) / 8) as u64;
            } else {
                nsrcs(srcs, cuda_codec::MAX_SRCS)?;
                let expected = dc.encoded_len(n as u64) as usize;
                if enc_len != expected {
                    return Err(invalid(format!(
                        "encoded length {enc_len} bytes; {} of {n} elements is {expected}",
                        codec.name()
                    )));
                }
            }
            let mut s = Vec::with_capacity(srcs.len());
            for (i, &p) in srcs.iter().enumerate() {
                s.push(map(
                    p,
                    enc_len,
                    enc_align(&dc),
                    &format!("encoded input {i}"),
                )?);
            }
            let dst = map(dst, f32s(n)?, 4, "the output")?;
            let work_len = match dc {
                DeviceCodec::TopKExact { .. } | DeviceCodec::TopKSampled { .. } => 8,
                _ => 0,
            };
            let work = map(workspace, work_len, 8, "the workspace")?;
            Ok(cuda_codec::decode_plan(
                &dc,
                &s,
                enc_len as u64,
                n as u64,
                dst,
                add,
                work,
            ))
        }
        CodecOp::DecodeTopK {
            codec,
            src,
            max_len,
            n,
            dst,
            add,
            workspace,
        } => {
            let mut dc = device_codec(ordinal, codec, n)?;
            let (DeviceCodec::TopKExact { k } | DeviceCodec::TopKSampled { k }) = &mut dc else {
                return Err(invalid(format!(
                    "a decode sized by its header is for top-k, not {}",
                    codec.name()
                )));
            };
            // The most the length allows; the kernels read the header's.
            *k = (max_len.saturating_sub(4) / 8) as u64;
            let src = map(src, max_len, 1, "the encoded input")?;
            let dst = map(dst, f32s(n)?, 4, "the output")?;
            let work = map(workspace, 8, 8, "the workspace")?;
            let mut plan =
                cuda_codec::decode_plan(&dc, &[src], max_len as u64, n as u64, dst, add, work);
            for l in &mut plan {
                l.args.flags |= cuda_codec::FLAG_LEN_MAX;
            }
            Ok(plan)
        }
        CodecOp::DecodeSumEncode {
            codec,
            srcs,
            n,
            dst,
            sum,
        } => {
            let dc = device_codec(ordinal, codec, n)?;
            if !matches!(dc, DeviceCodec::Fp16 | DeviceCodec::Bf16) {
                return Err(invalid(format!(
                    "fused decode-sum-encode is for fp16 and bf16, not {}",
                    codec.name()
                )));
            }
            nsrcs(srcs, cuda_codec::MAX_SRCS)?;
            let enc = dc.encoded_len(n as u64) as usize;
            let mut s = Vec::with_capacity(srcs.len());
            for (i, &p) in srcs.iter().enumerate() {
                s.push(map(p, enc, 2, &format!("encoded input {i}"))?);
            }
            let dst = map(dst, enc, 2, "the encoding")?;
            let sum = match sum {
                Some(p) => map(p, f32s(n)?, 4, "the sum")?,
                None => 0,
            };
            Ok(cuda_codec::decsum_encode_plan(&dc, &s, n as u64, dst, sum).unwrap_or_default())
        }
    }
}

/// Checks a range's alignment (a shared helper of the backends' `map`).
pub(crate) fn check_align(ordinal: usize, ptr: DevicePtr, align: usize, what: &str) -> Result<()> {
    if !ptr.0.is_multiple_of(align as u64) {
        return Err(DeviceError::InvalidArgument {
            ordinal,
            call: "codec",
            detail: format!("{what} at {ptr:#x?} is not {align}-byte aligned"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_texts() {
        assert_eq!(decode_status(0), None);
        assert!(decode_status(2).unwrap().contains("larger"));
        assert!(decode_status(12).unwrap().contains("ascending"));
        assert!(decode_status(12).unwrap().contains("range"));
    }

    /// A sampled top-k encoding given at its largest size decodes by its
    /// header (as compress decodes the exact bytes); a header claiming more
    /// than the bytes given is refused, the output untouched.
    #[cfg(feature = "emu")]
    #[test]
    fn topk_decodes_sized_by_the_header() {
        use crate::emu::codecs::{run_plan, PlanShape};
        let n = 50_000;
        let x: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1013) as f32 - 506.0).collect();
        let codec = Codec::parse("topk:0.01").unwrap();
        let mut enc = Vec::new();
        codec.encode(&x, &mut enc);
        let max_len = codec.max_encoded_len(n);
        assert!(enc.len() < max_len, "the sampled encoding is shorter");
        let mut want = vec![0f32; n];
        codec.decode(&enc, n, &mut want).unwrap();
        let mut given = vec![0xa5u8; max_len];
        given[..enc.len()].copy_from_slice(&enc);
        let mut work = [0u64; 1];
        let run = |given: &[u8], out: &mut [f32], work: &mut [u64; 1]| {
            let op = CodecOp::DecodeTopK {
                codec: &codec,
                src: DevicePtr(given.as_ptr() as u64),
                max_len,
                n,
                dst: DevicePtr(out.as_mut_ptr() as u64),
                add: false,
                workspace: DevicePtr(work.as_mut_ptr() as u64),
            };
            let launches = plan(0, &op, |p, _, align, what| {
                check_align(0, p, align, what)?;
                Ok(p.0)
            })
            .unwrap();
            // SAFETY: host memory of the sizes the plan uses: `given`
            // max_len bytes, `out` n f32, `work` 8 bytes.
            unsafe { run_plan(&launches, PlanShape::EMU) }.unwrap();
            work[0] as u32
        };
        let mut got = vec![1f32; n];
        assert_eq!(run(&given, &mut got, &mut work), 0);
        assert_eq!(got, want);
        let k = (max_len - 4) / 8 + 1;
        given[..4].copy_from_slice(&(k as u32).to_le_bytes());
        let mut kept = vec![1f32; n];
        assert_eq!(run(&given, &mut kept, &mut work), 3);
        assert!(kept.iter().all(|&v| v == 1.0));
        let e = plan(
            0,
            &CodecOp::DecodeTopK {
                codec: &Codec::Fp16,
                src: DevicePtr(0),
                max_len: 8,
                n: 2,
                dst: DevicePtr(0),
                add: false,
                workspace: DevicePtr(0),
            },
            |p, _, _, _| Ok(p.0),
        )
        .unwrap_err();
        assert!(e.to_string().contains("for top-k"), "{e}");
    }

    #[test]
    fn codecs_map_to_the_device_forms() {
        let c = |s| device_codec(0, &Codec::parse(s).unwrap(), 1000).unwrap();
        assert_eq!(c("topk:0.1"), DeviceCodec::TopKSampled { k: 100 });
        assert_eq!(c("topk-exact:0.1"), DeviceCodec::TopKExact { k: 100 });
        assert_eq!(
            c("int8-sr:7"),
            DeviceCodec::Int8 {
                block: 7,
                stochastic: true
            }
        );
        let bad = Codec::Int8 {
            block: 0,
            stochastic: false,
        };
        assert!(device_codec(0, &bad, 10).is_err());
        // MX: the device encoding is compress's, to the byte.
        for (spec, format) in [
            ("mxfp8", cuda_codec::MX_E4M3),
            ("mxfp8-e5m2", cuda_codec::MX_E5M2),
            ("mxfp4", cuda_codec::MX_E2M1),
        ] {
            assert_eq!(c(spec), DeviceCodec::Mx { format });
            let codec = Codec::parse(spec).unwrap();
            for n in [0usize, 1, 31, 32, 33, 1000] {
                let dc = device_codec(0, &codec, n).unwrap();
                assert_eq!(
                    dc.encoded_len(n as u64) as usize,
                    codec.max_encoded_len(n),
                    "{spec} {n}"
                );
            }
        }
    }
}
