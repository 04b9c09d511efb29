//! NUMA placement of the transport's registered host memory (issue 36,
//! risk 9): the inbound FIFO and the staging a NIC reads and writes by DMA
//! are placed on the NIC's NUMA node, as NCCL allocates its host buffers
//! near the NIC. Memory on the other socket crosses the inter-socket link
//! on every DMA and every staging copy.
//!
//! The NIC's node is sysfs's `class/infiniband/<dev>/device/numa_node`
//! (`-1`: the platform does not say). The placement is a preferred-node
//! memory policy (`mbind(2)` with `MPOL_PREFERRED`, set before the pages
//! are first touched, so the kernel allocates them there; `MPOL_MF_MOVE`
//! moves any page already touched). Preferred, not bound: a full node
//! falls back to another instead of failing the registration.

use std::path::Path;

/// `mbind(2)`'s flag that moves pages already allocated elsewhere
/// (linux/mempolicy.h: `MPOL_MF_MOVE (1<<1)`).
const MPOL_MF_MOVE: libc::c_uint = 1 << 1;
/// `get_mempolicy(2)`'s flag asking for the policy of the page at `addr`
/// (linux/mempolicy.h: `MPOL_F_ADDR (1<<1)`).
const MPOL_F_ADDR: libc::c_ulong = 1 << 1;
/// Nodes a node mask here can name (64 per word).
const MASK_WORDS: usize = 16;
const MAX_NODES: usize = MASK_WORDS * 64;

/// The NUMA node of RDMA device `device` as the sysfs mounted at
/// `sysfs` (`/sys`, or a test's tree) reports it
/// (`None`: not reported, `-1`, or no such device).
pub fn nic_numa_node(sysfs: &Path, device: &str) -> Option<u32> {
    let path = sysfs
        .join("class/infiniband")
        .join(device)
        .join("device/numa_node");
    let text = std::fs::read_to_string(path).ok()?;
    let node: i64 = text.trim().parse().ok()?;
    u32::try_from(node)
        .ok()
        .filter(|&n| (n as usize) < MAX_NODES)
}

/// This machine's first NUMA node, where it has one (the node the strict
/// emulation's NIC sits on; a kernel without NUMA support has none).
pub fn first_node() -> Option<u32> {
    std::path::Path::new("/sys/devices/system/node/node0")
        .exists()
        .then_some(0)
}

/// Asks the kernel to place the pages of `addr .. addr + len` (page
/// aligned) on `node`, moving those already touched.
pub(crate) fn prefer_node(addr: u64, len: usize, node: u32) -> Result<(), String> {
    if node as usize >= MAX_NODES {
        return Err(format!(
            "NUMA node {node} is beyond the {MAX_NODES} nodes a mask names"
        ));
    }
    let mut mask = [0 as libc::c_ulong; MASK_WORDS];
    mask[node as usize / 64] |= 1 << (node % 64);
    // SAFETY: mbind reads `MASK_WORDS` words of node mask from a live
    // array and changes only the memory policy of the range (a range this
    // process mapped; an unmapped one is refused with EFAULT), never its
    // contents or mapping.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            addr as *mut libc::c_void,
            len as libc::c_ulong,
            libc::MPOL_PREFERRED,
            mask.as_ptr(),
            (MAX_NODES + 1) as libc::c_ulong,
            MPOL_MF_MOVE,
        )
    };
    if r != 0 {
        return Err(format!(
            "mbind(MPOL_PREFERRED, node {node}) of {len} bytes: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// The node the memory policy of the page at `addr` prefers (`None`: the
/// default policy, another mode, or the call failed). Diagnostics and
/// tests.
pub fn preferred_node(addr: u64) -> Option<u32> {
    let mut mode: libc::c_int = -1;
    let mut mask = [0 as libc::c_ulong; MASK_WORDS];
    // SAFETY: get_mempolicy writes one int into `mode` and at most
    // `MASK_WORDS` words into `mask`, both live; with MPOL_F_ADDR it only
    // reads the policy of the page at `addr` (EFAULT if unmapped).
    let r = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut mode as *mut libc::c_int,
            mask.as_mut_ptr(),
            (MAX_NODES + 1) as libc::c_ulong,
            addr as *mut libc::c_void,
            MPOL_F_ADDR,
        )
    };
    if r != 0 || mode != libc::MPOL_PREFERRED {
        return None;
    }
    (0..MAX_NODES)
        .find(|&n| mask[n / 64] & (1 << (n % 64)) != 0)
        .map(|n| n as u32)
}

/// Places a registration's pages on the NIC's node where the port
/// reports one: logged, not fatal, when the kernel refuses (no NUMA
/// support, a node offline): the memory then stays where it would have
/// been.
pub(crate) fn place(device: &str, node: Option<u32>, addr: u64, len: usize) {
    let Some(node) = node else { return };
    if let Err(e) = prefer_node(addr, len, node) {
        tracing::debug!(
            device,
            node,
            "placing registered memory on the NIC's NUMA node: {e}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nic_node_comes_from_sysfs() {
        let root = std::env::temp_dir().join(format!("sncl-numa-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let dev = |name: &str, text: &str| {
            let d = root.join("class/infiniband").join(name).join("device");
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("numa_node"), text).unwrap();
        };
        dev("mlx5_0", "1\n");
        dev("mlx5_1", "-1\n");
        dev("mlx5_2", "garbage");
        let nodes = ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_9"].map(|d| nic_numa_node(&root, d));
        let _ = std::fs::remove_dir_all(&root);
        assert_eq!(nodes, [Some(1), None, None, None]);
    }

    #[test]
    fn a_preferred_node_is_set_on_the_range_and_read_back() {
        let Some(node) = first_node() else {
            eprintln!("skipped: this kernel reports no NUMA node");
            return;
        };
        let mut map = memmap2::MmapMut::map_anon(1 << 20).unwrap();
        let addr = map.as_mut_ptr() as u64;
        assert_eq!(
            preferred_node(addr),
            None,
            "a fresh mapping has the default policy"
        );
        if let Err(e) = prefer_node(addr, map.len(), node) {
            eprintln!("skipped: mbind is refused here ({e})");
            return;
        }
        map[0] = 1;
        assert_eq!(preferred_node(addr), Some(node));
        assert_eq!(preferred_node(addr + (1 << 19)), Some(node));
        assert!(prefer_node(addr, map.len(), MAX_NODES as u32).is_err());
    }
}
