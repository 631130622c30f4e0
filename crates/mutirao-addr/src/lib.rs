//! # mutirao-addr — addressing by properties from a mutirão program
//!
//! The glue between the runtime (`mutirao`) and the directory (`mutirao-dir`): a program
//! registers mailboxes and memory blocks with attributes, others find them by attributes and
//! send, put and get through the runtime — Rocmeμ's resource-oriented addressing (digest 002
//! §7.3–7.6), including run-time component replacement (§6.2.1).
//!
//! A complete single-process run (a directory server in a thread, the runtime as one rank);
//! under `mutirao run` the directory comes from `MUTIRAO_DIR_SOCKET` and the same calls reach
//! mailboxes and blocks of other ranks:
//!
//! ```
//! use mutirao_addr::{Acl, Addr, AttrList, Block, Config, Mailbox, Match, Scope, Timeout};
//! use std::time::Duration;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let sock = std::env::temp_dir().join(format!("mutirao-addr-doc-{}.sock", std::process::id()));
//! # let (tx, rx) = std::sync::mpsc::channel();
//! # let s = sock.clone();
//! # std::thread::spawn(move || mutirao_dir::server::run_blocking(Default::default(), Some(s), None, move |_| { let _ = tx.send(()); }));
//! # rx.recv_timeout(Duration::from_secs(10))?;
//! let world = mutirao::init()?; // no launcher: a single rank
//! let cfg = Config { socket: Some(sock.clone()), ..Config::from_env()? };
//! let addr = Addr::connect_with(&world, cfg)?; // `Addr::connect(&world)` reads MUTIRAO_DIR_SOCKET
//!
//! // A mailbox described by properties, found by a partial query, sent to.
//! let props = AttrList::from_pairs([("service", "analyser"), ("lang", "pt")])?;
//! let inbox = Mailbox::register(&addr, &props, Acl::Public)?;
//! let found = addr.find(&AttrList::from_pairs([("service", "analyser")])?, Scope::Local)?;
//! assert_eq!(found[0].gid, inbox.gid());
//! let ticket = addr.send(&found[0], 7, b"texto".to_vec())?; // never blocks
//! let m = inbox.recv(Match::tag(7), Timeout::After(Duration::from_secs(5)))?.unwrap();
//! assert_eq!(m.data, b"texto");
//! addr.wait(&ticket, Duration::from_secs(5))?; // delivered
//!
//! // A memory block, written and read through put/get.
//! let block = Block::register(&addr, &AttrList::from_pairs([("store", "a")])?, 1024, Acl::Public)?;
//! let target = addr.find_blocks(&AttrList::from_pairs([("store", "a")])?, Scope::Local)?.remove(0);
//! addr.wait(&addr.put(&target, 10, b"bytes".to_vec())?, Duration::from_secs(5))?;
//! assert_eq!(addr.get(&target, 10, 5, Duration::from_secs(5))?, b"bytes");
//! assert!(addr.get(&target, 1020, 10, Duration::from_secs(5)).is_err()); // out of range
//!
//! drop((inbox, block));
//! drop(addr);
//! world.finalize()?;
//! # let _ = std::fs::remove_file(&sock);
//! # Ok(())
//! # }
//! ```
//!
//! What it provides:
//! - [`Addr::connect`] joins (collective) using the directory socket in `MUTIRAO_DIR_SOCKET`;
//! - [`Mailbox::register`] / [`Block::register`] with user attributes plus reserved ones
//!   (`mutirao.kind`, `.job`, `.rank`, `.ctx`, `.no`, `.size`) saying where the resource lives;
//! - [`Addr::find`] / [`Addr::find_blocks`]: query by (partial) properties, paged;
//! - [`Addr::send`] never blocks (per-destination credit window, queue beyond it) and returns
//!   a [`Ticket`]: delivered, or a [`Reason`] (deleted, process gone, ACL refused…);
//! - [`Mailbox::recv`] with [`Match`] on source and tag and a [`Timeout`];
//! - [`Addr::send_by_properties`]: component replacement (re-query and resend once);
//! - [`Addr::multicast`] over relations stored in the directory ([`Addr::relate`]): each
//!   member once, one wire message per destination process;
//! - [`Addr::put`] / [`Addr::get`] on another process's [`Block`] (software path).
//!
//! No progress thread: a process serves acknowledgements, credits and put/get only inside
//! calls of this API (see [`Addr`]). Ticket and get waits are bounded.
#![warn(missing_docs)]

mod addr;
pub mod credit;
pub mod pool;
pub mod proto;

pub use addr::{
    parse_techs, Addr, Block, Config, Kind, Mailbox, Match, Message, Multicast, Stats, Target,
    Ticket, TicketStatus, Timeout, ATTR_CTX, ATTR_JOB, ATTR_KIND, ATTR_NO, ATTR_RANK, ATTR_SIZE,
    BRIDGE_ENV, CREDITS_ENV, DIR_SOCKET_ENV, MAX_CLASS_ENV, RESERVED_PREFIX, TECHS_ENV,
};
pub use mutirao_dir::relations::Rel;
pub use mutirao_dir::{Acl, Attr, AttrList, Gid, Scope};
pub use proto::Reason;

use std::time::Duration;

/// Everything that can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum AddrError {
    /// No directory socket.
    #[error("no directory: {DIR_SOCKET_ENV} is not set; start the program with `mutirao run` (it hosts a directory for the job) or set {DIR_SOCKET_ENV} to an agent's directory socket (`mutirao agent --dir-socket PATH`)")]
    NoDirectory,
    /// A bad setting.
    #[error("bad setting: {0}")]
    Config(String),
    /// The directory refused or failed.
    #[error("directory: {0}")]
    Dir(mutirao_dir::DirError),
    /// The runtime failed.
    #[error("runtime: {0}")]
    Runtime(#[from] mutirao::Error),
    /// A user attribute used the reserved prefix.
    #[error("attribute {0:?} is reserved (names starting with `mutirao.` say where a resource lives); rename it")]
    Reserved(String),
    /// A directory entry without the location attributes this crate writes.
    #[error("resource {gid} has no valid {attr} attribute: it was not registered through mutirao-addr, so it cannot be addressed")]
    NotAddressable {
        /// The resource.
        gid: Gid,
        /// The missing or malformed attribute.
        attr: String,
    },
    /// The operation does not apply to that kind of resource.
    #[error("resource {gid} is not a {want}")]
    WrongKind {
        /// The resource.
        gid: Gid,
        /// What the operation needs.
        want: &'static str,
    },
    /// A delivery, put or get failed.
    #[error("resource {gid}: {reason}")]
    Delivery {
        /// The resource.
        gid: Gid,
        /// Why.
        reason: Reason,
    },
    /// A bounded wait ran out.
    #[error("{what}: no answer within {after:?} (is the target process inside the runtime? it serves acknowledgements only during mutirao-addr calls)")]
    TimedOut {
        /// The wait's bound.
        after: Duration,
        /// What was waited for.
        what: String,
    },
    /// No resource matches the query.
    #[error("no mailbox matches the query in this scope")]
    NoMatch,
    /// The local mailbox or block was deleted.
    #[error("resource {0} was deleted")]
    Deleted(Gid),
}
