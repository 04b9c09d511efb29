//! `--launches N`: the benchmark run N times, each a fresh launch of this
//! program (new ranks, new communicator), and per size the minimum, median
//! and maximum over the launches of each launch's median time and bus
//! bandwidth. On a loaded or unpinned machine one launch can settle in a
//! slow mode and the next in a fast one; one launch's numbers hide that.

use std::process::{Command, ExitCode};

/// One size's result in one launch: (bytes, median µs, bus bandwidth GB/s).
type Point = (u64, f64, f64);

/// The command line without `--launches N` / `--launches=N`.
fn child_args(argv: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut skip = false;
    for a in argv.iter().skip(1) {
        if skip {
            skip = false;
        } else if a == "--launches" {
            skip = true;
        } else if !a.starts_with("--launches=") {
            out.push(a.clone());
        }
    }
    out
}

/// The points of one launch's `--json` file (out of place where it ran,
/// else in place).
fn points(text: &str) -> Result<Vec<Point>, String> {
    let rows: Vec<serde_json::Value> =
        serde_json::from_str(text).map_err(|e| format!("a launch's JSON: {e}"))?;
    rows.iter()
        .map(|r| {
            let t = if r["oop"].is_object() {
                &r["oop"]
            } else {
                &r["ip"]
            };
            let bytes = r["size"].as_u64().ok_or("a row without a size")?;
            let median = r["median_us"].as_f64().ok_or("a row without a median")?;
            // The row's bus bandwidth is of its mean time; rescaled to the
            // median's, as the times are.
            let mean = t["time_us"].as_f64().unwrap_or(0.0);
            let busbw = t["busbw"].as_f64().unwrap_or(0.0);
            let busbw = if median > 0.0 {
                busbw * mean / median
            } else {
                0.0
            };
            Ok((bytes, median, busbw))
        })
        .collect()
}

fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    (v[0], median, v[n - 1])
}

/// Runs the benchmark `launches` times and prints the spread per size.
pub fn main(argv: &[String], launches: usize, json_given: bool) -> ExitCode {
    if json_given {
        eprintln!("commbench: --launches writes its own per-launch JSON; drop --json");
        return ExitCode::from(2);
    }
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("commbench: --launches: cannot find this program: {e}");
            return ExitCode::from(1);
        }
    };
    let dir = std::env::temp_dir().join(format!("commbench-launches-{}", std::process::id()));
    // Ours alone: created here (not an existing one), mode 0700.
    let made = {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().mode(0o700).create(&dir)
    };
    if let Err(e) = made {
        eprintln!("commbench: --launches: {}: {e}", dir.display());
        return ExitCode::from(1);
    }
    let args = child_args(argv);
    let mut runs: Vec<Vec<Point>> = Vec::new();
    let mut failed = 0;
    for i in 0..launches {
        let json = dir.join(format!("launch-{i}.json"));
        let out = Command::new(&exe)
            .args(&args)
            .arg("--json")
            .arg(&json)
            .output();
        let result = match out {
            Err(e) => Err(e.to_string()),
            Ok(o) if !o.status.success() => {
                let err = String::from_utf8_lossy(&o.stderr);
                Err(format!(
                    "{}: {}",
                    o.status,
                    err.lines().last().unwrap_or("")
                ))
            }
            Ok(_) => std::fs::read_to_string(&json)
                .map_err(|e| e.to_string())
                .and_then(|t| points(&t)),
        };
        match result {
            Ok(p) => runs.push(p),
            Err(why) => {
                failed += 1;
                eprintln!("commbench: launch {} of {launches} failed: {why}", i + 1);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    if runs.is_empty() {
        return ExitCode::from(1);
    }
    println!(
        "# {} launches: per size, each launch's median, then min / median / max over the launches",
        runs.len()
    );
    println!(
        "# {:>12} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9} {:>8}",
        "size", "min us", "med us", "max us", "min GB/s", "med GB/s", "max GB/s", "max/min"
    );
    for (k, &(bytes, _, _)) in runs[0].iter().enumerate() {
        let at: Vec<&Point> = runs.iter().filter_map(|r| r.get(k)).collect();
        let (t_min, t_med, t_max) = stats(at.iter().map(|p| p.1).collect());
        let (b_min, b_med, b_max) = stats(at.iter().map(|p| p.2).collect());
        println!(
            "  {bytes:>12} {t_min:>10.2} {t_med:>10.2} {t_max:>10.2} {b_min:>9.3} {b_med:>9.3} \
             {b_max:>9.3} {:>8.2}",
            if t_min > 0.0 { t_max / t_min } else { 0.0 }
        );
    }
    if failed > 0 {
        eprintln!("commbench: {failed} of {launches} launches failed");
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_launch_count_is_not_passed_on() {
        let argv: Vec<String> = [
            "commbench",
            "all_reduce",
            "--launches",
            "3",
            "-b",
            "8",
            "--launches=2",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(child_args(&argv), ["all_reduce", "-b", "8"]);
    }

    #[test]
    fn spread_is_min_median_max() {
        assert_eq!(stats(vec![3.0, 1.0, 2.0]), (1.0, 2.0, 3.0));
        assert_eq!(stats(vec![4.0, 1.0, 2.0, 3.0]), (1.0, 2.5, 4.0));
        let row = r#"[{"size": 8, "median_us": 2.0, "oop": {"busbw": 0.01, "time_us": 4.0}, "ip": null}]"#;
        assert_eq!(points(row).unwrap(), vec![(8, 2.0, 0.02)]);
    }
}
