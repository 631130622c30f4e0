//! `mutirao run`: the launcher (mutirão's `mpirun`).

use anyhow::{bail, Context};
use mutirao::pmi::CheckpointSink;
use mutirao_launch::ckpt_dir::{young_daly, DirSink};
use mutirao_launch::hostfile;
use mutirao_launch::job::{self, forwarded_env, JobSpec};
use mutirao_launch::proto::{self, Stream};
use mutirao_launch::recovery::{self, run_with_recovery, Recovery};
use mutirao_launch::supervise::{supervise, Report, Watch};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

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

impl From<BindTo> for job::BindTo {
    fn from(b: BindTo) -> job::BindTo {
        match b {
            BindTo::None => job::BindTo::None,
            BindTo::Core => job::BindTo::Core,
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

impl From<CkptMode> for recovery::CkptMode {
    fn from(m: CkptMode) -> recovery::CkptMode {
        match m {
            CkptMode::Blocking => recovery::CkptMode::Blocking,
            CkptMode::Nonblocking => recovery::CkptMode::Nonblocking,
        }
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
    /// 2.5–4×). Not on a machine others use: pinned ranks cannot move away from a busy
    /// process, and a yielding rank then waits out its time slices (4 ranks on 2 cores beside
    /// one busy loop: an 8-byte allreduce took 2.5–2.7 ms pinned, 7.5–10 µs unpinned).
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
    /// Where checkpoints are kept: `dir` (a directory of this machine, --checkpoint-dir),
    /// `agents[:K]` (K replicas, default 2, on agents of the hostfile other than the rank's own
    /// host; reads fall back across replicas), or `s3://BUCKET[/PREFIX]` (S3-compatible storage;
    /// endpoint, region and credentials from AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID,
    /// AWS_SECRET_ACCESS_KEY, AWS_ALLOW_HTTP). Default: `agents` with a hostfile of 3 or more
    /// agents, else `dir`. The ranks send their checkpoints through this launcher.
    #[arg(long, value_name = "STORE")]
    pub checkpoint_store: Option<mutirao_launch::store::StoreKind>,
    /// The directory of `--checkpoint-store dir` (default: ./mutirao-ckpt-PID, removed when the
    /// job succeeds).
    #[arg(long, value_name = "DIR")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Keep the checkpoints after the job succeeded (they are deleted by default; a failed
    /// job's are always kept).
    #[arg(long)]
    pub keep_checkpoints: bool,
    /// Restarts from a checkpoint before giving up (each failure, also during a recovery).
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub max_restarts: u32,
    /// A host's mean time between failures, in seconds: with checkpoints on, the launcher
    /// prints the interval Young's and Daly's formulas suggest for the measured checkpoint cost.
    #[arg(long, value_name = "S")]
    pub host_mtbf: Option<f64>,
    /// When a rank other than 0 fails (or its host is lost), report it and let the others go
    /// on, instead of ending the job: for master/worker programs, where rank 0 re-queues a lost
    /// worker's work (docs/master-worker.md). The exit status is rank 0's. Not with
    /// --checkpoint-interval.
    #[arg(long, conflicts_with = "checkpoint_interval")]
    pub continue_on_failure: bool,
    /// Print, once every rank has connected, how long the ranks' start-up took: each phase's
    /// maximum over the ranks (registering with this launcher, the address exchange, the mesh
    /// connect; docs/grid.md) and the time from the launch until all were connected.
    #[arg(long)]
    pub init_timings: bool,
    /// Heartbeat period with the agents, in seconds: an agent silent for 2.5 periods (at least
    /// one period plus 1 s; its host down or cut off) counts as lost, and so do its ranks; with
    /// --continue-on-failure the other ranks' operations on them then fail within 3 periods.
    /// 0 turns heartbeats off.
    #[arg(long, default_value_t = 1.0, value_name = "S")]
    pub heartbeat: f64,
    /// The program and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROG [ARGS]..."
    )]
    pub command: Vec<String>,
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
            checkpoint_store: None,
            checkpoint_dir: None,
            keep_checkpoints: false,
            max_restarts: 0,
            host_mtbf: None,
            heartbeat: 1.0,
            continue_on_failure: false,
            init_timings: false,
            command,
        }
    }
}

impl RunArgs {
    /// The job this command line describes (one incarnation, without checkpoints).
    fn spec(&self) -> anyhow::Result<JobSpec> {
        let mut spec = JobSpec::local(self.n, self.command[0].clone(), self.command[1..].to_vec());
        spec.bind_to = self.bind_to.into();
        spec.env = forwarded_env(&self.env)?;
        if !(self.heartbeat.is_finite() && self.heartbeat >= 0.0) {
            bail!("--heartbeat must be a number of seconds, 0 or more");
        }
        spec.heartbeat = (self.heartbeat > 0.0).then(|| Duration::from_secs_f64(self.heartbeat));
        if let Some(path) = &self.hostfile {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read hostfile {}", path.display()))?;
            spec.hosts = Some(hostfile::parse(&text).map_err(anyhow::Error::msg)?);
            let secret_path = self
                .token_file
                .clone()
                .unwrap_or_else(proto::default_token_path);
            spec.secret = Some(proto::read_token_file(&secret_path).map_err(anyhow::Error::msg)?);
        }
        Ok(spec)
    }

    fn watch(&self, interrupted: Arc<AtomicBool>) -> Watch {
        Watch {
            timeout: self.timeout.map(Duration::from_secs_f64),
            interrupted,
            keep_going: self.continue_on_failure,
            ..Watch::default()
        }
    }

    /// Print one report: output lines (tagged with `[rank]` when asked), notices on stderr.
    fn print(&self, r: Report) {
        match r {
            Report::Output { rank, stream, line } => {
                let text = if self.tag_output {
                    format!("[{rank}] {line}\n")
                } else {
                    format!("{line}\n")
                };
                let _ = match stream {
                    Stream::Out => std::io::stdout().lock().write_all(text.as_bytes()),
                    Stream::Err => std::io::stderr().lock().write_all(text.as_bytes()),
                };
            }
            Report::Notice(n) => eprintln!("mutirao run: {n}"),
            Report::Init(r) if self.init_timings => eprintln!("mutirao run: {r}"),
            Report::Init(_) => {}
            // The restart's notices tell it already.
            Report::Recovery(_) => {}
        }
    }
}

pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    if args.n == 0 {
        bail!("-n must be at least 1");
    }
    if let Some(t) = args.timeout {
        if !(t.is_finite() && t > 0.0) {
            bail!("--timeout must be a positive number of seconds");
        }
    }
    let spec = args.spec()?;
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let flag = interrupted.clone();
        // A second handler installation fails only if one exists already; then Ctrl-C still
        // reaches the default action.
        let _ = ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst));
    }
    let watch = args.watch(interrupted);
    let Some(interval) = args.checkpoint_interval else {
        let job = job::Job::start(&spec)?;
        let ended = supervise(&job, spec.n, &watch, &mut |r| args.print(r));
        let _ = std::io::stdout().lock().flush();
        return Ok(ExitCode::from(ended.code));
    };
    if !(interval.is_finite() && interval > 0.0) {
        bail!("--checkpoint-interval must be a positive number of seconds");
    }
    if let Some(m) = args.host_mtbf {
        if !(m.is_finite() && m > 0.0) {
            bail!("--host-mtbf must be a positive number of seconds");
        }
    }
    use mutirao_launch::store::{self, StoreKind};
    let kind = match (&args.checkpoint_store, &spec.hosts) {
        (Some(k), _) => k.clone(),
        (None, Some(h)) if distinct_agents(h) >= 3 => StoreKind::Agents { k: 2 },
        (None, _) => StoreKind::Dir,
    };
    let (dir, owned) = match &args.checkpoint_dir {
        Some(d) => (d.clone(), false),
        None => (
            std::env::current_dir()
                .context("cannot read the current directory")?
                .join(format!("mutirao-ckpt-{}", std::process::id())),
            true,
        ),
    };
    let rank_hosts = store::RankHosts::default();
    let job_name = format!("run-{}-{}", std::process::id(), unix_secs());
    // This run's checkpoint key: blobs and commit records in stores others can reach (agents,
    // S3) are HMACed under it, and on agents it names the job's scope, so neither another job
    // nor a holder of the agent token can read, replace or forge them.
    let ckpt_key = mutirao::pmi::new_token().context("cannot make a checkpoint key")?;
    type Costs = Box<dyn Fn() -> Vec<f64>>;
    type Forget = Box<dyn Fn() -> Result<usize, String>>;
    let (sink, costs, forget): (Arc<dyn CheckpointSink>, Costs, Forget) = match &kind {
        StoreKind::Dir => {
            let s = Arc::new(DirSink::for_program(&dir, args.n as u32, &args.command)?);
            (
                s.clone(),
                Box::new(move || s.wave_costs()),
                Box::new(|| Ok(0)),
            )
        }
        StoreKind::Agents { k } => {
            let (Some(hosts), Some(secret)) = (&spec.hosts, &spec.secret) else {
                bail!("--checkpoint-store agents needs --hostfile (the agents keep the replicas)");
            };
            let scope = mutirao_launch::proto::checkpoint_scope(&ckpt_key, &job_name);
            let rep = store::on_agents(hosts, secret, &scope, *k, rank_hosts.clone())?;
            let s = store::repo_sink(rep, &job_name, args.n, Some(ckpt_key))?;
            let f = s.clone();
            (
                s.clone(),
                Box::new(move || s.wave_costs()),
                Box::new(move || store::forget(f.repo())),
            )
        }
        StoreKind::S3 { bucket, prefix } => {
            let s = store::repo_sink(
                store::s3(bucket, prefix)?,
                &job_name,
                args.n,
                Some(ckpt_key),
            )?;
            let f = s.clone();
            (
                s.clone(),
                Box::new(move || s.wave_costs()),
                Box::new(move || store::forget(f.repo())),
            )
        }
    };
    if kind != StoreKind::Dir {
        eprintln!(
            "mutirao run: checkpoints of job {job_name} go to {}",
            match &kind {
                StoreKind::Agents { k } => format!(
                    "{k} agent(s) other than each rank's host (as many as are left, at least 1, once hosts are lost)"
                ),
                StoreKind::S3 { bucket, prefix } => format!("s3://{bucket}/{prefix}"),
                StoreKind::Dir => unreachable!("handled above"),
            }
        );
    }
    let rec = Recovery {
        sink,
        interval,
        mode: args.checkpoint_mode.into(),
        max_restarts: args.max_restarts,
        rank_hosts: Some(rank_hosts),
    };
    let out = run_with_recovery(&spec, &rec, &watch, &mut |r| args.print(r))?;
    let _ = std::io::stdout().lock().flush();
    if out.code != 0 && !out.restarts.is_empty() && kind == StoreKind::Dir {
        eprintln!(
            "mutirao run: checkpoints are kept in {} (--checkpoint-dir)",
            dir.display()
        );
    }
    let costs = costs();
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
                let (young, daly) = young_daly(med, m / args.n.max(1) as f64);
                eprintln!(
                    "; with --host-mtbf {m} s over {} ranks, Young suggests --checkpoint-interval {young:.1}, Daly {daly:.1}",
                    args.n
                );
            }
            None => eprintln!(" (give --host-mtbf S for an interval suggestion)"),
        }
    }
    if out.code == 0 && owned && kind == StoreKind::Dir && !args.keep_checkpoints {
        let _ = std::fs::remove_dir_all(&dir);
    }
    if out.code == 0 && kind != StoreKind::Dir && !args.keep_checkpoints {
        // The job is done: its checkpoints are of no more use.
        if let Err(e) = forget() {
            eprintln!("mutirao run: could not delete the checkpoints of job {job_name}: {e}");
        }
    } else if kind != StoreKind::Dir && (out.code != 0 || args.keep_checkpoints) {
        eprintln!("mutirao run: the checkpoints of job {job_name} are kept in the store");
    }
    Ok(ExitCode::from(out.code))
}

/// Agents (host, port) a hostfile names, each counted once.
fn distinct_agents(hosts: &[hostfile::HostEntry]) -> usize {
    let mut seen: Vec<(&str, u16)> = hosts.iter().map(|h| (h.host.as_str(), h.port)).collect();
    seen.sort_unstable();
    seen.dedup();
    seen.len()
}

fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
