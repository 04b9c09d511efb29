//! [`LaunchEnv`]: rank, world size, root address and secret from the
//! environment a launcher (torchrun, Open MPI's mpirun, Slurm's srun, or
//! plain `SNCL_*` variables) sets up.

use std::net::{SocketAddr, ToSocketAddrs};

use super::unique_id::{decode_hex, UniqueId};
use crate::auth::sha256_fields;
use crate::environment::ReadEnvironment;
use comm_core::settings::Environment;
use comm_core::{Error, Result};

/// Launcher name: rank and size came from `SNCL_RANK` / `SNCL_WORLD_SIZE`.
pub const LAUNCHER_SNCL: &str = "sncl";
/// Launcher name: torchrun / torch.distributed (`RANK`, `WORLD_SIZE`).
pub const LAUNCHER_TORCHRUN: &str = "torchrun";
/// Launcher name: Open MPI's mpirun (`OMPI_COMM_WORLD_*`).
pub const LAUNCHER_OPENMPI: &str = "openmpi";
/// Launcher name: Slurm's srun (`SLURM_PROCID`, `SLURM_NTASKS`).
pub const LAUNCHER_SLURM: &str = "slurm";

/// First port of the range the Slurm root port is derived from.
pub const SLURM_PORT_BASE: u16 = 20000;
/// Size of the range the Slurm root port is derived from.
pub const SLURM_PORT_RANGE: u64 = 20000;

/// What a launched process learns from its environment.
///
/// Built by [`LaunchEnv::from_env`] (or [`LaunchEnv::from_vars`] for tests)
/// with these rules; empty variables count as unset.
///
/// **Rank and world size**, from the first launcher whose variables are set:
///
/// | launcher (`launcher`) | rank | world size | local rank |
/// |---|---|---|---|
/// | `"sncl"` | `SNCL_RANK` | `SNCL_WORLD_SIZE` | `SNCL_LOCAL_RANK` |
/// | `"torchrun"` | `RANK` | `WORLD_SIZE` | `LOCAL_RANK` |
/// | `"openmpi"` | `OMPI_COMM_WORLD_RANK` | `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK` |
/// | `"slurm"` | `SLURM_PROCID` | `SLURM_NTASKS` (or `SLURM_NPROCS`) | `SLURM_LOCALID` |
///
/// None of them set, only one of a rank/size pair set, a value that is not a
/// non-negative integer, a world size of 0 or a rank ≥ the world size are
/// [`Error::Config`] errors saying what to set.
///
/// **Root address** (where rank 0's store listens): `SNCL_ROOT` as
/// `host:port` (`[v6]:port` for IPv6 literals) always wins. Otherwise:
///
/// * torchrun: `MASTER_ADDR` with port `MASTER_PORT + 1` (torchrun's own
///   store already listens on `MASTER_PORT`).
/// * Slurm: the first host of `SLURM_STEP_NODELIST` (else
///   `SLURM_JOB_NODELIST`, else `SLURM_NODELIST`), where task 0 runs under
///   the default block distribution, with port
///   `20000 + (SLURM_JOB_ID % 20000)`. Two concurrent steps of one job would
///   pick the same port, and an arbitrary distribution may place task 0
///   elsewhere: set `SNCL_ROOT` then.
/// * Open MPI and plain `SNCL_RANK`: there is no address to derive; set
///   `SNCL_ROOT` (with mpirun: `mpirun -x SNCL_ROOT=host:port ...`).
///
/// Host names are resolved with [`ToSocketAddrs`]; the first IPv4 result is
/// preferred, else the first result.
///
/// A root that resolves to a loopback address while the launcher says the
/// job spans several hosts (torchrun's `LOCAL_WORLD_SIZE` below
/// `WORLD_SIZE`, Open MPI's local size below its world size, Slurm's node
/// count above 1) is an error: the other hosts could never reach it.
///
/// **Secret**: `SNCL_SECRET` (32 hex digits) if set, else the contents of
/// the file `SNCL_SECRET_FILE` (32 hex digits; a regular file of this
/// user, not readable by group or others); an all-zero secret is refused.
/// Otherwise it is derived
/// deterministically, so every rank computes the same value, from the
/// launcher name, the world size, the root address and the launcher's job
/// identity: `TORCHELASTIC_RUN_ID`, `TORCHELASTIC_RESTART_COUNT`,
/// `MASTER_ADDR`, `MASTER_PORT` (torchrun); `SLURM_JOB_ID`, `SLURM_STEP_ID`
/// (Slurm); `OMPI_MCA_ess_base_jobid`, `PMIX_NAMESPACE` (Open MPI); nothing
/// more for `"sncl"`. A derived secret only keeps separate jobs (and stale
/// ranks of an earlier torchrun restart) apart; it is **not a security
/// boundary**, since anyone who can read the job's environment can compute
/// it. Set `SNCL_SECRET` or `SNCL_SECRET_FILE` (the same random value on
/// every rank) for that; rank 0 logs one warning whenever the secret is
/// derived ([`SecretSource::Derived`]): every job identity is public (a
/// torchrun run id is on torchrun's command line, readable from /proc by
/// every local user).
#[derive(Clone, PartialEq, Eq)]
pub struct LaunchEnv {
    /// This process's rank.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Rank within the node, when the launcher says.
    pub local_rank: Option<usize>,
    /// Where rank 0's store listens.
    pub root: SocketAddr,
    /// The job secret.
    pub secret: [u8; 16],
    /// Where the secret came from.
    pub secret_source: SecretSource,
    /// Which launcher the rank came from: one of [`LAUNCHER_SNCL`],
    /// [`LAUNCHER_TORCHRUN`], [`LAUNCHER_OPENMPI`], [`LAUNCHER_SLURM`].
    pub launcher: &'static str,
}

impl std::fmt::Debug for LaunchEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaunchEnv")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("local_rank", &self.local_rank)
            .field("root", &self.root)
            .field("secret", &"<redacted>")
            .field("secret_source", &self.secret_source)
            .field("launcher", &self.launcher)
            .finish()
    }
}

/// Rank/size/local-rank variable names of one launcher.
struct Source {
    launcher: &'static str,
    rank: &'static str,
    size: &'static [&'static str],
    local: &'static str,
}

const SOURCES: [Source; 4] = [
    Source {
        launcher: LAUNCHER_SNCL,
        rank: "SNCL_RANK",
        size: &["SNCL_WORLD_SIZE"],
        local: "SNCL_LOCAL_RANK",
    },
    Source {
        launcher: LAUNCHER_TORCHRUN,
        rank: "RANK",
        size: &["WORLD_SIZE"],
        local: "LOCAL_RANK",
    },
    Source {
        launcher: LAUNCHER_OPENMPI,
        rank: "OMPI_COMM_WORLD_RANK",
        size: &["OMPI_COMM_WORLD_SIZE"],
        local: "OMPI_COMM_WORLD_LOCAL_RANK",
    },
    Source {
        launcher: LAUNCHER_SLURM,
        rank: "SLURM_PROCID",
        size: &["SLURM_NTASKS", "SLURM_NPROCS"],
        local: "SLURM_LOCALID",
    },
];

/// Identity variables hashed into a derived secret, per launcher.
fn identity_vars(launcher: &str) -> &'static [&'static str] {
    match launcher {
        LAUNCHER_TORCHRUN => &[
            "TORCHELASTIC_RUN_ID",
            "TORCHELASTIC_RESTART_COUNT",
            "MASTER_ADDR",
            "MASTER_PORT",
        ],
        LAUNCHER_SLURM => &["SLURM_JOB_ID", "SLURM_STEP_ID"],
        LAUNCHER_OPENMPI => &["OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"],
        _ => &[],
    }
}

fn parse_num(name: &str, value: &str, launcher: &str) -> Result<usize> {
    value.parse::<usize>().map_err(|_| {
        Error::Config(format!(
            "{name}={value:?} is not a non-negative integer (read as the {launcher} launcher's \
             rank/size); fix or unset it"
        ))
    })
}

/// Resolves `(host, port)`, preferring addresses other hosts can reach
/// (not loopback), then IPv4.
fn resolve(host: &str, port: u16, what: &str) -> Result<SocketAddr> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| {
            Error::Config(format!(
                "cannot resolve the sncl root host {host:?} from {what}: {e}; \
                 use a host name every node can resolve, or an IP address"
            ))
        })?
        .collect();
    let rank_of = |a: &SocketAddr| (a.ip().is_loopback(), !a.is_ipv4());
    addrs
        .iter()
        .min_by_key(|a| rank_of(a))
        .copied()
        .ok_or_else(|| {
            Error::Config(format!(
                "the sncl root host {host:?} from {what} resolved to no address"
            ))
        })
}

/// Where the job's secret came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecretSource {
    /// `SNCL_SECRET`.
    Variable,
    /// The file named by `SNCL_SECRET_FILE`.
    File,
    /// Derived from the launcher's job identity (see [`LaunchEnv`]): not
    /// authentication, since every job identity is public to local users.
    Derived,
}

/// The lowest number of hosts the launcher says the job spans, when it says.
fn hosts_expected(launcher: &str, var: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    let num = |k: &str| var(k).and_then(|v| v.parse::<usize>().ok());
    let fewer = |local: &str, world: &str| match (num(local), num(world)) {
        (Some(l), Some(w)) if l < w => Some(format!("{local}={l} < {world}={w}")),
        _ => None,
    };
    match launcher {
        LAUNCHER_TORCHRUN => fewer("LOCAL_WORLD_SIZE", "WORLD_SIZE"),
        LAUNCHER_OPENMPI => fewer("OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_SIZE"),
        LAUNCHER_SLURM => [
            "SLURM_STEP_NUM_NODES",
            "SLURM_JOB_NUM_NODES",
            "SLURM_NNODES",
        ]
        .iter()
        .find_map(|k| num(k).map(|n| (k, n)))
        .filter(|(_, n)| *n > 1)
        .map(|(k, n)| format!("{k}={n}")),
        _ => None,
    }
}

/// The secret from `SNCL_SECRET`, else from the file `SNCL_SECRET_FILE`;
/// `None` when neither is set (empty values count as unset).
pub fn configured_secret(
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<([u8; 16], SecretSource)>> {
    let var = |k: &str| {
        get(k)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    if let Some(s) = var("SNCL_SECRET") {
        let mut secret = [0u8; 16];
        decode_hex(&s, &mut secret).map_err(|e| {
            Error::Config(format!(
                "SNCL_SECRET is not 32 hex digits ({e}); generate one with e.g. \
                 `openssl rand -hex 16` and give the same value to every rank"
            ))
        })?;
        check_secret_strength(&secret, "SNCL_SECRET")?;
        return Ok(Some((secret, SecretSource::Variable)));
    }
    match var("SNCL_SECRET_FILE") {
        Some(path) => Ok(Some((read_secret_file(&path)?, SecretSource::File))),
        None => Ok(None),
    }
}

/// Refuses a secret anyone could guess: all zero bytes.
fn check_secret_strength(secret: &[u8; 16], from: &str) -> Result<()> {
    if secret.iter().all(|&b| b == 0) {
        return Err(Error::Config(format!(
            "{from} is all zeros, which any process could guess; generate one with e.g. \
             `openssl rand -hex 16`"
        )));
    }
    Ok(())
}

/// Reads a secret file: a regular file of this user, readable by its
/// owner only, holding 32 hex digits (not all zero).
fn read_secret_file(path: &str) -> Result<[u8; 16]> {
    let what = format!("SNCL_SECRET_FILE={path:?}");
    let meta = std::fs::metadata(path)
        .map_err(|e| Error::Config(format!("{what} cannot be read: {e}")))?;
    crate::environment::check_private_file(&what, std::path::Path::new(path), &meta)?;
    if meta.len() > 4096 {
        return Err(Error::Config(format!(
            "{what} holds {} bytes; it should hold 32 hex digits",
            meta.len()
        )));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Config(format!("{what} cannot be read: {e}")))?;
    let mut secret = [0u8; 16];
    decode_hex(text.trim(), &mut secret).map_err(|e| {
        Error::Config(format!(
            "{what} does not hold 32 hex digits ({e}); write one with e.g. \
             `openssl rand -hex 16 > {path}`"
        ))
    })?;
    check_secret_strength(&secret, &what)?;
    Ok(secret)
}

/// Parses `host:port` / `[v6]:port` from variable `name` (errors name it
/// and say how to write it), resolving a host name, preferring addresses
/// other hosts can reach (not loopback), then IPv4.
pub fn parse_host_port(name: &str, value: &str) -> Result<SocketAddr> {
    let what = format!("{name}={value:?}");
    if let Ok(a) = value.parse::<SocketAddr>() {
        if a.port() == 0 {
            return Err(Error::Config(format!(
                "{what} has port 0; give the port rank 0's store listens on, e.g. {}:29501",
                a.ip()
            )));
        }
        return Ok(a);
    }
    let (host, port) = value
        .strip_prefix('[')
        .and_then(|v| v.split_once("]:"))
        .or_else(|| value.rsplit_once(':'))
        .filter(|(h, _)| !h.is_empty() && !h.contains(':'))
        .ok_or_else(|| {
            Error::Config(format!(
                "{what} is not host:port; set it like {name}=node01:29501 or {name}=[fd00::1]:29501"
            ))
        })?;
    let port = match port.parse::<u16>() {
        Ok(p) if p != 0 => p,
        _ => {
            return Err(Error::Config(format!(
                "{what}: {port:?} is not a port (1-65535); set it like {name}={host}:29501"
            )))
        }
    };
    resolve(host, port, &what)
}

/// The first host of a Slurm hostlist expression such as
/// `node[01-04,07],gpu5` (→ `node01`), `a-b-c` (→ `a-b-c`) or `n[9-12]x`
/// (→ `n9x`). Zero padding is kept; several bracket groups in one name
/// (`rack[1-2]-n[01-08]` → `rack1-n01`) are supported. `None` when the list
/// is empty or malformed.
pub fn slurm_first_host(nodelist: &str) -> Option<String> {
    let list = nodelist.trim();
    let mut depth = 0usize;
    let mut end = list.len();
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.checked_sub(1)?,
            ',' if depth == 0 => {
                end = i;
                break;
            }
            _ => {}
        }
    }
    let entry = list[..end].trim();
    let mut out = String::new();
    let mut rest = entry;
    while let Some(open) = rest.find('[') {
        out.push_str(&rest[..open]);
        let close = open + rest[open..].find(']')?;
        let inner = &rest[open + 1..close];
        let first = inner.split(',').next()?.split('-').next()?.trim();
        if first.is_empty() || !first.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        out.push_str(first);
        rest = &rest[close + 1..];
    }
    if rest.contains(']') {
        return None;
    }
    out.push_str(rest);
    (!out.is_empty() && !out.contains(char::is_whitespace)).then_some(out)
}

impl LaunchEnv {
    /// Reads the process environment and settings file
    /// ([`Environment::from_process`]); see [`LaunchEnv`] for the rules.
    pub fn from_env() -> Result<LaunchEnv> {
        Self::from_environment(&Environment::from_process()?)
    }

    /// Like [`LaunchEnv::from_env`], reading the variables of `env`.
    pub fn from_environment(env: &Environment) -> Result<LaunchEnv> {
        Self::from_vars(&env.getter())
    }

    /// Like [`LaunchEnv::from_env`], reading variables through `get`.
    pub fn from_vars(get: &dyn Fn(&str) -> Option<String>) -> Result<LaunchEnv> {
        Self::detect_vars(get)?.ok_or_else(|| {
            Error::Config(
                "cannot tell this process's rank and world size: none of SNCL_RANK + \
                 SNCL_WORLD_SIZE, RANK + WORLD_SIZE (torchrun), OMPI_COMM_WORLD_RANK + \
                 OMPI_COMM_WORLD_SIZE (Open MPI mpirun) or SLURM_PROCID + SLURM_NTASKS \
                 (Slurm srun) is set; start the job with torchrun, mpirun or srun, or set \
                 SNCL_RANK, SNCL_WORLD_SIZE and SNCL_ROOT=host:port on every process"
                    .into(),
            )
        })
    }

    /// Whether a launcher started this process: `Ok(None)` when no
    /// launcher's rank variables are set (a process run by hand), else
    /// what [`LaunchEnv::from_environment`] reads, errors included.
    pub fn detect(env: &Environment) -> Result<Option<LaunchEnv>> {
        Self::detect_vars(&env.getter())
    }

    fn detect_vars(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<LaunchEnv>> {
        let var = |k: &str| {
            get(k)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };

        // Rank and world size.
        let mut found = None;
        for src in &SOURCES {
            let rank = var(src.rank);
            let size = src.size.iter().find_map(|k| var(k).map(|v| (*k, v)));
            match (rank, size) {
                (None, None) => continue,
                (Some(r), Some((size_name, s))) => {
                    found = Some((src, r, size_name, s));
                    break;
                }
                (Some(_), None) => {
                    return Err(Error::Config(format!(
                    "{} is set but {} is not; the {} launcher sets both, so set both or neither",
                    src.rank,
                    src.size.join(" / "),
                    src.launcher
                )))
                }
                (None, Some((size_name, _))) => {
                    // Slurm sets SLURM_NTASKS in batch scripts too, without a
                    // task id: not a launched rank. Keep looking there.
                    if src.launcher == LAUNCHER_SLURM {
                        continue;
                    }
                    return Err(Error::Config(format!(
                        "{size_name} is set but {} is not; the {} launcher sets both, so set both or neither",
                        src.rank, src.launcher
                    )));
                }
            }
        }
        let Some((src, rank_s, size_name, size_s)) = found else {
            return Ok(None);
        };
        let launcher = src.launcher;
        let rank = parse_num(src.rank, &rank_s, launcher)?;
        let world_size = parse_num(size_name, &size_s, launcher)?;
        if world_size == 0 {
            return Err(Error::Config(format!(
                "{size_name}=0: the world size must be at least 1"
            )));
        }
        if world_size > comm_core::MAX_RANKS {
            return Err(Error::Config(format!(
                "{size_name}={world_size} exceeds the {} ranks one sncl communicator supports",
                comm_core::MAX_RANKS
            )));
        }
        if rank >= world_size {
            return Err(Error::Config(format!(
                "{}={rank} is not below {size_name}={world_size}: ranks are 0..{}; \
                 check the launcher's configuration",
                src.rank,
                world_size - 1
            )));
        }
        let local_rank = var(src.local)
            .map(|v| parse_num(src.local, &v, launcher))
            .transpose()?;

        // Root address.
        let root = if let Some(r) = var("SNCL_ROOT") {
            parse_host_port("SNCL_ROOT", &r)?
        } else {
            match launcher {
                LAUNCHER_TORCHRUN => {
                    let (Some(addr), Some(port)) = (var("MASTER_ADDR"), var("MASTER_PORT")) else {
                        return Err(Error::Config(
                            "running under torchrun (RANK/WORLD_SIZE set) but MASTER_ADDR or \
                             MASTER_PORT is missing; set SNCL_ROOT=host:port, or both \
                             MASTER_ADDR and MASTER_PORT (sncl then listens on MASTER_PORT + 1)"
                                .into(),
                        ));
                    };
                    let port = port
                        .parse::<u16>()
                        .ok()
                        .and_then(|p| p.checked_add(1))
                        .filter(|p| *p > 1)
                        .ok_or_else(|| {
                            Error::Config(format!(
                                "MASTER_PORT={port:?} is not a port below 65535 (sncl's root \
                                 listens on MASTER_PORT + 1); fix it or set SNCL_ROOT=host:port"
                            ))
                        })?;
                    resolve(&addr, port, &format!("MASTER_ADDR={addr:?}"))?
                }
                LAUNCHER_SLURM => {
                    let (list_name, list) = [
                        "SLURM_STEP_NODELIST",
                        "SLURM_JOB_NODELIST",
                        "SLURM_NODELIST",
                    ]
                    .iter()
                    .find_map(|k| var(k).map(|v| (*k, v)))
                    .ok_or_else(|| {
                        Error::Config(
                            "running under Slurm (SLURM_PROCID set) but none of \
                             SLURM_STEP_NODELIST / SLURM_JOB_NODELIST is set, so the root host \
                             is unknown; set SNCL_ROOT=host:port"
                                .into(),
                        )
                    })?;
                    let host = slurm_first_host(&list).ok_or_else(|| {
                        Error::Config(format!(
                            "cannot parse the Slurm hostlist {list_name}={list:?}; \
                             set SNCL_ROOT=host:port"
                        ))
                    })?;
                    let job = var("SLURM_JOB_ID").ok_or_else(|| {
                        Error::Config(
                            "running under Slurm but SLURM_JOB_ID is not set, so the root port \
                             cannot be derived; set SNCL_ROOT=host:port"
                                .into(),
                        )
                    })?;
                    let job_id = job.parse::<u64>().map_err(|_| {
                        Error::Config(format!(
                            "SLURM_JOB_ID={job:?} is not a number, so the root port cannot be \
                             derived; set SNCL_ROOT=host:port"
                        ))
                    })?;
                    let port = SLURM_PORT_BASE + (job_id % SLURM_PORT_RANGE) as u16;
                    resolve(
                        &host,
                        port,
                        &format!("the first host of {list_name}={list:?}"),
                    )?
                }
                LAUNCHER_OPENMPI => {
                    return Err(Error::Config(
                        "running under Open MPI (OMPI_COMM_WORLD_RANK set), which provides no \
                         rendezvous address; pick a host and free port for rank 0 and export it \
                         to every rank: mpirun -x SNCL_ROOT=host:port ..."
                            .into(),
                    ))
                }
                _ => {
                    return Err(Error::Config(
                        "SNCL_RANK/SNCL_WORLD_SIZE are set but SNCL_ROOT is not; set \
                         SNCL_ROOT=host:port (where rank 0's store listens) on every process"
                            .into(),
                    ))
                }
            }
        };

        // A root that only this host can reach, in a job that spans hosts.
        if root.ip().is_loopback() {
            if let Some(why) = hosts_expected(launcher, &var) {
                return Err(Error::Config(format!(
                    "the sncl root {root} is a loopback address, but this job spans several \
                     hosts ({why}): the other hosts cannot reach it. A host name can resolve \
                     to loopback on its own host (Debian maps it to 127.0.1.1 in /etc/hosts); \
                     set SNCL_ROOT (or MASTER_ADDR) to an address the other hosts reach"
                )));
            }
        }

        // Secret.
        let (secret, secret_source) = if let Some(given) = configured_secret(&var)? {
            given
        } else {
            let world = (world_size as u64).to_le_bytes();
            let root_text = root.to_string();
            let values: Vec<(&str, String)> = identity_vars(launcher)
                .iter()
                .map(|&k| (k, var(k).unwrap_or_default()))
                .collect();
            let mut fields: Vec<&[u8]> = vec![
                b"sncl-derived-secret-v1",
                launcher.as_bytes(),
                &world,
                root_text.as_bytes(),
            ];
            for (k, v) in &values {
                fields.extend([k.as_bytes(), v.as_bytes()]);
            }
            let d = sha256_fields(&fields);
            let mut secret = [0u8; 16];
            secret.copy_from_slice(&d[..16]);
            // Every job identity is public: Slurm and Open MPI job ids to
            // every user of the cluster, and a torchrun run id, however
            // random, to every local user (it is on torchrun's command
            // line, in /proc/PID/cmdline).
            if rank == 0 {
                tracing::warn!(
                    "sncl: this job is not authenticated: without SNCL_SECRET or \
                     SNCL_SECRET_FILE its secret is derived from public facts (launcher \
                     {launcher}, root {root}, world size {world_size}, job id), so a process \
                     that can reach {root} could join it; give every rank the same \
                     SNCL_SECRET (e.g. `openssl rand -hex 16`) or SNCL_SECRET_FILE \
                     (see docs/SECURITY.md)"
                );
            }
            (secret, SecretSource::Derived)
        };
        let env = LaunchEnv {
            rank,
            world_size,
            local_rank,
            root,
            secret,
            secret_source,
            launcher,
        };
        tracing::debug!(?env, "sncl launch environment");
        Ok(Some(env))
    }

    /// The unique id (root and secret) every rank of this job shares.
    pub fn unique_id(&self) -> UniqueId {
        UniqueId {
            root: self.root,
            secret: self.secret,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Result<LaunchEnv> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        LaunchEnv::from_vars(&move |k| m.get(k).cloned())
    }

    fn err(pairs: &[(&str, &str)]) -> String {
        env(pairs).unwrap_err().to_string()
    }

    #[test]
    fn detect_tells_a_process_run_by_hand_from_a_launched_one() {
        let detect = |pairs: &[(&str, &str)]| {
            let m: HashMap<String, String> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            LaunchEnv::detect_vars(&move |k| m.get(k).cloned())
        };
        assert!(detect(&[("HOME", "/root")]).unwrap().is_none());
        assert!(err(&[]).contains("cannot tell this process's rank"));
        let e = detect(&[
            ("SNCL_RANK", "1"),
            ("SNCL_WORLD_SIZE", "2"),
            ("SNCL_ROOT", "127.0.0.1:1"),
        ])
        .unwrap()
        .expect("launched");
        assert_eq!((e.rank, e.world_size), (1, 2));
        assert!(
            detect(&[("SNCL_RANK", "1")]).is_err(),
            "half a launch is an error"
        );
    }

    #[test]
    fn hostlists() {
        let f = |s| slurm_first_host(s);
        assert_eq!(f("node[01-04,07],gpu5").as_deref(), Some("node01"));
        assert_eq!(f("gpu5,node[01-04]").as_deref(), Some("gpu5"));
        assert_eq!(f("a-b-c").as_deref(), Some("a-b-c"));
        assert_eq!(f("n[9-12]x").as_deref(), Some("n9x"));
        assert_eq!(f("n[009-012]").as_deref(), Some("n009"));
        assert_eq!(f("rack[1-2]-n[01-08],x").as_deref(), Some("rack1-n01"));
        assert_eq!(f("node[3,5-7]").as_deref(), Some("node3"));
        assert_eq!(f(" host1 ").as_deref(), Some("host1"));
        assert_eq!(f(""), None);
        assert_eq!(f("node[01-04"), None);
        assert_eq!(f("node]01["), None);
        assert_eq!(f("node[]"), None);
        assert_eq!(f("node[a-b]"), None);
    }

    #[test]
    fn sncl_vars() {
        let e = env(&[
            ("SNCL_RANK", "2"),
            ("SNCL_WORLD_SIZE", "4"),
            ("SNCL_LOCAL_RANK", "0"),
            ("SNCL_ROOT", "127.0.0.1:29501"),
            ("SNCL_SECRET", "000102030405060708090a0b0c0d0e0F"),
            // Ignored: SNCL_* wins.
            ("RANK", "7"),
            ("WORLD_SIZE", "8"),
        ])
        .unwrap();
        assert_eq!((e.rank, e.world_size, e.local_rank), (2, 4, Some(0)));
        assert_eq!(e.launcher, LAUNCHER_SNCL);
        assert_eq!(e.root, "127.0.0.1:29501".parse().unwrap());
        assert_eq!(
            e.secret,
            [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
        );
        assert_eq!(e.unique_id().root, e.root);
        assert!(!format!("{e:?}").contains("[0, 1, 2"));

        let e6 = env(&[
            ("SNCL_RANK", "0"),
            ("SNCL_WORLD_SIZE", "1"),
            ("SNCL_ROOT", "[::1]:29501"),
        ])
        .unwrap();
        assert_eq!(e6.root, "[::1]:29501".parse().unwrap());
        let host = env(&[
            ("SNCL_RANK", "0"),
            ("SNCL_WORLD_SIZE", "1"),
            ("SNCL_ROOT", "localhost:29501"),
        ])
        .unwrap();
        assert!(host.root.ip().is_loopback() && host.root.port() == 29501);

        let m = err(&[("SNCL_RANK", "0"), ("SNCL_WORLD_SIZE", "2")]);
        assert!(m.contains("SNCL_ROOT=host:port"), "{m}");
        let m = err(&[
            ("SNCL_RANK", "0"),
            ("SNCL_WORLD_SIZE", "2"),
            ("SNCL_ROOT", "node01"),
        ]);
        assert!(m.contains("not host:port"), "{m}");
        let m = err(&[
            ("SNCL_RANK", "0"),
            ("SNCL_WORLD_SIZE", "2"),
            ("SNCL_ROOT", "node01:http"),
        ]);
        assert!(m.contains("not a port"), "{m}");
        let m = err(&[
            ("SNCL_RANK", "0"),
            ("SNCL_WORLD_SIZE", "2"),
            ("SNCL_ROOT", "1.2.3.4:1"),
            ("SNCL_SECRET", "xyz"),
        ]);
        assert!(m.contains("SNCL_SECRET") && m.contains("32 hex"), "{m}");
    }

    #[test]
    fn bad_numbers_and_ranges() {
        let root = ("SNCL_ROOT", "1.2.3.4:5");
        let m = err(&[("SNCL_RANK", "4"), ("SNCL_WORLD_SIZE", "4"), root]);
        assert!(
            m.contains("SNCL_RANK=4") && m.contains("SNCL_WORLD_SIZE=4"),
            "{m}"
        );
        let m = err(&[("RANK", "x1"), ("WORLD_SIZE", "4"), root]);
        assert!(m.contains("RANK=\"x1\"") && m.contains("torchrun"), "{m}");
        let m = err(&[("RANK", "-1"), ("WORLD_SIZE", "4"), root]);
        assert!(m.contains("non-negative"), "{m}");
        let m = err(&[("RANK", "0"), ("WORLD_SIZE", "0"), root]);
        assert!(m.contains("at least 1"), "{m}");
        let m = err(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "z"),
            root,
        ]);
        assert!(m.contains("LOCAL_RANK"), "{m}");
        let m = err(&[("RANK", "0"), root]);
        assert!(m.contains("WORLD_SIZE"), "{m}");
        let m = err(&[]);
        for v in [
            "SNCL_RANK",
            "RANK",
            "OMPI_COMM_WORLD_RANK",
            "SLURM_PROCID",
            "SNCL_ROOT",
        ] {
            assert!(m.contains(v), "{m}");
        }
    }

    #[test]
    fn torchrun() {
        let vars = [
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "3"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_RUN_ID", "job42"),
            // Under a Slurm allocation too: torchrun still wins.
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
        ];
        let e = env(&vars).unwrap();
        assert_eq!(e.launcher, LAUNCHER_TORCHRUN);
        assert_eq!((e.rank, e.world_size, e.local_rank), (3, 8, Some(3)));
        assert_eq!(e.root, "127.0.0.1:29501".parse().unwrap());
        // Every rank derives the same secret; another run id a different one.
        let mut other_rank = vars;
        other_rank[0] = ("RANK", "5");
        other_rank[2] = ("LOCAL_RANK", "1");
        assert_eq!(env(&other_rank).unwrap().secret, e.secret);
        let mut other_job = vars;
        other_job[5] = ("TORCHELASTIC_RUN_ID", "job43");
        assert_ne!(env(&other_job).unwrap().secret, e.secret);
        // SNCL_ROOT overrides.
        let mut over = vars.to_vec();
        over.push(("SNCL_ROOT", "10.1.1.1:7000"));
        assert_eq!(env(&over).unwrap().root, "10.1.1.1:7000".parse().unwrap());

        let m = err(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
        ]);
        assert!(m.contains("MASTER_PORT") && m.contains("SNCL_ROOT"), "{m}");
        let m = err(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "65535"),
        ]);
        assert!(m.contains("MASTER_PORT"), "{m}");
    }

    #[test]
    fn open_mpi() {
        let vars = [
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "16"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_MCA_ess_base_jobid", "123456"),
            // mpirun inside a Slurm allocation: Open MPI wins.
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_NODELIST", "node[1-2]"),
            ("SLURM_JOB_ID", "77"),
        ];
        let m = err(&vars);
        assert!(m.contains("mpirun -x SNCL_ROOT=host:port"), "{m}");
        let mut with_root = vars.to_vec();
        with_root.push(("SNCL_ROOT", "127.0.0.1:29600"));
        let e = env(&with_root).unwrap();
        assert_eq!(e.launcher, LAUNCHER_OPENMPI);
        assert_eq!((e.rank, e.world_size, e.local_rank), (1, 16, Some(1)));
        assert_eq!(e.root, "127.0.0.1:29600".parse().unwrap());
        with_root[3] = ("OMPI_MCA_ess_base_jobid", "654321");
        assert_ne!(env(&with_root).unwrap().secret, e.secret);
    }

    #[test]
    fn slurm() {
        let vars = [
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_STEP_NODELIST", "localhost,node[02-04]"),
            ("SLURM_JOB_NODELIST", "other[1-9]"),
            ("SLURM_JOB_ID", "123456"),
            ("SLURM_STEP_ID", "0"),
        ];
        let e = env(&vars).unwrap();
        assert_eq!(e.launcher, LAUNCHER_SLURM);
        assert_eq!((e.rank, e.world_size, e.local_rank), (5, 8, Some(1)));
        assert!(e.root.ip().is_loopback());
        assert_eq!(e.root.port(), 20000 + (123456 % 20000) as u16);
        let mut step1 = vars;
        step1[6] = ("SLURM_STEP_ID", "1");
        assert_ne!(env(&step1).unwrap().secret, e.secret);

        // Falls back to the job nodelist; a hostname that does not resolve
        // is reported with the variable it came from.
        let m = err(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_NODELIST", "sncl-no-such-host[01-02].invalid"),
            ("SLURM_JOB_ID", "9"),
        ]);
        assert!(
            m.contains("sncl-no-such-host01.invalid") && m.contains("SLURM_JOB_NODELIST"),
            "{m}"
        );
        let m = err(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_NODELIST", "node[01"),
            ("SLURM_JOB_ID", "9"),
        ]);
        assert!(m.contains("hostlist") && m.contains("SNCL_ROOT"), "{m}");
        let m = err(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")]);
        assert!(
            m.contains("SLURM_STEP_NODELIST") && m.contains("SNCL_ROOT"),
            "{m}"
        );
        let m = err(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_NODELIST", "localhost"),
        ]);
        assert!(m.contains("SLURM_JOB_ID"), "{m}");
        // A batch script (SLURM_NTASKS without SLURM_PROCID) is not a rank.
        let m = err(&[("SLURM_NTASKS", "2")]);
        assert!(m.contains("cannot tell"), "{m}");
    }

    #[test]
    fn loopback_root_in_a_multi_host_job_is_an_error() {
        let m = err(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_WORLD_SIZE", "4"),
            ("MASTER_ADDR", "127.0.1.1"),
            ("MASTER_PORT", "29500"),
        ]);
        assert!(
            m.contains("loopback") && m.contains("LOCAL_WORLD_SIZE=4 < WORLD_SIZE=8"),
            "{m}"
        );
        assert!(m.contains("127.0.1.1"), "{m}");
        let m = err(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_NNODES", "2"),
            ("SNCL_ROOT", "127.0.0.1:29500"),
        ]);
        assert!(m.contains("SLURM_NNODES=2"), "{m}");
        // One host: loopback is right.
        let e = env(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_WORLD_SIZE", "4"),
            ("MASTER_ADDR", "localhost"),
            ("MASTER_PORT", "29500"),
        ])
        .unwrap();
        assert!(e.root.ip().is_loopback());
    }

    #[test]
    fn secret_sources() {
        let base = [
            ("SNCL_RANK", "0"),
            ("SNCL_WORLD_SIZE", "2"),
            ("SNCL_ROOT", "127.0.0.1:29500"),
        ];
        let e = env(&base).unwrap();
        assert_eq!(e.secret_source, SecretSource::Derived);
        let mut with = base.to_vec();
        with.push(("SNCL_SECRET", "000102030405060708090a0b0c0d0e0f"));
        assert_eq!(env(&with).unwrap().secret_source, SecretSource::Variable);

        let dir = std::env::temp_dir().join(format!("sncl-secret-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("secret");
        std::fs::write(&path, "00112233445566778899aabbccddeeff\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let p = path.to_str().unwrap();
        let mut with = base.to_vec();
        with.push(("SNCL_SECRET_FILE", p));
        let e = env(&with).unwrap();
        assert_eq!(e.secret_source, SecretSource::File);
        assert_eq!(e.secret[0], 0x00);
        assert_eq!(e.secret[15], 0xff);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let m = err(&with);
        assert!(
            m.contains("readable by other users") && m.contains("chmod 600"),
            "{m}"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, "not hex").unwrap();
        let m = err(&with);
        assert!(m.contains("32 hex digits"), "{m}");
        std::fs::remove_dir_all(&dir).unwrap();

        // A torchrun run id is on torchrun's command line: never secret,
        // however long and random.
        let tr = |id: &'static str| {
            env(&[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "127.0.0.1"),
                ("MASTER_PORT", "29500"),
                ("TORCHELASTIC_RUN_ID", id),
            ])
            .unwrap()
            .secret_source
        };
        assert_eq!(tr("none"), SecretSource::Derived);
        assert_eq!(
            tr("8d7c5e0b-5d1c-4b8e-9a51-0f4f3a2b1c0d"),
            SecretSource::Derived
        );
    }

    /// Secrets anyone could guess or swap: all zeros, a FIFO (whose read
    /// would block init past every deadline), a directory.
    #[test]
    fn weak_or_odd_secrets_are_refused() {
        let base = [
            ("SNCL_RANK", "0"),
            ("SNCL_WORLD_SIZE", "2"),
            ("SNCL_ROOT", "127.0.0.1:29500"),
        ];
        let mut with = base.to_vec();
        with.push(("SNCL_SECRET", "00000000000000000000000000000000"));
        let m = err(&with);
        assert!(m.contains("all zeros"), "{m}");
        let dir = std::env::temp_dir().join(format!("sncl-secret-odd-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let zeros = dir.join("zeros");
        std::fs::write(&zeros, "00000000000000000000000000000000\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&zeros, std::fs::Permissions::from_mode(0o600)).unwrap();
        let fifo = dir.join("fifo");
        let made = std::process::Command::new("mkfifo")
            .args(["-m", "600"])
            .arg(&fifo)
            .status()
            .is_ok_and(|s| s.success());
        assert!(made, "mkfifo");
        for (path, want) in [
            (&zeros, "all zeros"),
            (&fifo, "not a regular file"),
            (&dir, "not a regular file"),
        ] {
            let mut with = base.to_vec();
            with.push(("SNCL_SECRET_FILE", path.to_str().unwrap()));
            let t = std::time::Instant::now();
            let m = err(&with);
            assert!(m.contains(want), "{}: {m}", path.display());
            assert!(t.elapsed() < std::time::Duration::from_secs(1));
        }
        // Another user's file (here uid 65534's), however private.
        let theirs = dir.join("theirs");
        std::fs::write(&theirs, "00112233445566778899aabbccddeeff\n").unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o600)).unwrap();
        if rustix::process::geteuid().is_root() {
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            let mut with = base.to_vec();
            with.push(("SNCL_SECRET_FILE", theirs.to_str().unwrap()));
            let m = err(&with);
            assert!(m.contains("owned by uid 65534"), "{m}");
        } else {
            eprintln!("skipping the other-owner case: giving a file away needs root");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn huge_world_size_is_an_error() {
        let m = err(&[
            ("SNCL_RANK", "0"),
            ("SNCL_WORLD_SIZE", "99999999999"),
            ("SNCL_ROOT", "127.0.0.1:29500"),
        ]);
        assert!(
            m.contains("SNCL_WORLD_SIZE=99999999999") && m.contains("exceeds"),
            "{m}"
        );
    }
}
