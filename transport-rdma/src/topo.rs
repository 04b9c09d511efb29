//! Which NIC a rank uses: the ACTIVE port nearest its GPU in the PCI tree
//! (sysfs), else spread by local rank, so that the ranks of a node use the
//! NICs as rails.

use std::path::{Path, PathBuf};

use crate::ibv::DevicePort;

/// Where sysfs lists RDMA devices.
const IB_CLASS: &str = "/sys/class/infiniband";
/// Where sysfs lists PCI devices by bus id.
const PCI_DEVICES: &str = "/sys/bus/pci/devices";

/// The PCI path of RDMA device `name` (`/sys/devices/pci0000:00/.../<bdf>`).
pub fn ib_device_pci_path(name: &str) -> Option<PathBuf> {
    std::fs::canonicalize(Path::new(IB_CLASS).join(name).join("device")).ok()
}

/// The PCI path of the PCI device with bus id `bdf` (e.g. a GPU's
/// `0000:3b:00.0`, as `nvidia-smi --query-gpu=pci.bus_id` prints it).
pub fn pci_path(bdf: &str) -> Option<PathBuf> {
    let bdf = bdf.trim().to_ascii_lowercase();
    // nvidia-smi prints an 8-digit domain (00000000:3B:00.0); sysfs 4.
    let bdf = match bdf.split_once(':') {
        Some((dom, rest)) if dom.len() == 8 => format!("{}:{rest}", &dom[4..]),
        _ => bdf,
    };
    std::fs::canonicalize(Path::new(PCI_DEVICES).join(bdf)).ok()
}

/// Hops between two PCI paths: components not shared, both sides.
pub fn pci_distance(a: &Path, b: &Path) -> usize {
    let (ca, cb): (Vec<_>, Vec<_>) = (a.components().collect(), b.components().collect());
    let common = ca.iter().zip(&cb).take_while(|(x, y)| x == y).count();
    (ca.len() - common) + (cb.len() - common)
}

/// Picks the port for this rank among `ports` (already filtered by
/// `SNCL_IB_HCA`, ACTIVE ones only): the one nearest `gpu` when the paths
/// are known (ties broken by local rank), else `local_rank % ports`.
pub fn choose_port<'a>(
    ports: &'a [DevicePort],
    local_rank: usize,
    gpu: Option<&Path>,
    nic_path: impl Fn(&str) -> Option<PathBuf>,
) -> Option<&'a DevicePort> {
    if ports.is_empty() {
        return None;
    }
    if let Some(gpu) = gpu {
        let dist: Vec<Option<usize>> = ports
            .iter()
            .map(|p| nic_path(&p.device).map(|n| pci_distance(gpu, &n)))
            .collect();
        if let Some(best) = dist.iter().flatten().min() {
            let nearest: Vec<&DevicePort> = ports
                .iter()
                .zip(&dist)
                .filter(|(_, d)| **d == Some(*best))
                .map(|(p, _)| p)
                .collect();
            return Some(nearest[local_rank % nearest.len()]);
        }
    }
    Some(&ports[local_rank % ports.len()])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(device: &str) -> DevicePort {
        DevicePort {
            device: device.into(),
            port: 1,
            active: true,
        }
    }

    #[test]
    fn the_nic_nearest_the_gpu_wins() {
        let gpu = Path::new("/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/0000:3c:00.0");
        let paths = |name: &str| -> Option<PathBuf> {
            Some(PathBuf::from(match name {
                "mlx5_0" => "/sys/devices/pci0000:17/0000:17:00.0/0000:18:00.0",
                "mlx5_1" => "/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/0000:3d:00.0",
                _ => return None,
            }))
        };
        let ports = [port("mlx5_0"), port("mlx5_1"), port("mlx5_2")];
        for local_rank in 0..4 {
            let p = choose_port(&ports, local_rank, Some(gpu), paths).unwrap();
            assert_eq!(p.device, "mlx5_1");
        }
        assert_eq!(pci_distance(gpu, gpu), 0);
    }

    #[test]
    fn without_topology_ranks_spread_over_the_rails() {
        let ports = [port("mlx5_0"), port("mlx5_1")];
        let none = |_: &str| None;
        let picks: Vec<&str> = (0..4)
            .map(|r| choose_port(&ports, r, None, none).unwrap().device.as_str())
            .collect();
        assert_eq!(picks, ["mlx5_0", "mlx5_1", "mlx5_0", "mlx5_1"]);
        let gpu = Path::new("/sys/devices/pci0000:00/0000:00:01.0");
        assert_eq!(
            choose_port(&ports, 1, Some(gpu), none).unwrap().device,
            "mlx5_1",
            "unknown NIC paths fall back to the spread"
        );
        assert!(choose_port(&[], 0, None, none).is_none());
    }

    #[test]
    fn bus_ids_are_normalised() {
        // Whatever this machine has, a malformed id is no path, not a panic.
        assert!(pci_path("not-a-bus-id").is_none());
        let _ = pci_path("00000000:3B:00.0");
    }
}
