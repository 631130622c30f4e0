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
//! The server side ([`PmiServer`]) is used by `mutirao run`; the client by [`crate::init`].

use crate::wire::constant_time_eq;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};

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

// ------------------------------------------------------------------ server

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
    state: Arc<(Mutex<FenceState>, Condvar)>,
}

impl PmiServer {
    /// Bind on `bind` (use port 0) and serve in background threads.
    pub fn start(
        bind: SocketAddr,
        size: u32,
        token: [u8; 32],
        fence_timeout: Duration,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(bind)?;
        let addr = listener.local_addr()?;
        let state = Arc::new((
            Mutex::new(FenceState {
                epoch: 0,
                arrived: vec![None; size as usize],
                result: None,
                hello: vec![false; size as usize],
                failed: None,
            }),
            Condvar::new(),
        ));
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
        let (m, cv) = &*self.state;
        if let Ok(mut s) = m.lock() {
            s.failed.get_or_insert_with(|| why.to_string());
        }
        cv.notify_all();
    }
}

fn serve_conn(
    conn: TcpStream,
    st: Arc<(Mutex<FenceState>, Condvar)>,
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
            let (m, _) = &*st;
            let Ok(mut s) = m.lock() else { return };
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
    st: &Arc<(Mutex<FenceState>, Condvar)>,
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
        let Msg::Fence { kvs } = msg else {
            let _ = write_msg(
                w,
                &Msg::Error {
                    msg: "expected a fence".into(),
                },
            );
            return;
        };
        let (m, cv) = &**st;
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
}
