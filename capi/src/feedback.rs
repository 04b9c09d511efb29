//! Error feedback for the compressed all-reduce (sncl extension): a handle
//! that carries, from one `snclAllReduceCompressedFeedback` to the next,
//! what the codec dropped of this rank's data (`sncl::ErrorFeedback`), so
//! that nothing is lost over time. One handle per tensor (per DDP bucket),
//! used by one operation at a time.
//!
//! Handles are ids in a table, not pointers: a destroyed, foreign or
//! mistyped handle is `snclInvalidArgument`, never undefined behaviour. An
//! operation keeps its own reference, so destroying a handle while an
//! operation that uses it is queued is safe (the operation still updates
//! it; the update is then lost with it).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use sncl_rs::ErrorFeedback;

use crate::error::{guard, CError};
use crate::types::snclResult_t;

/// Opaque error-feedback state, never defined (the handle is an id).
#[repr(C)]
pub struct snclErrorFeedback {
    _private: u8,
}

/// Handle to the error-feedback state of one tensor
/// (`snclErrorFeedbackCreate`).
pub type snclErrorFeedback_t = *mut snclErrorFeedback;

/// One tensor's feedback, shared by its handle and the operations using it.
pub(crate) type SharedFeedback = Arc<Mutex<ErrorFeedback>>;

/// The live handles: id → state (ids start at 1 and are never reused).
struct Table {
    next: usize,
    live: HashMap<usize, SharedFeedback>,
}

static TABLE: Mutex<Option<Table>> = Mutex::new(None);

fn table() -> MutexGuard<'static, Option<Table>> {
    TABLE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The state behind `handle` (NULL: none).
pub(crate) fn feedback_arg(handle: snclErrorFeedback_t) -> Result<Option<SharedFeedback>, CError> {
    if handle.is_null() {
        return Ok(None);
    }
    let id = handle as usize;
    table()
        .as_ref()
        .and_then(|t| t.live.get(&id).cloned())
        .map(Some)
        .ok_or_else(|| {
            CError::invalid(format!(
                "error-feedback handle {id:#x} is not live (destroyed, or not made by \
                 snclErrorFeedbackCreate)"
            ))
        })
}

/// Creates an empty error-feedback state (sized by its first use) and
/// writes its handle to `*feedback`.
///
/// # Safety
/// `feedback` is NULL (refused) or points to writable storage for a handle.
#[no_mangle]
pub unsafe extern "C" fn snclErrorFeedbackCreate(
    feedback: *mut snclErrorFeedback_t,
) -> snclResult_t {
    guard(|| {
        if feedback.is_null() {
            return Err(CError::invalid("feedback is NULL"));
        }
        let mut t = table();
        let t = t.get_or_insert_with(|| Table {
            next: 1,
            live: HashMap::new(),
        });
        let id = t.next;
        t.next += 1;
        t.live
            .insert(id, Arc::new(Mutex::new(ErrorFeedback::new(0))));
        // SAFETY: checked non-NULL; the caller provides storage.
        unsafe { feedback.write(id as snclErrorFeedback_t) };
        Ok(snclResult_t::snclSuccess)
    })
}

/// Destroys an error-feedback state; NULL is a no-op. Operations already
/// queued with it keep their reference and finish normally.
///
/// # Safety
/// None beyond passing a handle (a stale one is `snclInvalidArgument`).
#[no_mangle]
pub unsafe extern "C" fn snclErrorFeedbackDestroy(feedback: snclErrorFeedback_t) -> snclResult_t {
    guard(|| {
        if feedback.is_null() {
            return Ok(snclResult_t::snclSuccess);
        }
        let id = feedback as usize;
        match table().as_mut().and_then(|t| t.live.remove(&id)) {
            Some(_) => Ok(snclResult_t::snclSuccess),
            None => Err(CError::invalid(format!(
                "error-feedback handle {id:#x} is not live (destroyed twice, or not made by \
                 snclErrorFeedbackCreate)"
            ))),
        }
    })
}
