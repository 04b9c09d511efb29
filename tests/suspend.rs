//! `Communicator::suspend` / `resume` (NCCL's `ncclCommSuspend` with
//! `NCCL_SUSPEND_MEM` and `ncclCommResume`): the peer buffers go (what
//! `mem_stats` reports drops to what stays: windows, the flight recorder),
//! operations are refused while suspended, and after a resume the same
//! operations give bitwise the same results, over shared memory, TCP and
//! the emulated RDMA provider (connected at first use), several times.

mod lazy_kit;
mod rank_kit;

use std::time::Duration;

use comm_core::config::TransportChoice;
use rank_kit::timed_on_ranks;
use sncl::{Communicator, Config, Error, MemStats, Purpose, ReduceOp, Residence};

fn config(transport: TransportChoice, timeout: Duration) -> Config {
    Config {
        timeout,
        transport,
        ..Config::default()
    }
}

/// `f` on every rank (one thread each), the results in rank order.
fn on_each<R: Send>(
    comms: &[Communicator],
    f: impl Fn(usize, &Communicator) -> R + Sync,
) -> Vec<R> {
    timed_on_ranks(comms, f)
        .into_iter()
        .map(|(r, _)| r)
        .collect()
}

/// Rank `r`'s input: values whose float sum depends on the order.
fn input(r: usize) -> Vec<f32> {
    (0..50_000)
        .map(|i| ((i * 7 + r * 13) % 101) as f32 * 0.1 + 1.0 / (r as f32 + 3.0))
        .collect()
}

fn all_reduce_bits(c: &Communicator, r: usize) -> Vec<u32> {
    let mut v = input(r);
    c.all_reduce_in_place(&mut v[..], ReduceOp::Sum)
        .unwrap_or_else(|e| panic!("rank {r}: all_reduce: {e}"));
    v.iter().map(|x| x.to_bits()).collect()
}

/// Bytes that a suspend releases.
fn peer_bytes(m: &MemStats) -> u64 {
    m.releasable()
}

/// Three suspend/resume cycles on `comms`: buffers released and restored,
/// operations refused in between, results bitwise as before.
fn cycles(comms: &[Communicator]) {
    let n = comms.len();
    on_each(comms, |r, c| {
        let first = all_reduce_bits(c, r);
        let before = c.mem_stats();
        assert!(peer_bytes(&before) > 0, "{before}");
        for cycle in 0..3 {
            let held = c.mem_stats();
            assert_eq!(held.suspended, 0, "rank {r}: {held}");
            let t = std::time::Instant::now();
            c.suspend()
                .unwrap_or_else(|e| panic!("rank {r} cycle {cycle}: suspend: {e}"));
            let suspend_ms = t.elapsed().as_secs_f64() * 1e3;
            assert!(c.is_suspended());
            let m = c.mem_stats();
            assert_eq!(m.connected_peers, 0, "rank {r}: {m}");
            assert_eq!(peer_bytes(&m), 0, "rank {r}: {m}");
            assert_eq!(m.suspended, held.releasable(), "rank {r}: {m}");
            assert_eq!(
                m.total_bytes() + m.suspended,
                held.total_bytes(),
                "rank {r}: what stays and what went make what was: {held} / {m}"
            );
            assert!(m.of(Purpose::FlightRecorder) > 0, "rank {r}: {m}");
            // Refused on this rank alone, at once, naming the suspend.
            let mut v = input(r);
            let e = c
                .all_reduce_in_place(&mut v[..], ReduceOp::Sum)
                .expect_err("an all-reduce on a suspended communicator");
            assert!(
                matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains("suspended"),
                "rank {r}: {e}"
            );
            assert_eq!(v, input(r), "a refused all-reduce leaves the buffer");
            let peer = (r + 1) % n;
            let e = c
                .send(&[1u8; 4][..], peer)
                .expect_err("a send while suspended");
            assert!(e.to_string().contains("suspended"), "rank {r}: {e}");
            let t = std::time::Instant::now();
            c.resume()
                .unwrap_or_else(|e| panic!("rank {r} cycle {cycle}: resume: {e}"));
            assert!(!c.is_suspended());
            if r == 0 {
                eprintln!(
                    "rank 0 of {n}, cycle {cycle}: {} B of peer buffers before, {} B \
                     suspended; suspend {suspend_ms:.2} ms, resume {:.2} ms",
                    peer_bytes(&before),
                    peer_bytes(&m),
                    t.elapsed().as_secs_f64() * 1e3
                );
            }
            assert_eq!(all_reduce_bits(c, r), first, "rank {r} cycle {cycle}");
            // Point-to-point traffic runs on the new connections too.
            let mut got = [0u64; 3];
            let (to, from) = ((r + 1) % n, (r + n - 1) % n);
            if r % 2 == 0 {
                c.send(&[r as u64; 3][..], to).unwrap();
                c.recv(&mut got[..], from).unwrap();
            } else {
                c.recv(&mut got[..], from).unwrap();
                c.send(&[r as u64; 3][..], to).unwrap();
            }
            assert_eq!(got, [from as u64; 3], "rank {r} cycle {cycle}");
        }
        let after = c.mem_stats();
        assert_eq!(
            after.of(Purpose::Fifo),
            before.of(Purpose::Fifo),
            "rank {r}: the FIFOs come back as they were: {before} / {after}"
        );
    });
}

#[test]
fn shared_memory_buffers_go_and_come_back() {
    // Shared memory named: another test of this binary binds emulated
    // devices, which makes nvlink the automatic choice.
    let comms =
        Communicator::init_threads(4, config(TransportChoice::Shm, Duration::from_secs(20)))
            .expect("init");
    cycles(&comms);
    for c in &comms {
        assert!(c.mem_stats().total(Residence::Shared) > 0);
    }
}

#[test]
fn tcp_buffers_go_and_come_back() {
    let comms =
        Communicator::init_threads(3, config(TransportChoice::Tcp, Duration::from_secs(20)))
            .expect("init");
    cycles(&comms);
}

#[test]
fn rdma_pairs_connected_at_first_use_connect_again_after_a_resume() {
    let comms = lazy_kit::init(3, 0x5e5e, true);
    // Nothing connected before the first operation.
    assert_eq!(lazy_kit::connected(&comms), vec![0, 0, 0]);
    cycles(&comms);
    // The ring's two neighbours, connected again at their first use.
    assert_eq!(lazy_kit::connected(&comms), vec![2, 2, 2]);
}

#[test]
fn a_communicator_created_through_rank_0s_tcp_store_resumes_in_it() {
    cycles(&lazy_kit::init_over_tcp_store(3));
}

#[test]
fn misuse_is_refused_and_leaves_the_communicator_usable() {
    let comms =
        Communicator::init_threads(2, config(TransportChoice::Auto, Duration::from_secs(20)))
            .expect("init");
    on_each(&comms, |r, c| {
        let e = c.resume().expect_err("a resume without a suspend");
        assert!(e.to_string().contains("not suspended"), "rank {r}: {e}");
        let first = all_reduce_bits(c, r);
        c.suspend().unwrap();
        let e = c.suspend().expect_err("a second suspend");
        assert!(e.to_string().contains("suspended already"), "rank {r}: {e}");
        let e = c
            .alloc_window::<f32>(16)
            .expect_err("a window while suspended");
        assert!(e.to_string().contains("suspended"), "rank {r}: {e}");
        c.resume().unwrap();
        assert_eq!(all_reduce_bits(c, r), first);
        assert!(c.async_error().is_none());
    });
}

/// A tagged message not yet received would go with its connection: the
/// suspend is refused on every rank, naming the pair, and the
/// communicator goes on; once received, the suspend passes.
#[test]
fn a_tagged_message_in_flight_refuses_the_suspend_everywhere() {
    let comms =
        Communicator::init_threads(2, config(TransportChoice::Auto, Duration::from_secs(20)))
            .expect("init");
    comms[0].send_tagged(&[5u8; 100], 1, 7).unwrap();
    let refusals = on_each(&comms, |_, c| c.suspend().expect_err("a message in flight"));
    for e in &refusals {
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        assert!(
            e.to_string()
                .contains("rank 0 sent 1 tagged message(s) to rank 1, which has received 0"),
            "{e}"
        );
    }
    assert!(!comms[0].is_suspended() && !comms[1].is_suspended());
    let mut got = [0u8; 100];
    assert_eq!(comms[1].recv_tagged(&mut got, Some(0), 7).unwrap(), 0);
    assert_eq!(got, [5u8; 100]);
    on_each(&comms, |_, c| c.suspend().unwrap());
    on_each(&comms, |r, c| {
        c.resume().unwrap();
        all_reduce_bits(c, r);
    });
    // After the resume, tagged messages flow on the new connections.
    std::thread::scope(|s| {
        s.spawn(|| comms[1].send_tagged(&[6u8; 10], 0, 8).unwrap());
        let mut b = [0u8; 10];
        assert_eq!(comms[0].recv_tagged(&mut b, None, 8).unwrap(), 1);
        assert_eq!(b, [6u8; 10]);
    });
}

/// Rank 0 aborted (from another thread) while it waits in a suspend that
/// rank 2 never joins: the suspend is called off on the ranks in it at
/// once, not at the timeout, with one verdict.
#[test]
fn an_abort_during_the_suspend_calls_it_off_everywhere() {
    let comms =
        Communicator::init_threads(3, config(TransportChoice::Auto, Duration::from_secs(30)))
            .expect("init");
    let t0 = std::time::Instant::now();
    let outcomes = std::thread::scope(|s| {
        let waiting: Vec<_> = comms[..2]
            .iter()
            .map(|c| s.spawn(move || c.suspend().expect_err("rank 2 never suspends")))
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        comms[0].abort();
        waiting
            .into_iter()
            .map(|h| h.join().unwrap().to_string())
            .collect::<Vec<_>>()
    });
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(10), "called off after {took:?}");
    for e in &outcomes {
        assert!(
            e.contains("called off") && e.contains("rank 0 gave up"),
            "{outcomes:?}"
        );
    }
}

/// A resume waiting for a rank that never resumes ends when the waiting
/// rank is aborted, not at the timeout.
#[test]
fn an_abort_ends_a_resume_that_waits() {
    let comms =
        Communicator::init_threads(2, config(TransportChoice::Auto, Duration::from_secs(30)))
            .expect("init");
    on_each(&comms, |_, c| c.suspend().unwrap());
    let t0 = std::time::Instant::now();
    let e = std::thread::scope(|s| {
        let waiting = s.spawn(|| comms[0].resume().expect_err("rank 1 never resumes"));
        std::thread::sleep(Duration::from_millis(300));
        comms[0].abort();
        waiting.join().unwrap()
    });
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(10), "ended after {took:?}: {e}");
    assert!(matches!(e, Error::Aborted { .. }), "{e}");
}

#[test]
fn a_rank_that_does_not_suspend_is_named_and_the_others_abort() {
    let comms = Communicator::init_threads(
        3,
        config(TransportChoice::Auto, Duration::from_millis(1500)),
    )
    .expect("init");
    let errors = on_each(&comms, |r, c| {
        if r == 2 {
            // Rank 2 carries on with its own work and never suspends.
            std::thread::sleep(Duration::from_millis(2000));
            return None;
        }
        Some(c.suspend().expect_err("a suspend rank 2 never joins"))
    });
    for (r, e) in errors.iter().enumerate().take(2) {
        let e = e.as_ref().expect("an error");
        let text = e.to_string();
        assert!(
            text.contains("rank(s) [2] did not call suspend") && text.contains("called off"),
            "rank {r}: {text}"
        );
        // The ranks that waited cannot know whether the others suspended:
        // the communicator is aborted, not half suspended.
        let mut v = [1f32; 4];
        let later = comms[r]
            .all_reduce_in_place(&mut v[..], ReduceOp::Sum)
            .expect_err("the communicator is aborted");
        assert!(matches!(later, Error::Aborted { .. }), "rank {r}: {later}");
    }
}

/// Rank `rank`'s device all-reduce of `count` floats on its emulated
/// device; the result read back.
fn device_all_reduce(
    c: &Communicator,
    dev: &std::sync::Arc<dyn sncl::device::Device>,
    rank: usize,
    count: usize,
) -> Result<Vec<f32>, String> {
    use sncl::device::{DeviceBuffer, DeviceSliceMut};
    let stream = dev.create_stream().map_err(|e| e.to_string())?;
    let mut buf = DeviceBuffer::new(dev, count * 4).map_err(|e| e.to_string())?;
    let host: Vec<f32> = (0..count).map(|i| (i * (rank + 1)) as f32).collect();
    let mut got = vec![0f32; count];
    // SAFETY: `host` and `got` outlive the synchronisations that complete
    // the copies.
    unsafe {
        dev.copy_h2d_async(buf.ptr(), host.as_ptr().cast(), count * 4, stream)
            .map_err(|e| e.to_string())?;
        c.scope(|sc| {
            let buf = DeviceSliceMut::<f32>::new(&mut buf, stream);
            sc.all_reduce_in_place(buf, ReduceOp::Sum)
                .and_then(|w| w.wait())
        })
        .map_err(|e| e.to_string())?;
        dev.copy_d2h_async(got.as_mut_ptr().cast(), buf.ptr(), count * 4, stream)
            .map_err(|e| e.to_string())?;
    }
    dev.synchronize(stream, std::time::Instant::now() + Duration::from_secs(30))
        .map_err(|e| e.to_string())?;
    Ok(got)
}

#[test]
fn a_device_communicator_refuses_device_operations_while_suspended() {
    let comms =
        Communicator::init_threads(2, config(TransportChoice::Auto, Duration::from_secs(20)))
            .expect("init");
    let count = 3000;
    on_each(&comms, |r, c| {
        let dev = sncl::device::open(sncl::device::Backend::Emu, r).expect("emulated device");
        let want: Vec<f32> = (0..count).map(|i| (3 * i) as f32).collect();
        assert_eq!(
            device_all_reduce(c, &dev, r, count).unwrap(),
            want,
            "rank {r}"
        );
        c.suspend().unwrap();
        let e =
            device_all_reduce(c, &dev, r, count).expect_err("a device all-reduce while suspended");
        assert!(e.contains("suspended"), "rank {r}: {e}");
        assert_eq!(c.mem_stats().connected_peers, 0);
        c.resume().unwrap();
        assert_eq!(
            device_all_reduce(c, &dev, r, count).unwrap(),
            want,
            "rank {r}"
        );
    });
}
