//! Device collectives in segments: an operation larger than the staging a
//! binding allocated at bind ([`super::memory::Staging`], `SNCL_DEVICE_STAGING_BYTES`
//! per buffer) runs as consecutive sub-operations over element ranges of
//! its per-rank blocks, each small enough that every algorithm's scratch,
//! step sends and pieces fit the staging (`comm-core/tests/staging_needs.rs`
//! bounds each by the footprint: the larger of the send and receive
//! extents). So nothing is allocated inside an operation, as NCCL's fixed
//! FIFOs loop over chunks.
//!
//! A side whose extent is one block (`count` elements) is addressed in
//! place at the segment's offset; a side of `nranks` blocks (all_gather's
//! and gather's receive, reduce_scatter's and scatter's send, both of
//! alltoall's) is strided: its blocks' ranges are copied on the stream into
//! a contiguous segment buffer before the segment runs (send) or out of it
//! after (receive). Every rank cuts the same segments: the cut depends only
//! on the collective, count, dtype, rank count and the shared setting.
//! Point-to-point groups are cut per peer stream instead ([`P2pSegments`]).

use comm_core::wire::Collective;

use ::device::DevicePtr;

/// How one side (send or receive) of an operation is laid out on this rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// Not used on this rank (e.g. gather's receive off the root).
    Unused,
    /// One block of `count` elements.
    Block,
    /// `nranks` blocks of `count` elements, block r at `r × count`.
    Blocks,
}

/// An operation's cut into segments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segments {
    count: usize,
    parts: usize,
    nranks: usize,
    esize: usize,
    send: Side,
    recv: Side,
}

/// Whether `coll` has a side of `nranks` blocks (on some rank).
fn strided(coll: Collective) -> (bool, bool) {
    match coll {
        Collective::ReduceScatter | Collective::Scatter => (true, false),
        Collective::AllGather | Collective::Gather => (false, true),
        Collective::AllToAll => (true, true),
        _ => (false, false),
    }
}

impl Segments {
    /// Cuts an operation of `count` elements per block of `esize` bytes
    /// over `nranks` ranks, which reads `send_elems` and writes
    /// `recv_elems` on this rank, into segments whose footprint is at most
    /// `staging_bytes`. Every rank gets the same cut (the footprint bound
    /// counts `nranks` blocks for every collective that has such a side on
    /// any rank). Err: a detail for an `InvalidArgument` (one element per
    /// block does not fit).
    pub fn cut(
        coll: Collective,
        (count, esize, nranks): (usize, usize, usize),
        (send_elems, recv_elems): (usize, usize),
        staging_bytes: usize,
    ) -> Result<Segments, String> {
        let (send_strided, recv_strided) = strided(coll);
        let side = |elems: usize, strided: bool| match (elems, strided) {
            (0, _) => Side::Unused,
            (_, true) if nranks > 1 => Side::Blocks,
            _ => Side::Block,
        };
        let blocks = if send_strided || recv_strided {
            nranks
        } else {
            1
        };
        let per_segment = staging_bytes / blocks.saturating_mul(esize).max(1);
        if per_segment == 0 {
            return Err(format!(
                "{} ranks × {esize}-byte elements do not fit the {staging_bytes}-byte device \
                 staging even one element per rank; raise SNCL_DEVICE_STAGING_BYTES",
                nranks
            ));
        }
        Ok(Segments {
            count,
            parts: count.div_ceil(per_segment).max(1),
            nranks,
            esize,
            send: side(send_elems, send_strided),
            recv: side(recv_elems, recv_strided),
        })
    }

    /// How many segments.
    pub fn len(&self) -> usize {
        self.parts
    }

    /// Whether there are no segments (never: an empty operation is one
    /// empty segment).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Segment `i`: (first element in each block, elements per block).
    pub fn bounds(&self, i: usize) -> (usize, usize) {
        comm_core::schedule::chunk_bounds(self.count, self.parts, i)
    }

    /// Segment `i`'s send and receive addresses, given the caller's
    /// buffers and the staging's segment buffers: in place for a whole
    /// operation (one segment) and for one-block sides; the segment buffer
    /// for strided sides.
    pub fn buffers(
        &self,
        i: usize,
        (send, recv): (DevicePtr, DevicePtr),
        (segment_send, segment_recv): (DevicePtr, DevicePtr),
    ) -> (DevicePtr, DevicePtr) {
        if self.parts == 1 {
            return (send, recv);
        }
        let offset = self.bounds(i).0 * self.esize;
        let at = |side: Side, base: DevicePtr, segment: DevicePtr| match side {
            Side::Unused => base,
            Side::Block => base.add(offset),
            Side::Blocks => segment,
        };
        (
            at(self.send, send, segment_send),
            at(self.recv, recv, segment_recv),
        )
    }

    /// The copies (destination, source, bytes) that gather segment `i`'s
    /// send blocks into the send segment buffer before it runs.
    pub fn gather_sends(
        &self,
        i: usize,
        send: DevicePtr,
        segment_send: DevicePtr,
    ) -> Vec<(DevicePtr, DevicePtr, usize)> {
        self.block_copies(i, self.send)
            .map(|(caller, segment, bytes)| (segment_send.add(segment), send.add(caller), bytes))
            .collect()
    }

    /// The copies (destination, source, bytes) that scatter segment `i`'s
    /// receive blocks from the receive segment buffer after it ran.
    pub fn scatter_recvs(
        &self,
        i: usize,
        recv: DevicePtr,
        segment_recv: DevicePtr,
    ) -> Vec<(DevicePtr, DevicePtr, usize)> {
        self.block_copies(i, self.recv)
            .map(|(caller, segment, bytes)| (recv.add(caller), segment_recv.add(segment), bytes))
            .collect()
    }

    /// For a strided side of a cut operation: per block, (byte offset in
    /// the caller's buffer, byte offset in the segment buffer, bytes).
    fn block_copies(&self, i: usize, side: Side) -> impl Iterator<Item = (usize, usize, usize)> {
        let (first, len) = self.bounds(i);
        let blocks = if self.parts > 1 && side == Side::Blocks && len > 0 {
            self.nranks
        } else {
            0
        };
        let (count, esize) = (self.count, self.esize);
        (0..blocks).map(move |r| ((r * count + first) * esize, r * len * esize, len * esize))
    }
}

/// A point-to-point group in segments. The transfers to one peer (and,
/// apart, those from one peer) form one stream of bytes in group order,
/// cut into parts of [`P2pSegments::part_bytes`]: segment i moves bytes
/// `i × part .. (i + 1) × part` of every stream, split at its buffers'
/// boundaries. Both ends of a stream hold the same transfers in the same
/// order (the k-th send to a peer meets its k-th receive from this rank),
/// so they cut alike whatever else their groups hold; a rank ahead in its
/// segments has finished every part a rank behind still waits for, so the
/// segments cannot deadlock. A segment's sends stay within `part` per peer,
/// its pieces within `part`: nothing outgrows the staging. Transfers to
/// this rank itself are not cut (they are copies, done apart).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct P2pSegments {
    segments: Vec<Vec<P2pPart>>,
}

/// A transfer's part in a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct P2pPart {
    /// The transfer's index in the group.
    pub transfer: usize,
    /// First byte of the part in the transfer's buffer.
    pub offset: usize,
    /// Its length in bytes.
    pub bytes: usize,
}

/// One transfer of a group as the cut sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct P2pTransfer {
    /// The other rank.
    pub peer: usize,
    /// A send (else a receive).
    pub is_send: bool,
    /// Its length in bytes.
    pub bytes: usize,
}

impl P2pSegments {
    /// The bytes per stream and segment for `nranks` ranks and
    /// `staging_bytes` of staging per buffer: a segment's sends (one part
    /// per peer) fit the send staging. A whole number of 256-byte units;
    /// at least 1 byte.
    pub fn part_bytes(staging_bytes: usize, nranks: usize) -> usize {
        let per_peer = staging_bytes / nranks.max(1);
        if per_peer >= 256 {
            per_peer / 256 * 256
        } else {
            per_peer.max(1)
        }
    }

    /// Cuts `transfers` (none to this rank itself) into parts of `part`
    /// bytes (> 0). An empty transfer goes into the segment holding its
    /// place in its stream (the last one where it ends the stream), so its
    /// partner's lands in the same one.
    pub fn cut(transfers: &[P2pTransfer], part: usize) -> P2pSegments {
        let part = part.max(1);
        // (peer, is_send) -> bytes of the stream so far; then its total.
        let mut streams: Vec<((usize, bool), usize)> = Vec::new();
        let mut starts = Vec::with_capacity(transfers.len());
        for t in transfers {
            let key = (t.peer, t.is_send);
            let at = match streams.iter_mut().find(|(k, _)| *k == key) {
                Some((_, total)) => {
                    let at = *total;
                    *total += t.bytes;
                    at
                }
                None => {
                    streams.push((key, t.bytes));
                    0
                }
            };
            starts.push(at);
        }
        let segments_of = |key: (usize, bool)| {
            let total = streams.iter().find(|(k, _)| *k == key).map_or(0, |s| s.1);
            total.div_ceil(part).max(1)
        };
        let count = streams
            .iter()
            .map(|(k, _)| segments_of(*k))
            .max()
            .unwrap_or(0);
        let mut segments = vec![Vec::new(); count];
        for (j, (t, &at)) in transfers.iter().zip(&starts).enumerate() {
            if t.bytes == 0 {
                let i = (at / part).min(segments_of((t.peer, t.is_send)) - 1);
                segments[i].push(P2pPart {
                    transfer: j,
                    offset: 0,
                    bytes: 0,
                });
                continue;
            }
            for (i, segment) in segments
                .iter_mut()
                .enumerate()
                .take((at + t.bytes - 1) / part + 1)
                .skip(at / part)
            {
                let lo = at.max(i * part);
                let hi = (at + t.bytes).min((i + 1) * part);
                segment.push(P2pPart {
                    transfer: j,
                    offset: lo - at,
                    bytes: hi - lo,
                });
            }
        }
        P2pSegments { segments }
    }

    /// The segments, each its parts in group order.
    pub fn segments(&self) -> &[Vec<P2pPart>] {
        &self.segments
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(peer: usize, bytes: usize) -> P2pTransfer {
        P2pTransfer {
            peer,
            is_send: true,
            bytes,
        }
    }

    fn recv(peer: usize, bytes: usize) -> P2pTransfer {
        P2pTransfer {
            peer,
            is_send: false,
            bytes,
        }
    }

    fn part(transfer: usize, offset: usize, bytes: usize) -> P2pPart {
        P2pPart {
            transfer,
            offset,
            bytes,
        }
    }

    #[test]
    fn p2p_streams_are_cut_at_the_same_bytes_on_both_ends() {
        // Rank 0 sends 300 then 0 then 500 bytes to rank 1 and receives
        // 100 from rank 2; rank 1 receives the two from rank 0 amid an
        // unrelated send to rank 2. Parts of 256 bytes.
        let a = P2pSegments::cut(&[send(1, 300), send(1, 0), recv(2, 100), send(1, 500)], 256);
        let b = P2pSegments::cut(
            &[recv(0, 300), send(2, 2000), recv(0, 0), recv(0, 500)],
            256,
        );
        let of = |s: &P2pSegments, transfers: &[usize]| -> Vec<Vec<(usize, usize)>> {
            s.segments()
                .iter()
                .map(|seg| {
                    seg.iter()
                        .filter(|p| transfers.contains(&p.transfer))
                        .map(|p| (p.offset, p.bytes))
                        .collect()
                })
                .collect()
        };
        // Stream 0 -> 1 (800 bytes): 4 segments on both ends, alike.
        let want = vec![
            vec![(0, 256)],
            vec![(256, 44), (0, 0), (0, 212)],
            vec![(212, 256)],
            vec![(468, 32)],
        ];
        assert_eq!(of(&a, &[0, 1, 3]), want);
        assert_eq!(of(&b, &[0, 2, 3])[..4], want[..]);
        // Rank 1's 2000-byte send runs 8 segments; rank 0 only 4.
        assert_eq!((a.segments().len(), b.segments().len()), (4, 8));
        assert_eq!(a.segments()[0], vec![part(0, 0, 256), part(2, 0, 100)]);
    }

    #[test]
    fn p2p_empty_transfers_and_groups() {
        assert!(P2pSegments::cut(&[], 256).segments().is_empty());
        // Only empty transfers: one segment that moves nothing.
        let e = P2pSegments::cut(&[send(1, 0), recv(1, 0)], 256);
        assert_eq!(e.segments(), &[vec![part(0, 0, 0), part(1, 0, 0)]]);
        // An empty transfer that ends a stream of exactly two parts sits
        // in the second.
        let s = P2pSegments::cut(&[send(1, 512), send(1, 0)], 256);
        assert_eq!(s.segments()[1], vec![part(0, 256, 256), part(1, 0, 0)]);
    }

    #[test]
    fn p2p_part_bytes_keep_a_segment_within_the_staging() {
        assert_eq!(P2pSegments::part_bytes(1 << 20, 8), 131072);
        assert_eq!(P2pSegments::part_bytes(1000, 3), 256);
        assert_eq!(P2pSegments::part_bytes(100, 3), 33);
        assert_eq!(P2pSegments::part_bytes(0, 3), 1);
        for (staging, n) in [(4096, 7), (65536, 5), (1 << 20, 3)] {
            assert!(P2pSegments::part_bytes(staging, n) * (n - 1) <= staging);
        }
    }

    #[test]
    fn one_segment_uses_the_callers_buffers() {
        let s =
            Segments::cut(Collective::AllGather, (1000, 4, 4), (1000, 4000), 1 << 20).expect("cut");
        assert_eq!(s.len(), 1);
        let caller = (DevicePtr(0x1000), DevicePtr(0x9000));
        let seg = (DevicePtr(0x100000), DevicePtr(0x200000));
        assert_eq!(s.buffers(0, caller, seg), caller);
        assert!(s.scatter_recvs(0, caller.1, seg.1).is_empty());
    }

    #[test]
    fn strided_sides_go_through_the_segment_buffers() {
        // 4 ranks × 1000 floats = 16000 bytes; 4096 bytes per segment fit
        // 256 elements per block: 4 segments of 250.
        let s = Segments::cut(Collective::AllToAll, (1000, 4, 4), (4000, 4000), 4096).expect("cut");
        assert_eq!(s.len(), 4);
        assert_eq!(s.bounds(1), (250, 250));
        let caller = (DevicePtr(0x1000), DevicePtr(0x9000));
        let seg = (DevicePtr(0x100000), DevicePtr(0x200000));
        assert_eq!(s.buffers(1, caller, seg), seg);
        let gathers = s.gather_sends(1, caller.0, seg.0);
        assert_eq!(gathers.len(), 4);
        // Block 2's elements 250..500 go to the segment's third block.
        assert_eq!(
            gathers[2],
            (
                seg.0.add(2 * 250 * 4),
                caller.0.add((2 * 1000 + 250) * 4),
                1000
            )
        );
        let scatters = s.scatter_recvs(3, caller.1, seg.1);
        assert_eq!(
            scatters[1],
            (caller.1.add((1000 + 750) * 4), seg.1.add(250 * 4), 1000)
        );
    }

    #[test]
    fn one_block_sides_are_addressed_in_place() {
        let s = Segments::cut(Collective::ReduceScatter, (1000, 4, 4), (4000, 1000), 4096)
            .expect("cut");
        let caller = (DevicePtr(0x1000), DevicePtr(0x9000));
        let seg = (DevicePtr(0x100000), DevicePtr(0x200000));
        assert_eq!(s.buffers(2, caller, seg), (seg.0, caller.1.add(500 * 4)));
        assert!(s.scatter_recvs(2, caller.1, seg.1).is_empty());
        // all_reduce: 4096 bytes hold 1024 floats: 1 segment per 1024.
        let a =
            Segments::cut(Collective::AllReduce, (3000, 4, 4), (3000, 3000), 4096).expect("cut");
        assert_eq!(a.len(), 3);
        assert_eq!(
            a.buffers(2, caller, seg),
            (caller.0.add(2000 * 4), caller.1.add(2000 * 4))
        );
    }

    #[test]
    fn every_rank_cuts_alike_and_off_root_sides_are_unused() {
        let root =
            Segments::cut(Collective::Gather, (1000, 4, 4), (1000, 4000), 4096).expect("root");
        let other =
            Segments::cut(Collective::Gather, (1000, 4, 4), (1000, 0), 4096).expect("other");
        assert_eq!(root.len(), other.len());
        assert_eq!(other.recv, Side::Unused);
        let caller = (DevicePtr(0x1000), DevicePtr(0));
        let seg = (DevicePtr(0x100000), DevicePtr(0x200000));
        assert_eq!(
            other.buffers(1, caller, seg),
            (caller.0.add(250 * 4), DevicePtr(0))
        );
        // A zero count is one empty segment.
        let z = Segments::cut(Collective::AllReduce, (0, 4, 4), (0, 0), 4096).expect("cut");
        assert_eq!((z.len(), z.bounds(0)), (1, (0, 0)));
    }

    #[test]
    fn too_many_ranks_for_the_staging_is_an_error() {
        let e = Segments::cut(
            Collective::AllGather,
            (10, 8, 100_000),
            (10, 1_000_000),
            65536,
        )
        .expect_err("does not fit");
        assert!(e.contains("SNCL_DEVICE_STAGING_BYTES"), "{e}");
    }
}
