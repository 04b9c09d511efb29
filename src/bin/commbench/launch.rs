//! `--np N`: launch N local ranks of this same command as processes.

use std::net::TcpListener;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

fn strip_np(args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut skip = false;
    for a in args {
        if skip {
            skip = false;
            continue;
        }
        if a == "--np" {
            skip = true;
            continue;
        }
        if a.starts_with("--np=") {
            continue;
        }
        out.push(a.clone());
    }
    out
}

fn secret_hex() -> String {
    let mut b = [0u8; 16];
    if getrandom::fill(&mut b).is_err() {
        let t = Instant::now().elapsed().as_nanos() ^ std::process::id() as u128;
        b = t.to_le_bytes();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Runs `np` ranks; the exit code is the worst of theirs.
pub fn launch_local(np: usize) -> ExitCode {
    if np == 0 {
        eprintln!("commbench: --np must be at least 1");
        return ExitCode::from(2);
    }
    let port = match TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()) {
        Ok(a) => a.port(),
        Err(e) => {
            eprintln!("commbench: cannot find a free port on 127.0.0.1: {e}");
            return ExitCode::from(1);
        }
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("commbench: cannot find my own executable: {e}");
            return ExitCode::from(1);
        }
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args = strip_np(&args);
    let secret = secret_hex();
    let mut children = Vec::new();
    for r in 0..np {
        let mut cmd = Command::new(&exe);
        cmd.args(&args)
            .env("SNCL_RANK", r.to_string())
            .env("SNCL_WORLD_SIZE", np.to_string())
            .env("SNCL_ROOT", format!("127.0.0.1:{port}"))
            .env("SNCL_SECRET", &secret)
            .env("SNCL_LOCAL_RANK", r.to_string())
            .stdin(Stdio::null());
        if r != 0 {
            cmd.stdout(Stdio::null());
        }
        match cmd.spawn() {
            Ok(c) => children.push(c),
            Err(e) => {
                eprintln!("commbench: cannot start rank {r}: {e}");
                for mut c in children {
                    let _ = c.kill();
                }
                return ExitCode::from(1);
            }
        }
    }
    // Wait; once one rank fails, give the others the sncl deadline plus a
    // margin to report their own errors, then stop them.
    let timeout_ms: u64 = std::env::var("SNCL_TIMEOUT_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300_000);
    let mut worst = 0i32;
    let mut failed_at: Option<Instant> = None;
    let mut running: Vec<Option<std::process::Child>> = children.into_iter().map(Some).collect();
    loop {
        let mut alive = 0;
        for (r, slot) in running.iter_mut().enumerate() {
            let Some(c) = slot else { continue };
            match c.try_wait() {
                Ok(Some(st)) => {
                    let code = st.code().unwrap_or(128 + 9);
                    if code != 0 {
                        if failed_at.is_none() {
                            failed_at = Some(Instant::now());
                        }
                        if st.code().is_none() {
                            eprintln!("commbench: rank {r} was killed by a signal");
                        }
                    }
                    worst = worst.max(code);
                    *slot = None;
                }
                Ok(None) => alive += 1,
                Err(_) => *slot = None,
            }
        }
        if alive == 0 {
            break;
        }
        if let Some(t) = failed_at {
            if t.elapsed() > Duration::from_millis(timeout_ms) + Duration::from_secs(5) {
                for (r, slot) in running.iter_mut().enumerate() {
                    if let Some(c) = slot {
                        eprintln!(
                            "commbench: stopping rank {r}, still running after another rank failed"
                        );
                        let _ = c.kill();
                        let _ = c.wait();
                        worst = worst.max(1);
                    }
                }
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    ExitCode::from(worst.clamp(0, 255) as u8)
}
