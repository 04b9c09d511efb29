use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::*;

#[test]
fn names_and_digest_keys_are_unique() {
    let mut names = HashSet::new();
    let mut keys = HashSet::new();
    for s in SETTINGS {
        assert!(s.name.starts_with("SNCL_"), "{}", s.name);
        assert!(names.insert(s.name), "{} declared twice", s.name);
        if let Scope::Shared { digest_key } = s.scope {
            assert!(keys.insert(digest_key), "digest key {digest_key} twice");
            assert!(
                s.is_config_field(),
                "{} is shared but no Config field",
                s.name
            );
        }
        assert!(!s.doc.is_empty() && !s.doc.contains('\n'), "{}", s.name);
        if let Values::Int(r) = s.values {
            assert!(r.min <= r.max && r.multiple >= 1, "{}", s.name);
        }
    }
}

/// Every declared default of a `Config` field is what `Config::default()`
/// holds, so the table cannot drift from the code.
#[test]
fn declared_defaults_are_the_config_defaults() {
    let d = Config::default();
    for s in SETTINGS.iter().filter(|s| s.is_config_field()) {
        match s.default {
            DefaultValue::Value(v) => {
                let mut c = Config::default();
                s.apply(&mut c, v).unwrap();
                assert_eq!(c, d, "{}={v}", s.name);
                assert_eq!(s.show(&d).as_deref(), Some(v), "{}", s.name);
            }
            DefaultValue::Unset(_) => {
                assert_eq!(s.show(&d).as_deref(), Some(""), "{}", s.name)
            }
        }
    }
}

/// The digest's wire format (`key=value;...` in table order). `checksum`
/// joined with SNCL_CHECKSUM, in the same change that grew the piece header
/// to 48 bytes, so builds before it do not interoperate with this one anyway.
#[test]
fn digest_wire_format() {
    assert_eq!(
        Config::default().shared_digest(),
        "algo=;chunk=262144;slot=131072;slots=8;piece=524288;checksum=0;transport=auto"
    );
    let c = Config::from_vars(&|k| match k {
        "SNCL_ALGO" => Some("all_reduce:tree;reduce:ring".into()),
        "SNCL_TRANSPORT" => Some("tcp".into()),
        _ => None,
    })
    .unwrap();
    assert_eq!(
        c.shared_digest(),
        "algo=all_reduce:tree,reduce:ring;chunk=262144;slot=131072;slots=8;piece=524288;\
         checksum=0;transport=tcp"
    );
    let mut b = Config::default();
    // Any well-formed name is adopted (the runtime's registry refuses
    // unknown ones at init, naming the known); a malformed one is not.
    assert!(b.adopt_digest("transport=UDP/IP").is_err());
    b.adopt_digest("transport=rdma").unwrap();
    assert_eq!(b.transport.forced(), Some("rdma"));
    b.adopt_digest("checksum=1").unwrap();
    assert!(b.checksum);
    assert!(b.adopt_digest("checksum=yes").is_err());
    let e = b.adopt_digest("colour=blue").unwrap_err().to_string();
    assert!(e.contains("colour"), "{e}");
}

#[test]
fn tables_list_every_setting() {
    let md = render_markdown();
    let help = render_help();
    for s in SETTINGS {
        assert!(md.contains(&format!("| `{}` |", s.name)), "{}", s.name);
        assert!(help.contains(&format!("\n{}\n", s.name)), "{}", s.name);
    }
    assert_eq!(md.lines().count(), SETTINGS.len() + 2);
    assert!(md.contains("| `SNCL_NSOCKS` | 1..=64 sockets | 2 | per process |"));
}

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
    assert_eq!((c.nsocks, c.chunk_bytes), (8, 8192));
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
    assert_eq!((c.shm_slots, c.nsocks), (4, 2));

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
    assert_eq!(
        (c.transport, c.shm_slots),
        (crate::config::TransportChoice::Tcp, 8)
    );

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

#[test]
fn debug_output_hides_values() {
    let env = Environment::from_pairs([("SNCL_SECRET", "00112233445566778899aabbccddeeff")]);
    let d = format!("{env:?}");
    assert!(d.contains("SNCL_SECRET") && !d.contains("0011"), "{d}");
}
