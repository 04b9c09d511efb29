//! Entry points of the store's decoders for the fuzz targets and property
//! tests in `fuzz/` (not API: hidden from the docs, may change at any time).
//!
//! Each takes bytes as a peer would send them and must return (an error or
//! a value), never panic, hang or allocate beyond the protocol's limits.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::protocol::{self, *};
use super::wire::{Attempt, Wire};
use super::{server, TcpStore};
use crate::Store;

/// The secret of the fake roots ([`memory_session`], [`FakeRoot`]).
const SECRET: [u8; 16] = *b"sncl-fuzz-secret";

/// Reads one store frame from `bytes` (what the server and the client do
/// with every message).
pub fn read_frame(bytes: &[u8]) -> io::Result<Option<Vec<u8>>> {
    protocol::read_frame(&mut &bytes[..])
}

/// Runs the server's request handler on `frame` against a fresh store.
/// GET and WAIT carry a timeout the server honours; it is zeroed here so a
/// fuzz input cannot make the harness wait.
pub fn handle_request(frame: &[u8]) -> io::Result<Option<Vec<u8>>> {
    let mut f = frame.to_vec();
    if matches!(f.first(), Some(&OP_GET) | Some(&OP_WAIT)) && f.len() >= 9 {
        f[1..9].fill(0);
    }
    server::handle_request_fresh(&f)
}

/// A store root in memory, as the client's [`Wire`]: it greets and answers
/// the client's proof correctly (when `authentic`), then sends `script`
/// and reaches end of stream; what the client writes is taken and dropped.
/// Reads never block, so a session needs no deadline to end.
struct ScriptedRoot {
    authentic: bool,
    /// The client's proof, until it is complete.
    proof: Vec<u8>,
    /// The bytes the client reads, from `pos`.
    out: Vec<u8>,
    pos: usize,
    /// The bytes sent after the handshake (or instead of one).
    script: Vec<u8>,
}

/// The server nonce of [`ScriptedRoot`]'s greeting.
const SNONCE: [u8; NONCE] = [7; NONCE];

impl ScriptedRoot {
    fn new(authentic: bool, script: &[u8]) -> ScriptedRoot {
        let mut out = Vec::new();
        if authentic {
            out.extend_from_slice(MAGIC);
            out.extend_from_slice(&SNONCE);
        } else {
            out.extend_from_slice(script);
        }
        ScriptedRoot {
            authentic,
            proof: Vec::new(),
            out,
            pos: 0,
            script: script.to_vec(),
        }
    }
}

impl Read for ScriptedRoot {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min(self.out.len() - self.pos);
        buf[..n].copy_from_slice(&self.out[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

impl Write for ScriptedRoot {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.authentic && self.proof.len() < PROOF_BYTES {
            let take = buf.len().min(PROOF_BYTES - self.proof.len());
            self.proof.extend_from_slice(&buf[..take]);
            if self.proof.len() == PROOF_BYTES {
                let rank = u64::from_le_bytes(self.proof[8..16].try_into().expect("8 bytes"));
                let cnonce = &self.proof[16..16 + NONCE];
                self.out.push(AUTH_OK);
                self.out
                    .extend_from_slice(&server_mac(&SECRET, &SNONCE, cnonce, rank));
                self.out.extend_from_slice(&self.script);
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Wire for ScriptedRoot {
    fn set_timeouts(&mut self, _read: Duration, _write: Duration) -> io::Result<()> {
        Ok(())
    }

    fn close(&mut self) {
        self.pos = self.out.len();
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
    }
}

/// What [`FakeRoot::session`] does, with the root in memory instead of on
/// a loopback socket (no connection per input): the client's handshake and
/// every store operation run against a root that sends `server_bytes`
/// (after a correct handshake when `authentic`, else instead of one) and
/// then ends the stream. Returns the first error the client reported.
pub fn memory_session(authentic: bool, server_bytes: &[u8]) -> comm_core::Result<()> {
    let root = SocketAddr::from((Ipv4Addr::LOCALHOST, 29500));
    let wire = Box::new(ScriptedRoot::new(authentic, server_bytes));
    let store = match TcpStore::over(wire, root, &SECRET, 1, Duration::from_secs(1)) {
        Ok(s) => s,
        Err(Attempt::Fatal(e)) => return Err(e),
        Err(Attempt::Retry(source)) => {
            return Err(comm_core::Error::Io {
                rank: 1,
                context: format!("handshake with the sncl root at {root}"),
                source,
            })
        }
    };
    operations(&store.with_io_timeout(Duration::from_millis(500)))
}

/// Every store operation with a zero timeout; the first error.
fn operations(store: &TcpStore) -> comm_core::Result<()> {
    let zero = Duration::ZERO;
    let r1 = store.try_get("k").map(drop);
    let r2 = store.get("k", zero).map(drop);
    let r3 = store.wait(&["a", "b"], zero);
    let r4 = store.add("k", 1).map(drop);
    let r5 = store.set("k", b"v");
    r1.and(r2).and(r3).and(r4).and(r5)
}

/// A fake store root on loopback that answers every connection with fixed
/// bytes, for [`FakeRoot::session`] (the real socket path of
/// [`memory_session`]).
pub struct FakeRoot {
    addr: SocketAddr,
    script: Arc<std::sync::Mutex<(bool, Vec<u8>)>>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl std::fmt::Debug for FakeRoot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeRoot")
            .field("addr", &self.addr)
            .finish()
    }
}

fn serve(mut s: TcpStream, authentic: bool, bytes: &[u8]) -> io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.set_write_timeout(Some(Duration::from_secs(2)))?;
    if authentic {
        let snonce = [7u8; NONCE];
        let mut greeting = [0u8; GREETING_BYTES];
        greeting[..8].copy_from_slice(MAGIC);
        greeting[8..].copy_from_slice(&snonce);
        s.write_all(&greeting)?;
        let mut proof = [0u8; PROOF_BYTES];
        s.read_exact(&mut proof)?;
        let rank = u64::from_le_bytes(proof[8..16].try_into().expect("8 bytes"));
        let cnonce = &proof[16..16 + NONCE];
        let mut ok = vec![AUTH_OK];
        ok.extend_from_slice(&server_mac(&SECRET, &snonce, cnonce, rank));
        s.write_all(&ok)?;
    }
    s.write_all(bytes)?;
    s.shutdown(Shutdown::Write)?;
    // Take whatever the client sends until it closes.
    let mut sink = [0u8; 4096];
    while s.read(&mut sink)? > 0 {}
    Ok(())
}

impl FakeRoot {
    /// Starts the fake root on an ephemeral loopback port.
    pub fn start() -> io::Result<FakeRoot> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let script = Arc::new(std::sync::Mutex::new((false, Vec::new())));
        let stop = Arc::new(AtomicBool::new(false));
        let (script2, stop2) = (Arc::clone(&script), Arc::clone(&stop));
        let thread = thread::spawn(move || {
            while !stop2.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((s, _)) => {
                        let _ = s.set_nonblocking(false);
                        let (authentic, bytes) = script2
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .clone();
                        let _ = serve(s, authentic, &bytes);
                    }
                    Err(_) => thread::sleep(Duration::from_micros(200)),
                }
            }
        });
        Ok(FakeRoot {
            addr,
            script,
            stop,
            thread: Some(thread),
        })
    }

    /// Connects a [`TcpStore`] client to the fake root, which sends
    /// `server_bytes` (after a correct handshake when `authentic`, else
    /// instead of one), then runs every store operation with a zero timeout.
    /// Returns the first error the client reported, or `Ok` when everything
    /// was accepted.
    pub fn session(&self, authentic: bool, server_bytes: &[u8]) -> comm_core::Result<()> {
        *self
            .script
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            (authentic, server_bytes.to_vec());
        let deadline = Instant::now() + Duration::from_millis(5);
        let store = TcpStore::connect(self.addr, SECRET, 1, deadline)?
            .with_io_timeout(Duration::from_millis(500));
        operations(&store)
    }
}

impl Drop for FakeRoot {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(body: &[u8]) -> Vec<u8> {
        let mut v = (body.len() as u32).to_le_bytes().to_vec();
        v.extend_from_slice(body);
        v
    }

    /// The in-memory root runs the client's real handshake and requests:
    /// right replies to all five operations succeed; a short reply, a
    /// wrong status and a non-store greeting fail, naming why.
    #[test]
    fn memory_session_runs_the_client_logic() {
        let mut good = Vec::new();
        for body in [
            &[ST_OK, b'v'][..],
            &[ST_OK],
            &[ST_OK],
            &[ST_OK, 1, 0, 0, 0, 0, 0, 0, 0],
            &[ST_OK],
        ] {
            good.extend_from_slice(&frame(body));
        }
        memory_session(true, &good).expect("right replies are accepted");
        let e = memory_session(true, &good[..good.len() - 1]).unwrap_err();
        assert!(e.to_string().contains("store set of key 'k'"), "{e}");
        let mut bad_add = good.clone();
        bad_add[20] = 4; // the add reply's status byte: an unknown status
        let e = memory_session(true, &bad_add).unwrap_err();
        assert!(e.to_string().contains("unexpected reply"), "{e}");
        let e = memory_session(false, b"HTTP/1.1 400 Bad Request\r\n\r\n").unwrap_err();
        assert!(e.to_string().contains("not an sncl store"), "{e}");
    }
}
