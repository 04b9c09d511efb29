//! The codec kernels (kernels/cuda/sncl_codec.cu) compiled for the host,
//! run through the launch plans of `kernels::cuda_codec` on host memory,
//! against the `compress` crate bit for bit: every codec, awkward sizes,
//! misaligned buffers, several launch shapes, error feedback over steps.
#![cfg(feature = "emu")]

use compress::{Codec, ErrorFeedback};
use device::emu::codecs::{run_plan, PlanShape};
use kernels::cuda_codec::{self, DeviceCodec};

const SHAPES: [PlanShape; 3] = [
    PlanShape {
        threads: 1,
        max_grid: 1,
    },
    PlanShape {
        threads: 32,
        max_grid: 3,
    },
    PlanShape::EMU,
];

const SIZES: [usize; 12] = [0, 1, 7, 13, 255, 256, 257, 511, 1021, 4099, 65_537, 70_001];

/// Byte-addressable scratch: `len` bytes at byte offset `off` of 16-aligned
/// storage (offset 0 takes the kernels' 16-byte pack paths).
struct Buf {
    store: Vec<u128>,
    off: usize,
    len: usize,
}

impl Buf {
    fn new(len: usize, off: usize, fill: u8) -> Buf {
        let mut b = Buf {
            store: vec![0; (len + off).div_ceil(16) + 1],
            off,
            len,
        };
        b.bytes_mut().fill(fill);
        b
    }
    fn from_f32(v: &[f32], off_elems: usize) -> Buf {
        let mut b = Buf::new(4 * v.len(), 4 * off_elems, 0);
        for (c, x) in b.bytes_mut().chunks_exact_mut(4).zip(v) {
            c.copy_from_slice(&x.to_le_bytes());
        }
        b
    }
    fn from_bytes(v: &[u8], off: usize) -> Buf {
        let mut b = Buf::new(v.len(), off, 0);
        b.bytes_mut().copy_from_slice(v);
        b
    }
    fn addr(&mut self) -> u64 {
        (self.store.as_mut_ptr() as *mut u8 as u64) + self.off as u64
    }
    fn bytes(&self) -> &[u8] {
        // SAFETY: `off + len` bytes lie inside `store`.
        unsafe {
            std::slice::from_raw_parts((self.store.as_ptr() as *const u8).add(self.off), self.len)
        }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, uniquely borrowed.
        unsafe {
            std::slice::from_raw_parts_mut(
                (self.store.as_mut_ptr() as *mut u8).add(self.off),
                self.len,
            )
        }
    }
    fn f32s(&self) -> Vec<f32> {
        self.bytes()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn device_codec(codec: &Codec, n: usize) -> DeviceCodec {
    match *codec {
        Codec::Fp16 => DeviceCodec::Fp16,
        Codec::Bf16 => DeviceCodec::Bf16,
        Codec::Int8 { block, stochastic } => DeviceCodec::Int8 {
            block: block as u64,
            stochastic,
        },
        Codec::TopK { sampled: false, .. } => DeviceCodec::TopKExact {
            k: codec.topk_k(n).unwrap() as u64,
        },
        Codec::TopK { sampled: true, .. } => DeviceCodec::TopKSampled {
            k: codec.topk_k(n).unwrap() as u64,
        },
        Codec::Mx { element } => DeviceCodec::Mx {
            format: match element {
                compress::MxElement::E4M3 => cuda_codec::MX_E4M3,
                compress::MxElement::E5M2 => cuda_codec::MX_E5M2,
                compress::MxElement::E2M1 => cuda_codec::MX_E2M1,
            },
        },
    }
}

/// Test data: mixed magnitudes, signs, zeros, repeated values (top-k ties),
/// tiny (below 2^-100) and subnormal runs, and with `special` NaN/inf.
fn data(n: usize, seed: u64, special: bool) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    (0..n)
        .map(|i| {
            let r = next();
            let m = ((r >> 11) as f64 / (1u64 << 53) as f64) as f32 * 2.0 - 1.0;
            match (i / 300) % 6 {
                0 => m * 10.0,
                1 => (m * 8.0).round() * 0.5, // ties and zeros
                2 => m * 1e-33,               // tiny blocks
                3 => f32::from_bits((r as u32) & 0x807f_ffff), // subnormals
                4 if special && r % 97 == 0 => {
                    [f32::NAN, f32::INFINITY, -f32::INFINITY][(r % 3) as usize]
                }
                _ => m * 1e4,
            }
        })
        .collect()
}

fn codecs() -> Vec<Codec> {
    [
        "fp16",
        "bf16",
        "int8",
        "int8:1",
        "int8:7",
        "int8:256",
        "int8-sr",
        "int8-sr:100",
        "topk-exact:0.01",
        "topk-exact:0.3",
        "topk-exact:1",
        "topk:0.001",
        "topk:0.01",
        "topk:0.3",
        "mxfp8",
        "mxfp8-e5m2",
        "mxfp4",
    ]
    .iter()
    .map(|s| Codec::parse(s).unwrap())
    .collect()
}

/// Encodes on the "device" (host-compiled kernels).
fn dev_encode(
    codec: &Codec,
    src: &[f32],
    seed: Option<u64>,
    shape: PlanShape,
    off: (usize, usize),
) -> Vec<u8> {
    dev_encode_state(codec, src, seed, shape, off).0
}

/// [`dev_encode`], and the top-k state words at the end (mode 5, threshold
/// 6, first threshold 8, prefix end 9: see sncl_codec.cu).
fn dev_encode_state(
    codec: &Codec,
    src: &[f32],
    seed: Option<u64>,
    shape: PlanShape,
    off: (usize, usize),
) -> (Vec<u8>, [u64; 16]) {
    let n = src.len();
    let dc = device_codec(codec, n);
    let mut s = Buf::from_f32(src, off.0);
    let max = dc.encoded_len(n as u64) as usize;
    let mut d = Buf::new(max, off.1, 0xa5);
    let mut w = Buf::new(cuda_codec::workspace_bytes(&dc, n as u64) as usize, 0, 0x5a);
    let seed = if matches!(
        dc,
        DeviceCodec::Int8 {
            stochastic: true,
            ..
        }
    ) {
        cuda_codec::kernel_seed(seed)
    } else {
        0
    };
    let plan = cuda_codec::encode_plan(&dc, s.addr(), d.addr(), n as u64, seed, w.addr());
    // SAFETY: the buffers are sized for the plan (encoded_len, workspace_bytes).
    unsafe { run_plan(&plan, shape) }.unwrap();
    // Top-k's length is in its header.
    let len = match dc {
        DeviceCodec::TopKExact { .. } | DeviceCodec::TopKSampled { .. } => {
            4 + 8 * u32::from_le_bytes(d.bytes()[..4].try_into().unwrap()) as usize
        }
        _ => max,
    };
    let mut state = [0u64; 16];
    if w.len >= 128 {
        for (s, c) in state.iter_mut().zip(w.bytes().chunks_exact(8)) {
            *s = u64::from_le_bytes(c.try_into().unwrap());
        }
    }
    (d.bytes()[..len.min(max)].to_vec(), state)
}

fn host_encode(codec: &Codec, src: &[f32], seed: Option<u64>) -> Vec<u8> {
    let mut out = Vec::new();
    match seed {
        Some(s) => codec.encode_seeded(src, s, &mut out),
        None => codec.encode(src, &mut out),
    }
    out
}

#[test]
fn encode_matches_compress_bit_for_bit() {
    for codec in codecs() {
        for &n in &SIZES {
            let src = data(n, n as u64 + 1, !matches!(codec, Codec::TopK { .. }));
            for seed in [None, Some(42u64)] {
                let want = host_encode(&codec, &src, seed);
                for (i, &shape) in SHAPES.iter().enumerate() {
                    let off = [(0, 0), (1, 1), (2, 2)][i];
                    // Casts need 2-byte aligned encodings.
                    let off = match codec {
                        Codec::Fp16 | Codec::Bf16 => (off.0, off.1 & !1),
                        _ => off,
                    };
                    let got = dev_encode(&codec, &src, seed, shape, off);
                    assert!(got == want, "{} n={n} seed={seed:?} shape={shape:?} off={off:?}: first difference at byte {:?}",
                        codec.name(), got.iter().zip(&want).position(|(a, b)| a != b));
                }
            }
        }
    }
}

/// Top-k with many equal magnitudes: ties go to the lowest indices.
#[test]
fn topk_ties_go_to_the_lowest_indices() {
    for n in [10usize, 1000, 70_001] {
        let src: Vec<f32> = (0..n)
            .map(|i| {
                if i % 3 == 0 {
                    -2.0
                } else {
                    (i % 5) as f32 * 0.25
                }
            })
            .collect();
        for ratio in ["0.01", "0.2", "0.5", "0.9"] {
            let codec = Codec::parse(&format!("topk-exact:{ratio}")).unwrap();
            let want = host_encode(&codec, &src, None);
            for &shape in &SHAPES {
                assert_eq!(
                    dev_encode(&codec, &src, None, shape, (0, 0)),
                    want,
                    "n={n} ratio={ratio}"
                );
            }
        }
    }
}

fn dev_decode(
    codec: &Codec,
    encs: &[Vec<u8>],
    n: usize,
    init: Option<&[f32]>,
    shape: PlanShape,
    off: usize,
) -> (Vec<f32>, u32) {
    // The output is 16-byte aligned (the pack path) when the inputs are
    // 8-byte aligned.
    let out_off = usize::from(!off.is_multiple_of(8));
    let dc = device_codec(codec, n);
    let enc_len = encs[0].len();
    let mut bufs: Vec<Buf> = encs.iter().map(|e| Buf::from_bytes(e, off)).collect();
    let addrs: Vec<u64> = bufs.iter_mut().map(Buf::addr).collect();
    let mut d = match init {
        Some(v) => Buf::from_f32(v, out_off),
        None => Buf::from_f32(&vec![f32::from_bits(0x7fa5_5555); n], out_off),
    };
    let mut w = Buf::new(16, 0, 0xee);
    let dc = match dc {
        DeviceCodec::TopKExact { .. } | DeviceCodec::TopKSampled { .. } => DeviceCodec::TopKExact {
            k: (enc_len.saturating_sub(4) / 8) as u64,
        },
        other => other,
    };
    let plan = cuda_codec::decode_plan(
        &dc,
        &addrs,
        enc_len as u64,
        n as u64,
        d.addr(),
        init.is_some(),
        w.addr(),
    );
    // SAFETY: inputs of enc_len bytes, n f32 out, 16 bytes of workspace.
    unsafe { run_plan(&plan, shape) }.unwrap();
    // Only top-k decodes validate on the device and write a status.
    let status = match dc {
        DeviceCodec::TopKExact { .. } => u32::from_le_bytes(w.bytes()[..4].try_into().unwrap()),
        _ => 0,
    };
    (d.f32s(), status)
}

#[test]
fn decode_and_decode_add_match_compress() {
    for codec in codecs() {
        for &n in &SIZES {
            let srcs: Vec<Vec<f32>> = (0..3).map(|r| data(n, 7 * n as u64 + r, true)).collect();
            let encs: Vec<Vec<u8>> = srcs.iter().map(|s| host_encode(&codec, s, None)).collect();
            let acc0 = data(n, 99, false);
            // One source, overwrite and add.
            let mut want = vec![0f32; n];
            codec.decode(&encs[0], n, &mut want).unwrap();
            let mut want_add = acc0.clone();
            codec.decode_add(&encs[0], n, &mut want_add).unwrap();
            // Three sources (dense codecs): decode, then decode_add.
            let mut want3 = want.clone();
            for e in &encs[1..] {
                codec.decode_add(e, n, &mut want3).unwrap();
            }
            for (i, &shape) in SHAPES.iter().enumerate() {
                let off = if matches!(codec, Codec::Fp16 | Codec::Bf16) {
                    2 * i
                } else {
                    i
                };
                let (got, st) = dev_decode(&codec, &encs[..1], n, None, shape, off);
                assert_eq!(
                    (bits(&got), st),
                    (bits(&want), 0),
                    "{} n={n} {shape:?}",
                    codec.name()
                );
                let (got, st) = dev_decode(&codec, &encs[..1], n, Some(&acc0), shape, off);
                assert_eq!(
                    (bits(&got), st),
                    (bits(&want_add), 0),
                    "{} add n={n}",
                    codec.name()
                );
                if !matches!(codec, Codec::TopK { .. }) {
                    let (got, _) = dev_decode(&codec, &encs, n, None, shape, off);
                    assert_eq!(bits(&got), bits(&want3), "{} 3 sources n={n}", codec.name());
                }
            }
        }
    }
}

#[test]
fn corrupt_topk_is_refused_and_leaves_the_output() {
    let codec = Codec::parse("topk-exact:0.1").unwrap();
    let n = 100;
    let good = host_encode(&codec, &data(n, 3, false), None);
    let k = good.len() / 8;
    let mut bad_range = good.clone();
    bad_range[4..8].copy_from_slice(&(n as u32).to_le_bytes());
    let mut bad_order = good.clone();
    bad_order.copy_within(4..8, 8);
    let mut big_k = good.clone();
    big_k[..4].copy_from_slice(&(n as u32 + 1).to_le_bytes());
    let short = good[..good.len() - 1].to_vec();
    let init = data(n, 5, false);
    for (bad, what) in [(bad_range, 4), (bad_order, 8), (big_k, 2), (short, 3)] {
        assert!(codec.decode(&bad, n, &mut vec![0.0; n]).is_err());
        for add in [false, true] {
            let mut dc = init.clone();
            let (got, st) = dev_decode(
                &codec,
                std::slice::from_ref(&bad),
                n,
                add.then_some(&init[..]),
                PlanShape::EMU,
                0,
            );
            if !add {
                dc = vec![f32::from_bits(0x7fa5_5555); n];
            }
            assert_eq!(st & what, what, "status {st} for case {what} (k={k})");
            assert!(device::codec::decode_status(st).is_some());
            assert_eq!(bits(&got), bits(&dc), "output touched on bad input {what}");
        }
    }
}

#[test]
fn fused_decode_sum_encode_matches_compress() {
    for codec in [Codec::Fp16, Codec::Bf16] {
        for &n in &SIZES {
            let encs: Vec<Vec<u8>> = (0..4)
                .map(|r| host_encode(&codec, &data(n, r + 11, true), None))
                .collect();
            let mut acc = vec![0f32; n];
            for e in &encs {
                codec.decode_add(e, n, &mut acc).unwrap();
            }
            let want = host_encode(&codec, &acc, None);
            for &shape in &SHAPES {
                let dc = device_codec(&codec, n);
                let mut bufs: Vec<Buf> = encs.iter().map(|e| Buf::from_bytes(e, 2)).collect();
                let addrs: Vec<u64> = bufs.iter_mut().map(Buf::addr).collect();
                let mut d = Buf::new(2 * n, 0, 0);
                let mut sum = Buf::new(4 * n, 4, 0);
                let plan =
                    cuda_codec::decsum_encode_plan(&dc, &addrs, n as u64, d.addr(), sum.addr())
                        .unwrap();
                // SAFETY: 2n-byte inputs and output, n f32 sum.
                unsafe { run_plan(&plan, shape) }.unwrap();
                assert_eq!(d.bytes(), &want[..], "{} n={n}", codec.name());
                assert_eq!(bits(&sum.f32s()), bits(&acc));
            }
        }
    }
}

#[test]
fn error_feedback_state_matches_after_several_steps() {
    for codec in codecs() {
        for n in [1usize, 257, 4099, 1 << 21] {
            if n == 1 << 21 && !matches!(codec, Codec::TopK { sampled: true, .. }) {
                continue;
            }
            let dc = device_codec(&codec, n);
            let mut ef = ErrorFeedback::new(n);
            let mut grad_d = Buf::from_f32(&vec![0.0; n], 1);
            let mut res_d = Buf::from_f32(&vec![0.0; n], 0);
            let mut enc_d = Buf::new(dc.encoded_len(n as u64) as usize, 0, 0);
            let mut work = Buf::new(cuda_codec::workspace_bytes(&dc, n as u64) as usize, 0, 0);
            for step in 0..4u64 {
                let g = data(n, 1000 + step, false);
                let mut host_g = g.clone();
                let mut wire = Vec::new();
                ef.encode_with_feedback(&codec, &mut host_g, &mut wire);
                grad_d = Buf::from_f32(&g, grad_d.off / 4);
                let plan = cuda_codec::feedback_encode_plan(
                    &dc,
                    grad_d.addr(),
                    res_d.addr(),
                    enc_d.addr(),
                    n as u64,
                    0,
                    work.addr(),
                );
                // SAFETY: buffers sized for the plan.
                unsafe { run_plan(&plan, SHAPES[step as usize % 3]) }.unwrap();
                assert_eq!(
                    &enc_d.bytes()[..wire.len()],
                    &wire[..],
                    "{} step {step}",
                    codec.name()
                );
                assert_eq!(
                    bits(&grad_d.f32s()),
                    bits(&host_g),
                    "{} step {step} grad",
                    codec.name()
                );
                assert_eq!(
                    bits(&res_d.f32s()),
                    bits(ef.residual()),
                    "{} step {step} residual",
                    codec.name()
                );
            }
        }
    }
}

/// The first element of each of the sampled top-k's sample runs (as
/// compress::topk::sample_keys draws them), so tests can plant values where
/// the sample looks or does not.
fn sample_runs(n: usize, k: usize) -> Vec<usize> {
    let (m, _) = cuda_codec::topk_sample(n as u64, k as u64).expect("sampled");
    let step = ((n as u64) << 32) / m;
    let mut st = 0x5eed_0000_0000_0000u64 ^ n as u64;
    let mut a = 0usize;
    (0..m)
        .map(|j| {
            let b = if j + 1 == m {
                n
            } else {
                (((j + 1) * step) >> 32) as usize
            };
            st = st.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = st;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            let off = (((z >> 32) * (b - a - 16 + 1) as u64) >> 32) as usize;
            let start = a + off;
            a = b;
            start
        })
        .collect()
}

/// Sampled top-k on tensors large enough to sample, through every branch of
/// compress's selection: the sample's threshold kept as is, too many above
/// it (second threshold from the prefix), too few (lower sample rank),
/// ties and mostly-zero tensors (exact fallbacks).
#[test]
fn sampled_topk_matches_compress_on_every_path() {
    let n = 1 << 21;
    let mut paths = std::collections::BTreeSet::new();
    for ratio in [0.001, 0.01] {
        let codec = Codec::TopK {
            ratio,
            sampled: true,
        };
        let k = codec.topk_k(n).unwrap();
        let runs = sample_runs(n, k);
        let mut in_sample = vec![false; n];
        for &r in &runs {
            in_sample[r..r + 16].iter_mut().for_each(|x| *x = true);
        }
        let base = data(n, 3, false);
        let cases: Vec<(&str, Vec<f32>)> = vec![
            ("continuous", base.iter().map(|x| x * 1.5 + 0.1).collect()),
            (
                "grid ties",
                base.iter().map(|x| (x / 3000.0).round()).collect(),
            ),
            (
                "mostly zero",
                (0..n)
                    .map(|i| if i % 5000 == 0 { 1.0 + i as f32 } else { 0.0 })
                    .collect(),
            ),
            (
                "sample too small",
                (0..n)
                    .map(|i| {
                        if in_sample[i] {
                            base[i] * 1e-3
                        } else {
                            base[i]
                        }
                    })
                    .collect(),
            ),
            (
                "sample too large",
                (0..n)
                    .map(|i| if in_sample[i] { base[i] * 1e3 } else { base[i] })
                    .collect(),
            ),
            (
                "sample too large, few big",
                (0..n)
                    .map(|i| {
                        if in_sample[i] {
                            1e6 + i as f32
                        } else if i % 997 == 0 {
                            1e5 + i as f32
                        } else {
                            (i % 1000) as f32
                        }
                    })
                    .collect(),
            ),
        ];
        for (what, src) in cases {
            let want = host_encode(&codec, &src, None);
            let (_, st) = dev_encode_state(&codec, &src, None, PlanShape::EMU, (0, 0));
            // Which way the device went: final mode (1 exact, 2 threshold),
            // prefix end p (case A), threshold vs the sample's t.
            let path = match (st[5], st[9] > 0, st[6].cmp(&st[8])) {
                (2, false, std::cmp::Ordering::Equal) => "sample threshold kept",
                (2, true, _) => "too many: prefix threshold kept",
                (1, true, _) => "too many: exact",
                (2, false, std::cmp::Ordering::Less) => "too few: lower sample threshold kept",
                (1, false, _) => "too few or over 2k: exact",
                other => panic!("{what}: unexpected state {other:?} {st:?}"),
            };
            eprintln!("{what}, ratio {ratio}: {path}");
            paths.insert(path);
            for shape in [PlanShape::EMU, SHAPES[1]] {
                let got = dev_encode(&codec, &src, None, shape, (1, 3));
                let kk = u32::from_le_bytes(want[..4].try_into().unwrap());
                assert!(got == want, "{what} ratio={ratio}: k {} vs {kk} (target {k}), first difference at byte {:?}",
                    u32::from_le_bytes(got[..4].try_into().unwrap()),
                    got.iter().zip(&want).position(|(a, b)| a != b));
            }
        }
    }
    assert_eq!(
        paths.len(),
        5,
        "not every selection path was taken: {paths:?}"
    );
}
