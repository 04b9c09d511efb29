//! Deciding whether a pair goes device to device, in two published steps:
//! each side reads the peer's [`Board`], maps the peer's PCI bus id to a
//! device of its own process (`cuDeviceGetByPCIBusId`), judges whether it
//! can reach it (the same device, or peer access) and publishes that
//! [`Verdict`]; then each side reads the peer's verdict and both use the
//! AND. Every step returns at once (`Ok(false)`: not yet), so neither side
//! ever blocks on the other; the executor polls with its deadline.

use std::sync::Arc;

use comm_core::Error;
use device::{Backend, Device, DeviceBuffer, DeviceError, DevicePtr};

use crate::board::{self, Board, Verdict};
use crate::{LinkState, Mode, NvlinkConnection};

/// Between the two verdicts: what this side has found.
pub(crate) struct Judged {
    dev: Arc<dyn Device>,
    inbox: DeviceBuffer,
    theirs: Board,
    mine: Verdict,
    /// The peer's device as an ordinal of this process (where visible).
    peer_ordinal: Option<usize>,
}

impl NvlinkConnection {
    /// Advances the decision; `Ok(true)` once decided (or already).
    pub(crate) fn decide(&mut self) -> Result<bool, Error> {
        if let LinkState::Failed { error, .. } = &self.state {
            return Err(self.corrupt(error.clone()));
        }
        if matches!(self.state, LinkState::Published { .. }) && !self.judge()? {
            return Ok(false);
        }
        let LinkState::Judged(j) = &self.state else {
            return Ok(true);
        };
        let theirs = match Verdict::read(&self.out_board) {
            Ok(None) => return Ok(false),
            Ok(Some(v)) => Ok(v),
            Err(d) => Err(d),
        };
        let mine = j.mine;
        let LinkState::Judged(j) = std::mem::replace(&mut self.state, LinkState::Idle) else {
            unreachable!("matched above");
        };
        let j = *j;
        let theirs = match theirs {
            Ok(v) => v,
            Err(d) => return Err(self.fail(j.inbox, self.corrupt(d))),
        };
        if mine == Verdict::Reach && theirs == Verdict::Reach {
            return match self.connect(&j) {
                Ok((peer_inbox, imported)) => {
                    let active = self.active(j.dev, j.inbox, &j.theirs, peer_inbox, imported);
                    self.state = LinkState::Decided(Some(Box::new(active)));
                    Ok(true)
                }
                Err(e) => Err(self.fail(j.inbox, e)),
            };
        }
        if self.mode == Mode::Required {
            let e = Error::InvalidArgument {
                rank: self.rank,
                op: "nvlink transport",
                detail: format!(
                    "SNCL_NVLINK=1 requires the device path with peer rank {}, and it cannot be \
                     used: this rank {}; peer rank {} {} (this device {}, the peer's {:?})",
                    self.peer,
                    mine.describe(),
                    self.peer,
                    theirs.describe(),
                    bus_id_of(&*j.dev),
                    j.theirs.bus_id
                ),
            };
            return Err(self.fail(j.inbox, e));
        }
        tracing::info!(
            rank = self.rank,
            peer = self.peer,
            ours = mine.describe(),
            theirs = theirs.describe(),
            "nvlink: device pieces are staged through the host"
        );
        // Our inbox stays allocated until the connection is dropped, in
        // case the peer mapped it.
        self.retired = Some(j.inbox);
        self.state = LinkState::Decided(None);
        Ok(true)
    }

    /// Keeps the inbox until drop and remembers the error.
    fn fail(&mut self, inbox: DeviceBuffer, e: Error) -> Error {
        self.state = LinkState::Failed {
            _inbox: inbox,
            error: e.to_string(),
        };
        e
    }

    /// Reads the peer's board and publishes this side's verdict; `Ok(false)`
    /// while the board is not there. A failure publishes
    /// [`Verdict::Failed`] (so the peer does not wait for a verdict) and is
    /// returned.
    fn judge(&mut self) -> Result<bool, Error> {
        let theirs = match Board::read(&self.out_board) {
            Ok(None) => return Ok(false),
            Ok(Some(b)) => Ok(b),
            Err(d) => Err(self.corrupt(d)),
        };
        let LinkState::Published { dev, inbox } =
            std::mem::replace(&mut self.state, LinkState::Idle)
        else {
            unreachable!("judge runs in the Published state");
        };
        let judged = theirs.and_then(|theirs| {
            if self.out_ring.slots() != theirs.slots as u64 {
                return Err(self.corrupt(format!(
                    "the peer's board says {} inbox slots, its descriptor ring has {}",
                    theirs.slots,
                    self.out_ring.slots()
                )));
            }
            let (mine, peer_ordinal) = self.verdict(&theirs, &*dev)?;
            Ok((theirs, mine, peer_ordinal))
        });
        match judged {
            Ok((theirs, mine, peer_ordinal)) => {
                mine.publish(&self.inbound.board);
                tracing::debug!(rank = self.rank, peer = self.peer, verdict = ?mine,
                    peer_bus_id = %theirs.bus_id, "nvlink: verdict published");
                self.state = LinkState::Judged(Box::new(Judged {
                    dev,
                    inbox,
                    theirs,
                    mine,
                    peer_ordinal,
                }));
                Ok(true)
            }
            Err(e) => {
                Verdict::Failed.publish(&self.inbound.board);
                Err(self.fail(inbox, e))
            }
        }
    }

    /// This side's verdict on the peer's device.
    fn verdict(&self, theirs: &Board, dev: &dyn Device) -> Result<(Verdict, Option<usize>), Error> {
        if theirs.backend != dev.backend() {
            return Ok((Verdict::OtherBackend, None));
        }
        if theirs.bus_id.is_empty() {
            return Ok((Verdict::NotVisible, None));
        }
        let local = match dev.ordinal_of_pci_bus_id(&theirs.bus_id) {
            Ok(Some(o)) => o,
            Ok(None) | Err(DeviceError::Unsupported { .. }) => {
                return Ok((Verdict::NotVisible, None))
            }
            Err(e) => return Err(self.device_err(dev, "finding the peer's device by bus id", e)),
        };
        if local == dev.ordinal() {
            return Ok((Verdict::Reach, Some(local)));
        }
        match dev.can_access_peer(local) {
            Ok(true) => Ok((Verdict::Reach, Some(local))),
            Ok(false) => Ok((Verdict::NoPeerAccess, Some(local))),
            Err(e) => Err(self.device_err(dev, "querying peer access", e)),
        }
    }

    /// Both sides can: enables peer access and maps the peer's inbox.
    /// Returns it as mapped here and whether it was imported.
    fn connect(&self, j: &Judged) -> Result<(DevicePtr, bool), Error> {
        let dev = &*j.dev;
        let local = j.peer_ordinal.unwrap_or(dev.ordinal());
        let same_process = j.theirs.token == board::process_token();
        if local == dev.ordinal() && !same_process {
            tracing::warn!(rank = self.rank, peer = self.peer, backend = dev.backend().name(),
                bus_id = %j.theirs.bus_id,
                "nvlink: this rank and its peer share one device (allowed; their work time-slices the device)");
        }
        dev.enable_peer_access(local)
            .map_err(|e| self.device_err(dev, "enabling peer access", e))?;
        // CUDA cannot open its own process's IPC handle; within a process
        // the address is valid as it is. The emulated device maps every
        // allocation anew (its addresses are per device object).
        if same_process && dev.backend() == Backend::Cuda {
            return Ok((DevicePtr(j.theirs.addr), false));
        }
        let p = dev.ipc_import(&j.theirs.handle).map_err(|e| {
            // A peer that exited took its inbox with it: that is the peer's
            // failure (named as such to every rank), not this device's.
            if !transport_shm::pid_alive(j.theirs.pid) {
                return self.peer_err(comm_core::transport::TransportError::PeerGone {
                    peer: self.peer,
                    detail: format!(
                        "process {} exited before its device inbox was opened ({e})",
                        j.theirs.pid
                    ),
                });
            }
            self.device_err(dev, "opening the peer's device inbox", e)
        })?;
        Ok((p, true))
    }
}

fn bus_id_of(dev: &dyn Device) -> String {
    dev.pci_bus_id()
        .map(|s| format!("{s:?}"))
        .unwrap_or_else(|_| "without a bus id".into())
}
