//! Which ports can talk (issue 36, risk 5): an InfiniBand port and an
//! Ethernet (RoCE) port never can, and InfiniBand ports talk within one
//! subnet (the upper 64 bits of their port GID, the subnet prefix; IB
//! routers are rare). A rank publishes the fabrics of the ports it may use
//! in its card, and a pair whose sets share none is refused before anything
//! connects — it falls back to TCP (or, under `SNCL_TRANSPORT=rdma`, fails
//! naming both sides' fabrics) instead of timing out in the NIC's retries.
//! (Which of several shared fabrics a rank's port is on is not checked yet:
//! rails on different RoCE subnets still rely on the IP routing between
//! them.)

use crate::verbs::LinkLayer;

/// One port's fabric, as the card carries it: `ib/<subnet prefix hex>` or
/// `eth`.
pub fn fabric_of(link_layer: LinkLayer, subnet_prefix: Option<u64>) -> String {
    match link_layer {
        LinkLayer::InfiniBand => format!("ib/{:016x}", subnet_prefix.unwrap_or(0)),
        LinkLayer::Ethernet => "eth".into(),
        LinkLayer::Emulated => "emulated".into(),
    }
}

/// The card's fabric list (`;fabrics=a,b`), appended to `verbs:<dev>:<port>`.
pub fn card_suffix(fabrics: &[String]) -> String {
    let mut f: Vec<&str> = fabrics.iter().map(String::as_str).collect();
    f.sort_unstable();
    f.dedup();
    format!(";fabrics={}", f.join(","))
}

/// The fabrics a card lists (`None`: a card without the list).
fn fabrics_in(card: &str) -> Option<Vec<&str>> {
    let list = card.split(';').find_map(|p| p.strip_prefix("fabrics="))?;
    Some(list.split(',').filter(|f| !f.is_empty()).collect())
}

/// Whether ranks with cards `a` and `b` share a fabric; `Err` names both
/// sides' fabrics.
pub fn share_a_fabric(a: (usize, &str), b: (usize, &str)) -> Result<(), String> {
    let (Some(fa), Some(fb)) = (fabrics_in(a.1), fabrics_in(b.1)) else {
        return Ok(());
    };
    if fa.iter().any(|f| fb.contains(f)) {
        return Ok(());
    }
    Err(format!(
        "rank {}'s RDMA ports are on [{}] and rank {}'s on [{}]: no fabric in common \
         (InfiniBand and Ethernet ports cannot talk, InfiniBand ports only within one subnet)",
        a.0,
        fa.join(", "),
        b.0,
        fb.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ib_and_ethernet_or_two_ib_subnets_do_not_pair() {
        let ib = |p| fabric_of(LinkLayer::InfiniBand, Some(p));
        let eth = fabric_of(LinkLayer::Ethernet, None);
        let card = |f: &[String]| format!("verbs:mlx5_0:1{}", card_suffix(f));
        let (a, b) = (card(&[ib(0xfe80 << 48)]), card(std::slice::from_ref(&eth)));
        let e = share_a_fabric((0, &a), (1, &b)).unwrap_err();
        assert!(
            e.contains("rank 0") && e.contains("ib/fe80") && e.contains("[eth]"),
            "{e}"
        );
        let other_subnet = card(&[ib(0xfec0 << 48)]);
        assert!(share_a_fabric((0, &a), (1, &other_subnet)).is_err());
        // One common fabric among several ports is enough.
        let both = card(&[ib(0xfec0 << 48), ib(0xfe80 << 48)]);
        assert!(share_a_fabric((0, &a), (1, &both)).is_ok());
        assert!(share_a_fabric((0, &b), (1, &card(&[eth.clone(), eth]))).is_ok());
        // A card without the list (an older sncl) is not judged.
        assert!(share_a_fabric((0, &a), (1, "verbs:mlx5_0:1")).is_ok());
    }
}
