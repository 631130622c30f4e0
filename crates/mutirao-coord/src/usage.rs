//! Usage history (InteGrade's LUPA/GUPA): per host and hour of the week, how often its owner
//! left it to the grid, learnt from the agents' heartbeats, so that placement prefers hosts
//! likely to stay idle for a while.
//!
//! Kept by the coordinator, not by each agent: the coordinator sees every host's reports
//! already (no new protocol), the history survives an agent's reinstallation, placement needs
//! it where placement happens, and one file holds all of it. The cost: hours in which an
//! agent was down or unregistered are simply not counted (unknown, not busy).
//!
//! A sample is one report; it is idle when the owner's policy said `available` (and no owner
//! was active). Each of the 168 hours of the week keeps two weighted counts; when a bucket's
//! total passes [`AGE_AT`] both are halved, so old weeks fade and a changed habit shows within
//! a few weeks. [`stay_idle`] is pure; [`Usage`] wraps it for the coordinator, and its file is
//! written atomically.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

/// Hours in a week.
pub const HOURS: usize = 168;
/// A bucket's total weight beyond which old samples are halved.
pub const AGE_AT: f64 = 2000.0;

/// One hour of the week of one host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Bucket {
    /// Reports counted (weighted).
    pub samples: f64,
    /// Of which idle.
    pub idle: f64,
}

impl Bucket {
    /// The probability the host is idle in this hour (Laplace's rule: ½ with no sample).
    pub fn p_idle(&self) -> f64 {
        (self.idle + 1.0) / (self.samples + 2.0)
    }

    fn add(&mut self, idle: bool) {
        self.samples += 1.0;
        if idle {
            self.idle += 1.0;
        }
        if self.samples > AGE_AT {
            self.samples /= 2.0;
            self.idle /= 2.0;
        }
    }
}

/// The hour of the week, 0 = Monday 00:00–01:00, from a weekday (0 Monday) and an hour.
pub fn hour_of_week(weekday: u32, hour: u32) -> usize {
    ((weekday % 7) * 24 + hour % 24) as usize
}

/// The probability a host with history `h` stays idle for `hours` hours from hour-of-week
/// `from` (the product of its hourly idle probabilities, taken as independent; at least the
/// current hour). A host with no history scores ½ per hour.
pub fn stay_idle(h: &[Bucket], from: usize, hours: u32) -> f64 {
    if h.is_empty() {
        return 0.5f64.powi(hours.max(1) as i32);
    }
    (0..hours.max(1) as usize)
        .map(|k| h[(from + k) % h.len()].p_idle())
        .product()
}

/// Every host's history.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct History {
    /// Host name → its 168 buckets.
    pub hosts: BTreeMap<String, Vec<Bucket>>,
}

impl History {
    /// Count one report of `host` at hour-of-week `how`.
    pub fn record(&mut self, host: &str, how: usize, idle: bool) {
        let b = self
            .hosts
            .entry(host.to_string())
            .or_insert_with(|| vec![Bucket::default(); HOURS]);
        if b.len() != HOURS {
            b.resize(HOURS, Bucket::default());
        }
        b[how % HOURS].add(idle);
    }

    /// [`stay_idle`] for `host` (½ per hour if never seen).
    pub fn stay_idle(&self, host: &str, how: usize, hours: u32) -> f64 {
        stay_idle(
            self.hosts.get(host).map(Vec::as_slice).unwrap_or(&[]),
            how,
            hours,
        )
    }
}

/// The hour of the week now, in the coordinator's local time.
pub fn now_hour_of_week() -> usize {
    use chrono::{Datelike, Timelike};
    let t = chrono::Local::now();
    hour_of_week(t.weekday().num_days_from_monday(), t.hour())
}

/// The coordinator's usage history: in memory, saved to a file now and then.
#[derive(Debug, Default)]
pub struct Usage {
    h: Mutex<History>,
    /// The hour of the week, and when it was computed (local time is not free to read at
    /// every heartbeat).
    how: Mutex<Option<(std::time::Instant, usize)>>,
}

impl Usage {
    fn how(&self) -> usize {
        let mut g = self.how.lock().unwrap_or_else(|p| p.into_inner());
        match *g {
            Some((at, how)) if at.elapsed() < std::time::Duration::from_secs(10) => how,
            _ => {
                let how = now_hour_of_week();
                *g = Some((std::time::Instant::now(), how));
                how
            }
        }
    }

    /// Count a report (idle when its owner's policy leaves the host to the grid).
    pub fn record(&self, host: &str, idle: bool) {
        let how = self.how();
        self.h
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record(host, how, idle);
    }

    /// The probability `host` stays idle for the next `hours` hours.
    pub fn stay_idle(&self, host: &str, hours: u32) -> f64 {
        let how = self.how();
        self.h
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stay_idle(host, how, hours)
    }

    /// A copy of the history.
    pub fn snapshot(&self) -> History {
        self.h.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replace the history (loaded from a file).
    pub fn replace(&self, h: History) {
        *self.h.lock().unwrap_or_else(|p| p.into_inner()) = h;
    }

    /// Load `path` if it exists (a missing file is an empty history).
    pub fn load(&self, path: &Path) -> crate::Result<()> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => {
                return Err(crate::Error::Io(format!(
                    "cannot read the usage history {}: {e}",
                    path.display()
                )))
            }
        };
        let h: History = serde_json::from_str(&text).map_err(|e| {
            crate::Error::Io(format!(
                "the usage history {} is not valid ({e}); move it away to start a new one",
                path.display()
            ))
        })?;
        self.replace(h);
        Ok(())
    }

    /// Save to `path` atomically (temporary file, fsync, rename, directory fsync).
    pub fn save(&self, path: &Path) -> crate::Result<()> {
        let bytes = serde_json::to_vec(&self.snapshot())
            .map_err(|e| crate::Error::Io(format!("cannot encode the usage history: {e}")))?;
        crate::exec::write_atomic(path, &bytes, false).map_err(|e| {
            crate::Error::Io(format!(
                "cannot write the usage history {}: {e}",
                path.display()
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_host_is_even_odds_and_history_moves_it() {
        let mut h = History::default();
        assert_eq!(h.stay_idle("n1", 0, 1), 0.5);
        assert_eq!(h.stay_idle("n1", 0, 2), 0.25);
        // n1's owner is away on Monday nights, at work Monday 09:00-10:00.
        for _ in 0..50 {
            h.record("n1", hour_of_week(0, 2), true);
            h.record("n1", hour_of_week(0, 3), true);
            h.record("n1", hour_of_week(0, 9), false);
        }
        let night = h.stay_idle("n1", hour_of_week(0, 2), 2);
        assert!(night > 0.9, "{night}");
        assert!(h.stay_idle("n1", hour_of_week(0, 9), 1) < 0.05);
        // Staying idle across an hour the owner usually works is unlikely.
        assert!(h.stay_idle("n1", hour_of_week(0, 8), 2) < 0.05);
        // The week wraps: Sunday 23:00 for two hours reaches Monday 00:00.
        assert_eq!(hour_of_week(6, 23), 167);
        assert!((h.stay_idle("n1", 167, 2) - 0.25).abs() < 1e-12);
    }

    #[test]
    fn old_samples_fade() {
        let mut b = Bucket::default();
        for _ in 0..2000 {
            b.add(true);
        }
        assert!(b.p_idle() > 0.99);
        // The owner changes habit: after as many busy samples the bucket says mostly busy.
        for _ in 0..3000 {
            b.add(false);
        }
        assert!(b.samples <= AGE_AT);
        assert!(b.p_idle() < 0.3, "{}", b.p_idle());
    }

    #[test]
    fn the_history_survives_a_save_and_load() {
        let dir = std::env::temp_dir().join(format!("mutirao-usage-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("usage.json");
        let u = Usage::default();
        u.load(&path).unwrap(); // missing: empty
        u.record("n1", true);
        u.record("n1", true);
        u.save(&path).unwrap();
        let v = Usage::default();
        v.load(&path).unwrap();
        assert_eq!(v.snapshot(), u.snapshot());
        assert!(v.stay_idle("n1", 1) > 0.5);
        std::fs::write(&path, "{not json").unwrap();
        let e = v.load(&path).unwrap_err().to_string();
        assert!(e.contains("move it away"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
