//! Jobs, their states and events, hosts.

use serde::{Deserialize, Serialize};

/// A job's state (issue 14: waiting, running, checkpointing, recovering, suspended, finished,
/// failed, cancelled).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum JobState {
    /// Submitted, not placed yet (or re-queued).
    Waiting,
    /// Its ranks run.
    Running,
    /// A checkpoint wave is under way.
    Checkpointing,
    /// A rank or host was lost; ranks restart from the last committed epoch.
    Recovering,
    /// An owner came back: its processes are stopped, not yet vacated.
    Suspended,
    /// Ended with the program's success.
    Finished,
    /// Ended with an error it could not recover from.
    Failed,
    /// Cancelled by its owner.
    Cancelled,
}

impl JobState {
    /// Every state.
    pub const ALL: [JobState; 8] = [
        JobState::Waiting,
        JobState::Running,
        JobState::Checkpointing,
        JobState::Recovering,
        JobState::Suspended,
        JobState::Finished,
        JobState::Failed,
        JobState::Cancelled,
    ];

    /// The name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Waiting => "waiting",
            JobState::Running => "running",
            JobState::Checkpointing => "checkpointing",
            JobState::Recovering => "recovering",
            JobState::Suspended => "suspended",
            JobState::Finished => "finished",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    /// Parse a stored name.
    pub fn parse(s: &str) -> Option<JobState> {
        JobState::ALL.into_iter().find(|x| x.as_str() == s)
    }

    /// Finished, failed or cancelled: nothing follows.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            JobState::Finished | JobState::Failed | JobState::Cancelled
        )
    }

    /// The state machine: may a job in `self` become `to`?
    ///
    /// waiting → running; running ↔ checkpointing; running/checkpointing → recovering →
    /// running (or waiting when it must be placed again); running/checkpointing → suspended →
    /// running (owner gone) or waiting (vacated, re-queued) or recovering (vacated, resumed
    /// from a checkpoint elsewhere); running/checkpointing/recovering → finished or failed;
    /// any state but a final one → cancelled.
    pub fn can_become(self, to: JobState) -> bool {
        use JobState::*;
        if self.is_final() {
            return false;
        }
        matches!(
            (self, to),
            (_, Cancelled)
                | (Waiting, Running)
                | (Waiting, Failed)
                | (Running, Checkpointing)
                | (Checkpointing, Running)
                | (Running | Checkpointing, Recovering)
                | (Recovering, Running | Waiting)
                | (Running | Checkpointing, Suspended)
                | (Suspended, Running | Waiting | Recovering)
                | (Running | Checkpointing | Recovering, Finished | Failed)
        )
    }
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A submission.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewJob {
    /// The submitting user.
    pub owner: String,
    /// Ranks.
    pub ranks: u32,
    /// The program (a content digest in the application repository, or a path).
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// A requirement on hosts (`cpu>=2 & site=north`).
    pub require: Option<String>,
    /// Seconds between checkpoint waves.
    pub checkpoint_interval_s: Option<f64>,
    /// A task graph (`mutirao-taskgraph/1`, [`crate::taskgraph`]): `program` is the digest of
    /// the graph's document in the repository, `ranks` its number of tasks, `args` at most one
    /// word, the scheduling algorithm (`hlogp-heft`, `heft`, `round-robin`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dag: bool,
    /// Environment variables every rank (or task) gets besides the runtime's own
    /// (`mutirao submit --env KEY=VALUE`); see [`check_env`].
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub env: std::collections::BTreeMap<String, String>,
}

/// A job as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// Its id.
    pub id: i64,
    /// What was submitted.
    pub spec: NewJob,
    /// Its state.
    pub state: JobState,
    /// Submission time, ms since the epoch.
    pub created_ms: i64,
    /// Last change, ms since the epoch.
    pub updated_ms: i64,
}

/// One line of a job's journal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// The job.
    pub job: i64,
    /// Position in the journal, from 1.
    pub seq: i64,
    /// When, ms since the epoch.
    pub at_ms: i64,
    /// `state` for a transition (then `detail` follows the new state's name in `to`), or a
    /// free kind (`placement`, `refused`, `checkpoint`, …).
    pub kind: String,
    /// The new state, for a transition.
    pub to: Option<JobState>,
    /// What happened, for a person.
    pub detail: String,
}

/// What an agent reports with its heartbeat.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct HostReport {
    /// Host name.
    pub name: String,
    /// Where its agent listens.
    pub addr: String,
    /// Idle CPU, in cores.
    pub idle_cpu: f64,
    /// Free memory, MiB.
    pub free_mem_mib: u64,
    /// 1-minute load.
    pub load: f64,
    /// Its owner is active (keyboard, own load): no grid work now.
    pub owner_active: bool,
    /// The owner policy's decision (`available`, `suspend`: the grid's processes here are
    /// stopped, `vacate`: the grid must leave); `available` when the agent has no policy.
    #[serde(default)]
    pub owner: crate::policy::OwnerState,
    /// Why the owner's policy decided so (empty when available).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub owner_why: String,
    /// The host's properties as its agent declares them (`mutirao agent --site S --prop K=V`),
    /// e.g. `site`, `arch`: requirements compare them (`site=north`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub props: std::collections::BTreeMap<String, String>,
    /// The grid jobs whose ranks its agent runs or ran within the last hour (alive ranks and
    /// exits, per job and run, from the agent's rank journal): what a restarted coordinator
    /// reconciles its jobs with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jobs: Vec<mutirao_launch::journal::JobRanks>,
    /// Its agent's usage history ([`crate::usage`]): the whole of it at registration and at
    /// the first report of each hour, this hour's bucket otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<crate::usage::UsageReport>,
}

/// Most job entries (and ranks per entry) a host report may carry.
pub const MAX_REPORTED_JOBS: usize = 4096;

impl HostReport {
    /// The owner's policy keeps grid work off this host now (active owner, suspend, vacate).
    pub fn owner_busy(&self) -> bool {
        self.owner_active || self.owner != crate::policy::OwnerState::Available
    }
}

/// A host as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Host {
    /// The last report.
    pub report: HostReport,
    /// When it came, ms since the epoch.
    pub last_seen_ms: i64,
}

/// Longest string field accepted (program, argument, requirement, host name, address).
pub const MAX_FIELD: usize = 4096;
/// Most arguments a job may have.
pub const MAX_ARGS: usize = 4096;
/// Most ranks a job may ask for.
pub const MAX_RANKS: u32 = 1 << 20;

/// Most environment variables a job may set.
pub const MAX_ENV: usize = 256;
/// The prefix of the variables the runtime and its launchers set for every rank (rank, size,
/// bootstrap address, job token, checkpoint settings, the program's digest…): a job may not set
/// them.
pub const RESERVED_ENV_PREFIX: &str = "MUTIRAO_";

/// Why `key` cannot name an environment variable a job sets, if it cannot: a name is a
/// letter or `_` followed by letters, digits and `_` (POSIX shells' rule), at most 256 bytes,
/// and not one of the runtime's `MUTIRAO_*` variables.
pub fn check_env_key(key: &str) -> Result<(), String> {
    let mut chars = key.chars();
    let good = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && key.len() <= 256;
    if !good {
        return Err(format!(
            "environment variable {key:?}: a name is a letter or _ followed by letters, digits \
             and _ (at most 256 of them)"
        ));
    }
    if key.to_ascii_uppercase().starts_with(RESERVED_ENV_PREFIX) {
        return Err(format!(
            "environment variable {key}: names starting with {RESERVED_ENV_PREFIX} are reserved \
             for the runtime and its launcher, which set them for every rank; choose another name"
        ));
    }
    Ok(())
}

/// Why `env` cannot be a job's environment, if it cannot ([`check_env_key`] for every name,
/// values without NUL and at most [`MAX_FIELD`] bytes, at most [`MAX_ENV`] variables).
pub fn check_env(env: &std::collections::BTreeMap<String, String>) -> Result<(), String> {
    if env.len() > MAX_ENV {
        return Err(format!(
            "{} environment variables; at most {MAX_ENV} are accepted",
            env.len()
        ));
    }
    for (k, v) in env {
        check_env_key(k)?;
        check_text(&format!("the value of {k}"), v)?;
    }
    Ok(())
}

pub(crate) fn check_text(what: &str, s: &str) -> Result<(), String> {
    if s.len() > MAX_FIELD {
        return Err(format!(
            "{what} is {} bytes long; at most {MAX_FIELD} are accepted",
            s.len()
        ));
    }
    if s.contains('\0') {
        return Err(format!("{what} contains a NUL character"));
    }
    Ok(())
}

impl NewJob {
    /// Why this submission cannot be stored, if it cannot (both stores call this first, so
    /// they accept and refuse the same submissions).
    pub fn validate(&self) -> Result<(), String> {
        if self.ranks == 0 {
            return Err("a job needs at least 1 rank".into());
        }
        if self.ranks > MAX_RANKS {
            return Err(format!(
                "{} ranks asked; at most {MAX_RANKS} are accepted",
                self.ranks
            ));
        }
        if self.program.trim().is_empty() {
            return Err("a job needs a program".into());
        }
        if self.owner.trim().is_empty() {
            return Err("a job needs an owner".into());
        }
        check_text("the owner", &self.owner)?;
        check_text("the program", &self.program)?;
        if self.args.len() > MAX_ARGS {
            return Err(format!(
                "{} arguments; at most {MAX_ARGS} are accepted",
                self.args.len()
            ));
        }
        for (i, a) in self.args.iter().enumerate() {
            check_text(&format!("argument {}", i + 1), a)?;
        }
        if let Some(r) = &self.require {
            check_text("the requirement", r)?;
        }
        if let Some(s) = self.checkpoint_interval_s {
            if !(s.is_finite() && s > 0.0) {
                return Err(format!(
                    "checkpoint interval {s} s must be a positive number"
                ));
            }
        }
        check_env(&self.env)?;
        Ok(())
    }
}

impl HostReport {
    /// Why this report cannot be stored, if it cannot.
    pub fn validate(&self) -> Result<(), String> {
        if self.name.trim().is_empty() {
            return Err("a host report needs a host name".into());
        }
        check_text("the host name", &self.name)?;
        check_text("the address", &self.addr)?;
        check_text("the owner's reason", &self.owner_why)?;
        if !(self.idle_cpu.is_finite()
            && self.idle_cpu >= 0.0
            && self.load.is_finite()
            && self.load >= 0.0)
        {
            return Err(format!(
                "host {}: idle cpu {} and load {} must be non-negative numbers",
                self.name, self.idle_cpu, self.load
            ));
        }
        if self.jobs.len() > MAX_REPORTED_JOBS
            || self
                .jobs
                .iter()
                .any(|j| j.alive.len() + j.exits.len() > MAX_REPORTED_JOBS)
        {
            return Err(format!(
                "host {}: more than {MAX_REPORTED_JOBS} jobs or ranks reported",
                self.name
            ));
        }
        if let Some(u) = &self.usage {
            u.check().map_err(|e| format!("host {}: {e}", self.name))?;
        }
        if self.free_mem_mib > i64::MAX as u64 {
            return Err(format!(
                "host {}: free memory {} MiB is not believable",
                self.name, self.free_mem_mib
            ));
        }
        Ok(())
    }
}

/// One read of a job's output log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogChunk {
    /// The bytes from the asked offset (possibly none).
    pub data: Vec<u8>,
    /// The log's whole length now, bytes.
    pub length: u64,
}
