//! Which NIC a rank uses: the ACTIVE port nearest its GPU in the PCI tree
//! (sysfs), else spread by local rank, so that the ranks of a node use the
//! NICs as rails.

use std::path::{Path, PathBuf};

use crate::gid::{GidEntry, GidKind};
use crate::ibv::DevicePort;

/// Where sysfs is mounted: `/sys`, or a fake tree (tests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sysfs {
    root: PathBuf,
}

impl Sysfs {
    /// The machine's sysfs, `/sys`.
    pub fn system() -> Sysfs {
        Sysfs::at(crate::sys::SYSFS_ROOT)
    }

    /// A sysfs tree rooted at `root` (holding `class/infiniband/` and
    /// `bus/pci/devices/`, whose entries link into `devices/`).
    pub fn at(root: impl Into<PathBuf>) -> Sysfs {
        Sysfs { root: root.into() }
    }

    /// Where the tree is rooted.
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// The PCI path of RDMA device `name`
    /// (`<root>/devices/pci0000:00/.../<bdf>`).
    pub fn ib_device_pci_path(&self, name: &str) -> Option<PathBuf> {
        let link = self.root.join("class/infiniband").join(name).join("device");
        std::fs::canonicalize(link).ok()
    }

    /// The PCI path of the PCI device with bus id `bdf` (e.g. a GPU's
    /// `0000:3b:00.0`, or `00000000:3B:00.0` as `nvidia-smi` and
    /// `cuDeviceGetPCIBusId` print it).
    pub fn pci_path(&self, bdf: &str) -> Option<PathBuf> {
        let bdf = bdf.trim().to_ascii_lowercase();
        // nvidia-smi prints an 8-digit domain (00000000:3B:00.0); sysfs 4.
        let bdf = match bdf.split_once(':') {
            Some((dom, rest)) if dom.len() == 8 => format!("{}:{rest}", &dom[4..]),
            _ => bdf,
        };
        if bdf.is_empty() || bdf.contains('/') || bdf.starts_with('.') {
            return None;
        }
        std::fs::canonicalize(self.root.join("bus/pci/devices").join(bdf)).ok()
    }
}

/// Parses a GID as sysfs prints it (`fe80:0000:0000:0000:0202:c9ff:fe00:0001`).
fn parse_gid(text: &str) -> Option<[u8; 16]> {
    let addr: std::net::Ipv6Addr = text.trim().parse().ok()?;
    Some(addr.octets())
}

impl Sysfs {
    /// The GID table of `device` port `port` (entries that are set, with
    /// their types); empty where sysfs does not have it.
    pub fn gid_table(&self, device: &str, port: u8) -> Vec<GidEntry> {
        let dir = self
            .root()
            .join("class/infiniband")
            .join(device)
            .join("ports")
            .join(port.to_string());
        let mut out = Vec::new();
        for index in 0..=u8::MAX {
            let Ok(text) = std::fs::read_to_string(dir.join("gids").join(index.to_string())) else {
                break;
            };
            let Some(gid) = parse_gid(&text).filter(|g| *g != [0; 16]) else {
                continue;
            };
            let kind = match std::fs::read_to_string(
                dir.join("gid_attrs/types").join(index.to_string()),
            ) {
                Ok(t) if t.trim() == "RoCE v2" => GidKind::RoceV2,
                Ok(_) => GidKind::IbOrRoceV1,
                Err(_) => continue,
            };
            out.push(GidEntry { index, gid, kind });
        }
        out
    }
}

/// The PCI path of RDMA device `name` in the machine's sysfs.
pub fn ib_device_pci_path(name: &str) -> Option<PathBuf> {
    Sysfs::system().ib_device_pci_path(name)
}

/// The PCI path of the PCI device with bus id `bdf` in the machine's sysfs
/// (see [`Sysfs::pci_path`]).
pub fn pci_path(bdf: &str) -> Option<PathBuf> {
    Sysfs::system().pci_path(bdf)
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

/// The rule of [`crate::probe_for`]: among `ports` (ACTIVE, allowed by
/// `SNCL_IB_HCA`), the one nearest the GPU with PCI bus id `gpu_bus_id` in
/// `sysfs` (fewest PCI hops; ties, and every port where the GPU or the NICs
/// are not found, shared out by `local_rank`).
pub fn nearest_port<'a>(
    ports: &'a [DevicePort],
    local_rank: usize,
    gpu_bus_id: Option<&str>,
    sysfs: &Sysfs,
) -> Option<&'a DevicePort> {
    let gpu = gpu_bus_id.and_then(|b| sysfs.pci_path(b));
    choose_port(ports, local_rank, gpu.as_deref(), |n| {
        sysfs.ib_device_pci_path(n)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(device: &str) -> DevicePort {
        DevicePort {
            device: device.into(),
            port: 1,
            active: true,
            link_layer: crate::verbs::LinkLayer::InfiniBand,
            subnet_prefix: None,
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

    /// A fake sysfs: a GPU and mlx5_1 under one PCI switch, mlx5_0 and
    /// mlx5_2 on other root ports; removed on drop.
    struct FakeSysfs(PathBuf);

    impl FakeSysfs {
        fn new(tag: &str) -> FakeSysfs {
            let root = std::env::temp_dir().join(format!("sncl-topo-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            let dev = |p: &str| {
                let d = root.join("devices").join(p);
                std::fs::create_dir_all(&d).unwrap();
                d
            };
            let gpu = dev("pci0000:3a/0000:3a:00.0/0000:3b:00.0/0000:3c:00.0");
            let near = dev("pci0000:3a/0000:3a:00.0/0000:3b:00.0/0000:3d:00.0");
            let far = dev("pci0000:17/0000:17:00.0/0000:18:00.0");
            let far2 = dev("pci0000:85/0000:85:00.0/0000:86:00.0");
            let bus = root.join("bus/pci/devices");
            std::fs::create_dir_all(&bus).unwrap();
            for (bdf, d) in [
                ("0000:3c:00.0", &gpu),
                ("0000:3d:00.0", &near),
                ("0000:18:00.0", &far),
                ("0000:86:00.0", &far2),
            ] {
                std::os::unix::fs::symlink(d, bus.join(bdf)).unwrap();
            }
            for (name, d) in [("mlx5_0", &far), ("mlx5_1", &near), ("mlx5_2", &far2)] {
                let c = root.join("class/infiniband").join(name);
                std::fs::create_dir_all(&c).unwrap();
                std::os::unix::fs::symlink(d, c.join("device")).unwrap();
            }
            FakeSysfs(root)
        }
    }

    impl Drop for FakeSysfs {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_fake_sysfs_tree_picks_the_nic_under_the_gpus_switch() {
        let fake = FakeSysfs::new("nearest");
        let sysfs = Sysfs::at(&fake.0);
        let ports = [port("mlx5_0"), port("mlx5_1"), port("mlx5_2")];
        // As cuDeviceGetPCIBusId prints it, and as sysfs names it.
        for bus in ["00000000:3C:00.0", "0000:3c:00.0"] {
            for local_rank in 0..4 {
                let p = nearest_port(&ports, local_rank, Some(bus), &sysfs).unwrap();
                assert_eq!(p.device, "mlx5_1", "{bus}, local rank {local_rank}");
            }
        }
        // Without mlx5_1 allowed, the two others are equally far: ties are
        // shared out by local rank.
        let others = [port("mlx5_0"), port("mlx5_2")];
        let picks: Vec<&str> = (0..4)
            .map(|r| {
                let p = nearest_port(&others, r, Some("0000:3c:00.0"), &sysfs).unwrap();
                p.device.as_str()
            })
            .collect();
        assert_eq!(picks, ["mlx5_0", "mlx5_2", "mlx5_0", "mlx5_2"]);
        // A GPU sysfs does not know, or none: spread by local rank.
        for gpu in [Some("0000:99:00.0"), Some("../../etc"), None] {
            let picks: Vec<&str> = (0..3)
                .map(|r| {
                    nearest_port(&ports, r, gpu, &sysfs)
                        .unwrap()
                        .device
                        .as_str()
                })
                .collect();
            assert_eq!(picks, ["mlx5_0", "mlx5_1", "mlx5_2"], "{gpu:?}");
        }
    }

    #[test]
    fn the_table_is_read_from_sysfs_as_show_gids_reads_it() {
        let root = std::env::temp_dir().join(format!("sncl-gids-{}", std::process::id()));
        let port = root.join("class/infiniband/mlx5_0/ports/1");
        std::fs::create_dir_all(port.join("gids")).unwrap();
        std::fs::create_dir_all(port.join("gid_attrs/types")).unwrap();
        let rows = [
            (
                "fe80:0000:0000:0000:0000:0000:0001:0203",
                Some("IB/RoCE v1"),
            ),
            ("fe80:0000:0000:0000:0000:0000:0001:0203", Some("RoCE v2")),
            ("0000:0000:0000:0000:0000:0000:0000:0000", None),
            ("0000:0000:0000:0000:0000:ffff:c612:0002", Some("RoCE v2")),
        ];
        for (i, (gid, kind)) in rows.iter().enumerate() {
            std::fs::write(port.join("gids").join(i.to_string()), format!("{gid}\n")).unwrap();
            if let Some(k) = kind {
                std::fs::write(
                    port.join("gid_attrs/types").join(i.to_string()),
                    format!("{k}\n"),
                )
                .unwrap();
            }
        }
        let t = Sysfs::at(&root).gid_table("mlx5_0", 1);
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(t.iter().map(|e| e.index).collect::<Vec<_>>(), [0, 1, 3]);
        assert_eq!(t[2].kind, GidKind::RoceV2);
        assert_eq!(t[2].ipv4(), Some(std::net::Ipv4Addr::new(198, 18, 0, 2)));
        assert_eq!(
            crate::gid::choose_gid_index(&t, crate::verbs::LinkLayer::Ethernet, None).0,
            3
        );
        assert!(Sysfs::at("/nonexistent").gid_table("mlx5_0", 1).is_empty());
    }
}
