//! Hierarchical collectives for two tiers (ranks within a node, nodes across
//! the slow network): the large traffic stays inside nodes and each byte
//! crosses between nodes as few times as the collective allows. Layouts may
//! be uneven (nodes with different rank counts) and the rank numbering
//! arbitrary (node-major, round-robin, random).
//!
//! Shards: a node with L ranks splits work into S = max L shards; shard s is
//! owned by its local rank `s % L`, and the owners of shard s on every node
//! form the cross-node group of that shard.

use super::ring::{
    push_ring_all_gather_multi, push_ring_all_reduce, push_ring_reduce_scatter_multi, Part,
};
use super::tree::{push_tree_broadcast, push_tree_reduce};
use crate::schedule::{chunk_bounds, BufId, Op, Region, Schedule};
use crate::topo::Topology;

fn max_local(t: &Topology) -> usize {
    t.nodes.iter().map(Vec::len).max().unwrap_or(1)
}

/// Owner of shard `s` on node `k`.
fn owner(t: &Topology, k: usize, s: usize) -> usize {
    let node = &t.nodes[k];
    node[s % node.len()]
}

/// The cross-node group of shard `s`, node by node.
fn shard_group(t: &Topology, s: usize) -> Vec<usize> {
    (0..t.nnodes()).map(|k| owner(t, k, s)).collect()
}

/// For node `k`: the parts each local position owns, given a part per shard.
fn node_parts(t: &Topology, k: usize, shard_parts: &[Part]) -> Vec<Vec<Part>> {
    let l = t.nodes[k].len();
    let mut v = vec![Vec::new(); l];
    for (sh, part) in shard_parts.iter().enumerate() {
        v[sh % l].push(*part);
    }
    v
}

/// Hierarchical all-reduce: intra-node reduce-scatter into shards, a ring
/// all-reduce of each shard among its owners across nodes, intra-node
/// all-gather. Pipelined over blocks of `S × chunk` elements.
pub fn hier_all_reduce(t: &Topology, r: usize, count: usize, chunk: usize) -> Schedule {
    let n = t.nranks();
    let mut s = Schedule::new(n, r);
    let k = t.node_of[r];
    let node = &t.nodes[k];
    let nshards = max_local(t);
    let multi_node = t.nnodes() > 1;
    let block = nshards.saturating_mul(chunk.max(1));
    let mut base = 0;
    while base < count {
        let blen = block.min(count - base);
        let shard_parts: Vec<Part> = (0..nshards)
            .map(|sh| {
                let (o, l) = chunk_bounds(blen, nshards, sh);
                (base + o, l)
            })
            .collect();
        let mine = node_parts(t, k, &shard_parts);
        push_ring_reduce_scatter_multi(&mut s, node, &mine, BufId::Send, BufId::Recv, !multi_node);
        if multi_node {
            for (sh, &(o, l)) in shard_parts.iter().enumerate() {
                if owner(t, k, sh) == r && l > 0 {
                    let group = shard_group(t, sh);
                    push_ring_all_reduce(&mut s, &group, o, l, l, BufId::Recv, BufId::Recv, true);
                }
            }
        }
        push_ring_all_gather_multi(&mut s, node, &mine, BufId::Recv);
        base += blen;
    }
    s
}

/// Piece `i` (of `chunk` elements) of every part in `parts`: a block of
/// `count` elements at `o` gives `(o + i·chunk, the rest up to chunk)`.
fn piece_of(parts: &[Vec<Part>], i: usize, chunk: usize, count: usize) -> Vec<Vec<Part>> {
    let at = i * chunk;
    let len = chunk.min(count.saturating_sub(at));
    parts
        .iter()
        .map(|v| {
            v.iter()
                .map(|&(o, l)| if l > 0 { (o + at, len) } else { (o, 0) })
                .collect()
        })
        .collect()
}

/// How many pieces of `chunk` elements a block of `count` takes (≥ 1).
fn pieces(count: usize, chunk: usize) -> usize {
    count.div_ceil(chunk.max(1)).max(1)
}

/// Block `(offset, len)` of the rank with local index `j` on node `kk`, for
/// blocks of `count` elements at `rank × count` (empty where node `kk` has
/// no local index `j`).
fn block_of(t: &Topology, kk: usize, j: usize, count: usize) -> Part {
    match t.nodes[kk].get(j) {
        Some(&x) => (x * count, count),
        None => (0, 0),
    }
}

/// The cross-node rings rank `r` takes part in, one per local index j it
/// owns: the group of j's owners and, node by node, the block of the rank
/// with local index j (none on a single node).
fn cross_node_blocks(t: &Topology, r: usize, count: usize) -> Vec<(Vec<usize>, Vec<Vec<Part>>)> {
    if t.nnodes() <= 1 {
        return Vec::new();
    }
    let k = t.node_of[r];
    (0..max_local(t))
        .filter(|&j| owner(t, k, j) == r)
        .map(|j| {
            let parts = (0..t.nnodes())
                .map(|kk| vec![block_of(t, kk, j, count)])
                .collect();
            (shard_group(t, j), parts)
        })
        .collect()
}

/// Inside node `k`: position p holds every node's block of each local index
/// j ≡ p (mod L).
fn node_blocks(t: &Topology, k: usize, count: usize) -> Vec<Vec<Part>> {
    let l = t.nodes[k].len();
    let mut local: Vec<Vec<Part>> = vec![Vec::new(); l];
    for j in 0..max_local(t) {
        for kk in 0..t.nnodes() {
            let b = block_of(t, kk, j, count);
            if b.1 > 0 {
                local[j % l].push(b);
            }
        }
    }
    local
}

/// Hierarchical all-gather: each rank's block goes once to every other node
/// (along the cross-node group of its local index), then blocks spread
/// inside each node. Rank i's `count` elements land at `i × count`.
/// Pipelined over pieces of `chunk` elements of every block: piece i crosses
/// the nodes, then spreads inside the node, while piece i + 1 is already on
/// its way, so no cross-node link idles between phases or between the
/// steps of the several cross-node rings that share it.
pub fn hier_all_gather(t: &Topology, r: usize, count: usize, chunk: usize) -> Schedule {
    let n = t.nranks();
    let mut s = Schedule::new(n, r);
    let k = t.node_of[r];
    let node = &t.nodes[k];
    s.push(vec![Op::Copy {
        src: Region::new(BufId::Send, 0, count),
        dst: Region::new(BufId::Recv, r * count, count),
    }]);
    if count == 0 {
        return s;
    }
    // Cross-node: for local index j, the owners of j carry the blocks of the
    // ranks with local index j around the nodes. Inside the node: position p
    // holds every block of local index j ≡ p (mod L) from every node.
    let cross = cross_node_blocks(t, r, count);
    let local = node_blocks(t, k, count);
    for i in 0..pieces(count, chunk) {
        for (group, parts) in &cross {
            push_ring_all_gather_multi(
                &mut s,
                group,
                &piece_of(parts, i, chunk, count),
                BufId::Recv,
            );
        }
        push_ring_all_gather_multi(
            &mut s,
            node,
            &piece_of(&local, i, chunk, count),
            BufId::Recv,
        );
    }
    s
}

/// Hierarchical reduce-scatter: the input holds one block of `count`
/// elements per rank; rank r receives block r reduced over all ranks.
/// Partial sums of every block are first reduced inside the node onto the
/// local owner of the block's local index, then reduced across nodes.
/// Pipelined over pieces of `chunk` elements of every block, as
/// [`hier_all_gather`].
pub fn hier_reduce_scatter(t: &Topology, r: usize, count: usize, chunk: usize) -> Schedule {
    let n = t.nranks();
    let mut s = Schedule::new(n, r);
    let k = t.node_of[r];
    let node = &t.nodes[k];
    if count == 0 {
        return s;
    }
    // Intra-node: reduce every block onto the owner of its local index.
    let local = node_blocks(t, k, count);
    // Across nodes: for each local index j this rank owns, reduce-scatter
    // the blocks of index j among the owners, each node keeping its own.
    let cross = cross_node_blocks(t, r, count);
    for i in 0..pieces(count, chunk) {
        let here = piece_of(&local, i, chunk, count);
        push_ring_reduce_scatter_multi(&mut s, node, &here, BufId::Send, BufId::Scratch, false);
        for (group, parts) in &cross {
            let there = piece_of(parts, i, chunk, count);
            push_ring_reduce_scatter_multi(
                &mut s,
                group,
                &there,
                BufId::Scratch,
                BufId::Scratch,
                false,
            );
        }
    }
    s.push(vec![
        Op::Copy {
            src: Region::new(BufId::Scratch, r * count, count),
            dst: Region::new(BufId::Recv, 0, count),
        },
        Op::Finalize {
            region: Region::new(BufId::Recv, 0, count),
        },
    ]);
    s
}

/// Node leaders for a rooted operation: the root, then local rank 0 of every
/// other node.
fn leaders(t: &Topology, root: usize) -> Vec<usize> {
    let rk = t.node_of[root];
    std::iter::once(root)
        .chain(
            (0..t.nnodes())
                .filter(|&kk| kk != rk)
                .map(|kk| t.nodes[kk][0]),
        )
        .collect()
}

fn leader_of(t: &Topology, root: usize, k: usize) -> usize {
    if t.node_of[root] == k {
        root
    } else {
        t.nodes[k][0]
    }
}

/// Hierarchical broadcast: a binomial tree among node leaders, then a
/// binomial tree inside each node from its leader.
pub fn hier_broadcast(t: &Topology, r: usize, root: usize, count: usize, chunk: usize) -> Schedule {
    let n = t.nranks();
    let mut s = Schedule::new(n, r);
    let k = t.node_of[r];
    if r == root {
        s.push(vec![Op::Copy {
            src: Region::new(BufId::Send, 0, count),
            dst: Region::new(BufId::Recv, 0, count),
        }]);
    }
    let lead = leaders(t, root);
    if lead.contains(&r) {
        push_tree_broadcast(&mut s, &lead, count, chunk, BufId::Send, BufId::Recv);
    }
    let me_lead = leader_of(t, root, k);
    let local: Vec<usize> = std::iter::once(me_lead)
        .chain(t.nodes[k].iter().copied().filter(|&x| x != me_lead))
        .collect();
    push_tree_broadcast(&mut s, &local, count, chunk, BufId::Recv, BufId::Recv);
    s
}

/// Hierarchical reduce: a binomial tree inside each node onto its leader,
/// then a binomial tree among leaders onto the root.
pub fn hier_reduce(t: &Topology, r: usize, root: usize, count: usize, chunk: usize) -> Schedule {
    let n = t.nranks();
    let mut s = Schedule::new(n, r);
    let k = t.node_of[r];
    let me_lead = leader_of(t, root, k);
    let local: Vec<usize> = std::iter::once(me_lead)
        .chain(t.nodes[k].iter().copied().filter(|&x| x != me_lead))
        .collect();
    let lead = leaders(t, root);
    let single = lead.len() == 1;
    let acc = if r == root {
        BufId::Recv
    } else {
        BufId::Scratch
    };
    push_tree_reduce(&mut s, &local, count, chunk, BufId::Send, acc, single);
    if !single && lead.contains(&r) {
        push_tree_reduce(&mut s, &lead, count, chunk, acc, acc, true);
    }
    s
}
