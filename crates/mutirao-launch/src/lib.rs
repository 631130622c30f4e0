//! Launch and supervision of mutirão jobs, as a library: `mutirao run`, the agent, recovery,
//! spawn and the coordinator all start and watch ranks through it (STRUCTURE.md, move 1).
//!
//! - [`job`]: a [`job::JobSpec`] (program, ranks, hosts, environment, checkpoint store) starts
//!   one incarnation, a [`job::Job`] handle with an event stream, `signal`, `fail`;
//! - [`supervise`]: wait for the ranks, end them all on the first failure, say why;
//! - [`recovery`]: restart every rank from the last committed checkpoint, avoiding failed hosts;
//! - [`agent`]: the per-host agent's session server; [`proto`]: its authenticated protocol
//!   (with heartbeats, so a host that vanishes silently is noticed);
//! - [`hostfile`]: hostfile parsing and placement; [`ckpt_dir`]: checkpoints in a directory;
//!   [`fsutil`]: atomic file writes; [`journal`]: an agent's journal of the grid ranks it runs.
//!
//! Nothing here prints or installs signal handlers: callers get events and reports.
//!
//! ```no_run
//! use mutirao_launch::job::{Job, JobSpec};
//! use mutirao_launch::supervise::{supervise, Report, Watch};
//! let spec = JobSpec::local(4, "target/release/examples/ring", vec!["100".into()]);
//! let job = Job::start(&spec)?;
//! let ended = supervise(&job, spec.n, &Watch::default(), &mut |r| {
//!     if let Report::Output { rank, line, .. } = r {
//!         println!("[{rank}] {line}");
//!     }
//! });
//! assert_eq!(ended.code, 0);
//! # Ok::<(), anyhow::Error>(())
//! ```

pub mod agent;
pub mod child;
pub mod ckpt_dir;
pub mod fsutil;
pub mod hostfile;
pub mod job;
pub mod journal;
pub mod proto;
pub mod recovery;
pub mod sandbox;
pub mod store;
pub mod supervise;
