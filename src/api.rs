//! The typed collectives. Each validates its slices against the counts and
//! the rank count (rejecting bad input before anything is sent), builds a
//! raw operation, and runs it inline (blocking forms on [`Communicator`]) or
//! queues it (non-blocking forms on [`Scope`]).

use std::marker::PhantomData;

use comm_core::shape::{OpShape, ShapeError};
use comm_core::transport::registry::MemoryKind;
use comm_core::wire::Collective;
use comm_core::{DataType, Error, ReduceOp, Result};

use crate::comm::{Inner, P2p, RawOp, VCounts};
use crate::work::{Group, Scope, Work};
use crate::{Communicator, Element};

fn bad(rank: usize, op: &'static str, detail: String) -> Error {
    Error::InvalidArgument { rank, op, detail }
}

/// Builders shared by the blocking and non-blocking forms: every op is
/// checked once by the communicator ([`Inner::prepare`], which keeps its
/// shape in the op), and the slices are checked against that shape's
/// extents.
struct Build<'c> {
    inner: &'c Inner,
}

impl Build<'_> {
    fn rank(&self) -> usize {
        self.inner.rank
    }

    /// The op `coll` of `count` elements (`op`: the reduction, where it
    /// reduces), checked, with its shape.
    fn raw<T: Element>(
        &self,
        coll: Collective,
        count: usize,
        root: usize,
        op: ReduceOp,
    ) -> Result<(RawOp, OpShape)> {
        let mut r = RawOp::new(coll, T::DTYPE, count);
        r.root = root;
        r.op = op;
        let p = self.inner.prepare(&mut r)?;
        Ok((r, p.shape))
    }

    /// An out-of-place operation of `count` elements: the buffers this
    /// rank uses must have the shape's extents.
    fn op<T: Element>(
        &self,
        coll: Collective,
        (count, root, op): (usize, usize, ReduceOp),
        send: &[T],
        recv: &mut [T],
    ) -> Result<RawOp> {
        let (mut r, shape) = self.raw::<T>(coll, count, root, op)?;
        shape
            .check_buffers(self.rank(), send.len(), recv.len())
            .map_err(|e| bad(self.rank(), coll.name(), e.to_string()))?;
        r.send = send.as_ptr() as *const u8;
        r.recv = recv.as_mut_ptr() as *mut u8;
        Ok(r)
    }

    /// An in-place operation of `count` elements on `buf`, laid out as
    /// [`OpShape::in_place`] says.
    fn in_place<T: Element>(
        &self,
        coll: Collective,
        (count, root, op): (usize, usize, ReduceOp),
        buf: &mut [T],
    ) -> Result<RawOp> {
        let name = coll.name();
        let (mut r, shape) = self.raw::<T>(coll, count, root, op)?;
        let layout = shape
            .in_place(self.rank())
            .ok_or_else(|| bad(self.rank(), name, format!("{name} has no in-place form")))?;
        if buf.len() != layout.elems {
            let e = ShapeError::Length {
                what: "buf",
                got: buf.len(),
                want: layout.elems,
            };
            return Err(bad(self.rank(), name, e.to_string()));
        }
        let p = buf.as_mut_ptr();
        // SAFETY: the layout's offsets lie within its `elems`, which is
        // `buf.len()` (checked above), so both pointers stay inside `buf`.
        unsafe {
            r.send = p.add(layout.input_at) as *const u8;
            r.recv = p.add(layout.output_at) as *mut u8;
        }
        Ok(r)
    }

    /// A variable-count op (`v`): checked, with this rank's extents
    /// (send, receive) in elements.
    fn v<T: Element>(&self, coll: Collective, v: VCounts) -> Result<(RawOp, usize, usize)> {
        let mut r = RawOp::new(coll, T::DTYPE, 0);
        r.v = Some(v);
        let p = self.inner.prepare(&mut r)?;
        Ok((r, p.send_elems, p.recv_elems))
    }

    fn multiple(&self, coll: Collective, len: usize) -> Result<usize> {
        let n = self.inner.nranks;
        if !len.is_multiple_of(n) {
            return Err(bad(
                self.rank(),
                coll.name(),
                format!("buffer of {len} elements is not divisible by the {n} ranks"),
            ));
        }
        Ok(len / n)
    }
}

/// No reduction (the collectives that do not reduce).
const NONE: ReduceOp = ReduceOp::Sum;

macro_rules! collectives {
    ($($(#[$doc:meta])* fn $name:ident<$t:ident>(&self $(, $arg:ident : $ty:ty)*) => $build:expr;)*) => {
        impl Communicator {
            $(
                $(#[$doc])*
                pub fn $name<'scope, $t: Element>(&self $(, $arg: $ty)*) -> Result<()> {
                    let b = Build { inner: &self.inner };
                    #[allow(clippy::redundant_closure_call)]
                    let op: RawOp = ($build)(&b)?;
                    self.run_blocking(op)
                }
            )*
        }
        impl<'scope> Scope<'scope, '_> {
            $(
                $(#[$doc])*
                ///
                /// Non-blocking: returns a [`Work`] handle; the buffers stay
                /// borrowed until the scope ends.
                pub fn $name<$t: Element>(&'scope self $(, $arg: $ty)*) -> Result<Work<'scope>> {
                    let b = Build { inner: &self.comm.inner };
                    #[allow(clippy::redundant_closure_call)]
                    let op: RawOp = ($build)(&b)?;
                    Ok(self.enqueue(op))
                }
            )*
        }
    };
}

collectives! {
    /// All-reduce: `recv[i] = op over ranks of send[i]`.
    fn all_reduce<T>(&self, send: &'scope [T], recv: &'scope mut [T], op: ReduceOp) => |b: &Build| {
        b.op(Collective::AllReduce, (send.len(), 0, op), send, recv)
    };
    /// In-place all-reduce of `buf`.
    fn all_reduce_in_place<T>(&self, buf: &'scope mut [T], op: ReduceOp) => |b: &Build| {
        b.in_place(Collective::AllReduce, (buf.len(), 0, op), buf)
    };
    /// Reduce-scatter: `send` holds one block of `recv.len()` elements per
    /// rank; rank r receives block r reduced over all ranks.
    fn reduce_scatter<T>(&self, send: &'scope [T], recv: &'scope mut [T], op: ReduceOp) => |b: &Build| {
        b.op(Collective::ReduceScatter, (recv.len(), 0, op), send, recv)
    };
    /// In-place reduce-scatter: `buf` holds one block per rank; the result
    /// lands in this rank's block `buf[rank*c..(rank+1)*c]`.
    fn reduce_scatter_in_place<T>(&self, buf: &'scope mut [T], op: ReduceOp) => |b: &Build| {
        let c = b.multiple(Collective::ReduceScatter, buf.len())?;
        b.in_place(Collective::ReduceScatter, (c, 0, op), buf)
    };
    /// All-gather: `recv` receives every rank's `send`, in rank order.
    fn all_gather<T>(&self, send: &'scope [T], recv: &'scope mut [T]) => |b: &Build| {
        b.op(Collective::AllGather, (send.len(), 0, NONE), send, recv)
    };
    /// In-place all-gather: this rank's block of `buf` is its contribution.
    fn all_gather_in_place<T>(&self, buf: &'scope mut [T]) => |b: &Build| {
        let c = b.multiple(Collective::AllGather, buf.len())?;
        b.in_place(Collective::AllGather, (c, 0, NONE), buf)
    };
    /// Broadcast `buf` from `root` to every rank, in place.
    fn broadcast<T>(&self, buf: &'scope mut [T], root: usize) => |b: &Build| {
        b.in_place(Collective::Broadcast, (buf.len(), root, NONE), buf)
    };
    /// Broadcast out of place: the root sends `send`; every rank receives into `recv`
    /// (`send` is ignored on other ranks).
    fn broadcast_from<T>(&self, send: &'scope [T], recv: &'scope mut [T], root: usize) => |b: &Build| {
        b.op(Collective::Broadcast, (recv.len(), root, NONE), send, recv)
    };
    /// Reduce to `root`: the root's `recv` receives the reduction of every
    /// rank's `send` (`recv` may be empty on other ranks).
    fn reduce<T>(&self, send: &'scope [T], recv: &'scope mut [T], op: ReduceOp, root: usize) => |b: &Build| {
        b.op(Collective::Reduce, (send.len(), root, op), send, recv)
    };
    /// In-place reduce: on the root `buf` is replaced by the reduction.
    fn reduce_in_place<T>(&self, buf: &'scope mut [T], op: ReduceOp, root: usize) => |b: &Build| {
        b.in_place(Collective::Reduce, (buf.len(), root, op), buf)
    };
    /// All-to-all: block j of `send` goes to rank j; block i of `recv` comes from rank i.
    fn alltoall<T>(&self, send: &'scope [T], recv: &'scope mut [T]) => |b: &Build| {
        let c = b.multiple(Collective::AllToAll, send.len())?;
        b.op(Collective::AllToAll, (c, 0, NONE), send, recv)
    };
    /// All-gather with per-rank counts: rank i's `send` (of `counts[i]`
    /// elements) lands at `recv[displs[i]..]`.
    fn all_gatherv<T>(&self, send: &'scope [T], recv: &'scope mut [T], counts: &[usize], displs: &[usize]) => |b: &Build| {
        let v = VCounts { send_counts: vec![], send_displs: vec![], recv_counts: counts.to_vec(), recv_displs: displs.to_vec() };
        let (mut r, se, re) = b.v::<T>(Collective::AllGatherV, v)?;
        if send.len() != se {
            let e = ShapeError::Length { what: "send", got: send.len(), want: se };
            return Err(bad(b.rank(), "all_gatherv", e.to_string()));
        }
        if recv.len() < re {
            return Err(bad(b.rank(), "all_gatherv", format!("recv has {} elements, counts and displacements need {re}", recv.len())));
        }
        r.send = send.as_ptr() as *const u8;
        r.recv = recv.as_mut_ptr() as *mut u8;
        Ok(r)
    };
    /// All-to-all with per-peer counts (PyTorch's `all_to_all_single` with splits).
    fn alltoallv<T>(&self, send: &'scope [T], send_counts: &[usize], send_displs: &[usize], recv: &'scope mut [T], recv_counts: &[usize], recv_displs: &[usize]) => |b: &Build| {
        let v = VCounts { send_counts: send_counts.to_vec(), send_displs: send_displs.to_vec(), recv_counts: recv_counts.to_vec(), recv_displs: recv_displs.to_vec() };
        let (mut r, se, re) = b.v::<T>(Collective::AllToAllV, v)?;
        if send.len() < se || recv.len() < re {
            return Err(bad(b.rank(), "alltoallv", format!("buffers of {} / {} elements, counts need {se} / {re}", send.len(), recv.len())));
        }
        r.send = send.as_ptr() as *const u8;
        r.recv = recv.as_mut_ptr() as *mut u8;
        Ok(r)
    };
    /// Gather to `root`: rank i's `send` lands in block i of the root's `recv`.
    fn gather<T>(&self, send: &'scope [T], recv: &'scope mut [T], root: usize) => |b: &Build| {
        b.op(Collective::Gather, (send.len(), root, NONE), send, recv)
    };
    /// Scatter from `root`: block i of the root's `send` lands in rank i's `recv`.
    fn scatter<T>(&self, send: &'scope [T], recv: &'scope mut [T], root: usize) => |b: &Build| {
        b.op(Collective::Scatter, (recv.len(), root, NONE), send, recv)
    };
}

impl Communicator {
    pub(crate) fn run_blocking(&self, op: RawOp) -> Result<()> {
        let t = self.inner.ticket();
        // SAFETY: the typed wrappers hold the borrows of every buffer `op`
        // points to until this returns.
        unsafe { self.inner.run_ordered(t, &op) }
    }

    /// The memory the transport to each peer moves, indexed by rank as
    /// [`Communicator::transports`]: [`MemoryKind::Host`] for every kind,
    /// and [`MemoryKind::Device`] where the kind goes device to device
    /// (device pieces over the others are staged through host memory).
    pub fn memory_kinds(&self) -> Vec<&'static [MemoryKind]> {
        self.transports()
            .iter()
            .map(|k| crate::setup::memory_kinds_of(k))
            .collect()
    }

    /// Waits until every rank has called `barrier`.
    pub fn barrier(&self) -> Result<()> {
        self.run_blocking(RawOp::new(Collective::Barrier, DataType::Uint8, 0))
    }

    /// Sends `buf` to `peer` (matched in order with the peer's `recv`).
    ///
    /// `peer` may not be this rank: a send to self completes only with a
    /// receive from self in the same [`Communicator::group`] (NCCL's group
    /// semantics; alone it would wait forever there), so here it is an
    /// [`Error::InvalidArgument`].
    pub fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<()> {
        self.group(|g| g.send(buf, peer))
    }

    /// Receives into `buf` from `peer` (not this rank; see
    /// [`Communicator::send`]).
    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<()> {
        self.group(|g| g.recv(buf, peer))
    }

    /// Runs the sends and receives registered by `f` together; they
    /// progress concurrently and all complete when this returns (like
    /// `ncclGroupStart` / `ncclGroupEnd`).
    ///
    /// A peer may be this rank itself: the k-th send to self is copied into
    /// the k-th receive from self (same byte count); a send to self without
    /// its receive in the group, or the reverse, is an
    /// [`Error::InvalidArgument`] and nothing of the group runs.
    ///
    /// ```no_run
    /// # let comm = sncl::Communicator::from_env()?;
    /// let (n, r) = (comm.size(), comm.rank());
    /// let out = vec![r as u32; 4];
    /// let mut got = vec![0u32; 4];
    /// // A ring shift; with one rank, a copy to itself.
    /// comm.group(|g| {
    ///     g.send(&out, (r + 1) % n);
    ///     g.recv(&mut got, (r + n - 1) % n);
    /// })?;
    /// # Ok::<(), sncl::Error>(())
    /// ```
    pub fn group<'a>(&self, f: impl FnOnce(&mut Group<'a>)) -> Result<()> {
        let mut g = Group {
            ops: Vec::new(),
            error: None,
            _bufs: PhantomData,
        };
        f(&mut g);
        if let Some(e) = g.error {
            return Err(e);
        }
        if g.ops.is_empty() {
            return Ok(());
        }
        let mut op = RawOp::new(Collective::SendRecv, DataType::Uint8, 0);
        op.p2p = g.ops;
        self.inner.prepare(&mut op)?;
        self.run_blocking(op)
    }
}

impl<'a> Group<'a> {
    /// Adds a send of `buf` to `peer`.
    pub fn send<T: Element>(&mut self, buf: &'a [T], peer: usize) {
        self.ops.push(P2p {
            peer,
            is_send: true,
            ptr: buf.as_ptr() as *mut u8,
            count: buf.len(),
            dtype: T::DTYPE,
        });
    }

    /// Adds a receive into `buf` from `peer`.
    pub fn recv<T: Element>(&mut self, buf: &'a mut [T], peer: usize) {
        self.ops.push(P2p {
            peer,
            is_send: false,
            ptr: buf.as_mut_ptr() as *mut u8,
            count: buf.len(),
            dtype: T::DTYPE,
        });
    }
}
