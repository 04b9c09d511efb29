//! Reduce-copy kernel bandwidth against a device-to-device copy in the same
//! run, and the kernels' first-use cost (compile + load, or load from the
//! disk cache on a second run).
//!
//! ```text
//! cargo run --release -p device --example kernel_bandwidth -- [cuda|emu] [MiB] [iterations]
//! ```
//!
//! Bytes moved count reads and writes: a copy of S bytes moves 2S, a
//! 2-input reduce of S output bytes moves 3S. Prints one line per
//! measurement and `ratio` = reduce bandwidth / copy bandwidth.

use std::sync::Arc;
use std::time::{Duration, Instant};

use device::{Backend, Device, DeviceBuffer, StreamHandle};
use kernels::{DataType, ReduceOp};

fn main() {
    if let Err(e) = run() {
        eprintln!("kernel_bandwidth: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), device::DeviceError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let backend = args
        .first()
        .map(|s| {
            Backend::from_name(s).ok_or_else(|| device::DeviceError::Unsupported {
                what: format!("backend {s:?}"),
                why: "expected cuda or emu".into(),
            })
        })
        .transpose()?
        .unwrap_or(Backend::Cuda);
    let mib: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(256);
    let iters: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(20);
    let dev = device::open(backend, 0)?;
    println!(
        "# device {} ({}), arch sm_{}{}; {mib} MiB per buffer, {iters} iterations",
        dev.name(),
        backend.name(),
        dev.arch().major,
        dev.arch().minor
    );
    let bytes = mib << 20;
    let count = bytes / 4;
    let a = DeviceBuffer::new(&dev, bytes)?;
    let b = DeviceBuffer::new(&dev, bytes)?;
    let out = DeviceBuffer::new(&dev, bytes)?;
    let stream = dev.create_stream()?;
    let deadline = || Instant::now() + Duration::from_secs(120);

    // First use: the reduce kernels are compiled (or read from the disk
    // cache) and loaded here.
    let t = Instant::now();
    // SAFETY: a, b and out are live allocations of `bytes` = 4 * count bytes.
    unsafe {
        dev.reduce_copy(
            stream,
            DataType::Float32,
            ReduceOp::Sum,
            &[a.ptr(), b.ptr()],
            &[out.ptr()],
            1,
        )?
    };
    dev.synchronize(stream, deadline())?;
    println!(
        "first-use  kernels compile+load (or cache load): {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    );

    let copy = time(&dev, stream, iters, |s| {
        // SAFETY: both live, `bytes` long, disjoint.
        unsafe { dev.copy_d2d_async(out.ptr(), a.ptr(), bytes, s) }
    })?;
    let reduce = time(&dev, stream, iters, |s| {
        // SAFETY: as for the first launch.
        unsafe {
            dev.reduce_copy(
                s,
                DataType::Float32,
                ReduceOp::Sum,
                &[a.ptr(), b.ptr()],
                &[out.ptr()],
                count,
            )
        }
    })?;
    let one = time(&dev, stream, iters, |s| {
        // SAFETY: as above; one source is a copy by the kernel.
        unsafe {
            dev.reduce_copy(
                s,
                DataType::Float32,
                ReduceOp::Sum,
                &[a.ptr()],
                &[out.ptr()],
                count,
            )
        }
    })?;
    let gbs = |moved: usize, ms: f64| moved as f64 / (ms * 1e-3) / 1e9;
    let copy_bw = gbs(2 * bytes, copy);
    let reduce_bw = gbs(3 * bytes, reduce);
    let one_bw = gbs(2 * bytes, one);
    println!("d2d-copy          {copy:9.3} ms  {copy_bw:9.1} GB/s (2S moved)");
    println!(
        "reduce-copy f32x2 {reduce:9.3} ms  {reduce_bw:9.1} GB/s (3S moved)  ratio {:.3}",
        reduce_bw / copy_bw
    );
    println!(
        "copy-kernel f32x1 {one:9.3} ms  {one_bw:9.1} GB/s (2S moved)  ratio {:.3}",
        one_bw / copy_bw
    );
    // SAFETY: created above; all its work was synchronised in `time`.
    unsafe { dev.destroy_stream(stream)? };
    Ok(())
}

/// Milliseconds per launch of `f`, timed with device events over `iters`
/// launches after one warm-up.
fn time(
    dev: &Arc<dyn Device>,
    stream: StreamHandle,
    iters: usize,
    f: impl Fn(StreamHandle) -> Result<(), device::DeviceError>,
) -> Result<f64, device::DeviceError> {
    f(stream)?;
    let (start, end) = (dev.create_event()?, dev.create_event()?);
    dev.record_event(start, stream)?;
    for _ in 0..iters {
        f(stream)?;
    }
    dev.record_event(end, stream)?;
    dev.synchronize(stream, Instant::now() + Duration::from_secs(120))?;
    let ms = dev.event_elapsed_ms(start, end)? as f64 / iters as f64;
    // SAFETY: both created above and complete (the stream was synchronised).
    unsafe {
        dev.destroy_event(start)?;
        dev.destroy_event(end)?;
    }
    Ok(ms)
}
