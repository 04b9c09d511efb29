//! Records in host shared memory that every rank of a one-node
//! communicator maps: the device offers' (`offer.rs`) and the IPC-event
//! lane's boards (`window/ipc_events.rs`).

use comm_core::{Error, Result};
use transport_shm::region::{region_name, Region};

use crate::comm::Inner;

/// Creates this rank's record of `bytes` in host shared memory (named by
/// the communicator, `region_id` and the rank), publishes its name under
/// `key` in the store, maps every peer's and waits until every rank has
/// mapped them all (collective; every rank of a one-node communicator).
/// The names are unlinked once mapped. `what` names the record in errors,
/// `op` the operation. Returns this rank's record and the peers' (`None`
/// at this rank's index).
pub(crate) fn share_host_records(
    inner: &Inner,
    (region_id, bytes): (u64, usize),
    (key_kind, what): (&str, &str),
    op: &'static str,
) -> Result<(Region, Vec<Option<Region>>)> {
    let me = inner.rank;
    let io = |context: String, source: std::io::Error| Error::Io {
        rank: me,
        context,
        source,
    };
    let name = region_name(inner.comm_id, region_id, me)
        .map_err(|e| io(format!("naming the {what}"), e))?;
    let own =
        Region::create(&name, bytes).map_err(|e| io(format!("creating the {what} {name:?}"), e))?;
    let store = inner.store.as_ref().ok_or_else(|| Error::InvalidArgument {
        rank: me,
        op,
        detail: format!("this communicator has no store to share the {what} through"),
    })?;
    let key = |k: &str, r: usize| format!("dwindow/{:x}/{key_kind}/{k}/{r}", inner.comm_id);
    let timeout = inner.config.timeout;
    let mut peers: Vec<Option<Region>> = (0..inner.nranks).map(|_| None).collect();
    let shared = (|| {
        store.set(&key("name", me), name.as_bytes())?;
        for p in (0..inner.nranks).filter(|&p| p != me) {
            let raw = store.get(&key("name", p), timeout)?;
            let peer = String::from_utf8(raw)
                .ok()
                .filter(|n| transport_shm::check_name(n).is_ok())
                .ok_or_else(|| Error::InvalidArgument {
                    rank: me,
                    op,
                    detail: format!("peer rank {p} published an invalid {what} name"),
                })?;
            let region = Region::open(&peer, bytes)
                .map_err(|e| io(format!("mapping peer rank {p}'s {what}"), e))?;
            peers[p] = Some(region);
        }
        store.set(&key("mapped", me), b"1")?;
        for p in (0..inner.nranks).filter(|&p| p != me) {
            store.get(&key("mapped", p), timeout)?;
        }
        Ok(())
    })();
    own.unlink();
    shared?;
    Ok((own, peers))
}
