//! nvlink's automatic choice on the emulated device, ranks as threads whose
//! devices are seen as `CUDA_VISIBLE_DEVICES` would make them seen
//! (`device::emu::open_with`): devices are matched by PCI bus id, not
//! ordinal; each side publishes its verdict and both use the AND; forced
//! `SNCL_NVLINK=1` where the device path cannot be used is an error naming
//! what is missing; `SNCL_NVLINK=0` leaves same-node pairs to shm. The mode
//! is set through `Config::nvlink`, as `SNCL_NVLINK` sets it.

mod device_kit;
mod nvlink_common;

use device::emu::{open_with, Visibility};
use device_kit::{run_case, Case, Rank};

use sncl::{Collective, Communicator, Config, DataType, NvlinkMode, ReduceOp};

/// The tests' configuration with `SNCL_NVLINK` = `mode` (None: unset),
/// parsed as the environment's value would be; the serial lock, held while
/// the returned guard lives, keeps the emulated devices to one test.
fn nvlink_config(mode: Option<&str>) -> (Config, std::sync::MutexGuard<'static, ()>) {
    let guard = nvlink_common::serial();
    let mut config = nvlink_common::config();
    if let Some(m) = mode {
        config.nvlink.mode = NvlinkMode::parse("SNCL_NVLINK", m).expect("a valid mode");
    }
    (config, guard)
}

/// Two thread ranks over nvlink (automatic), rank r bound to ordinal
/// `ords[r]` of a process that sees `vis[r]`.
fn pair(config: Config, ords: [usize; 2], vis: [Visibility; 2]) -> Vec<Rank> {
    let comms = Communicator::init_threads(2, config).expect("init");
    comms
        .into_iter()
        .zip(ords.into_iter().zip(vis))
        .map(|(comm, (ord, vis))| {
            assert_eq!(comm.transports()[1 - comm.rank()], "nvlink");
            let dev = open_with(ord, vis).expect("emulated device");
            comm.bind_device(dev.clone()).expect("bind_device");
            let stream = dev.create_stream().expect("stream");
            Rank::new(comm, dev, stream)
        })
        .collect()
}

fn vis(visible: &[usize], peer_access: bool) -> Visibility {
    Visibility {
        visible: visible.to_vec(),
        peer_access,
    }
}

fn all_reduce(count: usize) -> Case {
    Case {
        coll: Collective::AllReduce,
        dtype: DataType::Float32,
        op: ReduceOp::Sum,
        root: 0,
        count,
    }
}

/// Runs the case on both ranks; each rank's result.
fn run(ranks: &[Rank], c: Case) -> Vec<Result<(), String>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter()
            .map(|r| s.spawn(move || run_case(r, &c)))
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

fn device_bytes_moved(ranks: &[Rank], c: Case) -> u64 {
    let before = transport_nvlink::device_bytes().0;
    for r in run(ranks, c) {
        r.expect("correct on every rank");
    }
    transport_nvlink::device_bytes().0 - before
}

/// Emulated device 3 is ordinal 0 in rank 0's process and ordinal 1 in
/// rank 1's, and neither has peer access: both find it is one device (by
/// bus id) and go device to device.
#[test]
fn one_device_under_different_ordinals_goes_device_to_device() {
    let (config, _serial) = nvlink_config(None);
    let ranks = pair(config, [0, 1], [vis(&[3, 5], false), vis(&[5, 3], false)]);
    let moved = device_bytes_moved(&ranks, all_reduce(20_011));
    assert!(moved > 0, "nothing went device to device");
}

/// Ordinal 0 in both processes, but different devices (3 and 5) without
/// peer access: ordinals alone would say "the same device"; the bus ids
/// say otherwise, and both ranks stage.
#[test]
fn same_ordinal_of_different_devices_without_peer_access_stages() {
    let (config, _serial) = nvlink_config(None);
    let ranks = pair(config, [0, 0], [vis(&[3], false), vis(&[5], false)]);
    assert_eq!(device_bytes_moved(&ranks, all_reduce(20_011)), 0);
    // Decided once: later operations stage as well, and stay correct.
    assert_eq!(device_bytes_moved(&ranks, all_reduce(7)), 0);
}

/// Rank 0's process does not see rank 1's device; rank 1 sees rank 0's
/// with peer access. Rank 1 alone would go device to device; with both
/// verdicts, both stage (and neither waits on the other).
#[test]
fn one_side_unable_both_stage() {
    let (config, _serial) = nvlink_config(None);
    let ranks = pair(config, [0, 1], [vis(&[0], true), vis(&[0, 1], true)]);
    assert_eq!(device_bytes_moved(&ranks, all_reduce(20_011)), 0);
}

/// Different devices with peer access: device to device.
#[test]
fn peer_access_between_devices_goes_device_to_device() {
    let (config, _serial) = nvlink_config(None);
    let ranks = pair(config, [0, 1], [vis(&[0, 1], true), vis(&[0, 1], true)]);
    assert!(device_bytes_moved(&ranks, all_reduce(20_011)) > 0);
}

/// `SNCL_NVLINK=1` where rank 0 cannot see rank 1's device: the first
/// device operation fails on both ranks, naming the setting and what is
/// missing on which rank.
#[test]
fn required_where_it_cannot_is_an_error_naming_what_is_missing() {
    let (config, _serial) = nvlink_config(Some("1"));
    let ranks = pair(config, [0, 1], [vis(&[0], true), vis(&[0, 1], true)]);
    let results = run(&ranks, all_reduce(1000));
    for (rank, r) in results.iter().enumerate() {
        let e = r.as_ref().expect_err("the device path is required");
        eprintln!("rank {rank}: {e}");
        assert!(e.contains("SNCL_NVLINK=1"), "rank {rank}: {e}");
    }
    let e0 = results[0].as_ref().unwrap_err();
    assert!(
        e0.contains("this rank does not see the other rank's device"),
        "rank 0 names what it misses: {e0}"
    );
    let e1 = results[1].as_ref().unwrap_err();
    assert!(
        e1.contains("peer rank 0 does not see the other rank's device"),
        "rank 1 names what rank 0 misses: {e1}"
    );
}

/// `SNCL_NVLINK=0`: same-node pairs use shm, and device pieces are staged.
#[test]
fn off_leaves_same_node_pairs_to_shm() {
    let (config, _serial) = nvlink_config(Some("0"));
    let comms = Communicator::init_threads(2, config).expect("init");
    for c in &comms {
        assert_eq!(c.transports()[1 - c.rank()], "shm");
    }
}

/// A bad value is a clear configuration error, before any setup.
#[test]
fn bad_value_is_a_config_error() {
    let e = match Config::from_vars(&|k| (k == "SNCL_NVLINK").then(|| "yes".to_string())) {
        Ok(_) => panic!("SNCL_NVLINK=yes must be refused"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("SNCL_NVLINK=\"yes\""), "{e}");
}

/// Host operations over automatic nvlink connections work and move no
/// device bytes (nothing device-related happens without a device
/// operation: no device is even bound here).
#[test]
fn host_only_runs_over_nvlink_touch_no_device() {
    let (config, _serial) = nvlink_config(None);
    let comms = Communicator::init_threads(3, config).expect("init");
    let before = transport_nvlink::device_bytes();
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                assert!(c.transports().iter().filter(|t| **t == "nvlink").count() == 2);
                let mut v = vec![1.0f32 + c.rank() as f32; 10_000];
                c.all_reduce_in_place(&mut v, ReduceOp::Sum)
                    .expect("host all_reduce");
                assert!(v.iter().all(|&x| x == 6.0));
            });
        }
    });
    assert_eq!(transport_nvlink::device_bytes(), before);
}
