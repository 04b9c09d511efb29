//! Which GID a RoCE port's connections use (issue 36, risk 1).
//!
//! A RoCE port's GID table holds, per IP address of its netdev, a RoCE v1
//! and a RoCE v2 entry, after the link-local pair (mlx5: 0 = v1 fe80::,
//! 1 = v2 fe80::, 2 = v1 ::ffff:a.b.c.d, 3 = v2 ::ffff:a.b.c.d). Index 0 —
//! what a fixed default picks — is RoCE v1 and link-local: its packets are
//! Ethernet frames with no IP header, so they never leave the L2 segment,
//! and a fabric of routed racks never delivers them. NCCL and perftest take
//! a RoCE v2 entry with an IPv4-mapped address (NCCL_IB_ROCE_VERSION_NUM=2,
//! NCCL_IB_ADDR_FAMILY=AF_INET). The table and each entry's type are in
//! sysfs: `class/infiniband/<dev>/ports/<port>/gids/<i>` and
//! `gid_attrs/types/<i>` ("IB/RoCE v1" or "RoCE v2"; reading the type of an
//! empty entry fails), as rdma-core's `show_gids` reads them.

use std::net::Ipv4Addr;

use crate::verbs::LinkLayer;

/// What an entry of a GID table is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GidKind {
    /// InfiniBand, or RoCE v1 (sysfs says "IB/RoCE v1" for both).
    IbOrRoceV1,
    /// RoCE v2 (UDP/IP encapsulated: routable).
    RoceV2,
}

/// One entry of a port's GID table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidEntry {
    /// Its index (`SNCL_IB_GID_INDEX`, `sgid_index`).
    pub index: u8,
    /// The GID.
    pub gid: [u8; 16],
    /// Its type.
    pub kind: GidKind,
}

impl GidEntry {
    /// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`).
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        let g = &self.gid;
        (g[..10].iter().all(|&b| b == 0) && g[10] == 0xff && g[11] == 0xff)
            .then(|| Ipv4Addr::new(g[12], g[13], g[14], g[15]))
    }

    /// Whether the GID is link-local (fe80::/10): it never leaves the L2
    /// segment.
    pub fn link_local(&self) -> bool {
        self.gid[0] == 0xfe && self.gid[1] & 0xc0 == 0x80
    }

    /// Whether packets from this GID can cross a routed (L3) fabric: RoCE
    /// v2 with an address that is not link-local.
    pub fn routable(&self) -> bool {
        self.kind == GidKind::RoceV2 && !self.link_local() && self.gid != [0; 16]
    }
}

/// The GID index a port's connections use: `forced` (`SNCL_IB_GID_INDEX`)
/// where set; on InfiniBand 0 (the port GID); on Ethernet (RoCE) the first
/// RoCE v2 entry with an IPv4-mapped address, else the first routable RoCE
/// v2 entry (IPv6), else — with the reason, for a WARN — the first entry.
/// The table may be empty (the provider cannot read it): 0.
pub fn choose_gid_index(
    table: &[GidEntry],
    link_layer: LinkLayer,
    forced: Option<u8>,
) -> (u8, Option<String>) {
    if let Some(i) = forced {
        return (i, None);
    }
    if link_layer != LinkLayer::Ethernet || table.is_empty() {
        return (0, None);
    }
    let v2 = |e: &&GidEntry| e.routable();
    if let Some(e) = table.iter().filter(v2).find(|e| e.ipv4().is_some()) {
        return (e.index, None);
    }
    if let Some(e) = table.iter().find(v2) {
        return (e.index, None);
    }
    let first = table[0].index;
    (
        first,
        Some(format!(
            "the port has no routable RoCE v2 GID (no RoCE v2 entry with an IP address in its \
             table of {} entries): using index {first}, which reaches only peers on the same L2 \
             segment; give the netdev an IP address, or set SNCL_IB_GID_INDEX",
            table.len()
        )),
    )
}

/// An mlx5-like RoCE table for `ip` (the strict emulated port's, and
/// tests'): 0 v1 fe80::, 1 v2 fe80::, 2 v1 ::ffff:ip, 3 v2 ::ffff:ip.
pub fn mlx5_roce_table(ip: Ipv4Addr, mac_tail: [u8; 3]) -> Vec<GidEntry> {
    let mut link_local = [0u8; 16];
    link_local[0] = 0xfe;
    link_local[1] = 0x80;
    link_local[13..].copy_from_slice(&mac_tail);
    let mut mapped = [0u8; 16];
    mapped[10] = 0xff;
    mapped[11] = 0xff;
    mapped[12..].copy_from_slice(&ip.octets());
    vec![
        GidEntry {
            index: 0,
            gid: link_local,
            kind: GidKind::IbOrRoceV1,
        },
        GidEntry {
            index: 1,
            gid: link_local,
            kind: GidKind::RoceV2,
        },
        GidEntry {
            index: 2,
            gid: mapped,
            kind: GidKind::IbOrRoceV1,
        },
        GidEntry {
            index: 3,
            gid: mapped,
            kind: GidKind::RoceV2,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roce_takes_the_v2_ipv4_entry_infiniband_index_0_and_a_forced_index_wins() {
        let t = mlx5_roce_table(Ipv4Addr::new(198, 18, 0, 2), [1, 2, 3]);
        assert_eq!(choose_gid_index(&t, LinkLayer::Ethernet, None), (3, None));
        assert_eq!(choose_gid_index(&t, LinkLayer::InfiniBand, None), (0, None));
        assert_eq!(
            choose_gid_index(&t, LinkLayer::Ethernet, Some(1)),
            (1, None)
        );
        assert_eq!(choose_gid_index(&[], LinkLayer::Ethernet, None), (0, None));
        // Only IPv6: the routable v2 entry.
        let mut v6 = t.clone();
        v6[3].gid = "2001:db8::5"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets();
        v6[2].gid = v6[3].gid;
        assert_eq!(choose_gid_index(&v6, LinkLayer::Ethernet, None), (3, None));
        // No address on the netdev: link-local only, with the reason.
        let (i, why) = choose_gid_index(&t[..2], LinkLayer::Ethernet, None);
        assert_eq!(i, 0);
        assert!(why.unwrap().contains("no routable RoCE v2 GID"));
        assert!(t[3].routable() && !t[0].routable() && !t[1].routable() && !t[2].routable());
        assert_eq!(t[3].ipv4(), Some(Ipv4Addr::new(198, 18, 0, 2)));
    }
}
