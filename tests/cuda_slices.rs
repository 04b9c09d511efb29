//! Collectives on cudarc slices (feature `cuda`): two thread ranks on CUDA
//! device 0, all_reduce / in-place all_reduce / all_gather / broadcast on
//! `CudaSlice<f32>`, checked on the host. Needs a CUDA device: skipped with
//! the reason where CUDA is not usable (`scripts/gpu-check.sh` runs it on a
//! GPU machine with SNCL_TEST_DEVICE_REQUIRED=1, which turns the skip into
//! a failure).
#![cfg(feature = "cuda")]

use std::time::Duration;

use sncl::cudarc::driver::CudaContext;
use sncl::device::{self, Backend};
use sncl::{Communicator, Config, ReduceOp};

fn cuda_usable() -> bool {
    match device::device_count(Backend::Cuda) {
        Ok(n) if n > 0 => true,
        Ok(_) | Err(_) => {
            let why = device::device_count(Backend::Cuda)
                .map(|n| format!("{n} devices"))
                .unwrap_or_else(|e| e.to_string());
            if std::env::var_os("SNCL_TEST_DEVICE_REQUIRED").is_some() {
                panic!("SNCL_TEST_DEVICE_REQUIRED is set but CUDA is not usable: {why}");
            }
            eprintln!("skipped: CUDA is not usable here ({why})");
            false
        }
    }
}

#[test]
fn collectives_on_cudarc_slices() {
    if !cuda_usable() {
        return;
    }
    let n = 2;
    let count = (1 << 20) + 3;
    let comms = Communicator::init_threads(
        n,
        Config {
            timeout: Duration::from_secs(60),
            ..Default::default()
        },
    )
    .expect("init");
    let errs: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || -> Result<(), String> {
                    let rank = c.rank();
                    let e = |e: &dyn std::fmt::Display| format!("rank {rank}: {e}");
                    let ctx = CudaContext::new(0).map_err(|x| e(&x))?;
                    let stream = ctx.new_stream().map_err(|x| e(&x))?;
                    let host: Vec<f32> = (0..count).map(|i| (i % 1000 + rank) as f32).collect();
                    let send = stream.clone_htod(&host).map_err(|x| e(&x))?;
                    let mut recv = stream.alloc_zeros::<f32>(count).map_err(|x| e(&x))?;
                    let mut gathered = stream.alloc_zeros::<f32>(n * count).map_err(|x| e(&x))?;
                    let mut inplace = stream.clone_htod(&host).map_err(|x| e(&x))?;
                    c.scope(|sc| -> sncl::Result<()> {
                        // Queued back to back on `stream` (each after the
                        // uploads through cudarc's events), then waited for.
                        let works = [
                            sc.all_reduce(&send, &mut recv, ReduceOp::Sum)?,
                            sc.all_reduce_in_place(&mut inplace, ReduceOp::Max)?,
                            sc.all_gather(&send, &mut gathered)?,
                        ];
                        works.into_iter().try_for_each(|w| w.wait())
                    })
                    .map_err(|x| e(&x))?;
                    let sum = stream.clone_dtoh(&recv).map_err(|x| e(&x))?;
                    let max = stream.clone_dtoh(&inplace).map_err(|x| e(&x))?;
                    let all = stream.clone_dtoh(&gathered).map_err(|x| e(&x))?;
                    for i in 0..count {
                        let base = (i % 1000) as f32;
                        let want_sum = 2.0 * base + 1.0;
                        if sum[i] != want_sum || max[i] != base + 1.0 {
                            return Err(format!(
                                "rank {rank}: element {i}: sum {} (want {want_sum}), max {} (want {})",
                                sum[i],
                                max[i],
                                base + 1.0
                            ));
                        }
                        for r in 0..n {
                            if all[r * count + i] != base + r as f32 {
                                return Err(format!("rank {rank}: gathered block {r} element {i} is {}", all[r * count + i]));
                            }
                        }
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
