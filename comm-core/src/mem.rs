//! The executor's memory boundary. The executor reaches an operation's
//! memory only through the [`Memory`] trait. Its host implementation
//! (`sncl_runtime::exec::Buffers`, over the kernels) lives with the
//! executor; device memory in the root crate keeps the data on the device
//! and stages what crosses the host.

use crate::{DataType, ReduceOp};

use crate::error::Result;
use crate::schedule::{Op, Region};

/// What the executor needs of an operation's memory (input, output,
/// scratch and point-to-point buffers, addressed by [`Region`]s in elements
/// of `esize` bytes). Every method may fail (device memory reports device
/// errors); host memory never does.
///
/// Within one step of a schedule the executor calls [`Memory::copy`] for
/// the step's copies, then [`Memory::prepare_sends`] once, then moves data
/// piece by piece ([`Memory::with_piece`], [`Memory::write_at`],
/// [`Memory::reduce_at`]), then [`Memory::divide`] for the step's
/// finalisation. Regions a step sends are not written during that step.
pub trait Memory {
    /// Copies `src` to `dst` (equal lengths; nothing when they are the same
    /// memory; they may overlap).
    fn copy(&self, src: Region, dst: Region, esize: usize) -> Result<()>;

    /// Called once per step after its copies, before any of its sends: an
    /// implementation whose memory the host cannot read directly starts
    /// staging the regions the step sends here (it need not wait for the
    /// staging to finish: see [`Memory::with_piece`]). Host memory does
    /// nothing.
    fn prepare_sends(&self, _ops: &[Op], _esize: usize) -> Result<()> {
        Ok(())
    }

    /// Calls `f` with bytes `at..at + len` of `r` (a region this step
    /// sends) when they can be read now; `Ok(None)` (and `f` not called)
    /// when they cannot yet, because their staging copy is still in flight.
    /// The executor treats `None` like a transport with no room now: it
    /// tries again later, and the operation's deadline applies. Host memory
    /// is always ready.
    fn with_piece<R>(
        &self,
        r: Region,
        esize: usize,
        at: usize,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>>;

    /// Whether the slices [`Memory::with_piece`] hands out are the
    /// operation's memory itself, valid and unchanged until the step ends,
    /// so that a transport may lend them instead of copying
    /// ([`crate::transport::Outgoing::lent`]). Host buffers: yes. Device
    /// memory staged through pinned host memory: yes too, where a step's
    /// staged sends stay put until the step's sends have drained (the
    /// executor flushes every connection before the next step stages).
    fn pieces_outlive_step(&self) -> bool {
        false
    }

    /// Writes `data` (a received piece) at byte `at` of region `dst`.
    fn write_at(&self, dst: Region, esize: usize, at: usize, data: &[u8]) -> Result<()>;

    /// `dst[at..] = local[at..] op data` for one received piece.
    #[allow(clippy::too_many_arguments)]
    fn reduce_at(
        &self,
        local: Region,
        dst: Region,
        esize: usize,
        at: usize,
        data: &[u8],
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()>;

    /// `region[i] /= divisor` (the last step of `Avg`).
    fn divide(&self, region: Region, dtype: DataType, divisor: usize) -> Result<()>;

    /// Device memory only: the operation's device queue (its device and
    /// stream), as an opaque value a transport with a device path
    /// ([`crate::transport::DeviceRegion::queue`]) downcasts. Host memory: `None`,
    /// and the other `device_*` methods are never called.
    fn device_queue(&self) -> Option<&dyn std::any::Any> {
        None
    }

    /// Device memory only: the device address of bytes `at..at + len` of
    /// region `r` (bounds-checked). `Ok(None)` where the memory cannot
    /// name one (then the piece is staged through the host).
    fn device_span(
        &self,
        _r: Region,
        _esize: usize,
        _at: usize,
        _len: usize,
    ) -> Result<Option<u64>> {
        Ok(None)
    }

    /// Device memory only: enqueues, on the operation's stream, the use of
    /// a received piece of `len` bytes at device address `src` (a
    /// transport's inbox): `dst[at..] = piece` when `local` is `None`,
    /// else `dst[at..] = local[at..] op piece`. Returns `Ok(false)` where
    /// this memory has no device path (the default).
    #[allow(clippy::too_many_arguments)]
    fn device_recv(
        &self,
        _local: Option<Region>,
        _dst: Region,
        _esize: usize,
        _at: usize,
        _src: u64,
        _len: usize,
        _dtype: DataType,
        _op: ReduceOp,
    ) -> Result<bool> {
        Ok(false)
    }
}
