//! What a server's listeners hold at most, and how refusals reach the log.
//!
//! - [`Handshakes`]: TCP connections still in their handshake. Over the cap the *oldest* is
//!   closed to admit the new one: idle connections re-opened every few seconds cannot hold
//!   the listener, and a real peer's handshake (one round trip) finishes long before 64 newer
//!   connections push it out.
//! - [`Slots`]: authenticated peer connections and local clients. Over the cap a new
//!   connection is closed at once.
//!
//! A cap reached is logged once, and how many connections it closed when the pressure ends.
//! Other refusals are logged one by one, at most [`LOG_BURST`] per [`LOG_WINDOW`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Refusals logged one by one per [`LOG_WINDOW`]; the rest are counted.
pub(super) const LOG_BURST: u32 = 10;
/// See [`LOG_BURST`].
pub(super) const LOG_WINDOW: Duration = Duration::from_secs(10);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One line on the server's log (standard error).
pub(super) fn log(msg: &str) {
    eprintln!("mutirao dir: {msg}");
}

/// Logs refusals, at most [`LOG_BURST`] lines per [`LOG_WINDOW`].
#[derive(Default)]
pub(super) struct RefusalLog {
    /// (start of the window, lines logged in it, refusals not logged).
    st: Mutex<Option<(Instant, u32, u64)>>,
}

impl RefusalLog {
    pub(super) fn refused(&self, msg: &str) {
        let now = Instant::now();
        let mut st = lock(&self.st);
        let (start, lines, quiet) = st.get_or_insert((now, 0, 0));
        if now.duration_since(*start) >= LOG_WINDOW {
            if *quiet > 0 {
                log(&format!(
                    "{quiet} more refusals in the last {:?} were not logged",
                    now.duration_since(*start)
                ));
            }
            (*start, *lines, *quiet) = (now, 0, 0);
        }
        if *lines < LOG_BURST {
            *lines += 1;
            log(msg);
        } else {
            *quiet += 1;
        }
    }
}

/// TCP connections in their handshake, oldest first. Each holds the receiver of its entry's
/// sender: dropping the sender (eviction) ends that handshake.
pub(super) struct Handshakes {
    max: usize,
    queue: Mutex<VecDeque<(u64, oneshot::Sender<()>)>>,
    next: AtomicU64,
    /// Connections closed over the cap since the cap was last logged.
    evicted: AtomicU64,
}

impl Handshakes {
    pub(super) fn new(max: usize) -> Self {
        Handshakes {
            max: max.max(1),
            queue: Mutex::new(VecDeque::new()),
            next: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
        }
    }

    /// Admits a new connection (closing the oldest one when the cap is reached): its id for
    /// [`Handshakes::done`], and a receiver that completes when it is evicted.
    pub(super) fn admit(&self) -> (u64, oneshot::Receiver<()>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let mut q = lock(&self.queue);
        if q.len() >= self.max {
            // Dropping the sender ends that connection's handshake.
            q.pop_front();
            if self.evicted.fetch_add(1, Ordering::Relaxed) == 0 {
                log(&format!(
                    "{} TCP connections are in their handshake (the cap): closing the oldest \
                     for each new one (logged once until the pressure ends)",
                    self.max
                ));
            }
        }
        q.push_back((id, tx));
        (id, rx)
    }

    /// The handshake of `id` ended (either way).
    pub(super) fn done(&self, id: u64) {
        let mut q = lock(&self.queue);
        if let Some(i) = q.iter().position(|(x, _)| *x == id) {
            q.remove(i);
        }
        if q.is_empty() {
            let k = self.evicted.swap(0, Ordering::Relaxed);
            if k > 0 {
                log(&format!(
                    "no TCP connection is in its handshake any more; {k} were closed over the cap"
                ));
            }
        }
    }

    /// Connections in their handshake now.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        lock(&self.queue).len()
    }
}

/// At most `max` connections of one kind served at once.
pub(super) struct Slots {
    max: usize,
    used: AtomicUsize,
    /// Connections refused since the cap was last logged.
    refused: AtomicU64,
    what: &'static str,
}

/// A place taken in [`Slots`], given back when dropped.
pub(super) struct Slot(Arc<Slots>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.used.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Slots {
    pub(super) fn new(max: usize, what: &'static str) -> Arc<Self> {
        Arc::new(Slots {
            max,
            used: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
            what,
        })
    }

    /// A place, or `None` at the cap (the caller closes the connection at once).
    pub(super) fn take(self: &Arc<Self>) -> Option<Slot> {
        let mut cur = self.used.load(Ordering::Acquire);
        loop {
            if cur >= self.max {
                if self.refused.fetch_add(1, Ordering::Relaxed) == 0 {
                    log(&format!(
                        "{} at the cap ({}): closing new ones at once \
                         (logged once until one is admitted again)",
                        self.what, self.max
                    ));
                }
                return None;
            }
            match self
                .used
                .compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(now) => cur = now,
            }
        }
        let k = self.refused.swap(0, Ordering::Relaxed);
        if k > 0 {
            log(&format!(
                "admitting {} again; {k} were closed over the cap",
                self.what
            ));
        }
        Some(Slot(self.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_handshake_cap_evicts_the_oldest_connection_first() {
        let h = Handshakes::new(2);
        let (a, mut ra) = h.admit();
        let (_b, mut rb) = h.admit();
        assert!(ra.try_recv().is_err() && rb.try_recv().is_err());
        let (_c, mut rc) = h.admit();
        assert!(
            matches!(ra.try_recv(), Err(oneshot::error::TryRecvError::Closed)),
            "the oldest is evicted"
        );
        assert!(matches!(
            rb.try_recv(),
            Err(oneshot::error::TryRecvError::Empty)
        ));
        assert!(matches!(
            rc.try_recv(),
            Err(oneshot::error::TryRecvError::Empty)
        ));
        h.done(a);
        assert_eq!(h.len(), 2, "an evicted id is already gone");
    }

    #[test]
    fn slots_refuse_over_the_cap_and_free_a_place_on_drop() {
        let s = Slots::new(2, "test connections");
        let a = s.take().expect("first");
        let _b = s.take().expect("second");
        assert!(s.take().is_none(), "over the cap");
        drop(a);
        assert!(s.take().is_some(), "a place was given back");
    }
}
