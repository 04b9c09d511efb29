//! The few OS calls the standard library and socket2 do not wrap: `poll(2)`
//! (waiting on several sockets with a deadline) and `getifaddrs(3)`
//! (interface addresses), and the socket options they lack (retransmission
//! timeout cap, pacing rate, `TCP_INFO`). All `unsafe` code of the crate lives here.

use std::ffi::CStr;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::RawFd;
use std::time::Duration;

/// One descriptor to wait on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PollFd {
    /// The descriptor.
    pub fd: RawFd,
    /// Wait until it is readable (else writable).
    pub read: bool,
    /// Set by [`poll`]: something happened (ready, error or hang-up).
    pub ready: bool,
}

impl PollFd {
    pub(crate) fn new(fd: RawFd, read: bool) -> PollFd {
        PollFd {
            fd,
            read,
            ready: false,
        }
    }
}

/// Waits until one of `fds` is ready or `timeout` passes; returns how many
/// are ready (0 on timeout). `EINTR` counts as a timeout-free wake-up (0).
pub(crate) fn poll(fds: &mut [PollFd], timeout: Duration) -> io::Result<usize> {
    let mut raw: Vec<libc::pollfd> = fds
        .iter()
        .map(|p| libc::pollfd {
            fd: p.fd,
            events: if p.read { libc::POLLIN } else { libc::POLLOUT },
            revents: 0,
        })
        .collect();
    // Round up so a sub-millisecond wait does not become a busy spin.
    let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
    // SAFETY: `raw` is a valid, initialised array of `raw.len()` pollfd
    // structs that outlives the call; poll only writes their `revents`.
    let n = unsafe { libc::poll(raw.as_mut_ptr(), raw.len() as libc::nfds_t, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    for (p, r) in fds.iter_mut().zip(&raw) {
        p.ready = r.revents != 0;
    }
    Ok(n as usize)
}

/// Copies what waits in socket `fd` into `buf` without taking it from the
/// socket and without waiting (`recv` with `MSG_PEEK | MSG_DONTWAIT`);
/// how many bytes were copied.
pub(crate) fn peek(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the call.
    let n = unsafe {
        libc::recv(
            fd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// This process's soft limit on open descriptors (None: unlimited or
/// unknown).
pub(crate) fn open_file_limit() -> Option<usize> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid rlimit for getrlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0
        || limit.rlim_cur == libc::RLIM_INFINITY
    {
        return None;
    }
    usize::try_from(limit.rlim_cur).ok()
}

/// One entry of the interface list: its name and address, if it has one of
/// family IPv4/IPv6.
#[derive(Clone, Debug)]
pub(crate) struct IfAddr {
    pub name: String,
    pub addr: Option<IpAddr>,
    /// Whether the interface is up (`IFF_UP`).
    pub up: bool,
}

/// Every (interface, address) pair `getifaddrs(3)` reports.
pub(crate) fn interface_addrs() -> io::Result<Vec<IfAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid out-pointer; on success getifaddrs stores the
    // head of a list that we own until freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a non-null node of the list returned above, which
        // stays valid until the freeifaddrs call below.
        let ifa = unsafe { &*cur };
        let name = if ifa.ifa_name.is_null() {
            String::from("?")
        } else {
            // SAFETY: a non-null ifa_name is a NUL-terminated string owned by
            // the list.
            unsafe { CStr::from_ptr(ifa.ifa_name) }
                .to_string_lossy()
                .into_owned()
        };
        let addr = if ifa.ifa_addr.is_null() {
            None
        } else {
            // SAFETY: a non-null ifa_addr points to a sockaddr whose first
            // field is the family; read_unaligned makes no alignment claim.
            let family = unsafe { std::ptr::read_unaligned(ifa.ifa_addr) }.sa_family;
            match i32::from(family) {
                libc::AF_INET => {
                    // SAFETY: family AF_INET means the storage is a sockaddr_in.
                    let sin = unsafe {
                        std::ptr::read_unaligned(ifa.ifa_addr as *const libc::sockaddr_in)
                    };
                    Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                        sin.sin_addr.s_addr,
                    ))))
                }
                libc::AF_INET6 => {
                    // SAFETY: family AF_INET6 means the storage is a sockaddr_in6.
                    let sin6 = unsafe {
                        std::ptr::read_unaligned(ifa.ifa_addr as *const libc::sockaddr_in6)
                    };
                    Some(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)))
                }
                _ => None,
            }
        };
        let up = ifa.ifa_flags & libc::IFF_UP as libc::c_uint != 0;
        out.push(IfAddr { name, addr, up });
        cur = ifa.ifa_next;
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed once;
    // no reference into the list survives this point.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// Linux's `TCP_RTO_MAX_MS` socket option (kernel 6.15 and newer): the
/// largest retransmission timeout of one socket, in milliseconds (the
/// system's default is 120 s; the kernel accepts 1,000 to 120,000).
const TCP_RTO_MAX_MS: libc::c_int = 44;

/// Caps `fd`'s retransmission timeout at `max` (at least 1 s), so that
/// after a link outage the connection resumes within about `max` of the
/// link coming back instead of after an exponential backoff of many
/// seconds. Kernels without the option answer `ENOPROTOOPT` (returned as
/// the error; callers treat it as "not available").
pub(crate) fn cap_retransmission_timeout(fd: RawFd, max: Duration) -> io::Result<()> {
    let ms = libc::c_int::try_from(max.as_millis().clamp(1_000, 120_000)).unwrap_or(120_000);
    // SAFETY: `fd` is an open socket owned by the caller; the option value
    // is a live c_int and its size is passed.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            TCP_RTO_MAX_MS,
            (&ms as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Caps the kernel's pacing rate of `fd` at `bytes_per_s`
/// (`SO_MAX_PACING_RATE`, 64-bit form). Linux paces TCP itself when the
/// option is set (since 4.13, no `fq` qdisc needed): the socket sends at most
/// this rate, and TCP small queues keep about a millisecond of it queued
/// below the socket.
pub(crate) fn set_max_pacing_rate(fd: RawFd, bytes_per_s: u64) -> io::Result<()> {
    // SAFETY: `fd` is an open socket owned by the caller; the option value is
    // a live u64 and its size is passed.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_MAX_PACING_RATE,
            (&bytes_per_s as *const u64).cast(),
            std::mem::size_of::<u64>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `fd`'s `SO_MAX_PACING_RATE` in bytes per second (`u64::MAX`: not capped).
pub(crate) fn max_pacing_rate(fd: RawFd) -> io::Result<u64> {
    let mut v: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: `fd` is an open socket owned by the caller; `v` and `len` are
    // live out-pointers and `len` holds the size of `v`.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_MAX_PACING_RATE,
            (&mut v as *mut u64).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    if len as usize == std::mem::size_of::<u32>() {
        // A kernel answering in the 32-bit form: ~0u32 means not capped.
        let v32 = v as u32;
        return Ok(if v32 == u32::MAX {
            u64::MAX
        } else {
            u64::from(v32)
        });
    }
    Ok(v)
}

/// The kernel's count of segments `fd` retransmitted over its lifetime
/// (`TCP_INFO`'s `tcpi_total_retrans`).
pub(crate) fn total_retransmits(fd: RawFd) -> io::Result<u32> {
    // SAFETY: tcp_info is plain old data; all-zero bytes are a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `fd` is an open socket owned by the caller; `info` and `len`
    // are live out-pointers and `len` holds the size of `info`.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    if r == 0 {
        Ok(info.tcpi_total_retrans)
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    #[test]
    fn a_fresh_connection_has_no_retransmits_and_a_closed_fd_is_an_error() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        let c = std::net::TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        assert_eq!(total_retransmits(c.as_raw_fd()).expect("TCP_INFO"), 0);
        let e = total_retransmits(-1).expect_err("fd -1 has no TCP_INFO");
        assert_eq!(e.raw_os_error(), Some(libc::EBADF), "{e}");
    }

    #[test]
    fn pacing_rate_is_set_and_read_back() {
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        let fd = sock.as_raw_fd();
        assert_eq!(
            max_pacing_rate(fd).expect("read"),
            u64::MAX,
            "fresh socket is not capped"
        );
        set_max_pacing_rate(fd, 1_484_375).expect("SO_MAX_PACING_RATE");
        assert_eq!(max_pacing_rate(fd).expect("read back"), 1_484_375);
        let e = set_max_pacing_rate(-1, 1).expect_err("fd -1");
        assert_eq!(e.raw_os_error(), Some(libc::EBADF), "{e}");
    }

    #[test]
    fn retransmission_timeout_cap_is_applied_where_the_kernel_has_it() {
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        match cap_retransmission_timeout(sock.as_raw_fd(), Duration::from_millis(1500)) {
            Ok(()) => {
                let mut got: libc::c_int = 0;
                let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
                // SAFETY: live out-pointers of the right size; `sock` is open.
                let r = unsafe {
                    libc::getsockopt(
                        sock.as_raw_fd(),
                        libc::IPPROTO_TCP,
                        TCP_RTO_MAX_MS,
                        (&mut got as *mut libc::c_int).cast(),
                        &mut len,
                    )
                };
                assert_eq!(r, 0, "{}", io::Error::last_os_error());
                assert_eq!(got, 1500);
            }
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::ENOPROTOOPT), "{e}");
                eprintln!("skipped: this kernel has no TCP_RTO_MAX_MS ({e})");
            }
        }
    }
}
