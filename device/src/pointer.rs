//! What memory an address is: [`PointerKind`], the answer of
//! [`Device::pointer_kind`](crate::Device::pointer_kind). The C ABI asks it
//! for every buffer, to run an operation on the device path or the host path.

/// What memory an address points to, as one backend sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PointerKind {
    /// Host memory the host can read and write directly: pageable memory, or
    /// page-locked / registered host memory.
    Host,
    /// Device memory (CUDA: also managed memory) of the device with this
    /// ordinal of the same backend.
    Device {
        /// The owning device's ordinal.
        ordinal: usize,
    },
    /// An address in this backend's device address space that is no live
    /// allocation it knows: freed, or (emulated device) made by another
    /// device object. Never safe to touch.
    Stale {
        /// Why, for the error message.
        detail: String,
    },
}

impl PointerKind {
    /// Whether the address is device memory (of any ordinal).
    pub fn is_device(&self) -> bool {
        matches!(self, PointerKind::Device { .. })
    }
}
