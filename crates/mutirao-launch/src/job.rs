//! One incarnation of a job: N ranks started on this host or through the agents of a hostfile,
//! with a bootstrap (PMI) server, seen as a stream of [`Event`]s. Nothing here prints or
//! installs signal handlers; [`crate::supervise`] decides what an event means.

use crate::hostfile::{self, HostEntry};
use crate::proto::{self, Msg, RankSpec, Stream};
use anyhow::{bail, Context};
use mutirao::pmi::{
    hex, new_token, CheckpointSink, FailureReport, PmiServer, SpawnRequest, SpawnedProc, Spawner,
};
use std::collections::{BTreeMap, HashMap};
use std::io::BufReader;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What `--bind-to` pins each rank to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum BindTo {
    /// Leave placement to the kernel.
    #[default]
    None,
    /// One core per rank (shared when ranks outnumber cores).
    Core,
}

impl BindTo {
    fn env(self) -> &'static str {
        match self {
            BindTo::None => "none",
            BindTo::Core => "core",
        }
    }
}

/// Everything needed to start one incarnation of a job.
#[derive(Clone)]
pub struct JobSpec {
    /// Number of ranks.
    pub n: usize,
    /// The program and its arguments.
    pub program: String,
    pub args: Vec<String>,
    /// The hosts to run on through their agents; `None`: every rank on this host.
    pub hosts: Option<Vec<HostEntry>>,
    /// Rank → index into `hosts`; `None`: [`hostfile::place`] over the hosts not in `exclude`.
    pub placement: Option<Vec<usize>>,
    /// Hosts (indices into `hosts`) not to use: lost or failed in an earlier incarnation.
    pub exclude: Vec<usize>,
    /// The agents' shared secret (needed with `hosts`).
    pub secret: Option<Vec<u8>>,
    pub bind_to: BindTo,
    /// Environment remote ranks get besides their rank variables (local ranks inherit this
    /// process's environment, plus these).
    pub env: BTreeMap<String, String>,
    /// How long the bootstrap server waits for every rank at a fence (at most; see
    /// [`effective_fence_timeout`]).
    pub fence_timeout: Duration,
    /// The checkpoint store the bootstrap server hands the ranks' checkpoints to.
    pub checkpoints: Option<Arc<dyn CheckpointSink>>,
    /// Heartbeat period with agents (a silent agent is lost after
    /// [`proto::launcher_silence`], 2.5 periods); `None` disables heartbeats.
    pub heartbeat: Option<Duration>,
    /// Local runs: host a resource directory for the job unless `MUTIRAO_DIR_SOCKET` is set.
    pub host_directory: bool,
    /// The ranks' working directory (default: this process's; agents use it when it exists
    /// on their host).
    pub cwd: Option<PathBuf>,
}

impl std::fmt::Debug for JobSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobSpec")
            .field("n", &self.n)
            .field("program", &self.program)
            .field("args", &self.args)
            .field("hosts", &self.hosts)
            .field("exclude", &self.exclude)
            .finish_non_exhaustive()
    }
}

impl JobSpec {
    /// `n` ranks of `program args` on this host, with the defaults of `mutirao run`.
    pub fn local(n: usize, program: impl Into<String>, args: Vec<String>) -> JobSpec {
        JobSpec {
            n,
            program: program.into(),
            args,
            hosts: None,
            placement: None,
            exclude: Vec::new(),
            secret: None,
            bind_to: BindTo::None,
            env: BTreeMap::new(),
            fence_timeout: Duration::from_secs(120),
            checkpoints: None,
            heartbeat: Some(Duration::from_secs(1)),
            host_directory: true,
            cwd: None,
        }
    }

    /// Rank → host index for this incarnation (all zeros when local).
    pub fn placement(&self) -> anyhow::Result<Vec<usize>> {
        let Some(hosts) = &self.hosts else {
            return Ok(vec![0; self.n]);
        };
        if let Some(p) = &self.placement {
            if p.len() != self.n || p.iter().any(|&h| h >= hosts.len()) {
                bail!(
                    "the placement names {} ranks or a host beyond the {} of the hostfile",
                    p.len(),
                    hosts.len()
                );
            }
            return Ok(p.clone());
        }
        let usable: Vec<usize> = (0..hosts.len())
            .filter(|i| !self.exclude.contains(i))
            .collect();
        if usable.is_empty() {
            bail!(
                "no host of the hostfile is left to run on ({} excluded after failures)",
                self.exclude.len()
            );
        }
        let sub: Vec<HostEntry> = usable.iter().map(|&i| hosts[i].clone()).collect();
        Ok(hostfile::place(&sub, self.n)
            .into_iter()
            .map(|k| usable[k])
            .collect())
    }
}

/// What happens to a running job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A line a rank wrote (without its newline).
    Output {
        rank: usize,
        stream: Stream,
        line: String,
    },
    /// An agent started a rank.
    Started { rank: usize },
    /// A rank ended: its exit code, or the signal that killed it.
    Exit {
        rank: usize,
        code: Option<i32>,
        signal: Option<i32>,
    },
    /// An agent's session ended or went silent (host index, why). An agent closes its session
    /// once all its ranks have ended: that alone is no failure.
    HostLost { host: usize, why: String },
    /// An agent answered the launch with an error (it refused to run the program, e.g. a
    /// cached copy that no longer matches its digest, or could not start it) and closed the
    /// session: the host is alive, its ranks will not run (host index, why).
    Refused { host: usize, why: String },
}

/// How to end ranks, local or remote: the process groups this launcher started (ranks and
/// spawned children, removed when they are reaped) and the agent sessions.
#[derive(Default, Clone)]
struct Group {
    local: Arc<Mutex<Vec<u32>>>,
    remote: Arc<Mutex<Vec<Arc<Mutex<proto::SessionWriter>>>>>,
}

impl Group {
    fn signal(&self, sig: i32) {
        if let Ok(pids) = self.local.lock() {
            for pid in pids.iter() {
                // SAFETY: kill(2) has no memory-safety preconditions; the negative pid
                // addresses the process group the child leads (process_group(0)); pids leave
                // this list when they are reaped, so no reused pid is signalled.
                unsafe {
                    libc::kill(-(*pid as i32), sig);
                }
            }
        }
        if let Ok(conns) = self.remote.lock() {
            for c in conns.iter() {
                if let Ok(mut s) = c.lock() {
                    let _ = proto::write_msg(&mut *s, &Msg::Kill { signal: sig });
                }
            }
        }
    }

    fn add_local(&self, pid: u32) {
        if let Ok(mut v) = self.local.lock() {
            v.push(pid);
        }
    }

    fn reaped(&self, pid: u32) {
        if let Ok(mut v) = self.local.lock() {
            v.retain(|p| *p != pid);
        }
    }

    fn add_remote(&self, w: Arc<Mutex<proto::SessionWriter>>) {
        if let Ok(mut v) = self.remote.lock() {
            v.push(w);
        }
    }

    /// Close every agent session (the agents kill what they still run).
    fn close_remote(&self) {
        if let Ok(conns) = self.remote.lock() {
            for c in conns.iter() {
                if let Ok(s) = c.lock() {
                    let _ = s.get_ref().shutdown(std::net::Shutdown::Both);
                }
            }
        }
    }
}

/// A started incarnation. Dropping it stops heartbeats and removes the job's temporary files
/// (shared-memory rings, the job directory); end the ranks first ([`Job::signal`]).
pub struct Job {
    /// `PID-TOKENPREFIX`: names the job's rings and temporary directory.
    pub id: String,
    rx: Receiver<Event>,
    group: Group,
    hosts_of: Vec<String>,
    placement: Vec<usize>,
    pmi: PmiServer,
    job_dir: Option<PathBuf>,
    local: bool,
    stop: Arc<AtomicBool>,
    started: Instant,
    spawner: Arc<JobSpawner>,
}

impl Job {
    /// Start every rank of `spec`. On error nothing is left running.
    pub fn start(spec: &JobSpec) -> anyhow::Result<Job> {
        if spec.n == 0 {
            bail!("a job needs at least one rank");
        }
        if spec.program.is_empty() {
            bail!("no program to run");
        }
        let token_bytes = new_token().context("cannot make a job token")?;
        let token = hex(&token_bytes);
        let id = format!("{}-{}", std::process::id(), &token[..8]);
        let (tx, rx) = channel::<Event>();
        let stop = Arc::new(AtomicBool::new(false));
        let placement = spec.placement()?;
        let started = Instant::now();
        let group = Group::default();
        let local = spec.hosts.is_none();
        let job_dir =
            if local && spec.host_directory && std::env::var_os("MUTIRAO_DIR_SOCKET").is_none() {
                Some(host_directory(&id)?)
            } else {
                None
            };
        let undo = |job_dir: &Option<PathBuf>| {
            if let Some(d) = job_dir {
                let _ = std::fs::remove_dir_all(d);
            }
            cleanup_shm(&id);
        };
        let mut load = vec![0usize; spec.hosts.as_ref().map_or(1, Vec::len)];
        for &h in &placement {
            load[h] += 1;
        }
        let spawner = Arc::new(JobSpawner {
            tx: Mutex::new(Some(tx.clone())),
            group: group.clone(),
            hosts: spec.hosts.clone(),
            exclude: spec.exclude.clone(),
            secret: spec.secret.clone(),
            env: spec.env.clone(),
            bind_to: spec.bind_to,
            heartbeat: spec.heartbeat,
            dir_socket: job_dir.as_ref().map(|d| d.join(DIR_SOCKET_NAME)),
            load: Mutex::new(load),
            members: Mutex::new(HashMap::new()),
            names: Mutex::new(BTreeMap::new()),
            stop: stop.clone(),
        });
        let ctx = Ctx {
            tx: &tx,
            group: &group,
            stop: &stop,
        };
        let (hosts_of, pmi) = match &spec.hosts {
            None => {
                let pmi = start_pmi(
                    spec,
                    "127.0.0.1:0".parse().expect("literal"),
                    token_bytes,
                    spawner.clone(),
                )
                .context("cannot start the bootstrap server on 127.0.0.1");
                let pmi = match pmi {
                    Ok(p) => p,
                    Err(e) => {
                        undo(&job_dir);
                        return Err(e);
                    }
                };
                let dir_socket = job_dir.as_ref().map(|d| d.join(DIR_SOCKET_NAME));
                if let Err(e) =
                    start_local(spec, pmi.addr(), &token, &id, dir_socket.as_deref(), &ctx)
                {
                    undo(&job_dir);
                    return Err(e);
                }
                (vec!["localhost".to_string(); spec.n], pmi)
            }
            Some(hosts) => start_remote(
                spec,
                hosts,
                &placement,
                token_bytes,
                &token,
                &id,
                &ctx,
                spawner.clone(),
            )?,
        };
        Ok(Job {
            id,
            rx,
            group,
            hosts_of,
            placement,
            pmi,
            job_dir,
            local,
            stop,
            started,
            spawner,
        })
    }

    /// A spawned rank ended: tell the bootstrap server (a spawn still in progress then fails at
    /// once); returns the host it ran on.
    pub fn spawned_exited(&self, rank: usize, why: &str) -> String {
        self.pmi.spawned_exited(rank as u32, why);
        self.spawner.forget(rank)
    }

    /// No more spawns: the event stream ends once the running processes have ended.
    pub fn stop_spawning(&self) {
        if let Ok(mut t) = self.spawner.tx.lock() {
            t.take();
        }
    }

    /// The next event, waiting at most `d`.
    pub fn recv_timeout(&self, d: Duration) -> Result<Event, RecvTimeoutError> {
        self.rx.recv_timeout(d)
    }

    /// Send `sig` to every rank (through the agents for remote ranks; agents turn anything but
    /// SIGKILL into SIGTERM).
    pub fn signal(&self, sig: i32) {
        self.group.signal(sig);
    }

    /// Tell ranks waiting at the bootstrap server that the job is ending.
    pub fn fail(&self, why: &str) {
        self.pmi.fail(why);
    }

    /// No checkpoint commit of this job lands after this returns (see
    /// [`PmiServer::fence_checkpoints`]).
    pub fn fence_checkpoints(&self) {
        self.pmi.fence_checkpoints();
    }

    /// The ranks that never reached a fence, once one timed out (see
    /// [`PmiServer::fence_missing`]).
    pub fn fence_missing(&self) -> Option<Vec<usize>> {
        self.pmi.fence_missing()
    }

    /// The job goes on without `ranks` (their host was lost under `--continue-on-failure`):
    /// the other ranks learn it when they next wait, and fail their operations on them
    /// ([`PmiServer::peers_lost`]).
    pub fn peers_lost(&self, ranks: &[usize]) {
        let r: Vec<u32> = ranks.iter().map(|&r| r as u32).collect();
        self.pmi.peers_lost(&r);
    }

    /// Channel failures ranks reported since the last call.
    pub fn take_failures(&self) -> Vec<FailureReport> {
        self.pmi.take_failures()
    }

    /// Per rank, the start-up phases it reported in the connection barrier (`None` until it
    /// gets there; see [`mutirao::pmi::PmiServer::init_phases`]).
    pub fn init_phases(&self) -> Vec<Option<mutirao::pmi::InitPhases>> {
        self.pmi.init_phases()
    }

    /// The host name of every rank.
    pub fn hosts_of(&self) -> &[String] {
        &self.hosts_of
    }

    /// Rank → index of its host in the hostfile (all zeros when local).
    pub fn placement(&self) -> &[usize] {
        &self.placement
    }

    /// When the job was started.
    pub fn started(&self) -> Instant {
        self.started
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Whatever still runs (spawned children the ranks did not wait for) ends with the job.
        self.group.signal(libc::SIGKILL);
        self.group.close_remote();
        if self.local {
            cleanup_shm(&self.id);
        }
        if let Some(d) = &self.job_dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// The bootstrap server's fence timeout for `spec`: `spec.fence_timeout`, but no more than 80 %
/// of the ranks' own start-up timeout (`MUTIRAO_CONNECT_TIMEOUT_S` of `spec.env`, else of this
/// process's environment, which local ranks inherit; 60 s by default). A rank that never
/// reaches the barrier is then reported by the launcher's answer to the others, naming it
/// ("timed out after … waiting for ranks [1] to reach the fence"), before they give up on a bare
/// read timeout of their own.
pub fn effective_fence_timeout(spec: &JobSpec) -> Duration {
    const VAR: &str = "MUTIRAO_CONNECT_TIMEOUT_S";
    let ranks = spec
        .env
        .get(VAR)
        .cloned()
        .or_else(|| std::env::var(VAR).ok())
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(60);
    spec.fence_timeout
        .min(Duration::from_secs(ranks).mul_f64(0.8))
}

/// The bootstrap server, with the checkpoint store when checkpoints are on.
fn start_pmi(
    spec: &JobSpec,
    bind: SocketAddr,
    token: [u8; 32],
    spawner: Arc<JobSpawner>,
) -> std::io::Result<PmiServer> {
    let fence = effective_fence_timeout(spec);
    let mut b = PmiServer::builder(bind, spec.n as u32, token, fence).spawner(spawner);
    if let Some(sink) = &spec.checkpoints {
        b = b.checkpoints(sink.clone());
    }
    b.start()
}

/// Where a rank runs: the address it listens on, and its place among its host's ranks.
struct Place<'a> {
    bind: &'a str,
    /// Ranks on its host.
    local: usize,
    /// Its index among them.
    local_rank: usize,
    bind_to: BindTo,
}

fn rank_env(
    rank: usize,
    size: usize,
    pmi: SocketAddr,
    token: &str,
    job: &str,
    place: Place<'_>,
) -> BTreeMap<String, String> {
    let Place {
        bind,
        local,
        local_rank,
        bind_to,
    } = place;
    let mut env = BTreeMap::new();
    let r = rank.to_string();
    let s = size.to_string();
    for (k, v) in [
        ("MUTIRAO_RANK", &r),
        ("MUTIRAO_SIZE", &s),
        ("OMPI_COMM_WORLD_RANK", &r),
        ("OMPI_COMM_WORLD_SIZE", &s),
        ("PMI_RANK", &r),
        ("PMI_SIZE", &s),
    ] {
        env.insert(k.to_string(), v.clone());
    }
    env.insert("MUTIRAO_PMI_ADDR".into(), pmi.to_string());
    env.insert("MUTIRAO_JOB_TOKEN".into(), token.to_string());
    env.insert("MUTIRAO_JOB_ID".into(), job.to_string());
    env.insert("MUTIRAO_BIND".into(), bind.to_string());
    env.insert("MUTIRAO_LOCAL_RANKS".into(), local.to_string());
    env.insert("MUTIRAO_LOCAL_RANK".into(), local_rank.to_string());
    env.insert("MUTIRAO_BIND_TO".into(), bind_to.env().to_string());
    env
}

/// How often a rank on an agent, while it waits, asks the launcher which ranks it has declared
/// lost (`MUTIRAO_LOST_POLL_MS`, a quarter of the heartbeat period, at least 20 ms): with the
/// launcher's silence limit ([`proto::launcher_silence`]), operations on the ranks of a host
/// that vanished fail within 3 heartbeat periods of its last sign of life.
fn lost_poll_env(heartbeat: Option<Duration>) -> Option<(String, String)> {
    let p = heartbeat?;
    let ms = (p.as_millis() / 4).max(20);
    Some(("MUTIRAO_LOST_POLL_MS".into(), ms.to_string()))
}

const DIR_SOCKET_NAME: &str = "dir.sock";

/// Starts a directory server for the job on `TMPDIR/mutirao-JOB/dir.sock` (the directory is
/// private to this user) and returns the job's temporary directory once it serves. The server
/// thread ends with the launcher; the caller removes the directory.
fn host_directory(job: &str) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = std::env::temp_dir().join(format!("mutirao-{job}"));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("cannot create the job directory {}", dir.display()))?;
    let sock = dir.join(DIR_SOCKET_NAME);
    let (ready_tx, ready_rx) = channel();
    std::thread::Builder::new()
        .name("job-directory".into())
        .spawn(move || {
            let tx = ready_tx.clone();
            let res = mutirao_dir::server::run_blocking(
                mutirao_dir::server::ServerConfig::default(),
                Some(sock),
                None,
                move |_| {
                    let _ = tx.send(Ok(()));
                },
            );
            if let Err(e) = res {
                let _ = ready_tx.send(Err(e.to_string()));
            }
        })?;
    match ready_rx.recv_timeout(Duration::from_secs(10)) {
        Ok(Ok(())) => Ok(dir),
        Ok(Err(e)) => {
            let _ = std::fs::remove_dir_all(&dir);
            bail!("cannot start the job's directory: {e} (set MUTIRAO_DIR_SOCKET to use another)")
        }
        Err(_) => {
            let _ = std::fs::remove_dir_all(&dir);
            bail!("the job's directory did not start within 10 s")
        }
    }
}

fn cleanup_shm(job: &str) {
    let prefix = format!("mutirao-{job}-");
    if let Ok(dir) = std::fs::read_dir("/dev/shm") {
        for e in dir.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

fn forward(rank: usize, stream: Stream, r: impl std::io::Read + Send + 'static, tx: Sender<Event>) {
    std::thread::spawn(move || {
        // Long lines as pieces, as agents send them: memory stays bounded.
        let mut lines = proto::LinePieces::new(r);
        while let Some(line) = lines.next_piece() {
            if tx.send(Event::Output { rank, stream, line }).is_err() {
                break;
            }
        }
    });
}

/// What starting processes needs from the job: its event stream, its process groups, its stop
/// flag.
struct Ctx<'a> {
    tx: &'a Sender<Event>,
    group: &'a Group,
    stop: &'a Arc<AtomicBool>,
}

/// Start one process on this host as world rank `rank`, its output and exit as events.
#[allow(clippy::too_many_arguments)]
fn start_one_local(
    program: &str,
    args: &[String],
    env: &BTreeMap<String, String>,
    cwd: Option<&Path>,
    dir_socket: Option<&Path>,
    rank: usize,
    tx: &Sender<Event>,
    group: &Group,
) -> anyhow::Result<u32> {
    let mut cmd = Command::new(program);
    if let Some(sock) = dir_socket {
        cmd.env("MUTIRAO_DIR_SOCKET", sock);
    }
    if let Some(d) = cwd {
        cmd.current_dir(d);
    }
    cmd.args(args)
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // Tied to this process: a launcher that dies, even by SIGKILL, takes its ranks with it.
    let mut child = crate::child::spawn(cmd).map_err(|e| {
        anyhow::anyhow!(
            "cannot start {program:?} for rank {rank}: {e} (is the path right and the file executable?)"
        )
    })?;
    let pid = child.id();
    group.add_local(pid);
    if let Some(o) = child.stdout.take() {
        forward(rank, Stream::Out, o, tx.clone());
    }
    if let Some(e) = child.stderr.take() {
        forward(rank, Stream::Err, e, tx.clone());
    }
    let txc = tx.clone();
    let group = group.clone();
    std::thread::spawn(move || {
        let st = child.wait();
        group.reaped(pid);
        let (code, signal) = match st {
            Ok(s) => (s.code(), s.signal()),
            Err(_) => (None, None),
        };
        let _ = txc.send(Event::Exit { rank, code, signal });
    });
    Ok(pid)
}

fn start_local(
    spec: &JobSpec,
    pmi: SocketAddr,
    token: &str,
    job: &str,
    dir_socket: Option<&Path>,
    ctx: &Ctx<'_>,
) -> anyhow::Result<()> {
    for rank in 0..spec.n {
        let place = Place {
            bind: "127.0.0.1",
            local: spec.n,
            local_rank: rank,
            bind_to: spec.bind_to,
        };
        let mut env = spec.env.clone();
        env.extend(rank_env(rank, spec.n, pmi, token, job, place));
        if let Err(e) = start_one_local(
            &spec.program,
            &spec.args,
            &env,
            spec.cwd.as_deref(),
            dir_socket,
            rank,
            ctx.tx,
            ctx.group,
        ) {
            // End what already started, then report.
            ctx.group.signal(libc::SIGKILL);
            return Err(e);
        }
    }
    Ok(())
}

/// Connect to an agent and authenticate; returns the writer, the reader and the address.
fn connect_agent(
    h: &HostEntry,
    secret: &[u8],
) -> anyhow::Result<(proto::SessionWriter, SessionReader, SocketAddr)> {
    let addr = (h.host.as_str(), h.port)
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve host {:?}", h.host))?
        .next()
        .with_context(|| format!("host {:?} has no address", h.host))?;
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).with_context(|| {
        format!(
            "cannot reach the agent of {} at {addr}: is `mutirao agent --listen {addr}` running there?",
            h.host
        )
    })?;
    s.set_nodelay(true).ok();
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let r = BufReader::new(s.try_clone()?);
    let sess =
        authenticate(r, s, secret).with_context(|| format!("agent of {} at {addr}", h.host))?;
    Ok((sess.writer, sess.reader, addr))
}

/// Send a launch on an authenticated agent session and turn the session into events: output,
/// starts and exits; heartbeats both ways. When the session of `spawned` children ends, the
/// children without an exit are reported as ended; when a rank session ends, the host is lost.
#[allow(clippy::too_many_arguments)]
fn run_session(
    (mut w, mut r): (proto::SessionWriter, SessionReader),
    host_index: usize,
    host: &str,
    launch: Msg,
    ranks: Vec<usize>,
    spawned: bool,
    heartbeat: Option<Duration>,
    ctx: &Ctx<'_>,
) -> anyhow::Result<Arc<Mutex<proto::SessionWriter>>> {
    proto::write_msg(&mut w, &launch)
        .with_context(|| format!("cannot send the job to the agent of {host}"))?;
    let silence = heartbeat.map(proto::launcher_silence);
    r.get_ref().get_ref().set_read_timeout(silence).ok();
    let w = Arc::new(Mutex::new(w));
    let session = w.clone();
    ctx.group.add_remote(w.clone());
    let txc = ctx.tx.clone();
    let host = host.to_string();
    std::thread::spawn(move || {
        let mut ended: Vec<usize> = Vec::new();
        let mut refused = false;
        let why = loop {
            match proto::read_msg(&mut r) {
                Ok(Some(Msg::Output { rank, stream, line })) => {
                    let _ = txc.send(Event::Output { rank, stream, line });
                }
                Ok(Some(Msg::Started { rank, .. })) => {
                    let _ = txc.send(Event::Started { rank });
                }
                Ok(Some(Msg::Exit { rank, code, signal })) => {
                    ended.push(rank);
                    let _ = txc.send(Event::Exit { rank, code, signal });
                }
                Ok(Some(Msg::Error { msg })) => {
                    refused = true;
                    break format!("agent of {host}: {msg}");
                }
                Ok(Some(_)) => {}
                Ok(None) => break format!("agent of {host} closed the connection"),
                Err(e) if e.contains("timed out") || e.contains("temporarily unavailable") => {
                    break format!(
                        "agent of {host} sent no heartbeat for {:.1} s (host down or unreachable)",
                        silence.unwrap_or_default().as_secs_f64()
                    )
                }
                Err(e) => break format!("agent of {host}: {e}"),
            }
        };
        if spawned {
            for rank in ranks.into_iter().filter(|r| !ended.contains(r)) {
                let _ = txc.send(Event::Output {
                    rank,
                    stream: Stream::Err,
                    line: format!("mutirao: spawned rank {rank}: {why}"),
                });
                let _ = txc.send(Event::Exit {
                    rank,
                    code: None,
                    signal: None,
                });
            }
        } else if refused {
            let _ = txc.send(Event::Refused {
                host: host_index,
                why,
            });
        } else {
            let _ = txc.send(Event::HostLost {
                host: host_index,
                why,
            });
        }
    });
    if let Some(period) = heartbeat {
        let stop = ctx.stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(period);
                let Ok(mut g) = w.lock() else { break };
                if proto::write_msg(&mut *g, &Msg::Heartbeat).is_err() {
                    break;
                }
            }
        });
    }
    Ok(session)
}

#[allow(clippy::too_many_arguments)]
fn start_remote(
    spec: &JobSpec,
    hosts: &[HostEntry],
    placement: &[usize],
    token_bytes: [u8; 32],
    token: &str,
    job: &str,
    ctx: &Ctx<'_>,
    spawner: Arc<JobSpawner>,
) -> anyhow::Result<(Vec<String>, PmiServer)> {
    let secret = spec
        .secret
        .as_deref()
        .context("running on a hostfile needs the agents' token")?;
    // Connect to every agent that gets ranks.
    let mut conns: Vec<Option<(proto::SessionWriter, SessionReader, SocketAddr)>> =
        (0..hosts.len()).map(|_| None).collect();
    for (i, h) in hosts.iter().enumerate() {
        if placement.contains(&i) {
            conns[i] = Some(connect_agent(h, secret)?);
        }
    }
    // Ranks reach the bootstrap server on the address we reach the first agent from.
    let local_ip = conns
        .iter()
        .flatten()
        .next()
        .map(|(w, _, _)| w.get_ref().local_addr())
        .transpose()?
        .map(|a| a.ip())
        .context("no host received ranks")?;
    let pmi = start_pmi(spec, SocketAddr::new(local_ip, 0), token_bytes, spawner)
        .with_context(|| format!("cannot start the bootstrap server on {local_ip}"))?;
    let cwd = spec
        .cwd
        .clone()
        .or_else(|| std::env::current_dir().ok())
        .map(|p| p.display().to_string());
    let mut hosts_of = vec![String::new(); spec.n];
    for (i, c) in conns.into_iter().enumerate() {
        let Some((w, r, addr)) = c else {
            continue;
        };
        let mine: Vec<usize> = (0..spec.n).filter(|r| placement[*r] == i).collect();
        let ranks = mine
            .iter()
            .enumerate()
            .map(|(local_rank, &rank)| {
                hosts_of[rank] = hostfile::agent_name(hosts, i);
                let mut env = spec.env.clone();
                env.extend(rank_env(
                    rank,
                    spec.n,
                    pmi.addr(),
                    token,
                    job,
                    Place {
                        bind: &addr.ip().to_string(),
                        local: mine.len(),
                        local_rank,
                        bind_to: spec.bind_to,
                    },
                ));
                env.extend(lost_poll_env(spec.heartbeat));
                RankSpec { rank, env }
            })
            .collect();
        let launch = Msg::Launch {
            program: spec.program.clone(),
            args: spec.args.clone(),
            cwd: cwd.clone(),
            ranks,
            heartbeat_ms: spec.heartbeat.map(|d| d.as_millis().max(1) as u64),
        };
        if let Err(e) = run_session(
            (w, r),
            i,
            &hostfile::agent_name(hosts, i),
            launch,
            mine,
            false,
            spec.heartbeat,
            ctx,
        ) {
            ctx.group.signal(libc::SIGKILL);
            return Err(e);
        }
    }
    Ok((hosts_of, pmi))
}

/// A spawned process, to stop it if its spawn fails.
enum Member {
    Local(u32),
    Remote(Arc<Mutex<proto::SessionWriter>>),
}

/// The launcher's side of `Comm::spawn` (issue 13): starts the children of a spawn request on
/// this host or through the agents of the hostfile (placement hints, else the hosts with the
/// most free slots), and feeds their output and exits into the job's event stream.
struct JobSpawner {
    /// The job's event stream (taken when the job stops spawning).
    tx: Mutex<Option<Sender<Event>>>,
    group: Group,
    hosts: Option<Vec<HostEntry>>,
    exclude: Vec<usize>,
    secret: Option<Vec<u8>>,
    env: BTreeMap<String, String>,
    bind_to: BindTo,
    heartbeat: Option<Duration>,
    dir_socket: Option<PathBuf>,
    /// Processes per host (ranks and children still running).
    load: Mutex<Vec<usize>>,
    /// Spawn group → its processes.
    members: Mutex<HashMap<u64, Vec<Member>>>,
    /// Spawned world rank → (host index, host name).
    names: Mutex<BTreeMap<usize, (usize, String)>>,
    stop: Arc<AtomicBool>,
}

impl JobSpawner {
    /// Hostfile index for a placement hint (a host name, `host:port`, or an address).
    fn host_for_hint(&self, hosts: &[HostEntry], hint: &str) -> Result<usize, String> {
        let found = hosts
            .iter()
            .position(|h| h.host == hint || format!("{}:{}", h.host, h.port) == hint);
        match found {
            Some(i) if self.exclude.contains(&i) => Err(format!(
                "host {hint} is out of this job (it failed earlier)"
            )),
            Some(i) => Ok(i),
            None => Err(format!(
                "unknown host {hint:?}: not in the job's hostfile (known: {})",
                hosts
                    .iter()
                    .map(|h| h.host.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }

    /// The host a spawned rank ran on, and forget it (it ended).
    fn forget(&self, rank: usize) -> String {
        let Some((h, name)) = self.names.lock().ok().and_then(|mut n| n.remove(&rank)) else {
            return "?".into();
        };
        if let Ok(mut l) = self.load.lock() {
            if let Some(x) = l.get_mut(h) {
                *x = x.saturating_sub(1);
            }
        }
        name
    }

    fn place(&self, req: &SpawnRequest) -> Result<Vec<usize>, String> {
        let Some(hosts) = &self.hosts else {
            let here = crate::agent::host_name();
            for hint in &req.hosts {
                if !["localhost", "127.0.0.1", here.as_str()].contains(&hint.as_str()) {
                    return Err(format!(
                        "unknown host {hint:?}: this job runs on this host only (localhost)"
                    ));
                }
            }
            return Ok(vec![0; req.ranks.len()]);
        };
        let mut load = self
            .load
            .lock()
            .map_err(|_| "spawner state poisoned")?
            .clone();
        let mut out = Vec::with_capacity(req.ranks.len());
        for i in 0..req.ranks.len() {
            let h = if req.hosts.is_empty() {
                // The host with the most free slots; when every slot is taken (children of an
                // earlier spawn may still be finishing) the least loaded one, as `mutirao run`
                // itself wraps around.
                (0..hosts.len())
                    .filter(|h| !self.exclude.contains(h))
                    .max_by_key(|&h| {
                        (
                            hosts[h].slots as isize - load[h] as isize,
                            std::cmp::Reverse(h),
                        )
                    })
                    .ok_or("no host of the hostfile is left to spawn on")?
            } else {
                self.host_for_hint(hosts, &req.hosts[i % req.hosts.len()])?
            };
            load[h] += 1;
            out.push(h);
        }
        Ok(out)
    }

    fn start(&self, req: &SpawnRequest) -> Result<Vec<SpawnedProc>, String> {
        if req.env.len() != req.ranks.len() {
            return Err("a spawn request with an environment per rank is malformed".into());
        }
        let tx = self
            .tx
            .lock()
            .map_err(|_| "spawner state poisoned")?
            .clone()
            .ok_or("the job is ending: no more spawns")?;
        let placement = self.place(req)?;
        let program = req.program.display().to_string();
        let ctx = Ctx {
            tx: &tx,
            group: &self.group,
            stop: &self.stop,
        };
        let mut started: Vec<Member> = Vec::new();
        let mut procs = Vec::new();
        let result = (|| -> Result<(), String> {
            match &self.hosts {
                None => {
                    let local_total = self.load.lock().map(|l| l[0]).unwrap_or(0) + req.ranks.len();
                    for (i, &rank) in req.ranks.iter().enumerate() {
                        let mut env = self.env.clone();
                        env.extend(req.env[i].iter().cloned());
                        env.insert("MUTIRAO_BIND".into(), "127.0.0.1".into());
                        env.insert("MUTIRAO_LOCAL_RANKS".into(), local_total.to_string());
                        env.insert("MUTIRAO_LOCAL_RANK".into(), rank.to_string());
                        env.insert("MUTIRAO_BIND_TO".into(), self.bind_to.env().into());
                        let pid = start_one_local(
                            &program,
                            &req.args,
                            &env,
                            None,
                            self.dir_socket.as_deref(),
                            rank as usize,
                            ctx.tx,
                            ctx.group,
                        )
                        .map_err(|e| format!("{e:#}"))?;
                        started.push(Member::Local(pid));
                        procs.push((rank, 0usize, "localhost".to_string()));
                    }
                }
                Some(hosts) => {
                    let secret = self.secret.as_deref().ok_or("no agent token")?;
                    let cwd = std::env::current_dir()
                        .ok()
                        .map(|p| p.display().to_string());
                    let mut by_host: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
                    for (i, &h) in placement.iter().enumerate() {
                        by_host.entry(h).or_default().push(i);
                    }
                    for (h, idx) in by_host {
                        let (w, r, addr) =
                            connect_agent(&hosts[h], secret).map_err(|e| format!("{e:#}"))?;
                        let ranks: Vec<RankSpec> = idx
                            .iter()
                            .enumerate()
                            .map(|(k, &i)| {
                                let mut env = self.env.clone();
                                env.extend(req.env[i].iter().cloned());
                                env.insert("MUTIRAO_BIND".into(), addr.ip().to_string());
                                env.insert("MUTIRAO_LOCAL_RANKS".into(), idx.len().to_string());
                                env.insert("MUTIRAO_LOCAL_RANK".into(), k.to_string());
                                env.insert("MUTIRAO_BIND_TO".into(), self.bind_to.env().into());
                                env.extend(lost_poll_env(self.heartbeat));
                                RankSpec {
                                    rank: req.ranks[i] as usize,
                                    env,
                                }
                            })
                            .collect();
                        let launch = Msg::Launch {
                            program: program.clone(),
                            args: req.args.clone(),
                            cwd: cwd.clone(),
                            ranks,
                            heartbeat_ms: self.heartbeat.map(|d| d.as_millis().max(1) as u64),
                        };
                        let writer = run_session(
                            (w, r),
                            h,
                            &hostfile::agent_name(hosts, h),
                            launch,
                            idx.iter().map(|&i| req.ranks[i] as usize).collect(),
                            true,
                            self.heartbeat,
                            &ctx,
                        )
                        .map_err(|e| format!("{e:#}"))?;
                        started.push(Member::Remote(writer));
                        for &i in &idx {
                            procs.push((req.ranks[i], h, hostfile::agent_name(hosts, h)));
                        }
                    }
                }
            }
            Ok(())
        })();
        if let Err(e) = result {
            stop_members(&started);
            return Err(e);
        }
        if let (Ok(mut load), Ok(mut names)) = (self.load.lock(), self.names.lock()) {
            for (rank, h, name) in &procs {
                if let Some(x) = load.get_mut(*h) {
                    *x += 1;
                }
                names.insert(*rank as usize, (*h, name.clone()));
            }
        }
        if let Ok(mut m) = self.members.lock() {
            m.insert(req.group, started);
        }
        Ok(procs
            .into_iter()
            .map(|(rank, _, host)| SpawnedProc { rank, host })
            .collect())
    }
}

fn stop_members(members: &[Member]) {
    for m in members {
        match m {
            Member::Local(pid) => {
                // SAFETY: kill(2) has no memory-safety preconditions; -pid is the process group
                // of a child this launcher started (process_group(0)).
                unsafe {
                    libc::kill(-(*pid as i32), libc::SIGKILL);
                }
            }
            Member::Remote(w) => {
                if let Ok(mut s) = w.lock() {
                    let _ = proto::write_msg(
                        &mut *s,
                        &Msg::Kill {
                            signal: libc::SIGKILL,
                        },
                    );
                    let _ = s.get_ref().shutdown(std::net::Shutdown::Both);
                }
            }
        }
    }
}

impl Spawner for JobSpawner {
    fn spawn(&self, req: &SpawnRequest) -> Result<Vec<SpawnedProc>, String> {
        self.start(req)
    }

    fn abort(&self, group: u64, _why: &str) {
        let members = self
            .members
            .lock()
            .ok()
            .and_then(|mut m| m.remove(&group))
            .unwrap_or_default();
        stop_members(&members);
    }
}

/// The environment remote ranks get besides their rank variables: every `MUTIRAO_*` variable
/// of this process (but the agent token's path) and the `-x NAME[=VALUE]` items.
pub fn forwarded_env(extra: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    let mut env: BTreeMap<String, String> = std::env::vars()
        .filter(|(k, _)| k.starts_with("MUTIRAO_") && k != "MUTIRAO_AGENT_TOKEN_FILE")
        .collect();
    for x in extra {
        match x.split_once('=') {
            Some((k, v)) if !k.is_empty() => {
                env.insert(k.to_string(), v.to_string());
            }
            Some(_) => bail!("-x {x:?}: the variable name is empty"),
            None => match std::env::var(x) {
                Ok(v) => {
                    env.insert(x.clone(), v);
                }
                Err(_) => bail!("-x {x}: no such variable in this environment (use -x {x}=VALUE)"),
            },
        }
    }
    Ok(env)
}

/// Client side of the agent handshake; returns the agent's host name and core count.
pub fn authenticate(
    mut r: BufReader<TcpStream>,
    mut w: TcpStream,
    secret: &[u8],
) -> anyhow::Result<Session> {
    let nonce = match proto::read_msg(&mut r).map_err(anyhow::Error::msg)? {
        Some(Msg::Challenge { version, nonce }) => {
            if version != proto::AGENT_PROTOCOL {
                bail!(
                    "the agent speaks protocol version {version}, this launcher {}: use the same mutirao build everywhere",
                    proto::AGENT_PROTOCOL
                );
            }
            nonce
        }
        Some(other) => bail!("unexpected first message from the agent: {other:?}"),
        None => bail!("the agent closed the connection"),
    };
    let mine = proto::nonce()?;
    proto::write_msg(
        &mut w,
        &Msg::Auth {
            mac: proto::client_mac(secret, &nonce, &mine),
            nonce: mine.clone(),
        },
    )?;
    match proto::read_msg(&mut r).map_err(anyhow::Error::msg)? {
        Some(Msg::Welcome { mac, host, cores }) => {
            if !proto::verify_server(secret, &nonce, &mine, &mac) {
                bail!("the agent could not prove it knows the token: refusing to use it");
            }
            let (sealer, opener) =
                proto::session_keys(secret, &nonce, &mine, mutirao::seal::Role::Client).split();
            Ok(Session {
                reader: mutirao::seal::SealedReader::new(r, opener),
                writer: mutirao::seal::SealedWriter::new(w, sealer),
                host,
                cores,
            })
        }
        Some(Msg::Error { msg }) => bail!("the agent refused us: {msg}"),
        Some(other) => bail!("unexpected answer from the agent: {other:?}"),
        None => bail!("the agent closed the connection during authentication (wrong token?)"),
    }
}

/// An authenticated, sealed session with an agent ([`authenticate`]).
pub struct Session {
    /// Messages from the agent.
    pub reader: SessionReader,
    /// Messages to the agent.
    pub writer: proto::SessionWriter,
    /// The host name the agent announced.
    pub host: String,
    /// The cores it announced.
    pub cores: usize,
}

/// Sealed messages from an agent.
pub type SessionReader = mutirao::seal::SealedReader<BufReader<TcpStream>>;

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(text: &str) -> Vec<HostEntry> {
        hostfile::parse(text).unwrap()
    }

    #[test]
    fn the_barrier_gives_up_before_the_ranks_do() {
        let mut spec = JobSpec::local(2, "prog", vec![]);
        spec.env
            .insert("MUTIRAO_CONNECT_TIMEOUT_S".into(), "3".into());
        assert_eq!(effective_fence_timeout(&spec), Duration::from_millis(2400));
        spec.fence_timeout = Duration::from_secs(1);
        assert_eq!(effective_fence_timeout(&spec), Duration::from_secs(1));
        spec.env.remove("MUTIRAO_CONNECT_TIMEOUT_S");
        spec.fence_timeout = Duration::from_secs(120);
        if std::env::var_os("MUTIRAO_CONNECT_TIMEOUT_S").is_none() {
            // The ranks' default, 60 s.
            assert_eq!(effective_fence_timeout(&spec), Duration::from_secs(48));
        }
    }

    #[test]
    fn placement_skips_excluded_hosts() {
        let mut spec = JobSpec::local(4, "prog", vec![]);
        spec.hosts = Some(hosts("a slots=2\nb slots=2\nc slots=2"));
        assert_eq!(spec.placement().unwrap(), vec![0, 0, 1, 1]);
        spec.exclude = vec![0];
        assert_eq!(spec.placement().unwrap(), vec![1, 1, 2, 2]);
        spec.exclude = vec![0, 1, 2];
        let e = spec.placement().unwrap_err().to_string();
        assert!(e.contains("no host"), "{e}");
    }

    #[test]
    fn explicit_placement_is_checked() {
        let mut spec = JobSpec::local(2, "prog", vec![]);
        spec.hosts = Some(hosts("a\nb"));
        spec.placement = Some(vec![1, 0]);
        assert_eq!(spec.placement().unwrap(), vec![1, 0]);
        spec.placement = Some(vec![1, 2]);
        assert!(spec.placement().is_err());
    }

    #[test]
    fn local_job_runs_and_reports_exits() {
        let spec = JobSpec::local(
            2,
            "/bin/sh",
            vec![
                "-c".into(),
                "echo rank $MUTIRAO_RANK of $MUTIRAO_SIZE; exit $MUTIRAO_RANK".into(),
            ],
        );
        let job = Job::start(&spec).unwrap();
        let mut exits = BTreeMap::new();
        let mut lines = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while exits.len() < 2 && Instant::now() < deadline {
            match job.recv_timeout(Duration::from_millis(100)) {
                Ok(Event::Exit { rank, code, .. }) => {
                    exits.insert(rank, code);
                }
                Ok(Event::Output { line, .. }) => lines.push(line),
                _ => {}
            }
        }
        assert_eq!(exits.get(&0), Some(&Some(0)));
        assert_eq!(exits.get(&1), Some(&Some(1)));
        // Output may trail the exit: wait for it a little.
        while lines.len() < 2 && Instant::now() < deadline {
            if let Ok(Event::Output { line, .. }) = job.recv_timeout(Duration::from_millis(100)) {
                lines.push(line);
            }
        }
        lines.sort();
        assert_eq!(lines, vec!["rank 0 of 2", "rank 1 of 2"]);
    }

    #[test]
    fn a_missing_program_is_a_clear_error() {
        let spec = JobSpec::local(2, "/nonexistent/prog", vec![]);
        let e = Job::start(&spec).err().expect("must fail").to_string();
        assert!(e.contains("cannot start"), "{e}");
    }
}
