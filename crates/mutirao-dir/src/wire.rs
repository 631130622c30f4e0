//! The AttrList wire encoding (digest 002 §7.3): one contiguous buffer that *is* the packet.
//!
//! ```text
//! header (32 bytes, little endian)
//!   0  magic u8 = 0xD1      1  version u8 = 1     2  kind u8      3  scope u8
//!   4  flags u16            6  status u16         8  uid u32      12 gid u32
//!   16 query_id u64         24 target u64 (a gid: resource, context or result)
//! count u32
//! count × ( name_len u16 | name | kind u8 (0 full, 1 want) | value_len u32 | value )
//! ```
//! For a `want` attribute `value_len` is the wanted length and no value bytes follow.
//! [`Packet::decode`] never panics: truncated, oversized or inconsistent input is an error.

use crate::attr::{check_attr, Attr, AttrList, AttrValue, MAX_ATTRS};
use crate::error::DirError;
use crate::gid::Gid;

/// Size of the fixed header.
pub const HEADER_LEN: usize = 32;
/// Largest packet accepted.
pub const MAX_PACKET: usize = 4 * 1024 * 1024;
const MAGIC: u8 = 0xD1;
const VERSION: u8 = 1;

/// Where a query looks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// This server's database only (no network I/O).
    Local,
    /// Every server of this site (same cluster id).
    Site,
    /// Every known server of every site.
    Grid,
}

impl Scope {
    /// Wire number.
    pub fn to_u8(self) -> u8 {
        match self {
            Scope::Local => 0,
            Scope::Site => 1,
            Scope::Grid => 2,
        }
    }

    /// From the wire number; unknown numbers are an error.
    pub fn from_u8(v: u8) -> Result<Self, DirError> {
        match v {
            0 => Ok(Scope::Local),
            1 => Ok(Scope::Site),
            2 => Ok(Scope::Grid),
            n => Err(DirError::UnknownScope(n)),
        }
    }
}

impl std::str::FromStr for Scope {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "local" => Ok(Scope::Local),
            "site" | "cluster" => Ok(Scope::Site),
            "grid" | "multicluster" => Ok(Scope::Grid),
            other => Err(format!(
                "unknown scope {other:?}: expected local, site or grid"
            )),
        }
    }
}

/// Request and reply kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Register a resource (attrs = the resource, target = context gid, flag UNIQUE).
    Register = 1,
    /// Single-answer query (target = gid or 0, attrs = query).
    Query = 2,
    /// Start a multi-answer query; the reply carries the first result.
    QueryStart = 3,
    /// Next result of query `query_id`.
    QueryNext = 4,
    /// Stop query `query_id` and free its state.
    QueryStop = 5,
    /// Delete resource `target`.
    Delete = 6,
    /// Open a context (a process); the reply's target is its gid.
    OpenContext = 7,
    /// Heartbeat of context `target`.
    Heartbeat = 8,
    /// Close context `target`, deleting its resources.
    CloseContext = 9,
    /// Server to server: single-answer query (reply only if found).
    PeerQuery = 0x20,
    /// Server to server: start a paged query (reply only if something matches).
    PeerStart = 0x21,
    /// Server to server: next result of a paged query.
    PeerNext = 0x22,
    /// Server to server: stop a paged query.
    PeerStop = 0x23,
    /// Server to server: unique registration routed to the owner of the attributes.
    PeerUnique = 0x24,
    /// Server to server: delete a resource the requesting server asked this one to hold.
    PeerDelete = 0x25,
    /// A reply (status 0 = success).
    Reply = 0x80,
}

impl Kind {
    fn from_u8(v: u8, offset: usize) -> Result<Self, DirError> {
        Ok(match v {
            1 => Kind::Register,
            2 => Kind::Query,
            3 => Kind::QueryStart,
            4 => Kind::QueryNext,
            5 => Kind::QueryStop,
            6 => Kind::Delete,
            7 => Kind::OpenContext,
            8 => Kind::Heartbeat,
            9 => Kind::CloseContext,
            0x20 => Kind::PeerQuery,
            0x21 => Kind::PeerStart,
            0x22 => Kind::PeerNext,
            0x23 => Kind::PeerStop,
            0x24 => Kind::PeerUnique,
            0x25 => Kind::PeerDelete,
            0x80 => Kind::Reply,
            n => {
                return Err(DirError::Wire {
                    offset,
                    what: format!("unknown request kind {n:#x}"),
                })
            }
        })
    }
}

/// Header flag: register only if no equal resource exists (return the existing gid).
pub const FLAG_UNIQUE: u16 = 1;
/// Reply flag: a multi-answer query has more results.
pub const FLAG_MORE: u16 = 2;
/// Reply flag: a registration created a new resource.
pub const FLAG_CREATED: u16 = 4;

/// The fixed packet header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Request or reply kind.
    pub kind: Kind,
    /// Raw scope byte (checked with [`Scope::from_u8`] by whoever needs it).
    pub scope: u8,
    /// Flags (`FLAG_*`).
    pub flags: u16,
    /// Reply status (0 ok, else [`DirError::status`]).
    pub status: u16,
    /// Caller's user id (overwritten by the server from SO_PEERCRED for local clients).
    pub uid: u32,
    /// Caller's group id (likewise).
    pub gid: u32,
    /// Request id / query id.
    pub query_id: u64,
    /// A gid: the resource, context or result concerned.
    pub target: Gid,
}

impl Header {
    /// A header of `kind` with everything else zero.
    pub fn new(kind: Kind) -> Self {
        Header {
            kind,
            scope: 0,
            flags: 0,
            status: 0,
            uid: 0,
            gid: 0,
            query_id: 0,
            target: Gid::NONE,
        }
    }
}

/// A whole packet: header plus attribute list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packet {
    /// The header.
    pub header: Header,
    /// The attributes (canonical order).
    pub attrs: AttrList,
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], DirError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        match end {
            Some(end) => {
                let s = &self.buf[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(DirError::Wire {
                offset: self.pos,
                what: format!(
                    "truncated: {what} needs {n} bytes, {} left",
                    self.buf.len() - self.pos
                ),
            }),
        }
    }
    fn u8(&mut self, what: &str) -> Result<u8, DirError> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16, DirError> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self, what: &str) -> Result<u32, DirError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self, what: &str) -> Result<u64, DirError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
}

impl Packet {
    /// A packet with `header` and `attrs`.
    pub fn new(header: Header, attrs: AttrList) -> Self {
        Packet { header, attrs }
    }

    /// Encoded size in bytes.
    pub fn encoded_len(&self) -> usize {
        HEADER_LEN
            + 4
            + self
                .attrs
                .iter()
                .map(|a| {
                    2 + a.name.len()
                        + 1
                        + 4
                        + match &a.value {
                            AttrValue::Full(v) => v.len(),
                            AttrValue::Want { .. } => 0,
                        }
                })
                .sum::<usize>()
    }

    /// Appends the encoding to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let h = &self.header;
        out.reserve(self.encoded_len());
        out.push(MAGIC);
        out.push(VERSION);
        out.push(h.kind as u8);
        out.push(h.scope);
        out.extend_from_slice(&h.flags.to_le_bytes());
        out.extend_from_slice(&h.status.to_le_bytes());
        out.extend_from_slice(&h.uid.to_le_bytes());
        out.extend_from_slice(&h.gid.to_le_bytes());
        out.extend_from_slice(&h.query_id.to_le_bytes());
        out.extend_from_slice(&h.target.0.to_le_bytes());
        out.extend_from_slice(&(self.attrs.len() as u32).to_le_bytes());
        for a in &self.attrs {
            // Limits (checked on construction) keep these casts lossless.
            out.extend_from_slice(&(a.name.len() as u16).to_le_bytes());
            out.extend_from_slice(a.name.as_bytes());
            match &a.value {
                AttrValue::Full(v) => {
                    out.push(0);
                    out.extend_from_slice(&(v.len() as u32).to_le_bytes());
                    out.extend_from_slice(v);
                }
                AttrValue::Want { len } => {
                    out.push(1);
                    out.extend_from_slice(&len.to_le_bytes());
                }
            }
        }
    }

    /// The encoding as a new buffer.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.encode_into(&mut v);
        v
    }

    /// Decodes a packet. Never panics; any inconsistency is a [`DirError::Wire`] (or a limit
    /// error). Attributes must arrive in canonical order with unique names.
    pub fn decode(buf: &[u8]) -> Result<Packet, DirError> {
        if buf.len() > MAX_PACKET {
            return Err(DirError::TooLarge(format!(
                "packet of {} bytes exceeds the {MAX_PACKET}-byte limit",
                buf.len()
            )));
        }
        let mut r = Reader { buf, pos: 0 };
        let magic = r.u8("magic")?;
        if magic != MAGIC {
            return Err(DirError::Wire {
                offset: 0,
                what: format!("bad magic {magic:#x}, expected {MAGIC:#x}"),
            });
        }
        let version = r.u8("version")?;
        if version != VERSION {
            return Err(DirError::Wire {
                offset: 1,
                what: format!("unsupported version {version}, this build speaks {VERSION}"),
            });
        }
        let kind = Kind::from_u8(r.u8("kind")?, 2)?;
        let scope = r.u8("scope")?;
        let flags = r.u16("flags")?;
        let status = r.u16("status")?;
        let uid = r.u32("uid")?;
        let gid = r.u32("gid")?;
        let query_id = r.u64("query id")?;
        let target = Gid(r.u64("target")?);
        let count_at = r.pos;
        let count = r.u32("attribute count")? as usize;
        if count > MAX_ATTRS {
            return Err(DirError::Wire {
                offset: count_at,
                what: format!("attribute count {count} exceeds the limit {MAX_ATTRS}"),
            });
        }
        let mut attrs: Vec<Attr> = Vec::with_capacity(count.min(64));
        for i in 0..count {
            let at = r.pos;
            let nlen = r.u16("attribute name length")? as usize;
            let name_bytes = r.take(nlen, "attribute name")?;
            let name = std::str::from_utf8(name_bytes)
                .map_err(|_| DirError::Wire {
                    offset: at + 2,
                    what: format!("attribute {i}: name is not UTF-8"),
                })?
                .to_string();
            let vk = r.u8("attribute kind")?;
            let vlen = r.u32("attribute value length")?;
            let value = match vk {
                0 => AttrValue::Full(r.take(vlen as usize, "attribute value")?.to_vec()),
                1 => AttrValue::Want { len: vlen },
                k => {
                    return Err(DirError::Wire {
                        offset: at + 2 + nlen,
                        what: format!(
                            "attribute {name:?}: kind {k} is neither 0 (full) nor 1 (want)"
                        ),
                    })
                }
            };
            let a = Attr { name, value };
            check_attr(&a)?;
            if let Some(prev) = attrs.last() {
                if prev.name >= a.name {
                    return Err(DirError::Wire {
                        offset: at,
                        what: format!(
                            "attribute {:?} after {:?}: names must be unique and sorted",
                            a.name, prev.name
                        ),
                    });
                }
            }
            attrs.push(a);
        }
        if r.pos != buf.len() {
            return Err(DirError::Wire {
                offset: r.pos,
                what: format!(
                    "{} trailing bytes after the last attribute",
                    buf.len() - r.pos
                ),
            });
        }
        Ok(Packet {
            header: Header {
                kind,
                scope,
                flags,
                status,
                uid,
                gid,
                query_id,
                target,
            },
            attrs: AttrList::from_sorted_unchecked(attrs),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Packet {
        let mut h = Header::new(Kind::Query);
        h.scope = 2;
        h.flags = FLAG_UNIQUE;
        h.uid = 1000;
        h.gid = 100;
        h.query_id = 77;
        h.target = Gid(0xabcdef);
        let attrs = AttrList::from_attrs([
            Attr::full("type", "mailbox"),
            Attr::want("port", 16),
            Attr::full("name", vec![0u8, 255, 3]),
        ])
        .unwrap();
        Packet::new(h, attrs)
    }

    #[test]
    fn roundtrip() {
        let p = sample();
        let b = p.encode();
        assert_eq!(b.len(), p.encoded_len());
        assert_eq!(Packet::decode(&b).unwrap(), p);
    }

    #[test]
    fn every_truncation_is_an_error() {
        let b = sample().encode();
        for n in 0..b.len() {
            assert!(Packet::decode(&b[..n]).is_err(), "prefix {n} decoded");
        }
    }

    #[test]
    fn oversized_count_and_value_rejected() {
        let mut b = sample().encode();
        b[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(Packet::decode(&b), Err(DirError::Wire { .. })));
        // a want of more than the value limit
        let mut h = Header::new(Kind::Query);
        h.scope = 0;
        let mut raw = Packet::new(h, AttrList::new()).encode();
        raw[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&1u32.to_le_bytes());
        raw.extend_from_slice(&1u16.to_le_bytes());
        raw.push(b'a');
        raw.push(1);
        raw.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(Packet::decode(&raw), Err(DirError::TooLarge(_))));
    }

    #[test]
    fn unknown_scope_is_an_error() {
        assert_eq!(Scope::from_u8(7), Err(DirError::UnknownScope(7)));
        assert!("galaxy".parse::<Scope>().is_err());
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Packet::decode(&bytes);
        }

        #[test]
        fn decode_never_panics_on_mutated_valid(pos in 0usize..60, val in any::<u8>()) {
            let mut b = sample().encode();
            let p = pos % b.len();
            b[p] = val;
            let _ = Packet::decode(&b);
        }
    }
}
