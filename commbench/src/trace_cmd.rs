//! `commbench trace [--chrome OUT.json] FILES...`: the hang verdict of
//! [`crate::trace`] over the flight-recorder dumps, and with `--chrome` a
//! Chrome/Perfetto trace of them ([`crate::chrome`]).

use std::process::ExitCode;

use crate::chrome::chrome_trace;
use crate::trace::{read_dumps, report};

/// `commbench trace [--chrome OUT] FILES...`.
pub fn main(argv: Vec<String>) -> ExitCode {
    let usage = "usage: commbench trace [--chrome OUT.json] FILES...  (flight-recorder dumps of \
                 SNCL_DEBUG_DUMP_DIR, or the directory; --chrome also writes a Chrome/Perfetto \
                 trace, one track per rank, openable in ui.perfetto.dev)";
    let mut files = Vec::new();
    let mut chrome_out: Option<String> = None;
    let mut args = argv.into_iter().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "-h" | "--help" => {
                eprintln!("{usage}");
                return ExitCode::from(2);
            }
            "--chrome" => match args.next() {
                Some(out) => chrome_out = Some(out),
                None => {
                    eprintln!("commbench trace: --chrome needs a file name\n{usage}");
                    return ExitCode::from(2);
                }
            },
            _ => files.push(a),
        }
    }
    if files.is_empty() {
        eprintln!("{usage}");
        return ExitCode::from(2);
    }
    match read_dumps(&files) {
        Ok(dumps) if dumps.is_empty() => {
            eprintln!("commbench trace: no dumps found in {files:?}");
            ExitCode::from(2)
        }
        Ok(dumps) => {
            let (text, verdicts) = report(&dumps);
            print!("{text}");
            if let Some(out) = chrome_out {
                let trace = chrome_trace(&dumps, &verdicts);
                let written = serde_json::to_string(&trace)
                    .map_err(|e| e.to_string())
                    .and_then(|t| std::fs::write(&out, t).map_err(|e| e.to_string()));
                if let Err(e) = written {
                    eprintln!("commbench trace: cannot write {out}: {e}");
                    return ExitCode::from(1);
                }
                println!("chrome trace: {out} (open in ui.perfetto.dev or chrome://tracing)");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("commbench trace: {e}");
            ExitCode::from(2)
        }
    }
}
