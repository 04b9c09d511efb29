//! The dense codecs' cross-node exchange, pipelined.
//!
//! Part j of every rank's data goes to rank j (the owner), which sums the
//! decoded parts in f32 in rank order, re-encodes its reduced part, and
//! every rank decodes those same bytes (as ZeRO++'s qgZ does). Each part is
//! cut into sub-chunks at multiples of the codec's block, so encoding a
//! sub-chunk gives the values encoding the whole part would, and the
//! exchange runs in rounds: round `s` carries sub-chunk `s` of the first
//! phase (parts to owners) and the owners' reduced sub-chunk `s − 2` of the
//! second phase (owners to all), one message per peer. While a round is on
//! the wire (a scoped thread posts it), this thread encodes the next
//! round's sub-chunks, sums and re-encodes what the previous round
//! brought, and decodes the reduced sub-chunks that arrived, so the
//! codec's work hides behind the link instead of adding to it. The result
//! is bit for bit the unpipelined exchange's (tests/tcp_pacing.rs).

use std::ops::Range;

use compress::{Codec, ErrorFeedback};

use super::exchange::{bytes_err, exchange};
use crate::{Communicator, Result};

/// Elements of one part a round carries at most (512 KiB of f32): large
/// enough that a round's latency is small next to its bytes on a slow
/// link, small enough that 16 MiB all-reduces run several rounds.
const ROUND_ELEMS: usize = 128 << 10;
/// Most rounds of the first phase.
const MAX_ROUNDS: usize = 16;

/// How the parts of `len` elements over `n` ranks are cut.
struct Cuts {
    len: usize,
    part: usize,
    /// Elements of a sub-chunk (the last of a part may be shorter).
    sub: usize,
    /// Sub-chunks per part (rounds of the first phase).
    rounds: usize,
}

impl Cuts {
    fn new(codec: &Codec, len: usize, n: usize) -> Cuts {
        let part = len.div_ceil(n);
        // Stochastic int8 draws its random numbers by position in the
        // encoded slice: only whole parts give the unpipelined values.
        let align = match *codec {
            Codec::Int8 {
                stochastic: true, ..
            } => part.max(1),
            Codec::Int8 { block, .. } => block.max(1),
            // Whole MX blocks (a part's last block may be shorter).
            Codec::Mx { .. } => compress::MX_BLOCK,
            _ => 1,
        };
        let want = part.div_ceil(ROUND_ELEMS).clamp(1, MAX_ROUNDS);
        let sub = part
            .div_ceil(want)
            .div_ceil(align)
            .saturating_mul(align)
            .max(1);
        let rounds = part.div_ceil(sub).max(1);
        Cuts {
            len,
            part,
            sub,
            rounds,
        }
    }

    /// Elements of sub-chunk `s` of part `j`.
    fn range(&self, j: usize, s: usize) -> Range<usize> {
        let part_end = ((j + 1) * self.part).min(self.len);
        let lo = (j * self.part + s * self.sub).min(part_end);
        lo..(lo + self.sub).min(part_end)
    }
}

/// A round's exchange: on its own thread while this one works, or done.
enum Posted<'s> {
    Running(std::thread::ScopedJoinHandle<'s, Result<()>>),
    Done(Result<()>),
}

/// One round's message layout: the first phase's bytes (`first` per peer),
/// then the second phase's (`second`).
#[derive(Clone, Copy)]
struct Layout {
    first: usize,
    second: usize,
}

impl Layout {
    fn block(&self) -> usize {
        self.first + self.second
    }
}

/// Sums `data` over `comm` moving only `codec`-encoded bytes; `ef`
/// compensates the input and keeps what encoding it dropped.
pub(super) fn exchange_dense(
    comm: &Communicator,
    data: &mut [f32],
    codec: &Codec,
    mut ef: Option<&mut ErrorFeedback>,
) -> Result<()> {
    let n = comm.size();
    let me = comm.rank();
    let cuts = Cuts::new(codec, data.len(), n);
    let sub_bytes = codec.max_encoded_len(cuts.sub);
    let layout = |s: usize| Layout {
        first: if s < cuts.rounds { sub_bytes } else { 0 },
        second: if (2..cuts.rounds + 2).contains(&s) {
            sub_bytes
        } else {
            0
        },
    };
    if let Some(f) = ef.as_deref_mut() {
        f.compensate(data);
    }
    let mut tmp = Vec::new();
    let mut decoded = Vec::new();
    // Round 0's first phase; then each round's while the one before runs.
    let mut send = vec![0u8; n * layout(0).block()];
    encode_first(
        codec,
        &cuts,
        data,
        0,
        layout(0),
        &mut send,
        &mut ef,
        &mut tmp,
        &mut decoded,
    );
    let mut prev_recv: Option<Vec<u8>> = None;
    let mut acc = Vec::new();
    for s in 0..cuts.rounds + 2 {
        let lay = layout(s);
        let mut recv = vec![0u8; n * lay.block()];
        let next = layout(s + 1);
        let mut send_next = vec![0u8; n * next.block()];
        // Work to overlap with round s: encode round s + 1's first phase,
        // reduce what round s − 1 brought (its second phase goes out in
        // round s + 1), decode round s − 1's second phase.
        let encodes = s + 1 < cuts.rounds;
        let reduces = (1..=cuts.rounds).contains(&s);
        let decodes = s >= 3;
        let overlap = lay.block() > 0 && (encodes || reduces || decodes);
        let (posted, work) = std::thread::scope(|sc| {
            let (send, recv) = (&send, &mut recv);
            let block = lay.block();
            let posted = if overlap {
                Posted::Running(sc.spawn(move || exchange(comm, send, recv, block)))
            } else {
                Posted::Done(exchange(comm, send, recv, block))
            };
            let work = (|| -> Result<()> {
                if encodes {
                    encode_first(
                        codec,
                        &cuts,
                        data,
                        s + 1,
                        next,
                        &mut send_next,
                        &mut ef,
                        &mut tmp,
                        &mut decoded,
                    );
                }
                let prev = prev_recv.as_deref().unwrap_or_default();
                if reduces {
                    // The owner's reduced sub-chunk s − 1, to everyone.
                    let mine = cuts.range(me, s - 1);
                    reduce_sub(comm, codec, prev, layout(s - 1), mine.len(), &mut acc)?;
                    codec.encode(&acc, &mut tmp);
                    for j in 0..n {
                        let at = j * next.block() + next.first;
                        send_next[at..at + tmp.len()].copy_from_slice(&tmp);
                    }
                }
                if decodes {
                    decode_second(comm, codec, &cuts, prev, layout(s - 1), s - 3, data)?;
                }
                Ok(())
            })();
            let posted = match posted {
                Posted::Running(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
                Posted::Done(r) => r,
            };
            (posted, work)
        });
        posted?;
        work?;
        prev_recv = Some(recv);
        send = send_next;
    }
    // The last round's second phase (sub-chunk rounds − 1).
    if let Some(prev) = prev_recv.as_deref() {
        let s = cuts.rounds + 1;
        decode_second(comm, codec, &cuts, prev, layout(s), s - 2, data)?;
    }
    Ok(())
}

/// Encodes sub-chunk `s` of every part into the first-phase slots of
/// `send`; with error feedback, the residual of those elements becomes
/// what decoding the same bytes gives back short of the compensated data.
#[allow(clippy::too_many_arguments)]
fn encode_first(
    codec: &Codec,
    cuts: &Cuts,
    data: &[f32],
    s: usize,
    lay: Layout,
    send: &mut [u8],
    ef: &mut Option<&mut ErrorFeedback>,
    tmp: &mut Vec<u8>,
    decoded: &mut Vec<f32>,
) {
    let n = send.len() / lay.block().max(1);
    for j in 0..n {
        let r = cuts.range(j, s);
        codec.encode(&data[r.clone()], tmp);
        let at = j * lay.block();
        send[at..at + tmp.len()].copy_from_slice(tmp);
        if let Some(f) = ef.as_deref_mut() {
            decoded.resize(r.len(), 0.0);
            codec
                .decode(tmp, r.len(), decoded)
                .expect("a codec decodes its own encoding");
            f.update_range(r.start, &data[r], decoded);
        }
    }
}

/// `acc` = the sum, in rank order, of the decoded first-phase slots of
/// `recv` (this rank's sub-chunk of `m` elements from every rank).
fn reduce_sub(
    comm: &Communicator,
    codec: &Codec,
    recv: &[u8],
    lay: Layout,
    m: usize,
    acc: &mut Vec<f32>,
) -> Result<()> {
    acc.clear();
    acc.resize(m, 0.0);
    let enc_len = codec.max_encoded_len(m);
    for r in 0..comm.size() {
        let at = r * lay.block();
        codec
            .decode_add(&recv[at..at + enc_len], m, acc)
            .map_err(|e| bytes_err(comm, e))?;
    }
    Ok(())
}

/// Decodes the second-phase slots of `recv` (every owner's reduced
/// sub-chunk `s`) into `data`.
fn decode_second(
    comm: &Communicator,
    codec: &Codec,
    cuts: &Cuts,
    recv: &[u8],
    lay: Layout,
    s: usize,
    data: &mut [f32],
) -> Result<()> {
    for j in 0..comm.size() {
        let r = cuts.range(j, s);
        let m = r.len();
        let at = j * lay.block() + lay.first;
        codec
            .decode(&recv[at..at + codec.max_encoded_len(m)], m, &mut data[r])
            .map_err(|e| bytes_err(comm, e))?;
    }
    Ok(())
}
