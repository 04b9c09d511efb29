//! [`LogThrottle`]: at most one log line per source per window, so that a
//! flood of strangers (junk connections, wrong secrets) costs a few lines,
//! not one each. Pure: the caller passes the time.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// Sources remembered at most; past this, the stalest are forgotten.
const MAX_SOURCES: usize = 1024;

/// One line per source per `window`, with a count of the lines held back.
#[derive(Debug)]
pub struct LogThrottle<K> {
    window: Duration,
    /// Per source: when its last line was written, and lines held back since.
    seen: HashMap<K, (Instant, u64)>,
}

impl<K: Eq + Hash + Clone> LogThrottle<K> {
    /// A throttle of one line per source per `window`.
    pub fn new(window: Duration) -> Self {
        LogThrottle {
            window,
            seen: HashMap::new(),
        }
    }

    /// [`Self::admit`] for a line about a stranger at `from`: `Some` with
    /// the text to append to the line (empty, or how many lines from `from`
    /// were held back in the window), `None` to hold this one back.
    pub fn admit_note(
        &mut self,
        source: K,
        from: std::net::IpAddr,
        now: Instant,
    ) -> Option<String> {
        let window = self.window.as_secs();
        self.admit(source, now).map(|held| match held {
            0 => String::new(),
            n => format!(" ({n} more from {from} in the last {window} s)"),
        })
    }

    /// Whether to write a line about `source` at `now`: `Some(held)` with
    /// the lines held back since its last one (write it, mentioning them),
    /// `None` to hold this one back.
    pub fn admit(&mut self, source: K, now: Instant) -> Option<u64> {
        if let Some((last, held)) = self.seen.get_mut(&source) {
            if now.saturating_duration_since(*last) < self.window {
                *held += 1;
                return None;
            }
            let out = *held;
            *last = now;
            *held = 0;
            return Some(out);
        }
        if self.seen.len() >= MAX_SOURCES {
            let window = self.window;
            self.seen
                .retain(|_, (last, _)| now.saturating_duration_since(*last) < window);
            if self.seen.len() >= MAX_SOURCES {
                // Every source is recent: a flood from many addresses; the
                // new one is held back until some expire.
                return None;
            }
        }
        self.seen.insert(source, (now, 0));
        Some(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_source_per_window_with_the_count() {
        let t0 = Instant::now();
        let mut t = LogThrottle::new(Duration::from_secs(10));
        assert_eq!(t.admit("a", t0), Some(0));
        for i in 1..=199 {
            assert_eq!(t.admit("a", t0 + Duration::from_millis(i)), None);
        }
        assert_eq!(t.admit("b", t0), Some(0), "another source is not held back");
        assert_eq!(t.admit("a", t0 + Duration::from_secs(10)), Some(199));
        assert_eq!(t.admit("a", t0 + Duration::from_secs(11)), None);
        let ip = std::net::IpAddr::from([10, 0, 0, 1]);
        assert_eq!(t.admit_note("c", ip, t0), Some(String::new()));
        assert_eq!(t.admit_note("c", ip, t0), None);
        assert_eq!(
            t.admit_note("c", ip, t0 + Duration::from_secs(10))
                .as_deref(),
            Some(" (1 more from 10.0.0.1 in the last 10 s)")
        );
    }

    #[test]
    fn memory_stays_bounded_under_many_sources() {
        let t0 = Instant::now();
        let mut t = LogThrottle::new(Duration::from_secs(10));
        let admitted = (0..5000u32).filter(|i| t.admit(*i, t0).is_some()).count();
        assert_eq!(admitted, MAX_SOURCES);
        assert!(t.seen.len() <= MAX_SOURCES);
        // Once the window has passed, new sources get lines again.
        assert_eq!(t.admit(99_999, t0 + Duration::from_secs(10)), Some(0));
    }
}
