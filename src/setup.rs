//! Building a communicator: rendezvous through a [`Store`], choice of the
//! transport per peer (same node: shared memory; otherwise TCP; or TCP
//! everywhere with `SNCL_TRANSPORT=tcp`), connection setup and the init line
//! at `SNCL_DEBUG=INFO`.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use comm_core::bootstrap::{store_barrier, PrefixStore, Store, TcpStoreServer};
use comm_core::config::TransportChoice;
use comm_core::transport::Connection;
use comm_core::{Config, Error, Result};
use transport_shm::{create_inbound, Segment, ShmConnection};
use transport_tcp::{TcpEndpoint, TcpSetup};

use crate::comm::{Inner, InnerParts};

/// This host's identity: `SNCL_NODE_ID`, else hostname + boot id (network
/// namespaces share both, so test beds must set `SNCL_NODE_ID`).
pub fn node_identity(config: &Config) -> String {
    if let Some(id) = &config.node_id {
        return id.clone();
    }
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    format!(
        "{}/{}",
        read("/proc/sys/kernel/hostname"),
        read("/proc/sys/kernel/random/boot_id")
    )
}

struct UnlinkOnDrop(Vec<String>);

impl Drop for UnlinkOnDrop {
    fn drop(&mut self) {
        for name in &self.0 {
            let _ = std::fs::remove_file(std::path::Path::new(transport_shm::SHM_DIR).join(name));
        }
    }
}

struct RankInfo {
    node: String,
    tcp: SocketAddr,
    digest: String,
    /// The standby listener (see `crate::comm::Standby`); a record without
    /// one (an older writer) leaves it out.
    standby: Option<SocketAddr>,
}

/// `node`, `tcp`, `digest` and the standby address, one per line; the
/// standby address comes last so that a reader can tell it from the digest
/// (which holds `key=value` pairs, never an address).
fn encode_info(node: &str, tcp: SocketAddr, digest: &str, standby: SocketAddr) -> Vec<u8> {
    format!("{node}\n{tcp}\n{digest}\n{standby}").into_bytes()
}

fn decode_info(rank: usize, peer: usize, b: &[u8]) -> Result<RankInfo> {
    let s = String::from_utf8_lossy(b);
    let mut it = s.splitn(3, '\n');
    let bad = || Error::Bootstrap {
        rank,
        detail: format!("rank {peer} published malformed connection info {s:?}"),
    };
    let node = it.next().ok_or_else(bad)?.to_string();
    let tcp = it.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
    let rest = it.next().ok_or_else(bad)?;
    let (digest, standby) = match rest.rsplit_once('\n') {
        Some((d, a)) => match a.parse::<SocketAddr>() {
            Ok(a) => (d, Some(a)),
            Err(_) => (rest, None),
        },
        None => (rest, None),
    };
    Ok(RankInfo {
        node,
        tcp,
        digest: digest.to_string(),
        standby,
    })
}

/// Opens the segment peer rank `p` created for data from `rank`, under the
/// name `p` published in the store. The name must be a plain segment name
/// (no path) and the file a private one of this user; errors say which rank,
/// which peer and what was wrong.
fn open_peer_segment(
    kv: &dyn Store,
    rank: usize,
    p: usize,
    timeout: std::time::Duration,
) -> Result<Segment> {
    let raw = kv.get(&format!("shm/{rank}/{p}"), timeout)?;
    let name = String::from_utf8(raw).map_err(|e| Error::Bootstrap {
        rank,
        detail: format!(
            "peer rank {p} published a shared-memory segment name (for data from rank {rank}) \
             that is not UTF-8: {:?}",
            String::from_utf8_lossy(e.as_bytes())
        ),
    })?;
    transport_shm::check_name(&name).map_err(|e| Error::Bootstrap {
        rank,
        detail: format!(
            "peer rank {p} published an invalid shared-memory segment name for data from \
             rank {rank}: {e}"
        ),
    })?;
    Segment::open(&name).map_err(|e| {
        let hint = if e.kind() == std::io::ErrorKind::PermissionDenied {
            "; shared memory needs every rank of a node to run as the same user \
             (else set SNCL_TRANSPORT=tcp)"
        } else {
            ""
        };
        Error::Io {
            rank,
            context: format!(
                "opening shared-memory segment {name:?} that peer rank {p} created for data \
                 from rank {rank}{hint}"
            ),
            source: e,
        }
    })
}

/// Everything needed to build one communicator.
pub(crate) struct SetupArgs {
    pub store: Arc<dyn Store>,
    pub rank: usize,
    pub nranks: usize,
    pub comm_id: u64,
    pub secret: [u8; 16],
    pub config: Config,
    pub local_ip: IpAddr,
    pub server: Option<TcpStoreServer>,
}

/// Connects this rank to every other rank of the communicator.
pub(crate) fn build(args: SetupArgs) -> Result<Inner> {
    let SetupArgs {
        store,
        rank,
        nranks,
        comm_id,
        secret,
        mut config,
        local_ip,
        server,
    } = args;
    config.validate()?;
    check_world(rank, nranks, "init")?;
    let deadline = Instant::now() + config.timeout;
    let timeout = config.timeout;
    let kv = PrefixStore::new(format!("sncl/{comm_id:016x}"), store.clone());
    transport_shm::cleanup_stale();
    let node = config
        .tiers
        .node_of(rank)
        .map(str::to_string)
        .unwrap_or_else(|| node_identity(&config));
    let ip = match &config.socket_ifname {
        Some(ifname) => transport_tcp::interface_addr(ifname).map_err(|e| Error::Io {
            rank,
            context: format!("SNCL_SOCKET_IFNAME={ifname}"),
            source: e,
        })?,
        None => local_ip,
    };
    let endpoint = TcpEndpoint::bind(ip).map_err(|e| Error::Io {
        rank,
        context: format!("binding a TCP listener on {ip}"),
        source: e,
    })?;
    // The standby listener: where this rank would serve a new store for a
    // shrink (see `crate::comm::Standby`).
    let standby = std::net::TcpListener::bind(SocketAddr::new(ip, 0)).map_err(|e| Error::Io {
        rank,
        context: format!("binding the standby store listener on {ip}"),
        source: e,
    })?;
    let standby_addr = standby.local_addr().map_err(|e| Error::Io {
        rank,
        context: "reading the standby store listener's address".into(),
        source: e,
    })?;
    kv.set(
        &format!("info/{rank}"),
        &encode_info(
            &node,
            endpoint.local_addr(),
            &config.shared_digest(),
            standby_addr,
        ),
    )?;
    let mut infos = Vec::with_capacity(nranks);
    for p in 0..nranks {
        let b = kv.get(&format!("info/{p}"), timeout)?;
        infos.push(decode_info(rank, p, &b)?);
    }
    // Every rank plans with rank 0's settings.
    config.adopt_digest(&infos[0].digest)?;
    let force_tcp = config.transport == TransportChoice::Tcp;
    let transports: Vec<&'static str> = (0..nranks)
        .map(|p| {
            if p == rank {
                "self"
            } else if !force_tcp && infos[p].node == node {
                "shm"
            } else {
                "tcp"
            }
        })
        .collect();
    let mut conns: Vec<Option<Box<dyn Connection>>> = (0..nranks).map(|_| None).collect();

    // Shared memory: create inbound FIFOs, publish their names, open the peers'.
    let shm_peers: Vec<usize> = (0..nranks).filter(|&p| transports[p] == "shm").collect();
    let mut inbound = Vec::new();
    // Names are removed when setup ends, whether it succeeded (every peer
    // has mapped them by then) or failed (nobody will).
    let mut inbound_names = UnlinkOnDrop(Vec::new());
    for &p in &shm_peers {
        let (seg, name) = create_inbound(comm_id, p, rank, config.shm_slots, config.shm_slot_bytes)
            .map_err(|e| Error::Io {
                rank,
                context: format!(
                    "creating shared-memory segment for data from rank {p} in /dev/shm"
                ),
                source: e,
            })?;
        kv.set(&format!("shm/{p}/{rank}"), name.as_bytes())?;
        inbound_names.0.push(name);
        inbound.push((p, seg));
    }
    for (p, seg) in inbound {
        let out = open_peer_segment(&kv, rank, p, timeout)?;
        conns[p] = Some(Box::new(ShmConnection::new(rank, p, seg, out)));
    }

    // TCP to everyone else.
    let tcp_peers: Vec<(usize, SocketAddr)> = (0..nranks)
        .filter(|&p| transports[p] == "tcp")
        .map(|p| (p, infos[p].tcp))
        .collect();
    if !tcp_peers.is_empty() {
        let setup = TcpSetup {
            rank,
            comm_id,
            secret,
            nsocks: config.nsocks,
            max_piece: config.tcp_piece_bytes,
            deadline,
        };
        for c in endpoint.establish(&setup, &tcp_peers)? {
            let p = c.peer();
            conns[p] = Some(Box::new(c));
        }
    }
    // Once everyone has opened its segments, the names can go.
    store_barrier(&kv, "connected", nranks, timeout)?;
    drop(inbound_names);
    let summary: Vec<String> = transports
        .iter()
        .enumerate()
        .filter(|(p, _)| *p != rank)
        .map(|(p, t)| format!("{p}:{t}"))
        .collect();
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        rank,
        nranks,
        node = %node,
        transports = %summary.join(","),
        "sncl communicator ready"
    );
    let standby_addrs = infos.iter().map(|i| i.standby).collect();
    let node_ids = infos.into_iter().map(|i| i.node).collect();
    Ok(Inner::new(InnerParts {
        rank,
        nranks,
        comm_id,
        config,
        node_ids,
        transports,
        conns,
        store: Some(store),
        secret,
        local_ip,
        server,
        standby: Some(standby),
        standby_addrs,
    }))
}

/// Checks a rank and world size before anything is sized by them: the
/// world at most [`comm_core::MAX_RANKS`], the rank inside it.
pub(crate) fn check_world(rank: usize, nranks: usize, op: &'static str) -> Result<()> {
    if nranks > comm_core::MAX_RANKS {
        return Err(Error::InvalidArgument {
            rank,
            op,
            detail: format!(
                "{nranks} ranks exceed the limit of {} ranks per communicator",
                comm_core::MAX_RANKS
            ),
        });
    }
    if rank >= nranks {
        return Err(Error::InvalidArgument {
            rank,
            op,
            detail: format!("rank {rank} is out of range for {nranks} ranks"),
        });
    }
    Ok(())
}
