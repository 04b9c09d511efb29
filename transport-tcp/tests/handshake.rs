//! The setup handshake against recorded traffic: a hello (or a greeting and
//! ack) captured from a real connection, replayed on a new one, is refused.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use comm_core::transport::Connection;
use comm_core::Error;
use transport_tcp::{TcpEndpoint, TcpSetup};

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const SECRET: [u8; 16] = *b"fedcba9876543210";
const COMM: u64 = 0xfeed_beef;
/// Greeting, hello and ack sizes of protocol version 2.
const GREETING: usize = 32;
const HELLO: usize = 96;
const ACK: usize = 32;

fn setup(rank: usize) -> TcpSetup {
    TcpSetup {
        rank,
        comm_id: COMM,
        secret: SECRET,
        nsocks: 1,
        max_piece: 4096,
        deadline: Instant::now() + Duration::from_secs(10),
        pacing: Default::default(),
        tls: None,
    }
}

/// Bytes seen on one proxied connection, each direction.
#[derive(Default)]
struct Recording {
    to_server: Mutex<Vec<u8>>,
    to_client: Mutex<Vec<u8>>,
}

/// Copies `from` to `to`, recording every byte, until either side closes.
fn pump(mut from: TcpStream, mut to: TcpStream, log: Arc<Recording>, to_server: bool) {
    let mut buf = [0u8; 4096];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let rec = if to_server {
                    &log.to_server
                } else {
                    &log.to_client
                };
                rec.lock().unwrap().extend_from_slice(&buf[..n]);
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// A recording TCP proxy to `upstream` for one connection.
fn recording_proxy(upstream: SocketAddr) -> (SocketAddr, thread::JoinHandle<Arc<Recording>>) {
    let listener = TcpListener::bind((LOCALHOST, 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    let handle = thread::spawn(move || {
        let (client, _) = listener.accept().unwrap();
        let server = TcpStream::connect(upstream).unwrap();
        let log = Arc::new(Recording::default());
        let (c2, s2, l2) = (
            client.try_clone().unwrap(),
            server.try_clone().unwrap(),
            log.clone(),
        );
        thread::spawn(move || pump(c2, s2, l2, true));
        let l3 = log.clone();
        thread::spawn(move || pump(server, client, l3, false));
        log
    });
    (addr, handle)
}

/// A real rank 1 → rank 0 setup through a recording proxy; returns what the
/// connector sent (the hello) and what the acceptor sent (greeting + ack).
fn record_a_real_setup() -> (Vec<u8>, Vec<u8>) {
    let ep0 = TcpEndpoint::bind(LOCALHOST).unwrap();
    let ep1 = TcpEndpoint::bind(LOCALHOST).unwrap();
    let (addr0, addr1) = (ep0.local_addr(), ep1.local_addr());
    let (proxy, recording) = recording_proxy(addr0);
    let t = thread::spawn(move || ep1.establish(&setup(1), &[(0, proxy)]).unwrap());
    let c0 = ep0.establish(&setup(0), &[(1, addr1)]).unwrap();
    let c1 = t.join().unwrap();
    let rec = recording.join().unwrap();
    let hello = rec.to_server.lock().unwrap().clone();
    let answers = rec.to_client.lock().unwrap().clone();
    drop((c0, c1));
    assert_eq!(hello.len(), HELLO, "one hello from the connector");
    assert_eq!(answers.len(), GREETING + ACK, "one greeting and one ack");
    (hello, answers)
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct LogBuf(Arc<Mutex<Vec<u8>>>);

impl Write for LogBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Connects to `addr`, reads the greeting, sends `hello`; returns the
/// greeting and everything the acceptor sent back before closing.
fn send_after_greeting(addr: SocketAddr, hello: &[u8]) -> (Vec<u8>, Vec<u8>, SocketAddr) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let local = s.local_addr().unwrap();
    let mut greeting = vec![0u8; GREETING];
    s.read_exact(&mut greeting).unwrap();
    s.write_all(hello).unwrap();
    let mut rest = Vec::new();
    // Returns once the acceptor closes the connection; a reset counts too.
    let _ = s.read_to_end(&mut rest);
    (greeting, rest, local)
}

#[test]
fn a_recorded_hello_replayed_to_a_new_acceptor_is_refused() {
    let (hello, answers) = record_a_real_setup();

    let ep0 = TcpEndpoint::bind(LOCALHOST).unwrap();
    let ep1 = TcpEndpoint::bind(LOCALHOST).unwrap();
    let (addr0, addr1) = (ep0.local_addr(), ep1.local_addr());
    let attacker = thread::spawn(move || {
        // The recorded hello, byte for byte: right secret, communicator and
        // ranks, but signed over another connection's nonce.
        let replay = send_after_greeting(addr0, &hello);
        // A peer of protocol version 1 (no nonces), refused at its version.
        let mut v1 = [0u8; 64];
        v1[..4].copy_from_slice(b"STCP");
        v1[4] = 1;
        let old = send_after_greeting(addr0, &v1);
        // Then the real rank 1 joins.
        let conns = ep1.establish(&setup(1), &[(0, addr0)]).unwrap();
        (replay, old, conns)
    });
    let logs = LogBuf::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let conns0 =
        tracing::subscriber::with_default(subscriber, || ep0.establish(&setup(0), &[(1, addr1)]))
            .unwrap();
    let ((greeting, replay_answer, replay_addr), (_, old_answer, old_addr), conns1) =
        attacker.join().unwrap();
    let logs = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    eprintln!("captured logs:\n{logs}");

    assert_ne!(
        &greeting[16..],
        &answers[16..GREETING],
        "every greeting carries a fresh nonce"
    );
    assert!(
        replay_answer.is_empty(),
        "the replayed hello got an answer: {replay_answer:?}"
    );
    assert!(old_answer.is_empty(), "{old_answer:?}");
    let replay_line = logs
        .lines()
        .find(|l| l.contains(&replay_addr.to_string()))
        .unwrap_or_else(|| panic!("no log line for the replay from {replay_addr}: {logs}"));
    assert!(replay_line.contains("WARN"), "{replay_line}");
    assert!(
        replay_line.contains("replayed hello") && replay_line.contains("claiming rank 1"),
        "{replay_line}"
    );
    assert!(replay_line.contains("rank=0"), "{replay_line}");
    let old_line = logs
        .lines()
        .find(|l| l.contains(&old_addr.to_string()))
        .unwrap_or_else(|| panic!("no log line for the v1 peer from {old_addr}: {logs}"));
    assert!(old_line.contains("protocol version 1"), "{old_line}");
    assert_eq!((conns0.len(), conns1.len()), (1, 1));
    assert_eq!((conns0[0].peer(), conns1[0].peer()), (1, 0));
}

#[test]
fn a_recorded_greeting_and_ack_replayed_to_a_new_connector_are_refused() {
    let (_, answers) = record_a_real_setup();

    // A fake rank 0 that replays the recorded greeting, takes the hello and
    // replays the recorded ack.
    let fake = TcpListener::bind((LOCALHOST, 0)).unwrap();
    let fake_addr = fake.local_addr().unwrap();
    let impostor = thread::spawn(move || {
        let (mut s, _) = fake.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(&answers[..GREETING]).unwrap();
        let mut hello = [0u8; HELLO];
        s.read_exact(&mut hello).unwrap();
        s.write_all(&answers[GREETING..]).unwrap();
        // Keep the socket open until the connector gives up.
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    });
    let ep1 = TcpEndpoint::bind(LOCALHOST).unwrap();
    let e = ep1.establish(&setup(1), &[(0, fake_addr)]).unwrap_err();
    impostor.join().unwrap();
    match e {
        Error::Bootstrap { rank, detail } => {
            eprintln!("{detail}");
            assert_eq!(rank, 1);
            assert!(detail.contains("peer rank 0"), "{detail}");
            assert!(detail.contains(&fake_addr.to_string()), "{detail}");
            assert!(detail.contains("wrong acknowledgement"), "{detail}");
        }
        other => panic!("expected a bootstrap error, got {other:?}"),
    }
}

#[test]
fn an_acceptor_with_another_secret_is_refused_by_the_connector() {
    let ep0 = TcpEndpoint::bind(LOCALHOST).unwrap();
    let ep1 = TcpEndpoint::bind(LOCALHOST).unwrap();
    let (addr0, addr1) = (ep0.local_addr(), ep1.local_addr());
    let t = thread::spawn(move || {
        let mut s = setup(0);
        s.secret[5] ^= 1;
        s.deadline = Instant::now() + Duration::from_millis(300);
        ep0.establish(&s, &[(1, addr1)]).unwrap_err()
    });
    let e1 = ep1.establish(&setup(1), &[(0, addr0)]).unwrap_err();
    let e0 = t.join().unwrap();
    let detail = |e| match e {
        Error::Bootstrap { rank, detail } => (rank, detail),
        other => panic!("expected a bootstrap error, got {other:?}"),
    };
    let (r1, d1) = detail(e1);
    assert_eq!(r1, 1);
    assert!(d1.contains("peer rank 0") && d1.contains("refused"), "{d1}");
    let (r0, d0) = detail(e0);
    assert_eq!(r0, 0);
    assert!(d0.contains("timed out") && d0.contains("rank 1"), "{d0}");
    assert!(d0.contains("refused 1 connection"), "{d0}");
}

/// More idle connections than may wait for a hello (4,096) reach rank 0's
/// listener before rank 1: the longest-waiting stranger is dropped for
/// each newcomer, so rank 1 still gets in (it used to be refused: "too
/// many connections waiting to say hello", and the setup failed).
#[test]
fn idle_strangers_beyond_the_pending_bound_do_not_keep_a_rank_out() {
    let ep0 = TcpEndpoint::bind(LOCALHOST).unwrap();
    let ep1 = TcpEndpoint::bind(LOCALHOST).unwrap();
    let (addr0, addr1) = (ep0.local_addr(), ep1.local_addr());
    let strangers = 4096 + 512;
    let rank0 = thread::spawn(move || ep0.establish(&setup(0), &[(1, addr1)]));
    let mut held = Vec::with_capacity(strangers);
    for _ in 0..strangers {
        match TcpStream::connect_timeout(&addr0, Duration::from_secs(2)) {
            Ok(s) => held.push(s),
            Err(e) => panic!("stranger {} could not connect: {e}", held.len()),
        }
    }
    // Let rank 0 take them all before rank 1 arrives.
    thread::sleep(Duration::from_millis(500));
    let t = Instant::now();
    let conns1 = ep1
        .establish(&setup(1), &[(0, addr0)])
        .expect("rank 1 joins");
    let conns0 = rank0.join().unwrap().expect("rank 0 completes");
    eprintln!(
        "{} idle strangers held; rank 1 joined in {:?}",
        held.len(),
        t.elapsed()
    );
    assert_eq!((conns0.len(), conns1.len()), (1, 1));
    drop(held);
}

/// Rank 1 connects and sends its hello while rank 0 has not reached its
/// handshake yet (its endpoint accepts early); then more strangers than
/// may wait arrive. Rank 1, the longest waiting, is spared because its
/// whole hello is there; the strangers make room among themselves.
#[test]
fn a_rank_that_said_hello_before_the_handshake_is_not_dropped_for_strangers() {
    let ep0 = TcpEndpoint::bind(LOCALHOST).unwrap();
    let ep1 = TcpEndpoint::bind(LOCALHOST).unwrap();
    let (addr0, addr1) = (ep0.local_addr(), ep1.local_addr());
    let rank1 = thread::spawn(move || ep1.establish(&setup(1), &[(0, addr0)]));
    // Rank 0's early acceptor greets rank 1, which answers with its hello.
    thread::sleep(Duration::from_millis(300));
    let strangers = 4096 + 512;
    let mut held = Vec::with_capacity(strangers);
    for _ in 0..strangers {
        match TcpStream::connect_timeout(&addr0, Duration::from_secs(2)) {
            Ok(s) => held.push(s),
            Err(e) => panic!("stranger {} could not connect: {e}", held.len()),
        }
    }
    thread::sleep(Duration::from_millis(300));
    let conns0 = ep0
        .establish(&setup(0), &[(1, addr1)])
        .expect("rank 0 completes");
    let conns1 = rank1.join().unwrap().expect("rank 1, greeted early, joins");
    assert_eq!((conns0.len(), conns1.len()), (1, 1));
    drop(held);
}
