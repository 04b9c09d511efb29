//! sncl's log as NCCL users set it: `SNCL_DEBUG` level, `SNCL_DEBUG_SUBSYS`
//! subsystems, `SNCL_DEBUG_FILE` with `%h` / `%p`, and `RUST_LOG` winning
//! over them (commbench installs sncl's subscriber, `log-init`).

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_commbench");

/// A 2-rank run; returns its stderr and whether it succeeded.
fn try_run(env: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = Command::new(BIN);
    cmd.args([
        "all_reduce",
        "--np",
        "2",
        "-b",
        "8",
        "-e",
        "8",
        "-n",
        "2",
        "-w",
        "1",
    ]);
    for var in [
        "RUST_LOG",
        "SNCL_DEBUG",
        "SNCL_DEBUG_SUBSYS",
        "SNCL_DEBUG_FILE",
    ] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().expect("commbench");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.success(), err)
}

/// A 2-rank run that must succeed; returns its stderr.
fn run(env: &[(&str, &str)]) -> String {
    let (ok, err) = try_run(env);
    assert!(ok, "{env:?}: {err}");
    err
}

#[test]
fn subsystems_and_a_file_per_process() {
    let dir = std::env::temp_dir().join(format!("sncl-logs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("log dir");
    let pattern = dir.join("sncl.%h.%p.log");
    let err = run(&[
        ("SNCL_DEBUG", "INFO"),
        ("SNCL_DEBUG_SUBSYS", "INIT,NET"),
        ("SNCL_DEBUG_FILE", pattern.to_str().unwrap()),
    ]);
    assert!(
        !err.contains("communicator ready"),
        "the log went to stderr too:\n{err}"
    );
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string();
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let pid = name
            .strip_prefix(&format!("sncl.{host}."))
            .and_then(|r| r.strip_suffix(".log"))
            .unwrap_or_else(|| panic!("{name} is not sncl.{host}.<pid>.log"));
        assert!(pid.parse::<u32>().is_ok(), "{name}");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{name}");
        let text = std::fs::read_to_string(&path).unwrap();
        // INIT's line is there; COLL's topology line (sncl::comm) is not.
        assert!(text.contains("communicator ready"), "{name}:\n{text}");
        assert!(!text.contains("sncl topology"), "{name}:\n{text}");
        files += 1;
    }
    assert_eq!(files, 2, "one file per rank process");
    let _ = std::fs::remove_dir_all(&dir);
    // Without the subsystem list the same level shows COLL's line too.
    let all = run(&[("SNCL_DEBUG", "INFO")]);
    assert!(all.contains("sncl topology"), "{all}");
    // A bad setting fails the configuration, naming the setting, the
    // value and what it accepts; the log says so too.
    for (var, value, want) in [
        (
            "SNCL_DEBUG_SUBSYS",
            "INIT,NETT",
            "unknown subsystem \"NETT\"",
        ),
        ("SNCL_DEBUG", "LOUD", "SNCL_DEBUG=\"LOUD\""),
    ] {
        let (ok, bad) = try_run(&[("SNCL_DEBUG", "INFO"), (var, value)]);
        assert!(!ok && bad.contains(want), "{var}={value}: {bad}");
    }
}

#[test]
fn rust_log_wins_over_sncl_debug() {
    // Debug events only where RUST_LOG asks, whatever SNCL_DEBUG says.
    let err = run(&[("SNCL_DEBUG", "WARN"), ("RUST_LOG", "sncl=info")]);
    assert!(err.contains("communicator ready"), "{err}");
    let quiet = run(&[("SNCL_DEBUG", "INFO"), ("RUST_LOG", "off")]);
    assert!(!quiet.contains("INFO"), "{quiet}");
}
