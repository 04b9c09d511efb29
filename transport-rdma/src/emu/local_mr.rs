//! A registration the emulated NIC holds (`LocalMr`): what backs it
//! (a region file peers write into, a dma-buf's mapping, or the user's
//! memory), its keys and bounds, and what strict mode tracks of it.

use std::sync::Arc;

use super::shared::LocalRegion;
use super::{odp, stale_pages};
use crate::verbs::Mr;

pub(super) struct LocalMr {
    /// The shared-memory file peers write into; `None` for a user
    /// registration ([`crate::verbs::Verbs::reg_user_mr`]), which is only ever read
    /// locally, at the address it names.
    pub(super) region: Option<Arc<LocalRegion>>,
    /// A dma-buf registration ([`crate::verbs::Verbs::reg_dmabuf_mr`]): the dma-buf's
    /// file as mapped here, and where the region starts in it (`region`
    /// is then its descriptor, with no bytes of its own).
    pub(super) dmabuf: Option<(Arc<memmap2::MmapRaw>, usize)>,
    pub(super) mr: Mr,
    /// Bytes strict mode charged as pinned (0 otherwise).
    pub(super) pinned: u64,
    /// An on-demand registration (`ibv_advise_mr` takes only these).
    pub(super) on_demand: bool,
    /// Strict mode, on demand: which pages the NIC has translated
    /// (`odp.rs`).
    pub(super) odp: Option<odp::OdpPages>,
    /// Strict mode, a pinned user registration: the pages it holds
    /// (`stale_pages.rs`).
    pub(super) pinned_pages: Option<stale_pages::PinnedPages>,
}

impl LocalMr {
    /// A registration backed by `region` (its own bytes, or a dma-buf's
    /// descriptor with `dmabuf` mapped), pinned bytes charged: `pinned`.
    pub(super) fn of_region(
        mr: Mr,
        region: LocalRegion,
        dmabuf: Option<(Arc<memmap2::MmapRaw>, usize)>,
        pinned: u64,
    ) -> LocalMr {
        LocalMr {
            region: Some(Arc::new(region)),
            dmabuf,
            mr,
            pinned,
            on_demand: false,
            odp: None,
            pinned_pages: None,
        }
    }
}
