//! The executor's device-to-device path: pieces of device memory posted as
//! device regions over connections that move them (`nvlink`, `rdma` with
//! GPUDirect). Only their headers cross host memory; the transport moves
//! the bytes, the memory ([`Memory::device_recv`]) reduces or copies them
//! on its stream. Where a connection does not move device memory the
//! pieces are staged through the host and travel as host pieces.

use super::context::{in_op, AbortFlag, OpContext};
use super::wait::{probe_peers, wait_over, Waiter};
use crate::error::{Error, Result};
use crate::mem::Memory;
use crate::schedule::{Op, Region};
use crate::transport::{Connection, DeviceRegion, Space};

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
            let space = match conns.get_mut(peer).and_then(|c| c.as_deref_mut()) {
                Some(c) => route(ctx, bufs, c)?,
                None => Some(Space::Host),
            };
            match space {
                Some(Space::Host) => out.push(*op),
                Some(Space::Device(_)) => {}
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

/// The memory this operation's pieces to and from `conn` travel in:
/// device regions (`Space::Device`: the memory is device memory and the
/// connection moves it device to device, both sides agreed), host bytes
/// (`Space::Host`: host memory, or device memory staged through the host),
/// or not decided yet (`None`: the peer has not published its side; the
/// caller tries again later, within the deadline).
pub(super) fn route<'q, M: Memory>(
    ctx: &OpContext,
    bufs: &'q M,
    conn: &mut dyn Connection,
) -> Result<Option<Space<'q>>> {
    let Some(queue) = bufs.device_queue() else {
        return Ok(Some(Space::Host));
    };
    Ok(match conn.ready(queue).map_err(|e| in_op(ctx, e))? {
        Some(true) => Some(Space::Device(queue)),
        Some(false) => Some(Space::Host),
        None => None,
    })
}

/// The device region of bytes `at..at + len` of `src`, to post to `peer`.
pub(super) fn device_region<'q, M: Memory>(
    ctx: &OpContext,
    bufs: &M,
    peer: usize,
    queue: &'q dyn std::any::Any,
    src: Region,
    (at, len): (usize, usize),
) -> Result<DeviceRegion<'q>> {
    let addr = bufs
        .device_span(src, ctx.dtype.size(), at, len)?
        .ok_or_else(|| no_device_path(ctx, peer))?;
    Ok(DeviceRegion { queue, addr, len })
}

/// Uses a device piece received from `peer` at byte `at`: enqueues its
/// reduction with `local` into `dst` (or its copy into `dst`) from the
/// transport's inbox on the operation's stream.
pub(super) fn use_device_piece<M: Memory>(
    ctx: &OpContext,
    bufs: &M,
    peer: usize,
    region: DeviceRegion<'_>,
    (local, dst): (Option<Region>, Region),
    at: usize,
) -> Result<()> {
    let esize = ctx.dtype.size();
    let (src, len) = (region.addr, region.len);
    if !bufs.device_recv(local, dst, esize, at, src, len, ctx.dtype, ctx.op)? {
        return Err(no_device_path(ctx, peer));
    }
    Ok(())
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
