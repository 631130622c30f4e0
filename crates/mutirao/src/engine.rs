//! The progress engine: connections to every peer, frame I/O, message matching, and the
//! spin-then-block wait loop.
//!
//! Single-threaded by design (like an MPI library at `MPI_THREAD_FUNNELED`): every API call drives
//! progress. Invariants:
//! - frames from one peer are processed in stream order, and a header is matched against posted
//!   receives the moment it is decoded, so MPI's non-overtaking rule per (source, tag, context)
//!   holds;
//! - a receive matches the first posted receive in post order, or the oldest unexpected message;
//! - eager messages (≤ `eager_limit`, `shm_eager_limit` to shared-memory peers) are sent at once
//!   and buffered by the receiver if unexpected; larger ones use rendezvous (RTS → CTS → DATA),
//!   so an unexpected large message costs the receiver only its header;
//! - raw pointers to caller memory (blocking send/recv) live in the engine only while the blocking
//!   call that put them there is running: it removes them on every exit path;
//! - a peer's failure (EOF without BYE, reset, protocol error) fails every pending operation that
//!   needs it and every later one, instead of blocking.

use crate::transport::{Fast, Transport};
use crate::wire::{Header, Kind, HEADER_LEN};
use crate::{Error, Status};
use mio::{Events, Interest, Poll, Token};
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::io::IoSlice;
use std::time::{Duration, Instant};

/// While spinning, how often a waiting rank offers its core (`sched_yield`) by default: never.
/// Every 20 µs (the default until 2026-11-25) made a rank beside one busy process lose its core
/// for a whole time slice at each offer: 10 interleaved rounds of `pingpong --sizes
/// 0,64,512,4096,65536` beside a busy loop on 2 cores, median one-way 4 KiB 10.5 µs and 64 KiB
/// 86 µs with it, 0.71 and 3.7 µs without (0–512 B unchanged). Ranks that outnumber the cores
/// do not spin at all, so this never holds off a rank sharing our core by design.
pub(crate) const POLITE_YIELD: Duration = Duration::ZERO;

/// Request ids are sequential integers: a multiplicative hash is enough (and far cheaper than SipHash).
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// The id of the receive a blocking call posts. `new_id` counts up from 2 and never reaches it.
pub(crate) const BLOCKING: u64 = u64::MAX;

/// Receives by id: a hash map, plus one slot for the receive of the blocking call in progress
/// (a blocking receive is posted, matched, completed and taken out once per call: keeping it out
/// of the map saves an insert, a removal and every lookup on the ping-pong path — about a fifth
/// of a shared-memory round trip's instructions). Same interface as the map.
#[derive(Default)]
pub(crate) struct Recvs {
    map: IdMap<Recv>,
    slot: Option<Recv>,
}

impl Recvs {
    #[inline]
    pub(crate) fn get(&self, id: &u64) -> Option<&Recv> {
        if *id == BLOCKING {
            self.slot.as_ref()
        } else {
            self.map.get(id)
        }
    }
    #[inline]
    pub(crate) fn get_mut(&mut self, id: &u64) -> Option<&mut Recv> {
        if *id == BLOCKING {
            self.slot.as_mut()
        } else {
            self.map.get_mut(id)
        }
    }
    #[inline]
    pub(crate) fn insert(&mut self, id: u64, r: Recv) {
        if id == BLOCKING {
            self.slot = Some(r);
        } else {
            self.map.insert(id, r);
        }
    }
    #[inline]
    pub(crate) fn remove(&mut self, id: &u64) -> Option<Recv> {
        if *id == BLOCKING {
            self.slot.take()
        } else {
            self.map.remove(id)
        }
    }
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&u64, &Recv)> {
        self.map
            .iter()
            .chain(self.slot.as_ref().map(|r| (&BLOCKING, r)))
    }
    pub(crate) fn is_empty(&self) -> bool {
        self.map.is_empty() && self.slot.is_none()
    }
}

/// A buffer the engine owns on behalf of a nonblocking request (type-erased `Vec<T: Pod>`).
pub trait Buf: std::any::Any {
    fn bytes(&self) -> &[u8];
    fn bytes_mut(&mut self) -> &mut [u8];
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any>;
}

impl<T: bytemuck::Pod> Buf for Vec<T> {
    fn bytes(&self) -> &[u8] {
        bytemuck::cast_slice(self)
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        bytemuck::cast_slice_mut(self)
    }
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}

/// Where a receive puts its payload.
pub(crate) enum Dest {
    /// Caller memory during a blocking call (see module invariants).
    Borrowed(*mut u8, usize),
    /// An owned buffer whose size bounds the message.
    Owned(Box<dyn Buf>),
    /// Allocate exactly the message size on arrival.
    Alloc(fn(usize) -> Result<Box<dyn Buf>, Error>),
}

/// Where a send takes its payload from.
pub(crate) enum SendData {
    Borrowed(*const u8, usize),
    Owned(Box<dyn Buf>),
}

impl SendData {
    fn bytes(&self) -> &[u8] {
        match self {
            // SAFETY: a Borrowed pointer is only stored while the blocking send that owns the
            // borrow is running (module invariant), so it points to `len` live bytes.
            SendData::Borrowed(p, n) => unsafe { std::slice::from_raw_parts(*p, *n) },
            SendData::Owned(b) => b.bytes(),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum RecvState {
    Posted,
    /// Payload frames are arriving from this peer.
    Receiving,
    Done,
}

pub(crate) struct Recv {
    ctx: u64,
    src: Option<usize>,
    tag: Option<i32>,
    dest: Dest,
    /// Message length once matched.
    len: usize,
    state: RecvState,
    pub(crate) status: Option<Status>,
    pub(crate) err: Option<Error>,
    detached: bool,
    /// Element size of the program's buffer type (for checkpoints of requests in flight).
    elem: u32,
    /// Posted with an exact-size buffer allocated on arrival (`irecv`), not into the program's.
    alloc: bool,
    /// Matched to a large message after this rank's cut of this epoch (blocking mode, between
    /// the cut and the snapshot), with the message's arrival number: its sender holds that
    /// message in its checkpoint, so the snapshot keeps this receive as pending.
    after_cut: Option<(u64, u64)>,
}

impl Recv {
    fn slice_mut(&mut self) -> &mut [u8] {
        match &mut self.dest {
            // SAFETY: see the module invariant on borrowed pointers.
            Dest::Borrowed(p, n) => unsafe { std::slice::from_raw_parts_mut(*p, *n) },
            Dest::Owned(b) => b.bytes_mut(),
            Dest::Alloc(_) => &mut [],
        }
    }

    /// Prepare the destination for a message of `len` bytes; errors on truncation.
    fn bind(&mut self, len: usize) -> Result<(), Error> {
        if let Dest::Alloc(f) = &self.dest {
            self.dest = Dest::Owned(f(len)?);
        }
        let cap = self.slice_mut().len();
        if len > cap {
            return Err(Error::Truncated { got: len, cap });
        }
        self.len = len;
        Ok(())
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum SendState {
    WaitCts,
    Streaming,
    Done,
}

pub(crate) struct Send {
    peer: usize,
    data: SendData,
    state: SendState,
    pub(crate) err: Option<Error>,
    detached: bool,
    /// (context, tag, element size of the program's buffer type): what a checkpoint keeps of a
    /// finished send not yet waited for.
    meta: (u64, i32, u32),
    /// A rendezvous send (its message goes only once the receiver matched it).
    rdv: bool,
    /// The receiver's clear-to-send (or FIN) came, after its cut of this epoch if `Some`:
    /// checkpoints of that epoch hold the message (see [`Engine::snapshot_runtime`]).
    acked: Option<Option<u64>>,
}

enum OutPayload {
    None,
    Owned(Vec<u8>),
    Send(u64),
}

struct Out {
    hdr: [u8; HEADER_LEN],
    /// Bytes of header + payload already written.
    pos: usize,
    payload: OutPayload,
}

enum Rx {
    Header,
    Payload {
        remaining: usize,
        target: Target,
        hdr: Header,
    },
}

enum Target {
    Recv(u64, usize),
    Unexpected(Vec<u8>, usize),
    Discard,
}

struct Unexpected {
    peer: usize,
    ctx: u64,
    tag: i32,
    body: UnexBody,
    /// Arrival number (see `Engine::arrivals`): orders the snapshot's slots for held messages.
    seq: u64,
}

impl Unexpected {
    /// A large message's announcement (`hdr`) of `peer`, unmatched.
    fn announced(
        peer: usize,
        hdr: Header,
        len: usize,
        cma: Option<(u64, i32)>,
        seq: u64,
    ) -> Unexpected {
        Unexpected {
            peer,
            ctx: hdr.ctx,
            tag: hdr.tag,
            body: UnexBody::Rts {
                send_id: hdr.id,
                len,
                cma,
            },
            seq,
        }
    }
}

enum UnexBody {
    Eager(Vec<u8>),
    Rts {
        send_id: u64,
        len: usize,
        /// (sender's buffer address, sender's pid) for a same-host cross-memory copy.
        cma: Option<(u64, i32)>,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum PeerState {
    Alive,
    Finalized,
    Failed(String),
    /// A world rank this process has no channel to: in a spawned rank, every rank outside its
    /// spawn group; in a parent, the children of other ranks' spawns.
    Unconnected,
}

pub(crate) struct Peer {
    pub(crate) state: PeerState,
    /// The byte stream to this peer; `None` for this process itself.
    io: Option<Box<dyn Transport>>,
    rx: Rx,
    stage: Vec<u8>,
    stage_start: usize,
    stage_end: usize,
    txq: VecDeque<Out>,
    bye_sent: bool,
    /// Same-host peer whose socket only carries wake-ups (cached `is_shm`).
    shm: bool,
    /// The peer said, at start-up, that it runs on this rank's host (same host identity), over
    /// whichever transport. False when not known (spawned ranks).
    pub(crate) same_host: bool,
}

const STAGE: usize = 64 * 1024;

/// How long a rank waiting on a TCP transfer in progress spins after the last bytes moved,
/// while its TCP links deliver fast (see [`LinkRate`]), unless the machine is oversubscribed.
const MID_TRANSFER_SPIN: Duration = Duration::from_millis(1);

/// A TCP link "delivers fast" while it moves at least this many bytes per µs (500 MB/s, 4
/// Gbit/s): loopback moves 2.5–7 GB/s on the 2-core VM, the testbed's links 30 Mbit/s–1 Gbit/s.
const FAST_LINK_BYTES_PER_US: u64 = 500;

/// The rate of [`LinkRate`] is taken over the last one to two of these.
const RATE_WINDOW: Duration = Duration::from_millis(1);

/// The rate at which one wait's TCP links have moved bytes lately: bytes counted since a mark
/// at most two [`RATE_WINDOW`]s old. It decides whether a quiet gap in a transfer is worth
/// spinning through: on a fast link a gap is a peer's wake-up or a socket-buffer refill and
/// the rest follows within microseconds, so a sleep adds a wake-up per gap; on a slow link
/// (30 Mbit/s: a 1500-byte frame every 400 µs) the rest comes at the link's pace and a spin
/// would burn the core through the whole transfer.
#[derive(Clone, Copy, Debug)]
struct LinkRate {
    /// (time, bytes moved so far) at the start of the previous and of the current window.
    marks: [(Instant, u64); 2],
}

impl LinkRate {
    fn new(now: Instant, moved: u64) -> LinkRate {
        LinkRate {
            marks: [(now, moved); 2],
        }
    }

    /// Whether the links moved at least [`FAST_LINK_BYTES_PER_US`] since the older mark, as of
    /// `now` with `moved` bytes moved so far (a count that only grows).
    fn fast(&mut self, now: Instant, moved: u64) -> bool {
        if now.saturating_duration_since(self.marks[1].0) >= RATE_WINDOW {
            self.marks = [self.marks[1], (now, moved)];
        }
        let (t, b) = self.marks[0];
        let us = now.saturating_duration_since(t).as_micros().max(1);
        let bytes = u128::from(moved.saturating_sub(b));
        bytes > 0 && bytes >= u128::from(FAST_LINK_BYTES_PER_US) * us
    }
}

impl Peer {
    pub(crate) fn new(io: Option<Box<dyn Transport>>) -> Peer {
        let shm = io.as_ref().is_some_and(|t| !t.socket_is_stream());
        Peer {
            shm,
            state: PeerState::Alive,
            io,
            rx: Rx::Header,
            stage: vec![0u8; STAGE],
            stage_start: 0,
            stage_end: 0,
            txq: VecDeque::new(),
            bye_sent: false,
            same_host: false,
        }
    }

    /// A world rank this process cannot reach (see [`PeerState::Unconnected`]).
    pub(crate) fn unconnected() -> Peer {
        Peer {
            state: PeerState::Unconnected,
            io: None,
            rx: Rx::Header,
            // Never read into (only live peers are): no staging buffer, so a process whose
            // world ranks reach far (many spawns) does not pay 64 KiB per rank it cannot reach.
            stage: Vec::new(),
            stage_start: 0,
            stage_end: 0,
            txq: VecDeque::new(),
            bye_sent: false,
            shm: false,
            same_host: false,
        }
    }

    /// Same-host peer whose socket only carries wake-ups.
    fn is_shm(&self) -> bool {
        self.io.as_ref().is_some_and(|t| !t.socket_is_stream())
    }
}

fn raw_read(io: &mut Option<Box<dyn Transport>>, buf: &mut [u8]) -> Result<usize, String> {
    match io.as_mut() {
        Some(t) => t.read(buf),
        None => Ok(0),
    }
}

fn raw_write(io: &mut Option<Box<dyn Transport>>, bufs: &[IoSlice<'_>]) -> Result<usize, String> {
    match io.as_mut() {
        Some(t) => t.write(bufs),
        None => Err("no connection".into()),
    }
}

/// Tunables, from the environment (see `crate::config`).
#[derive(Clone, Debug)]
pub(crate) struct Tuning {
    pub eager_limit: usize,
    /// Eager limit towards shared-memory peers.
    pub shm_eager_limit: usize,
    /// Spin when every peer is on shared memory.
    pub spin_shm: Duration,
    /// After spinning, yield the core this long before sleeping.
    pub yield_for: Duration,
    /// While spinning, offer the core this often (zero: never).
    pub polite_yield: Duration,
    pub cma: bool,
    pub spin: Duration,
    /// Ranks outnumber the host's cores: collectives that can choose send large blocks to
    /// same-host peers by single copy, when cross-memory copies are allowed (see
    /// `Comm::alltoall`).
    pub outnumbered: bool,
}

pub(crate) struct Engine {
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) peers: Vec<Peer>,
    poll: Option<Poll>,
    events: Events,
    posted: VecDeque<u64>,
    unexpected: VecDeque<Unexpected>,
    /// Buffers of unexpected eager messages, kept once copied out for the next ones (see
    /// [`Engine::unexpected_buf`]).
    spare: Vec<Vec<u8>>,
    pub(crate) recvs: Recvs,
    /// A blocking receive was abandoned while its rendezvous data could still come: later
    /// blocking receives take fresh ids, so that data cannot land in another call's buffer.
    slot_tainted: bool,
    pub(crate) sends: IdMap<Send>,
    next_id: u64,
    tuning: Tuning,
    n_shm: usize,
    n_sock: usize,
    /// Offer cross-memory copies to same-host peers (`MUTIRAO_CMA`, default on).
    cma: bool,
    /// Keeps the launcher connection open for the life of the job.
    pub(crate) _pmi: Option<crate::pmi::PmiClient>,
    /// How often a blocked wait asks the launcher for lost ranks, and when it last did
    /// (`MUTIRAO_LOST_POLL_MS`, [`Engine::ask_lost`]).
    pub(crate) lost_poll: Option<(Duration, Instant)>,
    pub(crate) finalized: bool,
    /// Passes of [`Engine::poke`] so far.
    pokes: u32,
    /// Checkpoint waves (issue 12), when the job takes them.
    pub(crate) ckpt: Option<CkptRt>,
    /// When the sockets were last asked for events.
    last_socket_poll: Instant,
    /// What a spawn needs from the launcher's environment (`None`: not under a launcher).
    pub(crate) launch: Option<crate::spawn::Launch>,
    /// The spawn group this process was started by (`None`: an original rank).
    pub(crate) spawned_in: Option<u64>,
    /// The spawn groups this rank is the parent of (saved with checkpoints while their
    /// children are wave members, so a restart starts them again).
    pub(crate) spawn_groups: Vec<crate::ckpt::SavedSpawn>,
    /// Spawn groups a restart re-created, until the program takes them (`Comm::respawned`):
    /// (group, members parent first, time to re-create).
    pub(crate) respawned: Option<Vec<(u64, Vec<usize>, Duration)>>,
    /// How long this rank's start-up took, phase by phase (`None`: not under a launcher).
    pub(crate) init_timings: Option<crate::InitTimings>,
    /// Peers this process had at start-up: their failures fail any-source receives of the
    /// communicators not in `scopes` (the job's, and those derived from it).
    base: usize,
    /// Point-to-point context → world ranks, for spawn communicators (and those derived from
    /// them): a failure fails an any-source receive there only if the rank is a member, so a
    /// lost spawned worker does not break the job's own any-source receives.
    scopes: HashMap<u64, Vec<usize>>,
    /// The communicator table: every `split`/`dup`, with the derivation counts that give new
    /// communicators their contexts (saved in checkpoints, see `crate::ckpt::CommTable`).
    pub(crate) comms: crate::ckpt::CommTable,
    /// The program's handles per derived context (whether it still holds one at a snapshot).
    pub(crate) comm_handles: HashMap<u64, Vec<std::rc::Weak<crate::comm::CommInner>>>,
    /// Application messages matched or queued so far (each one's arrival number).
    arrivals: u64,
    /// Whether more threads are runnable than there are CPUs: then a waiting rank yields its
    /// core instead of spinning (see [`crate::busy`]).
    busy: crate::busy::BusyProbe,
    /// Times [`Engine::wait_until`] yielded its core (tests).
    yields: u64,
    /// Times [`Engine::wait_until`] went to sleep in the kernel (tests).
    sleeps: u64,
    /// Times [`Engine::wait_until`] stopped spinning because a shared-memory peer, awake, ran
    /// on this rank's CPU (tests).
    cpu_cuts: u64,
    /// When this rank last moved itself off a CPU it shared with a shared-memory peer (see
    /// [`move_off_cpu`]), and how many times it did (tests).
    last_move: Option<Instant>,
    moves: u64,
    /// Passes of [`Engine::wait_until`] that read TCP sockets directly, and that asked epoll
    /// (tests).
    direct_passes: u64,
    epoll_passes: u64,
    /// Idle passes [`Engine::wait_until`] spun without reading the clock (tests).
    spun: u64,
    /// Bytes read from and written to TCP peers so far (see [`LinkRate`]).
    tcp_moved: u64,
    /// A restore in progress: peers' held messages to collect first, frames to deliver after.
    restoring: Option<Restoring>,
}

/// While a restore waits for the messages peers held at the restored epoch (they send them
/// again first): what came, and the frames that followed, delivered once the restore is done.
#[derive(Default)]
pub(crate) struct Restoring {
    /// Per source, how many held messages it sends again.
    want: HashMap<usize, usize>,
    got: HashMap<usize, VecDeque<Held>>,
    deferred: Vec<(usize, Held)>,
}

/// A spinning rank first asks whether the machine is oversubscribed ([`crate::busy`]) after
/// this long with TCP peers, then every [`BUSY_EVERY`]: at once, i.e. at the first clock read
/// (after 32 idle passes), since an answer is reused for 100 µs and a TCP reply takes several
/// µs anyway. Beside one busy loop on 2 cores a first look at 5 µs left the pair spinning on
/// one core until then: interleaved `pingpong` over TCP, 10 rounds, one-way 0 B–4 KiB median
/// 15.3–16.4 µs with 5 µs, 9.7–10.2 µs at once, 32–35 µs at 20 µs (2026-11-27); quiet, the
/// best rounds were the same (4.0–4.1 µs at 0–512 B).
const BUSY_FIRST: Duration = Duration::ZERO;
/// The same when every peer shares memory. Later: beside one busy loop on 2 cores, ring waits
/// of tens of µs are common while both ranks still have a core (the loop takes one from time
/// to time), and cutting those short cost more than it saved. Interleaved `pingpong` beside a
/// busy loop, 7 rounds, one-way 64 KiB: 10 µs without the probe, 57 µs with a first look at
/// 5 µs, 68 at 50 µs, 10 at 200 µs (and 256 KiB–4 MiB 0.05–0.44× the time without the probe,
/// whose 500 µs spin the pair otherwise waits out on one core; 2026-11-27).
const BUSY_FIRST_SHM: Duration = Duration::from_micros(200);
const BUSY_EVERY: Duration = Duration::from_micros(20);

/// Whether the pass after the `yields`-th yield of a wait asks the kernel for socket events.
/// TCP peers need it after every yield (the yield phase advances the pass count in steps that
/// would otherwise skip every socket poll when TCP and shared-memory peers mix); peers on
/// shared memory use their sockets only for wake-ups (not needed while the rank yields: their
/// rings are read on every pass) and failure notices, so every 32nd yield. An `epoll_wait`
/// after each yield doubled the system calls of 4 ranks waiting on 2 cores.
fn sockets_after_yield(tcp_peers: bool, yields: u64) -> bool {
    tcp_peers || yields % 32 == 0
}

/// A wait reads its TCP peers' sockets directly ([`Engine::progress_direct`]) only with at
/// most this many TCP peers: a read each per pass, where one `epoll_wait` covers them all.
const DIRECT_MAX: usize = 4;
/// Every this many passes a wait that reads its sockets directly asks epoll all the same (for
/// writability, and to drain readiness it already acted on).
const DIRECT_EPOLL_EVERY: u32 = 16;

/// Passes of [`Engine::recv_fast`] over one ring before the general wait takes over (a few µs:
/// a ping-pong reply comes well within it; a late one is waited for the usual way).
const FAST_POLLS: u32 = 2048;
/// When ranks outnumber cores, [`Engine::recv_fast`] yields its core up to this many times
/// between looks at the ring before the general wait takes over. Each turn of the general wait
/// posts a request and passes over every peer; 4 ranks on 2 cores spent a quarter of their user
/// time there in an 8-byte allreduce.
const FAST_YIELDS: u32 = 16;
/// Every this many empty polls [`Engine::recv_fast`] asks whether the sender runs on our CPU.
const FAST_CPU_EVERY: u32 = 256;

/// A rank that shares its CPU with a shared-memory peer moves off it at most this often (a
/// move costs two system calls and a migration; the kernel may put the pair together again at
/// the next wake-up).
const MOVE_EVERY: Duration = Duration::from_millis(1);

/// Move the calling thread off `cpu` to another CPU of its affinity mask, and give it its mask
/// back (the kernel migrates a thread at once when its CPU leaves its mask, and does not move
/// it back when the CPU returns); returns the CPU it ran on in between. `None`, and nothing
/// changed, when the mask has no other CPU (`--bind-to core`, a one-CPU cpuset) or cannot be
/// read or set.
fn move_off_cpu(cpu: u32) -> Option<u32> {
    use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};
    let mask = sched_getaffinity(None).ok()?;
    let cpu = cpu as usize;
    if cpu >= CpuSet::MAX_CPU || !mask.is_set(cpu) || mask.count() < 2 {
        return None;
    }
    let mut others = mask;
    others.unset(cpu);
    sched_setaffinity(None, &others).ok()?;
    let now_on = current_cpu();
    // Restoring can only fail if the mask changed meanwhile (a cpuset shrank); the thread
    // then keeps the smaller mask the kernel allows.
    let _ = sched_setaffinity(None, &mask);
    now_on
}

/// The CPU the calling thread runs on now (`None` where the kernel cannot tell). A read of the
/// thread's restartable-sequence area (glibc 2.35+) or the vDSO: a few nanoseconds.
fn current_cpu() -> Option<u32> {
    // SAFETY: sched_getcpu has no preconditions; it returns -1 where it cannot tell.
    u32::try_from(unsafe { libc::sched_getcpu() }).ok()
}

/// Unexpected eager payloads from this size on get their buffer from the engine's pool.
const SPARE_MIN: usize = 64 * 1024;
/// How many such buffers the pool keeps (at most this many eager-limit-sized buffers: 8 MiB
/// with the default 2 MiB shared-memory eager limit).
const SPARE_KEEP: usize = 4;

/// How often [`Engine::poke`] reads the sockets of shared-memory peers.
const SHM_SOCKET_POLL: Duration = Duration::from_millis(1);

impl Engine {
    pub(crate) fn new(
        rank: usize,
        size: usize,
        mut peers: Vec<Peer>,
        tuning: Tuning,
    ) -> Result<Engine, Error> {
        let poll = if size > 1 {
            let poll = Poll::new()?;
            for (i, p) in peers.iter_mut().enumerate() {
                if let Some(s) = p.io.as_mut().and_then(|t| t.socket()) {
                    poll.registry().register(
                        s,
                        Token(i),
                        Interest::READABLE | Interest::WRITABLE,
                    )?;
                }
            }
            Some(poll)
        } else {
            None
        };
        let n_shm = peers.iter().filter(|p| p.is_shm()).count();
        let cma = tuning.cma;
        let n_sock = peers
            .iter()
            .filter(|p| p.io.as_ref().is_some_and(|t| t.socket_is_stream()))
            .count();
        Ok(Engine {
            rank,
            size,
            peers,
            poll,
            events: Events::with_capacity(256),
            posted: VecDeque::new(),
            unexpected: VecDeque::new(),
            spare: Vec::new(),
            recvs: Recvs::default(),
            slot_tainted: false,
            sends: IdMap::default(),
            next_id: 1,
            tuning,
            n_shm,
            n_sock,
            cma,
            _pmi: None,
            lost_poll: None,
            finalized: false,
            pokes: 0,
            last_socket_poll: Instant::now(),
            ckpt: None,
            launch: None,
            spawned_in: None,
            spawn_groups: Vec::new(),
            respawned: None,
            init_timings: None,
            base: size,
            scopes: HashMap::new(),
            comms: crate::ckpt::CommTable::default(),
            comm_handles: HashMap::new(),
            arrivals: 0,
            busy: crate::busy::BusyProbe::new(),
            yields: 0,
            sleeps: 0,
            cpu_cuts: 0,
            direct_passes: 0,
            epoll_passes: 0,
            last_move: None,
            moves: 0,
            spun: 0,
            tcp_moved: 0,
            restoring: None,
        })
    }

    /// Any-source receives on `ctx` (either of a communicator's two contexts) fail when
    /// exactly the ranks in `members` fail.
    pub(crate) fn scope(&mut self, ctx: u64, members: Vec<usize>) {
        self.scopes.insert(ctx & !1, members);
    }

    /// Whether `ctx`'s communicator is a scoped (spawn) one.
    pub(crate) fn scoped(&self, ctx: u64) -> bool {
        self.scopes.contains_key(&(ctx & !1))
    }

    /// Whether `peer`'s failure fails an any-source receive on `ctx`.
    fn failure_counts(&self, ctx: u64, peer: usize) -> bool {
        match self.scopes.get(&(ctx & !1)) {
            Some(m) => m.contains(&peer),
            None => peer < self.base,
        }
    }

    /// Add channels to world ranks after start-up (a spawn): `peers` grows to cover them,
    /// world ranks in between that this process cannot reach are [`PeerState::Unconnected`].
    pub(crate) fn add_peers(&mut self, new: Vec<(usize, Box<dyn Transport>)>) -> Result<(), Error> {
        if self.poll.is_none() {
            self.poll = Some(Poll::new()?);
        }
        for (rank, _) in &new {
            match self.peers.get(*rank).map(|p| &p.state) {
                None | Some(PeerState::Unconnected) => {}
                Some(_) => {
                    return Err(Error::Invalid(format!(
                        "world rank {rank} is already connected to this process"
                    )))
                }
            }
        }
        for (rank, mut io) in new {
            while self.peers.len() <= rank {
                self.peers.push(Peer::unconnected());
            }
            if let (Some(s), Some(poll)) = (io.socket(), self.poll.as_ref()) {
                poll.registry().register(
                    s,
                    Token(rank),
                    Interest::READABLE | Interest::WRITABLE,
                )?;
            }
            if io.socket_is_stream() {
                self.n_sock += 1;
            } else {
                self.n_shm += 1;
            }
            self.peers[rank] = Peer::new(Some(io));
        }
        Ok(())
    }

    fn new_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn check_peer(&self, peer: usize) -> Result<(), Error> {
        match &self.peers.get(peer).map(|p| &p.state) {
            None => Err(Error::Invalid(format!(
                "rank {peer} does not exist (the job has {} ranks)",
                self.peers.len()
            ))),
            Some(PeerState::Alive) => Ok(()),
            Some(PeerState::Finalized) => Err(Error::PeerFinalized(peer)),
            Some(PeerState::Failed(why)) => Err(Error::PeerFailed {
                rank: peer,
                reason: why.clone(),
            }),
            Some(PeerState::Unconnected) => Err(Error::Invalid(format!(
                "world rank {peer} is not connected to this process: a spawned rank reaches only \
                 its parent and its siblings, a parent only its own children"
            ))),
        }
    }

    // ---------------------------------------------------------------- sends

    /// Start a send. Small messages are written (or queued) at once and complete immediately.
    pub(crate) fn start_send(
        &mut self,
        peer: usize,
        ctx: u64,
        tag: i32,
        data: SendData,
    ) -> Result<u64, Error> {
        self.start_send_capped(peer, ctx, tag, data, usize::MAX)
    }

    /// [`Engine::start_send`] with the eager limit lowered to `eager_cap`: a larger message
    /// goes by rendezvous (a single cross-memory copy to a same-host peer).
    pub(crate) fn start_send_capped(
        &mut self,
        peer: usize,
        ctx: u64,
        tag: i32,
        data: SendData,
        eager_cap: usize,
    ) -> Result<u64, Error> {
        self.send_inner(
            peer,
            ctx,
            tag,
            data,
            SendOpts {
                eager_cap,
                ..SendOpts::REQUEST
            },
        )
        .map(|id| id.unwrap_or(0))
    }

    /// Whether the collectives should prefer single copies to shared-memory peers: ranks
    /// outnumber the cores and cross-memory copies are allowed.
    pub(crate) fn prefers_single_copy(&self) -> bool {
        self.tuning.outnumbered && self.cma
    }

    /// Start the send of a blocking call: `None` when it is already complete (a small message
    /// written or queued, copied), which then needs no request; else its id, as `start_send`.
    pub(crate) fn start_send_blocking(
        &mut self,
        peer: usize,
        ctx: u64,
        tag: i32,
        data: SendData,
    ) -> Result<Option<u64>, Error> {
        self.send_inner(
            peer,
            ctx,
            tag,
            data,
            SendOpts {
                track_eager: false,
                ..SendOpts::REQUEST
            },
        )
    }

    fn send_inner(
        &mut self,
        peer: usize,
        ctx: u64,
        tag: i32,
        data: SendData,
        opts: SendOpts,
    ) -> Result<Option<u64>, Error> {
        let SendOpts {
            track_eager,
            cma_ok,
            eager_cap,
        } = opts;
        if self.finalized {
            return Err(Error::Invalid("send after finalize".into()));
        }
        let len = data.bytes().len();
        if peer == self.rank {
            self.check_peer(peer)?;
            let bytes = data.bytes().to_vec();
            self.deliver_local(ctx, tag, bytes);
            if !track_eager {
                return Ok(None);
            }
            let id = self.new_id();
            let mut sd = done_send(peer, data);
            sd.meta = (ctx, tag, 1);
            self.sends.insert(id, sd);
            return Ok(Some(id));
        }
        self.check_peer(peer)?;
        let shm = self.peers[peer].shm;
        let eager_limit = if shm {
            self.tuning.shm_eager_limit
        } else {
            self.tuning.eager_limit
        }
        .min(eager_cap);
        if len <= eager_limit {
            let hdr = Header {
                kind: Kind::Eager,
                tag,
                ctx,
                len: len as u64,
                id: 0,
            };
            self.write_or_queue(peer, hdr, data.bytes())?;
            if !track_eager {
                return Ok(None);
            }
            let id = self.new_id();
            let mut sd = done_send(peer, data);
            sd.meta = (ctx, tag, 1);
            self.sends.insert(id, sd);
            Ok(Some(id))
        } else {
            let id = self.new_id();
            let cma = shm && self.cma && cma_ok;
            let hdr = Header {
                kind: if cma { Kind::RtsCma } else { Kind::Rts },
                tag,
                ctx,
                len: len as u64,
                id,
            };
            let mut info = [0u8; 16];
            info[..8].copy_from_slice(&(data.bytes().as_ptr() as u64).to_le_bytes());
            info[8..].copy_from_slice(&u64::from(std::process::id()).to_le_bytes());
            self.sends.insert(
                id,
                Send {
                    peer,
                    data,
                    state: SendState::WaitCts,
                    err: None,
                    detached: false,
                    meta: (ctx, tag, 1),
                    rdv: true,
                    acked: None,
                },
            );
            let payload: &[u8] = if cma { &info } else { &[] };
            self.write_or_queue(peer, hdr, payload)?;
            Ok(Some(id))
        }
    }

    /// Write a frame with its payload now if the connection is idle; queue the rest (copied).
    fn write_or_queue(&mut self, peer: usize, hdr: Header, payload: &[u8]) -> Result<(), Error> {
        let h = hdr.encode();
        let p = &mut self.peers[peer];
        let mut written = 0;
        if p.txq.is_empty() {
            match raw_write(&mut p.io, &[IoSlice::new(&h), IoSlice::new(payload)]) {
                Ok(n) => {
                    written = n;
                    if !p.shm {
                        self.tcp_moved += n as u64;
                    }
                }
                Err(why) => {
                    self.fail_peer(peer, why);
                    return self.check_peer(peer);
                }
            }
        }
        let total = HEADER_LEN + payload.len();
        if written < total {
            let pay = if written > HEADER_LEN {
                payload[written - HEADER_LEN..].to_vec()
            } else {
                payload.to_vec()
            };
            let (pos, pay) = if written > HEADER_LEN {
                // Header done: keep only the rest of the payload, as a header-less frame.
                (HEADER_LEN, pay)
            } else {
                (written, pay)
            };
            p.txq.push_back(Out {
                hdr: h,
                pos,
                payload: if pay.is_empty() {
                    OutPayload::None
                } else {
                    OutPayload::Owned(pay)
                },
            });
        }
        Ok(())
    }

    fn queue_frame(&mut self, peer: usize, hdr: Header, payload: OutPayload) {
        self.peers[peer].txq.push_back(Out {
            hdr: hdr.encode(),
            pos: 0,
            payload,
        });
    }

    /// Write queued frames of `peer` until the connection would block.
    fn flush(&mut self, peer: usize) -> bool {
        let mut did = false;
        loop {
            let p = &mut self.peers[peer];
            let Some(out) = p.txq.front_mut() else {
                break;
            };
            let payload: &[u8] = match &out.payload {
                OutPayload::None => &[],
                OutPayload::Owned(v) => v,
                OutPayload::Send(id) => match self.sends.get(id) {
                    Some(s) => s.data.bytes(),
                    None => &[],
                },
            };
            let total = HEADER_LEN + payload.len();
            let res = if out.pos < HEADER_LEN {
                raw_write(
                    &mut p.io,
                    &[IoSlice::new(&out.hdr[out.pos..]), IoSlice::new(payload)],
                )
            } else {
                raw_write(&mut p.io, &[IoSlice::new(&payload[out.pos - HEADER_LEN..])])
            };
            match res {
                Ok(0) => break,
                Ok(n) => {
                    did = true;
                    if !p.shm {
                        self.tcp_moved += n as u64;
                    }
                    out.pos += n;
                    if out.pos == total {
                        let out = p.txq.pop_front().expect("front exists");
                        if let OutPayload::Send(id) = out.payload {
                            self.send_done(id);
                        }
                    }
                }
                Err(why) => {
                    self.fail_peer(peer, why);
                    break;
                }
            }
        }
        did
    }

    fn send_done(&mut self, id: u64) {
        if let Some(s) = self.sends.get_mut(&id) {
            s.state = SendState::Done;
            if s.detached {
                if let Some(s) = self.sends.remove(&id) {
                    self.keep_if_held(id, &s);
                }
            }
        }
    }

    /// Send `id` leaves the engine (waited for, or dropped and finished): if a checkpoint of
    /// the active wave, not yet snapshotted here, must hold its message (its receiver matched
    /// it after its cut), keep a copy for that snapshot.
    fn keep_if_held(&mut self, id: u64, s: &Send) {
        let Some(Some(e)) = s.acked else { return };
        if !s.rdv || s.err.is_some() {
            return;
        }
        let Some(c) = self.ckpt.as_mut() else { return };
        if c.wave.before_snapshot() != Some(e) {
            return;
        }
        let (ctx, tag, elem) = s.meta;
        c.gone_held.push((
            e,
            id,
            crate::ckpt::SavedRequest {
                ctx,
                elem,
                state: crate::ckpt::SavedRequestState::Held {
                    dest: s.peer as u32,
                    tag,
                    buf: s.data.bytes().to_vec(),
                    waited: true,
                },
            },
        ));
    }

    // ---------------------------------------------------------------- receives

    /// Post a receive; matches the oldest unexpected message first.
    pub(crate) fn post_recv(
        &mut self,
        ctx: u64,
        src: Option<usize>,
        tag: Option<i32>,
        dest: Dest,
    ) -> Result<u64, Error> {
        self.post_recv_inner(ctx, src, tag, dest, false)
    }

    /// Post the receive of a blocking call (taken out again before the call returns, by
    /// `take_recv` and `forget_recv`): it lives in the receive slot, not the map.
    pub(crate) fn post_recv_blocking(
        &mut self,
        ctx: u64,
        src: Option<usize>,
        tag: Option<i32>,
        dest: Dest,
    ) -> Result<u64, Error> {
        self.post_recv_inner(ctx, src, tag, dest, true)
    }

    fn post_recv_inner(
        &mut self,
        ctx: u64,
        src: Option<usize>,
        tag: Option<i32>,
        dest: Dest,
        blocking: bool,
    ) -> Result<u64, Error> {
        if let Some(s) = src {
            if s >= self.peers.len() {
                return Err(Error::Invalid(format!(
                    "source rank {s} does not exist (the job has {} ranks)",
                    self.peers.len()
                )));
            }
        }
        let id = if blocking && !self.slot_tainted && self.recvs.slot.is_none() {
            BLOCKING
        } else {
            self.new_id()
        };
        let alloc = matches!(dest, Dest::Alloc(_));
        let mut r = Recv {
            ctx,
            src,
            tag,
            dest,
            len: 0,
            state: RecvState::Posted,
            status: None,
            err: None,
            detached: false,
            elem: 1,
            alloc,
            after_cut: None,
        };
        let found = if self.unexpected.is_empty() {
            None
        } else {
            self.unexpected
                .iter()
                .position(|u| matches(&r, u.peer, u.ctx, u.tag))
        };
        if let Some(i) = found {
            let u = self.unexpected.remove(i).expect("index from position");
            let status = Status {
                source: u.peer,
                tag: u.tag,
                bytes: match &u.body {
                    UnexBody::Eager(v) => v.len(),
                    UnexBody::Rts { len, .. } => *len,
                },
            };
            r.status = Some(status);
            match u.body {
                UnexBody::Eager(v) => {
                    match r.bind(v.len()) {
                        Ok(()) => r.slice_mut()[..v.len()].copy_from_slice(&v),
                        Err(e) => r.err = Some(e),
                    }
                    r.state = RecvState::Done;
                    self.recycle(v);
                }
                UnexBody::Rts { send_id, len, cma } => {
                    self.recvs.insert(id, r);
                    self.rendezvous_matched(u.peer, id, send_id, len, cma);
                    return Ok(id);
                }
            }
            self.recvs.insert(id, r);
            return Ok(id);
        }
        // Nothing buffered: fail at once if the source can never send.
        let dead = match src {
            Some(s) => self.check_peer(s).err(),
            None => self.any_failed(ctx),
        };
        if let Some(e) = dead {
            r.err = Some(e);
            r.state = RecvState::Done;
        } else {
            self.posted.push_back(id);
        }
        self.recvs.insert(id, r);
        Ok(id)
    }

    fn any_failed(&self, ctx: u64) -> Option<Error> {
        self.peers
            .iter()
            .enumerate()
            .find_map(|(i, p)| match &p.state {
                PeerState::Failed(why) if self.failure_counts(ctx, i) => Some(Error::PeerFailed {
                    rank: i,
                    reason: why.clone(),
                }),
                _ => None,
            })
    }

    /// A ready-to-send arrived: match it now or keep it as unexpected (header only).
    fn on_rts(&mut self, peer: usize, hdr: Header, len: usize, cma: Option<(u64, i32)>) {
        self.arrivals += 1;
        let seq = self.arrivals;
        match self.match_posted(peer, hdr.ctx, hdr.tag) {
            Some(id) => {
                // Matched between this rank's cut and its snapshot: after the cut, so its
                // sender holds it (no clear-to-send came before this rank's cut marker).
                let after_cut = self
                    .ckpt
                    .as_ref()
                    .and_then(|c| c.wave.cut_not_snapshot())
                    .map(|e| (e, seq));
                if let Some(r) = self.recvs.get_mut(&id) {
                    r.status = Some(Status {
                        source: peer,
                        tag: hdr.tag,
                        bytes: len,
                    });
                    r.after_cut = after_cut;
                }
                self.rendezvous_matched(peer, id, hdr.id, len, cma);
            }
            None => self
                .unexpected
                .push_back(Unexpected::announced(peer, hdr, len, cma, seq)),
        }
    }

    /// Receive `recv_id` matched the large message `send_id` of `peer`: copy it straight out of
    /// the sender's memory when possible (one copy, no streaming), else ask for it (CTS).
    fn rendezvous_matched(
        &mut self,
        peer: usize,
        recv_id: u64,
        send_id: u64,
        len: usize,
        cma: Option<(u64, i32)>,
    ) {
        let Some(r) = self.recvs.get_mut(&recv_id) else {
            return;
        };
        if let Err(e) = r.bind(len) {
            // Take the data into the void so the sender completes; the receive reports the error.
            r.err = Some(e);
            r.dest = Dest::Alloc(discard_alloc);
            r.len = len;
            r.state = RecvState::Receiving;
            self.send_cts(peer, send_id, recv_id);
            return;
        }
        r.state = RecvState::Receiving;
        if let Some((addr, pid)) = cma {
            if cma_copy(pid, addr, &mut r.slice_mut()[..len]) {
                self.recv_done(recv_id);
                let fin = Header {
                    kind: Kind::Fin,
                    tag: 0,
                    ctx: 0,
                    len: 0,
                    id: send_id,
                };
                self.queue_frame(peer, fin, OutPayload::None);
                self.flush(peer);
                return;
            }
        }
        self.send_cts(peer, send_id, recv_id);
    }

    fn send_cts(&mut self, peer: usize, send_id: u64, recv_id: u64) {
        let hdr = Header {
            kind: Kind::Cts,
            tag: 0,
            ctx: 0,
            len: recv_id,
            id: send_id,
        };
        self.queue_frame(peer, hdr, OutPayload::None);
        self.flush(peer);
    }

    fn match_posted(&mut self, peer: usize, ctx: u64, tag: i32) -> Option<u64> {
        let recvs = &self.recvs;
        let i = self
            .posted
            .iter()
            .position(|id| recvs.get(id).is_some_and(|r| matches(r, peer, ctx, tag)))?;
        if i == 0 {
            self.posted.pop_front()
        } else {
            self.posted.remove(i)
        }
    }

    /// A message to ourselves: match or buffer at once.
    fn deliver_local(&mut self, ctx: u64, tag: i32, bytes: Vec<u8>) {
        let me = self.rank;
        self.deliver_eager(me, ctx, tag, bytes);
    }

    fn deliver_eager(&mut self, peer: usize, ctx: u64, tag: i32, bytes: Vec<u8>) {
        self.arrivals += 1;
        if let Some(id) = self.match_posted(peer, ctx, tag) {
            if let Some(r) = self.recvs.get_mut(&id) {
                r.status = Some(Status {
                    source: peer,
                    tag,
                    bytes: bytes.len(),
                });
                match r.bind(bytes.len()) {
                    Ok(()) => r.slice_mut()[..bytes.len()].copy_from_slice(&bytes),
                    Err(e) => r.err = Some(e),
                }
                self.recv_done(id);
            }
            self.recycle(bytes);
        } else {
            self.unexpected.push_back(Unexpected {
                peer,
                ctx,
                tag,
                body: UnexBody::Eager(bytes),
                seq: self.arrivals,
            });
        }
    }

    /// A buffer for an unexpected eager message of `len` bytes. Large ones reuse the buffer of
    /// an earlier one: a fresh allocation of that size is a fresh mapping, and filling it from
    /// the ring cost a page fault per 4 KiB (a quarter of the time of a 4-rank allreduce of
    /// 4 MiB, whose ring steps often arrive before their receive is posted). A reused buffer is
    /// not zeroed: the payload overwrites all of it before anyone reads it.
    fn unexpected_buf(&mut self, len: usize) -> Vec<u8> {
        if len >= SPARE_MIN {
            if let Some(i) = self.spare.iter().position(|v| v.capacity() >= len) {
                let mut v = self.spare.swap_remove(i);
                v.resize(len, 0);
                return v;
            }
        }
        vec![0u8; len]
    }

    /// Keep the buffer of a delivered unexpected message for [`Engine::unexpected_buf`].
    fn recycle(&mut self, v: Vec<u8>) {
        if v.capacity() < SPARE_MIN {
            return;
        }
        if self.spare.len() == SPARE_KEEP {
            // Keep the larger buffers: drop the smallest.
            let (i, _) = self
                .spare
                .iter()
                .enumerate()
                .min_by_key(|(_, b)| b.capacity())
                .expect("the pool is full, so not empty");
            if self.spare[i].capacity() >= v.capacity() {
                return;
            }
            self.spare.swap_remove(i);
        }
        self.spare.push(v);
    }

    fn recv_done(&mut self, id: u64) {
        if let Some(r) = self.recvs.get_mut(&id) {
            r.state = RecvState::Done;
            if r.detached {
                self.recvs.remove(&id);
            }
        }
    }

    /// Is there a matching message already here? (probe)
    pub(crate) fn iprobe(&self, ctx: u64, src: Option<usize>, tag: Option<i32>) -> Option<Status> {
        let probe = Recv {
            ctx,
            src,
            tag,
            dest: Dest::Alloc(discard_alloc),
            len: 0,
            state: RecvState::Posted,
            status: None,
            err: None,
            detached: false,
            elem: 1,
            alloc: true,
            after_cut: None,
        };
        self.unexpected
            .iter()
            .find(|u| matches(&probe, u.peer, u.ctx, u.tag))
            .map(|u| Status {
                source: u.peer,
                tag: u.tag,
                bytes: match &u.body {
                    UnexBody::Eager(v) => v.len(),
                    UnexBody::Rts { len, .. } => *len,
                },
            })
    }

    // ---------------------------------------------------------------- input

    /// Process every byte available from `peer`. Returns whether anything was read.
    fn read_peer(&mut self, peer: usize) -> bool {
        let mut did = false;
        loop {
            match self.step_input(peer) {
                Ok(true) => did = true,
                Ok(false) => break,
                Err(why) => {
                    if self.peers[peer].state == PeerState::Alive {
                        let kind = self.peers[peer].io.as_ref().map_or("", |t| t.kind());
                        self.fail_peer(peer, format!("{kind} link: {why}"));
                    }
                    break;
                }
            }
        }
        did
    }

    /// Make one step of progress on `peer`'s input; Ok(false) = nothing available.
    fn step_input(&mut self, peer: usize) -> Result<bool, String> {
        if self.peers[peer].state != PeerState::Alive {
            return Ok(false);
        }
        let p = &mut self.peers[peer];
        match &mut p.rx {
            Rx::Header => {
                let have = p.stage_end - p.stage_start;
                if have < HEADER_LEN {
                    if p.stage_start > 0 {
                        p.stage.copy_within(p.stage_start..p.stage_end, 0);
                        p.stage_end = have;
                        p.stage_start = 0;
                    }
                    let n = raw_read(&mut p.io, &mut p.stage[p.stage_end..])?;
                    if n == 0 {
                        return Ok(false);
                    }
                    if !p.shm {
                        self.tcp_moved += n as u64;
                    }
                    p.stage_end += n;
                    return Ok(true);
                }
                let hdr = Header::decode(&p.stage[p.stage_start..p.stage_start + HEADER_LEN])
                    .map_err(|e| format!("protocol error: {e}"))?;
                p.stage_start += HEADER_LEN;
                self.on_header(peer, hdr)?;
                Ok(true)
            }
            Rx::Payload { .. } => self.step_payload(peer),
        }
    }

    fn on_header(&mut self, peer: usize, hdr: Header) -> Result<(), String> {
        match hdr.kind {
            Kind::Eager => {
                let len = usize::try_from(hdr.len).map_err(|_| "message too large".to_string())?;
                let held = self.ckpt.as_ref().is_some_and(|c| c.wave.diverts(peer));
                let posted = if held {
                    None
                } else {
                    self.match_posted(peer, hdr.ctx, hdr.tag)
                };
                let target = match posted {
                    Some(id) => {
                        let r = self.recvs.get_mut(&id).expect("posted ids are live");
                        r.status = Some(Status {
                            source: peer,
                            tag: hdr.tag,
                            bytes: len,
                        });
                        match r.bind(len) {
                            Ok(()) => {
                                r.state = RecvState::Receiving;
                                Target::Recv(id, 0)
                            }
                            Err(e) => {
                                r.err = Some(e);
                                self.recv_done(id);
                                Target::Discard
                            }
                        }
                    }
                    None => Target::Unexpected(self.unexpected_buf(len), 0),
                };
                self.peers[peer].rx = Rx::Payload {
                    remaining: len,
                    target,
                    hdr,
                };
                if len == 0 {
                    self.payload_complete(peer);
                }
            }
            Kind::Rts => {
                let len = usize::try_from(hdr.len).map_err(|_| "message too large".to_string())?;
                self.arrive(peer, Held::Rts(hdr, len, None));
            }
            Kind::RtsCma => {
                // The 16-byte payload (address, pid) follows; handled in `payload_complete`.
                self.peers[peer].rx = Rx::Payload {
                    remaining: 16,
                    target: Target::Unexpected(vec![0u8; 16], 0),
                    hdr,
                };
            }
            Kind::Fin => {
                let send_id = hdr.id;
                match self.sends.get(&send_id) {
                    Some(s) if s.peer == peer && s.state == SendState::WaitCts => {
                        self.on_ack(peer, send_id);
                        self.send_done(send_id)
                    }
                    _ => return Err(format!("unexpected FIN for send {send_id}")),
                }
            }
            Kind::Cts => {
                let send_id = hdr.id;
                let recv_id = hdr.len;
                let Some(s) = self.sends.get_mut(&send_id) else {
                    return Err(format!("CTS for unknown send {send_id}"));
                };
                if s.peer != peer || s.state != SendState::WaitCts {
                    return Err(format!("unexpected CTS for send {send_id}"));
                }
                s.state = SendState::Streaming;
                self.on_ack(peer, send_id);
                let Some(s) = self.sends.get_mut(&send_id) else {
                    return Err(format!("CTS for unknown send {send_id}"));
                };
                let len = s.data.bytes().len() as u64;
                self.queue_frame(
                    peer,
                    Header {
                        kind: Kind::Data,
                        tag: 0,
                        ctx: 0,
                        len,
                        id: recv_id,
                    },
                    OutPayload::Send(send_id),
                );
                self.flush(peer);
            }
            Kind::Data => {
                let len = usize::try_from(hdr.len).map_err(|_| "message too large".to_string())?;
                let id = hdr.id;
                let ok = self.recvs.get(&id).is_some_and(|r| {
                    r.state == RecvState::Receiving && r.status.map(|s| s.source) == Some(peer)
                });
                if !ok {
                    return Err(format!("DATA for unknown receive {id}"));
                }
                let r = self.recvs.get_mut(&id).expect("checked");
                if len != r.len {
                    return Err(format!("DATA of {len} bytes for a {}-byte message", r.len));
                }
                let target = if r.slice_mut().len() >= len {
                    Target::Recv(id, 0)
                } else {
                    Target::Discard
                };
                self.peers[peer].rx = Rx::Payload {
                    remaining: len,
                    target,
                    hdr,
                };
                if len == 0 {
                    self.payload_complete(peer);
                }
            }
            Kind::Bye => {
                self.peers[peer].state = PeerState::Finalized;
                self.fail_ops_of(peer);
                self.ckpt_peer_gone(peer, false);
            }
            Kind::Marker => {
                let m = hdr.to_marker()?;
                let Some(c) = self.ckpt.as_mut() else {
                    return Err(
                        "a checkpoint marker arrived but this rank takes no checkpoints: \
                         every rank of a job must see the same MUTIRAO_CKPT_* settings"
                            .into(),
                    );
                };
                let now = c.clock0.elapsed();
                let fx = c.wave.on_marker(peer, m, now);
                self.apply_ckpt(fx);
                self.ckpt_finish();
            }
        }
        Ok(())
    }

    fn step_payload(&mut self, peer: usize) -> Result<bool, String> {
        let p = &mut self.peers[peer];
        let Rx::Payload {
            remaining, target, ..
        } = &mut p.rx
        else {
            return Ok(false);
        };
        let want = *remaining;
        // Destination slice for the next bytes.
        let mut scratch = [0u8; 0];
        let mut discard_buf;
        let dst: &mut [u8] = match target {
            Target::Recv(id, off) => match self.recvs.get_mut(id) {
                Some(r) => &mut r.slice_mut()[*off..*off + want],
                None => {
                    *target = Target::Discard;
                    &mut scratch
                }
            },
            Target::Unexpected(v, off) => &mut v[*off..*off + want],
            Target::Discard => {
                discard_buf = vec![0u8; want.min(STAGE)];
                &mut discard_buf
            }
        };
        if dst.is_empty() && want > 0 {
            return Ok(true); // target switched to Discard; next step handles it
        }
        // Take staged bytes first, then read straight into the destination.
        let staged = p.stage_end - p.stage_start;
        let n = if staged > 0 {
            let n = staged.min(dst.len());
            dst[..n].copy_from_slice(&p.stage[p.stage_start..p.stage_start + n]);
            p.stage_start += n;
            n
        } else if dst.len() < 1024 {
            // Small remainder: read through the stage to pick up following frames too.
            let got = raw_read(&mut p.io, &mut p.stage[..])?;
            p.stage_start = 0;
            p.stage_end = got;
            if got == 0 {
                return Ok(false);
            }
            if !p.shm {
                self.tcp_moved += got as u64;
            }
            return Ok(true);
        } else {
            let n = raw_read(&mut p.io, dst)?;
            if n == 0 {
                return Ok(false);
            }
            if !p.shm {
                self.tcp_moved += n as u64;
            }
            n
        };
        match target {
            Target::Recv(_, off) | Target::Unexpected(_, off) => *off += n,
            Target::Discard => {}
        }
        *remaining -= n;
        if *remaining == 0 {
            self.payload_complete(peer);
        }
        Ok(true)
    }

    fn payload_complete(&mut self, peer: usize) {
        let rx = std::mem::replace(&mut self.peers[peer].rx, Rx::Header);
        let Rx::Payload { target, hdr, .. } = rx else {
            return;
        };
        match target {
            Target::Recv(id, _) => self.recv_done(id),
            Target::Unexpected(v, _) if hdr.kind == Kind::RtsCma => {
                let word = |i: usize| {
                    let mut a = [0u8; 8];
                    a.copy_from_slice(&v[i..i + 8]);
                    u64::from_le_bytes(a)
                };
                let (addr, pid) = (word(0), word(8) as i32);
                let len = usize::try_from(hdr.len).unwrap_or(usize::MAX);
                self.arrive(peer, Held::Rts(hdr, len, Some((addr, pid))));
            }
            Target::Unexpected(v, _) => self.arrive(peer, Held::Eager(hdr.ctx, hdr.tag, v)),
            Target::Discard => {
                if hdr.kind == Kind::Data {
                    self.recv_done(hdr.id);
                }
            }
        }
    }

    // ---------------------------------------------------------------- failures

    /// Mark `peer` failed and fail everything that needs it.
    pub(crate) fn fail_peer(&mut self, peer: usize, why: String) {
        if let Some(p) = self.peers.get_mut(peer) {
            match p.state {
                PeerState::Failed(_) => return,
                PeerState::Finalized => {
                    // It said goodbye and has now closed: nothing more can reach it.
                    p.txq.clear();
                    return;
                }
                PeerState::Unconnected => return,
                PeerState::Alive => {}
            }
            p.state = PeerState::Failed(why.clone());
            p.txq.clear();
            p.rx = Rx::Header;
            if let Some(t) = p.io.as_mut() {
                if let (Some(s), Some(poll)) = (t.socket(), self.poll.as_ref()) {
                    let _ = poll.registry().deregister(s);
                }
                t.close_socket();
            }
            // Tell the launcher (digest 004 §15.4 step 1), when checkpoints make recovery
            // possible; a launcher that is gone changes nothing here.
            if self.ckpt.is_some() {
                if let Some(pmi) = self._pmi.as_mut() {
                    let _ = pmi.report_failure(peer as u32, &why, Duration::from_secs(2));
                }
            }
        }
        self.fail_ops_of(peer);
        self.ckpt_peer_gone(peer, true);
    }

    /// A blocked wait, at most once per `MUTIRAO_LOST_POLL_MS`: ask the launcher which ranks it
    /// has declared lost, and fail those still taken as alive here (a host cut off closes no
    /// socket, so nothing else would ever tell). A launcher that does not answer changes
    /// nothing (its own loss is the agent's business).
    fn ask_lost(&mut self) {
        let Some((every, last)) = self.lost_poll else {
            return;
        };
        let now = Instant::now();
        if now.saturating_duration_since(last) < every {
            return;
        }
        self.lost_poll = Some((every, now));
        let Some(pmi) = self._pmi.as_mut() else {
            return;
        };
        let Ok(lost) = pmi.lost_ranks(Duration::from_secs(2)) else {
            return;
        };
        for r in lost {
            let r = r as usize;
            if r != self.rank
                && self
                    .peers
                    .get(r)
                    .is_some_and(|p| p.state == PeerState::Alive)
            {
                self.fail_peer(
                    r,
                    "the launcher lost its host (no heartbeat from its agent); the job goes on \
                     without it"
                        .into(),
                );
            }
        }
    }

    /// Fail pending operations that can no longer complete because `peer` is gone.
    fn fail_ops_of(&mut self, peer: usize) {
        let err = match self.check_peer(peer) {
            Err(e) => e,
            Ok(()) => return,
        };
        let failed = matches!(self.peers[peer].state, PeerState::Failed(_));
        // Receives posted for this source (or any source, ULFM's rule, if it failed).
        let mut keep = VecDeque::new();
        while let Some(id) = self.posted.pop_front() {
            let hit = self.recvs.get(&id).is_some_and(|r| {
                r.src == Some(peer)
                    || (failed && r.src.is_none() && self.failure_counts(r.ctx, peer))
            });
            if hit {
                if let Some(r) = self.recvs.get_mut(&id) {
                    r.err = Some(err.clone());
                }
                self.recv_done(id);
            } else {
                keep.push_back(id);
            }
        }
        self.posted = keep;
        // Receives in progress from it.
        let ids: Vec<u64> = self
            .recvs
            .iter()
            .filter(|(_, r)| {
                r.state == RecvState::Receiving && r.status.map(|s| s.source) == Some(peer)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            if let Some(r) = self.recvs.get_mut(&id) {
                r.err = Some(err.clone());
            }
            self.recv_done(id);
        }
        // Sends to it that are not finished.
        let ids: Vec<u64> = self
            .sends
            .iter()
            .filter(|(_, s)| s.peer == peer && s.state != SendState::Done)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            if let Some(s) = self.sends.get_mut(&id) {
                s.err = Some(err.clone());
            }
            self.send_done(id);
        }
    }

    // ---------------------------------------------------------------- progress

    /// One non-blocking pass over every connection. `sockets`: also ask the kernel for socket events.
    fn progress_once(&mut self, sockets: bool) -> Result<bool, Error> {
        let mut did = false;
        if self.ckpt.is_some() {
            self.ckpt_tick();
        }
        if self.n_shm > 0 {
            for i in 0..self.peers.len() {
                let p = &self.peers[i];
                if p.state == PeerState::Alive
                    && (p.io.as_ref().is_some_and(|t| t.ready_hint())
                        || p.stage_end > p.stage_start)
                {
                    did |= self.read_peer(i);
                }
            }
        }
        if sockets {
            did |= self.poll_sockets(Some(Duration::ZERO))?;
        }
        for i in 0..self.peers.len() {
            if !self.peers[i].txq.is_empty() {
                did |= self.flush(i);
            }
        }
        Ok(did)
    }

    fn poll_sockets(&mut self, timeout: Option<Duration>) -> Result<bool, Error> {
        let Some(poll) = self.poll.as_mut() else {
            return Ok(false);
        };
        self.last_socket_poll = Instant::now();
        match poll.poll(&mut self.events, timeout) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return Ok(false),
            Err(e) => return Err(e.into()),
        }
        let mut did = false;
        let evs: Vec<(usize, bool, bool, bool)> = self
            .events
            .iter()
            .map(|e| {
                let closed = e.is_read_closed() || e.is_error();
                (
                    e.token().0,
                    e.is_readable() || closed,
                    closed,
                    e.is_writable(),
                )
            })
            .collect();
        for (i, r, closed, w) in evs {
            let Some(p) = self.peers.get_mut(i) else {
                continue;
            };
            let Some(t) = p.io.as_mut() else {
                continue;
            };
            if w {
                t.on_writable();
            }
            if r {
                let shm = !t.socket_is_stream();
                let alive = t.on_readable(closed);
                // Whatever the stream still holds (maybe a BYE) counts before a close.
                did |= self.read_peer(i);
                did |= shm;
                if let Err(why) = alive {
                    self.close_socket(i);
                    if self.peers[i].state == PeerState::Alive {
                        self.fail_peer(i, why);
                    }
                }
            }
        }
        Ok(did)
    }

    fn close_socket(&mut self, i: usize) {
        if let Some(t) = self.peers[i].io.as_mut() {
            if let (Some(s), Some(poll)) = (t.socket(), self.poll.as_ref()) {
                let _ = poll.registry().deregister(s);
            }
            t.close_socket();
        }
    }

    /// The eager limit towards TCP peers if any rank of `group` (world ranks) other than this
    /// one is reached over TCP; `None` when all of them are shared-memory peers.
    pub(crate) fn tcp_eager_limit_among(&self, group: &[usize]) -> Option<usize> {
        group
            .iter()
            .any(|&w| w != self.rank && self.peers.get(w).is_some_and(|p| !p.shm))
            .then_some(self.tuning.eager_limit)
    }

    /// Whether every rank of `group` (world ranks) other than this one said at start-up that
    /// it runs on this rank's host.
    pub(crate) fn all_on_this_host(&self, group: &[usize]) -> bool {
        group
            .iter()
            .all(|&w| w == self.rank || self.peers.get(w).is_some_and(|p| p.same_host))
    }

    /// Whether a message of `len` bytes to or from world rank `peer` goes eagerly (its send
    /// completes without the receiver: written to the link or queued, copied).
    pub(crate) fn eager_with(&self, peer: usize, len: usize) -> bool {
        self.peers.get(peer).is_some_and(|p| {
            len <= if p.shm {
                self.tuning.shm_eager_limit
            } else {
                self.tuning.eager_limit
            }
        })
    }

    /// The blocking receive's fast path: a receive from one shared-memory peer, with nothing else
    /// in flight in this process (no request, no queued frame, no unexpected message, no
    /// checkpoint waves), polls that peer's ring for up to [`FAST_POLLS`] passes and takes a
    /// matching eager message straight into `buf` — no request, no staging copy, no pass over the
    /// other peers. `None`: not taken; the caller posts the receive and waits as usual (which
    /// also notices failures and sleeps). With nothing in flight nothing is owed to any other
    /// peer, so leaving them alone for these few microseconds delays no one.
    pub(crate) fn recv_fast(
        &mut self,
        ctx: u64,
        src: Option<usize>,
        tag: Option<i32>,
        buf: &mut [u8],
    ) -> Option<Status> {
        let s = src?;
        if self.ckpt.is_some()
            || self.finalized
            || !self.posted.is_empty()
            || !self.unexpected.is_empty()
            || !self.sends.is_empty()
            || !self.recvs.is_empty()
            || self.peers.iter().any(|p| !p.txq.is_empty())
        {
            return None;
        }
        let p = self.peers.get_mut(s)?;
        if !p.shm
            || p.state != PeerState::Alive
            || !matches!(p.rx, Rx::Header)
            || p.stage_end > p.stage_start
        {
            return None;
        }
        let t = p.io.as_mut()?.as_shm()?;
        // Ranks outnumber cores (no spinning): a look, then the core goes to a co-located
        // rank (likely the sender), [`FAST_YIELDS`] times, before the general path waits.
        // Otherwise: spin for up to [`FAST_POLLS`] looks.
        let yielding = self.tuning.spin_shm.is_zero();
        let looks = if yielding {
            FAST_YIELDS + 1
        } else {
            FAST_POLLS
        };
        for i in 0..looks {
            match t.recv_eager(ctx, tag, buf) {
                Fast::Took(tag, bytes) => {
                    return Some(Status {
                        source: s,
                        tag,
                        bytes,
                    })
                }
                Fast::Other => return None,
                Fast::Empty if yielding => {
                    if i < FAST_YIELDS {
                        self.yields = self.yields.wrapping_add(1);
                        std::thread::yield_now();
                    }
                }
                // Not there yet: if the sender, awake, last ran on our CPU, it cannot write
                // while we poll. Move off the CPU (see `separate_from_peer`) and let the
                // general path yield it (see `Engine::wait_until`). Asked after the first
                // empty look and then every [`FAST_CPU_EVERY`] polls, so a message already
                // there costs nothing more. Not when ranks outnumber cores (the arm above):
                // moving ranks about was not measured there.
                Fast::Empty
                    if i % FAST_CPU_EVERY == 0
                        && current_cpu().is_some_and(|c| t.peer_on_cpu(c)) =>
                {
                    self.cpu_cuts = self.cpu_cuts.wrapping_add(1);
                    self.separate_from_peer();
                    return None;
                }
                Fast::Empty => std::hint::spin_loop(),
            }
        }
        None
    }

    /// Drive progress until `done` holds: spin for `tuning.spin` (offering the core every
    /// `tuning.polite_yield`, if not zero: see [`POLITE_YIELD`]), then block in the kernel so a
    /// waiting rank costs no CPU.
    pub(crate) fn wait_until(
        &mut self,
        mut done: impl FnMut(&Engine) -> bool,
    ) -> Result<(), Error> {
        // The clock is read only once spinning starts, and then only every 32 passes: on the
        // fast path (the message is already there) a wait costs no clock read and no syscall.
        let mut start: Option<Instant> = None;
        let mut spins: u32 = 1;
        let polite = self.tuning.polite_yield;
        let mut next_yield = polite;
        // The pass after a yield always looks at the sockets: the yield phase advances `spins`
        // in steps that would otherwise skip every socket poll when TCP and shared-memory peers
        // mix (TCP messages then waited out the whole yield phase, 1 ms).
        let mut after_yield = false;
        // The machine was found oversubscribed during this spin: yield instead of spinning for
        // the rest of it (see `crate::busy`); the next look at `next_busy` into the spin.
        let mut cut = false;
        // ... because the machine is busy (not only a shared-memory peer on our CPU).
        let mut busy_cut = false;
        let busy_first = if self.n_sock == 0 {
            BUSY_FIRST_SHM
        } else {
            BUSY_FIRST
        };
        let mut next_busy = busy_first;
        // How fast the TCP links move bytes, counted from the wait's first quiet moment (the
        // first clock read): bytes that were already queued when the wait began say nothing
        // of the link's pace.
        let mut rate: Option<LinkRate> = None;
        // TCP peers need the kernel's word on every pass (interleaved with the rings); peers on
        // shared memory only use their sockets for wake-ups and failure, so look rarely.
        let every = match (self.n_sock > 0, self.n_shm > 0) {
            (true, false) => 1,
            (true, true) => 16,
            (false, _) => 1024,
        };
        // No spin budget (ranks outnumber cores): the first idle pass goes to the yield phase.
        // Spinning 31 passes first (as with a budget, where the clock is read every 32nd
        // pass) held the core for a microsecond or two that a rank queued behind us, often the
        // one we wait for, needed: 4 ranks on 2 cores, allreduce 8 B 0.6x the time.
        let no_spin = if self.n_sock == 0 {
            self.tuning.spin_shm.is_zero()
        } else {
            self.tuning.spin.is_zero()
        };
        loop {
            if done(self) {
                return Ok(());
            }
            let sockets = self.n_sock + self.n_shm > 0 && (after_yield || spins % every == 0);
            let direct = !after_yield && spins % DIRECT_EPOLL_EVERY != 0 && self.direct_reads();
            after_yield = false;
            let progressed = if direct {
                self.direct_passes = self.direct_passes.wrapping_add(1);
                self.progress_direct()
            } else {
                self.epoll_passes = self.epoll_passes.wrapping_add(u64::from(sockets));
                self.progress_once(sockets)?
            };
            if progressed {
                spins = 1;
                // Keep spinning while data flows: sleeping mid-transfer costs a wake-up each time.
                start = None;
                next_yield = polite;
                cut = false;
                busy_cut = false;
                next_busy = busy_first;
                continue;
            }
            if spins == 1 && self.n_sock > 0 && !no_spin && !cut && self.busy.oversubscribed() {
                // With TCP peers on a busy machine, sleep at the first idle pass: a spin holds
                // a core the peer (or its kernel-side send) may be queued for, and a yield
                // hands it to the busy process for the rest of its slice, while a rank asleep
                // in the kernel is woken by the data and runs at once (beside a busy loop,
                // one-way TCP 0 B 4.4 µs against 9.5 µs spinning then yielding; see
                // docs/runtime.md). The answer is reused for 100 µs, so a quiet machine pays
                // one read of /proc/loadavg per 100 µs of waits.
                cut = true;
                busy_cut = true;
            }
            spins = spins.wrapping_add(1);
            if spins % 32 != 0 && !no_spin && !busy_cut {
                self.spun = self.spun.wrapping_add(1);
                std::hint::spin_loop();
                continue;
            }
            let now = Instant::now();
            let t0 = *start.get_or_insert(now);
            let waited = now.saturating_duration_since(t0);
            let moved = self.tcp_moved;
            let rate = rate.get_or_insert_with(|| LinkRate::new(now, moved));
            let spin = if self.n_sock == 0 {
                self.tuning.spin_shm
            } else if waited >= self.tuning.spin
                && !self.tuning.spin.is_zero()
                && self.tuning.spin < MID_TRANSFER_SPIN
                && self.tcp_mid_transfer()
                && rate.fast(now, moved)
            {
                // A message is half across a TCP link that delivers fast (loopback, a fast
                // LAN): the quiet gap is a peer's wake-up or a socket-buffer refill, and a
                // sleep now would add a wake-up per gap. On a slow link the rate test fails
                // and the rank sleeps as usual. The busy check below still cuts the spin short
                // on an oversubscribed machine.
                MID_TRANSFER_SPIN
            } else {
                self.tuning.spin
            };
            if waited < spin && !cut && self.n_shm > 0 && self.shm_peer_on_our_cpu() {
                // A shared-memory peer, awake, last ran on our CPU: it is queued behind us
                // (most often: the kernel places a woken rank beside its waker, and beside a
                // busy process the pair then stays on one core), so every microsecond of our
                // spin delays it. Yield for the rest of the spin instead, without waiting for
                // the machine-wide look below (the first one comes 200 µs into a spin on
                // shared memory). Beside a busy loop, one-way 256 KiB 268 → 23 µs, 1 MiB 386
                // → 85 µs (see docs/runtime.md).
                cut = true;
                self.cpu_cuts = self.cpu_cuts.wrapping_add(1);
            }
            if waited < spin && !cut && waited >= next_busy {
                // More threads runnable than CPUs: our spin holds a core someone is queued
                // for, maybe the rank we wait for. Yield instead for the rest of the spin: a
                // rank queued on our core runs at once, and one running elsewhere is still
                // polled for between the yields, with no wake-up to pay.
                cut = self.busy.oversubscribed();
                busy_cut = cut;
                next_busy = waited + BUSY_EVERY;
            }
            if waited < spin && !cut {
                // A polite spin (MUTIRAO_POLITE_YIELD_US, off by default): every `polite` of
                // spinning, offer the core once, for a rank we wait for that may be queued
                // behind us. Measured, it cost more than it saved beside a busy process: the
                // offer hands the core to that process for a whole time slice.
                if !polite.is_zero() && waited >= next_yield {
                    std::thread::yield_now();
                    next_yield = waited + polite;
                }
                std::hint::spin_loop();
                continue;
            }
            if waited < spin + self.tuning.yield_for && !(busy_cut && self.n_sock > 0) {
                // Ranks outnumber cores, or the machine is busy (`cut`): hand the core to a
                // co-located rank (likely the one we wait for) instead of paying a sleep and a
                // wake-up. Not on a busy machine with TCP peers (see above).
                self.yields = self.yields.wrapping_add(1);
                std::thread::yield_now();
                spins = spins.wrapping_add(31);
                after_yield = sockets_after_yield(self.n_sock > 0, self.yields);
                continue;
            }
            if self.poll.is_none() {
                // A single rank waiting for itself can never be satisfied.
                return Err(Error::Invalid(
                    "deadlock: this rank waits for a message no one can send".into(),
                ));
            }
            // Block: announce sleep on every ring, re-check, then wait for a socket event.
            let mut woke = false;
            for p in &self.peers {
                if let Some(t) = &p.io {
                    woke |= t.prepare_sleep(!p.txq.is_empty());
                }
            }
            if !woke {
                self.sleeps = self.sleeps.wrapping_add(1);
                // Wake for the next question to the launcher, if it comes first.
                let nap = match self.lost_poll {
                    Some((every, last)) => (last + every)
                        .saturating_duration_since(Instant::now())
                        .clamp(Duration::from_millis(1), Duration::from_millis(200)),
                    None => Duration::from_millis(200),
                };
                self.poll_sockets(Some(nap))?;
                self.ask_lost();
            }
            for p in &self.peers {
                if let Some(t) = &p.io {
                    t.end_sleep();
                }
            }
        }
    }

    /// Publish the CPU this rank runs on to its shared-memory peers, and tell whether one of
    /// them, awake, last said it runs there too. Asked every 32 idle passes of a spin (see
    /// [`current_cpu`]); the store happens only when the CPU changed.
    fn shm_peer_on_our_cpu(&mut self) -> bool {
        let Some(cpu) = current_cpu() else {
            return false;
        };
        let mut shared = false;
        for p in &mut self.peers {
            if !p.shm || p.state != PeerState::Alive {
                continue;
            }
            if let Some(t) = p.io.as_mut().and_then(|t| t.as_shm()) {
                shared |= t.peer_on_cpu(cpu);
            }
        }
        shared
    }

    /// This rank, waiting for a small message (the fast path), shares its CPU with the
    /// sender: move off it (at most once per [`MOVE_EVERY`]), so the pair runs on two CPUs
    /// again. Yielding alone keeps the pair on one CPU for good beside a busy process: each
    /// hands the CPU to the other, neither sleeps, so the kernel sees two runnable threads here
    /// against one there and moves nobody (interleaved `pingpong` beside a busy loop, 4 rounds:
    /// 0–4 KiB one-way 1.3–2.6 µs with yields alone, 0.20–1.28 µs moving off, as without the
    /// CPU check). Only here, not in the general wait: moving apart on every wait, large
    /// transfers included, made 4 MiB 1.4 ms against 0.4 ms (the rank left beside the busy
    /// process stalled the pipeline for whole time slices).
    fn separate_from_peer(&mut self) {
        let now = Instant::now();
        if self
            .last_move
            .is_some_and(|t| now.saturating_duration_since(t) < MOVE_EVERY)
        {
            return;
        }
        self.last_move = Some(now);
        if current_cpu().and_then(move_off_cpu).is_some() {
            self.moves = self.moves.wrapping_add(1);
        }
    }

    /// Whether a wait pass may read its peers' sockets directly instead of asking epoll: only
    /// TCP peers, at most [`DIRECT_MAX`] of them, nothing queued to write (a blocked write
    /// learns that it may go on only from epoll), no checkpoint waves, and the busy probe's
    /// last word was "not oversubscribed": beside a busy loop, direct reads measured slower
    /// (interleaved `pingpong` over TCP, 10 rounds: 0–64 B one-way 14.0 against 10.1–10.2 µs;
    /// not understood — maybe the socket lock that each `recvfrom` takes, which sends an
    /// arriving segment to the backlog), and gated by the probe they measured even.
    fn direct_reads(&self) -> bool {
        self.n_shm == 0
            && self.n_sock > 0
            && self.n_sock <= DIRECT_MAX
            && self.ckpt.is_none()
            && !self.busy.last_answer()
            && self.peers.iter().all(|p| p.txq.is_empty())
    }

    /// One pass that reads every live TCP peer's socket directly (one `recvfrom` each, as
    /// MPICH polls its sockets) instead of an `epoll_wait` and then a `recvfrom` for the
    /// socket it names: a message that arrives costs one system call, not two. Edge-triggered
    /// readiness for bytes read this way is still reported later by epoll; it then costs one
    /// empty read.
    fn progress_direct(&mut self) -> bool {
        let mut did = false;
        for i in 0..self.peers.len() {
            let p = &mut self.peers[i];
            if p.state != PeerState::Alive || p.shm {
                continue;
            }
            let Some(t) = p.io.as_mut() else {
                continue;
            };
            t.arm_read();
            did |= self.read_peer(i);
        }
        did
    }

    /// Whether a message is partly written to, or partly read from, a TCP peer.
    fn tcp_mid_transfer(&self) -> bool {
        self.peers.iter().any(|p| {
            p.io.is_some() && !p.shm && (!p.txq.is_empty() || matches!(p.rx, Rx::Payload { .. }))
        })
    }

    /// One non-blocking progress pass (for test/iprobe). Asks the kernel for socket events
    /// on every pass only when every peer is on TCP. Peers on shared memory use their sockets
    /// only for wake-ups and failure notices, so those are read at most once a millisecond
    /// (and on every 16th pass when TCP peers are mixed in): an `epoll_wait` per pass cost
    /// more than the rest of a polling loop's pass (`iprobe`/`test` loops, the addressing
    /// layer's engine).
    pub(crate) fn poke(&mut self) -> Result<(), Error> {
        self.pokes = self.pokes.wrapping_add(1);
        let overdue = || self.last_socket_poll.elapsed() >= SHM_SOCKET_POLL;
        let sockets = match (self.n_sock > 0, self.n_shm > 0) {
            (false, false) => false,
            (true, false) => true,
            (true, true) => self.pokes % 16 == 0 || overdue(),
            (false, true) => overdue(),
        };
        let progressed = self.progress_once(sockets)?;
        // A program that polls (test, iprobe) instead of waiting asks about lost ranks too:
        // the clock is read every 256 idle pokes, the launcher asked at most once per period.
        if !progressed && self.lost_poll.is_some() && self.pokes % 256 == 0 {
            self.ask_lost();
        }
        Ok(())
    }

    /// Why nothing more can come from `src` (a rank, or any rank when `None`), if so.
    /// `ctx`: the communicator's context (decides whose failure counts for any source).
    pub(crate) fn source_gone(&self, src: Option<usize>, ctx: u64) -> Option<Error> {
        match src {
            Some(s) => self.check_peer(s).err(),
            None => self.any_failed(ctx),
        }
    }

    pub(crate) fn recv_finished(&self, id: u64) -> bool {
        self.recvs
            .get(&id)
            .is_none_or(|r| r.state == RecvState::Done)
    }

    pub(crate) fn send_finished(&self, id: u64) -> bool {
        self.sends
            .get(&id)
            .is_none_or(|s| s.state == SendState::Done)
    }

    /// Take a finished receive out of the engine.
    pub(crate) fn take_recv(&mut self, id: u64) -> Result<(Status, Option<Box<dyn Buf>>), Error> {
        if id == BLOCKING {
            // Take the fields out in place: moving a whole `Recv` out of the slot costs more
            // than the rest of a receive.
            let r = self
                .recvs
                .slot
                .as_mut()
                .ok_or_else(|| Error::Invalid("unknown request".into()))?;
            let res = match r.err.take() {
                Some(e) => Err(e),
                None => match r.status {
                    Some(status) => Ok((
                        status,
                        match std::mem::replace(&mut r.dest, Dest::Alloc(discard_alloc)) {
                            Dest::Owned(b) => Some(b),
                            _ => None,
                        },
                    )),
                    None => Err(Error::Invalid("receive has no status".into())),
                },
            };
            self.recvs.slot = None;
            return res;
        }
        let r = self
            .recvs
            .remove(&id)
            .ok_or_else(|| Error::Invalid("unknown request".into()))?;
        if let Some(e) = r.err {
            return Err(e);
        }
        let status = r
            .status
            .ok_or_else(|| Error::Invalid("receive has no status".into()))?;
        let buf = match r.dest {
            Dest::Owned(b) => Some(b),
            _ => None,
        };
        Ok((status, buf))
    }

    pub(crate) fn take_send(&mut self, id: u64) -> Result<Option<Box<dyn Buf>>, Error> {
        let s = self
            .sends
            .remove(&id)
            .ok_or_else(|| Error::Invalid("unknown request".into()))?;
        self.keep_if_held(id, &s);
        if let Some(e) = s.err {
            return Err(e);
        }
        Ok(match s.data {
            SendData::Owned(b) => Some(b),
            SendData::Borrowed(..) => None,
        })
    }

    /// Remove a receive whatever its state (blocking-call exit path). If payload is still flowing
    /// into it, the rest is discarded so no pointer to caller memory survives.
    pub(crate) fn forget_recv(&mut self, id: u64) {
        if id == BLOCKING
            && self
                .recvs
                .get(&id)
                .is_some_and(|r| r.state == RecvState::Receiving)
        {
            self.slot_tainted = true;
        }
        self.posted.retain(|x| *x != id);
        for p in &mut self.peers {
            if let Rx::Payload { target, .. } = &mut p.rx {
                if matches!(target, Target::Recv(t, _) if *t == id) {
                    *target = Target::Discard;
                }
            }
        }
        self.recvs.remove(&id);
    }

    /// Remove a send whatever its state (blocking-call exit path). Queued frames that still
    /// reference its data are dropped (the peer has failed if the send did not complete).
    pub(crate) fn forget_send(&mut self, id: u64) {
        if let Some(s) = self.sends.remove(&id) {
            if s.state == SendState::Done {
                self.keep_if_held(id, &s);
            } else {
                let peer = s.peer;
                self.peers[peer]
                    .txq
                    .retain(|o| !matches!(o.payload, OutPayload::Send(x) if x == id));
                if s.state == SendState::Streaming && self.peers[peer].state == PeerState::Alive {
                    self.fail_peer(peer, "a send was abandoned mid-stream".into());
                }
            }
        }
    }

    /// Let a request complete in the background; its buffer is freed when it does.
    pub(crate) fn detach(&mut self, id: u64) {
        if let Some(r) = self.recvs.get_mut(&id) {
            if r.state == RecvState::Done {
                self.recvs.remove(&id);
            } else if r.state == RecvState::Posted {
                self.posted.retain(|x| *x != id);
                self.recvs.remove(&id);
            } else {
                r.detached = true;
            }
        } else if let Some(s) = self.sends.get_mut(&id) {
            if s.state == SendState::Done {
                if let Some(s) = self.sends.remove(&id) {
                    self.keep_if_held(id, &s);
                }
            } else {
                s.detached = true;
            }
        }
    }

    /// Flush everything, say goodbye to every peer, and stop.
    pub(crate) fn finalize_io(&mut self) -> Result<(), Error> {
        self.ckpt_leave();
        // Pending background sends must reach their peers first.
        let res = self.wait_until(|e| {
            e.sends.values().all(|s| s.state == SendState::Done)
                && e.peers.iter().all(|p| p.txq.is_empty())
        });
        for i in 0..self.peers.len() {
            if i == self.rank {
                continue;
            }
            let p = &self.peers[i];
            if !p.bye_sent
                && matches!(p.state, PeerState::Alive | PeerState::Finalized)
                && p.io.as_ref().is_some()
            {
                self.peers[i].bye_sent = true;
                let hdr = Header {
                    kind: Kind::Bye,
                    tag: 0,
                    ctx: 0,
                    len: 0,
                    id: 0,
                };
                self.queue_frame(i, hdr, OutPayload::None);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.peers.iter().any(|p| {
            !p.txq.is_empty()
                && matches!(p.state, PeerState::Alive | PeerState::Finalized)
                && p.io.is_some()
        }) && Instant::now() < deadline
        {
            if !self.progress_once(true)? {
                self.poll_sockets(Some(Duration::from_millis(10)))?;
            }
        }
        self.finalized = true;
        res
    }
}

/// How [`Engine::send_inner`] sends.
#[derive(Clone, Copy)]
struct SendOpts {
    /// Give an eager send a request id too (else `None`: nothing to wait for).
    track_eager: bool,
    /// A rendezvous to a same-host peer may offer a cross-memory copy (not for the held sends
    /// a restore issues again: the program may retype, so replace, their buffer).
    cma_ok: bool,
    /// Lower the eager limit to this many bytes.
    eager_cap: usize,
}

impl SendOpts {
    const REQUEST: SendOpts = SendOpts {
        track_eager: true,
        cma_ok: true,
        eager_cap: usize::MAX,
    };
}

fn done_send(peer: usize, data: SendData) -> Send {
    Send {
        peer,
        data,
        state: SendState::Done,
        err: None,
        detached: false,
        meta: (0, 0, 1),
        rdv: false,
        acked: None,
    }
}

/// Copy `dst.len()` bytes from address `addr` of process `pid` (Linux cross-memory attach).
/// False if the kernel refuses (no permission, old kernel): the caller falls back to streaming.
fn cma_copy(pid: i32, addr: u64, dst: &mut [u8]) -> bool {
    let mut done = 0usize;
    while done < dst.len() {
        let local = libc::iovec {
            iov_base: dst[done..].as_mut_ptr().cast(),
            iov_len: dst.len() - done,
        };
        let remote = libc::iovec {
            iov_base: (addr as usize + done) as *mut libc::c_void,
            iov_len: dst.len() - done,
        };
        // SAFETY: `local` describes the writable, live slice `dst[done..]`; the remote iovec is
        // only read by the kernel from the other process's address space, with its own checks
        // (a bad address is an EFAULT, not undefined behaviour here).
        let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
        if n <= 0 {
            return false;
        }
        done += n as usize;
    }
    true
}

fn discard_alloc(len: usize) -> Result<Box<dyn Buf>, Error> {
    Ok(Box::new(vec![0u8; len]))
}

fn matches(r: &Recv, peer: usize, ctx: u64, tag: i32) -> bool {
    r.ctx == ctx && r.src.is_none_or(|s| s == peer) && r.tag.is_none_or(|t| t == tag)
}

// ---------------------------------------------------------------- checkpoint waves

/// An application frame the wave may hold back (`crate::ckpt::Wave::on_app`).
#[derive(Clone)]
pub(crate) enum Held {
    Eager(u64, i32, Vec<u8>),
    Rts(Header, usize, Option<(u64, i32)>),
}

/// The runtime's part of checkpointing: the wave machine and what a restart brought back.
pub(crate) struct CkptRt {
    pub(crate) wave: crate::ckpt::Wave<Held>,
    pub(crate) clock0: Instant,
    /// How long a PMI checkpoint operation may take.
    pub(crate) pmi_timeout: Duration,
    /// The program state of the restored epoch, until the program asks for it.
    pub(crate) restored_app: Option<Vec<u8>>,
    /// (epoch, incarnation) on a restart.
    pub(crate) recovery: Option<(u64, u64)>,
    /// The waves this rank saw aborted (for tests and reports).
    pub(crate) aborted: Vec<u64>,
    /// Epochs this rank (rank 0) committed.
    pub(crate) committed: Vec<u64>,
    /// A snapshot taken whose checkpoint is not complete yet (nonblocking mode: waiting for
    /// cuts), or not yet stored.
    pub(crate) pending: Option<crate::ckpt::RankCheckpoint>,
    /// The requests in flight at the restored snapshot, re-created, until the program takes
    /// them (`Comm::restored_requests`).
    pub(crate) restored_reqs: Option<Vec<RestoredReq>>,
    /// Sends saved as held in `pending` (send id, index in its requests) whose receiver's cut
    /// is not in yet (nonblocking mode): a clear-to-send arriving before that cut puts the
    /// message in the cut after all.
    pub(crate) tentative: Vec<(u64, usize)>,
    /// Large sends the program waited for (or dropped) after their receiver matched them
    /// past its cut of this epoch and before this rank's snapshot: (epoch, send id, saved as
    /// held with `waited`). The snapshot holds them; their receivers keep places for them.
    pub(crate) gone_held: Vec<(u64, u64, crate::ckpt::SavedRequest)>,
}

/// What a snapshot keeps of the runtime's messages and requests (see
/// [`Engine::snapshot_runtime`]).
pub(crate) struct RuntimeSnapshot {
    pub(crate) requests: Vec<crate::ckpt::SavedRequest>,
    pub(crate) unexpected: Vec<crate::ckpt::SavedMessage>,
    pub(crate) resent: Vec<crate::ckpt::ResentSlot>,
    pub(crate) tentative: Vec<(u64, usize)>,
}

impl RestoredReq {
    /// Send `id` re-created from a saved request of (context, element size) `of` (to world
    /// rank `dest`).
    fn send(id: u64, of: (u64, u32), dest: u32, tag: i32) -> RestoredReq {
        RestoredReq {
            id,
            is_recv: false,
            ctx: of.0,
            elem: of.1,
            peer: Some(dest),
            tag: Some(tag),
        }
    }
}

impl CkptRt {
    /// A rank's checkpointing state with `wave`, started now, on a restart from (epoch,
    /// incarnation) `recovery`.
    pub(crate) fn new(
        wave: crate::ckpt::Wave<Held>,
        pmi_timeout: Duration,
        recovery: Option<(u64, u64)>,
    ) -> CkptRt {
        CkptRt {
            wave,
            clock0: Instant::now(),
            pmi_timeout,
            restored_app: None,
            recovery,
            aborted: Vec::new(),
            committed: Vec::new(),
            pending: None,
            restored_reqs: None,
            tentative: Vec::new(),
            gone_held: Vec::new(),
        }
    }
}

/// A request re-created from a checkpoint (see `crate::ckpt::SavedRequest`).
#[derive(Debug, Clone)]
pub(crate) struct RestoredReq {
    pub(crate) id: u64,
    pub(crate) is_recv: bool,
    pub(crate) ctx: u64,
    pub(crate) elem: u32,
    /// World rank: the source of a receive (`None`: any), the destination of a send.
    pub(crate) peer: Option<u32>,
    pub(crate) tag: Option<i32>,
}

impl Engine {
    /// An application frame arrived from `peer`: deliver it, or hold it back (after the
    /// channel's cut, before the local snapshot).
    fn arrive(&mut self, peer: usize, f: Held) {
        // During a restore, the first frames of a peer are the messages it held at the
        // restored epoch, sent again: they fill the places saved for them.
        if let Some(rs) = self.restoring.as_mut() {
            let want = rs.want.get(&peer).copied().unwrap_or(0);
            let got = rs.got.entry(peer).or_default();
            if got.len() < want {
                got.push_back(f);
                return;
            }
        }
        let f = match self.ckpt.as_mut() {
            Some(c) => match c.wave.on_app(peer, f) {
                Some(f) => f,
                None => return,
            },
            None => f,
        };
        self.deliver_held(peer, f);
    }

    fn deliver_held(&mut self, peer: usize, f: Held) {
        if let Some(rs) = self.restoring.as_mut() {
            rs.deferred.push((peer, f));
            return;
        }
        self.deliver_now(peer, f);
    }

    fn deliver_now(&mut self, peer: usize, f: Held) {
        match f {
            Held::Eager(ctx, tag, bytes) => self.deliver_eager(peer, ctx, tag, bytes),
            Held::Rts(hdr, len, cma) => self.on_rts(peer, hdr, len, cma),
        }
    }

    /// The receiver `peer` matched large send `send_id` (its clear-to-send or FIN came): note
    /// whether that was after its cut of the active wave (the checkpoint then holds the
    /// message), or, with this rank's snapshot taken and `peer`'s cut still to come, put the
    /// message in the pending checkpoint's cut after all.
    fn on_ack(&mut self, peer: usize, send_id: u64) {
        let Some(c) = self.ckpt.as_mut() else { return };
        let after = c.wave.cut_in(peer);
        if let Some(s) = self.sends.get_mut(&send_id) {
            s.acked = Some(after);
        }
        if c.wave.awaiting_cut(peer).is_none() {
            return;
        }
        let Some(i) = c.tentative.iter().position(|t| t.0 == send_id) else {
            return;
        };
        let (_, idx) = c.tentative.remove(i);
        if let Some(q) = c.pending.as_mut().and_then(|p| p.requests.get_mut(idx)) {
            use crate::ckpt::SavedRequestState as St;
            if let St::Held { dest, tag, buf, .. } = &mut q.state {
                q.state = St::Sent {
                    dest: *dest,
                    tag: *tag,
                    buf: std::mem::take(buf),
                };
            }
        }
    }

    /// Carry out what the wave machine decided.
    pub(crate) fn apply_ckpt(&mut self, fx: crate::ckpt::Effects<Held>) {
        for (to, m) in fx.send {
            if to < self.peers.len() && self.peers[to].state == PeerState::Alive {
                self.queue_frame(to, Header::marker(m), OutPayload::None);
                self.flush(to);
            }
        }
        for (src, f) in fx.release {
            self.deliver_held(src, f);
        }
        if let Some(e) = fx.aborted {
            if let Some(c) = self.ckpt.as_mut() {
                c.aborted.push(e);
                if c.pending.as_ref().is_some_and(|p| p.epoch == e) {
                    c.pending = None;
                    c.tentative.clear();
                }
                c.gone_held.retain(|(ge, _, _)| *ge != e);
            }
            if self.rank == 0 {
                eprintln!(
                    "mutirao: checkpoint wave {e} was abandoned (it did not complete in time, a \
                     rank had already passed the checkpoint point it was to be cut at, or a rank \
                     is finishing); no checkpoint of it exists. Checkpoint points must be places \
                     no message crosses (e.g. the end of an iteration), reached as often by every \
                     rank, and ranks must keep reaching them"
                );
            }
        }
        if let Some(e) = fx.commit {
            let timeout = self
                .ckpt
                .as_ref()
                .map_or(Duration::from_secs(60), |c| c.pmi_timeout);
            match self._pmi.as_mut().map(|p| p.ckpt_commit(e, timeout)) {
                Some(Ok(())) => {
                    if let Some(c) = self.ckpt.as_mut() {
                        c.committed.push(e);
                    }
                }
                Some(Err(why)) => {
                    eprintln!("mutirao: checkpoint epoch {e} could not be committed: {why}")
                }
                None => eprintln!(
                    "mutirao: checkpoint epoch {e} could not be committed: no launcher connection"
                ),
            }
        }
    }

    /// Rank 0's clock: start a due wave, abort an overdue one.
    pub(crate) fn ckpt_tick(&mut self) {
        if self.rank != 0 || self.finalized {
            return;
        }
        let Some(c) = self.ckpt.as_mut() else { return };
        let now = c.clock0.elapsed();
        let fx = c.wave.tick(now);
        self.apply_ckpt(fx);
    }

    /// If this rank's checkpoint is complete (snapshot taken, every cut in), add the channel
    /// state, store it through the launcher, and tell rank 0.
    pub(crate) fn ckpt_finish(&mut self) {
        let Some(c) = self.ckpt.as_mut() else { return };
        if c.pending.is_none() {
            return;
        }
        let Some(complete) = c.wave.take_complete() else {
            return;
        };
        let Some(mut cp) = c.pending.take() else {
            return;
        };
        c.tentative.clear();
        let timeout = c.pmi_timeout;
        let (rank, epoch) = (self.rank, cp.epoch);
        for (src, f) in complete.late {
            match f {
                Held::Eager(ctx, tag, bytes) => cp.late.push(crate::ckpt::SavedMessage {
                    source: src as u32,
                    ctx,
                    tag,
                    bytes,
                }),
                // A large message announced after this rank's snapshot: this rank matches it
                // after its cut, so its sender holds it (no clear-to-send before this rank's
                // cut marker) and sends it again on a restore, into this place.
                Held::Rts(..) => cp.resent.push(crate::ckpt::ResentSlot {
                    source: src as u32,
                    late: true,
                    before: cp.late.len() as u32,
                }),
            }
        }
        // The ranks this one spawned that are members of the wave: the launcher counts their
        // checkpoints too before it commits the epoch.
        let children = c.wave.children_in(epoch);
        let put = cp.encode().and_then(|blob| match self._pmi.as_mut() {
            Some(p) => p.ckpt_put_with(epoch, &blob, &children, timeout),
            None => Err("no launcher connection".into()),
        });
        match put {
            Ok(()) => {
                let Some(c) = self.ckpt.as_mut() else { return };
                let now = c.clock0.elapsed();
                let fx = c.wave.stored(epoch, now);
                self.apply_ckpt(fx);
            }
            // The wave cannot commit; rank 0 abandons it at its timeout. The program goes on.
            Err(why) => eprintln!(
                "mutirao: rank {rank}: checkpoint of epoch {epoch} not stored ({why}); this wave will not commit"
            ),
        }
    }

    /// A spawn link (a child of this rank, or this spawned rank's parent or sibling) said
    /// goodbye or broke: it is in no later wave; a wave it was in and that can no longer
    /// complete is aborted. The job's own ranks stay members: a wave without one of them
    /// would not be a checkpoint of the job (it times out instead, as before).
    fn ckpt_peer_gone(&mut self, peer: usize, failed: bool) {
        if peer < self.base && self.spawned_in.is_none() {
            return;
        }
        let Some(c) = self.ckpt.as_mut() else { return };
        let now = c.clock0.elapsed();
        let fx = c.wave.remove_peer(peer, failed, now);
        self.apply_ckpt(fx);
        self.ckpt_finish();
    }

    /// This rank spawned group `group` (`members`: itself, then the children) of `program`
    /// with `args` (issue 13): the children are members of the waves from now on.
    pub(crate) fn ckpt_add_children(
        &mut self,
        group: u64,
        members: &[usize],
        program: String,
        args: Vec<String>,
    ) {
        let Some(c) = self.ckpt.as_mut() else { return };
        let (_, fx) = c.wave.add_children(&members[1..]);
        self.spawn_groups.push(crate::ckpt::SavedSpawn {
            group,
            members: members.iter().map(|m| *m as u32).collect(),
            program,
            args,
        });
        self.apply_ckpt(fx);
    }

    /// The spawn groups to save with this rank's checkpoint of `epoch`: those with children
    /// that are members of it (only those children).
    pub(crate) fn saved_spawns(&self, epoch: u64) -> Vec<crate::ckpt::SavedSpawn> {
        let Some(c) = self.ckpt.as_ref() else {
            return Vec::new();
        };
        let kids = c.wave.children_in(epoch);
        self.spawn_groups
            .iter()
            .filter_map(|g| {
                let mut m = vec![*g.members.first()?];
                m.extend(g.members[1..].iter().filter(|r| kids.contains(r)));
                (m.len() > 1).then(|| crate::ckpt::SavedSpawn {
                    members: m,
                    ..g.clone()
                })
            })
            .collect()
    }

    /// This rank is finalizing: it takes part in no more waves.
    pub(crate) fn ckpt_leave(&mut self) {
        let Some(c) = self.ckpt.as_mut() else { return };
        let now = c.clock0.elapsed();
        let fx = c.wave.leave(now);
        self.apply_ckpt(fx);
    }

    /// A checkpoint point's precondition: no request failed. Receives may be pending (they
    /// are saved), sends finished or not (a large one its receiver has not matched is held:
    /// see [`Engine::snapshot_runtime`]).
    pub(crate) fn check_requests(&self) -> Result<(), Error> {
        let mut ids: Vec<&u64> = self.sends.keys().collect();
        ids.sort();
        for id in ids {
            let s = &self.sends[id];
            if let Some(e) = &s.err {
                return Err(Error::Invalid(format!(
                    "checkpoint point with a nonblocking send to rank {} that failed ({e}): \
                     wait for it (and handle the error) before the checkpoint point",
                    s.peer
                )));
            }
        }
        for (_, r) in self.recvs.iter() {
            if let Some(e) = &r.err {
                return Err(Error::Invalid(format!(
                    "checkpoint point with a nonblocking receive that failed ({e}): wait for it \
                     (and handle the error) before the checkpoint point"
                )));
            }
        }
        Ok(())
    }

    /// Some receive matched before this rank's cut of `epoch` is taking in a large message's
    /// data: the snapshot waits for it (its sender had the clear-to-send before this rank's
    /// cut marker, so the message is in the cut and needs only progress). One matched after
    /// the cut is not waited for: its sender holds the message.
    pub(crate) fn receiving(&self, epoch: u64) -> bool {
        self.recvs.iter().any(|(_, r)| {
            r.state == RecvState::Receiving && r.after_cut.is_none_or(|(e, _)| e != epoch)
        })
    }

    /// Set a send's element size (what `size_of::<T>()` of its request is).
    pub(crate) fn set_send_elem(&mut self, id: u64, elem: usize) {
        // Only checkpoints read it: no lookup on the request path of a job without them.
        if self.ckpt.is_none() {
            return;
        }
        if let Some(s) = self.sends.get_mut(&id) {
            s.meta.2 = u32::try_from(elem).unwrap_or(u32::MAX);
        }
    }

    /// Set a receive's element size (what `size_of::<T>()` of its request is).
    pub(crate) fn set_recv_elem(&mut self, id: u64, elem: usize) {
        if self.ckpt.is_none() {
            return;
        }
        if let Some(r) = self.recvs.get_mut(&id) {
            r.elem = u32::try_from(elem).unwrap_or(u32::MAX);
        }
    }

    /// The context is one checkpoints cover: the world's or a derived one in the table.
    fn covered(&self, ctx: u64) -> bool {
        ctx == 0 || self.comms.entry(ctx).is_some()
    }

    /// The runtime's part of this rank's snapshot of `epoch`: the program's requests in
    /// flight in the order it made them, the unexpected queue, and the places of the messages
    /// peers hold. Call after [`Engine::check_requests`] and once [`Engine::receiving`] is
    /// false. A large message is in the cut exactly when its receiver matched it before its
    /// own cut, i.e. when the receiver's clear-to-send (or FIN) came before its cut marker:
    /// - a large send not matched so, finished or not, is *held*: saved with its buffer and
    ///   sent again once on a restore (tentatively, while that receiver's cut may still come
    ///   with this rank's snapshot taken: [`Engine::on_ack`]);
    /// - on the receiving side, an announcement still unmatched, or matched after this rank's
    ///   cut, is not in the snapshot: its place is kept instead ([`crate::ckpt::ResentSlot`]),
    ///   and a receive that matched it after the cut is saved as pending.
    pub(crate) fn snapshot_runtime(&self, epoch: u64) -> Result<RuntimeSnapshot, Error> {
        use crate::ckpt::{ResentSlot, SavedMessage, SavedRequest, SavedRequestState as St};
        let mut out: Vec<(u64, SavedRequest)> = Vec::new();
        // Places of held messages, by arrival number: (arrival, source).
        let mut places: Vec<(u64, usize)> = Vec::new();
        for (id, r) in self.recvs.iter() {
            if !self.covered(r.ctx) {
                return Err(Error::Invalid(
                    "checkpoint point with a nonblocking receive pending on a spawn \
                     communicator, which checkpoints do not cover: wait for it first"
                        .into(),
                ));
            }
            let held = r.after_cut.filter(|(e, _)| *e == epoch);
            let state = match (r.state, held) {
                (RecvState::Posted, _) => St::Recv {
                    source: r.src.map(|s| s as u32),
                    tag: r.tag,
                    into: match &r.dest {
                        Dest::Owned(b) => Some(b.bytes().to_vec()),
                        _ => None,
                    },
                },
                // Matched after the cut: pending in the snapshot, its message in its place.
                (RecvState::Receiving | RecvState::Done, Some((_, seq))) => {
                    let st = r.status.ok_or_else(|| {
                        Error::Invalid("a matched receive without a status".into())
                    })?;
                    places.push((seq, st.source));
                    St::Recv {
                        source: r.src.map(|s| s as u32),
                        tag: r.tag,
                        // An irecv_into's buffer: the message sent again writes the same
                        // bytes over what it wrote here.
                        into: match (&r.dest, r.alloc) {
                            (Dest::Owned(b), false) => Some(b.bytes().to_vec()),
                            _ => None,
                        },
                    }
                }
                (RecvState::Done, None) => {
                    let st = r.status.ok_or_else(|| {
                        Error::Invalid("a finished receive without a status".into())
                    })?;
                    St::Received {
                        source: st.source as u32,
                        tag: st.tag,
                        len: st.bytes as u64,
                        buf: match &r.dest {
                            Dest::Owned(b) => b.bytes().to_vec(),
                            _ => Vec::new(),
                        },
                    }
                }
                (RecvState::Receiving, None) => {
                    return Err(Error::Invalid(
                        "a large message was still arriving at the snapshot".into(),
                    ))
                }
            };
            out.push((
                *id,
                SavedRequest {
                    ctx: r.ctx,
                    elem: r.elem,
                    state,
                },
            ));
        }
        for (id, s) in &self.sends {
            let (ctx, tag, elem) = s.meta;
            if !self.covered(ctx) {
                return Err(Error::Invalid(
                    "checkpoint point with a nonblocking send on a spawn communicator, which \
                     checkpoints do not cover: wait for it first"
                        .into(),
                ));
            }
            let buf = match &s.data {
                SendData::Owned(b) => b.bytes().to_vec(),
                SendData::Borrowed(..) => Vec::new(),
            };
            let in_cut = !s.rdv || s.acked.is_some_and(|after| after != Some(epoch));
            let dest = s.peer as u32;
            out.push((
                *id,
                SavedRequest {
                    ctx,
                    elem,
                    state: if in_cut {
                        St::Sent { dest, tag, buf }
                    } else {
                        St::Held {
                            dest,
                            tag,
                            buf,
                            waited: false,
                        }
                    },
                },
            ));
        }
        // Sends held at this epoch that the program waited for (or dropped) before the snapshot.
        if let Some(c) = self.ckpt.as_ref() {
            out.extend(
                c.gone_held
                    .iter()
                    .filter(|(e, _, _)| *e == epoch)
                    .map(|(_, id, q)| (*id, q.clone())),
            );
        }
        out.sort_by_key(|(id, _)| *id);
        let tentative = out
            .iter()
            .enumerate()
            .filter(|(_, (_, q))| matches!(q.state, St::Held { .. }))
            .map(|(i, (id, _))| (*id, i))
            .collect();
        // The unexpected queue: eager messages kept, unmatched announcements replaced by
        // places (their senders hold them), merged with the places of those matched after the
        // cut, in arrival order.
        for u in &self.unexpected {
            if matches!(u.body, UnexBody::Rts { .. }) {
                places.push((u.seq, u.peer));
            }
        }
        places.sort_unstable();
        let mut unexpected = Vec::new();
        let mut resent = Vec::new();
        let mut p = places.iter().peekable();
        for u in &self.unexpected {
            let UnexBody::Eager(b) = &u.body else {
                continue;
            };
            while let Some((_, src)) = p.next_if(|(seq, _)| *seq < u.seq) {
                resent.push(ResentSlot {
                    source: *src as u32,
                    late: false,
                    before: unexpected.len() as u32,
                });
            }
            unexpected.push(SavedMessage {
                source: u.peer as u32,
                ctx: u.ctx,
                tag: u.tag,
                bytes: b.clone(),
            });
        }
        for (_, src) in p {
            resent.push(ResentSlot {
                source: *src as u32,
                late: false,
                before: unexpected.len() as u32,
            });
        }
        Ok(RuntimeSnapshot {
            requests: out.into_iter().map(|(_, r)| r).collect(),
            unexpected,
            resent,
            tentative,
        })
    }

    /// Restore checkpoint `c` into this fresh engine (before the program runs), in this order:
    /// the communicator table; the held sends sent again (before anything new to their
    /// receivers); the messages peers held, waited for (each peer sends its own again first:
    /// at most `timeout`); the unexpected queue with them in their places; the pending
    /// receives posted again; the channel state with them in their places; then whatever
    /// arrived meanwhile. Returns the program's state and the requests re-created.
    pub(crate) fn restore(
        &mut self,
        c: crate::ckpt::RankCheckpoint,
        timeout: Duration,
    ) -> Result<(Vec<u8>, Vec<RestoredReq>), Error> {
        use crate::ckpt::SavedRequestState as St;
        let epoch = c.epoch;
        let want = self.expect_resent(epoch, &c.resent)?;
        self.comms = crate::ckpt::CommTable::restore(c.comms);
        // Held sends first: FIFO puts them before anything the program sends to that rank.
        // Never by cross-memory copy: the program may retype (replace) the buffer.
        let mut resent_ids = HashMap::new();
        for (i, q) in c.requests.iter().enumerate() {
            if let St::Held {
                dest,
                tag,
                buf,
                waited,
            } = &q.state
            {
                if *dest as usize >= self.peers.len() {
                    return Err(Error::Init(format!(
                        "restart: the checkpoint holds a send to rank {dest}, which the job does \
                         not have: it was written by another program or job"
                    )));
                }
                let id = self
                    .send_inner(
                        *dest as usize,
                        q.ctx,
                        *tag,
                        SendData::Owned(Box::new(buf.clone())),
                        SendOpts {
                            cma_ok: false,
                            ..SendOpts::REQUEST
                        },
                    )?
                    .unwrap_or(0);
                if let Some(s) = self.sends.get_mut(&id) {
                    s.meta.2 = q.elem;
                }
                if *waited {
                    self.detach(id);
                } else {
                    resent_ids.insert(i, id);
                }
            }
        }
        if !want.is_empty() {
            let deadline = Instant::now() + timeout;
            let filled = |e: &Engine| {
                e.restoring.as_ref().is_none_or(|rs| {
                    rs.want
                        .iter()
                        .all(|(p, n)| rs.got.get(p).map_or(0, |q| q.len()) >= *n)
                })
            };
            let missing = |e: &Engine| -> Vec<usize> {
                let mut v: Vec<usize> = e.restoring.as_ref().map_or(Vec::new(), |rs| {
                    rs.want
                        .iter()
                        .filter(|(p, n)| rs.got.get(p).map_or(0, |q| q.len()) < **n)
                        .map(|(p, _)| *p)
                        .collect()
                });
                v.sort_unstable();
                v
            };
            self.wait_until(|e| {
                filled(e)
                    || Instant::now() >= deadline
                    || missing(e).iter().any(|p| e.check_peer(*p).is_err())
            })?;
            if !filled(self) {
                let m = missing(self);
                let gone = m.iter().find_map(|p| self.check_peer(*p).err());
                return Err(Error::Init(match gone {
                    Some(err) => format!(
                        "restart from epoch {epoch}: ranks {m:?} did not send again the large \
                         messages they held at that epoch: {err}"
                    ),
                    None => format!(
                        "restart from epoch {epoch}: ranks {m:?} did not send again within \
                         {timeout:?} the large messages they held at that epoch (their \
                         checkpoints do not hold them: checkpoints of different jobs?)"
                    ),
                }));
            }
        }
        let mut rs = self.restoring.take().unwrap_or_default();
        // Each slot's message, in order: a sender's slots are filled in the order it sent.
        let mut fill = |source: u32| -> Result<Held, Error> {
            rs.got
                .get_mut(&(source as usize))
                .and_then(|q| q.pop_front())
                .ok_or_else(|| {
                    Error::Init(format!(
                        "restart from epoch {epoch}: no message of rank {source} for a place \
                         the checkpoint keeps"
                    ))
                })
        };
        // The unexpected queue, with the held messages in their places.
        let mut queue = Vec::new();
        let mut slots = c.resent.iter().filter(|s| !s.late).peekable();
        for i in 0..=c.unexpected.len() {
            while let Some(s) = slots.next_if(|s| s.before as usize <= i) {
                let peer = s.source as usize;
                let seq = 0;
                queue.push(match fill(s.source)? {
                    Held::Eager(ctx, tag, bytes) => Unexpected {
                        peer,
                        ctx,
                        tag,
                        body: UnexBody::Eager(bytes),
                        seq,
                    },
                    Held::Rts(hdr, len, cma) => Unexpected::announced(peer, hdr, len, cma, seq),
                });
            }
            if let Some(m) = c.unexpected.get(i) {
                queue.push(Unexpected {
                    peer: m.source as usize,
                    ctx: m.ctx,
                    tag: m.tag,
                    body: UnexBody::Eager(m.bytes.clone()),
                    seq: 0,
                });
            }
        }
        for u in queue.into_iter().rev() {
            self.unexpected.push_front(u);
        }
        let reqs = self.restore_requests(c.requests, &resent_ids)?;
        // The channel state, with the held messages announced late in their places.
        let mut slots = c.resent.iter().filter(|s| s.late).peekable();
        for i in 0..=c.late.len() {
            while let Some(s) = slots.next_if(|s| s.before as usize <= i) {
                let f = fill(s.source)?;
                self.deliver_now(s.source as usize, f);
            }
            if let Some(m) = c.late.get(i) {
                self.deliver_eager(m.source as usize, m.ctx, m.tag, m.bytes.clone());
            }
        }
        for (peer, f) in rs.deferred {
            self.deliver_now(peer, f);
        }
        Ok((c.app, reqs))
    }

    /// A restore from `epoch` is coming whose checkpoint keeps `slots`: from now on the first
    /// application frames of each sender fill them, and later ones wait for the restore
    /// (call before anything is read, when something may be read before [`Engine::restore`]).
    /// Returns how many each sender sends again.
    pub(crate) fn expect_resent(
        &mut self,
        epoch: u64,
        slots: &[crate::ckpt::ResentSlot],
    ) -> Result<HashMap<usize, usize>, Error> {
        let mut want: HashMap<usize, usize> = HashMap::new();
        for slot in slots {
            let src = slot.source as usize;
            if src >= self.peers.len() || src == self.rank {
                return Err(Error::Init(format!(
                    "restart: the checkpoint of epoch {epoch} keeps a place for a message of \
                     rank {src}, which cannot send one here: it was written by another program \
                     or job"
                )));
            }
            *want.entry(src).or_default() += 1;
        }
        self.restoring.get_or_insert_with(Restoring::default).want = want.clone();
        Ok(want)
    }

    /// Re-create the requests of a restored snapshot (before anything new arrives): receives
    /// are posted again, in their order; finished ones wait to be taken; held sends are the
    /// ones [`Engine::restore`] sent again (`resent`: request index → send id). Their buffers
    /// are bytes until the program names the type ([`Engine::retype`]).
    fn restore_requests(
        &mut self,
        reqs: Vec<crate::ckpt::SavedRequest>,
        resent: &HashMap<usize, u64>,
    ) -> Result<Vec<RestoredReq>, Error> {
        use crate::ckpt::SavedRequestState as St;
        let mut out = Vec::with_capacity(reqs.len());
        for (i, q) in reqs.into_iter().enumerate() {
            let bad = |what: &str| {
                Error::Init(format!(
                    "restart: the checkpoint holds a request {what}: it was written by another \
                     program or job"
                ))
            };
            match q.state {
                St::Recv { source, tag, into } => {
                    if source.is_some_and(|s| s as usize >= self.peers.len()) {
                        return Err(bad("from a rank the job does not have"));
                    }
                    let dest = match into {
                        Some(b) => Dest::Owned(Box::new(b)),
                        None => Dest::Alloc(discard_alloc),
                    };
                    let id = self.post_recv(q.ctx, source.map(|s| s as usize), tag, dest)?;
                    if let Some(r) = self.recvs.get_mut(&id) {
                        r.elem = q.elem;
                    }
                    out.push(RestoredReq {
                        id,
                        is_recv: true,
                        ctx: q.ctx,
                        elem: q.elem,
                        peer: source,
                        tag,
                    });
                }
                St::Received {
                    source,
                    tag,
                    len,
                    buf,
                } => {
                    let id = self.new_id();
                    self.recvs.insert(
                        id,
                        Recv {
                            ctx: q.ctx,
                            src: Some(source as usize),
                            tag: Some(tag),
                            dest: Dest::Owned(Box::new(buf)),
                            len: len as usize,
                            state: RecvState::Done,
                            status: Some(Status {
                                source: source as usize,
                                tag,
                                bytes: len as usize,
                            }),
                            err: None,
                            detached: false,
                            elem: q.elem,
                            alloc: false,
                            after_cut: None,
                        },
                    );
                    out.push(RestoredReq {
                        id,
                        is_recv: true,
                        ctx: q.ctx,
                        elem: q.elem,
                        peer: Some(source),
                        tag: Some(tag),
                    });
                }
                St::Sent { dest, tag, buf } => {
                    if dest as usize >= self.peers.len() {
                        return Err(bad("to a rank the job does not have"));
                    }
                    let id = self.new_id();
                    let mut sd = done_send(dest as usize, SendData::Owned(Box::new(buf)));
                    sd.meta = (q.ctx, tag, q.elem);
                    self.sends.insert(id, sd);
                    out.push(RestoredReq::send(id, (q.ctx, q.elem), dest, tag));
                }
                St::Held { waited: true, .. } => {}
                St::Held { dest, tag, .. } => {
                    let id = *resent
                        .get(&i)
                        .ok_or_else(|| bad("held but not sent again"))?;
                    out.push(RestoredReq::send(id, (q.ctx, q.elem), dest, tag));
                }
            }
        }
        Ok(out)
    }

    /// Give a restored request's buffer the program's element type `T` (it was bytes).
    pub(crate) fn retype<T: bytemuck::Pod>(&mut self, id: u64, is_recv: bool) -> Result<(), Error> {
        let elem = std::mem::size_of::<T>();
        let cast = |b: &dyn Buf| -> Result<Box<dyn Buf>, Error> {
            let bytes = b.bytes();
            if elem == 0 || bytes.len() % elem != 0 {
                return Err(Error::ElementSize {
                    bytes: bytes.len(),
                    elem,
                });
            }
            Ok(Box::new(bytemuck::pod_collect_to_vec::<u8, T>(bytes)))
        };
        if is_recv {
            let Some(r) = self.recvs.get_mut(&id) else {
                return Ok(()); // taken already
            };
            r.dest = match &r.dest {
                Dest::Owned(b) => Dest::Owned(cast(b.as_ref())?),
                Dest::Alloc(_) => Dest::Alloc(crate::comm::alloc_vec::<T>),
                Dest::Borrowed(..) => return Ok(()),
            };
            // A finished irecv of any length whose message does not fit `T`: as at arrival.
            if r.state == RecvState::Done && r.status.is_some_and(|s| s.bytes % elem != 0) {
                r.err.get_or_insert(Error::ElementSize {
                    bytes: r.status.map_or(0, |s| s.bytes),
                    elem,
                });
            }
        } else if let Some(s) = self.sends.get_mut(&id) {
            // (A held send sent again streams from this buffer, never by cross-memory copy:
            // replacing it with the same bytes changes nothing on the wire.)
            if let SendData::Owned(b) = &s.data {
                s.data = SendData::Owned(cast(b.as_ref())?);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mio::net::TcpStream;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream as StdStream};

    /// An engine for rank 0 of 2 whose peer is a raw socket the test controls.
    fn engine_with_raw_peer() -> (Engine, StdStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let raw = StdStream::connect(l.local_addr().unwrap()).unwrap();
        let (ours, _) = l.accept().unwrap();
        ours.set_nonblocking(true).unwrap();
        let peers = vec![
            Peer::new(None),
            Peer::new(Some(Box::new(crate::transport::TcpTransport::new(
                TcpStream::from_std(ours),
            )))),
        ];
        let e = Engine::new(
            0,
            2,
            peers,
            Tuning {
                eager_limit: 1024,
                shm_eager_limit: 1024,
                spin: Duration::from_micros(10),
                spin_shm: Duration::from_micros(10),
                yield_for: Duration::ZERO,
                polite_yield: POLITE_YIELD,
                cma: false,
                outnumbered: false,
            },
        )
        .unwrap();
        (e, raw)
    }

    /// An eager frame of context 0: header and payload, as a peer writes it.
    fn eager_frame(tag: i32, payload: &[u8]) -> Vec<u8> {
        let h = Header {
            kind: Kind::Eager,
            tag,
            ctx: 0,
            len: payload.len() as u64,
            id: 0,
        };
        let mut v = h.encode().to_vec();
        v.extend_from_slice(payload);
        v
    }

    fn recv_error(e: &mut Engine) -> Error {
        let id = e
            .post_recv(0, Some(1), None, Dest::Alloc(discard_alloc))
            .unwrap();
        e.wait_until(|e| e.recv_finished(id)).unwrap();
        e.take_recv(id).err().expect("the receive must fail")
    }

    /// Requests in flight survive a snapshot and a restore: a posted `irecv_into` (its buffer
    /// kept), an `irecv` completed before the snapshot, a finished send; typed again, they
    /// complete as before.
    #[test]
    fn requests_in_flight_are_saved_restored_and_typed_again() {
        use crate::ckpt::SavedRequestState as St;
        let (mut e, _raw) = engine_with_raw_peer();
        // Posted, from the peer, into an owned buffer of u32.
        let into = e
            .post_recv(0, Some(1), Some(3), Dest::Owned(Box::new(vec![9u32; 4])))
            .unwrap();
        // (What `set_recv_elem` records in a job with checkpoints.)
        e.recvs.get_mut(&into).unwrap().elem = 4;
        // Completed (a message to itself), into an exact-size Vec<u16>.
        let done = e
            .post_recv(
                0,
                Some(0),
                Some(4),
                Dest::Alloc(crate::comm::alloc_vec::<u16>),
            )
            .unwrap();
        e.recvs.get_mut(&done).unwrap().elem = 2;
        let s1 = e
            .start_send(0, 0, 4, SendData::Owned(Box::new(vec![7u16, 8, 9])))
            .unwrap();
        e.sends.get_mut(&s1).unwrap().meta.2 = 2;
        assert!(e.recv_finished(done));
        e.check_requests().unwrap();
        let saved = e.snapshot_runtime(1).unwrap().requests;
        assert_eq!(saved.len(), 3);
        assert!(matches!(
            &saved[0].state,
            St::Recv { source: Some(1), tag: Some(3), into: Some(b) } if b.len() == 16
        ));
        assert!(matches!(
            &saved[1].state,
            St::Received { source: 0, tag: 4, len: 6, buf } if buf.len() == 6
        ));
        assert!(matches!(&saved[2].state, St::Sent { dest: 0, tag: 4, buf } if buf.len() == 6));
        assert_eq!(saved.iter().map(|q| q.elem).collect::<Vec<_>>(), [4, 2, 2]);

        // A new incarnation.
        let (mut e2, mut raw2) = engine_with_raw_peer();
        let back = e2.restore_requests(saved, &HashMap::new()).unwrap();
        assert_eq!(
            back.iter()
                .map(|q| (q.is_recv, q.peer, q.tag))
                .collect::<Vec<_>>(),
            [
                (true, Some(1), Some(3)),
                (true, Some(0), Some(4)),
                (false, Some(0), Some(4))
            ]
        );
        for q in &back {
            match q.elem {
                4 => e2.retype::<u32>(q.id, q.is_recv).unwrap(),
                _ => e2.retype::<u16>(q.id, q.is_recv).unwrap(),
            }
        }
        // The re-posted receive takes the peer's message into the saved buffer.
        raw2.write_all(&eager_frame(3, &[1, 0, 0, 0, 2, 0, 0, 0]))
            .unwrap();
        e2.wait_until(|e| e.recv_finished(back[0].id)).unwrap();
        let (st, buf) = e2.take_recv(back[0].id).unwrap();
        assert_eq!((st.source, st.tag, st.bytes), (1, 3, 8));
        let v = *buf.unwrap().into_any().downcast::<Vec<u32>>().unwrap();
        assert_eq!(
            v,
            [1, 2, 9, 9],
            "the message, then the buffer's saved contents"
        );
        let (st, buf) = e2.take_recv(back[1].id).unwrap();
        assert_eq!((st.source, st.tag, st.bytes), (0, 4, 6));
        let v = *buf.unwrap().into_any().downcast::<Vec<u16>>().unwrap();
        assert_eq!(v, [7, 8, 9]);
        let v = *e2
            .take_send(back[2].id)
            .unwrap()
            .unwrap()
            .into_any()
            .downcast::<Vec<u16>>()
            .unwrap();
        assert_eq!(
            v,
            [7, 8, 9],
            "the send's buffer comes back; nothing is sent again"
        );
        assert!(e2.peers[1].txq.is_empty());
    }

    /// A checkpoint of this engine's runtime state at `epoch`, no program state.
    fn blob(e: &Engine, epoch: u64) -> crate::ckpt::RankCheckpoint {
        let rt = e.snapshot_runtime(epoch).unwrap();
        crate::ckpt::RankCheckpoint {
            epoch,
            rank: e.rank as u32,
            size: e.size as u32,
            comms: Vec::new(),
            requests: rt.requests,
            unexpected: rt.unexpected,
            late: Vec::new(),
            app: Vec::new(),
            spawns: Vec::new(),
            resent: rt.resent,
        }
    }

    fn read_header(raw: &mut StdStream) -> Header {
        use std::io::Read;
        let mut h = [0u8; HEADER_LEN];
        raw.read_exact(&mut h).unwrap();
        Header::decode(&h).unwrap()
    }

    /// A capped send goes by rendezvous above its cap although it is under the eager limit;
    /// at or under the cap it stays eager.
    #[test]
    fn a_send_above_its_cap_goes_by_rendezvous_under_the_eager_limit() {
        let (mut e, mut raw) = engine_with_raw_peer();
        let eager = e
            .start_send_capped(1, 0, 1, SendData::Owned(Box::new(vec![1u8; 100])), 100)
            .unwrap();
        let h = read_header(&mut raw);
        assert_eq!((h.kind, h.len), (Kind::Eager, 100));
        assert!(e.send_finished(eager));
        let mut body = [0u8; 100];
        std::io::Read::read_exact(&mut raw, &mut body).unwrap();
        let rdv = e
            .start_send_capped(1, 0, 2, SendData::Owned(Box::new(vec![2u8; 101])), 100)
            .unwrap();
        let h = read_header(&mut raw);
        assert_eq!((h.kind, h.tag, h.len), (Kind::Rts, 2, 101));
        assert!(!e.send_finished(rdv), "a rendezvous waits for the receiver");
    }

    /// A large isend its receiver has not matched at a checkpoint point is held: saved with
    /// its buffer, sent again exactly once by a restore (one announcement, the data once asked
    /// for, nothing more), and its restored request completes with the buffer.
    #[test]
    fn a_large_send_in_progress_is_held_and_sent_again_once_after_a_restore() {
        use crate::ckpt::SavedRequestState as St;
        use std::io::Read;
        let (mut e, mut raw) = engine_with_raw_peer();
        let big = e
            .start_send(1, 0, 1, SendData::Owned(Box::new(vec![7u8; 4096])))
            .unwrap();
        assert_eq!(read_header(&mut raw).kind, Kind::Rts);
        e.check_requests().unwrap();
        assert!(!e.send_finished(big));
        let c = blob(&e, 1);
        assert!(
            matches!(&c.requests[..], [q] if matches!(&q.state, St::Held { dest: 1, tag: 1, buf, waited: false } if *buf == vec![7u8; 4096])),
            "{:?}",
            c.requests.iter().map(|q| &q.state).collect::<Vec<_>>()
        );
        // A new incarnation: the restore sends it again before anything else.
        let (mut e2, mut raw2) = engine_with_raw_peer();
        let (_, back) = e2.restore(c, Duration::from_secs(5)).unwrap();
        let [q] = &back[..] else {
            panic!("one request back: {back:?}")
        };
        assert_eq!((q.is_recv, q.peer, q.tag), (false, Some(1), Some(1)));
        let rts = read_header(&mut raw2);
        assert_eq!(
            (rts.kind, rts.tag, rts.len, rts.id),
            (Kind::Rts, 1, 4096, q.id)
        );
        let cts = Header {
            kind: Kind::Cts,
            tag: 0,
            ctx: 0,
            len: 77,
            id: q.id,
        };
        raw2.write_all(&cts.encode()).unwrap();
        e2.wait_until(|e| e.send_finished(q.id)).unwrap();
        let data = read_header(&mut raw2);
        assert_eq!((data.kind, data.len, data.id), (Kind::Data, 4096, 77));
        let mut body = vec![0u8; 4096];
        raw2.read_exact(&mut body).unwrap();
        assert_eq!(body, vec![7u8; 4096]);
        let v = *e2
            .take_send(q.id)
            .unwrap()
            .unwrap()
            .into_any()
            .downcast::<Vec<u8>>()
            .unwrap();
        assert_eq!(v, vec![7u8; 4096]);
        // Exactly once: nothing more on the wire.
        raw2.set_nonblocking(true).unwrap();
        e2.poke().unwrap();
        assert!(raw2.read(&mut [0u8; 1]).is_err(), "a second copy was sent");
        e.forget_send(big);
    }

    /// Give `e` (rank 0 of 2) checkpoint waves: a wave starts at once when asked.
    fn with_waves(e: &mut Engine, mode: crate::ckpt::Mode) {
        e.ckpt = Some(CkptRt::new(
            crate::ckpt::Wave::new(
                0,
                2,
                mode,
                0,
                Duration::from_millis(1),
                Duration::from_secs(60),
                Duration::ZERO,
            ),
            Duration::from_secs(1),
            None,
        ));
    }

    /// Blocking mode: a large send its receiver matched after its cut (the FIN comes after
    /// the receiver's cut marker) and that the program waited for before this rank's
    /// checkpoint point is still held by the snapshot, then sent again by a restore in the
    /// background (the program has no request for it any more).
    #[test]
    fn a_large_send_matched_after_the_receivers_cut_and_waited_for_is_still_held() {
        use crate::ckpt::{Marker, Mode, SafePoint, SavedRequestState as St};
        let (mut e, mut raw) = engine_with_raw_peer();
        with_waves(&mut e, Mode::Blocking);
        let c = e.ckpt.as_mut().unwrap();
        let _ = c.wave.tick(Duration::from_millis(5));
        let epoch = c.wave.active_epoch().unwrap();
        let a = e
            .start_send(1, 0, 3, SendData::Owned(Box::new(vec![3u8; 4096])))
            .unwrap();
        // The receiver's cut, then its FIN for `a`; the program waits for `a`.
        raw.write_all(&Header::marker(Marker::Cut(epoch, 2)).encode())
            .unwrap();
        let fin = Header {
            kind: Kind::Fin,
            tag: 0,
            ctx: 0,
            len: 0,
            id: a,
        };
        raw.write_all(&fin.encode()).unwrap();
        e.wait_until(|e| e.send_finished(a)).unwrap();
        e.take_send(a).unwrap();
        // This rank's checkpoint point and snapshot.
        let c = e.ckpt.as_mut().unwrap();
        assert_eq!(c.wave.at_safe_point(), SafePoint::Continue);
        assert!(matches!(c.wave.at_safe_point(), SafePoint::Cut { .. }));
        let c = blob(&e, epoch);
        assert!(
            matches!(&c.requests[..], [q] if matches!(&q.state, St::Held { dest: 1, tag: 3, waited: true, buf } if buf.len() == 4096)),
            "{:?}",
            c.requests
        );
        let (mut e2, mut raw2) = engine_with_raw_peer();
        let (_, back) = e2.restore(c, Duration::from_secs(5)).unwrap();
        assert!(
            back.is_empty(),
            "no request for a send the program waited for"
        );
        let rts = read_header(&mut raw2);
        assert_eq!((rts.kind, rts.tag, rts.len), (Kind::Rts, 3, 4096));
    }

    /// Nonblocking mode: a large send not yet matched at this rank's snapshot is held only
    /// tentatively. A FIN (or clear-to-send) arriving before the receiver's cut marker puts
    /// it in the cut after all (the receiver matched it before its cut); one arriving after
    /// that marker leaves it held, even once the send has finished.
    #[test]
    fn nonblocking_a_send_matched_before_the_receivers_cut_leaves_the_held_ones() {
        use crate::ckpt::{Marker, Mode, SafePoint, SavedRequestState as St};
        let (mut e, mut raw) = engine_with_raw_peer();
        with_waves(&mut e, Mode::Nonblocking);
        let (a, b) = (
            e.start_send(1, 0, 1, SendData::Owned(Box::new(vec![1u8; 4096])))
                .unwrap(),
            e.start_send(1, 0, 2, SendData::Owned(Box::new(vec![2u8; 4096])))
                .unwrap(),
        );
        // A wave, cut at this rank's second checkpoint point; the snapshot at once.
        let c = e.ckpt.as_mut().unwrap();
        let _ = c.wave.tick(Duration::from_millis(5));
        assert_eq!(c.wave.at_safe_point(), SafePoint::Continue);
        let SafePoint::Cut { epoch, .. } = c.wave.at_safe_point() else {
            panic!("no cut at the second checkpoint point")
        };
        let rt = e.snapshot_runtime(epoch).unwrap();
        let c = e.ckpt.as_mut().unwrap();
        assert_eq!(rt.tentative.len(), 2);
        c.tentative = rt.tentative;
        let pending = blob(&e, epoch);
        let c = e.ckpt.as_mut().unwrap();
        c.pending = Some(pending);
        let _ = c.wave.snapshot_taken();
        let fin = |id: u64| Header {
            kind: Kind::Fin,
            tag: 0,
            ctx: 0,
            len: 0,
            id,
        };
        // `a` is matched before the receiver's cut: in the cut after all.
        raw.write_all(&fin(a).encode()).unwrap();
        e.wait_until(|e| e.send_finished(a)).unwrap();
        let states: Vec<&St> = e
            .ckpt
            .as_ref()
            .unwrap()
            .pending
            .as_ref()
            .unwrap()
            .requests
            .iter()
            .map(|q| &q.state)
            .collect();
        assert!(
            matches!(
                states[..],
                [St::Sent { tag: 1, .. }, St::Held { tag: 2, .. }]
            ),
            "{states:?}"
        );
        // Then the receiver's cut, then `b`'s FIN: after the cut, so held at this epoch.
        raw.write_all(&Header::marker(Marker::Cut(epoch, 2)).encode())
            .unwrap();
        raw.write_all(&fin(b).encode()).unwrap();
        e.wait_until(|e| e.send_finished(b)).unwrap();
        assert_eq!(e.sends[&b].acked, Some(Some(epoch)));
        let again = e.snapshot_runtime(epoch).unwrap().requests;
        assert!(
            matches!(
                (&again[0].state, &again[1].state),
                (St::Sent { tag: 1, .. }, St::Held { tag: 2, .. })
            ),
            "{again:?}"
        );
    }

    /// On the receiving side an unmatched announcement is left out of the snapshot and its
    /// place kept: after a restore the message its sender sends again takes that place,
    /// before a message that arrived after it, as in the run that was not interrupted.
    #[test]
    fn a_held_message_sent_again_keeps_its_place_before_later_ones() {
        let (mut e, mut raw) = engine_with_raw_peer();
        let eager = |tag: i32, b: u8| eager_frame(tag, &[b; 4]);
        let rts = Header {
            kind: Kind::Rts,
            tag: 5,
            ctx: 0,
            len: 4096,
            id: 9,
        };
        raw.write_all(&rts.encode()).unwrap();
        raw.write_all(&eager(5, 2)).unwrap();
        e.wait_until(|e| e.unexpected.len() == 2).unwrap();
        let c = blob(&e, 3);
        assert_eq!(
            c.unexpected.len(),
            1,
            "the announcement is not in the snapshot"
        );
        assert_eq!(
            c.resent,
            vec![crate::ckpt::ResentSlot {
                source: 1,
                late: false,
                before: 0
            }]
        );
        // Restored: the sender sends the held message again first (here small enough to be
        // eager), then a new one; receives of tag 5 get them in the original order.
        let (mut e2, mut raw2) = engine_with_raw_peer();
        raw2.write_all(&eager(5, 1)).unwrap();
        raw2.write_all(&eager(5, 3)).unwrap();
        e2.restore(c, Duration::from_secs(5)).unwrap();
        let mut got = Vec::new();
        for _ in 0..3 {
            let id = e2
                .post_recv(0, Some(1), Some(5), Dest::Alloc(discard_alloc))
                .unwrap();
            e2.wait_until(|e| e.recv_finished(id)).unwrap();
            let (_, b) = e2.take_recv(id).unwrap();
            got.push(b.unwrap().bytes()[0]);
        }
        assert_eq!(got, [1, 2, 3], "held, then saved, then new");
    }

    #[test]
    fn corrupt_frame_fails_the_peer_with_a_protocol_error() {
        let (mut e, mut raw) = engine_with_raw_peer();
        raw.write_all(&[0xEE; HEADER_LEN]).unwrap();
        match recv_error(&mut e) {
            Error::PeerFailed { rank: 1, reason } => {
                assert!(reason.contains("protocol error"), "{reason}")
            }
            other => panic!("unexpected {other:?}"),
        }
        // Later operations fail at once, no hang.
        assert!(e
            .start_send(1, 0, 0, SendData::Owned(Box::new(vec![1u8])))
            .is_err());
    }

    #[test]
    fn truncated_frame_then_close_is_a_failure_not_a_hang() {
        let (mut e, mut raw) = engine_with_raw_peer();
        let h = Header {
            kind: Kind::Eager,
            tag: 0,
            ctx: 0,
            len: 100,
            id: 0,
        };
        raw.write_all(&h.encode()).unwrap();
        raw.write_all(&[1u8; 10]).unwrap();
        drop(raw);
        assert!(matches!(
            recv_error(&mut e),
            Error::PeerFailed { rank: 1, .. }
        ));
    }

    /// A whole message and the peer's close that reach the socket before the poller looks give
    /// one readiness event (readable and peer-closed at once). The read that takes the message
    /// is short, which normally means "drained, wait for the next edge"; here no edge will come,
    /// so the close must still be seen: the message is delivered, then the next receive fails
    /// instead of waiting forever.
    #[test]
    fn a_message_and_the_close_in_one_readiness_event_give_the_message_then_the_failure() {
        let (mut e, mut raw) = engine_with_raw_peer();
        raw.write_all(&eager_frame(7, &[4, 5, 6])).unwrap();
        drop(raw);
        // Let the data and the FIN both arrive before the engine's first poll.
        std::thread::sleep(Duration::from_millis(50));
        let id = e
            .post_recv(0, Some(1), None, Dest::Alloc(discard_alloc))
            .unwrap();
        e.wait_until(|e| e.recv_finished(id)).unwrap();
        let (st, buf) = e.take_recv(id).unwrap();
        assert_eq!((st.tag, st.bytes), (7, 3));
        assert_eq!(buf.unwrap().bytes(), &[4, 5, 6]);
        // Polled without blocking, with a bound, so a missed close fails the test, not hangs it.
        let id = e
            .post_recv(0, Some(1), None, Dest::Alloc(discard_alloc))
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !e.recv_finished(id) && Instant::now() < deadline {
            e.poke().unwrap();
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(e.recv_finished(id), "the peer's close was never noticed");
        assert!(matches!(
            e.take_recv(id),
            Err(Error::PeerFailed { rank: 1, .. })
        ));
    }

    /// (spun passes, yields, sleeps) of a 30 ms wait for a message from a TCP peer, with a spin
    /// budget of `spin` and the machine counted busy or not.
    fn tcp_wait_with(busy: crate::busy::BusyProbe, spin: Duration) -> (u64, u64, u64) {
        let (mut e, raw) = engine_with_raw_peer();
        e.tuning.spin = spin;
        e.busy = busy;
        wait_for_a_late_message(&mut e, raw, Duration::from_millis(30));
        (e.spun, e.yields, e.sleeps)
    }

    /// `e` waits for a 1-byte message that the raw peer sends after `delay`.
    fn wait_for_a_late_message(e: &mut Engine, mut raw: StdStream, delay: Duration) {
        let id = e
            .post_recv(0, Some(1), None, Dest::Alloc(discard_alloc))
            .unwrap();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(delay);
            raw.write_all(&eager_frame(1, &[9])).unwrap();
            raw
        });
        e.wait_until(|e| e.recv_finished(id)).unwrap();
        let _raw = sender.join().unwrap();
        assert_eq!(e.take_recv(id).unwrap().0.bytes, 1);
    }

    /// With TCP peers the sockets are read after every yield; with shared-memory peers only,
    /// after one yield in 32.
    #[test]
    fn a_yielding_rank_reads_shared_memory_peers_sockets_once_in_32_yields() {
        assert!((1..=64).all(|y| sockets_after_yield(true, y)));
        let looks: Vec<u64> = (1..=96)
            .filter(|&y| sockets_after_yield(false, y))
            .collect();
        assert_eq!(looks, [32, 64, 96]);
    }

    /// Without a spin budget (ranks outnumber cores) a waiting rank never spins: every idle
    /// pass goes to the yield phase (and then to sleep). With a budget it spins first.
    #[test]
    fn a_rank_without_a_spin_budget_yields_at_once() {
        let wait = |spin: Duration| {
            let (mut e, raw) = engine_with_raw_peer();
            e.tuning.spin = spin;
            e.tuning.yield_for = Duration::from_millis(2);
            if let Some(quiet) = crate::busy::BusyProbe::with_cpus(usize::MAX) {
                e.busy = quiet; // whatever else runs now, the machine counts as not busy
            }
            wait_for_a_late_message(&mut e, raw, Duration::from_millis(5));
            (e.spun, e.yields)
        };
        let (spun, yields) = wait(Duration::ZERO);
        assert_eq!(spun, 0, "no budget: spun {spun} passes");
        assert!(yields > 0, "no budget: never yielded");
        let (spun, _) = wait(Duration::from_micros(200));
        assert!(spun > 0, "a 200 µs budget: never spun");
    }

    /// With TCP peers on an oversubscribed machine a waiting rank sleeps at its first idle pass:
    /// no spin, no yield (a yield would hand the core to the busy process for the rest of its
    /// slice; asleep, the data wakes it at once). On a machine that is not busy it spins and
    /// then sleeps, without yielding (no yield phase when ranks do not outnumber cores).
    #[test]
    fn a_tcp_wait_on_a_busy_machine_sleeps_at_its_first_idle_pass() {
        let (Some(busy), Some(quiet)) = (
            crate::busy::BusyProbe::with_cpus(0),
            crate::busy::BusyProbe::with_cpus(usize::MAX),
        ) else {
            return; // no procfs: the probe never says busy (its parse tests cover the rest)
        };
        let (spun, yields, sleeps) = tcp_wait_with(busy, Duration::from_millis(10));
        assert_eq!((spun, yields), (0, 0), "busy: spun or yielded");
        assert!(sleeps > 0, "busy: never slept");
        let (spun, yields, sleeps) = tcp_wait_with(quiet, Duration::from_millis(10));
        assert!(spun > 0, "quiet: never spun");
        assert_eq!(yields, 0, "quiet: the spin yielded");
        assert!(
            sleeps > 0,
            "quiet: a 10 ms spin in a 30 ms wait, yet never slept"
        );
    }

    /// With shared-memory peers only, an oversubscribed machine turns the rest of the spin into
    /// yields (the machine's first look comes [`BUSY_FIRST_SHM`] into it): the message, written
    /// to the ring 5 ms into a 20 ms spin, is found between yields, without a sleep.
    #[test]
    fn a_shared_memory_wait_on_a_busy_machine_yields_for_the_rest_of_its_spin() {
        let Some(busy) = crate::busy::BusyProbe::with_cpus(0) else {
            return; // no procfs: the probe never says busy (its parse tests cover the rest)
        };
        let (mut e, mut ends) = engine_with_shm_peer("busyyield");
        e.busy = busy;
        let id = e
            .post_recv(0, Some(1), None, Dest::Alloc(discard_alloc))
            .unwrap();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            let (n, _) = ends
                .tx
                .write_vectored(&[IoSlice::new(&eager_frame(1, &[9]))]);
            assert_eq!(n, HEADER_LEN + 1);
            ends
        });
        e.wait_until(|e| e.recv_finished(id)).unwrap();
        let _ends = writer.join().unwrap();
        assert_eq!(e.take_recv(id).unwrap().0.bytes, 1);
        assert!(e.yields > 0, "busy: the spin never yielded");
        assert_eq!(
            e.sleeps, 0,
            "the message came within the spin, yet the rank slept"
        );
    }

    /// A rank is "mid-transfer" on TCP exactly while a message is partly read from a TCP
    /// peer, and no longer once it is whole; the bytes read are counted for the link's rate.
    #[test]
    fn a_message_half_read_from_a_tcp_peer_is_a_transfer_in_progress() {
        let (mut e, mut raw) = engine_with_raw_peer();
        assert!(!e.tcp_mid_transfer(), "nothing sent yet");
        let frame = eager_frame(7, &[5u8; 4000]);
        raw.write_all(&frame[..HEADER_LEN + 1000]).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !e.tcp_mid_transfer() && Instant::now() < deadline {
            e.progress_once(true).unwrap();
        }
        assert!(e.tcp_mid_transfer(), "header and 1000 of 4000 bytes read");
        raw.write_all(&frame[HEADER_LEN + 1000..]).unwrap();
        while e.tcp_mid_transfer() && Instant::now() < deadline {
            e.progress_once(true).unwrap();
        }
        assert!(!e.tcp_mid_transfer(), "the whole message is in");
        assert_eq!(
            e.tcp_moved,
            frame.len() as u64,
            "bytes read from the TCP peer"
        );
    }

    /// The link counts as fast at loopback's pace and not at a 30 Mbit/s link's or a 1 Gbit/s
    /// LAN's; without new bytes the rate decays, so a spin through a gap ends.
    #[test]
    fn the_link_rate_tells_a_fast_link_from_a_slow_one() {
        let t = Instant::now();
        let us = |n: u64| t + Duration::from_micros(n);
        // Loopback: 256 KiB in the first 100 µs (2.6 GB/s), then a quiet gap.
        let mut r = LinkRate::new(t, 0);
        assert!(r.fast(us(100), 256 << 10));
        assert!(r.fast(us(400), 256 << 10), "a 300 µs gap after 2.6 GB/s");
        assert!(
            !r.fast(us(600), 256 << 10),
            "no new bytes for 500 µs: 262 144 bytes over 600 µs is below 500 B/µs"
        );
        // 30 Mbit/s: a 1448-byte frame every ~390 µs.
        let mut r = LinkRate::new(t, 0);
        for i in 1..=20u64 {
            assert!(!r.fast(us(390 * i + 50), 1448 * i), "frame {i}");
        }
        // 1 Gbit/s: 125 bytes a µs.
        let mut r = LinkRate::new(t, 0);
        for i in 1..=20u64 {
            assert!(!r.fast(us(100 * i), 12_500 * i), "100 µs step {i}");
        }
        // No bytes at all is never fast, even at once.
        let mut r = LinkRate::new(t, 7);
        assert!(!r.fast(t, 7));
        // The window moves: a fast first millisecond does not make a slow second one fast.
        let mut r = LinkRate::new(t, 0);
        assert!(r.fast(us(1000), 4 << 20));
        assert!(r.fast(us(1500), 4 << 20), "the last 1.5 ms moved 4 MiB");
        assert!(
            !r.fast(us(2100), (4 << 20) + 1448),
            "the last 1.1 ms moved one frame"
        );
    }

    /// A message trickling in from a slow peer (the header, then 1448-byte pieces 600 µs
    /// apart: ~2.4 MB/s, a 20 Mbit/s link) is waited for by sleeping between the pieces, not
    /// by spinning through them, although each gap is shorter than the mid-transfer spin
    /// (1 ms) that a fast link gets.
    #[test]
    fn a_wait_on_a_slow_tcp_transfer_sleeps_between_the_pieces() {
        let (mut e, mut raw) = engine_with_raw_peer();
        e.tuning.spin = Duration::from_micros(50);
        let id = e
            .post_recv(0, Some(1), None, Dest::Alloc(discard_alloc))
            .unwrap();
        let frame = eager_frame(1, &[3u8; 10 * 1448]);
        let sender = std::thread::spawn(move || {
            raw.write_all(&frame[..HEADER_LEN]).unwrap();
            for piece in frame[HEADER_LEN..].chunks(1448) {
                std::thread::sleep(Duration::from_micros(600));
                raw.write_all(piece).unwrap();
            }
            raw
        });
        e.wait_until(|e| e.recv_finished(id)).unwrap();
        let _raw = sender.join().unwrap();
        assert_eq!(e.take_recv(id).unwrap().0.bytes, 10 * 1448);
        // 10 gaps, 9 of them mid-transfer; a gap is lost only when the waiting thread is
        // scheduled too late to see it.
        assert!(
            e.sleeps >= 3,
            "slept {} times in 10 gaps of 600 µs",
            e.sleeps
        );
    }

    /// The far ends of a shared-memory peer: the ring it writes to us, the ring it reads from
    /// us, and its doorbell socket.
    struct ShmPeerEnds {
        tx: crate::shm::Ring,
        rx: crate::shm::Ring,
        bell: StdStream,
    }

    /// An engine for rank 0 of 2 whose peer is on shared memory, its far ends held by the test.
    fn engine_with_shm_peer(name: &str) -> (Engine, ShmPeerEnds) {
        let dir = if std::path::Path::new("/dev/shm").is_dir() {
            std::path::PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let path =
            |end: &str| dir.join(format!("mutirao-etest-{}-{name}-{end}", std::process::id()));
        let (to_us, to_them) = (path("in"), path("out"));
        let our_rx = crate::shm::Ring::create(&to_us, 16 << 10).unwrap();
        let their_tx = crate::shm::Ring::open(&to_us).unwrap();
        let their_rx = crate::shm::Ring::create(&to_them, 16 << 10).unwrap();
        let our_tx = crate::shm::Ring::open(&to_them).unwrap();
        std::fs::remove_file(&to_us).unwrap();
        std::fs::remove_file(&to_them).unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let bell = StdStream::connect(l.local_addr().unwrap()).unwrap();
        let (ours, _) = l.accept().unwrap();
        ours.set_nonblocking(true).unwrap();
        let t = crate::transport::ShmTransport::new(our_tx, our_rx, TcpStream::from_std(ours));
        let peers = vec![Peer::new(None), Peer::new(Some(Box::new(t)))];
        let mut e = Engine::new(
            0,
            2,
            peers,
            Tuning {
                eager_limit: 1024,
                shm_eager_limit: 1024,
                spin: Duration::from_micros(10),
                spin_shm: Duration::from_millis(20),
                yield_for: Duration::ZERO,
                polite_yield: POLITE_YIELD,
                cma: false,
                outnumbered: false,
            },
        )
        .unwrap();
        if let Some(quiet) = crate::busy::BusyProbe::with_cpus(usize::MAX) {
            e.busy = quiet; // the machine never counts as busy: only the CPU check can cut
        }
        let ends = ShmPeerEnds {
            tx: their_tx,
            rx: their_rx,
            bell,
        };
        (e, ends)
    }

    /// Runs `f` on a thread pinned to the CPU it starts on (given to `f`); `None` where the
    /// thread cannot tell its CPU or be pinned.
    fn on_one_cpu<T: std::marker::Send + 'static>(
        f: impl FnOnce(u32) -> T + std::marker::Send + 'static,
    ) -> Option<T> {
        std::thread::spawn(move || {
            use rustix::thread::{sched_setaffinity, CpuSet};
            let cpu = current_cpu()?;
            let mut one = CpuSet::new();
            one.set(cpu as usize);
            sched_setaffinity(None, &one).ok()?;
            Some(f(cpu))
        })
        .join()
        .unwrap()
    }

    /// A wait (spin budget 20 ms) for a message the shared-memory peer sends after 5 ms, the
    /// peer having published `peer_cpu` (or the waiter's own CPU): (CPU cuts, yields).
    fn cuts_of_a_shm_wait(same_cpu: bool) -> Option<(u64, u64)> {
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            on_one_cpu(move |cpu| {
                let (mut e, ends) = engine_with_shm_peer(if same_cpu { "same" } else { "other" });
                ends.rx
                    .publish_reader_cpu(if same_cpu { cpu } else { cpu + 1 });
                let id = e
                    .post_recv(0, Some(1), None, Dest::Alloc(discard_alloc))
                    .unwrap();
                tx.send(ends).unwrap();
                e.wait_until(|e| e.recv_finished(id)).unwrap();
                assert_eq!(e.take_recv(id).unwrap().0.bytes, 1);
                (e.cpu_cuts, e.yields)
            })
        });
        // The sender runs unpinned, so it never waits for the pinned waiter's CPU.
        let mut ends = rx.recv().ok();
        if let Some(ends) = ends.as_mut() {
            std::thread::sleep(Duration::from_millis(5));
            let (n, wake) = ends
                .tx
                .write_vectored(&[std::io::IoSlice::new(&eager_frame(1, &[9]))]);
            assert!(n > 0, "the ring has room");
            if wake {
                ends.bell.write_all(&[1]).unwrap();
            }
        }
        let got = waiter.join().unwrap();
        drop(ends);
        got
    }

    /// A waiting rank whose shared-memory peer, awake, last ran on the waiter's CPU yields the
    /// CPU instead of spinning (on a machine the busy probe calls quiet); a peer on another
    /// CPU leaves the spin alone.
    #[test]
    fn a_wait_yields_at_once_when_the_shm_peer_runs_on_our_cpu() {
        let Some((cuts, yields)) = cuts_of_a_shm_wait(true) else {
            return; // the thread cannot be pinned here
        };
        assert!(cuts > 0, "the shared CPU was never noticed");
        assert!(yields > 0, "the spin never yielded");
        let Some((cuts, yields)) = cuts_of_a_shm_wait(false) else {
            return;
        };
        assert_eq!((cuts, yields), (0, 0), "a peer on another CPU: spun");
    }

    /// The fast path stops polling at its first empty look when the sender shares our CPU
    /// (and, the thread pinned to one CPU, has nowhere to move); a sender elsewhere is polled
    /// for the whole fast path.
    #[test]
    fn the_fast_path_gives_up_at_once_when_the_sender_runs_on_our_cpu() {
        let run = |same: bool, spin: Duration| {
            on_one_cpu(move |cpu| {
                let (mut e, ends) = engine_with_shm_peer(if same { "fsame" } else { "fother" });
                e.tuning.spin_shm = spin;
                ends.rx.publish_reader_cpu(if same { cpu } else { cpu + 1 });
                let mut buf = [0u8; 8];
                assert!(
                    e.recv_fast(0, Some(1), None, &mut buf).is_none(),
                    "nothing sent"
                );
                (e.cpu_cuts, e.moves)
            })
        };
        let spin = Duration::from_millis(20);
        let Some((cuts, moves)) = run(true, spin) else {
            return; // the thread cannot be pinned here
        };
        assert_eq!(cuts, 1, "same CPU: one look, then the general path");
        assert_eq!(moves, 0, "pinned to one CPU: nowhere to move");
        assert_eq!(run(false, spin), Some((0, 0)), "a sender on another CPU");
        assert_eq!(
            run(true, Duration::ZERO),
            Some((0, 0)),
            "ranks outnumber cores: looks between yields and no CPU check"
        );
    }

    /// When ranks outnumber cores (no spin budget) the fast path hands its core over between
    /// looks, [`FAST_YIELDS`] times, before the general wait takes over; a message already
    /// there is taken at the first look, with no yield.
    #[test]
    fn without_a_spin_budget_the_fast_path_yields_between_looks() {
        let (mut e, mut ends) = engine_with_shm_peer("fyield");
        e.tuning.spin_shm = Duration::ZERO;
        let mut buf = [0u8; 8];
        assert!(e.recv_fast(0, Some(1), Some(5), &mut buf).is_none());
        assert_eq!(
            e.yields,
            u64::from(FAST_YIELDS),
            "an empty ring: every yield, then give up"
        );
        let hdr = Header {
            kind: Kind::Eager,
            tag: 5,
            ctx: 0,
            len: 3,
            id: 0,
        }
        .encode();
        let (n, _) = ends
            .tx
            .write_vectored(&[IoSlice::new(&hdr), IoSlice::new(b"abc")]);
        assert_eq!(n, hdr.len() + 3);
        let st = e.recv_fast(0, Some(1), Some(5), &mut buf).expect("taken");
        assert_eq!((st.source, st.tag, st.bytes), (1, 5, 3));
        assert_eq!(&buf[..3], b"abc");
        assert_eq!(
            e.yields,
            u64::from(FAST_YIELDS),
            "a message already there: no yield"
        );
    }

    /// Moving off a CPU runs the thread elsewhere and gives it its affinity mask back; with a
    /// one-CPU mask nothing moves and nothing changes.
    #[test]
    fn moving_off_a_cpu_runs_elsewhere_and_keeps_the_mask() {
        use rustix::thread::sched_getaffinity;
        std::thread::spawn(|| {
            let Some(cpu) = current_cpu() else {
                return;
            };
            let before = sched_getaffinity(None).unwrap();
            match move_off_cpu(cpu) {
                Some(other) => {
                    assert!(before.count() >= 2);
                    assert_ne!(other, cpu, "still on CPU {cpu}");
                    assert!(
                        before.is_set(other as usize),
                        "CPU {other} is outside the mask"
                    );
                }
                None => assert_eq!(before.count(), 1, "a mask of several CPUs, yet no move"),
            }
            assert!(
                sched_getaffinity(None).unwrap() == before,
                "the mask changed"
            );
        })
        .join()
        .unwrap();
        let pinned = on_one_cpu(|cpu| (move_off_cpu(cpu), current_cpu()));
        if let Some((moved, now)) = pinned {
            assert_eq!(moved, None, "a one-CPU mask cannot move");
            assert!(now.is_some());
        }
    }

    /// A spinning wait on one TCP peer, the machine quiet, reads the socket directly and asks
    /// epoll once in [`DIRECT_EPOLL_EVERY`] passes; the machine busy (the probe's last word),
    /// it asks epoll on every pass, as before.
    #[test]
    fn a_quiet_tcp_wait_reads_its_socket_directly() {
        let (Some(quiet), Some(mut busy)) = (
            crate::busy::BusyProbe::with_cpus(usize::MAX),
            crate::busy::BusyProbe::with_cpus(0),
        ) else {
            return; // no procfs: the probe never says busy (its parse tests cover the rest)
        };
        assert!(busy.oversubscribed(), "a probe with 0 CPUs says busy"); // its last word
        let (mut e, raw) = engine_with_raw_peer();
        e.tuning.spin = Duration::from_millis(20);
        e.busy = quiet;
        wait_for_a_late_message(&mut e, raw, Duration::from_millis(5));
        assert!(e.direct_passes > 100, "direct passes {}", e.direct_passes);
        assert!(
            e.epoll_passes <= e.direct_passes / (u64::from(DIRECT_EPOLL_EVERY) - 1) + 2,
            "epoll asked {} times in {} direct passes",
            e.epoll_passes,
            e.direct_passes
        );
        let (mut e, raw) = engine_with_raw_peer();
        e.tuning.spin = Duration::from_millis(20);
        e.busy = busy;
        wait_for_a_late_message(&mut e, raw, Duration::from_millis(5));
        assert_eq!(e.direct_passes, 0, "busy: read directly");
        assert!(e.epoll_passes > 0);
    }

    #[test]
    fn data_for_an_unknown_receive_is_a_protocol_error() {
        let (mut e, mut raw) = engine_with_raw_peer();
        let h = Header {
            kind: Kind::Data,
            tag: 0,
            ctx: 0,
            len: 4,
            id: 999,
        };
        raw.write_all(&h.encode()).unwrap();
        raw.write_all(&[0u8; 4]).unwrap();
        match recv_error(&mut e) {
            Error::PeerFailed { reason, .. } => {
                assert!(reason.contains("unknown receive"), "{reason}")
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn bye_then_close_is_a_clean_finalize() {
        let (mut e, mut raw) = engine_with_raw_peer();
        let bye = Header {
            kind: Kind::Bye,
            tag: 0,
            ctx: 0,
            len: 0,
            id: 0,
        };
        raw.write_all(&bye.encode()).unwrap();
        drop(raw);
        assert_eq!(recv_error(&mut e), Error::PeerFinalized(1));
    }
}
