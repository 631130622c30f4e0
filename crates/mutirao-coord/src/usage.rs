//! Usage history (InteGrade's LUPA/GUPA): per host and hour of the week, how often its owner
//! left it to the grid, so that placement prefers hosts likely to stay idle for a while.
//!
//! Each agent keeps its own host's history ([`HostUsage`], on disk in its state directory
//! through [`AgentUsage`], atomically written, 168 buckets): it samples its owner's policy at
//! every heartbeat, in its own local time (the owner's hours), and survives a restart. It
//! sends the whole history when it registers and at the first heartbeat of each hour, and the
//! current hour's bucket in the other heartbeats ([`UsageReport`]). The coordinator mirrors
//! what its agents send ([`Usage`], saved to a file so that a restarted coordinator places
//! with it before the agents send their histories again) and places with it.
//!
//! A sample is one heartbeat; it is idle when the owner's policy said `available`. Each of the
//! 168 hours of the week keeps two weighted counts; when a bucket's total passes [`AGE_AT`]
//! both are halved, so old weeks fade and a changed habit shows within a few weeks.
//! [`stay_idle`] is pure, and so are [`HostUsage`] and [`Keeper`]; [`Usage`] and
//! [`AgentUsage`] wrap them for the coordinator and the agent, their files written atomically.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
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

    /// Count one sample.
    pub fn add(&mut self, idle: bool) {
        self.samples += 1.0;
        if idle {
            self.idle += 1.0;
        }
        if self.samples > AGE_AT {
            self.samples /= 2.0;
            self.idle /= 2.0;
        }
    }

    /// Why this bucket is not one an agent could have kept, if it is not.
    pub fn check(&self) -> Result<(), String> {
        let ok = |v: f64| v.is_finite() && (0.0..=AGE_AT + 1.0).contains(&v);
        if !(ok(self.samples) && ok(self.idle) && self.idle <= self.samples) {
            return Err(format!(
                "usage bucket of {} samples, {} idle: expected 0 <= idle <= samples <= {}",
                self.samples,
                self.idle,
                AGE_AT + 1.0
            ));
        }
        Ok(())
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

/// One host's history: its 168 buckets, hour 0 = Monday 00:00–01:00 of its agent's local time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct HostUsage {
    /// The buckets, [`HOURS`] of them.
    pub buckets: Vec<Bucket>,
}

impl Default for HostUsage {
    fn default() -> Self {
        HostUsage {
            buckets: vec![Bucket::default(); HOURS],
        }
    }
}

impl HostUsage {
    /// Count one sample at hour-of-week `how`.
    pub fn record(&mut self, how: usize, idle: bool) {
        if self.buckets.len() != HOURS {
            self.buckets.resize(HOURS, Bucket::default());
        }
        self.buckets[how % HOURS].add(idle);
    }

    /// [`stay_idle`] from hour-of-week `from`.
    pub fn stay_idle(&self, from: usize, hours: u32) -> f64 {
        stay_idle(&self.buckets, from, hours)
    }

    /// Why this history is not one an agent could have kept, if it is not.
    pub fn check(&self) -> Result<(), String> {
        if self.buckets.len() != HOURS {
            return Err(format!(
                "a usage history has {HOURS} hourly buckets, not {}",
                self.buckets.len()
            ));
        }
        self.buckets.iter().try_for_each(Bucket::check)
    }
}

/// What an agent sends of its history with a report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageReport {
    /// The hour of the week now, in the agent's local time.
    pub hour: u32,
    /// This hour's bucket.
    pub now: Bucket,
    /// The whole history (at registration and at the first report of each hour; empty
    /// otherwise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<Bucket>,
}

impl UsageReport {
    /// Why this report cannot be taken, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        if self.hour as usize >= HOURS {
            return Err(format!(
                "usage hour {} is not an hour of the week (0 to {})",
                self.hour,
                HOURS - 1
            ));
        }
        self.now.check()?;
        if !self.history.is_empty() {
            HostUsage {
                buckets: self.history.clone(),
            }
            .check()?;
        }
        Ok(())
    }
}

/// The agent's side, pure: its host's history and when it last sent all of it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Keeper {
    /// The history.
    pub usage: HostUsage,
    /// The hour of the week at which the whole history was last sent.
    pub sent_whole: Option<usize>,
}

impl Keeper {
    /// Count a sample at hour-of-week `how` and say what to report: the whole history the
    /// first time and at the first sample of each hour, else this hour's bucket.
    pub fn sample(&mut self, how: usize, idle: bool) -> UsageReport {
        let how = how % HOURS;
        self.usage.record(how, idle);
        let whole = self.sent_whole != Some(how);
        if whole {
            self.sent_whole = Some(how);
        }
        UsageReport {
            hour: how as u32,
            now: self.usage.buckets[how],
            history: if whole {
                self.usage.buckets.clone()
            } else {
                Vec::new()
            },
        }
    }
}

/// Every host's history, as the coordinator mirrors it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct History {
    /// Host name → its history.
    pub hosts: BTreeMap<String, HostUsage>,
    /// Host name → its hour of the week at its last report (its agent's local time).
    #[serde(default)]
    pub hour: BTreeMap<String, usize>,
}

impl History {
    /// Take what `host`'s agent reported: its whole history, or this hour's bucket.
    pub fn reported(&mut self, host: &str, u: &UsageReport) {
        let how = u.hour as usize % HOURS;
        let h = self.hosts.entry(host.to_string()).or_default();
        if u.history.len() == HOURS {
            h.buckets = u.history.clone();
        } else if h.buckets.len() != HOURS {
            h.buckets.resize(HOURS, Bucket::default());
        }
        h.buckets[how] = u.now;
        self.hour.insert(host.to_string(), how);
    }

    /// [`stay_idle`] for `host` from its agent's hour now (`how` if it never said; ½ per
    /// hour if it never sent a history).
    pub fn stay_idle(&self, host: &str, how: usize, hours: u32) -> f64 {
        let from = self.hour.get(host).copied().unwrap_or(how);
        stay_idle(
            self.hosts
                .get(host)
                .map(|h| h.buckets.as_slice())
                .unwrap_or(&[]),
            from,
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

/// The coordinator's mirror of its agents' usage histories: in memory, saved to a file now
/// and then.
#[derive(Debug, Default)]
pub struct Usage {
    h: Mutex<History>,
    /// The hour of the week, and when it was computed (local time is not free to read at
    /// every placement).
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

    /// Take what `host`'s agent reported of its history.
    pub fn reported(&self, host: &str, u: &UsageReport) {
        self.h
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .reported(host, u);
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

/// An agent's own history, kept in a file (`usage.json` in its state directory), written
/// atomically (temporary file, fsync, rename) at most once a minute and at each new hour, so
/// that the agent restarted keeps it.
pub struct AgentUsage {
    path: PathBuf,
    k: Mutex<(Keeper, Option<std::time::Instant>)>,
}

/// How often an agent writes its history at most (besides each new hour).
pub const AGENT_SAVE_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

impl AgentUsage {
    /// Open the history at `path` (a missing file is an empty history; a malformed one an
    /// error that says what to do).
    pub fn open(path: &Path) -> crate::Result<AgentUsage> {
        let usage = match std::fs::read(path) {
            Ok(b) => {
                let u: HostUsage = serde_json::from_slice(&b).map_err(|e| {
                    crate::Error::Io(format!(
                        "the usage history {} is not valid ({e}); move it away to start a new one",
                        path.display()
                    ))
                })?;
                u.check().map_err(|e| {
                    crate::Error::Io(format!(
                        "the usage history {}: {e}; move it away to start a new one",
                        path.display()
                    ))
                })?;
                u
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => HostUsage::default(),
            Err(e) => {
                return Err(crate::Error::Io(format!(
                    "cannot read the usage history {}: {e}",
                    path.display()
                )))
            }
        };
        Ok(AgentUsage {
            path: path.to_path_buf(),
            k: Mutex::new((
                Keeper {
                    usage,
                    sent_whole: None,
                },
                None,
            )),
        })
    }

    /// Count a sample now (idle: the owner's policy leaves the host to the grid) and return
    /// what to report; the file is written when due, and a failure to write it is returned
    /// besides (the sample is kept in memory and written next time).
    pub fn sample(&self, idle: bool) -> (UsageReport, Option<crate::Error>) {
        let mut g = self.k.lock().unwrap_or_else(|p| p.into_inner());
        let r = g.0.sample(now_hour_of_week(), idle);
        let due = g.1.is_none_or(|t| t.elapsed() >= AGENT_SAVE_EVERY) || !r.history.is_empty();
        let mut err = None;
        if due {
            match self.write(&g.0.usage) {
                Ok(()) => g.1 = Some(std::time::Instant::now()),
                Err(e) => err = Some(e),
            }
        }
        (r, err)
    }

    /// A copy of the history.
    pub fn snapshot(&self) -> HostUsage {
        self.k
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .usage
            .clone()
    }

    fn write(&self, u: &HostUsage) -> crate::Result<()> {
        let bytes = serde_json::to_vec(u)
            .map_err(|e| crate::Error::Io(format!("cannot encode the usage history: {e}")))?;
        crate::exec::write_atomic(&self.path, &bytes, false).map_err(|e| {
            crate::Error::Io(format!(
                "cannot write the usage history {}: {e}",
                self.path.display()
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_host_is_even_odds_and_history_moves_it() {
        let mut h = HostUsage::default();
        assert_eq!(History::default().stay_idle("n1", 0, 1), 0.5);
        assert_eq!(History::default().stay_idle("n1", 0, 2), 0.25);
        // n1's owner is away on Monday nights, at work Monday 09:00-10:00.
        for _ in 0..50 {
            h.record(hour_of_week(0, 2), true);
            h.record(hour_of_week(0, 3), true);
            h.record(hour_of_week(0, 9), false);
        }
        let night = h.stay_idle(hour_of_week(0, 2), 2);
        assert!(night > 0.9, "{night}");
        assert!(h.stay_idle(hour_of_week(0, 9), 1) < 0.05);
        // Staying idle across an hour the owner usually works is unlikely.
        assert!(h.stay_idle(hour_of_week(0, 8), 2) < 0.05);
        // The week wraps: Sunday 23:00 for two hours reaches Monday 00:00.
        assert_eq!(hour_of_week(6, 23), 167);
        assert!((h.stay_idle(167, 2) - 0.25).abs() < 1e-12);
        assert!(h.check().is_ok());
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
        assert!(b.check().is_ok());
    }

    #[test]
    fn an_agent_sends_its_whole_history_once_an_hour_and_the_bucket_otherwise() {
        let mut k = Keeper::default();
        let r = k.sample(10, true);
        assert_eq!((r.hour, r.history.len()), (10, HOURS), "first: whole");
        assert_eq!(r.now.samples, 1.0);
        let r = k.sample(10, false);
        assert!(r.history.is_empty(), "same hour: the bucket only");
        assert_eq!((r.now.samples, r.now.idle), (2.0, 1.0));
        let r = k.sample(11, true);
        assert_eq!(r.history.len(), HOURS, "a new hour: whole again");
        assert_eq!(r.history[10].samples, 2.0);
        // A coordinator that starts listening now gets this hour's buckets only...
        let mut h = History::default();
        for _ in 0..40 {
            h.reported("n1", &k.sample(11, true));
        }
        assert_eq!(h.hosts["n1"].buckets[10].samples, 0.0);
        assert_eq!(h.hosts["n1"].buckets[11].samples, 41.0);
        // ... until the next hour, when it gets the whole history.
        h.reported("n1", &k.sample(12, true));
        assert_eq!(h.hosts["n1"].buckets[10].samples, 2.0);
        assert_eq!(h.hosts["n1"].buckets[12].samples, 1.0);
        assert_eq!(h.hour["n1"], 12);
        h.reported("n1", &k.sample(11, true));
        // Its hour is the agent's: the coordinator's own (here 100) does not matter.
        assert!(h.stay_idle("n1", 100, 1) > 0.95);
        assert_eq!(h.stay_idle("n2", 100, 1), 0.5);
    }

    #[test]
    fn nonsense_histories_are_refused() {
        let mut r = UsageReport {
            hour: 168,
            ..Default::default()
        };
        assert!(r.check().unwrap_err().contains("hour of the week"));
        r.hour = 3;
        assert!(r.check().is_ok());
        r.now.idle = 2.0;
        assert!(r.check().unwrap_err().contains("idle <= samples"));
        r.now = Bucket::default();
        r.history = vec![Bucket::default(); 3];
        assert!(r.check().unwrap_err().contains("168 hourly buckets"));
        r.history = vec![Bucket::default(); HOURS];
        r.history[5].samples = f64::NAN;
        assert!(r.check().is_err());
    }

    #[test]
    fn the_histories_survive_a_save_and_load() {
        let dir = std::env::temp_dir().join(format!("mutirao-usage-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // The coordinator's mirror.
        let path = dir.join("usage.json");
        let u = Usage::default();
        u.load(&path).unwrap(); // missing: empty
        let mut k = Keeper::default();
        u.reported("n1", &k.sample(4, true));
        u.save(&path).unwrap();
        let v = Usage::default();
        v.load(&path).unwrap();
        assert_eq!(v.snapshot(), u.snapshot());
        std::fs::write(&path, "{not json").unwrap();
        let e = v.load(&path).unwrap_err().to_string();
        assert!(e.contains("move it away"), "{e}");
        // An agent's own: restarted, it keeps its history.
        let path = dir.join("agent-usage.json");
        let a = AgentUsage::open(&path).unwrap();
        let (r, err) = a.sample(true);
        assert!(err.is_none(), "{err:?}");
        assert_eq!(r.history.len(), HOURS, "the first report carries it all");
        drop(a);
        let b = AgentUsage::open(&path).unwrap();
        assert_eq!(b.snapshot().buckets[r.hour as usize].samples, 1.0);
        std::fs::write(&path, "[1,2]").unwrap();
        let e = AgentUsage::open(&path).err().unwrap().to_string();
        assert!(e.contains("move it away"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
