//! The compressed all-reduce's cross-node exchange over TCP gives bit for
//! bit the result of its arithmetic (computed here independently: every
//! owner sums the decoded parts in rank order, re-encodes, and every rank
//! decodes the same bytes), on 2..=4 ranks, with pieces larger than the TCP
//! bounce buffer configured (the transport caps them). Any change to how
//! the exchange is scheduled or paced must keep this passing.

use comm_core::config::TransportChoice;
use sncl::{Codec, Communicator, CompressScope, Config, ReduceOp};

fn input(r: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((((i * 7919 + r * 104_729) % 2003) as f32) - 1001.0) * 0.0173)
        .collect()
}

/// `codec`'s encoding of `x` zero-padded to `codec.max_encoded_len(x.len())`,
/// as the all-reduce lays parts out.
fn encoded(codec: &Codec, x: &[f32]) -> Vec<u8> {
    let mut tmp = Vec::new();
    codec.encode(x, &mut tmp);
    let mut out = vec![0u8; codec.max_encoded_len(x.len())];
    out[..tmp.len()].copy_from_slice(&tmp);
    out
}

/// The flat compressed all-reduce (sum, no error feedback) of `inputs`.
fn reference(codec: &Codec, inputs: &[Vec<f32>]) -> Vec<f32> {
    let n = inputs.len();
    let len = inputs[0].len();
    if n == 1 {
        return inputs[0].clone();
    }
    let mut out = vec![0f32; len];
    if let Codec::TopK { .. } = codec {
        for x in inputs {
            let mut enc = Vec::new();
            codec.encode(x, &mut enc);
            codec.decode_add(&enc, len, &mut out).unwrap();
        }
        return out;
    }
    let part = len.div_ceil(n);
    for j in 0..n {
        let b = (j * part).min(len)..((j + 1) * part).min(len);
        let mut acc = vec![0f32; b.len()];
        for x in inputs {
            codec
                .decode_add(&encoded(codec, &x[b.clone()]), b.len(), &mut acc)
                .unwrap();
        }
        let m = b.len();
        codec.decode(&encoded(codec, &acc), m, &mut out[b]).unwrap();
    }
    out
}

#[test]
fn compressed_exchange_over_tcp_with_capped_pieces_is_bit_identical() {
    let len = 1_000_003;
    for n in 2..=4 {
        let cfg = Config {
            transport: TransportChoice::Tcp,
            // Above the bounce buffer: the transport caps pieces to it.
            tcp: sncl::TcpSettings {
                piece_bytes: 1 << 20,
                ..Default::default()
            },
            ..Config::default()
        };
        let comms = Communicator::init_threads(n, cfg).unwrap();
        for name in ["fp16", "int8", "topk:0.01"] {
            let codec = Codec::parse(name).unwrap();
            let inputs: Vec<Vec<f32>> = (0..n).map(|r| input(r, len)).collect();
            let want = reference(&codec, &inputs);
            let got: Vec<Vec<f32>> = std::thread::scope(|s| {
                let hs: Vec<_> = comms
                    .iter()
                    .map(|c| {
                        let codec = &codec;
                        s.spawn(move || {
                            let mut buf = input(c.rank(), len);
                            c.all_reduce_compressed(
                                &mut buf,
                                ReduceOp::Sum,
                                codec,
                                None,
                                CompressScope::Flat,
                            )
                            .map(|()| buf)
                        })
                    })
                    .collect();
                hs.into_iter()
                    .map(|h| h.join().expect("rank thread panicked").unwrap())
                    .collect()
            });
            for (r, g) in got.iter().enumerate() {
                let first_diff = g
                    .iter()
                    .zip(&want)
                    .position(|(a, b)| a.to_bits() != b.to_bits());
                assert!(
                    first_diff.is_none(),
                    "{name} on {n} ranks, rank {r}: element {:?} differs from the reference",
                    first_diff.map(|i| (i, g[i], want[i]))
                );
            }
        }
    }
}
