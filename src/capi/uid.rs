//! Choosing the root address of the unique ids the C ABI makes.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs, UdpSocket};

use super::error::CError;
use crate::UniqueId;

fn config_err(msg: String) -> CError {
    CError::invalid(msg)
}

/// Parses `host:port` (`[v6]:port`), preferring IPv4 when a name resolves
/// to several addresses.
fn parse_root(v: &str) -> Result<SocketAddr, CError> {
    let v = v.trim();
    let what = format!("SNCL_ROOT={v:?}");
    let addr = if let Ok(a) = v.parse::<SocketAddr>() {
        a
    } else {
        let (host, port) = v
            .rsplit_once(':')
            .filter(|(h, _)| !h.is_empty())
            .ok_or_else(|| {
                config_err(format!(
                    "{what} is not host:port; set it like SNCL_ROOT=node01:29501"
                ))
            })?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port: u16 = port
            .parse()
            .map_err(|_| config_err(format!("{what}: {port:?} is not a port (1-65535)")))?;
        let addrs: Vec<SocketAddr> = (host, port)
            .to_socket_addrs()
            .map_err(|e| config_err(format!("cannot resolve the host of {what}: {e}")))?
            .collect();
        addrs
            .iter()
            .find(|a| a.is_ipv4())
            .or(addrs.first())
            .copied()
            .ok_or_else(|| config_err(format!("the host of {what} resolved to no address")))?
    };
    if addr.port() == 0 {
        return Err(config_err(format!(
            "{what} has port 0; give the port rank 0's store listens on"
        )));
    }
    Ok(addr)
}

fn var(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.trim().is_empty())
}

/// IPv4 addresses of up interfaces, with their names.
fn interfaces() -> Vec<(String, Ipv4Addr)> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut p = head;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list getifaddrs returned, alive until
        // freeifaddrs; its name is a NUL-terminated string and its address,
        // when not NULL and of family AF_INET, a sockaddr_in.
        unsafe {
            let ifa = &*p;
            if !ifa.ifa_addr.is_null()
                && i32::from((*ifa.ifa_addr).sa_family) == libc::AF_INET
                && ifa.ifa_flags & libc::IFF_UP as libc::c_uint != 0
            {
                let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                let name = std::ffi::CStr::from_ptr(ifa.ifa_name)
                    .to_string_lossy()
                    .into_owned();
                out.push((name, ip));
            }
            p = ifa.ifa_next;
        }
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// The address of interface `SNCL_SOCKET_IFNAME` (exact name, else the
/// first whose name starts with it), if set and found.
fn ifname_ip() -> Option<IpAddr> {
    let want = var("SNCL_SOCKET_IFNAME")?;
    let ifs = interfaces();
    ifs.iter()
        .find(|(n, _)| *n == want)
        .or_else(|| ifs.iter().find(|(n, _)| n.starts_with(want.as_str())))
        .map(|(_, ip)| IpAddr::V4(*ip))
}

/// The host's address for a new root: `SNCL_SOCKET_IFNAME`'s, else the
/// first non-loopback IPv4 address of an up interface other than docker /
/// virtual bridges, else 127.0.0.1.
fn host_ip() -> IpAddr {
    if let Some(ip) = ifname_ip() {
        return ip;
    }
    interfaces()
        .into_iter()
        .find(|(n, ip)| {
            !ip.is_loopback()
                && !ip.is_unspecified()
                && !n.starts_with("docker")
                && !n.starts_with("virbr")
                && !n.starts_with("lo")
        })
        .map(|(_, ip)| IpAddr::V4(ip))
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// `snclGetUniqueId`: see its documentation for the rules.
pub(crate) fn new_unique_id() -> Result<UniqueId, CError> {
    if let Some(root) = var("SNCL_ROOT") {
        let root = parse_root(&root)?;
        let given = comm_core::bootstrap::configured_secret(&|k| std::env::var(k).ok())
            .map_err(CError::from)?;
        return match given {
            Some((secret, _)) => Ok(UniqueId { root, secret }),
            None => UniqueId::new(root).map_err(CError::from),
        };
    }
    // The store starts now on a free port (no window for another program
    // to take it before snclCommInitRank).
    let ip = host_ip();
    crate::Communicator::unique_id(SocketAddr::new(ip, 0)).map_err(CError::from)
}

/// A unique id for a communicator whose rank 0 is this process, used by
/// `snclCommSplit`: on `SNCL_SOCKET_IFNAME`'s address if set, else on the
/// address this host uses to reach `route` (the parent's root), else on
/// 127.0.0.1.
pub(crate) fn split_unique_id(route: Option<SocketAddr>) -> Result<UniqueId, CError> {
    let ip = ifname_ip()
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
    crate::Communicator::unique_id(SocketAddr::new(ip, 0)).map_err(CError::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_roots_and_secrets() {
        assert_eq!(
            parse_root("127.0.0.1:29501").unwrap(),
            "127.0.0.1:29501".parse().unwrap()
        );
        assert_eq!(parse_root("localhost:7").unwrap().port(), 7);
        assert!(parse_root("127.0.0.1:0").is_err());
        assert!(parse_root("nohost").is_err());
    }

    #[test]
    fn loopback_route_stays_on_loopback() {
        let id = split_unique_id(Some("127.0.0.1:5".parse().unwrap())).unwrap();
        assert!(id.root.ip().is_loopback());
    }
}
