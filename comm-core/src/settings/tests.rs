use std::collections::HashSet;

use super::*;
use crate::config::Config;

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
/// to 48 bytes, so builds before it do not interoperate with this one anyway;
/// `device_staging` joined with SNCL_DEVICE_STAGING_BYTES (the device path's
/// segments, which every rank must cut alike); `check_roots` with
/// SNCL_CHECK_ROOTS (rooted collectives' schedules differ with it);
/// `deterministic` with SNCL_DETERMINISTIC (reducing schedules differ);
/// `runtime_connect` with SNCL_RUNTIME_CONNECT (both ranks of a pair must
/// connect it at init or both at first use), and `runtime_connect_tcp`
/// with SNCL_RUNTIME_CONNECT_TCP_RANKS for the same reason.
#[test]
fn digest_wire_format() {
    assert_eq!(
        Config::default().shared_digest(),
        "algo=;chunk=262144;slot=131072;slots=8;piece=524288;checksum=0;check_roots=1;deterministic=0;transport=auto;\
         runtime_connect=1;runtime_connect_tcp=64;device_staging=4194304;device_lane=16777216"
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
         checksum=0;check_roots=1;deterministic=0;transport=tcp;runtime_connect=1;runtime_connect_tcp=64;device_staging=4194304;device_lane=16777216"
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
    b.adopt_digest("check_roots=0").unwrap();
    assert!(!b.check_roots);
    b.adopt_digest("device_staging=65536").unwrap();
    assert_eq!(b.device.staging_bytes, 65536);
    assert!(b.adopt_digest("device_staging=4096").is_err());
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
    assert!(md.contains("| `SNCL_NSOCKS` | 1..=64 sockets | 1 | per process |"));
}

#[test]
fn debug_output_hides_values() {
    let env = Environment::from_pairs([("SNCL_SECRET", "00112233445566778899aabbccddeeff")]);
    let d = format!("{env:?}");
    assert!(d.contains("SNCL_SECRET") && !d.contains("0011"), "{d}");
}

#[test]
fn tcp_pacing_parses_off_auto_and_rates_and_refuses_the_rest() {
    use crate::config::TcpPacing;
    let s = SETTINGS
        .iter()
        .find(|s| s.name == "SNCL_TCP_PACING")
        .expect("declared");
    let mut c = Config::default();
    assert_eq!(c.tcp.pacing, TcpPacing::Off);
    for (raw, want) in [
        ("auto", TcpPacing::Auto),
        ("100mbit", TcpPacing::Rate(12.5e6)),
        ("12.5MB/s", TcpPacing::Rate(12.5e6)),
        ("1gbit", TcpPacing::Rate(125e6)),
        ("off", TcpPacing::Off),
    ] {
        s.apply(&mut c, raw).unwrap();
        assert_eq!(c.tcp.pacing, want, "{raw}");
    }
    for bad in ["fast", "-5mbit", "0.5", "mbit"] {
        let e = s.apply(&mut c, bad).expect_err(bad).to_string();
        assert!(
            e.contains("SNCL_TCP_PACING") && e.contains(bad),
            "{bad}: {e}"
        );
    }
}

#[test]
fn compress_pacing_defaults_to_auto_parses_like_tcp_pacing_and_names_itself() {
    use crate::config::TcpPacing;
    let s = SETTINGS
        .iter()
        .find(|s| s.name == "SNCL_COMPRESS_PACING")
        .expect("declared");
    let mut c = Config::default();
    assert_eq!(c.tcp.compress_pacing, TcpPacing::Auto);
    assert_eq!(c.tcp.flows_per_rank, 1);
    for (raw, want) in [
        ("off", TcpPacing::Off),
        ("100mbit", TcpPacing::Rate(12.5e6)),
        ("auto", TcpPacing::Auto),
    ] {
        s.apply(&mut c, raw).unwrap();
        assert_eq!(c.tcp.compress_pacing, want, "{raw}");
        assert_eq!(
            c.tcp.pacing,
            TcpPacing::Off,
            "{raw}: SNCL_TCP_PACING untouched"
        );
    }
    let e = s.apply(&mut c, "fast").expect_err("fast").to_string();
    assert!(
        e.contains("SNCL_COMPRESS_PACING") && e.contains("fast") && !e.contains("SNCL_TCP_PACING"),
        "{e}"
    );
}

/// A mistyped `SNCL_*` variable is named with the nearest setting; test
/// harness variables and other programs' variables are not.
#[test]
fn unknown_sncl_variables_are_named_with_the_nearest_setting() {
    let env = Environment::from_pairs([
        ("SNCL_ALOG", "all_reduce:ring"),
        ("SNCL_TIMEOUTMS", "5"),
        ("SNCL_FROBNICATE", "1"),
        ("SNCL_TEST_DEVICE", "cuda"),
        ("SNCL_ALGO", "all_reduce:ring"),
        ("NCCL_ALGO", "Ring"),
    ]);
    let mut unknown = env.unknown_names();
    unknown.sort();
    assert_eq!(
        unknown,
        vec![
            ("SNCL_ALOG", Some("SNCL_ALGO")),
            ("SNCL_FROBNICATE", None),
            ("SNCL_TIMEOUTMS", Some("SNCL_TIMEOUT_MS")),
        ]
    );
    // Still only a warning: the configuration builds.
    Config::from_environment(&env).expect("unknown names are not errors");
}

/// The shm and nvlink transports' settings are Config fields like the rest:
/// parsed once (environment or settings file), settable in code, and a bad
/// value fails at Config construction naming the setting.
#[test]
fn transport_parts_parse_into_config() {
    use crate::config::{NvlinkMode, SingleCopy};
    let d = Config::default();
    assert_eq!(d.shm.single_copy, SingleCopy::Auto);
    assert_eq!(d.shm.single_copy_min_bytes, 65536);
    assert_eq!(d.nvlink.mode, NvlinkMode::Auto);
    let c = Config::from_vars(&|k| match k {
        "SNCL_SHM_CMA" => Some("0".into()),
        "SNCL_SHM_CMA_MIN_BYTES" => Some("4096".into()),
        "SNCL_NVLINK" => Some("1".into()),
        _ => None,
    })
    .unwrap();
    assert_eq!(c.shm.single_copy, SingleCopy::Off);
    assert_eq!(c.shm.single_copy_min_bytes, 4096);
    assert_eq!(c.nvlink.mode, NvlinkMode::Required);
    for (var, value) in [
        ("SNCL_SHM_CMA", "maybe"),
        ("SNCL_SHM_CMA_MIN_BYTES", "0"),
        ("SNCL_SHM_CMA_MIN_BYTES", "lots"),
        ("SNCL_NVLINK", "yes"),
    ] {
        let e = Config::from_vars(&|k| (k == var).then(|| value.to_string())).unwrap_err();
        assert!(e.to_string().contains(var), "{var}={value}: {e}");
    }
}

/// The RDMA transport's settings parse into `Config::ib` (formerly read by
/// transport-rdma from the environment), with the same ranges and errors.
#[test]
fn ib_settings_parse_and_reject() {
    let c = Config::from_vars(&|k| {
        match k {
            "SNCL_IB_QPS_PER_CONN" => Some("4"),
            "SNCL_IB_EMULATE" => Some("1"),
            "SNCL_IB_TC" => Some("106"),
            "SNCL_IB_HCA" => Some("^mlx5_2"),
            "SNCL_IB_GDR" => Some("0"),
            _ => None,
        }
        .map(str::to_string)
    })
    .unwrap();
    let ib = &c.ib;
    assert_eq!(
        (ib.qps_per_conn, ib.emulate, ib.traffic_class),
        (4, true, 106)
    );
    assert!(ib.hca.as_ref().unwrap().exclude);
    assert_eq!((ib.gdr, ib.zero_copy, ib.retry_cnt), (Some(false), None, 7));
    assert_eq!(Config::default().ib, crate::config::IbSettings::default());
    for (k, v) in [
        ("SNCL_IB_QPS_PER_CONN", "0"),
        ("SNCL_IB_QPS_PER_CONN", "17"),
        ("SNCL_IB_RETRY_CNT", "8"),
        ("SNCL_IB_SL", "x"),
        ("SNCL_IB_DISABLE", "yes"),
        ("SNCL_IB_ZERO_COPY", "maybe"),
        ("SNCL_IB_HCA", "mlx5_0:0"),
        ("SNCL_IB_EMULATE", "2"),
    ] {
        let e = Config::from_vars(&|name| (name == k).then(|| v.to_string()))
            .unwrap_err()
            .to_string();
        assert!(e.contains(k), "{k}={v}: {e}");
    }
    // SNCL_IB_EMULATE: 0, 1 or strict (issue 36's strict verbs model).
    for (v, want) in [
        ("0", (false, false)),
        ("1", (true, false)),
        ("strict", (true, true)),
    ] {
        let c =
            Config::from_vars(&|name| (name == "SNCL_IB_EMULATE").then(|| v.to_string())).unwrap();
        assert_eq!((c.ib.emulate, c.ib.emulate_strict), want, "{v}");
        let shown = SETTINGS
            .iter()
            .find(|s| s.name == "SNCL_IB_EMULATE")
            .and_then(|s| s.show(&c));
        assert_eq!(shown.as_deref(), Some(v), "shown back");
    }
    let e = Config::from_vars(&|name| (name == "SNCL_IB_EMULATE").then(|| "yes".to_string()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("strict"), "{e}");
}

/// Byte-valued settings take the size suffixes commbench takes (one parser,
/// `crate::units::parse_bytes`); other integers do not.
#[test]
fn byte_settings_take_size_suffixes() {
    let c = Config::from_vars(&|k| {
        match k {
            "SNCL_CHUNK_BYTES" => Some("256K"),
            "SNCL_DEVICE_STAGING_BYTES" => Some("8M"),
            _ => None,
        }
        .map(str::to_string)
    })
    .unwrap();
    assert_eq!(
        (c.chunk_bytes, c.device.staging_bytes),
        (256 << 10, 8 << 20)
    );
    let e = Config::from_vars(&|k| (k == "SNCL_NSOCKS").then(|| "2K".to_string())).unwrap_err();
    assert!(e.to_string().contains("SNCL_NSOCKS"), "{e}");
    let e =
        Config::from_vars(&|k| (k == "SNCL_CHUNK_BYTES").then(|| "1.5M".to_string())).unwrap_err();
    assert!(e.to_string().contains("SNCL_CHUNK_BYTES"), "{e}");
}
