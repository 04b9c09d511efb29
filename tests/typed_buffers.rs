//! The one typed API over every memory kind: each collective row runs the
//! same call on host slices and on device views (the emulated device),
//! blocking on the communicator and queued in a scope, and the results
//! agree bit for bit; buffers that cannot go together are refused before
//! anything runs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sncl::device::{
    self, Backend, Device, DeviceBuffer, DeviceSlice, DeviceSliceMut, StreamHandle,
};
use sncl::{Buffer, BufferMut, Collective, Communicator, Config, ReduceOp};

const RANKS: usize = 3;
const COUNT: usize = 257;
const ROOT: usize = 1;

/// The rows with one buffer.
const IN_PLACE: [Collective; 5] = [
    Collective::AllReduce,
    Collective::ReduceScatter,
    Collective::AllGather,
    Collective::Broadcast,
    Collective::Reduce,
];

/// (send, recv) lengths of `coll` on `rank`.
fn extents(coll: Collective, rank: usize) -> (usize, usize) {
    let (k, n, root) = (COUNT, RANKS, rank == ROOT);
    match coll {
        Collective::AllReduce | Collective::Broadcast => (k, k),
        Collective::ReduceScatter => (n * k, k),
        Collective::AllGather => (k, n * k),
        Collective::Reduce => (k, if root { k } else { 0 }),
        Collective::AllToAll => (n * k, n * k),
        Collective::Gather => (k, if root { n * k } else { 0 }),
        Collective::Scatter => (if root { n * k } else { 0 }, k),
        other => unreachable!("{other:?}"),
    }
}

/// The in-place buffer's length for `coll`.
fn in_place_len(coll: Collective) -> usize {
    match coll {
        Collective::ReduceScatter | Collective::AllGather => RANKS * COUNT,
        _ => COUNT,
    }
}

fn input(rank: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((rank * 31 + i * 7) % 23) as f32 * 0.75 - 8.0)
        .collect()
}

/// Runs the out-of-place row `coll`, blocking or queued in a scope.
fn run<S, R>(
    comm: &Communicator,
    coll: Collective,
    scoped: bool,
    send: S,
    recv: R,
) -> sncl::Result<()>
where
    S: Buffer<Elem = f32> + Send,
    R: BufferMut<Elem = f32> + Send,
{
    let op = ReduceOp::Sum;
    if scoped {
        return comm.scope(|s| {
            match coll {
                Collective::AllReduce => s.all_reduce(send, recv, op),
                Collective::ReduceScatter => s.reduce_scatter(send, recv, op),
                Collective::AllGather => s.all_gather(send, recv),
                Collective::Broadcast => s.broadcast_from(send, recv, ROOT),
                Collective::Reduce => s.reduce(send, recv, op, ROOT),
                Collective::AllToAll => s.alltoall(send, recv),
                Collective::Gather => s.gather(send, recv, ROOT),
                Collective::Scatter => s.scatter(send, recv, ROOT),
                other => unreachable!("{other:?}"),
            }?
            .wait()
        });
    }
    match coll {
        Collective::AllReduce => comm.all_reduce(send, recv, op),
        Collective::ReduceScatter => comm.reduce_scatter(send, recv, op),
        Collective::AllGather => comm.all_gather(send, recv),
        Collective::Broadcast => comm.broadcast_from(send, recv, ROOT),
        Collective::Reduce => comm.reduce(send, recv, op, ROOT),
        Collective::AllToAll => comm.alltoall(send, recv),
        Collective::Gather => comm.gather(send, recv, ROOT),
        Collective::Scatter => comm.scatter(send, recv, ROOT),
        other => unreachable!("{other:?}"),
    }
}

/// Runs the in-place row `coll` (blocking).
fn run_in_place<B: BufferMut<Elem = f32>>(
    comm: &Communicator,
    coll: Collective,
    buf: B,
) -> sncl::Result<()> {
    let op = ReduceOp::Sum;
    match coll {
        Collective::AllReduce => comm.all_reduce_in_place(buf, op),
        Collective::ReduceScatter => comm.reduce_scatter_in_place(buf, op),
        Collective::AllGather => comm.all_gather_in_place(buf),
        Collective::Broadcast => comm.broadcast(buf, ROOT),
        Collective::Reduce => comm.reduce_in_place(buf, op, ROOT),
        other => unreachable!("{other:?}"),
    }
}

struct Dev {
    dev: Arc<dyn Device>,
    stream: StreamHandle,
}

impl Dev {
    fn upload(&self, host: &[f32]) -> DeviceBuffer {
        let buf = DeviceBuffer::new(&self.dev, host.len().max(1) * 4).expect("allocation");
        // SAFETY: `host` outlives the synchronisation below.
        unsafe {
            self.dev
                .copy_h2d_async(buf.ptr(), host.as_ptr().cast(), host.len() * 4, self.stream)
        }
        .expect("upload");
        self.sync();
        buf
    }

    fn download(&self, buf: &DeviceBuffer, len: usize) -> Vec<f32> {
        let mut out = vec![0f32; len];
        // SAFETY: `out` outlives the synchronisation below.
        unsafe {
            self.dev
                .copy_d2h_async(out.as_mut_ptr().cast(), buf.ptr(), len * 4, self.stream)
        }
        .expect("download");
        self.sync();
        out
    }

    fn sync(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        self.dev
            .synchronize(self.stream, deadline)
            .expect("synchronize");
    }
}

fn per_rank(f: impl Fn(&Communicator, &Dev) -> Result<(), String> + Sync) {
    let config = Config {
        timeout: Duration::from_secs(30),
        ..Default::default()
    };
    let comms = Communicator::init_threads(RANKS, config).expect("init");
    let errs: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                let f = &f;
                s.spawn(move || {
                    let dev = device::open(Backend::Emu, c.rank()).map_err(|e| e.to_string())?;
                    let stream = dev.create_stream().map_err(|e| e.to_string())?;
                    f(c, &Dev { dev, stream }).map_err(|e| format!("rank {}: {e}", c.rank()))
                })
            })
            .collect();
        hs.into_iter()
            .filter_map(|h| h.join().unwrap().err())
            .collect()
    });
    assert!(errs.is_empty(), "{errs:#?}");
}

#[test]
fn every_row_agrees_on_host_and_device_memory() {
    per_rank(|c, d| {
        let rank = c.rank();
        // The rows with a send and a receive buffer: every collective of
        // uniform counts.
        for coll in Collective::UNIFORM {
            let (se, re) = extents(coll, rank);
            let send = input(rank, se);
            let mut want = vec![0f32; re];
            run(c, coll, false, &send[..], &mut want[..]).map_err(|e| e.to_string())?;
            for scoped in [false, true] {
                let dsend = d.upload(&send);
                let mut drecv = d.upload(&vec![0f32; re]);
                let sv = DeviceSlice::<f32>::new(&dsend, d.stream).slice(0..se);
                let rv = DeviceSliceMut::<f32>::new(&mut drecv, d.stream).narrow(0..re);
                run(c, coll, scoped, sv, rv).map_err(|e| format!("{coll:?}: {e}"))?;
                let got = d.download(&drecv, re);
                if got
                    .iter()
                    .map(|x| x.to_bits())
                    .ne(want.iter().map(|x| x.to_bits()))
                {
                    return Err(format!(
                        "{coll:?} (scoped {scoped}): device differs from host"
                    ));
                }
            }
        }
        for coll in IN_PLACE {
            let len = in_place_len(coll);
            let mut host = input(rank, len);
            let mut dbuf = d.upload(&host);
            run_in_place(c, coll, &mut host[..]).map_err(|e| e.to_string())?;
            let view = DeviceSliceMut::<f32>::new(&mut dbuf, d.stream).narrow(0..len);
            run_in_place(c, coll, view).map_err(|e| format!("{coll:?} in place: {e}"))?;
            let got = d.download(&dbuf, len);
            // Reduce writes the root only; the rest of each buffer is the
            // same input on both.
            if got
                .iter()
                .map(|x| x.to_bits())
                .ne(host.iter().map(|x| x.to_bits()))
            {
                return Err(format!("{coll:?} in place: device differs from host"));
            }
        }
        Ok(())
    });
}

#[test]
fn buffers_that_cannot_go_together_are_refused() {
    per_rank(|c, d| {
        let host = vec![1f32; COUNT];
        let mut dbuf = d.upload(&host);
        let other = d.dev.create_stream().map_err(|e| e.to_string())?;
        let dsend = d.upload(&host);
        // Host input, device output.
        let e = c
            .all_reduce(
                &host[..],
                DeviceSliceMut::<f32>::new(&mut dbuf, d.stream),
                ReduceOp::Sum,
            )
            .expect_err("host and device mixed");
        if !e
            .to_string()
            .contains("host and device buffers cannot be mixed")
        {
            return Err(format!("mixed memory: {e}"));
        }
        // Two streams.
        let e = c
            .all_reduce(
                DeviceSlice::<f32>::new(&dsend, other),
                DeviceSliceMut::<f32>::new(&mut dbuf, d.stream),
                ReduceOp::Sum,
            )
            .expect_err("two streams");
        if !e.to_string().contains("different streams") {
            return Err(format!("two streams: {e}"));
        }
        // Lengths are checked as on the host.
        let e = c
            .all_reduce(
                DeviceSlice::<f32>::new(&dsend, d.stream).slice(0..COUNT - 1),
                DeviceSliceMut::<f32>::new(&mut dbuf, d.stream),
                ReduceOp::Sum,
            )
            .expect_err("lengths differ");
        if !e.to_string().contains("recv") {
            return Err(format!("lengths: {e}"));
        }
        // Variable counts with a count missing: refused by what is wrong.
        let counts = vec![1; RANKS - 1];
        let displs: Vec<usize> = (0..RANKS).collect();
        let e = c
            .all_gatherv(
                DeviceSlice::<f32>::new(&dsend, d.stream).slice(0..1),
                DeviceSliceMut::<f32>::new(&mut dbuf, d.stream),
                &counts,
                &displs,
            )
            .expect_err("all_gatherv with a count missing");
        if !e.to_string().contains("one per rank") {
            return Err(format!("all_gatherv: {e}"));
        }
        // Views of one allocation made from raw pointers can alias: an
        // out-of-place row refuses overlapping buffers.
        let p = dbuf.ptr();
        // SAFETY: both views are the COUNT f32 of `dbuf`, which outlives
        // them; the call is refused before anything is enqueued.
        let (whole, part) = unsafe {
            (
                DeviceSlice::<f32>::from_raw(d.dev.clone(), p, COUNT, d.stream),
                sncl::device::DeviceSliceMut::<f32>::from_raw(d.dev.clone(), p, COUNT, d.stream),
            )
        };
        let e = c
            .all_reduce(whole, part, ReduceOp::Sum)
            .expect_err("aliased buffers");
        if !e.to_string().contains("overlaps the receive buffer") {
            return Err(format!("overlap: {e}"));
        }
        // Every rank refused the same calls locally: a collective still
        // matches afterwards.
        let mut one = [1u32];
        c.all_reduce_in_place(&mut one, ReduceOp::Sum)
            .map_err(|e| e.to_string())?;
        if one[0] != RANKS as u32 {
            return Err(format!("after the refusals: {} ranks, not {RANKS}", one[0]));
        }
        // SAFETY: nothing was enqueued on `other` (every call was refused).
        unsafe { d.dev.destroy_stream(other) }.map_err(|e| e.to_string())
    });
}

/// Variable counts on device buffers are checked before the communicator
/// binds to their device: a refused call binds nothing.
#[test]
fn variable_counts_on_device_buffers_bind_nothing() {
    per_rank(|c, d| {
        let mut dbuf = d.upload(&[0f32; RANKS]);
        let one = d.upload(&[1f32]);
        let (counts, displs) = (vec![1; RANKS], (1..=RANKS).collect::<Vec<_>>());
        let e = c
            .all_gatherv(
                DeviceSlice::<f32>::new(&one, d.stream),
                DeviceSliceMut::<f32>::new(&mut dbuf, d.stream),
                &counts,
                &displs,
            )
            .expect_err("the last block ends past the receive buffer");
        if !e.to_string().contains("counts and displacements need") {
            return Err(format!("all_gatherv: {e}"));
        }
        match c.bound_device() {
            None => Ok(()),
            Some(_) => Err("a refused all_gatherv bound the communicator".into()),
        }
    });
}
