//! The executor's device-to-device path: pieces of device memory over
//! connections with a [`crate::transport::DeviceLink`] (`nvlink`). Only
//! their headers cross host memory; the transport moves the bytes, the
//! memory ([`Memory::device_recv`]) reduces or copies them on its stream.

use super::piece::check_piece;
use super::wait::{probe_peers, wait_over, Waiter};
use super::{in_op, AbortFlag, OpContext, OpState};
use crate::error::{Error, Result};
use crate::mem::Memory;
use crate::schedule::{Op, Region};
use crate::transport::{Connection, DeviceLink};
use crate::wire::PieceHeader;

/// Device memory: waits (within the deadline) until the route of every
/// send of `ops` is decided and leaves in `out` those that go through the
/// host (staged by [`Memory::prepare_sends`]).
pub(super) fn host_routed_sends<M: Memory>(
    ctx: &OpContext,
    bufs: &M,
    ops: &[Op],
    conns: &mut [Option<Box<dyn Connection>>],
    abort: Option<&AbortFlag>,
    out: &mut Vec<Op>,
) -> Result<()> {
    let mut waiter = Waiter::new(ctx.spin);
    loop {
        out.clear();
        let mut undecided = Vec::new();
        for op in ops {
            let Op::Send { peer, .. } = *op else { continue };
            let route = match conns.get_mut(peer).and_then(|c| c.as_deref_mut()) {
                Some(c) => device_route(ctx, bufs, c)?,
                None => Some(false),
            };
            match route {
                Some(false) => out.push(*op),
                Some(true) => {}
                None => undecided.push(peer),
            }
        }
        if undecided.is_empty() {
            return Ok(());
        }
        if let Some(waited) = waiter.idle() {
            let aborted = abort.is_some_and(|a| a.load(std::sync::atomic::Ordering::Relaxed));
            let doing = || format!("waiting for the device paths of {undecided:?}");
            if let Some(e) = wait_over(ctx, waited, aborted, doing, || undecided.clone()) {
                if matches!(e, Error::Timeout { .. }) {
                    tracing::error!(rank = ctx.rank, op = %ctx.fingerprint, seq = ctx.seq, peers = ?undecided,
                        "sncl hang: peers never published their device inboxes");
                }
                return Err(e);
            }
            probe_peers(ctx, &mut waiter, conns, || undecided.clone())?;
        }
    }
}

/// Whether this operation's pieces to and from `conn` go device to device
/// (`Some(true)`: the memory is device memory and the connection has a
/// device path both sides can use), through the host (`Some(false)`), or
/// not decided yet (`None`: the peer has not published its side; the
/// caller tries again later, within the deadline).
pub(super) fn device_route<M: Memory>(
    ctx: &OpContext,
    bufs: &M,
    conn: &mut dyn Connection,
) -> Result<Option<bool>> {
    let Some(queue) = bufs.device_queue() else {
        return Ok(Some(false));
    };
    let Some(link) = conn.device_link() else {
        return Ok(Some(false));
    };
    link.ready(queue).map_err(|e| in_op(ctx, e))
}

/// The device-to-device form of [`send_some`]: pieces leave from where
/// they lie on the device. They carry no checksum (their bytes never
/// cross host memory; `SNCL_CHECKSUM` covers what does).
pub(super) fn send_device<M: Memory>(
    ctx: &OpContext,
    bufs: &M,
    conn: &mut dyn Connection,
    src: Region,
    st: &mut OpState,
) -> Result<usize> {
    let esize = ctx.dtype.size();
    let total = src.len * esize;
    let (peer, queue, link, max) = device_parts(ctx, bufs, conn)?;
    let mut moved = 0;
    loop {
        let n = max.min(total - st.done);
        let addr = bufs
            .device_span(src, esize, st.done, n)?
            .ok_or_else(|| no_device_path(ctx, peer))?;
        let h = PieceHeader {
            checksum: None,
            comm_id: ctx.comm_id,
            seq: ctx.seq,
            fingerprint: (st.done == 0).then_some(ctx.fingerprint),
            len: n as u32,
        };
        if !link
            .try_send_device(queue, &h, addr)
            .map_err(|e| in_op(ctx, e))?
        {
            return Ok(moved);
        }
        moved += n;
        if st.advance(n, total) {
            return Ok(moved);
        }
    }
}

/// What a device piece needs: the peer, the operation's device queue,
/// the connection's device link and the largest piece in whole elements.
#[allow(clippy::type_complexity)]
fn device_parts<'a, M: Memory>(
    ctx: &OpContext,
    bufs: &'a M,
    conn: &'a mut dyn Connection,
) -> Result<(usize, &'a dyn std::any::Any, &'a mut dyn DeviceLink, usize)> {
    let esize = ctx.dtype.size();
    let peer = conn.peer();
    let queue = bufs
        .device_queue()
        .ok_or_else(|| no_device_path(ctx, peer))?;
    let link = conn
        .device_link()
        .ok_or_else(|| no_device_path(ctx, peer))?;
    let max = (link.max_device_piece() / esize * esize).max(esize);
    Ok((peer, queue, link, max))
}

fn no_device_path(ctx: &OpContext, peer: usize) -> Error {
    Error::InvalidArgument {
        rank: ctx.rank,
        op: ctx.fingerprint.collective.name(),
        detail: format!(
            "the pieces exchanged with peer rank {peer} go device to device, but this \
             operation's memory has no device address for them"
        ),
    }
}

/// The device-to-device form of [`recv_some`]: each piece is reduced or
/// copied from the transport's device inbox on the operation's stream.
pub(super) fn recv_device<M: Memory>(
    ctx: &OpContext,
    bufs: &M,
    conn: &mut dyn Connection,
    local: Option<Region>,
    dst: Region,
    st: &mut OpState,
) -> Result<usize> {
    let esize = ctx.dtype.size();
    let total = dst.len * esize;
    let (peer, queue, link, max) = device_parts(ctx, bufs, conn)?;
    let mut moved = 0;
    loop {
        let expect = max.min(total - st.done);
        let done = st.done;
        let mut consume = |h: &PieceHeader, src: u64| -> Result<()> {
            check_piece(ctx, peer, h, h.len as usize, expect, (done, total))?;
            if !bufs.device_recv(local, dst, esize, done, src, expect, ctx.dtype, ctx.op)? {
                return Err(no_device_path(ctx, peer));
            }
            Ok(())
        };
        let got = link
            .try_recv_device(queue, &mut consume)
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
