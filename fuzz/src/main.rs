//! `sncl-fuzz`: an in-process, coverage-free mutating fuzz driver for the
//! targets of this crate (stable toolchain, no instrumentation).
//!
//! ```text
//! sncl-fuzz [TARGET|all] [--iters N] [--seconds S] [--seed X] [--max-len L]
//! ```
//!
//! Each iteration feeds the target either random bytes or a mutation (bit
//! flips, interesting values, insertions, deletions, truncation, splices) of
//! a seed or of an earlier input. A panic is a crash: its input is written
//! to `fuzz/crashes/<target>-<iteration>.bin` and the driver exits 1.
//! Prints one line per target: inputs run, seconds, crashes.

use std::panic;
use std::time::Instant;

use sncl_fuzz::{seeds, TARGETS};

/// splitmix64: a small, fast, seedable generator (not for secrets).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

const INTERESTING: &[u64] = &[
    0,
    1,
    2,
    0x7f,
    0x80,
    0xff,
    0x100,
    0x7fff,
    0xffff,
    0x1_0000,
    0x40_0000,
    0x40_0001,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    u64::MAX,
    i64::MAX as u64,
];

fn mutate(rng: &mut Rng, input: &mut Vec<u8>, corpus: &[Vec<u8>], max_len: usize) {
    let rounds = 1 + rng.below(4);
    for _ in 0..rounds {
        let len = input.len();
        match rng.below(9) {
            0 if len > 0 => {
                let i = rng.below(len);
                input[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                input[i] = rng.next() as u8;
            }
            2 if len > 0 => {
                // An interesting value, 1/2/4/8 bytes little endian.
                let v = INTERESTING[rng.below(INTERESTING.len())];
                let w = 1 << rng.below(4);
                let i = rng.below(len);
                for (k, b) in v.to_le_bytes().iter().take(w).enumerate() {
                    if let Some(x) = input.get_mut(i + k) {
                        *x = *b;
                    }
                }
            }
            3 if len < max_len => {
                let i = rng.below(len + 1);
                let n = 1 + rng.below(16.min(max_len - len));
                let fill: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                input.splice(i..i, fill);
            }
            4 if len > 0 => {
                let i = rng.below(len);
                let n = 1 + rng.below(len - i);
                input.drain(i..i + n.min(16));
            }
            5 => input.truncate(rng.below(len + 1)),
            6 if !corpus.is_empty() => {
                let other = &corpus[rng.below(corpus.len())];
                let at = rng.below(len + 1);
                let from = rng.below(other.len() + 1);
                input.truncate(at);
                input.extend_from_slice(&other[from..]);
                input.truncate(max_len);
            }
            7 if len > 0 => {
                // Printable: text decoders reject most binary early.
                let i = rng.below(len);
                input[i] = b" =.#\n\t:-0123456789abcdefGKMBs/_"[rng.below(31)];
            }
            _ => {
                let i = rng.below(len + 1);
                input.insert(i.min(input.len()), b"\0\n=:"[rng.below(4)]);
                input.truncate(max_len);
            }
        }
    }
}

struct Args {
    target: String,
    iters: u64,
    seconds: f64,
    seed: u64,
    max_len: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        target: "all".into(),
        iters: 1_000_000,
        seconds: f64::INFINITY,
        seed: 1,
        max_len: 512,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--iters" => {
                a.iters = val("--iters")?
                    .parse()
                    .map_err(|e| format!("--iters: {e}"))?
            }
            "--seconds" => {
                a.seconds = val("--seconds")?
                    .parse()
                    .map_err(|e| format!("--seconds: {e}"))?
            }
            "--seed" => a.seed = val("--seed")?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--max-len" => {
                a.max_len = val("--max-len")?
                    .parse()
                    .map_err(|e| format!("--max-len: {e}"))?
            }
            "-h" | "--help" => {
                let names: Vec<&str> = TARGETS.iter().map(|t| t.0).collect();
                return Err(format!(
                    "sncl-fuzz [TARGET|all] [--iters N] [--seconds S] [--seed X] [--max-len L]\ntargets: {}",
                    names.join(" ")
                ));
            }
            t if !t.starts_with('-') => a.target = t.into(),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let chosen: Vec<_> = TARGETS
        .iter()
        .filter(|t| args.target == "all" || t.0 == args.target)
        .collect();
    if chosen.is_empty() {
        eprintln!("unknown target {}; --help lists them", args.target);
        std::process::exit(2);
    }
    // Crashes are reported below with their input; keep the default hook's
    // message for the first one only.
    let mut crashed = false;
    for &&(name, target, _) in &chosen {
        let mut rng = Rng(args.seed ^ name.len() as u64);
        let mut corpus = seeds(name);
        for s in corpus.clone() {
            target(&s);
        }
        let start = Instant::now();
        let mut n = 0u64;
        let mut input = Vec::new();
        while n < args.iters && start.elapsed().as_secs_f64() < args.seconds {
            if rng.below(8) == 0 || corpus.is_empty() {
                let len = rng.below(args.max_len + 1);
                input = (0..len).map(|_| rng.next() as u8).collect();
            } else {
                if rng.below(4) == 0 {
                    input = corpus[rng.below(corpus.len())].clone();
                }
                mutate(&mut rng, &mut input, &corpus, args.max_len);
            }
            let ok = panic::catch_unwind(|| target(&input)).is_ok();
            n += 1;
            if !ok {
                crashed = true;
                let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("crashes");
                let _ = std::fs::create_dir_all(&dir);
                let path = dir.join(format!("{name}-{n}.bin"));
                let _ = std::fs::write(&path, &input);
                eprintln!(
                    "CRASH in {name} after {n} inputs; input in {}",
                    path.display()
                );
                break;
            }
            // Keep a sample of the inputs as further corpus for splices and mutations.
            if corpus.len() < 256 && rng.below(1024) == 0 {
                corpus.push(input.clone());
            }
        }
        println!(
            "{name}: {n} inputs in {:.1} s, {} crash(es)",
            start.elapsed().as_secs_f64(),
            u8::from(crashed)
        );
        if crashed {
            std::process::exit(1);
        }
    }
}
