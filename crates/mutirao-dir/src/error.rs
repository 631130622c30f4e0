//! The crate's error type.

use crate::gid::Gid;

/// Everything that can go wrong in the directory, the wire format, the server and mεμ.
///
/// Messages say what went wrong, where, and what to do. An ACL outsider never sees
/// [`DirError::PermissionDenied`] for a resource it may not see: it gets [`DirError::NotFound`].
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum DirError {
    /// A configuration value is out of range.
    #[error("bad configuration: {0}")]
    BadConfig(String),
    /// A packet could not be decoded.
    #[error("malformed packet at byte {offset}: {what}")]
    Wire {
        /// Byte offset in the packet where decoding failed.
        offset: usize,
        /// What was wrong.
        what: String,
    },
    /// An attribute (name or value) or list exceeds a limit.
    #[error("attribute too large: {0}")]
    TooLarge(String),
    /// An attribute list is unusable for this request.
    #[error("bad attribute list: {0}")]
    BadAttrs(String),
    /// A scope number other than 0 (local), 1 (site), 2 (grid).
    #[error("unknown scope {0}: expected 0 (local), 1 (site) or 2 (grid)")]
    UnknownScope(u8),
    /// Attributes in the reserved `sys.` namespace are set by the system only.
    #[error(
        "attribute name {0:?} is in the reserved system namespace `sys.`; choose another name"
    )]
    SystemNamespace(String),
    /// No such resource (or the caller is not in its ACL, which looks the same).
    #[error("resource {0} not found")]
    NotFound(Gid),
    /// No resource matches the query.
    #[error("no resource matches the query")]
    NoMatch,
    /// The caller may see the resource but may not do this to it.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// A multi-answer query id that the server does not (or no longer) know.
    #[error("unknown or expired query {0}; start a new query")]
    UnknownQuery(u64),
    /// A context gid that the server does not know (expired or never opened).
    #[error("unknown context {0}: open a context first (or it expired for missing heartbeats)")]
    UnknownContext(Gid),
    /// The gid counter of this server is exhausted.
    #[error("gid counter exhausted on this server; restart it with another node id")]
    Exhausted,
    /// A socket or file error.
    #[error("i/o error: {0}")]
    Io(String),
    /// Peer authentication failed.
    #[error("authentication failed: {0}")]
    Auth(String),
    /// The peer violated the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// A request did not complete in time.
    #[error("timed out: {0}")]
    Timeout(String),
    /// A mεμ rule was violated (chaining, alias, capacity, routing).
    #[error("{0}")]
    Meu(String),
}

impl From<std::io::Error> for DirError {
    fn from(e: std::io::Error) -> Self {
        DirError::Io(e.to_string())
    }
}

impl DirError {
    /// The message without the variant's prefix (what a reply packet carries, so that the
    /// receiving side can rebuild the same error).
    pub fn body(&self) -> String {
        match self {
            DirError::BadConfig(m)
            | DirError::TooLarge(m)
            | DirError::BadAttrs(m)
            | DirError::SystemNamespace(m)
            | DirError::PermissionDenied(m)
            | DirError::Io(m)
            | DirError::Auth(m)
            | DirError::Protocol(m)
            | DirError::Timeout(m)
            | DirError::Meu(m) => m.clone(),
            other => other.to_string(),
        }
    }

    /// Stable numeric status for the wire (0 is success).
    pub fn status(&self) -> u16 {
        match self {
            DirError::BadConfig(_) => 10,
            DirError::Wire { .. } => 11,
            DirError::TooLarge(_) => 12,
            DirError::BadAttrs(_) => 13,
            DirError::UnknownScope(_) => 14,
            DirError::SystemNamespace(_) => 15,
            DirError::NotFound(_) => 1,
            DirError::NoMatch => 2,
            DirError::PermissionDenied(_) => 3,
            DirError::UnknownQuery(_) => 4,
            DirError::UnknownContext(_) => 5,
            DirError::Exhausted => 6,
            DirError::Io(_) => 20,
            DirError::Auth(_) => 21,
            DirError::Protocol(_) => 22,
            DirError::Timeout(_) => 23,
            DirError::Meu(_) => 30,
        }
    }
}
