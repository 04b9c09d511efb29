//! Pieces: sending a region piece by piece, receiving and checking each
//! piece's header (communicator, sequence number, the fingerprint once per
//! message) and using its payload where the transport holds it — host
//! pieces written or reduced straight from the receive slot, their CRC32C
//! verified in the same pass; device pieces from the device inbox
//! ([`super::device`]). One loop for both: the connection's
//! [`Space`] decides which payloads it posts and is handed.

use super::context::{in_op, peer_failed, OpContext, OpState};
use super::device::{device_region, route, use_device_piece};
use crate::error::{Error, Result};
use crate::mem::Memory;
use crate::schedule::Region;
use crate::transport::{Connection, Outgoing, Payload, Space, TransportError};
use crate::wire::PieceHeader;

/// Completes a connection's posted pieces (buffered host bytes, lent
/// pieces, device copies); `Ok(true)` when nothing is left.
pub(super) fn flush(ctx: &OpContext, c: &mut dyn Connection) -> Result<bool> {
    c.flush().map_err(|e| in_op(ctx, e))
}

/// The header of a piece of `len` bytes; the `first` piece of a message
/// carries the operation's fingerprint, the pieces after it a short
/// header. A host piece of an operation that checksums pieces asks for a
/// CRC32C, which the transport computes in the pass that copies the
/// payload (see [`PieceHeader::checksum`]); device pieces carry none
/// (their bytes never cross host memory; `SNCL_CHECKSUM` covers what does).
fn header(ctx: &OpContext, first: bool, len: usize, checksum: bool) -> PieceHeader {
    PieceHeader {
        checksum: checksum.then_some(0),
        comm_id: ctx.comm_id,
        seq: ctx.seq,
        fingerprint: first.then_some(ctx.fingerprint),
        len: len as u32,
    }
}

/// Uses a received piece (bytes `at..at + data.len()` of a message of
/// `total` bytes from `peer`): writes it at `dst` (`local` is `None`) or
/// reduces it with `local` into `dst`, verifying its checksum in the same
/// pass. Host memory is written [`CHECKSUM_BLOCK`](crate::wire::CHECKSUM_BLOCK)
/// bytes at a time, each block checksummed just before it is used, so the
/// piece is read once; on a mismatch the piece has been written (the
/// operation fails and its output is undefined, as after any error).
/// Memory the host cannot write directly (device memory, staged) is
/// verified first. A mismatch, or a missing checksum where this rank
/// expects one, is corrupt data from that peer.
#[allow(clippy::too_many_arguments)]
fn use_piece<M: Memory>(
    ctx: &OpContext,
    bufs: &M,
    peer: usize,
    h: &PieceHeader,
    data: &[u8],
    (local, dst): (Option<Region>, Region),
    (at, total): (usize, usize),
) -> Result<()> {
    let esize = ctx.dtype.size();
    let put = |off: usize, part: &[u8]| match local {
        None => bufs.write_at(dst, esize, at + off, part),
        Some(l) => bufs.reduce_at(l, dst, esize, at + off, part, ctx.dtype, ctx.op),
    };
    let corrupt = |detail: String| peer_failed(ctx, TransportError::Corrupt { peer, detail });
    let want = match h.checksum {
        Some(want) => want,
        None if ctx.checksum => {
            return Err(corrupt(format!(
                "{} (seq {}): the piece at bytes {at}.. of {total} carries no checksum and \
                 SNCL_CHECKSUM=1 here (ranks must agree on SNCL_CHECKSUM)",
                ctx.fingerprint, ctx.seq
            )))
        }
        None => return put(0, data),
    };
    let got = if bufs.device_queue().is_some() {
        let got = crate::wire::piece_checksum(data);
        if got == want {
            put(0, data)?;
        }
        got
    } else {
        let block = (crate::wire::CHECKSUM_BLOCK / esize * esize).max(esize);
        let mut crc = 0;
        for (k, part) in data.chunks(block).enumerate() {
            crc = crate::wire::checksum_append(crc, part);
            put(k * block, part)?;
        }
        crc
    };
    if got != want {
        return Err(corrupt(format!(
            "{} (seq {}): the piece at bytes {at}..{} of {total} has CRC32C {got:#010x}, \
             its sender computed {want:#010x} (the data changed in memory or on the link)",
            ctx.fingerprint,
            ctx.seq,
            at + data.len()
        )));
    }
    Ok(())
}

/// Pushes as many pieces of `src` as the connection takes now and the
/// memory has ready (staged, for device memory going through the host).
pub(super) fn send_some<M: Memory>(
    ctx: &OpContext,
    bufs: &M,
    conn: &mut dyn Connection,
    src: Region,
    st: &mut OpState,
) -> Result<usize> {
    let esize = ctx.dtype.size();
    let total = src.len * esize;
    let Some(space) = route(ctx, bufs, conn)? else {
        return Ok(0);
    };
    let max = piece_limit(conn, space, esize);
    let mut moved = 0;
    let lend = bufs.pieces_outlive_step();
    loop {
        let n = max.min(total - st.done);
        let first = st.done == 0;
        let sent = match space {
            Space::Device(queue) => {
                let region = device_region(ctx, bufs, conn.peer(), queue, src, (st.done, n))?;
                conn.try_post_send(&header(ctx, first, n, false), Outgoing::device(region))
            }
            Space::Host => {
                let sent = bufs.with_piece(src, esize, st.done, n, |b| {
                    let piece = if lend {
                        // SAFETY: `pieces_outlive_step` promises `b` is the
                        // operation's own memory, unchanged until the step
                        // ends, and the step does not end (see the drain in
                        // `execute`) before every connection it sent on has
                        // flushed.
                        unsafe { Outgoing::lent(b) }
                    } else {
                        Outgoing::copied(b)
                    };
                    conn.try_post_send(&header(ctx, first, b.len(), ctx.checksum), piece)
                })?;
                // Not staged yet (device memory): like no room now, try later.
                let Some(sent) = sent else {
                    return Ok(moved);
                };
                sent
            }
        };
        if !sent.map_err(|e| in_op(ctx, e))? {
            return Ok(moved);
        }
        moved += n;
        if st.advance(n, total) {
            return Ok(moved);
        }
    }
}

/// The largest piece over `conn` in `space`, in whole elements.
fn piece_limit(conn: &dyn Connection, space: Space<'_>, esize: usize) -> usize {
    (conn.max_piece(space.kind()) / esize * esize).max(esize)
}

/// Checks a received piece's header against this operation: communicator
/// and sequence number on every piece, the fingerprint on the first piece
/// of a message (byte `done` 0, which must carry it; a later piece that
/// carries one too is checked as well), and its length against the
/// `expect`ed bytes at byte `done` of `total`.
pub(super) fn check_piece(
    ctx: &OpContext,
    peer: usize,
    h: &PieceHeader,
    len: usize,
    expect: usize,
    (done, total): (usize, usize),
) -> Result<()> {
    if h.comm_id != ctx.comm_id {
        return Err(Error::CommMismatch {
            rank: ctx.rank,
            peer,
            seq: ctx.seq,
            op: ctx.fingerprint,
            ours: ctx.comm_id,
            theirs: h.comm_id,
            their_seq: h.seq,
        });
    }
    match h.fingerprint {
        Some(theirs) if h.seq != ctx.seq || theirs != ctx.fingerprint => {
            return Err(Error::Mismatch {
                rank: ctx.rank,
                peer,
                seq: ctx.seq,
                ours: ctx.fingerprint,
                their_seq: h.seq,
                theirs,
            });
        }
        None if done == 0 || h.seq != ctx.seq => {
            return Err(Error::InvalidArgument {
                rank: ctx.rank,
                op: ctx.fingerprint.collective.name(),
                detail: format!(
                    "{} (seq {}): peer rank {peer} sent a continuation piece (its seq {}, no \
                     fingerprint) of {len} bytes where this rank expects {} at byte {done} of \
                     {total} (message sizes or operations differ across ranks?)",
                    ctx.fingerprint,
                    ctx.seq,
                    h.seq,
                    if done == 0 {
                        "the first piece of a message"
                    } else {
                        "a piece of its own operation"
                    }
                ),
            });
        }
        _ => {}
    }
    if len != expect {
        return Err(Error::InvalidArgument {
            rank: ctx.rank,
            op: ctx.fingerprint.collective.name(),
            detail: format!(
                "peer rank {peer} sent a piece of {len} bytes at byte {done} of {total} where {expect} were expected (counts differ across ranks?)"
            ),
        });
    }
    Ok(())
}

/// Consumes as many arrived pieces into `dst` as there are.
pub(super) fn recv_some<M: Memory>(
    ctx: &OpContext,
    bufs: &M,
    conn: &mut dyn Connection,
    local: Option<Region>,
    dst: Region,
    st: &mut OpState,
) -> Result<usize> {
    let esize = ctx.dtype.size();
    let total = dst.len * esize;
    let Some(space) = route(ctx, bufs, conn)? else {
        return Ok(0);
    };
    let max = piece_limit(conn, space, esize);
    let peer = conn.peer();
    let mut moved = 0;
    loop {
        let expect = max.min(total - st.done);
        let done = st.done;
        let mut consume = |h: &PieceHeader, payload: Payload<'_>| -> Result<()> {
            check_piece(ctx, peer, h, payload.len(), expect, (done, total))?;
            match payload {
                Payload::Host(data) => {
                    use_piece(ctx, bufs, peer, h, data, (local, dst), (done, total))
                }
                Payload::Device(region) => {
                    use_device_piece(ctx, bufs, peer, region, (local, dst), done)
                }
            }
        };
        let got = conn
            .try_recv(space, &mut consume)
            .map_err(|e| in_op(ctx, e))?;
        if !got {
            return Ok(moved);
        }
        moved += expect;
        if st.advance(expect, total) {
            return Ok(moved);
        }
    }
}
