//! The LL protocol of the staged direct kernel (`kernels/cuda/sncl_direct.cu`,
//! "LL") across the wrap of its 32-bit line flags: two ranks as two streams
//! of one device run LL all-reduces at explicit epochs from 2^32 - 3 to
//! 2^32 + 3 (the counters are 64-bit; a line carries the epoch's low 32
//! bits). The call at 2^32, a multiple of the refresh period, runs one-shot
//! staged and clears the rank's LL slots; lines planted before it, which
//! carry the flag of a later epoch as lines 2^32 epochs old would, must not
//! be taken for that epoch's.
//!
//! Run with `cargo test -p device --features emu --test direct_ll` (the
//! emulated device; `SNCL_TEST_DEVICE=cuda` on a GPU).

mod common;

use std::time::Duration;

use common::{Ctx, Flag};
use device::direct::{
    self, DirectAlgo, DirectAllReduce, Staged, StagedCollective, FLAG_BYTES, LANE_FLAG_BYTES,
};
use device::{DeviceBuffer, DevicePtr};
use kernels::cuda::DIRECT_LL_BLOCK_BYTES;
use kernels::{DataType, ReduceOp};

/// Elements of a rank's lane buffer and of its send and receive buffers.
const LANE: usize = 4096;
/// The calls' fingerprint (any value but 0: checked).
const FINGERPRINT: u64 = 0x5eed_f00d_1234_5678;
const WRAP: u64 = 1 << 32;

struct Rank {
    ctx: Ctx,
    lane: DeviceBuffer,
    flags: DeviceBuffer,
    control: Flag,
    send: DeviceBuffer,
    recv: DeviceBuffer,
}

fn rank(ctx: Ctx) -> Rank {
    let flags = ctx.buffer(LANE_FLAG_BYTES);
    ctx.upload(flags.ptr(), &vec![0; LANE_FLAG_BYTES]);
    Rank {
        lane: ctx.buffer(LANE * 4),
        flags,
        control: Flag::new(&ctx.dev),
        send: ctx.buffer(LANE * 4),
        recv: ctx.buffer(LANE * 4),
        ctx,
    }
}

/// Rank `r`'s element `i` at `epoch`: small integers, so every sum is exact.
fn value(r: usize, i: usize, epoch: u64) -> f32 {
    ((epoch % 7) * 100 + r as u64 * 10 + (i % 13) as u64) as f32
}

fn floats(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

/// Enqueues rank `me`'s LL launch of `count` floats at `epoch`.
fn launch(ranks: &[Rank], me: usize, count: usize, epoch: u64) {
    let r = &ranks[me];
    let (block, max_blocks) = direct::launch_limits(r.ctx.dev.backend());
    let lanes: Vec<DevicePtr> = ranks.iter().map(|r| r.lane.ptr()).collect();
    let flags: Vec<DevicePtr> = ranks.iter().map(|r| r.flags.ptr()).collect();
    let grid = direct::grid(DataType::Float32, count, block, max_blocks);
    assert!(direct::ll_fits(4, count, grid, block), "{count} floats");
    let op = DirectAllReduce {
        algo: DirectAlgo::LowLatency,
        dtype: DataType::Float32,
        op: ReduceOp::Sum,
        count,
        rank: me,
        inputs: &lanes,
        outputs: &lanes,
        flags: &flags,
        scratch: None,
        control: r.control.addr(0),
        epoch,
        grid,
        staged: Some(Staged {
            collective: StagedCollective::AllReduce,
            source: r.send.ptr(),
            result: r.recv.ptr(),
            chunk: LANE,
            fingerprint: FINGERPRINT,
        }),
    };
    // SAFETY: every buffer above lives until the test synchronises both
    // streams: lanes of LANE floats (a round's), flag areas of
    // LANE_FLAG_BYTES, send and receive buffers of LANE >= count floats, a
    // pinned control block of 16 >= CONTROL_WORDS words.
    unsafe { r.ctx.dev.direct_all_reduce(r.ctx.stream, &op) }.expect("direct_all_reduce");
}

fn upload_inputs(ranks: &[Rank], count: usize, epoch: u64) {
    for (me, r) in ranks.iter().enumerate() {
        let v: Vec<f32> = (0..count).map(|i| value(me, i, epoch)).collect();
        r.ctx.upload(r.send.ptr(), &floats(&v));
    }
}

fn check_results(ranks: &[Rank], count: usize, epoch: u64) {
    for (me, r) in ranks.iter().enumerate() {
        let got = r.ctx.download(r.recv.ptr(), count * 4);
        let want: Vec<f32> = (0..count)
            .map(|i| (0..ranks.len()).map(|q| value(q, i, epoch)).sum())
            .collect();
        if got != floats(&want) {
            let first = got
                .chunks(4)
                .zip(&want)
                .position(|(g, w)| g != w.to_ne_bytes())
                .unwrap_or(0);
            panic!(
                "rank {me}, epoch 2^32{:+}: element {first} is {:?}, expected {}",
                epoch as i64 - WRAP as i64,
                f32::from_ne_bytes(got[first * 4..first * 4 + 4].try_into().unwrap()),
                want[first]
            );
        }
    }
}

/// One all-reduce of `count` floats at `epoch` on both ranks, waited for.
fn all_reduce(ranks: &[Rank], count: usize, epoch: u64) {
    upload_inputs(ranks, count, epoch);
    for me in 0..ranks.len() {
        launch(ranks, me, count, epoch);
    }
    for r in ranks {
        r.ctx.sync();
    }
    check_results(ranks, count, epoch);
}

/// Lines of `count` floats (block 0, packs below the block's threads) with
/// the flag of `epoch` and data that is no rank's, and the header lines
/// with the calls' fingerprint: what an LL call 2^32 epochs before `epoch`
/// would have left in rank `r`'s slot of `epoch`'s parity.
fn plant_stale_lines(r: &Rank, count: usize, epoch: u64) {
    let flag = (epoch as u32 as u64) << 32;
    let line = |data: u32| (flag | data as u64).to_ne_bytes();
    let mut slot = Vec::with_capacity(DIRECT_LL_BLOCK_BYTES + 16);
    for _ in 0..count.div_ceil(4) * 4 {
        slot.extend_from_slice(&line(0x4b00_0000)); // 8388608.0
    }
    slot.resize(DIRECT_LL_BLOCK_BYTES, 0);
    slot.extend_from_slice(&line(FINGERPRINT as u32));
    slot.extend_from_slice(&line((FINGERPRINT >> 32) as u32));
    let offset = FLAG_BYTES + (epoch as usize & 1) * (DIRECT_LL_BLOCK_BYTES + 16);
    r.ctx.upload(r.flags.ptr().add(offset), &slot);
}

#[test]
fn ll_lines_stay_exact_across_the_wrap_of_their_32_bit_flags() {
    let Some(first) = Ctx::new() else { return };
    let ranks = [rank(first.other_stream()), rank(first)];
    // 250 packs: one block (the planted lines are block 0's) of 256 or
    // more threads, a pack each.
    let big = 1000;
    all_reduce(&ranks, 7, WRAP - 3);
    all_reduce(&ranks, 10, WRAP - 2);
    // As if left by an LL call at 2 (2^32 + 2 - 2^32): flag 2, parity 0.
    plant_stale_lines(&ranks[1], big, WRAP + 2);
    all_reduce(&ranks, big, WRAP - 1); // flag 0xffff_ffff
    all_reduce(&ranks, big, WRAP); // one-shot staged: clears the slots
    all_reduce(&ranks, big, WRAP + 1); // flag 1
                                       // Rank 1 is held behind a host-released wait: rank 0 must wait for its
                                       // lines, not take the planted ones.
    upload_inputs(&ranks, big, WRAP + 2);
    let hold = Flag::new(&ranks[1].ctx.dev);
    // SAFETY: the word is pinned and outlives the stream's work
    // (synchronised below).
    unsafe {
        ranks[1]
            .ctx
            .dev
            .stream_wait_u32(ranks[1].ctx.stream, hold.addr(0), 1)
    }
    .expect("stream_wait_u32");
    launch(&ranks, 1, big, WRAP + 2);
    launch(&ranks, 0, big, WRAP + 2);
    std::thread::sleep(Duration::from_millis(300));
    hold.word(0).store(1, std::sync::atomic::Ordering::Release);
    for r in &ranks {
        r.ctx.sync();
    }
    check_results(&ranks, big, WRAP + 2);
    all_reduce(&ranks, 3, WRAP + 3);
    for r in &ranks {
        let gave_up = r.control.word(2).load(std::sync::atomic::Ordering::Acquire);
        assert_eq!(gave_up, 0, "a kernel gave up");
    }
}
