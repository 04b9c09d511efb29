//! The thread's context scope ([`crate::Device::enter`], [`crate::Entered`]):
//! which context a live scope made current on this thread, so that the
//! calls inside it skip their own check.

use std::cell::Cell;

thread_local! {
    /// The context a live [`crate::Entered`] scope made current on this
    /// thread (its address; 0: no scope).
    static ENTERED: Cell<usize> = const { Cell::new(0) };
}

/// The context of this thread's innermost live scope (0: none).
pub(crate) fn entered() -> usize {
    ENTERED.with(Cell::get)
}

/// Opens a scope for context `ctx`; the scope it nests in.
pub(crate) fn enter(ctx: usize) -> usize {
    ENTERED.with(|e| e.replace(ctx))
}

/// Ends a scope, back to `outer`.
pub(crate) fn leave(outer: usize) {
    ENTERED.with(|e| e.set(outer));
}
