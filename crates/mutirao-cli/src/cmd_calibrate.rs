//! `mutirao calibrate`: the measuring loop of the HLogP modeller (thesis 000 §11.4, version II).
//!
//! How it runs:
//! 1. This process (the *coordinator*) reads the hostfile (or makes `-n N` local hosts), works
//!    out names and sites, and starts `mutirao run` with one rank per host — two when same-host
//!    pairs are measured (rank `2i` is host `i`'s primary, `2i+1` its mirror) — running this same
//!    binary as `mutirao calibrate --worker CONFIG`.
//! 2. Rank 0 leads: it measures H on every host, one host at a time, makes the plan with
//!    `strategy::plan`, then measures one pair at a time (every other rank waits in a receive for
//!    its next order). Each result is printed by rank 0 as a `@@mutirao-calibrate ` JSON record on
//!    its standard output, which the launcher forwards to the coordinator.
//! 3. The coordinator drives the progress bar from those records, builds the
//!    `mutirao-calib/1` document, and writes it atomically. Because every result leaves rank 0 as
//!    soon as it exists, a host (even rank 0's) dying keeps everything measured before: the file
//!    is marked partial, naming the host, and the command exits 1.

use crate::fsutil::write_atomic;
use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use mutirao::{Comm, ANY_TAG};
use mutirao_model::calib::{
    CalibHost, Calibration, CapacityKind, CapacityMeasurement, LinkProbe, LoadInfo, PLogPSample,
    PairRef, PingPongSample, PushMeasurement, PushSample, SendMode, SpeedMeasurement, SpeedSample,
    StrategyKind,
};
use mutirao_model::strategy::{plan, Plan, PlanHost, PlanOptions};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cmd_fit::{ModeArg, StrategyArg};
use crate::hostfile;

/// Prefix of rank 0's record lines on its standard output.
const RECORD: &str = "@@mutirao-calibrate ";
/// Rank 0 → worker: an order.
const TAG_CTRL: i32 = 1;
/// Worker → rank 0: a result.
const TAG_REPORT: i32 = 2;
/// Ping-pong payload (both directions).
const TAG_DATA: i32 = 10;
/// Measure → mirror: the current size is over.
const TAG_END_SIZE: i32 = 11;
/// Measure → mirror: the sweep is over.
const TAG_END_SWEEP: i32 = 12;
/// PLogP's g(0) stream (measure → mirror) and its acknowledgement.
const TAG_STREAM: i32 = 13;
/// Messages in PLogP's g(0) stream.
const STREAM_K: u32 = 32;
/// Capacity fans: data and the one-byte ready / ack messages around it.
const TAG_FAN: i32 = 14;
/// A push probe's data and its ready / arrived signals.
const TAG_PUSH: i32 = 15;
/// Largest message size accepted by `--sizes` (1 GiB).
const MAX_SIZE: u64 = 1 << 30;
/// The failed "host" recorded when no host is to blame (a timeout, an interruption).
const NO_HOST: &str = "(job)";
/// The H kernel's name in the calibration file.
const KERNEL: &str = "int+matmul";

/// Measure a set of hosts for the HLogP model: H of every host and a version II ping-pong per
/// ordered host pair and message size, through the mutirão runtime's own transports.
///
/// Examples:
///   mutirao calibrate -n 2 --sizes 0,1K,64K -o calib.json
///   mutirao calibrate --hostfile g1.hosts --strategy site-sampled -o calib.json
///   mutirao calibrate --hostfile g1.hosts --sites 10.0.0.2=a,10.0.1.2=b --mode send,isend -o c.json
///
/// Each host of the hostfile needs a running `mutirao agent` and this same binary at the same
/// path. Sites: `--sites`/`--sites-file`, else the /24 of an IPv4 address (`10.213.1`), else
/// `default`. Exit status: 0 complete, 1 partial (a host failed; the file is still written and
/// names it), 2 bad input (nothing written).
#[derive(clap::Args)]
#[command(
    verbatim_doc_comment,
    after_help = "Examples:
  mutirao calibrate -n 2 --sizes 0,1K,64K -o calib.json
  mutirao calibrate --hostfile g1.hosts --strategy site-sampled -o calib.json
  mutirao calibrate --hostfile g1.hosts --sites 10.0.0.2=a,10.0.1.2=b --mode send,isend -o c.json

Each host of the hostfile needs a running `mutirao agent` and this binary at the same path.
Sites: --sites / --sites-file, else the /24 of an IPv4 address (10.213.1), else `default`.
Exit status: 0 complete; 1 partial (a host failed or the time ran out: the file is still
written, marked partial, naming the host); 2 bad input (nothing written)."
)]
pub struct CalibrateArgs {
    /// Hosts to measure (`HOST [slots=N] [port=P]` lines; slots are ignored).
    #[arg(long, value_name = "FILE")]
    hostfile: Option<PathBuf>,
    /// Measure a running testbed (`mutirao testbed up SPEC --name NAME`): its hostfile, agent
    /// token, and host and site names from its resource spec, as if given with --hostfile,
    /// --token-file and --resources.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["hostfile", "token_file", "resources", "sites_file"])]
    testbed: Option<String>,
    /// Do not measure link capacities. By default, after the sweeps, each host sends to (and
    /// receives from) its same-site peers at once, and one host of each site sends to every
    /// host of each other site at once: the aggregate rates become the model's NIC and site-link
    /// capacities, which the contention model of `simulate` and `schedule` shares among
    /// messages in flight.
    #[arg(long)]
    no_capacity: bool,
    /// Do not measure the hosts' push cost. By default, after the capacities, each host computes
    /// for a fixed time alone and again while a rendezvous message (1 MiB, or twice the eager
    /// limit) moves to a peer of its site, testing the send between 1 ms slices as a program
    /// overlapping communication does: what the message added is the model's `push_cost`,
    /// which the contention simulator charges to senders. Without it `fit` derives the cost
    /// from the slope of the eager send overhead, which leaves out what moving a large message
    /// costs beyond its copy.
    #[arg(long)]
    no_push: bool,
    /// Without --hostfile: number of hosts emulated on this machine (`local0`, `local1`, …).
    #[arg(short = 'n', long = "hosts", default_value_t = 2, value_name = "N")]
    n: usize,
    /// Which pairs to measure.
    #[arg(long, value_enum, default_value = "all-pairs")]
    strategy: StrategyArg,
    /// Send modes to measure (comma list): `isend` (nonblocking, Os = posting only), `send`.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "isend")]
    mode: Vec<ModeArg>,
    /// Message sizes in bytes (comma list; K and M suffixes are KiB and MiB).
    #[arg(
        long,
        default_value = "0,64,256,1K,4K,16K,32K,64K,128K,256K,512K,1M",
        value_name = "LIST"
    )]
    sizes: String,
    /// Most timed repetitions per size.
    #[arg(long, default_value_t = 40, value_name = "R")]
    reps: u32,
    /// Fewest timed repetitions per size.
    #[arg(long, default_value_t = 5, value_name = "R")]
    min_reps: u32,
    /// Untimed warm-up repetitions before each size.
    #[arg(long, default_value_t = 1)]
    warmup: u32,
    /// Stop repeating a size after this many seconds once --min-reps are done.
    #[arg(long, default_value_t = 0.3, value_name = "S")]
    time_per_size: f64,
    /// Stop a size early once its median round trip is known within this fraction: after
    /// --min-reps timed repetitions when the median's standard error is under half of it; and
    /// for slow sizes, once --time-per-size is spent, after 2 timed repetitions that agree
    /// within it (a 1 MiB round trip over a 40 Mbit/s link takes 0.45 s; five of them per pair
    /// would dominate the calibration). 0 turns both off.
    #[arg(long, default_value_t = 0.02, value_name = "FRACTION")]
    precision: f64,
    /// Measure every ordered pair with its own ping-pong, as the thesis's version II(a) did.
    /// By default an unordered pair is measured once and both directions are recorded: the
    /// echo of a → b's ping-pong is b → a's message (Os of b, Or of a, the same L), and the
    /// calibration lists such pairs under provenance.echoed.
    #[arg(long)]
    both_directions: bool,
    /// Also measure PLogP (Kielmann et al., the thesis's version I) for every planned pair:
    /// RTT(0), g(0) from a stream of empty messages, RTT(m) of m bytes answered by an empty
    /// message, Os(m) and Or(m), blocking sends.
    #[arg(long)]
    plogp: bool,
    /// Sites of hosts, `HOST=SITE` (comma list, repeatable); HOST as in the hostfile.
    #[arg(long, value_delimiter = ',', value_name = "HOST=SITE")]
    sites: Vec<String>,
    /// File of `HOST SITE [NAME]` lines (`#` comments): sites and, optionally, names.
    #[arg(long, value_name = "FILE", conflicts_with = "resources")]
    sites_file: Option<PathBuf>,
    /// A mεμ resource spec (e.g. the `NAME.meu` that `mutirao testbed up` writes): a domain
    /// with an `addr` property is a host, named as the domain; its site is its nearest
    /// ancestor with the quality `site`. Hosts of the hostfile that it lacks keep the
    /// default site.
    #[arg(long, value_name = "FILE")]
    resources: Option<PathBuf>,
    /// Do not measure same-host pairs (then one rank per host is started).
    #[arg(long)]
    no_same_host: bool,
    /// Type-sampled: relative tolerance for putting two hosts in one cluster.
    #[arg(long, default_value_t = 0.10)]
    tolerance: f64,
    /// H kernel repetitions per run (default: chosen by rank 0 so that a run takes about
    /// 0.1 s on its host; every host runs the same number).
    #[arg(long)]
    speed_reps: Option<u64>,
    /// H kernel runs per host, in rounds (each round runs every host once, one at a time). H is
    /// the least CPU time of a host's runs times their median wall/CPU ratio (its share of the
    /// processor), per repetition; see docs/calibration.md.
    #[arg(long, default_value_t = 5)]
    speed_runs: u32,
    /// Eager limit of the calibration job (bytes, K/M suffixes), or `runtime`. Default:
    /// `runtime`, the runtime's own (`MUTIRAO_EAGER_LIMIT` if set, else 64 KiB to TCP peers and
    /// the ring size to shared-memory peers): the model then describes messages as programs
    /// send them. A byte count above the largest size makes every message eager, so that its
    /// wire time shows in L as in the thesis's version II; with rendezvous the receiver's probe
    /// returns before the data moves, so the transfer lands in Or.
    #[arg(long, value_name = "BYTES|runtime")]
    eager_limit: Option<String>,
    /// The agents' shared secret (as for `mutirao run`).
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// End the calibration after S seconds (the file is written, marked partial).
    #[arg(long, default_value_t = 3600.0, value_name = "S")]
    timeout: f64,
    /// Where to write the calibration (mutirao-calib/1 JSON); written atomically.
    #[arg(short, long, required_unless_present = "worker")]
    output: Option<PathBuf>,
    /// Internal: run as a rank of the calibration job (started by the coordinator).
    #[arg(long, hide = true, value_name = "CONFIG")]
    worker: Option<String>,
    /// Testing: the primary rank of HOST kills itself after taking part in K sweeps.
    #[arg(long, hide = true, value_name = "HOST:K")]
    fault_kill: Option<String>,
}

/// A host as the job sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct HostSpec {
    name: String,
    site: String,
    address: String,
}

/// Everything rank 0 needs; passed as JSON on the workers' command line.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct WorkerConfig {
    hosts: Vec<HostSpec>,
    same_host: bool,
    strategy: StrategyKind,
    tolerance: f64,
    modes: Vec<SendMode>,
    sizes: Vec<u64>,
    reps: u32,
    min_reps: u32,
    warmup: u32,
    time_per_size: f64,
    precision: f64,
    both_directions: bool,
    speed_reps: Option<u64>,
    speed_runs: u32,
    fault_kill: Option<(usize, u32)>,
    plogp: bool,
    /// Measure link capacities with concurrent streams after the sweeps.
    #[serde(default)]
    capacity: bool,
    /// Bytes of the push probe's rendezvous message; no probe when `None`.
    #[serde(default)]
    push_bytes: Option<u64>,
}

/// One pass over the planned pairs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
enum Pass {
    PingPong(SendMode),
    Plogp,
}

impl Pass {
    fn label(self) -> &'static str {
        match self {
            Pass::PingPong(m) => m.as_str(),
            Pass::Plogp => "plogp",
        }
    }
}

impl WorkerConfig {
    fn passes(&self) -> Vec<Pass> {
        let mut v: Vec<Pass> = self.modes.iter().map(|m| Pass::PingPong(*m)).collect();
        if self.plogp {
            v.push(Pass::Plogp);
        }
        v
    }
    fn ranks_per_host(&self) -> usize {
        if self.same_host {
            2
        } else {
            1
        }
    }
    fn host_of_rank(&self, r: usize) -> usize {
        r / self.ranks_per_host()
    }
    fn primary(&self, host: usize) -> usize {
        host * self.ranks_per_host()
    }
}

/// Rank 0 → coordinator.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
enum Record {
    Host {
        host: CalibHost,
    },
    Plan {
        plan: Plan,
    },
    Probe {
        probe: LinkProbe,
    },
    Capacity {
        capacity: CapacityMeasurement,
    },
    Push {
        push: PushMeasurement,
    },
    Sweep {
        src: String,
        dst: String,
        mode: SendMode,
        /// Per size: bytes, warm-up repetitions done, samples.
        sizes: Vec<SizeSamples>,
        /// The samples are the echo direction of the dst → src ping-pong.
        #[serde(default)]
        echo: bool,
    },
    Plogp {
        src: String,
        dst: String,
        sizes: Vec<(u64, Vec<PLogPSample>)>,
    },
    Progress {
        done: u64,
        total: u64,
        what: String,
    },
    Failed {
        host: String,
        reason: String,
    },
    Done,
}

/// Rank 0 → worker.
#[derive(Debug, Serialize, Deserialize)]
enum Ctrl {
    Speed {
        reps: u64,
        runs: u32,
    },
    Measure {
        peer: usize,
        pass: Pass,
        sizes: Vec<u64>,
        p: RepParams,
    },
    Mirror {
        peer: usize,
        pass: Pass,
    },
    /// Concurrent streams between `center` and each of `peers` (`out`: center sends), `bytes`
    /// each, `reps` times; the center times each repetition.
    Fan {
        center: usize,
        peers: Vec<usize>,
        out: bool,
        bytes: u64,
        reps: u32,
    },
    /// `center` computes about `compute_s` seconds alone, then the same while sending `bytes`
    /// to `peer` (which has posted its receive), `reps` times; the center times each.
    Push {
        center: usize,
        peer: usize,
        bytes: u64,
        compute_s: f64,
        reps: u32,
    },
    Done,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct RepParams {
    reps: u32,
    min_reps: u32,
    warmup: u32,
    time_per_size: f64,
    precision: f64,
}

/// One measure-side repetition (µs).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct MeasureRep {
    /// An untimed warm-up repetition.
    #[serde(default)]
    warm: bool,
    rtt: f64,
    os: f64,
    probe: f64,
    or: f64,
    wait: Option<f64>,
}

type Failure = (Option<usize>, String);

/// The measure side's result of a sweep. For PLogP the first size is the RTT(0) phase.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct MeasureOut {
    sizes: Vec<(u64, Vec<MeasureRep>)>,
    /// PLogP's g(0) (µs).
    g0: Option<f64>,
}

/// Worker → rank 0.
#[derive(Debug, Serialize, Deserialize)]
enum Report {
    Speed {
        os: String,
        loadavg: String,
        samples: Vec<(f64, f64)>,
    },
    Measure(Result<MeasureOut, Failure>),
    /// Per size: (Or, Os) of every repetition.
    Mirror(Result<Vec<Vec<(f64, f64)>>, Failure>),
    /// Seconds per repetition (the center), or nothing (a peer).
    Fan(Result<Vec<f64>, Failure>),
    /// Per repetition (the center): seconds alone, while sending, and until the send completed.
    Push(Result<PushTimes, Failure>),
}

fn failure(e: &mutirao::Error) -> Failure {
    match e {
        mutirao::Error::PeerFailed { rank, .. } => (Some(*rank), e.to_string()),
        mutirao::Error::PeerFinalized(rank) => (Some(*rank), e.to_string()),
        _ => (None, e.to_string()),
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

// ------------------------------------------------------------------ parsing (pure)

/// Parse `--sizes`: a comma list of byte counts with optional K/M (KiB/MiB) suffixes; sorted,
/// duplicates removed.
pub fn parse_sizes(text: &str) -> anyhow::Result<Vec<u64>> {
    let mut out = Vec::new();
    for (i, item) in text.split(',').enumerate() {
        let t = item.trim();
        let (num, mul) = match t.chars().last() {
            Some('K') | Some('k') => (&t[..t.len() - 1], 1024u64),
            Some('M') | Some('m') => (&t[..t.len() - 1], 1024 * 1024),
            _ => (t, 1),
        };
        let v = num
            .parse::<u64>()
            .ok()
            .and_then(|v| v.checked_mul(mul))
            .with_context(|| {
                format!(
                    "--sizes item {} ({t:?}) is not a byte count; use e.g. 0,1024,64K,1M",
                    i + 1
                )
            })?;
        if v > MAX_SIZE {
            bail!("--sizes item {} ({t}) is larger than 1 GiB", i + 1);
        }
        out.push(v);
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Default site of a hostfile host: the first three octets of an IPv4 address, else `default`.
fn default_site(host: &str) -> String {
    match host.parse::<std::net::Ipv4Addr>() {
        Ok(a) => {
            let o = a.octets();
            format!("{}.{}.{}", o[0], o[1], o[2])
        }
        Err(_) => "default".into(),
    }
}

/// Apply `--sites` items and a sites file to `hosts` (keyed by their original name).
/// `ADDR SITE NAME` lines (the sites-file format) for the hosts of `hosts` that the mεμ spec
/// `text` describes: a domain with an exact `addr` property is a host; its site is its nearest
/// ancestor with the quality `site`.
fn sites_from_resources(path: &str, text: &str, hosts: &[String]) -> anyhow::Result<String> {
    use mutirao_dir::meu::props::PropValue;
    use mutirao_dir::meu::spec;
    let sp = spec::parse(text).with_context(|| format!("resource spec {path}"))?;
    let by_label: std::collections::HashMap<&str, &spec::DomainSpec> = sp
        .domains
        .iter()
        .filter_map(|d| d.label.as_deref().map(|l| (l, d)))
        .collect();
    let prop = |d: &spec::DomainSpec, name: &str| -> Option<PropValue> {
        d.props
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.value.clone())
    };
    let mut out = String::new();
    let mut found = 0;
    for d in &sp.domains {
        let Some(PropValue::Exact(addr)) = prop(d, "addr") else {
            continue;
        };
        found += 1;
        if !hosts.contains(&addr) {
            continue;
        }
        // Climb to the nearest ancestor that is a site (a cycle cannot pass `parse`'s checks,
        // but the climb is bounded anyway).
        let mut cur = d;
        let mut site = None;
        for _ in 0..sp.domains.len() {
            let Some(up) = cur
                .ancestor
                .as_ref()
                .and_then(|a| by_label.get(a.label.as_str()))
            else {
                break;
            };
            if prop(up, "site") == Some(PropValue::Flag) {
                site = Some(up.name.clone());
                break;
            }
            cur = up;
        }
        let Some(site) = site else {
            bail!(
                "resource spec {path} line {}: host {:?} ({addr}) has no ancestor with the quality `site`",
                d.line,
                d.name
            );
        };
        for (what, v) in [("site", &site), ("host", &d.name)] {
            if v.is_empty() || v.contains(char::is_whitespace) {
                bail!(
                    "resource spec {path} line {}: {what} name {v:?} must be one word to name a host or site",
                    d.line
                );
            }
        }
        out.push_str(&format!("{addr} {site} {}\n", d.name));
    }
    if found == 0 {
        bail!(
            "resource spec {path} has no domain with an `addr` property, so it names no host; \
             give the NAME.meu that `mutirao testbed up` wrote, or use --sites-file"
        );
    }
    Ok(out)
}

fn apply_sites(
    hosts: &mut [HostSpec],
    items: &[String],
    file: Option<(&str, &str)>,
) -> anyhow::Result<()> {
    let known = |hosts: &[HostSpec]| {
        hosts
            .iter()
            .map(|h| h.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut renames: Vec<(usize, String)> = Vec::new();
    if let Some((path, text)) = file {
        for (ln, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let w: Vec<&str> = line.split_whitespace().collect();
            if !(2..=3).contains(&w.len()) {
                bail!(
                    "{path} line {}: expected `HOST SITE [NAME]`, found {raw:?}",
                    ln + 1
                );
            }
            let Some(i) = hosts.iter().position(|h| h.name == w[0]) else {
                bail!(
                    "{path} line {}: unknown host {:?} (hosts: {})",
                    ln + 1,
                    w[0],
                    known(hosts)
                );
            };
            hosts[i].site = w[1].to_string();
            if let Some(n) = w.get(2) {
                renames.push((i, n.to_string()));
            }
        }
    }
    for item in items {
        let Some((h, s)) = item.split_once('=') else {
            bail!("--sites {item:?}: expected HOST=SITE");
        };
        if s.trim().is_empty() {
            bail!("--sites {item:?}: the site is empty");
        }
        let Some(i) = hosts.iter().position(|x| x.name == h.trim()) else {
            bail!(
                "--sites {item:?}: unknown host {:?} (hosts: {})",
                h.trim(),
                known(hosts)
            );
        };
        hosts[i].site = s.trim().to_string();
    }
    for (i, n) in renames {
        hosts[i].name = n;
    }
    for (i, h) in hosts.iter().enumerate() {
        if hosts[..i].iter().any(|o| o.name == h.name) {
            bail!("host name {:?} is used twice; host names must be unique (a host listed twice in the hostfile, or a NAME in the sites file)", h.name);
        }
    }
    Ok(())
}

// ------------------------------------------------------------------ coordinator

/// `mutirao calibrate`.
pub fn run(a: CalibrateArgs) -> anyhow::Result<ExitCode> {
    if let Some(cfg) = &a.worker {
        return worker(cfg);
    }
    let output = a.output.clone().context("-o/--output is required")?;
    let mut a = a;
    if let Some(name) = &a.testbed {
        let f = crate::cmd_testbed::testbed_files(name)?;
        a.hostfile = Some(f.hosts);
        a.token_file = Some(f.token);
        a.resources = Some(f.meu);
    }
    let sizes = parse_sizes(&a.sizes)?;
    if sizes.len() < 3 {
        bail!(
            "--sizes {:?} has {} distinct size(s); `fit` needs at least 3 per link (an \
             intercept, a slope and a size to check them), e.g. --sizes 0,64K,1M",
            a.sizes,
            sizes.len()
        );
    }
    if a.reps == 0 || a.min_reps == 0 || a.min_reps > a.reps {
        bail!(
            "--reps ({}) and --min-reps ({}) must be at least 1, with --min-reps <= --reps",
            a.reps,
            a.min_reps
        );
    }
    if !(a.time_per_size.is_finite() && a.time_per_size >= 0.0) {
        bail!("--time-per-size must be a number of seconds >= 0");
    }
    if !(a.precision.is_finite() && (0.0..1.0).contains(&a.precision)) {
        bail!("--precision must be a fraction in [0, 1), e.g. 0.02 for 2%");
    }
    if !(a.timeout.is_finite() && a.timeout > 0.0) {
        bail!("--timeout must be a positive number of seconds");
    }
    if a.speed_reps == Some(0) || a.speed_runs == 0 {
        bail!("--speed-reps and --speed-runs must be at least 1");
    }
    if !(a.tolerance.is_finite() && a.tolerance >= 0.0) {
        bail!("--tolerance must be a finite number >= 0");
    }
    let mut modes: Vec<SendMode> = Vec::new();
    for m in &a.mode {
        let m = SendMode::from(*m);
        if !modes.contains(&m) {
            modes.push(m);
        }
    }
    // Hosts: names, sites, addresses, agent ports.
    let (mut hosts, ports): (Vec<HostSpec>, Vec<u16>) = match &a.hostfile {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("cannot read hostfile {}", p.display()))?;
            let entries =
                hostfile::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
            entries
                .iter()
                .map(|e| {
                    (
                        HostSpec {
                            name: e.host.clone(),
                            site: default_site(&e.host),
                            address: format!("{}:{}", e.host, e.port),
                        },
                        e.port,
                    )
                })
                .unzip()
        }
        None => {
            if a.n == 0 {
                bail!("-n must be at least 1");
            }
            (0..a.n)
                .map(|i| {
                    (
                        HostSpec {
                            name: format!("local{i}"),
                            site: "local".into(),
                            address: "127.0.0.1".into(),
                        },
                        0,
                    )
                })
                .unzip()
        }
    };
    let hostfile_names: Vec<String> = hosts.iter().map(|h| h.name.clone()).collect();
    let sites_text = match (&a.sites_file, &a.resources) {
        (Some(p), _) => Some(
            std::fs::read_to_string(p)
                .with_context(|| format!("cannot read sites file {}", p.display()))?,
        ),
        (None, Some(p)) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("cannot read resource spec {}", p.display()))?;
            Some(sites_from_resources(
                &p.display().to_string(),
                &text,
                &hostfile_names,
            )?)
        }
        (None, None) => None,
    };
    let sites_path = a
        .sites_file
        .as_ref()
        .or(a.resources.as_ref())
        .map(|p| p.display().to_string());
    apply_sites(
        &mut hosts,
        &a.sites,
        sites_path.as_deref().zip(sites_text.as_deref()),
    )?;
    let fault_kill = match &a.fault_kill {
        None => None,
        Some(s) => {
            let (h, k) = s
                .rsplit_once(':')
                .context("--fault-kill expects HOST:SWEEPS")?;
            let i = hosts
                .iter()
                .position(|x| x.name == h)
                .with_context(|| format!("--fault-kill: unknown host {h:?}"))?;
            Some((
                i,
                k.parse().context("--fault-kill: SWEEPS is not a number")?,
            ))
        }
    };
    let mut cfg = WorkerConfig {
        hosts: hosts.clone(),
        same_host: !a.no_same_host,
        strategy: strategy_kind(a.strategy),
        tolerance: a.tolerance,
        modes,
        sizes,
        reps: a.reps,
        min_reps: a.min_reps,
        warmup: a.warmup,
        time_per_size: a.time_per_size,
        precision: a.precision,
        both_directions: a.both_directions,
        speed_reps: a.speed_reps,
        speed_runs: a.speed_runs,
        fault_kill,
        plogp: a.plogp,
        capacity: !a.no_capacity,
        push_bytes: None,
    };
    // A plan with placeholder speeds checks the strategy's input before anything starts.
    let probe_hosts: Vec<PlanHost> = hosts
        .iter()
        .map(|h| PlanHost::with_h(&h.name, &h.site, 1.0))
        .collect();
    plan(
        cfg.strategy,
        &probe_hosts,
        &PlanOptions {
            same_host: cfg.same_host,
            tolerance: cfg.tolerance,
            ..PlanOptions::default()
        },
    )?;
    let eager: Option<u64> = match a.eager_limit.as_deref() {
        Some("runtime") => None,
        Some(t) => Some(
            parse_sizes(t)
                .ok()
                .filter(|v| v.len() == 1)
                .and_then(|v| v.first().copied())
                .with_context(|| {
                    format!("--eager-limit {t:?}: expected a byte count (e.g. 4M) or `runtime`")
                })?,
        ),
        None => None,
    };
    // The push probe sends a rendezvous message: 1 MiB, or twice the eager limit if that is
    // larger; none when the limit makes every message of a program eager in practice.
    let effective_eager = eager
        .or_else(|| {
            std::env::var("MUTIRAO_EAGER_LIMIT")
                .ok()
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(mutirao::config::DEFAULT_EAGER_LIMIT as u64);
    cfg.push_bytes =
        (!a.no_push && effective_eager <= 8 << 20).then(|| (1u64 << 20).max(2 * effective_eager));
    let exe = std::env::current_exe().context("cannot find this program's path")?;
    let nranks = hosts.len() * cfg.ranks_per_host();
    let mut cmd = Command::new(&exe);
    cmd.arg("run").arg("-n").arg(nranks.to_string());
    cmd.arg("--timeout").arg(a.timeout.to_string());
    let tmp_hostfile = match &a.hostfile {
        Some(_) => {
            let mut text = String::new();
            for (h, port) in hostfile_names.iter().zip(&ports) {
                text.push_str(&format!("{h} slots={} port={port}\n", cfg.ranks_per_host()));
            }
            let p = std::env::temp_dir()
                .join(format!("mutirao-calibrate-{}.hosts", std::process::id()));
            std::fs::write(&p, text).with_context(|| format!("cannot write {}", p.display()))?;
            cmd.arg("--hostfile").arg(&p);
            Some(p)
        }
        None => None,
    };
    if let Some(t) = &a.token_file {
        cmd.arg("--token-file").arg(t);
    }
    cmd.arg("--")
        .arg(&exe)
        .arg("calibrate")
        .arg("--worker")
        .arg(serde_json::to_string(&cfg)?);
    if let Some(e) = eager {
        // The launcher passes every MUTIRAO_* variable on to local and remote ranks.
        cmd.env("MUTIRAO_EAGER_LIMIT", e.to_string());
    }
    // A same-host pair's few repetitions per size never wrap a shared-memory ring: without
    // this, every repetition up to 2 MiB of traffic paid fresh page faults (32 KiB one-way
    // 34–60 µs instead of 6.5 µs). Start-up pays it once (two ranks per host: ~2 ms).
    if std::env::var_os("MUTIRAO_SHM_PREFAULT").is_none() {
        cmd.env("MUTIRAO_SHM_PREFAULT", "1");
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let f = interrupted.clone();
        // Fails only if a handler exists already; Ctrl-C then keeps its default action.
        let _ = ctrlc::set_handler(move || f.store(true, Ordering::SeqCst));
    }
    let started = now_ms();
    let outcome = coordinate(cmd, &cfg, &hostfile_names);
    if let Some(p) = tmp_hostfile {
        let _ = std::fs::remove_file(p);
    }
    let mut outcome = outcome?;
    if interrupted.load(Ordering::SeqCst) && !outcome.done {
        outcome.launcher_errors.push("interrupted (Ctrl-C)".into());
    }
    let mut c = Calibration::new(
        cfg.strategy,
        concat!("mutirao ", env!("CARGO_PKG_VERSION")),
        started,
    );
    c.provenance.eager_limit_bytes = Some(match eager {
        Some(e) => e,
        None => std::env::var("MUTIRAO_EAGER_LIMIT")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(mutirao::config::DEFAULT_EAGER_LIMIT as u64),
    });
    let eager_text = match (eager, std::env::var("MUTIRAO_EAGER_LIMIT")) {
        (Some(e), _) => format!("eager limit {e} B"),
        (None, Ok(v)) => format!("eager limit {v} B (MUTIRAO_EAGER_LIMIT)"),
        (None, Err(_)) => "runtime's default eager limit".into(),
    };
    c.provenance.transport = match std::env::var("MUTIRAO_TRANSPORT").as_deref() {
        Ok("tcp") => format!("tcp; {eager_text}"),
        _ => format!("auto (tcp between hosts, shared memory within a host); {eager_text}"),
    };
    for (i, h) in hosts.iter().enumerate() {
        let host = outcome.hosts.remove(&i).unwrap_or_else(|| {
            let mut x = CalibHost::new(&h.name, &h.site, &h.address);
            x.os = None;
            x
        });
        c.add_host(host)?;
    }
    for s in &outcome.sweeps {
        for (bytes, warmup, samples) in &s.sizes {
            if !samples.is_empty() {
                c.record_pingpong(&s.src, &s.dst, s.mode, *bytes, *warmup, samples)?;
            }
        }
        let pr = PairRef {
            src: s.src.clone(),
            dst: s.dst.clone(),
        };
        if s.echo && !c.provenance.echoed.contains(&pr) {
            c.provenance.echoed.push(pr);
        }
    }
    for (src, dst, sizes) in &outcome.plogp {
        for (bytes, samples) in sizes {
            if !samples.is_empty() {
                c.record_plogp(src, dst, *bytes, samples)?;
            }
        }
    }
    if let Some(p) = &outcome.plan {
        p.record_in(&mut c);
    }
    c.provenance.link_probes = outcome.probes.clone();
    c.capacity = outcome.capacity.clone();
    c.push = outcome.push.clone();
    let mut failed = outcome.failed.clone();
    if !outcome.done && failed.is_empty() {
        // Rank 0 could not say why: take the launcher's words, and the host they name.
        let mut reason = if outcome.launcher_errors.is_empty() {
            format!(
                "the calibration job ended before finishing (launcher exit status {})",
                outcome.status
            )
        } else {
            outcome.launcher_errors.join("; ")
        };

        let by_rank = outcome
            .launcher_errors
            .iter()
            .find_map(|e| launcher_rank(e))
            .map(|r| cfg.host_of_rank(r))
            .filter(|i| *i < hosts.len());
        let host = by_rank
            .or_else(|| {
                hostfile_names
                    .iter()
                    .enumerate()
                    .filter(|(_, n)| reason.contains(n.as_str()))
                    .max_by_key(|(_, n)| n.len())
                    .map(|(i, _)| i)
            })
            .map(|i| hosts[i].name.clone())
            .unwrap_or_else(|| NO_HOST.into());
        if !outcome.doing.is_empty() {
            reason.push_str(&format!(" (while measuring {})", outcome.doing));
        }
        failed.push((host, reason));
    }
    for (h, r) in &failed {
        c.mark_partial(h, r);
    }
    if !cfg.same_host && failed.is_empty() {
        // One rank per host measures no same-host pair: measure two ranks on this machine
        // through the runtime's shared memory, so the model gets a same-host class.
        eprintln!("mutirao calibrate: measuring two ranks on this host (same-host class)");
        match launcher_same_host(&exe, &a, eager) {
            Ok(sw) => c.launcher_same_host = Some(sw),
            Err(e) => eprintln!(
                "mutirao calibrate: warning: could not measure the same-host class on this host: {e:#}; `mutirao fit` will refuse the calibration"
            ),
        }
    }
    c.finalize(now_ms());
    c.validate()
        .context("internal error: the calibration built from the measurements is invalid")?;
    write_atomic(&output, c.to_json())?;
    let measured = c.pairs.len();
    if failed.is_empty() {
        eprintln!(
            "mutirao calibrate: {} hosts, {measured} sweeps in {:.1} s; wrote {}",
            hosts.len(),
            (now_ms() - started) as f64 / 1000.0,
            output.display()
        );
        Ok(ExitCode::SUCCESS)
    } else {
        for (h, r) in &failed {
            if h == NO_HOST {
                eprintln!("mutirao calibrate: the calibration ended early: {r}");
            } else {
                eprintln!("mutirao calibrate: host {h} failed: {r}");
            }
        }
        eprintln!(
            "mutirao calibrate: wrote a PARTIAL calibration ({measured} sweeps kept) to {}",
            output.display()
        );
        Ok(ExitCode::from(1))
    }
}

/// A sweep between two ranks on the launcher's host, with the main calibration's sizes, modes
/// and eager limit (a nested `mutirao calibrate -n 1`), named after this host.
fn launcher_same_host(
    exe: &std::path::Path,
    a: &CalibrateArgs,
    eager: Option<u64>,
) -> anyhow::Result<mutirao_model::calib::PairSweep> {
    let out = std::env::temp_dir().join(format!(
        "mutirao-calibrate-{}-same.json",
        std::process::id()
    ));
    let mut cmd = Command::new(exe);
    cmd.arg("calibrate")
        .arg("-n")
        .arg("1")
        .arg("--no-capacity")
        .arg("--speed-runs")
        .arg("1")
        .arg("--sizes")
        .arg(&a.sizes)
        .arg("--reps")
        .arg(a.reps.to_string())
        .arg("--min-reps")
        .arg(a.min_reps.to_string())
        .arg("--precision")
        .arg(a.precision.to_string())
        .arg("--eager-limit")
        .arg(eager.map_or("runtime".to_string(), |e| e.to_string()))
        .arg("-o")
        .arg(&out);
    for m in &a.mode {
        cmd.arg("--mode").arg(match m {
            ModeArg::Send => "send",
            ModeArg::Isend => "isend",
        });
    }
    let st = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .context("cannot start the same-host calibration")?;
    let text = std::fs::read_to_string(&out);
    let _ = std::fs::remove_file(&out);
    if !st.status.success() {
        bail!(
            "the same-host calibration failed: {}",
            String::from_utf8_lossy(&st.stderr).trim()
        );
    }
    let c = Calibration::from_json(&text.context("the same-host calibration wrote nothing")?)?;
    let mut sw = c
        .pairs
        .into_iter()
        .find(|p| p.src == p.dst)
        .context("the same-host calibration measured no same-host pair")?;
    let me = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let me = if me.is_empty() {
        "launcher".to_string()
    } else {
        me
    };
    sw.src = me.clone();
    sw.dst = me;
    Ok(sw)
}

/// The rank a launcher message (`rank 3 on HOST exited …`) is about.
fn launcher_rank(msg: &str) -> Option<usize> {
    let rest = msg.strip_prefix("rank ")?;
    let (num, tail) = rest.split_once(' ')?;
    if !tail.starts_with("on ") {
        return None;
    }
    num.parse().ok()
}

fn strategy_kind(s: StrategyArg) -> StrategyKind {
    match s {
        StrategyArg::AllPairs => StrategyKind::AllPairs,
        StrategyArg::SiteSampled => StrategyKind::SiteSampled,
        StrategyArg::TypeSampled => StrategyKind::TypeSampled,
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

struct SweepRec {
    src: String,
    dst: String,
    mode: SendMode,
    sizes: Vec<SizeSamples>,
    echo: bool,
}

/// A PLogP sweep: source, destination, samples per size.
type PlogpRec = (String, String, Vec<(u64, Vec<PLogPSample>)>);

struct Outcome {
    hosts: BTreeMap<usize, CalibHost>,
    plan: Option<Plan>,
    probes: Vec<LinkProbe>,
    capacity: Vec<CapacityMeasurement>,
    push: Vec<PushMeasurement>,
    sweeps: Vec<SweepRec>,
    plogp: Vec<PlogpRec>,
    failed: Vec<(String, String)>,
    done: bool,
    /// What rank 0 last said it was doing.
    doing: String,
    status: String,
    launcher_errors: Vec<String>,
}

/// Run the job, follow rank 0's records, show progress.
fn coordinate(
    mut cmd: Command,
    cfg: &WorkerConfig,
    hostfile_names: &[String],
) -> anyhow::Result<Outcome> {
    let mut child = cmd
        .spawn()
        .context("cannot start `mutirao run` for the calibration job")?;
    let bar = ProgressBar::new(cfg.hosts.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let stderr = child.stderr.take().context("no stderr pipe")?;
    let errs = {
        let bar = bar.clone();
        std::thread::spawn(move || {
            // The launcher's own verdicts first, then errors it (or a rank) gave up with.
            let (mut launcher, mut errors) = (Vec::new(), Vec::new());
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix("mutirao run: ") {
                    launcher.push(rest.to_string());
                } else if let Some(rest) = line.strip_prefix("mutirao: error: ") {
                    errors.push(rest.to_string());
                }
                bar.suspend(|| eprintln!("{line}"));
            }
            launcher.extend(errors);
            launcher
        })
    };
    let mut out = Outcome {
        hosts: BTreeMap::new(),
        plan: None,
        probes: Vec::new(),
        capacity: Vec::new(),
        push: Vec::new(),
        sweeps: Vec::new(),
        plogp: Vec::new(),
        failed: Vec::new(),
        done: false,
        doing: String::new(),
        status: String::new(),
        launcher_errors: Vec::new(),
    };
    let stdout = child.stdout.take().context("no stdout pipe")?;
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        let Some(json) = line.strip_prefix(RECORD) else {
            bar.suspend(|| eprintln!("{line}"));
            continue;
        };
        let rec: Record = match serde_json::from_str(json) {
            Ok(r) => r,
            Err(e) => {
                bar.suspend(|| eprintln!("mutirao calibrate: unreadable record ({e}): {json}"));
                continue;
            }
        };
        match rec {
            Record::Host { host } => {
                if let Some(i) = cfg.hosts.iter().position(|h| h.name == host.name) {
                    out.hosts.insert(i, host);
                }
            }
            Record::Plan { plan } => out.plan = Some(plan),
            Record::Probe { probe } => out.probes.push(probe),
            Record::Capacity { capacity } => out.capacity.push(capacity),
            Record::Push { push } => out.push.push(push),
            Record::Sweep {
                src,
                dst,
                mode,
                sizes,
                echo,
            } => out.sweeps.push(SweepRec {
                src,
                dst,
                mode,
                sizes,
                echo,
            }),
            Record::Progress { done, total, what } => {
                bar.set_length(total);
                bar.set_position(done);
                bar.set_message(what.clone());
                out.doing = what;
            }
            Record::Plogp { src, dst, sizes } => out.plogp.push((src, dst, sizes)),
            Record::Failed { host, reason } => out.failed.push((host, reason)),
            Record::Done => out.done = true,
        }
    }
    let status = child.wait().context("waiting for the calibration job")?;
    bar.finish_and_clear();
    out.launcher_errors = errs.join().unwrap_or_default();
    out.status = status
        .code()
        .map(|c| c.to_string())
        .unwrap_or_else(|| "killed".into());
    let _ = hostfile_names;
    Ok(out)
}

// ------------------------------------------------------------------ ranks

fn emit(rec: &Record) {
    let line = format!(
        "{RECORD}{}\n",
        serde_json::to_string(rec).expect("records always serialize")
    );
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(line.as_bytes());
    let _ = out.flush();
}

fn worker(cfg_text: &str) -> anyhow::Result<ExitCode> {
    let cfg: WorkerConfig =
        serde_json::from_str(cfg_text).context("--worker: the configuration is not valid")?;
    let comm = mutirao::init()?;
    let expected = cfg.hosts.len() * cfg.ranks_per_host();
    if comm.size() != expected {
        bail!(
            "the job has {} ranks, the configuration expects {expected}",
            comm.size()
        );
    }
    if comm.rank() == 0 {
        return leader(&comm, &cfg);
    }
    let mut sweeps = 0u32;
    let me = cfg.host_of_rank(comm.rank());
    // When the leader (rank 0) is gone there is nothing left to do: leave quietly with status 0,
    // so that the launcher reports the rank that really failed, not us.
    let leader_gone = |e: &mutirao::Error| {
        matches!(
            e,
            mutirao::Error::PeerFailed { rank: 0, .. } | mutirao::Error::PeerFinalized(0)
        )
    };
    loop {
        let ctrl = match comm.recv_obj::<Ctrl>(0, TAG_CTRL) {
            Ok((c, _)) => c,
            Err(e) if leader_gone(&e) => return Ok(ExitCode::SUCCESS),
            Err(e) => return Err(e.into()),
        };
        let report = match ctrl {
            Ctrl::Speed { reps, runs } => speed_report(reps, runs),
            Ctrl::Measure {
                peer,
                pass,
                sizes,
                p,
            } => {
                fault_check(&cfg, me, comm.rank(), &mut sweeps);
                Report::Measure(measure(&comm, peer, pass, &sizes, p).map_err(|e| failure(&e)))
            }
            Ctrl::Mirror { peer, pass } => {
                fault_check(&cfg, me, comm.rank(), &mut sweeps);
                Report::Mirror(mirror(&comm, peer, pass).map_err(|e| failure(&e)))
            }
            Ctrl::Fan {
                center,
                peers,
                out,
                bytes,
                reps,
            } => Report::Fan(fan(&comm, center, &peers, out, bytes, reps).map_err(|e| failure(&e))),
            Ctrl::Push {
                center,
                peer,
                bytes,
                compute_s,
                reps,
            } => Report::Push(
                push_part(&comm, center, peer, bytes, compute_s, reps).map_err(|e| failure(&e)),
            ),
            Ctrl::Done => break,
        };
        match comm.send_obj(&report, 0, TAG_REPORT) {
            Ok(()) => {}
            Err(e) if leader_gone(&e) => return Ok(ExitCode::SUCCESS),
            Err(e) => return Err(e.into()),
        }
    }
    comm.finalize()?;
    Ok(ExitCode::SUCCESS)
}

/// Test hook (`--fault-kill HOST:K`): the host's primary rank dies abruptly in its K+1-th sweep.
fn fault_check(cfg: &WorkerConfig, host: usize, rank: usize, sweeps: &mut u32) {
    if let Some((h, k)) = cfg.fault_kill {
        if h == host && rank == cfg.primary(host) {
            if *sweeps >= k {
                // SAFETY: kill(2) on our own pid has no memory-safety preconditions.
                unsafe {
                    libc::kill(std::process::id() as i32, libc::SIGKILL);
                }
            }
            *sweeps += 1;
        }
    }
}

/// Emits the host record of every host with at least one H run (taking its runs); returns H
/// per host (`None` for a host without runs).
fn speed_records(
    cfg: &WorkerConfig,
    speed_reps: u64,
    runs: &mut [Vec<(f64, f64)>],
    first: &mut [Option<(String, String)>],
) -> Vec<Option<f64>> {
    let mut h_us = Vec::with_capacity(cfg.hosts.len());
    for (i, spec) in cfg.hosts.iter().enumerate() {
        let (Some((os, loadavg)), false) = (first[i].take(), runs[i].is_empty()) else {
            h_us.push(None);
            continue;
        };
        let speed = SpeedMeasurement {
            kernel: KERNEL.into(),
            reps: speed_reps,
            samples: std::mem::take(&mut runs[i])
                .into_iter()
                .map(|(wall_us, cpu_us)| SpeedSample { wall_us, cpu_us })
                .collect(),
        };
        h_us.push(speed.h_us());
        let host = CalibHost {
            os: Some(os),
            speed: Some(speed),
            load: LoadInfo::from_proc_loadavg(&loadavg),
            ..CalibHost::new(&spec.name, &spec.site, &spec.address)
        };
        emit(&Record::Host { host });
    }
    h_us
}

/// Rank 0: H of every host, the plan, then every sweep, one at a time.
fn leader(comm: &Comm, cfg: &WorkerConfig) -> anyhow::Result<ExitCode> {
    let n = cfg.hosts.len();
    let mut done = 0u64;
    let mut total = n as u64 * u64::from(cfg.speed_runs);
    let fail = |host: usize, reason: String| -> anyhow::Result<ExitCode> {
        emit(&Record::Failed {
            host: cfg.hosts[host].name.clone(),
            reason,
        });
        Ok(ExitCode::from(3))
    };
    let mut leader_sweeps = 0u32;
    let speed_reps = cfg
        .speed_reps
        .unwrap_or_else(|| auto_speed_reps(Duration::from_millis(100)));
    // H in rounds: every round runs the kernel once on every host, one host at a time, so a
    // slow spell of the machine (another job, a noisy neighbour) spreads over all hosts' runs
    // instead of landing on whichever host was being measured; H comes from all of a host's
    // runs (`SpeedMeasurement::h_us`). If a host fails, the hosts measured so far are still
    // recorded before the failure is.
    let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new(); n];
    let mut first: Vec<Option<(String, String)>> = vec![None; n];
    for round in 0..cfg.speed_runs {
        for (i, spec) in cfg.hosts.iter().enumerate() {
            emit(&Record::Progress {
                done,
                total,
                what: format!("H of {} (run {}/{})", spec.name, round + 1, cfg.speed_runs),
            });
            let r = cfg.primary(i);
            let rep = if r == 0 {
                speed_report(speed_reps, 1)
            } else {
                let sent = comm.send_obj(
                    &Ctrl::Speed {
                        reps: speed_reps,
                        runs: 1,
                    },
                    r,
                    TAG_CTRL,
                );
                match sent.and_then(|_| comm.recv_obj::<Report>(r, TAG_REPORT)) {
                    Ok((rep, _)) => rep,
                    Err(e) => {
                        speed_records(cfg, speed_reps, &mut runs, &mut first);
                        return fail(i, format!("while measuring its speed: {e}"));
                    }
                }
            };
            let Report::Speed {
                os,
                loadavg,
                samples,
            } = rep
            else {
                speed_records(cfg, speed_reps, &mut runs, &mut first);
                return fail(i, "answered the speed order with something else".into());
            };
            runs[i].extend(samples);
            // The OS and the load as they were before this host's first run.
            first[i].get_or_insert((os, loadavg));
            done += 1;
        }
    }
    let h_us = speed_records(cfg, speed_reps, &mut runs, &mut first);
    let link = if cfg.strategy == StrategyKind::TypeSampled {
        match link_probes(comm, cfg, &mut done, &mut total, &mut leader_sweeps) {
            Ok(l) => l,
            Err((host, why)) => return fail(host, why),
        }
    } else {
        vec![None; n]
    };
    let plan_hosts: Vec<PlanHost> = cfg
        .hosts
        .iter()
        .zip(&h_us)
        .zip(&link)
        .map(|((h, s), l)| {
            let mut p = match s {
                Some(v) if *v > 0.0 => PlanHost::with_h(&h.name, &h.site, *v),
                _ => PlanHost::new(&h.name, &h.site),
            };
            p.link = *l;
            p
        })
        .collect();
    let p = plan(
        cfg.strategy,
        &plan_hosts,
        &PlanOptions {
            same_host: cfg.same_host,
            tolerance: cfg.tolerance,
            ..PlanOptions::default()
        },
    )?;
    emit(&Record::Plan { plan: p.clone() });
    total += (p.measure.len() * cfg.passes().len()) as u64;
    let index = |name: &str| cfg.hosts.iter().position(|h| h.name == name);
    let params = RepParams {
        reps: cfg.reps,
        min_reps: cfg.min_reps,
        warmup: cfg.warmup,
        time_per_size: cfg.time_per_size,
        precision: cfg.precision,
    };
    let planned: HashSet<(&str, &str)> = p
        .measure
        .iter()
        .map(|x| (x.src.as_str(), x.dst.as_str()))
        .collect();
    for pass in cfg.passes() {
        // Pairs already recorded in this pass as the echo of their reverse.
        let mut echoed: HashSet<(&str, &str)> = HashSet::new();
        for pair in &p.measure {
            let (Some(a), Some(b)) = (index(&pair.src), index(&pair.dst)) else {
                bail!("the plan names a host that is not in the job: {pair:?}");
            };
            if echoed.contains(&(pair.src.as_str(), pair.dst.as_str())) {
                continue; // `done` was counted when its reverse was measured
            }
            emit(&Record::Progress {
                done,
                total,
                what: format!("{} -> {} ({})", pair.src, pair.dst, pass.label()),
            });
            let (mres, rres) = match run_pair(
                comm,
                cfg,
                a,
                b,
                pass,
                &cfg.sizes,
                params,
                &mut leader_sweeps,
            ) {
                Ok(x) => x,
                Err((host, why)) => return fail(host, why),
            };
            match (mres, rres) {
                (Some(Ok(m)), Some(Ok(r))) => match pass {
                    Pass::PingPong(mode) => {
                        let sizes = combine(&m.sizes, &r);
                        let reverse = (pair.dst.as_str(), pair.src.as_str());
                        if !cfg.both_directions && a != b && planned.contains(&reverse) {
                            emit(&Record::Sweep {
                                src: pair.dst.clone(),
                                dst: pair.src.clone(),
                                mode,
                                sizes: sizes
                                    .iter()
                                    .map(|(m, w, v)| (*m, *w, v.iter().map(echo_sample).collect()))
                                    .collect(),
                                echo: true,
                            });
                            echoed.insert(reverse);
                            done += 1;
                        }
                        emit(&Record::Sweep {
                            src: pair.src.clone(),
                            dst: pair.dst.clone(),
                            mode,
                            sizes,
                            echo: false,
                        })
                    }
                    Pass::Plogp => emit(&Record::Plogp {
                        src: pair.src.clone(),
                        dst: pair.dst.clone(),
                        sizes: combine_plogp(&m, &r, cfg.warmup),
                    }),
                },
                (m, r) => {
                    let errs: Vec<Failure> = [m.and_then(|x| x.err()), r.and_then(|x| x.err())]
                        .into_iter()
                        .flatten()
                        .collect();
                    // The first error that names a failed rank names the host.
                    let (rank, reason) = errs
                        .iter()
                        .find(|(r, _)| r.is_some())
                        .or(errs.first())
                        .cloned()
                        .unwrap_or((None, "unknown failure".into()));
                    let host = rank.map(|r| cfg.host_of_rank(r)).unwrap_or(a);
                    return fail(
                        host,
                        format!(
                            "during {} -> {} ({}): {reason}",
                            pair.src,
                            pair.dst,
                            pass.label()
                        ),
                    );
                }
            }
            done += 1;
        }
    }
    if cfg.capacity && n >= 2 {
        for job in capacity_jobs(cfg) {
            emit(&Record::Progress {
                done,
                total,
                what: format!("capacity: {}", job.label),
            });
            match capacity_job(comm, cfg, &job) {
                Ok(Some(c)) => emit(&Record::Capacity { capacity: c }),
                Ok(None) => {}
                Err((host, why)) => return fail(host, why),
            }
        }
    }
    if let (Some(bytes), true) = (cfg.push_bytes, n >= 2) {
        for (host, peer) in push_jobs(cfg) {
            emit(&Record::Progress {
                done,
                total,
                what: format!("push cost of {}", cfg.hosts[host].name),
            });
            match push_probe(comm, cfg, host, peer, bytes) {
                Ok(p) => emit(&Record::Push { push: p }),
                Err((host, why)) => return fail(host, why),
            }
        }
    }
    emit(&Record::Progress {
        done,
        total,
        what: "done".into(),
    });
    for r in 1..comm.size() {
        comm.send_obj(&Ctrl::Done, r, TAG_CTRL)?;
    }
    emit(&Record::Done);
    comm.clone().finalize()?;
    Ok(ExitCode::SUCCESS)
}

/// One capacity measurement to make: a center host and its peers (host indices).
struct CapJob {
    label: String,
    kind: CapacityKind,
    center: usize,
    peers: Vec<usize>,
    out: bool,
    from_site: Option<String>,
    to_site: Option<String>,
}

/// What to measure: per host, NIC out (to its same-site peers, else to every other host) and NIC
/// in (from the same); per ordered pair of sites, one host of the first sending to every host of
/// the second at once.
fn capacity_jobs(cfg: &WorkerConfig) -> Vec<CapJob> {
    let n = cfg.hosts.len();
    let mut jobs = Vec::new();
    for (i, h) in cfg.hosts.iter().enumerate() {
        let same: Vec<usize> = (0..n)
            .filter(|&j| j != i && cfg.hosts[j].site == h.site)
            .collect();
        let peers = if same.is_empty() {
            (0..n).filter(|&j| j != i).collect()
        } else {
            same
        };
        for out in [true, false] {
            jobs.push(CapJob {
                label: format!("NIC {} of {}", if out { "out" } else { "in" }, h.name),
                kind: if out {
                    CapacityKind::NicOut
                } else {
                    CapacityKind::NicIn
                },
                center: i,
                peers: peers.clone(),
                out,
                from_site: None,
                to_site: None,
            });
        }
    }
    let mut sites: Vec<&str> = Vec::new();
    for h in &cfg.hosts {
        if !sites.contains(&h.site.as_str()) {
            sites.push(&h.site);
        }
    }
    for a in &sites {
        for b in &sites {
            if a == b {
                continue;
            }
            let Some(center) = cfg.hosts.iter().position(|h| h.site == *a) else {
                continue;
            };
            let peers: Vec<usize> = (0..n).filter(|&j| cfg.hosts[j].site == *b).collect();
            jobs.push(CapJob {
                label: format!("site link {a} -> {b}"),
                kind: CapacityKind::SiteLink,
                center,
                peers,
                out: true,
                from_site: Some(a.to_string()),
                to_site: Some(b.to_string()),
            });
        }
    }
    jobs
}

/// Seconds one capacity measurement aims at, and its repetitions.
const CAP_TARGET_S: f64 = 0.3;
const CAP_REPS: u32 = 3;

/// Run one fan on the hosts' primary ranks; `Ok(None)` when it has no peer.
fn capacity_job(
    comm: &Comm,
    cfg: &WorkerConfig,
    job: &CapJob,
) -> Result<Option<CapacityMeasurement>, (usize, String)> {
    if job.peers.is_empty() {
        return Ok(None);
    }
    let k = job.peers.len() as f64;
    // A short probe sizes the real run to about CAP_TARGET_S.
    let probe_bytes = 256u64 << 10;
    let t = run_fan(comm, cfg, job, probe_bytes, 1)?;
    let rate = k * probe_bytes as f64 / t.iter().copied().fold(f64::INFINITY, f64::min).max(1e-6);
    let bytes = ((rate * CAP_TARGET_S / k) as u64).clamp(256 << 10, 64 << 20);
    let times = run_fan(comm, cfg, job, bytes, CAP_REPS)?;
    let samples_mbit: Vec<f64> = times
        .iter()
        .map(|t| k * bytes as f64 * 8.0 / t.max(1e-9) / 1e6)
        .collect();
    let name = |i: usize| cfg.hosts[i].name.clone();
    Ok(Some(CapacityMeasurement {
        kind: job.kind,
        host: match job.kind {
            CapacityKind::SiteLink => None,
            _ => Some(name(job.center)),
        },
        from_site: job.from_site.clone(),
        to_site: job.to_site.clone(),
        streams: job
            .peers
            .iter()
            .map(|&p| {
                if job.out {
                    PairRef::new(&name(job.center), &name(p))
                } else {
                    PairRef::new(&name(p), &name(job.center))
                }
            })
            .collect(),
        bytes_per_stream: bytes,
        median_mbit: median(samples_mbit.iter().copied()).unwrap_or(0.0),
        samples_mbit,
    }))
}

/// Order the fan on every rank involved (the leader takes its own part), collect the center's
/// times.
fn run_fan(
    comm: &Comm,
    cfg: &WorkerConfig,
    job: &CapJob,
    bytes: u64,
    reps: u32,
) -> Result<Vec<f64>, (usize, String)> {
    let center = cfg.primary(job.center);
    let peers: Vec<usize> = job.peers.iter().map(|&h| cfg.primary(h)).collect();
    let ctrl = Ctrl::Fan {
        center,
        peers: peers.clone(),
        out: job.out,
        bytes,
        reps,
    };
    let mut ranks = vec![center];
    ranks.extend(&peers);
    order_on(
        comm,
        cfg,
        &ranks,
        &ctrl,
        &job.label,
        || fan(comm, center, &peers, job.out, bytes, reps),
        |rep| match rep {
            Report::Fan(r) => Some(r),
            _ => None,
        },
    )
}

/// Order one measurement on `ranks`, the first of which (the center) times it: the order goes to
/// every other rank, the leader (rank 0) takes its own part with `local` if it is one of them,
/// then every rank's report is read, `pick` taking the result out of a report of the expected
/// kind (`None`: another kind). The center's result is returned; an error names the host and
/// `label`.
fn order_on<T>(
    comm: &Comm,
    cfg: &WorkerConfig,
    ranks: &[usize],
    ctrl: &Ctrl,
    label: &str,
    local: impl FnOnce() -> Result<T, mutirao::Error>,
    pick: impl Fn(Report) -> Option<Result<T, Failure>>,
) -> Result<T, (usize, String)> {
    let center = ranks[0];
    let host_of = |r: usize| cfg.host_of_rank(r);
    for &r in ranks {
        if r != 0 {
            comm.send_obj(ctrl, r, TAG_CTRL)
                .map_err(|e| (host_of(r), format!("during {label}: {e}")))?;
        }
    }
    let mut result = None;
    if ranks.contains(&0) {
        let t = local().map_err(|e| (0, format!("during {label}: {e}")))?;
        if center == 0 {
            result = Some(t);
        }
    }
    for &r in ranks {
        if r == 0 {
            continue;
        }
        let rep = comm
            .recv_obj::<Report>(r, TAG_REPORT)
            .map_err(|e| (host_of(r), format!("during {label}: {e}")))?
            .0;
        match pick(rep) {
            Some(Ok(t)) => {
                if r == center {
                    result = Some(t);
                }
            }
            Some(Err((rank, why))) => {
                return Err((
                    rank.map(host_of).unwrap_or(host_of(r)),
                    format!("during {label}: {why}"),
                ))
            }
            None => {
                return Err((
                    host_of(r),
                    format!("answered the order for {label} with something else"),
                ))
            }
        }
    }
    result.ok_or_else(|| (host_of(center), format!("{label}: no timing came back")))
}

/// This rank's part of a fan. Out: each peer posts its receive and says ready; the center starts
/// its clock, sends to every peer at once and stops it at the last acknowledgement. In: the
/// center posts its receives, starts its clock and tells every peer to go; it stops at the last
/// arrival. Returns the center's seconds per repetition (empty for a peer).
fn fan(
    comm: &Comm,
    center: usize,
    peers: &[usize],
    out: bool,
    bytes: u64,
    reps: u32,
) -> Result<Vec<f64>, mutirao::Error> {
    let me = comm.rank();
    let len = bytes as usize;
    let mut times = Vec::new();
    let mut one = [0u8; 1];
    for _ in 0..reps {
        if me == center {
            if out {
                for &p in peers {
                    comm.recv(&mut one, p, TAG_FAN)?;
                }
                let t = Instant::now();
                let reqs = peers
                    .iter()
                    .map(|&p| comm.isend(vec![0u8; len], p, TAG_FAN))
                    .collect::<Result<Vec<_>, _>>()?;
                mutirao::wait_all(reqs)?;
                for &p in peers {
                    comm.recv(&mut one, p, TAG_FAN)?;
                }
                times.push(t.elapsed().as_secs_f64());
            } else {
                let reqs = peers
                    .iter()
                    .map(|&p| comm.irecv_into(vec![0u8; len], p, TAG_FAN))
                    .collect::<Result<Vec<_>, _>>()?;
                let t = Instant::now();
                for &p in peers {
                    comm.send(&one, p, TAG_FAN)?;
                }
                mutirao::wait_all(reqs)?;
                times.push(t.elapsed().as_secs_f64());
            }
        } else if peers.contains(&me) {
            if out {
                let req = comm.irecv_into(vec![0u8; len], center, TAG_FAN)?;
                comm.send(&one, center, TAG_FAN)?;
                req.wait()?;
                comm.send(&one, center, TAG_FAN)?;
            } else {
                comm.recv(&mut one, center, TAG_FAN)?;
                comm.send(&vec![0u8; len], center, TAG_FAN)?;
            }
        }
    }
    Ok(times)
}

/// Per host, the peer its push probe sends to: the first other host of its site, else the first
/// other host (host indices).
fn push_jobs(cfg: &WorkerConfig) -> Vec<(usize, usize)> {
    let n = cfg.hosts.len();
    (0..n)
        .filter_map(|i| {
            let same = (0..n).find(|&j| j != i && cfg.hosts[j].site == cfg.hosts[i].site);
            same.or_else(|| (0..n).find(|&j| j != i)).map(|j| (i, j))
        })
        .collect()
}

/// Per push repetition (the center's): seconds alone, while sending, and until the send completed.
type PushTimes = Vec<(f64, f64, f64)>;

/// Computation a push repetition lasts: at least this, and about twice the message's transfer
/// alone so that the transfer ends while the host computes (its whole cost then falls inside).
const PUSH_MIN_S: f64 = 0.1;
const PUSH_MAX_S: f64 = 1.0;
const PUSH_REPS: u32 = 5;

/// One host's push probe: a transfer alone first (to size the computation, and the message if
/// the link is slow), then `PUSH_REPS` repetitions of the computation alone and while sending.
fn push_probe(
    comm: &Comm,
    cfg: &WorkerConfig,
    host: usize,
    peer: usize,
    bytes: u64,
) -> Result<PushMeasurement, (usize, String)> {
    let label = format!(
        "the push probe of {} (to {})",
        cfg.hosts[host].name, cfg.hosts[peer].name
    );
    let transfer = run_push(comm, cfg, host, peer, bytes, 0.0, 1, &label)?
        .first()
        .map_or(0.0, |t| t.2);
    // On a slow link, a smaller message (still well above the eager limit it was sized from).
    let bytes = if 2.0 * transfer > PUSH_MAX_S {
        ((bytes as f64 * PUSH_MAX_S / (2.0 * transfer)) as u64).max(bytes / 2 + 1)
    } else {
        bytes
    };
    let compute_s = (2.0 * transfer).clamp(PUSH_MIN_S, PUSH_MAX_S);
    let reps = run_push(comm, cfg, host, peer, bytes, compute_s, PUSH_REPS, &label)?;
    Ok(PushMeasurement {
        host: cfg.hosts[host].name.clone(),
        peer: cfg.hosts[peer].name.clone(),
        bytes,
        samples: reps
            .iter()
            .map(|&(alone_s, sending_s, _)| PushSample { alone_s, sending_s })
            .collect(),
    })
}

/// Order a push probe on both hosts' primary ranks (the leader takes its own part), collect
/// the center's times.
#[allow(clippy::too_many_arguments)]
fn run_push(
    comm: &Comm,
    cfg: &WorkerConfig,
    host: usize,
    peer: usize,
    bytes: u64,
    compute_s: f64,
    reps: u32,
    label: &str,
) -> Result<PushTimes, (usize, String)> {
    let center = cfg.primary(host);
    let other = cfg.primary(peer);
    let ctrl = Ctrl::Push {
        center,
        peer: other,
        bytes,
        compute_s,
        reps,
    };
    order_on(
        comm,
        cfg,
        &[center, other],
        &ctrl,
        label,
        || push_part(comm, center, other, bytes, compute_s, reps),
        |rep| match rep {
            Report::Push(r) => Some(r),
            _ => None,
        },
    )
}

/// This rank's part of a push probe. The center, per repetition: computes alone; waits for the
/// peer's "receive posted"; starts its clock, sends, computes the same in 1 ms slices testing
/// the send between them (as exec-dag's ranks and programs overlapping communication do), stops
/// the clock at the end of the computation and again when the send completes; waits for the
/// peer's "arrived". Returns (alone, sending, until sent) seconds per repetition (empty for
/// the peer).
fn push_part(
    comm: &Comm,
    center: usize,
    peer: usize,
    bytes: u64,
    compute_s: f64,
    reps: u32,
) -> Result<PushTimes, mutirao::Error> {
    let me = comm.rank();
    let len = bytes as usize;
    let mut one = [0u8; 1];
    let mut out = Vec::new();
    if me == center {
        let rate = if compute_s > 0.0 {
            crate::cmd_exec::measure_rate_briefly()
        } else {
            0.0
        };
        let iters = (rate * compute_s) as u64;
        let slice = ((rate / 1000.0) as u64).max(1);
        for _ in 0..reps {
            let t = Instant::now();
            crate::cmd_exec::compute_sliced(iters, slice, || Ok(()))?;
            let alone = t.elapsed().as_secs_f64();
            comm.recv(&mut one, peer, TAG_PUSH)?;
            let t = Instant::now();
            let mut req = comm.isend(vec![0u8; len], peer, TAG_PUSH)?;
            let mut sent = false;
            crate::cmd_exec::compute_sliced(iters, slice, || {
                if !sent {
                    sent = req.test()?;
                }
                Ok(())
            })?;
            let sending = t.elapsed().as_secs_f64();
            req.wait()?;
            let until_sent = t.elapsed().as_secs_f64();
            comm.recv(&mut one, peer, TAG_PUSH)?;
            out.push((alone, sending, until_sent));
        }
    } else if me == peer {
        for _ in 0..reps {
            let req = comm.irecv_into(vec![0u8; len], center, TAG_PUSH)?;
            comm.send(&one, center, TAG_PUSH)?;
            req.wait()?;
            comm.send(&one, center, TAG_PUSH)?;
        }
    }
    Ok(out)
}

/// Bytes of a type-sampled link probe.
const PROBE_BYTES: u64 = 1 << 20;

/// Type-sampled: a preliminary link speed for every host of a site with two or more hosts, so
/// that hosts behind slower links (an old NIC on the same switch) form their own cluster. The
/// hosts of a site are probed in a ring (each with the next; one probe for two hosts), a 1 MiB
/// ping-pong each (one warm-up, two timed); a host's speed is the faster of its probes in MB/s,
/// so a fast host next to a slow one still shows its own speed through its other neighbour.
fn link_probes(
    comm: &Comm,
    cfg: &WorkerConfig,
    done: &mut u64,
    total: &mut u64,
    leader_sweeps: &mut u32,
) -> Result<Vec<Option<f64>>, (usize, String)> {
    let n = cfg.hosts.len();
    let mut sites: Vec<&str> = Vec::new();
    for h in &cfg.hosts {
        if !sites.contains(&h.site.as_str()) {
            sites.push(&h.site);
        }
    }
    let mut pairs = Vec::new();
    for site in sites {
        let m: Vec<usize> = (0..n).filter(|&i| cfg.hosts[i].site == site).collect();
        match m.len() {
            0 | 1 => {}
            2 => pairs.push((m[0], m[1])),
            k => pairs.extend((0..k).map(|j| (m[j], m[(j + 1) % k]))),
        }
    }
    *total += pairs.len() as u64;
    let params = RepParams {
        reps: 2,
        min_reps: 2,
        warmup: 1,
        time_per_size: 0.0,
        precision: 0.0,
    };
    let mut link: Vec<Option<f64>> = vec![None; n];
    for (a, b) in pairs {
        let (sa, sb) = (&cfg.hosts[a].name, &cfg.hosts[b].name);
        emit(&Record::Progress {
            done: *done,
            total: *total,
            what: format!("link probe {sa} -> {sb}"),
        });
        let pass = Pass::PingPong(SendMode::Isend);
        let (m, r) = run_pair(comm, cfg, a, b, pass, &[PROBE_BYTES], params, leader_sweeps)?;
        let rtt = match (m, r) {
            (Some(Ok(m)), Some(Ok(_))) => m
                .sizes
                .first()
                .and_then(|(_, reps)| median(reps.iter().filter(|x| !x.warm).map(|x| x.rtt))),
            (m, r) => {
                let errs: Vec<Failure> = [m.and_then(|x| x.err()), r.and_then(|x| x.err())]
                    .into_iter()
                    .flatten()
                    .collect();
                let (rank, reason) = errs
                    .iter()
                    .find(|(r, _)| r.is_some())
                    .or(errs.first())
                    .cloned()
                    .unwrap_or((None, "unknown failure".into()));
                let host = rank.map(|r| cfg.host_of_rank(r)).unwrap_or(a);
                return Err((
                    host,
                    format!("during the link probe {sa} -> {sb}: {reason}"),
                ));
            }
        };
        if let Some(rtt) = rtt.filter(|r| *r > 0.0) {
            emit(&Record::Probe {
                probe: LinkProbe {
                    src: sa.clone(),
                    dst: sb.clone(),
                    bytes: PROBE_BYTES,
                    rtt_us: rtt,
                },
            });
            let mb_s = PROBE_BYTES as f64 / (rtt / 2.0);
            for h in [a, b] {
                link[h] = Some(link[h].map_or(mb_s, |x: f64| x.max(mb_s)));
            }
        }
        *done += 1;
    }
    Ok(link)
}

/// The two halves of one sweep as rank 0 collected them.
type PairResult = (
    Option<Result<MeasureOut, Failure>>,
    Option<Result<Vec<Vec<(f64, f64)>>, Failure>>,
);

/// Run one sweep of hosts `a` (measure) and `b` (mirror; `a == b` is the same-host pair): send
/// the orders, do rank 0's own part, collect the reports. `Err` names the host an order could
/// not reach.
#[allow(clippy::too_many_arguments)]
fn run_pair(
    comm: &Comm,
    cfg: &WorkerConfig,
    a: usize,
    b: usize,
    pass: Pass,
    sizes: &[u64],
    params: RepParams,
    leader_sweeps: &mut u32,
) -> Result<PairResult, (usize, String)> {
    let ra = cfg.primary(a);
    let rb = if a == b { ra + 1 } else { cfg.primary(b) };
    // Orders first, then our own part, then the others' reports.
    for (r, ctrl) in [
        (
            ra,
            Ctrl::Measure {
                peer: rb,
                pass,
                sizes: sizes.to_vec(),
                p: params,
            },
        ),
        (rb, Ctrl::Mirror { peer: ra, pass }),
    ] {
        if r != 0 {
            if let Err(e) = comm.send_obj(&ctrl, r, TAG_CTRL) {
                return Err((cfg.host_of_rank(r), e.to_string()));
            }
        }
    }
    let mut mres = None;
    let mut rres = None;
    if ra == 0 {
        fault_check(cfg, 0, 0, leader_sweeps);
        mres = Some(measure(comm, rb, pass, sizes, params).map_err(|e| failure(&e)));
    }
    if rb == 0 {
        fault_check(cfg, 0, 0, leader_sweeps);
        rres = Some(mirror(comm, ra, pass).map_err(|e| failure(&e)));
    }
    if ra != 0 {
        mres = Some(match comm.recv_obj::<Report>(ra, TAG_REPORT) {
            Ok((Report::Measure(r), _)) => r,
            Ok(_) => Err((Some(ra), "answered with the wrong report".into())),
            Err(e) => Err(failure(&e)),
        });
    }
    if rb != 0 {
        rres = Some(match comm.recv_obj::<Report>(rb, TAG_REPORT) {
            Ok((Report::Mirror(r), _)) => r,
            Ok(_) => Err((Some(rb), "answered with the wrong report".into())),
            Err(e) => Err(failure(&e)),
        });
    }
    Ok((mres, rres))
}

/// The b → a sample that the echo of an a → b ping-pong gives: same round trip and L, the
/// overheads of the other ends.
fn echo_sample(x: &PingPongSample) -> PingPongSample {
    PingPongSample {
        rtt_us: x.rtt_us,
        os_src_us: x.os_dst_us,
        or_dst_us: x.or_src_us,
        os_dst_us: x.os_src_us,
        or_src_us: x.or_dst_us,
        probe_us: None,
        wait_src_us: None,
    }
}

/// Join the two sides' timings into samples, dropping the warm-up repetitions.
fn combine(m: &[(u64, Vec<MeasureRep>)], r: &[Vec<(f64, f64)>]) -> Vec<SizeSamples> {
    m.iter()
        .zip(r)
        .map(|((bytes, ms), rs)| {
            let warmup = ms.iter().filter(|x| x.warm).count() as u32;
            let samples = ms
                .iter()
                .zip(rs)
                .filter(|(x, _)| !x.warm)
                .map(|(x, &(or_dst, os_dst))| PingPongSample {
                    rtt_us: x.rtt,
                    os_src_us: x.os,
                    or_dst_us: or_dst,
                    os_dst_us: os_dst,
                    or_src_us: x.or,
                    probe_us: Some(x.probe),
                    wait_src_us: x.wait,
                })
                .collect();
            (*bytes, warmup, samples)
        })
        .collect()
}

/// One size of a ping-pong sweep: bytes, warm-up repetitions done, samples.
type SizeSamples = (u64, u32, Vec<PingPongSample>);

/// The median of `xs` (the mean of the middle two for an even count); `None` when empty.
pub(crate) fn median(xs: impl Iterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = xs.collect();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => None,
        n if n % 2 == 1 => Some(v[n / 2]),
        n => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// PLogP samples: one per timed repetition of RTT(m), with the sweep's RTT(0) (median of its
/// phase) and g(0); Os(m) is measure's blocking send call, Or(m) the mirror's receive call after
/// its probe saw the whole (eager) message.
fn combine_plogp(
    m: &MeasureOut,
    r: &[Vec<(f64, f64)>],
    warmup: u32,
) -> Vec<(u64, Vec<PLogPSample>)> {
    let (Some((_, phase0)), Some(g0)) = (m.sizes.first(), m.g0) else {
        return Vec::new();
    };
    let Some(rtt0) = median(phase0.iter().skip(warmup as usize).map(|x| x.rtt)) else {
        return Vec::new();
    };
    m.sizes
        .iter()
        .skip(1)
        .zip(r.iter().skip(1))
        .map(|((bytes, ms), rs)| {
            let samples = ms
                .iter()
                .zip(rs)
                .skip(warmup as usize)
                .map(|(x, &(or, _))| PLogPSample {
                    rtt0_us: rtt0,
                    g0_us: g0,
                    rtt_us: x.rtt,
                    os_us: x.os,
                    or_us: or,
                })
                .collect();
            (*bytes, samples)
        })
        .collect()
}

/// The measure side of one sweep (version II): per repetition, time the send call (Os; in
/// `isend` mode the posting only, the wait apart), wait for the echo with a probe, time the
/// receive call (Or), and the round trip from before the send to after the receive.
fn measure(
    comm: &Comm,
    peer: usize,
    pass: Pass,
    sizes: &[u64],
    p: RepParams,
) -> Result<MeasureOut, mutirao::Error> {
    let mode = match pass {
        Pass::PingPong(m) => m,
        Pass::Plogp => SendMode::Send,
    };
    let mut out = Vec::with_capacity(sizes.len() + 1);
    let mut g0 = None;
    if pass == Pass::Plogp {
        // RTT(0), then g(0): a stream of empty messages, acknowledged once; the time per
        // message beyond one round trip.
        let reps = measure_size(comm, peer, mode, 0, p, p.warmup)?;
        let rtt0 = median(reps.iter().filter(|x| !x.warm).map(|x| x.rtt)).unwrap_or(0.0);
        out.push((0, reps));
        let t0 = Instant::now();
        for _ in 0..STREAM_K {
            comm.send::<u8>(&[], peer, TAG_STREAM)?;
        }
        comm.recv::<u8>(&mut [], peer, TAG_STREAM)?;
        g0 = Some(((us(t0.elapsed()) - rtt0) / f64::from(STREAM_K)).max(0.0));
    }
    // Warm-up before every size, except in ping-pong sweeps once the previous size's round trip
    // exceeds a tenth of --time-per-size: the connection is warm from that size, and a warm-up
    // of a 1 MiB message over a 40 Mbit/s WAN would cost 0.45 s per pair.
    let mut prev_rtt: Option<f64> = None;
    for &m in sizes {
        let warmup = match (pass, prev_rtt) {
            (Pass::PingPong(_), Some(r)) if r > p.time_per_size * 1e6 / 10.0 => 0,
            _ => p.warmup,
        };
        let reps = measure_size(comm, peer, mode, m, p, warmup)?;
        prev_rtt = median(reps.iter().filter(|x| !x.warm).map(|x| x.rtt));
        out.push((m, reps));
    }
    comm.send::<u8>(&[], peer, TAG_END_SWEEP)?;
    Ok(MeasureOut { sizes: out, g0 })
}

/// The repetitions of one size, then the end-of-size message.
fn measure_size(
    comm: &Comm,
    peer: usize,
    mode: SendMode,
    m: u64,
    p: RepParams,
    warmup: u32,
) -> Result<Vec<MeasureRep>, mutirao::Error> {
    let budget = Duration::from_secs_f64(p.time_per_size);
    let len = usize::try_from(m).map_err(|_| mutirao::Error::Invalid("size".into()))?;
    let mut sbuf = vec![0xA5u8; len];
    // Touch the receive buffer now (a zeroed allocation maps its pages on first write), so no
    // repetition pays the page faults.
    let mut rbuf = vec![0x5Au8; len];
    let mut reps = Vec::new();
    let mut timed_since = Instant::now();
    loop {
        let t0 = Instant::now();
        let (os, wait) = match mode {
            SendMode::Send => {
                comm.send(&sbuf, peer, TAG_DATA)?;
                (t0.elapsed(), None)
            }
            SendMode::Isend => {
                let req = comm.isend(std::mem::take(&mut sbuf), peer, TAG_DATA)?;
                let t1 = Instant::now();
                let (b, _) = req.wait()?;
                sbuf = b;
                (t1 - t0, Some(us(t1.elapsed())))
            }
        };
        let t2 = Instant::now();
        comm.probe(peer, TAG_DATA)?;
        let t3 = Instant::now();
        comm.recv(&mut rbuf, peer, TAG_DATA)?;
        let t4 = Instant::now();
        reps.push(MeasureRep {
            warm: reps.len() < warmup as usize,
            rtt: us(t4 - t0),
            os: us(os),
            probe: us(t3 - t2),
            or: us(t4 - t3),
            wait,
        });
        let timed = reps.len().saturating_sub(warmup as usize) as u32;
        if timed == 0 {
            timed_since = Instant::now();
        }
        let spent = timed_since.elapsed() >= budget;
        if timed >= p.reps
            || (timed >= p.min_reps && spent)
            || (timed >= 2 && spent && consistent(&reps[warmup as usize..], p.precision))
            || (timed >= p.min_reps && settled(&reps[warmup as usize..], p.precision))
        {
            break;
        }
    }
    comm.send::<u8>(&[], peer, TAG_END_SIZE)?;
    Ok(reps)
}

/// Whether the median round trip of `reps` is known within `precision`: its standard error
/// (from the whole 10–90% spread: stricter than `FitPoint::of_stats`, which uses the lower
/// half, so a size with a long tail of descheduled samples keeps measuring) is at most half of
/// `precision` × median. Steady links (a shaped WAN: 13.6–13.9 ms for 64 KiB) settle after
/// --min-reps; noisy sizes keep their time budget.
fn settled(reps: &[MeasureRep], precision: f64) -> bool {
    if precision <= 0.0 || reps.len() < 2 {
        return false;
    }
    let mut r: Vec<f64> = reps.iter().map(|x| x.rtt).collect();
    r.sort_by(f64::total_cmp);
    let at = |q: f64| r[((r.len() - 1) as f64 * q).round() as usize];
    let (p10, median, p90) = (at(0.1), at(0.5), at(0.9));
    let se = 1.2533 * ((p90 - p10) / 2.563) / (r.len() as f64).sqrt();
    median > 0.0 && se <= 0.5 * precision * median
}

/// Whether the round trips of `reps` agree within `precision` (max − min ≤ precision · min).
fn consistent(reps: &[MeasureRep], precision: f64) -> bool {
    let (lo, hi) = reps.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), r| {
        (lo.min(r.rtt), hi.max(r.rtt))
    });
    precision > 0.0 && lo.is_finite() && hi - lo <= precision * lo
}

/// The mirror side: probe until the message is here, time the receive (Or), time the echo's
/// send (Os; posting only in `isend` mode). Sizes come from the probes.
/// For PLogP the answer is an empty message sent with a blocking send, and a stream of
/// `STREAM_K` empty messages is acknowledged once.
fn mirror(comm: &Comm, peer: usize, pass: Pass) -> Result<Vec<Vec<(f64, f64)>>, mutirao::Error> {
    let mut buf: Vec<u8> = Vec::new();
    let mut sizes = Vec::new();
    let mut cur = Vec::new();
    loop {
        let st = comm.probe(peer, ANY_TAG)?;
        match st.tag {
            TAG_DATA => {
                if buf.len() != st.bytes {
                    buf.resize(st.bytes, 0);
                }
                let t0 = Instant::now();
                comm.recv(&mut buf, peer, TAG_DATA)?;
                let or = us(t0.elapsed());
                let t1 = Instant::now();
                let os = match pass {
                    Pass::Plogp => {
                        comm.send::<u8>(&[], peer, TAG_DATA)?;
                        us(t1.elapsed())
                    }
                    Pass::PingPong(SendMode::Send) => {
                        comm.send(&buf, peer, TAG_DATA)?;
                        us(t1.elapsed())
                    }
                    Pass::PingPong(SendMode::Isend) => {
                        let req = comm.isend(std::mem::take(&mut buf), peer, TAG_DATA)?;
                        let os = us(t1.elapsed());
                        buf = req.wait()?.0;
                        os
                    }
                };
                cur.push((or, os));
            }
            TAG_STREAM => {
                for _ in 0..STREAM_K {
                    comm.recv::<u8>(&mut [], peer, TAG_STREAM)?;
                }
                comm.send::<u8>(&[], peer, TAG_STREAM)?;
            }
            TAG_END_SIZE => {
                comm.recv::<u8>(&mut [], peer, TAG_END_SIZE)?;
                sizes.push(std::mem::take(&mut cur));
            }
            TAG_END_SWEEP => {
                comm.recv::<u8>(&mut [], peer, TAG_END_SWEEP)?;
                return Ok(sizes);
            }
            t => {
                return Err(mutirao::Error::Invalid(format!(
                    "unexpected tag {t} from rank {peer} during a ping-pong"
                )))
            }
        }
    }
}

// ------------------------------------------------------------------ H

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call; clock_gettime
    // writes only into it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        ts.tv_sec.max(0) as u64,
        ts.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

/// One repetition of the H kernel: an integer loop (xorshift and adds) and a 48×48
/// floating-point matrix product, behind `black_box` so the compiler cannot remove them.
fn kernel_rep(mats: &mut [Vec<f64>; 3]) -> u64 {
    use std::hint::black_box;
    let mut x = black_box(0x9E37_79B9_7F4A_7C15u64);
    let mut acc = 0u64;
    for _ in 0..100_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        acc = acc.wrapping_add(x >> 3);
    }
    const N: usize = 48;
    let [a, b, c] = mats;
    for i in 0..N {
        for j in 0..N {
            let mut s = 0.0;
            for k in 0..N {
                s += a[i * N + k] * b[k * N + j];
            }
            c[i * N + j] = s;
        }
    }
    black_box(&mut *c);
    black_box(acc) ^ (c[N + 1].to_bits())
}

/// Run the kernel `runs` times of `reps` repetitions: (wall µs, CPU µs) per run.
fn speed_samples(reps: u64, runs: u32) -> Vec<(f64, f64)> {
    const N: usize = 48;
    let mut mats = [
        (0..N * N).map(|i| (i % 7) as f64 * 0.5).collect::<Vec<_>>(),
        (0..N * N)
            .map(|i| (i % 5) as f64 * 0.25)
            .collect::<Vec<_>>(),
        vec![0.0; N * N],
    ];
    let mut sink = 0u64;
    kernel_rep(&mut mats); // warm caches and frequency once
    (0..runs)
        .map(|_| {
            let (w0, c0) = (Instant::now(), thread_cpu());
            for _ in 0..reps {
                sink = sink.wrapping_add(kernel_rep(&mut mats));
            }
            std::hint::black_box(sink);
            (us(w0.elapsed()), us(thread_cpu().saturating_sub(c0)))
        })
        .collect()
}

/// Kernel repetitions that take about `target` on this host (at least 1).
fn auto_speed_reps(target: Duration) -> u64 {
    let mut reps = 1u64;
    loop {
        let wall = speed_samples(reps, 1).first().map(|s| s.0).unwrap_or(0.0);
        if wall >= us(target) / 5.0 || reps >= 1 << 20 {
            let per = (wall / reps as f64).max(1e-3);
            return ((us(target) / per).ceil() as u64).max(1);
        }
        reps *= 2;
    }
}

fn speed_report(reps: u64, runs: u32) -> Report {
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    Report::Speed {
        os: std::env::consts::OS.to_string(),
        loadavg,
        samples: speed_samples(reps, runs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Testbed g1 as `mutirao testbed up` records it (sites a: a1, a2; b: b1).
    fn testbed_state() -> mutirao_testbed::TestbedState {
        let host = |name: &str, site: &str, addr: &str, cpu: f64, nic: u32| {
            format!(
                r#"{{"name":"{name}","site":"{site}","addr":"{addr}","cpu":{cpu},"nic_mbit":{nic},"netns":"","cgroup":""}}"#
            )
        };
        let hosts = [
            host("a1", "a", "10.213.0.2", 1.0, 800),
            host("a2", "a", "10.213.0.3", 0.25, 800),
            host("b1", "b", "10.213.1.2", 0.5, 200),
        ]
        .join(",");
        serde_json::from_str(&format!(
            r#"{{"format":"{}","prefix":"mt0","block":"10.213.0.0/20","namespaces":[],"root_links":[],"cgroup":"","hosts":[{hosts}],"wans":[{{"sites":["a","b"],"mbit":40.0}}],"agents":[],"hostfile":""}}"#,
            mutirao_testbed::STATE_FORMAT
        ))
        .expect("a valid testbed state")
    }

    #[test]
    fn a_testbed_maps_onto_the_resource_hierarchy() {
        use mutirao_dir::meu::props::{PropSet, Property};
        use mutirao_dir::meu::{spec, Hierarchy};
        let text = mutirao_testbed::resource_spec("g1", &testbed_state());
        let sp = spec::parse(&text).unwrap();
        let (h, labels) = Hierarchy::from_spec(&sp).unwrap();
        let (root, a, b) = (labels["tb"], labels["s0"], labels["s1"]);
        // Sums up the tree: a site's CPU (thousandths of a core) and access bandwidth.
        assert_eq!(h.properties(a).get("cpu_milli"), Some(1250));
        assert_eq!(h.properties(a).get("nic_mbit"), Some(1600));
        assert_eq!(h.properties(b).get("cpu_milli"), Some(500));
        assert_eq!(h.properties(root).get("cpu_milli"), Some(1750));
        assert_eq!(h.properties(root).get("wan.a.b"), Some(40));
        // Lookups: a host by its address; no host of site b has 0.6 of a core.
        let by_addr = PropSet::of([
            Property::flag("host"),
            Property::exact("addr", "10.213.1.2"),
        ]);
        let hit = h
            .lookup(root, None, None, &by_addr)
            .expect("b1 found by address");
        assert_eq!(h.get(hit).unwrap().name, "b1");
        let big = PropSet::of([Property::flag("host"), Property::sum("cpu_milli", 600)]);
        assert_eq!(h.lookup(b, None, None, &big), None);
        assert_eq!(
            h.get(h.lookup(a, None, None, &big).unwrap()).unwrap().name,
            "a1"
        );
    }

    #[test]
    fn calibrate_takes_sites_and_names_from_the_resource_hierarchy() {
        let text = mutirao_testbed::resource_spec("g1", &testbed_state());
        // The hostfile names hosts by address; a3 is not in the spec, b1 not in the hostfile.
        let hosts: Vec<String> = ["10.213.0.2", "10.213.0.3", "10.213.0.9"]
            .map(String::from)
            .to_vec();
        let lines = sites_from_resources("g1.meu", &text, &hosts).unwrap();
        assert_eq!(lines, "10.213.0.2 a a1\n10.213.0.3 a a2\n");
        // Bad input: a spec without hosts, a host without a site, a syntax error.
        let e = sites_from_resources("x.meu", "r: root { Myrinet };", &hosts).unwrap_err();
        assert!(
            format!("{e:#}").contains("no domain with an `addr` property"),
            "{e:#}"
        );
        let orphan = r#"r: root; h: "a1" <r> { host, addr="10.213.0.2" };"#;
        let e = sites_from_resources("x.meu", orphan, &hosts).unwrap_err();
        assert!(
            format!("{e:#}").contains("no ancestor with the quality `site`"),
            "{e:#}"
        );
        let e = sites_from_resources("x.meu", "r: root {", &hosts).unwrap_err();
        assert!(format!("{e:#}").contains("line 1, column"), "{e:#}");
    }

    #[test]
    fn sizes_parse_with_suffixes_sorted_and_deduplicated() {
        assert_eq!(
            parse_sizes("1K, 0,64k,1M,1024").unwrap(),
            vec![0, 1024, 65536, 1 << 20]
        );
        let e = parse_sizes("0,abc").unwrap_err().to_string();
        assert!(e.contains("item 2") && e.contains("abc"), "{e}");
        assert!(parse_sizes("").is_err());
        assert!(parse_sizes("-5").is_err());
        assert!(parse_sizes("2048M").is_err());
    }

    #[test]
    fn sites_apply_and_unknown_hosts_are_named() {
        let mk = |n: &str| HostSpec {
            name: n.into(),
            site: default_site(n),
            address: String::new(),
        };
        let mut hs = vec![mk("10.1.0.2"), mk("10.1.1.2"), mk("node")];
        assert_eq!(hs[0].site, "10.1.0");
        assert_eq!(hs[2].site, "default");
        apply_sites(
            &mut hs,
            &["node=b".into()],
            Some(("s.txt", "# c\n10.1.0.2 a a1\n10.1.1.2 b\n")),
        )
        .unwrap();
        assert_eq!(
            hs.iter()
                .map(|h| (h.name.as_str(), h.site.as_str()))
                .collect::<Vec<_>>(),
            vec![("a1", "a"), ("10.1.1.2", "b"), ("node", "b")]
        );
        let e = apply_sites(&mut hs, &["zz=a".into()], None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown host \"zz\""), "{e}");
        let mut hs = vec![mk("x"), mk("y")];
        let e = apply_sites(&mut hs, &[], Some(("f", "y s x\n")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("used twice"), "{e}");
    }

    #[test]
    fn launcher_messages_name_the_rank() {
        assert_eq!(
            launcher_rank(
                "rank 3 on 10.0.0.2 was killed by signal 9 (SIGKILL); ending the other ranks"
            ),
            Some(3)
        );
        assert_eq!(launcher_rank("agent of h closed the connection"), None);
        assert_eq!(launcher_rank("rank x on h"), None);
    }

    #[test]
    fn combine_drops_warmup_and_pairs_both_sides() {
        let m = vec![(
            8u64,
            (0..4)
                .map(|i| MeasureRep {
                    warm: i == 0,
                    rtt: 100.0 + i as f64,
                    os: 1.0,
                    probe: 50.0,
                    or: 2.0,
                    wait: None,
                })
                .collect::<Vec<_>>(),
        )];
        let r = vec![(0..4).map(|i| (3.0 + i as f64, 4.0)).collect::<Vec<_>>()];
        let s = combine(&m, &r);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].1, 1, "one warm-up repetition recorded");
        assert_eq!(s[0].2.len(), 3);
        assert_eq!(s[0].2[0].rtt_us, 101.0);
        assert_eq!(s[0].2[0].or_dst_us, 4.0);
        // L = (101 - 1 - 4 - 4 - 2) / 2
        assert_eq!(s[0].2[0].latency_us(), 45.0);
    }

    fn rep(rtt: f64) -> MeasureRep {
        MeasureRep {
            warm: false,
            rtt,
            os: 0.0,
            probe: 0.0,
            or: 0.0,
            wait: None,
        }
    }

    #[test]
    fn consistent_needs_agreeing_round_trips() {
        assert!(consistent(&[rep(100.0), rep(101.5)], 0.02));
        assert!(!consistent(&[rep(100.0), rep(103.0)], 0.02));
        assert!(
            !consistent(&[rep(100.0), rep(100.0)], 0.0),
            "0 turns it off"
        );
        assert!(!consistent(&[], 0.02));
    }

    #[test]
    fn settled_needs_a_tight_median() {
        let reps = |rtts: &[f64]| -> Vec<MeasureRep> { rtts.iter().map(|&r| rep(r)).collect() };
        // The shaped WAN's 64 KiB round trips (µs): the median is known within 1%.
        let wan = reps(&[13594.0, 13917.0, 13872.0, 13676.0, 13676.0]);
        assert!(settled(&wan, 0.02));
        assert!(!settled(&wan, 0.0), "0 turns it off");
        // Tens of µs with bimodal outliers: not settled after five.
        let noisy = reps(&[81.0, 91.0, 84.0, 146.0, 142.0]);
        assert!(!settled(&noisy, 0.02));
        assert!(!settled(&reps(&[100.0]), 0.02));
    }

    #[test]
    fn the_kernel_takes_cpu_time() {
        let s = speed_samples(2, 2);
        assert_eq!(s.len(), 2);
        assert!(s.iter().all(|&(w, c)| w > 0.0 && c > 0.0), "{s:?}");
    }
}
