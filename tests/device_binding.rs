//! How a communicator finds its device: `bind_default_device` (the current
//! device, else the rank's index on its node modulo the device count), the
//! typed API binding to its buffers' device on first use, and a clear error
//! where the backend is not usable. On the emulated device (8 devices, no
//! notion of a current one) and, for the error, on CUDA where no driver is
//! installed.

use std::time::{Duration, Instant};

use comm_core::config::TransportChoice;
use sncl::device::{self, Backend, DeviceBuffer, DeviceSliceMut};
use sncl::{Communicator, Config, ReduceOp};

/// The first `count` floats of `buf`, after the work queued on `stream`.
fn read_back(
    dev: &dyn device::Device,
    buf: &DeviceBuffer,
    count: usize,
    stream: device::StreamHandle,
) -> Result<Vec<f32>, String> {
    let mut got = vec![0f32; count];
    // SAFETY: `got` is written by the copy only and outlives the
    // synchronisation that completes it, before it is returned.
    unsafe { dev.copy_d2h_async(got.as_mut_ptr().cast(), buf.ptr(), count * 4, stream) }
        .map_err(|e| e.to_string())?;
    dev.synchronize(stream, Instant::now() + Duration::from_secs(30))
        .map_err(|e| e.to_string())?;
    Ok(got)
}

fn config() -> Config {
    Config {
        timeout: Duration::from_secs(30),
        transport: TransportChoice::Auto,
        ..Default::default()
    }
}

#[test]
fn default_device_is_the_ranks_index_on_its_node() {
    let comms = Communicator::init_threads(3, config()).expect("init");
    let ordinals: Vec<usize> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| s.spawn(move || c.bind_default_device(Backend::Emu).map(|d| d.ordinal())))
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("no panic").expect("bind"))
            .collect()
    });
    // One node (threads of one process): local index = rank.
    assert_eq!(ordinals, vec![0, 1, 2]);
    for c in &comms {
        let bound = c.bound_device().expect("bound");
        assert_eq!(bound.ordinal(), c.rank());
        assert_eq!(bound.backend(), Backend::Emu);
        let e = c
            .bind_default_device(Backend::Emu)
            .expect_err("a communicator binds once");
        assert!(e.to_string().contains("already bound"), "{e}");
    }
}

#[test]
fn typed_operation_binds_to_its_buffers_device() {
    let comms = Communicator::init_threads(2, config()).expect("init");
    let count = 257;
    let errs: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || -> Result<(), String> {
                    let rank = c.rank();
                    // Rank r's buffers live on emulated device 5 - r.
                    let dev = device::open(Backend::Emu, 5 - rank).map_err(|e| e.to_string())?;
                    let stream = dev.create_stream().map_err(|e| e.to_string())?;
                    let mut buf = DeviceBuffer::new(&dev, count * 4).map_err(|e| e.to_string())?;
                    let host: Vec<f32> = (0..count).map(|i| (i * (rank + 1)) as f32).collect();
                    // SAFETY: `host` outlives the synchronisation below.
                    unsafe {
                        dev.copy_h2d_async(buf.ptr(), host.as_ptr().cast(), count * 4, stream)
                    }
                    .map_err(|e| e.to_string())?;
                    if c.bound_device().is_some() {
                        return Err(format!("rank {rank} bound before its first operation"));
                    }
                    c.scope(|sc| {
                        let buf = DeviceSliceMut::<f32>::new(&mut buf, stream);
                        sc.all_reduce_in_place(buf, ReduceOp::Sum)
                            .and_then(|w| w.wait())
                    })
                    .map_err(|e| e.to_string())?;
                    let bound = c.bound_device().ok_or("not bound after the operation")?;
                    if bound.ordinal() != 5 - rank {
                        return Err(format!(
                            "rank {rank} bound to device {}, its buffers are on {}",
                            bound.ordinal(),
                            5 - rank
                        ));
                    }
                    let got = read_back(dev.as_ref(), &buf, count, stream)?;
                    for (i, g) in got.iter().enumerate() {
                        let want = (3 * i) as f32;
                        if *g != want {
                            return Err(format!(
                                "rank {rank}: element {i} is {g}, expected {want}"
                            ));
                        }
                    }
                    // A buffer of another device is refused once bound.
                    let other = device::open(Backend::Emu, 7).map_err(|e| e.to_string())?;
                    let mut foreign =
                        DeviceBuffer::new(&other, count * 4).map_err(|e| e.to_string())?;
                    let e = c
                        .scope(|sc| {
                            let foreign = DeviceSliceMut::<f32>::new(&mut foreign, stream);
                            sc.all_reduce_in_place(foreign, ReduceOp::Sum).map(|_| ())
                        })
                        .err()
                        .ok_or("a buffer of another device is refused")?;
                    if !e.to_string().contains("another device") {
                        return Err(format!("unexpected error: {e}"));
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter()
            .filter_map(|h| h.join().expect("no panic").err())
            .collect()
    });
    assert!(errs.is_empty(), "{}", errs.join("\n"));
}

#[test]
fn default_cuda_device_without_a_driver_is_a_clear_error() {
    let comms = Communicator::init_threads(1, config()).expect("init");
    match comms[0].bind_default_device(Backend::Cuda) {
        Ok(dev) => eprintln!(
            "skipped: a CUDA device is usable here (bound to {}), the no-driver error cannot be checked",
            dev.name()
        ),
        Err(e) => {
            let text = e.to_string();
            if device::open(Backend::Cuda, 0).is_ok() {
                panic!("CUDA opens here, yet bind_default_device failed: {text}");
            }
            assert!(text.contains("rank 0"), "names the rank: {text}");
            assert!(text.contains("bind_default_device"), "names the call: {text}");
            assert!(
                text.contains("CUDA is missing") || text.contains("no CUDA device"),
                "says what is missing: {text}"
            );
            assert!(comms[0].bound_device().is_none());
        }
    }
}

/// `connect_device` sets the device links up collectively, before any
/// operation: refused without a bound device, idempotent, and the
/// collectives after it run (no join left for the first one).
#[test]
fn connect_device_sets_the_links_up_before_the_first_collective() {
    let comms = Communicator::init_threads(2, config()).expect("init");
    let e = comms[0].connect_device().expect_err("no device bound yet");
    assert!(
        e.to_string().contains("connect_device") && e.to_string().contains("bind_device"),
        "{e}"
    );
    let count = 1000;
    let errs: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || -> Result<(), String> {
                    let dev = c
                        .bind_default_device(Backend::Emu)
                        .map_err(|e| e.to_string())?;
                    let before = c.stats().ops;
                    c.connect_device().map_err(|e| e.to_string())?;
                    // The join ran now: its barrier and its agreement on
                    // the kernel path are operations of the communicator.
                    let joined = c.stats().ops;
                    if joined == before {
                        return Err("connect_device ran no join".into());
                    }
                    // Idempotent: no second barrier (the peer does not call
                    // it again, so a second join would wait out the timeout).
                    let t0 = Instant::now();
                    c.connect_device().map_err(|e| e.to_string())?;
                    if t0.elapsed() > Duration::from_secs(5) || c.stats().ops != joined {
                        return Err("a second connect_device joined again".into());
                    }
                    let stream = dev.create_stream().map_err(|e| e.to_string())?;
                    let mut buf = DeviceBuffer::new(&dev, count * 4).map_err(|e| e.to_string())?;
                    let data = vec![1.0f32 + c.rank() as f32; count];
                    // SAFETY: `data` outlives the synchronisation below.
                    unsafe {
                        dev.copy_h2d_async(buf.ptr(), data.as_ptr().cast(), count * 4, stream)
                    }
                    .map_err(|e| e.to_string())?;
                    let mut view = DeviceSliceMut::<f32>::new(&mut buf, stream);
                    c.all_reduce_in_place(&mut view, ReduceOp::Sum)
                        .map_err(|e| e.to_string())?;
                    let got = read_back(dev.as_ref(), &buf, count, stream)?;
                    if got.iter().any(|&v| v != 3.0) {
                        return Err(format!("rank {}: {:?}", c.rank(), &got[..4]));
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter()
            .filter_map(|h| h.join().expect("no panic").err())
            .collect()
    });
    assert!(errs.is_empty(), "{errs:?}");
}
