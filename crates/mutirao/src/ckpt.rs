//! The checkpoint wave as a pure state machine (issue 12): which markers to send, which arriving
//! application messages to deliver, hold or record as channel state, when to snapshot, when a
//! wave is complete, committed or aborted. No I/O and no clock: the caller passes the time
//! (`now`, a monotonic [`Duration`] from any origin) and carries out the returned [`Effects`].
//!
//! The protocol (see `docs/checkpoints.md`):
//! 1. the coordinator (rank 0) starts wave `e` when `interval` passed since the last wave ended
//!    and floods `Announce(e)`; every rank forwards the first marker of `e` it sees to all peers;
//!    The announce names the safe point to cut at, counted from the start (two ahead of the
//!    coordinator's count: a peer may be an iteration ahead); a rank already past it cannot
//!    join and aborts the wave for everyone, which costs one retry, not a deadlock;
//! 2. at that safe point, a rank sends `Cut(e)` on every channel (FIFO
//!    after everything it sent before). Blocking mode: it snapshots once `Cut(e)` arrived from
//!    every peer. Nonblocking mode: it snapshots at once; messages from `q` arriving after the
//!    snapshot and before `q`'s `Cut(e)` are *late*: delivered and recorded as channel state.
//!    In both modes a message arriving on a channel after that channel's `Cut(e)` and before the
//!    local snapshot is *held*: not delivered, never in the checkpoint, released after the
//!    snapshot (or when the wave is aborted);
//! 3. a rank whose checkpoint is complete (snapshot taken, every `Cut(e)` in) stores it and
//!    sends `Done(e)` to the coordinator, which commits `e` when every rank is done;
//! 4. a wave that is not committed within `timeout` is aborted by the coordinator
//!    (`Abort(e)` flood): held messages are released, recorded channel state dropped. Learning a
//!    newer epoch also closes an older unfinished one (the coordinator starts `e+1` only once `e`
//!    is committed or aborted).

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::time::Duration;

/// How a rank takes its snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Wait at the safe point until every peer's cut arrived, then snapshot (no channel state).
    Blocking,
    /// Snapshot at the safe point at once; record late messages as channel state.
    Nonblocking,
}

impl Mode {
    /// Parse `MUTIRAO_CKPT_MODE`.
    pub fn parse(s: &str) -> Result<Mode, String> {
        match s {
            "" | "blocking" => Ok(Mode::Blocking),
            "nonblocking" => Ok(Mode::Nonblocking),
            other => Err(format!(
                "MUTIRAO_CKPT_MODE={other:?}: expected \"blocking\" or \"nonblocking\""
            )),
        }
    }

    /// The value `parse` reads.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Blocking => "blocking",
            Mode::Nonblocking => "nonblocking",
        }
    }
}

/// A checkpoint control message (a `Kind::Marker` frame: sub-kind and epoch in its header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marker {
    /// Wave `e` has started (flooded); every rank cuts at its safe point number `at` (counted
    /// from 1 since the start or the restore).
    Announce(u64, u64),
    /// Everything the sender sent before this on this channel is before its cut of `e` (taken
    /// at safe point number `at`).
    Cut(u64, u64),
    /// The sender's checkpoint of `e` is durable (to the coordinator).
    Done(u64),
    /// Wave `e` is abandoned (flooded by the coordinator).
    Abort(u64),
}

impl Marker {
    /// Sub-kind code carried in the frame header.
    pub fn code(self) -> u8 {
        match self {
            Marker::Announce(..) => 1,
            Marker::Cut(..) => 2,
            Marker::Done(_) => 3,
            Marker::Abort(_) => 4,
        }
    }

    /// The epoch the marker is about.
    pub fn epoch(self) -> u64 {
        match self {
            Marker::Announce(e, _) | Marker::Cut(e, _) | Marker::Done(e) | Marker::Abort(e) => e,
        }
    }

    /// The safe point number a wave is cut at (ANNOUNCE and CUT; 0 for the others).
    pub fn at(self) -> u64 {
        match self {
            Marker::Announce(_, at) | Marker::Cut(_, at) => at,
            _ => 0,
        }
    }

    /// Rebuild a marker from its header fields.
    pub fn from_parts(code: u8, epoch: u64, at: u64) -> Result<Marker, String> {
        Ok(match code {
            1 => Marker::Announce(epoch, at),
            2 => Marker::Cut(epoch, at),
            3 => Marker::Done(epoch),
            4 => Marker::Abort(epoch),
            c => {
                return Err(format!(
                    "unknown checkpoint marker sub-kind {c}: the peer runs another mutirão version"
                ))
            }
        })
    }
}

/// What the caller must do after a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effects<M> {
    /// Markers to send, in order: `(destination rank, marker)`.
    pub send: Vec<(usize, Marker)>,
    /// Held messages to hand to matching now, in arrival order per sender: `(source, message)`.
    pub release: Vec<(usize, M)>,
    /// The coordinator: every rank's checkpoint of this epoch is durable; commit it.
    pub commit: Option<u64>,
    /// This wave was abandoned (its checkpoint, if any, must not be stored or used).
    pub aborted: Option<u64>,
}

impl<M> Default for Effects<M> {
    fn default() -> Self {
        Effects {
            send: Vec::new(),
            release: Vec::new(),
            commit: None,
            aborted: None,
        }
    }
}

impl<M> Effects<M> {
    fn merge(&mut self, other: Effects<M>) {
        self.send.extend(other.send);
        self.release.extend(other.release);
        self.commit = self.commit.or(other.commit);
        self.aborted = self.aborted.or(other.aborted);
    }
}

/// What a safe point must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SafePoint {
    /// No wave to take part in here.
    Continue,
    /// Send these cuts (in order, before anything else), then: blocking mode — progress until
    /// [`Wave::ready_to_snapshot`], then snapshot; nonblocking mode — snapshot at once. In both
    /// cases call [`Wave::snapshot_taken`] right after the snapshot.
    Cut {
        epoch: u64,
        send: Vec<(usize, Marker)>,
    },
}

/// A complete checkpoint's channel state, ready to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Complete<M> {
    pub epoch: u64,
    /// Late messages `(source, message)`, in arrival order: re-injected before anything new on a
    /// restore.
    pub late: Vec<(usize, M)>,
}

struct Active<M> {
    epoch: u64,
    at: u64,
    cut_sent: bool,
    snapshot: bool,
    cuts_in: Vec<bool>,
    held: Vec<VecDeque<M>>,
    late: Vec<(usize, M)>,
    handed_over: bool,
}

struct Coordinator {
    interval: Duration,
    timeout: Duration,
    /// When the last wave ended (committed or aborted), or the start.
    last_end: Duration,
    /// The wave in progress: (epoch, started at, done from each rank).
    running: Option<(u64, Duration, Vec<bool>)>,
}

/// One rank's view of the checkpoint waves.
pub struct Wave<M> {
    rank: usize,
    size: usize,
    mode: Mode,
    /// Highest epoch this rank has closed (completed or aborted) or started from.
    closed: u64,
    active: Option<Active<M>>,
    coord: Option<Coordinator>,
    /// The rank is finalizing: it reaches no more safe points and refuses every new wave.
    leaving: bool,
    /// Safe points passed since the start (or the restore: every rank restarts at 0 together).
    points: u64,
}

impl<M: Clone> Wave<M> {
    /// A rank's machine. `after` is the epoch restored from (0 on a fresh start): new waves are
    /// numbered above it. `interval`/`timeout` matter on the coordinator (rank 0) only;
    /// `interval` zero disables waves. `now` is the current time.
    pub fn new(
        rank: usize,
        size: usize,
        mode: Mode,
        after: u64,
        interval: Duration,
        timeout: Duration,
        now: Duration,
    ) -> Self {
        Wave {
            rank,
            size,
            mode,
            closed: after,
            leaving: false,
            points: 0,
            active: None,
            coord: (rank == 0).then_some(Coordinator {
                interval,
                timeout,
                last_end: now,
                running: None,
            }),
        }
    }

    /// The epoch of the wave this rank currently takes part in.
    pub fn active_epoch(&self) -> Option<u64> {
        self.active.as_ref().map(|a| a.epoch)
    }

    /// The rank has learned `epoch` and not snapshotted it yet: it should stop at its next safe
    /// point.
    pub fn wants_cut(&self) -> bool {
        self.active.as_ref().is_some_and(|a| !a.cut_sent)
    }

    fn others(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.size).filter(move |&r| r != self.rank)
    }

    /// Start tracking `epoch` (first time it is heard of); returns the forward flood.
    fn learn(&mut self, epoch: u64, at: u64, from: Option<usize>) -> Effects<M> {
        let mut fx = Effects::default();
        if epoch <= self.closed {
            return fx;
        }
        if let Some(a) = &self.active {
            if a.epoch >= epoch {
                return fx;
            }
            // A newer wave: the coordinator closed ours. Abandon it.
            let old = a.epoch;
            fx.merge(self.abandon(old));
        }
        if self.leaving || self.points >= at {
            // This rank will never reach that safe point (it is finalizing, or already past
            // it): end the wave for everyone.
            self.closed = self.closed.max(epoch);
            fx.send
                .extend(self.others().map(|r| (r, Marker::Abort(epoch))));
            fx.aborted = Some(epoch);
            return fx;
        }
        let mut cuts_in = vec![false; self.size];
        cuts_in[self.rank] = true;
        self.active = Some(Active {
            epoch,
            at,
            cut_sent: false,
            snapshot: false,
            cuts_in,
            held: (0..self.size).map(|_| VecDeque::new()).collect(),
            late: Vec::new(),
            handed_over: false,
        });
        fx.send.extend(
            self.others()
                .filter(|&r| Some(r) != from)
                .map(|r| (r, Marker::Announce(epoch, at))),
        );
        fx
    }

    /// Drop the active wave `epoch`: release held messages, forget channel state.
    fn abandon(&mut self, epoch: u64) -> Effects<M> {
        let mut fx = Effects::default();
        if let Some(a) = self.active.take_if(|a| a.epoch == epoch) {
            for (src, q) in a.held.into_iter().enumerate() {
                fx.release.extend(q.into_iter().map(|m| (src, m)));
            }
            fx.aborted = Some(epoch);
        }
        self.closed = self.closed.max(epoch);
        fx
    }

    /// The rank is finalizing: it will reach no more safe points. A wave it has not cut yet is
    /// aborted for everyone (any rank may abort a wave it cannot join), later ones likewise, and
    /// the coordinator starts no more waves.
    pub fn leave(&mut self, now: Duration) -> Effects<M> {
        let mut fx = Effects::default();
        if self.leaving {
            return fx;
        }
        self.leaving = true;
        if let Some(c) = &mut self.coord {
            c.interval = Duration::ZERO;
            c.running = None;
            c.last_end = now;
        }
        if let Some(a) = &self.active {
            if !a.cut_sent {
                let e = a.epoch;
                fx.send.extend(self.others().map(|r| (r, Marker::Abort(e))));
                fx.merge(self.abandon(e));
            }
        }
        fx
    }

    /// The coordinator's clock: start a wave when it is due, abort one that took too long.
    /// Other ranks get nothing to do. Call at runtime calls and safe points (never during init or
    /// finalize).
    pub fn tick(&mut self, now: Duration) -> Effects<M> {
        let mut fx = Effects::default();
        let next = self.closed.max(self.active_epoch().unwrap_or(0)) + 1;
        let Some(c) = &mut self.coord else { return fx };
        if c.interval.is_zero() {
            return fx;
        }
        match &c.running {
            Some((e, started, _)) => {
                if now.saturating_sub(*started) >= c.timeout {
                    let e = *e;
                    c.running = None;
                    c.last_end = now;
                    fx.send
                        .extend((1..self.size).map(|r| (r, Marker::Abort(e))));
                    fx.merge(self.abandon(e));
                    fx.aborted = Some(e);
                }
            }
            None => {
                if now.saturating_sub(c.last_end) >= c.interval {
                    let e = next;
                    c.running = Some((e, now, vec![false; self.size]));
                    // Two safe points ahead: a peer may be one iteration ahead of this rank.
                    let at = self.points + 2;
                    fx.merge(self.learn(e, at, None));
                }
            }
        }
        fx
    }

    /// A marker arrived from `from`.
    pub fn on_marker(&mut self, from: usize, m: Marker, now: Duration) -> Effects<M> {
        let mut fx = Effects::default();
        match m {
            Marker::Announce(e, at) => fx.merge(self.learn(e, at, Some(from))),
            Marker::Cut(e, at) => {
                fx.merge(self.learn(e, at, Some(from)));
                if let Some(a) = &mut self.active {
                    if a.epoch == e && from < self.size {
                        a.cuts_in[from] = true;
                    }
                }
            }
            Marker::Abort(e) => {
                if let Some(c) = &mut self.coord {
                    if c.running.as_ref().is_some_and(|(re, _, _)| *re == e) {
                        c.running = None;
                        c.last_end = now;
                    }
                }
                if self.active_epoch() == Some(e) {
                    fx.merge(self.abandon(e));
                } else {
                    self.closed = self.closed.max(e);
                }
            }
            Marker::Done(e) => fx.merge(self.done_from(from, e, now)),
        }
        fx
    }

    fn done_from(&mut self, from: usize, e: u64, now: Duration) -> Effects<M> {
        let mut fx = Effects::default();
        let Some(c) = &mut self.coord else { return fx };
        if let Some((re, _, done)) = &mut c.running {
            if *re == e && from < done.len() {
                done[from] = true;
                if done.iter().all(|d| *d) {
                    c.running = None;
                    c.last_end = now;
                    fx.commit = Some(e);
                }
            }
        }
        fx
    }

    /// An application frame (eager message or rendezvous announcement) arrived from `from`.
    /// `Some(m)`: hand it to matching now (if it is late, a copy is kept as channel state);
    /// `None`: held until the snapshot or an abort, excluded from the checkpoint.
    pub fn on_app(&mut self, from: usize, m: M) -> Option<M> {
        let Some(a) = &mut self.active else {
            return Some(m);
        };
        if from >= self.size {
            return Some(m);
        }
        if a.cuts_in[from] && !a.snapshot {
            a.held[from].push_back(m);
            return None;
        }
        if a.snapshot && !a.cuts_in[from] && self.mode == Mode::Nonblocking {
            a.late.push((from, m.clone()));
        }
        Some(m)
    }

    /// An application frame from `from` arriving now must go through [`Wave::on_app`] before
    /// matching: it would be held, or recorded as late (nonblocking mode).
    pub fn diverts(&self, from: usize) -> bool {
        self.holds(from)
            || self.active.as_ref().is_some_and(|a| {
                self.mode == Mode::Nonblocking && from < self.size && a.snapshot && !a.cuts_in[from]
            })
    }

    /// The snapshot mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// An application frame from `from` arriving now would be held (the channel's cut is in,
    /// the local snapshot not yet taken). Lets the caller keep it away from posted receives.
    pub fn holds(&self, from: usize) -> bool {
        self.active
            .as_ref()
            .is_some_and(|a| from < self.size && a.cuts_in[from] && !a.snapshot)
    }

    /// The program reached a safe point.
    pub fn at_safe_point(&mut self) -> SafePoint {
        self.points += 1;
        let Some(a) = &mut self.active else {
            return SafePoint::Continue;
        };
        if a.cut_sent || self.points != a.at {
            return SafePoint::Continue;
        }
        a.cut_sent = true;
        let (e, at) = (a.epoch, a.at);
        SafePoint::Cut {
            epoch: e,
            send: self.others().map(|r| (r, Marker::Cut(e, at))).collect(),
        }
    }

    /// Blocking mode: every peer's cut arrived, the snapshot may be taken. Nonblocking mode:
    /// true as soon as the cuts are sent.
    pub fn ready_to_snapshot(&self) -> bool {
        self.active.as_ref().is_some_and(|a| {
            a.cut_sent
                && !a.snapshot
                && (self.mode == Mode::Nonblocking || a.cuts_in.iter().all(|c| *c))
        })
    }

    /// The snapshot of the active wave was taken: held messages are released.
    pub fn snapshot_taken(&mut self) -> Effects<M> {
        let mut fx = Effects::default();
        if let Some(a) = &mut self.active {
            a.snapshot = true;
            for (src, q) in a.held.iter_mut().enumerate() {
                fx.release.extend(q.drain(..).map(|m| (src, m)));
            }
        }
        fx
    }

    /// Once the snapshot is taken and every cut is in: the channel state to store with it
    /// (returned once per wave).
    pub fn take_complete(&mut self) -> Option<Complete<M>> {
        let a = self.active.as_mut()?;
        if !a.snapshot || a.handed_over || !a.cuts_in.iter().all(|c| *c) {
            return None;
        }
        a.handed_over = true;
        Some(Complete {
            epoch: a.epoch,
            late: std::mem::take(&mut a.late),
        })
    }

    /// This rank's checkpoint of `epoch` is durable: tell the coordinator; the wave is closed here.
    pub fn stored(&mut self, epoch: u64, now: Duration) -> Effects<M> {
        let mut fx = Effects::default();
        if self.active_epoch() == Some(epoch) {
            self.active = None;
            self.closed = self.closed.max(epoch);
        }
        if self.rank == 0 {
            fx.merge(self.done_from(0, epoch, now));
        } else {
            fx.send.push((0, Marker::Done(epoch)));
        }
        fx
    }

    /// How long the coordinator lets a wave run before aborting it (the coordinator only).
    pub fn timeout(&self) -> Option<Duration> {
        self.coord.as_ref().map(|c| c.timeout)
    }
}

// ------------------------------------------------------------------ the stored blob

/// A message kept in a checkpoint: received but not matched at the snapshot (unexpected), or
/// late (channel state, nonblocking mode). Re-injected, in order, before anything new on a
/// restore. Ranks are world ranks; `ctx` is the communicator context id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedMessage {
    pub source: u32,
    pub ctx: u64,
    pub tag: i32,
    pub bytes: Vec<u8>,
}

/// One rank's checkpoint of one epoch: the program's state and the runtime's. Nothing in it is
/// host-specific (no addresses, pids or paths), so it restores on another host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankCheckpoint {
    pub epoch: u64,
    pub rank: u32,
    pub size: u32,
    /// The communicator table: the next context id `split`/`dup` hand out.
    pub next_ctx: u64,
    /// Received, unmatched messages at the snapshot, in arrival order.
    pub unexpected: Vec<SavedMessage>,
    /// Channel state (nonblocking mode), in arrival order.
    pub late: Vec<SavedMessage>,
    /// The program's state, serialized by the program's serde value (bincode).
    pub app: Vec<u8>,
}

/// First bytes of every checkpoint blob.
pub const BLOB_MAGIC: [u8; 8] = *b"MUTICKP\0";
/// Version of the blob layout.
pub const BLOB_VERSION: u32 = 1;

/// FNV-1a, 64 bits: detects truncation and corruption of a blob (not an adversary: blobs travel
/// over the job's authenticated connections and the stores checksum them too).
fn fnv1a(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
        (h ^ u64::from(*x)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl RankCheckpoint {
    /// `magic | version u32 | body length u64 | checksum u64 | body (bincode)`, little-endian.
    pub fn encode(&self) -> Result<Vec<u8>, String> {
        let body = bincode::serialize(self)
            .map_err(|e| format!("cannot encode the checkpoint of epoch {}: {e}", self.epoch))?;
        let mut out = Vec::with_capacity(28 + body.len());
        out.extend_from_slice(&BLOB_MAGIC);
        out.extend_from_slice(&BLOB_VERSION.to_le_bytes());
        out.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.extend_from_slice(&fnv1a(&body).to_le_bytes());
        out.extend_from_slice(&body);
        Ok(out)
    }

    /// Decode a blob and check it is `rank`'s (of `size` ranks) checkpoint of `epoch`; a
    /// corrupt, truncated or foreign blob is an error saying which, never data.
    pub fn decode(b: &[u8], epoch: u64, rank: u32, size: u32) -> Result<RankCheckpoint, String> {
        let what = format!("the checkpoint of rank {rank} at epoch {epoch}");
        if b.len() < 28 || b[..8] != BLOB_MAGIC {
            return Err(format!("{what} is not a mutirão checkpoint (bad header)"));
        }
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| u64::from(u32_at(o)) | (u64::from(u32_at(o + 4)) << 32);
        let version = u32_at(8);
        if version != BLOB_VERSION {
            return Err(format!(
                "{what} has layout version {version}, this runtime reads {BLOB_VERSION}: restart with the mutirão build that wrote it"
            ));
        }
        let body = &b[28..];
        if u64_at(12) != body.len() as u64 {
            return Err(format!(
                "{what} is truncated or padded: {} body bytes, the header says {}",
                body.len(),
                u64_at(12)
            ));
        }
        if u64_at(20) != fnv1a(body) {
            return Err(format!("{what} is corrupt (checksum mismatch)"));
        }
        let c: RankCheckpoint =
            bincode::deserialize(body).map_err(|e| format!("{what} is corrupt: {e}"))?;
        if (c.epoch, c.rank, c.size) != (epoch, rank, size) {
            return Err(format!(
                "{what} holds rank {} of {} at epoch {} instead: a checkpoint of another job or epoch",
                c.rank, c.size, c.epoch
            ));
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn marker_codes_round_trip_and_unknown_is_an_error() {
        for m in [
            Marker::Announce(3, 1),
            Marker::Cut(4, 1),
            Marker::Done(5),
            Marker::Abort(6),
        ] {
            assert_eq!(Marker::from_parts(m.code(), m.epoch(), m.at()), Ok(m));
        }
        assert!(Marker::from_parts(9, 1, 0)
            .unwrap_err()
            .contains("sub-kind 9"));
        assert_eq!(Mode::parse("nonblocking"), Ok(Mode::Nonblocking));
        assert!(Mode::parse("fast").is_err());
    }

    #[test]
    fn coordinator_starts_after_the_interval_and_floods_announce() {
        let mut w: Wave<u32> = Wave::new(0, 3, Mode::Blocking, 0, ms(50), ms(500), ms(0));
        assert!(w.tick(ms(49)).send.is_empty());
        let fx = w.tick(ms(50));
        assert_eq!(
            fx.send,
            vec![(1, Marker::Announce(1, 2)), (2, Marker::Announce(1, 2))]
        );
        assert_eq!(w.active_epoch(), Some(1));
        // No second wave while one runs.
        assert!(w.tick(ms(120)).send.is_empty());
    }

    #[test]
    fn a_rank_forwards_the_first_announce_only() {
        let mut w: Wave<u32> = Wave::new(2, 4, Mode::Blocking, 0, ms(0), ms(0), ms(0));
        let fx = w.on_marker(0, Marker::Announce(1, 1), ms(1));
        assert_eq!(
            fx.send,
            vec![(1, Marker::Announce(1, 1)), (3, Marker::Announce(1, 1))]
        );
        assert!(w
            .on_marker(1, Marker::Announce(1, 1), ms(1))
            .send
            .is_empty());
    }

    #[test]
    fn blocking_holds_after_a_cut_and_releases_at_the_snapshot() {
        let mut w: Wave<u32> = Wave::new(1, 3, Mode::Blocking, 0, ms(0), ms(0), ms(0));
        w.on_marker(0, Marker::Announce(1, 1), ms(0));
        assert_eq!(w.on_app(2, 10), Some(10));
        w.on_marker(2, Marker::Cut(1, 1), ms(0));
        assert_eq!(w.on_app(2, 11), None, "after 2's cut: held");
        assert_eq!(w.on_app(0, 12), Some(12), "before 0's cut: delivered");
        let SafePoint::Cut { send, .. } = w.at_safe_point() else {
            panic!("a wave is active")
        };
        assert_eq!(send, vec![(0, Marker::Cut(1, 1)), (2, Marker::Cut(1, 1))]);
        assert!(!w.ready_to_snapshot(), "0's cut missing");
        w.on_marker(0, Marker::Cut(1, 1), ms(0));
        assert!(w.ready_to_snapshot());
        let fx = w.snapshot_taken();
        assert_eq!(fx.release, vec![(2, 11)]);
        let c = w.take_complete().unwrap();
        assert!(c.late.is_empty());
        assert_eq!(w.stored(1, ms(0)).send, vec![(0, Marker::Done(1))]);
        assert_eq!(w.on_app(2, 13), Some(13));
    }

    #[test]
    fn nonblocking_records_late_messages_until_the_cut() {
        let mut w: Wave<u32> = Wave::new(1, 2, Mode::Nonblocking, 0, ms(0), ms(0), ms(0));
        w.on_marker(0, Marker::Announce(1, 1), ms(0));
        assert!(matches!(w.at_safe_point(), SafePoint::Cut { epoch: 1, .. }));
        assert!(w.ready_to_snapshot());
        w.snapshot_taken();
        assert_eq!(w.take_complete(), None, "0's cut not in yet");
        assert_eq!(w.on_app(0, 7), Some(7));
        w.on_marker(0, Marker::Cut(1, 1), ms(0));
        assert_eq!(w.on_app(0, 8), Some(8));
        assert_eq!(w.take_complete().unwrap().late, vec![(0, 7)]);
    }

    #[test]
    fn timeout_aborts_and_releases_held_messages() {
        let mut w: Wave<u32> = Wave::new(0, 2, Mode::Blocking, 4, ms(10), ms(100), ms(0));
        let fx = w.tick(ms(10));
        assert_eq!(fx.send, vec![(1, Marker::Announce(5, 2))]);
        w.on_marker(1, Marker::Cut(5, 1), ms(20));
        assert_eq!(w.on_app(1, 1), None);
        let fx = w.tick(ms(110));
        assert_eq!(fx.send, vec![(1, Marker::Abort(5))]);
        assert_eq!(fx.release, vec![(1, 1)]);
        assert_eq!(fx.aborted, Some(5));
        assert_eq!(w.active_epoch(), None);
        // The next wave gets a new number, after another interval.
        assert!(w.tick(ms(115)).send.is_empty());
        assert_eq!(w.tick(ms(120)).send, vec![(1, Marker::Announce(6, 2))]);
    }

    #[test]
    fn coordinator_commits_when_every_rank_is_done() {
        let mut w: Wave<u32> = Wave::new(0, 2, Mode::Blocking, 0, ms(10), ms(100), ms(0));
        w.tick(ms(10));
        assert_eq!(
            w.at_safe_point(),
            SafePoint::Continue,
            "cut at the 2nd safe point"
        );
        assert!(matches!(w.at_safe_point(), SafePoint::Cut { epoch: 1, .. }));
        w.on_marker(1, Marker::Cut(1, 2), ms(11));
        assert!(w.ready_to_snapshot());
        w.snapshot_taken();
        w.take_complete().unwrap();
        assert_eq!(w.stored(1, ms(12)).commit, None);
        assert_eq!(w.on_marker(1, Marker::Done(1), ms(13)).commit, Some(1));
    }

    #[test]
    fn blobs_round_trip_and_bad_ones_are_named_errors() {
        let c = RankCheckpoint {
            epoch: 3,
            rank: 1,
            size: 4,
            next_ctx: 9,
            unexpected: vec![SavedMessage {
                source: 2,
                ctx: 0,
                tag: 5,
                bytes: vec![1, 2, 3],
            }],
            late: vec![],
            app: vec![7; 100],
        };
        let b = c.encode().unwrap();
        assert_eq!(RankCheckpoint::decode(&b, 3, 1, 4).unwrap(), c);
        let e = RankCheckpoint::decode(&b[..b.len() - 1], 3, 1, 4).unwrap_err();
        assert!(e.contains("truncated"), "{e}");
        let mut flip = b.clone();
        *flip.last_mut().unwrap() ^= 1;
        let e = RankCheckpoint::decode(&flip, 3, 1, 4).unwrap_err();
        assert!(e.contains("checksum"), "{e}");
        let e = RankCheckpoint::decode(&b, 4, 1, 4).unwrap_err();
        assert!(e.contains("another job or epoch"), "{e}");
        let e = RankCheckpoint::decode(b"hello world, not a checkpoint", 3, 1, 4).unwrap_err();
        assert!(e.contains("not a mutirão checkpoint"), "{e}");
    }

    #[test]
    fn a_leaving_rank_aborts_the_waves_it_cannot_join() {
        let mut w: Wave<u32> = Wave::new(2, 3, Mode::Blocking, 0, ms(0), ms(0), ms(0));
        w.on_marker(0, Marker::Announce(1, 1), ms(0));
        w.on_marker(1, Marker::Cut(1, 1), ms(0));
        assert_eq!(w.on_app(1, 5), None);
        let fx = w.leave(ms(1));
        assert_eq!(fx.send, vec![(0, Marker::Abort(1)), (1, Marker::Abort(1))]);
        assert_eq!(fx.release, vec![(1, 5)]);
        let fx = w.on_marker(0, Marker::Announce(2, 1), ms(2));
        assert_eq!(fx.send, vec![(0, Marker::Abort(2)), (1, Marker::Abort(2))]);
        assert_eq!(w.active_epoch(), None);
        // The coordinator hears a rank's abort: the wave ends, the next one may start later.
        let mut c: Wave<u32> = Wave::new(0, 2, Mode::Blocking, 0, ms(10), ms(100), ms(0));
        c.tick(ms(10));
        assert_eq!(c.on_marker(1, Marker::Abort(1), ms(11)).aborted, Some(1));
        assert_eq!(c.tick(ms(21)).send, vec![(1, Marker::Announce(2, 2))]);
        // A finalizing coordinator starts nothing more.
        c.leave(ms(22));
        assert!(c.tick(ms(500)).send.is_empty());
    }

    // ----------------------------------------------------------- §15.6.5 property test

    #[derive(Clone, Debug)]
    enum Frame {
        App(u64),
        Mk(Marker),
    }

    #[derive(Clone, Debug)]
    enum Op {
        Send(usize, usize),
        Deliver(usize, usize),
        Safe(usize),
    }

    #[derive(Clone, Debug, Default)]
    struct Blob {
        sent: BTreeSet<u64>,
        received: BTreeSet<u64>,
        late: Vec<u64>,
    }

    struct Sim {
        n: usize,
        now: u64,
        next_id: u64,
        waves: Vec<Wave<u64>>,
        chan: Vec<Vec<VecDeque<Frame>>>,
        sent: Vec<BTreeSet<u64>>,
        /// Messages delivered to each rank's engine (matched or unexpected).
        received: Vec<BTreeSet<u64>>,
        blocked: Vec<bool>,
        /// Safe points each rank has passed.
        points: Vec<u64>,
        snap: Vec<Option<(u64, Blob)>>,
        store: BTreeMap<(u64, usize), Blob>,
        committed: Vec<u64>,
        /// (epoch, rank, id) of every message held.
        held: Vec<(u64, usize, u64)>,
        owner: BTreeMap<u64, (usize, usize)>,
    }

    impl Sim {
        fn new(n: usize, mode: Mode) -> Sim {
            Sim {
                n,
                now: 0,
                next_id: 0,
                waves: (0..n)
                    .map(|r| Wave::new(r, n, mode, 0, ms(20), ms(400), ms(0)))
                    .collect(),
                chan: (0..n)
                    .map(|_| (0..n).map(|_| VecDeque::new()).collect())
                    .collect(),
                sent: vec![BTreeSet::new(); n],
                received: vec![BTreeSet::new(); n],
                blocked: vec![false; n],
                points: vec![0; n],
                snap: vec![None; n],
                store: BTreeMap::new(),
                committed: Vec::new(),
                held: Vec::new(),
                owner: BTreeMap::new(),
            }
        }

        fn deliver_app(&mut self, r: usize, from: usize, id: u64) {
            assert!(
                self.received[r].insert(id),
                "message {id} delivered twice to {r}"
            );
            assert_eq!(self.owner[&id], (from, r));
        }

        fn apply(&mut self, r: usize, fx: Effects<u64>) {
            for (to, m) in fx.send {
                self.chan[r][to].push_back(Frame::Mk(m));
            }
            for (src, id) in fx.release {
                self.deliver_app(r, src, id);
            }
            if let Some(e) = fx.aborted {
                if self.snap[r].as_ref().is_some_and(|(se, _)| *se == e) {
                    self.snap[r] = None;
                }
                self.blocked[r] = false;
            }
            if let Some(e) = fx.commit {
                for q in 0..self.n {
                    assert!(
                        self.store.contains_key(&(e, q)),
                        "commit {e} without {q}'s blob"
                    );
                }
                self.committed.push(e);
            }
        }

        fn settle(&mut self, r: usize) {
            if self.blocked[r] && self.waves[r].ready_to_snapshot() {
                self.take_snapshot(r);
            }
            if let Some(c) = self.waves[r].take_complete() {
                let (e, mut blob) = self.snap[r].take().expect("snapshot before completion");
                assert_eq!(e, c.epoch);
                blob.late = c.late.iter().map(|(_, id)| *id).collect();
                self.store.insert((e, r), blob);
                let fx = self.waves[r].stored(e, ms(self.now));
                self.apply(r, fx);
            }
        }

        fn take_snapshot(&mut self, r: usize) {
            let e = self.waves[r].active_epoch().unwrap();
            self.snap[r] = Some((
                e,
                Blob {
                    sent: self.sent[r].clone(),
                    received: self.received[r].clone(),
                    late: Vec::new(),
                },
            ));
            self.blocked[r] = false;
            let fx = self.waves[r].snapshot_taken();
            self.apply(r, fx);
        }

        fn step(&mut self, op: &Op) {
            self.now += 1;
            let fx = self.waves[0].tick(ms(self.now));
            self.apply(0, fx);
            match *op {
                Op::Send(a, b) => {
                    let (a, b) = (a % self.n, b % self.n);
                    if a != b && !self.blocked[a] {
                        let id = self.next_id;
                        self.next_id += 1;
                        self.owner.insert(id, (a, b));
                        self.sent[a].insert(id);
                        self.chan[a][b].push_back(Frame::App(id));
                    }
                }
                Op::Deliver(a, b) => {
                    let (a, b) = (a % self.n, b % self.n);
                    match self.chan[a][b].pop_front() {
                        Some(Frame::App(id)) => {
                            let ep = self.waves[b].active_epoch();
                            match self.waves[b].on_app(a, id) {
                                Some(id) => self.deliver_app(b, a, id),
                                None => self.held.push((ep.unwrap(), b, id)),
                            }
                        }
                        Some(Frame::Mk(m)) => {
                            let fx = self.waves[b].on_marker(a, m, ms(self.now));
                            self.apply(b, fx);
                        }
                        None => {}
                    }
                    self.settle(b);
                }
                Op::Safe(r) => {
                    let r = r % self.n;
                    if !self.blocked[r] {
                        self.points[r] += 1;
                        if let SafePoint::Cut { send, .. } = self.waves[r].at_safe_point() {
                            for (to, m) in send {
                                self.chan[r][to].push_back(Frame::Mk(m));
                            }
                            self.blocked[r] = true;
                            self.settle(r);
                        }
                    }
                }
            }
            self.settle(0);
        }

        fn check(&self) {
            for &e in &self.committed {
                for r in 0..self.n {
                    let b = &self.store[&(e, r)];
                    let late: BTreeSet<u64> = b.late.iter().copied().collect();
                    assert_eq!(late.len(), b.late.len(), "a late message recorded twice");
                    assert!(
                        b.received.is_disjoint(&late),
                        "epoch {e} rank {r}: a message both received and in channel state"
                    );
                    for id in b.received.iter().chain(late.iter()) {
                        let (src, dst) = self.owner[id];
                        assert_eq!(dst, r);
                        assert!(
                            self.store[&(e, src)].sent.contains(id),
                            "epoch {e}: orphan {id} ({src}→{r}) received but not sent in the cut"
                        );
                    }
                    for id in &b.sent {
                        let (_, dst) = self.owner[id];
                        let rb = &self.store[&(e, dst)];
                        assert!(
                            rb.received.contains(id) || rb.late.contains(id),
                            "epoch {e}: message {id} ({r}→{dst}) lost: sent before the cut, neither received nor in channel state"
                        );
                    }
                }
                for (he, r, id) in &self.held {
                    if *he == e {
                        let b = &self.store[&(e, *r)];
                        assert!(
                            !b.received.contains(id) && !b.late.contains(id),
                            "held message {id} in rank {r}'s checkpoint of {e}"
                        );
                    }
                }
            }
        }
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0..5usize, 0..5usize).prop_map(|(a, b)| Op::Send(a, b)),
            5 => (0..5usize, 0..5usize).prop_map(|(a, b)| Op::Deliver(a, b)),
            1 => (0..5usize).prop_map(Op::Safe),
        ]
    }

    fn run(n: usize, mode: Mode, ops: &[Op]) {
        let mut sim = Sim::new(n, mode);
        for o in ops {
            sim.step(o);
        }
        // Drain: no new traffic, every rank reaches safe points, everything is delivered, until
        // a wave has committed (bounded).
        let before = sim.committed.len();
        // Safe points in lockstep (the laggards first), as a loop with one safe point per
        // iteration would reach them.
        for _ in 0..5000 {
            if sim.committed.len() > before {
                break;
            }
            let low = *sim.points.iter().min().unwrap();
            for a in 0..n {
                if sim.points[a] == low {
                    sim.step(&Op::Safe(a));
                }
                for b in 0..n {
                    sim.step(&Op::Deliver(a, b));
                }
            }
        }
        assert!(
            sim.committed.len() > before,
            "a quiet job must commit a wave"
        );
        sim.check();
        // Every message delivered exactly once over the whole run (held ones released).
        let all: usize = sim.received.iter().map(|s| s.len()).sum();
        let in_flight: usize = sim
            .chan
            .iter()
            .flatten()
            .map(|q| q.iter().filter(|f| matches!(f, Frame::App(_))).count())
            .sum();
        assert_eq!(all + in_flight, sim.next_id as usize);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]
        #[test]
        fn restoring_any_committed_epoch_loses_and_orphans_nothing(
            n in 2usize..=5,
            nonblocking in any::<bool>(),
            ops in proptest::collection::vec(op(), 0..600),
        ) {
            let mode = if nonblocking { Mode::Nonblocking } else { Mode::Blocking };
            run(n, mode, &ops);
        }
    }
}
