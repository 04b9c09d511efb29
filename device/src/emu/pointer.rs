//! [`Device::pointer_kind`](crate::Device::pointer_kind) on the emulated
//! device: its address registry answers.

use super::device::Emu;
use super::memory::split;
use crate::{DevicePtr, PointerKind};

/// The kind of `addr` for this device object: its own live allocation
/// (device memory), an emulated address it does not hold (freed, or another
/// device object's), or host memory (anything outside the emulated space).
pub(super) fn kind(emu: &Emu, addr: u64) -> PointerKind {
    let ptr = DevicePtr(addr);
    if split(ptr).is_err() {
        return PointerKind::Host;
    }
    match emu.memory.span(ptr, 0) {
        Ok(_) => PointerKind::Device {
            ordinal: emu.ordinal,
        },
        Err(detail) => PointerKind::Stale { detail },
    }
}

#[cfg(test)]
mod tests {
    use crate::PointerKind;

    #[test]
    fn live_freed_foreign_and_host_addresses() {
        let a = crate::emu::open(1).unwrap();
        let b = crate::emu::open(1).unwrap();
        let p = a.alloc(64).unwrap();
        assert_eq!(
            a.pointer_kind(p.0).unwrap(),
            PointerKind::Device { ordinal: 1 }
        );
        assert_eq!(
            a.pointer_kind(p.add(63).0).unwrap(),
            PointerKind::Device { ordinal: 1 }
        );
        // Another device object's allocation is not this one's.
        assert!(matches!(
            b.pointer_kind(p.0).unwrap(),
            PointerKind::Stale { .. }
        ));
        let host = [0u8; 4];
        assert_eq!(
            a.pointer_kind(host.as_ptr() as u64).unwrap(),
            PointerKind::Host
        );
        assert_eq!(a.pointer_kind(0).unwrap(), PointerKind::Host);
        // SAFETY: allocated above, freed once, unused.
        unsafe { a.free(p) }.unwrap();
        match a.pointer_kind(p.0).unwrap() {
            PointerKind::Stale { detail } => assert!(detail.contains("not"), "{detail}"),
            k => panic!("a freed address is {k:?}"),
        }
    }
}
