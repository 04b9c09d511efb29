//! `commbench --help-env` prints the settings table, and a settings file
//! reaches a real run (its errors name the file and line).

use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_commbench");

fn commbench(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let o = Command::new(BIN)
        .args(args)
        .envs(env.iter().copied())
        .env("SNCL_TIMEOUT_MS", "30000")
        .stdin(Stdio::null())
        .output()
        .expect("running commbench");
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn help_env_lists_every_setting_without_an_operation() {
    let (code, out, err) = commbench(&["--help-env"], &[]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(out, comm_core::settings::render_help());
    for s in comm_core::settings::SETTINGS {
        assert!(out.contains(s.name), "{} missing:\n{out}", s.name);
    }
    assert!(out.contains("1..=64 sockets"), "{out}");
    // Without --help-env the operation is still required.
    let (code, _, err) = commbench(&[], &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("<OP>"), "{err}");
}

#[test]
fn settings_file_errors_name_file_and_line() {
    let dir = std::env::temp_dir().join(format!("commbench-conf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("sncl.conf");
    std::fs::write(&conf, "# test\nSNCL_NSOCKS=65\n").unwrap();
    let conf_s = conf.to_str().unwrap();
    let args = ["all_reduce", "--np", "1", "-b", "64", "-e", "64", "-n", "1"];
    let (code, out, err) = commbench(&args, &[("SNCL_CONF_FILE", conf_s)]);
    assert_ne!(code, Some(0), "{out}{err}");
    assert!(
        err.contains("SNCL_NSOCKS=65") && err.contains(&format!("{conf_s}:2")),
        "{err}"
    );
    // The environment wins over the file.
    let (code, out, err) = commbench(&args, &[("SNCL_CONF_FILE", conf_s), ("SNCL_NSOCKS", "2")]);
    assert_eq!(code, Some(0), "{out}{err}");
    std::fs::write(&conf, "SNCL_NO_SUCH=1\n").unwrap();
    let (code, out, err) = commbench(&args, &[("SNCL_CONF_FILE", conf_s)]);
    assert_ne!(code, Some(0), "{out}{err}");
    assert!(
        err.contains("SNCL_NO_SUCH") && err.contains(&format!("{conf_s}:1")),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
