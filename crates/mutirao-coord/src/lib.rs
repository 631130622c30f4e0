//! # mutirao-coord: the grid coordinator (issue 14, docs/grid.md)
//!
//! What a grid coordinator must never lose — jobs, their states, the story of each job, its
//! output, the hosts and their last reports — behind a [`Store`] trait, on SQLite
//! ([`SqliteStore`]: schema migrations, WAL, every change one transaction, fsynced) or
//! PostgreSQL ([`PgStore`], the same migrations). The job lifecycle is a pure state machine
//! ([`JobState::can_become`]); the store refuses a transition the machine does not allow and
//! journals every one it makes.
//!
//! Around it: [`auth`] (user and agent tokens), [`repo`] (the content-addressed application
//! repository and [`verify`]), [`api`] (the HTTP + JSON API and its OpenAPI document),
//! [`client`] (a blocking client of it), [`place`] (requirements and placement, pure),
//! [`exec`] (the [`exec::Executor`] trait and the dispatcher that runs placed jobs), and
//! [`report`] (what an agent reports, and its heartbeat thread), [`policy`] (the owner's
//! policy, pure), [`owner`] (the agent applying it) and [`usage`] (hosts' usage history by hour
//! of the week, for placement).
//!
//! ```
//! use mutirao_coord::{JobState, NewJob, SqliteStore, Store};
//! let s = SqliteStore::open_in_memory()?;
//! let j = s.create_job(&NewJob { owner: "ana".into(), ranks: 8, program: "matmul".into(),
//!     args: vec!["2000".into()], require: Some("cpu>=2".into()), checkpoint_interval_s: None, dag: false,
//!     env: Default::default() })?;
//! assert_eq!(j.state, JobState::Waiting);
//! s.transition(j.id, JobState::Running, "placed on 8 hosts")?;
//! assert!(s.transition(j.id, JobState::Waiting, "again").is_err()); // not a legal move
//! s.transition(j.id, JobState::Finished, "exit 0")?;
//! let story: Vec<String> = s.events(j.id)?.into_iter().map(|e| e.detail).collect();
//! assert_eq!(story, ["submitted", "placed on 8 hosts", "exit 0"]);
//! # Ok::<(), mutirao_coord::Error>(())
//! ```

#![forbid(unsafe_code)]

pub mod api;
pub mod auth;
pub mod client;
pub mod exec;
pub mod fetch;
pub mod logbatch;
mod model;
pub mod owner;
mod pg;
pub mod place;
pub mod policy;
pub mod repo;
pub mod report;
mod sqlite;
pub mod taskgraph;
pub mod usage;

pub use model::{
    check_env, check_env_key, Event, Host, HostReport, Job, JobState, LogChunk, NewJob, MAX_ARGS,
    MAX_ENV, MAX_FIELD, MAX_RANKS, RESERVED_ENV_PREFIX,
};
pub use pg::PgStore;
pub use repo::{verify, Repo};
pub use sqlite::SqliteStore;

/// Errors of the coordinator's store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No such job.
    #[error("job {0} does not exist")]
    NoJob(i64),
    /// The state machine does not allow this move.
    #[error("job {job} is {from}; it cannot become {to}")]
    Transition {
        /// The job.
        job: i64,
        /// Its state.
        from: JobState,
        /// The refused state.
        to: JobState,
    },
    /// A request that makes no sense (0 ranks, an empty program…).
    #[error("invalid: {0}")]
    Invalid(String),
    /// The database failed or is not one of ours.
    #[error("database: {0}")]
    Db(String),
    /// No such content in the application repository.
    #[error("{0} is not in the application repository; upload it first")]
    NoBlob(String),
    /// Content whose digest is not the one it was named by.
    #[error("content named {expected} has digest {actual}: it was altered or corrupted; refusing to use it")]
    Tampered {
        /// The digest it was asked by.
        expected: String,
        /// The digest of the bytes received.
        actual: String,
    },
    /// Content larger than the repository accepts.
    #[error("{size} bytes is more than the repository accepts ({max} bytes); raise --max-upload or split the input")]
    TooLarge {
        /// Its size.
        size: u64,
        /// The limit.
        max: u64,
    },
    /// A user's uploads would take more than their quota.
    #[error("{user}'s uploads take {used} bytes of their {quota}-byte quota; {size} bytes more would exceed it (ask the coordinator's operator to raise --upload-quota-mib)")]
    Quota {
        /// The user.
        user: String,
        /// Bytes their uploads take now.
        used: u64,
        /// Bytes refused.
        size: u64,
        /// The quota.
        quota: u64,
    },
    /// An agent reported an address other than the one its host registered at.
    #[error("host {host} registered at {registered:?}; a report from {reported:?} is refused: the agent must register again to move")]
    Moved {
        /// The host.
        host: String,
        /// Where it registered.
        registered: String,
        /// Where the refused report says it is.
        reported: String,
    },
    /// A file-system failure.
    #[error("{0}")]
    Io(String),
    /// The coordinator answered with an error (client side).
    #[error("the coordinator refused: {status} {message}")]
    Remote {
        /// The HTTP status.
        status: u16,
        /// Its message.
        message: String,
    },
    /// The coordinator could not be reached or answered nonsense (client side).
    #[error("{0}")]
    Unreachable(String),
}

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Self {
        Error::Db(e.to_string())
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Refuse a note of kind `state` (that kind is for transitions).
fn check_note_kind(kind: &str) -> Result<()> {
    if kind == "state" {
        return Err(Error::Invalid(
            "kind \"state\" is for transitions; use transition()".into(),
        ));
    }
    Ok(())
}

/// Where the coordinator keeps jobs, events and hosts. Every method is one atomic change:
/// after it returns, a crash of the coordinator loses nothing it did.
pub trait Store: Send + Sync {
    /// The schema version (migrations applied).
    fn schema_version(&self) -> Result<i64>;
    /// Record a submitted job (state `waiting`, event "submitted").
    fn create_job(&self, j: &NewJob) -> Result<Job>;
    /// One job.
    fn job(&self, id: i64) -> Result<Job>;
    /// Jobs, newest first; only `owner`'s if given.
    fn jobs(&self, owner: Option<&str>) -> Result<Vec<Job>> {
        self.jobs_newest(owner, u64::MAX)
    }
    /// The newest `limit` jobs, newest first; only `owner`'s if given.
    fn jobs_newest(&self, owner: Option<&str>, limit: u64) -> Result<Vec<Job>>;
    /// Every job in one of `states`, oldest first (what the dispatcher scans).
    fn jobs_in(&self, states: &[JobState]) -> Result<Vec<Job>>;
    /// Move a job to `to` if the state machine allows it, journalling `detail`.
    fn transition(&self, id: i64, to: JobState, detail: &str) -> Result<Job> {
        self.transition_noting(id, &[], to, detail)
    }
    /// Journal `notes` (kind, detail; as [`Store::note`]) and then move the job to `to`, all in
    /// one change (one commit: a job's start journals its placement and starts with one
    /// durable write instead of one per event). Nothing is done if any part is refused.
    fn transition_noting(
        &self,
        id: i64,
        notes: &[(&str, &str)],
        to: JobState,
        detail: &str,
    ) -> Result<Job>;
    /// Journal an event that changes no state (placement chosen, host refused, …).
    fn note(&self, id: i64, kind: &str, detail: &str) -> Result<Event>;
    /// The job's journal, oldest first.
    fn events(&self, id: i64) -> Result<Vec<Event>>;
    /// Record a host's registration (or a report replacing its last one).
    fn report_host(&self, r: &HostReport) -> Result<Host>;
    /// Record a heartbeat of a registered host; `None` (and nothing changed) if it never
    /// registered. One statement: heartbeats are the coordinator's most frequent write.
    fn heartbeat_host(&self, r: &HostReport) -> Result<Option<Host>>;
    /// Every host known, by name.
    fn hosts(&self) -> Result<Vec<Host>>;
    /// One host, if it ever reported.
    fn host(&self, name: &str) -> Result<Option<Host>>;
    /// Append output to a job's log; returns the log's new length in bytes.
    fn append_log(&self, id: i64, data: &[u8]) -> Result<u64> {
        self.append_log_capped(id, data, u64::MAX).map(|a| a.length)
    }
    /// Append output to a job's log, keeping at most `cap` bytes of output
    /// ([`cap_output`]: the first append to cross it stores its part within the cap and a
    /// notice, later ones store nothing), in rows of at most [`LOG_ROW`] bytes, one change.
    fn append_log_capped(&self, id: i64, data: &[u8], cap: u64) -> Result<Appended>;
    /// At most `max` bytes of a job's log from byte `offset`, and the log's length.
    fn read_log(&self, id: i64, offset: u64, max: usize) -> Result<LogChunk>;
    /// Record that `owner` has `digest` (`size` bytes) in the repository, unless that would
    /// take their recorded content over `quota` bytes; one change. Content they already have
    /// is not counted twice.
    fn add_blob(&self, owner: &str, digest: &str, size: u64, quota: u64) -> Result<BlobAdd>;
    /// Bytes of the content recorded for `owner`.
    fn blob_usage(&self, owner: &str) -> Result<u64>;
    /// Whether `digest` is recorded for `owner` (they uploaded it, or it was kept for a job of
    /// theirs).
    fn has_blob(&self, owner: &str, digest: &str) -> Result<bool>;
}

/// What [`Store::add_blob`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlobAdd {
    /// Recorded now.
    Added,
    /// The owner had it already; nothing changed.
    Already,
    /// Refused: the owner's content takes `used` bytes and this would cross the quota.
    OverQuota {
        /// Bytes recorded for the owner.
        used: u64,
    },
}

/// What [`Store::append_log_capped`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Appended {
    /// The log's length now, bytes (notice included).
    pub length: u64,
    /// Bytes of the output given that were stored.
    pub stored: u64,
    /// Bytes of the output given that were dropped (past the cap).
    pub dropped: u64,
    /// This append crossed the cap and wrote the notice.
    pub truncated: bool,
}

/// Largest row a log is stored in: a long output (a line of megabytes) is split.
pub const LOG_ROW: usize = 64 << 10;

/// The line a log gets where it reaches its cap.
pub fn cap_notice(cap: u64) -> String {
    format!("mutirao: this job's log reached its cap of {cap} bytes; further output is dropped (the job's journal counts it)\n")
}

/// What to store of `data` appended to a log of `len` bytes capped at `cap` bytes of output:
/// the part within the cap, then — if this append crosses the cap — the notice (on a line of
/// its own). A log at or past its cap takes nothing. Returns the bytes to store and whether
/// the notice is among them.
pub fn cap_output(len: u64, data: &[u8], cap: u64) -> (Vec<u8>, bool) {
    let room = cap.saturating_sub(len);
    if (data.len() as u64) <= room {
        return (data.to_vec(), false);
    }
    if len >= cap {
        return (Vec::new(), false);
    }
    let keep = &data[..room as usize];
    let mut out = keep.to_vec();
    if keep.last().is_some_and(|b| *b != b'\n') {
        out.push(b'\n');
    }
    out.extend_from_slice(cap_notice(cap).as_bytes());
    (out, true)
}

/// [`Appended`] for `data` given and `stored` (from [`cap_output`]) appended at `len`.
fn appended(len: u64, data: &[u8], stored: &[u8], truncated: bool, cap: u64) -> Appended {
    let kept = if truncated {
        cap.saturating_sub(len)
    } else {
        stored.len() as u64
    };
    Appended {
        length: len + stored.len() as u64,
        stored: kept,
        dropped: data.len() as u64 - kept,
        truncated,
    }
}

/// Copy the part of a log chunk stored at `start` that lies at or after `offset` into `out`,
/// keeping `out` at most `max` bytes (the stores keep logs as chunks at byte offsets).
fn gather(out: &mut Vec<u8>, start: i64, chunk: &[u8], offset: u64, max: usize) {
    let start = start.max(0) as u64;
    let skip = offset.saturating_sub(start).min(chunk.len() as u64) as usize;
    let room = max.saturating_sub(out.len());
    let take = (chunk.len() - skip).min(room);
    out.extend_from_slice(&chunk[skip..skip + take]);
}

/// Create `dir` (and its parents) and make it private to this user (mode 0700): it holds
/// users' programs, jobs and checkpoints.
pub(crate) fn private_dir(dir: &std::path::Path, what: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)
        .and_then(|_| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)))
        .map_err(|e| Error::Io(format!("cannot create {what} {}: {e}", dir.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_within_the_cap_is_kept_whole_and_the_append_crossing_it_ends_with_the_notice() {
        assert_eq!(cap_output(0, b"abc\n", 10), (b"abc\n".to_vec(), false));
        assert_eq!(cap_output(6, b"abcd", 10), (b"abcd".to_vec(), false));
        // Cut inside a line: the notice starts a line of its own.
        let (out, t) = cap_output(6, b"abcdef\n", 10);
        assert!(t);
        assert_eq!(out, format!("abcd\n{}", cap_notice(10)).into_bytes());
        // Cut at a line's end: no empty line.
        let (out, _) = cap_output(5, b"abcd\nef", 10);
        assert_eq!(out, format!("abcd\n{}", cap_notice(10)).into_bytes());
        // At or past the cap (the notice is there): nothing more.
        assert_eq!(cap_output(10, b"x", 10), (Vec::new(), false));
        assert_eq!(cap_output(99, b"x", 10), (Vec::new(), false));
        let a = appended(
            6,
            b"abcdef\n",
            &format!("abcd\n{}", cap_notice(10)).into_bytes(),
            true,
            10,
        );
        assert_eq!((a.stored, a.dropped, a.truncated), (4, 3, true));
        assert_eq!(a.length, 6 + 5 + cap_notice(10).len() as u64);
    }
}
