//! The C ABI from outside: the checked-in header is what cbindgen
//! generates now; a C program built with the system compiler runs every
//! collective on 4 processes through `libsncl`; the C example runs. The
//! in-process checks through the same functions are the crate's unit tests
//! (src/tests/): this crate has no rlib to link here.
//!
//! Regenerate the header with
//! `cargo test -p sncl-capi --test c_abi -- --ignored regenerate_header`.

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// This crate's directory (cbindgen.toml, src/, tests/c/).
const MANIFEST: &str = env!("CARGO_MANIFEST_DIR");

/// The workspace root (include/sncl.h, examples/c/).
fn workspace() -> &'static Path {
    Path::new(MANIFEST)
        .parent()
        .expect("the crate is a workspace member")
}

fn generate_header() -> String {
    let root = Path::new(MANIFEST);
    let mut cfg = cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml");
    // sncl's own release, from the package version (cbindgen emits no
    // string constants): one source, checked by `header_is_current`.
    let release = format!(
        "\n/* sncl's own release (SNCL_VERSION_CODE is the NCCL API version it\n * mirrors). */\n\
         #define SNCL_RELEASE \"{}\"\n",
        env!("CARGO_PKG_VERSION")
    );
    cfg.after_includes = Some(cfg.after_includes.unwrap_or_default() + &release);
    let b = cbindgen::Builder::new()
        .with_config(cfg)
        .with_src(root.join("src/lib.rs"))
        .generate()
        .expect("cbindgen generates the header");
    let mut out = Vec::new();
    b.write(&mut out);
    String::from_utf8(out).expect("utf-8 header")
}

fn header_path() -> PathBuf {
    workspace().join("include/sncl.h")
}

#[test]
fn header_is_current() {
    let want = generate_header();
    let have = std::fs::read_to_string(header_path()).unwrap_or_default();
    assert!(
        have == want,
        "include/sncl.h is stale (capi/src or capi/cbindgen.toml changed); regenerate it with\n  \
         cargo test -p sncl-capi --test c_abi -- --ignored regenerate_header\nand commit the result"
    );
}

#[test]
#[ignore = "writes include/sncl.h; run it after changing the C ABI"]
fn regenerate_header() {
    std::fs::write(header_path(), generate_header()).expect("writing include/sncl.h");
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

/// Compiles C sources (`src`: relative to this crate) against the header
/// and libsncl; None when there is no C compiler (the reason is printed).
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
        .arg(workspace().join("include"))
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
    // Per program as well: two tests run their programs over the same
    // transport at once, and would truncate each other's output files.
    let program = exe.file_stem().and_then(|s| s.to_str()).unwrap_or("c");
    let dir = scratch(&format!("{program}_{transport}"));
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
            .arg(format!("-I{}", workspace().join("include").display()))
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
    let Some(exe) = compile("../examples/c/allreduce.c", "c_allreduce_example") else {
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
        .arg(workspace().join("include"))
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
