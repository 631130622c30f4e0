//! # mutirao-mw: master/worker load balancing (HNOW, JoiN and friends)
//!
//! Pure logic, no I/O: the master of a master/worker program asks a [`Policy`] how many tasks
//! to hand each worker, keeps the hand-outs in a [`Ledger`] (every task done exactly once, a
//! lost worker's blocks re-queued, the first result of a replicated block wins), and appends
//! [`log::Record`]s to the repository log that [`measure`] analyses afterwards.
//!
//! * [`hnow`]: the seed-003 balancer — synchronized iterations, characterization round,
//!   heterogeneity factor, thresholds and Eqs. 1–5 ([`hnow::Mode::Faithful`]), and an improved
//!   mode (centre-of-band target, smoothed rates, at least one task, tail shrinking);
//! * [`policy`]: the same [`Policy`] trait for static equal split, JoiN (static shares, pull,
//!   replication of the slowest outstanding block), guided self-scheduling, adaptive weighted
//!   factoring and work stealing;
//! * [`ledger`]: block-cyclic dynamic distribution over the task index space, exactly once;
//! * [`config`]: the repository's configuration (`TAM_BLOCO`, `THRESHOLD_MIN`, …);
//! * [`normalize`]: Table 2 → Table 3 (`norm_i = T_best / T_i`), Σnorm for efficiency;
//! * [`log`] and [`measure`]: the per-iteration log and the measurement algorithm (AM) that
//!   proposes `TAM_BLOCO` and thresholds from it;
//! * [`awd`]: the available-workers pool (claim, release, spawn latency per host);
//! * [`choose`]: which candidate host to add, by predicted makespan (speed, spawn cost,
//!   remaining work);
//! * [`sim`]: a discrete-event master/worker simulator to compare policies without hosts;
//! * [`driver`] (the one module that does I/O): the same policies over real ranks of the
//!   `mutirao` runtime — rank 0 the master, the others workers.

#![forbid(unsafe_code)]

pub mod awd;
pub mod choose;
pub mod config;
pub mod driver;
pub mod hnow;
pub mod ledger;
pub mod log;
pub mod measure;
pub mod normalize;
pub mod policy;
pub mod sim;

pub use config::Config;
pub use ledger::{Block, Ledger};
pub use policy::{Policy, PolicyKind};

/// A worker's identity (the master's numbering; a rank, or an index into the membership).
pub type WorkerId = u32;

/// What a worker reports with each block: seconds computing and seconds communicating (the
/// load index of seed 003 §2.4; the worst case assumes they do not overlap).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LoadIndex {
    /// Time from the start to the end of the block's computation, s.
    pub t_comp_s: f64,
    /// Time spent receiving the block and sending its result, s.
    pub t_comm_s: f64,
}

/// Errors of this crate: bad configuration or a call out of protocol.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// A configuration value is missing, malformed or out of range.
    #[error("configuration: {0}")]
    Config(String),
    /// A call that does not fit the ledger's state (unknown block, wrong worker…).
    #[error("ledger: {0}")]
    Ledger(String),
    /// Anything else a caller passed that cannot be used.
    #[error("invalid argument: {0}")]
    Invalid(String),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
