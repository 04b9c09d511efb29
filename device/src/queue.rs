//! [`DeviceQueue`]: what the executor hands a device link for one
//! operation.

use std::sync::Arc;

use crate::{Device, StreamHandle};

/// The operation's device and stream, as the runtime's device memory hands
/// it to the executor (`comm_core::mem::Memory::device_queue`) and the
/// executor to device links (`transport-nvlink`, GPUDirect RDMA in
/// `transport-rdma`), which downcast it from `&dyn Any`.
#[derive(Clone, Debug)]
pub struct DeviceQueue {
    /// The communicator's device.
    pub dev: Arc<dyn Device>,
    /// The stream the operation runs on.
    pub stream: StreamHandle,
}
