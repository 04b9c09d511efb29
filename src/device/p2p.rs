//! Point-to-point transfers on device memory: a group of sends and
//! receives (NCCL's `ncclSend` / `ncclRecv` between `ncclGroupStart` and
//! `ncclGroupEnd`) queued on the caller's stream, as the host-driven
//! collectives are (`api.rs`): checked now, run by the progress thread in
//! the communicator's order, the caller's stream released once the data is
//! on the device.
//!
//! The progress thread runs a group in segments (`P2pSegments`): the
//! transfers to one peer form one stream of bytes, cut into parts that
//! keep every segment within the staging allocated at bind, so a transfer
//! of any size allocates nothing. Sends to and receives from this rank
//! itself are device-to-device copies, the k-th send to self into the k-th
//! receive from self. A group, like the host's, takes no collective
//! sequence number: only the ranks it names take part.

use std::sync::atomic::Ordering;

use comm_core::wire::Collective;
use comm_core::{DataType, Error, Result};

use ::device::{DevicePtr, StreamHandle};
use sncl_runtime::device::binding::Binding;
use sncl_runtime::device::memory::{DeviceMemory, OpIds};
use sncl_runtime::device::segment::{P2pSegments, P2pTransfer};

use crate::buffer::{GroupDeviceOp, Lent, Location, Stream};
use crate::comm::{Inner, P2p, RawOp, State};
use crate::work::RawWork;
use crate::Communicator;

/// One transfer of a point-to-point group on device memory: `count`
/// elements of `dtype` at `ptr` (a device address of the communicator's
/// device) sent to or received from `peer`. A send and its receive have
/// the same size in bytes; the k-th send to a peer meets the peer's k-th
/// receive from this rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceTransfer {
    /// The other rank (this rank itself: a copy, paired with a receive
    /// from itself in the same group).
    pub peer: usize,
    /// A send (else a receive).
    pub is_send: bool,
    /// The buffer (device address).
    pub ptr: DevicePtr,
    /// Its length in elements of `dtype`.
    pub count: usize,
    /// The element type.
    pub dtype: DataType,
}

impl DeviceTransfer {
    /// A send of `count` elements of `dtype` at `ptr` to `peer`.
    pub fn send(ptr: DevicePtr, count: usize, dtype: DataType, peer: usize) -> DeviceTransfer {
        DeviceTransfer {
            peer,
            is_send: true,
            ptr,
            count,
            dtype,
        }
    }

    /// A receive of `count` elements of `dtype` into `ptr` from `peer`.
    pub fn recv(ptr: DevicePtr, count: usize, dtype: DataType, peer: usize) -> DeviceTransfer {
        DeviceTransfer {
            peer,
            is_send: false,
            ptr,
            count,
            dtype,
        }
    }
}

impl Communicator {
    /// Queues a group of point-to-point transfers on device memory on
    /// `stream`; returns at once (see [`crate::device`] for the stream
    /// semantics). The transfers progress together, as in one
    /// `ncclGroupStart` / `ncclGroupEnd`. Errors in the arguments (no bound
    /// device, a peer out of range, a NULL or foreign buffer, a send to
    /// self without its receive, a stream under capture) are returned now,
    /// before anything is queued; device and peer failures through the
    /// handle.
    ///
    /// # Safety
    /// Every transfer's buffer is a live device range of the bound device
    /// for its count, and stays so, unused by anything not ordered on
    /// `stream` (and received-into buffers untouched by anything else),
    /// until the handle reports completion (also if it is dropped early).
    pub unsafe fn send_recv_device_raw(
        &self,
        transfers: &[DeviceTransfer],
        stream: StreamHandle,
    ) -> Result<RawWork> {
        let make = self.prepare_device_p2p(transfers, stream)?;
        Ok(RawWork::from_state(self.worker.submit_with(make)))
    }

    /// Checks a device point-to-point group now (nothing is queued when it
    /// is rejected) and returns what queues it in stream order.
    pub(crate) fn prepare_device_p2p(
        &self,
        transfers: &[DeviceTransfer],
        stream: StreamHandle,
    ) -> Result<crate::work::DeviceJobMaker> {
        let inner = &self.inner;
        let (rank, name) = (inner.rank, Collective::SendRecv.name());
        let invalid = |detail: String| Error::InvalidArgument {
            rank,
            op: name,
            detail,
        };
        let attached = self.device.get().cloned().ok_or_else(|| {
            invalid(
                "no device is bound to this communicator (call Communicator::bind_device)".into(),
            )
        })?;
        let b = attached.binding.clone();
        let mut raw = RawOp::new(Collective::SendRecv, DataType::Uint8, 0);
        raw.p2p = transfers
            .iter()
            .map(|t| P2p {
                peer: t.peer,
                is_send: t.is_send,
                ptr: t.ptr.0 as usize as *mut u8,
                count: t.count,
                dtype: t.dtype,
            })
            .collect();
        inner.prepare(&mut raw)?;
        for (k, t) in raw.p2p.iter().enumerate() {
            let what = format!(
                "transfer {k} ({} {} peer {})",
                if t.is_send { "send to" } else { "receive from" },
                t.dtype.name(),
                t.peer
            );
            if t.bytes() == 0 {
                continue;
            }
            if t.ptr.is_null() {
                return Err(invalid(format!("{what}: the device buffer is NULL")));
            }
            b.check_buffer((rank, name), &what, t.ptr as usize as u64, t.bytes())?;
        }
        if !b.peers_bound.load(Ordering::Acquire) {
            if b.dev.is_capturing(stream).unwrap_or(false) {
                return Err(invalid(
                    "the first device operation of a communicator sets its device links up \
                     (allocations, a barrier) and cannot be captured into a CUDA graph; call \
                     connect_device (or run one device collective) before capturing"
                        .into(),
                ));
            }
            self.join_once(&b)?;
        }
        let none = DevicePtr(0);
        self.queue_host_driven(attached, raw, (none, none), stream)
    }
}

impl Communicator {
    /// Queues an all_gatherv or alltoallv on device memory on `stream`;
    /// returns at once (stream semantics as [`crate::device`]). It runs as
    /// a point-to-point group, as PyTorch runs `all_to_all_single` with
    /// splits over NCCL: every rank sends each peer its block and receives
    /// each peer's (its own block is a device copy; all_gatherv in place,
    /// `send` at `recv + displs[rank]`, copies nothing). Counts and
    /// displacements are in elements, one per rank (all_gatherv: the
    /// receive side's only; this rank sends `counts[rank]`).
    ///
    /// # Safety
    /// `send` and `recv` are live device ranges of the bound device for the
    /// extents the counts and displacements give, used by nothing not
    /// ordered on `stream` until the handle reports completion.
    pub unsafe fn enqueue_device_v(
        &self,
        (coll, dtype): (Collective, DataType),
        (send, recv): (DevicePtr, DevicePtr),
        v: crate::comm::VCounts,
        stream: StreamHandle,
    ) -> Result<RawWork> {
        let mut raw = RawOp::new(coll, dtype, 0);
        raw.v = Some(Box::new(v));
        let make = self.prepare_device_v(raw, (send, recv), stream)?;
        Ok(RawWork::from_state(self.worker.submit_with(make)))
    }

    /// Checks an all_gatherv or alltoallv `raw` (its variable counts set;
    /// addresses `send` and `recv`) and returns what queues it as a device
    /// point-to-point group.
    pub(crate) fn prepare_device_v(
        &self,
        mut raw: RawOp,
        (send, recv): (DevicePtr, DevicePtr),
        stream: StreamHandle,
    ) -> Result<crate::work::DeviceJobMaker> {
        let inner = &self.inner;
        let (me, n, coll) = (inner.rank, inner.nranks, raw.coll);
        if !matches!(coll, Collective::AllGatherV | Collective::AllToAllV) {
            return Err(inner.invalid(
                coll.name(),
                "variable counts go with all_gatherv and alltoallv only".into(),
            ));
        }
        let p = inner.prepare(&mut raw)?;
        let esize = raw.dtype.size();
        if coll == Collective::AllToAllV {
            inner.check_ranges_apart(
                coll,
                (send.0, p.send_elems * esize),
                (recv.0, p.recv_elems * esize),
            )?;
        }
        let Some(v) = raw.v.as_deref() else {
            return Err(inner.invalid(coll.name(), "variable counts are missing".into()));
        };
        let dtype = raw.dtype;
        let at = |base: DevicePtr, displ: usize| base.add(displ * esize);
        let mut transfers = Vec::with_capacity(2 * n);
        for q in 0..n {
            let into = DeviceTransfer::recv(at(recv, v.recv_displs[q]), v.recv_counts[q], dtype, q);
            let from = match coll {
                Collective::AllToAllV => {
                    DeviceTransfer::send(at(send, v.send_displs[q]), v.send_counts[q], dtype, q)
                }
                _ => DeviceTransfer::send(send, p.send_elems, dtype, q),
            };
            if q == me && coll == Collective::AllGatherV && from.ptr == into.ptr {
                // In place: this rank's block is where it goes.
                continue;
            }
            transfers.push(from);
            transfers.push(into);
        }
        self.prepare_device_p2p(&transfers, stream)
    }
}

impl Inner {
    /// Runs a device point-to-point group on the progress thread (in its
    /// turn, after the caller's stream reached it): the copies to self on
    /// the binding's stream, then the other transfers segment by segment
    /// through the staging. Returns once the data is on the device.
    pub(super) fn run_device_p2p(
        &self,
        st: &mut State,
        binding: &Binding,
        op: &RawOp,
    ) -> Result<()> {
        let (me, name) = (self.rank, op.coll.name());
        st.count_op(op.coll);
        let sends = op.p2p.iter().filter(|p| p.peer == me && p.is_send);
        let recvs = op.p2p.iter().filter(|p| p.peer == me && !p.is_send);
        let copies: Vec<(DevicePtr, DevicePtr, usize)> = sends
            .zip(recvs)
            .filter(|(s, _)| s.bytes() > 0)
            .map(|(s, r)| (device_ptr(r.ptr), device_ptr(s.ptr), s.bytes()))
            .collect();
        if let Err(e) = super::job::copy_on_stream(binding, &copies) {
            let e = binding.error(me, name, None, "copying to this rank itself", e);
            self.fail(st, &e);
            return Err(e);
        }
        let others: Vec<&P2p> = op.p2p.iter().filter(|p| p.peer != me).collect();
        let mut staging = binding.staging();
        let cut = P2pSegments::cut(
            &others
                .iter()
                .map(|p| P2pTransfer {
                    peer: p.peer,
                    is_send: p.is_send,
                    bytes: p.bytes(),
                })
                .collect::<Vec<_>>(),
            P2pSegments::part_bytes(staging.bytes(), self.nranks),
        );
        for segment in cut.segments() {
            let mut sub = RawOp::new(Collective::SendRecv, DataType::Uint8, 0);
            sub.p2p = segment
                .iter()
                .map(|part| {
                    let t = others[part.transfer];
                    P2p {
                        peer: t.peer,
                        is_send: t.is_send,
                        ptr: (t.ptr as usize + part.offset) as *mut u8,
                        count: part.bytes,
                        dtype: DataType::Uint8,
                    }
                })
                .collect();
            let (sched, algo) = self.schedule(st, &sub, true)?;
            let fingerprint = self.prepared(&sub)?.fingerprint;
            let peers = sub
                .p2p
                .iter()
                .map(|p| (device_ptr(p.ptr), p.bytes()))
                .collect();
            let bytes = sub.p2p.iter().map(|p| p.bytes() as u64).sum();
            let none = (DevicePtr(0), 0);
            let mem = DeviceMemory::new(
                (&binding.dev, binding.stream),
                &mut staging,
                OpIds {
                    rank: me,
                    op: name,
                    seq: 0,
                },
                none,
                none,
                self.config.timeout,
            )
            .with_peer_buffers(peers);
            // Point-to-point groups take no collective sequence number
            // (as on the host path: their pieces carry 0).
            self.execute_op(
                st,
                &sub,
                (0, fingerprint),
                (&sched, algo),
                &mem,
                bytes,
                |r| {
                    // The data must be on the device (and the staging free)
                    // before the caller's stream goes on, also after a
                    // failure.
                    let done = mem.finish();
                    r.and(done)
                },
            )?;
        }
        if cut.segments().is_empty() && !copies.is_empty() {
            let deadline = std::time::Instant::now() + self.config.timeout;
            if let Err(e) = binding.dev.synchronize(binding.stream, deadline) {
                let e = binding.error(me, name, None, "copying to this rank itself", e);
                self.fail(st, &e);
                return Err(e);
            }
        }
        Ok(())
    }
}

/// A device address kept in a [`P2p`]'s pointer field.
fn device_ptr(p: *mut u8) -> DevicePtr {
    DevicePtr(p as usize as u64)
}

impl Communicator {
    /// [`Communicator::group`] over device buffers: every buffer on the
    /// communicator's device (binding it on first use) and one stream; the
    /// group is queued there and waited for (the data is on the device
    /// when this returns, ordered on the stream).
    pub(crate) fn run_device_group(&self, mut ops: Vec<GroupDeviceOp<'_>>) -> Result<()> {
        let (rank, name) = (self.inner.rank, Collective::SendRecv.name());
        let mut stream: Option<Stream> = None;
        for (k, op) in ops.iter().enumerate() {
            let Location::Device { device, stream: s } = op.buf.location() else {
                continue;
            };
            let what = format!("the buffer of transfer {k}");
            self.bind_or_check_id(name, &what, &device)?;
            match &stream {
                Some(first) if first.handle() != s.handle() => {
                    return Err(Error::InvalidArgument {
                        rank,
                        op: name,
                        detail: format!(
                            "a group's device buffers go on one stream: transfer {k}'s is \
                             {:#x}, the first one's {:#x}",
                            s.handle().0,
                            first.handle().0
                        ),
                    })
                }
                Some(_) => {}
                None => stream = Some(s),
            }
        }
        let Some(stream) = stream else {
            return Ok(());
        };
        let shape: Vec<(usize, bool, usize, DataType)> = ops
            .iter()
            .map(|op| (op.peer, op.is_send, op.count, op.dtype))
            .collect();
        // The addresses are lent (and cudarc's guards held) until the group
        // is queued.
        let lent: Vec<Lent<'_>> = ops.iter_mut().map(|op| op.buf.lend_on(&stream)).collect();
        let transfers: Vec<DeviceTransfer> = shape
            .iter()
            .zip(&lent)
            .map(|(&(peer, is_send, count, dtype), l)| DeviceTransfer {
                peer,
                is_send,
                ptr: DevicePtr(l.addr as u64),
                count,
                dtype,
            })
            .collect();
        let make = self.prepare_device_p2p(&transfers, stream.handle())?;
        let work = RawWork::from_state(self.worker.submit_with(make));
        drop(lent);
        work.wait()
    }
}
