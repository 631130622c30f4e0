//! # mutirão: message passing for unequal, non-dedicated machines
//!
//! The library a parallel program links. Start it under the launcher
//! (`mutirao run -n 4 ./my_program`), or alone, where it runs as a single rank.
//!
//! ```no_run
//! use mutirao::op;
//!
//! fn main() -> Result<(), mutirao::Error> {
//!     let world = mutirao::init()?;
//!     let (rank, size) = (world.rank(), world.size());
//!     if rank == 0 {
//!         world.send(&[1.0f64, 2.0, 3.0], 1 % size, 7)?;
//!     }
//!     if rank == 1 % size {
//!         let mut buf = [0.0f64; 3];
//!         let status = world.recv(&mut buf, 0, 7)?;
//!         assert_eq!(status.bytes, 24);
//!     }
//!     let mut sum = [0u64];
//!     world.allreduce(&[rank as u64], &mut sum, &op::Sum)?;
//!     assert_eq!(sum[0], (size * (size - 1) / 2) as u64);
//!     world.finalize()
//! }
//! ```
//!
//! What it provides:
//! - point-to-point: [`Comm::send`], [`Comm::recv`] (with [`ANY_SOURCE`] / [`ANY_TAG`] and a
//!   [`Status`]), nonblocking [`Comm::isend`] / [`Comm::irecv`] returning a [`Request`]
//!   ([`Request::wait`], [`Request::test`], [`wait_all`], [`wait_any`]), [`Comm::probe`] /
//!   [`Comm::iprobe`]; MPI's non-overtaking order per (source, tag, communicator);
//! - typed messages: zero-copy for slices of plain-old-data (`bytemuck::Pod`), serde
//!   ([`Comm::send_obj`], [`Comm::recv_obj`]) for heap types;
//! - collectives with real algorithms (see [`coll`]): barrier, bcast, reduce, allreduce,
//!   gather(v), scatter(v), allgather, alltoall, user operators; [`Comm::split`] and [`Comm::dup`];
//! - transports: TCP between hosts, shared-memory rings between processes of one host, the
//!   fastest chosen per peer;
//! - a waiting rank spins briefly and then sleeps in the kernel, so ranks sharing a core do not
//!   starve each other;
//! - spawn: one rank starts more ranks while the job runs ([`Comm::spawn`], [`SpawnSpec`]);
//!   they and it share a merged communicator, the other ranks do not pause;
//! - errors, never aborts: when a peer dies, every operation that needs it returns
//!   [`Error::PeerFailed`].
//!
//! Threading: a communicator is used from one thread (it is `!Send`), like MPI at
//! `MPI_THREAD_FUNNELED`.

mod busy;
pub mod ckpt;
pub mod coll;
mod comm;
pub mod config;
mod engine;
mod init;
pub mod local_job;
pub mod op;
pub mod pmi;
pub mod seal;
pub mod shm;
mod spawn;
mod transport;
pub mod wire;

pub use comm::{wait_all, wait_any, Comm, Completion, Recovery, Request, RestoredRequest};
pub use init::{init, init_with, InitTimings, JobEnv, SpawnEnv};
pub use spawn::{PendingSpawn, SpawnSpec, Spawned};

/// Receive from any source.
pub const ANY_SOURCE: usize = usize::MAX;
/// Receive with any tag. User tags must be ≥ 0.
pub const ANY_TAG: i32 = -1;

/// What a completed receive (or a probe) tells about the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    /// Rank of the sender in the communicator used.
    pub source: usize,
    /// The message's tag.
    pub tag: i32,
    /// Size of the message in bytes.
    pub bytes: usize,
}

impl Status {
    /// Number of elements of type `T` in the message.
    pub fn count<T>(&self) -> usize {
        self.bytes / std::mem::size_of::<T>().max(1)
    }
}

/// Everything that can go wrong. Operations never abort the process.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum Error {
    /// Start-up failed: launcher unreachable, peers unreachable, bad environment.
    #[error("mutirão initialisation failed: {0}")]
    Init(String),
    /// A peer died or its connection broke; the operation cannot complete.
    #[error("rank {rank} (world) failed: {reason}; operations that need it cannot complete")]
    PeerFailed { rank: usize, reason: String },
    /// A peer has finalized and will send or receive nothing more.
    #[error("rank {0} (world) has finalized and will neither send nor receive any more")]
    PeerFinalized(usize),
    /// The message is larger than the receive buffer.
    #[error("message of {got} bytes does not fit the {cap}-byte receive buffer; post a larger buffer or use recv_vec")]
    Truncated { got: usize, cap: usize },
    /// The message size is not a whole number of elements of the receive type.
    #[error("message of {bytes} bytes is not a whole number of {elem}-byte elements: sender and receiver disagree on the type")]
    ElementSize { bytes: usize, elem: usize },
    /// A wrong argument: rank out of range, negative tag, mismatched lengths…
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// A serde message could not be encoded or decoded.
    #[error("cannot encode or decode a message: {0}")]
    Codec(String),
    /// An operating-system error.
    #[error("I/O error: {0}")]
    Io(String),
    /// A spawn failed (the launcher cannot spawn, the program did not start, a child did not
    /// connect in time); the children started are stopped and the job goes on.
    #[error("spawn failed: {0}")]
    Spawn(String),
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e.to_string())
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
