//! Strict mode's device checks at the calls that make queues and
//! registrations (the rules: [`super::DeviceProfile`]).

use super::{call_err, EmuVerbs};
use crate::ibv::attr::{mr_access, Registration};
use crate::verbs::Result;

impl EmuVerbs {
    /// Strict mode: `rule` applied to the device's profile; `op` names the
    /// call in the error.
    pub(super) fn check_profile(
        &self,
        op: &'static str,
        rule: impl FnOnce(&super::DeviceProfile) -> std::result::Result<(), String>,
    ) -> Result<()> {
        match &self.strict {
            Some(s) => rule(&s.profile).map_err(|e| call_err(op, e)),
            None => Ok(()),
        }
    }

    /// Strict mode: registration `r`'s access flags, as the real provider
    /// passes them, checked.
    pub(super) fn check_registration(&self, op: &'static str, r: Registration) -> Result<()> {
        self.check_profile(op, |p| p.check_mr_access(mr_access(r)))
    }
}
