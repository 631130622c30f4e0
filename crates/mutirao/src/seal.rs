//! Sealed sessions: what every control connection (launcher ↔ agent, checkpoint store, rank ↔
//! bootstrap server) carries once its handshake is done.
//!
//! The handshake is a challenge–response over a shared secret (the agent token, or the job
//! token): each side sends a fresh nonce and proves it knows the secret by an HMAC over both
//! nonces ([`mac_hex`]); the secret itself never crosses the wire. Both sides then derive a
//! session key per direction with HKDF-SHA256 from the secret and the two nonces
//! ([`SessionKeys::derive`]), and from then on every byte goes inside a *record*: a 4-byte
//! big-endian length, then the bytes sealed with ChaCha20-Poly1305 (the length is the
//! associated data, the nonce is the record's sequence number in its direction). So:
//!
//! - a peer that does not know the secret can neither read nor write a session — a relay
//!   between two honest ends (a re-pointed address) passes bytes it cannot read, alter, replay
//!   or reorder: any of these fails the next record's tag and ends the session;
//! - a record is at most [`MAX_RECORD`] bytes of plaintext, so a reader never holds more than
//!   one record (≈ 64 KiB) of what a peer sent;
//! - every session has fresh keys (fresh nonces), so a record of one session means nothing in
//!   another.
//!
//! [`SealedWriter`] buffers writes and seals them into records when flushed (or when a record
//! is full); [`SealedReader`] opens records and serves their bytes as a [`BufRead`]. A reader
//! that hits a read timeout in the middle of a record keeps what it has and goes on at the
//! next call, so read timeouts (heartbeats) do not desynchronise a session.

use chacha20poly1305::aead::{AeadInPlace, KeyInit};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce, Tag};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::{self, BufRead, Read, Write};

/// Most plaintext bytes in one record.
pub const MAX_RECORD: usize = 64 << 10;
/// Bytes of the authentication tag that ends every record.
const TAG_LEN: usize = 16;
/// Bytes of the length that starts every record.
const LEN_LEN: usize = 4;

/// Which end of a session this is: the one that connected, or the one that accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The side that connected (launcher, rank).
    Client,
    /// The side that accepted (agent, bootstrap server).
    Server,
}

/// HMAC-SHA256 of `parts` under `secret`, labelled: every part is length-prefixed, so no two
/// different lists of parts give the same input.
pub fn mac(secret: &[u8], label: &str, parts: &[&[u8]]) -> [u8; 32] {
    // HMAC-SHA256 takes keys of any length: new_from_slice cannot fail for it.
    let mut m = match <Hmac<Sha256> as Mac>::new_from_slice(secret) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC-SHA256 accepts keys of every length"),
    };
    m.update(&(label.len() as u64).to_le_bytes());
    m.update(label.as_bytes());
    for p in parts {
        m.update(&(p.len() as u64).to_le_bytes());
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

/// [`mac`] in lowercase hex.
pub fn mac_hex(secret: &[u8], label: &str, parts: &[&[u8]]) -> String {
    crate::pmi::hex(&mac(secret, label, parts))
}

/// Whether `mac_hex` is [`mac_hex`] of these inputs (compared in constant time).
pub fn verify_hex(secret: &[u8], label: &str, parts: &[&[u8]], mac_hex_given: &str) -> bool {
    crate::wire::constant_time_eq(
        self::mac_hex(secret, label, parts).as_bytes(),
        mac_hex_given.as_bytes(),
    )
}

/// A fresh 32-byte nonce in hex (64 characters).
pub fn nonce_hex() -> io::Result<String> {
    Ok(crate::pmi::hex(&crate::pmi::new_token()?))
}

/// The two keys of one end of a session: one to seal what it sends, one to open what it gets.
pub struct SessionKeys {
    send: Sealer,
    recv: Opener,
}

impl std::fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionKeys(..)")
    }
}

impl SessionKeys {
    /// The keys of `role`'s end of a session whose handshake exchanged `client_nonce` and
    /// `server_nonce` under `secret`; `context` names the protocol (keys of one protocol are
    /// useless in another).
    pub fn derive(
        secret: &[u8],
        context: &str,
        client_nonce: &[u8],
        server_nonce: &[u8],
        role: Role,
    ) -> SessionKeys {
        let mut salt = Vec::with_capacity(16 + client_nonce.len() + server_nonce.len());
        salt.extend_from_slice(&(client_nonce.len() as u64).to_le_bytes());
        salt.extend_from_slice(client_nonce);
        salt.extend_from_slice(&(server_nonce.len() as u64).to_le_bytes());
        salt.extend_from_slice(server_nonce);
        let hk = hkdf::Hkdf::<Sha256>::new(Some(&salt), secret);
        let key = |dir: &str| -> ChaCha20Poly1305 {
            let mut okm = [0u8; 32];
            let info = format!("{context}\0{dir}");
            // 32 bytes are far below HKDF-SHA256's 255 × 32-byte limit.
            if hk.expand(info.as_bytes(), &mut okm).is_err() {
                unreachable!("HKDF-SHA256 expands to 32 bytes");
            }
            ChaCha20Poly1305::new(Key::from_slice(&okm))
        };
        let (c2s, s2c) = (key("client-to-server"), key("server-to-client"));
        let (send, recv) = match role {
            Role::Client => (c2s, s2c),
            Role::Server => (s2c, c2s),
        };
        SessionKeys {
            send: Sealer { aead: send, seq: 0 },
            recv: Opener { aead: recv, seq: 0 },
        }
    }

    /// The sealing and the opening halves.
    pub fn split(self) -> (Sealer, Opener) {
        (self.send, self.recv)
    }
}

/// Seals records of one direction, numbering them.
pub struct Sealer {
    aead: ChaCha20Poly1305,
    seq: u64,
}

/// Opens records of one direction, in order.
pub struct Opener {
    aead: ChaCha20Poly1305,
    seq: u64,
}

fn nonce_of(seq: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&seq.to_be_bytes());
    *Nonce::from_slice(&n)
}

impl Sealer {
    /// `plain` as one record (length, sealed bytes, tag).
    fn seal(&mut self, plain: &[u8]) -> io::Result<Vec<u8>> {
        let seq = self.seq;
        self.seq = seq
            .checked_add(1)
            .ok_or_else(|| io::Error::other("session exhausted its record numbers"))?;
        let len = (plain.len() + TAG_LEN) as u32;
        let mut rec = Vec::with_capacity(LEN_LEN + plain.len() + TAG_LEN);
        rec.extend_from_slice(&len.to_be_bytes());
        rec.extend_from_slice(plain);
        let (head, body) = rec.split_at_mut(LEN_LEN);
        let tag = self
            .aead
            .encrypt_in_place_detached(&nonce_of(seq), head, body)
            .map_err(|_| io::Error::other("cannot seal a record"))?;
        rec.extend_from_slice(&tag);
        Ok(rec)
    }
}

impl Opener {
    /// The plaintext of record `rec` (its length header `head`), or an error if it was not
    /// sealed by the other end as the next record.
    fn open(&mut self, head: &[u8; LEN_LEN], rec: &mut Vec<u8>) -> io::Result<()> {
        let n = rec.len() - TAG_LEN;
        let tag = *Tag::from_slice(&rec[n..]);
        rec.truncate(n);
        self.aead
            .decrypt_in_place_detached(&nonce_of(self.seq), head, rec, &tag)
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a record of the session failed authentication (forged, altered, replayed or reordered): closing the session",
                )
            })?;
        self.seq += 1;
        Ok(())
    }
}

/// Writes through records: bytes are buffered and sealed into a record at [`Write::flush`] (or
/// when [`MAX_RECORD`] of them are waiting). Flush after each message.
pub struct SealedWriter<W: Write> {
    inner: W,
    sealer: Sealer,
    buf: Vec<u8>,
    broken: bool,
}

impl<W: Write> SealedWriter<W> {
    /// Records on `inner`.
    pub fn new(inner: W, sealer: Sealer) -> Self {
        SealedWriter {
            inner,
            sealer,
            buf: Vec::new(),
            broken: false,
        }
    }

    /// The stream the records go to.
    pub fn get_ref(&self) -> &W {
        &self.inner
    }

    fn send_record(&mut self) -> io::Result<()> {
        if self.broken {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "an earlier write of this session failed",
            ));
        }
        let take = self.buf.len().min(MAX_RECORD);
        let rec = self.sealer.seal(&self.buf[..take])?;
        self.buf.drain(..take);
        // A record half written leaves the session unusable: nothing more may follow it.
        self.inner
            .write_all(&rec)
            .inspect_err(|_| self.broken = true)
    }
}

impl<W: Write> Write for SealedWriter<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len() >= MAX_RECORD {
            self.send_record()?;
        }
        let n = data.len().min(MAX_RECORD - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        while !self.buf.is_empty() {
            self.send_record()?;
        }
        self.inner.flush()
    }
}

/// Reads through records: opens each as it arrives and serves its bytes.
pub struct SealedReader<R: BufRead> {
    inner: R,
    opener: Opener,
    head: [u8; LEN_LEN],
    head_len: usize,
    /// The record being read (sealed), then its plaintext.
    rec: Vec<u8>,
    /// Bytes the record being read has in all (0: reading its length).
    rec_want: usize,
    pos: usize,
    /// Plaintext ready in `rec[pos..]`.
    open: bool,
    failed: Option<(io::ErrorKind, String)>,
}

impl<R: BufRead> SealedReader<R> {
    /// Records from `inner` (a buffered reader that may already hold bytes of the first one).
    pub fn new(inner: R, opener: Opener) -> Self {
        SealedReader {
            inner,
            opener,
            head: [0; LEN_LEN],
            head_len: 0,
            rec: Vec::new(),
            rec_want: 0,
            pos: 0,
            open: false,
            failed: None,
        }
    }

    /// The stream the records come from.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// The stream the records come from, mutably (to set its timeouts).
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    /// Whether plaintext is waiting that was not read yet.
    pub fn has_buffered(&self) -> bool {
        self.open && self.pos < self.rec.len()
    }

    fn fail(&mut self, kind: io::ErrorKind, msg: String) -> io::Error {
        self.failed = Some((kind, msg.clone()));
        io::Error::new(kind, msg)
    }

    /// Reads until a record is open (`Ok(true)`), or the stream ends between records
    /// (`Ok(false)`).
    fn next_record(&mut self) -> io::Result<bool> {
        if let Some((kind, msg)) = &self.failed {
            return Err(io::Error::new(*kind, msg.clone()));
        }
        while self.head_len < LEN_LEN {
            let n = self.inner.read(&mut self.head[self.head_len..])?;
            if n == 0 {
                if self.head_len == 0 {
                    return Ok(false);
                }
                return Err(self.fail(
                    io::ErrorKind::UnexpectedEof,
                    "the connection closed inside a record".into(),
                ));
            }
            self.head_len += n;
            if self.head_len == LEN_LEN {
                let len = u32::from_be_bytes(self.head) as usize;
                if !(TAG_LEN..=MAX_RECORD + TAG_LEN).contains(&len) {
                    return Err(self.fail(
                        io::ErrorKind::InvalidData,
                        format!(
                            "a record of {len} bytes announced (at most {} allowed): the peer does not speak this protocol",
                            MAX_RECORD + TAG_LEN
                        ),
                    ));
                }
                self.rec_want = len;
                self.rec.clear();
                self.rec.reserve(len);
            }
        }
        while self.rec.len() < self.rec_want {
            let buf = self.inner.fill_buf()?;
            if buf.is_empty() {
                return Err(self.fail(
                    io::ErrorKind::UnexpectedEof,
                    "the connection closed inside a record".into(),
                ));
            }
            let n = buf.len().min(self.rec_want - self.rec.len());
            self.rec.extend_from_slice(&buf[..n]);
            self.inner.consume(n);
        }
        let head = self.head;
        if let Err(e) = self.opener.open(&head, &mut self.rec) {
            return Err(self.fail(e.kind(), e.to_string()));
        }
        self.head_len = 0;
        self.rec_want = 0;
        self.pos = 0;
        self.open = true;
        Ok(true)
    }
}

impl<R: BufRead> Read for SealedReader<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let n = {
            let buf = self.fill_buf()?;
            let n = buf.len().min(out.len());
            out[..n].copy_from_slice(&buf[..n]);
            n
        };
        self.consume(n);
        Ok(n)
    }
}

impl<R: BufRead> BufRead for SealedReader<R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        while !self.has_buffered() {
            self.open = false;
            if !self.next_record()? {
                return Ok(&[]);
            }
        }
        Ok(&self.rec[self.pos..])
    }

    fn consume(&mut self, amt: usize) {
        self.pos = (self.pos + amt).min(self.rec.len());
    }
}

/// Both halves of a sealed session as one stream (for protocols that read and write one
/// stream, like the checkpoint store's).
pub struct SealedStream<R: BufRead, W: Write> {
    /// Records from the peer.
    pub reader: SealedReader<R>,
    /// Records to the peer.
    pub writer: SealedWriter<W>,
}

impl<R: BufRead, W: Write> Read for SealedStream<R, W> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        self.reader.read(out)
    }
}

impl<R: BufRead, W: Write> Write for SealedStream<R, W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.writer.write(data)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.writer.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn pair() -> (SessionKeys, SessionKeys) {
        let a = SessionKeys::derive(b"secret", "test-v1", b"n1", b"n2", Role::Client);
        let b = SessionKeys::derive(b"secret", "test-v1", b"n1", b"n2", Role::Server);
        (a, b)
    }

    /// What `keys` seal of `msgs`, each flushed as its own record(s).
    fn sealed(keys: SessionKeys, msgs: &[&[u8]]) -> Vec<u8> {
        let (s, _) = keys.split();
        let mut w = SealedWriter::new(Vec::new(), s);
        for m in msgs {
            w.write_all(m).unwrap();
            w.flush().unwrap();
        }
        w.inner
    }

    fn read_all(keys: SessionKeys, wire: Vec<u8>) -> io::Result<Vec<u8>> {
        let (_, o) = keys.split();
        let mut r = SealedReader::new(Cursor::new(wire), o);
        let mut out = Vec::new();
        r.read_to_end(&mut out)?;
        Ok(out)
    }

    #[test]
    fn what_one_end_seals_the_other_opens_in_order() {
        let (a, b) = pair();
        let big = vec![7u8; 3 * MAX_RECORD + 5];
        let wire = sealed(a, &[b"hello\n", &big, b"bye\n"]);
        let got = read_all(b, wire.clone()).unwrap();
        let mut want = b"hello\n".to_vec();
        want.extend_from_slice(&big);
        want.extend_from_slice(b"bye\n");
        assert_eq!(got, want);
        // The plaintext is not on the wire.
        assert!(!wire.windows(5).any(|w| w == b"hello"));
    }

    #[test]
    fn a_wrong_secret_a_replay_a_reorder_or_a_flipped_bit_is_refused() {
        let (a, _) = pair();
        let wire = sealed(a, &[b"one\n", b"two\n"]);
        let first_len = LEN_LEN + 4 + TAG_LEN;
        let other = SessionKeys::derive(b"Secret", "test-v1", b"n1", b"n2", Role::Server);
        assert!(read_all(other, wire.clone()).is_err(), "wrong secret");
        let other_nonce = SessionKeys::derive(b"secret", "test-v1", b"n1", b"n3", Role::Server);
        assert!(
            read_all(other_nonce, wire.clone()).is_err(),
            "other session"
        );
        let same_dir = SessionKeys::derive(b"secret", "test-v1", b"n1", b"n2", Role::Client);
        assert!(read_all(same_dir, wire.clone()).is_err(), "reflected");
        // Replay the first record in place of the second.
        let mut replay = wire[..first_len].to_vec();
        replay.extend_from_slice(&wire[..first_len]);
        let (_, b) = pair();
        let e = read_all(b, replay).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        // Swap the two records.
        let mut swapped = wire[first_len..].to_vec();
        swapped.extend_from_slice(&wire[..first_len]);
        let (_, b) = pair();
        assert!(read_all(b, swapped).is_err(), "reordered");
        // Flip one bit of the body.
        let mut flipped = wire.clone();
        flipped[LEN_LEN + 1] ^= 1;
        let (_, b) = pair();
        assert!(read_all(b, flipped).is_err(), "altered");
        // Cut inside a record.
        let (_, b) = pair();
        let e = read_all(b, wire[..first_len + 3].to_vec()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn an_oversized_record_is_refused_before_it_is_read() {
        let (_, b) = pair();
        let mut wire = ((MAX_RECORD + TAG_LEN + 1) as u32).to_be_bytes().to_vec();
        wire.extend_from_slice(&[0u8; 100]);
        let e = read_all(b, wire).unwrap_err();
        assert!(e.to_string().contains("at most"), "{e}");
    }

    /// A reader whose every other read times out: records come through intact.
    struct Stutter {
        data: Cursor<Vec<u8>>,
        tick: bool,
    }
    impl Read for Stutter {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            self.tick = !self.tick;
            if self.tick {
                return Err(io::Error::new(io::ErrorKind::WouldBlock, "not yet"));
            }
            let n = out.len().min(3);
            self.data.read(&mut out[..n])
        }
    }

    #[test]
    fn a_timeout_inside_a_record_loses_nothing() {
        let (a, b) = pair();
        let wire = sealed(a, &[b"first line\n", b"second line\n"]);
        let (_, o) = b.split();
        let inner = io::BufReader::with_capacity(
            2,
            Stutter {
                data: Cursor::new(wire),
                tick: false,
            },
        );
        let mut r = SealedReader::new(inner, o);
        let mut lines = Vec::new();
        let mut line = Vec::new();
        for _ in 0..10_000 {
            match r.read_until(b'\n', &mut line) {
                Ok(0) => break,
                Ok(_) => lines.push(std::mem::take(&mut line)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(lines, [b"first line\n".to_vec(), b"second line\n".to_vec()]);
    }

    #[test]
    fn macs_bind_every_part_and_the_label() {
        let m = mac_hex(b"k", "l", &[b"ab", b"c"]);
        assert!(verify_hex(b"k", "l", &[b"ab", b"c"], &m));
        assert!(!verify_hex(b"k", "l", &[b"a", b"bc"], &m));
        assert!(!verify_hex(b"k", "m", &[b"ab", b"c"], &m));
        assert!(!verify_hex(b"j", "l", &[b"ab", b"c"], &m));
    }
}
