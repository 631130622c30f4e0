//! The per-host agent: starts, watches and ends the processes an authenticated launcher asks
//! for, streams their output back and reports how they ended. `mutirao agent` is a shell over
//! [`serve_forever`]; this module prints nothing itself (it logs through [`AgentConfig::log`]).

use crate::proto::{self, Msg, Stream};
use anyhow::bail;
use std::collections::BTreeMap;
use std::io::BufReader;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What an agent serves with.
#[derive(Clone)]
pub struct AgentConfig {
    /// The shared secret launchers must prove they hold.
    pub secret: Arc<Vec<u8>>,
    /// The directory socket ranks started here get as `MUTIRAO_DIR_SOCKET`.
    pub dir_socket: Option<PathBuf>,
    /// Where the agent's log lines go.
    pub log: Arc<dyn Fn(&str) + Send + Sync>,
    /// The checkpoint replicas this agent keeps for launchers (`None`: it keeps none).
    pub store: Option<Arc<mutirao_ckpt::DirStore>>,
    /// Every process group this agent runs for launchers (the owner's policy stops and
    /// continues them all).
    pub procs: Procs,
    /// Where programs named by digest come from (an agent of a grid coordinator fetches them
    /// from its repository); `None`: programs are run from the paths launchers name.
    pub programs: Option<ProgramSource>,
    /// The journal of the grid ranks this agent runs (ranks a coordinator labelled with
    /// [`crate::journal::GRID_JOB_ENV`]): alive, and how each ended; `None`: none is kept.
    pub journal: Option<Arc<crate::journal::RankJournal>>,
    /// Who the ranks run as, in which directory, with what environment.
    pub sandbox: Arc<crate::sandbox::Sandbox>,
    /// How many connections it serves at once.
    pub limits: Limits,
}

/// How many connections an agent serves at once, and how long a handshake may take.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections that have not yet proved they hold the token: more are closed at once.
    pub handshaking: usize,
    /// Sessions at once (launches and checkpoint sessions), authenticated or not.
    pub sessions: usize,
    /// Time for the whole handshake.
    pub handshake: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            handshaking: 64,
            sessions: 512,
            handshake: proto::HANDSHAKE_DEADLINE,
        }
    }
}

/// One unit of a counted limit, given back when dropped.
struct Slot(Arc<AtomicUsize>);

impl Slot {
    /// A unit of `count` if fewer than `max` are taken.
    fn take(count: &Arc<AtomicUsize>, max: usize) -> Option<Slot> {
        count
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(count.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Resolves a program digest (`sha256:<hex>`) to a local file whose content has just been
/// checked against it, or says why not.
pub type Resolve = Arc<dyn Fn(&str) -> Result<PathBuf, String> + Send + Sync>;

/// Programs by digest, for an agent that does not share the launcher's file system.
#[derive(Clone)]
pub struct ProgramSource {
    /// Digest → checked local file.
    pub resolve: Resolve,
}

/// The digest a launch names its program by, if any: the program itself given as
/// `sha256:<hex>` (a program in the coordinator's repository, e.g. one a rank spawns), the
/// digest of [`PROGRAM_DIGEST_ENV`] when the program is the one [`PROGRAM_DIGEST_OF_ENV`]
/// names, or a file name `sha256-<hex>` (an agent's cached copy: a rank run from it that
/// spawns itself names that path).
pub fn program_digest(program: &str, env: Option<&BTreeMap<String, String>>) -> Option<String> {
    let is_digest = |d: &str| {
        d.strip_prefix("sha256:")
            .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
    };
    if program.starts_with("sha256:") {
        return Some(program.to_string());
    }
    if let Some(want) = env.and_then(|env| {
        let of = env.get(PROGRAM_DIGEST_OF_ENV);
        env.get(PROGRAM_DIGEST_ENV)
            .filter(|_| of.is_none_or(|p| *p == program))
    }) {
        return Some(want.trim().to_string());
    }
    let name = Path::new(program).file_name()?.to_str()?;
    let d = name.replacen('-', ":", 1);
    is_digest(&d).then_some(d)
}

/// The process groups an agent runs for launchers, so that the host owner's policy can stop
/// them (SIGSTOP) when the owner comes back and continue them (SIGCONT) when the owner leaves.
/// A group started while they are stopped is stopped at once.
#[derive(Clone, Default)]
pub struct Procs(Arc<Mutex<ProcsInner>>);

#[derive(Default)]
struct ProcsInner {
    pids: Vec<i32>,
    stopped: bool,
}

impl Procs {
    fn lock(&self) -> std::sync::MutexGuard<'_, ProcsInner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stop every group (and those started from now on); returns how many run now.
    pub fn stop_all(&self) -> usize {
        let mut g = self.lock();
        g.stopped = true;
        kill_all(&g.pids, libc::SIGSTOP);
        g.pids.len()
    }

    /// Continue every group; returns how many run now.
    pub fn continue_all(&self) -> usize {
        let mut g = self.lock();
        g.stopped = false;
        kill_all(&g.pids, libc::SIGCONT);
        g.pids.len()
    }

    /// End every group (SIGKILL; stopped ones too); returns how many there were.
    pub fn kill_all(&self) -> usize {
        let g = self.lock();
        kill_all(&g.pids, libc::SIGKILL);
        g.pids.len()
    }

    /// Groups running and not stopped.
    pub fn running(&self) -> usize {
        let g = self.lock();
        if g.stopped {
            0
        } else {
            g.pids.len()
        }
    }

    /// Groups alive (stopped or not).
    pub fn count(&self) -> usize {
        self.lock().pids.len()
    }

    fn add(&self, pid: i32) {
        let mut g = self.lock();
        if g.stopped {
            kill_all(&[pid], libc::SIGSTOP);
        }
        g.pids.push(pid);
    }

    fn remove(&self, pid: i32) {
        self.lock().pids.retain(|p| *p != pid);
    }
}

/// Accept launchers on `listener` forever, one thread per session, within [`Limits`]: a
/// connection over a limit is closed at once (and said once in the log, until the count is
/// under the limit again).
pub fn serve_forever(listener: TcpListener, cfg: AgentConfig) {
    let handshaking = Arc::new(AtomicUsize::new(0));
    let sessions = Arc::new(AtomicUsize::new(0));
    let mut refusing = false;
    for conn in listener.incoming() {
        let conn = match conn {
            Ok(c) => c,
            Err(e) => {
                (cfg.log)(&format!("accept failed: {e}"));
                // Out of descriptors, say: give the sessions a moment to end.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let peer = conn
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| "?".into());
        let slots = Slot::take(&sessions, cfg.limits.sessions)
            .and_then(|s| Slot::take(&handshaking, cfg.limits.handshaking).map(|h| (s, h)));
        let Some((session_slot, handshake_slot)) = slots else {
            if !refusing {
                (cfg.log)(&format!(
                    "refusing connections (from {peer} on): {} sessions or {} handshakes at once already",
                    cfg.limits.sessions, cfg.limits.handshaking
                ));
                refusing = true;
            }
            drop(conn);
            continue;
        };
        refusing = false;
        let session = cfg.clone();
        let spawned = std::thread::Builder::new()
            .name("agent-conn".into())
            .spawn(move || {
                let _session = session_slot;
                if let Err(e) = serve_counted(conn, &session, Some(handshake_slot)) {
                    (session.log)(&format!("session with {peer}: {e:#}"));
                }
            });
        if let Err(e) = spawned {
            (cfg.log)(&format!("cannot start a session thread: {e}"));
        }
    }
}

/// This host's name, as agents announce it.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// Serve one launcher's session on `conn`: authenticate it, run its launch request, stream
/// output and exits back, obey `kill`, and kill everything it started if the launcher goes away
/// (its socket closes, or — with heartbeats — it stays silent for [`proto::HEARTBEAT_MISSES`]
/// periods).
pub fn serve(conn: TcpStream, cfg: &AgentConfig) -> anyhow::Result<()> {
    serve_counted(conn, cfg, None)
}

/// [`serve`], giving `handshaking` back once the launcher is authenticated.
fn serve_counted(
    conn: TcpStream,
    cfg: &AgentConfig,
    handshaking: Option<Slot>,
) -> anyhow::Result<()> {
    let secret: &[u8] = &cfg.secret;
    let dir_socket = cfg.dir_socket.as_ref();
    let peer = conn.peer_addr()?;
    conn.set_nodelay(true).ok();
    // A peer that reads nothing cannot hold a writer for long either.
    conn.set_write_timeout(Some(Duration::from_secs(30)))?;
    // The whole handshake within the deadline, however slowly the peer sends it.
    let mut r = BufReader::new(proto::DeadlineReader::new(
        conn.try_clone()?,
        Some(std::time::Instant::now() + cfg.limits.handshake),
    ));
    // Before authentication: plain lines.
    let mut plain = conn.try_clone()?;
    let mut send_plain = |m: &Msg| -> anyhow::Result<()> {
        proto::write_msg(&mut plain, m)?;
        Ok(())
    };
    // Authentication.
    let nonce = proto::nonce()?;
    send_plain(&Msg::Challenge {
        version: proto::AGENT_PROTOCOL,
        nonce: nonce.clone(),
    })?;
    let client_nonce = match proto::read_msg_max(&mut r, proto::MAX_PRE_AUTH_LINE) {
        Ok(Some(Msg::Auth { mac, nonce: cn }))
            if cn.len() >= 32 && proto::verify_client(secret, &nonce, &cn, &mac) =>
        {
            cn
        }
        Ok(Some(Msg::Auth { nonce: cn, .. })) if cn.len() < 32 => {
            let _ = send_plain(&Msg::Error {
                msg: "nonce too short".into(),
            });
            bail!("refused {peer}: short nonce");
        }
        Ok(Some(Msg::Auth { .. })) => {
            let _ = send_plain(&Msg::Error {
                msg: "authentication failed".into(),
            });
            bail!("refused {peer}: wrong token");
        }
        Ok(other) => {
            let _ = send_plain(&Msg::Error {
                msg: "authenticate first".into(),
            });
            bail!("refused {peer}: expected auth, got {other:?}");
        }
        Err(e) => {
            let _ = send_plain(&Msg::Error {
                msg: "malformed request".into(),
            });
            bail!("refused {peer}: {e}");
        }
    };
    send_plain(&Msg::Welcome {
        mac: proto::server_mac(secret, &nonce, &client_nonce),
        host: host_name(),
        cores: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
    })?;
    // Authenticated: sealed records from now on, and the session's own timeouts.
    let (sealer, opener) =
        proto::session_keys(secret, &nonce, &client_nonce, mutirao::seal::Role::Server).split();
    let mut r = mutirao::seal::SealedReader::new(r, opener);
    let w = Arc::new(Mutex::new(mutirao::seal::SealedWriter::new(
        conn.try_clone()?,
        sealer,
    )));
    let send = |m: &Msg| -> anyhow::Result<()> {
        let mut g = w.lock().map_err(|_| anyhow::anyhow!("writer poisoned"))?;
        proto::write_msg(&mut *g, m)?;
        Ok(())
    };
    drop(handshaking);
    r.get_mut().get_mut().set_deadline(None);
    r.get_ref()
        .get_ref()
        .get_ref()
        .set_read_timeout(Some(Duration::from_secs(60)))?;
    // The job.
    let (program, args, cwd, ranks, heartbeat_ms) = match proto::read_msg(&mut r) {
        Ok(Some(Msg::Launch {
            program,
            args,
            cwd,
            ranks,
            heartbeat_ms,
        })) => (program, args, cwd, ranks, heartbeat_ms),
        Ok(Some(Msg::Store { scope })) => {
            let Some(store) = cfg.store.clone() else {
                let _ = send(&Msg::Error {
                    msg: "this agent keeps no checkpoints (started with --no-store)".into(),
                });
                bail!("{peer}: refused a checkpoint session: no store");
            };
            if !proto::is_scope(&scope) {
                let _ = send(&Msg::Error {
                    msg: "a checkpoint session needs a scope of 64 lowercase hex digits".into(),
                });
                bail!("{peer}: refused a checkpoint session: malformed scope");
            }
            // One job's keys only: the scope is named by the job's checkpoint key.
            let store = mutirao_ckpt::Scoped::new(store, &scope)
                .map_err(|e| anyhow::anyhow!("{peer}: checkpoint scope: {e}"))?;
            send(&Msg::Ready)?;
            // Idle sessions end after a while; the launcher reconnects when it needs to.
            conn.set_read_timeout(Some(Duration::from_secs(300)))?;
            let writer = Arc::try_unwrap(w)
                .map_err(|_| anyhow::anyhow!("the session's writer is still shared"))?
                .into_inner()
                .map_err(|_| anyhow::anyhow!("writer poisoned"))?;
            let served = mutirao_ckpt::remote::serve(
                mutirao::seal::SealedStream { reader: r, writer },
                &store,
            );
            if let Err(e) = served {
                if !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) {
                    bail!("{peer}: checkpoint session: {e}");
                }
            }
            return Ok(());
        }
        Ok(None) => return Ok(()),
        Ok(Some(other)) => {
            let _ = send(&Msg::Error {
                msg: "expected a launch request".into(),
            });
            bail!("{peer}: expected launch, got {other:?}");
        }
        Err(e) => {
            let _ = send(&Msg::Error {
                msg: format!("malformed launch request: {e}"),
            });
            bail!("{peer}: malformed launch: {e}");
        }
    };
    if program.is_empty() || ranks.is_empty() {
        let _ = send(&Msg::Error {
            msg: "a launch needs a program and at least one rank".into(),
        });
        bail!("{peer}: empty launch");
    }
    // Heartbeats: ours every period from now on — fetching or checking the program may take
    // longer than the launcher waits for a silent agent — until the session ends (every rank
    // ended, or this function returns, refusing or done); the launcher's awaited below.
    let ended = Arc::new(AtomicBool::new(false));
    struct EndsHeartbeats(Arc<AtomicBool>);
    impl Drop for EndsHeartbeats {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let _session = EndsHeartbeats(ended.clone());
    let silence = match heartbeat_ms {
        Some(ms) if ms > 0 => {
            let period = Duration::from_millis(ms);
            let w = w.clone();
            let ended = ended.clone();
            std::thread::spawn(move || {
                while !ended.load(Ordering::SeqCst) {
                    std::thread::sleep(period);
                    if ended.load(Ordering::SeqCst) {
                        break;
                    }
                    match w.lock() {
                        Ok(mut g) => {
                            if proto::write_msg(&mut *g, &Msg::Heartbeat).is_err() {
                                break;
                            }
                        }
                        Err(_) => break,
                    }
                }
            });
            Some(period * proto::HEARTBEAT_MISSES)
        }
        _ => None,
    };
    let log = |m: &str| (cfg.log)(m);
    // A launcher that names the program's digest (the grid coordinator does) has it checked
    // here, on the host that runs it, before anything starts.
    // Only for the program it names (a rank may spawn another program with its environment).
    let named = program_digest(&program, ranks.first().map(|r| &r.env));
    // Where and as whom this job's ranks run (shared with its other sessions here).
    let lease = match cfg
        .sandbox
        .lease(crate::sandbox::job_key(ranks.first().map(|r| &r.env)))
    {
        Ok(l) => l,
        Err(e) => {
            let msg = format!("cannot prepare the job's directory or user: {e}");
            let _ = send(&Msg::Error { msg: msg.clone() });
            bail!("{peer}: {msg}");
        }
    };
    let mut program = program;
    let mut cwd = cwd;
    match (&cfg.programs, named) {
        (Some(src), Some(want)) => {
            // From the coordinator's repository (or this agent's cache), checked just now;
            // a job running as another user gets a copy of its own.
            let resolved = (src.resolve)(&want).and_then(|p| {
                if lease.account.is_some() {
                    lease.install_program(&p).map_err(|e| e.to_string())
                } else {
                    Ok(p)
                }
            });
            match resolved {
                Ok(p) => {
                    log(&format!(
                        "{peer}: {program:?} is {want}, run from {}",
                        p.display()
                    ));
                    program = p.display().to_string();
                }
                Err(e) => {
                    let msg = format!("{want}: {e}");
                    let _ = send(&Msg::Error { msg: msg.clone() });
                    bail!("{peer}: refused the launch: {msg}");
                }
            }
            // No shared file system on a grid: the job's own directory.
            cwd = Some(lease.dir.display().to_string());
        }
        (None, Some(want)) if program.starts_with("sha256:") => {
            let msg = format!(
                "the program is named by its digest {want}, but this agent fetches no programs (start it with --coordinator URL)"
            );
            let _ = send(&Msg::Error { msg: msg.clone() });
            bail!("{peer}: {msg}");
        }
        (None, Some(want)) => {
            if let Err(e) = verify_program(&program, cwd.as_deref(), &want) {
                let _ = send(&Msg::Error { msg: e.clone() });
                bail!("{peer}: {e}");
            }
        }
        (_, None) => {}
    }
    log(&format!(
        "{peer}: starting {program:?} as ranks {:?}",
        ranks.iter().map(|r| r.rank).collect::<Vec<_>>()
    ));
    let mut pids: Vec<i32> = Vec::new();
    let mut waiters = Vec::new();
    for spec in &ranks {
        let mut cmd = Command::new(&program);
        cmd.args(&args);
        // Nothing of the agent's environment: the launch's variables, PATH, HOME, TMPDIR.
        lease.prepare(&mut cmd, &spec.env);
        if let Some(sock) = dir_socket {
            // This host's directory, whatever the launcher's environment said.
            cmd.env("MUTIRAO_DIR_SOCKET", sock);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        if let Some(d) = &cwd {
            if Path::new(d).is_dir() {
                cmd.current_dir(d);
            }
        }
        let mut child = match crate::child::spawn(cmd) {
            Ok(c) => c,
            Err(e) => {
                kill_all(&pids, libc::SIGKILL);
                let who = match cfg.sandbox.run_as() {
                    crate::sandbox::RunAs::Agent => String::new(),
                    other => format!(
                        " (this agent runs jobs as another user — {}; that user must be able to run the program and enter its directory, or start the agent with --run-as)",
                        other.describe()
                    ),
                };
                let _ = send(&Msg::Error {
                    msg: format!("cannot start {program:?} for rank {}: {e}{who}", spec.rank),
                });
                bail!("{peer}: cannot start {program:?}: {e}");
            }
        };
        pids.push(child.id() as i32);
        cfg.procs.add(child.id() as i32);
        if let (Some(j), Some(label)) = (&cfg.journal, crate::journal::Label::of_env(&spec.env)) {
            j.started(label, spec.rank as u32, child.id() as i32);
        }
        send(&Msg::Started {
            rank: spec.rank,
            pid: child.id(),
        })?;
        let rank = spec.rank;
        let mut readers = Vec::new();
        for (stream, pipe) in [
            (
                Stream::Out,
                child
                    .stdout
                    .take()
                    .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
            ),
            (
                Stream::Err,
                child
                    .stderr
                    .take()
                    .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
            ),
        ] {
            let Some(pipe) = pipe else { continue };
            let w = w.clone();
            readers.push(std::thread::spawn(move || {
                // A long line goes as several pieces, never as one message too long for the
                // launcher to take.
                let mut lines = proto::LinePieces::new(pipe);
                while let Some(line) = lines.next_piece() {
                    let m = Msg::Output { rank, stream, line };
                    let sent = w.lock().map(|mut g| proto::write_msg(&mut *g, &m).is_ok());
                    if !matches!(sent, Ok(true)) {
                        break;
                    }
                }
            }));
        }
        let w = w.clone();
        let procs = cfg.procs.clone();
        let journal = cfg.journal.clone();
        let jlog = cfg.log.clone();
        let job = lease.clone();
        waiters.push(std::thread::spawn(move || {
            let st = child.wait();
            procs.remove(child.id() as i32);
            let (code, signal) = match st {
                Ok(s) => (s.code(), s.signal()),
                Err(_) => (None, None),
            };
            if let Some(j) = &journal {
                if let Err(e) = j.ended(child.id() as i32, code, signal) {
                    jlog(&format!("cannot journal the end of rank {rank}: {e:#}"));
                }
            }
            for t in readers {
                let _ = t.join();
            }
            // The job's last rank of its last session here: what its ranks left running ends
            // and its directory goes before the launcher hears of the exit.
            drop(job);
            if let Ok(mut g) = w.lock() {
                let _ = proto::write_msg(&mut *g, &Msg::Exit { rank, code, signal });
            }
        }));
    }
    if let Some(j) = &cfg.journal {
        if let Err(e) = j.save() {
            log(&format!("{peer}: cannot journal the ranks started: {e:#}"));
        }
    }
    // When every rank has ended, end our direction of the session (the read loop below drains
    // what the launcher still sends, then ends).
    let closer = conn.try_clone()?;
    let ended_w = ended.clone();
    drop(lease);
    std::thread::spawn(move || {
        for t in waiters {
            let _ = t.join();
        }
        ended_w.store(true, Ordering::SeqCst);
        // Only our direction: closing a socket with the launcher's unread heartbeats in it
        // would send a reset, which can make the launcher lose the exits just sent. The read
        // loop below drains until the launcher closes, or gives up after a short while.
        let _ = closer.set_read_timeout(Some(Duration::from_millis(500)));
        let _ = closer.shutdown(Shutdown::Write);
    });
    let mut drained_since: Option<std::time::Instant> = None;
    // The launcher's heartbeats awaited for HEARTBEAT_MISSES periods.
    // Listen for kill requests; a vanished launcher ends everything it started.
    r.get_ref().get_ref().get_ref().set_read_timeout(silence)?;
    loop {
        match proto::read_msg(&mut r) {
            Ok(Some(Msg::Kill { signal })) => {
                let sig = if signal == libc::SIGKILL {
                    libc::SIGKILL
                } else {
                    libc::SIGTERM
                };
                kill_all(&pids, sig);
                if sig == libc::SIGTERM {
                    // Ranks the owner's policy stopped act on SIGTERM only once continued.
                    kill_all(&pids, libc::SIGCONT);
                }
            }
            Ok(Some(_)) => {
                if ended.load(Ordering::SeqCst) {
                    let since = *drained_since.get_or_insert_with(std::time::Instant::now);
                    if since.elapsed() > Duration::from_secs(2) {
                        return Ok(());
                    }
                }
            }
            Ok(None) => {
                kill_all(&pids, libc::SIGKILL);
                return Ok(());
            }
            Err(e) => {
                kill_all(&pids, libc::SIGKILL);
                if !ended.load(Ordering::SeqCst) {
                    log(&format!(
                        "{peer}: the launcher went silent or its connection broke ({e}); killed its ranks"
                    ));
                }
                return Ok(());
            }
        }
    }
}

/// The rank variable naming the program's expected digest (`sha256:<64 hex>`): an agent
/// refuses to start a program whose content does not match it.
pub const PROGRAM_DIGEST_ENV: &str = "MUTIRAO_PROGRAM_DIGEST";
/// The program [`PROGRAM_DIGEST_ENV`] is the digest of (absent: whatever the launch runs).
pub const PROGRAM_DIGEST_OF_ENV: &str = "MUTIRAO_PROGRAM_DIGEST_OF";

/// The `sha256:<hex>` digest of the file at `path`, read in pieces.
pub fn file_digest(path: &Path) -> std::io::Result<String> {
    use sha2::{Digest, Sha256};
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(format!("sha256:{}", mutirao::pmi::hex(&h.finalize())))
}

/// Check that `program` (a path, relative to `cwd` if relative) has digest `want`; the error
/// says what to do.
pub fn verify_program(program: &str, cwd: Option<&str>, want: &str) -> Result<(), String> {
    if !program.contains('/') {
        return Err(format!(
            "cannot check {program:?} against its digest {want}: give the program as a path"
        ));
    }
    let p = match cwd {
        Some(d) if !Path::new(program).is_absolute() => Path::new(d).join(program),
        _ => PathBuf::from(program),
    };
    let have = file_digest(&p).map_err(|e| {
        format!(
            "cannot read {} to check it against its digest {want}: {e}",
            p.display()
        )
    })?;
    if !mutirao::wire::constant_time_eq(have.as_bytes(), want.trim().as_bytes()) {
        return Err(format!(
            "{} has digest {have}, not {want}: it was altered or corrupted after it was named; refusing to run it (upload and submit it again)",
            p.display()
        ));
    }
    Ok(())
}

fn kill_all(pids: &[i32], sig: i32) {
    for pid in pids {
        // SAFETY: kill(2) has no memory-safety preconditions; -pid addresses the process group
        // each child leads (process_group(0)). Signalling an already-reaped group is harmless
        // (ESRCH).
        unsafe {
            libc::kill(-*pid, sig);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_launch_names_its_program_by_digest_in_three_ways() {
        let hex = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        let d = format!("sha256:{hex}");
        // The program itself is a digest (a program of the coordinator's repository).
        assert_eq!(program_digest(&d, None), Some(d.clone()));
        // The launch's digest variable, for the program it names (or any, without _OF).
        let mut env = BTreeMap::new();
        env.insert(PROGRAM_DIGEST_ENV.to_string(), d.clone());
        assert_eq!(
            program_digest("/jobs/7/program", Some(&env)),
            Some(d.clone())
        );
        env.insert(PROGRAM_DIGEST_OF_ENV.to_string(), "/jobs/7/program".into());
        assert_eq!(
            program_digest("/jobs/7/program", Some(&env)),
            Some(d.clone())
        );
        assert_eq!(program_digest("/usr/bin/other", Some(&env)), None);
        // An agent's cached copy, named by a rank that spawns itself.
        let cached = format!("/var/agent/programs/sha256-{hex}");
        assert_eq!(program_digest(&cached, Some(&env)), Some(d.clone()));
        assert_eq!(program_digest("/var/agent/programs/sha256-xyz", None), None);
        assert_eq!(program_digest("./prog", None), None);
    }

    #[test]
    fn a_program_is_run_only_with_the_digest_it_was_named_by() {
        let d = std::env::temp_dir().join(format!("mutirao-agent-digest-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("prog");
        std::fs::write(&p, b"abc").unwrap();
        // sha256("abc")
        let abc = "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(file_digest(&p).unwrap(), abc);
        assert!(verify_program(p.to_str().unwrap(), None, abc).is_ok());
        assert!(verify_program("./prog", d.to_str(), abc).is_ok());
        std::fs::write(&p, b"abd").unwrap();
        let e = verify_program(p.to_str().unwrap(), None, abc).unwrap_err();
        assert!(e.contains("altered or corrupted") && e.contains(abc), "{e}");
        let e = verify_program("sh", None, abc).unwrap_err();
        assert!(e.contains("give the program as a path"), "{e}");
        let e = verify_program("/nonexistent/prog", None, abc).unwrap_err();
        assert!(e.contains("cannot read"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// An agent's configuration for tests: ranks run as the test's user, in job directories
    /// under `dir`.
    fn config(secret: &[u8], dir: &Path) -> AgentConfig {
        use crate::sandbox::{RunAs, Sandbox};
        AgentConfig {
            secret: Arc::new(secret.to_vec()),
            dir_socket: None,
            log: Arc::new(|_| {}),
            store: None,
            procs: Procs::default(),
            journal: None,
            programs: None,
            sandbox: Arc::new(Sandbox::new(RunAs::Agent, &dir.join("jobs")).unwrap()),
            limits: Limits::default(),
        }
    }

    /// Serve `cfg` on a loopback listener; returns its port.
    fn serve_on_loopback(cfg: AgentConfig) -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || serve_forever(listener, cfg));
        port
    }

    /// Run `sh -c script` as one rank through an agent on `port`; its output lines and exit.
    fn run_through(port: u16, secret: &[u8], script: &str) -> (Vec<String>, Option<Option<i32>>) {
        use crate::job::{Event, Job, JobSpec};
        let mut spec = JobSpec::local(1, "/bin/sh", vec!["-c".into(), script.into()]);
        spec.hosts = Some(vec![crate::hostfile::HostEntry {
            host: "127.0.0.1".into(),
            slots: 1,
            port,
        }]);
        spec.secret = Some(secret.to_vec());
        spec.env.insert("FROM_LAUNCH".into(), "yes".into());
        let job = Job::start(&spec).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let (mut out, mut exit) = (Vec::new(), None);
        while exit.is_none() && std::time::Instant::now() < deadline {
            match job.recv_timeout(Duration::from_millis(100)) {
                Ok(Event::Output { line, .. }) => out.push(line),
                Ok(Event::Exit { code, .. }) => exit = Some(code),
                Ok(Event::Started { .. }) => {}
                Ok(other) => out.push(format!("{other:?}")),
                Err(_) => {}
            }
        }
        (out, exit)
    }

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("mutirao-agent-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn after_the_handshake_only_sealed_messages_count() {
        use std::io::Write;
        let dir = scratch("sealed");
        let marker = dir.join("ran");
        let secret = [5u8; 32];
        let port = serve_on_loopback(config(&secret, &dir));
        // An honest handshake, then a launch written in the clear (what a relay that saw the
        // handshake could inject): the agent must not run it.
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let sess =
            crate::job::authenticate(BufReader::new(s.try_clone().unwrap()), s, &secret).unwrap();
        let mut raw = sess.writer.get_ref().try_clone().unwrap();
        let launch = Msg::Launch {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), format!("touch {}", marker.display())],
            cwd: None,
            ranks: vec![proto::RankSpec {
                rank: 0,
                env: BTreeMap::new(),
            }],
            heartbeat_ms: None,
        };
        let mut line = serde_json::to_vec(&launch).unwrap();
        line.push(b'\n');
        raw.write_all(&line).unwrap();
        // The agent closes the session (whatever it sends is sealed, never a plain event).
        let mut r = sess.reader.get_ref().get_ref().try_clone().unwrap();
        let mut got = Vec::new();
        let _ = std::io::Read::read_to_end(&mut r, &mut got);
        assert!(
            !String::from_utf8_lossy(&got).contains("\"op\""),
            "the agent answered in the clear: {got:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
        assert!(!marker.exists(), "a launch sent in the clear was run");
        // The same launch, sealed, runs: the refusal was about the framing alone.
        let (out, exit) = run_through(port, &secret, &format!("touch {}", marker.display()));
        assert_eq!(exit, Some(Some(0)), "{out:#?}");
        assert!(marker.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_checkpoint_session_sees_only_its_own_job_s_scope() {
        use mutirao_ckpt::remote::RemoteStore;
        use mutirao_ckpt::BlobStore;
        let dir = scratch("scopes");
        let secret = [9u8; 32];
        let mut cfg = config(&secret, &dir);
        cfg.store = Some(Arc::new(
            mutirao_ckpt::DirStore::open(dir.join("store")).unwrap(),
        ));
        let port = serve_on_loopback(cfg);
        let host = crate::hostfile::parse(&format!("127.0.0.1 port={port}")).unwrap()[0].clone();
        let session = |scope: String| {
            let h = host.clone();
            RemoteStore::new("agent", move || {
                crate::store::connect_store(&h, &secret, &scope)
            })
        };
        // Two jobs, each with its own checkpoint key; a third session holds the agent token
        // but not job A's key, so it can only guess a scope.
        let a = session(proto::checkpoint_scope(&[1; 32], "job-a"));
        let b = session(proto::checkpoint_scope(&[2; 32], "job-a"));
        a.put("jobs/job-a/1/0.ckpt", b"a's blob").unwrap();
        assert_eq!(b.list("").unwrap(), Vec::<String>::new());
        assert_eq!(b.get("jobs/job-a/1/0.ckpt").unwrap(), None);
        b.put("jobs/job-a/1/0.ckpt", b"forged").unwrap();
        b.delete("jobs/job-a/1/0.ckpt").unwrap();
        assert_eq!(a.get("jobs/job-a/1/0.ckpt").unwrap().unwrap(), b"a's blob");
        assert_eq!(a.list("").unwrap(), vec!["jobs/job-a/1/0.ckpt".to_string()]);
        // Scopes are 64 hex digits: no path, no escape.
        for bad in [
            "..".to_string(),
            "a/b".into(),
            "A".repeat(64),
            String::new(),
        ] {
            let e = session(bad.clone()).list("").unwrap_err().to_string();
            assert!(e.contains("scope"), "{bad:?}: {e}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_rank_gets_none_of_the_agent_s_environment() {
        let dir = scratch("env");
        let secret = [3u8; 32];
        let port = serve_on_loopback(config(&secret, &dir));
        let (out, exit) = run_through(port, &secret, "env; pwd");
        assert_eq!(exit, Some(Some(0)), "{out:#?}");
        let pwd = out.last().cloned().unwrap_or_default();
        let names: Vec<&str> = out[..out.len() - 1]
            .iter()
            .filter_map(|l| l.split('=').next())
            .collect();
        for n in &names {
            assert!(
                ["PATH", "HOME", "TMPDIR", "FROM_LAUNCH"].contains(n)
                    || n.starts_with("MUTIRAO_")
                    || n.starts_with("OMPI_")
                    || n.starts_with("PMI_")
                    // The shell's own.
                    || ["PWD", "SHLVL", "_", "OLDPWD"].contains(n),
                "the rank inherited {n} from the agent: {out:#?}"
            );
        }
        assert!(names.contains(&"FROM_LAUNCH"), "{out:#?}");
        // The test process (the agent here) has CARGO_* variables; the rank must not.
        assert!(std::env::vars().any(|(k, _)| k.starts_with("CARGO")));
        let home = out
            .iter()
            .find_map(|l| l.strip_prefix("HOME="))
            .unwrap_or_default()
            .to_string();
        assert!(home.contains("/jobs/job-"), "{home}");
        assert!(
            !Path::new(&home).exists(),
            "the job's directory outlived it"
        );
        assert!(!pwd.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_rank_printing_10_mb_without_a_newline_still_exits_0() {
        let dir = scratch("longline");
        let secret = [4u8; 32];
        let port = serve_on_loopback(config(&secret, &dir));
        let (out, exit) = run_through(
            port,
            &secret,
            "head -c 10000000 /dev/zero | tr '\\0' x; head -c 800000 /dev/zero | tr '\\0' '\\001'",
        );
        assert_eq!(
            exit,
            Some(Some(0)),
            "{:?}",
            out.iter().filter(|l| l.len() < 200).collect::<Vec<_>>()
        );
        let xs: usize = out
            .iter()
            .map(|l| l.bytes().filter(|b| *b == b'x').count())
            .sum();
        let ctl: usize = out
            .iter()
            .map(|l| l.bytes().filter(|b| *b == 1).count())
            .sum();
        assert_eq!((xs, ctl), (10_000_000, 800_000));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_handshake_sent_a_byte_at_a_time_is_cut_at_the_deadline() {
        use std::io::{Read, Write};
        let dir = scratch("slowloris");
        let port = serve_on_loopback(config(&[5u8; 32], &dir));
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(900)))
            .unwrap();
        let t0 = std::time::Instant::now();
        let mut buf = [0u8; 4096];
        let mut closed = false;
        // One byte a second, for at most 12 s; the agent must close within its 5 s.
        for _ in 0..12 {
            if s.write_all(b"{").is_err() {
                closed = true;
                break;
            }
            match s.read(&mut buf) {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Err(e)
                    if e.kind() != std::io::ErrorKind::WouldBlock
                        && e.kind() != std::io::ErrorKind::TimedOut =>
                {
                    closed = true;
                    break;
                }
                _ => {}
            }
        }
        let took = t0.elapsed();
        assert!(closed, "still open after {took:?}");
        assert!(took < Duration::from_secs(7), "closed only after {took:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_unauthenticated_line_over_4_kib_is_refused_at_once() {
        use std::io::{BufRead, Read, Write};
        let dir = scratch("bigline");
        let port = serve_on_loopback(config(&[6u8; 32], &dir));
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(4))).unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut challenge = String::new();
        r.read_line(&mut challenge).unwrap();
        assert!(challenge.contains("challenge"), "{challenge}");
        let t0 = std::time::Instant::now();
        // 8 KiB of one unended line: refused without waiting for more.
        let _ = s.write_all(&[b'a'; 8192]);
        let mut rest = String::new();
        let _ = r.read_to_string(&mut rest);
        assert!(rest.contains("malformed request"), "{rest:?}");
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn connections_over_the_handshake_cap_are_closed_and_a_launcher_still_gets_in_later() {
        use std::io::Read;
        let dir = scratch("cap");
        let secret = [8u8; 32];
        let mut cfg = config(&secret, &dir);
        cfg.limits = Limits {
            handshaking: 4,
            sessions: 16,
            handshake: Duration::from_secs(2),
        };
        let port = serve_on_loopback(cfg);
        let idle: Vec<TcpStream> = (0..4)
            .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
            .collect();
        std::thread::sleep(Duration::from_millis(200));
        let mut over = TcpStream::connect(("127.0.0.1", port)).unwrap();
        over.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let mut buf = [0u8; 256];
        assert_eq!(
            over.read(&mut buf).map_err(|e| e.kind()),
            Ok(0),
            "a fifth handshake at once must be closed without a challenge"
        );
        // The idle ones are cut at their deadline; then launches work again.
        std::thread::sleep(Duration::from_millis(2500));
        drop(idle);
        let (out, exit) = run_through(port, &secret, "echo in");
        assert_eq!(exit, Some(Some(0)), "{out:#?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn two_agents_on_one_address_are_two_hosts_to_the_launcher() {
        use crate::job::{Event, Job, JobSpec};
        let dir = scratch("twohosts");
        let secret = [9u8; 32];
        let ports = [
            serve_on_loopback(config(&secret, &dir.join("a"))),
            serve_on_loopback(config(&secret, &dir.join("b"))),
        ];
        let mut spec = JobSpec::local(2, "/bin/true", vec![]);
        spec.hosts = Some(
            ports
                .iter()
                .map(|&port| crate::hostfile::HostEntry {
                    host: "127.0.0.1".into(),
                    slots: 1,
                    port,
                })
                .collect(),
        );
        spec.secret = Some(secret.to_vec());
        let job = Job::start(&spec).unwrap();
        assert_eq!(
            job.hosts_of(),
            ports.map(|p| format!("127.0.0.1:{p}")).as_slice()
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let mut exits = 0;
        while exits < 2 && std::time::Instant::now() < deadline {
            if let Ok(Event::Exit { .. }) = job.recv_timeout(Duration::from_millis(100)) {
                exits += 1;
            }
        }
        assert_eq!(exits, 2);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_agent_fetching_its_program_longer_than_the_heartbeat_silence_is_not_lost() {
        use crate::job::{Event, Job, JobSpec};
        let secret = vec![7u8; 32];
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let run_dir =
            std::env::temp_dir().join(format!("mutirao-agent-slowfetch-{}", std::process::id()));
        let mut cfg = config(&secret, &run_dir);
        // A fetch of 1.5 s: three times the launcher's patience with a silent agent.
        cfg.programs = Some(ProgramSource {
            resolve: Arc::new(|_| {
                std::thread::sleep(Duration::from_millis(1500));
                Ok(PathBuf::from("/bin/sh"))
            }),
        });
        std::thread::spawn(move || {
            if let Ok((conn, _)) = listener.accept() {
                let _ = serve(conn, &cfg);
            }
        });
        let mut spec = JobSpec::local(
            1,
            "/grid/job/program",
            vec!["-c".into(), "echo fetched".into()],
        );
        spec.hosts = Some(vec![crate::hostfile::HostEntry {
            host: "127.0.0.1".into(),
            slots: 1,
            port,
        }]);
        spec.secret = Some(secret);
        spec.heartbeat = Some(Duration::from_millis(100));
        spec.env.insert(
            PROGRAM_DIGEST_ENV.into(),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad".into(),
        );
        let job = Job::start(&spec).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let (mut out, mut exit) = (Vec::new(), None);
        while exit.is_none() && std::time::Instant::now() < deadline {
            match job.recv_timeout(Duration::from_millis(100)) {
                Ok(Event::Output { line, .. }) => out.push(line),
                Ok(Event::Exit { code, .. }) => exit = Some(code),
                Ok(other) => out.push(format!("{other:?}")),
                Err(_) => {}
            }
        }
        let _ = std::fs::remove_dir_all(&run_dir);
        assert_eq!(exit, Some(Some(0)), "{out:#?}");
        assert!(out.iter().any(|l| l == "fetched"), "{out:#?}");
    }
}
