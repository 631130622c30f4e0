//! The wire format between ranks: a connection handshake, then a stream of fixed 32-byte frame
//! headers, each followed by `payload_len()` bytes of payload.
//!
//! Every multi-byte field is little-endian. Decoding never panics: a malformed or truncated frame
//! is an [`WireError`] that says what was wrong.
//!
//! | offset | size | field | meaning |
//! |---|---|---|---|
//! | 0 | 1 | kind | [`Kind`] |
//! | 1 | 1 | flags | reserved, must be 0 |
//! | 2 | 2 | reserved | must be 0 |
//! | 4 | 4 | tag | message tag (i32) |
//! | 8 | 8 | ctx | communicator context id |
//! | 16 | 8 | len | EAGER: payload bytes; RTS: message bytes; CTS: receiver's request id; DATA: payload bytes |
//! | 24 | 8 | id | RTS/CTS: sender's request id; DATA: receiver's request id |

use std::fmt;

/// Version of the rank-to-rank protocol. A peer with another version is refused at the handshake.
pub const PROTOCOL_VERSION: u32 = 1;
/// First bytes of every handshake.
pub const MAGIC: [u8; 8] = *b"MUTIRAO\0";
/// Size of a frame header.
pub const HEADER_LEN: usize = 32;
/// Largest message the protocol accepts (1 TiB): anything larger is a corrupt frame.
pub const MAX_MESSAGE: u64 = 1 << 40;
/// Size of a handshake hello.
pub const HELLO_LEN: usize = 8 + 4 + 4 + 32;

/// Errors decoding frames and handshakes.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("truncated frame: got {got} of {need} header bytes")]
    Truncated { got: usize, need: usize },
    #[error("unknown frame kind {0}: the peer is not a mutirão rank of this version, or the stream is corrupt")]
    UnknownKind(u8),
    #[error("frame has non-zero reserved bits ({0:#x}): the stream is corrupt")]
    Reserved(u32),
    #[error("frame announces {0} bytes, above the protocol maximum of {MAX_MESSAGE}: the stream is corrupt")]
    TooLarge(u64),
    #[error("frame kind {kind:?} must carry no payload but announces {len} bytes")]
    UnexpectedPayload { kind: Kind, len: u64 },
    #[error("the peer is not a mutirão rank (bad handshake magic)")]
    BadMagic,
    #[error("the peer speaks mutirão protocol version {theirs}, this process speaks {PROTOCOL_VERSION}: run every rank with the same mutirão build")]
    Version { theirs: u32 },
    #[error(
        "the peer presented a wrong job token: it belongs to another job, or is not a rank at all"
    )]
    BadToken,
    #[error("the peer claims rank {rank}, but the job has {size} ranks")]
    BadRank { rank: u32, size: u32 },
}

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A whole small message: header then payload.
    Eager = 1,
    /// Ready-to-send of a large message (rendezvous); no payload.
    Rts = 2,
    /// Clear-to-send: the receiver matched an RTS and has a buffer; no payload.
    Cts = 3,
    /// The payload of a large message, after a CTS.
    Data = 4,
    /// The sender finalized: no more frames follow on this connection.
    Bye = 5,
    /// Checkpoint-wave control ([`crate::ckpt::Marker`]): sub-kind in `tag`, epoch in `id`, no
    /// payload ([`Header::marker`]).
    Marker = 6,
    /// Ready-to-send between processes of one host: a 16-byte payload (sender's buffer address,
    /// sender's pid) lets the receiver copy the message itself (cross-memory attach).
    RtsCma = 7,
    /// The receiver copied a [`Kind::RtsCma`] message: the send is complete. No payload.
    Fin = 8,
}

impl Kind {
    fn from_u8(b: u8) -> Result<Self, WireError> {
        Ok(match b {
            1 => Kind::Eager,
            2 => Kind::Rts,
            3 => Kind::Cts,
            4 => Kind::Data,
            5 => Kind::Bye,
            6 => Kind::Marker,
            7 => Kind::RtsCma,
            8 => Kind::Fin,
            other => return Err(WireError::UnknownKind(other)),
        })
    }
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub tag: i32,
    pub ctx: u64,
    pub len: u64,
    pub id: u64,
}

impl Header {
    /// Bytes of payload following this header on the stream.
    pub fn payload_len(&self) -> u64 {
        match self.kind {
            Kind::Eager | Kind::Data => self.len,
            Kind::RtsCma => 16,
            _ => 0,
        }
    }

    /// Encode into a 32-byte array.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0] = self.kind as u8;
        b[4..8].copy_from_slice(&self.tag.to_le_bytes());
        b[8..16].copy_from_slice(&self.ctx.to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b[24..32].copy_from_slice(&self.id.to_le_bytes());
        b
    }

    /// Decode and validate a header from the first 32 bytes of `b`.
    pub fn decode(b: &[u8]) -> Result<Header, WireError> {
        let b: &[u8; HEADER_LEN] =
            b.get(..HEADER_LEN)
                .and_then(|s| s.try_into().ok())
                .ok_or(WireError::Truncated {
                    got: b.len(),
                    need: HEADER_LEN,
                })?;
        let kind = Kind::from_u8(b[0])?;
        let reserved = u32::from_le_bytes([b[1], b[2], b[3], 0]);
        if reserved != 0 {
            return Err(WireError::Reserved(reserved));
        }
        let u64_at = |o: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(a)
        };
        let h = Header {
            kind,
            tag: i32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            ctx: u64_at(8),
            len: u64_at(16),
            id: u64_at(24),
        };
        match kind {
            Kind::Eager | Kind::Data | Kind::Rts | Kind::RtsCma if h.len > MAX_MESSAGE => {
                Err(WireError::TooLarge(h.len))
            }
            Kind::Bye | Kind::Marker | Kind::Fin if h.len != 0 => {
                Err(WireError::UnexpectedPayload { kind, len: h.len })
            }
            _ => Ok(h),
        }
    }
}

impl Header {
    /// A checkpoint marker frame (issue 12): sub-kind in `tag`, epoch in `id`, the safe point
    /// to cut at in `ctx`, no payload.
    pub fn marker(m: crate::ckpt::Marker) -> Header {
        Header {
            kind: Kind::Marker,
            tag: i32::from(m.code()),
            ctx: m.at(),
            len: 0,
            id: m.epoch(),
        }
    }

    /// The checkpoint marker a [`Kind::Marker`] frame carries.
    pub fn to_marker(&self) -> Result<crate::ckpt::Marker, String> {
        if self.kind != Kind::Marker {
            return Err(format!(
                "a {:?} frame is not a checkpoint marker",
                self.kind
            ));
        }
        let code = u8::try_from(self.tag).map_err(|_| {
            format!(
                "checkpoint marker sub-kind {} out of range: the stream is corrupt",
                self.tag
            )
        })?;
        crate::ckpt::Marker::from_parts(code, self.id, self.ctx)
    }
}

/// The first message on every rank-to-rank connection, in both directions.
#[derive(Clone, PartialEq, Eq)]
pub struct Hello {
    pub version: u32,
    pub rank: u32,
    pub token: [u8; 32],
}

impl fmt::Debug for Hello {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the token.
        f.debug_struct("Hello")
            .field("version", &self.version)
            .field("rank", &self.rank)
            .finish_non_exhaustive()
    }
}

impl Hello {
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&self.rank.to_le_bytes());
        b[16..48].copy_from_slice(&self.token);
        b
    }

    /// Decode a hello and check it against the job: magic, version, token, rank range.
    pub fn decode_checked(b: &[u8], token: &[u8; 32], size: u32) -> Result<Hello, WireError> {
        if b.len() < HELLO_LEN {
            return Err(WireError::Truncated {
                got: b.len(),
                need: HELLO_LEN,
            });
        }
        if b[..8] != MAGIC {
            return Err(WireError::BadMagic);
        }
        let version = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
        if version != PROTOCOL_VERSION {
            return Err(WireError::Version { theirs: version });
        }
        let rank = u32::from_le_bytes([b[12], b[13], b[14], b[15]]);
        let mut theirs = [0u8; 32];
        theirs.copy_from_slice(&b[16..48]);
        if !constant_time_eq(&theirs, token) {
            return Err(WireError::BadToken);
        }
        if rank >= size {
            return Err(WireError::BadRank { rank, size });
        }
        Ok(Hello {
            version,
            rank,
            token: theirs,
        })
    }
}

/// Compare two secrets in time independent of where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn header_round_trip() {
        let h = Header {
            kind: Kind::Rts,
            tag: -7,
            ctx: 42,
            len: 1 << 30,
            id: 9,
        };
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
        assert_eq!(h.payload_len(), 0);
    }

    #[test]
    fn malformed_headers_are_errors() {
        assert!(matches!(
            Header::decode(&[1, 0, 0]),
            Err(WireError::Truncated { got: 3, .. })
        ));
        let mut b = Header {
            kind: Kind::Eager,
            tag: 0,
            ctx: 0,
            len: 0,
            id: 0,
        }
        .encode();
        b[0] = 99;
        assert_eq!(Header::decode(&b), Err(WireError::UnknownKind(99)));
        b[0] = 1;
        b[2] = 1;
        assert!(matches!(Header::decode(&b), Err(WireError::Reserved(_))));
        b[2] = 0;
        b[16..24].copy_from_slice(&(MAX_MESSAGE + 1).to_le_bytes());
        assert!(matches!(Header::decode(&b), Err(WireError::TooLarge(_))));
    }

    #[test]
    fn hello_checks_version_token_and_rank() {
        let token = [7u8; 32];
        let h = Hello {
            version: PROTOCOL_VERSION,
            rank: 3,
            token,
        };
        assert_eq!(Hello::decode_checked(&h.encode(), &token, 4).unwrap(), h);
        assert_eq!(
            Hello::decode_checked(&h.encode(), &[8u8; 32], 4),
            Err(WireError::BadToken)
        );
        assert_eq!(
            Hello::decode_checked(&h.encode(), &token, 3),
            Err(WireError::BadRank { rank: 3, size: 3 })
        );
        let old = Hello {
            version: PROTOCOL_VERSION + 1,
            ..h.clone()
        };
        let e = Hello::decode_checked(&old.encode(), &token, 4).unwrap_err();
        assert!(e.to_string().contains("protocol version"), "{e}");
        assert_eq!(
            Hello::decode_checked(
                b"GET / HTTP/1.1\r\n\r\n0123456789012345678901234567890",
                &token,
                4
            ),
            Err(WireError::BadMagic)
        );
        assert!(format!("{h:?}").find("token").is_none());
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = Header::decode(&bytes);
            let _ = Hello::decode_checked(&bytes, &[0u8; 32], 8);
        }

        #[test]
        fn valid_headers_round_trip(kind in 1u8..=8, tag: i32, ctx: u64, len in 0..MAX_MESSAGE, id: u64) {
            let len = if matches!(kind, 5 | 6 | 8) { 0 } else { len };
            let h = Header { kind: Kind::from_u8(kind).unwrap(), tag, ctx, len, id };
            prop_assert_eq!(Header::decode(&h.encode()).unwrap(), h);
        }
    }

    #[test]
    fn marker_frames_round_trip_and_reject_bad_sub_kinds() {
        use crate::ckpt::Marker;
        for m in [
            Marker::Announce(1, 2),
            Marker::Cut(u64::MAX, 7),
            Marker::Done(0),
            Marker::Abort(9),
        ] {
            let h = Header::decode(&Header::marker(m).encode()).unwrap();
            assert_eq!(h.payload_len(), 0);
            assert_eq!(h.to_marker(), Ok(m));
        }
        let mut h = Header::marker(Marker::Cut(3, 7));
        h.tag = 300;
        assert!(h.to_marker().unwrap_err().contains("out of range"));
        h.tag = 7;
        assert!(h.to_marker().unwrap_err().contains("sub-kind 7"));
        h.kind = Kind::Eager;
        assert!(h.to_marker().is_err());
    }
}
