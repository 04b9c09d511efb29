//! The table of every `SNCL_*` setting.
//!
//! Order matters twice: it is the order of the README's table and of
//! `commbench --help-env`, and the shared settings appear in the agreement
//! digest in this order (`algo`, `chunk`, `slot`, `slots`, `piece`,
//! `checksum`, `transport`, `device_staging`, `device_lane`: the digest's wire
//! format).

use std::time::Duration;

use super::row::{DefaultValue, Field, IntRange, Scope, Setting, Values};
use crate::config::{
    parse_algo, HcaFilter, NvlinkMode, SingleCopy, TransportChoice, DEVICE_STAGING_ALIGN,
    MAX_CHUNK_BYTES, MAX_DEVICE_LANE_BYTES, MAX_DEVICE_STAGING_BYTES, MAX_NSOCKS, MAX_SHM_SLOTS,
    MAX_SHM_SLOT_BYTES, MAX_SINGLE_COPY_MIN_BYTES, MAX_TCP_PIECE_BYTES, MAX_TIMEOUT_MS,
    MIN_CHUNK_BYTES, MIN_DEVICE_STAGING_BYTES, MIN_NSOCKS, MIN_SHM_SLOTS, MIN_SHM_SLOT_BYTES,
    MIN_TCP_PIECE_BYTES, MIN_TIMEOUT_MS, SHM_SLOT_ALIGN, TCP_PIECE_ALIGN,
};

const fn launch(
    name: &'static str,
    values: &'static str,
    default: DefaultValue,
    doc: &'static str,
) -> Setting {
    Setting {
        name,
        scope: Scope::Launch,
        values: Values::Text(values),
        default,
        doc,
        field: Field::Elsewhere,
    }
}

const fn local(
    name: &'static str,
    values: Values,
    default: DefaultValue,
    doc: &'static str,
) -> Setting {
    Setting {
        name,
        scope: Scope::Process,
        values,
        default,
        doc,
        field: Field::Elsewhere,
    }
}

/// A TLS file's row (`SNCL_TLS_*`): a path, unset by default (TLS off).
const fn tls_file(
    name: &'static str,
    doc: &'static str,
    put: fn(&mut crate::Config, Option<std::path::PathBuf>),
    get: fn(&crate::Config) -> &Option<std::path::PathBuf>,
) -> Setting {
    Setting {
        name,
        scope: Scope::Process,
        values: Values::Text("path"),
        default: DefaultValue::Unset("TLS off"),
        doc,
        field: Field::Path { put, get },
    }
}

const fn range(min: usize, max: usize, multiple: usize, unit: &'static str) -> Values {
    Values::Int(IntRange {
        min,
        max,
        multiple,
        unit,
    })
}

use DefaultValue::{Unset, Value};

/// Every setting sncl reads, in documentation order.
pub static SETTINGS: &[Setting] = &[
    // Launch: read by `LaunchEnv` (comm-core/src/bootstrap/env.rs).
    launch(
        "SNCL_RANK",
        "integer below SNCL_WORLD_SIZE",
        Unset("from the launcher: torchrun `RANK`, Open MPI `OMPI_COMM_WORLD_RANK`, Slurm `SLURM_PROCID`"),
        "this process's rank",
    ),
    Setting {
        name: "SNCL_WORLD_SIZE",
        scope: Scope::Launch,
        values: range(1, crate::MAX_RANKS, 1, "ranks"),
        default: Unset("from the launcher: torchrun `WORLD_SIZE`, Open MPI `OMPI_COMM_WORLD_SIZE`, Slurm `SLURM_NTASKS`"),
        doc: "number of ranks",
        field: Field::Elsewhere,
    },
    launch(
        "SNCL_LOCAL_RANK",
        "integer",
        Unset("from the launcher: `LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_RANK`, `SLURM_LOCALID`"),
        "rank within the node",
    ),
    launch(
        "SNCL_ROOT",
        "host:port or [v6]:port",
        Unset("torchrun: `MASTER_ADDR`:`MASTER_PORT`+1; Slurm: first node, port 20000 + job id mod 20000; Open MPI: must be given"),
        "where rank 0's rendezvous store listens",
    ),
    launch(
        "SNCL_SECRET",
        "32 hex digits",
        Unset("`SNCL_SECRET_FILE`, else derived from the launcher's job id (not authenticated: a WARN says so)"),
        "secret every connection must prove (see docs/SECURITY.md)",
    ),
    launch(
        "SNCL_SECRET_FILE",
        "path of a file holding 32 hex digits, mode 0600",
        Unset("none"),
        "file holding the secret",
    ),
    // Shared: in the agreement digest, rank 0's value applies everywhere.
    Setting {
        name: "SNCL_ALGO",
        scope: Scope::Shared { digest_key: "algo" },
        values: Values::Text("collective:algorithm pairs separated by `;` (names: see the README's Algorithms section or `commbench --help`)"),
        default: Value(""),
        doc: "forced algorithms, e.g. `all_reduce:ring;broadcast:tree` (empty: the planner chooses)",
        field: Field::Text {
            put: |c, v| {
                c.algo = parse_algo(&v.replace(',', ";"))?;
                Ok(())
            },
            show: |c| {
                let algo: Vec<String> = c
                    .algo
                    .iter()
                    .map(|(coll, a)| format!("{}:{}", coll.name(), a.name()))
                    .collect();
                algo.join(",")
            },
        },
    },
    Setting {
        name: "SNCL_CHUNK_BYTES",
        scope: Scope::Shared { digest_key: "chunk" },
        values: range(MIN_CHUNK_BYTES, MAX_CHUNK_BYTES, 1, "bytes"),
        default: Value("262144"),
        doc: "pipeline chunk",
        field: Field::Int {
            name: "chunk_bytes",
            get: |c| c.chunk_bytes,
            put: |c, v| c.chunk_bytes = v,
        },
    },
    Setting {
        name: "SNCL_SHM_SLOT_BYTES",
        scope: Scope::Shared { digest_key: "slot" },
        values: range(MIN_SHM_SLOT_BYTES, MAX_SHM_SLOT_BYTES, SHM_SLOT_ALIGN, "bytes"),
        default: Value("131072"),
        doc: "shared-memory FIFO slot size (slots × slot size ≤ 1 GiB per segment)",
        field: Field::Int {
            name: "shm.slot_bytes",
            get: |c| c.shm.slot_bytes,
            put: |c, v| c.shm.slot_bytes = v,
        },
    },
    Setting {
        name: "SNCL_SHM_SLOTS",
        scope: Scope::Shared { digest_key: "slots" },
        values: range(MIN_SHM_SLOTS, MAX_SHM_SLOTS, 1, "slots"),
        default: Value("8"),
        doc: "shared-memory FIFO slots per direction",
        field: Field::Int {
            name: "shm.slots",
            get: |c| c.shm.slots,
            put: |c, v| c.shm.slots = v,
        },
    },
    Setting {
        name: "SNCL_TCP_PIECE_BYTES",
        scope: Scope::Shared { digest_key: "piece" },
        values: range(MIN_TCP_PIECE_BYTES, MAX_TCP_PIECE_BYTES, TCP_PIECE_ALIGN, "bytes"),
        default: Value("524288"),
        doc: "TCP piece size",
        field: Field::Int {
            name: "tcp.piece_bytes",
            get: |c| c.tcp.piece_bytes,
            put: |c, v| c.tcp.piece_bytes = v,
        },
    },
    Setting {
        name: "SNCL_CHECKSUM",
        scope: Scope::Shared {
            digest_key: "checksum",
        },
        values: Values::Choice(&["0", "1"]),
        default: Value("0"),
        doc: "`1`: every piece of a collective carries the CRC32C of its payload, computed in the \
              pass that copies it, and the receiver verifies it while it uses the piece (corrupt \
              data is an error naming the peer; the output is then undefined, as after any failed \
              operation; costs the CRC's compute on each side, docs/perf-notes/NOTEBOOK.md §11b)",
        field: Field::Text {
            put: |c, v| {
                c.checksum = switch("SNCL_CHECKSUM", v)?;
                Ok(())
            },
            show: |c| u8::from(c.checksum).to_string(),
        },
    },
    Setting {
        name: "SNCL_CHECK_ROOTS",
        scope: Scope::Shared {
            digest_key: "check_roots",
        },
        values: Values::Choice(&["0", "1"]),
        default: Value("1"),
        doc: "`1`: broadcast, reduce, gather and scatter start with ⌈log2 n⌉ empty exchanges that \
              compare every rank's root, count, type and reduction, so ranks that disagree fail \
              on every rank in that operation, naming both roots, before any data moves; `0`: \
              no exchange (one hop less at 2 ranks; a disagreement is then found only by the \
              ranks that receive, or at the timeout; docs/perf-notes/NOTEBOOK.md §17)",
        field: Field::Text {
            put: |c, v| {
                c.check_roots = switch("SNCL_CHECK_ROOTS", v)?;
                Ok(())
            },
            show: |c| u8::from(c.check_roots).to_string(),
        },
    },
    Setting {
        name: "SNCL_DETERMINISTIC",
        scope: Scope::Shared {
            digest_key: "deterministic",
        },
        values: Values::Choice(&["0", "1"]),
        default: Value("0"),
        doc: "`1`: all-reduce, reduce and reduce-scatter (fused and compressed ones too) reduce \
              every element in one canonical order, a fixed binary tree over the ranks in rank \
              order, whatever the algorithm, chunk, transport, placement or memory, so results \
              are bitwise reproducible from run to run and across algorithms (docs/DETERMINISM.md; \
              top-k compression is refused); `0`: each algorithm reduces in its own order",
        field: Field::Text {
            put: |c, v| {
                c.deterministic = switch("SNCL_DETERMINISTIC", v)?;
                Ok(())
            },
            show: |c| u8::from(c.deterministic).to_string(),
        },
    },
    Setting {
        name: "SNCL_TRANSPORT",
        scope: Scope::Shared {
            digest_key: "transport",
        },
        values: Values::Text("auto, or a transport's name (self, shm, rdma, tcp)"),
        default: Value("auto"),
        doc: "`auto`: per rank pair the first transport of the registry that can connect it \
              (shared memory within a node, RDMA across where a device is ready, else TCP); a name forces that transport between \
              every pair and fails naming what is missing where it cannot",
        field: Field::Text {
            put: |c, v| {
                c.transport = TransportChoice::parse(v)?;
                Ok(())
            },
            show: |c| c.transport.to_string(),
        },
    },
    Setting {
        name: "SNCL_RUNTIME_CONNECT",
        scope: Scope::Shared {
            digest_key: "runtime_connect",
        },
        values: Values::Choice(&["0", "1"]),
        default: Value("1"),
        doc: "`1`: RDMA connections (and TCP ones from SNCL_RUNTIME_CONNECT_TCP_RANKS ranks) are made at the first operation that needs the pair (a \
              collective connects the peers its schedule talks to, a point-to-point operation \
              its peer, which must reach an operation with this rank), so a job connects only \
              the pairs its operations use (as NCCL_RUNTIME_CONNECT=1); `0`: every pair at init",
        field: Field::Text {
            put: |c, v| {
                c.runtime_connect = switch("SNCL_RUNTIME_CONNECT", v)?;
                Ok(())
            },
            show: |c| u8::from(c.runtime_connect).to_string(),
        },
    },
    Setting {
        name: "SNCL_RUNTIME_CONNECT_TCP_RANKS",
        scope: Scope::Shared {
            digest_key: "runtime_connect_tcp",
        },
        values: range(1, crate::MAX_RANKS, 1, "ranks"),
        default: Value("64"),
        doc: "with SNCL_RUNTIME_CONNECT=1, a communicator of at least this many ranks connects its \
              TCP pairs at first use too (a ring's rank then opens its two neighbours' sockets, not \
              one per peer); smaller ones connect every TCP pair at init",
        field: Field::Int {
            name: "runtime_connect_tcp_ranks",
            get: |c| c.runtime_connect_tcp_ranks,
            put: |c, v| c.runtime_connect_tcp_ranks = v,
        },
    },
    Setting {
        name: "SNCL_DEVICE_STAGING_BYTES",
        scope: Scope::Shared {
            digest_key: "device_staging",
        },
        values: range(
            MIN_DEVICE_STAGING_BYTES,
            MAX_DEVICE_STAGING_BYTES,
            DEVICE_STAGING_ALIGN,
            "bytes",
        ),
        default: Value("4194304"),
        doc: "device path: the size of each staging buffer a communicator allocates when it binds \
              a device (send staging and receive ring in pinned memory, scratch and two segment \
              buffers on the device: six of them); a device collective runs in segments of at \
              most this many bytes per buffer, and nothing is allocated inside an operation",
        field: Field::Int {
            name: "device.staging_bytes",
            get: |c| c.device.staging_bytes,
            put: |c, v| c.device.staging_bytes = v,
        },
    },
    Setting {
        name: "SNCL_DEVICE_LANE_BYTES",
        scope: Scope::Shared {
            digest_key: "device_lane",
        },
        values: range(0, MAX_DEVICE_LANE_BYTES, DEVICE_STAGING_ALIGN, "bytes"),
        default: Value("16777216"),
        doc: "device path: the kernel path's internal window, per rank. All-reduces of \
              2-byte or wider types run as one kernel launch on the caller's stream that \
              goes through the window in rounds of this many bytes (one-shot or two-shot \
              direct kernel; opened at the first device collective where 2 to 8 ranks share \
              a node; capturable in CUDA graphs). Where processes share a device without \
              MPS, the collectives go through the window in rounds ordered between the \
              processes by IPC events instead (copies and fold kernels that spin on nothing; \
              not capturable); 0: every device collective stays on the host-driven path",
        field: Field::Int {
            name: "device.lane_bytes",
            get: |c| c.device.lane_bytes,
            put: |c, v| c.device.lane_bytes = v,
        },
    },
    // Per process.
    Setting {
        name: "SNCL_TIMEOUT_MS",
        scope: Scope::Process,
        values: range(MIN_TIMEOUT_MS as usize, MAX_TIMEOUT_MS as usize, 1, "ms"),
        default: Value("300000"),
        doc: "an operation (or a store request) fails when a peer makes no progress this long",
        field: Field::Int {
            name: "timeout (ms)",
            get: |c| usize::try_from(c.timeout.as_millis()).unwrap_or(usize::MAX),
            put: |c, v| c.timeout = Duration::from_millis(v as u64),
        },
    },
    Setting {
        name: "SNCL_INIT_TIMEOUT_MS",
        scope: Scope::Process,
        values: range(0, MAX_TIMEOUT_MS as usize, 1, "ms"),
        default: Value("0"),
        doc: "creating a communicator (init from a unique id, the launcher's environment or a store; a grow, on the members and the new processes) fails when the ranks have not all arrived and connected this long (0: `SNCL_TIMEOUT_MS`); launch skew is not a hang",
        field: Field::Int {
            name: "init_timeout (ms)",
            get: |c| usize::try_from(c.init_timeout.as_millis()).unwrap_or(usize::MAX),
            put: |c, v| c.init_timeout = Duration::from_millis(v as u64),
        },
    },
    Setting {
        name: "SNCL_NSOCKS",
        scope: Scope::Process,
        values: range(MIN_NSOCKS, MAX_NSOCKS, 1, "sockets"),
        default: Value("1"),
        doc: "TCP sockets per peer; a message's pieces alternate over them. One flow per peer is the default: \
              two made hier reduce-scatter and all-gather 1.2–1.4× slower on a 100 Mbit/s test bed (several \
              flows per peer wait on each other's stragglers each step) and were level at 1 Gbit/s and on \
              loopback (docs/perf-notes/NOTEBOOK.md §3, ninth run)",
        field: Field::Int {
            name: "tcp.nsocks",
            get: |c| c.tcp.nsocks,
            put: |c, v| c.tcp.nsocks = v,
        },
    },
    Setting {
        name: "SNCL_TCP_PACING",
        scope: Scope::Process,
        values: Values::Text("off, auto, or the node link's rate: 100mbit, 12.5MB/s, ..."),
        default: Value("off"),
        doc: "kernel pacing (`SO_MAX_PACING_RATE`) of each cross-node TCP socket at the link's rate × 0.95 / \
              (ranks of the node sharing the link × `SNCL_NSOCKS`), so that flows a node starts together do not \
              overflow the link's queue; `auto` takes the rate from the topology's `inter.bandwidth` \
              (`SNCL_TOPO_FILE`, `SNCL_INTER_BW`; `inter.nic = rank` means a NIC per rank, not shared), a \
              measured goodput already net of headers, used whole instead of × 0.95, and paces nothing where \
              none is configured",
        field: Field::Text {
            put: |c, v| {
                c.tcp.pacing = crate::config::TcpPacing::parse(v)?;
                Ok(())
            },
            show: |c| c.tcp.pacing.to_string(),
        },
    },
    Setting {
        name: "SNCL_COMPRESS_PACING",
        scope: Scope::Process,
        values: Values::Text("auto, off, or the node link's rate: 100mbit, 12.5MB/s, ..."),
        default: Value("auto"),
        doc: "kernel pacing of the compressed all-reduce's cross-node exchange, which sends to every other \
              node at once over one socket per peer: each socket at the link's rate / (ranks of the node × \
              (nodes − 1)), so the exchange fills the link without overflowing its queue (docs/perf-notes/NOTEBOOK.md §13); a rate \
              given here is used at 0.95 (headers), `auto` (default) uses the topology's `inter.bandwidth` \
              (a measured goodput) whole, and where none is configured measures the node links' TCP goodput \
              when the first compressed all-reduce builds its sub-communicators (the first rank of each node \
              sends to the next node's, up to 32 MiB, about 0.15 s at 100 Mbit/s; links faster than about \
              5 Gbit/s stay unpaced); `off` leaves those sockets to `SNCL_TCP_PACING`",
        field: Field::Text {
            put: |c, v| {
                c.tcp.compress_pacing =
                    crate::config::TcpPacing::parse_setting("SNCL_COMPRESS_PACING", v)?;
                Ok(())
            },
            show: |c| c.tcp.compress_pacing.to_string(),
        },
    },
    Setting {
        name: "SNCL_SOCKET_IFNAME",
        scope: Scope::Process,
        values: Values::Text("network interface name"),
        default: Unset("the interface that reaches the root"),
        doc: "interface for TCP connections and for stores this process starts",
        field: Field::Text {
            put: |c, v| {
                c.tcp.socket_ifname = Some(v.trim().to_owned()).filter(|s| !s.is_empty());
                Ok(())
            },
            show: |c| c.tcp.socket_ifname.clone().unwrap_or_default(),
        },
    },
    tls_file(
        "SNCL_TLS_CERT",
        "this rank's certificate chain (PEM, leaf first) for TLS on TCP connections and the store; \
         with `SNCL_TLS_KEY` and `SNCL_TLS_CA`, all three or none (docs/SECURITY.md)",
        |c, p| c.tcp.tls.cert = p,
        |c| &c.tcp.tls.cert,
    ),
    tls_file(
        "SNCL_TLS_KEY",
        "the private key of `SNCL_TLS_CERT` (PEM; a file of this user, unreadable by group and others)",
        |c, p| c.tcp.tls.key = p,
        |c| &c.tcp.tls.key,
    ),
    tls_file(
        "SNCL_TLS_CA",
        "certificate authorities (PEM) every peer's certificate must chain to; a peer without one is refused",
        |c, p| c.tcp.tls.ca = p,
        |c| &c.tcp.tls.ca,
    ),
    Setting {
        name: "SNCL_NODE_ID",
        scope: Scope::Process,
        values: Values::Text("any text"),
        default: Unset("hostname + boot id"),
        doc: "node identity: ranks with the same one share memory (containers, namespaces)",
        field: Field::Text {
            put: |c, v| {
                c.node_id = Some(v.to_owned()).filter(|s| !s.is_empty());
                Ok(())
            },
            show: |c| c.node_id.clone().unwrap_or_default(),
        },
    },
    Setting {
        name: "SNCL_FLIGHT_RECORDER_ENTRIES",
        scope: Scope::Process,
        values: range(0, crate::flight::MAX_ENTRIES, 1, "operations"),
        default: Value("1000"),
        doc: "operations each communicator's flight recorder keeps (0: off); dumped to `SNCL_DEBUG_DUMP_DIR`",
        field: Field::Int {
            name: "flight_recorder_entries",
            get: |c| c.flight_recorder_entries,
            put: |c, v| c.flight_recorder_entries = v,
        },
    },
    Setting {
        name: "SNCL_DEBUG_DUMP_DIR",
        scope: Scope::Process,
        values: Values::Text("directory"),
        default: Unset("none: no dumps"),
        doc: "directory for flight-recorder dumps (JSON lines, mode 0600) on timeout, abort or `dump_flight_recorder()`; read by `commbench trace`",
        field: Field::Text {
            put: |c, v| {
                c.debug_dump_dir = Some(std::path::PathBuf::from(v)).filter(|p| !p.as_os_str().is_empty());
                Ok(())
            },
            show: |c| {
                c.debug_dump_dir
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            },
        },
    },
    // Per process, read by `TierSpec` (comm-core/src/topofile.rs).
    local(
        "SNCL_TOPO_FILE",
        Values::Text("path (format in comm-core/src/topofile.rs)"),
        Unset("none"),
        "tier costs and node placement",
    ),
    local(
        "SNCL_INTRA_BW",
        Values::Text("bandwidth: 20GB/s, 1gbit, ..."),
        Unset("built-in shared-memory cost"),
        "intra-node bandwidth for the planner",
    ),
    local(
        "SNCL_INTRA_LAT",
        Values::Text("latency: 1us, 0.5ms, ..."),
        Unset("built-in shared-memory cost"),
        "intra-node latency for the planner",
    ),
    local(
        "SNCL_INTER_BW",
        Values::Text("bandwidth: 20GB/s, 1gbit, ..."),
        Unset("built-in TCP cost"),
        "inter-node bandwidth for the planner",
    ),
    local(
        "SNCL_INTER_LAT",
        Values::Text("latency: 1us, 0.5ms, ..."),
        Unset("built-in TCP cost"),
        "inter-node latency for the planner",
    ),
    // Per process: the RDMA transport's part of Config (`Config::ib`).
    Setting {
        name: "SNCL_IB_DISABLE",
        scope: Scope::Process,
        values: Values::Choice(&["0", "1"]),
        default: Value("0"),
        doc: "`1`: never use RDMA (the transport is skipped with one INFO line)",
        field: Field::Text {
            put: |c, v| {
                c.ib.disable = zero_or_one("SNCL_IB_DISABLE", v)?;
                Ok(())
            },
            show: |c| u8::from(c.ib.disable).to_string(),
        },
    },
    Setting {
        name: "SNCL_IB_EMULATE",
        scope: Scope::Process,
        values: Values::Choice(&["0", "1", "strict"]),
        default: Value("0"),
        doc: "`1`: run the RDMA transport on emulated verbs between processes of one machine (CI, machines without a NIC); \
              `strict`: emulated verbs that also apply the rules a real NIC and kernel apply (pinned-memory accounting \
              against `RLIMIT_MEMLOCK` unless the process has CAP_IPC_LOCK, ...: docs/RDMA.md)",
        field: Field::Text {
            put: |c, v| {
                (c.ib.emulate, c.ib.emulate_strict) = match v.trim() {
                    "" | "0" => (false, false),
                    "1" => (true, false),
                    "strict" => (true, true),
                    other => {
                        return Err(crate::Error::Config(format!(
                            "SNCL_IB_EMULATE={other:?}: expected 0, 1 or strict"
                        )))
                    }
                };
                Ok(())
            },
            show: |c| {
                if c.ib.emulate_strict {
                    "strict".into()
                } else {
                    u8::from(c.ib.emulate).to_string()
                }
            },
        },
    },
    Setting {
        name: "SNCL_IB_HCA",
        scope: Scope::Process,
        values: Values::Text("NCCL syntax: `mlx5_0:1,mlx5_1:1`; `^` excludes, `=` matches names exactly"),
        default: Unset("every device, the first ACTIVE port"),
        doc: "RDMA devices and ports to use",
        field: Field::Text {
            put: |c, v| {
                c.ib.hca = Some(v)
                    .filter(|v| !v.trim().is_empty())
                    .map(HcaFilter::parse)
                    .transpose()?;
                Ok(())
            },
            show: |c| c.ib.hca.as_ref().map(HcaFilter::to_string).unwrap_or_default(),
        },
    },
    Setting {
        name: "SNCL_IB_GID_INDEX",
        scope: Scope::Process,
        values: Values::Text("auto, or an index 0-255 of the port's GID table (`show_gids`)"),
        default: Value("auto"),
        doc: "GID table index of the RDMA port; `auto`: on RoCE the first RoCE v2 entry with an IPv4-mapped \
              address (as NCCL and perftest choose; index 0 is RoCE v1 link-local and does not cross routed \
              fabrics), else a routable RoCE v2 one, on InfiniBand 0",
        field: Field::Text {
            put: |c, v| {
                c.ib.gid_index = match v.trim() {
                    "" | "auto" => None,
                    n => Some(n.parse::<u8>().map_err(|_| {
                        crate::Error::Config(format!(
                            "SNCL_IB_GID_INDEX={n:?}: expected auto or an index 0-255"
                        ))
                    })?),
                };
                Ok(())
            },
            show: |c| c.ib.gid_index.map_or_else(|| "auto".into(), |i| i.to_string()),
        },
    },
    Setting {
        name: "SNCL_IB_TIMEOUT",
        scope: Scope::Process,
        values: range(0, 31, 1, "exponent"),
        default: Value("20"),
        doc: "RDMA ACK timeout, 4.096 µs × 2^value per retry",
        field: Field::Int {
            name: "ib.timeout",
            get: |c| c.ib.timeout as usize,
            put: |c, v| c.ib.timeout = v as u8,
        },
    },
    Setting {
        name: "SNCL_IB_RETRY_CNT",
        scope: Scope::Process,
        values: range(0, 7, 1, "retries"),
        default: Value("7"),
        doc: "RDMA transport retries before a work request fails",
        field: Field::Int {
            name: "ib.retry_cnt",
            get: |c| c.ib.retry_cnt as usize,
            put: |c, v| c.ib.retry_cnt = v as u8,
        },
    },
    Setting {
        name: "SNCL_IB_TC",
        scope: Scope::Process,
        values: range(0, 255, 1, "traffic class"),
        default: Value("0"),
        doc: "RDMA traffic class (RoCE: DSCP << 2)",
        field: Field::Int {
            name: "ib.traffic_class",
            get: |c| c.ib.traffic_class as usize,
            put: |c, v| c.ib.traffic_class = v as u8,
        },
    },
    Setting {
        name: "SNCL_IB_SL",
        scope: Scope::Process,
        values: range(0, 15, 1, "service level"),
        default: Value("0"),
        doc: "InfiniBand service level",
        field: Field::Int {
            name: "ib.sl",
            get: |c| c.ib.sl as usize,
            put: |c, v| c.ib.sl = v as u8,
        },
    },
    Setting {
        name: "SNCL_IB_QPS_PER_CONN",
        scope: Scope::Process,
        values: Values::Text("auto, or 1 to 16 queue pairs"),
        default: Value("auto"),
        doc: "RC queue pairs per peer; pieces stripe over them (every rank must use the same \
              value). auto = 2 on a RoCE port (its switches spread flows over equal-cost paths \
              by each QP's UDP source port, so one QP per peer can pile pairs onto one path), \
              1 on InfiniBand",
        field: Field::Text {
            put: |c, v| {
                c.ib.qps_per_conn = match v.trim() {
                    "" | "auto" => 0,
                    n => match n.parse::<usize>() {
                        Ok(q) if (1..=crate::config::MAX_QPS_PER_CONN).contains(&q) => q,
                        _ => {
                            return Err(crate::Error::Config(format!(
                                "SNCL_IB_QPS_PER_CONN={n:?}: expected auto or 1 to {}",
                                crate::config::MAX_QPS_PER_CONN
                            )))
                        }
                    },
                };
                Ok(())
            },
            show: |c| match c.ib.qps_per_conn {
                0 => "auto".into(),
                q => q.to_string(),
            },
        },
    },
    Setting {
        name: "SNCL_IB_ZERO_COPY",
        scope: Scope::Process,
        values: Values::Choice(&["auto", "0", "1"]),
        default: Value("auto"),
        doc: "RDMA-write large host pieces straight from the user's buffer: auto = where the device registers on demand (ODP; the emulated provider does), 1 = also pin per step without ODP, 0 = always through the staging copy",
        field: Field::Text {
            put: |c, v| {
                c.ib.zero_copy = auto_zero_or_one("SNCL_IB_ZERO_COPY", v)?;
                Ok(())
            },
            show: |c| c.ib.zero_copy.map_or("auto".into(), |b| u8::from(b).to_string()),
        },
    },
    Setting {
        name: "SNCL_IB_GDR",
        scope: Scope::Process,
        values: Values::Choice(&["auto", "0", "1"]),
        default: Value("auto"),
        doc: "GPUDirect RDMA: device pieces go NIC to device memory (dma-buf registration) where both ranks of a pair can: auto = where the device exports dma-bufs and libibverbs has ibv_reg_dmabuf_mr, 1 = required (an error naming what is missing), 0 = always staged through host memory",
        field: Field::Text {
            put: |c, v| {
                c.ib.gdr = auto_zero_or_one("SNCL_IB_GDR", v)?;
                Ok(())
            },
            show: |c| c.ib.gdr.map_or("auto".into(), |b| u8::from(b).to_string()),
        },
    },
    Setting {
        name: "SNCL_IB_REG_CACHE_MB",
        scope: Scope::Process,
        values: range(0, 1 << 20, 1, "MiB"),
        default: Value("4096"),
        doc: "user-buffer registrations (on demand) kept per RDMA connection, least recently used dropped first",
        field: Field::Int {
            name: "ib.reg_cache_mb",
            get: |c| c.ib.reg_cache_mb,
            put: |c, v| c.ib.reg_cache_mb = v,
        },
    },
    Setting {
        name: "SNCL_SHM_CMA",
        scope: Scope::Process,
        values: Values::Choice(&["auto", "1", "0"]),
        default: Value("auto"),
        doc: "single-copy shared memory for large pieces (the receiver reads the sender's buffer with process_vm_readv): `auto` where the kernel permits it and this host's cross-memory reads run at >= 0.75 of a copy's speed (measured once per process), `1` wherever permitted, `0` never; Yama ptrace_scope >= 2 or a failed probe fall back to the slot FIFO (logged once)",
        field: Field::Text {
            put: |c, v| {
                c.shm.single_copy = SingleCopy::parse("SNCL_SHM_CMA", v)?;
                Ok(())
            },
            show: |c| c.shm.single_copy.to_string(),
        },
    },
    Setting {
        name: "SNCL_SHM_CMA_MIN_BYTES",
        scope: Scope::Process,
        values: range(1, MAX_SINGLE_COPY_MIN_BYTES, 1, "bytes"),
        default: Value("65536"),
        doc: "smallest shared-memory piece a sender lends for a cross-memory read instead of copying it into a slot (a piece is at most SNCL_SHM_SLOT_BYTES)",
        field: Field::Int {
            name: "shm.single_copy_min_bytes",
            get: |c| c.shm.single_copy_min_bytes,
            put: |c, v| c.shm.single_copy_min_bytes = v,
        },
    },
    Setting {
        name: "SNCL_NVLINK",
        scope: Scope::Process,
        values: Values::Choice(&["auto", "1", "0"]),
        default: Value("auto"),
        doc: "the nvlink transport between ranks of one node (host pieces over shm's connection): `auto` goes device to device where both ranks see each other's device (by PCI bus id) with peer access or share it, else stages device pieces through the host; `1` fails the first device operation of a pair that cannot, naming what is missing; `0` leaves same-node pairs to shm",
        field: Field::Text {
            put: |c, v| {
                c.nvlink.mode = NvlinkMode::parse("SNCL_NVLINK", v)?;
                Ok(())
            },
            show: |c| c.nvlink.mode.to_string(),
        },
    },
    Setting {
        name: "SNCL_DEBUG",
        scope: Scope::Process,
        values: Values::Choice(&["OFF", "ERROR", "WARN", "INFO", "DEBUG", "TRACE"]),
        default: Value("WARN"),
        doc: "level of sncl's log on stderr (C ABI, commbench), in any case; `VERSION` (as `NCCL_DEBUG`) means WARN; `RUST_LOG`, when set, wins over it",
        field: Field::Text {
            put: |c, v| {
                c.log.level = crate::config::LogLevel::parse(v)?;
                Ok(())
            },
            show: |c| c.log.level.to_string(),
        },
    },
    Setting {
        name: "SNCL_DEBUG_SUBSYS",
        scope: Scope::Process,
        values: Values::Text("comma-separated INIT, COLL, P2P, SHM, NET, GRAPH, TUNING, ENV, ALLOC, ALL; a leading ^ excludes the list"),
        default: Value("ALL"),
        doc: "subsystems whose messages above WARN `SNCL_DEBUG` shows (as `NCCL_DEBUG_SUBSYS`); warnings and errors are always shown",
        field: Field::Text {
            put: |c, v| {
                c.log.subsystems = crate::config::SubsystemFilter::parse(v)?;
                Ok(())
            },
            show: |c| c.log.subsystems.to_string(),
        },
    },
    Setting {
        name: "SNCL_DEBUG_FILE",
        scope: Scope::Process,
        values: Values::Text("path; %h: host name, %p: process id"),
        default: Unset("none: stderr"),
        doc: "file the log goes to instead of stderr (created mode 0600, appended to), as `NCCL_DEBUG_FILE`",
        field: Field::Text {
            put: |c, v| {
                c.log.file = Some(v.to_owned()).filter(|p| !p.trim().is_empty());
                Ok(())
            },
            show: |c| c.log.file.clone().unwrap_or_default(),
        },
    },
    // Per process, read elsewhere.
    local(
        "SNCL_TORCH_INLINE",
        Values::Choice(&["0", "1"]),
        Value("1"),
        "PyTorch backend: `0` runs every operation on its worker thread; else a blocking one with nothing queued runs on the caller's",
    ),
    Setting {
        name: "SNCL_CUDA_INCLUDE",
        scope: Scope::Process,
        values: Values::Text("directory"),
        default: Unset("beside the loaded NVRTC, else `$CUDA_HOME/include`, `$CUDA_PATH/include`, `/usr/local/cuda/include`"),
        doc: "directory holding `cuda_fp16.h` for compiling sncl's device kernels (when a communicator binds a device)",
        field: Field::Path {
            put: |c, p| c.device.cuda_include = p,
            get: |c| &c.device.cuda_include,
        },
    },
    local(
        "SNCL_CONF_FILE",
        Values::Text("path"),
        Unset("`~/.sncl.conf`, else `/etc/sncl.conf`"),
        "settings file (lines `NAME=value`, `#` comments); the environment wins over it",
    ),
];

/// The setting named `name`, if declared.
pub fn lookup(name: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.name == name)
}

/// Variables of the `SNCL_` prefix that test harnesses use; never settings.
pub const TEST_PREFIX: &str = "SNCL_TEST_";

/// The declared setting nearest to `name` (a likely typo: at most 3 edits
/// away), if any.
pub fn nearest(name: &str) -> Option<&'static str> {
    SETTINGS
        .iter()
        .map(|s| (strsim::levenshtein(name, s.name), s.name))
        .filter(|&(d, _)| d <= 3)
        .min()
        .map(|(_, n)| n)
}

/// The shared setting whose digest key is `key`.
pub(crate) fn by_digest_key(key: &str) -> Option<&'static Setting> {
    SETTINGS
        .iter()
        .find(|s| matches!(s.scope, Scope::Shared { digest_key } if digest_key == key))
}

/// A `0|1` setting's value, empty meaning 0.
fn zero_or_one(name: &str, v: &str) -> crate::Result<bool> {
    if v.trim().is_empty() {
        return Ok(false);
    }
    switch(name, v)
}

/// A switch that must be given as `0` or `1` (no empty value: for a
/// switch that is on by default, empty must not mean off).
fn switch(name: &str, v: &str) -> crate::Result<bool> {
    match v.trim() {
        "0" => Ok(false),
        "1" => Ok(true),
        other => Err(crate::Error::Config(format!(
            "{name}={other:?}: expected 0 or 1"
        ))),
    }
}

/// An `auto|0|1` setting's value: `None` for auto.
fn auto_zero_or_one(name: &str, v: &str) -> crate::Result<Option<bool>> {
    match v.trim() {
        "" | "auto" => Ok(None),
        "0" => Ok(Some(false)),
        "1" => Ok(Some(true)),
        other => Err(crate::Error::Config(format!(
            "{name}={other:?}: expected auto, 0 or 1"
        ))),
    }
}
