//! The device side of the runtime: what a communicator bound to a device
//! keeps and what the executor runs over device memory with.
//!
//! * [`binding::Binding`]: the device, the operations' internal stream, the
//!   pinned flag callers' streams wait on, the staging reused across
//!   operations, and what the binding counts. Binding loads every kernel
//!   and allocates the staging, so that no operation later loads, allocates
//!   or frees (each may synchronise the device);
//! * [`memory::DeviceMemory`]: the executor's [`crate::exec::Memory`] over
//!   device buffers, keeping the data on the device and staging only what
//!   crosses the network through pinned memory;
//! * [`segment::Segments`]: operations larger than the staging cut into
//!   segments;
//! * [`errors::device_error`]: device errors as sncl errors naming the
//!   rank, the operation and the device.

pub mod binding;
pub mod errors;
pub mod memory;
pub mod segment;
