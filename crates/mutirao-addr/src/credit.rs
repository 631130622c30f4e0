//! Per-destination credit flow control (pure state machines, no I/O).
//!
//! The sender side ([`Window`]) lets at most `credits` data frames be outstanding towards one
//! destination; more are queued (so a send never blocks) and released as credits come back.
//! The receiver side ([`Owed`]) counts credits to return: one per data frame once the
//! application has consumed it (or at once when it was refused), returned with the next
//! acknowledgement to that sender or on their own at the low-water mark (half the window).

use std::collections::VecDeque;

/// Sender side of one destination's window.
#[derive(Debug)]
pub struct Window<T> {
    avail: u32,
    queue: VecDeque<T>,
}

impl<T> Window<T> {
    /// A window of `credits` (at least 1).
    pub fn new(credits: u32) -> Self {
        Window {
            avail: credits.max(1),
            queue: VecDeque::new(),
        }
    }

    /// Offers a frame: returns it if it may go now (a credit is taken), otherwise queues it.
    /// Frames leave in the order they were offered.
    pub fn submit(&mut self, x: T) -> Option<T> {
        if self.avail > 0 && self.queue.is_empty() {
            self.avail -= 1;
            Some(x)
        } else {
            self.queue.push_back(x);
            None
        }
    }

    /// Returns `n` credits; gives back the queued frames that may go now, in order.
    pub fn grant(&mut self, n: u32) -> Vec<T> {
        self.avail = self.avail.saturating_add(n);
        let k = (self.avail as usize).min(self.queue.len());
        self.avail -= k as u32;
        self.queue.drain(..k).collect()
    }

    /// Frames waiting for credits.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Credits available now.
    pub fn available(&self) -> u32 {
        self.avail
    }

    /// Empties the queue (the destination is gone), giving the frames back.
    pub fn drain(&mut self) -> Vec<T> {
        self.queue.drain(..).collect()
    }
}

/// Receiver side: credits owed to one sender.
#[derive(Debug, Default, Clone)]
pub struct Owed {
    n: u32,
}

impl Owed {
    /// One more credit to return. Returns `Some(k)` when `k` credits should be sent now on
    /// their own (the low-water mark `threshold` was reached).
    pub fn add(&mut self, threshold: u32) -> Option<u32> {
        self.n += 1;
        if self.n >= threshold.max(1) {
            Some(self.take())
        } else {
            None
        }
    }

    /// Takes everything owed (to piggyback on an acknowledgement).
    pub fn take(&mut self) -> u32 {
        std::mem::take(&mut self.n)
    }
}

/// The low-water mark for a window of `credits`: half of it, at least one.
pub fn threshold(credits: u32) -> u32 {
    (credits / 2).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn submit_beyond_the_window_queues_and_grant_releases_in_order() {
        let mut w = Window::new(2);
        assert_eq!(w.submit(1), Some(1));
        assert_eq!(w.submit(2), Some(2));
        assert_eq!(w.submit(3), None);
        assert_eq!(w.submit(4), None);
        assert_eq!(w.queued(), 2);
        assert_eq!(w.grant(1), vec![3]);
        assert_eq!(w.submit(5), None, "queued frames go first");
        assert_eq!(w.grant(5), vec![4, 5]);
        assert_eq!(w.available(), 3);
        assert_eq!(w.submit(6), Some(6));
    }

    #[test]
    fn owed_credits_return_at_half_the_window() {
        let t = threshold(8);
        let mut o = Owed::default();
        assert_eq!(o.add(t), None);
        assert_eq!(o.add(t), None);
        assert_eq!(o.add(t), None);
        assert_eq!(o.add(t), Some(4));
        assert_eq!(o.add(t), None);
        assert_eq!(o.take(), 1);
        assert_eq!(threshold(1), 1);
    }

    proptest! {
        /// A sender and a receiver that consumes at any pace: nothing is lost, order holds,
        /// at most `credits` frames are ever outstanding, and everything gets through.
        #[test]
        fn window_never_loses_or_reorders(credits in 1u32..10, n in 0usize..200,
                                          pace in proptest::collection::vec(1u8..4, 1..50)) {
            let mut w = Window::new(credits);
            let mut owed = Owed::default();
            let t = threshold(credits);
            let mut in_flight = VecDeque::new();
            let mut got = vec![];
            for i in 0..n {
                if let Some(x) = w.submit(i) { in_flight.push_back(x); }
            }
            let mut steps = 0;
            while got.len() < n {
                steps += 1;
                prop_assert!(steps < 100_000, "stalled with {} received", got.len());
                let k = pace[steps % pace.len()] as usize;
                for _ in 0..k {
                    let Some(x) = in_flight.pop_front() else { break };
                    got.push(x);
                    if let Some(c) = owed.add(t) {
                        for y in w.grant(c) { in_flight.push_back(y); }
                    }
                }
                prop_assert!(in_flight.len() as u32 <= credits);
            }
            prop_assert_eq!(got, (0..n).collect::<Vec<_>>());
        }
    }
}
