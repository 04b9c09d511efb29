//! THE list of transport kinds, in order of preference: each peer pair gets
//! the first kind that is ready on both ranks and accepts the pair (see
//! [`comm_core::transport::registry`]). A new transport is one crate with
//! its [`TransportKind`] (setup, settings, connection) and one line here.

use comm_core::transport::registry::{MemoryKind, SelfKind, TransportKind};
use comm_core::transport::Connection;
use comm_core::{Error, Result};

/// Every transport kind this build has, most preferred first.
pub(crate) static TRANSPORTS: &[&dyn TransportKind] = &[
    &SelfKind,
    // Ahead of shm: it wraps shm's connection for host pieces and adds the
    // device path between ranks of a node (SNCL_NVLINK=0 turns it off).
    &transport_nvlink::NvlinkKind,
    &transport_shm::ShmKind,
    &transport_rdma::RdmaKind,
    &transport_tcp::TcpKind,
];

/// The names of the transport kinds this build has, most preferred first
/// (what `SNCL_TRANSPORT` names and [`crate::Stats::by_transport`] counts).
pub fn transport_names() -> Vec<&'static str> {
    TRANSPORTS.iter().map(|k| k.name()).collect()
}

/// A connection moves device memory exactly when its kind declares
/// [`MemoryKind::Device`]: the executor posts device regions to a
/// connection that moves them and stages device pieces through host
/// memory where it does not, so the declaration is what decides it.
pub(crate) fn check_memory_kinds(
    rank: usize,
    kind: &dyn TransportKind,
    c: &mut dyn Connection,
) -> Result<()> {
    let declared = kind.memory_kinds().contains(&MemoryKind::Device);
    if c.memory_kinds().contains(&MemoryKind::Device) == declared {
        return Ok(());
    }
    let (declares, has) = if declared {
        ("host and device memory", "host memory only")
    } else {
        ("host memory only", "device memory too")
    };
    Err(Error::Bootstrap {
        rank,
        detail: format!(
            "transport {} declares {declares}, but its connection to peer rank {} moves {has}",
            kind.name(),
            c.peer()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_valid_and_distinct() {
        let names: Vec<&str> = TRANSPORTS.iter().map(|k| k.name()).collect();
        assert_eq!(names.first(), Some(&"self"), "self comes first");
        assert_eq!(names.last(), Some(&"tcp"), "tcp is the fallback");
        for (i, n) in names.iter().enumerate() {
            comm_core::transport::registry::check_name(n).unwrap();
            assert!(!names[..i].contains(n), "{n} is listed twice");
        }
    }
}
