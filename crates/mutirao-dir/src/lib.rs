//! # mutirao-dir — the directory service and the mεμ resource hierarchy
//!
//! A resource is a global id ([`Gid`]) plus an immutable attribute list ([`AttrList`]).
//! [`Directory`] is one server's in-memory database (no I/O; time is a parameter);
//! [`server::DirServer`] serves it over a Unix socket (local clients, SO_PEERCRED) and TCP
//! (peer servers, HMAC cluster key); [`client::Client`] talks to a server; [`meu`] is the
//! resource hierarchy (spec parser, property algebra, lookup, allocation, message routing);
//! [`relations`] plans multicast over filiation/pairing relations (pure, no I/O).
//!
//! ```
//! use mutirao_dir::{Acl, AttrList, Attr, Cred, Directory, DirConfig};
//! use std::time::Instant;
//!
//! let mut dir = Directory::new(DirConfig::default()).unwrap();
//! let me = Cred::new(1000, 1000);
//! let now = Instant::now();
//! let ctx = dir.open_context(me, now).unwrap();
//! let attrs = AttrList::from_pairs([("type", "mailbox"), ("name", "pending")]).unwrap();
//! let reg = dir.register(me, ctx, attrs, Acl::Public, false).unwrap();
//!
//! // Find it by a full attribute and ask for the value of "name".
//! let q = AttrList::from_attrs([Attr::full("type", "mailbox"), Attr::want("name", 64)]).unwrap();
//! let (gid, answer) = dir.query(me, None, &q).unwrap();
//! assert_eq!(gid, reg.gid);
//! assert_eq!(answer.value("name"), Some(&b"pending"[..]));
//! ```
#![warn(missing_docs)]

pub mod attr;
pub mod client;
pub mod directory;
pub mod error;
pub mod gid;
pub mod meu;
pub mod net;
pub mod relations;
pub mod server;
pub mod wire;

pub use attr::{Attr, AttrList, AttrValue};
pub use directory::{Acl, Cred, DirConfig, Directory, Registered};
pub use error::DirError;
pub use gid::{Gid, GidParts, GidSplit};
pub use wire::{Kind, Packet, Scope};
