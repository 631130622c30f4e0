//! One incarnation of a job: N ranks started on this host or through the agents of a hostfile,
//! with a bootstrap (PMI) server, seen as a stream of [`Event`]s. Nothing here prints or
//! installs signal handlers; [`crate::supervise`] decides what an event means.

use crate::hostfile::{self, HostEntry};
use crate::proto::{self, Msg, RankSpec, Stream};
use anyhow::{bail, Context};
use mutirao::pmi::{hex, new_token, CheckpointSink, FailureReport, PmiServer};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
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
    /// How long the bootstrap server waits for every rank at a fence.
    pub fence_timeout: Duration,
    /// The checkpoint store the bootstrap server hands the ranks' checkpoints to.
    pub checkpoints: Option<Arc<dyn CheckpointSink>>,
    /// Heartbeat period with agents (a silent agent is lost after
    /// [`proto::HEARTBEAT_MISSES`] periods); `None` disables heartbeats.
    pub heartbeat: Option<Duration>,
    /// Local runs: host a resource directory for the job unless `MUTIRAO_DIR_SOCKET` is set.
    pub host_directory: bool,
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
}

/// How to end ranks, local or remote.
enum Group {
    Local(Vec<Option<u32>>),
    Remote(Vec<Arc<Mutex<TcpStream>>>),
}

impl Group {
    fn signal(&self, sig: i32) {
        match self {
            Group::Local(pids) => {
                for pid in pids.iter().flatten() {
                    // SAFETY: kill(2) has no memory-safety preconditions; the negative pid
                    // addresses the process group the child leads (process_group(0)).
                    unsafe {
                        libc::kill(-(*pid as i32), sig);
                    }
                }
            }
            Group::Remote(conns) => {
                for c in conns {
                    if let Ok(mut s) = c.lock() {
                        let _ = proto::write_msg(&mut *s, &Msg::Kill { signal: sig });
                    }
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
        match &spec.hosts {
            None => {
                let job_dir =
                    if spec.host_directory && std::env::var_os("MUTIRAO_DIR_SOCKET").is_none() {
                        Some(host_directory(&id)?)
                    } else {
                        None
                    };
                let pmi = start_pmi(spec, "127.0.0.1:0".parse().expect("literal"), token_bytes)
                    .context("cannot start the bootstrap server on 127.0.0.1");
                let pmi = match pmi {
                    Ok(p) => p,
                    Err(e) => {
                        if let Some(d) = &job_dir {
                            let _ = std::fs::remove_dir_all(d);
                        }
                        return Err(e);
                    }
                };
                let dir_socket = job_dir.as_ref().map(|d| d.join(DIR_SOCKET_NAME));
                let pids =
                    match start_local(spec, pmi.addr(), &token, &id, dir_socket.as_deref(), &tx) {
                        Ok(p) => p,
                        Err(e) => {
                            if let Some(d) = &job_dir {
                                let _ = std::fs::remove_dir_all(d);
                            }
                            cleanup_shm(&id);
                            return Err(e);
                        }
                    };
                Ok(Job {
                    id,
                    rx,
                    group: Group::Local(pids),
                    hosts_of: vec!["localhost".to_string(); spec.n],
                    placement,
                    pmi,
                    job_dir,
                    local: true,
                    stop,
                    started,
                })
            }
            Some(hosts) => {
                let (writers, hosts_of, pmi) = start_remote(
                    spec,
                    hosts,
                    &placement,
                    token_bytes,
                    &token,
                    &id,
                    &tx,
                    &stop,
                )?;
                Ok(Job {
                    id,
                    rx,
                    group: Group::Remote(writers),
                    hosts_of,
                    placement,
                    pmi,
                    job_dir: None,
                    local: false,
                    stop,
                    started,
                })
            }
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

    /// Channel failures ranks reported since the last call.
    pub fn take_failures(&self) -> Vec<FailureReport> {
        self.pmi.take_failures()
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
        if self.local {
            cleanup_shm(&self.id);
        }
        if let Some(d) = &self.job_dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// The bootstrap server, with the checkpoint store when checkpoints are on.
fn start_pmi(spec: &JobSpec, bind: SocketAddr, token: [u8; 32]) -> std::io::Result<PmiServer> {
    match &spec.checkpoints {
        Some(sink) => PmiServer::start_with_checkpoints(
            bind,
            spec.n as u32,
            token,
            spec.fence_timeout,
            sink.clone(),
        ),
        None => PmiServer::start(bind, spec.n as u32, token, spec.fence_timeout),
    }
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
        let mut br = BufReader::new(r);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match br.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if buf.last() == Some(&b'\n') {
                        buf.pop();
                    }
                    let line = String::from_utf8_lossy(&buf).into_owned();
                    if tx.send(Event::Output { rank, stream, line }).is_err() {
                        break;
                    }
                }
            }
        }
    });
}

fn start_local(
    spec: &JobSpec,
    pmi: SocketAddr,
    token: &str,
    job: &str,
    dir_socket: Option<&Path>,
    tx: &Sender<Event>,
) -> anyhow::Result<Vec<Option<u32>>> {
    let mut pids = vec![None; spec.n];
    for rank in 0..spec.n {
        let place = Place {
            bind: "127.0.0.1",
            local: spec.n,
            local_rank: rank,
            bind_to: spec.bind_to,
        };
        let env = rank_env(rank, spec.n, pmi, token, job, place);
        let mut cmd = Command::new(&spec.program);
        if let Some(sock) = dir_socket {
            cmd.env("MUTIRAO_DIR_SOCKET", sock);
        }
        cmd.args(&spec.args)
            .envs(&spec.env)
            .envs(&env)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                // End what already started, then report.
                Group::Local(pids.clone()).signal(libc::SIGKILL);
                bail!(
                    "cannot start {:?} for rank {rank}: {e} (is the path right and the file executable?)",
                    spec.program
                );
            }
        };
        pids[rank] = Some(child.id());
        if let Some(o) = child.stdout.take() {
            forward(rank, Stream::Out, o, tx.clone());
        }
        if let Some(e) = child.stderr.take() {
            forward(rank, Stream::Err, e, tx.clone());
        }
        let txc = tx.clone();
        std::thread::spawn(move || {
            let st = child.wait();
            let (code, signal) = match st {
                Ok(s) => (s.code(), s.signal()),
                Err(_) => (None, None),
            };
            let _ = txc.send(Event::Exit { rank, code, signal });
        });
    }
    Ok(pids)
}

type Remote = (Vec<Arc<Mutex<TcpStream>>>, Vec<String>, PmiServer);

#[allow(clippy::too_many_arguments)]
fn start_remote(
    spec: &JobSpec,
    hosts: &[HostEntry],
    placement: &[usize],
    token_bytes: [u8; 32],
    token: &str,
    job: &str,
    tx: &Sender<Event>,
    stop: &Arc<AtomicBool>,
) -> anyhow::Result<Remote> {
    let secret = spec
        .secret
        .as_deref()
        .context("running on a hostfile needs the agents' token")?;
    // Connect to every agent that gets ranks.
    let mut conns: Vec<Option<(TcpStream, BufReader<TcpStream>, SocketAddr)>> =
        (0..hosts.len()).map(|_| None).collect();
    for (i, h) in hosts.iter().enumerate() {
        if !placement.contains(&i) {
            continue;
        }
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
        let mut r = BufReader::new(s.try_clone()?);
        let mut w = s;
        authenticate(&mut r, &mut w, secret)
            .with_context(|| format!("agent of {} at {addr}", h.host))?;
        conns[i] = Some((w, r, addr));
    }
    // Ranks reach the bootstrap server on the address we reach the first agent from.
    let local_ip = conns
        .iter()
        .flatten()
        .next()
        .map(|(w, _, _)| w.local_addr())
        .transpose()?
        .map(|a| a.ip())
        .context("no host received ranks")?;
    let pmi = start_pmi(spec, SocketAddr::new(local_ip, 0), token_bytes)
        .with_context(|| format!("cannot start the bootstrap server on {local_ip}"))?;
    let cwd = std::env::current_dir()
        .ok()
        .map(|p| p.display().to_string());
    let mut hosts_of = vec![String::new(); spec.n];
    let mut writers = Vec::new();
    let silence = spec.heartbeat.map(|p| p * proto::HEARTBEAT_MISSES);
    for (i, c) in conns.into_iter().enumerate() {
        let Some((mut w, mut r, addr)) = c else {
            continue;
        };
        let mine: Vec<usize> = (0..spec.n).filter(|r| placement[*r] == i).collect();
        let ranks = mine
            .iter()
            .enumerate()
            .map(|(local_rank, &rank)| {
                hosts_of[rank] = hosts[i].host.clone();
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
                RankSpec { rank, env }
            })
            .collect();
        proto::write_msg(
            &mut w,
            &Msg::Launch {
                program: spec.program.clone(),
                args: spec.args.clone(),
                cwd: cwd.clone(),
                ranks,
                heartbeat_ms: spec.heartbeat.map(|d| d.as_millis().max(1) as u64),
            },
        )
        .with_context(|| format!("cannot send the job to the agent of {}", hosts[i].host))?;
        r.get_ref().set_read_timeout(silence).ok();
        let w = Arc::new(Mutex::new(w));
        writers.push(w.clone());
        let txc = tx.clone();
        let host = hosts[i].host.clone();
        std::thread::spawn(move || loop {
            let lost = |why: String| {
                let _ = txc.send(Event::HostLost { host: i, why });
            };
            match proto::read_msg(&mut r) {
                Ok(Some(Msg::Output { rank, stream, line })) => {
                    let _ = txc.send(Event::Output { rank, stream, line });
                }
                Ok(Some(Msg::Started { rank, .. })) => {
                    let _ = txc.send(Event::Started { rank });
                }
                Ok(Some(Msg::Exit { rank, code, signal })) => {
                    let _ = txc.send(Event::Exit { rank, code, signal });
                }
                Ok(Some(Msg::Error { msg })) => {
                    lost(format!("agent of {host}: {msg}"));
                    break;
                }
                Ok(Some(_)) => {}
                Ok(None) => {
                    lost(format!("agent of {host} closed the connection"));
                    break;
                }
                Err(e) if e.contains("timed out") || e.contains("temporarily unavailable") => {
                    lost(format!(
                        "agent of {host} sent no heartbeat for {:.1} s (host down or unreachable)",
                        silence.unwrap_or_default().as_secs_f64()
                    ));
                    break;
                }
                Err(e) => {
                    lost(format!("agent of {host}: {e}"));
                    break;
                }
            }
        });
        if let Some(period) = spec.heartbeat {
            let stop = stop.clone();
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
    }
    Ok((writers, hosts_of, pmi))
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
    r: &mut impl BufRead,
    w: &mut impl Write,
    secret: &[u8],
) -> anyhow::Result<(String, usize)> {
    let nonce = match proto::read_msg(r).map_err(anyhow::Error::msg)? {
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
        w,
        &Msg::Auth {
            mac: proto::mac(secret, proto::CLIENT_LABEL, &nonce),
            nonce: mine.clone(),
        },
    )?;
    match proto::read_msg(r).map_err(anyhow::Error::msg)? {
        Some(Msg::Welcome { mac, host, cores }) => {
            if !proto::verify(secret, proto::SERVER_LABEL, &mine, &mac) {
                bail!("the agent could not prove it knows the token: refusing to use it");
            }
            Ok((host, cores))
        }
        Some(Msg::Error { msg }) => bail!("the agent refused us: {msg}"),
        Some(other) => bail!("unexpected answer from the agent: {other:?}"),
        None => bail!("the agent closed the connection during authentication (wrong token?)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(text: &str) -> Vec<HostEntry> {
        hostfile::parse(text).unwrap()
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
