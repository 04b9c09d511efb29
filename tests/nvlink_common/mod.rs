//! Shared by the nvlink tests: configuration, inputs, and one case run on
//! host and device buffers and compared bit for bit.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use comm_core::config::TransportChoice;
use half::bf16;
use sncl::device::{self, Backend, Device, DeviceBuffer, StreamHandle};
use sncl::{Collective, Communicator, Config, DataType, DeviceOp, RawOp, ReduceOp};

/// Tests of one binary that read the process-wide
/// `transport_nvlink::device_bytes` counters hold this, so that another
/// test's bytes do not count as theirs.
pub static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Holds [`SERIAL`] (a test that failed while holding it does not matter).
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn config() -> Config {
    Config {
        timeout: Duration::from_secs(30),
        chunk_bytes: 4096,
        // Inbox slots of 8 × 4 KiB = 32 KiB, 4 of them: the larger counts
        // below take several slots and wrap the inbox.
        shm_slot_bytes: 4096,
        shm_slots: 4,
        transport: TransportChoice::parse("nvlink").expect("a transport name"),
        ..Default::default()
    }
}

pub fn input(dtype: DataType, rank: usize, count: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(count * dtype.size());
    for i in 0..count {
        let v = ((rank * 31 + i * 7) % 23) as f32 - 11.0;
        match dtype {
            DataType::Float32 => out.extend((v * 0.75).to_le_bytes()),
            DataType::Bfloat16 => out.extend(bf16::from_f32(v * 0.75).to_le_bytes()),
            other => panic!("no input for {other:?}"),
        }
    }
    out
}

#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub coll: Collective,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub count: usize,
}

pub fn extents(c: &Case, n: usize) -> (usize, usize) {
    let k = c.count;
    match c.coll {
        Collective::AllReduce | Collective::Broadcast => (k, k),
        Collective::ReduceScatter => (n * k, k),
        Collective::AllGather => (k, n * k),
        other => panic!("no extents for {other:?}"),
    }
}

pub struct Rank {
    pub comm: Communicator,
    pub dev: Arc<dyn Device>,
    pub stream: StreamHandle,
}

pub fn ranks(n: usize) -> Vec<Rank> {
    let comms = Communicator::init_threads(n, config()).expect("init over nvlink");
    comms.into_iter().map(bind).collect()
}

/// Checks that every peer is connected over nvlink and binds the
/// communicator to emulated device `rank`.
pub fn bind(comm: Communicator) -> Rank {
    for (p, kind) in comm.transports().iter().enumerate() {
        if p != comm.rank() {
            assert_eq!(*kind, "nvlink", "rank {} to {p}", comm.rank());
        }
    }
    let dev = device::open(Backend::Emu, comm.rank()).expect("emulated device");
    comm.bind_device(dev.clone()).expect("bind_device");
    let stream = dev.create_stream().expect("stream");
    Rank { comm, dev, stream }
}

/// Runs `c` on host buffers, then on device buffers; returns a mismatch.
pub fn run_case(r: &Rank, c: &Case) -> Result<(), String> {
    let (n, rank) = (r.comm.size(), r.comm.rank());
    let (se, re) = extents(c, n);
    let esize = c.dtype.size();
    let send = input(c.dtype, rank, se);
    let fill = vec![0xa5u8; re * esize];
    let mut want = fill.clone();
    let mut raw = RawOp::new(c.coll, c.dtype, c.count);
    raw.op = c.op;
    raw.root = 1 % n;
    raw.send = send.as_ptr();
    raw.recv = want.as_mut_ptr();
    // SAFETY: both vectors cover the extents and outlive the call.
    unsafe { r.comm.run_raw(&raw) }.map_err(|e| format!("host {c:?}: {e}"))?;
    let dsend = DeviceBuffer::new(&r.dev, send.len()).map_err(|e| e.to_string())?;
    let drecv = DeviceBuffer::new(&r.dev, fill.len()).map_err(|e| e.to_string())?;
    let mut got = vec![0u8; fill.len()];
    // SAFETY: the host vectors outlive the synchronisation below.
    unsafe {
        r.dev
            .copy_h2d_async(dsend.ptr(), send.as_ptr(), send.len(), r.stream)
            .map_err(|e| e.to_string())?;
        r.dev
            .copy_h2d_async(drecv.ptr(), fill.as_ptr(), fill.len(), r.stream)
            .map_err(|e| e.to_string())?;
    }
    let mut d = DeviceOp::new(c.coll, c.dtype, c.count, dsend.ptr(), drecv.ptr(), r.stream);
    d.op = c.op;
    d.root = 1 % n;
    // SAFETY: the buffers live until after `wait`.
    let work = unsafe { r.comm.enqueue_device(d) }.map_err(|e| format!("device {c:?}: {e}"))?;
    // SAFETY: `got` outlives the synchronisation.
    unsafe {
        r.dev
            .copy_d2h_async(got.as_mut_ptr(), drecv.ptr(), got.len(), r.stream)
    }
    .map_err(|e| e.to_string())?;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    r.dev
        .synchronize(r.stream, deadline)
        .map_err(|e| format!("device {c:?}: stream: {e}"))?;
    work.wait().map_err(|e| format!("device {c:?}: {e}"))?;
    if got != want {
        let first = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
        return Err(format!(
            "rank {rank}/{n} {c:?}: device result differs from the host's at byte {first} of {}",
            got.len()
        ));
    }
    Ok(())
}

pub fn run_all(ranks: &[Rank], cases: &[Case]) -> Vec<String> {
    std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter()
            .map(|r| {
                s.spawn(move || {
                    cases
                        .iter()
                        .filter_map(|c| run_case(r, c).err())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter()
            .flat_map(|h| h.join().expect("rank thread panicked"))
            .collect()
    })
}

pub fn cases(counts: &[usize]) -> Vec<Case> {
    let mut v = Vec::new();
    for &count in counts {
        for dtype in [DataType::Float32, DataType::Bfloat16] {
            for coll in [
                Collective::AllReduce,
                Collective::ReduceScatter,
                Collective::AllGather,
                Collective::Broadcast,
            ] {
                let op = if matches!(coll, Collective::AllReduce) && dtype == DataType::Bfloat16 {
                    ReduceOp::Avg
                } else {
                    ReduceOp::Sum
                };
                v.push(Case {
                    coll,
                    dtype,
                    op,
                    count,
                });
            }
        }
    }
    v
}
