//! Fuzz targets for every sncl decoder of bytes that come from outside the
//! process: peers (store protocol, TCP handshake and data frames, shared
//! memory slots, the setup record and the agreement's failed-rank lists),
//! files and variables (topology file, settings), the unique id. (The C
//! ABI's string inputs: sncl-capi's unit tests, the one place the C
//! functions can be called from Rust.)
//!
//! A target is a plain `fn(&[u8])`: it feeds the bytes to the decoder and
//! panics only when the decoder misbehaves (panics itself, or breaks an
//! invariant such as a round trip or a size bound). libFuzzer runs them
//! (`fuzz/libfuzzer/`, `scripts/fuzz.sh`) from the seeds of [`seeds`];
//! `tests/decoders.rs` runs them under proptest in the normal test suite
//! and replays every crash ever found (`regressions/`). See
//! docs/FUZZING.md.

use std::path::Path;
use std::sync::OnceLock;

use comm_core::settings::{Environment, SETTINGS};
use comm_core::topofile::{parse_bandwidth, parse_latency_us, TierSpec};
use comm_core::wire::{PieceHeader, HEADER_BYTES};
use comm_core::Config;
use sncl_bootstrap::store_fuzzing::{self, FakeRoot};
use sncl_bootstrap::{UniqueId, MAX_FRAME_BYTES, UNIQUE_ID_BYTES};
use transport_tcp::fuzzing as tcp;

/// A fuzz target: feeds `data` to one decoder, panics on misbehaviour.
pub type Target = fn(&[u8]);

/// Every target: name and function.
pub const TARGETS: &[(&str, Target)] = &[
    ("store_frame", store_frame),
    ("store_request", store_request),
    ("store_client", store_client),
    ("store_client_socket", store_client_socket),
    ("tcp_greeting", tcp_greeting),
    ("tcp_hello", tcp_hello),
    ("tcp_hello_signed", tcp_hello_signed),
    ("tcp_ack", tcp_ack),
    ("tcp_data", tcp_data),
    ("piece_header", piece_header),
    ("shm_slot_header", shm_slot_header),
    ("nvlink_board", nvlink_board),
    ("gdr_board", gdr_board),
    ("topofile", topofile),
    ("unique_id", unique_id),
    ("settings_value", settings_value),
    ("settings_file", settings_file),
    ("agreement_set", agreement_set),
    ("setup_record", setup_record),
];

/// The target named `name`.
pub fn target(name: &str) -> Option<Target> {
    TARGETS.iter().find(|t| t.0 == name).map(|t| t.1)
}

fn text(data: &[u8]) -> String {
    String::from_utf8_lossy(data).into_owned()
}

/// One store frame as read off a socket: never more than the limit.
pub fn store_frame(data: &[u8]) {
    if let Ok(Some(body)) = store_fuzzing::read_frame(data) {
        assert!(body.len() <= MAX_FRAME_BYTES);
        assert!(body.len() + 4 <= data.len());
    }
}

/// One request frame through the server's handler, against a fresh store.
pub fn store_request(data: &[u8]) {
    if let Ok(Some(reply)) = store_fuzzing::handle_request(data) {
        assert!(!reply.is_empty(), "empty reply");
    }
}

/// Whether the root is authentic (`data[0]` odd) and what it sends.
fn root_script(data: &[u8]) -> (bool, &[u8]) {
    match data.split_first() {
        Some((f, rest)) => (f & 1 == 1, rest),
        None => (false, data),
    }
}

/// A client talking to a root in memory that sends `data[1..]` (after a
/// correct handshake when `data[0]` is odd): the client's handshake and
/// request/response logic, with no socket per input.
pub fn store_client(data: &[u8]) {
    let (authentic, bytes) = root_script(data);
    let _ = store_fuzzing::memory_session(authentic, bytes);
}

/// As [`store_client`], over a loopback socket to a fake root (the real
/// socket path; one connection per input, so slow). Both paths must agree
/// on whether the session succeeds.
pub fn store_client_socket(data: &[u8]) {
    static ROOT: OnceLock<FakeRoot> = OnceLock::new();
    let root = ROOT.get_or_init(|| FakeRoot::start().expect("fake store root on loopback"));
    let (authentic, bytes) = root_script(data);
    let socket = root.session(authentic, bytes);
    let memory = store_fuzzing::memory_session(authentic, bytes);
    assert_eq!(
        socket.is_ok(),
        memory.is_ok(),
        "socket and memory paths disagree: {socket:?} vs {memory:?}"
    );
}

/// The acceptor's greeting as the connecting rank reads it.
pub fn tcp_greeting(data: &[u8]) {
    let _ = tcp::greeting(data);
}

/// A hello as the accepting rank judges it; `data[0]` picks the setup.
pub fn tcp_hello(data: &[u8]) {
    let (sel, rest) = data.split_first().map_or((0, data), |(s, r)| (*s, r));
    let nsocks = 1 + (sel & 3) as usize;
    let max_piece = 4096usize << (sel >> 4);
    if let Ok((from, idx)) = tcp::hello(rest, nsocks, max_piece) {
        assert!(
            (1..4).contains(&from) && idx < nsocks,
            "accepted {from}/{idx}"
        );
    }
}

/// An ack as the connecting rank checks it (against a fixed valid hello).
pub fn tcp_ack(data: &[u8]) {
    let hello = tcp::valid_hello(1, 0, 2, 1 << 19, [3; 16]);
    let good = tcp::valid_ack(&hello);
    if tcp::ack(data, &hello) {
        assert_eq!(&data[..good.len()], &good[..], "accepted a wrong ack");
    }
}

/// Received data bytes on a TCP connection; `data[0]` picks the piece size.
pub fn tcp_data(data: &[u8]) {
    let (sel, rest) = data.split_first().map_or((0, data), |(s, r)| (*s, r));
    let max_piece = 1usize << (sel % 21);
    if let Ok(Some((h, total))) = tcp::data(rest, max_piece) {
        assert!(h.len as usize <= max_piece);
        // A checksummed piece's CRC32C is its 4-byte trailer.
        let trailer = if h.checksum.is_some() { 4 } else { 0 };
        assert_eq!(total, h.encoded_len() + h.len as usize + trailer);
        assert!(total <= rest.len());
        if let Some(crc) = h.checksum {
            assert_eq!(crc.to_le_bytes(), rest[total - 4..total]);
        }
    }
}

/// A piece header, from a stream (any length: the short form without a
/// fingerprint, the long one with it) and from a fixed header area: decodes,
/// or not; a decoded one round-trips, and both readings agree.
pub fn piece_header(data: &[u8]) {
    if let Ok((h, n)) = PieceHeader::decode_prefix(data) {
        assert_eq!(n, h.encoded_len());
        assert!(n <= data.len());
        let mut again = [0u8; HEADER_BYTES];
        assert_eq!(h.encode(&mut again), n);
        // Flags and reserved bytes are checked: a decoded header is exactly
        // what encoding gives.
        assert_eq!(data[..n], again[..n]);
        assert_eq!(PieceHeader::decode(&again), Ok(h));
    }
    let Some(b) = data.first_chunk::<HEADER_BYTES>() else {
        return;
    };
    if let Ok(h) = PieceHeader::decode(b) {
        assert_eq!(PieceHeader::decode_prefix(b).map(|(d, _)| d), Ok(h));
        let mut again = [0u8; HEADER_BYTES];
        h.encode(&mut again);
        // The whole area: a short header's unused bytes must be zero.
        assert_eq!(*b, again);
    }
}

/// A shared-memory slot header; the slot size comes from the input.
pub fn shm_slot_header(data: &[u8]) {
    let (sel, rest) = data.split_first().map_or((0, data), |(s, r)| (*s, r));
    let slot_bytes = (1usize << (sel % 24)) - usize::from(sel >= 128);
    let Some(b) = rest.first_chunk::<HEADER_BYTES>() else {
        return;
    };
    if let Ok(h) = transport_shm::decode_slot_header(b, slot_bytes) {
        assert!(h.len as usize <= slot_bytes);
    }
}

/// The GPUDirect verdict a peer writes into this side's board page: what
/// decodes re-encodes with the same verdict and inbox.
pub fn gdr_board(data: &[u8]) {
    transport_rdma::fuzz_gdr_board(data);
}

/// The nvlink board a peer publishes (its device inbox: backend, ordinal,
/// geometry, address, IPC handle): a decoded board has a valid geometry
/// and survives its own encoding.
pub fn nvlink_board(data: &[u8]) {
    use transport_nvlink::{Board, BOARD_BYTES};
    let mut b = [0u8; BOARD_BYTES];
    let n = data.len().min(BOARD_BYTES);
    b[..n].copy_from_slice(&data[..n]);
    // Let the magic through often enough to reach the fields.
    if data.first().is_some_and(|x| x & 1 == 0) {
        b[0..4].copy_from_slice(b"NVLB");
    }
    if let Ok(board) = Board::decode(&b) {
        assert!(board.slots > 0 && board.slot_bytes > 0);
        assert!(board.slots.checked_mul(board.slot_bytes).is_some());
        assert_eq!(Board::decode(&board.encode()), Ok(board));
    }
    let _ = Board::decode(data);
}

/// A topology file; a parsed one survives its own printing.
pub fn topofile(data: &[u8]) {
    let t = text(data);
    let _ = parse_bandwidth(&t);
    let _ = parse_latency_us(&t);
    if let Ok(spec) = TierSpec::parse(&t, "fuzz.topo") {
        let printed = spec.to_text();
        for line in printed.lines().filter(|l| !l.starts_with("node.")) {
            let v = line
                .split_once('=')
                .map_or("", |(_, v)| v)
                .to_ascii_lowercase();
            assert!(
                !v.contains("inf") && !v.contains("nan"),
                "non-finite value: {line}"
            );
        }
        match TierSpec::parse(&printed, "printed") {
            Ok(again) => assert_eq!(again.to_text(), printed, "printing is not stable"),
            Err(e) => panic!("the printed spec does not parse: {e}\n{printed}"),
        }
    }
}

/// A unique id as bytes and as hex; a decoded one round-trips.
pub fn unique_id(data: &[u8]) {
    let mut b = [0u8; UNIQUE_ID_BYTES];
    let n = data.len().min(UNIQUE_ID_BYTES);
    b[..n].copy_from_slice(&data[..n]);
    if let Ok(id) = UniqueId::from_bytes(&b) {
        assert_eq!(id.to_bytes(), b);
        assert_eq!(
            UniqueId::from_hex(&id.to_hex()).map(|i| i.to_bytes()).ok(),
            Some(b)
        );
    }
    if let Ok(id) = UniqueId::from_hex(&text(data)) {
        assert_eq!(UniqueId::from_bytes(&id.to_bytes()).ok(), Some(id));
    }
}

/// One setting's value (`data[0]` picks the setting) through the config
/// parser, the algorithm parser and the agreement digest rank 0 sends.
pub fn settings_value(data: &[u8]) {
    let (sel, rest) = data.split_first().map_or((0, data), |(s, r)| (*s, r));
    let setting = &SETTINGS[sel as usize % SETTINGS.len()];
    let value = text(rest);
    if let Ok(c) = Config::from_vars(&|n| (n == setting.name).then(|| value.clone())) {
        let digest = c.shared_digest();
        let mut d = Config::default();
        d.adopt_digest(&digest)
            .unwrap_or_else(|e| panic!("a config's own digest is refused: {e}\n{digest}"));
    }
    let _ = comm_core::config::parse_algo(&value);
    let _ = Config::default().adopt_digest(&value);
}

/// A settings file (`SNCL_CONF_FILE`, `~/.sncl.conf`, `/etc/sncl.conf`).
pub fn settings_file(data: &[u8]) {
    let mut env = Environment::from_pairs::<String, String>(Vec::new());
    if env
        .overlay_conf(Path::new("/fuzz/sncl.conf"), &text(data))
        .is_ok()
    {
        let _ = Config::from_environment(&env);
    }
}

/// A hello whose fields come from the input, signed with the setup's
/// secret (so the MAC passes) and judged: an accepted one is exactly the
/// expected communicator, version, sizes, an expected rank to rank 0 and a
/// socket index in range. The first byte picks the setup (as `tcp_hello`);
/// the bytes after the fields say which fields keep the expected value, so
/// acceptance stays reachable.
pub fn tcp_hello_signed(data: &[u8]) {
    let mut b = [0u8; 1 + 2 + 8 + 5 * 4 + 16 + 1];
    let n = data.len().min(b.len());
    b[..n].copy_from_slice(&data[..n]);
    let sel = b[0];
    let nsocks = 1 + (sel & 3) as usize;
    let max_piece = 4096usize << (sel >> 4);
    let keep = b[b.len() - 1];
    let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    let pick = |bit: u8, expected: u64, fuzzed: u64| {
        if keep & (1 << bit) != 0 {
            expected
        } else {
            fuzzed
        }
    };
    let version = pick(0, tcp::PROTOCOL_VERSION as u64, u16_at(1) as u64) as u16;
    let comm_id = pick(
        1,
        tcp::COMM_ID,
        u64::from_le_bytes(b[3..11].try_into().expect("8")),
    );
    let from = u32_at(11);
    let to = pick(2, 0, u32_at(15) as u64) as u32;
    let idx = u32_at(19);
    let socks = pick(3, nsocks as u64, u32_at(23) as u64) as u32;
    let piece = pick(4, max_piece as u64, u32_at(27) as u64) as u32;
    let nonce: [u8; 16] = b[31..47].try_into().expect("16 bytes");
    let hello = tcp::signed_hello((version, comm_id, from, to), (idx, socks, piece), nonce);
    if let Ok((f, i)) = tcp::hello(&hello, nsocks, max_piece) {
        let expected = (
            comm_id == tcp::COMM_ID && version == tcp::PROTOCOL_VERSION,
            to == 0,
            socks as usize == nsocks,
            piece as usize == max_piece,
        );
        assert_eq!(
            expected,
            (true, true, true, true),
            "accepted a hello for another setup"
        );
        assert!(
            (1..4).contains(&f) && f == from as usize,
            "accepted rank {f} (sent {from})"
        );
        assert!(
            i < nsocks && i == idx as usize,
            "accepted socket {i} (sent {idx})"
        );
    }
}

/// A failed-rank list of the agreement (`data[0]` is the communicator's
/// size): ranks in range, and a round trip.
pub fn agreement_set(data: &[u8]) {
    let (n, rest) = data
        .split_first()
        .map_or((8, data), |(n, r)| (*n as usize, r));
    if let Err(e) = sncl::fuzzing::agreement_set(rest, n) {
        panic!("agreement set decoder: {e}");
    }
}

/// The setup record every rank publishes: a round trip.
pub fn setup_record(data: &[u8]) {
    if let Err(e) = sncl::fuzzing::setup_record(data) {
        panic!("setup record decoder: {e}");
    }
}

/// Valid inputs of each target, the mutating driver's starting corpus.
pub fn seeds(name: &str) -> Vec<Vec<u8>> {
    let header_with = |checksum: Option<u32>| {
        let h = PieceHeader {
            checksum,
            comm_id: 0x5eed,
            seq: 3,
            len: 64,
            fingerprint: Some(comm_core::wire::Fingerprint {
                collective: comm_core::wire::Collective::AllReduce,
                dtype: comm_core::DataType::Float32,
                op: comm_core::ReduceOp::Sum,
                root: -1,
                count: 16,
                settings: 0,
            }),
        };
        let mut b = [0u8; HEADER_BYTES];
        h.encode(&mut b);
        b
    };
    let header = header_with(None);
    // The pieces after a message's first: no fingerprint, short header.
    let short = {
        let mut b = [0u8; HEADER_BYTES];
        let h = PieceHeader {
            fingerprint: None,
            ..PieceHeader::decode(&header).expect("a valid header")
        };
        let n = h.encode(&mut b);
        b[..n].to_vec()
    };
    let frame = |body: &[u8]| {
        let mut v = (body.len() as u32).to_le_bytes().to_vec();
        v.extend_from_slice(body);
        v
    };
    let key = |op: u8, extra: &[u8], k: &str| {
        let mut v = vec![op];
        v.extend_from_slice(extra);
        v.extend_from_slice(&(k.len() as u32).to_le_bytes());
        v.extend_from_slice(k.as_bytes());
        v
    };
    let uid = UniqueId::new("198.18.0.1:29500".parse().expect("address"))
        .expect("random secret")
        .to_bytes()
        .to_vec();
    match name {
        "store_frame" => vec![frame(b"hello"), frame(&[]), vec![]],
        "store_request" => vec![
            key(1, &[], "key"),
            key(2, &[0; 8], "key"),
            key(3, &[], "key"),
            {
                let mut v = vec![4];
                v.extend_from_slice(&[0; 8]);
                v.extend_from_slice(&2u32.to_le_bytes());
                v.extend_from_slice(&key(0, &[], "a")[1..]);
                v.extend_from_slice(&key(0, &[], "b")[1..]);
                v
            },
            key(5, &7u64.to_le_bytes(), "n"),
        ],
        "store_client" | "store_client_socket" => vec![
            [&[1u8][..], &frame(&[0])].concat(),
            [&[1u8][..], &frame(&[2, 1, 0, 0, 0, 1, 0, 0, 0, b'a'])].concat(),
            [&[1u8][..], &frame(&[0, 1, 0, 0, 0, 0, 0, 0, 0])].concat(),
            b"\x00SNCLSTR1................".to_vec(),
        ],
        "tcp_greeting" => {
            let mut g = b"STCG\x02\x00".to_vec();
            g.resize(32, 9);
            vec![g]
        }
        "tcp_hello" => vec![
            [&[0x01u8][..], &tcp::valid_hello(1, 0, 2, 4096, [1; 16])].concat(),
            [&[0x13u8][..], &tcp::valid_hello(3, 3, 4, 8192, [2; 16])].concat(),
        ],
        "tcp_hello_signed" => vec![
            // Rank 1, socket 0 of 2, 4 KiB pieces, every checked field kept.
            [&[0x01u8][..], &tcp::PROTOCOL_VERSION.to_le_bytes(), &[0; 8], &1u32.to_le_bytes(), &[0; 4], &[0; 4], &[0; 4], &[0; 4], &[7; 16], &[0x1f]].concat(),
            // Rank 3, socket 3 of 4, nothing kept: fields as given.
            [&[0x13u8][..], &tcp::PROTOCOL_VERSION.to_le_bytes(), &0x5eedu64.to_le_bytes(), &3u32.to_le_bytes(), &[0; 4], &3u32.to_le_bytes(), &4u32.to_le_bytes(), &8192u32.to_le_bytes(), &[9; 16], &[0]].concat(),
        ],
        "tcp_ack" => vec![tcp::valid_ack(&tcp::valid_hello(1, 0, 2, 1 << 19, [3; 16])).to_vec()],
        "tcp_data" => vec![
            [&[12u8][..], &header[..], &[0u8; 64]].concat(),
            // A later piece of a message: the short header.
            [&[12u8][..], &short[..], &[0u8; 64]].concat(),
            // A checksummed frame: CRC32C field zero, the CRC in a trailer.
            [
                &[12u8][..],
                &header_with(Some(0))[..],
                &[0u8; 64],
                &comm_core::wire::piece_checksum(&[0u8; 64]).to_le_bytes(),
            ]
            .concat(),
            {
                let mut a = b"ABRT".to_vec();
                a.extend_from_slice(&1u32.to_le_bytes());
                a.resize(HEADER_BYTES, 0);
                [&[12u8][..], &a[..]].concat()
            },
        ],
        "piece_header" => vec![header.to_vec(), short.clone()],
        "shm_slot_header" => vec![[&[10u8][..], &header[..]].concat()],
        "gdr_board" => vec![{
            // magic "SNCLGDR1", yes, inbox address / rkey / bytes, no reason
            let words: [u64; 6] = [
                0x534e_434c_4744_5231,
                1,
                0x7f00_0000_0000,
                0x1234,
                4 << 20,
                0,
            ];
            words.iter().flat_map(|w| w.to_le_bytes()).collect()
        }],
        "nvlink_board" => vec![transport_nvlink::Board {
            backend: device::Backend::Emu,
            ordinal: 1,
            pid: 4242,
            token: 0x5eed_1234,
            slots: 8,
            slot_bytes: 1 << 20,
            addr: 0x7f00_0000_0000,
            handle: device::IpcHandle([7; 64]),
            bus_id: "0000:E1:00.0".into(),
        }
        .encode()
        .to_vec()],
        "topofile" => vec![
            b"intra.bandwidth = 20GB/s\ninter.bandwidth = 100mbit\ninter.latency = 5us\n".to_vec(),
            b"# nodes\nnode.0 = a\nnode.1 = b\nnodes = 2\nranks_per_node = 4\n".to_vec(),
            b"inter.burst = 1MB\ninter.oversubscription = 2\nintra.reduce_bandwidth = 10GB/s\n"
                .to_vec(),
        ],
        "unique_id" => vec![uid.clone(), {
            let id =
                UniqueId::from_bytes(&uid.clone().try_into().expect("128 bytes")).expect("valid");
            id.to_hex().into_bytes()
        }],
        "settings_value" => (0..SETTINGS.len() as u8)
            .flat_map(|i| [vec![i, b'1'], [&[i][..], b"auto"].concat()])
            .chain([[&[0u8][..], Config::default().shared_digest().as_bytes()].concat()])
            .collect(),
        "settings_file" => {
            vec![b"SNCL_NSOCKS=4\n# comment\nSNCL_ALGO = all_reduce:ring\n".to_vec()]
        }
        "agreement_set" => [(8u8, &[0usize, 5, 7][..]), (3, &[]), (64, &[1, 63])]
            .iter()
            .map(|(n, ranks)| [&[*n][..], &sncl::fuzzing::encoded_set(ranks)].concat())
            .collect(),
        "setup_record" => vec![
            b"node-a\n-\nalgo=auto;nsocks=2\n127.0.0.1:4000\nkind shm ready sncl-seg-1\nkind tcp ready 127.0.0.1:4001\nkind rdma unavailable no device".to_vec(),
            b"[::1]:1\n-\n\n[::1]:9\nkind tcp ready".to_vec(),
        ],
        _ => vec![Vec::new()],
    }
}
