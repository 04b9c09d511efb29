//! Devices and contexts, and the current context of each host thread.
//!
//! Rules (CUDA Driver API, "Context Management" and "Primary Context
//! Management"):
//! * every driver call but initialisation, device queries and context
//!   management needs `cuInit` first (`CUDA_ERROR_NOT_INITIALIZED`);
//! * a call that works in a context uses the calling thread's current
//!   context: the top of its context stack (`cuCtxSetCurrent` replaces the
//!   top, `cuCtxPushCurrent` / `cuCtxPopCurrent` push and pop); with none
//!   current the call fails with `CUDA_ERROR_INVALID_CONTEXT`;
//! * the primary context of a device is reference counted by
//!   `cuDevicePrimaryCtxRetain` / `cuDevicePrimaryCtxRelease`; when the
//!   count reaches zero the context is destroyed, and a thread that still
//!   has it current gets `CUDA_ERROR_CONTEXT_IS_DESTROYED`.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::handles::{lock, Table};
use crate::{config, CUresult, Res};

/// A context: a device's address space for streams, modules and memory.
pub struct Context {
    /// The handle the caller holds (`CUcontext`).
    pub handle: u64,
    /// The device ordinal.
    pub device: usize,
    /// Whether this is the device's primary context.
    pub primary: bool,
    destroyed: AtomicBool,
}

impl Context {
    /// Whether the context has been destroyed.
    pub fn is_destroyed(&self) -> bool {
        self.destroyed.load(Ordering::Acquire)
    }
}

/// Every live context.
pub static CONTEXTS: Table<Context> = Table::new(0x00c0_0000_0000);

static INITIALISED: AtomicBool = AtomicBool::new(false);

/// Primary context of each device: (retain count, the context).
type Primary = Mutex<(u32, Option<Arc<Context>>)>;

fn primaries() -> &'static Vec<Primary> {
    static P: OnceLock<Vec<Primary>> = OnceLock::new();
    P.get_or_init(|| {
        (0..config::get().devices)
            .map(|_| Mutex::new((0, None)))
            .collect()
    })
}

thread_local! {
    /// This host thread's context stack (top = current), as handles.
    static STACK: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// `cuInit`.
pub fn init(flags: u32) -> Res<()> {
    if flags != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    INITIALISED.store(true, Ordering::Release);
    Ok(())
}

/// `CUDA_ERROR_NOT_INITIALIZED` before `cuInit`.
pub fn initialised() -> Res<()> {
    if INITIALISED.load(Ordering::Acquire) {
        Ok(())
    } else {
        Err(CUresult::CUDA_ERROR_NOT_INITIALIZED)
    }
}

/// Checks a `CUdevice` (an ordinal).
pub fn device(dev: i32) -> Res<usize> {
    initialised()?;
    usize::try_from(dev)
        .ok()
        .filter(|d| *d < config::get().devices)
        .ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)
}

fn new_context(device: usize, primary: bool) -> Arc<Context> {
    CONTEXTS
        .insert_with(|handle| {
            Arc::new(Context {
                handle,
                device,
                primary,
                destroyed: AtomicBool::new(false),
            })
        })
        .1
}

/// `cuDevicePrimaryCtxRetain`.
pub fn primary_retain(dev: i32) -> Res<u64> {
    let d = device(dev)?;
    let mut p = lock(&primaries()[d]);
    let ctx = match &p.1 {
        Some(c) => c.clone(),
        None => {
            let c = new_context(d, true);
            p.1 = Some(c.clone());
            c
        }
    };
    p.0 += 1;
    Ok(ctx.handle)
}

/// `cuDevicePrimaryCtxRelease`: `CUDA_ERROR_INVALID_CONTEXT` when the
/// primary context is not retained. The handle of the context destroyed
/// when the count reached zero.
pub fn primary_release(dev: i32) -> Res<Option<u64>> {
    let d = device(dev)?;
    let mut p = lock(&primaries()[d]);
    if p.0 == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
    }
    p.0 -= 1;
    if p.0 == 0 {
        if let Some(c) = p.1.take() {
            destroy(&c);
            return Ok(Some(c.handle));
        }
    }
    Ok(None)
}

/// `cuDevicePrimaryCtxGetState`: (retain count, active).
pub fn primary_state(dev: i32) -> Res<(u32, bool)> {
    let d = device(dev)?;
    let p = lock(&primaries()[d]);
    Ok((p.0, p.1.is_some()))
}

/// `cuCtxCreate`: a new context, pushed on the calling thread's stack.
pub fn create(dev: i32) -> Res<u64> {
    let d = device(dev)?;
    let c = new_context(d, false);
    STACK.with(|s| s.borrow_mut().push(c.handle));
    Ok(c.handle)
}

/// `cuCtxDestroy`: a primary context cannot be destroyed this way;
/// `before` runs first (the caller waits for the context's streams).
pub fn destroy_handle(h: u64, before: impl FnOnce(&Context) -> Res<()>) -> Res<()> {
    initialised()?;
    let c = CONTEXTS.get(h)?;
    if c.primary {
        return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
    }
    before(&c)?;
    destroy(&c);
    STACK.with(|s| s.borrow_mut().retain(|x| *x != h));
    Ok(())
}

fn destroy(c: &Arc<Context>) {
    c.destroyed.store(true, Ordering::Release);
    let _ = CONTEXTS.remove(c.handle);
    crate::memory::release_context(c.handle);
}

/// The context of handle `h` (not destroyed).
pub fn by_handle(h: u64) -> Res<Arc<Context>> {
    initialised()?;
    let c = CONTEXTS
        .get(h)
        .map_err(|_| CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
    if c.is_destroyed() {
        return Err(CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED);
    }
    Ok(c)
}

/// The calling thread's current context, or `CUDA_ERROR_INVALID_CONTEXT`
/// (`CUDA_ERROR_CONTEXT_IS_DESTROYED` when it was destroyed meanwhile).
pub fn current() -> Res<Arc<Context>> {
    initialised()?;
    let top = STACK.with(|s| s.borrow().last().copied());
    match top {
        None => Err(CUresult::CUDA_ERROR_INVALID_CONTEXT),
        Some(h) => CONTEXTS
            .get(h)
            .map_err(|_| CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED),
    }
}

/// The current context's handle, or 0 when none is current.
pub fn current_handle() -> Res<u64> {
    initialised()?;
    Ok(STACK.with(|s| s.borrow().last().copied()).unwrap_or(0))
}

/// `cuCtxSetCurrent`: replaces the top of the stack; null pops it.
pub fn set_current(h: u64) -> Res<()> {
    initialised()?;
    if h == 0 {
        STACK.with(|s| s.borrow_mut().pop());
        return Ok(());
    }
    by_handle(h)?;
    STACK.with(|s| {
        let mut s = s.borrow_mut();
        match s.last_mut() {
            Some(top) => *top = h,
            None => s.push(h),
        }
    });
    Ok(())
}

/// `cuCtxPushCurrent`.
pub fn push(h: u64) -> Res<()> {
    by_handle(h)?;
    STACK.with(|s| s.borrow_mut().push(h));
    Ok(())
}

/// `cuCtxPopCurrent`: the popped handle; `CUDA_ERROR_INVALID_CONTEXT`
/// with an empty stack.
pub fn pop() -> Res<u64> {
    initialised()?;
    STACK
        .with(|s| s.borrow_mut().pop())
        .ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)
}

/// Every live context of device `d`.
pub fn of_device(d: usize) -> Vec<Arc<Context>> {
    CONTEXTS
        .all()
        .into_iter()
        .filter(|c| c.device == d && !c.is_destroyed())
        .collect()
}
