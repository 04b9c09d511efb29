//! The device test kit shared by the device-collective and nvlink tests:
//! inputs, cases run on host and device buffers and compared bit for bit,
//! ranks bound to emulated devices, and a device fault injected on rank 1.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use half::{bf16, f16};
use sncl::device::{self, Backend, Device, DeviceBuffer, StreamHandle};
use sncl::{Collective, Communicator, DataType, DeviceOp, RawOp, ReduceOp};

/// Input element `i` of `rank` (small values: no overflow surprises, exact
/// in f16/bf16, distinct across ranks).
pub fn input(dtype: DataType, rank: usize, count: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(count * dtype.size());
    for i in 0..count {
        let v = ((rank * 31 + i * 7) % 23) as i64 - 11;
        match dtype {
            DataType::Float32 => out.extend((v as f32 * 0.75).to_le_bytes()),
            DataType::Float64 => out.extend((v as f64 * 0.75).to_le_bytes()),
            DataType::Int8 => out.push(v as i8 as u8),
            DataType::Uint32 => out.extend(((rank * 1000 + i) as u32).to_le_bytes()),
            DataType::Int64 => out.extend((v * 100_000 + i as i64).to_le_bytes()),
            DataType::Uint64 => out.extend(((rank * 1000 + i * 3) as u64).to_le_bytes()),
            DataType::Float16 => out.extend(f16::from_f32(v as f32 * 0.75).to_le_bytes()),
            DataType::Bfloat16 => out.extend(bf16::from_f32(v as f32 * 0.75).to_le_bytes()),
            DataType::Int32 => out.extend((v as i32 * 1000 + i as i32).to_le_bytes()),
            DataType::Uint8 => out.push((rank * 37 + i * 11) as u8),
            DataType::Float8e4m3 => out.push(kernels::F8E4M3::from_f32(v as f32 * 0.75).to_bits()),
            DataType::Float8e5m2 => out.push(kernels::F8E5M2::from_f32(v as f32 * 0.75).to_bits()),
        }
    }
    out
}

#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub coll: Collective,
    pub dtype: DataType,
    pub op: ReduceOp,
    /// The root, modulo the rank count.
    pub root: usize,
    pub count: usize,
}

/// (send, recv) elements on `rank` (NCCL's conventions).
pub fn extents(c: &Case, n: usize, rank: usize) -> (usize, usize) {
    let k = c.count;
    match c.coll {
        Collective::AllReduce => (k, k),
        Collective::ReduceScatter => (n * k, k),
        Collective::AllGather => (k, n * k),
        Collective::Broadcast => (k, k),
        Collective::Reduce => (k, if rank == c.root % n { k } else { 0 }),
        Collective::AllToAll => (n * k, n * k),
        Collective::Gather => (k, if rank == c.root % n { n * k } else { 0 }),
        Collective::Scatter => (if rank == c.root % n { n * k } else { 0 }, k),
        other => panic!("no extents for {other:?}"),
    }
}

/// The most bytes either buffer of one case holds (the large-count cases:
/// 1,000,003 elements × 4 ranks × 8 bytes fit).
pub const CASE_BUFFER_BYTES: usize = 40 << 20;

/// One rank: its communicator, bound device, stream, and the send and
/// receive buffers every case uses, allocated once ([`Rank::new`]):
/// allocating synchronises a CUDA device, and with ranks as threads of one
/// process on one device, a rank allocating while another rank's stream
/// waits in the collective both are in is a deadlock (NCCL's rule too:
/// allocate before the collectives).
pub struct Rank {
    pub comm: Communicator,
    pub dev: Arc<dyn Device>,
    pub stream: StreamHandle,
    pub send: DeviceBuffer,
    pub recv: DeviceBuffer,
}

impl Rank {
    /// A rank on `dev` (which `comm` is bound to) with a stream, and its
    /// case buffers.
    pub fn new(comm: Communicator, dev: Arc<dyn Device>, stream: StreamHandle) -> Rank {
        let alloc = || DeviceBuffer::new(&dev, CASE_BUFFER_BYTES).expect("the case buffers");
        let (send, recv) = (alloc(), alloc());
        Rank {
            comm,
            dev,
            stream,
            send,
            recv,
        }
    }
}

/// The backend the device suites run on: the emulated device by default;
/// `SNCL_TEST_DEVICE=cuda` runs them on the `cuda` backend — on a GPU, or
/// on the strict CUDA driver model (`SNCL_TEST_DEVICE=cuda
/// scripts/cuda-model.sh target/debug/deps/device_collectives-*`;
/// docs/CUDA-MODEL.md says what that does today).
pub fn test_backend() -> Backend {
    match std::env::var("SNCL_TEST_DEVICE").as_deref() {
        Err(_) | Ok("") | Ok("emu") => Backend::Emu,
        Ok("cuda") => Backend::Cuda,
        Ok(other) => panic!("SNCL_TEST_DEVICE={other}: expected emu or cuda"),
    }
}

/// Binds `comm` to device `rank` of [`test_backend`] (device 0 where the
/// machine has fewer) with a stream of its own.
pub fn bind_rank(comm: Communicator) -> Rank {
    let backend = test_backend();
    let dev = device::open(backend, comm.rank())
        .or_else(|_| device::open(backend, 0))
        .unwrap_or_else(|e| panic!("{} device for rank {}: {e}", backend.name(), comm.rank()));
    comm.bind_device(dev.clone()).expect("bind_device");
    let stream = dev.create_stream().expect("stream");
    Rank::new(comm, dev, stream)
}

/// Runs `case` on host buffers and on device buffers; returns a mismatch.
pub fn run_case(r: &Rank, c: &Case) -> Result<(), String> {
    let (n, rank) = (r.comm.size(), r.comm.rank());
    let esize = c.dtype.size();
    let (se, re) = extents(c, n, rank);
    let send = input(c.dtype, rank, se);
    let fill = vec![0xa5u8; re * esize];
    // Host reference, same communicator and schedule.
    let mut want = fill.clone();
    let mut raw = RawOp::new(c.coll, c.dtype, c.count);
    raw.op = c.op;
    raw.root = c.root % n;
    raw.send = send.as_ptr();
    raw.recv = want.as_mut_ptr();
    // SAFETY: both vectors cover the extents and outlive the call.
    unsafe { r.comm.run_raw(&raw) }.map_err(|e| format!("host {c:?}: {e}"))?;
    // Device: upload, collective, download, all ordered by the stream only.
    if send.len().max(fill.len()) > CASE_BUFFER_BYTES {
        return Err(format!(
            "{c:?}: larger than the kit's {CASE_BUFFER_BYTES}-byte buffers"
        ));
    }
    let (dsend, drecv) = (&r.send, &r.recv);
    let mut got = vec![0u8; fill.len()];
    // SAFETY: the host vectors outlive the stream synchronisation below;
    // the device ranges are the buffers' own.
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
    d.root = c.root % n;
    // SAFETY: the buffers live until after `wait` below.
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
                    let mut errs = Vec::new();
                    for c in cases {
                        if let Err(e) = run_case(r, c) {
                            errs.push(e);
                        }
                    }
                    errs
                })
            })
            .collect();
        hs.into_iter()
            .flat_map(|h| h.join().expect("rank thread panicked"))
            .collect()
    })
}

/// An in-place f32 sum all-reduce of `count` elements of `buf` on `r`'s
/// stream, waited for.
pub fn all_reduce_device(r: &Rank, buf: &DeviceBuffer, count: usize) -> Result<(), String> {
    // SAFETY: `buf` is borrowed until after `wait`.
    let w = unsafe {
        r.comm.all_reduce_device_raw(
            buf.ptr(),
            buf.ptr(),
            count,
            DataType::Float32,
            ReduceOp::Sum,
            r.stream,
        )
    }
    .map_err(|e| format!("enqueue: {e}"))?;
    w.wait().map_err(|e| e.to_string())
}

/// Every rank runs one all-reduce of `count` elements, with a device fault
/// (`fault`) injected on rank 1 first; each rank's outcome.
pub fn all_reduce_with_fault_on_rank_1(
    ranks: &[Rank],
    count: usize,
    fault: &str,
) -> Vec<Result<(), String>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter()
            .map(|r| {
                s.spawn(move || {
                    assert!(count * 4 <= CASE_BUFFER_BYTES);
                    // A first operation sets the device links and the
                    // kernel path up, so the fault hits the measured one.
                    all_reduce_device(r, &r.send, 1)?;
                    if r.comm.rank() == 1 {
                        r.dev.inject_fault(fault).map_err(|e| e.to_string())?;
                    }
                    all_reduce_device(r, &r.send, count)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("no panic"))
            .collect()
    })
}

/// f32 and bf16 cases of `colls` at each count: sum, and avg for bf16
/// all_reduce; root 1 (taken modulo the rank count).
pub fn cases_of(colls: &[Collective], counts: &[usize]) -> Vec<Case> {
    let mut v = Vec::new();
    for &count in counts {
        for dtype in [DataType::Float32, DataType::Bfloat16] {
            for &coll in colls {
                let op = if coll == Collective::AllReduce && dtype == DataType::Bfloat16 {
                    ReduceOp::Avg
                } else {
                    ReduceOp::Sum
                };
                v.push(Case {
                    coll,
                    dtype,
                    op,
                    root: 1,
                    count,
                });
            }
        }
    }
    v
}

/// Re-executes this test binary as `n` ranks running test `test`, each
/// with `env` plus `{prefix}_RANK`, `{prefix}_N` and `{prefix}_ID` (a
/// fresh unique id on loopback), output piped.
pub fn spawn_ranks(
    n: usize,
    test: &str,
    prefix: &str,
    env: &[(&str, &str)],
) -> Vec<std::process::Child> {
    use std::process::{Command, Stdio};
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let id =
        sncl::UniqueId::new(format!("127.0.0.1:{port}").parse().expect("address")).expect("id");
    let exe = std::env::current_exe().expect("test binary");
    (0..n)
        .map(|rank| {
            Command::new(&exe)
                .args([test, "--exact", "--nocapture", "--test-threads=1"])
                .envs(env.iter().copied())
                .env(format!("{prefix}_RANK"), rank.to_string())
                .env(format!("{prefix}_N"), n.to_string())
                .env(format!("{prefix}_ID"), id.to_hex())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawning a rank")
        })
        .collect()
}

/// Waits for every child, each on its own thread so that a child that
/// exits is reaped at once (a zombie still counts as a live process to
/// the peers' liveness probes); returns (rank, success, output).
pub fn join_ranks(children: Vec<std::process::Child>) -> Vec<(usize, bool, String)> {
    let waiters: Vec<_> = children
        .into_iter()
        .map(|c| std::thread::spawn(move || c.wait_with_output().expect("waiting for a rank")))
        .collect();
    waiters
        .into_iter()
        .enumerate()
        .map(|(rank, w)| {
            let out = w.join().expect("waiter thread");
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            (rank, out.status.success(), text)
        })
        .collect()
}

/// The child side of [`spawn_ranks`]: this rank's `{prefix}_RANK`, the
/// world size `{prefix}_N` and the unique id `{prefix}_ID`.
pub fn spawned_rank(prefix: &str) -> (usize, usize, sncl::UniqueId) {
    let var = |k: String| std::env::var(&k).unwrap_or_else(|_| panic!("{k} unset"));
    let rank = var(format!("{prefix}_RANK")).parse().expect("rank");
    let n = var(format!("{prefix}_N")).parse().expect("n");
    let id = sncl::UniqueId::from_hex(&var(format!("{prefix}_ID"))).expect("unique id");
    (rank, n, id)
}

/// Ends this rank process with SIGKILL (no exit handler runs, as when a
/// rank is killed), while its peers wait for it.
pub fn kill_this_process() -> ! {
    let pid = std::process::id().to_string();
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &pid])
        .status();
    std::thread::sleep(Duration::from_secs(60));
    unreachable!("SIGKILL did not end the process");
}

/// A survivor's check after peer `dead` was killed mid-operation: the
/// error `e` names the dead peer, and came within `deadline` (`took`).
///
/// The survivor then stays a moment, as a program reporting the error
/// would: a survivor that exited at once would be reported as gone itself
/// by a survivor that had not yet read its abort notice (docs/RDMA.md §3a),
/// which is true but names the wrong rank.
pub fn assert_names_dead_peer(
    rank: usize,
    e: &str,
    dead: usize,
    took: Duration,
    deadline: Duration,
) {
    eprintln!("rank {rank}: failed after {took:?}: {e}");
    assert!(
        e.contains(&format!("rank {dead}")),
        "does not name the dead peer: {e}"
    );
    assert!(
        took < deadline,
        "took {took:?}, the deadline is {deadline:?}"
    );
    std::thread::sleep(SURVIVOR_STAY);
}

/// How long a survivor stays after its verdict (see
/// [`assert_names_dead_peer`]): longer than a peer's detection of a death
/// takes on the emulated fabric (the CI log showed 136 ms).
const SURVIVOR_STAY: Duration = Duration::from_millis(1500);
