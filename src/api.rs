//! The typed collectives, one row each for buffers of every memory kind
//! ([`crate::Buffer`]). Each validates its buffers against the counts and
//! the rank count (rejecting bad input before anything is sent), builds a
//! raw operation, and runs it inline (blocking forms on [`Communicator`]) or
//! queues it (non-blocking forms on [`Scope`]); device buffers go the
//! device path, in their stream's order ([`crate::device`]).

use std::marker::PhantomData;

use comm_core::shape::{OpShape, ShapeError};
use comm_core::transport::registry::MemoryKind;
use comm_core::wire::Collective;
use comm_core::{DataType, Error, ReduceOp, Result};

use crate::buffer::{Buffer, BufferMut, DeviceId, Location, Stream};
use crate::comm::{Inner, P2p, RawOp, VCounts};
use crate::device::{DeviceOp, DevicePtr};
use crate::work::{DeviceJobMaker, Group, RawWork, Scope, Work};
use crate::{CollConfig, Communicator, Element};

fn bad(rank: usize, op: &'static str, detail: String) -> Error {
    Error::InvalidArgument { rank, op, detail }
}

/// Where a checked operation goes: run now (the blocking forms on
/// [`Communicator`]) or queued on the progress thread ([`Scope`]).
trait Submit {
    type Out;
    /// A host operation whose buffers stay lent until `Out` says so.
    fn host(self, op: RawOp) -> Result<Self::Out>;
    /// A device operation, ordered on its stream by `make`.
    fn device(self, make: DeviceJobMaker) -> Result<Self::Out>;
}

/// The blocking forms: the operation has completed when they return.
struct Blocking<'c>(&'c Communicator);

impl Submit for Blocking<'_> {
    type Out = ();
    fn host(self, op: RawOp) -> Result<()> {
        self.0.run_blocking(op)
    }
    fn device(self, make: DeviceJobMaker) -> Result<()> {
        RawWork::from_state(self.0.worker.submit_with(make)).wait()
    }
}

/// The non-blocking forms: buffers stay borrowed until the scope ends.
struct Queued<'scope, 'env>(&'scope Scope<'scope, 'env>);

impl<'scope> Submit for Queued<'scope, '_> {
    type Out = Work<'scope>;
    fn host(self, op: RawOp) -> Result<Work<'scope>> {
        Ok(self.0.enqueue(op))
    }
    fn device(self, make: DeviceJobMaker) -> Result<Work<'scope>> {
        Ok(self.0.enqueue_with(make))
    }
}

/// Builders shared by the blocking and non-blocking forms: every op is
/// checked once by the communicator ([`Inner::prepare`], which keeps its
/// shape in the op), the buffers are checked against that shape's
/// extents, and their memory kind picks the host or the device path.
struct Build<'c> {
    comm: &'c Communicator,
    inner: &'c Inner,
    /// The call's own settings ([`Communicator::configured`]).
    config: CollConfig,
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
        self.configure(&mut r)?;
        let p = self.inner.prepare(&mut r)?;
        Ok((r, p.shape))
    }

    /// Gives `r` the call's settings, checked as far as the memory kind
    /// does not matter (a protocol on host memory is refused where the
    /// host path takes the op).
    fn configure(&self, r: &mut RawOp) -> Result<()> {
        if self.config != CollConfig::default() {
            self.config.check(self.rank(), r.coll, true)?;
            r.config = self.config.or_tag(r.config.tag);
        }
        Ok(())
    }

    /// An out-of-place operation of `count` elements: the buffers this
    /// rank uses must have the shape's extents.
    fn op<S, R, K>(
        &self,
        coll: Collective,
        (count, root, op): (usize, usize, ReduceOp),
        send: S,
        recv: R,
        to: K,
    ) -> Result<K::Out>
    where
        S: Buffer,
        R: BufferMut<Elem = S::Elem>,
        K: Submit,
    {
        let (r, shape) = self.raw::<S::Elem>(coll, count, root, op)?;
        shape
            .check_buffers(self.rank(), send.len(), recv.len())
            .map_err(|e| bad(self.rank(), coll.name(), e.to_string()))?;
        let uses = (shape.uses_send(self.rank()), shape.uses_recv(self.rank()));
        self.lend(r, send, recv, uses, to)
    }

    /// An in-place operation of `count` elements on `buf`, laid out as
    /// [`OpShape::in_place`] says.
    fn in_place<B, K>(
        &self,
        coll: Collective,
        (count, root, op): (usize, usize, ReduceOp),
        mut buf: B,
        to: K,
    ) -> Result<K::Out>
    where
        B: BufferMut,
        K: Submit,
    {
        let name = coll.name();
        let (mut r, shape) = self.raw::<B::Elem>(coll, count, root, op)?;
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
        let esize = r.dtype.size();
        // Host memory (the hot path): nothing to place.
        let place = match buf.kind() {
            MemoryKind::Host => None,
            MemoryKind::Device => self.place(name, [(buf.location(), buf.len())])?,
        };
        let stream = place.map(|(_, s)| s);
        let lent = buf.lend_mut(stream.as_ref());
        // The layout's offsets lie within its `elems`, which is
        // `buf.len()` (checked above): both addresses stay inside `buf`.
        let (send, recv) = (
            lent.addr + layout.input_at * esize,
            lent.addr + layout.output_at * esize,
        );
        match &stream {
            None => {
                r.send = send as *const u8;
                r.recv = recv as *mut u8;
                to.host(r)
            }
            Some(s) => self.device(&r, (send, recv), s, to),
        }
    }

    /// A variable-count op (`v`): checked, with this rank's extents
    /// (send, receive) in elements.
    fn v<T: Element>(&self, coll: Collective, v: VCounts) -> Result<(RawOp, usize, usize)> {
        let mut r = RawOp::new(coll, T::DTYPE, 0);
        r.v = Some(Box::new(v));
        self.configure(&mut r)?;
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

    /// Where an operation on buffers at `locations` (with the lengths this
    /// rank uses; an unused or empty buffer goes with any) runs: `None` on
    /// the host, else the device and the stream (the last device buffer's,
    /// i.e. the output's). Host and device memory cannot be mixed, device
    /// buffers must live on the communicator's device (binding it on first
    /// use) and raw streams must agree.
    fn place<const N: usize>(
        &self,
        name: &'static str,
        locations: [(Location, usize); N],
    ) -> Result<Option<(DeviceId, Stream)>> {
        let rank = self.rank();
        // No allocation here: this runs before every host operation.
        let any_used = locations.iter().any(|(_, len)| *len > 0);
        let considered = |len: usize| !any_used || len > 0;
        let (mut host, mut device) = (false, false);
        for (l, len) in &locations {
            if considered(*len) {
                match l.kind() {
                    MemoryKind::Host => host = true,
                    MemoryKind::Device => device = true,
                }
            }
        }
        if !device {
            return Ok(None);
        }
        if host {
            return Err(bad(
                rank,
                name,
                "host and device buffers cannot be mixed in one operation".into(),
            ));
        }
        // Every device buffer must live on the communicator's device (the
        // first operation binds it, to the receive side's device first),
        // also one this rank does not use.
        for (i, (l, _)) in locations.iter().enumerate().rev() {
            let what = if i + 1 == N {
                "the receive buffer"
            } else {
                "the send buffer"
            };
            if let Location::Device { device, .. } = l {
                self.comm.bind_or_check_id(name, what, device)?;
            }
        }
        let mut placed = None;
        for (l, len) in locations {
            let Location::Device { device, stream } = l else {
                continue;
            };
            if !considered(len) {
                continue;
            }
            if let Some((_, prev)) = &placed {
                match (prev, &stream) {
                    (Stream::Handle(a), Stream::Handle(b)) => {
                        if a != b {
                            return Err(bad(
                                rank,
                                name,
                                format!(
                                    "the buffers are ordered on different streams ({:#x} and {:#x})",
                                    a.0, b.0
                                ),
                            ));
                        }
                    }
                    #[cfg(feature = "cuda")]
                    (Stream::Cuda(_), Stream::Cuda(_)) => {}
                    #[cfg(feature = "cuda")]
                    _ => {
                        return Err(bad(
                            rank,
                            name,
                            "cudarc slices and sncl device views cannot be mixed in one operation"
                                .into(),
                        ))
                    }
                }
            }
            placed = Some((device, stream));
        }
        Ok(placed)
    }

    /// Lends `send` and `recv` (`uses`: whether this rank uses each) to
    /// `r` and submits it on the host or device path their memory says.
    fn lend<S, R, K>(
        &self,
        mut r: RawOp,
        send: S,
        mut recv: R,
        uses: (bool, bool),
        to: K,
    ) -> Result<K::Out>
    where
        S: Buffer,
        R: BufferMut,
        K: Submit,
    {
        // Host memory on both sides (the hot path): nothing to place.
        if send.kind() == MemoryKind::Host && recv.kind() == MemoryKind::Host {
            r.send = send.lend(None).addr as *const u8;
            r.recv = recv.lend_mut(None).addr as *mut u8;
            return to.host(r);
        }
        let name = r.coll.name();
        let len = |used: bool, len: usize| if used { len } else { 0 };
        let place = self.place(
            name,
            [
                (send.location(), len(uses.0, send.len())),
                (recv.location(), len(uses.1, recv.len())),
            ],
        )?;
        let stream = place.map(|(_, s)| s);
        let lens = (send.len(), recv.len());
        // cudarc's guards (in `Lent`) record their events when dropped,
        // after the operation was submitted.
        let (s, d) = (send.lend(stream.as_ref()), recv.lend_mut(stream.as_ref()));
        match &stream {
            None => {
                r.send = s.addr as *const u8;
                r.recv = d.addr as *mut u8;
                to.host(r)
            }
            Some(st) => {
                // Host borrows cannot alias; device views made from raw
                // pointers can: only NCCL's in-place forms may overlap, and
                // those go through the in-place rows.
                let esize = r.dtype.size();
                let span = |addr: usize, used: bool, len: usize| {
                    let bytes = if used { len.saturating_mul(esize) } else { 0 };
                    (addr, addr.saturating_add(bytes))
                };
                let a = span(s.addr, uses.0, lens.0);
                let b = span(d.addr, uses.1, lens.1);
                if a.0 < b.1 && b.0 < a.1 {
                    return Err(bad(
                        self.rank(),
                        name,
                        format!(
                            "the send buffer ({:#x}, {} bytes) overlaps the receive buffer \
                             ({:#x}, {} bytes); an in-place operation takes its in-place form",
                            a.0,
                            a.1 - a.0,
                            b.0,
                            b.1 - b.0
                        ),
                    ));
                }
                self.device(&r, (s.addr, d.addr), st, to)
            }
        }
    }

    /// Submits the checked op `r` on device addresses `send` and `recv`,
    /// ordered on `stream`.
    fn device<K: Submit>(
        &self,
        r: &RawOp,
        (send, recv): (usize, usize),
        stream: &Stream,
        to: K,
    ) -> Result<K::Out> {
        if r.v.is_some() {
            let buffers = (DevicePtr(send as u64), DevicePtr(recv as u64));
            let make = self
                .comm
                .prepare_device_v(r.clone(), buffers, stream.handle())?;
            return to.device(make);
        }
        let mut d = DeviceOp::new(
            r.coll,
            r.dtype,
            r.count,
            DevicePtr(send as u64),
            DevicePtr(recv as u64),
            stream.handle(),
        );
        d.op = r.op;
        d.root = r.root;
        d.config = r.config;
        to.device(self.comm.prepare_device(d)?)
    }
}

/// No reduction (the collectives that do not reduce).
const NONE: ReduceOp = ReduceOp::Sum;

/// A communicator's blocking collectives with per-call settings: the
/// algorithm, chunk, protocol and tag of [`CollConfig`] for every call made
/// through it ([`Communicator::configured`]).
pub struct Configured<'c> {
    comm: &'c Communicator,
    config: CollConfig,
}

/// A scope's non-blocking collectives with per-call settings
/// ([`Scope::configured`]).
pub struct ConfiguredScope<'scope, 'env> {
    scope: &'scope Scope<'scope, 'env>,
    config: CollConfig,
}

impl Communicator {
    /// The collectives with `config`'s settings for each call (NCCL 2.31's
    /// `ncclCollConfig_t`): `comm.configured(&cfg).all_reduce(..)`. The
    /// settings are checked with each call, before anything is sent; every
    /// rank passes the same ones.
    pub fn configured(&self, config: &CollConfig) -> Configured<'_> {
        Configured {
            comm: self,
            config: *config,
        }
    }
}

impl<'scope, 'env> Scope<'scope, 'env> {
    /// The non-blocking collectives with `config`'s settings for each call.
    pub fn configured(&'scope self, config: &CollConfig) -> ConfiguredScope<'scope, 'env> {
        ConfiguredScope {
            scope: self,
            config: *config,
        }
    }
}

/// One row per collective: a blocking form on [`Communicator`] and a
/// non-blocking one on [`Scope`], for buffers of any memory kind.
macro_rules! collectives {
    ($($(#[$doc:meta])* fn $name:ident<$($gen:ident: $bound:path),*>(&self $(, $arg:ident : $ty:ty)*)
        => |$b:ident, $to:ident| $build:expr;)*) => {
        impl Communicator {
            $(
                $(#[$doc])*
                pub fn $name<$($gen: $bound),*>(&self $(, $arg: $ty)*) -> Result<()>
                {
                    let $b = Build { comm: self, inner: &self.inner, config: CollConfig::default() };
                    let $to = Blocking(self);
                    $build
                }
            )*
        }
        impl Configured<'_> {
            $(
                $(#[$doc])*
                ///
                /// With this view's per-call settings ([`CollConfig`]).
                pub fn $name<$($gen: $bound),*>(&self $(, $arg: $ty)*) -> Result<()>
                {
                    let $b = Build { comm: self.comm, inner: &self.comm.inner, config: self.config };
                    let $to = Blocking(self.comm);
                    $build
                }
            )*
        }
        impl<'scope> ConfiguredScope<'scope, '_> {
            $(
                $(#[$doc])*
                ///
                /// Non-blocking, with this view's per-call settings
                /// ([`CollConfig`]): returns a [`Work`] handle; the buffers
                /// stay borrowed until the scope ends.
                pub fn $name<$($gen: $bound + 'scope),*>(&self $(, $arg: $ty)*) -> Result<Work<'scope>>
                {
                    let $b = Build { comm: self.scope.comm, inner: &self.scope.comm.inner, config: self.config };
                    let $to = Queued(self.scope);
                    $build
                }
            )*
        }
        impl<'scope> Scope<'scope, '_> {
            $(
                $(#[$doc])*
                ///
                /// Non-blocking: returns a [`Work`] handle; the buffers stay
                /// borrowed until the scope ends.
                pub fn $name<$($gen: $bound + 'scope),*>(&'scope self $(, $arg: $ty)*) -> Result<Work<'scope>>
                {
                    let $b = Build { comm: self.comm, inner: &self.comm.inner, config: CollConfig::default() };
                    let $to = Queued(self);
                    $build
                }
            )*
        }
    };
}

collectives! {
    /// All-reduce: `recv[i] = op over ranks of send[i]`.
    fn all_reduce<S: Buffer, R: BufferMut<Elem = S::Elem>>(&self, send: S, recv: R, op: ReduceOp) => |b, to| {
        b.op(Collective::AllReduce, (send.len(), 0, op), send, recv, to)
    };
    /// In-place all-reduce of `buf`.
    fn all_reduce_in_place<B: BufferMut>(&self, buf: B, op: ReduceOp) => |b, to| {
        b.in_place(Collective::AllReduce, (buf.len(), 0, op), buf, to)
    };
    /// Reduce-scatter: `send` holds one block of `recv.len()` elements per
    /// rank; rank r receives block r reduced over all ranks.
    fn reduce_scatter<S: Buffer, R: BufferMut<Elem = S::Elem>>(&self, send: S, recv: R, op: ReduceOp) => |b, to| {
        b.op(Collective::ReduceScatter, (recv.len(), 0, op), send, recv, to)
    };
    /// In-place reduce-scatter: `buf` holds one block per rank; the result
    /// lands in this rank's block `buf[rank*c..(rank+1)*c]`.
    fn reduce_scatter_in_place<B: BufferMut>(&self, buf: B, op: ReduceOp) => |b, to| {
        let c = b.multiple(Collective::ReduceScatter, buf.len())?;
        b.in_place(Collective::ReduceScatter, (c, 0, op), buf, to)
    };
    /// All-gather: `recv` receives every rank's `send`, in rank order.
    fn all_gather<S: Buffer, R: BufferMut<Elem = S::Elem>>(&self, send: S, recv: R) => |b, to| {
        b.op(Collective::AllGather, (send.len(), 0, NONE), send, recv, to)
    };
    /// In-place all-gather: this rank's block of `buf` is its contribution.
    fn all_gather_in_place<B: BufferMut>(&self, buf: B) => |b, to| {
        let c = b.multiple(Collective::AllGather, buf.len())?;
        b.in_place(Collective::AllGather, (c, 0, NONE), buf, to)
    };
    /// Broadcast `buf` from `root` to every rank, in place.
    fn broadcast<B: BufferMut>(&self, buf: B, root: usize) => |b, to| {
        b.in_place(Collective::Broadcast, (buf.len(), root, NONE), buf, to)
    };
    /// Broadcast out of place: the root sends `send`; every rank receives into `recv`
    /// (`send` is ignored on other ranks).
    fn broadcast_from<S: Buffer, R: BufferMut<Elem = S::Elem>>(&self, send: S, recv: R, root: usize) => |b, to| {
        b.op(Collective::Broadcast, (recv.len(), root, NONE), send, recv, to)
    };
    /// Reduce to `root`: the root's `recv` receives the reduction of every
    /// rank's `send` (`recv` may be empty on other ranks).
    fn reduce<S: Buffer, R: BufferMut<Elem = S::Elem>>(&self, send: S, recv: R, op: ReduceOp, root: usize) => |b, to| {
        b.op(Collective::Reduce, (send.len(), root, op), send, recv, to)
    };
    /// In-place reduce: on the root `buf` is replaced by the reduction.
    fn reduce_in_place<B: BufferMut>(&self, buf: B, op: ReduceOp, root: usize) => |b, to| {
        b.in_place(Collective::Reduce, (buf.len(), root, op), buf, to)
    };
    /// All-to-all: block j of `send` goes to rank j; block i of `recv` comes from rank i.
    fn alltoall<S: Buffer, R: BufferMut<Elem = S::Elem>>(&self, send: S, recv: R) => |b, to| {
        let c = b.multiple(Collective::AllToAll, send.len())?;
        b.op(Collective::AllToAll, (c, 0, NONE), send, recv, to)
    };
    /// All-gather with per-rank counts: rank i's `send` (of `counts[i]`
    /// elements) lands at `recv[displs[i]..]`.
    fn all_gatherv<S: Buffer, R: BufferMut<Elem = S::Elem>>(&self, send: S, recv: R, counts: &[usize], displs: &[usize]) => |b, to| {
        let v = VCounts { send_counts: vec![], send_displs: vec![], recv_counts: counts.to_vec(), recv_displs: displs.to_vec() };
        let (r, se, re) = b.v::<S::Elem>(Collective::AllGatherV, v)?;
        if send.len() != se {
            let e = ShapeError::Length { what: "send", got: send.len(), want: se };
            return Err(bad(b.rank(), "all_gatherv", e.to_string()));
        }
        if recv.len() < re {
            return Err(bad(b.rank(), "all_gatherv", format!("recv has {} elements, counts and displacements need {re}", recv.len())));
        }
        b.lend(r, send, recv, (true, true), to)
    };
    /// All-to-all with per-peer counts (PyTorch's `all_to_all_single` with splits).
    fn alltoallv<S: Buffer, R: BufferMut<Elem = S::Elem>>(&self, send: S, send_counts: &[usize], send_displs: &[usize], recv: R, recv_counts: &[usize], recv_displs: &[usize]) => |b, to| {
        let v = VCounts { send_counts: send_counts.to_vec(), send_displs: send_displs.to_vec(), recv_counts: recv_counts.to_vec(), recv_displs: recv_displs.to_vec() };
        let (r, se, re) = b.v::<S::Elem>(Collective::AllToAllV, v)?;
        if send.len() < se || recv.len() < re {
            return Err(bad(b.rank(), "alltoallv", format!("buffers of {} / {} elements, counts need {se} / {re}", send.len(), recv.len())));
        }
        b.lend(r, send, recv, (true, true), to)
    };
    /// Gather to `root`: rank i's `send` lands in block i of the root's `recv`.
    fn gather<S: Buffer, R: BufferMut<Elem = S::Elem>>(&self, send: S, recv: R, root: usize) => |b, to| {
        b.op(Collective::Gather, (send.len(), root, NONE), send, recv, to)
    };
    /// Scatter from `root`: block i of the root's `send` lands in rank i's `recv`.
    fn scatter<S: Buffer, R: BufferMut<Elem = S::Elem>>(&self, send: S, recv: R, root: usize) => |b, to| {
        b.op(Collective::Scatter, (recv.len(), root, NONE), send, recv, to)
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
            device_ops: Vec::new(),
            error: None,
            _bufs: PhantomData,
        };
        f(&mut g);
        if let Some(e) = g.error {
            return Err(e);
        }
        if !g.device_ops.is_empty() {
            if !g.ops.is_empty() {
                return Err(bad(
                    self.rank(),
                    "sendrecv",
                    "host and device buffers cannot be mixed in one group".into(),
                ));
            }
            return self.run_device_group(g.device_ops);
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
    /// Adds a send of `buf` to `peer`: host memory (`&[T]`, `&Vec<T>`,
    /// ...) or a device view ([`crate::device::DeviceSlice`], ...); one
    /// group's buffers are all host or all device memory, the device ones
    /// on one stream.
    pub fn send<B: Buffer + 'a>(&mut self, buf: B, peer: usize) {
        match buf.kind() {
            MemoryKind::Host => self.ops.push(P2p {
                peer,
                is_send: true,
                ptr: buf.lend(None).addr as *mut u8,
                count: buf.len(),
                dtype: <B::Elem as Element>::DTYPE,
            }),
            MemoryKind::Device => self
                .device_ops
                .push(crate::buffer::GroupDeviceOp::send(buf, peer)),
        }
    }

    /// Adds a receive into `buf` from `peer` (memory kinds as
    /// [`Group::send`]).
    pub fn recv<B: BufferMut + 'a>(&mut self, mut buf: B, peer: usize) {
        match buf.kind() {
            MemoryKind::Host => {
                let count = buf.len();
                let ptr = buf.lend_mut(None).addr as *mut u8;
                self.ops.push(P2p {
                    peer,
                    is_send: false,
                    ptr,
                    count,
                    dtype: <B::Elem as Element>::DTYPE,
                })
            }
            MemoryKind::Device => self
                .device_ops
                .push(crate::buffer::GroupDeviceOp::recv(buf, peer)),
        }
    }
}
