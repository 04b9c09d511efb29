//! The C layout of the libibverbs structures the transport uses, copied
//! from rdma-core's `<infiniband/verbs.h>` (its ABI is stable: the
//! `IBVERBS_1.1` symbols), and the library loaded at run time.
//!
//! `ibv_post_send`, `ibv_post_recv` and `ibv_poll_cq` are `static inline`
//! functions in verbs.h that call through the context's ops table
//! (`struct ibv_context_ops`, 32 function pointers after the device
//! pointer); [`Ops`] reproduces that table.

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `union ibv_gid` (8-byte aligned: it holds two `__be64`).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default)]
pub struct Gid(pub [u8; 16]);

/// `struct ibv_context_ops` (verbs.h): only the slots used are typed.
#[repr(C)]
pub struct Ops {
    _before_poll: [*const c_void; 11],
    pub poll_cq: unsafe extern "C" fn(*mut c_void, c_int, *mut Wc) -> c_int,
    _between: [*const c_void; 13],
    pub post_send: unsafe extern "C" fn(*mut c_void, *mut SendWr, *mut *mut SendWr) -> c_int,
    pub post_recv: unsafe extern "C" fn(*mut c_void, *mut RecvWr, *mut *mut RecvWr) -> c_int,
    _after: [*const c_void; 5],
}

/// `struct ibv_context`.
#[repr(C)]
pub struct Context {
    pub device: *mut c_void,
    pub ops: Ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    _mutex: libc::pthread_mutex_t,
    /// `UINTPTR_MAX` where the context is the tail of a `struct
    /// verbs_context` (every provider since rdma-core 13): the extended ops
    /// lie before it (`verbs_get_ctx` in verbs.h).
    pub abi_compat: *mut c_void,
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Wc {
    pub wr_id: u64,
    pub status: c_uint,
    pub opcode: c_uint,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// Network byte order.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct ibv_send_wr` (RDMA variant of the `wr` union; the other unions
/// are kept as padding of their size).
#[repr(C)]
#[derive(Debug)]
pub struct SendWr {
    pub wr_id: u64,
    pub next: *mut SendWr,
    pub sg_list: *mut Sge,
    pub num_sge: c_int,
    pub opcode: c_uint,
    pub send_flags: c_uint,
    /// Network byte order.
    pub imm_data: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    _wr_rest: [u32; 5],
    _qp_type: u64,
    _bind_mw: [u64; 6],
}

impl SendWr {
    pub fn new() -> SendWr {
        SendWr {
            wr_id: 0,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
            opcode: 0,
            send_flags: 0,
            imm_data: 0,
            remote_addr: 0,
            rkey: 0,
            _wr_rest: [0; 5],
            _qp_type: 0,
            _bind_mw: [0; 6],
        }
    }
}

/// `struct ibv_recv_wr`.
#[repr(C)]
#[derive(Debug)]
pub struct RecvWr {
    pub wr_id: u64,
    pub next: *mut RecvWr,
    pub sg_list: *mut Sge,
    pub num_sge: c_int,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct QpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
#[derive(Debug)]
pub struct QpInitAttr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub cap: QpCap,
    pub qp_type: c_uint,
    pub sq_sig_all: c_int,
}

/// The start of `struct ibv_qp`.
#[repr(C)]
pub struct QpHead {
    pub context: *mut Context,
    pub qp_context: *mut c_void,
    pub pd: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_uint,
}

/// The start of `struct ibv_cq`.
#[repr(C)]
pub struct CqHead {
    pub context: *mut Context,
}

/// The start of `struct ibv_mr`.
#[repr(C)]
pub struct MrHead {
    pub context: *mut c_void,
    pub pd: *mut c_void,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GlobalRoute {
    pub dgid: Gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AhAttr {
    pub grh: GlobalRoute,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct QpAttr {
    pub qp_state: c_uint,
    pub cur_qp_state: c_uint,
    pub path_mtu: c_uint,
    pub path_mig_state: c_uint,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: QpCap,
    pub ah_attr: AhAttr,
    pub alt_ah_attr: AhAttr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_async_event`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AsyncEventRaw {
    pub element: *mut c_void,
    pub event_type: c_uint,
}

// The layouts verbs.h gives on 64-bit Linux.
const _: () = assert!(std::mem::size_of::<Ops>() == 32 * 8);
const _: () = assert!(std::mem::offset_of!(Context, async_fd) == 268);
const _: () = assert!(std::mem::size_of::<Wc>() == 48);
const _: () = assert!(std::mem::size_of::<SendWr>() == 128);
const _: () = assert!(std::mem::offset_of!(SendWr, remote_addr) == 40);
const _: () = assert!(std::mem::size_of::<RecvWr>() == 32);
const _: () = assert!(std::mem::size_of::<QpInitAttr>() == 64);
const _: () = assert!(std::mem::offset_of!(QpHead, qp_num) == 52);
const _: () = assert!(std::mem::size_of::<AhAttr>() == 32);
const _: () = assert!(std::mem::offset_of!(QpAttr, ah_attr) == 56);
const _: () = assert!(std::mem::offset_of!(QpAttr, pkey_index) == 120);
const _: () = assert!(std::mem::offset_of!(QpAttr, rate_limit) == 136);
const _: () = assert!(std::mem::size_of::<QpAttr>() == 144);
const _: () = assert!(std::mem::offset_of!(MrHead, lkey) == 36);

/// `ibv_port_attr` is read from a zeroed buffer larger than it at these
/// offsets (providers may fill fields newer than this build knows).
pub const PORT_ATTR_BYTES: usize = 256;
pub const PORT_STATE: usize = 0;
pub const PORT_ACTIVE_MTU: usize = 8;
pub const PORT_LID: usize = 34;
pub const PORT_LINK_LAYER: usize = 46;

/// `IBV_WR_RDMA_WRITE`, `IBV_WR_RDMA_WRITE_WITH_IMM`.
pub const WR_RDMA_WRITE: c_uint = 0;
pub const WR_RDMA_WRITE_WITH_IMM: c_uint = 1;
/// `IBV_SEND_SIGNALED`.
pub const SEND_SIGNALED: c_uint = 1 << 1;
/// `IBV_ACCESS_LOCAL_WRITE`, `IBV_ACCESS_REMOTE_WRITE`, `IBV_ACCESS_REMOTE_ATOMIC`.
pub const ACCESS_LOCAL_WRITE: c_int = 1;
pub const ACCESS_REMOTE_WRITE: c_int = 1 << 1;
pub const ACCESS_REMOTE_ATOMIC: c_int = 1 << 3;
/// `IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE`.
pub const ACCESS_LOCAL_REMOTE_WRITE: c_int = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE;
/// `IBV_ACCESS_ON_DEMAND`: on-demand paging (nothing pinned).
pub const ACCESS_ON_DEMAND: c_int = 1 << 6;
/// `IBV_QPT_RC`.
pub const QPT_RC: c_uint = 2;
/// `IBV_WC_RDMA_WRITE`, `IBV_WC_RECV_RDMA_WITH_IMM`.
pub const WC_RDMA_WRITE: c_uint = 1;
pub const WC_RECV_RDMA_WITH_IMM: c_uint = (1 << 7) + 1;
/// `enum ibv_qp_attr_mask` bits.
pub const QP_STATE: c_int = 1;
pub const QP_CUR_STATE: c_int = 1 << 1;
pub const QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const QP_PKEY_INDEX: c_int = 1 << 4;
pub const QP_PORT: c_int = 1 << 5;
pub const QP_AV: c_int = 1 << 7;
pub const QP_PATH_MTU: c_int = 1 << 8;
pub const QP_TIMEOUT: c_int = 1 << 9;
pub const QP_RETRY_CNT: c_int = 1 << 10;
pub const QP_RNR_RETRY: c_int = 1 << 11;
pub const QP_RQ_PSN: c_int = 1 << 12;
pub const QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const QP_ALT_PATH: c_int = 1 << 14;
pub const QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const QP_SQ_PSN: c_int = 1 << 16;
pub const QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const QP_PATH_MIG_STATE: c_int = 1 << 18;
pub const QP_DEST_QPN: c_int = 1 << 20;

/// The libibverbs entry points the transport calls (exported symbols).
pub struct Lib {
    pub get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void,
    pub free_device_list: unsafe extern "C" fn(*mut *mut c_void),
    pub get_device_name: unsafe extern "C" fn(*mut c_void) -> *const c_char,
    pub open_device: unsafe extern "C" fn(*mut c_void) -> *mut Context,
    pub close_device: unsafe extern "C" fn(*mut Context) -> c_int,
    pub query_port: unsafe extern "C" fn(*mut Context, u8, *mut u8) -> c_int,
    pub query_gid: unsafe extern "C" fn(*mut Context, u8, c_int, *mut Gid) -> c_int,
    pub alloc_pd: unsafe extern "C" fn(*mut Context) -> *mut c_void,
    pub dealloc_pd: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub reg_mr: unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int) -> *mut MrHead,
    pub dereg_mr: unsafe extern "C" fn(*mut MrHead) -> c_int,
    pub create_cq:
        unsafe extern "C" fn(*mut Context, c_int, *mut c_void, *mut c_void, c_int) -> *mut CqHead,
    pub destroy_cq: unsafe extern "C" fn(*mut CqHead) -> c_int,
    pub create_qp: unsafe extern "C" fn(*mut c_void, *mut QpInitAttr) -> *mut QpHead,
    pub destroy_qp: unsafe extern "C" fn(*mut QpHead) -> c_int,
    pub modify_qp: unsafe extern "C" fn(*mut QpHead, *mut QpAttr, c_int) -> c_int,
    pub get_async_event: unsafe extern "C" fn(*mut Context, *mut AsyncEventRaw) -> c_int,
    pub ack_async_event: unsafe extern "C" fn(*mut AsyncEventRaw),
    pub fork_init: unsafe extern "C" fn() -> c_int,
    /// `ibv_reg_dmabuf_mr(pd, offset, length, iova, fd, access)`: rdma-core
    /// 34 and newer; `None` in older libraries (no GPUDirect RDMA: device
    /// memory is staged).
    pub reg_dmabuf_mr:
        Option<unsafe extern "C" fn(*mut c_void, u64, usize, u64, c_int, c_int) -> *mut MrHead>,
    _lib: libloading::Library,
}

/// The soname loaded.
pub const SONAME: &str = "libibverbs.so.1";

impl Lib {
    /// Loads libibverbs and resolves every entry point.
    pub fn load() -> Result<Lib, String> {
        // SAFETY: loading libibverbs runs its constructors, which only
        // read configuration files; the library is kept loaded in `_lib`
        // for as long as the function pointers are used.
        let lib =
            unsafe { libloading::Library::new(SONAME) }.map_err(
                |e| match std::error::Error::source(&e) {
                    Some(cause) => format!("{e}: {cause}"),
                    None => e.to_string(),
                },
            )?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol is declared with the C signature of
                // verbs.h; the pointer stays valid while `lib` is loaded.
                *unsafe { lib.get($name) }.map_err(|e| {
                    format!(
                        "{} lacks {}: {e}",
                        SONAME,
                        String::from_utf8_lossy(&$name[..$name.len() - 1])
                    )
                })?
            };
        }
        Ok(Lib {
            get_device_list: sym!(b"ibv_get_device_list\0"),
            free_device_list: sym!(b"ibv_free_device_list\0"),
            get_device_name: sym!(b"ibv_get_device_name\0"),
            open_device: sym!(b"ibv_open_device\0"),
            close_device: sym!(b"ibv_close_device\0"),
            query_port: sym!(b"ibv_query_port\0"),
            query_gid: sym!(b"ibv_query_gid\0"),
            alloc_pd: sym!(b"ibv_alloc_pd\0"),
            dealloc_pd: sym!(b"ibv_dealloc_pd\0"),
            reg_mr: sym!(b"ibv_reg_mr\0"),
            dereg_mr: sym!(b"ibv_dereg_mr\0"),
            create_cq: sym!(b"ibv_create_cq\0"),
            destroy_cq: sym!(b"ibv_destroy_cq\0"),
            create_qp: sym!(b"ibv_create_qp\0"),
            destroy_qp: sym!(b"ibv_destroy_qp\0"),
            modify_qp: sym!(b"ibv_modify_qp\0"),
            get_async_event: sym!(b"ibv_get_async_event\0"),
            ack_async_event: sym!(b"ibv_ack_async_event\0"),
            fork_init: sym!(b"ibv_fork_init\0"),
            // SAFETY: declared with verbs.h's signature; optional.
            reg_dmabuf_mr: unsafe { lib.get(b"ibv_reg_dmabuf_mr\0") }.ok().map(|s| *s),
            _lib: lib,
        })
    }
}
