//! Entry points of the root crate's decoders for the fuzz targets and
//! property tests in `fuzz/` (not API: hidden from the docs, may change at
//! any time): the two records of the agreement and setup paths that come
//! from other processes through the store.
//!
//! Each feeds bytes as a peer would publish them to the decoder and checks
//! what the decoder must guarantee; `Err` says which guarantee broke (the
//! fuzz target panics with it). A decoder that refuses the bytes is fine.

use std::collections::BTreeSet;

/// The failed-rank list a survivor publishes during `agree_on_failed`,
/// read by a rank of a `nranks` communicator: every rank it names is below
/// `nranks`, and what it accepts encodes and decodes back to itself.
pub fn agreement_set(bytes: &[u8], nranks: usize) -> Result<(), String> {
    let Ok(set) = crate::agree::decode_set(0, 1, nranks, bytes) else {
        return Ok(());
    };
    if let Some(r) = set.iter().find(|&&r| r >= nranks) {
        return Err(format!("accepted rank {r} of a {nranks}-rank communicator"));
    }
    let again = crate::agree::decode_set(0, 1, nranks, &crate::agree::encode_set(&set))
        .map_err(|e| format!("its own encoding of {set:?} is refused: {e}"))?;
    if again != set {
        return Err(format!("{set:?} encodes and decodes to {again:?}"));
    }
    Ok(())
}

/// The setup record a rank publishes (node, settings digest, standby
/// address, one line per transport kind): what it accepts encodes and
/// decodes back to itself.
pub fn setup_record(bytes: &[u8]) -> Result<(), String> {
    let Ok(info) = crate::setup::decode_info(0, 1, bytes) else {
        return Ok(());
    };
    let Some(standby) = info.standby else {
        // Writers always publish a standby address; a record without one
        // has no encoding to compare with.
        return Ok(());
    };
    let kinds: Vec<(&str, _)> = info
        .card
        .kinds
        .iter()
        .map(|(name, state)| (name.as_str(), state.clone()))
        .collect();
    let encoded = crate::setup::encode_info(1, &info.card.node, &info.digest, standby, &kinds)
        .map_err(|e| format!("its decoded record does not encode: {e}"))?;
    let again = crate::setup::decode_info(0, 1, &encoded)
        .map_err(|e| format!("its own encoding is refused: {e}"))?;
    let same = again.card.node == info.card.node
        && again.card.kinds == info.card.kinds
        && again.digest == info.digest
        && again.standby == info.standby;
    if !same {
        return Err(format!(
            "the record decodes, encodes and decodes to another: {:?} / {:?}",
            String::from_utf8_lossy(bytes),
            String::from_utf8_lossy(&encoded)
        ));
    }
    Ok(())
}

/// A set of ranks as [`agreement_set`]'s seeds write it.
pub fn encoded_set(ranks: &[usize]) -> Vec<u8> {
    crate::agree::encode_set(&ranks.iter().copied().collect::<BTreeSet<_>>())
}
