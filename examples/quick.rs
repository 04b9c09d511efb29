//! Four ranks as threads all-reduce a vector and check the result.
use sncl::{Communicator, Config, ConfigFromEnv, ReduceOp};

fn main() -> sncl::Result<()> {
    let n = 4;
    let comms = Communicator::init_threads(n, Config::from_env()?)?;
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let mut v: Vec<f32> = (0..1_000_003).map(|i| (i % 7 + c.rank()) as f32).collect();
                c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
                for (i, x) in v.iter().enumerate() {
                    let want = (0..n).map(|r| (i % 7 + r) as f32).sum::<f32>();
                    assert_eq!(*x, want, "rank {} elem {i}", c.rank());
                }
                c.barrier().unwrap();
            });
        }
    });
    eprintln!("ok");
    Ok(())
}
