//! Where each rank of a window runs: a key of its device that every
//! process computes alike, and whether two processes share a device
//! without MPS (then the direct kernels, which spin on each other, are off).

/// A key of `dev` that ranks of every process compute alike: a hash of its
/// PCI bus id (its backend and ordinal where it has none).
pub(super) fn device_key(dev: &dyn ::device::Device) -> u64 {
    // The same in every process and build.
    let text = match dev.pci_bus_id() {
        Ok(id) => id.to_ascii_lowercase(),
        Err(_) => format!("{}:{}", dev.backend().name(), dev.ordinal()),
    };
    comm_core::hash::fnv1a(text.bytes())
}

/// Given every rank's (process token, device key, MPS), why direct kernels
/// cannot run: two ranks of different processes on one device (same node,
/// same bus id) without MPS (their kernels time-slice the device, so one
/// rank's kernel would spin on a kernel that cannot start). `None` where
/// nothing forbids them.
pub(super) fn shared_without_mps(
    placement: &[(u64, u64, bool)],
    same_node: impl Fn(usize, usize) -> bool,
) -> Option<String> {
    for (a, &(pa, da, ma)) in placement.iter().enumerate() {
        for (b, &(pb, db, mb)) in placement.iter().enumerate().skip(a + 1) {
            if pa != pb && da == db && same_node(a, b) && !(ma && mb) {
                return Some(format!(
                    "ranks {a} and {b} share a device from different processes without MPS"
                ));
            }
        }
    }
    None
}

/// The most blocks each rank's direct kernel may launch so that the
/// kernels of every rank sharing a device are resident together (their
/// blocks spin on each other; a block that cannot be resident until a
/// spinning one ends is a hang): given every rank's (device key, blocks its
/// device holds at once; `u64::MAX`: no limit), the least over ranks of
/// what its device holds over the ranks on it (same node, same key). Every
/// rank computes it alike from the same records.
pub(super) fn direct_grid_cap(
    devices: &[(u64, u64)],
    same_node: impl Fn(usize, usize) -> bool,
) -> u64 {
    devices
        .iter()
        .enumerate()
        .map(|(a, &(key, holds))| {
            let sharing = devices
                .iter()
                .enumerate()
                .filter(|&(b, &(k, _))| k == key && (a == b || same_node(a, b)))
                .count() as u64;
            holds / sharing.max(1)
        })
        .min()
        .unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::{direct_grid_cap, shared_without_mps};

    #[test]
    fn ranks_sharing_a_device_share_its_resident_blocks() {
        let one_node = |_: usize, _: usize| true;
        // Two ranks on one device holding 32 blocks: 16 each.
        assert_eq!(direct_grid_cap(&[(7, 32), (7, 32)], one_node), 16);
        // One device each: the smaller device bounds every rank's grid.
        assert_eq!(direct_grid_cap(&[(7, 32), (8, 528)], one_node), 32);
        // Three of four ranks on one device.
        assert_eq!(
            direct_grid_cap(&[(7, 528), (7, 528), (7, 528), (8, 528)], one_node),
            176
        );
        // The same bus id on two nodes is two devices; no limit stays none.
        assert_eq!(direct_grid_cap(&[(7, 32), (7, 32)], |_, _| false), 32);
        assert_eq!(direct_grid_cap(&[(7, u64::MAX); 2], one_node), u64::MAX / 2);
    }

    #[test]
    fn direct_kernels_are_off_only_for_processes_sharing_a_device_without_mps() {
        let all_one_node = |_: usize, _: usize| true;
        // Threads of one process on one device: on.
        assert_eq!(shared_without_mps(&[(1, 7, false); 4], all_one_node), None);
        // Two processes, one device, no MPS: off, naming the ranks.
        let two = [(1, 7, false), (2, 7, false)];
        let why = shared_without_mps(&two, all_one_node).expect("off");
        assert!(
            why.contains("ranks 0 and 1") && why.contains("MPS"),
            "{why}"
        );
        // With MPS on both: on. One device each: on.
        assert_eq!(
            shared_without_mps(&[(1, 7, true), (2, 7, true)], all_one_node),
            None
        );
        assert_eq!(
            shared_without_mps(&[(1, 7, false), (2, 8, false)], all_one_node),
            None
        );
        // The same bus id on two nodes is two devices.
        assert_eq!(shared_without_mps(&two, |_, _| false), None);
    }
}
