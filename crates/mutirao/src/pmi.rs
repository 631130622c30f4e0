//! Bootstrap (the PMI role of MPICH-IG's IG-PM): ranks find each other through a key–value
//! exchange with a barrier, served by the launcher.
//!
//! Protocol: one TCP connection per rank to the launcher, newline-delimited JSON.
//! 1. Handshake, in the clear: server → rank `{"op":"challenge","nonce":N1}`; rank → server
//!    `{"op":"hello","rank":R,"nonce":N2,"mac":M}` with M = HMAC(job token; N1, N2, R); the
//!    server checks the proof and answers `{"op":"welcome","mac":M'}` with its own proof
//!    (HMAC under another label, N2 before N1), or `{"op":"error","msg":…}`. The job token never
//!    crosses the wire. Before the welcome the connection may send nothing else; the hello line
//!    must arrive whole within [`HELLO_TIMEOUT`] and [`MAX_HELLO`] bytes, and at most
//!    [`MAX_UNAUTH`] connections wait for theirs (a new one over that closes the oldest; see
//!    `pmi/gate.rs`). From then on every byte both ways is in [`crate::seal`] records under
//!    keys derived from the token and both nonces: a relay or a stranger on the path can
//!    neither read a rank's addresses and checkpoints nor forge, replay or reorder a message.
//!    The first sealed message is the server's `{"op":"ok"}` or `{"op":"error","msg":…}`
//!    (rank out of range, already connected). Sealed lines may be up to 1 MiB.
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
//!    started without a sink answers each with an error saying so. Spawned ranks in the waves
//!    (issue 13) put and get their own blobs; a parent's `ckpt_put` names its children in the
//!    wave (`"children":[…]`) and a commit needs their blobs too (and their declared children's).
//! 4. `{"op":"report_failure","peer":P,"reason":…}` → `ok`: the rank's channel to rank P broke
//!    (digest 004 §15.4 step 1); the launcher reads these with [`PmiServer::take_failures`].
//!    `{"op":"lost"}` → `{"op":"lost_ranks","ranks":[…]}`: the ranks the launcher has declared
//!    lost ([`PmiServer::peers_lost`]: their host went silent under `--continue-on-failure`);
//!    a waiting rank asks every `MUTIRAO_LOST_POLL_MS` and fails its operations on them.
//!
//! 5. spawn (issue 13; docs/spawn.md): a rank asks for more ranks with
//!    `{"op":"spawn","program":P,"args":[…],"n":N,"hosts":[…],"timeout_ms":T,"job_id":J}`;
//!    the server gives the new ranks world ranks above every rank so far, asks its
//!    [`Spawner`] to start them and answers `{"op":"spawned","group":G,"ranks":[…],"hosts":[…]}`
//!    (or an error: no spawner, the program could not start…). The new ranks connect with
//!    their world rank in `hello` (accepted only for a group the server started and only once),
//!    and the parent and its children meet in group fences
//!    `{"op":"group_fence","group":G,"kvs":{…}}` → `fence_done` with the kvs in group order
//!    (parent first). A group fence that a member does not reach within T fails for all of
//!    them; the server then forgets the group and tells the spawner to abort it. The parent
//!    may give up on its group at any time with `{"op":"spawn_cancel","group":G,"why":…}` →
//!    `ok` (same effect). A restart re-creates a checkpointed group with `spawn` and
//!    `"restore":{"group":G,"ranks":[…]}`: the same group id and world ranks, which must be free.
//!
//! The server side ([`PmiServer`]) is used by `mutirao run`; the client by [`crate::init`].

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// One rank's key–value set.
pub type Kvs = BTreeMap<String, String>;

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Msg {
    /// Server → rank, first thing on every connection: the server's nonce.
    Challenge {
        nonce: String,
    },
    /// Rank → server: its rank, its nonce and its proof of the job token ([`hello_mac`]).
    Hello {
        rank: u32,
        nonce: String,
        mac: String,
    },
    /// Server → rank, in the clear: the server's proof of the job token ([`welcome_mac`]);
    /// everything after it is sealed.
    Welcome {
        mac: String,
    },
    Ok,
    Error {
        msg: String,
    },
    Fence {
        kvs: Kvs,
    },
    FenceDone {
        all: Vec<Kvs>,
    },
    CkptPut {
        epoch: u64,
        len: u64,
        /// The ranks this rank spawned that are members of the wave (issue 13): the server
        /// requires their blobs too before it commits the epoch.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        children: Vec<u32>,
    },
    CkptGet {
        epoch: u64,
    },
    Blob {
        len: u64,
    },
    CkptCommit {
        epoch: u64,
    },
    CkptLast,
    Last {
        epoch: Option<u64>,
    },
    ReportFailure {
        peer: u32,
        reason: String,
    },
    Spawn {
        program: PathBuf,
        args: Vec<String>,
        n: u32,
        hosts: Vec<String>,
        timeout_ms: u64,
        job_id: String,
        /// A restart re-creating a checkpointed spawn group (issue 13): its group id and its
        /// children's world ranks, as they were.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        restore: Option<Respawn>,
    },
    Spawned {
        group: u64,
        ranks: Vec<u32>,
        hosts: Vec<String>,
    },
    GroupFence {
        group: u64,
        kvs: Kvs,
    },
    SpawnCancel {
        group: u64,
        why: String,
    },
    /// Rank → server: which ranks has the launcher declared lost (their host gone silent)?
    Lost,
    /// Server → rank: every rank declared lost so far ([`PmiServer::peers_lost`]).
    LostRanks {
        ranks: Vec<u32>,
    },
}

/// A spawn group as a checkpoint saved it, started again on a restart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Respawn {
    group: u64,
    ranks: Vec<u32>,
}

/// Most ranks one spawn may ask for.
pub const MAX_SPAWN: u32 = 4096;

/// World ranks given to spawned ranks stay below this (a process keeps a small record per
/// world rank up to the largest it knows).
pub const MAX_WORLD_RANK: u32 = 1 << 24;

/// Longest spawn timeout accepted (a day).
pub const MAX_SPAWN_TIMEOUT: Duration = Duration::from_secs(86_400);

/// The key under which a rank publishes its start-up phases in the connection barrier (the
/// job's second fence): `register,exchange,connect` in whole microseconds. The launcher's
/// server keeps them ([`PmiServer::init_phases`]); ranks ignore the key.
pub const INIT_KEY: &str = "init_us";

/// How long three phases of one rank's start-up took (monotonic clock), as it reports them to
/// the launcher through the connection barrier (see [`crate::InitTimings`] for all of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InitPhases {
    /// Connecting to the bootstrap server and registering (hello with the job token).
    pub register: Duration,
    /// The address-exchange fence: waits until every rank has started and published.
    pub exchange: Duration,
    /// Building the mesh (rings, TCP connections, authenticated hellos).
    pub connect: Duration,
}

impl InitPhases {
    /// `register,exchange,connect` in microseconds (the [`INIT_KEY`] value).
    pub fn encode(&self) -> String {
        format!(
            "{},{},{}",
            self.register.as_micros(),
            self.exchange.as_micros(),
            self.connect.as_micros()
        )
    }

    /// The inverse of [`InitPhases::encode`]; `None` unless it is three non-negative integers.
    pub fn parse(s: &str) -> Option<InitPhases> {
        let mut it = s.split(',').map(|x| x.trim().parse::<u64>().ok());
        let (Some(Some(r)), Some(Some(e)), Some(Some(c)), None) =
            (it.next(), it.next(), it.next(), it.next())
        else {
            return None;
        };
        Some(InitPhases {
            register: Duration::from_micros(r),
            exchange: Duration::from_micros(e),
            connect: Duration::from_micros(c),
        })
    }

    /// Each phase's maximum of `self` and `o`.
    pub fn max(&self, o: &InitPhases) -> InitPhases {
        InitPhases {
            register: self.register.max(o.register),
            exchange: self.exchange.max(o.exchange),
            connect: self.connect.max(o.connect),
        }
    }
}

/// What the launcher is asked to start for one spawn (issue 13). Built by the PMI server;
/// handed to the launcher's [`Spawner`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnRequest {
    /// The spawn group: the parent and these children.
    pub group: u64,
    /// World rank of the rank that asked.
    pub parent: u32,
    /// The program to run (the parent resolved "this program" to its own executable).
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Placement hints, one host per child or fewer (cycled); empty: the launcher decides.
    pub hosts: Vec<String>,
    /// The children's world ranks, in group order (child `i` is group rank `i + 1`).
    pub ranks: Vec<u32>,
    /// Per child (same order as `ranks`), the environment it must be started with: the PMI
    /// address, job token and id, its world rank, the spawn group and its members. The
    /// launcher adds its own per-host settings (`MUTIRAO_BIND`, `MUTIRAO_LOCAL_RANKS`, …).
    pub env: Vec<Vec<(String, String)>>,
}

/// One started child, as the launcher reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnedProc {
    /// Its world rank (one of [`SpawnRequest::ranks`]).
    pub rank: u32,
    /// Where it runs (a hostfile name or address), for the per-host latency report.
    pub host: String,
}

/// The launcher's side of spawn: start processes for a [`SpawnRequest`] and supervise them
/// like the job's other ranks (output forwarded, reaped, killed with the job).
///
/// Contract:
/// * `spawn` returns once every child is started (not once it has connected), with one
///   [`SpawnedProc`] per requested rank; on any error it stops the children it already started
///   and returns a message saying what failed (missing program, unknown or refusing host,
///   no free slot);
/// * `abort(group, why)` is called when a group fails after a successful `spawn` (a child did
///   not reach the group fence in time, a member ended early, the parent cancelled): stop every
///   child of that group still running. It may be called on the thread that calls
///   [`PmiServer::spawned_exited`], so do not hold a lock `abort` needs while calling that.
///   A spawned child's failure is not the job's failure: the job goes on;
/// * the launcher should call [`PmiServer::spawned_exited`] when a spawned process ends, so a
///   spawn whose child dies at start-up fails at once instead of at its timeout.
pub trait Spawner: Send + Sync {
    /// Start the children of `req`.
    fn spawn(&self, req: &SpawnRequest) -> Result<Vec<SpawnedProc>, String>;
    /// Stop what is left of a failed spawn group.
    fn abort(&self, group: u64, why: &str);
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

mod gate;
pub use gate::{HELLO_TIMEOUT, MAX_HELLO, MAX_UNAUTH};

/// Longest line an authenticated PMI peer may send (a rank's KVS is small); before the job
/// token is proved, [`MAX_HELLO`].
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

/// Labels of the rank's and the server's proofs, and the name of the bootstrap's session keys.
const HELLO_LABEL: &str = "mutirao-bootstrap-hello-v2";
const WELCOME_LABEL: &str = "mutirao-bootstrap-welcome-v2";
const SESSION_CONTEXT: &str = "mutirao-bootstrap-session-v2";

/// A rank's proof that it holds the job token: an HMAC over the server's nonce, its own and
/// its rank (so a proof is good for one connection and one rank only).
fn hello_mac(token: &[u8; 32], server_nonce: &str, client_nonce: &str, rank: u32) -> String {
    crate::seal::mac_hex(
        token,
        HELLO_LABEL,
        &[
            server_nonce.as_bytes(),
            client_nonce.as_bytes(),
            rank.to_string().as_bytes(),
        ],
    )
}

/// The server's proof that it holds the job token (another label, the nonces the other way
/// round: a rank's own proof reflected back is not one).
fn welcome_mac(token: &[u8; 32], server_nonce: &str, client_nonce: &str, rank: u32) -> String {
    crate::seal::mac_hex(
        token,
        WELCOME_LABEL,
        &[
            client_nonce.as_bytes(),
            server_nonce.as_bytes(),
            rank.to_string().as_bytes(),
        ],
    )
}

fn session_keys(
    token: &[u8; 32],
    server_nonce: &str,
    client_nonce: &str,
    role: crate::seal::Role,
) -> crate::seal::SessionKeys {
    crate::seal::SessionKeys::derive(
        token,
        SESSION_CONTEXT,
        client_nonce.as_bytes(),
        server_nonce.as_bytes(),
        role,
    )
}

/// The sealed halves of a bootstrap connection.
type ConnReader = crate::seal::SealedReader<BufReader<TcpStream>>;
type ConnWriter = crate::seal::SealedWriter<TcpStream>;

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
    reader: ConnReader,
    writer: ConnWriter,
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
        s.set_read_timeout(Some(timeout)).ok();
        s.set_write_timeout(Some(timeout)).ok();
        let mut writer = s
            .try_clone()
            .map_err(|e| format!("cannot clone PMI socket: {e}"))?;
        let mut reader = BufReader::new(s);
        let talk = |e: String| format!("cannot talk to the launcher at {addr}: {e}");
        // 1. The server's challenge (or its refusal).
        let server_nonce = match read_msg(&mut reader) {
            Ok(Msg::Challenge { nonce }) => nonce,
            Ok(Msg::Error { msg }) => return Err(format!("the launcher refused this rank: {msg}")),
            Ok(other) => {
                return Err(format!(
                    "unexpected first message from the launcher: {other:?}"
                ))
            }
            Err(e) => return Err(format!("launcher at {addr}: {e}")),
        };
        // 2. Our proof over both nonces: the token itself never crosses the wire.
        let nonce = crate::seal::nonce_hex().map_err(|e| talk(e.to_string()))?;
        let mac = hello_mac(token, &server_nonce, &nonce, rank);
        write_msg(
            &mut writer,
            &Msg::Hello {
                rank,
                nonce: nonce.clone(),
                mac,
            },
        )
        .map_err(|e| talk(e.to_string()))?;
        // 3. The server's proof, then sealed records both ways.
        match read_msg(&mut reader) {
            Ok(Msg::Welcome { mac }) => {
                let want = welcome_mac(token, &server_nonce, &nonce, rank);
                if !crate::wire::constant_time_eq(want.as_bytes(), mac.as_bytes()) {
                    return Err(format!(
                        "the server at {addr} did not prove it holds this job's token: it is not \
                         this job's launcher (a stale MUTIRAO_PMI_ADDR, or someone else's port)"
                    ));
                }
            }
            Ok(Msg::Error { msg }) => return Err(format!("the launcher refused this rank: {msg}")),
            Ok(other) => return Err(format!("unexpected answer from the launcher: {other:?}")),
            Err(e) => return Err(format!("launcher at {addr}: {e}")),
        }
        let (sealer, opener) =
            session_keys(token, &server_nonce, &nonce, crate::seal::Role::Client).split();
        let mut c = PmiClient {
            reader: crate::seal::SealedReader::new(reader, opener),
            writer: crate::seal::SealedWriter::new(writer, sealer),
        };
        match read_msg(&mut c.reader) {
            Ok(Msg::Ok) => Ok(c),
            Ok(Msg::Error { msg }) => Err(format!("the launcher refused this rank: {msg}")),
            Ok(other) => Err(format!("unexpected answer from the launcher: {other:?}")),
            Err(e) => Err(format!("launcher at {addr}: {e}")),
        }
    }

    fn set_timeout(&mut self, t: Option<Duration>) {
        self.writer.get_ref().set_read_timeout(t).ok();
        self.writer.get_ref().set_write_timeout(t).ok();
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
        self.ckpt_put_with(epoch, blob, &[], timeout)
    }

    /// [`PmiClient::ckpt_put`] of a rank whose spawned ranks `children` are members of the
    /// wave: the launcher then commits `epoch` only once their checkpoints are stored too.
    pub fn ckpt_put_with(
        &mut self,
        epoch: u64,
        blob: &[u8],
        children: &[u32],
        timeout: Duration,
    ) -> Result<(), String> {
        let what = format!("storing the checkpoint of epoch {epoch}");
        let m = Msg::CkptPut {
            epoch,
            len: blob.len() as u64,
            children: children.to_vec(),
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

    /// The ranks the launcher has declared lost so far ([`PmiServer::peers_lost`]).
    pub fn lost_ranks(&mut self, timeout: Duration) -> Result<Vec<u32>, String> {
        let what = "asking the launcher for lost ranks";
        match self.call(&Msg::Lost, None, timeout, what)? {
            Msg::LostRanks { ranks } => Ok(ranks),
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

    /// Ask the launcher to start `n` ranks of `program` (issue 13). Returns the spawn group,
    /// the children's world ranks and the hosts they were started on, once the launcher has
    /// started them; they then meet this rank in [`PmiClient::group_fence`]s.
    #[allow(clippy::too_many_arguments)]
    pub fn spawn(
        &mut self,
        program: &std::path::Path,
        args: &[String],
        n: u32,
        hosts: &[String],
        timeout: Duration,
        job_id: &str,
    ) -> Result<(u64, Vec<u32>, Vec<String>), String> {
        self.spawn_inner(program, args, n, hosts, timeout, job_id, None)
    }

    /// A restart: start the children of checkpointed spawn group `group` again, with their
    /// world ranks `ranks` (each then restores its own checkpoint), placed by the launcher.
    /// Only before the job's first fence, so no new spawn has taken those ranks.
    pub fn respawn(
        &mut self,
        program: &std::path::Path,
        args: &[String],
        group: u64,
        ranks: &[u32],
        timeout: Duration,
        job_id: &str,
    ) -> Result<(u64, Vec<u32>, Vec<String>), String> {
        let n = u32::try_from(ranks.len()).map_err(|_| "too many ranks".to_string())?;
        let r = Respawn {
            group,
            ranks: ranks.to_vec(),
        };
        let got = self.spawn_inner(program, args, n, &[], timeout, job_id, Some(r))?;
        if got.0 != group || got.1 != ranks {
            return Err(format!(
                "the launcher re-created spawn group {group} as group {} with ranks {:?} instead of {ranks:?}",
                got.0, got.1
            ));
        }
        Ok(got)
    }

    #[allow(clippy::too_many_arguments)]
    fn spawn_inner(
        &mut self,
        program: &std::path::Path,
        args: &[String],
        n: u32,
        hosts: &[String],
        timeout: Duration,
        job_id: &str,
        restore: Option<Respawn>,
    ) -> Result<(u64, Vec<u32>, Vec<String>), String> {
        let what = format!("spawning {n} ranks of {}", program.display());
        let m = Msg::Spawn {
            program: program.to_path_buf(),
            args: args.to_vec(),
            n,
            hosts: hosts.to_vec(),
            timeout_ms: timeout.as_millis().min(u64::MAX as u128) as u64,
            job_id: job_id.to_string(),
            restore,
        };
        match self.call(&m, None, timeout + Duration::from_secs(2), &what)? {
            Msg::Spawned {
                group,
                ranks,
                hosts,
            } if ranks.len() == n as usize && hosts.len() == n as usize => {
                Ok((group, ranks, hosts))
            }
            other => Err(format!("{what}: unexpected answer {other:?}")),
        }
    }

    /// Give up on spawn group `group` (its parent only): the server forgets it, fails its
    /// members' fences and has the spawner stop its children.
    pub fn spawn_cancel(&mut self, group: u64, why: &str, timeout: Duration) -> Result<(), String> {
        let what = format!("cancelling spawn group {group}");
        let m = Msg::SpawnCancel {
            group,
            why: why.to_string(),
        };
        match self.call(&m, None, timeout, &what)? {
            Msg::Ok => Ok(()),
            other => Err(format!("{what}: unexpected answer {other:?}")),
        }
    }

    /// Publish `kvs` to the members of spawn group `group` and wait for theirs (in group
    /// order: the parent first). The server gives up after the spawn's timeout; `timeout`
    /// here bounds the wait for its answer.
    pub fn group_fence(
        &mut self,
        group: u64,
        kvs: Kvs,
        timeout: Duration,
    ) -> Result<Vec<Kvs>, String> {
        let what = format!("fence of spawn group {group}");
        match self.call(&Msg::GroupFence { group, kvs }, None, timeout, &what)? {
            Msg::FenceDone { all } => Ok(all),
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
    /// Per epoch, which ranks have put their blob, with the spawned ranks each declared as
    /// members of the wave. Its lock is held through a commit.
    puts: Mutex<BTreeMap<u64, BTreeMap<u32, Vec<u32>>>>,
    /// Spawned ranks that were members of each committed epoch (issue 13), newest last.
    committed_spawned: Mutex<BTreeMap<u64, Vec<SpawnedMember>>>,
    /// Set by [`PmiServer::fence_checkpoints`]: this incarnation commits nothing more.
    ckpt_fenced: std::sync::atomic::AtomicBool,
    failures: Mutex<Vec<FailureReport>>,
    /// Ranks the launcher declared lost (their host went away or silent): ranks ask for them
    /// while they wait, and fail their operations on them.
    lost: Mutex<std::collections::BTreeSet<u32>>,
    spawner: Option<Arc<dyn Spawner>>,
    spawn: Mutex<SpawnState>,
    scv: Condvar,
    token: [u8; 32],
    addr: SocketAddr,
    /// Per job rank, the start-up phases it reported ([`INIT_KEY`]).
    init: Mutex<Vec<Option<InitPhases>>>,
    /// The most bytes read from one connection before its hello was checked.
    #[cfg(test)]
    preauth_max: std::sync::atomic::AtomicUsize,
}

#[cfg(test)]
impl Shared {
    fn note_preauth(&self, n: usize) {
        self.preauth_max
            .fetch_max(n, std::sync::atomic::Ordering::Relaxed);
    }
}

struct FenceState {
    epoch: u64,
    arrived: Vec<Option<Kvs>>,
    result: Option<(u64, Arc<Vec<Kvs>>)>,
    hello: Vec<bool>,
    failed: Option<String>,
    /// The ranks a fence gave up waiting for (set by the first fence timeout).
    missing: Option<Vec<usize>>,
}

/// A spawned rank that took part in a committed checkpoint epoch: what restarting it would
/// need (issue 13; see [`PmiServer::spawned_members`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnedMember {
    /// Its world rank.
    pub rank: u32,
    /// The rank that spawned it.
    pub parent: u32,
    /// Its spawn group.
    pub group: u64,
    /// The program and arguments its spawn asked for.
    pub program: PathBuf,
    pub args: Vec<String>,
}

/// Spawn groups in flight.
struct SpawnState {
    /// The next world rank to give a spawned rank.
    next_rank: u32,
    next_group: u64,
    groups: BTreeMap<u64, Group>,
    /// Why a group was forgotten (so its late members get the reason).
    gone: BTreeMap<u64, String>,
    /// Every spawned rank of a spawn that completed: (parent, group, program, args).
    joined: BTreeMap<u32, SpawnedMember>,
}

/// One spawn group: the parent (member 0) and its children.
struct Group {
    members: Vec<u32>,
    program: PathBuf,
    args: Vec<String>,
    hello: Vec<bool>,
    arrived: Vec<Option<Kvs>>,
    epoch: u64,
    result: Option<(u64, Arc<Vec<Kvs>>)>,
    /// Members that have taken the current result.
    taken: usize,
    timeout: Duration,
}

/// Group fences a spawn uses: the address exchange and the connection barrier. The group is
/// forgotten once every member has the result of the last one.
const GROUP_FENCES: u64 = 2;

/// The launcher's side: accepts `size` ranks and serves their fences.
pub struct PmiServer {
    addr: SocketAddr,
    state: Arc<Shared>,
}

/// Options of a [`PmiServer`] before it starts ([`PmiServer::builder`]).
pub struct PmiServerBuilder {
    bind: SocketAddr,
    size: u32,
    token: [u8; 32],
    fence_timeout: Duration,
    sink: Option<Arc<dyn CheckpointSink>>,
    spawner: Option<Arc<dyn Spawner>>,
}

impl PmiServerBuilder {
    /// Serve the ranks' checkpoint operations from `sink`.
    pub fn checkpoints(mut self, sink: Arc<dyn CheckpointSink>) -> Self {
        self.sink = Some(sink);
        self
    }

    /// Serve spawn requests by starting processes through `spawner`. Without one, a spawn is
    /// answered with an error saying this launcher cannot spawn.
    pub fn spawner(mut self, spawner: Arc<dyn Spawner>) -> Self {
        self.spawner = Some(spawner);
        self
    }

    /// Bind and serve in background threads.
    pub fn start(self) -> std::io::Result<PmiServer> {
        PmiServer::start_inner(self)
    }
}

impl PmiServer {
    /// Bind on `bind` (use port 0) and serve in background threads.
    pub fn start(
        bind: SocketAddr,
        size: u32,
        token: [u8; 32],
        fence_timeout: Duration,
    ) -> std::io::Result<Self> {
        Self::builder(bind, size, token, fence_timeout).start()
    }

    /// [`PmiServer::start`], and serve the ranks' checkpoint operations from `sink`.
    pub fn start_with_checkpoints(
        bind: SocketAddr,
        size: u32,
        token: [u8; 32],
        fence_timeout: Duration,
        sink: Arc<dyn CheckpointSink>,
    ) -> std::io::Result<Self> {
        Self::builder(bind, size, token, fence_timeout)
            .checkpoints(sink)
            .start()
    }

    /// A server to configure (checkpoints, spawn) before [`PmiServerBuilder::start`].
    pub fn builder(
        bind: SocketAddr,
        size: u32,
        token: [u8; 32],
        fence_timeout: Duration,
    ) -> PmiServerBuilder {
        PmiServerBuilder {
            bind,
            size,
            token,
            fence_timeout,
            sink: None,
            spawner: None,
        }
    }

    fn start_inner(b: PmiServerBuilder) -> std::io::Result<Self> {
        let PmiServerBuilder {
            bind,
            size,
            token,
            fence_timeout,
            sink,
            spawner,
        } = b;
        let listener = TcpListener::bind(bind)?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Shared {
            fence: Mutex::new(FenceState {
                epoch: 0,
                arrived: vec![None; size as usize],
                result: None,
                hello: vec![false; size as usize],
                failed: None,
                missing: None,
            }),
            cv: Condvar::new(),
            sink,
            size,
            puts: Mutex::new(BTreeMap::new()),
            committed_spawned: Mutex::new(BTreeMap::new()),
            ckpt_fenced: std::sync::atomic::AtomicBool::new(false),
            failures: Mutex::new(Vec::new()),
            lost: Mutex::new(std::collections::BTreeSet::new()),
            spawner,
            spawn: Mutex::new(SpawnState {
                next_rank: size,
                next_group: 1,
                groups: BTreeMap::new(),
                gone: BTreeMap::new(),
                joined: BTreeMap::new(),
            }),
            scv: Condvar::new(),
            token,
            addr,
            init: Mutex::new(vec![None; size as usize]),
            #[cfg(test)]
            preauth_max: std::sync::atomic::AtomicUsize::new(0),
        });
        let st = state.clone();
        std::thread::Builder::new()
            .name("pmi-accept".into())
            .spawn(move || {
                let st2 = st.clone();
                let served = gate::accept_loop(listener, st, move |conn, hello| {
                    // Authenticated: a thread of its own (each rank is admitted once).
                    let st = st2.clone();
                    let _ = std::thread::Builder::new()
                        .name("pmi-conn".into())
                        .spawn(move || serve_conn(conn, st, hello, fence_timeout));
                });
                if let Err(e) = served {
                    eprintln!("mutirao bootstrap: the server stopped accepting ranks: {e}");
                }
            })?;
        Ok(PmiServer { addr, state })
    }

    /// Where ranks reach this server.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// No more checkpoint commits from this incarnation: returns once a commit in progress has
    /// ended, and later ones are refused. A launcher about to restart a job calls it before it
    /// reads the last committed epoch, so no commit of the dying incarnation lands after that.
    pub fn fence_checkpoints(&self) {
        self.state
            .ckpt_fenced
            .store(true, std::sync::atomic::Ordering::SeqCst);
        // Wait for a commit holding the lock (a poisoned lock means no commit is running).
        drop(self.state.puts.lock());
    }

    /// Make every pending and later fence fail with `why` (a rank died before the fence completed).
    pub fn fail(&self, why: &str) {
        if let Ok(mut s) = self.state.fence.lock() {
            s.failed.get_or_insert_with(|| why.to_string());
        }
        self.state.cv.notify_all();
    }

    /// The ranks that never reached a fence of the job, once a fence timed out waiting for
    /// them (`None`: no fence timed out). The ranks that did reach it were answered with the
    /// timeout and exit with it: a launcher blames these ranks (and their hosts), not those.
    pub fn fence_missing(&self) -> Option<Vec<usize>> {
        self.state.fence.lock().ok().and_then(|s| s.missing.clone())
    }

    /// The launcher saw spawned rank `rank` end (`why`: how). If its spawn is still in
    /// progress, it fails now (the parent gets the reason instead of waiting out the timeout)
    /// and the spawner is told to abort the group; otherwise nothing happens.
    pub fn spawned_exited(&self, rank: u32, why: &str) {
        member_lost(&self.state, rank, why);
    }

    /// The spawned ranks that were members of committed epoch `epoch` (empty: only the job's
    /// own ranks; `None`: this server did not commit that epoch). A launcher restarting from an
    /// epoch with spawned members must start them again too, or refuse (issue 13).
    pub fn spawned_members(&self, epoch: u64) -> Option<Vec<SpawnedMember>> {
        self.state
            .committed_spawned
            .lock()
            .ok()
            .and_then(|c| c.get(&epoch).cloned())
    }

    /// Per job rank (in rank order), the start-up phases it reported in the connection
    /// barrier; `None` for a rank that has not reached it (or an older runtime's rank).
    pub fn init_phases(&self) -> Vec<Option<InitPhases>> {
        match self.state.init.lock() {
            Ok(v) => v.clone(),
            Err(_) => Vec::new(),
        }
    }

    /// The launcher takes `ranks` as lost (their host vanished: no exit will come, and their
    /// sockets may never close). Ranks that ask ([`PmiClient::lost_ranks`], which the runtime
    /// does while it waits, every `MUTIRAO_LOST_POLL_MS`) fail their operations on them with
    /// `PeerFailed` instead of waiting for a peer that will never answer.
    pub fn peers_lost(&self, ranks: &[u32]) {
        if let Ok(mut l) = self.state.lost.lock() {
            l.extend(ranks.iter().copied());
        }
    }

    /// The channel failures ranks reported since the last call (oldest first).
    pub fn take_failures(&self) -> Vec<FailureReport> {
        match self.state.failures.lock() {
            Ok(mut f) => std::mem::take(&mut *f),
            Err(_) => Vec::new(),
        }
    }
}

/// Serves a connection whose hello proved the job token (checked by [`gate::accept_loop`]):
/// sends the server's own proof, then seals the session and answers the hello inside it.
fn serve_conn(conn: TcpStream, st: Arc<Shared>, hello: gate::Hello, fence_timeout: Duration) {
    let size = st.size;
    let rank = hello.rank;
    if conn.set_nonblocking(false).is_err() {
        return;
    }
    conn.set_nodelay(true).ok();
    let Ok(mut w) = conn.try_clone() else { return };
    let welcome = Msg::Welcome {
        mac: welcome_mac(&st.token, &hello.server_nonce, &hello.client_nonce, rank),
    };
    if write_msg(&mut w, &welcome).is_err() {
        return;
    }
    let (sealer, opener) = session_keys(
        &st.token,
        &hello.server_nonce,
        &hello.client_nonce,
        crate::seal::Role::Server,
    )
    .split();
    let mut w = crate::seal::SealedWriter::new(w, sealer);
    let mut r = crate::seal::SealedReader::new(BufReader::new(conn), opener);
    if rank >= size {
        let admitted = admit_spawned(&st, rank);
        let reply = match &admitted {
            Ok(()) => Msg::Ok,
            Err(msg) => Msg::Error { msg: msg.clone() },
        };
        if write_msg(&mut w, &reply).is_err() || admitted.is_err() {
            return;
        }
        conn_loop(&mut r, &mut w, &st, rank as usize, fence_timeout);
        member_lost(&st, rank, "its connection to the launcher closed");
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
    let rank = rank as usize;
    conn_loop(&mut r, &mut w, &st, rank, fence_timeout);
    // The rank closed its connection (it finished or died): allow nothing more for it, and
    // fail the spawns it is the parent of that are still in progress.
    member_lost(&st, rank as u32, "its connection to the launcher closed");
}

fn conn_loop(
    r: &mut ConnReader,
    w: &mut ConnWriter,
    st: &Arc<Shared>,
    rank: usize,
    fence_timeout: Duration,
) {
    // Between fences a rank may compute for a long time: no read timeout.
    r.get_ref().get_ref().set_read_timeout(None).ok();
    loop {
        let msg = match read_msg(r) {
            Ok(m) => m,
            Err(_) => return,
        };
        let spawned = rank >= st.size as usize;
        let kvs = match msg {
            Msg::Spawn {
                program,
                args,
                n,
                hosts,
                timeout_ms,
                job_id,
                restore,
            } => {
                let reply = match do_spawn(
                    st,
                    rank as u32,
                    program,
                    args,
                    n,
                    hosts,
                    timeout_ms,
                    job_id,
                    restore,
                ) {
                    Ok(m) => m,
                    Err(msg) => Msg::Error { msg },
                };
                if write_msg(w, &reply).is_err() {
                    return;
                }
                continue;
            }
            Msg::SpawnCancel { group, why } => {
                let reply = answer(spawn_cancel(st, rank as u32, group, why));
                if write_msg(w, &reply).is_err() {
                    return;
                }
                continue;
            }
            Msg::GroupFence { group, kvs } => {
                let reply = group_fence(st, rank as u32, group, kvs);
                if write_msg(w, &reply).is_err() {
                    return;
                }
                continue;
            }
            Msg::Fence { .. } | Msg::CkptCommit { .. } if spawned => {
                // Spawned ranks are not in the job's fences; they store and restore their
                // checkpoints (waves include them) but do not commit (docs/spawn.md).
                let _ = write_msg(
                    w,
                    &Msg::Error {
                        msg: format!(
                            "rank {rank} was spawned: it takes part in its spawn group's fences \
                             and stores its checkpoints, but not in the job's fences or commits"
                        ),
                    },
                );
                return;
            }
            Msg::Fence { kvs } => {
                if let Some(p) = kvs.get(INIT_KEY).and_then(|v| InitPhases::parse(v)) {
                    if let Ok(mut v) = st.init.lock() {
                        if let Some(slot) = v.get_mut(rank) {
                            *slot = Some(p);
                        }
                    }
                }
                kvs
            }
            Msg::CkptPut {
                epoch,
                len,
                children,
            } => {
                let blob = match read_blob(r, len) {
                    Ok(b) => b,
                    Err(_) => return,
                };
                let reply = answer(ckpt_put(st, rank, epoch, &blob, children));
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
            Msg::Lost => {
                let ranks = st
                    .lost
                    .lock()
                    .map(|l| l.iter().copied().collect())
                    .unwrap_or_default();
                if write_msg(w, &Msg::LostRanks { ranks }).is_err() {
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
                s.missing.get_or_insert(missing);
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

/// A rank above the job's size said hello: accept it once, if a live spawn group has it.
fn admit_spawned(st: &Shared, rank: u32) -> Result<(), String> {
    let mut s = st
        .spawn
        .lock()
        .map_err(|_| "spawn bookkeeping poisoned".to_string())?;
    for g in s.groups.values_mut() {
        if let Some(i) = g.members.iter().skip(1).position(|m| *m == rank) {
            if g.hello[i + 1] {
                return Err(format!("rank {rank} is already connected"));
            }
            g.hello[i + 1] = true;
            return Ok(());
        }
    }
    Err(format!(
        "rank {rank} out of range for {} ranks and not part of any spawn in progress \
         (the spawn may have failed or timed out)",
        st.size
    ))
}

fn job_id_ok(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

#[allow(clippy::too_many_arguments)]
fn do_spawn(
    st: &Shared,
    parent: u32,
    program: PathBuf,
    args: Vec<String>,
    n: u32,
    hosts: Vec<String>,
    timeout_ms: u64,
    job_id: String,
    restore: Option<Respawn>,
) -> Result<Msg, String> {
    let spawner = st.spawner.clone().ok_or_else(|| {
        "this launcher cannot spawn ranks (its bootstrap server was started without a spawner); \
         run the job with `mutirao run`, or give PmiServer a Spawner"
            .to_string()
    })?;
    if n == 0 || n > MAX_SPAWN {
        return Err(format!("cannot spawn {n} ranks: ask for 1 to {MAX_SPAWN}"));
    }
    let timeout = Duration::from_millis(timeout_ms);
    if timeout.is_zero() || timeout > MAX_SPAWN_TIMEOUT {
        return Err(format!(
            "spawn timeout of {timeout_ms} ms: give one between 1 ms and {MAX_SPAWN_TIMEOUT:?}"
        ));
    }
    if !job_id_ok(&job_id) {
        return Err(format!("job id {job_id:?} must be letters, digits, - or _"));
    }
    if program.as_os_str().is_empty() {
        return Err("spawn of an empty program path".into());
    }
    let (group, ranks) = {
        let mut s = st
            .spawn
            .lock()
            .map_err(|_| "spawn bookkeeping poisoned".to_string())?;
        let (group, ranks) = match &restore {
            Some(r) => {
                // The same group id and world ranks as when the checkpoint was taken; they
                // must be free (a restart asks before the job's first fence, before any new
                // spawn could take them).
                let taken = |x: u32| {
                    s.joined.contains_key(&x) || s.groups.values().any(|g| g.members.contains(&x))
                };
                if r.ranks.len() != n as usize
                    || r.ranks
                        .iter()
                        .any(|&x| x < st.size || x >= MAX_WORLD_RANK || taken(x))
                    || s.groups.contains_key(&r.group)
                    || s.joined.values().any(|m| m.group == r.group)
                {
                    return Err(format!(
                        "cannot re-create spawn group {} with ranks {:?}: ranks out of range or \
                         already in use (re-create spawn groups before the job's first fence)",
                        r.group, r.ranks
                    ));
                }
                let top = r.ranks.iter().copied().max().unwrap_or(0);
                s.next_rank = s.next_rank.max(top + 1);
                s.next_group = s.next_group.max(r.group + 1);
                (r.group, r.ranks.clone())
            }
            None => {
                let first = s.next_rank;
                let end = first
                    .checked_add(n)
                    .filter(|e| *e <= MAX_WORLD_RANK)
                    .ok_or_else(|| {
                        format!(
                            "no world ranks left for this spawn: this job has given out {first} of {MAX_WORLD_RANK}"
                        )
                    })?;
                s.next_rank = end;
                let group = s.next_group;
                s.next_group += 1;
                ((group), (first..end).collect::<Vec<u32>>())
            }
        };
        let mut members = vec![parent];
        members.extend(&ranks);
        let k = members.len();
        s.groups.insert(
            group,
            Group {
                members,
                program: program.clone(),
                args: args.clone(),
                hello: (0..k).map(|i| i == 0).collect(),
                arrived: vec![None; k],
                epoch: 0,
                result: None,
                taken: 0,
                timeout,
            },
        );
        (group, ranks)
    };
    let members: Vec<String> = std::iter::once(parent)
        .chain(ranks.iter().copied())
        .map(|r| r.to_string())
        .collect();
    let members = members.join(",");
    let env = ranks
        .iter()
        .map(|r| {
            vec![
                ("MUTIRAO_RANK".to_string(), r.to_string()),
                ("MUTIRAO_SIZE".to_string(), st.size.to_string()),
                ("MUTIRAO_PMI_ADDR".to_string(), st.addr.to_string()),
                ("MUTIRAO_JOB_TOKEN".to_string(), hex(&st.token)),
                ("MUTIRAO_JOB_ID".to_string(), job_id.clone()),
                ("MUTIRAO_SPAWN_GROUP".to_string(), group.to_string()),
                ("MUTIRAO_SPAWN_MEMBERS".to_string(), members.clone()),
            ]
        })
        .collect();
    let req = SpawnRequest {
        group,
        parent,
        program,
        args,
        hosts,
        ranks: ranks.clone(),
        env,
    };
    let forget = |why: String| {
        if let Ok(mut s) = st.spawn.lock() {
            s.groups.remove(&group);
            remember_gone(&mut s, group, why);
        }
        st.scv.notify_all();
    };
    let procs = match spawner.spawn(&req) {
        Ok(p) => p,
        Err(e) => {
            let why = format!(
                "the launcher could not start {n} ranks of {}: {e}",
                req.program.display()
            );
            forget(why.clone());
            return Err(why);
        }
    };
    let mut hosts = Vec::with_capacity(ranks.len());
    for r in &ranks {
        match procs.iter().find(|p| p.rank == *r) {
            Some(p) => hosts.push(p.host.clone()),
            None => {
                let why = format!("the launcher reported no process for spawned rank {r}");
                spawner.abort(group, &why);
                forget(why.clone());
                return Err(why);
            }
        }
    }
    Ok(Msg::Spawned {
        group,
        ranks,
        hosts,
    })
}

fn spawn_cancel(st: &Shared, rank: u32, group: u64, why: String) -> Result<(), String> {
    let why = format!("its parent (rank {rank}) gave up: {why}");
    {
        let mut s = st
            .spawn
            .lock()
            .map_err(|_| "spawn bookkeeping poisoned".to_string())?;
        match s.groups.get(&group) {
            None => return Ok(()), // already gone
            Some(g) if g.members[0] != rank => {
                return Err(format!(
                "rank {rank} is not the parent of spawn group {group}: only rank {} may cancel it",
                g.members[0]
            ))
            }
            Some(_) => {}
        }
        s.groups.remove(&group);
        remember_gone(&mut s, group, why.clone());
    }
    st.scv.notify_all();
    if let Some(sp) = &st.spawner {
        sp.abort(group, &why);
    }
    Ok(())
}

/// Member `rank` of a spawn in progress is gone: fail its group (a group whose last fence
/// has completed is left alone — its members may leave at will).
fn member_lost(st: &Shared, rank: u32, why: &str) {
    let mut failed = Vec::new();
    if let Ok(mut s) = st.spawn.lock() {
        let hit: Vec<u64> = s
            .groups
            .iter()
            .filter(|(_, g)| g.epoch < GROUP_FENCES && g.members.contains(&rank))
            .map(|(id, _)| *id)
            .collect();
        for id in hit {
            let Some(g) = s.groups.remove(&id) else {
                continue;
            };
            let who = if g.members[0] == rank {
                format!("its parent (rank {rank})")
            } else {
                format!("spawned rank {rank}")
            };
            let reason = format!("{who} ended before the spawn completed: {why}");
            remember_gone(&mut s, id, reason.clone());
            failed.push((id, reason));
        }
    } else {
        return;
    }
    if failed.is_empty() {
        return;
    }
    st.scv.notify_all();
    if let Some(sp) = &st.spawner {
        for (id, reason) in &failed {
            sp.abort(*id, reason);
        }
    }
}

fn remember_gone(s: &mut SpawnState, group: u64, why: String) {
    s.gone.insert(group, why);
    while s.gone.len() > 256 {
        s.gone.pop_first();
    }
}

/// A member of spawn group `group` arrived at its next fence: wait for the others.
fn group_fence(st: &Shared, rank: u32, group: u64, kvs: Kvs) -> Msg {
    let err = |msg: String| Msg::Error { msg };
    let Ok(mut s) = st.spawn.lock() else {
        return err("spawn bookkeeping poisoned".into());
    };
    let gone = |s: &SpawnState| {
        let why = s
            .gone
            .get(&group)
            .cloned()
            .unwrap_or_else(|| "it does not exist or has finished".to_string());
        format!("spawn group {group} is gone: {why}")
    };
    let Some(g) = s.groups.get_mut(&group) else {
        return err(gone(&s));
    };
    let Some(idx) = g.members.iter().position(|m| *m == rank) else {
        return err(format!(
            "rank {rank} is not a member of spawn group {group}"
        ));
    };
    if g.arrived[idx].is_some() {
        return err(format!(
            "rank {rank} is already waiting in the fence of spawn group {group}"
        ));
    }
    let my_epoch = g.epoch;
    g.arrived[idx] = Some(kvs);
    if g.arrived.iter().all(Option::is_some) {
        let all: Vec<Kvs> = g.arrived.iter_mut().filter_map(Option::take).collect();
        g.result = Some((my_epoch, Arc::new(all)));
        g.taken = 0;
        g.epoch += 1;
        st.scv.notify_all();
    }
    let timeout = g.timeout;
    let deadline = Instant::now() + timeout;
    loop {
        let Some(g) = s.groups.get_mut(&group) else {
            return err(gone(&s));
        };
        if let Some((e, all)) = &g.result {
            if *e == my_epoch {
                let all = all.as_ref().clone();
                g.taken += 1;
                if g.taken == g.members.len() && g.epoch >= GROUP_FENCES {
                    if let Some(g) = s.groups.remove(&group) {
                        // Complete: its children may now take part in checkpoint waves.
                        for &c in &g.members[1..] {
                            s.joined.insert(
                                c,
                                SpawnedMember {
                                    rank: c,
                                    parent: g.members[0],
                                    group,
                                    program: g.program.clone(),
                                    args: g.args.clone(),
                                },
                            );
                        }
                    }
                }
                return Msg::FenceDone { all };
            }
        }
        let now = Instant::now();
        if now >= deadline {
            let missing: Vec<u32> = g
                .members
                .iter()
                .zip(&g.arrived)
                .filter(|(_, a)| a.is_none())
                .map(|(m, _)| *m)
                .collect();
            let why = format!(
                "timed out after {timeout:?} waiting for ranks {missing:?} of spawn group {group}"
            );
            s.groups.remove(&group);
            remember_gone(&mut s, group, why.clone());
            drop(s);
            st.scv.notify_all();
            if let Some(sp) = &st.spawner {
                sp.abort(group, &why);
            }
            return err(why);
        }
        s = match st.scv.wait_timeout(s, deadline - now) {
            Ok((g, _)) => g,
            Err(_) => return err("spawn bookkeeping poisoned".into()),
        };
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

fn ckpt_put(
    st: &Shared,
    rank: usize,
    epoch: u64,
    blob: &[u8],
    children: Vec<u32>,
) -> Result<(), String> {
    if children.len() > MAX_SPAWN as usize * 64 {
        return Err(format!(
            "rank {rank} declared {} spawned ranks with its checkpoint: too many",
            children.len()
        ));
    }
    with_sink(st)?.put(epoch, rank as u32, blob)?;
    let mut puts = st
        .puts
        .lock()
        .map_err(|_| "checkpoint bookkeeping poisoned".to_string())?;
    puts.entry(epoch).or_default().insert(rank as u32, children);
    Ok(())
}

/// Which ranks epoch `epoch` needs before it can be committed: every rank of the job, and the
/// spawned ranks their checkpoints (and, for grandchildren, their children's) declared as
/// members of the wave. Returns the spawned members, or what is missing or wrong.
fn wave_members(
    st: &Shared,
    puts: &BTreeMap<u32, Vec<u32>>,
    epoch: u64,
) -> Result<Vec<SpawnedMember>, String> {
    let missing: Vec<u32> = (0..st.size).filter(|r| !puts.contains_key(r)).collect();
    if !missing.is_empty() {
        return Err(format!(
            "cannot commit epoch {epoch}: ranks {missing:?} have not stored their checkpoint of it"
        ));
    }
    let joined = st
        .spawn
        .lock()
        .map_err(|_| "spawn bookkeeping poisoned".to_string())?
        .joined
        .clone();
    let mut out: Vec<SpawnedMember> = Vec::new();
    let mut todo: Vec<u32> = (0..st.size).collect();
    let mut missing = Vec::new();
    // Each spawned rank has one parent, so every rank is visited once; bounded by the puts.
    while let Some(r) = todo.pop() {
        let Some(children) = puts.get(&r) else {
            missing.push(r);
            continue;
        };
        for &c in children {
            match joined.get(&c) {
                Some(m) if m.parent == r => {
                    if out.iter().any(|o| o.rank == c) {
                        return Err(format!(
                            "cannot commit epoch {epoch}: spawned rank {c} was declared twice"
                        ));
                    }
                    out.push(m.clone());
                    todo.push(c);
                }
                _ => {
                    return Err(format!(
                        "cannot commit epoch {epoch}: rank {r} declared rank {c} as a spawned \
                         member of the wave, but {c} is not a rank it spawned"
                    ))
                }
            }
        }
    }
    if !missing.is_empty() {
        missing.sort_unstable();
        return Err(format!(
            "cannot commit epoch {epoch}: spawned ranks {missing:?} are members of its wave and \
             have not stored their checkpoint of it"
        ));
    }
    out.sort_by_key(|m| m.rank);
    Ok(out)
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
    let empty = BTreeMap::new();
    let spawned = wave_members(st, puts.get(&epoch).unwrap_or(&empty), epoch)?;
    if st.ckpt_fenced.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(format!(
            "cannot commit epoch {epoch}: the launcher is ending this incarnation of the job"
        ));
    }
    sink.commit(epoch)?;
    puts.retain(|e, _| *e > epoch);
    if let Ok(mut c) = st.committed_spawned.lock() {
        c.insert(epoch, spawned);
        // Only the newest epochs matter (a restart uses the last committed one).
        while c.len() > 16 {
            c.pop_first();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bootstrap server for `n` ranks on loopback (fences wait up to 10 s), and its token.
    fn server(n: u32) -> (PmiServer, [u8; 32]) {
        let token = new_token().unwrap();
        let srv = PmiServer::start(
            "127.0.0.1:0".parse().unwrap(),
            n,
            token,
            Duration::from_secs(10),
        )
        .unwrap();
        (srv, token)
    }

    #[test]
    fn fence_returns_every_rank_kvs_in_rank_order() {
        let (srv, token) = server(3);
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
    fn the_server_keeps_the_init_phases_ranks_publish_and_ignores_malformed_ones() {
        let p = InitPhases {
            register: Duration::from_micros(1500),
            exchange: Duration::from_micros(20),
            connect: Duration::from_micros(7),
        };
        assert_eq!(p.encode(), "1500,20,7");
        assert_eq!(InitPhases::parse(&p.encode()), Some(p));
        for bad in ["", "1,2", "1,2,3,4", "1,-2,3", "a,b,c"] {
            assert_eq!(InitPhases::parse(bad), None, "{bad}");
        }
        let (srv, token) = server(2);
        let addr = srv.addr().to_string();
        let hs: Vec<_> = [p.encode(), "not,a,number".to_string()]
            .into_iter()
            .enumerate()
            .map(|(r, v)| {
                let addr = addr.clone();
                std::thread::spawn(move || {
                    let mut c = PmiClient::connect(&addr, r as u32, &token, Duration::from_secs(5))
                        .unwrap();
                    c.fence(Kvs::new(), Duration::from_secs(5)).unwrap();
                    let mut kvs = Kvs::new();
                    kvs.insert(INIT_KEY.into(), v);
                    c.fence(kvs, Duration::from_secs(5)).unwrap();
                    c
                })
            })
            .collect();
        let _clients: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(srv.init_phases(), vec![Some(p), None]);
        let q = InitPhases {
            register: Duration::from_micros(10),
            exchange: Duration::from_micros(30),
            connect: Duration::from_micros(5),
        };
        let m = p.max(&q);
        assert_eq!(
            (m.register, m.exchange, m.connect),
            (p.register, q.exchange, p.connect)
        );
    }

    #[test]
    fn wrong_token_and_duplicate_rank_are_refused() {
        let (srv, token) = server(2);
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

    /// Reads one line from `s` (waiting at most the socket's read timeout), a byte at a time
    /// so that nothing after it is taken from the socket.
    fn read_line(mut s: &TcpStream) -> Result<String, std::io::Error> {
        let mut line = Vec::new();
        let mut b = [0u8; 1];
        while s.read(&mut b)? == 1 {
            line.push(b[0]);
            if b[0] == b'\n' {
                break;
            }
        }
        Ok(String::from_utf8_lossy(&line).into_owned())
    }

    /// Reads the server's challenge from a fresh connection; returns its nonce.
    fn challenge(s: &TcpStream) -> String {
        let line = read_line(s).unwrap();
        match serde_json::from_str::<Msg>(&line) {
            Ok(Msg::Challenge { nonce }) => nonce,
            other => panic!("no challenge first: {line:?} {other:?}"),
        }
    }

    /// Passes bytes between a client and `to` in both directions, keeping a copy of each.
    struct Relay {
        addr: SocketAddr,
        up: Arc<Mutex<Vec<u8>>>,
        down: Arc<Mutex<Vec<u8>>>,
    }

    fn relay(to: SocketAddr) -> Relay {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (up, down) = (Arc::default(), Arc::default());
        let (u, d) = (Arc::clone(&up), Arc::clone(&down));
        std::thread::spawn(move || {
            let Ok((c, _)) = l.accept() else { return };
            let Ok(s) = TcpStream::connect(to) else {
                return;
            };
            let pipe = |mut a: TcpStream, mut b: TcpStream, keep: Arc<Mutex<Vec<u8>>>| {
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = a.read(&mut buf) {
                        if n == 0 || b.write_all(&buf[..n]).is_err() {
                            break;
                        }
                        keep.lock().unwrap().extend_from_slice(&buf[..n]);
                    }
                    let _ = b.shutdown(std::net::Shutdown::Write);
                })
            };
            let a = pipe(c.try_clone().unwrap(), s.try_clone().unwrap(), u);
            let b = pipe(s, c, d);
            let _ = (a.join(), b.join());
        });
        Relay { addr, up, down }
    }

    #[test]
    fn the_job_token_and_the_kvs_never_cross_the_wire_in_the_clear() {
        let (srv, token) = server(1);
        let r = relay(srv.addr());
        let mut c =
            PmiClient::connect(&r.addr.to_string(), 0, &token, Duration::from_secs(5)).unwrap();
        let mut kvs = Kvs::new();
        kvs.insert("addr".into(), "secret-address-of-rank-0".into());
        let all = c.fence(kvs, Duration::from_secs(5)).unwrap();
        assert_eq!(all[0]["addr"], "secret-address-of-rank-0");
        c.ckpt_last(Duration::from_secs(5)).err();
        drop(c);
        std::thread::sleep(Duration::from_millis(100));
        let both = [r.up.lock().unwrap().clone(), r.down.lock().unwrap().clone()].concat();
        let seen = String::from_utf8_lossy(&both);
        assert!(seen.contains(r#""op":"challenge""#) && seen.contains(r#""op":"welcome""#));
        for secret in [
            hex(&token),
            "secret-address".into(),
            "fence".into(),
            "kvs".into(),
        ] {
            assert!(
                !seen.contains(&secret),
                "{secret:?} went in the clear: {seen}"
            );
        }
    }

    #[test]
    fn a_replayed_hello_is_refused_on_a_new_connection() {
        let (srv, token) = server(2);
        let r = relay(srv.addr());
        let _c =
            PmiClient::connect(&r.addr.to_string(), 0, &token, Duration::from_secs(5)).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let up = r.up.lock().unwrap().clone();
        let hello = up.split(|&b| b == b'\n').next().unwrap().to_vec();
        assert!(String::from_utf8_lossy(&hello).contains(r#""op":"hello""#));
        // The same hello, word for word, as rank 0 and (edited) as rank 1: neither proves
        // anything against a new challenge.
        let as1 = String::from_utf8_lossy(&hello).replace(r#""rank":0"#, r#""rank":1"#);
        for line in [hello.clone(), as1.into_bytes()] {
            let mut s = TcpStream::connect(srv.addr()).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            challenge(&s);
            s.write_all(&[line, b"\n".to_vec()].concat()).unwrap();
            let answer = read_line(&s).unwrap();
            assert!(answer.contains("wrong job token"), "{answer}");
        }
    }

    #[test]
    fn after_the_handshake_a_message_in_the_clear_is_not_served() {
        let (srv, token) = server(1);
        let mut s = TcpStream::connect(srv.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let n1 = challenge(&s);
        let n2 = crate::seal::nonce_hex().unwrap();
        let hello = Msg::Hello {
            rank: 0,
            nonce: n2.clone(),
            mac: hello_mac(&token, &n1, &n2, 0),
        };
        write_msg(&mut s, &hello).unwrap();
        let welcome = read_line(&s).unwrap();
        assert!(welcome.contains(r#""op":"welcome""#), "{welcome}");
        // An honest handshake, then a fence in the clear (a one-rank job: it would be
        // answered at once if it counted).
        s.write_all(b"{\"op\":\"fence\",\"kvs\":{}}\n").unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        let rest = String::from_utf8_lossy(&rest);
        assert!(
            !rest.contains("fence_done"),
            "a fence in the clear was served: {rest}"
        );
        assert!(
            !rest.contains(r#""op""#),
            "the server answered in the clear: {rest}"
        );
    }

    #[test]
    fn a_server_that_cannot_prove_the_token_is_not_trusted() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let fake = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            write_msg(
                &mut s,
                &Msg::Challenge {
                    nonce: "ab".repeat(32),
                },
            )
            .unwrap();
            let hello = read_line(&s).unwrap();
            // Whatever it got, it cannot answer with the proof: it echoes the rank's own.
            let mac = match serde_json::from_str::<Msg>(&hello) {
                Ok(Msg::Hello { mac, .. }) => mac,
                _ => String::new(),
            };
            write_msg(&mut s, &Msg::Welcome { mac }).unwrap();
            hello
        });
        let token = new_token().unwrap();
        let e = PmiClient::connect(&addr.to_string(), 0, &token, Duration::from_secs(5))
            .err()
            .unwrap();
        assert!(e.contains("did not prove"), "{e}");
        let hello = fake.join().unwrap();
        assert!(
            !hello.contains(&hex(&token)),
            "the token went to a stranger: {hello}"
        );
    }

    #[test]
    fn a_client_sending_one_byte_a_second_is_closed_by_the_hello_deadline() {
        let (srv, _) = server(1);
        let s = TcpStream::connect(srv.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let t = Instant::now();
        let mut w = s.try_clone().unwrap();
        let writer = std::thread::spawn(move || {
            for b in br#"{"op":"hello","rank":0"#.iter().take(12) {
                if w.write_all(&[*b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        });
        challenge(&s);
        let line = read_line(&s);
        let took = t.elapsed();
        let mut rest = [0u8; 16];
        let end = (&s).read(&mut rest);
        writer.join().unwrap();
        eprintln!("one byte a second: closed after {took:?}");
        assert!(
            took >= HELLO_TIMEOUT - Duration::from_millis(500)
                && took <= HELLO_TIMEOUT + Duration::from_millis(1500),
            "closed after {took:?} ({line:?})"
        );
        let line = line.unwrap();
        assert!(line.contains("no hello within"), "{line}");
        assert!(
            matches!(end, Ok(0) | Err(_)),
            "the connection is closed: {end:?}"
        );
    }

    #[test]
    fn a_1_mib_first_line_without_a_token_is_refused_after_at_most_4_kib() {
        let (srv, _) = server(1);
        let s = TcpStream::connect(srv.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut w = s.try_clone().unwrap();
        // The server closes without reading it all: the write may fail, which is the point.
        let writer = std::thread::spawn(move || w.write_all(&vec![b'x'; 1 << 20]).is_ok());
        challenge(&s);
        let line = read_line(&s).unwrap();
        let _ = writer.join().unwrap();
        assert!(line.contains(&format!("{MAX_HELLO} bytes")), "{line}");
        let read = srv
            .state
            .preauth_max
            .load(std::sync::atomic::Ordering::Relaxed);
        eprintln!("1 MiB first line: {read} bytes read before the refusal");
        assert!(
            read <= MAX_HELLO,
            "{read} bytes read before the token was proved"
        );
    }

    #[test]
    fn two_hundred_idle_connections_do_not_stop_a_real_job_from_joining() {
        const IDLE: usize = 200;
        let (srv, token) = server(3);
        let idle: Vec<TcpStream> = (0..IDLE)
            .map(|_| {
                let s = TcpStream::connect(srv.addr()).unwrap();
                s.set_nonblocking(true).unwrap();
                s
            })
            .collect();
        let t = Instant::now();
        let addr = srv.addr().to_string();
        let ranks: Vec<_> = (0..3u32)
            .map(|r| {
                let addr = addr.clone();
                std::thread::spawn(move || {
                    let t = Duration::from_secs(5);
                    let mut c = PmiClient::connect(&addr, r, &token, t)?;
                    let mut kvs = Kvs::new();
                    kvs.insert("addr".into(), format!("host{r}"));
                    let all = c.fence(kvs, t)?;
                    c.fence(Kvs::new(), t)?;
                    Ok::<_, String>(all.len())
                })
            })
            .collect();
        for h in ranks {
            assert_eq!(h.join().unwrap(), Ok(3));
        }
        let joined = t.elapsed();
        eprintln!("{IDLE} idle connections: the job joined in {joined:?}");
        assert!(
            joined < HELLO_TIMEOUT,
            "the job joined after {joined:?}, not before the idle connections' deadline"
        );
        // The oldest idle connections made room: closed, not served by a thread each.
        let closed = idle
            .iter()
            .filter(|s| {
                // Past the challenge: an error line, the end of the stream or a reset is a
                // connection the server closed.
                let mut got = Vec::new();
                let mut b = [0u8; 256];
                loop {
                    match (&**s).read(&mut b) {
                        Ok(0) => return true,
                        Ok(n) => got.extend_from_slice(&b[..n]),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            return String::from_utf8_lossy(&got).contains(r#""op":"error""#)
                        }
                        Err(_) => return true,
                    }
                }
            })
            .count();
        assert!(
            closed >= IDLE - MAX_UNAUTH,
            "{closed} of {IDLE} idle connections closed"
        );
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
        assert_eq!(srv.fence_missing(), None);
        let e = c.fence(Kvs::new(), Duration::from_secs(5)).unwrap_err();
        assert!(e.contains("[1]"), "{e}");
        assert_eq!(
            srv.fence_missing(),
            Some(vec![1]),
            "the rank that never came"
        );
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
    fn after_fence_checkpoints_no_commit_lands() {
        let token = new_token().unwrap();
        let sink = Arc::new(MemSink::default());
        let srv = PmiServer::start_with_checkpoints(
            "127.0.0.1:0".parse().unwrap(),
            1,
            token,
            Duration::from_secs(10),
            sink.clone(),
        )
        .unwrap();
        let t = Duration::from_secs(10);
        let mut c0 = PmiClient::connect(&srv.addr().to_string(), 0, &token, t).unwrap();
        c0.ckpt_put(1, b"one", t).unwrap();
        c0.ckpt_commit(1, t).unwrap();
        c0.ckpt_put(2, b"two", t).unwrap();
        srv.fence_checkpoints();
        let e = c0.ckpt_commit(2, t).unwrap_err();
        assert!(e.contains("ending this incarnation"), "{e}");
        assert_eq!(sink.last_committed().unwrap(), Some(1));
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

    type ChildThread = std::thread::JoinHandle<Result<Vec<Kvs>, String>>;

    /// Starts each child as a thread that joins the group through the PMI protocol (or, for
    /// the ranks in `absent`, never connects).
    struct ThreadSpawner {
        absent: Vec<u32>,
        /// Children store a checkpoint of this epoch after the group fences.
        put: Option<u64>,
        aborted: Mutex<Vec<(u64, String)>>,
        requests: Mutex<Vec<SpawnRequest>>,
        children: Mutex<Vec<ChildThread>>,
    }

    impl Spawner for ThreadSpawner {
        fn spawn(&self, req: &SpawnRequest) -> Result<Vec<SpawnedProc>, String> {
            if req.program.to_str() == Some("/missing") {
                return Err("/missing: no such file".into());
            }
            self.requests.lock().unwrap().push(req.clone());
            let mut out = Vec::new();
            for (r, env) in req.ranks.iter().zip(&req.env) {
                out.push(SpawnedProc {
                    rank: *r,
                    host: "here".into(),
                });
                if self.absent.contains(r) {
                    continue;
                }
                let get = |k: &str| env.iter().find(|(n, _)| n == k).unwrap().1.clone();
                let (addr, rank, group) = (
                    get("MUTIRAO_PMI_ADDR"),
                    get("MUTIRAO_RANK").parse::<u32>().unwrap(),
                    get("MUTIRAO_SPAWN_GROUP").parse::<u64>().unwrap(),
                );
                let token = unhex_token(&get("MUTIRAO_JOB_TOKEN")).unwrap();
                let put = self.put;
                self.children
                    .lock()
                    .unwrap()
                    .push(std::thread::spawn(move || {
                        let t = Duration::from_secs(10);
                        let mut c = PmiClient::connect(&addr, rank, &token, t)?;
                        let mut kvs = Kvs::new();
                        kvs.insert("who".into(), format!("child{rank}"));
                        let all = c.group_fence(group, kvs, t)?;
                        c.group_fence(group, Kvs::new(), t)?;
                        if let Some(epoch) = put {
                            // A spawned rank stores checkpoints (it is in the waves), but
                            // commits nothing.
                            c.ckpt_put(epoch, format!("child{rank}").as_bytes(), t)?;
                            let e = c.ckpt_commit(epoch, t).unwrap_err();
                            assert!(e.contains("was spawned"), "{e}");
                            return Ok(all);
                        }
                        // It is not part of the job's fences.
                        let e = c.fence(Kvs::new(), t).unwrap_err();
                        assert!(e.contains("was spawned"), "{e}");
                        Ok(all)
                    }));
            }
            Ok(out)
        }
        fn abort(&self, group: u64, why: &str) {
            self.aborted.lock().unwrap().push((group, why.to_string()));
        }
    }

    fn thread_spawner(absent: Vec<u32>) -> Arc<ThreadSpawner> {
        Arc::new(ThreadSpawner {
            absent,
            put: None,
            aborted: Mutex::new(Vec::new()),
            requests: Mutex::new(Vec::new()),
            children: Mutex::new(Vec::new()),
        })
    }

    /// Spawn a group of 2 from rank 0 and complete its fences; the children store `put`.
    fn spawn_two(
        p: &mut PmiClient,
        restore: Option<(u64, &[u32])>,
    ) -> Result<(u64, Vec<u32>), String> {
        let t = Duration::from_secs(10);
        let prog = std::path::Path::new("/bin/prog");
        let (g, ranks, _) = match restore {
            None => p.spawn(prog, &["w".into()], 2, &[], Duration::from_secs(5), "job-1")?,
            Some((g, r)) => {
                p.respawn(prog, &["w".into()], g, r, Duration::from_secs(5), "job-1")?
            }
        };
        p.group_fence(g, Kvs::new(), t)?;
        p.group_fence(g, Kvs::new(), t)?;
        Ok((g, ranks))
    }

    #[test]
    fn a_commit_counts_the_declared_spawned_members_and_a_restart_respawns_them() {
        let token = new_token().unwrap();
        let t = Duration::from_secs(10);
        let sink = Arc::new(MemSink::default());
        let sp = Arc::new(ThreadSpawner {
            put: Some(1),
            ..Arc::into_inner(thread_spawner(vec![])).unwrap()
        });
        let srv = PmiServer::builder("127.0.0.1:0".parse().unwrap(), 1, token, t)
            .spawner(sp.clone())
            .checkpoints(sink.clone())
            .start()
            .unwrap();
        let mut p = PmiClient::connect(&srv.addr().to_string(), 0, &token, t).unwrap();
        let (g, kids) = spawn_two(&mut p, None).unwrap();
        assert_eq!(kids, [1, 2]);
        for h in std::mem::take(&mut *sp.children.lock().unwrap()) {
            h.join().unwrap().unwrap();
        }
        // Epoch 1: both children stored theirs; the parent declares them.
        p.ckpt_put_with(1, b"p", &kids, t).unwrap();
        p.ckpt_commit(1, t).unwrap();
        let m = srv.spawned_members(1).unwrap();
        assert_eq!(
            m.iter()
                .map(|m| (m.rank, m.parent, m.group))
                .collect::<Vec<_>>(),
            [(1, 0, g), (2, 0, g)]
        );
        assert_eq!(
            (m[0].program.to_str(), m[0].args.clone()),
            (Some("/bin/prog"), vec!["w".to_string()])
        );
        // Epoch 2: declared but not stored by the children: no commit.
        p.ckpt_put_with(2, b"p", &kids, t).unwrap();
        let e = p.ckpt_commit(2, t).unwrap_err();
        assert!(
            e.contains("spawned ranks [1, 2]") && e.contains("have not stored"),
            "{e}"
        );
        // Epoch 3: a rank that is not its child.
        p.ckpt_put_with(3, b"p", &[7], t).unwrap();
        let e = p.ckpt_commit(3, t).unwrap_err();
        assert!(e.contains("7 is not a rank it spawned"), "{e}");
        // Epoch 4: no spawned members.
        p.ckpt_put(4, b"p", t).unwrap();
        p.ckpt_commit(4, t).unwrap();
        assert_eq!(srv.spawned_members(4), Some(vec![]));
        assert_eq!(sink.blobs.lock().unwrap()[&(1, 2)], b"child2");
        drop(srv);

        // A restart: a new server; the group comes back with its id and ranks, a spawned
        // rank reads its checkpoint, and a new spawn gets ranks and a group above them.
        let sp = thread_spawner(vec![]);
        let srv = PmiServer::builder("127.0.0.1:0".parse().unwrap(), 1, token, t)
            .spawner(sp.clone())
            .checkpoints(sink.clone())
            .start()
            .unwrap();
        let mut p = PmiClient::connect(&srv.addr().to_string(), 0, &token, t).unwrap();
        let e = spawn_two(&mut p, Some((g, &[0, 1]))).unwrap_err();
        assert!(e.contains("already in use"), "{e}");
        assert_eq!(
            spawn_two(&mut p, Some((g, &kids))).unwrap(),
            (g, kids.clone())
        );
        let e = spawn_two(&mut p, Some((g, &kids))).unwrap_err();
        assert!(e.contains("already in use"), "{e}");
        let (g2, r2) = spawn_two(&mut p, None).unwrap();
        assert!(g2 > g && r2 == [3, 4], "{g2} {r2:?}");
        for h in std::mem::take(&mut *sp.children.lock().unwrap()) {
            h.join().unwrap().unwrap();
        }
        let env: BTreeMap<_, _> = sp.requests.lock().unwrap()[0].env[1]
            .iter()
            .cloned()
            .collect();
        assert_eq!(
            (
                env["MUTIRAO_RANK"].as_str(),
                env["MUTIRAO_SPAWN_MEMBERS"].as_str()
            ),
            ("2", "0,1,2")
        );
    }

    #[test]
    fn spawn_gives_new_world_ranks_and_a_group_fence_joins_parent_and_children() {
        let token = new_token().unwrap();
        let sp = thread_spawner(vec![]);
        let t = Duration::from_secs(10);
        let srv = PmiServer::builder("127.0.0.1:0".parse().unwrap(), 2, token, t)
            .spawner(sp.clone())
            .start()
            .unwrap();
        let addr = srv.addr().to_string();
        let mut p = PmiClient::connect(&addr, 1, &token, t).unwrap();
        let prog = std::path::Path::new("/bin/prog");
        let (g, ranks, hosts) = p
            .spawn(prog, &["a".into()], 2, &[], Duration::from_secs(5), "job-1")
            .unwrap();
        assert_eq!(ranks, [2, 3]);
        assert_eq!(hosts, ["here", "here"]);
        let mut kvs = Kvs::new();
        kvs.insert("who".into(), "parent".into());
        let all = p.group_fence(g, kvs, t).unwrap();
        let who: Vec<_> = all.iter().map(|k| k["who"].clone()).collect();
        assert_eq!(who, ["parent", "child2", "child3"]);
        assert_eq!(p.group_fence(g, Kvs::new(), t).unwrap().len(), 3);
        for h in std::mem::take(&mut *sp.children.lock().unwrap()) {
            assert_eq!(h.join().unwrap().unwrap(), all);
        }
        let req = sp.requests.lock().unwrap()[0].clone();
        assert_eq!(
            (req.group, req.parent, req.args.clone()),
            (g, 1, vec!["a".to_string()])
        );
        let env2: BTreeMap<_, _> = req.env[0].iter().cloned().collect();
        assert_eq!(env2["MUTIRAO_RANK"], "2");
        assert_eq!(env2["MUTIRAO_SIZE"], "2");
        assert_eq!(env2["MUTIRAO_SPAWN_MEMBERS"], "1,2,3");
        assert_eq!(env2["MUTIRAO_JOB_ID"], "job-1");
        // The group is finished: its ranks cannot connect again, and later spawns get new ranks.
        let e = PmiClient::connect(&addr, 2, &token, t).err().unwrap();
        assert!(e.contains("not part of any spawn"), "{e}");
        assert!(sp.aborted.lock().unwrap().is_empty());
        // A parent that gives up: its child's fence fails at once, the spawner aborts.
        let (g2, ranks, _) = p
            .spawn(prog, &[], 1, &[], Duration::from_secs(5), "job-1")
            .unwrap();
        assert_eq!(ranks, [4]);
        let mut other = PmiClient::connect(&addr, 0, &token, t).unwrap();
        let e = other.spawn_cancel(g2, "no", t).unwrap_err();
        assert!(e.contains("only rank 1"), "{e}");
        p.spawn_cancel(g2, "changed my mind", t).unwrap();
        for h in std::mem::take(&mut *sp.children.lock().unwrap()) {
            // It was waiting in the fence, or came too late to be admitted.
            let e = h.join().unwrap().unwrap_err();
            assert!(
                e.contains("gave up: changed my mind") || e.contains("not part of any spawn"),
                "{e}"
            );
        }
        assert_eq!(sp.aborted.lock().unwrap()[0].0, g2);
    }

    #[test]
    fn spawn_errors_no_spawner_missing_program_and_a_child_that_never_comes() {
        let token = new_token().unwrap();
        let t = Duration::from_secs(10);
        let srv = PmiServer::start("127.0.0.1:0".parse().unwrap(), 1, token, t).unwrap();
        let mut p = PmiClient::connect(&srv.addr().to_string(), 0, &token, t).unwrap();
        let prog = std::path::Path::new("/bin/prog");
        let e = p.spawn(prog, &[], 1, &[], t, "j").unwrap_err();
        assert!(e.contains("cannot spawn ranks"), "{e}");
        // The connection still serves (the job goes on).
        p.report_failure(3, "x", t).unwrap();

        let sp = thread_spawner(vec![5]);
        let srv = PmiServer::builder("127.0.0.1:0".parse().unwrap(), 2, token, t)
            .spawner(sp.clone())
            .start()
            .unwrap();
        let addr = srv.addr().to_string();
        let mut p = PmiClient::connect(&addr, 0, &token, t).unwrap();
        let e = p
            .spawn(std::path::Path::new("/missing"), &[], 2, &[], t, "j")
            .unwrap_err();
        assert!(e.contains("no such file"), "{e}");
        let e = p.spawn(prog, &[], 0, &[], t, "j").unwrap_err();
        assert!(e.contains("1 to"), "{e}");
        // World ranks are never reused (the failed spawn above had 2 and 3). Rank 5 (the second
        // child) never connects: the fence fails for everyone within the timeout, the spawner
        // is told to abort, and the group is forgotten.
        let (g, ranks, _) = p
            .spawn(prog, &[], 2, &[], Duration::from_millis(300), "j")
            .unwrap();
        assert_eq!(ranks, [4, 5]);
        let t0 = Instant::now();
        let e = p.group_fence(g, Kvs::new(), t).unwrap_err();
        assert!(e.contains("timed out") && e.contains("[5]"), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
        for h in std::mem::take(&mut *sp.children.lock().unwrap()) {
            let e = h.join().unwrap().unwrap_err();
            assert!(
                e.contains("timed out")
                    || e.contains("is gone")
                    || e.contains("not part of any spawn"),
                "{e}"
            );
        }
        let ab = sp.aborted.lock().unwrap().clone();
        assert_eq!(ab.len(), 1);
        assert_eq!(ab[0].0, g);
        let e = PmiClient::connect(&addr, 5, &token, t).err().unwrap();
        assert!(e.contains("not part of any spawn"), "{e}");
        let e = p.group_fence(g, Kvs::new(), t).unwrap_err();
        assert!(e.contains("is gone") && e.contains("timed out"), "{e}");
        // And the parent's connection still works for the job's own fences.
        let mut c1 = PmiClient::connect(&addr, 1, &token, t).unwrap();
        let h = std::thread::spawn(move || c1.fence(Kvs::new(), t).map(|a| a.len()));
        assert_eq!(p.fence(Kvs::new(), t).unwrap().len(), 2);
        assert_eq!(h.join().unwrap(), Ok(2));
    }

    #[test]
    fn a_child_whose_connection_closes_fails_the_spawn_at_once() {
        let token = new_token().unwrap();
        let t = Duration::from_secs(10);
        let sp = thread_spawner(vec![1, 2]);
        let srv = PmiServer::builder("127.0.0.1:0".parse().unwrap(), 1, token, t)
            .spawner(sp.clone())
            .start()
            .unwrap();
        let addr = srv.addr().to_string();
        let mut p = PmiClient::connect(&addr, 0, &token, t).unwrap();
        let prog = std::path::Path::new("/bin/prog");
        let (g, ranks, _) = p.spawn(prog, &[], 2, &[], t, "j").unwrap();
        assert_eq!(ranks, [1, 2]);
        drop(PmiClient::connect(&addr, 2, &token, t).unwrap());
        let t0 = Instant::now();
        let e = p.group_fence(g, Kvs::new(), t).unwrap_err();
        assert!(
            e.contains("spawned rank 2 ended before the spawn completed"),
            "{e}"
        );
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        // The spawner hears of it just after the members (bounded wait).
        for _ in 0..200 {
            if !sp.aborted.lock().unwrap().is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let ab = sp.aborted.lock().unwrap().clone();
        assert!(ab.len() == 1 && ab[0].0 == g, "{ab:?}");
        // The launcher's word on an exit after the group is gone changes nothing.
        srv.spawned_exited(1, "exit 1");
        assert_eq!(sp.aborted.lock().unwrap().len(), 1);
    }

    #[test]
    fn without_a_sink_checkpoints_are_refused_and_failures_are_reported() {
        let (srv, token) = server(2);
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
