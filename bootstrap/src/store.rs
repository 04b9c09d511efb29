//! The key-value store ranks rendezvous through, in the shape of Gloo's
//! rendezvous store and PyTorch's c10d `Store`: `set`, blocking `get` and
//! `wait`, `try_get` and an atomic counter `add`.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use comm_core::{Error, Result};

pub use comm_core::store::Store;

/// A view of another store in which every key is prefixed with
/// `"{prefix}/"`, so that independent users (communicators, retries, splits)
/// share one store without colliding. Prefix stores nest.
#[derive(Debug, Clone)]
pub struct PrefixStore<S: Store> {
    prefix: String,
    inner: S,
}

impl<S: Store> PrefixStore<S> {
    /// Wraps `inner`; key `k` becomes `"{prefix}/k"` in `inner`.
    pub fn new(prefix: impl Into<String>, inner: S) -> Self {
        PrefixStore {
            prefix: prefix.into(),
            inner,
        }
    }

    /// The prefix (without the trailing `/`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Unwraps the store.
    pub fn into_inner(self) -> S {
        self.inner
    }

    fn key(&self, key: &str) -> String {
        format!("{}/{}", self.prefix, key)
    }
}

impl<S: Store> Store for PrefixStore<S> {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.inner.set(&self.key(key), value)
    }
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.inner.get(&self.key(key), timeout)
    }
    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.inner.try_get(&self.key(key))
    }
    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        let full: Vec<String> = keys.iter().map(|k| self.key(k)).collect();
        let refs: Vec<&str> = full.iter().map(String::as_str).collect();
        self.inner.wait(&refs, timeout)
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.inner.add(&self.key(key), delta)
    }
}

/// A barrier over a store: each of `world_size` callers increments
/// `"{key}/arrived"`; the last one sets `"{key}/done"`, which everyone waits
/// for. Use a fresh `key` for every barrier.
pub fn store_barrier<S: Store + ?Sized>(
    store: &S,
    key: &str,
    world_size: usize,
    timeout: Duration,
) -> Result<()> {
    let arrived = store.add(&format!("{key}/arrived"), 1)?;
    let done = format!("{key}/done");
    if arrived == world_size as i64 {
        store.set(&done, b"1")?;
    }
    store.wait(&[&done], timeout)
}

/// How a wait in the shared map ended.
#[derive(Debug)]
pub(crate) enum WaitOutcome {
    Ready,
    TimedOut { missing: Vec<String> },
    Closed,
}

/// Why an `add` was refused.
#[derive(Debug)]
pub(crate) enum AddError {
    NotAnInteger(String),
    Overflow(i64),
    Closed,
}

impl std::fmt::Display for AddError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AddError::NotAnInteger(v) => write!(
                f,
                "the key holds {v:?}, not a decimal integer; use a key that only add() writes"
            ),
            AddError::Overflow(v) => write!(f, "the counter (at {v}) would overflow i64"),
            AddError::Closed => write!(f, "the store was closed"),
        }
    }
}

#[derive(Default)]
struct State {
    map: HashMap<String, Vec<u8>>,
    closed: bool,
}

/// The state behind a [`MemoryStore`] and behind the TCP store server.
#[derive(Default)]
pub(crate) struct Shared {
    state: Mutex<State>,
    /// Wakes threads blocked in [`Shared::wait`].
    changed: Condvar,
    /// Wakes the server's tasks in [`Shared::wait_async`].
    changed_async: tokio::sync::Notify,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is a plain map that is never left half-updated, so a
        // panic elsewhere while holding the lock does not invalidate it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Returns false when the store is closed.
    pub(crate) fn set(&self, key: &str, value: &[u8]) -> bool {
        let mut st = self.lock();
        if st.closed {
            return false;
        }
        st.map.insert(key.to_owned(), value.to_vec());
        drop(st);
        self.notify_changed();
        true
    }

    /// `Err(())` when the store is closed.
    pub(crate) fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, ()> {
        let st = self.lock();
        if st.closed {
            return Err(());
        }
        Ok(st.map.get(key).cloned())
    }

    pub(crate) fn add(&self, key: &str, delta: i64) -> Result<i64, AddError> {
        let mut st = self.lock();
        if st.closed {
            return Err(AddError::Closed);
        }
        let old = match st.map.get(key) {
            None => 0,
            Some(v) => std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.trim().parse::<i64>().ok())
                .ok_or_else(|| AddError::NotAnInteger(String::from_utf8_lossy(v).into_owned()))?,
        };
        let new = old.checked_add(delta).ok_or(AddError::Overflow(old))?;
        st.map.insert(key.to_owned(), new.to_string().into_bytes());
        drop(st);
        self.notify_changed();
        Ok(new)
    }

    /// How a wait for `keys` ends now, if it ends: ready (keys present;
    /// this wins over a close, so a waiter woken by the set it waited for
    /// still gets its answer when the store closes right after), closed,
    /// or timed out once `expired`.
    fn wait_outcome(
        st: &State,
        keys: &[&str],
        fetch: bool,
        expired: bool,
    ) -> Option<(WaitOutcome, Option<Vec<u8>>)> {
        if keys.iter().all(|k| st.map.contains_key(*k)) {
            let value = if fetch {
                keys.first().and_then(|k| st.map.get(*k).cloned())
            } else {
                None
            };
            return Some((WaitOutcome::Ready, value));
        }
        if st.closed {
            return Some((WaitOutcome::Closed, None));
        }
        if expired {
            let missing = keys
                .iter()
                .filter(|k| !st.map.contains_key(**k))
                .map(|k| k.to_string())
                .collect();
            return Some((WaitOutcome::TimedOut { missing }, None));
        }
        None
    }

    /// Waits until all `keys` are set; with `fetch`, returns the value of
    /// the first key. Blocks the calling thread (the in-process store).
    pub(crate) fn wait(
        &self,
        keys: &[&str],
        timeout: Duration,
        fetch: bool,
    ) -> (WaitOutcome, Option<Vec<u8>>) {
        // A deadline too far to represent means "no deadline".
        let deadline = Instant::now().checked_add(timeout);
        let mut st = self.lock();
        loop {
            let now = Instant::now();
            let expired = deadline.is_some_and(|d| now >= d);
            if let Some(outcome) = Self::wait_outcome(&st, keys, fetch, expired) {
                return outcome;
            }
            st = match deadline {
                Some(d) => {
                    self.changed
                        .wait_timeout(st, d - now)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
                None => self
                    .changed
                    .wait(st)
                    .unwrap_or_else(PoisonError::into_inner),
            };
        }
    }

    /// [`Self::wait`] for the store server's event loop: the task yields
    /// instead of blocking its thread.
    pub(crate) async fn wait_async(
        &self,
        keys: &[&str],
        timeout: Duration,
        fetch: bool,
    ) -> (WaitOutcome, Option<Vec<u8>>) {
        let deadline = tokio::time::Instant::now().checked_add(timeout);
        loop {
            // Registered before the state is read, so a change between the
            // read and the await still wakes this task.
            let notified = self.changed_async.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let expired = deadline.is_some_and(|d| tokio::time::Instant::now() >= d);
            if let Some(outcome) = Self::wait_outcome(&self.lock(), keys, fetch, expired) {
                return outcome;
            }
            match deadline {
                Some(d) => {
                    tokio::select! {
                        _ = &mut notified => {}
                        _ = tokio::time::sleep_until(d) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Wakes every waiter with [`WaitOutcome::Closed`] and refuses further use.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.notify_changed();
    }

    fn notify_changed(&self) {
        self.changed.notify_all();
        self.changed_async.notify_waiters();
    }
}

/// An in-process [`Store`]: a `Mutex<HashMap>` plus a `Condvar`. Clones are
/// handles to the same map, so ranks run as threads of one test can each get
/// one (use [`MemoryStore::for_rank`] so errors name the right rank).
#[derive(Clone, Default)]
pub struct MemoryStore {
    shared: Arc<Shared>,
    rank: usize,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("rank", &self.rank)
            .field("keys", &self.shared.lock().map.len())
            .finish()
    }
}

impl MemoryStore {
    /// An empty store; its handle reports errors as rank 0.
    pub fn new() -> Self {
        Self::default()
    }

    pub(crate) fn from_shared(shared: Arc<Shared>, rank: usize) -> Self {
        MemoryStore { shared, rank }
    }

    /// Another handle to the same map whose errors name `rank`.
    pub fn for_rank(&self, rank: usize) -> MemoryStore {
        MemoryStore {
            shared: Arc::clone(&self.shared),
            rank,
        }
    }

    /// The rank this handle reports in errors.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Closes the store for every handle: current and later operations
    /// fail with an error instead of blocking, except a `get` or `wait`
    /// whose keys are all set (it answers, as it would have a moment
    /// before).
    pub fn close(&self) {
        self.shared.close();
    }

    fn closed(&self, what: &str) -> Error {
        Error::Bootstrap {
            rank: self.rank,
            detail: format!(
                "in-process store closed during {what}; the job is shutting down or was aborted"
            ),
        }
    }

    fn timed_out(&self, op: &str, missing: &[String], timeout: Duration) -> Error {
        Error::Bootstrap {
            rank: self.rank,
            detail: format!(
                "in-process store {op} timed out after {} ms waiting for key(s) {}; \
                 the rank(s) that set them failed or have not reached this point yet",
                timeout.as_millis(),
                quote_keys(missing)
            ),
        }
    }
}

/// `'a', 'b'` for error messages.
pub(crate) fn quote_keys<S: AsRef<str>>(keys: &[S]) -> String {
    keys.iter()
        .map(|k| format!("'{}'", k.as_ref()))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Store for MemoryStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        if self.shared.set(key, value) {
            Ok(())
        } else {
            Err(self.closed(&format!("set of key '{key}'")))
        }
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        match self.shared.wait(&[key], timeout, true) {
            (WaitOutcome::Ready, Some(v)) => Ok(v),
            (WaitOutcome::Ready, None) => unreachable!("fetch of a present key"),
            (WaitOutcome::TimedOut { missing }, _) => Err(self.timed_out("get", &missing, timeout)),
            (WaitOutcome::Closed, _) => Err(self.closed(&format!("get of key '{key}'"))),
        }
    }

    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.shared
            .try_get(key)
            .map_err(|()| self.closed(&format!("try_get of key '{key}'")))
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        match self.shared.wait(keys, timeout, false).0 {
            WaitOutcome::Ready => Ok(()),
            WaitOutcome::TimedOut { missing } => Err(self.timed_out("wait", &missing, timeout)),
            WaitOutcome::Closed => Err(self.closed(&format!("wait for {}", quote_keys(keys)))),
        }
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.shared.add(key, delta).map_err(|e| match e {
            AddError::Closed => self.closed(&format!("add to key '{key}'")),
            e => Error::Bootstrap {
                rank: self.rank,
                detail: format!("in-process store add({delta}) to key '{key}' failed: {e}"),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    const T: Duration = Duration::from_secs(10);

    #[test]
    fn set_get_try_get() {
        let s = MemoryStore::new();
        assert_eq!(s.try_get("a").unwrap(), None);
        s.set("a", b"1").unwrap();
        assert_eq!(s.try_get("a").unwrap().as_deref(), Some(&b"1"[..]));
        assert_eq!(s.get("a", T).unwrap(), b"1");
        s.set("a", b"2").unwrap();
        assert_eq!(s.get("a", Duration::ZERO).unwrap(), b"2");
    }

    #[test]
    fn threads_get_wait_add() {
        let world = 8;
        let store = MemoryStore::new();
        let handles: Vec<_> = (0..world)
            .map(|r| {
                let s = store.for_rank(r);
                thread::spawn(move || {
                    s.set(&format!("addr/{r}"), format!("host{r}").as_bytes())
                        .unwrap();
                    for p in 0..world {
                        let v = s.get(&format!("addr/{p}"), T).unwrap();
                        assert_eq!(v, format!("host{p}").as_bytes());
                    }
                    let n = s.add("count", 1).unwrap();
                    assert!((1..=world as i64).contains(&n));
                    store_barrier(&s, "b0", world, T).unwrap();
                    assert_eq!(s.get("count", T).unwrap(), world.to_string().as_bytes());
                    let keys: Vec<String> = (0..world).map(|p| format!("addr/{p}")).collect();
                    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                    s.wait(&refs, T).unwrap();
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(store.add("count", -3).unwrap(), world as i64 - 3);
    }

    #[test]
    fn get_timeout_names_key_and_rank() {
        let s = MemoryStore::new().for_rank(5);
        let t0 = Instant::now();
        let err = s
            .get("never/set", Duration::from_millis(50))
            .unwrap_err()
            .to_string();
        assert!(t0.elapsed() >= Duration::from_millis(50));
        assert!(err.contains("rank 5"), "{err}");
        assert!(err.contains("'never/set'"), "{err}");
        assert!(err.contains("50 ms"), "{err}");

        s.set("present", b"x").unwrap();
        let err = s
            .wait(&["present", "missing"], Duration::from_millis(20))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("'missing'") && !err.contains("'present'"),
            "{err}"
        );
    }

    #[test]
    fn add_rejects_non_integer() {
        let s = MemoryStore::new();
        s.set("k", b"hello").unwrap();
        let err = s.add("k", 1).unwrap_err().to_string();
        assert!(err.contains("'k'") && err.contains("hello"), "{err}");
        s.set("m", &i64::MAX.to_string().into_bytes()).unwrap();
        assert!(s.add("m", 1).is_err());
    }

    #[test]
    fn close_wakes_waiters() {
        let s = MemoryStore::new();
        let s2 = s.for_rank(1);
        let h = thread::spawn(move || s2.get("x", Duration::from_secs(3600)));
        thread::sleep(Duration::from_millis(20));
        s.close();
        let err = h.join().unwrap().unwrap_err().to_string();
        assert!(err.contains("rank 1") && err.contains("'x'"), "{err}");
    }

    #[test]
    fn prefix_store_composes() {
        let base = MemoryStore::new();
        let shared: Arc<dyn Store> = Arc::new(base.clone());
        let p = PrefixStore::new("comm1", Arc::clone(&shared));
        let pp = PrefixStore::new("split0", &p);
        p.set("a", b"1").unwrap();
        pp.set("b", b"2").unwrap();
        assert_eq!(base.try_get("comm1/a").unwrap().unwrap(), b"1");
        assert_eq!(base.try_get("comm1/split0/b").unwrap().unwrap(), b"2");
        assert_eq!(pp.add("c", 2).unwrap(), 2);
        assert_eq!(base.get("comm1/split0/c", T).unwrap(), b"2");
        pp.wait(&["b", "c"], T).unwrap();
        let err = pp
            .get("zz", Duration::from_millis(1))
            .unwrap_err()
            .to_string();
        assert!(err.contains("'comm1/split0/zz'"), "{err}");
        let boxed: Box<dyn Store> = Box::new(pp);
        assert_eq!(boxed.try_get("b").unwrap().unwrap(), b"2");
    }
}
