//! The frames ranks exchange for addressing (pure: encoding, decoding, admission checks).
//!
//! Every frame is one runtime message on the addressing communicator's tag: a kind byte, then
//! little-endian fixed fields, then (for frames that carry bytes) the payload to the end.
//! Decoding never panics: a short or unknown frame is a [`FrameError`].

use mutirao_dir::{Acl, Cred, Gid};
use std::fmt;

/// Why a receiver refused a frame (sent back in a NACK), or why the sender gave up on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// No mailbox or block with that gid lives in the target process (deleted, or never there).
    NoSuchResource,
    /// The resource's ACL does not admit the sender (enforced by the receiver).
    AclRefused,
    /// A put/get range outside the block.
    OutOfRange {
        /// First byte asked for.
        offset: u64,
        /// Bytes asked for.
        len: u64,
        /// Size of the block.
        size: u64,
    },
    /// The resource is of another kind (a send to a block, a put to a mailbox).
    WrongKind,
    /// The target process ended or failed before acknowledging.
    ProcessGone(String),
    /// The target lives in another job, which this process's runtime cannot reach.
    OtherJob(String),
    /// No technology is shared with the target's process and no bridge links them.
    NoRoute(usize),
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::NoSuchResource => write!(
                f,
                "no such resource in the target process (deleted?): query the directory again for a replacement"
            ),
            Reason::AclRefused => write!(f, "the resource's ACL does not admit this sender"),
            Reason::OutOfRange { offset, len, size } => write!(
                f,
                "bytes {offset}..{} are outside the {size}-byte block",
                offset.saturating_add(*len)
            ),
            Reason::WrongKind => write!(
                f,
                "wrong kind of resource (send goes to mailboxes, put/get to blocks)"
            ),
            Reason::ProcessGone(why) => write!(f, "the target process is gone: {why}"),
            Reason::OtherJob(job) => write!(
                f,
                "the target lives in job {job:?}; only ranks of this job are reachable"
            ),
            Reason::NoRoute(rank) => write!(
                f,
                "no route to rank {rank}: it shares no technology with this process and no bridge (MUTIRAO_ADDR_BRIDGE=1) links them"
            ),
        }
    }
}

impl Reason {
    fn code(&self) -> (u8, [u64; 3]) {
        match self {
            Reason::NoSuchResource => (1, [0; 3]),
            Reason::AclRefused => (2, [0; 3]),
            Reason::OutOfRange { offset, len, size } => (3, [*offset, *len, *size]),
            Reason::WrongKind => (4, [0; 3]),
            // Local-only reasons never travel; encode as "no such resource".
            Reason::ProcessGone(_) | Reason::OtherJob(_) | Reason::NoRoute(_) => (1, [0; 3]),
        }
    }

    fn from_code(c: u8, v: [u64; 3]) -> Result<Reason, FrameError> {
        Ok(match c {
            1 => Reason::NoSuchResource,
            2 => Reason::AclRefused,
            3 => Reason::OutOfRange {
                offset: v[0],
                len: v[1],
                size: v[2],
            },
            4 => Reason::WrongKind,
            n => return Err(FrameError(format!("unknown refusal reason {n}"))),
        })
    }
}

/// A malformed frame (a peer speaking another protocol version, or corruption).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed addressing frame: {0}")]
pub struct FrameError(pub String);

/// One addressing frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// A message for mailbox `dst` (uses one credit).
    Data {
        /// Sender's sequence number (ticket id).
        seq: u64,
        /// Destination mailbox.
        dst: Gid,
        /// Source identity (the sender's context, or a mailbox it sends as).
        src: Gid,
        /// Sender's credentials (checked against the mailbox's ACL).
        cred: Cred,
        /// User tag.
        tag: i32,
        /// The bytes.
        payload: Vec<u8>,
    },
    /// One wire message of a multicast: a copy for each of `members` (uses one credit).
    Mcast {
        /// Sender's sequence number.
        seq: u64,
        /// Sender's context (with `seq`, the duplicate-detection key).
        origin: Gid,
        /// Source identity.
        src: Gid,
        /// Sender's credentials.
        cred: Cred,
        /// User tag.
        tag: i32,
        /// Mailboxes in the receiving process that get a copy.
        members: Vec<Gid>,
        /// The bytes.
        payload: Vec<u8>,
    },
    /// Accepted; `credits` returned with it.
    Ack {
        /// The accepted frame's sequence number.
        seq: u64,
        /// Credits returned.
        credits: u32,
    },
    /// Refused; `credits` returned with it.
    Nack {
        /// The refused frame's sequence number.
        seq: u64,
        /// Why.
        reason: Reason,
        /// Credits returned.
        credits: u32,
    },
    /// Credits returned on their own (the receiver's application consumed messages).
    Credit {
        /// How many.
        credits: u32,
    },
    /// Write `data` at `offset` of block `dst`.
    Put {
        /// Sequence number (ticket id).
        seq: u64,
        /// The block.
        dst: Gid,
        /// Sender's credentials.
        cred: Cred,
        /// Byte offset in the block.
        offset: u64,
        /// The bytes.
        data: Vec<u8>,
    },
    /// Read `len` bytes at `offset` of block `dst`.
    Get {
        /// Sequence number.
        seq: u64,
        /// The block.
        dst: Gid,
        /// Sender's credentials.
        cred: Cred,
        /// Byte offset in the block.
        offset: u64,
        /// Bytes wanted.
        len: u64,
    },
    /// The bytes a [`Frame::Get`] asked for.
    GetReply {
        /// The get's sequence number.
        seq: u64,
        /// The bytes.
        data: Vec<u8>,
    },
    /// "I reached barrier `epoch`."
    Done {
        /// Barrier number.
        epoch: u64,
    },
}

const K_DATA: u8 = 1;
const K_MCAST: u8 = 2;
const K_ACK: u8 = 3;
const K_NACK: u8 = 4;
const K_CREDIT: u8 = 5;
const K_PUT: u8 = 6;
const K_GET: u8 = 7;
const K_GETREPLY: u8 = 8;
const K_DONE: u8 = 9;

/// Most members one multicast frame may name (bounds a decoder's allocation).
pub const MAX_MEMBERS: usize = 1 << 16;

struct W<'a>(&'a mut Vec<u8>);
impl W<'_> {
    fn u8(&mut self, x: u8) -> &mut Self {
        self.0.push(x);
        self
    }
    fn u64(&mut self, x: u64) -> &mut Self {
        self.0.extend_from_slice(&x.to_le_bytes());
        self
    }
    fn u32(&mut self, x: u32) -> &mut Self {
        self.0.extend_from_slice(&x.to_le_bytes());
        self
    }
    fn cred(&mut self, c: Cred) -> &mut Self {
        self.u32(c.uid).u32(c.gid)
    }
    fn bytes(&mut self, b: &[u8]) {
        self.0.extend_from_slice(b);
    }
}

struct R<'a> {
    b: &'a [u8],
    at: usize,
}
impl<'a> R<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], FrameError> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.b.len());
        let end = end.ok_or_else(|| {
            FrameError(format!(
                "frame of {} bytes ends inside {what} (at byte {})",
                self.b.len(),
                self.at
            ))
        })?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u64(&mut self, what: &str) -> Result<u64, FrameError> {
        let s = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
    fn u32(&mut self, what: &str) -> Result<u32, FrameError> {
        let s = self.take(4, what)?;
        let mut a = [0u8; 4];
        a.copy_from_slice(s);
        Ok(u32::from_le_bytes(a))
    }
    fn cred(&mut self) -> Result<Cred, FrameError> {
        Ok(Cred::new(self.u32("uid")?, self.u32("gid")?))
    }
    fn rest(&mut self) -> Vec<u8> {
        let s = &self.b[self.at..];
        self.at = self.b.len();
        s.to_vec()
    }
    fn end(&self) -> Result<(), FrameError> {
        if self.at == self.b.len() {
            Ok(())
        } else {
            Err(FrameError(format!(
                "{} trailing bytes",
                self.b.len() - self.at
            )))
        }
    }
}

impl Frame {
    /// Encodes the frame (header, then payload).
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.encoded_len());
        self.encode_into(&mut v);
        v
    }

    /// Bytes [`Frame::encode`] produces: the header (`ctrl`) plus the payload.
    pub fn encoded_len(&self) -> usize {
        match self {
            Frame::Data { payload, .. } => 37 + payload.len(),
            Frame::Mcast {
                members, payload, ..
            } => 41 + 8 * members.len() + payload.len(),
            Frame::Ack { .. } => 13,
            Frame::Nack { .. } => 38,
            Frame::Credit { .. } => 5,
            Frame::Put { data, .. } => 33 + data.len(),
            Frame::Get { .. } => 41,
            Frame::GetReply { data, .. } => 9 + data.len(),
            Frame::Done { .. } => 9,
        }
    }

    /// Encodes into `out` (cleared first), e.g. a pooled buffer.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.clear();
        let mut w = W(out);
        match self {
            Frame::Data {
                seq,
                dst,
                src,
                cred,
                tag,
                payload,
            } => w
                .u8(K_DATA)
                .u64(*seq)
                .u64(dst.0)
                .u64(src.0)
                .cred(*cred)
                .u32(*tag as u32)
                .bytes(payload),
            Frame::Mcast {
                seq,
                origin,
                src,
                cred,
                tag,
                members,
                payload,
            } => {
                w.u8(K_MCAST)
                    .u64(*seq)
                    .u64(origin.0)
                    .u64(src.0)
                    .cred(*cred)
                    .u32(*tag as u32)
                    .u32(members.len() as u32);
                for m in members {
                    w.u64(m.0);
                }
                w.bytes(payload)
            }
            Frame::Ack { seq, credits } => {
                w.u8(K_ACK).u64(*seq).u32(*credits);
            }
            Frame::Nack {
                seq,
                reason,
                credits,
            } => {
                let (c, v) = reason.code();
                w.u8(K_NACK)
                    .u64(*seq)
                    .u32(*credits)
                    .u64(v[0])
                    .u64(v[1])
                    .u64(v[2])
                    .u8(c);
            }
            Frame::Credit { credits } => {
                w.u8(K_CREDIT).u32(*credits);
            }
            Frame::Put {
                seq,
                dst,
                cred,
                offset,
                data,
            } => w
                .u8(K_PUT)
                .u64(*seq)
                .u64(dst.0)
                .cred(*cred)
                .u64(*offset)
                .bytes(data),
            Frame::Get {
                seq,
                dst,
                cred,
                offset,
                len,
            } => {
                w.u8(K_GET)
                    .u64(*seq)
                    .u64(dst.0)
                    .cred(*cred)
                    .u64(*offset)
                    .u64(*len);
            }
            Frame::GetReply { seq, data } => w.u8(K_GETREPLY).u64(*seq).bytes(data),
            Frame::Done { epoch } => {
                w.u8(K_DONE).u64(*epoch);
            }
        }
    }

    /// Decodes a frame; malformed input is an error, never a panic.
    pub fn decode(b: &[u8]) -> Result<Frame, FrameError> {
        let mut r = R { b, at: 0 };
        let kind = r.take(1, "the kind byte")?[0];
        let f = match kind {
            K_DATA => Frame::Data {
                seq: r.u64("seq")?,
                dst: Gid(r.u64("dst")?),
                src: Gid(r.u64("src")?),
                cred: r.cred()?,
                tag: r.u32("tag")? as i32,
                payload: r.rest(),
            },
            K_MCAST => {
                let seq = r.u64("seq")?;
                let origin = Gid(r.u64("origin")?);
                let src = Gid(r.u64("src")?);
                let cred = r.cred()?;
                let tag = r.u32("tag")? as i32;
                let n = r.u32("member count")? as usize;
                if n > MAX_MEMBERS {
                    return Err(FrameError(format!(
                        "{n} multicast members (at most {MAX_MEMBERS})"
                    )));
                }
                let mut members = Vec::with_capacity(n.min(b.len() / 8));
                for _ in 0..n {
                    members.push(Gid(r.u64("member list")?));
                }
                Frame::Mcast {
                    seq,
                    origin,
                    src,
                    cred,
                    tag,
                    members,
                    payload: r.rest(),
                }
            }
            K_ACK => {
                let f = Frame::Ack {
                    seq: r.u64("seq")?,
                    credits: r.u32("credits")?,
                };
                r.end()?;
                f
            }
            K_NACK => {
                let seq = r.u64("seq")?;
                let credits = r.u32("credits")?;
                let v = [r.u64("reason")?, r.u64("reason")?, r.u64("reason")?];
                let c = r.take(1, "reason code")?[0];
                r.end()?;
                Frame::Nack {
                    seq,
                    reason: Reason::from_code(c, v)?,
                    credits,
                }
            }
            K_CREDIT => {
                let f = Frame::Credit {
                    credits: r.u32("credits")?,
                };
                r.end()?;
                f
            }
            K_PUT => Frame::Put {
                seq: r.u64("seq")?,
                dst: Gid(r.u64("dst")?),
                cred: r.cred()?,
                offset: r.u64("offset")?,
                data: r.rest(),
            },
            K_GET => {
                let f = Frame::Get {
                    seq: r.u64("seq")?,
                    dst: Gid(r.u64("dst")?),
                    cred: r.cred()?,
                    offset: r.u64("offset")?,
                    len: r.u64("len")?,
                };
                r.end()?;
                f
            }
            K_GETREPLY => Frame::GetReply {
                seq: r.u64("seq")?,
                data: r.rest(),
            },
            K_DONE => {
                let f = Frame::Done {
                    epoch: r.u64("epoch")?,
                };
                r.end()?;
                f
            }
            n => return Err(FrameError(format!("unknown frame kind {n}"))),
        };
        Ok(f)
    }

    /// True for frames that use a credit of the receiver's window.
    pub fn uses_credit(&self) -> bool {
        matches!(self, Frame::Data { .. } | Frame::Mcast { .. })
    }
}

/// The receiver-side ACL check: does a resource owned by `owner` under `acl` admit `cred`?
pub fn admit(acl: &Acl, owner: u32, cred: Cred) -> Result<(), Reason> {
    if acl.permits(owner, cred) {
        Ok(())
    } else {
        Err(Reason::AclRefused)
    }
}

/// The byte range `offset..offset+len` of a `size`-byte block, or why not.
pub fn block_range(size: usize, offset: u64, len: u64) -> Result<std::ops::Range<usize>, Reason> {
    let bad = || Reason::OutOfRange {
        offset,
        len,
        size: size as u64,
    };
    let end = offset.checked_add(len).ok_or_else(bad)?;
    if end > size as u64 {
        return Err(bad());
    }
    Ok(offset as usize..end as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn all() -> Vec<Frame> {
        let c = Cred::new(1000, 100);
        vec![
            Frame::Data {
                seq: 7,
                dst: Gid(9),
                src: Gid(3),
                cred: c,
                tag: -2,
                payload: b"hello".to_vec(),
            },
            Frame::Mcast {
                seq: 1,
                origin: Gid(2),
                src: Gid(3),
                cred: c,
                tag: 4,
                members: vec![Gid(5), Gid(6)],
                payload: vec![0; 100],
            },
            Frame::Ack { seq: 3, credits: 2 },
            Frame::Nack {
                seq: 3,
                reason: Reason::OutOfRange {
                    offset: 10,
                    len: 20,
                    size: 15,
                },
                credits: 1,
            },
            Frame::Nack {
                seq: 4,
                reason: Reason::AclRefused,
                credits: 0,
            },
            Frame::Credit { credits: 8 },
            Frame::Put {
                seq: 5,
                dst: Gid(8),
                cred: c,
                offset: 4,
                data: vec![1, 2, 3],
            },
            Frame::Get {
                seq: 6,
                dst: Gid(8),
                cred: c,
                offset: 4,
                len: 3,
            },
            Frame::GetReply {
                seq: 6,
                data: vec![],
            },
            Frame::Done { epoch: 2 },
        ]
    }

    #[test]
    fn every_frame_round_trips() {
        for f in all() {
            let b = f.encode();
            assert_eq!(b.len(), f.encoded_len(), "{f:?}");
            assert_eq!(Frame::decode(&b), Ok(f.clone()), "{f:?}");
        }
    }

    #[test]
    fn truncated_frames_are_errors() {
        for f in all() {
            let b = f.encode();
            for cut in 0..b.len() {
                let d = Frame::decode(&b[..cut]);
                // Frames ending in a payload may decode with a shorter payload; never panic,
                // and fixed-size frames must fail.
                if let Ok(g) = d {
                    assert!(
                        matches!(
                            g,
                            Frame::Data { .. }
                                | Frame::Mcast { .. }
                                | Frame::Put { .. }
                                | Frame::GetReply { .. }
                        ),
                        "{f:?} cut at {cut} decoded as {g:?}"
                    );
                }
            }
        }
        assert!(Frame::decode(&[42]).is_err());
        assert!(Frame::decode(&[]).is_err());
    }

    #[test]
    fn local_only_reasons_never_travel_as_themselves() {
        let f = Frame::Nack {
            seq: 1,
            reason: Reason::ProcessGone("x".into()),
            credits: 0,
        };
        assert!(matches!(
            Frame::decode(&f.encode()),
            Ok(Frame::Nack {
                reason: Reason::NoSuchResource,
                ..
            })
        ));
    }

    #[test]
    fn acl_admission_at_the_receiver() {
        let owner = 1000;
        assert_eq!(admit(&Acl::Public, owner, Cred::new(5, 5)), Ok(()));
        assert_eq!(admit(&Acl::private(), owner, Cred::new(1000, 5)), Ok(()));
        assert_eq!(
            admit(&Acl::private(), owner, Cred::new(65534, 65534)),
            Err(Reason::AclRefused)
        );
        let acl = Acl::Only {
            users: vec![7],
            groups: vec![50],
        };
        assert_eq!(admit(&acl, owner, Cred::new(7, 1)), Ok(()));
        assert_eq!(admit(&acl, owner, Cred::new(8, 50)), Ok(()));
        assert_eq!(
            admit(&acl, owner, Cred::new(8, 51)),
            Err(Reason::AclRefused)
        );
    }

    #[test]
    fn block_ranges() {
        assert_eq!(block_range(10, 0, 10), Ok(0..10));
        assert_eq!(block_range(10, 10, 0), Ok(10..10));
        assert!(block_range(10, 5, 6).is_err());
        assert!(block_range(10, u64::MAX, 2).is_err());
        assert!(block_range(0, 1, 0).is_err());
    }

    proptest! {
        #[test]
        fn decoding_garbage_never_panics(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Frame::decode(&b);
        }
    }
}
