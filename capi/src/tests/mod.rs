//! The crate's Rust-side tests (tests/ holds the C programs; it cannot
//! link this crate, which has no rlib).

// The workspace's test kits (they name the Rust API `sncl`: see lib.rs).
#[path = "../../../tests/fault_kit/mod.rs"]
mod fault_kit;
#[path = "../../../tests/rank_kit/mod.rs"]
mod rank_kit;

mod faults;
mod fuzz;
mod grow;
mod in_process;
mod settings;
mod suspend;

#[test]
fn handles_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<super::comm::CommShared>();
    send_sync::<super::stream::StreamShared>();
}
