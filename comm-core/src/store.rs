//! The interface of the key-value store ranks rendezvous through (the
//! stores themselves — memory, TCP — are `sncl-bootstrap`'s). Transport
//! kinds exchange per-pair information through it at setup
//! ([`crate::transport::registry::SetupContext::store`]).

use std::sync::Arc;
use std::time::Duration;

use crate::error::Result;

/// A small key-value store shared by all ranks of a job during bootstrap.
///
/// Keys are UTF-8 strings, values are bytes. Values written by [`Store::add`]
/// are decimal ASCII integers (as in c10d), so `get` on a counter returns
/// e.g. `b"4"`. Every blocking call takes a timeout and fails with an error
/// naming the rank, the key(s) and the timeout instead of hanging.
pub trait Store: Send + Sync {
    /// Stores `value` under `key`, replacing any previous value and waking
    /// every waiter on `key`.
    fn set(&self, key: &str, value: &[u8]) -> Result<()>;

    /// Returns the value of `key`, waiting up to `timeout` for some rank to
    /// set it. Fails with an error naming the key when it does not appear.
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>>;

    /// Returns the value of `key` if it is set, without waiting.
    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>>;

    /// Waits up to `timeout` until every key in `keys` is set. The error on
    /// timeout lists the keys still missing.
    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()>;

    /// Atomically adds `delta` to the integer counter at `key` (a missing key
    /// counts as 0) and returns the new value.
    fn add(&self, key: &str, delta: i64) -> Result<i64>;
}

impl<S: Store + ?Sized> Store for &S {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        (**self).set(key, value)
    }
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        (**self).get(key, timeout)
    }
    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        (**self).try_get(key)
    }
    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        (**self).wait(keys, timeout)
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        (**self).add(key, delta)
    }
}

impl<S: Store + ?Sized> Store for Arc<S> {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        (**self).set(key, value)
    }
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        (**self).get(key, timeout)
    }
    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        (**self).try_get(key)
    }
    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        (**self).wait(keys, timeout)
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        (**self).add(key, delta)
    }
}

impl<S: Store + ?Sized> Store for Box<S> {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        (**self).set(key, value)
    }
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        (**self).get(key, timeout)
    }
    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        (**self).try_get(key)
    }
    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        (**self).wait(keys, timeout)
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        (**self).add(key, delta)
    }
}
