//! The available-workers area (AWD, seed 003 §2.2): a pool of worker slots that a job may
//! claim and later release — another job may then claim them — decoupled from the balancer
//! and the application. Slots come from wherever the caller finds hosts (a hostfile's unused
//! slots, a directory lookup by properties); a claim filters them by a predicate on their
//! properties. The pool also remembers each host's measured spawn latency, which
//! [`crate::choose`] weighs against its speed.
//!
//! ```
//! use mutirao_mw::awd::{Pool, Slot};
//! let pool = Pool::new(vec![
//!     Slot::new("w1", 2).with("site", "north").with("cpu", "2"),
//!     Slot::new("w2", 1).with("site", "south"),
//! ]);
//! let north = pool.claim(2, |s| s.prop("site") == Some("north")).unwrap();
//! assert_eq!(north.iter().map(|c| c.host.as_str()).collect::<Vec<_>>(), ["w1", "w1"]);
//! assert!(pool.claim(1, |s| s.prop("site") == Some("north")).is_err()); // all taken
//! pool.release(&north[0]).unwrap();
//! assert_eq!(pool.available(|_| true), 2);
//! ```

use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// A host with some worker slots and its properties.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Slot {
    /// Host name or address.
    pub host: String,
    /// Worker slots on it.
    pub slots: u32,
    /// Properties (`site`, `cpu`, …), as the directory or the hostfile gives them.
    pub props: BTreeMap<String, String>,
}

impl Slot {
    /// `slots` slots on `host`, no properties.
    pub fn new(host: &str, slots: u32) -> Slot {
        Slot {
            host: host.to_string(),
            slots,
            props: BTreeMap::new(),
        }
    }

    /// With one more property.
    pub fn with(mut self, k: &str, v: &str) -> Slot {
        self.props.insert(k.to_string(), v.to_string());
        self
    }

    /// A property's value.
    pub fn prop(&self, k: &str) -> Option<&str> {
        self.props.get(k).map(String::as_str)
    }
}

/// One claimed slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    /// Unique per pool.
    pub id: u64,
    /// The host.
    pub host: String,
}

#[derive(Debug, Default)]
struct State {
    slots: Vec<Slot>,
    used: Vec<u32>,
    claims: BTreeMap<u64, usize>,
    next: u64,
    spawn_s: BTreeMap<String, f64>,
}

/// The pool; share it between jobs of one process with an `Arc`.
#[derive(Debug, Default)]
pub struct Pool {
    st: Mutex<State>,
}

impl Pool {
    /// A pool of these slots (a host listed twice adds up).
    pub fn new(slots: Vec<Slot>) -> Pool {
        let used = vec![0; slots.len()];
        Pool {
            st: Mutex::new(State {
                slots,
                used,
                ..State::default()
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the counters half-updated (every update
        // is a single assignment), so a poisoned lock is still consistent.
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Add hosts found later (a directory lookup, a new agent).
    pub fn add(&self, s: Slot) {
        let mut st = self.lock();
        st.slots.push(s);
        st.used.push(0);
    }

    /// Free slots on hosts that satisfy `pred`.
    pub fn available(&self, pred: impl Fn(&Slot) -> bool) -> u32 {
        let st = self.lock();
        st.slots
            .iter()
            .zip(&st.used)
            .filter(|(s, _)| pred(s))
            .map(|(s, u)| s.slots - u)
            .sum()
    }

    /// Claim `n` slots on hosts that satisfy `pred`, spreading over hosts in the order they
    /// were listed (a host's slots are used before the next host's). All or nothing: with fewer
    /// than `n` free, nothing is claimed and the error says how many there were.
    pub fn claim(&self, n: u32, pred: impl Fn(&Slot) -> bool) -> Result<Vec<Claim>> {
        let mut st = self.lock();
        let free: u32 = st
            .slots
            .iter()
            .zip(&st.used)
            .filter(|(s, _)| pred(s))
            .map(|(s, u)| s.slots - u)
            .sum();
        if free < n {
            return Err(Error::Invalid(format!(
                "asked for {n} worker slots, {free} free on the hosts that match"
            )));
        }
        let mut out = Vec::with_capacity(n as usize);
        let mut i = 0;
        while (out.len() as u32) < n {
            if pred(&st.slots[i]) && st.used[i] < st.slots[i].slots {
                st.used[i] += 1;
                let id = st.next;
                st.next += 1;
                st.claims.insert(id, i);
                out.push(Claim {
                    id,
                    host: st.slots[i].host.clone(),
                });
            } else {
                i += 1;
            }
        }
        Ok(out)
    }

    /// Give a slot back.
    pub fn release(&self, c: &Claim) -> Result<()> {
        let mut st = self.lock();
        let i = st.claims.remove(&c.id).ok_or_else(|| {
            Error::Invalid(format!(
                "claim {} on {} is not held (released twice?)",
                c.id, c.host
            ))
        })?;
        st.used[i] -= 1;
        Ok(())
    }

    /// Remember a host's measured spawn latency (the latest measurement wins).
    pub fn record_spawn(&self, host: &str, seconds: f64) {
        if seconds.is_finite() && seconds >= 0.0 {
            self.lock().spawn_s.insert(host.to_string(), seconds);
        }
    }

    /// The host's last measured spawn latency.
    pub fn spawn_latency(&self, host: &str) -> Option<f64> {
        self.lock().spawn_s.get(host).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn claims_are_all_or_nothing_and_released_slots_go_to_another_job() {
        let pool = Arc::new(Pool::new(vec![Slot::new("a", 1), Slot::new("b", 2)]));
        let e = pool.claim(4, |_| true).unwrap_err().to_string();
        assert!(e.contains("asked for 4 worker slots, 3 free"), "{e}");
        assert_eq!(pool.available(|_| true), 3);
        let job1 = pool.claim(2, |_| true).unwrap();
        assert_eq!(job1[0].host, "a");
        assert_eq!(job1[1].host, "b");
        let p2 = pool.clone();
        let job2 = std::thread::spawn(move || p2.claim(1, |_| true).unwrap())
            .join()
            .unwrap();
        assert_eq!(job2[0].host, "b");
        assert!(pool.claim(1, |_| true).is_err());
        pool.release(&job1[0]).unwrap();
        assert!(pool.release(&job1[0]).is_err());
        assert_eq!(pool.claim(1, |_| true).unwrap()[0].host, "a");
    }

    #[test]
    fn spawn_latency_is_remembered_per_host() {
        let pool = Pool::new(vec![Slot::new("a", 1)]);
        assert_eq!(pool.spawn_latency("a"), None);
        pool.record_spawn("a", 0.4);
        pool.record_spawn("a", 0.2);
        assert_eq!(pool.spawn_latency("a"), Some(0.2));
        pool.record_spawn("a", f64::NAN);
        assert_eq!(pool.spawn_latency("a"), Some(0.2));
    }
}
