//! Choosing the root address of the unique ids the C ABI makes.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};

use comm_core::settings::Environment;
use sncl_bootstrap::ReadEnvironment;
use sncl_bootstrap::{configured_secret, parse_host_port};

use super::error::CError;
use sncl_rs::UniqueId;

/// The settings the unique-id rules read (environment and settings file).
fn settings() -> Result<Environment, CError> {
    Environment::from_process().map_err(CError::from)
}

/// A non-blank setting.
fn var(env: &Environment, k: &str) -> Option<String> {
    env.get(k)
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// The address of interface `SNCL_SOCKET_IFNAME` (transport-tcp's rule:
/// its IPv4 address, else a routable IPv6 one), if set; an interface that
/// does not exist or has no address is an error listing the interfaces.
fn ifname_ip(env: &Environment) -> Result<Option<IpAddr>, CError> {
    let config = comm_core::Config::from_environment(env).map_err(CError::from)?;
    let Some(want) = config.tcp.socket_ifname else {
        return Ok(None);
    };
    transport_tcp::interface_addr(&want)
        .map(Some)
        .map_err(|e| CError::invalid(format!("SNCL_SOCKET_IFNAME={want:?}: {e}")))
}

/// The host's address for a new root: `SNCL_SOCKET_IFNAME`'s, else the
/// first non-loopback IPv4 address of an up interface other than docker /
/// virtual bridges, else 127.0.0.1.
fn host_ip(env: &Environment) -> Result<IpAddr, CError> {
    if let Some(ip) = ifname_ip(env)? {
        return Ok(ip);
    }
    Ok(IpAddr::V4(
        transport_tcp::default_host_ipv4().unwrap_or(Ipv4Addr::LOCALHOST),
    ))
}

/// `snclGetUniqueId`: see its documentation for the rules.
pub(crate) fn new_unique_id() -> Result<UniqueId, CError> {
    let env = settings()?;
    if let Some(root) = var(&env, "SNCL_ROOT") {
        let root = parse_host_port("SNCL_ROOT", &root).map_err(CError::from)?;
        let given = configured_secret(&env.getter()).map_err(CError::from)?;
        return match given {
            Some((secret, _)) => Ok(UniqueId { root, secret }),
            None => UniqueId::new(root).map_err(CError::from),
        };
    }
    // The store starts now on a free port (no window for another program
    // to take it before snclCommInitRank).
    let ip = host_ip(&env)?;
    sncl_rs::Communicator::unique_id(SocketAddr::new(ip, 0)).map_err(CError::from)
}

/// A unique id for a communicator whose rank 0 is this process, used by
/// `snclCommSplit`: on `SNCL_SOCKET_IFNAME`'s address if set, else on the
/// address this host uses to reach `route` (the parent's root), else on
/// 127.0.0.1.
pub(crate) fn split_unique_id(route: Option<SocketAddr>) -> Result<UniqueId, CError> {
    let ip = ifname_ip(&settings()?)?
        .or_else(|| {
            let r = route?;
            if r.ip().is_loopback() {
                return Some(r.ip());
            }
            let bind = match r {
                SocketAddr::V4(_) => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
                SocketAddr::V6(_) => "[::]:0".parse().ok()?,
            };
            // A connected UDP socket sends nothing; it only asks the kernel
            // which local address routes to `r`.
            let s = UdpSocket::bind(bind).ok()?;
            s.connect(r).ok()?;
            Some(s.local_addr().ok()?.ip())
        })
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    sncl_rs::Communicator::unique_id(SocketAddr::new(ip, 0)).map_err(CError::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_roots_with_the_bootstrap_rules() {
        let p = |v| parse_host_port("SNCL_ROOT", v);
        assert_eq!(
            p("127.0.0.1:29501").unwrap(),
            "127.0.0.1:29501".parse().unwrap()
        );
        assert_eq!(p("localhost:7").unwrap().port(), 7);
        assert!(p("127.0.0.1:0").is_err());
        assert!(p("nohost").is_err());
    }

    #[test]
    fn unknown_interface_is_an_error_naming_it() {
        let env = Environment::from_pairs([("SNCL_SOCKET_IFNAME", "sncl-no-such-if0")]);
        let e = ifname_ip(&env).unwrap_err();
        assert!(format!("{e:?}").contains("sncl-no-such-if0"), "{e:?}");
        assert_eq!(ifname_ip(&Environment::default()).unwrap(), None);
    }

    #[test]
    fn loopback_route_stays_on_loopback() {
        let id = split_unique_id(Some("127.0.0.1:5".parse().unwrap())).unwrap();
        assert!(id.root.ip().is_loopback());
    }
}
