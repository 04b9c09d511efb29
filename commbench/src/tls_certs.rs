//! `commbench tls-certs DIR`: a job's TLS files for `SNCL_TLS_*` — a fresh
//! authority (its key is discarded once the job's certificate is signed),
//! one certificate and key every rank shares: `DIR/ca.pem`, `DIR/cert.pem`
//! and `DIR/key.pem` (mode 0600; DIR is created mode 0700). Copy DIR to
//! every node of the job (docs/SECURITY.md).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// Options of `commbench tls-certs`.
#[derive(Parser, Debug, Clone)]
#[command(name = "commbench tls-certs", bin_name = "commbench tls-certs")]
pub struct TlsCertsArgs {
    /// Directory to write ca.pem, cert.pem and key.pem into.
    pub dir: PathBuf,
    /// Subject names of the job's certificate (informational: peers check
    /// the authority, not the name); repeatable.
    #[arg(long = "name", default_values_t = vec!["sncl".to_string()])]
    pub names: Vec<String>,
}

/// Runs `commbench tls-certs` (`argv[0]` is the subcommand's name).
pub fn main(argv: Vec<String>) -> ExitCode {
    let args = match crate::parse_subcommand::<TlsCertsArgs>(&argv) {
        Ok(a) => a,
        Err(code) => return code,
    };
    match sncl_bootstrap::tls::certs::write_job_set(&args.dir, &args.names) {
        Ok(files) => {
            println!("SNCL_TLS_CERT={}", files.cert.display());
            println!("SNCL_TLS_KEY={}", files.key.display());
            println!("SNCL_TLS_CA={}", files.ca.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!(
                "commbench tls-certs: cannot write the job's TLS files into {}: {e}",
                args.dir.display()
            );
            ExitCode::FAILURE
        }
    }
}
