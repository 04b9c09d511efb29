//! The compressed collectives' byte exchange: every rank's encoded block
//! to every other in one group, and the error a block that does not decode
//! gives. Shared by the sparse and the dense paths.

use comm_core::{Error, Result};

use crate::Communicator;

/// Direct exchange in one group: block j of `send` goes to rank j; block j
/// of `recv` comes from rank j (this rank's own block is copied).
pub(super) fn exchange(
    comm: &Communicator,
    send: &[u8],
    recv: &mut [u8],
    stride: usize,
) -> Result<()> {
    let me = comm.rank();
    if stride == 0 {
        return Ok(());
    }
    recv[me * stride..(me + 1) * stride].copy_from_slice(&send[me * stride..(me + 1) * stride]);
    let blocks: Vec<&mut [u8]> = recv.chunks_mut(stride).collect();
    comm.group(|g| {
        for (j, block) in blocks.into_iter().enumerate() {
            if j != me {
                g.send(&send[j * stride..(j + 1) * stride], j);
                g.recv(block, j);
            }
        }
    })
}

pub(super) fn bytes_err(comm: &Communicator, e: compress::CompressError) -> Error {
    Error::InvalidArgument {
        rank: comm.rank(),
        op: "all_reduce_compressed",
        detail: format!("a peer's encoded data does not decode: {e}"),
    }
}
