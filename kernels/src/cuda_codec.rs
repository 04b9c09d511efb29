//! The device codec kernels (`kernels/cuda/sncl_codec.cu`): their source,
//! names, the argument struct both device backends pass, and the launch
//! sequences ("plans") that make up one codec operation, so the CUDA and
//! emulated backends run exactly the same kernels in the same order.
//!
//! Formats are the `compress` crate's, bit for bit: fp16/bf16 (`n` × u16),
//! blockwise int8 (per block an f32 scale then the i8s) and top-k (`u32 k`,
//! `k` ascending u32 indices, `k` f32 values), exact and sampled top-k
//! selecting the very indices `compress` selects.
//!
//! ABI: every kernel is `sncl_codec_<name>(SnclCodecArgs)` with
//! [`CodecArgs`] passed by value.

/// The codec kernels' translation unit.
pub const CODEC_SOURCE: &str = include_str!("../cuda/sncl_codec.cu");

/// The headers [`CODEC_SOURCE`] includes, as (name, text), for NVRTC's
/// in-memory headers: [`crate::cuda::HEADERS`] and the top-k kernels.
pub fn codec_headers() -> Vec<(&'static str, &'static str)> {
    let mut h = crate::cuda::HEADERS.to_vec();
    h.push(("sncl_codec_topk.cuh", TOPK_HEADER));
    h
}

/// The top-k kernels (`kernels/cuda/sncl_codec_topk.cuh`).
const TOPK_HEADER: &str = include_str!("../cuda/sncl_codec_topk.cuh");

/// The most encoded inputs one decode (or fused decode-sum-encode) takes.
pub const MAX_SRCS: usize = 8;

/// The most threads per block a block kernel (shared memory and barriers:
/// `int8_encode`, the fused top-k kernels) is launched with
/// (`SNCL_CODEC_BLOCK_THREADS`); the CUDA backend's
/// [`crate::cuda::BLOCK_THREADS`] is within it.
pub const BLOCK_KERNEL_THREADS: u32 = 256;
const _: () = assert!(crate::cuda::BLOCK_THREADS <= BLOCK_KERNEL_THREADS);

/// Elements of an int8 block per thread of the group that owns it
/// (`SNCL_INT8_PER_THREAD`): an int8 encode launch wants about
/// `n / INT8_PER_THREAD` threads.
pub const INT8_PER_THREAD: u64 = 8;

/// Elements per top-k compaction chunk (`SNCL_TOPK_CHUNK`).
pub const TOPK_CHUNK: u64 = 256;
/// Chunks per top-k scan group (`SNCL_TOPK_GROUP`).
pub const TOPK_GROUP: u64 = 256;
/// Private top-k histogram copies (`SNCL_TOPK_HCOPIES`).
pub const TOPK_HCOPIES: u64 = 64;

/// `flags`: decode adds to the destination instead of overwriting it.
pub const FLAG_ADD: i32 = 1;
/// `flags`: int8 rounds stochastically.
pub const FLAG_STOCHASTIC: i32 = 2;
/// `flags`: top-k selects by a sampled threshold.
pub const FLAG_SAMPLED: i32 = 4;

/// `flags`: a top-k decode's `enc_len` is an upper bound (decoding the
/// device's own sampled encoding, whose length is in its header).
pub const FLAG_LEN_MAX: i32 = 8;

/// Top-k modes (`SNCL_TM_*`), for [`CodecArgs::when`].
pub mod mode {
    /// Exact selection (also every sampled fallback).
    pub const EXACT: u32 = 1;
    /// Keep every key at or above the threshold.
    pub const FINAL: u32 = 2;
    /// Sampled, too many above t: second threshold from the prefix.
    pub const A: u32 = 4;
    /// Sampled, too few above t: lower threshold from the sample.
    pub const B: u32 = 8;
    /// Sampled: counting above the second threshold.
    pub const RECOUNT: u32 = 16;
    /// Sampled: the sample's threshold.
    pub const SAMPLE: u32 = 32;
}

/// Rust mirror of `SnclCodecArgs` (144 bytes). Pointers are addresses in
/// the launching backend's space (device addresses on CUDA, host addresses
/// on the emulated device).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CodecArgs {
    /// Inputs: f32 (encode) or encoded bytes (decode); `nsrcs` used.
    pub src: [u64; MAX_SRCS],
    /// Output: encoded bytes (encode) or f32 (decode).
    pub dst: u64,
    /// f32 side buffer (residual, gradient, sum) or 0.
    pub aux: u64,
    /// Device workspace of [`workspace_bytes`].
    pub work: u64,
    /// Elements.
    pub n: u64,
    /// int8: block size; top-k: `k`.
    pub param: u64,
    /// Top-k decode: encoded bytes given; sampled top-k encode: sample runs.
    pub enc_len: u64,
    /// Sampled top-k: the sample rank `j`.
    pub rank: u64,
    /// int8-sr: the 32-bit kernel seed ([`kernel_seed`]).
    pub seed: u32,
    /// Top-k radix pass, 0 to 3.
    pub pass: u32,
    /// Inputs used, 1 to [`MAX_SRCS`].
    pub nsrcs: i32,
    /// [`FLAG_ADD`], [`FLAG_STOCHASTIC`], [`FLAG_SAMPLED`].
    pub flags: i32,
    /// Top-k: the [`mode`]s this launch runs in (0: always).
    pub when: u32,
    /// Padding.
    pub pad: u32,
}

const _: () = assert!(std::mem::size_of::<CodecArgs>() == 144);

/// A codec as the device kernels know it (the device layer maps
/// `compress::Codec` to this; `k` is `compress::Codec::topk_k(n)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceCodec {
    /// IEEE half, nearest even.
    Fp16,
    /// bfloat16, nearest even.
    Bf16,
    /// Blockwise int8.
    Int8 {
        /// Elements per scale (at least 1).
        block: u64,
        /// Stochastic rounding.
        stochastic: bool,
    },
    /// Exact top-k: the `k` largest magnitudes, ties to the lowest indices.
    TopKExact {
        /// Elements kept (at most `n`).
        k: u64,
    },
    /// Sampled-threshold top-k (`compress`'s `topk:<ratio>`): between
    /// `ceil(k/2)` and `2k` elements, the very indices compress selects.
    TopKSampled {
        /// The target count (at most `n`).
        k: u64,
    },
    /// OCP MX v1.0 blocks of [`MX_BLOCK`] with an E8M0 scale (`compress`'s
    /// `mxfp8`, `mxfp8-e5m2`, `mxfp4`), bit for bit.
    Mx {
        /// The element format: [`MX_E4M3`], [`MX_E5M2`] or [`MX_E2M1`].
        format: u64,
    },
}

/// Elements per MX scale.
pub const MX_BLOCK: u64 = 32;
/// [`DeviceCodec::Mx`] element format: MXFP8 with E4M3 elements.
pub const MX_E4M3: u64 = 0;
/// MXFP8 with E5M2 elements.
pub const MX_E5M2: u64 = 1;
/// MXFP4: E2M1 elements, two per byte.
pub const MX_E2M1: u64 = 2;

/// Encoded bytes of an MX block of `len` elements (its scale included).
fn mx_block_bytes(format: u64, len: u64) -> u64 {
    1 + if format == MX_E2M1 {
        len.div_ceil(2)
    } else {
        len
    }
}

impl DeviceCodec {
    /// Encoded bytes for `n` elements.
    pub fn encoded_len(&self, n: u64) -> u64 {
        match *self {
            DeviceCodec::Fp16 | DeviceCodec::Bf16 => 2 * n,
            DeviceCodec::Int8 { block, .. } => n + 4 * n.div_ceil(block.max(1)),
            DeviceCodec::TopKExact { k } => 4 + 8 * k,
            DeviceCodec::TopKSampled { k } => 4 + 8 * (2 * k).min(n),
            DeviceCodec::Mx { format } => {
                let (full, rest) = (n / MX_BLOCK, n % MX_BLOCK);
                full * mx_block_bytes(format, MX_BLOCK)
                    + if rest > 0 {
                        mx_block_bytes(format, rest)
                    } else {
                        0
                    }
            }
        }
    }
}

/// Sampled top-k's sample (`compress::topk::sample_keys`): `(runs, j)`, the
/// number of 16-element runs and the rank in the sample that corresponds to
/// `k`; `None` where compress selects exactly (the sample would be a
/// quarter of the tensor or more, or `k` is 0 or all of it).
pub fn topk_sample(n: u64, k: u64) -> Option<(u64, u64)> {
    if k == 0 || k >= n {
        return None;
    }
    let s = (n / 100).max(4096).max(n.saturating_mul(256) / k);
    if s.saturating_mul(4) >= n {
        return None;
    }
    let runs = s.div_ceil(16);
    let s = runs * 16;
    let j = ((k as f64 * s as f64 / n as f64).round() as u64).clamp(1, s);
    Some((runs, j))
}

/// What one launch works on: how many independent work items its grid
/// covers (the backend picks the grid from it; any shape is correct).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Items {
    /// Work items of one thread each (elements, blocks, chunks, groups).
    Many(u64),
    /// Thread 0 of block 0 does everything.
    Single,
}

/// One kernel launch of a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// The kernel's name.
    pub kernel: String,
    /// Its argument.
    pub args: CodecArgs,
    /// Its work items.
    pub items: Items,
}

fn launch(name: &str, args: CodecArgs, items: Items) -> Launch {
    Launch {
        kernel: format!("sncl_codec_{name}"),
        args,
        items,
    }
}

/// Every codec kernel's name.
pub fn kernel_names() -> Vec<String> {
    let mut v = Vec::new();
    for f in ["f16", "bf16"] {
        for k in ["encode", "decode", "decsum_encode"] {
            v.push(format!("sncl_codec_{k}_{f}"));
        }
    }
    for k in [
        "int8_encode",
        "int8_decode",
        "topk_init",
        "topk_sample",
        "topk_hist",
        "topk_count",
        "topk_write",
        "topk_check_init",
        "topk_check",
        "topk_clear",
        "topk_scatter",
        "ef_compensate",
        "ef_residual",
        "mx_encode",
        "mx_decode",
    ] {
        v.push(format!("sncl_codec_{k}"));
    }
    v
}

/// Top-k encode workspace: 16 + 256 x [`TOPK_HCOPIES`] u64 words, then per
/// chunk two u32 counts, per group two u32 totals, then the sample's u32
/// keys.
fn topk_work(n: u64, sample_runs: u64) -> u64 {
    let chunks = n.div_ceil(TOPK_CHUNK);
    let groups = chunks.div_ceil(TOPK_GROUP);
    8 * (16 + 256 * TOPK_HCOPIES) + 8 * chunks + 8 * groups + (64 * sample_runs).next_multiple_of(8)
}

/// Bytes of device workspace an encode (with or without feedback) or a
/// decode of `n` elements needs (8-byte aligned; 0 for the casts and int8).
pub fn workspace_bytes(codec: &DeviceCodec, n: u64) -> u64 {
    match *codec {
        DeviceCodec::Fp16 | DeviceCodec::Bf16 => 0,
        DeviceCodec::Int8 { .. } | DeviceCodec::Mx { .. } => 0,
        DeviceCodec::TopKExact { .. } => topk_work(n, 0),
        DeviceCodec::TopKSampled { k } => topk_work(n, topk_sample(n, k).map_or(0, |(r, _)| r)),
    }
}

/// lowbias32 (compress's `hash32`).
fn hash32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    x
}

/// The 32-bit seed the int8 kernels use for a caller's seed: what
/// `compress::Codec::encode_seeded(.., seed, ..)` uses (`Some`), or
/// `Codec::encode` (`None`: 0).
pub fn kernel_seed(seed: Option<u64>) -> u32 {
    match seed {
        Some(s) => hash32((s ^ (s >> 32)) as u32 ^ 0x5bd1_e995),
        None => 0,
    }
}

fn args(n: u64, param: u64, work: u64) -> CodecArgs {
    CodecArgs {
        n,
        param,
        work,
        nsrcs: 1,
        ..Default::default()
    }
}

/// The launches that encode `n` f32 at `src` into `dst`
/// ([`DeviceCodec::encoded_len`] bytes) with workspace `work`; `seed` is
/// [`kernel_seed`]'s. Empty for `n == 0` except top-k, whose header
/// (`k = 0`) is still written.
pub fn encode_plan(
    codec: &DeviceCodec,
    src: u64,
    dst: u64,
    n: u64,
    seed: u32,
    work: u64,
) -> Vec<Launch> {
    let mut a = args(n, 0, work);
    a.src[0] = src;
    a.dst = dst;
    match *codec {
        DeviceCodec::Fp16 | DeviceCodec::Bf16 if n == 0 => vec![],
        DeviceCodec::Fp16 => vec![launch("encode_f16", a, Items::Many(n))],
        DeviceCodec::Bf16 => vec![launch("encode_bf16", a, Items::Many(n))],
        DeviceCodec::Int8 { .. } if n == 0 => vec![],
        DeviceCodec::Int8 { block, stochastic } => {
            a.param = block;
            a.seed = seed;
            if stochastic {
                a.flags = FLAG_STOCHASTIC;
            }
            vec![launch(
                "int8_encode",
                a,
                Items::Many(n.div_ceil(INT8_PER_THREAD)),
            )]
        }
        DeviceCodec::TopKExact { k } => topk_plan(a, k, None),
        DeviceCodec::TopKSampled { k } => topk_plan(a, k, topk_sample(n, k)),
        DeviceCodec::Mx { .. } if n == 0 => vec![],
        DeviceCodec::Mx { format } => {
            a.param = format;
            vec![launch("mx_encode", a, Items::Many(n.div_ceil(MX_BLOCK)))]
        }
    }
}

/// Top-k encode: exact, or sampled with `(runs, j)` (see
/// `sncl_codec_topk.cuh` for the modes each launch runs in): 7 launches
/// exact, 18 sampled (2 for `k = 0`). Each radix-select pass and each count
/// is one launch whose last block to finish takes the cross-block steps.
fn topk_plan(mut a: CodecArgs, k: u64, sample: Option<(u64, u64)>) -> Vec<Launch> {
    let n = a.n;
    a.param = k;
    if let Some((runs, j)) = sample {
        a.flags = FLAG_SAMPLED;
        a.enc_len = runs;
        a.rank = j;
    }
    let mut v = vec![launch("topk_init", a, Items::Many(256 * TOPK_HCOPIES))];
    if k == 0 {
        v.push(launch("topk_write", a, Items::Single));
        return v;
    }
    let chunks = n.div_ceil(TOPK_CHUNK);
    // Keys a select's histograms visit: the sample (SAMPLE), else up to n.
    let select = |v: &mut Vec<Launch>, mut a: CodecArgs, when: u32, keys: u64| {
        a.when = when;
        for pass in 0..4 {
            a.pass = pass;
            v.push(launch("topk_hist", a, Items::Many(keys)));
        }
    };
    let count = |v: &mut Vec<Launch>, mut a: CodecArgs, when: u32| {
        a.when = when;
        v.push(launch("topk_count", a, Items::Many(chunks)));
    };
    if let Some((runs, _)) = sample {
        v.push(launch("topk_sample", a, Items::Many(runs)));
        select(&mut v, a, mode::SAMPLE, 16 * runs);
        count(&mut v, a, mode::SAMPLE);
        select(&mut v, a, mode::A | mode::B, n);
        count(&mut v, a, mode::RECOUNT);
    }
    select(&mut v, a, mode::EXACT, n);
    count(&mut v, a, mode::EXACT);
    v.push(launch("topk_write", a, Items::Many(chunks)));
    v
}

/// The launches that decode the encodings at `srcs` (1 to [`MAX_SRCS`],
/// each of `enc_len` bytes) of `n` elements into the f32 at `dst`:
/// `dst = dec(srcs[0]) + dec(srcs[1]) + ...` left to right, or with `add`
/// `dst += ...` (as successive `compress` `decode`/`decode_add` calls).
/// Top-k takes one source and validates it: on bad input the u32 status at
/// `work` is non-zero (see `sncl_codec.cu`) and `dst` is left untouched.
pub fn decode_plan(
    codec: &DeviceCodec,
    srcs: &[u64],
    enc_len: u64,
    n: u64,
    dst: u64,
    add: bool,
    work: u64,
) -> Vec<Launch> {
    let mut a = args(n, 0, work);
    a.nsrcs = srcs.len() as i32;
    a.src[..srcs.len()].copy_from_slice(srcs);
    a.dst = dst;
    a.enc_len = enc_len;
    if add {
        a.flags = FLAG_ADD;
    }
    match *codec {
        DeviceCodec::Fp16
        | DeviceCodec::Bf16
        | DeviceCodec::Int8 { .. }
        | DeviceCodec::Mx { .. }
            if n == 0 =>
        {
            vec![]
        }
        DeviceCodec::Mx { format } => {
            a.param = format;
            vec![launch("mx_decode", a, Items::Many(n))]
        }
        DeviceCodec::Fp16 => vec![launch("decode_f16", a, Items::Many(n))],
        DeviceCodec::Bf16 => vec![launch("decode_bf16", a, Items::Many(n))],
        DeviceCodec::Int8 { block, .. } => {
            a.param = block;
            vec![launch("int8_decode", a, Items::Many(n))]
        }
        DeviceCodec::TopKExact { k } | DeviceCodec::TopKSampled { k } => vec![
            launch("topk_check_init", a, Items::Single),
            launch("topk_check", a, Items::Many(k.max(1))),
            launch("topk_clear", a, Items::Many(n.max(1))),
            launch("topk_scatter", a, Items::Many(k.max(1))),
        ],
    }
}

/// The fused reduce-and-re-encode of the casts: `dst = enc(dec(srcs[0]) +
/// dec(srcs[1]) + ...)` summed in f32 from +0 (as `compress` `decode_add`
/// into zeros, then `encode`), and the f32 sum to `sum` unless 0. `None`
/// for codecs other than fp16/bf16.
pub fn decsum_encode_plan(
    codec: &DeviceCodec,
    srcs: &[u64],
    n: u64,
    dst: u64,
    sum: u64,
) -> Option<Vec<Launch>> {
    let name = match codec {
        DeviceCodec::Fp16 => "decsum_encode_f16",
        DeviceCodec::Bf16 => "decsum_encode_bf16",
        _ => return None,
    };
    if n == 0 {
        return Some(vec![]);
    }
    let mut a = args(n, 0, 0);
    a.nsrcs = srcs.len() as i32;
    a.src[..srcs.len()].copy_from_slice(srcs);
    a.dst = dst;
    a.aux = sum;
    Some(vec![launch(name, a, Items::Many(n))])
}

/// One error-feedback step on the device, as
/// `compress::ErrorFeedback::encode_with_feedback`: `grad += residual`,
/// encode `grad` into `dst`, decode that into `residual`, `residual = grad -
/// residual`. `grad` is left compensated.
pub fn feedback_encode_plan(
    codec: &DeviceCodec,
    grad: u64,
    residual: u64,
    dst: u64,
    n: u64,
    seed: u32,
    work: u64,
) -> Vec<Launch> {
    let mut c = args(n, 0, work);
    c.dst = grad;
    c.aux = residual;
    let mut v = Vec::new();
    if n > 0 {
        v.push(launch("ef_compensate", c, Items::Many(n)));
    }
    v.extend(encode_plan(codec, grad, dst, n, seed, work));
    let mut decode = decode_plan(
        codec,
        &[dst],
        codec.encoded_len(n),
        n,
        residual,
        false,
        work,
    );
    for l in &mut decode {
        l.args.flags |= FLAG_LEN_MAX;
    }
    v.extend(decode);
    if n > 0 {
        c.dst = residual;
        c.aux = grad;
        v.push(launch("ef_residual", c, Items::Many(n)));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_is_defined_in_the_source_and_listed() {
        let names = kernel_names();
        for name in &names {
            let short = name.strip_prefix("sncl_codec_").unwrap();
            assert!(
                CODEC_SOURCE.contains(&format!("X({short})")),
                "{name} not in the host table"
            );
        }
        assert_eq!(CODEC_SOURCE.matches("X(").count(), names.len());
    }

    #[test]
    fn constants_match_the_source() {
        assert!(CODEC_SOURCE.contains(&format!("#define SNCL_TOPK_CHUNK {TOPK_CHUNK}ull")));
        assert!(CODEC_SOURCE.contains(&format!("#define SNCL_TOPK_GROUP {TOPK_GROUP}ull")));
        assert!(CODEC_SOURCE.contains(&format!("#define SNCL_TOPK_HCOPIES {TOPK_HCOPIES}ull")));
        assert!(CODEC_SOURCE.contains("#include \"sncl_codec_topk.cuh\""));
        assert!(!TOPK_HEADER.contains("#include"));
        assert!(CODEC_SOURCE.contains(&format!("#define SNCL_CODEC_MAX_SRCS {MAX_SRCS}")));
        assert!(CODEC_SOURCE.contains(&format!(
            "#define SNCL_CODEC_BLOCK_THREADS {BLOCK_KERNEL_THREADS}"
        )));
        assert!(CODEC_SOURCE.contains(&format!("#define SNCL_INT8_PER_THREAD {INT8_PER_THREAD}u")));
        assert!(CODEC_SOURCE.contains(&format!("#define SNCL_CODEC_ADD {FLAG_ADD}")));
        assert!(CODEC_SOURCE.contains(&format!("#define SNCL_CODEC_STOCHASTIC {FLAG_STOCHASTIC}")));
        assert!(CODEC_SOURCE.contains(&format!("#define SNCL_CODEC_SAMPLED {FLAG_SAMPLED}")));
        assert!(CODEC_SOURCE.contains(&format!("#define SNCL_CODEC_LEN_MAX {FLAG_LEN_MAX}")));
        for (name, v) in [
            ("EXACT", mode::EXACT),
            ("FINAL", mode::FINAL),
            ("A", mode::A),
            ("B", mode::B),
            ("RECOUNT", mode::RECOUNT),
            ("SAMPLE", mode::SAMPLE),
        ] {
            assert!(
                TOPK_HEADER.contains(&format!("#define SNCL_TM_{name} {v}u")),
                "{name}"
            );
        }
        assert!(
            !CODEC_SOURCE.contains("#include <"),
            "NVRTC gets no include path"
        );
    }

    #[test]
    fn plans_use_only_listed_kernels() {
        let names = kernel_names();
        let codecs = [
            DeviceCodec::Fp16,
            DeviceCodec::Bf16,
            DeviceCodec::Int8 {
                block: 256,
                stochastic: true,
            },
            DeviceCodec::TopKExact { k: 3 },
            DeviceCodec::TopKSampled { k: 30 },
        ];
        for c in codecs {
            let mut plans = encode_plan(&c, 1, 2, 1000, 7, 3);
            plans.extend(decode_plan(&c, &[1, 2], 9, 1000, 4, true, 3));
            plans.extend(feedback_encode_plan(&c, 1, 2, 3, 1000, 7, 4));
            plans.extend(decsum_encode_plan(&c, &[1], 1000, 2, 0).unwrap_or_default());
            for l in plans {
                assert!(names.contains(&l.kernel), "{}", l.kernel);
            }
        }
    }

    #[test]
    fn seeds_and_sizes() {
        assert_eq!(kernel_seed(None), 0);
        assert_ne!(kernel_seed(Some(1)), kernel_seed(Some(2)));
        assert_eq!(
            DeviceCodec::Int8 {
                block: 256,
                stochastic: false
            }
            .encoded_len(257),
            265
        );
        assert_eq!(DeviceCodec::TopKExact { k: 10 }.encoded_len(1000), 84);
        assert_eq!(workspace_bytes(&DeviceCodec::Fp16, 100), 0);
        assert_eq!(topk_work(1, 0), 8 * (16 + 256 * 64) + 8 + 8);
        assert_eq!(topk_sample(100_000, 1000), None);
        assert!(topk_sample(10_000_000, 100_000).is_some());
    }

    #[test]
    fn codec_plans_take_few_launches() {
        let enc = |c: DeviceCodec, n| encode_plan(&c, 1, 2, n, 0, 3).len();
        let int8 = DeviceCodec::Int8 {
            block: 256,
            stochastic: true,
        };
        // One DRAM pass for int8; top-k's launches do not grow with n.
        assert_eq!(enc(int8, 1 << 24), 1);
        assert_eq!(enc(DeviceCodec::Fp16, 1 << 24), 1);
        assert_eq!(enc(DeviceCodec::TopKExact { k: 1000 }, 1 << 24), 7);
        let k = (1u64 << 24) / 100;
        assert!(topk_sample(1 << 24, k).is_some());
        assert_eq!(enc(DeviceCodec::TopKSampled { k }, 1 << 24), 18);
        assert_eq!(enc(DeviceCodec::TopKSampled { k: 0 }, 1 << 24), 2);
    }
}
