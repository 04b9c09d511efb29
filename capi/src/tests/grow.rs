//! `snclCommGetUniqueId` and `snclCommGrow` with ranks as threads: two
//! members and a new rank grow to three and all-reduce; misuse is
//! `snclInvalidArgument` naming what is wrong.

use std::ffi::c_int;
use std::net::SocketAddr;

use super::in_process::{grouped_all_reduce, id_at, ok};
use super::rank_kit::free_port;
use crate::*;
use snclResult_t::*;

#[test]
fn two_members_and_a_new_rank_grow_to_three() {
    let id = id_at(SocketAddr::from(([127, 0, 0, 1], free_port())));
    let members: Vec<usize> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                s.spawn(move || {
                    let mut c = std::ptr::null_mut();
                    // SAFETY: a valid out-pointer; NULL config.
                    ok(unsafe { snclCommInitRankConfig(&mut c, 2, id, r, std::ptr::null_mut()) });
                    c as usize
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank")).collect()
    });
    let members: Vec<snclComm_t> = members.into_iter().map(|c| c as snclComm_t).collect();
    let mut grow_id = snclUniqueId {
        internal: [0; SNCL_UNIQUE_ID_BYTES],
    };
    let mut unused = std::ptr::null_mut();
    // SAFETY: live handles and valid out-pointers throughout.
    unsafe {
        assert_eq!(
            snclCommGetUniqueId(members[1], &mut grow_id),
            snclInvalidArgument,
            "rank 1 hands out no grow id"
        );
        ok(snclCommGetUniqueId(members[0], &mut grow_id));
        assert_eq!(
            snclCommGrow(
                members[1],
                3,
                std::ptr::null(),
                1,
                &mut unused,
                std::ptr::null_mut()
            ),
            snclInvalidArgument,
            "a member passes rank -1"
        );
        assert_eq!(
            snclCommGrow(
                std::ptr::null_mut(),
                3,
                std::ptr::null(),
                2,
                &mut unused,
                std::ptr::null_mut()
            ),
            snclInvalidArgument,
            "a new rank needs the id"
        );
    }
    let (grow_id_ptr, m) = (&grow_id as *const snclUniqueId as usize, members.clone());
    let grown: Vec<usize> = std::thread::scope(|s| {
        let mut hs: Vec<_> = m
            .iter()
            .enumerate()
            .map(|(r, &c)| {
                let c = c as usize;
                s.spawn(move || {
                    let mut g = std::ptr::null_mut();
                    // Rank 0 passes the id it handed out; rank 1 none.
                    let id = if r == 0 {
                        grow_id_ptr as *const snclUniqueId
                    } else {
                        std::ptr::null()
                    };
                    // SAFETY: a live handle, an id that outlives the scope, a
                    // valid out-pointer.
                    ok(unsafe {
                        snclCommGrow(c as snclComm_t, 3, id, -1, &mut g, std::ptr::null_mut())
                    });
                    g as usize
                })
            })
            .collect();
        hs.push(s.spawn(move || {
            let mut g = std::ptr::null_mut();
            // SAFETY: no parent, the grow id, a valid out-pointer.
            ok(unsafe {
                snclCommGrow(
                    std::ptr::null_mut(),
                    3,
                    grow_id_ptr as *const snclUniqueId,
                    2,
                    &mut g,
                    std::ptr::null_mut(),
                )
            });
            g as usize
        }));
        hs.into_iter().map(|h| h.join().expect("rank")).collect()
    });
    let grown: Vec<snclComm_t> = grown.into_iter().map(|c| c as snclComm_t).collect();
    // SAFETY: live handles of one communicator each, destroyed once.
    unsafe {
        for (r, &g) in grown.iter().enumerate() {
            let (mut cr, mut cn): (c_int, c_int) = (-1, -1);
            ok(snclCommUserRank(g, &mut cr));
            ok(snclCommCount(g, &mut cn));
            assert_eq!((cr, cn), (r as c_int, 3));
        }
        grouped_all_reduce(&grown);
        grouped_all_reduce(&members);
        for c in grown.into_iter().chain(members) {
            ok(snclCommDestroy(c));
        }
    }
}
