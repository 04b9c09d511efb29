//! `Device::codec` against the `compress` crate, written once against
//! `Arc<dyn Device>`: every codec kernel's output on the device vs the CPU
//! codec, bit for bit. The backend comes from `SNCL_TEST_DEVICE` (`emu` by
//! default, `cuda` on a GPU machine: `scripts/gpu-check.sh`); tests skip,
//! saying why, where the device cannot be opened.

mod common;

use common::Ctx;
use compress::{Codec, ErrorFeedback};
use device::codec::{decode_status, workspace_bytes};
use device::{CodecOp, DeviceError, DevicePtr};

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn to_f32(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Gradient-like data with ties, zeros, tiny values and (dense codecs) a
/// NaN and infinities.
fn data(n: usize, seed: u64, special: bool) -> Vec<f32> {
    let mut rng = common::Rng::new(seed);
    (0..n)
        .map(|i| {
            let r = rng.next();
            let m = ((r >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
            match (i / 200) % 5 {
                0 => (m * 6.0).round() * 0.25,
                1 => m * 1e-32,
                2 if special && r.is_multiple_of(211) => {
                    [f32::NAN, f32::INFINITY, -f32::INFINITY][(r % 3) as usize]
                }
                _ => m * 100.0,
            }
        })
        .collect()
}

const SPECS: [&str; 13] = [
    "fp16",
    "bf16",
    "int8",
    "int8:7",
    "int8-sr",
    "int8-sr:300",
    "topk-exact:0.01",
    "topk-exact:0.25",
    "topk:0.01",
    "topk:0.001",
    "mxfp8",
    "mxfp8-e5m2",
    "mxfp4",
];

fn enqueue(ctx: &Ctx, op: &CodecOp<'_>) {
    // SAFETY: every test passes live buffers sized for the operation and
    // synchronises before reading or freeing them.
    unsafe { ctx.dev.codec(ctx.stream, op) }.expect("codec");
}

#[test]
fn encode_and_decode_match_the_cpu_codec() {
    let Some(ctx) = Ctx::new() else { return };
    for spec in SPECS {
        let codec = Codec::parse(spec).unwrap();
        let dense = !matches!(codec, Codec::TopK { .. });
        // 1.5 M elements: enough for sampled top-k to sample.
        for n in [0usize, 1, 7, 257, 1021, 100_003, 1_500_001] {
            let src = data(n, n as u64 + 5, dense);
            let seed = n as u64 * 31;
            let mut want = Vec::new();
            codec.encode_seeded(&src, seed, &mut want);
            // One element (4 bytes) off for the f32, 1 or 2 bytes off for
            // the encoding.
            let enc_off = if dense && matches!(codec, Codec::Fp16 | Codec::Bf16) {
                2
            } else {
                1
            };
            let s = ctx.buffer(4 * n + 4);
            let e = ctx.buffer(codec.max_encoded_len(n) + enc_off);
            let w = ctx.buffer(workspace_bytes(&codec, n));
            let out = ctx.buffer(4 * n + 4);
            ctx.upload(s.ptr().add(4), &f32_bytes(&src));
            enqueue(
                &ctx,
                &CodecOp::Encode {
                    codec: &codec,
                    src: s.ptr().add(4),
                    n,
                    dst: e.ptr().add(enc_off),
                    seed: Some(seed),
                    feedback: None,
                    workspace: w.ptr(),
                },
            );
            ctx.sync();
            let got = ctx.download(e.ptr().add(enc_off), want.len());
            assert!(
                got == want,
                "{spec} n={n}: encodings differ at byte {:?}",
                got.iter().zip(&want).position(|(a, b)| a != b)
            );

            // Decode, and decode-add onto data.
            let init = data(n, 77, false);
            for add in [false, true] {
                let mut host = init.clone();
                if add {
                    codec.decode_add(&want, n, &mut host).unwrap();
                } else {
                    codec.decode(&want, n, &mut host).unwrap();
                }
                ctx.upload(out.ptr().add(4), &f32_bytes(&init));
                enqueue(
                    &ctx,
                    &CodecOp::Decode {
                        codec: &codec,
                        srcs: &[e.ptr().add(enc_off)],
                        enc_len: want.len(),
                        n,
                        dst: out.ptr().add(4),
                        add,
                        workspace: w.ptr(),
                    },
                );
                ctx.sync();
                assert_eq!(
                    to_f32(&ctx.download(out.ptr().add(4), 4 * n)),
                    bits(&host),
                    "{spec} n={n} add={add}"
                );
            }
        }
    }
}

#[test]
fn error_feedback_residual_lives_on_the_device() {
    let Some(ctx) = Ctx::new() else { return };
    for spec in SPECS {
        let codec = Codec::parse(spec).unwrap();
        let n = 5003;
        let mut ef = ErrorFeedback::new(n);
        let g = ctx.buffer(4 * n);
        let r = ctx.buffer(4 * n);
        let e = ctx.buffer(codec.max_encoded_len(n));
        let w = ctx.buffer(workspace_bytes(&codec, n));
        ctx.upload(r.ptr(), &vec![0u8; 4 * n]);
        assert!(e.bytes() >= 4);
        for step in 0..3 {
            let grad = data(n, 500 + step, false);
            let mut host = grad.clone();
            let mut wire = Vec::new();
            ef.encode_with_feedback(&codec, &mut host, &mut wire);
            ctx.upload(g.ptr(), &f32_bytes(&grad));
            enqueue(
                &ctx,
                &CodecOp::Encode {
                    codec: &codec,
                    src: g.ptr(),
                    n,
                    dst: e.ptr(),
                    seed: None,
                    feedback: Some(r.ptr()),
                    workspace: w.ptr(),
                },
            );
            ctx.sync();
            assert_eq!(
                ctx.download(e.ptr(), wire.len()),
                wire,
                "{spec} step {step}"
            );
            assert_eq!(
                to_f32(&ctx.download(r.ptr(), 4 * n)),
                bits(ef.residual()),
                "{spec} step {step}"
            );
            assert_eq!(
                to_f32(&ctx.download(g.ptr(), 4 * n)),
                bits(&host),
                "{spec} step {step}"
            );
        }
    }
}

#[test]
fn fused_decode_sum_encode_and_multi_source_decode() {
    let Some(ctx) = Ctx::new() else { return };
    let n = 3001;
    for spec in ["fp16", "bf16", "int8:64"] {
        let codec = Codec::parse(spec).unwrap();
        let encs: Vec<Vec<u8>> = (0..3)
            .map(|r| {
                let mut v = Vec::new();
                codec.encode(&data(n, 40 + r, true), &mut v);
                v
            })
            .collect();
        let mut acc = vec![0f32; n];
        for x in &encs {
            codec.decode_add(x, n, &mut acc).unwrap();
        }
        let len = encs[0].len();
        let bufs: Vec<_> = encs
            .iter()
            .map(|x| {
                let b = ctx.buffer(len);
                ctx.upload(b.ptr(), x);
                b
            })
            .collect();
        let ptrs: Vec<DevicePtr> = bufs.iter().map(|b| b.ptr()).collect();
        let out = ctx.buffer(4 * n);
        let w = ctx.buffer(workspace_bytes(&codec, n).max(8));
        ctx.upload(out.ptr(), &vec![0u8; 4 * n]);
        enqueue(
            &ctx,
            &CodecOp::Decode {
                codec: &codec,
                srcs: &ptrs,
                enc_len: len,
                n,
                dst: out.ptr(),
                add: true,
                workspace: w.ptr(),
            },
        );
        ctx.sync();
        assert_eq!(
            to_f32(&ctx.download(out.ptr(), 4 * n)),
            bits(&acc),
            "{spec}"
        );
        if matches!(codec, Codec::Fp16 | Codec::Bf16) {
            let mut want = Vec::new();
            codec.encode(&acc, &mut want);
            let enc = ctx.buffer(2 * n);
            enqueue(
                &ctx,
                &CodecOp::DecodeSumEncode {
                    codec: &codec,
                    srcs: &ptrs,
                    n,
                    dst: enc.ptr(),
                    sum: Some(out.ptr()),
                },
            );
            ctx.sync();
            assert_eq!(ctx.download(enc.ptr(), 2 * n), want, "{spec} fused");
            assert_eq!(
                to_f32(&ctx.download(out.ptr(), 4 * n)),
                bits(&acc),
                "{spec} fused sum"
            );
        }
    }
}

#[test]
fn corrupt_topk_sets_the_status_and_leaves_the_output() {
    let Some(ctx) = Ctx::new() else { return };
    let codec = Codec::parse("topk-exact:0.1").unwrap();
    let n = 1000;
    let mut enc = Vec::new();
    codec.encode(&data(n, 9, false), &mut enc);
    enc[4..8].copy_from_slice(&(n as u32 + 3).to_le_bytes());
    let e = ctx.buffer(enc.len());
    let out = ctx.buffer(4 * n);
    let w = ctx.buffer(workspace_bytes(&codec, n));
    let init = f32_bytes(&data(n, 1, false));
    ctx.upload(e.ptr(), &enc);
    ctx.upload(out.ptr(), &init);
    enqueue(
        &ctx,
        &CodecOp::Decode {
            codec: &codec,
            srcs: &[e.ptr()],
            enc_len: enc.len(),
            n,
            dst: out.ptr(),
            add: false,
            workspace: w.ptr(),
        },
    );
    ctx.sync();
    let status = u32::from_le_bytes(ctx.download(w.ptr(), 4).try_into().unwrap());
    assert!(
        decode_status(status).is_some_and(|s| s.contains("range")),
        "status {status}"
    );
    assert_eq!(ctx.download(out.ptr(), 4 * n), init);
}

#[test]
fn bad_codec_arguments_are_errors() {
    let Some(ctx) = Ctx::new() else { return };
    let b = ctx.buffer(4096);
    let topk = Codec::parse("topk:0.1").unwrap();
    let fp16 = Codec::Fp16;
    let int8 = Codec::parse("int8").unwrap();
    let one = [b.ptr()];
    let two = [b.ptr(), b.ptr()];
    let encode = |codec, src: DevicePtr, n, dst: DevicePtr| CodecOp::Encode {
        codec,
        src,
        n,
        dst,
        seed: None,
        feedback: None,
        workspace: b.ptr(),
    };
    let cases: Vec<(CodecOp<'_>, &str)> = vec![
        (
            CodecOp::Decode {
                codec: &topk,
                srcs: &two,
                enc_len: 12,
                n: 10,
                dst: b.ptr(),
                add: false,
                workspace: b.ptr(),
            },
            "two top-k sources",
        ),
        (
            encode(&fp16, b.ptr().add(2), 10, b.ptr().add(400)),
            "misaligned f32",
        ),
        (
            encode(&fp16, b.ptr(), 10, b.ptr().add(401)),
            "misaligned fp16",
        ),
        (
            CodecOp::Decode {
                codec: &int8,
                srcs: &one,
                enc_len: 10,
                n: 100,
                dst: b.ptr(),
                add: false,
                workspace: b.ptr(),
            },
            "wrong length",
        ),
        (
            CodecOp::Decode {
                codec: &fp16,
                srcs: &[],
                enc_len: 20,
                n: 10,
                dst: b.ptr(),
                add: false,
                workspace: b.ptr(),
            },
            "no source",
        ),
        (
            CodecOp::DecodeSumEncode {
                codec: &int8,
                srcs: &one,
                n: 10,
                dst: b.ptr(),
                sum: None,
            },
            "fused int8",
        ),
    ];
    for (op, what) in cases {
        // SAFETY: every case is refused before anything is enqueued.
        let r = unsafe { ctx.dev.codec(ctx.stream, &op) };
        assert!(
            matches!(
                r,
                Err(DeviceError::InvalidArgument { .. } | DeviceError::Unsupported { .. })
            ),
            "{what}: {r:?}"
        );
    }
    if ctx.is_emu() {
        // Past the end of the allocation: the emulator sees it.
        // SAFETY: refused before anything is enqueued.
        let r = unsafe {
            ctx.dev
                .codec(ctx.stream, &encode(&fp16, b.ptr(), 2000, b.ptr()))
        };
        assert!(
            matches!(r, Err(DeviceError::InvalidArgument { .. })),
            "{r:?}"
        );
    }
    ctx.sync();
}
