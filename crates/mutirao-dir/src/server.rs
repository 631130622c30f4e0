//! The directory server: a [`Directory`] served to local clients over a Unix socket and to
//! peer servers over authenticated TCP (tokio, multi-threaded).
//!
//! Hosting it (what `mutirao agent` does):
//! ```no_run
//! # async fn host() -> Result<(), mutirao_dir::DirError> {
//! use mutirao_dir::server::{DirServer, ServerConfig};
//! let mut cfg = ServerConfig::default();
//! cfg.dir.node = 7;
//! cfg.cluster_key = b"shared secret".to_vec();
//! cfg.peers = vec!["127.0.0.1:7701".parse().unwrap()];
//! let server = DirServer::new(cfg)?;
//! let tcp = tokio::net::TcpListener::bind("127.0.0.1:7700").await?;
//! let handles = server.spawn(Some("/tmp/mutirao-dir.sock".into()), Some(tcp))?;
//! # drop(handles); Ok(()) }
//! ```
//!
//! Requests from local clients run as the uid/gid the kernel reports for the socket
//! (SO_PEERCRED); requests from peers run as the uid/gid the origin server attached, trusted
//! because the peer proved knowledge of the cluster key. Registration never touches the network
//! (except `unique` ones, routed to the attributes' owner server). Site and grid queries that
//! miss locally fan out to the peers in scope; only peers that find something reply, and the
//! first positive reply wins; silence until `peer_timeout` means not found.

use crate::attr::{Attr, AttrList};
use crate::directory::{full_key, Acl, Cred, DirConfig, Directory, Registered, ACL_ATTR};
use crate::error::DirError;
use crate::gid::Gid;
use crate::net::{
    frame_into, handshake_accept, handshake_connect, read_frame, write_frame, FrameReader, PeerId,
    SpinGate, DEFAULT_SPIN,
};
use crate::wire::{Header, Kind, Packet, Scope, FLAG_CREATED, FLAG_MORE, FLAG_UNIQUE};
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use tokio::io::{AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::{JoinHandle, JoinSet};

mod event_loop;
mod limits;

use limits::{Handshakes, RefusalLog, Slot, Slots};

/// How a server serves its local (Unix-socket) clients; see [`DirServer::set_local_mode`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LocalMode {
    /// One thread runs every connection through epoll, polling briefly after requests
    /// before it sleeps. Requests that need no peer are answered on that thread; the others
    /// go to the tokio runtime. The fastest with many clients, and a fixed thread count.
    #[default]
    EventLoop,
    /// A thread per connection, polling its socket briefly before it sleeps. Peer fan-outs
    /// are awaited on that thread.
    Threads,
    /// A tokio task per connection, sleeping in the runtime (the slowest).
    Tasks,
}

impl LocalMode {
    fn to_u8(self) -> u8 {
        match self {
            LocalMode::EventLoop => 0,
            LocalMode::Threads => 1,
            LocalMode::Tasks => 2,
        }
    }

    fn from_u8(v: u8) -> LocalMode {
        match v {
            1 => LocalMode::Threads,
            2 => LocalMode::Tasks,
            _ => LocalMode::EventLoop,
        }
    }
}

/// Name of the system attribute carrying an error message in a reply.
pub const ERROR_ATTR: &str = "sys.error";

/// Server configuration.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The directory's configuration (gid split, cluster and node ids, timeouts).
    pub dir: DirConfig,
    /// TCP addresses of the other directory servers (sites are learned at the handshake).
    pub peers: Vec<SocketAddr>,
    /// Shared cluster key authenticating servers to each other. Must not be empty when
    /// peers are used.
    pub cluster_key: Vec<u8>,
    /// How long a fan-out waits for a positive reply before answering "not found".
    pub peer_timeout: Duration,
    /// How long connecting to a peer may take.
    pub connect_timeout: Duration,
    /// TCP connections still in their handshake at once; over it the oldest is closed
    /// (each has [`crate::net::HANDSHAKE_TIMEOUT`] for the whole handshake).
    pub max_handshakes: usize,
    /// Authenticated peer connections served at once; over it a new one is closed.
    pub max_peer_conns: usize,
    /// Local (Unix-socket) clients served at once; over it a new one is closed at once.
    pub max_local_conns: usize,
}

/// Default [`ServerConfig::max_handshakes`].
pub const DEFAULT_MAX_HANDSHAKES: usize = 64;
/// Default [`ServerConfig::max_peer_conns`].
pub const DEFAULT_MAX_PEER_CONNS: usize = 256;
/// Default [`ServerConfig::max_local_conns`].
pub const DEFAULT_MAX_LOCAL_CONNS: usize = 1024;
/// Pause after a failed `accept` (out of descriptors: wait for some to be closed).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            dir: DirConfig::default(),
            peers: vec![],
            cluster_key: vec![],
            peer_timeout: Duration::from_millis(200),
            connect_timeout: Duration::from_secs(1),
            max_handshakes: DEFAULT_MAX_HANDSHAKES,
            max_peer_conns: DEFAULT_MAX_PEER_CONNS,
            max_local_conns: DEFAULT_MAX_LOCAL_CONNS,
        }
    }
}

/// An encoded frame, shared by every peer a fan-out sends it to.
type Frame = Arc<Vec<u8>>;

/// Where the replies to a fan-out go.
enum Waiter {
    /// A task: (connection, request id, reply).
    Task(mpsc::UnboundedSender<(Arc<Conn>, u64, Packet)>),
    /// A local-client thread.
    Thread(std::sync::mpsc::Sender<Packet>),
    /// A connection of the event loop, which takes the first positive reply only.
    Loop(event_loop::LoopWaiter),
}

/// Fan-outs in flight, by request id.
type FanoutTable = Mutex<HashMap<u64, Waiter>>;

struct Conn {
    id: PeerId,
    w: Arc<PeerWriter>,
    pending: Mutex<HashMap<u64, oneshot::Sender<Packet>>>,
    alive: AtomicBool,
}

/// The write side of a connection to a peer. A frame goes out on the calling thread when the
/// socket takes it (a fan-out wakes no writer task); what the socket does not take waits, in
/// order, for the flusher task ([`flush_loop`]), and later frames queue behind it.
struct PeerWriter {
    st: Mutex<WriterState>,
    more: tokio::sync::Notify,
}

struct WriterState {
    /// A second descriptor of the socket (non-blocking).
    sock: std::net::TcpStream,
    /// Bytes the socket has not taken yet, in order.
    pending: Vec<u8>,
    broken: bool,
}

impl PeerWriter {
    /// Splits a peer connection: the writer (with its flusher task started) and the read
    /// half. Needs a tokio runtime.
    fn start(s: TcpStream) -> std::io::Result<(Arc<PeerWriter>, tokio::net::tcp::OwnedReadHalf)> {
        // A second descriptor for writing from any thread without the runtime.
        let std = s.into_std()?;
        let sock = std.try_clone()?;
        let (r, w) = TcpStream::from_std(std)?.into_split();
        let writer = Arc::new(PeerWriter {
            st: Mutex::new(WriterState {
                sock,
                pending: Vec::new(),
                broken: false,
            }),
            more: tokio::sync::Notify::new(),
        });
        tokio::spawn(flush_loop(writer.clone(), w));
        Ok((writer, r))
    }

    /// Sends `f` or queues it behind earlier bytes; `false` if the connection is broken.
    fn send(&self, f: &[u8]) -> bool {
        use rustix::io::Errno;
        use rustix::net::SendFlags;
        let mut st = lock(&self.st);
        if st.broken {
            return false;
        }
        if !st.pending.is_empty() {
            st.pending.extend_from_slice(f);
            return true;
        }
        let mut off = 0;
        while off < f.len() {
            match rustix::net::send(
                &st.sock,
                &f[off..],
                SendFlags::DONTWAIT | SendFlags::NOSIGNAL,
            ) {
                Ok(n) => off += n,
                Err(Errno::AGAIN) => break,
                Err(Errno::INTR) => {}
                Err(_) => {
                    st.broken = true;
                    return false;
                }
            }
        }
        if off < f.len() {
            st.pending.extend_from_slice(&f[off..]);
            drop(st);
            self.more.notify_one();
        }
        true
    }

    fn is_broken(&self) -> bool {
        lock(&self.st).broken
    }

    /// Marks it broken and ends its flusher.
    fn close(&self) {
        lock(&self.st).broken = true;
        self.more.notify_one();
    }
}

/// Frames for peers held back until the event loop ends its pass, so that the fan-outs of one
/// pass share one `send` per peer (under load) while a lone fan-out still goes out at once.
#[derive(Default)]
pub(super) struct Cork {
    held: Vec<(Arc<Conn>, Vec<u8>)>,
}

impl Cork {
    fn add(&mut self, c: &Arc<Conn>, f: &[u8]) {
        match self.held.iter_mut().find(|(x, _)| Arc::ptr_eq(x, c)) {
            Some((_, buf)) => buf.extend_from_slice(f),
            None => self.held.push((c.clone(), f.to_vec())),
        }
    }

    /// Sends what is held (a broken connection's part is dropped: its fan-outs time out).
    pub(super) fn flush(&mut self) {
        for (c, buf) in self.held.drain(..) {
            let _ = c.w.send(&buf);
        }
    }
}

/// Writes what [`PeerWriter::send`] could not, when the socket can take it.
async fn flush_loop(w: Arc<PeerWriter>, half: tokio::net::tcp::OwnedWriteHalf) {
    loop {
        w.more.notified().await;
        loop {
            {
                let st = lock(&w.st);
                if st.broken {
                    return;
                }
                if st.pending.is_empty() {
                    break;
                }
            }
            if half.writable().await.is_err() {
                w.close();
                return;
            }
            let mut st = lock(&w.st);
            match half.try_write(&st.pending) {
                Ok(n) => {
                    st.pending.drain(..n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => {
                    st.broken = true;
                    return;
                }
            }
        }
    }
}

/// Removes a request's entry from a waiter table when the request ends in any way
/// (reply, timeout, or the waiting future dropped).
struct Unregister<'a, T>(&'a Mutex<HashMap<u64, T>>, u64);

impl<T> Drop for Unregister<'_, T> {
    fn drop(&mut self) {
        lock(self.0).remove(&self.1);
    }
}

impl Conn {
    /// Sends a request; waits at most `timeout` for a reply (`None`: silence or failure).
    async fn request(&self, mut p: Packet, id: u64, timeout: Duration) -> Option<Packet> {
        p.header.query_id = id;
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(id, tx);
        let _unregister = Unregister(&self.pending, id);
        let mut frame = Vec::with_capacity(p.encoded_len() + 4);
        frame_into(&p, &mut frame);
        if !self.w.send(&frame) {
            return None;
        }
        tokio::time::timeout(timeout, rx).await.ok()?.ok()
    }

    /// Sends a request that expects no reply.
    fn notify(&self, p: &Packet) {
        let mut frame = Vec::with_capacity(p.encoded_len() + 4);
        frame_into(p, &mut frame);
        let _ = self.w.send(&frame);
    }
}

/// A request sent to several peers at once; replies arrive on `rx` until it is dropped.
struct Fanout {
    rx: mpsc::UnboundedReceiver<(Arc<Conn>, u64, Packet)>,
    /// How many peers the request went to.
    sent: usize,
    table: Arc<FanoutTable>,
    id: u64,
}

impl Drop for Fanout {
    fn drop(&mut self) {
        lock(&self.table).remove(&self.id);
    }
}

/// Local connections served by threads, shut down when their accept task ends.
#[derive(Default)]
struct LocalConns {
    closed: AtomicBool,
    next: AtomicU64,
    socks: Mutex<HashMap<u64, std::os::unix::net::UnixStream>>,
}

impl LocalConns {
    fn shutdown_all(&self) {
        for (_, s) in lock(&self.socks).drain() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// Owned by the accept task: dropping it (abort, runtime shutdown) ends every connection.
struct LocalGuard(Arc<LocalConns>);

impl Drop for LocalGuard {
    fn drop(&mut self) {
        self.0.closed.store(true, Ordering::Release);
        self.0.shutdown_all();
    }
}

/// A unique resource a peer holds for one of our contexts: (holder, gid, registrant).
type RemoteHeld = (Arc<Conn>, Gid, Cred);

struct PeerLink {
    addr: SocketAddr,
    /// The live connection, if any (read without waiting on every fan-out).
    conn: Mutex<Option<Arc<Conn>>>,
    /// Held while connecting, so that concurrent requests connect once.
    connecting: tokio::sync::Mutex<()>,
}

struct PeerCursor {
    conn: Arc<Conn>,
    remote: u64,
    buffered: Option<(Gid, AttrList)>,
    more: bool,
}

struct GridCursor {
    cred: Cred,
    local: Option<u64>,
    /// The peers' first answers (`None`: local scope).
    arrivals: Option<Fanout>,
    /// How many first answers have arrived.
    arrived: usize,
    peers: Vec<PeerCursor>,
    deadline: tokio::time::Instant,
    last_used: Instant,
}

struct Inner {
    cfg: ServerConfig,
    me: PeerId,
    dir: RwLock<Directory>,
    peers: Vec<PeerLink>,
    next_req: AtomicU64,
    next_cursor: AtomicU64,
    cursors: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<GridCursor>>>>,
    cursor_used: Mutex<HashMap<u64, Instant>>,
    remote_held: Mutex<HashMap<Gid, Vec<RemoteHeld>>>,
    fanouts: Arc<FanoutTable>,
    local_mode: AtomicU8,
    /// The local clients' event loop, which serves peer connections accepted while it runs.
    peer_loop: Mutex<Option<event_loop::LoopSender>>,
    local_spin_ns: AtomicU64,
    spin_gate: Arc<SpinGate>,
    /// TCP connections in their handshake.
    handshakes: Handshakes,
    /// Authenticated peer connections served.
    peer_slots: Arc<Slots>,
    /// Local clients served.
    local_slots: Arc<Slots>,
    refusals: RefusalLog,
}

/// The directory server. Cheap to clone (an `Arc`).
#[derive(Clone)]
pub struct DirServer {
    inner: Arc<Inner>,
}

/// Handles of the tasks started by [`DirServer::spawn`]; abort them to stop the server.
pub struct ServerHandles {
    /// Unix-socket accept loop.
    pub unix: Option<JoinHandle<Result<(), DirError>>>,
    /// TCP accept loop.
    pub tcp: Option<JoinHandle<Result<(), DirError>>>,
    /// Heartbeat-expiry loop.
    pub maintenance: JoinHandle<()>,
}

impl ServerHandles {
    /// Aborts every task.
    pub fn abort(&self) {
        if let Some(h) = &self.unix {
            h.abort();
        }
        if let Some(h) = &self.tcp {
            h.abort();
        }
        self.maintenance.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn reply(h: &Header) -> Header {
    let mut r = Header::new(Kind::Reply);
    r.query_id = h.query_id;
    r.scope = h.scope;
    r
}

/// A reply packet carrying `e`.
pub fn error_packet(h: &Header, e: &DirError) -> Packet {
    let mut r = reply(h);
    r.status = e.status();
    r.target = match e {
        DirError::NotFound(g) | DirError::UnknownContext(g) => *g,
        _ => h.target,
    };
    if let DirError::UnknownQuery(q) = e {
        r.query_id = *q;
    }
    if let DirError::UnknownScope(s) = e {
        r.scope = *s;
    }
    let msg: String = e.body().chars().take(4096).collect();
    let attrs = AttrList::from_attrs([Attr::full(ERROR_ATTR, msg)]).unwrap_or_default();
    Packet::new(r, attrs)
}

/// Rebuilds the error carried by a reply packet (status ≠ 0).
pub fn error_from_packet(p: &Packet) -> DirError {
    let h = &p.header;
    let msg = p
        .attrs
        .value(ERROR_ATTR)
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .unwrap_or_else(|| format!("server status {}", h.status));
    match h.status {
        1 => DirError::NotFound(h.target),
        2 => DirError::NoMatch,
        3 => DirError::PermissionDenied(msg.trim_start_matches("permission denied: ").to_string()),
        4 => DirError::UnknownQuery(h.query_id),
        5 => DirError::UnknownContext(h.target),
        6 => DirError::Exhausted,
        10 => DirError::BadConfig(msg),
        11 => DirError::Protocol(format!("the server could not decode our packet: {msg}")),
        12 => DirError::TooLarge(msg),
        13 => DirError::BadAttrs(msg),
        14 => DirError::UnknownScope(h.scope),
        15 => DirError::SystemNamespace(msg),
        21 => DirError::Auth(msg),
        23 => DirError::Timeout(msg),
        30 => DirError::Meu(msg),
        _ => DirError::Protocol(msg),
    }
}

fn ok_packet(h: &Header, target: Gid, attrs: AttrList) -> Packet {
    let mut r = reply(h);
    r.target = target;
    Packet::new(r, attrs)
}

impl DirServer {
    /// A server with an empty directory. Spawns nothing; call [`DirServer::spawn`] (or the
    /// `serve_*` functions) inside a tokio runtime.
    pub fn new(cfg: ServerConfig) -> Result<Self, DirError> {
        if !cfg.peers.is_empty() && cfg.cluster_key.is_empty() {
            return Err(DirError::BadConfig(
                "peers are configured but the cluster key is empty; give every server the same key"
                    .into(),
            ));
        }
        let dir = Directory::new(cfg.dir.clone())?;
        let me = PeerId {
            cluster: cfg.dir.cluster,
            node: cfg.dir.node,
        };
        let peers = cfg
            .peers
            .iter()
            .map(|&addr| PeerLink {
                addr,
                conn: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
            })
            .collect();
        Ok(DirServer {
            inner: Arc::new(Inner {
                me,
                dir: RwLock::new(dir),
                peers,
                next_req: AtomicU64::new(1),
                next_cursor: AtomicU64::new(1),
                cursors: Mutex::new(HashMap::new()),
                cursor_used: Mutex::new(HashMap::new()),
                remote_held: Mutex::new(HashMap::new()),
                fanouts: Arc::new(Mutex::new(HashMap::new())),
                local_mode: AtomicU8::new(LocalMode::default().to_u8()),
                peer_loop: Mutex::new(None),
                local_spin_ns: AtomicU64::new(DEFAULT_SPIN.as_nanos() as u64),
                spin_gate: Arc::new(SpinGate::server()),
                handshakes: Handshakes::new(cfg.max_handshakes),
                peer_slots: Slots::new(cfg.max_peer_conns, "authenticated peer connections"),
                local_slots: Slots::new(cfg.max_local_conns, "local clients"),
                refusals: RefusalLog::default(),
                cfg,
            }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.inner.cfg
    }

    /// How local Unix-socket clients are served (default [`LocalMode::EventLoop`]).
    /// Applies to connections accepted later (a listener started in one mode keeps its
    /// event loop, if it has one, for connections accepted in that mode).
    pub fn set_local_mode(&self, mode: LocalMode) {
        self.inner.local_mode.store(mode.to_u8(), Ordering::Relaxed);
    }

    /// How local clients accepted from now on are served.
    pub fn local_mode(&self) -> LocalMode {
        LocalMode::from_u8(self.inner.local_mode.load(Ordering::Relaxed))
    }

    /// How long the event loop or a local-client thread polls for the next request before
    /// sleeping (default [`DEFAULT_SPIN`]; zero: sleep at once; see
    /// [`crate::net::SpinPolicy`]). Applies to connections accepted later and to event loops
    /// started later.
    pub fn set_local_spin(&self, spin: Duration) {
        let ns = spin.as_nanos().min(u64::MAX as u128) as u64;
        self.inner.local_spin_ns.store(ns, Ordering::Relaxed);
    }

    /// Runs `f` on the directory (in-process access without a socket).
    pub fn with_directory<R>(&self, f: impl FnOnce(&mut Directory) -> R) -> R {
        let mut d = self.inner.dir.write().unwrap_or_else(|e| e.into_inner());
        f(&mut d)
    }

    /// Open multi-answer queries: this server's grid cursors plus the directory's cursors
    /// (including those held for peers).
    pub fn open_queries(&self) -> usize {
        lock(&self.inner.cursors).len() + self.with_directory(|d| d.open_queries())
    }

    /// Starts the maintenance loop and the listeners given. The Unix socket is created at
    /// `unix` (a stale socket file there is replaced) with mode 0666: who may do what is
    /// decided per request from the peer's uid. A TCP listener needs a cluster key
    /// ([`DirError::BadConfig`] without one, before anything starts).
    pub fn spawn(
        &self,
        unix: Option<PathBuf>,
        tcp: Option<TcpListener>,
    ) -> Result<ServerHandles, DirError> {
        if tcp.is_some() {
            self.check_listen_key()?;
        }
        let unix = match unix {
            Some(p) => {
                let l = bind_unix(&p)?;
                let s = self.clone();
                Some(tokio::spawn(async move { s.serve_unix_listener(l).await }))
            }
            None => None,
        };
        let tcp = tcp.map(|l| {
            let s = self.clone();
            tokio::spawn(async move { s.serve_tcp(l).await })
        });
        let maintenance = self.spawn_maintenance();
        Ok(ServerHandles {
            unix,
            tcp,
            maintenance,
        })
    }

    /// Periodically purges contexts that missed their heartbeats and idle queries.
    pub fn spawn_maintenance(&self) -> JoinHandle<()> {
        let s = self.clone();
        let period = (s.inner.cfg.dir.heartbeat_timeout / 4).max(Duration::from_millis(5));
        tokio::spawn(async move {
            let mut iv = tokio::time::interval(period);
            loop {
                iv.tick().await;
                s.maintain(Instant::now());
            }
        })
    }

    /// One maintenance pass at time `now` (exposed for tests and custom loops).
    pub fn maintain(&self, now: Instant) {
        let expired = self.with_directory(|d| d.expire(now));
        for ctx in expired.contexts {
            self.release_remote(ctx);
        }
        let qt = self.inner.cfg.dir.query_timeout;
        let idle: Vec<u64> = lock(&self.inner.cursor_used)
            .iter()
            .filter(|(_, t)| now.saturating_duration_since(**t) > qt)
            .map(|(id, _)| *id)
            .collect();
        for id in idle {
            self.drop_cursor(id);
        }
    }

    fn release_remote(&self, ctx: Gid) {
        let held = lock(&self.inner.remote_held).remove(&ctx);
        for (conn, gid, cred) in held.into_iter().flatten() {
            // The delete runs as the user who registered it, who owns it at the holder.
            let mut h = Header::new(Kind::PeerDelete);
            h.target = gid;
            h.uid = cred.uid;
            h.gid = cred.gid;
            conn.notify(&Packet::new(h, AttrList::new()));
        }
    }

    /// Serves local clients on a Unix socket at `path` until the task is aborted.
    pub async fn serve_unix(&self, path: &Path) -> Result<(), DirError> {
        let l = bind_unix(path)?;
        self.serve_unix_listener(l).await
    }

    /// Serves local clients on an already bound Unix listener, in the
    /// [`DirServer::local_mode`] current when each connection is accepted. When this task
    /// ends (aborted, or its runtime dropped), the connections it accepted are shut down
    /// too.
    pub async fn serve_unix_listener(&self, l: UnixListener) -> Result<(), DirError> {
        let live = Arc::new(LocalConns::default());
        let _shutdown_on_exit = LocalGuard(live.clone());
        // Started with the first connection served in the event-loop mode; dropping it
        // stops the loop and closes its connections.
        let mut event_loop: Option<event_loop::LoopHandle> = None;
        if self.local_mode() == LocalMode::EventLoop {
            self.start_loop(&mut event_loop);
        }
        loop {
            let stream = match l.accept().await {
                Ok((s, _)) => s,
                Err(e) => {
                    self.accept_failed("Unix socket", &e).await;
                    continue;
                }
            };
            // Over the cap the connection is closed at once (logged once).
            let Some(slot) = self.inner.local_slots.take() else {
                continue;
            };
            let (stream, slot) = match self.local_mode() {
                LocalMode::EventLoop => match self.add_to_loop(stream, slot, &mut event_loop) {
                    Ok(()) => continue,
                    Err(back) => back,
                },
                LocalMode::Threads => match self.spawn_local_thread(stream, slot, &live) {
                    Ok(()) => continue,
                    Err(back) => back,
                },
                LocalMode::Tasks => (stream, slot),
            };
            let s = self.clone();
            tokio::spawn(async move {
                let _ = s.local_conn(stream).await;
                drop(slot);
            });
        }
    }

    /// An `accept` failed (out of descriptors, most likely): log it and pause, instead of
    /// ending the listener.
    async fn accept_failed(&self, what: &str, e: &std::io::Error) {
        self.inner
            .refusals
            .refused(&format!("accepting on the {what} failed: {e}"));
        tokio::time::sleep(ACCEPT_BACKOFF).await;
    }

    /// A TCP peer listener needs a non-empty cluster key: with an empty one anybody could
    /// pass the handshake and act as any uid.
    fn check_listen_key(&self) -> Result<(), DirError> {
        if self.inner.cfg.cluster_key.is_empty() {
            return Err(DirError::BadConfig(
                "no cluster key: a server without one serves its Unix socket only and opens no \
                 TCP peer listener; give every server the same key (--key-file FILE or \
                 MUTIRAO_CLUSTER_KEY) to listen for peers"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Starts the event loop unless it runs; peer connections accepted from then on are
    /// served by it too. Without a loop (it could not start), connections are served as
    /// tasks.
    fn start_loop(&self, event_loop: &mut Option<event_loop::LoopHandle>) {
        if event_loop.is_some() {
            return;
        }
        let spin = Duration::from_nanos(self.inner.local_spin_ns.load(Ordering::Relaxed));
        let rt = tokio::runtime::Handle::current();
        if let Ok(h) = event_loop::LoopHandle::start(self.clone(), rt, spin) {
            *lock(&self.inner.peer_loop) = Some(h.sender().clone());
            *event_loop = Some(h);
        }
    }

    /// Hands a local connection to the event loop (starting it if needed); gives the stream
    /// back when that is impossible (the caller then serves it as a task).
    fn add_to_loop(
        &self,
        stream: UnixStream,
        slot: Slot,
        event_loop: &mut Option<event_loop::LoopHandle>,
    ) -> Result<(), (UnixStream, Slot)> {
        let cred = match stream.peer_cred() {
            Ok(c) => Cred::new(c.uid(), c.gid()),
            Err(_) => return Err((stream, slot)),
        };
        self.start_loop(event_loop);
        let Some(lp) = event_loop.as_ref() else {
            return Err((stream, slot));
        };
        // tokio's stream is already non-blocking, as the loop needs.
        let std = match stream.into_std() {
            Ok(s) => s,
            // into_std only fails if deregistering fails; nothing to serve then.
            Err(_) => return Ok(()),
        };
        match lp
            .sender()
            .add(std.into(), event_loop::Party::Client(cred), slot)
        {
            Ok(()) => Ok(()),
            Err((s, slot)) => {
                // The loop has ended: start a new one with the next connection.
                *event_loop = None;
                UnixStream::from_std(s.into()).map_or(Ok(()), |s| Err((s, slot)))
            }
        }
    }

    /// Moves a local connection onto its own blocking thread; gives the stream back when
    /// that is impossible (the caller then serves it as a task).
    fn spawn_local_thread(
        &self,
        stream: UnixStream,
        slot: Slot,
        live: &Arc<LocalConns>,
    ) -> Result<(), (UnixStream, Slot)> {
        let cred = match stream.peer_cred() {
            Ok(c) => Cred::new(c.uid(), c.gid()),
            Err(_) => return Err((stream, slot)),
        };
        let std = match stream.into_std() {
            Ok(s) => s,
            // into_std only fails if deregistering fails; nothing to serve then.
            Err(_) => return Ok(()),
        };
        let registered = match (std.set_nonblocking(false), std.try_clone()) {
            (Ok(()), Ok(c)) => c,
            _ => return Ok(()),
        };
        let id = live.next.fetch_add(1, Ordering::Relaxed);
        lock(&live.socks).insert(id, registered);
        let s = self.clone();
        let rt = tokio::runtime::Handle::current();
        let live2 = live.clone();
        // Given back if the thread cannot start (the closure is dropped unrun).
        let slot = Arc::new(Mutex::new(Some(slot)));
        let slot2 = slot.clone();
        let spawned = std::thread::Builder::new()
            .name("mdir-local".into())
            .spawn(move || {
                let _held = lock(&slot2).take();
                let _ = s.local_conn_blocking(&std, cred, &rt);
                lock(&live2.socks).remove(&id);
            });
        match spawned {
            Ok(_) => {
                // The accept task may have ended between the insert and here.
                if live.closed.load(Ordering::Acquire) {
                    live.shutdown_all();
                }
                Ok(())
            }
            Err(_) => {
                let back = lock(&live.socks).remove(&id);
                let slot = lock(&slot).take();
                match (back.map(|b| (b.set_nonblocking(true), b)), slot) {
                    (Some((Ok(()), b)), Some(slot)) => {
                        UnixStream::from_std(b).map_or(Ok(()), |b| Err((b, slot)))
                    }
                    _ => Ok(()),
                }
            }
        }
    }

    /// One local client on a blocking thread: read a request (polling briefly first), answer
    /// it here if no peer is needed, else on the runtime, write the reply with one syscall
    /// (replies to pipelined requests are batched until no request is buffered).
    fn local_conn_blocking(
        &self,
        s: &std::os::unix::net::UnixStream,
        cred: Cred,
        rt: &tokio::runtime::Handle,
    ) -> Result<(), DirError> {
        use std::io::Write;
        let spin = Duration::from_nanos(self.inner.local_spin_ns.load(Ordering::Relaxed));
        let mut r = FrameReader::new(spin).with_gate(self.inner.spin_gate.clone());
        let mut out = Vec::with_capacity(4096);
        loop {
            let reply = match r.next_frame(s)? {
                None => return Ok(()),
                Some(frame) => match Packet::decode(frame) {
                    Ok(p) => match self
                        .try_handle_here(cred, p)
                        .or_else(|p| self.query_peers_here(cred, p))
                    {
                        Ok(reply) => reply,
                        Err(p) => {
                            let (tx, rx) = oneshot::channel();
                            let srv = self.clone();
                            rt.spawn(async move {
                                let _ = tx.send(srv.handle_slow(cred, p).await);
                            });
                            rx.blocking_recv()
                                .map_err(|_| DirError::Io("the server's runtime stopped".into()))?
                        }
                    },
                    Err(e) => error_packet(&Header::new(Kind::Reply), &e),
                },
            };
            frame_into(&reply, &mut out);
            if !r.has_buffered() {
                (&*s).write_all(&out)?;
                out.clear();
            }
        }
    }

    async fn local_conn(&self, stream: UnixStream) -> Result<(), DirError> {
        let cred = stream.peer_cred()?;
        let cred = Cred::new(cred.uid(), cred.gid());
        let (r, w) = stream.into_split();
        let mut r = BufReader::with_capacity(64 * 1024, r);
        let mut w = BufWriter::with_capacity(64 * 1024, w);
        let mut buf = Vec::new();
        let mut out = Vec::new();
        loop {
            if read_frame(&mut r, &mut buf).await?.is_none() {
                w.flush().await?;
                return Ok(());
            }
            let reply = match Packet::decode(&buf) {
                Ok(p) => self.handle(cred, p).await,
                Err(e) => error_packet(&Header::new(Kind::Reply), &e),
            };
            out.clear();
            frame_into(&reply, &mut out);
            w.write_all(&out).await?;
            if r.buffer().is_empty() {
                w.flush().await?;
            }
        }
    }

    /// Serves peer servers on a TCP listener until the task is aborted. Refuses to start
    /// without a cluster key ([`DirError::BadConfig`]).
    ///
    /// Each connection has [`crate::net::HANDSHAKE_TIMEOUT`] for its whole handshake, in
    /// which it is read at most [`crate::net::MAX_PREAUTH`] bytes; at most
    /// [`ServerConfig::max_handshakes`] are in their handshake at once (over it the oldest is
    /// closed) and [`ServerConfig::max_peer_conns`] are served once authenticated. Refusals
    /// are logged on standard error.
    pub async fn serve_tcp(&self, l: TcpListener) -> Result<(), DirError> {
        self.check_listen_key()?;
        loop {
            let (stream, from) = match l.accept().await {
                Ok(x) => x,
                Err(e) => {
                    self.accept_failed("TCP peer listener", &e).await;
                    continue;
                }
            };
            let (id, evicted) = self.inner.handshakes.admit();
            let s = self.clone();
            tokio::spawn(async move {
                let _ = s.peer_conn(stream, from, id, evicted).await;
            });
        }
    }

    /// The handshake of an accepted connection (`id` in the handshake table), then serving it.
    async fn peer_conn(
        &self,
        mut stream: TcpStream,
        from: SocketAddr,
        id: u64,
        evicted: oneshot::Receiver<()>,
    ) -> Result<(), DirError> {
        let hs = tokio::select! {
            r = async {
                stream.set_nodelay(true)?;
                handshake_accept(&mut stream, &self.inner.cfg.cluster_key, self.inner.me).await
            } => Some(r),
            // Closed over the handshake cap (logged once by the table).
            _ = evicted => None,
        };
        self.inner.handshakes.done(id);
        match hs {
            None => return Ok(()),
            Some(Err(e)) => {
                self.inner
                    .refusals
                    .refused(&format!("refused a peer connection from {from}: {e}"));
                return Err(e);
            }
            Some(Ok(_)) => {}
        }
        // Over the cap the connection is closed at once (logged once).
        let Some(slot) = self.inner.peer_slots.take() else {
            return Ok(());
        };
        // The local clients' event loop, if one runs, serves the peer from here on: no task
        // wake-up per fan-out request.
        let lp = lock(&self.inner.peer_loop).clone();
        let (stream, _slot) = match lp {
            Some(lp) => {
                let std = stream.into_std()?;
                let party = event_loop::Party::Peer(Mutex::new(HashMap::new()));
                match lp.add(std.into(), party, slot) {
                    Ok(()) => return Ok(()),
                    Err((fd, slot)) => {
                        *lock(&self.inner.peer_loop) = None;
                        (TcpStream::from_std(fd.into())?, slot)
                    }
                }
            }
            None => (stream, slot),
        };
        let (r, w) = stream.into_split();
        let mut r = BufReader::new(r);
        let (tx, rx) = mpsc::unbounded_channel::<Frame>();
        let writer = tokio::spawn(write_loop(w, rx));
        // Paged queries of this connection: the requester's start request id -> our cursor.
        let cursors: Arc<Mutex<HashMap<u64, u64>>> = Arc::new(Mutex::new(HashMap::new()));
        let mut buf = Vec::new();
        let result = loop {
            match read_frame(&mut r, &mut buf).await {
                Ok(Some(())) => {}
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
            let p = match Packet::decode(&buf) {
                Ok(p) => p,
                Err(e) => break Err(e),
            };
            // Peer requests never wait on anything: answer them here, in order (a task
            // per request cost more than the request itself).
            if let Some(reply) = self.handle_peer(p, &cursors) {
                let mut f = Vec::with_capacity(reply.encoded_len() + 4);
                frame_into(&reply, &mut f);
                let _ = tx.send(Arc::new(f));
            }
        };
        self.stop_peer_cursors(&cursors);
        drop(tx);
        let _ = writer.await;
        result
    }

    /// Frees the paged queries a peer connection left open.
    fn stop_peer_cursors(&self, cursors: &Mutex<HashMap<u64, u64>>) {
        let ids: Vec<u64> = lock(cursors).drain().map(|(_, v)| v).collect();
        self.with_directory(|d| {
            for q in ids {
                let _ = d.query_stop(q);
            }
        });
    }

    fn handle_peer(&self, p: Packet, cursors: &Mutex<HashMap<u64, u64>>) -> Option<Packet> {
        let h = &p.header;
        let cred = Cred::new(h.uid, h.gid);
        let now = Instant::now();
        match h.kind {
            Kind::PeerQuery => {
                let gid = (h.target != Gid::NONE).then_some(h.target);
                let d = self.inner.dir.read().unwrap_or_else(|e| e.into_inner());
                d.query(cred, gid, &p.attrs)
                    .ok()
                    .map(|(g, a)| ok_packet(h, g, a))
            }
            Kind::PeerStart => {
                let mut d = self.with_dir_write();
                let q = d.query_start(cred, p.attrs.clone(), now).ok()?;
                match d.query_next(q, now) {
                    Ok(Some((g, a))) => {
                        let mut r = ok_packet(h, g, a);
                        if d.query_has_more(q) {
                            r.header.flags |= FLAG_MORE;
                            lock(cursors).insert(h.query_id, q);
                        } else {
                            let _ = d.query_stop(q);
                        }
                        Some(r)
                    }
                    _ => {
                        let _ = d.query_stop(q);
                        None
                    }
                }
            }
            Kind::PeerNext => {
                let start = h.target.0;
                let q = lock(cursors).get(&start).copied();
                let Some(q) = q else {
                    return Some(error_packet(h, &DirError::UnknownQuery(start)));
                };
                let mut d = self.with_dir_write();
                let res = d.query_next(q, now);
                let more = d.query_has_more(q);
                if !more {
                    let _ = d.query_stop(q);
                    lock(cursors).remove(&start);
                }
                Some(match res {
                    Ok(Some((g, a))) => {
                        let mut r = ok_packet(h, g, a);
                        if more {
                            r.header.flags |= FLAG_MORE;
                        }
                        r
                    }
                    Ok(None) => error_packet(h, &DirError::NoMatch),
                    Err(e) => error_packet(h, &e),
                })
            }
            Kind::PeerStop => {
                if let Some(q) = lock(cursors).remove(&h.target.0) {
                    let _ = self.with_dir_write().query_stop(q);
                }
                None
            }
            Kind::PeerUnique => {
                let mut attrs = p.attrs.clone();
                let acl = match take_acl(&mut attrs) {
                    Ok(a) => a,
                    Err(e) => return Some(error_packet(h, &e)),
                };
                let res = self
                    .with_dir_write()
                    .register(cred, Gid::NONE, attrs, acl, true);
                Some(match res {
                    Ok(r) => registered_packet(h, r),
                    Err(e) => error_packet(h, &e),
                })
            }
            Kind::PeerDelete => {
                let res = self.with_dir_write().delete(cred, h.target);
                Some(match res {
                    Ok(()) => ok_packet(h, h.target, AttrList::new()),
                    Err(e) => error_packet(h, &e),
                })
            }
            _ => Some(error_packet(
                h,
                &DirError::Protocol(format!("{:?} is not a server-to-server request", h.kind)),
            )),
        }
    }

    fn with_dir_write(&self) -> std::sync::RwLockWriteGuard<'_, Directory> {
        self.inner.dir.write().unwrap_or_else(|e| e.into_inner())
    }

    fn with_dir_read(&self) -> std::sync::RwLockReadGuard<'_, Directory> {
        self.inner.dir.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Handles one local-client request as `cred` and returns the reply (never fails: errors
    /// are reply packets). This is what the Unix socket calls; an embedding process may call
    /// it directly.
    pub async fn handle(&self, cred: Cred, p: Packet) -> Packet {
        match self.try_handle_here(cred, p) {
            Ok(reply) => reply,
            Err(p) => self.handle_slow(cred, p).await,
        }
    }

    /// Answers `p` on the calling thread if that needs no peer and no async wait (local
    /// queries and hits, registration, contexts, deletes of our own resources); otherwise
    /// gives the packet back for [`DirServer::handle_slow`].
    fn try_handle_here(&self, cred: Cred, p: Packet) -> Result<Packet, Packet> {
        let h = &p.header;
        let res = match h.kind {
            Kind::OpenContext => self
                .with_dir_write()
                .open_context(cred, Instant::now())
                .map(|g| ok_packet(h, g, AttrList::new())),
            Kind::Heartbeat => self
                .with_dir_write()
                .heartbeat(cred, h.target, Instant::now())
                .map(|()| ok_packet(h, h.target, AttrList::new())),
            Kind::CloseContext => {
                let r = self.with_dir_write().close_context(cred, h.target);
                r.map(|_| {
                    self.release_remote(h.target);
                    ok_packet(h, h.target, AttrList::new())
                })
            }
            Kind::Register if h.flags & FLAG_UNIQUE == 0 || self.inner.peers.is_empty() => {
                self.register_here(cred, h, p.attrs.clone())
            }
            Kind::Query => {
                let gid = (h.target != Gid::NONE).then_some(h.target);
                match Scope::from_u8(h.scope) {
                    Err(e) => Err(e),
                    Ok(scope) => match self.query_here(cred, gid, &p.attrs, scope) {
                        Some(r) => r.map(|(g, a)| ok_packet(h, g, a)),
                        None => return Err(p),
                    },
                }
            }
            Kind::Delete if self.is_mine(h.target) => self
                .delete_here(cred, h.target)
                .map(|()| ok_packet(h, h.target, AttrList::new())),
            _ => return Err(p),
        };
        Ok(res.unwrap_or_else(|e| error_packet(h, &e)))
    }

    /// Handles a request that [`DirServer::try_handle_here`] gave back (it may involve peers).
    async fn handle_slow(&self, cred: Cred, p: Packet) -> Packet {
        let h = p.header.clone();
        match self.handle_inner(cred, p).await {
            Ok(r) => r,
            Err(e) => error_packet(&h, &e),
        }
    }

    fn is_mine(&self, gid: Gid) -> bool {
        let parts = self.inner.cfg.dir.split.decode(gid);
        parts.cluster == self.inner.me.cluster && parts.node == self.inner.me.node
    }

    async fn handle_inner(&self, cred: Cred, p: Packet) -> Result<Packet, DirError> {
        let h = p.header.clone();
        let now = Instant::now();
        match h.kind {
            Kind::OpenContext => {
                let g = self.with_dir_write().open_context(cred, now)?;
                Ok(ok_packet(&h, g, AttrList::new()))
            }
            Kind::Heartbeat => {
                self.with_dir_write().heartbeat(cred, h.target, now)?;
                Ok(ok_packet(&h, h.target, AttrList::new()))
            }
            Kind::CloseContext => {
                self.with_dir_write().close_context(cred, h.target)?;
                self.release_remote(h.target);
                Ok(ok_packet(&h, h.target, AttrList::new()))
            }
            Kind::Register => self.register(cred, &h, p.attrs).await,
            Kind::Query => {
                let scope = Scope::from_u8(h.scope)?;
                let gid = (h.target != Gid::NONE).then_some(h.target);
                let (g, a) = match self.query_here(cred, gid, &p.attrs, scope) {
                    Some(r) => r?,
                    None => self.query_peers(cred, gid, &p.attrs, scope).await?,
                };
                Ok(ok_packet(&h, g, a))
            }
            Kind::QueryStart => {
                let scope = Scope::from_u8(h.scope)?;
                let id = self.cursor_start(cred, p.attrs, scope).await?;
                self.cursor_reply(&h, id).await
            }
            Kind::QueryNext => self.cursor_reply(&h, h.query_id).await,
            Kind::QueryStop => {
                if !self.drop_cursor(h.query_id) {
                    return Err(DirError::UnknownQuery(h.query_id));
                }
                Ok(ok_packet(&h, Gid::NONE, AttrList::new()))
            }
            Kind::Delete => {
                self.delete(cred, h.target).await?;
                Ok(ok_packet(&h, h.target, AttrList::new()))
            }
            k => Err(DirError::Protocol(format!("{k:?} is not a client request"))),
        }
    }

    async fn register(&self, cred: Cred, h: &Header, attrs: AttrList) -> Result<Packet, DirError> {
        let mut user = attrs.clone();
        let acl = take_acl(&mut user)?;
        let unique = h.flags & FLAG_UNIQUE != 0;
        if unique && !self.inner.peers.is_empty() {
            // Validate everything locally before any network I/O, so a bad request changes
            // nothing anywhere.
            {
                let d = self.with_dir_read();
                d.check_context(cred, h.target)?;
                d.check_registrable(&user)?;
            }
            let key = full_key(&user);
            let conns = self.conns(Scope::Grid).await;
            let score = |id: PeerId| {
                let mut s = DefaultHasher::new();
                (key, id.cluster, id.node).hash(&mut s);
                (s.finish(), id.cluster, id.node)
            };
            let mut best: Option<Arc<Conn>> = None;
            let mut best_score = score(self.inner.me);
            for c in conns {
                let sc = score(c.id);
                if sc > best_score {
                    best_score = sc;
                    best = Some(c);
                }
            }
            if let Some(owner) = best {
                let mut rh = Header::new(Kind::PeerUnique);
                rh.uid = cred.uid;
                rh.gid = cred.gid;
                let id = self.inner.next_req.fetch_add(1, Ordering::Relaxed);
                let r = owner
                    .request(Packet::new(rh, attrs), id, self.inner.cfg.peer_timeout.max(Duration::from_secs(1)))
                    .await
                    .ok_or_else(|| DirError::Timeout("the owner server of these attributes did not answer the unique registration".into()))?;
                if r.header.status != 0 {
                    return Err(error_from_packet(&r));
                }
                if r.header.flags & FLAG_CREATED != 0 {
                    let ctx = if h.target == Gid::NONE {
                        None
                    } else {
                        Some(h.target)
                    };
                    if let Some(ctx) = ctx {
                        lock(&self.inner.remote_held).entry(ctx).or_default().push((
                            owner,
                            r.header.target,
                            cred,
                        ));
                    }
                }
                let mut out = reply(h);
                out.target = r.header.target;
                out.flags = r.header.flags & FLAG_CREATED;
                return Ok(Packet::new(out, AttrList::new()));
            }
        }
        let r = self
            .with_dir_write()
            .register(cred, h.target, user, acl, unique)?;
        Ok(registered_packet(h, r))
    }

    /// Registration answered locally (not `unique`, or no peers).
    fn register_here(
        &self,
        cred: Cred,
        h: &Header,
        mut attrs: AttrList,
    ) -> Result<Packet, DirError> {
        let acl = take_acl(&mut attrs)?;
        let unique = h.flags & FLAG_UNIQUE != 0;
        let r = self
            .with_dir_write()
            .register(cred, h.target, attrs, acl, unique)?;
        Ok(registered_packet(h, r))
    }

    /// Single-answer query as `cred` in `scope`.
    pub async fn query(
        &self,
        cred: Cred,
        gid: Option<Gid>,
        q: &AttrList,
        scope: Scope,
    ) -> Result<(Gid, AttrList), DirError> {
        match self.query_here(cred, gid, q, scope) {
            Some(r) => r,
            None => self.query_peers(cred, gid, q, scope).await,
        }
    }

    /// The part of a query this server decides alone: `None` when peers must be asked (a
    /// gid another server holds in scope, or a local attribute miss in site/grid scope).
    fn query_here(
        &self,
        cred: Cred,
        gid: Option<Gid>,
        q: &AttrList,
        scope: Scope,
    ) -> Option<Result<(Gid, AttrList), DirError>> {
        if let Some(g) = gid {
            if self.is_mine(g) {
                return Some(self.with_dir_read().query(cred, gid, q));
            }
            let parts = self.inner.cfg.dir.split.decode(g);
            let in_scope = match scope {
                Scope::Local => false,
                Scope::Site => parts.cluster == self.inner.me.cluster,
                Scope::Grid => true,
            };
            return if in_scope {
                None
            } else {
                Some(Err(DirError::NotFound(g)))
            };
        }
        match self.with_dir_read().query(cred, None, q) {
            Err(DirError::NoMatch) if scope != Scope::Local => None,
            other => Some(other),
        }
    }

    /// The peers' part of a query that [`DirServer::query_here`] could not decide.
    async fn query_peers(
        &self,
        cred: Cred,
        gid: Option<Gid>,
        q: &AttrList,
        scope: Scope,
    ) -> Result<(Gid, AttrList), DirError> {
        let split = self.inner.cfg.dir.split;
        if let Some(g) = gid {
            let parts = split.decode(g);
            let owner = self
                .conns(scope)
                .await
                .into_iter()
                .find(|c| c.id.cluster == parts.cluster && c.id.node == parts.node)
                .ok_or(DirError::NotFound(g))?;
            let mut h = Header::new(Kind::PeerQuery);
            h.uid = cred.uid;
            h.gid = cred.gid;
            h.target = g;
            let id = self.inner.next_req.fetch_add(1, Ordering::Relaxed);
            return match owner
                .request(Packet::new(h, q.clone()), id, self.inner.cfg.peer_timeout)
                .await
            {
                Some(r) if r.header.status == 0 => Ok((r.header.target, r.attrs)),
                _ => Err(DirError::NotFound(g)),
            };
        }
        let Some(mut f) = self.fan_out(scope, cred, Kind::PeerQuery, q).await else {
            return Err(DirError::NoMatch);
        };
        // Only positive peers reply; the first reply wins, silence means not found.
        let first = tokio::time::timeout(self.inner.cfg.peer_timeout, async {
            while let Some((_, _, r)) = f.rx.recv().await {
                if r.header.status == 0 {
                    return Some(r);
                }
            }
            None
        })
        .await;
        match first {
            Ok(Some(r)) => Ok((r.header.target, r.attrs)),
            _ => Err(DirError::NoMatch),
        }
    }

    fn delete_here(&self, cred: Cred, gid: Gid) -> Result<(), DirError> {
        let closing_ctx = self.with_dir_read().is_context(gid);
        self.with_dir_write().delete(cred, gid)?;
        if closing_ctx {
            self.release_remote(gid);
        }
        Ok(())
    }

    async fn delete(&self, cred: Cred, gid: Gid) -> Result<(), DirError> {
        let parts = self.inner.cfg.dir.split.decode(gid);
        if self.is_mine(gid) {
            return self.delete_here(cred, gid);
        }
        let owner = self
            .conns(Scope::Grid)
            .await
            .into_iter()
            .find(|c| c.id.cluster == parts.cluster && c.id.node == parts.node)
            .ok_or(DirError::NotFound(gid))?;
        let mut h = Header::new(Kind::PeerDelete);
        h.uid = cred.uid;
        h.gid = cred.gid;
        h.target = gid;
        let id = self.inner.next_req.fetch_add(1, Ordering::Relaxed);
        let r = owner
            .request(
                Packet::new(h, AttrList::new()),
                id,
                self.inner.cfg.peer_timeout.max(Duration::from_secs(1)),
            )
            .await
            .ok_or_else(|| DirError::Timeout(format!("the server holding {gid} did not answer")))?;
        if r.header.status != 0 {
            return Err(error_from_packet(&r));
        }
        Ok(())
    }

    async fn cursor_start(&self, cred: Cred, q: AttrList, scope: Scope) -> Result<u64, DirError> {
        let now = Instant::now();
        let local = self.with_dir_write().query_start(cred, q.clone(), now)?;
        let arrivals = if scope != Scope::Local {
            self.fan_out(scope, cred, Kind::PeerStart, &q).await
        } else {
            None
        };
        let id = self.inner.next_cursor.fetch_add(1, Ordering::Relaxed);
        let cur = GridCursor {
            cred,
            local: Some(local),
            arrivals,
            arrived: 0,
            peers: vec![],
            deadline: tokio::time::Instant::now()
                + if scope == Scope::Local {
                    Duration::ZERO
                } else {
                    self.inner.cfg.peer_timeout
                },
            last_used: now,
        };
        lock(&self.inner.cursors).insert(id, Arc::new(tokio::sync::Mutex::new(cur)));
        lock(&self.inner.cursor_used).insert(id, now);
        Ok(id)
    }

    async fn cursor_reply(&self, h: &Header, id: u64) -> Result<Packet, DirError> {
        let cur = lock(&self.inner.cursors)
            .get(&id)
            .cloned()
            .ok_or(DirError::UnknownQuery(id))?;
        let next = {
            let mut c = cur.lock().await;
            c.last_used = Instant::now();
            lock(&self.inner.cursor_used).insert(id, c.last_used);
            self.cursor_next(&mut c).await
        };
        match next {
            Some((g, a)) => {
                let mut r = ok_packet(h, g, a);
                r.header.query_id = id;
                r.header.flags |= FLAG_MORE;
                Ok(r)
            }
            None => {
                self.drop_cursor(id);
                let mut e = error_packet(h, &DirError::NoMatch);
                e.header.query_id = id;
                Ok(e)
            }
        }
    }

    async fn cursor_next(&self, c: &mut GridCursor) -> Option<(Gid, AttrList)> {
        let _ = c.cred;
        if let Some(l) = c.local {
            let r = self.with_dir_write().query_next(l, Instant::now());
            match r {
                Ok(Some(x)) => return Some(x),
                _ => {
                    let _ = self.with_dir_write().query_stop(l);
                    c.local = None;
                }
            }
        }
        loop {
            if let Some(f) = c.arrivals.as_mut() {
                while let Ok((conn, remote, r)) = f.rx.try_recv() {
                    c.arrived += 1;
                    c.peers.push(PeerCursor {
                        conn,
                        remote,
                        buffered: Some((r.header.target, r.attrs)),
                        more: r.header.flags & FLAG_MORE != 0,
                    });
                }
            }
            for pc in c.peers.iter_mut() {
                if let Some(x) = pc.buffered.take() {
                    return Some(x);
                }
            }
            for pc in c.peers.iter_mut() {
                if pc.more {
                    let mut h = Header::new(Kind::PeerNext);
                    h.target = Gid(pc.remote);
                    let id = self.inner.next_req.fetch_add(1, Ordering::Relaxed);
                    match pc
                        .conn
                        .request(
                            Packet::new(h, AttrList::new()),
                            id,
                            self.inner.cfg.peer_timeout,
                        )
                        .await
                    {
                        Some(r) if r.header.status == 0 => {
                            pc.more = r.header.flags & FLAG_MORE != 0;
                            return Some((r.header.target, r.attrs));
                        }
                        _ => pc.more = false,
                    }
                }
            }
            let now = tokio::time::Instant::now();
            let all_in = c.arrivals.as_ref().is_none_or(|f| c.arrived >= f.sent);
            if now >= c.deadline || all_in {
                // Every peer answered, or the window closed: later answers are dropped.
                c.arrivals = None;
                return None;
            }
            let f = c.arrivals.as_mut()?;
            match tokio::time::timeout(c.deadline - now, f.rx.recv()).await {
                Ok(Some((conn, remote, r))) => {
                    c.arrived += 1;
                    c.peers.push(PeerCursor {
                        conn,
                        remote,
                        buffered: Some((r.header.target, r.attrs)),
                        more: r.header.flags & FLAG_MORE != 0,
                    })
                }
                Ok(None) | Err(_) => c.deadline = now,
            }
        }
    }

    fn drop_cursor(&self, id: u64) -> bool {
        lock(&self.inner.cursor_used).remove(&id);
        let Some(cur) = lock(&self.inner.cursors).remove(&id) else {
            return false;
        };
        if let Ok(c) = cur.try_lock() {
            if let Some(l) = c.local {
                let _ = self.with_dir_write().query_stop(l);
            }
            for pc in &c.peers {
                if pc.more {
                    let mut h = Header::new(Kind::PeerStop);
                    h.target = Gid(pc.remote);
                    pc.conn.notify(&Packet::new(h, AttrList::new()));
                }
            }
        }
        true
    }

    /// Sends `kind` with `q` as `cred` to every peer in `scope` (connecting lazily): the
    /// packet is encoded once and queued on each connection; the replies come back on the
    /// returned [`Fanout`], which stops accepting them when dropped. `None`: no peer.
    async fn fan_out(&self, scope: Scope, cred: Cred, kind: Kind, q: &AttrList) -> Option<Fanout> {
        let conns = self.conns(scope).await;
        if conns.is_empty() {
            return None;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let (id, sent) = self.send_fanout(&conns, cred, kind, q, Waiter::Task(tx), None);
        Some(Fanout {
            rx,
            sent,
            table: self.inner.fanouts.clone(),
            id,
        })
    }

    /// Registers `waiter` under a fresh request id, encodes the request once and queues it
    /// on every connection; returns the id and how many connections took it. The caller
    /// must remove the id from the fan-out table when done.
    fn send_fanout(
        &self,
        conns: &[Arc<Conn>],
        cred: Cred,
        kind: Kind,
        q: &AttrList,
        waiter: Waiter,
        cork: Option<&mut Cork>,
    ) -> (u64, usize) {
        let id = self.inner.next_req.fetch_add(1, Ordering::Relaxed);
        let mut h = Header::new(kind);
        h.uid = cred.uid;
        h.gid = cred.gid;
        h.query_id = id;
        let p = Packet::new(h, q.clone());
        let mut frame = Vec::with_capacity(p.encoded_len() + 4);
        frame_into(&p, &mut frame);
        let frame = Arc::new(frame);
        lock(&self.inner.fanouts).insert(id, waiter);
        let sent = match cork {
            Some(cork) => conns
                .iter()
                .filter(|c| !c.w.is_broken())
                .map(|c| cork.add(c, &frame))
                .count(),
            None => conns.iter().filter(|c| c.w.send(&frame)).count(),
        };
        (id, sent)
    }

    /// Connections to every peer in `scope` if all are open (`None`: some must be opened,
    /// which only the runtime can do).
    fn open_conns(&self, scope: Scope) -> Option<Vec<Arc<Conn>>> {
        let mut out = Vec::with_capacity(self.inner.peers.len());
        if scope == Scope::Local {
            return Some(out);
        }
        for link in &self.inner.peers {
            let c = lock(&link.conn)
                .as_ref()
                .filter(|c| c.alive.load(Ordering::Acquire))
                .cloned()?;
            if scope == Scope::Grid || c.id.cluster == self.inner.me.cluster {
                out.push(c);
            }
        }
        Some(out)
    }

    /// The open peer connections to fan `p` out to, if it is an attribute query and every
    /// peer in its scope is connected.
    fn fanout_conns(&self, p: &Packet) -> Option<Vec<Arc<Conn>>> {
        let h = &p.header;
        if h.kind != Kind::Query || h.target != Gid::NONE {
            return None;
        }
        self.open_conns(Scope::from_u8(h.scope).ok()?)
    }

    /// A site/grid attribute query that missed locally, fanned out and awaited on the
    /// calling (local-client) thread. `Err(p)`: it needs the runtime (a peer connection must
    /// be opened first, or it is not such a query).
    fn query_peers_here(&self, cred: Cred, p: Packet) -> Result<Packet, Packet> {
        let Some(conns) = self.fanout_conns(&p) else {
            return Err(p);
        };
        let h = &p.header;
        let (tx, rx) = std::sync::mpsc::channel();
        let (id, sent) = self.send_fanout(
            &conns,
            cred,
            Kind::PeerQuery,
            &p.attrs,
            Waiter::Thread(tx),
            None,
        );
        let _unregister = Unregister(&self.inner.fanouts, id);
        let deadline = Instant::now() + self.inner.cfg.peer_timeout;
        // Only positive peers reply; the first reply wins, silence means not found.
        let mut waiting = sent > 0;
        while waiting {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(r) if r.header.status == 0 => {
                    return Ok(ok_packet(h, r.header.target, r.attrs));
                }
                Ok(_) => {}
                Err(_) => waiting = false,
            }
        }
        Ok(error_packet(h, &DirError::NoMatch))
    }

    /// Starts a site/grid attribute query that missed locally for a connection of the event
    /// loop: the first positive reply goes to `waiter`. `Ok(Some(id))`: in flight under
    /// fan-out `id` (the caller times it out with [`DirServer::end_fanout`]); `Ok(None)`: no
    /// peer to ask. `Err(p)`: not such a query, or a peer connection must be opened first.
    fn start_loop_fanout(
        &self,
        cred: Cred,
        p: Packet,
        waiter: event_loop::LoopWaiter,
        cork: &mut Cork,
    ) -> Result<Option<u64>, Packet> {
        let Some(conns) = self.fanout_conns(&p) else {
            return Err(p);
        };
        let (id, sent) = self.send_fanout(
            &conns,
            cred,
            Kind::PeerQuery,
            &p.attrs,
            Waiter::Loop(waiter),
            Some(cork),
        );
        if sent == 0 {
            lock(&self.inner.fanouts).remove(&id);
            return Ok(None);
        }
        Ok(Some(id))
    }

    /// Ends fan-out `id` if no positive reply has taken it; `true` if it was still waiting
    /// (then its answer is "not found").
    fn end_fanout(&self, id: u64) -> bool {
        lock(&self.inner.fanouts).remove(&id).is_some()
    }

    /// Connections to every reachable peer in `scope`; already open ones are taken without
    /// waiting, missing ones are opened concurrently.
    async fn conns(&self, scope: Scope) -> Vec<Arc<Conn>> {
        if scope == Scope::Local || self.inner.peers.is_empty() {
            return vec![];
        }
        let mut out = Vec::with_capacity(self.inner.peers.len());
        let mut missing = vec![];
        for (i, link) in self.inner.peers.iter().enumerate() {
            match lock(&link.conn).as_ref() {
                Some(c) if c.alive.load(Ordering::Acquire) => out.push(c.clone()),
                _ => missing.push(i),
            }
        }
        if !missing.is_empty() {
            let mut set = JoinSet::new();
            for i in missing {
                let s = self.clone();
                set.spawn(async move { s.conn(i).await });
            }
            while let Some(r) = set.join_next().await {
                if let Ok(Some(c)) = r {
                    out.push(c);
                }
            }
        }
        if scope == Scope::Site {
            out.retain(|c| c.id.cluster == self.inner.me.cluster);
        }
        out
    }

    async fn conn(&self, i: usize) -> Option<Arc<Conn>> {
        let link = &self.inner.peers[i];
        let live = |link: &PeerLink| {
            lock(&link.conn)
                .as_ref()
                .filter(|c| c.alive.load(Ordering::Acquire))
                .cloned()
        };
        if let Some(c) = live(link) {
            return Some(c);
        }
        let _connecting = link.connecting.lock().await;
        if let Some(c) = live(link) {
            return Some(c);
        }
        let c = self.connect(link.addr).await.ok()?;
        *lock(&link.conn) = Some(c.clone());
        Some(c)
    }

    async fn connect(&self, addr: SocketAddr) -> Result<Arc<Conn>, DirError> {
        let (s, id) = tokio::time::timeout(self.inner.cfg.connect_timeout, async {
            let mut s = TcpStream::connect(addr).await?;
            s.set_nodelay(true)?;
            let id = handshake_connect(&mut s, &self.inner.cfg.cluster_key, self.inner.me).await?;
            Ok::<_, DirError>((s, id))
        })
        .await
        .map_err(|_| DirError::Timeout(format!("connecting to peer {addr}")))??;
        let (writer, r) = PeerWriter::start(s)?;
        let conn = Arc::new(Conn {
            id,
            w: writer,
            pending: Mutex::new(HashMap::new()),
            alive: AtomicBool::new(true),
        });
        let c2 = conn.clone();
        let fanouts = self.inner.fanouts.clone();
        tokio::spawn(async move {
            let mut r = BufReader::new(r);
            let mut buf = Vec::new();
            while let Ok(Some(())) = read_frame(&mut r, &mut buf).await {
                let Ok(p) = Packet::decode(&buf) else { break };
                let id = p.header.query_id;
                let waiter = lock(&c2.pending).remove(&id);
                if let Some(w) = waiter {
                    let _ = w.send(p);
                } else {
                    let mut table = lock(&fanouts);
                    match table.get(&id) {
                        Some(Waiter::Task(tx)) => {
                            let _ = tx.send((c2.clone(), id, p));
                        }
                        Some(Waiter::Thread(tx)) => {
                            let _ = tx.send(p);
                        }
                        Some(Waiter::Loop(_)) if p.header.status == 0 => {
                            // The first positive reply wins: taken out of the table, so the
                            // loop's deadline finds nothing left to time out.
                            let w = table.remove(&id);
                            drop(table);
                            if let Some(Waiter::Loop(w)) = w {
                                w.deliver(p);
                            }
                        }
                        Some(Waiter::Loop(_)) | None => {}
                    }
                }
            }
            c2.alive.store(false, Ordering::Release);
            c2.w.close();
            lock(&c2.pending).clear();
        });
        Ok(conn)
    }
}

/// Writes queued frames; frames queued while a write is in progress go out together.
async fn write_loop(w: tokio::net::tcp::OwnedWriteHalf, mut rx: mpsc::UnboundedReceiver<Frame>) {
    let mut w = BufWriter::new(w);
    while let Some(f) = rx.recv().await {
        if w.write_all(&f).await.is_err() {
            return;
        }
        while let Ok(f) = rx.try_recv() {
            if w.write_all(&f).await.is_err() {
                return;
            }
        }
        if w.flush().await.is_err() {
            return;
        }
    }
}

fn registered_packet(h: &Header, r: Registered) -> Packet {
    let mut out = reply(h);
    out.target = r.gid;
    if r.created {
        out.flags |= FLAG_CREATED;
    }
    Packet::new(out, AttrList::new())
}

fn take_acl(attrs: &mut AttrList) -> Result<Acl, DirError> {
    match attrs.remove(ACL_ATTR) {
        None => Ok(Acl::Public),
        Some(a) => match a.bytes() {
            Some(b) => Acl::decode(b),
            None => Err(DirError::BadAttrs(format!(
                "{ACL_ATTR} must be a full value"
            ))),
        },
    }
}

fn bind_unix(path: &Path) -> Result<UnixListener, DirError> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if m.file_type().is_socket() {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(DirError::Io(format!(
                    "{} is in use by a running server; stop it or choose another path",
                    path.display()
                )));
            }
            std::fs::remove_file(path)?;
        } else {
            return Err(DirError::Io(format!(
                "{} exists and is not a socket; refusing to replace it",
                path.display()
            )));
        }
    }
    let l = UnixListener::bind(path)
        .map_err(|e| DirError::Io(format!("cannot bind {}: {e}", path.display())))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    Ok(l)
}

/// Runs a server until the process ends: builds a multi-threaded tokio runtime, binds the
/// Unix socket and the TCP address given, calls `on_ready` with the bound TCP address, then
/// serves forever. For programs without their own runtime (e.g. `mutirao dir serve`).
pub fn run_blocking(
    cfg: ServerConfig,
    unix: Option<PathBuf>,
    tcp: Option<SocketAddr>,
    on_ready: impl FnOnce(Option<SocketAddr>),
) -> Result<(), DirError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let server = DirServer::new(cfg)?;
        if tcp.is_some() {
            // Before binding: without a key no TCP listener opens, not even briefly.
            server.check_listen_key()?;
        }
        let listener = match tcp {
            Some(a) => Some(
                TcpListener::bind(a)
                    .await
                    .map_err(|e| DirError::Io(format!("cannot listen on {a}: {e}")))?,
            ),
            None => None,
        };
        let bound = match &listener {
            Some(l) => Some(l.local_addr()?),
            None => None,
        };
        let h = server.spawn(unix, listener)?;
        on_ready(bound);
        let res = match (h.unix, h.tcp) {
            (Some(u), Some(t)) => tokio::select! { r = u => r, r = t => r },
            (Some(u), None) => u.await,
            (None, Some(t)) => t.await,
            (None, None) => {
                return Err(DirError::BadConfig(
                    "nothing to serve: give a Unix socket path or a TCP address".into(),
                ))
            }
        };
        h.maintenance.abort();
        res.map_err(|e| DirError::Io(format!("server task failed: {e}")))?
    })
}

/// Writes one packet to an async stream (helper for embedders speaking the protocol).
pub async fn send_packet<W: tokio::io::AsyncWrite + Unpin>(
    w: &mut W,
    p: &Packet,
) -> Result<(), DirError> {
    write_frame(w, p).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Client;

    fn served(
        mode: LocalMode,
    ) -> (
        tokio::runtime::Runtime,
        DirServer,
        ServerHandles,
        tempfile::TempDir,
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let s = DirServer::new(ServerConfig::default()).unwrap();
        s.set_local_mode(mode);
        let h = {
            let _g = rt.enter();
            s.spawn(Some(dir.path().join("d.sock")), None).unwrap()
        };
        (rt, s, h, dir)
    }

    #[test]
    fn every_local_mode_answers_the_same() {
        for mode in [LocalMode::EventLoop, LocalMode::Threads, LocalMode::Tasks] {
            let (_rt, _s, h, dir) = served(mode);
            let mut c = Client::connect(dir.path().join("d.sock")).unwrap();
            let a = AttrList::from_pairs([("k", "v"), ("n", "1")]).unwrap();
            let g = c.register(Gid::NONE, &a, &Acl::Public, false).unwrap().gid;
            let q = AttrList::from_pairs([("k", "v")]).unwrap();
            for _ in 0..3 {
                assert_eq!(c.query(None, &q, Scope::Grid).unwrap().0, g);
                assert_eq!(
                    c.query(Some(g), &AttrList::new(), Scope::Local).unwrap(),
                    (g, a.clone())
                );
            }
            // pipelined replies come back in order
            let qs: Vec<_> = (0..50).map(|_| (Some(g), AttrList::new())).collect();
            let rs = c.query_pipelined(&qs, Scope::Local).unwrap();
            assert!(rs.into_iter().all(|r| r.unwrap().0 == g));
            // a multi-answer query goes through the runtime
            assert_eq!(c.query_iter(&q, Scope::Local).unwrap().count(), 1);
            h.abort();
        }
    }

    /// Writes `frames` requests on a raw connection, as one buffer.
    fn raw_requests(s: &std::os::unix::net::UnixStream, ps: &[Packet]) {
        use std::io::Write;
        let mut out = Vec::new();
        for p in ps {
            frame_into(p, &mut out);
        }
        (&*s).write_all(&out).unwrap();
    }

    fn raw_query(id: u64, kind: Kind, target: Gid, q: &AttrList) -> Packet {
        let mut h = Header::new(kind);
        h.query_id = id;
        h.target = target;
        h.scope = Scope::Local.to_u8();
        Packet::new(h, q.clone())
    }

    #[test]
    fn pipelined_replies_keep_their_order_when_one_goes_through_the_runtime() {
        for mode in [LocalMode::EventLoop, LocalMode::Threads, LocalMode::Tasks] {
            let (_rt, _s, h, dir) = served(mode);
            let mut c = Client::connect(dir.path().join("d.sock")).unwrap();
            let a = AttrList::from_pairs([("k", "v")]).unwrap();
            let g = c.register(Gid::NONE, &a, &Acl::Public, false).unwrap().gid;
            let raw = std::os::unix::net::UnixStream::connect(dir.path().join("d.sock")).unwrap();
            let none = AttrList::new();
            // fast, through the runtime (a multi-answer query), fast, fast
            raw_requests(
                &raw,
                &[
                    raw_query(11, Kind::Query, g, &none),
                    raw_query(12, Kind::QueryStart, Gid::NONE, &a),
                    raw_query(13, Kind::Query, g, &none),
                    raw_query(14, Kind::Query, Gid::NONE, &a),
                ],
            );
            let mut r = FrameReader::new(Duration::ZERO);
            let mut got = vec![];
            for _ in 0..4 {
                let f = r.next_frame(&raw).unwrap().expect("a reply");
                got.push(Packet::decode(f).unwrap());
            }
            assert!(got
                .iter()
                .all(|p| p.header.status == 0 && p.header.target == g));
            assert_eq!(got[0].header.query_id, 11, "{mode:?}");
            assert_ne!(
                got[1].header.query_id, 11,
                "{mode:?}: the cursor's reply is second"
            );
            assert_eq!(got[2].header.query_id, 13, "{mode:?}");
            assert_eq!(got[3].header.query_id, 14, "{mode:?}");
            h.abort();
        }
    }

    #[test]
    fn a_client_that_does_not_read_its_replies_does_not_stall_the_others() {
        let (_rt, _s, h, dir) = served(LocalMode::EventLoop);
        let path = dir.path().join("d.sock");
        let mut c = Client::connect(&path).unwrap();
        let big = AttrList::from_attrs([Attr::full("blob", vec![b'x'; 4000])]).unwrap();
        let g = c
            .register(Gid::NONE, &big, &Acl::Public, false)
            .unwrap()
            .gid;
        // 2000 replies of 4 KiB: far more than the socket buffers and the loop's MAX_OUT.
        const N: u64 = 2000;
        let raw = std::os::unix::net::UnixStream::connect(&path).unwrap();
        // A stalled server fails the test instead of hanging it.
        raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let writer = {
            let w = raw.try_clone().unwrap();
            std::thread::spawn(move || {
                let reqs: Vec<_> = (1..=N)
                    .map(|i| raw_query(i, Kind::Query, g, &AttrList::new()))
                    .collect();
                raw_requests(&w, &reqs);
            })
        };
        // The replies pile up unread; another client is still served promptly.
        std::thread::sleep(Duration::from_millis(100));
        let t = Instant::now();
        for _ in 0..100 {
            assert_eq!(
                c.query(Some(g), &AttrList::new(), Scope::Local).unwrap().0,
                g
            );
        }
        assert!(t.elapsed() < Duration::from_secs(5), "other client stalled");
        // Reading the backlog gets every reply, in order.
        let mut r = FrameReader::new(Duration::ZERO);
        for i in 1..=N {
            let f = r.next_frame(&raw).unwrap().expect("a reply");
            let p = Packet::decode(f).unwrap();
            assert_eq!((p.header.query_id, p.header.status), (i, 0));
        }
        writer.join().unwrap();
        h.abort();
    }

    #[test]
    fn peer_writer_keeps_frames_in_order_when_the_socket_is_full() {
        use tokio::io::AsyncReadExt;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let client = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
            let (mut far, _) = l.accept().await.unwrap();
            let (pw, _r) = PeerWriter::start(client).unwrap();
            // 32 MiB nobody reads yet: more than the kernel's buffers take.
            const N: u32 = 4096;
            const LEN: usize = 8192;
            for i in 0..N {
                let mut f = vec![(i % 251) as u8; LEN];
                f[..4].copy_from_slice(&i.to_le_bytes());
                assert!(pw.send(&f));
            }
            assert!(
                !lock(&pw.st).pending.is_empty(),
                "the socket should have filled and bytes queued for the flusher"
            );
            let mut got = vec![0u8; N as usize * LEN];
            far.read_exact(&mut got).await.unwrap();
            for (i, f) in got.chunks(LEN).enumerate() {
                assert_eq!(&f[..4], &(i as u32).to_le_bytes(), "frame {i} out of order");
                assert!(
                    f[4..].iter().all(|&b| b == (i % 251) as u8),
                    "frame {i} corrupted"
                );
            }
            assert!(lock(&pw.st).pending.is_empty());
            pw.close();
        });
    }

    #[test]
    fn aborting_the_listener_closes_thread_and_loop_served_clients() {
        for mode in [LocalMode::EventLoop, LocalMode::Threads] {
            let (rt, _s, h, dir) = served(mode);
            let mut c = Client::connect(dir.path().join("d.sock")).unwrap();
            c.open_context().unwrap();
            h.abort();
            // The accept task is dropped on the runtime; give it a moment.
            let deadline = Instant::now() + Duration::from_secs(2);
            loop {
                match c.open_context() {
                    Err(DirError::Io(_)) => break,
                    Ok(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    other => panic!("{mode:?}: connection still served after abort: {other:?}"),
                }
            }
            drop(rt);
        }
    }
}
