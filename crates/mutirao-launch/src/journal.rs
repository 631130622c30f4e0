//! An agent's journal of the grid ranks it runs: which grid job (and which of its runs) each
//! rank belongs to, whether it is alive, and how each one ended (kept [`KEEP_EXITS_MS`]), so
//! that a restarted coordinator can ask the agents what became of the jobs it left running
//! (docs/grid.md, "A coordinator restarted").
//!
//! A grid coordinator labels every rank it launches with [`GRID_JOB_ENV`] and [`GRID_RUN_ENV`]
//! (the launcher adds `MUTIRAO_INCARNATION` for in-run restarts); the agent records ranks that
//! carry a label and nothing else. [`Journal`] is the pure part (no I/O, no clock: times are
//! arguments); [`RankJournal`] keeps one on disk, rewritten atomically at each change.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The rank variable naming the grid job a rank belongs to (its id at the coordinator).
pub const GRID_JOB_ENV: &str = "MUTIRAO_GRID_JOB";
/// The rank variable numbering the coordinator's run of that job (1 for its first placement).
pub const GRID_RUN_ENV: &str = "MUTIRAO_GRID_RUN";
/// The launcher's incarnation variable (0, or the restart number within a run).
pub const INCARNATION_ENV: &str = "MUTIRAO_INCARNATION";
/// How long a finished rank's exit is remembered (ms).
pub const KEEP_EXITS_MS: i64 = 3_600_000;
/// Most entries kept (the oldest finished ones go first).
pub const MAX_ENTRIES: usize = 4096;

/// Which grid job, run and incarnation a rank belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Label {
    /// The job's id at the coordinator.
    pub job: i64,
    /// The coordinator's run of the job.
    pub run: u32,
    /// The launcher's incarnation within the run.
    pub incarnation: u32,
}

impl Label {
    /// The label a rank's environment carries, if it is a grid rank.
    pub fn of_env(env: &BTreeMap<String, String>) -> Option<Label> {
        let job = env.get(GRID_JOB_ENV)?.trim().parse().ok()?;
        let run = env.get(GRID_RUN_ENV)?.trim().parse().ok()?;
        let incarnation = env
            .get(INCARNATION_ENV)
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        Some(Label {
            job,
            run,
            incarnation,
        })
    }
}

/// One rank as journalled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// Whose it is.
    pub label: Label,
    /// Its rank.
    pub rank: u32,
    /// Its process (group) id on this host.
    pub pid: i32,
    /// When it started, ms since the epoch.
    pub started_ms: i64,
    /// When it ended (`None`: alive).
    #[serde(default)]
    pub ended_ms: Option<i64>,
    /// Its exit code, if it exited.
    #[serde(default)]
    pub code: Option<i32>,
    /// The signal that ended it, if one did.
    #[serde(default)]
    pub signal: Option<i32>,
}

/// How a rank ended, as reported.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RankExit {
    /// The rank.
    pub rank: u32,
    /// Its incarnation within the run.
    #[serde(default)]
    pub incarnation: u32,
    /// Exit code (`None`: killed by a signal, or unknown).
    #[serde(default)]
    pub code: Option<i32>,
    /// The signal that ended it.
    #[serde(default)]
    pub signal: Option<i32>,
    /// When, ms since the epoch.
    #[serde(default)]
    pub ended_ms: i64,
}

impl RankExit {
    /// `exit 0`, `exit status 3`, `signal 9`, `unknown (the agent restarted)`.
    pub fn how(&self) -> String {
        match (self.code, self.signal) {
            (Some(0), _) => "exit 0".into(),
            (Some(c), _) => format!("exit status {c}"),
            (None, Some(s)) => format!("signal {s}"),
            (None, None) => "unknown (the agent restarted while it ran)".into(),
        }
    }
}

/// What an agent reports of one run of a grid job (in its heartbeats).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct JobRanks {
    /// The job's id at the coordinator.
    pub job: i64,
    /// The coordinator's run of it.
    pub run: u32,
    /// Ranks alive on this host now.
    #[serde(default)]
    pub alive: Vec<u32>,
    /// Ranks that ended within the last hour, how.
    #[serde(default)]
    pub exits: Vec<RankExit>,
}

/// The ranks an agent runs or ran for grid jobs (pure: times are arguments).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Journal {
    /// Every rank remembered, oldest first.
    pub entries: Vec<Entry>,
}

impl Journal {
    /// A rank `rank` of `label` started as process `pid` at `now_ms`.
    pub fn started(&mut self, label: Label, rank: u32, pid: i32, now_ms: i64) {
        self.entries.push(Entry {
            label,
            rank,
            pid,
            started_ms: now_ms,
            ended_ms: None,
            code: None,
            signal: None,
        });
        self.prune(now_ms);
    }

    /// The alive rank of process `pid` ended; returns whether one was recorded.
    pub fn ended(&mut self, pid: i32, code: Option<i32>, signal: Option<i32>, now_ms: i64) -> bool {
        let found = self
            .entries
            .iter_mut()
            .rev()
            .find(|e| e.pid == pid && e.ended_ms.is_none());
        match found {
            Some(e) => {
                e.ended_ms = Some(now_ms);
                e.code = code;
                e.signal = signal;
                true
            }
            None => false,
        }
    }

    /// The agent restarted: ranks it believed alive are no longer its own (it cannot wait for
    /// them); they are recorded as ended with an unknown status. Returns how many.
    pub fn agent_restarted(&mut self, now_ms: i64) -> usize {
        let mut n = 0;
        for e in self.entries.iter_mut().filter(|e| e.ended_ms.is_none()) {
            e.ended_ms = Some(now_ms);
            n += 1;
        }
        self.prune(now_ms);
        n
    }

    /// Forget exits older than [`KEEP_EXITS_MS`], and the oldest ended entries beyond
    /// [`MAX_ENTRIES`].
    pub fn prune(&mut self, now_ms: i64) {
        self.entries
            .retain(|e| e.ended_ms.is_none_or(|t| now_ms - t <= KEEP_EXITS_MS));
        let mut excess = self.entries.len().saturating_sub(MAX_ENTRIES);
        if excess > 0 {
            self.entries.retain(|e| {
                if excess > 0 && e.ended_ms.is_some() {
                    excess -= 1;
                    false
                } else {
                    true
                }
            });
        }
    }

    /// Per job and run, the ranks alive and the exits remembered, by job then run.
    pub fn report(&self) -> Vec<JobRanks> {
        let mut by: BTreeMap<(i64, u32), JobRanks> = BTreeMap::new();
        for e in &self.entries {
            let r = by
                .entry((e.label.job, e.label.run))
                .or_insert_with(|| JobRanks {
                    job: e.label.job,
                    run: e.label.run,
                    ..Default::default()
                });
            match e.ended_ms {
                None => r.alive.push(e.rank),
                Some(t) => r.exits.push(RankExit {
                    rank: e.rank,
                    incarnation: e.label.incarnation,
                    code: e.code,
                    signal: e.signal,
                    ended_ms: t,
                }),
            }
        }
        by.into_values()
            .map(|mut r| {
                r.alive.sort_unstable();
                r.alive.dedup();
                r
            })
            .collect()
    }
}

/// Milliseconds since the epoch now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A [`Journal`] kept in a file, rewritten atomically (temporary file, fsync, rename) at each
/// change.
pub struct RankJournal {
    path: PathBuf,
    j: Mutex<Journal>,
}

impl RankJournal {
    /// Open (or create) the journal at `path`. Ranks a previous agent left alive are recorded
    /// as ended with an unknown status (this agent cannot wait for them); returns the journal
    /// and how many such ranks there were. A malformed file is an error that says what to do.
    pub fn open(path: &Path) -> anyhow::Result<(RankJournal, usize)> {
        let mut j: Journal = match std::fs::read(path) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| {
                anyhow::anyhow!(
                    "the rank journal {} is not valid ({e}); move it away to start a new one",
                    path.display()
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Journal::default(),
            Err(e) => anyhow::bail!("cannot read the rank journal {}: {e}", path.display()),
        };
        let orphaned = j.agent_restarted(now_ms());
        let rj = RankJournal {
            path: path.to_path_buf(),
            j: Mutex::new(j),
        };
        rj.save()?;
        Ok((rj, orphaned))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Journal> {
        self.j.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Record a rank started (in memory: call [`RankJournal::save`] once the launch's ranks
    /// are all started; a rank that ends first is still found, its end saves).
    pub fn started(&self, label: Label, rank: u32, pid: i32) {
        self.lock().started(label, rank, pid, now_ms());
    }

    /// Record the end of the rank of process `pid` (if it is journalled) and save.
    pub fn ended(&self, pid: i32, code: Option<i32>, signal: Option<i32>) -> anyhow::Result<()> {
        if self.lock().ended(pid, code, signal, now_ms()) {
            self.save()?;
        }
        Ok(())
    }

    /// What the agent reports in its heartbeats.
    pub fn report(&self) -> Vec<JobRanks> {
        let mut j = self.lock();
        j.prune(now_ms());
        j.report()
    }

    /// A copy of the journal.
    pub fn snapshot(&self) -> Journal {
        self.lock().clone()
    }

    /// Write the journal to its file, atomically.
    pub fn save(&self) -> anyhow::Result<()> {
        // Serialized under the lock: two saves never interleave their renames out of order.
        let j = self.lock();
        let bytes = serde_json::to_vec(&*j)?;
        crate::fsutil::write_atomic_mode(&self.path, bytes, 0o600)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn label(job: i64, run: u32, incarnation: u32) -> Label {
        Label {
            job,
            run,
            incarnation,
        }
    }

    #[test]
    fn a_rank_s_label_comes_from_its_environment() {
        let mut env = BTreeMap::new();
        assert_eq!(Label::of_env(&env), None);
        env.insert(GRID_JOB_ENV.to_string(), "7".to_string());
        assert_eq!(Label::of_env(&env), None, "a run is needed too");
        env.insert(GRID_RUN_ENV.to_string(), "2".to_string());
        assert_eq!(Label::of_env(&env), Some(label(7, 2, 0)));
        env.insert(INCARNATION_ENV.to_string(), "3".to_string());
        assert_eq!(Label::of_env(&env), Some(label(7, 2, 3)));
        env.insert(GRID_JOB_ENV.to_string(), "x".to_string());
        assert_eq!(Label::of_env(&env), None);
    }

    #[test]
    fn alive_ranks_and_exits_are_reported_per_job_and_run() {
        let mut j = Journal::default();
        j.started(label(7, 1, 0), 0, 100, 1_000);
        j.started(label(7, 1, 0), 1, 101, 1_000);
        j.started(label(8, 1, 0), 0, 102, 1_000);
        assert!(j.ended(100, Some(0), None, 2_000));
        assert!(!j.ended(999, Some(0), None, 2_000), "not journalled");
        let r = j.report();
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].job, r[0].run), (7, 1));
        assert_eq!(r[0].alive, vec![1]);
        assert_eq!(
            r[0].exits,
            vec![RankExit {
                rank: 0,
                incarnation: 0,
                code: Some(0),
                signal: None,
                ended_ms: 2_000
            }]
        );
        assert_eq!(r[1].alive, vec![0]);
        // A pid reused by a later rank: the alive one is ended, the old exit stays.
        j.started(label(7, 2, 0), 0, 100, 3_000);
        assert!(j.ended(100, None, Some(9), 4_000));
        let r = j.report();
        assert_eq!(r[1].exits[0].how(), "signal 9");
        assert_eq!(r[0].exits[0].how(), "exit 0");
    }

    #[test]
    fn exits_are_forgotten_after_an_hour_and_the_journal_is_bounded() {
        let mut j = Journal::default();
        j.started(label(1, 1, 0), 0, 10, 0);
        j.ended(10, Some(0), None, 0);
        j.started(label(2, 1, 0), 0, 11, 0);
        j.prune(KEEP_EXITS_MS + 1);
        assert_eq!(
            j.entries.len(),
            1,
            "the alive rank stays, the old exit goes"
        );
        assert_eq!(j.entries[0].label.job, 2);
        for pid in 0..(MAX_ENTRIES as i32 + 10) {
            j.started(label(3, 1, 0), 0, 1000 + pid, 5);
            j.ended(1000 + pid, Some(0), None, 5);
        }
        assert_eq!(j.entries.len(), MAX_ENTRIES);
        assert!(j.entries.iter().any(|e| e.label.job == 2), "alive kept");
    }

    #[test]
    fn a_restarted_agent_reports_its_predecessor_s_ranks_as_ended_unknown() {
        let dir = std::env::temp_dir().join(format!("mutirao-journal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("ranks.json");
        let (j, n) = RankJournal::open(&p).unwrap();
        assert_eq!(n, 0);
        j.started(label(5, 1, 0), 0, 4242);
        j.started(label(5, 1, 0), 1, 4243);
        j.save().unwrap();
        j.ended(4242, Some(0), None).unwrap();
        drop(j);
        let (j, n) = RankJournal::open(&p).unwrap();
        assert_eq!(n, 1);
        let r = j.report();
        assert!(r[0].alive.is_empty());
        let hows: Vec<String> = r[0].exits.iter().map(RankExit::how).collect();
        assert_eq!(hows[0], "exit 0");
        assert!(hows[1].starts_with("unknown"), "{hows:?}");
        std::fs::write(&p, "{nope").unwrap();
        let e = RankJournal::open(&p).err().unwrap().to_string();
        assert!(e.contains("move it away"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
