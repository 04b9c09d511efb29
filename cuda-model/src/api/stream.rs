//! Stream, event, stream-memory-operation, capture and graph entry points.

use std::ffi::{c_int, c_uint, c_void};

use cudarc::driver::sys::CUipcEventHandle;

use super::{h, out, ptr, run};
use crate::stream::{self, Op, Stream};
use crate::{event, graph, ipc, memops, CUresult};

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(s: *mut *mut c_void, flags: c_uint) -> CUresult {
    run("cuStreamCreate", || out(s, ptr(stream::create(flags)?)))
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    s: *mut *mut c_void,
    flags: c_uint,
    _priority: c_int,
) -> CUresult {
    cuStreamCreate(s, flags)
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy_v2(s: *mut c_void) -> CUresult {
    run("cuStreamDestroy", || stream::destroy(h(s)))
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuStreamQuery(s: *mut c_void) -> CUresult {
    run("cuStreamQuery", || {
        let st = stream::resolve(h(s))?;
        stream::refuse_on_capturing(&st)?;
        if st.query()? {
            Ok(())
        } else {
            Err(CUresult::CUDA_ERROR_NOT_READY)
        }
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(s: *mut c_void) -> CUresult {
    run("cuStreamSynchronize", || {
        let st = stream::resolve(h(s))?;
        stream::refuse_on_capturing(&st)?;
        crate::sync::stream(&st, "cuStreamSynchronize")
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing(s: *mut c_void, status: *mut c_uint) -> CUresult {
    run("cuStreamIsCapturing", || {
        let st = stream::resolve(h(s))?;
        out(status, stream::capture_status(&st).0)
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v2(
    s: *mut c_void,
    status: *mut c_uint,
    id: *mut u64,
    graph_out: *mut *mut c_void,
    deps: *mut *const c_void,
    ndeps: *mut usize,
) -> CUresult {
    run("cuStreamGetCaptureInfo", || {
        let st = stream::resolve(h(s))?;
        let (state, capture_id) = stream::capture_status(&st);
        out(status, state)?;
        for (p, v) in [(id, capture_id)] {
            if !p.is_null() {
                out(p, v)?;
            }
        }
        if !graph_out.is_null() {
            out(graph_out, std::ptr::null_mut())?;
        }
        if !deps.is_null() {
            out(deps, std::ptr::null())?;
        }
        if !ndeps.is_null() {
            out(ndeps, 0)?;
        }
        Ok(())
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuStreamWaitValue32_v2(
    s: *mut c_void,
    addr: u64,
    value: u32,
    flags: c_uint,
) -> CUresult {
    run("cuStreamWaitValue32", || {
        let st = stream::resolve(h(s))?;
        memops::wait(&st, addr, value.into(), flags, false)
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuStreamWaitValue32(
    s: *mut c_void,
    addr: u64,
    value: u32,
    flags: c_uint,
) -> CUresult {
    cuStreamWaitValue32_v2(s, addr, value, flags)
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuStreamWaitValue64_v2(
    s: *mut c_void,
    addr: u64,
    value: u64,
    flags: c_uint,
) -> CUresult {
    run("cuStreamWaitValue64", || {
        let st = stream::resolve(h(s))?;
        memops::wait(&st, addr, value, flags, true)
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuStreamWriteValue32_v2(
    s: *mut c_void,
    addr: u64,
    value: u32,
    flags: c_uint,
) -> CUresult {
    run("cuStreamWriteValue32", || {
        let st = stream::resolve(h(s))?;
        memops::write(&st, addr, value.into(), flags, false)
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuStreamWriteValue32(
    s: *mut c_void,
    addr: u64,
    value: u32,
    flags: c_uint,
) -> CUresult {
    cuStreamWriteValue32_v2(s, addr, value, flags)
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuStreamWriteValue64_v2(
    s: *mut c_void,
    addr: u64,
    value: u64,
    flags: c_uint,
) -> CUresult {
    run("cuStreamWriteValue64", || {
        let st = stream::resolve(h(s))?;
        memops::write(&st, addr, value, flags, true)
    })
}

type HostFn = unsafe extern "C" fn(*mut c_void);

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchHostFunc(
    s: *mut c_void,
    f: Option<HostFn>,
    data: *mut c_void,
) -> CUresult {
    run("cuLaunchHostFunc", || {
        let st = stream::resolve(h(s))?;
        let f = f.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let data = data as usize;
        st.issue(Op::new("cuLaunchHostFunc", move |_s: &Stream| {
            // SAFETY: the caller's function and argument, called once on
            // the stream's thread as the driver does.
            unsafe { f(data as *mut c_void) };
            Ok(())
        }))
        .map(|_| ())
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(e: *mut *mut c_void, flags: c_uint) -> CUresult {
    run("cuEventCreate", || out(e, ptr(event::create(flags)?)))
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuEventDestroy_v2(e: *mut c_void) -> CUresult {
    run("cuEventDestroy", || event::destroy(h(e)))
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuEventRecord(e: *mut c_void, s: *mut c_void) -> CUresult {
    run("cuEventRecord", || event::record(h(e), h(s)))
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuEventQuery(e: *mut c_void) -> CUresult {
    run("cuEventQuery", || event::query(h(e)))
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuEventSynchronize(e: *mut c_void) -> CUresult {
    run("cuEventSynchronize", || event::synchronize(h(e)))
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(
    ms: *mut f32,
    a: *mut c_void,
    b: *mut c_void,
) -> CUresult {
    run("cuEventElapsedTime", || {
        out(ms, event::elapsed(h(a), h(b))?)
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuStreamWaitEvent(
    s: *mut c_void,
    e: *mut c_void,
    flags: c_uint,
) -> CUresult {
    run("cuStreamWaitEvent", || {
        if flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        event::stream_wait(h(s), h(e))
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuIpcGetEventHandle(
    out_handle: *mut CUipcEventHandle,
    e: *mut c_void,
) -> CUresult {
    run("cuIpcGetEventHandle", || {
        let ev = event::EVENTS.get(h(e))?;
        let sh = ev
            .shared
            .as_ref()
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let bytes = sh.handle();
        out(
            out_handle,
            CUipcEventHandle {
                reserved: bytes.map(|b| b as std::ffi::c_char),
            },
        )
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenEventHandle(
    e: *mut *mut c_void,
    handle: CUipcEventHandle,
) -> CUresult {
    run("cuIpcOpenEventHandle", || {
        let ctx = crate::context::current()?;
        let bytes = handle.reserved.map(|b| b as u8);
        let shared = ipc::SharedEvent::open(&bytes)?;
        let ev = event::Event {
            flags: event::INTERPROCESS | event::DISABLE_TIMING,
            device: ctx.device,
            last: std::sync::Mutex::new(None),
            captured: std::sync::Mutex::new(false),
            shared: Some(std::sync::Arc::new(shared)),
        };
        out(e, ptr(event::EVENTS.insert(std::sync::Arc::new(ev))))
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2(s: *mut c_void, mode: c_uint) -> CUresult {
    run("cuStreamBeginCapture", || graph::begin(h(s), mode))
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(s: *mut c_void, g: *mut *mut c_void) -> CUresult {
    run("cuStreamEndCapture", || {
        if g.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        match graph::end(h(s)) {
            Ok(handle) => out(g, ptr(handle)),
            Err(e) => {
                out(g, std::ptr::null_mut())?;
                Err(e)
            }
        }
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    exec: *mut *mut c_void,
    g: *mut c_void,
    _flags: u64,
) -> CUresult {
    run("cuGraphInstantiate", || {
        out(exec, ptr(graph::instantiate(h(g))?))
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch(exec: *mut c_void, s: *mut c_void) -> CUresult {
    run("cuGraphLaunch", || graph::launch(h(exec), h(s)))
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuGraphDestroy(g: *mut c_void) -> CUresult {
    run("cuGraphDestroy", || graph::destroy(h(g)))
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuGraphExecDestroy(exec: *mut c_void) -> CUresult {
    run("cuGraphExecDestroy", || graph::exec_destroy(h(exec)))
}
