//! What one process sees of the emulated machine: how many devices there
//! are, which of them its ordinals name, whether they reach each other, and
//! their PCI bus ids.

/// How many emulated devices there are.
pub const DEVICES: usize = 8;

/// What one process sees of the emulated machine, as `CUDA_VISIBLE_DEVICES`
/// and the topology decide it on CUDA (tests of nvlink's automatic choice).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Visibility {
    /// `visible[i]` is the emulated device (below [`DEVICES`]) that ordinal
    /// `i` names in this process; its PCI bus id is that device's.
    pub visible: Vec<usize>,
    /// Whether devices have peer access to each other (the same device
    /// always has).
    pub peer_access: bool,
}

impl Default for Visibility {
    /// Every emulated device at its own ordinal, with peer access.
    fn default() -> Self {
        Visibility {
            visible: (0..DEVICES).collect(),
            peer_access: true,
        }
    }
}

/// The fake PCI bus id of emulated device `physical`: stable, one per
/// emulated device, in CUDA's format.
pub fn pci_bus_id_of(physical: usize) -> String {
    format!("0000:{:02X}:00.0", 0xE0 + physical)
}
