//! `commbench calibrate --np N` on one node: a topology file with the intra
//! tier, measured over the ranks' transport, and no inter tier; only the
//! measuring rank reports its fit.

use std::process::Command;

use comm_core::topofile::TierSpec;

#[test]
fn calibrate_np_writes_the_intra_tier_of_one_node() {
    for transport in ["shm", "tcp"] {
        let path = std::env::temp_dir().join(format!(
            "sncl-calibrate-np-{transport}-{}.txt",
            std::process::id()
        ));
        let out = Command::new(env!("CARGO_BIN_EXE_commbench"))
            .args(["calibrate", "--np", "2", "--size", "256K", "-n", "3", "-o"])
            .arg(&path)
            .env("SNCL_TRANSPORT", transport)
            .env("SNCL_TIMEOUT_MS", "30000")
            .output()
            .expect("running commbench calibrate");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "calibrate over {transport} failed ({}):\n{}\n{stderr}",
            out.status,
            String::from_utf8_lossy(&out.stdout)
        );
        let text = std::fs::read_to_string(&path).expect("the topology file");
        let _ = std::fs::remove_file(&path);
        // Read as the planner reads it (SNCL_TOPO_FILE).
        let spec = TierSpec::parse(&text, "calibrate --np output")
            .unwrap_or_else(|e| panic!("{transport}: {e}\n{text}"));
        let intra = spec.intra.expect("intra.latency and intra.bandwidth");
        let us = intra.alpha_us;
        assert!(us > 0.0 && us < 1e5, "{transport}: intra.latency {us} us");
        let bw = intra.bytes_per_us * 1e6;
        assert!(bw > 1e6, "{transport}: intra.bandwidth {bw} B/s");
        assert_eq!(spec.cluster.nodes, Some(1), "{text}");
        assert_eq!(spec.cluster.ranks_per_node, Some(2), "{text}");
        assert!(
            !text.contains("inter."),
            "{transport}: an inter tier on one node:\n{text}"
        );
        // Rank 1 holds no measurement (zeros): until only the measuring rank
        // reported, it printed a fit of zeros ("0.0 us for ..."). Rank 0
        // prints one or two fit lines (a noisy fit says so).
        let fit_lines: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains("ranks 0 -> 1:"))
            .collect();
        assert!(
            (1..=2).contains(&fit_lines.len())
                && !fit_lines.iter().any(|l| l.contains(": 0.0 us for")),
            "{transport}: the fit reported by a rank that did not measure:\n{stderr}"
        );
        assert_eq!(
            stderr
                .matches("a step of an 8-byte ring all-reduce")
                .count(),
            1,
            "{transport}: the step latency not reported exactly once:\n{stderr}"
        );
    }
}
