//! The C ABI: the checked-in header is what cbindgen generates now; a C
//! program built with the system compiler runs every collective on 4
//! processes through `libsncl`; the C example runs; and in-process checks
//! of what a multi-process program cannot easily reach (one thread driving
//! every rank, groups of inits, non-blocking init, errors reaching a
//! stream).
//!
//! Regenerate the header with
//! `cargo test --test c_abi -- --ignored regenerate_header`.

use std::ffi::{c_int, c_void, CStr};
use std::fs::File;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sncl::capi::*;

const MANIFEST: &str = env!("CARGO_MANIFEST_DIR");

fn generate_header() -> String {
    let root = Path::new(MANIFEST);
    let cfg = cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml");
    let b = cbindgen::Builder::new()
        .with_config(cfg)
        .with_src(root.join("src/capi/mod.rs"))
        .generate()
        .expect("cbindgen generates the header");
    let mut out = Vec::new();
    b.write(&mut out);
    String::from_utf8(out).expect("utf-8 header")
}

fn header_path() -> PathBuf {
    Path::new(MANIFEST).join("include/sncl.h")
}

#[test]
fn header_is_current() {
    let want = generate_header();
    let have = std::fs::read_to_string(header_path()).unwrap_or_default();
    assert!(
        have == want,
        "include/sncl.h is stale (src/capi or cbindgen.toml changed); regenerate it with\n  \
         cargo test --test c_abi -- --ignored regenerate_header\nand commit the result"
    );
}

#[test]
#[ignore = "writes include/sncl.h; run it after changing the C ABI"]
fn regenerate_header() {
    std::fs::write(header_path(), generate_header()).expect("writing include/sncl.h");
}

#[test]
fn version_matches_the_crate() {
    let v = |s: &str| s.parse::<c_int>().unwrap();
    assert_eq!(SNCL_MAJOR, v(env!("CARGO_PKG_VERSION_MAJOR")));
    assert_eq!(SNCL_MINOR, v(env!("CARGO_PKG_VERSION_MINOR")));
    assert_eq!(SNCL_PATCH, v(env!("CARGO_PKG_VERSION_PATCH")));
    assert_eq!(
        SNCL_VERSION_CODE,
        SNCL_MAJOR * 10000 + SNCL_MINOR * 100 + SNCL_PATCH
    );
    let mut got = 0;
    // SAFETY: a valid out-pointer.
    let r = unsafe { snclGetVersion(&mut got) };
    assert_eq!(r, snclResult_t::snclSuccess);
    assert_eq!(got, SNCL_VERSION_CODE);
}

// ---------------------------------------------------------------------------
// Building and running C.

/// The directory holding libsncl.so: this test's `deps/` (what this cargo
/// run built), else the one above it.
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps dir");
    for d in [deps, deps.parent().expect("profile dir")] {
        if d.join("libsncl.so").exists() {
            return d.to_path_buf();
        }
    }
    panic!(
        "libsncl.so not found next to {}; the crate's cdylib should be built with the tests",
        deps.display()
    );
}

/// Compiles C sources against the header and libsncl; None when there is
/// no C compiler (the reason is printed).
fn compile(src: &str, out_name: &str) -> Option<PathBuf> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    if Command::new(&cc).arg("--version").output().is_err() {
        eprintln!("skipping: no C compiler ({cc}) on this machine");
        return None;
    }
    let lib = lib_dir();
    let out = scratch(out_name);
    let o = Command::new(&cc)
        .args([
            "-std=c11",
            "-D_DEFAULT_SOURCE",
            "-O1",
            "-Wall",
            "-Wextra",
            "-Werror",
        ])
        .arg("-I")
        .arg(Path::new(MANIFEST).join("include"))
        .arg(Path::new(MANIFEST).join(src))
        .arg("-o")
        .arg(&out)
        .arg("-L")
        .arg(&lib)
        .arg("-lsncl")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .output()
        .expect("running the C compiler");
    assert!(
        o.status.success(),
        "compiling {src} failed:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    Some(out)
}

/// A scratch path of this test process (concurrent runs stay apart).
fn scratch(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}.{}", std::process::id()))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Waits for every child up to `limit`; kills them all on timeout. Returns
/// each one's exit code (None: killed or signalled).
fn wait_all(children: &mut [Child], limit: Duration) -> Vec<Option<i32>> {
    let deadline = Instant::now() + limit;
    let mut codes = vec![None; children.len()];
    let mut done = vec![false; children.len()];
    while done.iter().any(|d| !d) {
        for (i, c) in children.iter_mut().enumerate() {
            if !done[i] {
                if let Some(s) = c.try_wait().expect("waiting for a child") {
                    codes[i] = s.code();
                    done[i] = true;
                }
            }
        }
        if Instant::now() > deadline {
            for (i, c) in children.iter_mut().enumerate() {
                if !done[i] {
                    let _ = c.kill();
                    let _ = c.wait();
                }
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    codes
}

fn run_c_ranks(exe: &Path, transport: &str, n: usize) {
    let port = free_port();
    let secret: String = (0..32)
        .map(|i| char::from_digit((port as u32 * 7 + i * 13) % 16, 16).unwrap())
        .collect();
    let dir = scratch(&format!("c_abi_{transport}"));
    std::fs::create_dir_all(&dir).unwrap();
    let start = Instant::now();
    let mut children: Vec<Child> = (0..n)
        .map(|r| {
            Command::new(exe)
                .env("SNCL_RANK", r.to_string())
                .env("SNCL_WORLD_SIZE", n.to_string())
                .env("SNCL_ROOT", format!("127.0.0.1:{port}"))
                .env("SNCL_SECRET", &secret)
                .env("SNCL_TRANSPORT", transport)
                .env("SNCL_TIMEOUT_MS", "60000")
                .stdin(Stdio::null())
                .stdout(File::create(dir.join(format!("{r}.out"))).unwrap())
                .stderr(File::create(dir.join(format!("{r}.err"))).unwrap())
                .spawn()
                .expect("starting a C rank")
        })
        .collect();
    let codes = wait_all(&mut children, Duration::from_secs(150));
    if codes.iter().all(|c| *c == Some(77)) {
        let out = std::fs::read_to_string(dir.join("0.out")).unwrap_or_default();
        eprintln!("skipping (libsncl lacks a feature; test the workspace): {out}");
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    let mut report = String::new();
    let mut ok = true;
    for (r, code) in codes.iter().enumerate() {
        let out = std::fs::read_to_string(dir.join(format!("{r}.out"))).unwrap_or_default();
        let err = std::fs::read_to_string(dir.join(format!("{r}.err"))).unwrap_or_default();
        let good = *code == Some(0) && out.contains(&format!("OK rank {r}"));
        ok &= good;
        report.push_str(&format!(
            "--- rank {r}: exit {code:?}\n{out}{}\n",
            err.lines().take(40).collect::<Vec<_>>().join("\n")
        ));
    }
    assert!(ok, "C ranks over {transport} failed:\n{report}");
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!(
        "{n} C ranks over {transport} passed in {:.1} s",
        start.elapsed().as_secs_f64()
    );
}

#[test]
fn c_program_runs_every_collective() {
    let Some(exe) = compile("tests/c/c_abi_test.c", "c_abi_test") else {
        return;
    };
    run_c_ranks(&exe, "auto", 4);
    run_c_ranks(&exe, "tcp", 4);
    tidy(&exe);
}

/// Collectives on device memory (the emulated device) from C.
#[test]
fn c_program_on_device_memory() {
    let Some(exe) = compile("tests/c/c_abi_device_test.c", "c_abi_device_test") else {
        return;
    };
    run_c_ranks(&exe, "auto", 2);
    run_c_ranks(&exe, "tcp", 3);
    tidy(&exe);
}

/// NCCL's example with the prefix renamed compiles, as C and as C++,
/// against a `cudaStream_t` declared as CUDA declares it.
#[test]
fn nccl_port_compiles_as_c_and_cpp() {
    let env = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.into());
    let root = Path::new(MANIFEST);
    for (cc, lang) in [
        (env("CC", "cc"), ["c", "-std=c11"]),
        (env("CXX", "c++"), ["c++", "-std=c++11"]),
    ] {
        if Command::new(&cc).arg("--version").output().is_err() {
            eprintln!("skipping {}: no compiler {cc}", lang[0]);
            continue;
        }
        let out = scratch(&format!("nccl_port_{}.o", lang[0]));
        let o = Command::new(&cc)
            .args([
                "-x", lang[0], lang[1], "-O2", "-Wall", "-Wextra", "-Werror", "-c", "-o",
            ])
            .args([&out, &root.join("tests/c/nccl_port.c")])
            .arg(format!("-I{}", root.join("include").display()))
            .arg(format!("-I{}", root.join("tests/c/cuda_stub").display()))
            .output()
            .expect("running the compiler");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "nccl_port.c as {}:\n{err}", lang[0]);
        tidy(&out);
    }
}

/// Removes a scratch file.
fn tidy(file: &Path) {
    let _ = std::fs::remove_file(file);
}

#[test]
fn c_example_runs() {
    let Some(exe) = compile("examples/c/allreduce.c", "c_allreduce_example") else {
        return;
    };
    let mut child = Command::new(&exe)
        .arg("4")
        .env_remove("SNCL_ROOT")
        .env("SNCL_SOCKET_IFNAME", "lo")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the example");
    let codes = wait_all(std::slice::from_mut(&mut child), Duration::from_secs(60));
    let o = child.wait_with_output().expect("example output");
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        codes[0],
        Some(0),
        "example failed:\n{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(out.matches(", 0 wrong").count(), 4, "{out}");
    tidy(&exe);
}

#[test]
fn header_compiles_as_cpp() {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    if Command::new(&cxx).arg("--version").output().is_err() {
        eprintln!("skipping: no C++ compiler ({cxx})");
        return;
    }
    let src = PathBuf::from(format!("{}.cpp", scratch("sncl_header").display()));
    std::fs::write(
        &src,
        "#include \"sncl.h\"\n\
         static_assert(sizeof(snclUniqueId) == 128, \"id size\");\n\
         int f() { snclConfig_t c = SNCL_CONFIG_INITIALIZER; snclComm_t comm = SNCL_COMM_NULL;\n\
           (void)comm; return c.timeoutMs == SNCL_CONFIG_UNDEF_INT && snclHalf == 6\n\
             && snclFloat == 7 && snclAvg == 4 && snclTimeout == 8; }\n",
    )
    .unwrap();
    let o = Command::new(&cxx)
        .args(["-std=c++11", "-fsyntax-only", "-Wall", "-Werror", "-I"])
        .arg(Path::new(MANIFEST).join("include"))
        .arg(&src)
        .output()
        .expect("running the C++ compiler");
    assert!(
        o.status.success(),
        "sncl.h does not compile as C++:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    tidy(&src);
}

// ---------------------------------------------------------------------------
// In-process checks through the same functions.

use snclResult_t::*;

fn ok(r: snclResult_t) {
    if r != snclSuccess {
        // SAFETY: NULL asks for this thread's last error.
        let msg = unsafe { CStr::from_ptr(snclGetLastError(std::ptr::null_mut())) };
        panic!("{r:?}: {}", msg.to_string_lossy());
    }
}

fn id_at(root: SocketAddr) -> snclUniqueId {
    let b = sncl::UniqueId::new(root).unwrap().to_bytes();
    snclUniqueId {
        internal: b.map(|x| x as std::ffi::c_char),
    }
}

fn sum_of_ranks(n: usize) -> f32 {
    (n * (n - 1) / 2) as f32
}

const FLOAT: c_int = snclDataType_t::snclFloat32 as c_int;
const SUM: c_int = snclRedOp_t::snclSum as c_int;

/// All-reduces each rank's number on every communicator from this thread,
/// in one group; checks the sums.
///
/// # Safety
/// `comms` are live handles of one communicator, in rank order.
unsafe fn grouped_all_reduce(comms: &[snclComm_t]) {
    let n = comms.len();
    let mut bufs: Vec<Vec<f32>> = (0..n).map(|r| vec![r as f32; 1000]).collect();
    ok(snclGroupStart());
    for (c, b) in comms.iter().zip(&mut bufs) {
        let p = b.as_mut_ptr() as *mut c_void;
        // SAFETY: the buffers outlive the group, which completes at GroupEnd.
        ok(unsafe { snclAllReduce(p, p, b.len(), FLOAT, SUM, *c, std::ptr::null_mut()) });
    }
    ok(snclGroupEnd());
    for b in &bufs {
        assert!(b.iter().all(|&x| x == sum_of_ranks(n)), "{:?}", &b[..4]);
    }
}

#[test]
fn one_thread_drives_every_rank() {
    let n = 4;
    let mut comms = vec![std::ptr::null_mut(); n];
    // SAFETY: `comms` has room for n handles; devlist may be NULL.
    unsafe {
        ok(snclCommInitAll(
            comms.as_mut_ptr(),
            n as c_int,
            std::ptr::null(),
        ));
        grouped_all_reduce(&comms);
        // A ring exchange from one thread, one group.
        let send: Vec<Vec<u64>> = (0..n).map(|r| vec![r as u64 * 7; 333]).collect();
        let mut recv = vec![vec![0u64; 333]; n];
        ok(snclGroupStart());
        for r in 0..n {
            let c = comms[r];
            let t = snclDataType_t::snclUint64 as c_int;
            ok(snclSend(
                send[r].as_ptr() as *const c_void,
                333,
                t,
                ((r + 1) % n) as c_int,
                c,
                std::ptr::null_mut(),
            ));
            ok(snclRecv(
                recv[r].as_mut_ptr() as *mut c_void,
                333,
                t,
                ((r + n - 1) % n) as c_int,
                c,
                std::ptr::null_mut(),
            ));
        }
        ok(snclGroupEnd());
        for (r, got) in recv.iter().enumerate() {
            assert!(got.iter().all(|&x| x == ((r + n - 1) % n) as u64 * 7));
        }
        // Split in a group: even and odd ranks.
        let mut subs = vec![std::ptr::null_mut(); n];
        ok(snclGroupStart());
        for r in 0..n {
            ok(snclCommSplit(
                comms[r],
                (r % 2) as c_int,
                r as c_int,
                &mut subs[r],
                std::ptr::null_mut(),
            ));
        }
        ok(snclGroupEnd());
        let evens: Vec<_> = (0..n).step_by(2).map(|r| subs[r]).collect();
        grouped_all_reduce(&evens);
        for c in subs.into_iter().chain(comms) {
            ok(snclCommDestroy(c));
        }
    }
}

#[test]
fn compressed_all_reduce() {
    let n = 4;
    let mut comms = vec![std::ptr::null_mut(); n];
    // SAFETY: `comms` has room for n handles; devlist may be NULL.
    unsafe {
        ok(snclCommInitAll(
            comms.as_mut_ptr(),
            n as c_int,
            std::ptr::null(),
        ))
    };
    let avg = snclRedOp_t::snclAvg as c_int;
    let len = 3000;
    // One thread per rank: each call blocks until every rank has joined.
    let handles: Vec<usize> = comms.iter().map(|&c| c as usize).collect();
    std::thread::scope(|s| {
        for (r, &h) in handles.iter().enumerate() {
            s.spawn(move || {
                let c = h as snclComm_t;
                let x: Vec<f32> = (0..len)
                    .map(|i| (i as f32 / len as f32) * (r + 1) as f32)
                    .collect();
                for (codec, op) in [(c"int8", SUM), (c"fp16", avg), (c"topk:0.5", SUM)] {
                    let mut out = vec![0f32; len];
                    // SAFETY: both buffers hold `len` floats; NULL stream.
                    ok(unsafe {
                        snclAllReduceCompressed(
                            x.as_ptr() as *const c_void,
                            out.as_mut_ptr() as *mut c_void,
                            len,
                            FLOAT,
                            op,
                            codec.as_ptr(),
                            c,
                            std::ptr::null_mut(),
                        )
                    });
                    let scale = if op == SUM { 10.0 } else { 2.5 }; // Σ (r+1) over 4 ranks
                    let worst = (0..len)
                        .map(|i| (out[i] - (i as f32 / len as f32) * scale).abs())
                        .fold(0f32, f32::max);
                    let tol = if codec == c"topk:0.5" {
                        scale
                    } else {
                        0.05 * scale
                    };
                    assert!(worst <= tol, "{codec:?}: off by {worst}");
                }
            });
        }
    });
    let c = comms[0];
    let mut b = vec![1f32; 8];
    let p = b.as_mut_ptr() as *mut c_void;
    let null = std::ptr::null_mut();
    // SAFETY: every pointer is valid or deliberately NULL; each call is
    // rejected before it runs.
    unsafe {
        let max = snclRedOp_t::snclMax as c_int;
        let dbl = snclDataType_t::snclFloat64 as c_int;
        let call = |dt, op, codec: *const std::ffi::c_char| {
            snclAllReduceCompressed(p, p, 2, dt, op, codec, c, null)
        };
        assert_eq!(call(dbl, SUM, c"int8".as_ptr()), snclInvalidArgument);
        assert_eq!(call(FLOAT, max, c"int8".as_ptr()), snclInvalidArgument);
        assert_eq!(call(FLOAT, SUM, c"int9".as_ptr()), snclInvalidArgument);
        assert_eq!(call(FLOAT, SUM, std::ptr::null()), snclInvalidArgument);
        ok(snclGroupStart());
        assert_eq!(call(FLOAT, SUM, c"int8".as_ptr()), snclInvalidUsage);
        ok(snclGroupEnd());
        for c in comms {
            ok(snclCommDestroy(c));
        }
    }
}

#[test]
fn inits_in_a_group_and_non_blocking() {
    let n = 3;
    // Blocking inits inside a group: created together at GroupEnd.
    let id = id_at(SocketAddr::from(([127, 0, 0, 1], free_port())));
    let mut comms = vec![std::ptr::null_mut(); n];
    // SAFETY: valid out-pointers; every handle is destroyed once.
    unsafe {
        ok(snclGroupStart());
        for (r, c) in comms.iter_mut().enumerate() {
            ok(snclCommInitRank(c, n as c_int, id, r as c_int));
        }
        ok(snclGroupEnd());
        grouped_all_reduce(&comms);
        for c in comms {
            ok(snclCommDestroy(c));
        }
    }
    // A communicator created by a group cannot be used before its end.
    let id = id_at(SocketAddr::from(([127, 0, 0, 1], free_port())));
    let mut c = std::ptr::null_mut();
    let mut count = 0;
    // SAFETY: valid out-pointers; the handle is destroyed once.
    unsafe {
        ok(snclGroupStart());
        ok(snclCommInitRank(&mut c, 1, id, 0));
        assert_eq!(snclCommCount(c, &mut count), snclInvalidUsage);
        ok(snclGroupEnd());
        ok(snclCommCount(c, &mut count));
        assert_eq!(count, 1);
        ok(snclCommDestroy(c));
    }
    // Non-blocking inits from one thread: in progress, then polled.
    let id = id_at(SocketAddr::from(([127, 0, 0, 1], free_port())));
    let mut comms = vec![std::ptr::null_mut(); n];
    // SAFETY: all-zero bytes are a valid snclConfig_t (integers, NULLs).
    let mut cfg = unsafe { std::mem::zeroed::<snclConfig_t>() };
    cfg.size = std::mem::size_of::<snclConfig_t>();
    cfg.magic = SNCL_API_MAGIC;
    cfg.version = SNCL_VERSION_CODE as u32;
    cfg.blocking = 0;
    cfg.timeoutMs = 30_000;
    // SAFETY: valid out-pointers and config; every handle is destroyed once.
    unsafe {
        for (r, c) in comms.iter_mut().enumerate() {
            let res = snclCommInitRankConfig(c, n as c_int, id, r as c_int, &mut cfg);
            assert!(res == snclInProgress || res == snclSuccess, "{res:?}");
        }
        for &c in &comms {
            let mut state = snclInProgress as c_int;
            let deadline = Instant::now() + Duration::from_secs(30);
            while state == snclInProgress as c_int {
                ok(snclCommGetAsyncError(c, &mut state));
                assert!(Instant::now() < deadline, "init still in progress");
                std::thread::sleep(Duration::from_millis(5));
            }
            assert_eq!(state, snclSuccess as c_int);
        }
        grouped_all_reduce(&comms);
        for c in comms {
            ok(snclCommDestroy(c));
        }
    }
}

#[test]
fn bad_arguments_are_reported() {
    let last = || {
        // SAFETY: NULL asks for this thread's last error.
        unsafe { CStr::from_ptr(snclGetLastError(std::ptr::null_mut())) }
            .to_string_lossy()
            .into_owned()
    };
    // SAFETY: every pointer is valid or deliberately NULL.
    unsafe {
        let mut c = std::ptr::null_mut();
        let mut bad = id_at(SocketAddr::from(([127, 0, 0, 1], 1)));
        bad.internal[40] ^= 1;
        assert_eq!(snclCommInitRank(&mut c, 2, bad, 0), snclInvalidArgument);
        assert!(last().contains("checksum"), "{}", last());
        assert!(c.is_null());
        let id = id_at(SocketAddr::from(([127, 0, 0, 1], 1)));
        assert_eq!(snclCommInitRank(&mut c, 2, id, 2), snclInvalidArgument);
        assert!(last().contains("out of range"), "{}", last());
        assert_eq!(
            snclCommInitRank(std::ptr::null_mut(), 2, id, 0),
            snclInvalidArgument
        );
        let mut cfg = std::mem::zeroed::<snclConfig_t>();
        assert_eq!(
            snclCommInitRankConfig(&mut c, 2, id, 0, &mut cfg),
            snclInvalidArgument
        );
        assert!(last().contains("SNCL_CONFIG_INITIALIZER"), "{}", last());
        assert_eq!(snclGroupEnd(), snclInvalidUsage);
        // (snclStreamSynchronize(NULL) waits for the current device's
        // default stream, a sncl extension.)
        assert_eq!(snclStreamQuery(std::ptr::null_mut()), snclInvalidArgument);
        // NULL handles are no-ops that succeed, as in NCCL.
        assert_eq!(snclCommDestroy(std::ptr::null_mut()), snclSuccess);
        assert_eq!(snclCommAbort(std::ptr::null_mut()), snclSuccess);
        assert_eq!(snclCommFinalize(std::ptr::null_mut()), snclSuccess);
        let s = |r: c_int| CStr::from_ptr(snclGetErrorString(r)).to_str().unwrap();
        assert_eq!(s(0), "no error");
        assert!(s(6).contains("remote"));
        assert_eq!(s(-3), "unknown result code");
    }
}

/// A huge rank count is an argument error before anything is allocated
/// for the ranks (it used to abort the process in setup). Rank 0 with a
/// reachable root gets as far as setup without the check.
#[test]
fn huge_rank_counts_are_rejected() {
    let last = || {
        // SAFETY: NULL asks for this thread's last error.
        unsafe { CStr::from_ptr(snclGetLastError(std::ptr::null_mut())) }
            .to_string_lossy()
            .into_owned()
    };
    let limit = comm_core::MAX_RANKS;
    // SAFETY: valid handle storage; ids by value.
    unsafe {
        for n in [c_int::MAX, (limit + 1) as c_int] {
            let id = id_at(SocketAddr::from(([127, 0, 0, 1], free_port())));
            let mut c = std::ptr::null_mut();
            let t = Instant::now();
            assert_eq!(snclCommInitRank(&mut c, n, id, 0), snclInvalidArgument);
            assert!(c.is_null());
            let msg = last();
            assert!(
                msg.contains(&n.to_string()) && msg.contains(&limit.to_string()),
                "{msg}"
            );
            assert_eq!(
                snclCommInitRankConfig(&mut c, n, id, 1, std::ptr::null_mut()),
                snclInvalidArgument
            );
            assert_eq!(
                snclCommInitAll(&mut c, n, std::ptr::null()),
                snclInvalidArgument
            );
            assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        }
    }
    // The Rust API checks at setup, whatever the store.
    let store = std::sync::Arc::new(sncl::MemoryStore::new().for_rank(0));
    match sncl::Communicator::init_with_store(store, 0, 1 << 40, 7, sncl::Config::default()) {
        Err(sncl::Error::InvalidArgument { detail, .. }) => {
            assert!(detail.contains(&limit.to_string()), "{detail}")
        }
        other => panic!("want InvalidArgument, got {other:?}"),
    }
}

#[test]
fn stream_reports_a_peer_abort() {
    let mut comms = vec![std::ptr::null_mut(); 2];
    // SAFETY: valid handles and buffers; each handle is released once.
    unsafe {
        ok(snclCommInitAll(comms.as_mut_ptr(), 2, std::ptr::null()));
        grouped_all_reduce(&comms);
        let mut st = std::ptr::null_mut();
        ok(snclStreamCreate(&mut st));
        ok(snclCommAbort(comms[1]));
        let mut buf = vec![1.0f32; 64];
        let p = buf.as_mut_ptr() as *mut c_void;
        // Queued fine; fails when it runs, which synchronize reports.
        ok(snclAllReduce(p, p, 64, FLOAT, SUM, comms[0], st));
        let r = snclStreamSynchronize(st);
        assert_eq!(r, snclRemoteError);
        let msg = CStr::from_ptr(snclGetLastError(comms[0]))
            .to_string_lossy()
            .into_owned();
        assert!(!msg.is_empty());
        let mut state = 0;
        ok(snclCommGetAsyncError(comms[0], &mut state));
        assert_eq!(state, snclRemoteError as c_int, "{msg}");
        ok(snclStreamDestroy(st));
        ok(snclCommDestroy(comms[0]));
    }
}

/// sncl extension: tagged sends and receives from any source through the
/// C functions, one thread per rank: ranks 1..3 each send 40 messages with
/// tags 0..3 to rank 0, which receives them tag by tag from
/// `SNCL_ANY_SOURCE` (checking `*source` against the payload) and then one
/// from a named peer; misuse (bad peers, NULL buffers, a stream, a group)
/// is reported. (Timeouts: tests/tagged.rs.)
#[test]
fn tagged_and_any_source() {
    let n = 4;
    let mut comms = vec![std::ptr::null_mut(); n];
    // SAFETY: `comms` has room for n handles; devlist may be NULL.
    unsafe {
        ok(snclCommInitAll(
            comms.as_mut_ptr(),
            n as c_int,
            std::ptr::null(),
        ))
    };
    let int32 = snclDataType_t::snclInt32 as c_int;
    let null: snclStream_t = std::ptr::null_mut();
    let no_src: *mut c_int = std::ptr::null_mut();
    let per = 40;
    let handles: Vec<usize> = comms.iter().map(|&c| c as usize).collect();
    std::thread::scope(|s| {
        for (r, &h) in handles.iter().enumerate() {
            s.spawn(move || {
                let c = h as snclComm_t;
                let null: snclStream_t = std::ptr::null_mut();
                if r > 0 {
                    for i in 0..per {
                        let tag = (i % 4) as c_int;
                        let msg = [r as i32, tag, i as i32];
                        // SAFETY: 3 ints; NULL stream.
                        ok(unsafe {
                            snclSendTagged(msg.as_ptr() as *const c_void, 3, int32, 0, tag, c, null)
                        });
                    }
                    return;
                }
                let mut seen = std::collections::HashSet::new();
                for round in 0..(n - 1) * per {
                    let tag = (3 - round % 4) as c_int;
                    let mut got = [0i32; 3];
                    let mut src: c_int = -7;
                    // SAFETY: 3 ints and a writable int; NULL stream.
                    ok(unsafe {
                        snclRecvTagged(
                            got.as_mut_ptr() as *mut c_void,
                            3,
                            int32,
                            SNCL_ANY_SOURCE,
                            tag,
                            c,
                            null,
                            &mut src,
                        )
                    });
                    assert_eq!(got[0], src, "source does not match the payload");
                    assert_eq!(
                        got[1], tag,
                        "a message with tag {} matched tag {tag}",
                        got[1]
                    );
                    assert!(seen.insert((got[0], got[2])), "{got:?} received twice");
                }
                assert_eq!(seen.len(), (n - 1) * per);
            });
        }
    });
    let c0 = comms[0];
    let mut b = [0i32; 2];
    let p = b.as_mut_ptr() as *mut c_void;
    // SAFETY: every pointer is valid or deliberately NULL / bogus; calls
    // that must fail are rejected before they run, the last one times out.
    unsafe {
        // Named peer, and a send to self received from any source.
        ok(snclSendTagged(p, 2, int32, 0, 11, c0, null));
        let mut src = -1;
        ok(snclRecvTagged(
            p,
            2,
            int32,
            SNCL_ANY_SOURCE,
            11,
            c0,
            null,
            &mut src,
        ));
        assert_eq!(src, 0);
        assert_eq!(
            snclSendTagged(p, 2, int32, 4, 0, c0, null),
            snclInvalidArgument
        );
        assert_eq!(
            snclRecvTagged(p, 2, int32, -2, 0, c0, null, no_src),
            snclInvalidArgument
        );
        assert_eq!(
            snclRecvTagged(std::ptr::null_mut(), 2, int32, 1, 0, c0, null, no_src),
            snclInvalidArgument
        );
        let mut stream: snclStream_t = std::ptr::null_mut();
        ok(snclStreamCreate(&mut stream));
        assert_eq!(
            snclSendTagged(p, 2, int32, 1, 0, c0, stream),
            snclInvalidUsage
        );
        ok(snclStreamDestroy(stream));
        ok(snclGroupStart());
        assert_eq!(
            snclRecvTagged(p, 2, int32, 1, 0, c0, null, no_src),
            snclInvalidUsage
        );
        ok(snclGroupEnd());
    }
    // SAFETY: live handles.
    unsafe {
        for c in comms {
            ok(snclCommDestroy(c));
        }
    }
}
