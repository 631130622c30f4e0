//! Framing (`len u32 LE | packet`) and the server-to-server HMAC-SHA256 challenge–response.
//!
//! Handshake on a TCP connection, `C` = connecting server, `S` = accepting server:
//! 1. C → S: `"MDIR1" | c_cluster u64 | c_node u64 | nonce_c [32]`
//! 2. S → C: `s_cluster u64 | s_node u64 | nonce_s [32] | HMAC(key, "mdir-s" | nonce_c | nonce_s | s_cluster | s_node)`
//! 3. C → S: `HMAC(key, "mdir-c" | nonce_s | nonce_c | c_cluster | c_node)`
//!
//! Each side proves knowledge of the cluster key over the other's fresh nonce, so a replayed
//! transcript fails. The key never crosses the wire.
//!
//! [`FrameReader`] is the blocking counterpart of [`read_frame`] used on the local fast path
//! (the client and the server's per-connection threads): it reads as many bytes as the socket
//! has in one syscall, and polls briefly before sleeping in the kernel ([`SpinPolicy`]).

use crate::error::DirError;
use crate::wire::{Packet, MAX_PACKET};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

type HmacSha256 = Hmac<Sha256>;

const HELLO: &[u8; 5] = b"MDIR1";
const NONCE: usize = 32;
const MAC: usize = 32;
/// Time allowed for the whole handshake (every read and write of it together, not each).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Most bytes read from a peer before it has proved the cluster key: the handshake is
/// fixed-size (greeting, then proof) and no length-prefixed frame is read before it ends.
pub const MAX_PREAUTH: usize = 4096;
const _: () = assert!(5 + 16 + NONCE + MAC <= MAX_PREAUTH);

/// An empty cluster key proves nothing (anyone can compute its HMAC): refused on both sides.
fn check_key(key: &[u8]) -> Result<(), DirError> {
    if key.is_empty() {
        return Err(DirError::Auth(
            "the cluster key is empty: give every server the same non-empty key \
             (--key-file FILE or MUTIRAO_CLUSTER_KEY)"
                .into(),
        ));
    }
    Ok(())
}

/// Reads one frame; `Ok(None)` on a clean end of stream before the length.
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
) -> Result<Option<()>, DirError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let n = u32::from_le_bytes(len) as usize;
    if n > MAX_PACKET {
        return Err(DirError::TooLarge(format!(
            "frame of {n} bytes exceeds the {MAX_PACKET}-byte limit"
        )));
    }
    buf.clear();
    buf.resize(n, 0);
    r.read_exact(buf).await?;
    Ok(Some(()))
}

/// Appends a length-prefixed packet to `out`.
pub fn frame_into(p: &Packet, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    p.encode_into(out);
    let n = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&n.to_le_bytes());
}

/// Writes one packet as a frame.
pub async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, p: &Packet) -> Result<(), DirError> {
    let mut out = Vec::with_capacity(p.encoded_len() + 4);
    frame_into(p, &mut out);
    w.write_all(&out).await?;
    Ok(())
}

/// Default time a blocking reader polls the socket before sleeping in the kernel.
///
/// On a virtual machine a thread woken from sleep costs tens of microseconds (the idle vCPU
/// must be woken), several times a local lookup's whole round trip; polling for a short while
/// (yielding the CPU between polls) avoids the sleep whenever the answer comes quickly.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);

/// Adaptive spin-then-block policy: poll first (for up to `budget`, yielding the CPU between
/// polls) while polling has recently paid off, that is while at least half of the recent
/// polling waits ended with data before the budget ran out; otherwise sleep at once, and
/// try polling again every 64th wait so that the policy notices when waits become short.
///
/// Polling pays off on an idle machine, where a sleeping thread takes tens of microseconds
/// to wake while a local lookup's round trip takes a few; it stops paying off when the cores
/// are busy (many clients, other programs): replies then take longer than the budget and
/// pollers only take CPU time from the threads they wait for.
#[derive(Clone, Debug)]
pub struct SpinPolicy {
    budget: Duration,
    /// Moving share (weight 1/8, in 1/1024ths) of polling waits that got data in time.
    hits: u32,
    waits: u32,
}

impl SpinPolicy {
    /// A policy polling for at most `budget` (zero: never poll).
    pub fn new(budget: Duration) -> Self {
        SpinPolicy {
            budget,
            hits: 1024,
            waits: 0,
        }
    }

    /// The polling budget.
    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// Whether the next wait should poll first.
    pub fn should_spin(&mut self) -> bool {
        if self.budget.is_zero() {
            return false;
        }
        self.waits = self.waits.wrapping_add(1);
        self.hits >= 512 || self.waits % 64 == 0
    }

    /// Records whether a polling wait got its data within the budget.
    pub fn record(&mut self, hit: bool) {
        self.hits = self.hits - self.hits / 8 + if hit { 128 } else { 0 };
    }
}

/// Caps how many threads poll at once. Pollers yield the CPU between polls, but when
/// waiting threads outnumber the cores a poller takes turns from the threads it waits for;
/// past the cap a waiter sleeps at once.
///
/// Three shapes:
/// - [`SpinGate::new`] admits `max` pollers and none at all while more than `2 max` readers
///   share it;
/// - the gate of a process's clients ([`SpinGate::process_clients`]) admits eight pollers
///   per core. Against a server's event loop (the default), clients that poll wake nobody:
///   the loop finds their requests without being woken, and they find their replies without
///   being woken. With 16 clients on 2 cores, letting every client poll serves 1.2–1.3×
///   the lookups of one poller per core (`local_bench`). Each poll still ends after its
///   budget, and a client whose polls keep missing sleeps at once ([`SpinPolicy`]), so a
///   loaded machine turns polling off by itself;
/// - a *server* gate ([`SpinGate::server`], for a thread per client) admits one poller per
///   core or half of its readers, whichever is more: with many clients, most clients sleep
///   between requests, and a server thread polling for its client's next request saves its
///   own wake-up on every request, while the clients' turns keep the polls short.
#[derive(Debug)]
pub struct SpinGate {
    active: AtomicUsize,
    members: AtomicUsize,
    max: usize,
    max_members: usize,
    half_members: bool,
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl SpinGate {
    /// A client gate: at most `max` threads poll at once, and none while more than `2 max`
    /// readers share the gate.
    pub fn new(max: usize) -> Self {
        SpinGate {
            active: AtomicUsize::new(0),
            members: AtomicUsize::new(0),
            max,
            max_members: 2 * max,
            half_members: false,
        }
    }

    /// A client gate sized to this machine: one poller per available core.
    pub fn per_core() -> Self {
        SpinGate::new(cores())
    }

    /// A server gate: at most max(one per core, half of the readers) poll at once.
    pub fn server() -> Self {
        SpinGate {
            max_members: usize::MAX,
            half_members: true,
            ..SpinGate::per_core()
        }
    }

    /// The gate shared by every [`crate::client::Client`] of this process: eight pollers
    /// per core, however many clients there are.
    pub fn process_clients() -> Arc<SpinGate> {
        static GATE: OnceLock<Arc<SpinGate>> = OnceLock::new();
        GATE.get_or_init(|| {
            Arc::new(SpinGate {
                max_members: usize::MAX,
                ..SpinGate::new(8 * cores())
            })
        })
        .clone()
    }

    /// Takes a place if polling is allowed and a place is free (then call
    /// [`SpinGate::leave`] after polling).
    pub fn enter(&self) -> bool {
        let members = self.members.load(Ordering::Relaxed);
        if members > self.max_members {
            return false;
        }
        let max = if self.half_members {
            self.max.max(members / 2)
        } else {
            self.max
        };
        let mut cur = self.active.load(Ordering::Relaxed);
        loop {
            if cur >= max {
                return false;
            }
            match self.active.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    /// Gives back a place taken by [`SpinGate::enter`].
    pub fn leave(&self) {
        self.active.fetch_sub(1, Ordering::Release);
    }

    /// Registers a reader sharing the gate until the returned value is dropped.
    pub fn join(self: &Arc<Self>) -> GateMember {
        self.members.fetch_add(1, Ordering::Relaxed);
        GateMember(self.clone())
    }
}

/// A reader's membership of a [`SpinGate`] (see [`SpinGate::join`]).
#[derive(Debug)]
pub struct GateMember(Arc<SpinGate>);

impl std::ops::Deref for GateMember {
    type Target = SpinGate;
    fn deref(&self) -> &SpinGate {
        &self.0
    }
}

impl Drop for GateMember {
    fn drop(&mut self) {
        self.0.members.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What [`FrameReader::try_next_frame`] found.
#[derive(Debug)]
pub enum TryFrame<'a> {
    /// A whole frame.
    Frame(&'a [u8]),
    /// No whole frame yet; the socket has nothing more to read now.
    Pending,
    /// The peer closed the connection between frames.
    Closed,
}

/// Reads length-prefixed frames from a blocking socket (Unix or TCP) with one `recv` per
/// batch of frames, polling briefly before blocking (see [`SpinPolicy`]).
#[derive(Debug)]
pub struct FrameReader {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    spin: SpinPolicy,
    gate: Option<GateMember>,
    /// The last non-blocking `recv` found the socket empty (see `try_next_frame`).
    drained: bool,
}

impl FrameReader {
    /// A reader with a 64 KiB buffer that polls for at most `spin` before blocking.
    pub fn new(spin: Duration) -> Self {
        FrameReader {
            buf: vec![0; 64 * 1024],
            start: 0,
            end: 0,
            spin: SpinPolicy::new(spin),
            gate: None,
            drained: false,
        }
    }

    /// Joins `gate` and polls only while it admits this reader (see [`SpinGate`]).
    pub fn with_gate(mut self, gate: Arc<SpinGate>) -> Self {
        self.gate = Some(gate.join());
        self
    }

    /// Changes the polling budget (zero: always block at once).
    pub fn set_spin(&mut self, spin: Duration) {
        self.spin = SpinPolicy::new(spin);
    }

    /// Whether bytes of a further frame are already buffered (more requests are in flight).
    pub fn has_buffered(&self) -> bool {
        self.end > self.start
    }

    /// Reads the next frame from `s`; `Ok(None)` on a clean end of stream between frames.
    /// A frame longer than [`MAX_PACKET`] is an error (the stream cannot be resynchronised).
    pub fn next_frame<S: AsFd>(&mut self, s: &S) -> Result<Option<&[u8]>, DirError> {
        loop {
            if let Some(r) = self.take_frame()? {
                return Ok(Some(&self.buf[r]));
            }
            if self.fill(s)? == 0 {
                return self.closed().map(|()| None);
            }
        }
    }

    /// Like [`FrameReader::next_frame`] on a non-blocking socket: reads what has arrived
    /// (one `recv` at a time, never waiting) and returns the next whole frame, if any.
    ///
    /// A `recv` that does not fill the buffer shows the socket empty: until
    /// [`FrameReader::rearm`], frames come from the buffer only and `Pending` costs no
    /// system call (for a caller told by level-triggered epoll when more arrives).
    pub fn try_next_frame<S: AsFd>(&mut self, s: &S) -> Result<TryFrame<'_>, DirError> {
        use rustix::io::Errno;
        loop {
            if let Some(r) = self.take_frame()? {
                return Ok(TryFrame::Frame(&self.buf[r]));
            }
            if self.drained {
                return Ok(TryFrame::Pending);
            }
            let room = self.buf.len() - self.end;
            match rustix::net::recv(
                s,
                &mut self.buf[self.end..],
                rustix::net::RecvFlags::DONTWAIT,
            ) {
                Ok((0, _)) => return self.closed().map(|()| TryFrame::Closed),
                Ok((n, _)) => {
                    self.end += n;
                    self.drained = n < room;
                }
                Err(Errno::AGAIN) => {
                    self.drained = true;
                    return Ok(TryFrame::Pending);
                }
                Err(Errno::INTR) => {}
                Err(e) => return Err(std::io::Error::from(e).into()),
            }
        }
    }

    /// Lets [`FrameReader::try_next_frame`] read the socket again (it may hold data now).
    pub fn rearm(&mut self) {
        self.drained = false;
    }

    /// The end of the stream: clean between frames, an error inside one.
    fn closed(&self) -> Result<(), DirError> {
        if self.end > self.start {
            return Err(DirError::Protocol(
                "the connection closed in the middle of a frame".into(),
            ));
        }
        Ok(())
    }

    /// The buffer range of the next whole frame, if one is buffered (consumed from the
    /// buffer); otherwise makes room for the rest of it.
    fn take_frame(&mut self) -> Result<Option<std::ops::Range<usize>>, DirError> {
        let have = self.end - self.start;
        // Bytes the next frame needs in the buffer (the length prefix until it is known).
        let mut need = 4;
        if have >= 4 {
            let mut len = [0u8; 4];
            len.copy_from_slice(&self.buf[self.start..self.start + 4]);
            let n = u32::from_le_bytes(len) as usize;
            if n > MAX_PACKET {
                return Err(DirError::TooLarge(format!(
                    "frame of {n} bytes exceeds the {MAX_PACKET}-byte limit"
                )));
            }
            if have >= 4 + n {
                let from = self.start + 4;
                self.start = from + n;
                if self.start == self.end {
                    // Nothing else buffered: the next read starts at the front.
                    self.start = 0;
                    self.end = 0;
                }
                return Ok(Some(from..from + n));
            }
            need = 4 + n;
            if self.buf.len() < need {
                self.buf.resize(need, 0);
            }
        }
        if self.start > 0 && (self.end == self.buf.len() || self.start + need > self.buf.len()) {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        Ok(None)
    }

    fn fill<S: AsFd>(&mut self, s: &S) -> Result<usize, DirError> {
        use rustix::io::Errno;
        let budget = self.spin.budget();
        let gate = self.gate.take();
        let spun = self.spin.should_spin() && gate.as_ref().is_none_or(|g| g.enter());
        if spun {
            let got = self.poll(s, Instant::now(), budget);
            if let Some(g) = &gate {
                g.leave();
            }
            self.gate = gate;
            if let Some(n) = got? {
                return Ok(n);
            }
        } else {
            self.gate = gate;
        }
        loop {
            match rustix::io::read(s, &mut self.buf[self.end..]) {
                Ok(n) => {
                    if spun {
                        self.spin.record(false);
                    }
                    self.end += n;
                    return Ok(n);
                }
                Err(Errno::INTR) => {}
                Err(e) => return Err(std::io::Error::from(e).into()),
            }
        }
    }

    /// Polls until data arrives (`Some(bytes read)`) or `budget` has passed since `t0`.
    fn poll<S: AsFd>(
        &mut self,
        s: &S,
        t0: Instant,
        budget: Duration,
    ) -> Result<Option<usize>, DirError> {
        use rustix::io::Errno;
        {
            loop {
                match rustix::net::recv(
                    s,
                    &mut self.buf[self.end..],
                    rustix::net::RecvFlags::DONTWAIT,
                ) {
                    Ok((n, _)) => {
                        self.spin.record(true);
                        self.end += n;
                        return Ok(Some(n));
                    }
                    Err(Errno::AGAIN) | Err(Errno::INTR) => {
                        if t0.elapsed() >= budget {
                            break;
                        }
                        std::thread::yield_now();
                    }
                    Err(e) => return Err(std::io::Error::from(e).into()),
                }
            }
        }
        Ok(None)
    }
}

fn nonce() -> Result<[u8; NONCE], DirError> {
    let mut n = [0u8; NONCE];
    getrandom::fill(&mut n).map_err(|e| DirError::Io(format!("no randomness: {e}")))?;
    Ok(n)
}

fn mac(key: &[u8], parts: &[&[u8]]) -> Result<HmacSha256, DirError> {
    let mut m = HmacSha256::new_from_slice(key)
        .map_err(|e| DirError::BadConfig(format!("cluster key: {e}")))?;
    for p in parts {
        m.update(p);
    }
    Ok(m)
}

/// Identity of the server at the other end of an authenticated connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PeerId {
    /// Cluster (site) id.
    pub cluster: u64,
    /// Node serial number.
    pub node: u64,
}

/// The connecting side of the handshake (refused at once with an empty key).
pub async fn handshake_connect<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    key: &[u8],
    me: PeerId,
) -> Result<PeerId, DirError> {
    check_key(key)?;
    tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        let nc = nonce()?;
        let mut hello = Vec::with_capacity(5 + 16 + NONCE);
        hello.extend_from_slice(HELLO);
        hello.extend_from_slice(&me.cluster.to_le_bytes());
        hello.extend_from_slice(&me.node.to_le_bytes());
        hello.extend_from_slice(&nc);
        s.write_all(&hello).await?;
        let mut resp = [0u8; 16 + NONCE + MAC];
        s.read_exact(&mut resp).await.map_err(|_| {
            DirError::Auth(
                "peer closed the connection during the handshake (wrong cluster key?)".into(),
            )
        })?;
        let sc = &resp[0..8];
        let sn = &resp[8..16];
        let ns = &resp[16..16 + NONCE];
        let tag = &resp[16 + NONCE..];
        mac(key, &[b"mdir-s", &nc, ns, sc, sn])?
            .verify_slice(tag)
            .map_err(|_| DirError::Auth("peer's proof does not match our cluster key".into()))?;
        let reply = mac(
            key,
            &[
                b"mdir-c",
                ns,
                &nc,
                &me.cluster.to_le_bytes(),
                &me.node.to_le_bytes(),
            ],
        )?
        .finalize()
        .into_bytes();
        s.write_all(&reply).await?;
        let mut a = [0u8; 8];
        a.copy_from_slice(sc);
        let mut b = [0u8; 8];
        b.copy_from_slice(sn);
        Ok(PeerId {
            cluster: u64::from_le_bytes(a),
            node: u64::from_le_bytes(b),
        })
    })
    .await
    .map_err(|_| {
        DirError::Timeout(format!(
            "the peer handshake did not finish within {HANDSHAKE_TIMEOUT:?}"
        ))
    })?
}

/// The accepting side of the handshake (refused at once with an empty key). Reads the
/// fixed-size greeting and proof only, at most [`MAX_PREAUTH`] bytes, within
/// [`HANDSHAKE_TIMEOUT`] for the whole exchange.
pub async fn handshake_accept<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    key: &[u8],
    me: PeerId,
) -> Result<PeerId, DirError> {
    check_key(key)?;
    tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        let mut hello = [0u8; 5 + 16 + NONCE];
        s.read_exact(&mut hello).await?;
        if &hello[..5] != HELLO {
            return Err(DirError::Auth(
                "not a mutirao directory peer (bad greeting)".into(),
            ));
        }
        let cc = &hello[5..13];
        let cn = &hello[13..21];
        let nc = &hello[21..];
        let ns = nonce()?;
        let sc = me.cluster.to_le_bytes();
        let sn = me.node.to_le_bytes();
        let tag = mac(key, &[b"mdir-s", nc, &ns, &sc, &sn])?
            .finalize()
            .into_bytes();
        let mut resp = Vec::with_capacity(16 + NONCE + MAC);
        resp.extend_from_slice(&sc);
        resp.extend_from_slice(&sn);
        resp.extend_from_slice(&ns);
        resp.extend_from_slice(&tag);
        s.write_all(&resp).await?;
        let mut proof = [0u8; MAC];
        s.read_exact(&mut proof).await?;
        mac(key, &[b"mdir-c", &ns, nc, cc, cn])?
            .verify_slice(&proof)
            .map_err(|_| {
                DirError::Auth("connecting peer's proof does not match our cluster key".into())
            })?;
        let mut a = [0u8; 8];
        a.copy_from_slice(cc);
        let mut b = [0u8; 8];
        b.copy_from_slice(cn);
        Ok(PeerId {
            cluster: u64::from_le_bytes(a),
            node: u64::from_le_bytes(b),
        })
    })
    .await
    .map_err(|_| {
        DirError::Timeout(format!(
            "the peer handshake did not finish within {HANDSHAKE_TIMEOUT:?}"
        ))
    })?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attr::AttrList;
    use crate::wire::{Header, Kind};
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    fn framed(target: u64, payload: usize) -> (Packet, Vec<u8>) {
        let mut h = Header::new(Kind::Query);
        h.target = crate::gid::Gid(target);
        // Values of at most 40 000 bytes each (the attribute limit is 64 KiB).
        let attrs = AttrList::from_pairs(
            (0..payload.div_ceil(40_000).max(1))
                .map(|i| (format!("p{i}"), vec![b'x'; payload.min(40_000)])),
        )
        .unwrap();
        let p = Packet::new(h, attrs);
        let mut f = Vec::new();
        frame_into(&p, &mut f);
        (p, f)
    }

    #[test]
    fn frame_reader_splits_batches_and_joins_fragments() {
        for spin in [Duration::ZERO, DEFAULT_SPIN] {
            let (mut a, b) = UnixStream::pair().unwrap();
            // Three frames in one write, then a frame larger than the buffer in two writes.
            let ps: Vec<(Packet, Vec<u8>)> = vec![
                framed(1, 10),
                framed(2, 0),
                framed(3, 300),
                framed(4, 100_000),
            ];
            let w = std::thread::spawn(move || {
                let mut batch = Vec::new();
                for (_, f) in &ps[..3] {
                    batch.extend_from_slice(f);
                }
                a.write_all(&batch).unwrap();
                let big = &ps[3].1;
                a.write_all(&big[..3]).unwrap();
                std::thread::sleep(Duration::from_millis(5));
                a.write_all(&big[3..]).unwrap();
                ps
            });
            let mut r = FrameReader::new(spin).with_gate(Arc::new(SpinGate::new(1)));
            let mut got = vec![];
            for _ in 0..4 {
                let f = r.next_frame(&b).unwrap().expect("a frame");
                got.push(Packet::decode(f).unwrap());
            }
            let ps = w.join().unwrap();
            assert_eq!(got, ps.into_iter().map(|(p, _)| p).collect::<Vec<_>>());
            assert!(!r.has_buffered());
            assert_eq!(r.next_frame(&b).unwrap(), None, "clean end of stream");
        }
    }

    #[test]
    fn frame_reader_rejects_oversize_and_truncated_frames() {
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&((MAX_PACKET as u32) + 1).to_le_bytes())
            .unwrap();
        let mut r = FrameReader::new(Duration::ZERO);
        assert!(matches!(r.next_frame(&b), Err(DirError::TooLarge(_))));

        let (mut a, b) = UnixStream::pair().unwrap();
        let (_, f) = framed(1, 50);
        a.write_all(&f[..f.len() - 1]).unwrap();
        drop(a);
        let mut r = FrameReader::new(DEFAULT_SPIN);
        assert!(matches!(r.next_frame(&b), Err(DirError::Protocol(_))));
    }

    #[test]
    fn spin_policy_stops_polling_when_polls_miss_and_probes_again() {
        let mut p = SpinPolicy::new(Duration::from_micros(50));
        assert!(p.should_spin(), "polls at first");
        for _ in 0..8 {
            p.record(false);
        }
        let polls = (0..128).filter(|_| p.should_spin()).count();
        assert_eq!(polls, 2, "only the probe every 64th wait polls");
        for _ in 0..8 {
            p.record(true);
        }
        assert!(p.should_spin(), "polls again once polls hit");
        let mut never = SpinPolicy::new(Duration::ZERO);
        assert!(!(0..100).any(|_| never.should_spin()));
    }

    #[test]
    fn spin_gate_admits_at_most_max() {
        let g = SpinGate::new(2);
        assert!(g.enter() && g.enter());
        assert!(!g.enter());
        g.leave();
        assert!(g.enter());
        g.leave();
        g.leave();
        let g = Arc::new(g);
        let mut members: Vec<GateMember> = (0..4).map(|_| g.join()).collect();
        assert!(g.enter(), "up to twice as many members as places");
        g.leave();
        members.push(g.join());
        assert!(
            !g.enter(),
            "more than twice as many members as places: nobody polls"
        );
        drop(members);
        assert!(g.enter());

        let s = Arc::new(SpinGate {
            max: 2,
            ..SpinGate::server()
        });
        let members: Vec<GateMember> = (0..16).map(|_| s.join()).collect();
        assert_eq!(
            (0..20).filter(|_| s.enter()).count(),
            8,
            "half of 16 readers"
        );
        drop(members);
    }

    fn two_ids() -> (PeerId, PeerId) {
        let id = |node| PeerId { cluster: 1, node };
        (id(2), id(3))
    }

    #[tokio::test]
    async fn handshake_succeeds_with_same_key_fails_with_other() {
        let (mut a, mut b) = tokio::io::duplex(4096);
        let (pa, pb) = two_ids();
        let (ra, rb) = tokio::join!(
            handshake_connect(&mut a, b"secret", pa),
            handshake_accept(&mut b, b"secret", pb)
        );
        assert_eq!(ra.unwrap(), pb);
        assert_eq!(rb.unwrap(), pa);

        let (mut a, mut b) = tokio::io::duplex(4096);
        let acc = tokio::spawn(async move { handshake_accept(&mut b, b"other", pb).await });
        let ra = handshake_connect(&mut a, b"secret", pa).await;
        drop(a);
        assert!(matches!(ra, Err(DirError::Auth(_))));
        assert!(acc.await.unwrap().is_err());
    }

    #[tokio::test]
    async fn a_peer_proving_the_empty_key_is_refused_on_both_sides() {
        let (pa, pb) = two_ids();
        let (mut a, mut b) = tokio::io::duplex(4096);
        let (ra, rb) = tokio::join!(
            handshake_connect(&mut a, b"", pa),
            handshake_accept(&mut b, b"", pb)
        );
        assert!(matches!(ra, Err(DirError::Auth(_))), "connect: {ra:?}");
        assert!(matches!(rb, Err(DirError::Auth(_))), "accept: {rb:?}");
    }
}
