//! Strict mode's device: a ConnectX-7's limits as `ibv_devinfo -v` lists
//! them, and the kernel's access rules for memory registrations.
//!
//! * **Limits** (ibv_create_cq(3): `cqe` at most the device's `max_cqe`;
//!   ibv_create_qp(3): the requested capabilities within `max_qp_wr`,
//!   `max_sge` and `max_inline_data`, else EINVAL): a request above them
//!   fails where the permissive emulation takes it.
//! * **Access** (`ib_check_mr_access` in include/rdma/ib_verbs.h, which
//!   ibv_reg_mr(3) and ibv_reg_dmabuf_mr reach): remote write or remote
//!   atomic access without local write is EINVAL; on-demand paging on a
//!   device without it is EOPNOTSUPP. The flags checked are the ones the
//!   real provider passes ([`crate::ibv::attr::mr_access`]).
//! * **Responder access** (ibv_modify_qp(3), `qp_access_flags`; ibv_poll_cq(3),
//!   `IBV_WC_REM_ACCESS_ERR`): a WRITE into a QP whose INIT did not grant
//!   `IBV_ACCESS_REMOTE_WRITE` fails at the requester with a remote access
//!   error (`qp_rules::answer`).

use std::ffi::c_int;

use crate::ibv::ffi;

/// The limits and capabilities of the strict emulated device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceProfile {
    /// `max_qp_wr`: work requests per send or receive queue.
    pub max_qp_wr: u32,
    /// `max_cqe`: entries per completion queue.
    pub max_cqe: usize,
    /// Whether the device pages on demand (`IBV_ODP_SUPPORT`).
    pub on_demand: bool,
}

impl DeviceProfile {
    /// A ConnectX-7 (mlx5): 32768 work requests per queue, 4194303
    /// completion-queue entries, on-demand paging.
    pub const CONNECTX7: DeviceProfile = DeviceProfile {
        max_qp_wr: 32768,
        max_cqe: 4_194_303,
        on_demand: true,
    };

    /// Checks `ibv_create_cq(cqe = depth)`.
    pub(super) fn check_cq(&self, depth: usize) -> std::result::Result<(), String> {
        if depth > self.max_cqe {
            return Err(format!(
                "Invalid argument (EINVAL): {depth} entries exceed the device's max_cqe {}",
                self.max_cqe
            ));
        }
        Ok(())
    }

    /// Checks `ibv_create_qp` with `max_send_wr` / `max_recv_wr`.
    pub(super) fn check_qp(&self, max_send: u32, max_recv: u32) -> std::result::Result<(), String> {
        if max_send.max(max_recv) > self.max_qp_wr {
            return Err(format!(
                "Invalid argument (EINVAL): max_send_wr {max_send} / max_recv_wr {max_recv} \
                 exceed the device's max_qp_wr {}",
                self.max_qp_wr
            ));
        }
        Ok(())
    }

    /// Checks a registration's access flags as `ib_check_mr_access` does.
    pub(super) fn check_mr_access(&self, access: c_int) -> std::result::Result<(), String> {
        let remote = ffi::ACCESS_REMOTE_WRITE | ffi::ACCESS_REMOTE_ATOMIC;
        if access & remote != 0 && access & ffi::ACCESS_LOCAL_WRITE == 0 {
            return Err(format!(
                "Invalid argument (EINVAL): access {access:#x} grants remote write or atomic \
                 access without IBV_ACCESS_LOCAL_WRITE"
            ));
        }
        if access & ffi::ACCESS_ON_DEMAND != 0 && !self.on_demand {
            return Err(
                "Operation not supported (EOPNOTSUPP): the device does not page on demand \
                 (IBV_ACCESS_ON_DEMAND)"
                    .into(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ibv::attr::{mr_access, Registration};

    #[test]
    fn limits_and_access_rules() {
        let p = DeviceProfile::CONNECTX7;
        assert!(p.check_cq(4_194_303).is_ok());
        assert!(p.check_cq(4_194_304).unwrap_err().contains("max_cqe"));
        assert!(p.check_qp(32768, 1).is_ok());
        assert!(p.check_qp(1, 32769).unwrap_err().contains("max_qp_wr"));
        // Every registration the real provider makes passes on a CX-7.
        for r in [
            Registration::Staging,
            Registration::DmaBuf,
            Registration::UserSource { on_demand: false },
            Registration::UserSource { on_demand: true },
        ] {
            p.check_mr_access(mr_access(r))
                .unwrap_or_else(|e| panic!("{r:?}: {e}"));
        }
        let e = p.check_mr_access(2).unwrap_err();
        assert!(e.contains("EINVAL") && e.contains("LOCAL_WRITE"), "{e}");
        assert!(p.check_mr_access(ffi::ACCESS_REMOTE_ATOMIC).is_err());
        let no_odp = DeviceProfile {
            on_demand: false,
            ..p
        };
        let odp = mr_access(Registration::UserSource { on_demand: true });
        assert!(no_odp
            .check_mr_access(odp)
            .unwrap_err()
            .contains("EOPNOTSUPP"));
        assert!(no_odp
            .check_mr_access(mr_access(Registration::Staging))
            .is_ok());
    }
}
