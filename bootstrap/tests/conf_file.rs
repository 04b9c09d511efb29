//! Settings files: which file applies, the environment winning over it, and
//! errors naming the file and line (the reading lives in
//! `sncl_bootstrap::environment`; parsing in comm-core's settings table).

use std::path::{Path, PathBuf};

use comm_core::config::TransportChoice;
use comm_core::settings::{Environment, Origin};
use comm_core::{Config, Result};
use sncl_bootstrap::environment::{ReadEnvironment, USER_CONF_FILE};

/// A scratch directory removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("sncl-settings-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
    fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn load(pairs: &[(&str, &str)], system: &Path) -> Result<Environment> {
    Environment::from_pairs(pairs.iter().copied()).with_conf_file(system)
}

#[test]
fn conf_file_precedence() {
    let s = Scratch::new("precedence");
    let home = s.0.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let system = s.file(
        "system.conf",
        "# system\nSNCL_NSOCKS = 4\nSNCL_CHUNK_BYTES=8192\n\n",
    );
    let home_s = home.to_str().unwrap();

    // No user file: the system file applies; the environment wins over it.
    let env = load(&[("HOME", home_s), ("SNCL_NSOCKS", "8")], &system).unwrap();
    let c = Config::from_environment(&env).unwrap();
    assert_eq!((c.tcp.nsocks, c.chunk_bytes), (8, 8192));
    assert_eq!(env.conf_file(), Some(system.as_path()));
    assert_eq!(env.origin("SNCL_NSOCKS"), Some(&Origin::Environment));
    assert_eq!(
        env.origin("SNCL_CHUNK_BYTES"),
        Some(&Origin::File {
            path: system.clone(),
            line: 3
        })
    );

    // ~/.sncl.conf wins over the system file (which is then not read).
    std::fs::write(home.join(USER_CONF_FILE), "SNCL_SHM_SLOTS=4\n").unwrap();
    let env = load(&[("HOME", home_s)], &system).unwrap();
    let c = Config::from_environment(&env).unwrap();
    assert_eq!((c.shm.slots, c.tcp.nsocks), (4, 1));

    // SNCL_CONF_FILE wins over both.
    let named = s.file("named.conf", "SNCL_TRANSPORT=tcp\n");
    let env = load(
        &[
            ("HOME", home_s),
            ("SNCL_CONF_FILE", named.to_str().unwrap()),
        ],
        &system,
    )
    .unwrap();
    let c = Config::from_environment(&env).unwrap();
    assert_eq!((c.transport, c.shm.slots), (TransportChoice::Tcp, 8));

    // No file at all is fine.
    let env = load(&[], &s.0.join("absent.conf")).unwrap();
    assert_eq!(env.conf_file(), None);
    assert_eq!(Config::from_environment(&env).unwrap(), Config::default());
}

#[test]
fn conf_file_errors_name_file_and_line() {
    let s = Scratch::new("errors");
    let absent = s.0.join("absent.conf");
    let bad = s.file("bad.conf", "# ok\nSNCL_NSOCKS=2\nNCCL_NSOCKS=2\n");
    let e = load(&[], &bad).unwrap_err().to_string();
    assert!(
        e.contains(&format!("{}:3", bad.display())) && e.contains("NCCL_NSOCKS"),
        "{e}"
    );
    let bad = s.file("noeq.conf", "SNCL_NSOCKS 2\n");
    let e = load(&[], &bad).unwrap_err().to_string();
    assert!(e.contains(&format!("{}:1", bad.display())), "{e}");
    let bad = s.file("nested.conf", "SNCL_CONF_FILE=/x\n");
    assert!(load(&[], &bad).is_err());

    // A value out of range in the file names the file and line too.
    let range = s.file("range.conf", "\nSNCL_NSOCKS=65\n");
    let env = load(&[], &range).unwrap();
    let e = Config::from_environment(&env).unwrap_err().to_string();
    assert!(
        e.contains("SNCL_NSOCKS=65")
            && e.contains("1..=64")
            && e.contains(&format!("{}:2", range.display())),
        "{e}"
    );

    // SNCL_CONF_FILE naming a missing file is an error; the default is not.
    let e = load(&[("SNCL_CONF_FILE", absent.to_str().unwrap())], &absent)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("SNCL_CONF_FILE") && e.contains("absent.conf"),
        "{e}"
    );

    // An unreadable file is an error, not skipped.
    use std::os::unix::fs::PermissionsExt;
    let locked = s.file("locked.conf", "SNCL_NSOCKS=2\n");
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
    if std::fs::read(&locked).is_ok() {
        eprintln!("skipping the unreadable-file check: this user (root?) reads mode-000 files");
    } else {
        let e = load(&[], &locked).unwrap_err().to_string();
        assert!(
            e.contains("locked.conf") && e.contains("cannot be read"),
            "{e}"
        );
    }
    let dir = s.0.join("dir.conf");
    std::fs::create_dir_all(&dir).unwrap();
    assert!(load(&[], &dir).is_err());
}

/// The topology file is read here, by the environment's reader, and parsed by
/// comm-core's settings from the attached text (comm-core reads no files);
/// `SNCL_TOPO_FILE` may come from the settings file too.
#[test]
fn topology_file_is_read_by_the_environment_reader() {
    let s = Scratch::new("topo");
    let topo = s.file("topo", "inter.bandwidth = 1gbit\ninter.latency = 50us\n");
    let conf = s.file("sncl.conf", &format!("SNCL_TOPO_FILE={}\n", topo.display()));
    let env = load(
        &[("SNCL_CONF_FILE", conf.to_str().unwrap())],
        Path::new("/nonexistent"),
    )
    .and_then(|e| e.with_topo_file())
    .unwrap();
    let c = Config::from_environment(&env).unwrap();
    let inter = c.tiers.inter.expect("inter tier from the file");
    assert_eq!((inter.alpha_us, inter.bytes_per_us), (50.0, 125.0));

    // Named but never read (the pure form): an error, not the built-in tiers.
    let unread = Environment::from_pairs([("SNCL_TOPO_FILE", topo.to_str().unwrap())]);
    let e = Config::from_environment(&unread).unwrap_err().to_string();
    assert!(e.contains("not read"), "{e}");

    // A file that does not exist: the error names it and where it was set.
    let missing = s.0.join("missing");
    let conf = s.file(
        "bad.conf",
        &format!("SNCL_TOPO_FILE={}\n", missing.display()),
    );
    let e = load(
        &[("SNCL_CONF_FILE", conf.to_str().unwrap())],
        Path::new("/nonexistent"),
    )
    .and_then(|e| e.with_topo_file())
    .unwrap_err()
    .to_string();
    assert!(
        e.contains(missing.to_str().unwrap()) && e.contains("bad.conf:1"),
        "{e}"
    );
}

/// A settings file that sets `SNCL_SECRET` must be as private as a secret
/// file: mode 0600 or stricter and owned by this user (a 0644 one was
/// accepted without a word while a 0644 secret file was refused).
#[test]
fn a_settings_file_with_the_secret_must_be_private() {
    use std::os::unix::fs::PermissionsExt;
    let s = Scratch::new("secret");
    let secret = "SNCL_SECRET=00112233445566778899aabbccddeeff\n";
    let system = s.0.join("absent.conf");
    let named = s.file("job.conf", secret);
    let vars = [("SNCL_CONF_FILE", named.to_str().unwrap())];
    std::fs::set_permissions(&named, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = load(&vars, &system).unwrap_err().to_string();
    assert!(
        e.contains("SNCL_SECRET")
            && e.contains("readable by other users")
            && e.contains("chmod 600"),
        "{e}"
    );
    std::fs::set_permissions(&named, std::fs::Permissions::from_mode(0o600)).unwrap();
    let env = load(&vars, &system).unwrap();
    assert_eq!(
        env.get("SNCL_SECRET"),
        Some("00112233445566778899aabbccddeeff")
    );
    // Without the secret, the mode of a settings file does not matter;
    // SNCL_SECRET_FILE is not SNCL_SECRET.
    let plain = s.file(
        "plain.conf",
        "SNCL_SECRET_FILE=/nonexistent\nSNCL_NSOCKS=2\n",
    );
    std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
    load(&[("SNCL_CONF_FILE", plain.to_str().unwrap())], &system).unwrap();
}
