//! `mutirao run`: the launcher (mutirão's `mpirun`).

use crate::agent_proto::{self as proto, Msg, RankSpec, Stream};
use crate::hostfile;
use anyhow::{bail, Context};
use mutirao::pmi::{hex, new_token, CheckpointSink, PmiServer};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Run a parallel program: N ranks on this host, or on the hosts of a hostfile through their
/// agents.
///
/// Examples:
///   mutirao run -n 4 target/release/examples/pi
///   mutirao run -n 8 --hostfile hosts.txt --tag-output ./ring 1000
///
/// Each rank gets MUTIRAO_RANK and MUTIRAO_SIZE (also OMPI_COMM_WORLD_RANK/SIZE and
/// PMI_RANK/PMI_SIZE). The exit status is the first failing rank's; when one rank fails the others
/// are ended within seconds; Ctrl-C ends them all.
///
/// Ranks find the resource directory through MUTIRAO_DIR_SOCKET: on this host the launcher hosts
/// a directory for the job's lifetime (unless MUTIRAO_DIR_SOCKET is already set); ranks started by
/// agents get their agent's directory.
/// What `--bind-to` pins each rank to.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindTo {
    /// Leave placement to the kernel.
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

/// Checkpoint mode (`MUTIRAO_CKPT_MODE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CkptMode {
    /// Wait at the safe point for every peer.
    Blocking,
    /// Record messages in flight and go on.
    Nonblocking,
}

/// One incarnation's checkpoint settings.
#[derive(Clone)]
pub struct CkptRun {
    sink: Arc<crate::ckpt_dir::DirSink>,
    env: Vec<(String, String)>,
}

impl std::fmt::Debug for CkptRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CkptRun")
            .field("env", &self.env)
            .finish_non_exhaustive()
    }
}

#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct RunArgs {
    /// Number of ranks to start.
    #[arg(short = 'n', long = "np", default_value_t = 1, value_name = "N")]
    pub n: usize,
    /// Hosts to run on (`host slots=N [port=P]` or `host:N` lines); each needs `mutirao agent`.
    /// Without it, all ranks run on this host.
    #[arg(long, value_name = "FILE")]
    pub hostfile: Option<PathBuf>,
    /// Prefix every output line with `[rank]`.
    #[arg(long)]
    pub tag_output: bool,
    /// Pin each rank to one core of its host (`core`), like Open MPI's `--bind-to core`. A
    /// host's ranks fill the cores it may use in blocks, in rank order: with 8 ranks on 2
    /// cores, ranks 0–3 share the first core. Neighbouring ranks, which often talk most, then
    /// share a core. When ranks outnumber cores, this keeps a waiting rank's turn for the rank
    /// it waits for (4 ping-pong pairs on 2 cores: 1.5× one pair's round trip instead of
    /// 2.5–4×).
    #[arg(long, value_enum, default_value = "none", value_name = "WHAT")]
    pub bind_to: BindTo,
    /// End the job (exit status 124) if it runs longer than S seconds.
    #[arg(long, value_name = "S")]
    pub timeout: Option<f64>,
    /// Pass an environment variable to remote ranks (`NAME` takes this process's value,
    /// `NAME=VALUE` sets it). Repeatable. Every `MUTIRAO_*` variable is passed anyway. Local ranks
    /// inherit the whole environment.
    #[arg(short = 'x', long = "env", value_name = "NAME[=VALUE]")]
    pub env: Vec<String>,
    /// The agents' shared secret (default: $MUTIRAO_AGENT_TOKEN_FILE or ~/.mutirao/agent.token).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Take a coordinated checkpoint about every S seconds (the program hands its state to
    /// `world.checkpoint_point(&state)` at safe points, docs/checkpoints.md) and, when a rank
    /// fails, restart every rank from the last committed checkpoint, at most --max-restarts
    /// times. Without it a failure ends the job.
    #[arg(long, value_name = "S")]
    pub checkpoint_interval: Option<f64>,
    /// `blocking` waits at the safe point until every peer reached it; `nonblocking` records
    /// the messages in flight instead and goes on.
    #[arg(long, value_enum, default_value = "blocking", value_name = "MODE")]
    pub checkpoint_mode: CkptMode,
    /// Where checkpoints are kept (default: ./mutirao-ckpt-PID, removed when the job succeeds).
    /// Must be reachable by this launcher; the ranks send their checkpoints to it.
    #[arg(long, value_name = "DIR")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Restarts from a checkpoint before giving up (each failure, also during a recovery).
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub max_restarts: u32,
    /// A host's mean time between failures, in seconds: with checkpoints on, the launcher
    /// prints the interval Young's and Daly's formulas suggest for the measured checkpoint cost.
    #[arg(long, value_name = "S")]
    pub host_mtbf: Option<f64>,
    /// Set by the recovery loop: the checkpoint store and the environment of this incarnation.
    #[arg(skip)]
    pub ckpt: Option<CkptRun>,
    /// The program and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROG [ARGS]..."
    )]
    pub command: Vec<String>,
}

enum Ev {
    Out(usize, Stream, String),
    Started,
    Exit(usize, Option<i32>, Option<i32>),
    /// An agent's connection ended: (hostfile line index, why).
    HostLost(usize, String),
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

impl RunArgs {
    /// A job another command starts through the launcher (calibration, exec-dag, CRES): no
    /// tagging, no binding, no checkpoints.
    pub fn job(
        n: usize,
        hostfile: Option<PathBuf>,
        timeout: f64,
        token_file: Option<PathBuf>,
        command: Vec<String>,
    ) -> RunArgs {
        RunArgs {
            n,
            hostfile,
            tag_output: false,
            bind_to: BindTo::None,
            timeout: Some(timeout),
            env: Vec::new(),
            token_file,
            checkpoint_interval: None,
            checkpoint_mode: CkptMode::Blocking,
            checkpoint_dir: None,
            max_restarts: 0,
            host_mtbf: None,
            ckpt: None,
            command,
        }
    }
}

/// The bootstrap server, with the checkpoint store when checkpoints are on.
fn start_pmi(
    args: &RunArgs,
    bind: SocketAddr,
    token: [u8; 32],
    fence_timeout: Duration,
) -> std::io::Result<PmiServer> {
    match &args.ckpt {
        Some(c) => PmiServer::start_with_checkpoints(
            bind,
            args.n as u32,
            token,
            fence_timeout,
            c.sink.clone() as Arc<dyn mutirao::pmi::CheckpointSink>,
        ),
        None => PmiServer::start(bind, args.n as u32, token, fence_timeout),
    }
}

pub fn run(mut args: RunArgs) -> anyhow::Result<ExitCode> {
    if args.n == 0 {
        bail!("-n must be at least 1");
    }
    if let Some(t) = args.timeout {
        if !(t.is_finite() && t > 0.0) {
            bail!("--timeout must be a positive number of seconds");
        }
    }
    let Some(interval) = args.checkpoint_interval else {
        let interrupted = Arc::new(AtomicBool::new(false));
        return run_once(&args, &interrupted).map(ExitCode::from);
    };
    if !(interval.is_finite() && interval > 0.0) {
        bail!("--checkpoint-interval must be a positive number of seconds");
    }
    if let Some(m) = args.host_mtbf {
        if !(m.is_finite() && m > 0.0) {
            bail!("--host-mtbf must be a positive number of seconds");
        }
    }
    let (dir, owned) = match &args.checkpoint_dir {
        Some(d) => (d.clone(), false),
        None => (
            std::env::current_dir()
                .context("cannot read the current directory")?
                .join(format!("mutirao-ckpt-{}", std::process::id())),
            true,
        ),
    };
    let sink = Arc::new(crate::ckpt_dir::DirSink::new(&dir, args.n as u32)?);
    let interrupted = Arc::new(AtomicBool::new(false));
    let mode = match args.checkpoint_mode {
        CkptMode::Blocking => "blocking",
        CkptMode::Nonblocking => "nonblocking",
    };
    let mut incarnation = 0u32;
    let code = loop {
        let restart = sink.last_committed().map_err(anyhow::Error::msg)?;
        let mut env = vec![
            ("MUTIRAO_CKPT_INTERVAL".to_string(), interval.to_string()),
            ("MUTIRAO_CKPT_MODE".to_string(), mode.to_string()),
            ("MUTIRAO_INCARNATION".to_string(), incarnation.to_string()),
        ];
        if let Some(e) = restart {
            env.push(("MUTIRAO_RESTART_EPOCH".to_string(), e.to_string()));
        }
        args.ckpt = Some(CkptRun {
            sink: sink.clone(),
            env,
        });
        let t = std::time::Instant::now();
        let code = run_once(&args, &interrupted)?;
        if code == 0 || interrupted.load(Ordering::SeqCst) {
            break code;
        }
        if incarnation >= args.max_restarts {
            eprintln!(
                "mutirao run: the job failed (exit status {code}) and {} restart(s) were used up (--max-restarts); giving up; checkpoints are kept in {}",
                args.max_restarts,
                dir.display()
            );
            break code;
        }
        incarnation += 1;
        let from = sink.last_committed().map_err(anyhow::Error::msg)?;
        eprintln!(
            "mutirao run: the job failed after {:.1} s (exit status {code}); restart {incarnation} of {}: every rank from {}",
            t.elapsed().as_secs_f64(),
            args.max_restarts,
            match from {
                Some(e) => format!("committed epoch {e}"),
                None => "the beginning (no checkpoint committed yet)".to_string(),
            }
        );
    };
    let costs = sink.wave_costs();
    if !costs.is_empty() {
        let mut c = costs.clone();
        c.sort_by(f64::total_cmp);
        let med = c[c.len() / 2];
        eprint!(
            "mutirao run: {} checkpoint(s) committed, median cost {:.3} s (first blob to commit)",
            costs.len(),
            med
        );
        match args.host_mtbf {
            Some(m) => {
                let (young, daly) = crate::ckpt_dir::young_daly(med, m / args.n.max(1) as f64);
                eprintln!(
                    "; with --host-mtbf {m} s over {} ranks, Young suggests --checkpoint-interval {young:.1}, Daly {daly:.1}",
                    args.n
                );
            }
            None => eprintln!(" (give --host-mtbf S for an interval suggestion)"),
        }
    }
    if code == 0 && owned {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(ExitCode::from(code))
}

fn run_once(args: &RunArgs, interrupted: &Arc<AtomicBool>) -> anyhow::Result<u8> {
    let token_bytes = new_token().context("cannot make a job token")?;
    let token = hex(&token_bytes);
    let job = format!("{}-{}", std::process::id(), &token[..8]);
    {
        let flag = interrupted.clone();
        // A second handler installation fails only if one exists already; then Ctrl-C still
        // reaches the default action.
        let _ = ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst));
    }
    let (tx, rx) = channel::<Ev>();
    let mut job_dir: Option<PathBuf> = None;
    let fence_timeout = Duration::from_secs(120);
    let (group, hosts_of, placement, pmi) = match &args.hostfile {
        None => {
            // A directory for this job, unless the caller named one.
            if std::env::var_os("MUTIRAO_DIR_SOCKET").is_none() {
                job_dir = Some(host_directory(&job)?);
            }
            let pmi = start_pmi(
                args,
                "127.0.0.1:0".parse().expect("literal"),
                token_bytes,
                fence_timeout,
            )
            .context("cannot start the bootstrap server on 127.0.0.1")?;
            let dir_socket = job_dir.as_ref().map(|d| d.join(DIR_SOCKET_NAME));
            let pids = match start_local(args, pmi.addr(), &token, &job, dir_socket.as_deref(), &tx)
            {
                Ok(p) => p,
                Err(e) => {
                    if let Some(d) = &job_dir {
                        let _ = std::fs::remove_dir_all(d);
                    }
                    return Err(e);
                }
            };
            (
                Group::Local(pids),
                vec!["localhost".to_string(); args.n],
                vec![0; args.n],
                pmi,
            )
        }
        Some(path) => start_remote(args, path, token_bytes, &token, &job, &tx, fence_timeout)?,
    };
    drop(tx);
    let code = supervise(args, &group, &hosts_of, &placement, &pmi, rx, interrupted);
    if args.hostfile.is_none() {
        cleanup_shm(&job);
    }
    if let Some(d) = job_dir {
        let _ = std::fs::remove_dir_all(d);
    }
    Ok(code)
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

fn forward(rank: usize, stream: Stream, r: impl std::io::Read + Send + 'static, tx: Sender<Ev>) {
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
                    if tx.send(Ev::Out(rank, stream, line)).is_err() {
                        break;
                    }
                }
            }
        }
    });
}

fn start_local(
    args: &RunArgs,
    pmi: SocketAddr,
    token: &str,
    job: &str,
    dir_socket: Option<&std::path::Path>,
    tx: &Sender<Ev>,
) -> anyhow::Result<Vec<Option<u32>>> {
    let mut pids = vec![None; args.n];
    for rank in 0..args.n {
        let place = Place {
            bind: "127.0.0.1",
            local: args.n,
            local_rank: rank,
            bind_to: args.bind_to,
        };
        let mut env = rank_env(rank, args.n, pmi, token, job, place);
        if let Some(c) = &args.ckpt {
            env.extend(c.env.iter().cloned());
        }
        let mut cmd = Command::new(&args.command[0]);
        if let Some(sock) = dir_socket {
            cmd.env("MUTIRAO_DIR_SOCKET", sock);
        }
        cmd.args(&args.command[1..])
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
                    args.command[0]
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
            let (code, sig) = match st {
                Ok(s) => (s.code(), s.signal()),
                Err(_) => (None, None),
            };
            let _ = txc.send(Ev::Exit(rank, code, sig));
        });
    }
    Ok(pids)
}

#[allow(clippy::type_complexity)]
fn start_remote(
    args: &RunArgs,
    path: &std::path::Path,
    token_bytes: [u8; 32],
    token: &str,
    job: &str,
    tx: &Sender<Ev>,
    fence_timeout: Duration,
) -> anyhow::Result<(Group, Vec<String>, Vec<usize>, PmiServer)> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read hostfile {}", path.display()))?;
    let hosts = hostfile::parse(&text).map_err(anyhow::Error::msg)?;
    let placement = hostfile::place(&hosts, args.n);
    let secret_path = args
        .token_file
        .clone()
        .unwrap_or_else(proto::default_token_path);
    let secret = proto::read_token_file(&secret_path).map_err(anyhow::Error::msg)?;
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
        let welcome = authenticate(&mut r, &mut w, &secret)
            .with_context(|| format!("agent of {} at {addr}", h.host))?;
        let _ = welcome;
        r.get_ref().set_read_timeout(None).ok();
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
    let pmi = start_pmi(
        args,
        SocketAddr::new(local_ip, 0),
        token_bytes,
        fence_timeout,
    )
    .with_context(|| format!("cannot start the bootstrap server on {local_ip}"))?;
    let forwarded = forwarded_env(&args.env)?;
    let cwd = std::env::current_dir()
        .ok()
        .map(|p| p.display().to_string());
    let mut hosts_of = vec![String::new(); args.n];
    let mut writers = Vec::new();
    for (i, c) in conns.into_iter().enumerate() {
        let Some((mut w, mut r, addr)) = c else {
            continue;
        };
        let mine: Vec<usize> = (0..args.n).filter(|r| placement[*r] == i).collect();
        let ranks = mine
            .iter()
            .enumerate()
            .map(|(local_rank, &rank)| {
                hosts_of[rank] = hosts[i].host.clone();
                let mut env = forwarded.clone();
                env.extend(rank_env(
                    rank,
                    args.n,
                    pmi.addr(),
                    token,
                    job,
                    Place {
                        bind: &addr.ip().to_string(),
                        local: mine.len(),
                        local_rank,
                        bind_to: args.bind_to,
                    },
                ));
                if let Some(c) = &args.ckpt {
                    env.extend(c.env.iter().cloned());
                }
                RankSpec { rank, env }
            })
            .collect();
        proto::write_msg(
            &mut w,
            &Msg::Launch {
                program: args.command[0].clone(),
                args: args.command[1..].to_vec(),
                cwd: cwd.clone(),
                ranks,
            },
        )
        .with_context(|| format!("cannot send the job to the agent of {}", hosts[i].host))?;
        let w = Arc::new(Mutex::new(w));
        writers.push(w);
        let txc = tx.clone();
        let host = hosts[i].host.clone();
        std::thread::spawn(move || loop {
            match proto::read_msg(&mut r) {
                Ok(Some(Msg::Output { rank, stream, line })) => {
                    let _ = txc.send(Ev::Out(rank, stream, line));
                }
                Ok(Some(Msg::Started { .. })) => {
                    let _ = txc.send(Ev::Started);
                }
                Ok(Some(Msg::Exit { rank, code, signal })) => {
                    let _ = txc.send(Ev::Exit(rank, code, signal));
                }
                Ok(Some(Msg::Error { msg })) => {
                    let _ = txc.send(Ev::HostLost(i, format!("agent of {host}: {msg}")));
                    break;
                }
                Ok(Some(_)) => {}
                Ok(None) => {
                    let _ = txc.send(Ev::HostLost(
                        i,
                        format!("agent of {host} closed the connection"),
                    ));
                    break;
                }
                Err(e) => {
                    let _ = txc.send(Ev::HostLost(i, format!("agent of {host}: {e}")));
                    break;
                }
            }
        });
    }
    Ok((Group::Remote(writers), hosts_of, placement, pmi))
}

/// The environment remote ranks get besides their rank variables.
fn forwarded_env(extra: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
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

/// Client side of the agent handshake.
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

fn describe(code: Option<i32>, sig: Option<i32>) -> (String, u8) {
    match (code, sig) {
        (Some(c), _) => (format!("exited with code {c}"), c.clamp(0, 255) as u8),
        (None, Some(s)) => (
            format!("was killed by signal {s} ({})", signal_name(s)),
            (128 + s).clamp(0, 255) as u8,
        ),
        (None, None) => ("ended in an unknown way".into(), 1),
    }
}

fn signal_name(s: i32) -> &'static str {
    match s {
        1 => "SIGHUP",
        2 => "SIGINT",
        6 => "SIGABRT",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        15 => "SIGTERM",
        _ => "signal",
    }
}

fn supervise(
    args: &RunArgs,
    group: &Group,
    hosts_of: &[String],
    placement: &[usize],
    pmi: &PmiServer,
    rx: Receiver<Ev>,
    interrupted: &AtomicBool,
) -> u8 {
    let n = args.n;
    let start = Instant::now();
    let mut exited = vec![false; n];
    let mut remaining = n;
    let mut first_failure: Option<u8> = None;
    let mut ending_since: Option<Instant> = None;
    let mut killed_hard = false;
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    let end_all = |why: String, code: u8, first: &mut Option<u8>, since: &mut Option<Instant>| {
        if first.is_none() {
            *first = Some(code);
            eprintln!("mutirao run: {why}");
        }
        if since.is_none() {
            *since = Some(Instant::now());
            pmi.fail(&why);
            group.signal(libc::SIGTERM);
        }
    };
    while remaining > 0 {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(Ev::Out(rank, stream, line)) => {
                let text = if args.tag_output {
                    format!("[{rank}] {line}\n")
                } else {
                    format!("{line}\n")
                };
                let _ = match stream {
                    Stream::Out => stdout.lock().write_all(text.as_bytes()),
                    Stream::Err => stderr.lock().write_all(text.as_bytes()),
                };
            }
            Ok(Ev::Started) => {}
            Ok(Ev::Exit(rank, code, sig)) => {
                if rank < n && !exited[rank] {
                    exited[rank] = true;
                    remaining -= 1;
                    let ok = code == Some(0);
                    if !ok && ending_since.is_none() {
                        let (what, c) = describe(code, sig);
                        end_all(
                            format!(
                                "rank {rank} on {} {what}; ending the other ranks",
                                hosts_of.get(rank).map(String::as_str).unwrap_or("?")
                            ),
                            c,
                            &mut first_failure,
                            &mut ending_since,
                        );
                    }
                }
            }
            Ok(Ev::HostLost(host, why)) => {
                let host = Some(host);
                // An agent closes its session once all its ranks have ended: that is no failure.
                let lost: Vec<usize> = (0..n)
                    .filter(|r| placement.get(*r).copied() == host && !exited[*r])
                    .collect();
                if !lost.is_empty() {
                    if ending_since.is_none() {
                        end_all(
                            format!(
                                "{why} while ranks {lost:?} were running; ending the other ranks"
                            ),
                            1,
                            &mut first_failure,
                            &mut ending_since,
                        );
                    }
                    // Those ranks will report no exit: count them as ended.
                    for r in lost {
                        exited[r] = true;
                        remaining -= 1;
                    }
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        if interrupted.load(Ordering::SeqCst) && ending_since.is_none() {
            end_all(
                "interrupted; ending all ranks".into(),
                130,
                &mut first_failure,
                &mut ending_since,
            );
        }
        if let Some(t) = args.timeout {
            if start.elapsed().as_secs_f64() > t && ending_since.is_none() {
                end_all(
                    format!("the job ran longer than --timeout {t} s; ending all ranks"),
                    124,
                    &mut first_failure,
                    &mut ending_since,
                );
            }
        }
        if let Some(since) = ending_since {
            if !killed_hard && since.elapsed() > Duration::from_secs(2) {
                killed_hard = true;
                group.signal(libc::SIGKILL);
            }
            if since.elapsed() > Duration::from_secs(10) {
                eprintln!(
                    "mutirao run: {remaining} rank(s) did not report their end; giving up on them"
                );
                break;
            }
        }
    }
    // Drain output still on its way (bounded: a grandchild may hold a pipe open).
    let drain_until = Instant::now() + Duration::from_secs(2);
    while let Ok(ev) = rx.recv_timeout(drain_until.saturating_duration_since(Instant::now())) {
        if let Ev::Out(rank, stream, line) = ev {
            let text = if args.tag_output {
                format!("[{rank}] {line}\n")
            } else {
                format!("{line}\n")
            };
            let _ = match stream {
                Stream::Out => stdout.lock().write_all(text.as_bytes()),
                Stream::Err => stderr.lock().write_all(text.as_bytes()),
            };
        }
    }
    let _ = stdout.lock().flush();
    first_failure.unwrap_or(0)
}
