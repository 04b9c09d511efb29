//! `sncl-fuzz`: helpers of the fuzzing scripts (scripts/fuzz.sh). The
//! fuzzing itself is libFuzzer's (`fuzz/libfuzzer/`, docs/FUZZING.md).
//!
//! ```text
//! sncl-fuzz list                 the targets, one per line
//! sncl-fuzz seeds DIR [TARGET]   writes each target's seeds to DIR/<target>/seed-<n>
//! ```

use std::path::Path;
use std::process::ExitCode;

use sncl_fuzz::{seeds, TARGETS};

fn write_seeds(dir: &Path, only: Option<&str>) -> std::io::Result<usize> {
    let mut written = 0;
    for (name, _) in TARGETS.iter().filter(|t| only.is_none_or(|o| o == t.0)) {
        let to = dir.join(name);
        std::fs::create_dir_all(&to)?;
        for (i, seed) in seeds(name).iter().enumerate() {
            std::fs::write(to.join(format!("seed-{i}")), seed)?;
            written += 1;
        }
    }
    Ok(written)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: sncl-fuzz list | sncl-fuzz seeds DIR [TARGET]";
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["list"] => {
            for (name, _) in TARGETS {
                println!("{name}");
            }
            ExitCode::SUCCESS
        }
        ["seeds", dir, rest @ ..] if rest.len() <= 1 => {
            let only = rest.first().copied();
            if let Some(t) = only.filter(|t| sncl_fuzz::target(t).is_none()) {
                eprintln!("sncl-fuzz: no target {t:?} (see sncl-fuzz list)");
                return ExitCode::from(2);
            }
            match write_seeds(Path::new(dir), only) {
                Ok(n) => {
                    eprintln!("sncl-fuzz: {n} seed(s) written under {dir}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("sncl-fuzz: writing seeds under {dir}: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        _ => {
            eprintln!("{usage}");
            ExitCode::from(2)
        }
    }
}
