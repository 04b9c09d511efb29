//! The TLS record layer's key updates: with a few records per key, every
//! socket updates its sending key many times during an exchange (and
//! follows its peer's updates), and every piece still arrives whole and in
//! order. Its own test binary: the records-per-key hook is process-wide.

use sncl_bootstrap::tls::certs::{self, Authority};
use sncl_bootstrap::tls::TlsIdentity;

mod support;
use support::*;

#[test]
fn key_updates_every_few_records_keep_every_piece() {
    let job = Authority::new("job").unwrap();
    let dir = std::env::temp_dir().join(format!("sncl-tls-ku-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    let issued = job.issue(&["rank".into()], false).unwrap();
    let id = TlsIdentity::load(&certs::write_files(&dir, &job.ca_pem(), &issued).unwrap()).unwrap();
    transport_tcp::set_records_per_key(3);
    let before = transport_tcp::key_updates_sent();
    let ranks: Vec<_> = mesh_with(3, 2, 64 * 1024, &vec![Some(id); 3])
        .into_iter()
        .map(Result::unwrap)
        .collect();
    run_exchange_on(ranks, 2, 64 * 1024, 200);
    let updates = transport_tcp::key_updates_sent() - before;
    // 3 ranks × 2 peers × 2 sockets, each sending ~200 pieces of up to 4
    // records: far more than one update per socket.
    assert!(updates > 100, "only {updates} key updates");
    transport_tcp::set_records_per_key(0);
}
