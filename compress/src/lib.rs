//! Gradient compression codecs for sncl.
//!
//! A [`Codec`] turns a slice of `f32` into bytes and back:
//!
//! | codec | spec | encoded bytes for `n` values | error |
//! | --- | --- | --- | --- |
//! | [`Codec::Fp16`] | `fp16` | `2n` | half an f16 ulp (relative 2⁻¹¹) |
//! | [`Codec::Bf16`] | `bf16` | `2n` | half a bf16 ulp (relative 2⁻⁸) |
//! | [`Codec::Int8`] | `int8`, `int8:512`, `int8-sr` | `n + 4⌈n/block⌉` | `absmax/254` per block |
//! | [`Codec::TopK`] | `topk:0.01`, `topk-exact:0.01` | `4 + 8k` (sampled: ≤ `4 + 16k`) | the dropped values |
//! | [`Codec::Mx`] | `mxfp8`, `mxfp8-e5m2`, `mxfp4` | `n + ⌈n/32⌉`; mxfp4 `⌈n/32⌉ + ~n/2` | half a step of the block's top binade, or the clamp at the largest element |
//!
//! Every format is little endian and self-describing enough that decoding
//! needs only the element count `n`:
//!
//! * **fp16 / bf16**: `n` × `u16`, rounded to nearest even. bf16 rounding is
//!   bit-for-bit `half::bf16::from_f32` (NaN stays NaN with the quiet bit
//!   set); fp16 rounding is IEEE (F16C `vcvtps2ph`, or `half::f16::from_f32`).
//! * **int8**: for each block of `block` elements (the last one may be
//!   shorter): an `f32` scale `absmax / 127`, then one `i8` per element,
//!   `round(x · 127 / absmax)` (nearest even; stochastic rounding for
//!   `int8-sr`). A block of zeros has scale 0 and decodes to exact zeros. A
//!   block holding a NaN or an infinity has a NaN scale and all-zero bytes, so
//!   the whole block decodes to NaN: overflow is never silently hidden.
//! * **mxfp8 / mxfp4** (OCP Microscaling Formats v1.0): blocks of 32, one
//!   E8M0 scale byte then the elements (E4M3 or E5M2 bytes; E2M1 nibbles,
//!   low nibble first); see [`MxElement`] and the `mx` module for the scale
//!   rule and the NaN/Inf and zero blocks.
//! * **top-k**: `u32 k`, then `k` × `u32` indices (strictly ascending), then
//!   `k` × `f32` values (exact). See [`Codec::TopK`] for how `k` and the
//!   selection are defined.
//!
//! Decoding validates everything it reads (length, `k`, index order and
//! range), returns [`CompressError`] for malformed input, never panics on it,
//! and leaves the output untouched on error.
//!
//! [`ErrorFeedback`] keeps the per-tensor residual (what compression dropped)
//! and adds it to the next step's gradient, so nothing is lost over time.
//!
//! On x86_64 with AVX2 (and F16C for fp16) vector kernels are selected at run
//! time; they give bit-identical results to the portable code. All `unsafe`
//! code lives in the private `simd` module.

#![warn(missing_docs)]

mod dense;
mod feedback;
mod int8;
mod int8_math;
mod mx;
#[cfg(target_arch = "x86_64")]
mod simd;
mod topk;

pub use feedback::ErrorFeedback;
pub use mx::{MxElement, MX_BLOCK};

use std::fmt;
use std::str::FromStr;

/// Default int8 block size (elements per scale).
pub const DEFAULT_INT8_BLOCK: usize = 256;
/// Largest accepted int8 block size.
pub const MAX_INT8_BLOCK: usize = 1 << 24;
/// Default top-k keep ratio for the spec `topk` without a ratio.
pub const DEFAULT_TOPK_RATIO: f64 = 0.01;

/// Errors of [`Codec::parse`] and of decoding.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompressError {
    /// The codec spec string is not understood.
    #[error("bad codec spec {spec:?}: {reason}")]
    BadSpec {
        /// The spec as given.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The encoded buffer's length does not match what `n` elements need.
    #[error("encoded length {got} bytes does not match {expected} for {n} elements")]
    BadLength {
        /// Bytes expected.
        expected: usize,
        /// Bytes given.
        got: usize,
        /// Element count.
        n: usize,
    },
    /// The output slice's length is not `n`.
    #[error("output holds {got} elements, expected {n}")]
    OutputLength {
        /// Elements in the output slice.
        got: usize,
        /// Element count given to decode.
        n: usize,
    },
    /// The encoded data is malformed (top-k count or indices).
    #[error("corrupt encoding: {0}")]
    Corrupt(String),
}

/// A gradient compression codec. Build one with [`Codec::parse`] or directly.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Codec {
    /// IEEE half precision, round to nearest even. Values above 65504 (after
    /// rounding) become infinity.
    Fp16,
    /// bfloat16 (the top 16 bits of an f32), round to nearest even.
    Bf16,
    /// Blockwise int8 with one f32 absmax scale per `block` elements.
    Int8 {
        /// Elements per scale, `1..=MAX_INT8_BLOCK` (default 256).
        block: usize,
        /// Stochastic rounding: `floor(y + u)` with `u` uniform in `[0, 1)`
        /// from a counter-based hash of the element index and a per-block
        /// seed; otherwise round to nearest even. The block seed hashes the
        /// block's bits (and the seed of [`Codec::encode_seeded`], 0 for
        /// [`Codec::encode`]): encoding stays deterministic (the same tensor
        /// always gives the same bytes) while a block whose data changed, as
        /// gradients do every step, gets unrelated random numbers. Passing
        /// a different seed each step (e.g. the step number) makes the
        /// rounding unbiased over steps even for a repeated input.
        stochastic: bool,
    },
    /// Keep the `k = ceil(ratio · n)` largest magnitudes (at least 1 when
    /// `n > 0`, at most `n`), send indices and exact values.
    ///
    /// NaN counts as larger than any number (it is always kept first).
    ///
    /// * exact (`sampled: false`): exactly `k` elements, the `k` largest
    ///   magnitudes; ties at the k-th magnitude go to the lowest indices.
    ///   (`select_nth_unstable` over the magnitudes of the candidates that
    ///   pass a sampled threshold set for about 1.5 k, or of the whole
    ///   tensor when fewer than k pass; the result is the same.)
    /// * sampled (`sampled: true`, as in DGC): the k-th largest magnitude is
    ///   estimated from a deterministic stratified sample (runs of 16
    ///   consecutive elements at random positions in equal strata; 1 % of the
    ///   elements, at least 4096 and at least `256 / ratio`; when that is more
    ///   than a quarter of the tensor, exact selection is used), then every
    ///   element with `|x| >=` that threshold is kept. If that would keep
    ///   more than `2k`, the candidates are cut to exactly the `k` largest;
    ///   if it keeps fewer than `ceil(k/2)`, the threshold is lowered once
    ///   from the sample and the tensor scanned again, and if that still
    ///   keeps too few, exact selection is used. So the count is always in
    ///   `ceil(k/2) ..= 2k`, and normally within a few percent of `k`.
    TopK {
        /// Fraction of elements to keep, in `(0, 1]`.
        ratio: f64,
        /// Sampled threshold (default) or exact selection.
        sampled: bool,
    },
    /// OCP Microscaling (MX v1.0): blocks of [`MX_BLOCK`] elements sharing
    /// an E8M0 power-of-two scale, elements E4M3 or E5M2 (MXFP8, 8.25 bits
    /// per element) or E2M1 (MXFP4, 4.25 bits), rounded to nearest even
    /// and clamped to the element format's largest normal.
    Mx {
        /// The element format.
        element: MxElement,
    },
}

fn bad_spec(spec: &str, reason: impl Into<String>) -> CompressError {
    CompressError::BadSpec {
        spec: spec.to_string(),
        reason: reason.into(),
    }
}

impl Codec {
    /// Parses a codec spec: `fp16`, `bf16`, `int8`, `int8:<block>`,
    /// `int8-sr`, `int8-sr:<block>`, `mxfp8` (E4M3 elements), `mxfp8-e5m2`,
    /// `mxfp4`, `topk`, `topk:<ratio>`,
    /// `topk-exact:<ratio>` (also `topk-sampled:<ratio>`). Top-k is sampled
    /// unless `-exact`; `topk` alone keeps 1 %. ASCII case and surrounding
    /// whitespace are ignored. [`Codec::name`] gives back a parseable spec.
    pub fn parse(s: &str) -> Result<Codec, CompressError> {
        let spec = s.trim().to_ascii_lowercase();
        let (head, arg) = match spec.split_once(':') {
            Some((h, a)) => (h, Some(a)),
            None => (spec.as_str(), None),
        };
        let no_arg = |c: Codec| match arg {
            None => Ok(c),
            Some(_) => Err(bad_spec(s, "this codec takes no parameter")),
        };
        match head {
            "fp16" | "f16" | "half" => no_arg(Codec::Fp16),
            "bf16" | "bfloat16" => no_arg(Codec::Bf16),
            "int8" | "int8-sr" => {
                let block = match arg {
                    None => DEFAULT_INT8_BLOCK,
                    Some(a) => a
                        .parse::<usize>()
                        .map_err(|_| bad_spec(s, "int8 block size must be an integer"))?,
                };
                if block == 0 || block > MAX_INT8_BLOCK {
                    return Err(bad_spec(
                        s,
                        format!("int8 block size must be in 1..={MAX_INT8_BLOCK}"),
                    ));
                }
                Ok(Codec::Int8 {
                    block,
                    stochastic: head == "int8-sr",
                })
            }
            "mxfp8" | "mxfp8-e4m3" => no_arg(Codec::Mx {
                element: MxElement::E4M3,
            }),
            "mxfp8-e5m2" => no_arg(Codec::Mx {
                element: MxElement::E5M2,
            }),
            "mxfp4" => no_arg(Codec::Mx {
                element: MxElement::E2M1,
            }),
            "topk" | "topk-sampled" | "topk-exact" => {
                let ratio = match arg {
                    None => DEFAULT_TOPK_RATIO,
                    Some(a) => a
                        .parse::<f64>()
                        .map_err(|_| bad_spec(s, "top-k ratio must be a number"))?,
                };
                if !(ratio > 0.0 && ratio <= 1.0) {
                    return Err(bad_spec(s, "top-k ratio must be in (0, 1]"));
                }
                Ok(Codec::TopK {
                    ratio,
                    sampled: head != "topk-exact",
                })
            }
            _ => Err(bad_spec(
                s,
                "unknown codec (expected fp16, bf16, int8[-sr][:block], mxfp8[-e5m2], mxfp4, \
                 topk[-exact][:ratio])",
            )),
        }
    }

    /// The canonical spec string; [`Codec::parse`] accepts it and gives back
    /// an equal codec.
    pub fn name(&self) -> String {
        match *self {
            Codec::Fp16 => "fp16".into(),
            Codec::Bf16 => "bf16".into(),
            Codec::Int8 { block, stochastic } => {
                let head = if stochastic { "int8-sr" } else { "int8" };
                if block == DEFAULT_INT8_BLOCK {
                    head.into()
                } else {
                    format!("{head}:{block}")
                }
            }
            Codec::TopK { ratio, sampled } => {
                let head = if sampled { "topk" } else { "topk-exact" };
                format!("{head}:{ratio}")
            }
            Codec::Mx { element } => match element {
                MxElement::E4M3 => "mxfp8".into(),
                MxElement::E5M2 => "mxfp8-e5m2".into(),
                MxElement::E2M1 => "mxfp4".into(),
            },
        }
    }

    /// For top-k, the target count `k` for `n` elements:
    /// `ceil(ratio · n)` clamped to `1..=n` (0 when `n == 0`). `None` for the
    /// dense codecs.
    pub fn topk_k(&self, n: usize) -> Option<usize> {
        match *self {
            Codec::TopK { ratio, .. } => Some(topk::target_k(ratio, n)),
            _ => None,
        }
    }

    /// Upper bound of the encoded size in bytes for `n` values (exact for the
    /// dense codecs and exact top-k).
    pub fn max_encoded_len(&self, n: usize) -> usize {
        match *self {
            Codec::Fp16 | Codec::Bf16 => 2 * n,
            Codec::Int8 { block, .. } => int8::encoded_len(n, block),
            Codec::Mx { element } => mx::encoded_len(element, n),
            Codec::TopK { ratio, sampled } => {
                let k = topk::target_k(ratio, n);
                let max = if sampled { (2 * k).min(n) } else { k };
                4 + 8 * max
            }
        }
    }

    /// Encodes `src`; `out` is cleared first and then holds exactly the
    /// encoding (its capacity is reused, so pass the same `Vec` every step).
    /// Encoding is deterministic: the same input gives the same bytes.
    ///
    /// # Panics
    /// For top-k when `src.len() > u32::MAX` (indices are `u32`), and for an
    /// invalid codec built by hand (int8 block 0, top-k ratio outside
    /// `(0, 1]`).
    pub fn encode(&self, src: &[f32], out: &mut Vec<u8>) {
        self.encode_impl(src, None, out)
    }

    /// [`Codec::encode`], with stochastic rounding (`int8-sr`) mixing `seed`
    /// into its random numbers (see [`Codec::Int8`]); the same as
    /// [`Codec::encode`] for every other codec. Every rank that must agree on the bytes has to
    /// pass the same seed.
    ///
    /// # Panics
    /// As [`Codec::encode`].
    pub fn encode_seeded(&self, src: &[f32], seed: u64, out: &mut Vec<u8>) {
        self.encode_impl(src, Some(seed), out)
    }

    fn encode_impl(&self, src: &[f32], seed: Option<u64>, out: &mut Vec<u8>) {
        out.clear();
        match *self {
            Codec::Fp16 => dense::encode_fp16(src, out),
            Codec::Bf16 => dense::encode_bf16(src, out),
            Codec::Int8 { block, stochastic } => {
                assert!(block > 0, "int8 block size must be positive");
                int8::encode(src, block, stochastic, seed, out)
            }
            Codec::TopK { ratio, sampled } => {
                assert!(ratio > 0.0 && ratio <= 1.0, "top-k ratio must be in (0, 1]");
                topk::encode(src, ratio, sampled, out)
            }
            Codec::Mx { element } => mx::encode(element, src, out),
        }
    }

    /// Decodes `enc` (the encoding of `n` values) into `out`, overwriting it
    /// (top-k writes zeros where nothing was sent). On error `out` is left
    /// untouched.
    pub fn decode(&self, enc: &[u8], n: usize, out: &mut [f32]) -> Result<(), CompressError> {
        self.decode_impl(enc, n, out, false)
    }

    /// Decodes `enc` and adds it to `acc` (`acc[i] += decoded[i]`; top-k
    /// scatter-adds its values). On error `acc` is left untouched.
    pub fn decode_add(&self, enc: &[u8], n: usize, acc: &mut [f32]) -> Result<(), CompressError> {
        self.decode_impl(enc, n, acc, true)
    }

    fn decode_impl(
        &self,
        enc: &[u8],
        n: usize,
        out: &mut [f32],
        add: bool,
    ) -> Result<(), CompressError> {
        if out.len() != n {
            return Err(CompressError::OutputLength { got: out.len(), n });
        }
        match *self {
            Codec::Fp16 | Codec::Bf16 => {
                check_len(enc, 2 * n, n)?;
                dense::decode(*self == Codec::Bf16, enc, out, add);
                Ok(())
            }
            Codec::Int8 { block, .. } => {
                if block == 0 {
                    return Err(CompressError::Corrupt("int8 block size 0".into()));
                }
                check_len(enc, int8::encoded_len(n, block), n)?;
                int8::decode(enc, block, out, add);
                Ok(())
            }
            Codec::TopK { .. } => topk::decode(enc, out, add),
            Codec::Mx { element } => mx::decode(element, enc, out, add),
        }
    }

    /// The largest error `|decode(encode(x))[i] - x[i]|` this codec can make
    /// on `src` (an upper bound, computed from the data):
    ///
    /// * fp16 / bf16: half an ulp of the target format at the largest
    ///   magnitude (exact rounding bound; 0 for an all-zero slice; infinite
    ///   if a value overflows to infinity or is not finite).
    /// * int8: the largest per-block `scale / 2` (`scale` for stochastic
    ///   rounding), with a relative slack of 2⁻¹² for f32 arithmetic plus
    ///   2⁻¹⁴⁰ for subnormal scales; infinite if a block is not finite.
    /// * top-k: the largest dropped magnitude (the selection is the one
    ///   `encode` makes), 0 if nothing is dropped.
    pub fn error_bound(&self, src: &[f32]) -> f32 {
        match *self {
            Codec::Fp16 => dense::error_bound(false, src),
            Codec::Bf16 => dense::error_bound(true, src),
            Codec::Int8 { block, stochastic } => int8::error_bound(src, block.max(1), stochastic),
            Codec::TopK { ratio, sampled } => topk::error_bound(src, ratio, sampled),
            Codec::Mx { element } => mx::error_bound(element, src),
        }
    }
}

fn check_len(enc: &[u8], expected: usize, n: usize) -> Result<(), CompressError> {
    if enc.len() == expected {
        Ok(())
    } else {
        Err(CompressError::BadLength {
            expected,
            got: enc.len(),
            n,
        })
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl FromStr for Codec {
    type Err = CompressError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Codec::parse(s)
    }
}

/// Name of the vector instruction sets the codecs use on this CPU
/// (`"avx2+f16c"`, `"avx2"` or `"scalar"`).
pub fn backend() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        simd::backend()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        "scalar"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_name_round_trip() {
        for s in [
            "fp16",
            "bf16",
            "int8",
            "int8:512",
            "int8-sr",
            "int8-sr:64",
            "topk:0.01",
            "topk-exact:0.01",
            "topk:0.5",
        ] {
            let c = Codec::parse(s).unwrap();
            assert_eq!(c.name(), s);
            assert_eq!(Codec::parse(&c.name()).unwrap(), c);
        }
        assert_eq!(
            Codec::parse("int8").unwrap(),
            Codec::Int8 {
                block: 256,
                stochastic: false
            }
        );
        assert_eq!(
            Codec::parse("topk:0.01").unwrap(),
            Codec::TopK {
                ratio: 0.01,
                sampled: true
            }
        );
        assert_eq!(
            Codec::parse(" TopK ").unwrap(),
            Codec::TopK {
                ratio: 0.01,
                sampled: true
            }
        );
        for bad in [
            "",
            "fp32",
            "fp16:2",
            "int8:0",
            "int8:x",
            "int8:-1",
            "topk:0",
            "topk:1.5",
            "topk:nan",
            "topk:",
            "int8:99999999999",
        ] {
            assert!(Codec::parse(bad).is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn max_encoded_len_values() {
        assert_eq!(Codec::Fp16.max_encoded_len(10), 20);
        assert_eq!(Codec::parse("int8").unwrap().max_encoded_len(257), 257 + 8);
        assert_eq!(Codec::parse("int8").unwrap().max_encoded_len(0), 0);
        assert_eq!(
            Codec::parse("topk-exact:0.01")
                .unwrap()
                .max_encoded_len(1000),
            84
        );
        assert_eq!(
            Codec::parse("topk:0.01").unwrap().max_encoded_len(1000),
            164
        );
        assert_eq!(Codec::parse("topk:0.01").unwrap().max_encoded_len(0), 4);
        assert_eq!(Codec::parse("topk:0.9").unwrap().max_encoded_len(10), 84);
    }
}
