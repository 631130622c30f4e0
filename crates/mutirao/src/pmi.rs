//! Bootstrap (the PMI role of MPICH-IG's IG-PM): ranks find each other through a key–value
//! exchange with a barrier, served by the launcher.
//!
//! Protocol: one TCP connection per rank to the launcher, newline-delimited JSON.
//! 1. rank → server `{"op":"hello","rank":R,"token":"<hex>"}`; the server checks the job token
//!    and the rank range and answers `{"op":"ok"}` or `{"op":"error","msg":…}`.
//! 2. rank → server `{"op":"fence","kvs":{…}}`; the server answers every rank at once, when all
//!    ranks have fenced, with `{"op":"fence_done","all":[kvs of rank 0, kvs of rank 1, …]}`.
//!    A fence that not every rank reaches before the server's timeout fails for everyone.
//!
//! 3. checkpoints (issue 12), on the same connection, which stays open for the whole job:
//!    `{"op":"ckpt_put","epoch":E,"len":N}` followed by N raw bytes (this rank's blob of epoch E;
//!    binary-safe, not limited by the 1 MiB line cap) → `ok` once the launcher's
//!    [`CheckpointSink`] has it durably; `{"op":"ckpt_get","epoch":E}` → `{"op":"blob","len":N}`
//!    and N raw bytes; `{"op":"ckpt_commit","epoch":E}` (rank 0 only, once every rank has put
//!    its blob of E) → `ok`; `{"op":"ckpt_last"}` → `{"op":"last","epoch":E|null}`. A server
//!    started without a sink answers each with an error saying so.
//! 4. `{"op":"report_failure","peer":P,"reason":…}` → `ok`: the rank's channel to rank P broke
//!    (digest 004 §15.4 step 1); the launcher reads these with [`PmiServer::take_failures`].
//!
//! The server side ([`PmiServer`]) is used by `mutirao run`; the client by [`crate::init`].

use crate::wire::constant_time_eq;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// One rank's key–value set.
pub type Kvs = BTreeMap<String, String>;

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Msg {
    Hello { rank: u32, token: String },
    Ok,
    Error { msg: String },
    Fence { kvs: Kvs },
    FenceDone { all: Vec<Kvs> },
    CkptPut { epoch: u64, len: u64 },
    CkptGet { epoch: u64 },
    Blob { len: u64 },
    CkptCommit { epoch: u64 },
    CkptLast,
    Last { epoch: Option<u64> },
    ReportFailure { peer: u32, reason: String },
}

/// Largest checkpoint blob the protocol carries (64 GiB): a larger length is a corrupt stream.
pub const MAX_BLOB: u64 = 64 << 30;

/// A rank told the launcher that its channel to another rank broke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureReport {
    /// The rank that saw the failure.
    pub rank: u32,
    /// The rank it can no longer reach.
    pub peer: u32,
    /// What went wrong, as the rank saw it.
    pub reason: String,
}

fn read_blob(r: &mut impl std::io::Read, len: u64) -> Result<Vec<u8>, String> {
    if len > MAX_BLOB {
        return Err(format!(
            "blob of {len} bytes announced, above the {MAX_BLOB}-byte maximum: the stream is corrupt"
        ));
    }
    let mut buf = Vec::with_capacity(len.min(1 << 24) as usize);
    let got = std::io::Read::take(r, len)
        .read_to_end(&mut buf)
        .map_err(|e| {
            format!(
                "reading a {len}-byte blob failed after {} bytes: {e}",
                buf.len()
            )
        })?;
    if got as u64 != len {
        return Err(format!("connection closed after {got} of {len} blob bytes"));
    }
    Ok(buf)
}

/// Where the launcher keeps the ranks' checkpoints (issue 12). The PMI server hands every
/// checkpoint operation a rank asks for to this sink; the launch library implements it over
/// the checkpoint stores of `mutirao-ckpt` (a local directory, replicas on agents, S3).
///
/// Contract:
/// * `put` returns only once `blob` is durable (written, fsynced, replicated as configured);
///   a second `put` of the same (epoch, rank) replaces the first;
/// * `get` returns exactly the bytes `put` stored, or an error naming what is missing or
///   corrupt (a checksum mismatch is an error, never data);
/// * `commit(epoch)` is called once every rank's blob of `epoch` is durable; it records the
///   epoch committed (atomically, durably) and may then delete every older epoch;
/// * `last_committed` is the newest committed epoch, `None` before the first commit.
///
/// Environment the launcher gives ranks for checkpointing (read by `JobEnv::from_env`):
/// `MUTIRAO_CKPT_INTERVAL` (seconds between waves; absent or 0 = no waves),
/// `MUTIRAO_CKPT_MODE` (`blocking`, the default, or `nonblocking`),
/// `MUTIRAO_RESTART_EPOCH` (the committed epoch to restore; absent = a fresh start),
/// `MUTIRAO_INCARNATION` (0 on the first start, +1 at every recovery).
pub trait CheckpointSink: Send + Sync {
    /// Store `rank`'s checkpoint of `epoch` durably.
    fn put(&self, epoch: u64, rank: u32, blob: &[u8]) -> Result<(), String>;
    /// Read back `rank`'s checkpoint of `epoch`.
    fn get(&self, epoch: u64, rank: u32) -> Result<Vec<u8>, String>;
    /// Every rank's checkpoint of `epoch` is durable: mark it committed, collect older ones.
    fn commit(&self, epoch: u64) -> Result<(), String>;
    /// The newest committed epoch.
    fn last_committed(&self) -> Result<Option<u64>, String>;
}

/// Longest line a PMI peer may send (a rank's KVS is small).
const MAX_LINE: usize = 1 << 20;

fn read_msg(r: &mut impl BufRead) -> Result<Msg, String> {
    let mut line = Vec::new();
    let n = std::io::Read::take(&mut *r, MAX_LINE as u64 + 1)
        .read_until(b'\n', &mut line)
        .map_err(|e| format!("read failed: {e}"))?;
    if n == 0 {
        return Err("connection closed".into());
    }
    if line.len() > MAX_LINE {
        return Err(format!("message longer than {MAX_LINE} bytes"));
    }
    serde_json::from_slice(&line).map_err(|e| format!("malformed message: {e}"))
}

fn write_msg(w: &mut impl Write, m: &Msg) -> std::io::Result<()> {
    let mut s = serde_json::to_vec(m).map_err(std::io::Error::other)?;
    s.push(b'\n');
    w.write_all(&s)?;
    w.flush()
}

/// Hex encoding of a token.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Decode a 64-hex-digit token.
pub fn unhex_token(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// A fresh random job token.
pub fn new_token() -> std::io::Result<[u8; 32]> {
    let mut t = [0u8; 32];
    getrandom::fill(&mut t).map_err(|e| std::io::Error::other(format!("no randomness: {e}")))?;
    Ok(t)
}

// ------------------------------------------------------------------ client

/// A rank's connection to the launcher's PMI server.
pub struct PmiClient {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl PmiClient {
    /// Connect and authenticate.
    pub fn connect(
        addr: &str,
        rank: u32,
        token: &[u8; 32],
        timeout: Duration,
    ) -> Result<Self, String> {
        let sa: SocketAddr = addr
            .parse()
            .map_err(|e| format!("MUTIRAO_PMI_ADDR {addr:?} is not host:port: {e}"))?;
        let s = TcpStream::connect_timeout(&sa, timeout)
            .map_err(|e| format!("cannot reach the launcher at {addr}: {e}"))?;
        s.set_nodelay(true).ok();
        let writer = s
            .try_clone()
            .map_err(|e| format!("cannot clone PMI socket: {e}"))?;
        let mut c = PmiClient {
            reader: BufReader::new(s),
            writer,
        };
        c.set_timeout(Some(timeout));
        write_msg(
            &mut c.writer,
            &Msg::Hello {
                rank,
                token: hex(token),
            },
        )
        .map_err(|e| format!("cannot talk to the launcher at {addr}: {e}"))?;
        match read_msg(&mut c.reader) {
            Ok(Msg::Ok) => Ok(c),
            Ok(Msg::Error { msg }) => Err(format!("the launcher refused this rank: {msg}")),
            Ok(other) => Err(format!("unexpected answer from the launcher: {other:?}")),
            Err(e) => Err(format!("launcher at {addr}: {e}")),
        }
    }

    fn set_timeout(&mut self, t: Option<Duration>) {
        self.writer.set_read_timeout(t).ok();
        self.writer.set_write_timeout(t).ok();
    }

    /// Publish `kvs` and wait until every rank has published; returns all ranks' sets in rank order.
    pub fn fence(&mut self, kvs: Kvs, timeout: Duration) -> Result<Vec<Kvs>, String> {
        self.set_timeout(Some(timeout));
        write_msg(&mut self.writer, &Msg::Fence { kvs })
            .map_err(|e| format!("fence: cannot talk to the launcher: {e}"))?;
        match read_msg(&mut self.reader) {
            Ok(Msg::FenceDone { all }) => Ok(all),
            Ok(Msg::Error { msg }) => Err(format!("fence failed: {msg}")),
            Ok(other) => Err(format!("fence: unexpected answer {other:?}")),
            Err(e) => Err(format!("fence: {e}")),
        }
    }
}

impl PmiClient {
    fn call(
        &mut self,
        m: &Msg,
        blob: Option<&[u8]>,
        timeout: Duration,
        what: &str,
    ) -> Result<Msg, String> {
        self.set_timeout(Some(timeout));
        let sent = write_msg(&mut self.writer, m).and_then(|_| match blob {
            Some(b) => {
                self.writer.write_all(b)?;
                self.writer.flush()
            }
            None => Ok(()),
        });
        sent.map_err(|e| format!("{what}: cannot talk to the launcher: {e}"))?;
        match read_msg(&mut self.reader) {
            Ok(Msg::Error { msg }) => Err(format!("{what}: the launcher answered: {msg}")),
            Ok(m) => Ok(m),
            Err(e) => Err(format!("{what}: {e}")),
        }
    }

    /// Store this rank's checkpoint of `epoch`; returns once the launcher has it durably.
    pub fn ckpt_put(&mut self, epoch: u64, blob: &[u8], timeout: Duration) -> Result<(), String> {
        let what = format!("storing the checkpoint of epoch {epoch}");
        let m = Msg::CkptPut {
            epoch,
            len: blob.len() as u64,
        };
        match self.call(&m, Some(blob), timeout, &what)? {
            Msg::Ok => Ok(()),
            other => Err(format!("{what}: unexpected answer {other:?}")),
        }
    }

    /// Fetch this rank's checkpoint of `epoch`.
    pub fn ckpt_get(&mut self, epoch: u64, timeout: Duration) -> Result<Vec<u8>, String> {
        let what = format!("fetching the checkpoint of epoch {epoch}");
        match self.call(&Msg::CkptGet { epoch }, None, timeout, &what)? {
            Msg::Blob { len } => {
                read_blob(&mut self.reader, len).map_err(|e| format!("{what}: {e}"))
            }
            other => Err(format!("{what}: unexpected answer {other:?}")),
        }
    }

    /// Rank 0: every rank's checkpoint of `epoch` is durable, commit it.
    pub fn ckpt_commit(&mut self, epoch: u64, timeout: Duration) -> Result<(), String> {
        let what = format!("committing epoch {epoch}");
        match self.call(&Msg::CkptCommit { epoch }, None, timeout, &what)? {
            Msg::Ok => Ok(()),
            other => Err(format!("{what}: unexpected answer {other:?}")),
        }
    }

    /// The newest committed epoch.
    pub fn ckpt_last(&mut self, timeout: Duration) -> Result<Option<u64>, String> {
        let what = "asking for the last committed checkpoint";
        match self.call(&Msg::CkptLast, None, timeout, what)? {
            Msg::Last { epoch } => Ok(epoch),
            other => Err(format!("{what}: unexpected answer {other:?}")),
        }
    }

    /// Tell the launcher that the channel to `peer` broke.
    pub fn report_failure(
        &mut self,
        peer: u32,
        reason: &str,
        timeout: Duration,
    ) -> Result<(), String> {
        let what = format!("reporting the failure of rank {peer}");
        let m = Msg::ReportFailure {
            peer,
            reason: reason.to_string(),
        };
        match self.call(&m, None, timeout, &what)? {
            Msg::Ok => Ok(()),
            other => Err(format!("{what}: unexpected answer {other:?}")),
        }
    }
}

// ------------------------------------------------------------------ server

struct Shared {
    fence: Mutex<FenceState>,
    cv: Condvar,
    sink: Option<Arc<dyn CheckpointSink>>,
    size: u32,
    /// Per epoch, which ranks have put their blob.
    puts: Mutex<BTreeMap<u64, Vec<bool>>>,
    failures: Mutex<Vec<FailureReport>>,
}

struct FenceState {
    epoch: u64,
    arrived: Vec<Option<Kvs>>,
    result: Option<(u64, Arc<Vec<Kvs>>)>,
    hello: Vec<bool>,
    failed: Option<String>,
}

/// The launcher's side: accepts `size` ranks and serves their fences.
pub struct PmiServer {
    addr: SocketAddr,
    state: Arc<Shared>,
}

impl PmiServer {
    /// Bind on `bind` (use port 0) and serve in background threads.
    pub fn start(
        bind: SocketAddr,
        size: u32,
        token: [u8; 32],
        fence_timeout: Duration,
    ) -> std::io::Result<Self> {
        Self::start_inner(bind, size, token, fence_timeout, None)
    }

    /// [`PmiServer::start`], and serve the ranks' checkpoint operations from `sink`.
    pub fn start_with_checkpoints(
        bind: SocketAddr,
        size: u32,
        token: [u8; 32],
        fence_timeout: Duration,
        sink: Arc<dyn CheckpointSink>,
    ) -> std::io::Result<Self> {
        Self::start_inner(bind, size, token, fence_timeout, Some(sink))
    }

    fn start_inner(
        bind: SocketAddr,
        size: u32,
        token: [u8; 32],
        fence_timeout: Duration,
        sink: Option<Arc<dyn CheckpointSink>>,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(bind)?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Shared {
            fence: Mutex::new(FenceState {
                epoch: 0,
                arrived: vec![None; size as usize],
                result: None,
                hello: vec![false; size as usize],
                failed: None,
            }),
            cv: Condvar::new(),
            sink,
            size,
            puts: Mutex::new(BTreeMap::new()),
            failures: Mutex::new(Vec::new()),
        });
        let st = state.clone();
        std::thread::Builder::new()
            .name("pmi-accept".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    let Ok(conn) = conn else { continue };
                    let st = st.clone();
                    let _ = std::thread::Builder::new()
                        .name("pmi-conn".into())
                        .spawn(move || serve_conn(conn, st, size, token, fence_timeout));
                }
            })?;
        Ok(PmiServer { addr, state })
    }

    /// Where ranks reach this server.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Make every pending and later fence fail with `why` (a rank died before the fence completed).
    pub fn fail(&self, why: &str) {
        if let Ok(mut s) = self.state.fence.lock() {
            s.failed.get_or_insert_with(|| why.to_string());
        }
        self.state.cv.notify_all();
    }

    /// The channel failures ranks reported since the last call (oldest first).
    pub fn take_failures(&self) -> Vec<FailureReport> {
        match self.state.failures.lock() {
            Ok(mut f) => std::mem::take(&mut *f),
            Err(_) => Vec::new(),
        }
    }
}

fn serve_conn(
    conn: TcpStream,
    st: Arc<Shared>,
    size: u32,
    token: [u8; 32],
    fence_timeout: Duration,
) {
    conn.set_nodelay(true).ok();
    // A peer that says nothing is dropped: nothing is run for it anyway.
    conn.set_read_timeout(Some(Duration::from_secs(30))).ok();
    let Ok(mut w) = conn.try_clone() else { return };
    let mut r = BufReader::new(conn);
    let rank = match read_msg(&mut r) {
        Ok(Msg::Hello { rank, token: t }) => {
            let ok = unhex_token(&t).is_some_and(|t| constant_time_eq(&t, &token));
            if !ok {
                let _ = write_msg(
                    &mut w,
                    &Msg::Error {
                        msg: "wrong job token".into(),
                    },
                );
                return;
            }
            if rank >= size {
                let _ = write_msg(
                    &mut w,
                    &Msg::Error {
                        msg: format!("rank {rank} out of range for {size} ranks"),
                    },
                );
                return;
            }
            let Ok(mut s) = st.fence.lock() else { return };
            if s.hello[rank as usize] {
                drop(s);
                let _ = write_msg(
                    &mut w,
                    &Msg::Error {
                        msg: format!("rank {rank} is already connected"),
                    },
                );
                return;
            }
            s.hello[rank as usize] = true;
            drop(s);
            if write_msg(&mut w, &Msg::Ok).is_err() {
                return;
            }
            rank as usize
        }
        _ => return,
    };
    conn_loop(&mut r, &mut w, &st, rank, fence_timeout);
    // The rank closed its connection (it finished or died): allow nothing more for it.
}

fn conn_loop(
    r: &mut BufReader<TcpStream>,
    w: &mut TcpStream,
    st: &Arc<Shared>,
    rank: usize,
    fence_timeout: Duration,
) {
    // Between fences a rank may compute for a long time: no read timeout.
    r.get_ref().set_read_timeout(None).ok();
    loop {
        let msg = match read_msg(r) {
            Ok(m) => m,
            Err(_) => return,
        };
        let kvs = match msg {
            Msg::Fence { kvs } => kvs,
            Msg::CkptPut { epoch, len } => {
                let blob = match read_blob(r, len) {
                    Ok(b) => b,
                    Err(_) => return,
                };
                let reply = answer(ckpt_put(st, rank, epoch, &blob));
                if write_msg(w, &reply).is_err() {
                    return;
                }
                continue;
            }
            Msg::CkptGet { epoch } => {
                let got = with_sink(st).and_then(|s| s.get(epoch, rank as u32));
                let sent = match got {
                    Ok(b) => write_msg(
                        w,
                        &Msg::Blob {
                            len: b.len() as u64,
                        },
                    )
                    .and_then(|_| w.write_all(&b))
                    .and_then(|_| w.flush()),
                    Err(msg) => write_msg(w, &Msg::Error { msg }),
                };
                if sent.is_err() {
                    return;
                }
                continue;
            }
            Msg::CkptCommit { epoch } => {
                let reply = answer(ckpt_commit(st, rank, epoch));
                if write_msg(w, &reply).is_err() {
                    return;
                }
                continue;
            }
            Msg::CkptLast => {
                let reply = match with_sink(st).and_then(|s| s.last_committed()) {
                    Ok(epoch) => Msg::Last { epoch },
                    Err(msg) => Msg::Error { msg },
                };
                if write_msg(w, &reply).is_err() {
                    return;
                }
                continue;
            }
            Msg::ReportFailure { peer, reason } => {
                if let Ok(mut f) = st.failures.lock() {
                    f.push(FailureReport {
                        rank: rank as u32,
                        peer,
                        reason,
                    });
                }
                if write_msg(w, &Msg::Ok).is_err() {
                    return;
                }
                continue;
            }
            other => {
                let _ = write_msg(
                    w,
                    &Msg::Error {
                        msg: format!("unexpected request {other:?}"),
                    },
                );
                return;
            }
        };
        let (m, cv) = (&st.fence, &st.cv);
        let Ok(mut s) = m.lock() else { return };
        let my_epoch = s.epoch;
        s.arrived[rank] = Some(kvs);
        if s.arrived.iter().all(Option::is_some) {
            let all: Vec<Kvs> = s.arrived.iter_mut().filter_map(Option::take).collect();
            s.result = Some((my_epoch, Arc::new(all)));
            s.epoch += 1;
            cv.notify_all();
        }
        let deadline = Instant::now() + fence_timeout;
        let reply = loop {
            if let Some((e, all)) = &s.result {
                if *e == my_epoch {
                    break Msg::FenceDone {
                        all: all.as_ref().clone(),
                    };
                }
            }
            if let Some(why) = &s.failed {
                break Msg::Error { msg: why.clone() };
            }
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<usize> = s
                    .arrived
                    .iter()
                    .enumerate()
                    .filter(|(_, a)| a.is_none())
                    .map(|(i, _)| i)
                    .collect();
                let why = format!(
                    "timed out after {:?} waiting for ranks {missing:?} to reach the fence",
                    fence_timeout
                );
                s.failed = Some(why.clone());
                cv.notify_all();
                break Msg::Error { msg: why };
            }
            s = match cv.wait_timeout(s, deadline - now) {
                Ok((g, _)) => g,
                Err(_) => return,
            };
        };
        drop(s);
        if write_msg(w, &reply).is_err() {
            return;
        }
        if matches!(reply, Msg::Error { .. }) {
            return;
        }
    }
}

fn answer(r: Result<(), String>) -> Msg {
    match r {
        Ok(()) => Msg::Ok,
        Err(msg) => Msg::Error { msg },
    }
}

fn with_sink(st: &Shared) -> Result<&Arc<dyn CheckpointSink>, String> {
    st.sink.as_ref().ok_or_else(|| {
        "this launcher keeps no checkpoints (it was started without a checkpoint store): \
         run without MUTIRAO_CKPT_INTERVAL, or give the launcher a store"
            .to_string()
    })
}

fn ckpt_put(st: &Shared, rank: usize, epoch: u64, blob: &[u8]) -> Result<(), String> {
    with_sink(st)?.put(epoch, rank as u32, blob)?;
    let mut puts = st
        .puts
        .lock()
        .map_err(|_| "checkpoint bookkeeping poisoned".to_string())?;
    puts.entry(epoch)
        .or_insert_with(|| vec![false; st.size as usize])[rank] = true;
    Ok(())
}

fn ckpt_commit(st: &Shared, rank: usize, epoch: u64) -> Result<(), String> {
    let sink = with_sink(st)?;
    if rank != 0 {
        return Err(format!(
            "rank {rank} asked to commit epoch {epoch}; only rank 0 commits"
        ));
    }
    let mut puts = st
        .puts
        .lock()
        .map_err(|_| "checkpoint bookkeeping poisoned".to_string())?;
    let missing: Vec<usize> = match puts.get(&epoch) {
        Some(p) => p
            .iter()
            .enumerate()
            .filter(|(_, d)| !**d)
            .map(|(i, _)| i)
            .collect(),
        None => (0..st.size as usize).collect(),
    };
    if !missing.is_empty() {
        return Err(format!(
            "cannot commit epoch {epoch}: ranks {missing:?} have not stored their checkpoint of it"
        ));
    }
    sink.commit(epoch)?;
    puts.retain(|e, _| *e > epoch);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fence_returns_every_rank_kvs_in_rank_order() {
        let token = new_token().unwrap();
        let srv = PmiServer::start(
            "127.0.0.1:0".parse().unwrap(),
            3,
            token,
            Duration::from_secs(10),
        )
        .unwrap();
        let addr = srv.addr().to_string();
        let hs: Vec<_> = (0..3u32)
            .map(|r| {
                let addr = addr.clone();
                std::thread::spawn(move || {
                    // Random arrival order.
                    std::thread::sleep(Duration::from_millis(((r * 7) % 3) as u64 * 20));
                    let mut c =
                        PmiClient::connect(&addr, r, &token, Duration::from_secs(5)).unwrap();
                    let mut kvs = Kvs::new();
                    kvs.insert("addr".into(), format!("host{r}"));
                    let a = c.fence(kvs, Duration::from_secs(5)).unwrap();
                    let b = c.fence(Kvs::new(), Duration::from_secs(5)).unwrap();
                    (a, b)
                })
            })
            .collect();
        for h in hs {
            let (a, b) = h.join().unwrap();
            let names: Vec<_> = a.iter().map(|k| k["addr"].clone()).collect();
            assert_eq!(names, ["host0", "host1", "host2"]);
            assert_eq!(b.len(), 3);
        }
    }

    #[test]
    fn wrong_token_and_duplicate_rank_are_refused() {
        let token = new_token().unwrap();
        let srv = PmiServer::start(
            "127.0.0.1:0".parse().unwrap(),
            2,
            token,
            Duration::from_secs(10),
        )
        .unwrap();
        let addr = srv.addr().to_string();
        let e = PmiClient::connect(&addr, 0, &[1u8; 32], Duration::from_secs(5))
            .err()
            .unwrap();
        assert!(e.contains("wrong job token"), "{e}");
        let _c = PmiClient::connect(&addr, 0, &token, Duration::from_secs(5)).unwrap();
        let e = PmiClient::connect(&addr, 0, &token, Duration::from_secs(5))
            .err()
            .unwrap();
        assert!(e.contains("already connected"), "{e}");
        let e = PmiClient::connect(&addr, 5, &token, Duration::from_secs(5))
            .err()
            .unwrap();
        assert!(e.contains("out of range"), "{e}");
    }

    #[test]
    fn fence_times_out_naming_missing_ranks() {
        let token = new_token().unwrap();
        let srv = PmiServer::start(
            "127.0.0.1:0".parse().unwrap(),
            2,
            token,
            Duration::from_millis(300),
        )
        .unwrap();
        let mut c =
            PmiClient::connect(&srv.addr().to_string(), 0, &token, Duration::from_secs(5)).unwrap();
        let e = c.fence(Kvs::new(), Duration::from_secs(5)).unwrap_err();
        assert!(e.contains("[1]"), "{e}");
    }

    #[derive(Default)]
    struct MemSink {
        blobs: Mutex<BTreeMap<(u64, u32), Vec<u8>>>,
        last: Mutex<Option<u64>>,
    }

    impl CheckpointSink for MemSink {
        fn put(&self, epoch: u64, rank: u32, blob: &[u8]) -> Result<(), String> {
            self.blobs
                .lock()
                .unwrap()
                .insert((epoch, rank), blob.to_vec());
            Ok(())
        }
        fn get(&self, epoch: u64, rank: u32) -> Result<Vec<u8>, String> {
            self.blobs
                .lock()
                .unwrap()
                .get(&(epoch, rank))
                .cloned()
                .ok_or_else(|| format!("no checkpoint of rank {rank} at epoch {epoch}"))
        }
        fn commit(&self, epoch: u64) -> Result<(), String> {
            *self.last.lock().unwrap() = Some(epoch);
            Ok(())
        }
        fn last_committed(&self) -> Result<Option<u64>, String> {
            Ok(*self.last.lock().unwrap())
        }
    }

    #[test]
    fn checkpoint_blobs_round_trip_binary_and_commit_needs_every_rank() {
        let token = new_token().unwrap();
        let sink = Arc::new(MemSink::default());
        let srv = PmiServer::start_with_checkpoints(
            "127.0.0.1:0".parse().unwrap(),
            2,
            token,
            Duration::from_secs(10),
            sink.clone(),
        )
        .unwrap();
        let addr = srv.addr().to_string();
        let t = Duration::from_secs(10);
        let mut c0 = PmiClient::connect(&addr, 0, &token, t).unwrap();
        let mut c1 = PmiClient::connect(&addr, 1, &token, t).unwrap();
        // Larger than the 1 MiB line cap, full of newlines and zeros.
        let big: Vec<u8> = (0..(3 << 20)).map(|i| (i % 251) as u8).collect();
        assert_eq!(c0.ckpt_last(t).unwrap(), None);
        c0.ckpt_put(1, &big, t).unwrap();
        let e = c0.ckpt_commit(1, t).unwrap_err();
        assert!(e.contains("ranks [1]"), "{e}");
        c1.ckpt_put(1, b"\n{\"op\":\"ok\"}\n", t).unwrap();
        let e = c1.ckpt_commit(1, t).unwrap_err();
        assert!(e.contains("only rank 0"), "{e}");
        c0.ckpt_commit(1, t).unwrap();
        assert_eq!(c1.ckpt_last(t).unwrap(), Some(1));
        assert_eq!(c0.ckpt_get(1, t).unwrap(), big);
        assert_eq!(c1.ckpt_get(1, t).unwrap(), b"\n{\"op\":\"ok\"}\n");
        // Each rank reads its own blob only (the rank is the connection's, not a field).
        assert_eq!(sink.blobs.lock().unwrap()[&(1, 0)], big);
        let e = c1.ckpt_get(7, t).unwrap_err();
        assert!(e.contains("no checkpoint of rank 1 at epoch 7"), "{e}");
        // The connection still works for fences afterwards.
        let h = std::thread::spawn(move || c1.fence(Kvs::new(), t).map(|a| a.len()));
        assert_eq!(c0.fence(Kvs::new(), t).unwrap().len(), 2);
        assert_eq!(h.join().unwrap(), Ok(2));
    }

    #[test]
    fn without_a_sink_checkpoints_are_refused_and_failures_are_reported() {
        let token = new_token().unwrap();
        let srv = PmiServer::start(
            "127.0.0.1:0".parse().unwrap(),
            2,
            token,
            Duration::from_secs(10),
        )
        .unwrap();
        let t = Duration::from_secs(10);
        let mut c = PmiClient::connect(&srv.addr().to_string(), 1, &token, t).unwrap();
        let e = c.ckpt_put(1, b"x", t).unwrap_err();
        assert!(e.contains("keeps no checkpoints"), "{e}");
        assert!(srv.take_failures().is_empty());
        c.report_failure(0, "connection reset", t).unwrap();
        assert_eq!(
            srv.take_failures(),
            vec![FailureReport {
                rank: 1,
                peer: 0,
                reason: "connection reset".into()
            }]
        );
        assert!(srv.take_failures().is_empty());
    }
}
