//! `commbench sim init`: the predicted creation of one communicator on the
//! modelled cluster's ranks, phase by phase, with its bottleneck named
//! ([`sim::bootstrap`]).

use comm_core::topofile::{parse_bandwidth, parse_latency_us};
use sim::bootstrap::{bootstrap, BootstrapModel, Rendezvous};

/// The bootstrap's flags of `commbench sim init`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct InitArgs {
    /// init only: requests per second the store server answers (default:
    /// 50000, measured on loopback by bootstrap/tests/store_rate.rs).
    #[arg(long = "store-rate")]
    pub store_rate: Option<f64>,
    /// init only: the store's round trip (e.g. 107us, the default).
    #[arg(long = "store-rtt")]
    pub store_rtt: Option<String>,
    /// init only: the store host's bandwidth (e.g. 12.5GB/s, the default).
    #[arg(long = "store-bw")]
    pub store_bw: Option<String>,
    /// init only: connections at creation (SNCL_RUNTIME_CONNECT=0)
    /// instead of at first use.
    #[arg(long = "eager")]
    pub eager: bool,
    /// init only: `tree` (gathered by rank 0, passed down a tree of
    /// standby stores: sncl's) or `all` (every rank reads every record
    /// from the store, as before stop 51).
    #[arg(long = "rendezvous", default_value = "tree")]
    pub rendezvous: String,
}

/// Prints the predicted creation of a communicator on `nodes` ×
/// `per_node` ranks.
pub fn run((nodes, per_node): (usize, usize), i: &InitArgs) -> Result<(), String> {
    let nranks = nodes
        .checked_mul(per_node)
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("{nodes} nodes x {per_node} ranks is not a job"))?;
    let mut m = BootstrapModel::measured_here(nranks);
    if let Some(r) = i.store_rate {
        if !(r.is_finite() && r > 0.0) {
            return Err(format!(
                "--store-rate {r}: expected requests per second above 0"
            ));
        }
        m.store_requests_per_s = r;
    }
    if let Some(s) = &i.store_rtt {
        m.round_trip_us =
            parse_latency_us(s).ok_or_else(|| format!("--store-rtt {s:?} is not a latency"))?;
    }
    if let Some(s) = &i.store_bw {
        m.store_bytes_per_s =
            parse_bandwidth(s).ok_or_else(|| format!("--store-bw {s:?} is not a bandwidth"))?;
    }
    m.eager = i.eager;
    m.rendezvous = match i.rendezvous.as_str() {
        "all" => Rendezvous::AllReadAll,
        "tree" => Rendezvous::Tree,
        x => return Err(format!("--rendezvous {x:?}: expected all or tree")),
    };
    let c = bootstrap(&m);
    println!(
        "# sncl commbench sim init: {} ranks = {} nodes x {}, store {:.0} requests/s, round trip {} us, {:.3} GB/s; connections {}; rendezvous {}",
        m.nranks,
        nodes,
        per_node,
        m.store_requests_per_s,
        m.round_trip_us,
        m.store_bytes_per_s / 1e9,
        if m.eager { "at creation" } else { "at first use" },
        i.rendezvous
    );
    println!("#      phase      seconds  bound");
    for p in &c.phases {
        println!("{:>12} {:>12.3}  {}", p.phase, p.seconds, p.bound);
    }
    let b = c.bottleneck();
    println!(
        "# total {:.3} s; bottleneck: {} ({}); {:.3e} store requests; the first operation's connections at first use: {:.3} s",
        c.total_s(),
        b.phase,
        b.bound,
        c.store_requests,
        c.first_use_connect_s
    );
    Ok(())
}
