//! `--device`: the benchmark on device buffers (emu or cuda). Times come
//! from device events on the caller's stream around the timed iterations;
//! results are checked by copying them back and comparing them with the
//! same collective run on host buffers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sncl::device::{self, Backend, Device, DeviceBuffer, StreamHandle};
use sncl::{Communicator, DeviceOp, DeviceTransfer, P2p, RawOp, Result};

use crate::cases::{input_bytes, Bench, Case, Timing, Values};

/// Where the benchmark's buffers live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Where {
    Host,
    Device(Backend),
}

impl Where {
    /// Parses `--device`; without it: cuda when device 0 opens, else host.
    pub fn choose(arg: Option<&str>) -> std::result::Result<Where, String> {
        match arg {
            None => Ok(if device::open(Backend::Cuda, 0).is_ok() {
                Where::Device(Backend::Cuda)
            } else {
                Where::Host
            }),
            Some("host") => Ok(Where::Host),
            Some(name) => {
                let b = Backend::from_name(name)
                    .ok_or_else(|| format!("--device {name}: expected host, emu or cuda"))?;
                // Fail once, before any rank starts, when it cannot open.
                device::open(b, 0).map_err(|e| format!("--device {name}: {e}"))?;
                Ok(Where::Device(b))
            }
        }
    }
}

/// One rank's device: opened, bound to `comm`, with a stream and the
/// benchmark's two buffers, allocated once for the largest case (as
/// nccl-tests does): allocating or freeing synchronises a CUDA device, and
/// with ranks as threads of one process, a rank allocating while another
/// rank's stream waits for the collective both are in is a deadlock.
pub struct Dev {
    pub dev: Arc<dyn Device>,
    stream: StreamHandle,
    send: DeviceBuffer,
    recv: DeviceBuffer,
}

impl Dev {
    /// `max_bytes`: the most either buffer of any case holds.
    pub fn open(comm: &Communicator, backend: Backend, max_bytes: usize) -> Result<Dev> {
        let rank = comm.rank();
        let err = |e: device::DeviceError| sncl::Error::InvalidArgument {
            rank,
            op: "commbench --device",
            detail: e.to_string(),
        };
        // One emulated device per rank; CUDA ranks of one node take their
        // own GPU when there are enough, else device 0.
        let ordinal = match backend {
            Backend::Emu => rank % 8,
            Backend::Cuda => rank,
        };
        let dev = device::open(backend, ordinal)
            .or_else(|_| device::open(backend, 0))
            .map_err(err)?;
        comm.bind_device(dev.clone())?;
        // The device links now, as NCCL sets them up at init: not between
        // the first upload and the first collective.
        comm.connect_device()?;
        let stream = dev.create_stream().map_err(err)?;
        let bytes = max_bytes.max(256);
        let send = DeviceBuffer::new(&dev, bytes).map_err(err)?;
        let recv = DeviceBuffer::new(&dev, bytes).map_err(err)?;
        Ok(Dev {
            dev,
            stream,
            send,
            recv,
        })
    }

    pub fn describe(&self) -> String {
        format!(
            "{} device {} ({})",
            self.dev.backend().name(),
            self.dev.ordinal(),
            self.dev.name()
        )
    }
}

/// This rank's (send, receive) extents in elements, as the host cases
/// and the communicator's checks compute them.
fn extents(c: &Case, n: usize, rank: usize) -> (usize, usize) {
    if c.bench == Bench::SendRecv {
        // A ring shift: `count` each way.
        return (c.count, c.count);
    }
    let shape =
        comm_core::shape::OpShape::new(c.bench.collective(), c.dtype, c.count, n).with_root(c.root);
    (shape.send_elems(rank), shape.recv_elems(rank))
}

/// Times a compressed all_reduce on device buffers (in place on a device
/// copy of the input, restored before each call); with `-c`, counts the
/// elements that differ from the host form's result on the same input
/// (the device codecs are bit-identical to the host's).
fn run_compressed(comm: &Communicator, d: &mut Dev, c: &Case) -> Result<(Timing, Option<Timing>)> {
    let (codec, scope) = c.compress.as_ref().expect("compressed case");
    let (n, rank) = (comm.size(), comm.rank());
    let described = d.describe();
    let fail = |what: &str, e: device::DeviceError| sncl::Error::InvalidArgument {
        rank,
        op: "all_reduce_compressed",
        detail: format!("{what} on {described}: {e}"),
    };
    let input = input_bytes(
        sncl::DataType::Float32,
        rank,
        c.count,
        c.op,
        Values::of(comm),
    );
    let fits = |b: &DeviceBuffer| input.len() <= b.bytes();
    if !fits(&d.send) || !fits(&d.recv) {
        return Err(fail(
            "sizing",
            device::DeviceError::InvalidArgument {
                ordinal: d.dev.ordinal(),
                call: "commbench",
                detail: format!("{} bytes exceed the benchmark's buffers", input.len()),
            },
        ));
    }
    let Dev {
        dev,
        stream,
        send: pristine,
        recv: buf,
    } = d;
    let (dev, stream) = (&*dev, *stream);
    // SAFETY: `input` lives until the stream is synchronised below.
    unsafe { dev.copy_h2d_async(pristine.ptr(), input.as_ptr(), input.len(), stream) }
        .map_err(|e| fail("upload", e))?;
    let deadline = || Instant::now() + Duration::from_secs(600);
    dev.synchronize(stream, deadline())
        .map_err(|e| fail("synchronize", e))?;
    let once = |buf: &mut DeviceBuffer| -> Result<()> {
        // SAFETY: both buffers hold `input.len()` bytes and outlive the
        // call, which synchronises the stream before it returns.
        unsafe { dev.copy_d2d_async(buf.ptr(), pristine.ptr(), input.len(), stream) }
            .map_err(|e| fail("restore the input", e))?;
        let view = sncl::device::DeviceSliceMut::<f32>::new(buf, stream).narrow(0..c.count);
        comm.all_reduce_compressed(view, c.op, codec, None, *scope)
    };
    for _ in 0..c.warmup {
        once(buf)?;
    }
    let t0 = Instant::now();
    for _ in 0..c.iters {
        once(buf)?;
    }
    let us = t0.elapsed().as_secs_f64() * 1e6 / c.iters.max(1) as f64;
    let mut wrong = 0u64;
    if c.check {
        once(buf)?;
        let mut got = vec![0f32; c.count];
        // SAFETY: `got` lives until the synchronisation below.
        unsafe { dev.copy_d2h_async(got.as_mut_ptr().cast(), buf.ptr(), c.count * 4, stream) }
            .map_err(|e| fail("download", e))?;
        dev.synchronize(stream, deadline())
            .map_err(|e| fail("synchronize", e))?;
        let mut want: Vec<f32> = input
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        comm.all_reduce_compressed(&mut want, c.op, codec, None, *scope)?;
        wrong = got
            .iter()
            .zip(&want)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count() as u64;
    }
    let mut sum = [0u64; 2];
    comm.all_reduce(&[wrong, (us * 1e3) as u64], &mut sum, sncl::ReduceOp::Sum)?;
    let mean_us = sum[1] as f64 / 1e3 / n as f64;
    Ok((
        Timing {
            mean_us,
            median_us: mean_us,
            wrong: sum[0],
            own_wrong: wrong,
            traffic: sncl::Stats::default(),
        },
        None,
    ))
}

/// Runs a case on device buffers; (timing, no in-place row).
pub fn run_case(comm: &Communicator, d: &mut Dev, c: &Case) -> Result<(Timing, Option<Timing>)> {
    if c.compress.is_some() {
        return run_compressed(comm, d, c);
    }
    let (n, rank) = (comm.size(), comm.rank());
    let name = c.bench.collective().name();
    let fail = |what: &str, e: device::DeviceError| sncl::Error::InvalidArgument {
        rank,
        op: name,
        detail: format!("{what} on {}: {e}", d.describe()),
    };
    let esize = c.dtype.size();
    let (se, re) = extents(c, n, rank);
    let send = input_bytes(c.dtype, rank, se, c.op, Values::of(comm));
    if send.len() > d.send.bytes() || re * esize > d.recv.bytes() {
        return Err(fail(
            "sizing",
            device::DeviceError::InvalidArgument {
                ordinal: d.dev.ordinal(),
                call: "commbench",
                detail: format!(
                    "{} and {} bytes exceed the benchmark's buffers",
                    send.len(),
                    re * esize
                ),
            },
        ));
    }
    let (dsend, drecv) = (&d.send, &d.recv);
    // SAFETY: `send` lives until the stream is synchronised below.
    unsafe {
        d.dev
            .copy_h2d_async(dsend.ptr(), send.as_ptr(), send.len(), d.stream)
    }
    .map_err(|e| fail("upload", e))?;
    let mut op = DeviceOp::new(
        c.bench.collective(),
        c.dtype,
        c.count,
        dsend.ptr(),
        drecv.ptr(),
        d.stream,
    );
    op.op = c.op;
    op.root = c.root;
    // The call's settings (--tag, --max-ctas) over the calling thread's tag.
    op.config = c.config.or_tag(op.config.tag);
    // sendrecv: a ring shift, as on host buffers.
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    let ring = [
        DeviceTransfer::send(dsend.ptr(), c.count, c.dtype, next),
        DeviceTransfer::recv(drecv.ptr(), c.count, c.dtype, prev),
    ];
    let enqueue = || -> Result<sncl::RawWork> {
        // SAFETY: the buffers live until every handle is waited for.
        unsafe {
            if c.bench == Bench::SendRecv {
                comm.send_recv_device_raw(&ring, d.stream)
            } else {
                comm.enqueue_device(op)
            }
        }
    };
    let run = || -> Result<()> { enqueue()?.wait() };
    // The traffic (and tags) of the warm-up and timed runs, as on host
    // buffers.
    let before = comm.stats();
    for _ in 0..c.warmup {
        run()?;
    }
    let graph = if c.graph_launches > 0 {
        let captured = crate::graph::capture(d.stream, || {
            for _ in 0..c.iters {
                run().map_err(|e| e.to_string())?;
            }
            Ok(())
        });
        Some(captured.map_err(|e| sncl::Error::InvalidArgument {
            rank,
            op: name,
            detail: format!("capturing {} iterations into a CUDA graph: {e}", c.iters),
        })?)
    } else {
        None
    };
    let (start, end) = (
        d.dev.create_event().map_err(|e| fail("event", e))?,
        d.dev.create_event().map_err(|e| fail("event", e))?,
    );
    d.dev
        .record_event(start, d.stream)
        .map_err(|e| fail("event", e))?;
    let mut works = Vec::with_capacity(c.iters);
    let launches = match &graph {
        Some(g) => {
            for _ in 0..c.graph_launches {
                g.launch(d.stream)
                    .map_err(|e| sncl::Error::InvalidArgument {
                        rank,
                        op: name,
                        detail: e,
                    })?;
            }
            c.graph_launches * c.iters
        }
        None => {
            for _ in 0..c.iters {
                works.push(enqueue()?);
            }
            c.iters
        }
    };
    d.dev
        .record_event(end, d.stream)
        .map_err(|e| fail("event", e))?;
    for w in works {
        w.wait()?;
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    d.dev
        .synchronize(d.stream, deadline)
        .map_err(|e| fail("synchronize", e))?;
    let ms = d
        .dev
        .event_elapsed_ms(start, end)
        .map_err(|e| fail("timing", e))?;
    let traffic = comm.stats().since(&before);
    // SAFETY: both events were created above and are not used again.
    unsafe {
        let _ = d.dev.destroy_event(start);
        let _ = d.dev.destroy_event(end);
    }
    let mut wrong = 0u64;
    if c.check {
        let mut got = vec![0u8; re * esize];
        // SAFETY: `got` lives until the synchronisation below.
        unsafe {
            d.dev
                .copy_d2h_async(got.as_mut_ptr(), drecv.ptr(), got.len(), d.stream)
        }
        .map_err(|e| fail("download", e))?;
        d.dev
            .synchronize(d.stream, deadline)
            .map_err(|e| fail("synchronize", e))?;
        let mut want = vec![0u8; re * esize];
        let mut raw = RawOp::new(c.bench.collective(), c.dtype, c.count);
        raw.op = c.op;
        raw.root = c.root;
        raw.send = send.as_ptr();
        raw.recv = want.as_mut_ptr();
        if c.bench == Bench::SendRecv {
            raw.p2p = vec![
                P2p {
                    peer: next,
                    is_send: true,
                    ptr: send.as_ptr() as *mut u8,
                    count: c.count,
                    dtype: c.dtype,
                },
                P2p {
                    peer: prev,
                    is_send: false,
                    ptr: want.as_mut_ptr(),
                    count: c.count,
                    dtype: c.dtype,
                },
            ];
        }
        // SAFETY: the host vectors cover the extents and outlive the call.
        unsafe { comm.run_raw(&raw) }?;
        wrong = got
            .chunks(esize)
            .zip(want.chunks(esize))
            .filter(|(a, b)| a != b)
            .count() as u64;
    }
    let mut sum = [0u64; 2];
    comm.all_reduce(
        &[
            wrong,
            (ms as f64 * 1e3 / launches.max(1) as f64 * 1e3) as u64,
        ],
        &mut sum,
        sncl::ReduceOp::Sum,
    )?;
    let mean_us = sum[1] as f64 / 1e3 / n as f64;
    Ok((
        Timing {
            mean_us,
            median_us: mean_us,
            wrong: sum[0],
            own_wrong: wrong,
            traffic,
        },
        None,
    ))
}
