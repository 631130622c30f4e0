//! `mutirao exec-dag`: run a task graph for real, as a schedule places it, and measure it —
//! the reality check for `simulate` and `schedule`.

use crate::cmd_run::{self, RunArgs};
use anyhow::{bail, Context};
use mutirao_sched::{Dag, Schedule};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Execute a task graph for real and print the measured makespan.
///
/// Every task computes for `work` seconds of the reference host (speed 1.0; each host times the
/// kernel in turn at start: with --model, a task's work means on every host what the model
/// says, the reference rate being the median over hosts of host rate ÷ model speed; without,
/// the fastest host of the run, as `fit` takes it), so slower hosts take longer by themselves,
/// calling into the
/// runtime every millisecond so that messages already sent keep flowing; every edge
/// between tasks on different hosts sends `bytes` bytes through the runtime (the payloads are
/// made before the clock starts, as an application's data would already exist). Each distinct host
/// of the schedule becomes one rank. With --hostfile (or --testbed), each rank runs on the
/// hostfile entry named like its schedule host, or like the address the host was calibrated at
/// (the schedule's `hosts` table, or the testbed's resource spec): any order, any extra lines.
///
/// Examples:
///   mutirao dag gen diamond --k 5 --work 0.01 --bytes 65536 -o d.json
///   mutirao schedule --model m.json --dag d.json --algo hlogp-heft -o s.json
///   mutirao simulate --model m.json --dag d.json --schedule s.json      # predicted
///   mutirao exec-dag --dag d.json --schedule s.json --model m.json      # measured
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct ExecArgs {
    /// The task graph (mutirao-dag/1).
    #[arg(long, value_name = "FILE")]
    pub dag: PathBuf,
    /// The schedule (mutirao-schedule/1): which host runs each task, in which order.
    #[arg(long, value_name = "FILE")]
    pub schedule: PathBuf,
    /// Run on these hosts through their agents (default: all ranks on this machine). Entries
    /// are matched to the schedule's hosts by name or address.
    #[arg(long, value_name = "FILE", conflicts_with = "testbed")]
    pub hostfile: Option<PathBuf>,
    /// The agents' token file (with --hostfile).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Run on the hosts of a running testbed (`mutirao testbed up … --name NAME`): its
    /// hostfile, token and host names.
    #[arg(long, value_name = "NAME")]
    pub testbed: Option<String>,
    /// Print the whole trace as JSON (same shape as `simulate --json`).
    #[arg(long)]
    pub json: bool,
    /// Kernel iterations per second of the reference host (default: measured at start on every
    /// host in turn; see --model). The trace (`--json`) reports the rate used and every host's
    /// measured rate: pass the rate back to time several runs alike.
    #[arg(long, value_name = "N")]
    pub rate: Option<f64>,
    /// The calibrated model the prediction used (mutirao-model/1). The reference rate is then
    /// the median over the hosts of (measured kernel rate ÷ the host's speed in the model), so
    /// that a task takes on each host what the model says up to that host's own measurement
    /// error, instead of every host inheriting the error of the fastest host's one measurement
    /// (default without it: the fastest host's rate, as `fit` takes the fastest host as speed
    /// 1.0). Every schedule host must be in the model.
    #[arg(long, value_name = "FILE")]
    pub model: Option<PathBuf>,
    /// End the run if it takes longer than S seconds.
    #[arg(long, value_name = "S", default_value_t = 600.0)]
    pub timeout: f64,
    #[arg(long, hide = true)]
    pub worker: bool,
    #[arg(long, hide = true)]
    pub out: Option<PathBuf>,
}

/// How far after the barrier the graph starts, so that every rank has the start time by then.
const START_DELAY_S: f64 = 0.1;

/// The fixed computation: dependent multiply-adds the compiler cannot remove.
fn kernel(iters: u64) -> u64 {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for i in 0..iters {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
    }
    x
}

/// Seconds since the Unix epoch, as a float (the shared time origin of the ranks).
fn epoch_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Iterations per second of the kernel on this host, now: the median of 3 runs of at least
/// 0.15 s each. A host throttled by a CPU quota runs in bursts of its quota per period (10 ms on
/// the testbed); 15 periods or more keep the rate within a few percent of its average, where
/// a 30 ms run erred by up to ±9% at 0.6 of a core.
pub fn measure_rate() -> f64 {
    kernel_rate(0.15, 3)
}

/// Iterations per second of the kernel: iterations doubled until one run lasts `min_run_s`,
/// then the median of `runs` runs of that many.
fn kernel_rate(min_run_s: f64, runs: usize) -> f64 {
    let time = |n: u64| {
        let t = Instant::now();
        std::hint::black_box(kernel(n));
        t.elapsed().as_secs_f64().max(1e-9)
    };
    let mut n = 200_000u64;
    while time(n) < min_run_s && n < 1 << 40 {
        n *= 2;
    }
    let mut rates: Vec<f64> = (0..runs.max(1)).map(|_| n as f64 / time(n)).collect();
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

/// A rough kernel rate (iterations per second) in about 20 ms: enough to size a computation
/// whose time is measured anyway (calibrate's push probe).
pub fn measure_rate_briefly() -> f64 {
    kernel_rate(0.02, 1)
}

/// `iters` kernel iterations in slices of `slice`, calling `between` after each (a program
/// overlapping communication with computation tests its requests there, which drives the
/// runtime's progress).
pub fn compute_sliced(
    iters: u64,
    slice: u64,
    mut between: impl FnMut() -> Result<(), mutirao::Error>,
) -> Result<(), mutirao::Error> {
    let mut left = iters;
    while left > 0 {
        let n = left.min(slice.max(1));
        std::hint::black_box(kernel(n));
        left -= n;
        between()?;
    }
    Ok(())
}

#[derive(Serialize, Deserialize)]
struct TaskRun {
    task: usize,
    start_s: f64,
    finish_s: f64,
}

/// What one rank saw: its tasks, when it handed each outgoing message to the runtime, and when
/// each incoming receive was posted and completed (edge index, seconds since the origin).
#[derive(Serialize, Deserialize, Default)]
struct RankRun {
    /// The reference rate every rank used (kernel iterations per second at speed 1.0).
    rate: f64,
    /// Each host's measured kernel rate, by rank (empty when the rate was given).
    #[serde(default)]
    host_rates: Vec<f64>,
    /// How the reference rate was chosen.
    #[serde(default)]
    rate_from: String,
    tasks: Vec<TaskRun>,
    sends: Vec<(usize, f64)>,
    recvs: Vec<(usize, f64, f64)>,
}

/// One message between two hosts, as measured. `send_start_s` is when the sender handed it to
/// the runtime (a nonblocking send), `recv_start_s` when the receiver posted its receive (all of
/// a task's at once) and `recv_end_s` when its wait returned with the data.
#[derive(Serialize)]
struct MessageOut<'a> {
    from: &'a str,
    to: &'a str,
    bytes: u64,
    send_start_s: f64,
    recv_start_s: f64,
    recv_end_s: f64,
}

#[derive(Serialize)]
struct HostOut<'a> {
    name: &'a str,
    busy_s: f64,
    idle_s: f64,
}

#[derive(Serialize)]
struct TaskOut<'a> {
    id: &'a str,
    host: &'a str,
    start_s: f64,
    finish_s: f64,
}

#[derive(Serialize)]
struct HostRate<'a> {
    name: &'a str,
    /// Measured kernel iterations per second.
    rate: f64,
    /// Speed in the model (with --model).
    #[serde(skip_serializing_if = "Option::is_none")]
    model_speed: Option<f64>,
}

#[derive(Serialize)]
struct ExecOut<'a> {
    format: &'static str,
    makespan_s: f64,
    rate: f64,
    /// "given", "fastest host" or "model speeds".
    rate_from: &'a str,
    host_rates: Vec<HostRate<'a>>,
    hosts: Vec<HostOut<'a>>,
    tasks: Vec<TaskOut<'a>>,
    messages: Vec<MessageOut<'a>>,
}

struct Plan {
    dag: Dag,
    hosts: Vec<String>,
    /// Address of each host from the schedule's hosts table, when it has one.
    addrs: Vec<Option<String>>,
    /// Rank of each task.
    rank_of: Vec<usize>,
    /// Per rank, its tasks in scheduled order.
    order: Vec<Vec<usize>>,
}

fn load(dag: &Path, schedule: &Path) -> anyhow::Result<Plan> {
    let dtext = std::fs::read_to_string(dag)
        .with_context(|| format!("cannot read task graph {}", dag.display()))?;
    let dag_v = Dag::from_json(&dtext).with_context(|| format!("in {}", dag.display()))?;
    let stext = std::fs::read_to_string(schedule)
        .with_context(|| format!("cannot read schedule {}", schedule.display()))?;
    let s = Schedule::from_json(&stext).with_context(|| format!("in {}", schedule.display()))?;
    let idx = dag_v.id_index();
    let mut hosts: Vec<String> = Vec::new();
    let mut rank_of = vec![usize::MAX; dag_v.len()];
    let mut entries = Vec::new();
    for (k, st) in s.tasks.iter().enumerate() {
        let Some(&t) = idx.get(st.id.as_str()) else {
            bail!(
                "{}: task {:?} is not in the task graph {}",
                schedule.display(),
                st.id,
                dag.display()
            );
        };
        if rank_of[t] != usize::MAX {
            bail!("{}: task {:?} is placed twice", schedule.display(), st.id);
        }
        let r = match hosts.iter().position(|h| *h == st.host) {
            Some(r) => r,
            None => {
                hosts.push(st.host.clone());
                hosts.len() - 1
            }
        };
        rank_of[t] = r;
        entries.push((r, st.start_s, k, t));
    }
    if let Some(t) = rank_of.iter().position(|r| *r == usize::MAX) {
        bail!(
            "{}: task {:?} of the graph is not placed",
            schedule.display(),
            dag_v.tasks()[t].id
        );
    }
    if dag_v.edges().len() > i32::MAX as usize {
        bail!("the task graph has more edges than message tags");
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)).then(a.2.cmp(&b.2)));
    let mut order = vec![Vec::new(); hosts.len()];
    for (r, _, _, t) in entries {
        order[r].push(t);
    }
    // A rank runs its tasks in scheduled order; a predecessor on the same rank must come first.
    for (r, ts) in order.iter().enumerate() {
        let pos: HashMap<usize, usize> = ts.iter().enumerate().map(|(i, t)| (*t, i)).collect();
        for e in dag_v.edges() {
            if rank_of[e.from] == r && rank_of[e.to] == r && pos[&e.from] > pos[&e.to] {
                bail!(
                    "{}: on host {:?} task {:?} is scheduled before its predecessor {:?}",
                    schedule.display(),
                    hosts[r],
                    dag_v.tasks()[e.to].id,
                    dag_v.tasks()[e.from].id
                );
            }
        }
    }
    let addrs = hosts
        .iter()
        .map(|h| {
            s.hosts
                .iter()
                .find(|x| x.name == *h)
                .and_then(|x| x.addr.clone())
        })
        .collect();
    Ok(Plan {
        dag: dag_v,
        hosts,
        addrs,
        rank_of,
        order,
    })
}

/// Each schedule host's speed in the model at `path`, in rank order.
fn model_speeds(plan: &Plan, path: &Path) -> anyhow::Result<Vec<f64>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read model {}", path.display()))?;
    let m = mutirao_model::Model::from_json(&text)
        .map_err(|e| anyhow::anyhow!("model {}: {e}", path.display()))?;
    plan.hosts
        .iter()
        .map(|h| match m.hosts.iter().find(|x| x.name == *h) {
            Some(x) if x.speed.is_finite() && x.speed > 0.0 => Ok(x.speed),
            Some(x) => bail!("model {}: host {h:?} has speed {}", path.display(), x.speed),
            None => bail!(
                "the schedule's host {h:?} is not in the model {} (its hosts: {}); pass the model the schedule was made with",
                path.display(),
                m.hosts.iter().map(|x| x.name.as_str()).collect::<Vec<_>>().join(", ")
            ),
        })
        .collect()
}

/// The reference rate (kernel iterations per second at speed 1.0) from every host's measured
/// rate: the median of rate ÷ model speed with `speeds`, else the fastest host's rate.
fn reference_rate(rates: &[f64], speeds: Option<&[f64]>) -> (f64, &'static str) {
    match speeds {
        Some(sp) => (
            crate::cmd_calibrate::median(rates.iter().zip(sp).map(|(r, s)| r / s))
                .unwrap_or(f64::NAN),
            "model speeds",
        ),
        None => (rates.iter().copied().fold(0.0, f64::max), "fastest host"),
    }
}

/// Host name → address pairs of a resource spec (domains with an `addr` property).
fn spec_addresses(path: &Path) -> anyhow::Result<Vec<(String, String)>> {
    use mutirao_dir::meu::props::PropValue;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read resource spec {}", path.display()))?;
    let sp = mutirao_dir::meu::spec::parse(&text)
        .with_context(|| format!("resource spec {}", path.display()))?;
    Ok(sp
        .domains
        .iter()
        .filter_map(|d| {
            d.props
                .iter()
                .find(|p| p.name == "addr")
                .and_then(|p| match &p.value {
                    PropValue::Exact(a) => Some((d.name.clone(), a.clone())),
                    _ => None,
                })
        })
        .collect())
}

/// The hostfile for the run: rank i on the entry of `hostfile` that names schedule host i, or
/// its address (from the schedule, or `aliases`). Errors list what the hostfile has.
fn rank_hostfile(
    plan: &Plan,
    hostfile: &str,
    aliases: &[(String, String)],
) -> anyhow::Result<String> {
    let entries = crate::hostfile::parse(hostfile).map_err(anyhow::Error::msg)?;
    let mut out = String::new();
    for (h, addr) in plan.hosts.iter().zip(&plan.addrs) {
        let mut names = vec![h.as_str()];
        names.extend(addr.as_deref());
        names.extend(
            aliases
                .iter()
                .filter(|(n, _)| n == h)
                .map(|(_, a)| a.as_str()),
        );
        names.extend(
            aliases
                .iter()
                .filter(|(_, a)| a == h)
                .map(|(n, _)| n.as_str()),
        );
        let Some(e) = entries.iter().find(|e| names.contains(&e.host.as_str())) else {
            bail!(
                "the schedule's host {h:?}{} is not in the hostfile, which has: {}",
                addr.as_deref()
                    .map(|a| format!(" (address {a})"))
                    .unwrap_or_default(),
                entries
                    .iter()
                    .map(|e| e.host.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        };
        out.push_str(&format!("{} slots=1 port={}\n", e.host, e.port));
    }
    Ok(out)
}

pub fn run(a: ExecArgs) -> anyhow::Result<ExitCode> {
    if a.worker {
        return worker(&a);
    }
    let plan = load(&a.dag, &a.schedule)?;
    let speeds = a
        .model
        .as_ref()
        .map(|m| model_speeds(&plan, m))
        .transpose()?;
    if let Some(r) = a.rate {
        if !(r.is_finite() && r > 0.0) {
            bail!("--rate {r}: must be a positive number");
        }
    }
    let abs = |p: &Path| std::fs::canonicalize(p).with_context(|| format!("{}", p.display()));
    let out = std::env::temp_dir().join(format!("mutirao-exec-{}.json", std::process::id()));
    // Where each rank runs.
    let (source, token, aliases) = match (&a.testbed, &a.hostfile) {
        (Some(name), _) => {
            let f = crate::cmd_testbed::testbed_files(name)?;
            let aliases = spec_addresses(&f.meu)?;
            (
                Some(f.hosts),
                a.token_file.clone().or(Some(f.token)),
                aliases,
            )
        }
        (None, Some(h)) => (Some(h.clone()), a.token_file.clone(), Vec::new()),
        (None, None) => (None, a.token_file.clone(), Vec::new()),
    };
    let ranks_file = match &source {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read hostfile {}", path.display()))?;
            let body = rank_hostfile(&plan, &text, &aliases)
                .with_context(|| format!("in {}", path.display()))?;
            let p = std::env::temp_dir().join(format!("mutirao-exec-{}.hosts", std::process::id()));
            crate::fsutil::write_atomic(&p, body.as_bytes())?;
            Some(p)
        }
        None => None,
    };
    let exe = std::env::current_exe().context("cannot find the mutirao binary")?;
    let mut command = vec![
        exe.display().to_string(),
        "exec-dag".into(),
        "--worker".into(),
        "--dag".into(),
        abs(&a.dag)?.display().to_string(),
        "--schedule".into(),
        abs(&a.schedule)?.display().to_string(),
        "--out".into(),
        out.display().to_string(),
    ];
    if let Some(r) = a.rate {
        command.extend(["--rate".into(), format!("{r}")]);
    }
    if let Some(m) = &a.model {
        command.extend(["--model".into(), abs(m)?.display().to_string()]);
    }
    let code = cmd_run::run(RunArgs::job(
        plan.hosts.len(),
        ranks_file.clone(),
        a.timeout,
        token,
        command,
    ));
    if let Some(p) = &ranks_file {
        let _ = std::fs::remove_file(p);
    }
    let code = code?;
    let result = std::fs::read_to_string(&out);
    let _ = std::fs::remove_file(&out);
    let runs: Vec<RankRun> = match result {
        Ok(t) => serde_json::from_str(&t).context("the workers' trace is malformed")?,
        Err(_) => {
            eprintln!("mutirao exec-dag: the run did not complete; no measurement");
            return Ok(if code == ExitCode::SUCCESS {
                ExitCode::from(1)
            } else {
                code
            });
        }
    };
    report(&plan, &runs, speeds.as_deref(), a.json)?;
    Ok(code)
}

fn report(plan: &Plan, runs: &[RankRun], speeds: Option<&[f64]>, json: bool) -> anyhow::Result<()> {
    let rate = runs.first().map_or(f64::NAN, |r| r.rate);
    let rate_from = runs.first().map_or("", |r| r.rate_from.as_str());
    let host_rates: Vec<HostRate> = runs
        .first()
        .map(|r| r.host_rates.as_slice())
        .unwrap_or_default()
        .iter()
        .zip(&plan.hosts)
        .enumerate()
        .map(|(i, (r, h))| HostRate {
            name: h,
            rate: *r,
            model_speed: speeds.and_then(|s| s.get(i).copied()),
        })
        .collect();
    let tasks = plan.dag.tasks();
    let edges = plan.dag.edges();
    let mut times = vec![(0.0f64, 0.0f64); tasks.len()];
    let mut busy = vec![0.0f64; plan.hosts.len()];
    let mut sent = vec![f64::NAN; edges.len()];
    let mut received = vec![(f64::NAN, f64::NAN); edges.len()];
    for rr in runs {
        for &(e, t) in &rr.sends {
            if let Some(x) = sent.get_mut(e) {
                *x = t;
            }
        }
        for &(e, a, b) in &rr.recvs {
            if let Some(x) = received.get_mut(e) {
                *x = (a, b);
            }
        }
    }
    for (r, rr) in runs.iter().enumerate() {
        for tr in &rr.tasks {
            if tr.task < times.len() {
                times[tr.task] = (tr.start_s, tr.finish_s);
                if let Some(b) = busy.get_mut(r) {
                    *b += tr.finish_s - tr.start_s;
                }
            }
        }
    }
    let makespan = times.iter().map(|t| t.1).fold(0.0, f64::max);
    if json {
        let out = ExecOut {
            format: "mutirao-execution/1",
            makespan_s: makespan,
            rate,
            rate_from,
            host_rates,
            hosts: plan
                .hosts
                .iter()
                .zip(&busy)
                .map(|(h, b)| HostOut {
                    name: h,
                    busy_s: *b,
                    idle_s: makespan - b,
                })
                .collect(),
            tasks: tasks
                .iter()
                .enumerate()
                .map(|(t, task)| TaskOut {
                    id: &task.id,
                    host: &plan.hosts[plan.rank_of[t]],
                    start_s: times[t].0,
                    finish_s: times[t].1,
                })
                .collect(),
            messages: edges
                .iter()
                .enumerate()
                .filter(|(e, _)| sent[*e].is_finite() && received[*e].0.is_finite())
                .map(|(e, edge)| MessageOut {
                    from: &tasks[edge.from].id,
                    to: &tasks[edge.to].id,
                    bytes: edge.bytes,
                    send_start_s: sent[e],
                    recv_start_s: received[e].0,
                    recv_end_s: received[e].1,
                })
                .collect(),
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "makespan_s {makespan:.6} (measured; {} tasks on {} hosts; rate {rate:.4e} iterations/s, {rate_from})",
            tasks.len(),
            plan.hosts.len()
        );
        for (h, b) in plan.hosts.iter().zip(&busy) {
            println!("{h:<28} busy {b:>10.6} s  idle {:>10.6} s", makespan - b);
        }
    }
    Ok(())
}

fn worker(a: &ExecArgs) -> anyhow::Result<ExitCode> {
    let plan = load(&a.dag, &a.schedule)?;
    let world = mutirao::init()?;
    let me = world.rank();
    if world.size() != plan.hosts.len() {
        bail!(
            "started with {} ranks for {} hosts",
            world.size(),
            plan.hosts.len()
        );
    }
    let speeds = a
        .model
        .as_ref()
        .map(|m| model_speeds(&plan, m))
        .transpose()?;
    // The reference rate: given, or from every host's (`reference_rate`). Hosts time the
    // kernel one after the other, so that none of them shares the machine's cores with
    // another's measurement.
    let (rate, host_rates, rate_from) = match a.rate {
        Some(r) => (r, Vec::new(), "given"),
        None => {
            let mut mine = 0.0f64;
            for r in 0..world.size() {
                world.barrier()?;
                if r == me {
                    mine = measure_rate();
                }
            }
            let mut all = vec![0.0f64; world.size()];
            world.allgather(&[mine], &mut all)?;
            let (r, from) = reference_rate(&all, speeds.as_deref());
            (r, all, from)
        }
    };
    if !(rate.is_finite() && rate > 0.0) {
        bail!("no usable kernel rate (measured {host_rates:?}); pass --rate");
    }
    let dag = &plan.dag;
    // The payloads exist before the clock starts, written once so that their pages are mapped:
    // the model charges a send for moving data, not for creating it.
    let mut payloads: HashMap<usize, Vec<u8>> = HashMap::new();
    for &t in &plan.order[me] {
        for &e in dag.out_edges(t) {
            let edge = dag.edges()[e];
            if plan.rank_of[edge.to] != me {
                let len = usize::try_from(edge.bytes).context("edge too large")?;
                payloads.insert(e, vec![0xA5u8; len]);
            }
        }
    }
    world.barrier()?;
    // One time origin for every rank, a little after rank 0's wall clock at the barrier, and
    // every rank waits for it: the graph starts at one instant everywhere, as the model has it.
    // (Barrier exits and the broadcast reach ranks milliseconds apart on a loaded machine, tens
    // of milliseconds on a host throttled to a quarter of a core.) Ranks of one machine (local
    // or testbed) share that clock exactly; real hosts agree as well as NTP does.
    let mut origin = [epoch_s() + START_DELAY_S];
    world.bcast(&mut origin, 0)?;
    let since = |o: f64| epoch_s() - o;
    let t0 = origin[0];
    let ahead = -since(t0);
    if ahead > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(ahead));
    }
    let mut pending: Vec<mutirao::Request<u8>> = Vec::new();
    let mut runs = RankRun {
        rate,
        host_rates,
        rate_from: rate_from.into(),
        ..RankRun::default()
    };
    for &t in &plan.order[me] {
        // Every receive of the task is posted at once (large messages go by rendezvous: their
        // transfers then move together, as an application posting MPI_Irecv for all its
        // inputs and waiting for all would have them); then each is waited for.
        let posted = since(t0);
        let mut incoming = Vec::new();
        for &e in dag.in_edges(t) {
            let edge = dag.edges()[e];
            let src = plan.rank_of[edge.from];
            if src != me {
                incoming.push((e, edge.bytes, world.irecv::<u8>(src, e as i32)?));
            }
        }
        for (e, bytes, req) in incoming {
            let (v, _) = req.wait()?;
            runs.recvs.push((e, posted, since(t0)));
            if v.len() as u64 != bytes {
                bail!("edge {e}: received {} bytes, expected {bytes}", v.len());
            }
        }
        let start = since(t0);
        // Compute in 1 ms slices and let the runtime make progress in between (as an application
        // overlapping computation with communication calls MPI_Test): a large message already
        // sent then flows while this rank computes, which is what the HLogP model assumes.
        let iters = (dag.tasks()[t].work * rate) as u64;
        let slice = ((rate / 1000.0) as u64).max(1);
        compute_sliced(iters, slice, || {
            // Testing the first request not yet done drives the engine for all of them (a
            // finished request's test returns at once without progress).
            for r in pending.iter_mut() {
                if !r.test()? {
                    break;
                }
            }
            Ok(())
        })?;
        let finish = since(t0);
        runs.tasks.push(TaskRun {
            task: t,
            start_s: start,
            finish_s: finish,
        });
        for &e in dag.out_edges(t) {
            let edge = dag.edges()[e];
            let dst = plan.rank_of[edge.to];
            if dst != me {
                let payload = payloads
                    .remove(&e)
                    .with_context(|| format!("edge {e}: its payload was not prepared"))?;
                runs.sends.push((e, since(t0)));
                pending.push(world.isend(payload, dst, e as i32)?);
            }
        }
    }
    mutirao::wait_all(pending)?;
    if me == 0 {
        let mut all = vec![runs];
        for r in 1..world.size() {
            let (v, _): (RankRun, _) = world.recv_obj(r, i32::MAX)?;
            all.push(v);
        }
        if let Some(out) = &a.out {
            crate::fsutil::write_atomic_mode(out, serde_json::to_string(&all)?, 0o600)?;
        }
    } else {
        world.send_obj(&runs, 0, i32::MAX)?;
    }
    world.finalize()?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mutirao_sched::dag::Task;

    fn plan() -> Plan {
        let tasks = (0..3)
            .map(|i| Task {
                id: format!("t{i}"),
                work: 0.1,
            })
            .collect();
        Plan {
            dag: Dag::new(tasks, vec![]).unwrap(),
            hosts: vec!["b1".into(), "a1".into(), "10.213.0.3".into()],
            addrs: vec![Some("10.213.1.2".into()), None, None],
            rank_of: vec![0, 1, 2],
            order: vec![vec![0], vec![1], vec![2]],
        }
    }

    #[test]
    fn ranks_find_their_hosts_by_name_or_address_in_any_order() {
        let hostfile = "10.213.0.3 slots=1 port=7300\n10.213.0.2 slots=2\n10.213.1.2 slots=1\n";
        // a1's address comes from the testbed's resource spec; b1's from the schedule.
        let aliases = vec![("a1".to_string(), "10.213.0.2".to_string())];
        let out = rank_hostfile(&plan(), hostfile, &aliases).unwrap();
        assert_eq!(
            out,
            "10.213.1.2 slots=1 port=7207\n10.213.0.2 slots=1 port=7207\n10.213.0.3 slots=1 port=7300\n"
        );
    }

    #[test]
    fn a_host_missing_from_the_hostfile_is_named_with_what_the_file_has() {
        let e = rank_hostfile(&plan(), "10.213.0.3\n10.213.1.2\n", &[]).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("\"a1\"") && msg.contains("10.213.0.3, 10.213.1.2"),
            "{msg}"
        );
    }
}

#[cfg(test)]
mod rate_tests {
    use super::reference_rate;

    #[test]
    fn with_model_speeds_the_reference_rate_is_the_median_of_rate_over_speed() {
        // Host rates 300, 160, 140 at model speeds 1.0, 0.5, 0.5: per speed 1.0 they say 300,
        // 320, 280 — the median, 300, not the fastest host's alone.
        let (r, from) = reference_rate(&[300.0, 160.0, 140.0], Some(&[1.0, 0.5, 0.5]));
        assert_eq!((r, from), (300.0, "model speeds"));
        // The fastest host measured 20% high: the median of the others' holds.
        let (r, _) = reference_rate(&[360.0, 150.0, 150.0], Some(&[1.0, 0.5, 0.5]));
        assert_eq!(r, 300.0);
        // Even count: the mean of the middle two.
        let (r, _) = reference_rate(&[100.0, 200.0], Some(&[0.5, 1.0]));
        assert_eq!(r, 200.0);
    }

    #[test]
    fn without_a_model_the_reference_rate_is_the_fastest_hosts() {
        assert_eq!(
            reference_rate(&[300.0, 360.0, 150.0], None),
            (360.0, "fastest host")
        );
    }
}
