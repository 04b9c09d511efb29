//! The communicator's host windows as data: each window's own region and
//! its same-node peers' mappings, every rank's control record, and the
//! buffers of a direct all-reduce. What runs over them is `window.rs`.

use std::hash::{Hash, Hasher};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Weak};

use comm_core::wire::Fingerprint;
use transport_shm::region::Region;

/// The words of a rank's control record, written by that rank only.
#[derive(Clone, Copy)]
pub(super) enum Word {
    /// Sequence number whose offer (the words below) is complete.
    Offer = 0,
    /// Sequence number whose own slice is reduced in the output.
    Reduced = 1,
    /// Sequence number for which this rank read everything it needed.
    Done = 2,
    /// Window id + 1 of the op's input, 0 when the op does not offer
    /// windows.
    SendWindow = 3,
    /// Offset of the input in its window.
    SendOffset = 4,
    /// Window id + 1 of the op's output.
    RecvWindow = 5,
    /// Offset of the output in its window.
    RecvOffset = 6,
    /// Hash of the op's fingerprint.
    Fingerprint = 7,
}

/// One window as this rank sees it: its own region and its same-node
/// peers' mappings.
pub(crate) struct WindowShared {
    /// Id, the same on every rank (windows are allocated collectively).
    pub id: u64,
    pub(super) own: Region,
    /// Peers' regions by rank (`None`: this rank, or another node).
    pub(super) peers: Vec<Option<Region>>,
}

impl WindowShared {
    /// The first byte of this rank's window.
    pub fn as_ptr(&self) -> *mut u8 {
        self.own.as_ptr()
    }

    /// Bytes in the window.
    pub fn len(&self) -> usize {
        self.own.len()
    }

    /// Rank `r`'s region (this rank's own for `me`).
    pub(super) fn region(&self, r: usize, me: usize) -> Option<&Region> {
        if r == me {
            Some(&self.own)
        } else {
            self.peers.get(r).and_then(Option::as_ref)
        }
    }
}

/// Every rank's control record (see [`Word`]).
pub(crate) struct Control {
    pub(super) own: Region,
    pub(super) peers: Vec<Option<Region>>,
}

impl Control {
    pub(super) fn word(&self, r: usize, me: usize, w: Word) -> &AtomicU64 {
        let region = if r == me {
            &self.own
        } else {
            // Present for every rank: offers only run where all ranks share
            // this node, and `alloc_window` mapped every same-node peer.
            self.peers[r]
                .as_ref()
                .expect("a same-node peer's control record")
        };
        // SAFETY: the region is page-aligned and CONTROL_BYTES (≥ 8 words
        // of 8 bytes; `window.rs`) long, so the word is aligned and in bounds; shared words are
        // only accessed atomically, by this process and its peers.
        unsafe { &*(region.as_ptr().add(w as usize * 8) as *const AtomicU64) }
    }
}

/// The communicator's windows.
#[derive(Default)]
pub(crate) struct Windows {
    pub(super) next_id: u64,
    pub(super) control: Option<Arc<Control>>,
    pub(super) live: Vec<Weak<WindowShared>>,
}

/// A direct all-reduce's buffers: windows and offsets (the same on every
/// rank).
pub(super) struct Direct {
    pub(super) send_win: Arc<WindowShared>,
    pub(super) send_off: usize,
    pub(super) recv_win: Arc<WindowShared>,
    pub(super) recv_off: usize,
}

pub(super) fn fingerprint_hash(f: &Fingerprint) -> u64 {
    // SipHash with fixed keys: the same value on every rank of one build.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    f.hash(&mut h);
    h.finish() | 1
}
