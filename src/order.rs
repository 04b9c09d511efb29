//! Issue order: operations take numbered places (tickets) when they are
//! issued and run when their turn comes, one after the other, in the order
//! of the numbers — whichever thread runs them. The communicator orders its
//! operations with one (stream order, see [`crate::Communicator`]); the C
//! ABI orders the calls on a `snclComm_t` with another, through
//! [`IssueOrder::ticket`] and [`Ticket`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// How many times a waiter checks the turn before it parks.
const SPINS: usize = 200;

/// A ticket-based order: places are numbered from 0 in the order they are
/// taken; the holder of place `n` runs after place `n - 1` has finished.
///
/// A waiter spins briefly, then parks; a finishing operation takes the park
/// lock only when somebody is parked (the communicator's small operations
/// pay two atomic operations for their turn).
#[derive(Debug)]
pub struct IssueOrder {
    /// The next place to hand out.
    next: Mutex<u64>,
    /// The place whose turn it is.
    turn: AtomicU64,
    /// Waiters parked on `cv`.
    parked: AtomicU64,
    park: Mutex<()>,
    cv: Condvar,
}

impl Default for IssueOrder {
    fn default() -> IssueOrder {
        IssueOrder::new()
    }
}

impl IssueOrder {
    /// An order whose first place is 0.
    pub fn new() -> IssueOrder {
        IssueOrder {
            next: Mutex::new(0),
            turn: AtomicU64::new(0),
            parked: AtomicU64::new(0),
            park: Mutex::new(()),
            cv: Condvar::new(),
        }
    }

    /// Takes the next place, as a [`Ticket`] that passes the turn on when
    /// it is dropped (run or not).
    pub fn ticket(self: &Arc<Self>) -> Ticket {
        self.take_with(|n| Ticket {
            order: self.clone(),
            n,
            started: false,
        })
    }

    /// Takes the next place and runs `f` with its number before anyone can
    /// take the one after (so work queued by `f` stays in place order).
    /// The caller must [`IssueOrder::wait_turn`] and then
    /// [`IssueOrder::finish`] exactly once for it.
    pub(crate) fn take_with<R>(&self, f: impl FnOnce(u64) -> R) -> R {
        let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
        let t = *next;
        *next += 1;
        f(t)
    }

    /// Waits until it is place `t`'s turn: every place before it finished.
    pub(crate) fn wait_turn(&self, t: u64) {
        for _ in 0..SPINS {
            if self.turn.load(Ordering::Acquire) == t {
                return;
            }
            std::hint::spin_loop();
        }
        self.parked.fetch_add(1, Ordering::SeqCst);
        let mut g = self.park.lock().unwrap_or_else(|e| e.into_inner());
        while self.turn.load(Ordering::SeqCst) != t {
            g = self
                .cv
                .wait_timeout(g, Duration::from_millis(1))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        drop(g);
        self.parked.fetch_sub(1, Ordering::SeqCst);
    }

    /// Ends the current turn: the next place may run.
    pub(crate) fn finish(&self) {
        self.turn.fetch_add(1, Ordering::SeqCst);
        // Waiters re-check at least every millisecond, so a missed wake-up
        // only delays; skip the lock when nobody is parked.
        if self.parked.load(Ordering::SeqCst) > 0 {
            let _g = self.park.lock().unwrap_or_else(|e| e.into_inner());
            self.cv.notify_all();
        }
    }
}

/// A place in an [`IssueOrder`], held by the operation it was taken for
/// (it may move to the thread that runs it). Dropping it passes the turn
/// on — after waiting for the turn if [`Ticket::wait_turn`] was not called,
/// so an operation dropped unrun never blocks the ones behind it, and never
/// lets them run before the ones ahead of it.
#[derive(Debug)]
pub struct Ticket {
    order: Arc<IssueOrder>,
    n: u64,
    started: bool,
}

impl Ticket {
    /// Waits until every place taken before this one has finished (each
    /// such operation runs within its own deadline or is dropped).
    pub fn wait_turn(&mut self) {
        if !self.started {
            self.order.wait_turn(self.n);
            self.started = true;
        }
    }

    /// The place's number (0 for the first ticket of the order).
    pub fn number(&self) -> u64 {
        self.n
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.wait_turn();
        self.order.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_run_in_the_order_they_were_taken() {
        let order = Arc::new(IssueOrder::new());
        let tickets: Vec<Ticket> = (0..8).map(|_| order.ticket()).collect();
        let ran = Arc::new(Mutex::new(Vec::new()));
        // Hand them to threads in reverse; they still run 0, 1, 2, ...
        let hs: Vec<_> = tickets
            .into_iter()
            .rev()
            .map(|mut t| {
                let ran = ran.clone();
                std::thread::spawn(move || {
                    t.wait_turn();
                    ran.lock().unwrap().push(t.number());
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(*ran.lock().unwrap(), (0..8).collect::<Vec<u64>>());
    }

    #[test]
    fn a_ticket_dropped_unrun_passes_its_turn_on() {
        let order = Arc::new(IssueOrder::new());
        let first = order.ticket();
        let skipped = order.ticket();
        let mut last = order.ticket();
        let h = std::thread::spawn(move || {
            last.wait_turn();
            last.number()
        });
        // `skipped` is dropped before `first` has run: it waits for its
        // turn on another thread, then passes it on.
        let d = std::thread::spawn(move || drop(skipped));
        std::thread::sleep(Duration::from_millis(20));
        assert!(!h.is_finished(), "ran before the tickets ahead of it");
        assert!(
            !d.is_finished(),
            "passed on a turn that was not yet its own"
        );
        drop(first);
        d.join().unwrap();
        assert_eq!(h.join().unwrap(), 2);
    }

    #[test]
    fn numbered_places_and_tickets_share_the_order() {
        let order = Arc::new(IssueOrder::new());
        let raw = order.take_with(|n| n);
        let mut t = order.ticket();
        assert_eq!((raw, t.number()), (0, 1));
        order.wait_turn(raw);
        order.finish();
        t.wait_turn();
    }
}
