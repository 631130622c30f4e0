//! [`Addr`]: the per-process addressing endpoint (directory connection + runtime traffic).

use crate::credit::{threshold, Owed, Window};
use crate::pool::Pool;
use crate::proto::{admit, block_range, Frame, Reason};
use crate::AddrError;
use mutirao::{Comm, Request, ANY_SOURCE};
use mutirao_dir::client::Client;
use mutirao_dir::relations::{plan, DedupWindow, Rel, Relations, Tech};
use mutirao_dir::{Acl, Attr, AttrList, Cred, DirError, Gid, Scope};
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Prefix of the attribute names this crate reserves (where a resource lives).
pub const RESERVED_PREFIX: &str = "mutirao.";
/// Reserved attribute: `mailbox`, `block` or `relation`.
pub const ATTR_KIND: &str = "mutirao.kind";
/// Reserved attribute: the job id of the process holding the resource.
pub const ATTR_JOB: &str = "mutirao.job";
/// Reserved attribute: the world rank of the process holding the resource.
pub const ATTR_RANK: &str = "mutirao.rank";
/// Reserved attribute: the directory context (process) holding the resource.
pub const ATTR_CTX: &str = "mutirao.ctx";
/// Reserved attribute: the resource's number inside its process.
pub const ATTR_NO: &str = "mutirao.no";
/// Reserved attribute: a block's size in bytes.
pub const ATTR_SIZE: &str = "mutirao.size";
const ATTR_REL_O: &str = "mutirao.rel.o";
const ATTR_REL_D: &str = "mutirao.rel.d";
const ATTR_REL_KIND: &str = "mutirao.rel.kind";

/// How long an idle wait polls without a syscall before it starts yielding its core (then
/// sleeping), like the runtime's spin; none when ranks outnumber cores. Paired rounds of
/// `addr_bench`: mailbox round trip median 4.8 µs against 5.8 µs yielding at once.
const SPIN: Duration = Duration::from_micros(20);

/// Environment variable naming the directory's Unix socket.
pub const DIR_SOCKET_ENV: &str = "MUTIRAO_DIR_SOCKET";
/// Environment variable setting the per-destination credit window.
pub const CREDITS_ENV: &str = "MUTIRAO_ADDR_CREDITS";
/// Environment variable listing this process's technologies (comma-separated ids 0–63).
pub const TECHS_ENV: &str = "MUTIRAO_ADDR_TECHS";
/// Environment variable making this process a bridge between technologies.
pub const BRIDGE_ENV: &str = "MUTIRAO_ADDR_BRIDGE";
/// Environment variable setting the largest frame-buffer class in bytes.
pub const MAX_CLASS_ENV: &str = "MUTIRAO_ADDR_MAX_CLASS";

const TAG_FRAME: i32 = 0;
/// Kind byte of a frame wrapped for a bridge: `K_FWD | dest u32 | origin u32 | frame`.
const K_FWD: u8 = 0xF0;
const FWD_HEADER: usize = 9;

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}
const TAG_SENTINEL: i32 = 1;
const MAX_FIND: usize = 100_000;
const HEARTBEAT_EVERY: Duration = Duration::from_millis(500);

/// Settings of an [`Addr`].
#[derive(Clone, Debug)]
pub struct Config {
    /// Data frames (sends, multicast copies) that may be outstanding towards one destination
    /// process before further ones are queued (`MUTIRAO_ADDR_CREDITS`, default 16). Rank 0's
    /// value is used by every rank.
    pub credits: u32,
    /// The directory's Unix socket (`MUTIRAO_DIR_SOCKET`).
    pub socket: Option<PathBuf>,
    /// Size of the largest frame-buffer class, a power of two ≥ 64 (`MUTIRAO_ADDR_MAX_CLASS`,
    /// default 65536). Larger frames get unpooled buffers and still arrive whole.
    pub max_class_bytes: usize,
    /// Technologies (networks) this process is on, as a bit mask of tech ids 0–63
    /// (`MUTIRAO_ADDR_TECHS=0,1`; default tech 0). Two processes talk directly only when they
    /// share one; otherwise frames go through a bridge. The runtime connects every pair of
    /// ranks, so this emulates the multi-network clusters of digest 002 §3.6 / §7.6.
    pub techs: u64,
    /// Whether this process forwards frames between technologies (`MUTIRAO_ADDR_BRIDGE=1`).
    pub bridge: bool,
}

impl Config {
    /// From the environment.
    pub fn from_env() -> Result<Config, AddrError> {
        let credits = match std::env::var(CREDITS_ENV) {
            Ok(v) => v
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|c| *c >= 1)
                .ok_or_else(|| {
                    AddrError::Config(format!("{CREDITS_ENV}={v:?} is not a whole number ≥ 1"))
                })?,
            Err(_) => 16,
        };
        let max_class_bytes = match std::env::var(MAX_CLASS_ENV) {
            Ok(v) => v.trim().parse::<usize>().map_err(|_| {
                AddrError::Config(format!("{MAX_CLASS_ENV}={v:?} is not a number of bytes"))
            })?,
            Err(_) => 1 << 16,
        };
        let techs = match std::env::var(TECHS_ENV) {
            Ok(v) => parse_techs(&v)?,
            Err(_) => 1,
        };
        let bridge = match std::env::var(BRIDGE_ENV).as_deref() {
            Ok("1") | Ok("yes") | Ok("true") => true,
            Ok("0") | Ok("no") | Ok("false") | Ok("") | Err(_) => false,
            Ok(other) => {
                return Err(AddrError::Config(format!(
                    "{BRIDGE_ENV}={other:?}: expected 1 or 0"
                )))
            }
        };
        Ok(Config {
            credits,
            socket: std::env::var_os(DIR_SOCKET_ENV).map(PathBuf::from),
            max_class_bytes,
            techs,
            bridge,
        })
    }
}

/// Parses a technology list (`0,1`) into a bit mask.
pub fn parse_techs(v: &str) -> Result<u64, AddrError> {
    let mut m = 0u64;
    for part in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let id: u32 = part.parse().ok().filter(|i| *i < 64).ok_or_else(|| {
            AddrError::Config(format!(
                "{TECHS_ENV}={v:?}: {part:?} is not a technology id between 0 and 63"
            ))
        })?;
        m |= 1 << id;
    }
    if m == 0 {
        return Err(AddrError::Config(format!(
            "{TECHS_ENV}={v:?} names no technology"
        )));
    }
    Ok(m)
}

/// How frames reach a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    Direct,
    Via(usize),
    None,
}

/// The route from `me` to `dest` given every rank's technology mask and bridge flag: direct
/// when they share a technology, else through the lowest-ranked bridge sharing one with each.
fn route(me: usize, dest: usize, techs: &[u64], bridges: &[bool]) -> Route {
    if me == dest || techs[me] & techs[dest] != 0 {
        return Route::Direct;
    }
    (0..techs.len())
        .find(|&b| bridges[b] && techs[b] & techs[me] != 0 && techs[b] & techs[dest] != 0)
        .map_or(Route::None, Route::Via)
}

/// What kind of resource a [`Target`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A mailbox: `send` goes there; one copy, one consumer.
    Mailbox,
    /// A memory block: `put`/`get` go there.
    Block,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Mailbox => "mailbox",
            Kind::Block => "block",
        }
    }
}

/// A resource found in the directory, with where it lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Its global id.
    pub gid: Gid,
    /// Mailbox or block.
    pub kind: Kind,
    /// Job of the process holding it.
    pub job: String,
    /// World rank of that process.
    pub rank: usize,
    /// Directory context of that process.
    pub ctx: Gid,
    /// Size in bytes (blocks).
    pub size: Option<u64>,
    /// The user attributes the query asked for (reserved ones removed).
    pub attrs: AttrList,
}

/// A delivery's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TicketStatus {
    /// Not acknowledged yet (possibly still queued for credits).
    Pending,
    /// The target accepted it (stored in the mailbox, or written to the block).
    Delivered,
    /// It will never be delivered.
    Failed(Reason),
}

/// The handle a [`Addr::send`] or [`Addr::put`] returns. Wait for it with [`Addr::wait`].
#[derive(Clone, Debug)]
pub struct Ticket {
    target: Gid,
    st: Rc<RefCell<TicketStatus>>,
}

impl Ticket {
    /// The state as last seen (does not drive progress; [`Addr::wait`] does).
    pub fn status(&self) -> TicketStatus {
        self.st.borrow().clone()
    }

    /// The resource it was sent to.
    pub fn target(&self) -> Gid {
        self.target
    }
}

/// How long a receive may wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timeout {
    /// Until a message comes.
    Block,
    /// Not at all: look once.
    Poll,
    /// At most this long.
    After(Duration),
}

impl Timeout {
    fn deadline(self) -> Option<Instant> {
        match self {
            Timeout::Block => None,
            Timeout::Poll => Some(Instant::now()),
            Timeout::After(d) => Some(Instant::now() + d),
        }
    }
}

/// Which messages a receive takes: by source identity and tag (`None` = any).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Match {
    /// Source identity (a sender's context gid, or the mailbox it sent as).
    pub src: Option<Gid>,
    /// Tag.
    pub tag: Option<i32>,
}

impl Match {
    /// Any message.
    pub fn any() -> Match {
        Match::default()
    }

    /// Messages with this tag.
    pub fn tag(tag: i32) -> Match {
        Match {
            src: None,
            tag: Some(tag),
        }
    }

    /// Messages from this source identity.
    pub fn src(src: Gid) -> Match {
        Match {
            src: Some(src),
            tag: None,
        }
    }

    fn takes(&self, m: &Stored) -> bool {
        self.src.is_none_or(|s| s == m.src) && self.tag.is_none_or(|t| t == m.tag)
    }
}

/// A received message; its buffer is the caller's (and may be sent on).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// Source identity: the sender's context, or the mailbox it sent as.
    pub src: Gid,
    /// World rank of the sender.
    pub src_rank: usize,
    /// Tag.
    pub tag: i32,
    /// The bytes.
    pub data: Vec<u8>,
}

/// Counters (for tests and tuning).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Data frames (sends, multicast wire messages) handed to the runtime, per destination
    /// world rank; frames to this process itself never touch the runtime and are not counted.
    pub data_frames_to: Vec<u64>,
    /// Control frames (acks, credits, put/get, barrier) handed to the runtime.
    pub control_frames: u64,
    /// Data frames waiting for credits now.
    pub queued: usize,
    /// Frames handed to the runtime whose sends have not been seen complete yet.
    pub in_flight: usize,
    /// Frames dropped because they could not be decoded.
    pub malformed: u64,
    /// Frame buffers taken from a size class's free list (reused).
    pub buffers_reused: u64,
    /// Frame buffers allocated.
    pub buffers_allocated: u64,
    /// Bytes this layer copied (encoding frames, decoding them, wrapping for a bridge): the
    /// instrumentation for check 14.
    pub bytes_copied: u64,
    /// Frames this process forwarded as a bridge (handed on in the buffer they arrived in).
    pub forwarded: u64,
    /// Bytes of those frames.
    pub forwarded_bytes: u64,
}

/// The result of [`Addr::multicast`].
#[derive(Debug)]
pub struct Multicast {
    /// One ticket per destination process (including this one when it holds members).
    pub tickets: Vec<Ticket>,
    /// Mailboxes that get a copy.
    pub members: Vec<Gid>,
    /// Resources reached over relations that are not mailboxes of this job (they get nothing).
    pub unreachable: Vec<Gid>,
}

struct Stored {
    src: Gid,
    src_rank: usize,
    tag: i32,
    data: Vec<u8>,
    /// Shared by every copy of one data frame; the last copy consumed returns the credit.
    credit: Option<Rc<usize>>,
}

struct MailboxState {
    acl: Acl,
    queue: VecDeque<Stored>,
}

struct BlockState {
    acl: Acl,
    data: Vec<u8>,
}

enum GetWait {
    Waiting(usize),
    Done(Result<Vec<u8>, Reason>),
}

struct State {
    next_seq: u64,
    next_no: u64,
    pending: HashMap<u64, (usize, Rc<RefCell<TicketStatus>>)>,
    gets: HashMap<u64, GetWait>,
    windows: Vec<Window<Vec<u8>>>,
    window_seqs: Vec<VecDeque<u64>>,
    owed: Vec<Owed>,
    inflight: Vec<(Request<u8>, usize)>,
    sentinels: Vec<Option<Request<u8>>>,
    last_sentinel_check: Instant,
    gone: Vec<Option<String>>,
    loopback: VecDeque<Vec<u8>>,
    mailboxes: HashMap<Gid, MailboxState>,
    blocks: HashMap<Gid, BlockState>,
    dedup: DedupWindow,
    pool: Pool,
    routes: Vec<Route>,
    bridge: bool,
    done_epoch: Vec<u64>,
    epoch: u64,
    stats: Stats,
}

/// A process's addressing endpoint: its directory context, its mailboxes and blocks, and the
/// runtime traffic that carries messages, acknowledgements, credits and put/get.
///
/// There is no progress thread: acknowledgements, credits and put/get requests aimed at this
/// process are served only while it is inside a call of this API (`recv`, `wait`, `get`,
/// `barrier`, `progress`). A process that computes for a long time should call
/// [`Addr::progress`] now and then, or its senders' ticket waits time out. (Directory
/// heartbeats run on a thread of their own, so its resources stay registered meanwhile.)
///
/// `!Send`, like the communicator it is built on.
pub struct Addr {
    comm: Comm,
    me: usize,
    job: String,
    cred: Cred,
    ctx: Gid,
    credits: u32,
    dir: RefCell<Client>,
    st: RefCell<State>,
    hb_stop: Arc<AtomicBool>,
    hb: Option<std::thread::JoinHandle<()>>,
    /// How long an idle wait polls before yielding: [`SPIN`], or zero when this host's ranks
    /// outnumber its cores (as the runtime decides for its own waits).
    spin: Duration,
}

impl std::fmt::Debug for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Addr")
            .field("rank", &self.me)
            .field("job", &self.job)
            .field("ctx", &self.ctx)
            .field("credits", &self.credits)
            .finish_non_exhaustive()
    }
}

fn reserved_check(attrs: &AttrList) -> Result<(), AddrError> {
    match attrs.iter().find(|a| a.name.starts_with(RESERVED_PREFIX)) {
        Some(a) => Err(AddrError::Reserved(a.name.clone())),
        None => Ok(()),
    }
}

fn text(attrs: &AttrList, name: &str, gid: Gid) -> Result<String, AddrError> {
    attrs
        .value(name)
        .and_then(|v| std::str::from_utf8(v).ok())
        .map(str::to_string)
        .ok_or_else(|| AddrError::NotAddressable {
            gid,
            attr: name.to_string(),
        })
}

fn number(attrs: &AttrList, name: &str, gid: Gid) -> Result<u64, AddrError> {
    text(attrs, name, gid)?
        .parse()
        .map_err(|_| AddrError::NotAddressable {
            gid,
            attr: name.to_string(),
        })
}

fn located_query(q: &AttrList, kind: Kind) -> Result<AttrList, AddrError> {
    reserved_check(q)?;
    let mut l = q.clone();
    l.insert(Attr::full(ATTR_KIND, kind.name()))?;
    for n in [ATTR_JOB, ATTR_RANK, ATTR_CTX, ATTR_NO] {
        l.insert(Attr::want(n, 128))?;
    }
    if kind == Kind::Block {
        l.insert(Attr::want(ATTR_SIZE, 32))?;
    }
    Ok(l)
}

fn parse_target(gid: Gid, a: &AttrList) -> Result<Target, AddrError> {
    let kind = match text(a, ATTR_KIND, gid)?.as_str() {
        "mailbox" => Kind::Mailbox,
        "block" => Kind::Block,
        _ => {
            return Err(AddrError::NotAddressable {
                gid,
                attr: ATTR_KIND.into(),
            })
        }
    };
    let size = match kind {
        Kind::Block => Some(number(a, ATTR_SIZE, gid)?),
        Kind::Mailbox => None,
    };
    let attrs = AttrList::from_attrs(
        a.iter()
            .filter(|x| !x.name.starts_with(RESERVED_PREFIX))
            .cloned(),
    )?;
    Ok(Target {
        gid,
        kind,
        job: text(a, ATTR_JOB, gid)?,
        rank: number(a, ATTR_RANK, gid)? as usize,
        ctx: Gid(number(a, ATTR_CTX, gid)?),
        size,
        attrs,
    })
}

impl Addr {
    /// Joins the addressing layer with settings from the environment. Collective over
    /// `world` (every rank calls it). Needs `MUTIRAO_DIR_SOCKET` (set by `mutirao run` and by
    /// agents).
    pub fn connect(world: &Comm) -> Result<Addr, AddrError> {
        Addr::connect_with(world, Config::from_env()?)
    }

    /// [`Addr::connect`] with explicit settings. Collective over `world`.
    pub fn connect_with(world: &Comm, cfg: Config) -> Result<Addr, AddrError> {
        let socket = cfg.socket.clone().ok_or(AddrError::NoDirectory)?;
        let pool = Pool::new(cfg.max_class_bytes)
            .map_err(|m| AddrError::Config(format!("{MAX_CLASS_ENV}: {m}")))?;
        let mut dir = Client::connect(&socket)?;
        let ctx = dir.open_context()?;
        // Collective part: a private communicator, and rank 0's credit window for all.
        let comm = world.dup()?;
        let mut credits = [u64::from(cfg.credits)];
        comm.bcast(&mut credits, 0)?;
        let credits = u32::try_from(credits[0]).unwrap_or(u32::MAX).max(1);
        let (me, n) = (comm.rank(), comm.size());
        // Everyone's technologies and bridge flag, for routing.
        let mut all = vec![0u64; 2 * n];
        comm.allgather(&[cfg.techs, u64::from(cfg.bridge)], &mut all)?;
        let techs: Vec<u64> = all.chunks(2).map(|c| c[0]).collect();
        let bridges: Vec<bool> = all.chunks(2).map(|c| c[1] != 0).collect();
        let routes: Vec<Route> = (0..n).map(|d| route(me, d, &techs, &bridges)).collect();
        let job = std::env::var("MUTIRAO_JOB_ID")
            .ok()
            .filter(|j| !j.is_empty() && JobEnvOk::ok(j))
            .unwrap_or_else(|| format!("solo-{}", std::process::id()));
        // SAFETY: geteuid/getegid have no preconditions and cannot fail.
        let cred = unsafe { Cred::new(libc::geteuid(), libc::getegid()) };
        let mut sentinels = Vec::with_capacity(n);
        for r in 0..n {
            sentinels.push(if r == me {
                None
            } else {
                Some(comm.irecv::<u8>(r, TAG_SENTINEL)?)
            });
        }
        let hb_stop = Arc::new(AtomicBool::new(false));
        let hb = {
            let stop = hb_stop.clone();
            let mut c = Client::connect(&socket)?;
            std::thread::Builder::new()
                .name("mutirao-addr-heartbeat".into())
                .spawn(move || {
                    let mut last = Instant::now();
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(50));
                        if last.elapsed() >= HEARTBEAT_EVERY {
                            if c.heartbeat(ctx).is_err() {
                                return;
                            }
                            last = Instant::now();
                        }
                    }
                })
                .map_err(|e| AddrError::Config(format!("cannot start the heartbeat thread: {e}")))?
        };
        let local_ranks = std::env::var("MUTIRAO_LOCAL_RANKS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(1);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let spin = if local_ranks > cores {
            Duration::ZERO
        } else {
            SPIN
        };
        Ok(Addr {
            spin,
            me,
            job,
            cred,
            ctx,
            credits,
            dir: RefCell::new(dir),
            st: RefCell::new(State {
                next_seq: 1,
                next_no: 1,
                pending: HashMap::new(),
                gets: HashMap::new(),
                windows: (0..n).map(|_| Window::new(credits)).collect(),
                window_seqs: vec![VecDeque::new(); n],
                owed: vec![Owed::default(); n],
                inflight: Vec::new(),
                sentinels,
                last_sentinel_check: Instant::now(),
                gone: vec![None; n],
                loopback: VecDeque::new(),
                mailboxes: HashMap::new(),
                blocks: HashMap::new(),
                dedup: DedupWindow::new(4096),
                pool,
                routes,
                bridge: cfg.bridge,
                done_epoch: vec![0; n],
                epoch: 0,
                stats: Stats {
                    data_frames_to: vec![0; n],
                    ..Stats::default()
                },
            }),
            comm,
            hb_stop,
            hb: Some(hb),
        })
    }

    /// This process's world rank.
    pub fn rank(&self) -> usize {
        self.me
    }

    /// This process's job id.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// This process's directory context (the source identity of its plain sends).
    pub fn context(&self) -> Gid {
        self.ctx
    }

    /// The credit window agreed at connect time.
    pub fn credits(&self) -> u32 {
        self.credits
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        let st = self.st.borrow();
        let mut s = st.stats.clone();
        s.queued = st.windows.iter().map(Window::queued).sum();
        s.buffers_reused = st.pool.reused();
        s.in_flight = st.inflight.len();
        s.buffers_allocated = st.pool.allocated();
        s
    }

    // ------------------------------------------------------------ directory side

    fn register(
        &self,
        attrs: &AttrList,
        kind: Kind,
        acl: &Acl,
        size: Option<usize>,
    ) -> Result<(Gid, Target), AddrError> {
        reserved_check(attrs)?;
        let no = {
            let mut st = self.st.borrow_mut();
            st.next_no += 1;
            st.next_no - 1
        };
        let mut full = attrs.clone();
        full.insert(Attr::full(ATTR_KIND, kind.name()))?;
        full.insert(Attr::full(ATTR_JOB, self.job.as_str()))?;
        full.insert(Attr::full(ATTR_RANK, self.me.to_string()))?;
        full.insert(Attr::full(ATTR_CTX, self.ctx.0.to_string()))?;
        full.insert(Attr::full(ATTR_NO, no.to_string()))?;
        if let Some(s) = size {
            full.insert(Attr::full(ATTR_SIZE, s.to_string()))?;
        }
        let reg = self
            .dir
            .borrow_mut()
            .register(self.ctx, &full, acl, false)?;
        let target = parse_target(reg.gid, &full)?;
        Ok((reg.gid, target))
    }

    /// Mailboxes matching `q` (full attributes must be equal, `Attr::want` ones must exist) in
    /// `scope`, at most `max`, fetched page by page from the directory.
    pub fn find_max(
        &self,
        q: &AttrList,
        scope: Scope,
        max: usize,
    ) -> Result<Vec<Target>, AddrError> {
        self.find_kind(q, scope, Kind::Mailbox, max)
    }

    /// Every mailbox matching `q` in `scope` (at most 100 000).
    pub fn find(&self, q: &AttrList, scope: Scope) -> Result<Vec<Target>, AddrError> {
        self.find_kind(q, scope, Kind::Mailbox, MAX_FIND)
    }

    /// Every memory block matching `q` in `scope` (at most 100 000).
    pub fn find_blocks(&self, q: &AttrList, scope: Scope) -> Result<Vec<Target>, AddrError> {
        self.find_kind(q, scope, Kind::Block, MAX_FIND)
    }

    fn find_kind(
        &self,
        q: &AttrList,
        scope: Scope,
        kind: Kind,
        max: usize,
    ) -> Result<Vec<Target>, AddrError> {
        let lq = located_query(q, kind)?;
        let mut dir = self.dir.borrow_mut();
        let mut out = Vec::new();
        let it = dir.query_iter(&lq, scope)?;
        for r in it.take(max) {
            let (gid, a) = r?;
            out.push(parse_target(gid, &a)?);
        }
        Ok(out)
    }

    /// Records a relation in the directory: with [`Rel::Filiation`], a multicast to `d` also
    /// reaches `o`; with [`Rel::Pairing`], a multicast to either reaches both. Returns the
    /// relation's gid (delete it with [`Addr::unrelate`]); it disappears with this process.
    pub fn relate(&self, o: Gid, d: Gid, rel: Rel) -> Result<Gid, AddrError> {
        let kind = match rel {
            Rel::Filiation => "filiation",
            Rel::Pairing => "pairing",
        };
        let a = AttrList::from_pairs([
            (ATTR_KIND, "relation".to_string()),
            (ATTR_REL_O, o.0.to_string()),
            (ATTR_REL_D, d.0.to_string()),
            (ATTR_REL_KIND, kind.to_string()),
        ])?;
        Ok(self
            .dir
            .borrow_mut()
            .register(self.ctx, &a, &Acl::Public, false)?
            .gid)
    }

    /// Removes a relation made by [`Addr::relate`].
    pub fn unrelate(&self, relation: Gid) -> Result<(), AddrError> {
        Ok(self.dir.borrow_mut().delete(relation)?)
    }

    fn relations(&self, scope: Scope) -> Result<Relations, AddrError> {
        let q = AttrList::from_attrs([
            Attr::full(ATTR_KIND, "relation"),
            Attr::want(ATTR_REL_O, 32),
            Attr::want(ATTR_REL_D, 32),
            Attr::want(ATTR_REL_KIND, 16),
        ])?;
        let mut g = Relations::new();
        let mut dir = self.dir.borrow_mut();
        for r in dir.query_iter(&q, scope)?.take(MAX_FIND) {
            let (gid, a) = r?;
            let o = Gid(number(&a, ATTR_REL_O, gid)?);
            let d = Gid(number(&a, ATTR_REL_D, gid)?);
            let rel = match text(&a, ATTR_REL_KIND, gid)?.as_str() {
                "filiation" => Rel::Filiation,
                "pairing" => Rel::Pairing,
                _ => {
                    return Err(AddrError::NotAddressable {
                        gid,
                        attr: ATTR_REL_KIND.into(),
                    })
                }
            };
            g.set(o, d, rel);
        }
        Ok(g)
    }

    // ------------------------------------------------------------ sending

    fn new_ticket(&self, st: &mut State, dest: usize, target: Gid) -> (u64, Ticket) {
        let seq = st.next_seq;
        st.next_seq += 1;
        let cell = Rc::new(RefCell::new(TicketStatus::Pending));
        st.pending.insert(seq, (dest, cell.clone()));
        (seq, Ticket { target, st: cell })
    }

    fn reachable(&self, t: &Target) -> Result<(), Reason> {
        let st = self.st.borrow();
        if t.job != self.job || t.rank >= st.gone.len() {
            return Err(Reason::OtherJob(t.job.clone()));
        }
        if st.routes[t.rank] == Route::None {
            return Err(Reason::NoRoute(t.rank));
        }
        Ok(())
    }

    /// Sends `data` with `tag` to mailbox `to`. Never blocks: beyond the credit window the
    /// frame is queued and leaves when credits return. The ticket reports delivery or why not.
    pub fn send(&self, to: &Target, tag: i32, data: Vec<u8>) -> Result<Ticket, AddrError> {
        self.send_from(self.ctx, to, tag, data)
    }

    /// [`Addr::send`] with one of this process's mailboxes as the source identity.
    pub fn send_as(
        &self,
        from: &Mailbox<'_>,
        to: &Target,
        tag: i32,
        data: Vec<u8>,
    ) -> Result<Ticket, AddrError> {
        self.send_from(from.gid, to, tag, data)
    }

    fn send_from(
        &self,
        src: Gid,
        to: &Target,
        tag: i32,
        data: Vec<u8>,
    ) -> Result<Ticket, AddrError> {
        if to.kind != Kind::Mailbox {
            return Err(AddrError::WrongKind {
                gid: to.gid,
                want: "mailbox",
            });
        }
        let reach = self.reachable(to);
        let mut st = self.st.borrow_mut();
        let (seq, ticket) = self.new_ticket(&mut st, to.rank, to.gid);
        if let Err(r) = reach {
            resolve(&mut st, seq, TicketStatus::Failed(r));
            return Ok(ticket);
        }
        let f = Frame::Data {
            seq,
            dst: to.gid,
            src,
            cred: self.cred,
            tag,
            payload: data,
        };
        let b = enc(&mut st, &f);
        self.submit(&mut st, to.rank, seq, b);
        Ok(ticket)
    }

    /// Component replacement (digest 002 §6.2.1) in one call. Sends to `cached` if it holds a
    /// target, otherwise to the first mailbox matching `q` in `scope`; waits at most `max` for
    /// the acknowledgement. On a delivery error it queries the directory again (skipping the
    /// resource that failed), resends once, and leaves the mailbox that took the message in
    /// `cached` for the next call.
    pub fn send_by_properties(
        &self,
        cached: &mut Option<Target>,
        q: &AttrList,
        scope: Scope,
        tag: i32,
        data: &[u8],
        max: Duration,
    ) -> Result<Target, AddrError> {
        let first = match cached.take() {
            Some(t) => t,
            None => self
                .find_max(q, scope, 1)?
                .into_iter()
                .next()
                .ok_or(AddrError::NoMatch)?,
        };
        let t = self.send(&first, tag, data.to_vec())?;
        match self.wait(&t, max) {
            Ok(()) => {
                *cached = Some(first.clone());
                return Ok(first);
            }
            Err(AddrError::Delivery { .. }) => {}
            Err(e) => return Err(e),
        }
        let again = self
            .find_max(q, scope, 16)?
            .into_iter()
            .find(|x| x.gid != first.gid)
            .ok_or(AddrError::NoMatch)?;
        let t = self.send(&again, tag, data.to_vec())?;
        self.wait(&t, max)?;
        *cached = Some(again.clone());
        Ok(again)
    }

    /// Writes `data` at `offset` of block `to` (software put over the runtime). The ticket is
    /// delivered once the bytes are in the block; out-of-range or ACL-refused writes fail it.
    pub fn put(&self, to: &Target, offset: u64, data: Vec<u8>) -> Result<Ticket, AddrError> {
        if to.kind != Kind::Block {
            return Err(AddrError::WrongKind {
                gid: to.gid,
                want: "block",
            });
        }
        let reach = self.reachable(to);
        let mut st = self.st.borrow_mut();
        let (seq, ticket) = self.new_ticket(&mut st, to.rank, to.gid);
        if let Err(r) = reach {
            resolve(&mut st, seq, TicketStatus::Failed(r));
            return Ok(ticket);
        }
        if let Some(why) = st.gone[to.rank].clone() {
            resolve(&mut st, seq, TicketStatus::Failed(Reason::ProcessGone(why)));
            return Ok(ticket);
        }
        let f = Frame::Put {
            seq,
            dst: to.gid,
            cred: self.cred,
            offset,
            data,
        };
        let b = enc(&mut st, &f);
        self.raw(&mut st, to.rank, b, false);
        Ok(ticket)
    }

    /// Reads `len` bytes at `offset` of block `from`, waiting at most `max`.
    pub fn get(
        &self,
        from: &Target,
        offset: u64,
        len: u64,
        max: Duration,
    ) -> Result<Vec<u8>, AddrError> {
        if from.kind != Kind::Block {
            return Err(AddrError::WrongKind {
                gid: from.gid,
                want: "block",
            });
        }
        if let Err(reason) = self.reachable(from) {
            return Err(AddrError::Delivery {
                gid: from.gid,
                reason,
            });
        }
        let seq = {
            let mut st = self.st.borrow_mut();
            let seq = st.next_seq;
            st.next_seq += 1;
            if let Some(why) = st.gone[from.rank].clone() {
                return Err(AddrError::Delivery {
                    gid: from.gid,
                    reason: Reason::ProcessGone(why),
                });
            }
            st.gets.insert(seq, GetWait::Waiting(from.rank));
            let f = Frame::Get {
                seq,
                dst: from.gid,
                cred: self.cred,
                offset,
                len,
            };
            let b = enc(&mut st, &f);
            self.raw(&mut st, from.rank, b, false);
            seq
        };
        let done = self.wait_until(Some(Instant::now() + max), |st| {
            matches!(st.gets.get(&seq), Some(GetWait::Done(_)))
        })?;
        let got = self.st.borrow_mut().gets.remove(&seq);
        match (done, got) {
            (true, Some(GetWait::Done(Ok(v)))) => Ok(v),
            (true, Some(GetWait::Done(Err(reason)))) => Err(AddrError::Delivery {
                gid: from.gid,
                reason,
            }),
            _ => Err(AddrError::TimedOut {
                after: max,
                what: format!("get from block {} on rank {}", from.gid, from.rank),
            }),
        }
    }

    /// Sends one copy of `data` to every mailbox reached from `to` over the relations stored in
    /// the directory (`scope`): each member exactly once even if the relation graph has
    /// cycles, and one wire message per destination process whatever its number of members.
    pub fn multicast(
        &self,
        to: Gid,
        tag: i32,
        data: &[u8],
        scope: Scope,
    ) -> Result<Multicast, AddrError> {
        let g = self.relations(scope)?;
        let recips = g.recipients(to);
        let locq = located_query(&AttrList::new(), Kind::Mailbox)?;
        let qs: Vec<(Option<Gid>, AttrList)> =
            recips.iter().map(|r| (Some(*r), locq.clone())).collect();
        let answers = self.dir.borrow_mut().query_pipelined(&qs, scope)?;
        let mut ctx_of = HashMap::new();
        let mut rank_of_ctx = HashMap::new();
        let mut unreachable = Vec::new();
        let mut members = Vec::new();
        for (r, a) in recips.iter().zip(answers) {
            match a
                .map_err(AddrError::from)
                .and_then(|(gid, a)| parse_target(gid, &a))
            {
                Ok(t) if self.reachable(&t).is_ok() => {
                    ctx_of.insert(*r, t.ctx);
                    rank_of_ctx.insert(t.ctx, t.rank);
                    members.push(*r);
                }
                _ => unreachable.push(*r),
            }
        }
        let one: BTreeSet<Tech> = BTreeSet::from([0]);
        let mut techs: HashMap<Gid, BTreeSet<Tech>> =
            rank_of_ctx.keys().map(|c| (*c, one.clone())).collect();
        techs.insert(self.ctx, one);
        let (local, msgs) = plan(
            &g,
            to,
            self.ctx,
            |r| ctx_of.get(&r).copied().unwrap_or(Gid::NONE),
            &techs,
        );
        let mut st = self.st.borrow_mut();
        let mut tickets = Vec::new();
        let mut groups: Vec<(usize, Vec<Gid>)> = Vec::new();
        if !local.is_empty() {
            groups.push((self.me, local));
        }
        for m in msgs {
            match rank_of_ctx.get(&m.ctx) {
                Some(rank) if m.ctx != Gid::NONE => groups.push((*rank, m.members)),
                _ => {}
            }
        }
        for (rank, members) in groups {
            let (seq, t) = self.new_ticket(&mut st, rank, to);
            let f = Frame::Mcast {
                seq,
                origin: self.ctx,
                src: self.ctx,
                cred: self.cred,
                tag,
                members,
                payload: data.to_vec(),
            };
            let b = enc(&mut st, &f);
            self.submit(&mut st, rank, seq, b);
            tickets.push(t);
        }
        Ok(Multicast {
            tickets,
            members,
            unreachable,
        })
    }

    /// Waits at most `max` for a ticket: `Ok` once delivered, [`AddrError::Delivery`] with the
    /// reason if it failed, [`AddrError::TimedOut`] if still pending (the target process may be
    /// outside the runtime; see [`Addr`]).
    pub fn wait(&self, t: &Ticket, max: Duration) -> Result<(), AddrError> {
        self.wait_until(Some(Instant::now() + max), |_| {
            t.status() != TicketStatus::Pending
        })?;
        match t.status() {
            TicketStatus::Delivered => Ok(()),
            TicketStatus::Failed(reason) => Err(AddrError::Delivery {
                gid: t.target,
                reason,
            }),
            TicketStatus::Pending => Err(AddrError::TimedOut {
                after: max,
                what: format!("delivery to {}", t.target),
            }),
        }
    }

    /// A barrier that keeps serving addressing traffic while it waits: returns once every other
    /// live rank has reached it too (ranks whose process is gone, or that no route reaches, are
    /// not waited for).
    /// Collective over the world; waits at most `max`.
    pub fn barrier(&self, max: Duration) -> Result<(), AddrError> {
        let epoch = {
            let mut st = self.st.borrow_mut();
            st.epoch += 1;
            let e = st.epoch;
            for r in 0..st.gone.len() {
                if r != self.me {
                    let b = enc(&mut st, &Frame::Done { epoch: e });
                    self.raw(&mut st, r, b, false);
                }
            }
            e
        };
        let me = self.me;
        let ok = self.wait_until(Some(Instant::now() + max), |st| {
            (0..st.gone.len()).all(|r| {
                r == me
                    || st.done_epoch[r] >= epoch
                    || st.gone[r].is_some()
                    || st.routes[r] == Route::None
            })
        })?;
        if ok {
            Ok(())
        } else {
            Err(AddrError::TimedOut {
                after: max,
                what: "the addressing barrier".into(),
            })
        }
    }

    /// Serves incoming frames, completed sends and peer failures once; never blocks for long
    /// (a large message whose header has arrived is received whole).
    pub fn progress(&self) -> Result<(), AddrError> {
        self.progress_once().map(|_| ())
    }

    /// Serves addressing traffic for `d`.
    pub fn serve_for(&self, d: Duration) -> Result<(), AddrError> {
        self.wait_until(Some(Instant::now() + d), |_| false)
            .map(|_| ())
    }

    // ------------------------------------------------------------ engine

    fn wait_until(
        &self,
        deadline: Option<Instant>,
        mut done: impl FnMut(&mut State) -> bool,
    ) -> Result<bool, AddrError> {
        let mut idle = 0u32;
        let mut idle_since: Option<Instant> = None;
        loop {
            let worked = self.progress_once()?;
            if done(&mut self.st.borrow_mut()) {
                return Ok(true);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(false);
            }
            if worked {
                idle = 0;
                idle_since = None;
            } else if idle_since.get_or_insert_with(Instant::now).elapsed() < self.spin {
                std::hint::spin_loop();
            } else {
                idle = idle.saturating_add(1);
                if idle < 64 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_micros(u64::from((idle - 64).min(1000))));
                }
            }
        }
    }

    fn progress_once(&self) -> Result<bool, AddrError> {
        let mut worked = false;
        let mut st = self.st.borrow_mut();
        // Completed sends: a failed one means the peer is gone.
        let mut i = 0;
        while i < st.inflight.len() {
            match st.inflight[i].0.test() {
                Ok(false) => i += 1,
                Ok(true) => {
                    let (req, dest) = st.inflight.swap_remove(i);
                    match req.wait() {
                        Ok((buf, _)) => st.pool.give(buf),
                        Err(e) => self.peer_gone(&mut st, dest, e.to_string()),
                    }
                }
                Err(e) => {
                    let (_, dest) = st.inflight.swap_remove(i);
                    self.peer_gone(&mut st, dest, e.to_string());
                }
            }
        }
        // Peer deaths, seen through a receive posted to each peer that nobody ever answers.
        if st.last_sentinel_check.elapsed() >= Duration::from_millis(10) {
            st.last_sentinel_check = Instant::now();
            for r in 0..st.sentinels.len() {
                let fired = match &mut st.sentinels[r] {
                    Some(req) => !matches!(req.test(), Ok(false)),
                    None => false,
                };
                if fired {
                    if let Some(req) = st.sentinels[r].take() {
                        let why = match req.wait() {
                            Err(e) => e.to_string(),
                            Ok(_) => "it sent on the failure-detection tag".into(),
                        };
                        self.peer_gone(&mut st, r, why);
                    }
                }
            }
        }
        // Incoming frames.
        for _ in 0..256 {
            let Some(status) = self.comm.iprobe(ANY_SOURCE, TAG_FRAME)? else {
                break;
            };
            worked = true;
            let mut buf = st.pool.take(status.bytes);
            buf.resize(status.bytes, 0);
            let got = self
                .comm
                .irecv_into(buf, status.source, TAG_FRAME)
                .and_then(|r| r.wait());
            match got {
                Ok((buf, _)) => {
                    if let Some(buf) = self.incoming(&mut st, status.source, buf) {
                        st.pool.give(buf);
                    }
                }
                Err(e) => self.peer_gone(&mut st, status.source, e.to_string()),
            }
        }
        // Frames to this process itself.
        for _ in 0..4096 {
            let Some(bytes) = st.loopback.pop_front() else {
                break;
            };
            worked = true;
            self.handle(&mut st, self.me, &bytes);
            st.pool.give(bytes);
        }
        Ok(worked)
    }

    fn raw(&self, st: &mut State, dest: usize, bytes: Vec<u8>, data: bool) {
        if dest == self.me {
            st.loopback.push_back(bytes);
            return;
        }
        if st.gone[dest].is_some() {
            return;
        }
        let (hop, bytes) = match st.routes[dest] {
            Route::Direct => (dest, bytes),
            Route::Via(b) => {
                // Wrapped once here, at the origin; the bridge forwards the buffer as it is.
                let mut w = st.pool.take(FWD_HEADER + bytes.len());
                w.push(K_FWD);
                w.extend_from_slice(&(dest as u32).to_le_bytes());
                w.extend_from_slice(&(self.me as u32).to_le_bytes());
                w.extend_from_slice(&bytes);
                st.stats.bytes_copied += bytes.len() as u64;
                st.pool.give(bytes);
                (b, w)
            }
            // Data frames never get here (see `reachable`); control frames have nowhere to go.
            Route::None => return,
        };
        if st.gone[hop].is_some() {
            return;
        }
        if data {
            st.stats.data_frames_to[hop] += 1;
        } else {
            st.stats.control_frames += 1;
        }
        match self.comm.isend(bytes, hop, TAG_FRAME) {
            Ok(r) => st.inflight.push((r, hop)),
            Err(e) => self.peer_gone(st, hop, e.to_string()),
        }
    }

    /// A frame that arrived from `from`: forwarded unchanged if it is for another rank and this
    /// process is a bridge, handled otherwise. Returns the buffer if it was not handed on.
    fn incoming(&self, st: &mut State, from: usize, buf: Vec<u8>) -> Option<Vec<u8>> {
        if buf.first() != Some(&K_FWD) {
            self.handle(st, from, &buf);
            return Some(buf);
        }
        let (Some(dest), Some(origin)) = (u32_at(&buf, 1), u32_at(&buf, 5)) else {
            st.stats.malformed += 1;
            return Some(buf);
        };
        let (dest, origin) = (dest as usize, origin as usize);
        if dest >= st.gone.len() || origin >= st.gone.len() {
            st.stats.malformed += 1;
            return Some(buf);
        }
        if dest == self.me {
            self.handle(st, origin, &buf[FWD_HEADER..]);
            return Some(buf);
        }
        if !st.bridge || st.gone[dest].is_some() {
            // Not a bridge (or the destination is gone): the origin's ticket times out or
            // fails when it learns the destination is gone.
            st.stats.malformed += u64::from(!st.bridge);
            return Some(buf);
        }
        st.stats.forwarded += 1;
        st.stats.forwarded_bytes += buf.len() as u64;
        match self.comm.isend(buf, dest, TAG_FRAME) {
            Ok(r) => st.inflight.push((r, dest)),
            Err(e) => self.peer_gone(st, dest, e.to_string()),
        }
        None
    }

    fn submit(&self, st: &mut State, dest: usize, seq: u64, bytes: Vec<u8>) {
        if let Some(why) = st.gone[dest].clone() {
            resolve(st, seq, TicketStatus::Failed(Reason::ProcessGone(why)));
            return;
        }
        st.window_seqs[dest].push_back(seq);
        if let Some(b) = st.windows[dest].submit(bytes) {
            st.window_seqs[dest].pop_front();
            self.raw(st, dest, b, true);
        }
    }

    fn grant(&self, st: &mut State, from: usize, n: u32) {
        if n == 0 {
            return;
        }
        for b in st.windows[from].grant(n) {
            st.window_seqs[from].pop_front();
            self.raw(st, from, b, true);
        }
    }

    fn peer_gone(&self, st: &mut State, r: usize, why: String) {
        if r == self.me || st.gone[r].is_some() {
            return;
        }
        st.gone[r] = Some(why.clone());
        st.windows[r].drain();
        st.window_seqs[r].clear();
        let dead: Vec<u64> = st
            .pending
            .iter()
            .filter(|(_, (d, _))| *d == r)
            .map(|(s, _)| *s)
            .collect();
        for s in dead {
            resolve(
                st,
                s,
                TicketStatus::Failed(Reason::ProcessGone(why.clone())),
            );
        }
        for g in st.gets.values_mut() {
            if matches!(g, GetWait::Waiting(d) if *d == r) {
                *g = GetWait::Done(Err(Reason::ProcessGone(why.clone())));
            }
        }
    }

    fn reply(&self, st: &mut State, to: usize, seq: u64, res: Result<(), Reason>, refund: bool) {
        let credits = st.owed[to].take() + u32::from(refund);
        let f = match res {
            Ok(()) => Frame::Ack { seq, credits },
            Err(reason) => Frame::Nack {
                seq,
                reason,
                credits,
            },
        };
        let b = enc(st, &f);
        self.raw(st, to, b, false);
    }

    fn release(&self, st: &mut State, credit: Option<Rc<usize>>) {
        if let Some(rc) = credit {
            if Rc::strong_count(&rc) == 1 {
                let src = *rc;
                if let Some(k) = st.owed[src].add(threshold(self.credits)) {
                    let b = enc(st, &Frame::Credit { credits: k });
                    self.raw(st, src, b, false);
                }
            }
        }
    }

    fn handle(&self, st: &mut State, from: usize, bytes: &[u8]) {
        st.stats.bytes_copied += bytes.len() as u64;
        let f = match Frame::decode(bytes) {
            Ok(f) => f,
            Err(_) => {
                st.stats.malformed += 1;
                return;
            }
        };
        match f {
            Frame::Data {
                seq,
                dst,
                src,
                cred,
                tag,
                payload,
            } => {
                let res = match st.mailboxes.get_mut(&dst) {
                    None if st.blocks.contains_key(&dst) => Err(Reason::WrongKind),
                    None => Err(Reason::NoSuchResource),
                    Some(m) => admit(&m.acl, self.cred.uid, cred).map(|()| {
                        m.queue.push_back(Stored {
                            src,
                            src_rank: from,
                            tag,
                            data: payload,
                            credit: Some(Rc::new(from)),
                        })
                    }),
                };
                let refund = res.is_err();
                self.reply(st, from, seq, res, refund);
            }
            Frame::Mcast {
                seq,
                origin,
                src,
                cred,
                tag,
                members,
                payload,
            } => {
                if !st.dedup.first_time(origin, seq) {
                    self.reply(st, from, seq, Ok(()), true);
                    return;
                }
                let credit = Rc::new(from);
                let mut accepted = 0;
                let mut refusal = Reason::NoSuchResource;
                for m in members {
                    if let Some(mb) = st.mailboxes.get_mut(&m) {
                        match admit(&mb.acl, self.cred.uid, cred) {
                            Ok(()) => {
                                accepted += 1;
                                mb.queue.push_back(Stored {
                                    src,
                                    src_rank: from,
                                    tag,
                                    data: payload.clone(),
                                    credit: Some(credit.clone()),
                                });
                            }
                            Err(r) => refusal = r,
                        }
                    }
                }
                drop(credit);
                let res = if accepted > 0 { Ok(()) } else { Err(refusal) };
                self.reply(st, from, seq, res, accepted == 0);
            }
            Frame::Ack { seq, credits } => {
                resolve(st, seq, TicketStatus::Delivered);
                self.grant(st, from, credits);
            }
            Frame::Nack {
                seq,
                reason,
                credits,
            } => {
                if let Some(g) = st.gets.get_mut(&seq) {
                    *g = GetWait::Done(Err(reason));
                } else {
                    resolve(st, seq, TicketStatus::Failed(reason));
                }
                self.grant(st, from, credits);
            }
            Frame::Credit { credits } => self.grant(st, from, credits),
            Frame::Put {
                seq,
                dst,
                cred,
                offset,
                data,
            } => {
                let res = match st.blocks.get_mut(&dst) {
                    None if st.mailboxes.contains_key(&dst) => Err(Reason::WrongKind),
                    None => Err(Reason::NoSuchResource),
                    Some(b) => admit(&b.acl, self.cred.uid, cred)
                        .and_then(|()| block_range(b.data.len(), offset, data.len() as u64))
                        .map(|r| b.data[r].copy_from_slice(&data)),
                };
                self.reply(st, from, seq, res, false);
            }
            Frame::Get {
                seq,
                dst,
                cred,
                offset,
                len,
            } => {
                let res = match st.blocks.get(&dst) {
                    None if st.mailboxes.contains_key(&dst) => Err(Reason::WrongKind),
                    None => Err(Reason::NoSuchResource),
                    Some(b) => admit(&b.acl, self.cred.uid, cred)
                        .and_then(|()| block_range(b.data.len(), offset, len))
                        .map(|r| b.data[r].to_vec()),
                };
                match res {
                    Ok(data) => {
                        let b = enc(st, &Frame::GetReply { seq, data });
                        self.raw(st, from, b, false)
                    }
                    Err(r) => self.reply(st, from, seq, Err(r), false),
                }
            }
            Frame::GetReply { seq, data } => {
                if let Some(g) = st.gets.get_mut(&seq) {
                    if matches!(g, GetWait::Waiting(_)) {
                        *g = GetWait::Done(Ok(data));
                    }
                }
            }
            Frame::Done { epoch } => {
                let e = &mut st.done_epoch[from];
                *e = (*e).max(epoch);
            }
        }
    }
}

/// Encodes `f` into a buffer of its size class.
fn enc(st: &mut State, f: &Frame) -> Vec<u8> {
    st.stats.bytes_copied += f.encoded_len() as u64;
    let mut b = st.pool.take(f.encoded_len());
    f.encode_into(&mut b);
    b
}

fn resolve(st: &mut State, seq: u64, to: TicketStatus) {
    if let Some((_, cell)) = st.pending.remove(&seq) {
        *cell.borrow_mut() = to;
    }
}

struct JobEnvOk;
impl JobEnvOk {
    fn ok(j: &str) -> bool {
        j.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    }
}

impl Drop for Addr {
    fn drop(&mut self) {
        self.hb_stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.hb.take() {
            let _ = h.join();
        }
        let _ = self.dir.get_mut().close_context(self.ctx);
    }
}

// ---------------------------------------------------------------- mailboxes and blocks

/// A mailbox this process registered: messages sent to its gid queue here until received.
#[derive(Debug)]
pub struct Mailbox<'a> {
    addr: &'a Addr,
    gid: Gid,
    target: Target,
    deleted: bool,
}

impl<'a> Mailbox<'a> {
    /// Registers a mailbox with `attrs` (user attributes; names starting with `mutirao.` are
    /// reserved) and `acl` (who may find it and send to it; checked by the directory and again
    /// by this process when a message arrives). The directory entry also says where it lives.
    pub fn register(addr: &'a Addr, attrs: &AttrList, acl: Acl) -> Result<Mailbox<'a>, AddrError> {
        let (gid, target) = addr.register(attrs, Kind::Mailbox, &acl, None)?;
        addr.st.borrow_mut().mailboxes.insert(
            gid,
            MailboxState {
                acl,
                queue: VecDeque::new(),
            },
        );
        Ok(Mailbox {
            addr,
            gid,
            target,
            deleted: false,
        })
    }

    /// Its gid.
    pub fn gid(&self) -> Gid {
        self.gid
    }

    /// How others address it (what [`Addr::find`] would return).
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// Messages waiting in it (after the last progress).
    pub fn pending(&self) -> usize {
        self.addr
            .st
            .borrow()
            .mailboxes
            .get(&self.gid)
            .map_or(0, |m| m.queue.len())
    }

    /// Takes the first waiting message that `m` accepts (in arrival order), waiting as `t`
    /// says; `Ok(None)` when none came in time. Serves this process's addressing traffic while
    /// it waits.
    pub fn recv(&self, m: Match, t: Timeout) -> Result<Option<Message>, AddrError> {
        let gid = self.gid;
        let mut out = None;
        let mut missing = false;
        self.addr.wait_until(t.deadline(), |st| {
            let Some(mb) = st.mailboxes.get_mut(&gid) else {
                missing = true;
                return true;
            };
            if let Some(i) = mb.queue.iter().position(|x| m.takes(x)) {
                if let Some(x) = mb.queue.remove(i) {
                    self.addr.release(st, x.credit);
                    out = Some(Message {
                        src: x.src,
                        src_rank: x.src_rank,
                        tag: x.tag,
                        data: x.data,
                    });
                    return true;
                }
            }
            false
        })?;
        if missing {
            return Err(AddrError::Deleted(gid));
        }
        Ok(out)
    }

    /// Deletes it: later sends to it fail with [`Reason::NoSuchResource`]; messages still
    /// waiting in it are dropped (their senders' tickets already said delivered).
    /// Dropping the handle deletes it too (ignoring errors).
    pub fn delete(mut self) -> Result<(), AddrError> {
        self.remove()
    }

    fn remove(&mut self) -> Result<(), AddrError> {
        if std::mem::replace(&mut self.deleted, true) {
            return Ok(());
        }
        {
            let mut st = self.addr.st.borrow_mut();
            if let Some(mb) = st.mailboxes.remove(&self.gid) {
                for x in mb.queue {
                    self.addr.release(&mut st, x.credit);
                }
            }
        }
        Ok(self.addr.dir.borrow_mut().delete(self.gid)?)
    }
}

impl Drop for Mailbox<'_> {
    fn drop(&mut self) {
        let _ = self.remove();
    }
}

/// A memory block this process registered: other ranks `put` and `get` bytes of it.
#[derive(Debug)]
pub struct Block<'a> {
    addr: &'a Addr,
    gid: Gid,
    target: Target,
    deleted: bool,
}

impl<'a> Block<'a> {
    /// Registers a zero-filled block of `size` bytes with `attrs` and `acl` (checked by the
    /// directory and by this process on every put/get).
    pub fn register(
        addr: &'a Addr,
        attrs: &AttrList,
        size: usize,
        acl: Acl,
    ) -> Result<Block<'a>, AddrError> {
        let (gid, target) = addr.register(attrs, Kind::Block, &acl, Some(size))?;
        addr.st.borrow_mut().blocks.insert(
            gid,
            BlockState {
                acl,
                data: vec![0; size],
            },
        );
        Ok(Block {
            addr,
            gid,
            target,
            deleted: false,
        })
    }

    /// Its gid.
    pub fn gid(&self) -> Gid {
        self.gid
    }

    /// How others address it.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// Reads `len` bytes at `offset` locally.
    pub fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>, AddrError> {
        let st = self.addr.st.borrow();
        let b = st
            .blocks
            .get(&self.gid)
            .ok_or(AddrError::Deleted(self.gid))?;
        let r = block_range(b.data.len(), offset, len).map_err(|reason| AddrError::Delivery {
            gid: self.gid,
            reason,
        })?;
        Ok(b.data[r].to_vec())
    }

    /// Writes `data` at `offset` locally.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), AddrError> {
        let mut st = self.addr.st.borrow_mut();
        let b = st
            .blocks
            .get_mut(&self.gid)
            .ok_or(AddrError::Deleted(self.gid))?;
        let r = block_range(b.data.len(), offset, data.len() as u64).map_err(|reason| {
            AddrError::Delivery {
                gid: self.gid,
                reason,
            }
        })?;
        b.data[r].copy_from_slice(data);
        Ok(())
    }

    /// Deletes it; later put/get fail with [`Reason::NoSuchResource`].
    /// Dropping the handle deletes it too (ignoring errors).
    pub fn delete(mut self) -> Result<(), AddrError> {
        self.remove()
    }

    fn remove(&mut self) -> Result<(), AddrError> {
        if std::mem::replace(&mut self.deleted, true) {
            return Ok(());
        }
        self.addr.st.borrow_mut().blocks.remove(&self.gid);
        Ok(self.addr.dir.borrow_mut().delete(self.gid)?)
    }
}

impl Drop for Block<'_> {
    fn drop(&mut self) {
        let _ = self.remove();
    }
}

impl From<DirError> for AddrError {
    fn from(e: DirError) -> Self {
        AddrError::Dir(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_direct_via_bridge_or_none() {
        // 0: tech 0; 1: techs 0 and 1, bridge; 2: tech 1; 3: tech 2 (isolated).
        let techs = [0b001, 0b011, 0b010, 0b100];
        let bridges = [false, true, false, false];
        assert_eq!(route(0, 1, &techs, &bridges), Route::Direct);
        assert_eq!(route(0, 2, &techs, &bridges), Route::Via(1));
        assert_eq!(route(2, 0, &techs, &bridges), Route::Via(1));
        assert_eq!(route(0, 3, &techs, &bridges), Route::None);
        assert_eq!(route(3, 3, &techs, &bridges), Route::Direct);
        // Without the bridge flag, a multi-technology process does not forward.
        assert_eq!(route(0, 2, &techs, &[false; 4]), Route::None);
    }

    #[test]
    fn technology_lists() {
        assert_eq!(parse_techs("0").unwrap(), 1);
        assert_eq!(parse_techs("0, 1,63").unwrap(), 0b11 | 1 << 63);
        assert!(parse_techs("64").is_err());
        assert!(parse_techs("x").is_err());
        assert!(parse_techs("").is_err());
    }

    #[test]
    fn reserved_names_are_refused() {
        let a = AttrList::from_pairs([("mutirao.rank", "3")]).unwrap();
        assert!(matches!(reserved_check(&a), Err(AddrError::Reserved(n)) if n == "mutirao.rank"));
        let q = AttrList::from_pairs([("service", "x")]).unwrap();
        let l = located_query(&q, Kind::Block).unwrap();
        assert_eq!(l.value(ATTR_KIND), Some(&b"block"[..]));
        assert!(l.get(ATTR_SIZE).is_some());
    }

    #[test]
    fn targets_without_location_are_not_addressable() {
        let a = AttrList::from_pairs([("mutirao.kind", "mailbox"), ("mutirao.job", "j")]).unwrap();
        assert!(matches!(
            parse_target(Gid(5), &a),
            Err(AddrError::NotAddressable { attr, .. }) if attr == ATTR_RANK
        ));
    }
}
