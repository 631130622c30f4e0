//! The calibration file `mutirao-calib/1`: every raw sample a calibration took, with the
//! statistics derived from them and the provenance needed to trust (or distrust) them.
//!
//! The measurement loop (ping-pong through the runtime, the host-speed kernels) fills a
//! [`Calibration`] with [`Calibration::add_host`], [`Calibration::record_pingpong`] or
//! [`Calibration::record_plogp`], marks failures with [`Calibration::mark_partial`], and calls
//! [`Calibration::finalize`] once, which computes every [`DerivedStats`]. Everything here is pure:
//! no clocks, no I/O; the caller passes timestamps and writes the JSON.
//!
//! ## Ping-pong, version II (digest 000 §11.4)
//! One [`PingPongSample`] per repetition, `measure` = the pair's `src`, `mirror` = its `dst`:
//! * `os_src_us`: duration of measure's send call (in `isend` mode only the posting, not the wait);
//! * `or_dst_us`: duration of mirror's receive call, timed after its probe saw the message;
//! * `os_dst_us`: duration of mirror's send of the echo;
//! * `or_src_us`: duration of measure's receive call of the echo, after its probe;
//! * `rtt_us`: from just before measure's send to the end of its receive (so it includes the
//!   probe wait); `probe_us`, if recorded, is the probe wait alone, so the other variant
//!   (`rtt_us − probe_us`) can be recovered.
//!
//! `L = (RTT − Os_src − Or_dst − Os_dst − Or_src) / 2` exactly as the thesis computes it
//! ([`PingPongSample::latency_us`]). It may be negative (send and receive overlapping, the thesis's
//! LAM case); the raw value is kept, and the modeller clamps fitted functions at zero.
//!
//! ## PLogP, Kielmann et al. (version I), optional
//! One [`PLogPSample`] per converged measurement set: `rtt0_us`, `g0_us`, `rtt_us` = RTT(m),
//! `os_us` and `or_us`. Derived: `g(m) = RTT(m) − RTT(0) + g(0)`, `L = (RTT(0) − 2·g(0)) / 2`.

use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};

/// The format tag every calibration file carries.
pub const CALIB_FORMAT: &str = "mutirao-calib/1";

/// Largest magnitude a timing may have (µs, about 31 years): keeps every statistic finite.
pub const MAX_TIMING_US: f64 = 1e15;

fn timing_ok(v: f64) -> bool {
    v.is_finite() && v.abs() <= MAX_TIMING_US
}

/// What is wrong with a calibration document, and where.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CalibError {
    /// The text is not JSON of the expected shape (serde's message names line and column).
    #[error("calibration is not valid mutirao-calib/1 JSON: {0}")]
    Json(String),
    /// Wrong `format` tag.
    #[error("calibration format is {found:?}, expected {CALIB_FORMAT:?}")]
    Format {
        /// The tag found.
        found: String,
    },
    /// A field has an impossible value; `at` is a JSON-path-like location.
    #[error("{at}: {msg}")]
    Field {
        /// Where, e.g. `pairs[3] (a1 -> b1, isend) sizes[2] (65536 B): samples[7].rtt_us`.
        at: String,
        /// What is wrong and what to do.
        msg: String,
    },
    /// A host name is referenced but not listed in `hosts`.
    #[error("{at}: unknown host {host:?}; it is not in the calibration's `hosts`")]
    UnknownHost {
        /// Where the reference is.
        at: String,
        /// The unknown name.
        host: String,
    },
}

fn field(at: impl Into<String>, msg: impl Into<String>) -> CalibError {
    CalibError::Field {
        at: at.into(),
        msg: msg.into(),
    }
}

/// How the message of a ping-pong is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SendMode {
    /// Blocking send (`MPI_Send`): Os may carry the transfer above the eager limit.
    Send,
    /// Nonblocking send (`MPI_Isend`): Os is the cost of posting the send only.
    Isend,
}

impl SendMode {
    /// The name used in files and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            SendMode::Send => "send",
            SendMode::Isend => "isend",
        }
    }
}

/// Which measurement protocol produced a sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    /// The thesis's version II ping-pong (the default).
    PingPong,
    /// Kielmann et al.'s PLogP parameter measurement (the thesis's version I).
    Plogp,
}

/// Which planning strategy chose the measured pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StrategyKind {
    /// Every ordered pair measured (versions I and II(a)).
    AllPairs,
    /// One pair per site and one representative per site pair (version II(b)).
    SiteSampled,
    /// One representative per cluster of similar hosts within a site.
    TypeSampled,
}

impl StrategyKind {
    /// The name used in files and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            StrategyKind::AllPairs => "all-pairs",
            StrategyKind::SiteSampled => "site-sampled",
            StrategyKind::TypeSampled => "type-sampled",
        }
    }
}

/// One run of the host-speed kernel.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SpeedSample {
    /// Wall-clock time of the run (µs).
    pub wall_us: f64,
    /// CPU time the process used during the run (µs), for Eq. 4.3.
    pub cpu_us: f64,
}

/// The host-speed (H) measurement of one host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpeedMeasurement {
    /// Name of the kernel combination (e.g. `"inc+matmul+gauss"`); H is only comparable between
    /// hosts measured with the same kernel.
    pub kernel: String,
    /// Kernel repetitions per run; H is normalised by it.
    pub reps: u64,
    /// One entry per run.
    pub samples: Vec<SpeedSample>,
}

impl SpeedMeasurement {
    /// H: wall time per repetition (µs). Larger = slower or more loaded.
    ///
    /// With CPU times (every run has `cpu_us > 0`), H = (fewest CPU µs of any run) × (median
    /// wall/CPU ratio) / reps: the processor's cost of the work, which interference (a busy
    /// cache or SMT sibling, the hypervisor) only ever raises, so its minimum over runs is the
    /// least disturbed figure; times the share of the processor the host gives the work
    /// (a CPU quota, co-runners), which is steady run to run. On the emulated grid this
    /// recovers quota ratios within 2% where the median wall time erred by up to 6%
    /// (docs/calibration.md, "Host speed"). Without CPU times: the median wall time.
    pub fn h_us(&self) -> Option<f64> {
        let reps = self.reps.max(1) as f64;
        let with_cpu = self
            .samples
            .iter()
            .all(|s| s.cpu_us > 0.0 && s.wall_us > 0.0);
        if with_cpu {
            let min_cpu = self
                .samples
                .iter()
                .map(|s| s.cpu_us)
                .fold(f64::INFINITY, f64::min);
            // A single-threaded kernel cannot use more CPU than wall time; a ratio under 1 is
            // clock granularity.
            let share = self.wall_cpu_ratio()?.max(1.0);
            return min_cpu.is_finite().then(|| min_cpu * share / reps);
        }
        let walls: Vec<f64> = self.samples.iter().map(|s| s.wall_us).collect();
        Some(Stats::of(&walls)?.median / reps)
    }

    /// H as the thesis computed it: the median wall time per repetition (µs).
    pub fn h_wall_median_us(&self) -> Option<f64> {
        let walls: Vec<f64> = self.samples.iter().map(|s| s.wall_us).collect();
        Some(Stats::of(&walls)?.median / self.reps.max(1) as f64)
    }

    /// Median wall/CPU ratio of the runs (≥ 1 on a host shared with other work), for Eq. 4.3.
    pub fn wall_cpu_ratio(&self) -> Option<f64> {
        let r: Vec<f64> = self
            .samples
            .iter()
            .filter(|s| s.cpu_us > 0.0)
            .map(|s| s.wall_us / s.cpu_us)
            .collect();
        Stats::of(&r).map(|s| s.median)
    }
}

/// Operating-system load of a host, read just before its speed was measured (`/proc/loadavg`,
/// `/proc/stat`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LoadInfo {
    /// 1-minute load average.
    pub loadavg_1m: f64,
    /// Run queue: processes runnable at the time (4th field of `/proc/loadavg`, numerator).
    pub run_queue: u32,
    /// Total processes (4th field of `/proc/loadavg`, denominator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_procs: Option<u32>,
    /// Percentage of CPU idle over a short window, if measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_idle_pct: Option<f64>,
}

impl LoadInfo {
    /// Parse the text of `/proc/loadavg` (`0.52 0.58 0.59 2/1234 5678`): the 1-minute load, and
    /// the run queue and total processes from the fourth field. `None` if malformed.
    pub fn from_proc_loadavg(text: &str) -> Option<LoadInfo> {
        let mut f = text.split_whitespace();
        let load: f64 = f.next()?.parse().ok()?;
        let (run, total) = f.nth(2)?.split_once('/')?;
        if !(load.is_finite() && load >= 0.0) {
            return None;
        }
        Some(LoadInfo {
            loadavg_1m: load,
            run_queue: run.parse().ok()?,
            total_procs: Some(total.parse().ok()?),
            cpu_idle_pct: None,
        })
    }
}

/// A host of the calibration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CalibHost {
    /// Host name (unique).
    pub name: String,
    /// Site the host belongs to.
    pub site: String,
    /// Address its agent was reached at (e.g. `10.1.0.2:7000`).
    pub address: String,
    /// Operating system name, for the thesis's Fig. 4.2 output (e.g. `linux`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os: Option<String>,
    /// Path of the executables on that host, if it differs (thesis Fig. 4.1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec_path: Option<String>,
    /// H measurement; `None` when the host could not be measured (see `partial`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed: Option<SpeedMeasurement>,
    /// Load when H was measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load: Option<LoadInfo>,
}

impl CalibHost {
    /// A host with no measurement yet.
    pub fn new(name: &str, site: &str, address: &str) -> Self {
        CalibHost {
            name: name.to_string(),
            site: site.to_string(),
            address: address.to_string(),
            os: None,
            exec_path: None,
            speed: None,
            load: None,
        }
    }
}

/// One ping-pong repetition (version II). See the module docs for each timing.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PingPongSample {
    /// Round trip seen by measure (`src`), from before its send to the end of its receive (µs).
    pub rtt_us: f64,
    /// Measure's send overhead (µs).
    pub os_src_us: f64,
    /// Mirror's receive overhead for the measured message (µs).
    pub or_dst_us: f64,
    /// Mirror's send overhead for the echo (µs).
    pub os_dst_us: f64,
    /// Measure's receive overhead for the echo (µs).
    pub or_src_us: f64,
    /// Measure's probe wait between its send and its receive (µs), if recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_us: Option<f64>,
    /// In `isend` mode: time measure spent completing its send (`wait`), not part of Os.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_src_us: Option<f64>,
}

impl PingPongSample {
    /// `L = (RTT − Os_src − Or_dst − Os_dst − Or_src) / 2` (thesis §4.3.3), in µs.
    pub fn latency_us(&self) -> f64 {
        (self.rtt_us - self.os_src_us - self.or_dst_us - self.os_dst_us - self.or_src_us) / 2.0
    }

    fn fields(&self) -> [(&'static str, Option<f64>); 7] {
        [
            ("rtt_us", Some(self.rtt_us)),
            ("os_src_us", Some(self.os_src_us)),
            ("or_dst_us", Some(self.or_dst_us)),
            ("os_dst_us", Some(self.os_dst_us)),
            ("or_src_us", Some(self.or_src_us)),
            ("probe_us", self.probe_us),
            ("wait_src_us", self.wait_src_us),
        ]
    }
}

/// One converged PLogP measurement (version I) for one message size.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PLogPSample {
    /// Mean zero-byte round trip, RTT(0) (µs).
    pub rtt0_us: f64,
    /// Zero-byte gap g(0) at saturation (µs).
    pub g0_us: f64,
    /// Round trip of an m-byte message answered by a 0-byte one, RTT(m) (µs).
    pub rtt_us: f64,
    /// Send overhead Os(m) (µs).
    pub os_us: f64,
    /// Receive overhead Or(m) (µs).
    pub or_us: f64,
}

impl PLogPSample {
    /// `g(m) = RTT(m) − RTT(0) + g(0)`.
    pub fn gap_us(&self) -> f64 {
        self.rtt_us - self.rtt0_us + self.g0_us
    }

    /// `L = (RTT(0) − 2·g(0)) / 2`: PLogP's latency of the first bit.
    pub fn latency_us(&self) -> f64 {
        (self.rtt0_us - 2.0 * self.g0_us) / 2.0
    }

    fn fields(&self) -> [(&'static str, f64); 5] {
        [
            ("rtt0_us", self.rtt0_us),
            ("g0_us", self.g0_us),
            ("rtt_us", self.rtt_us),
            ("os_us", self.os_us),
            ("or_us", self.or_us),
        ]
    }
}

/// Summary statistics of one quantity.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Number of samples.
    pub count: usize,
    /// Median.
    pub median: f64,
    /// Arithmetic mean (what the thesis reported).
    pub mean: f64,
    /// Smallest sample.
    pub min: f64,
    /// Largest sample.
    pub max: f64,
    /// 10th percentile (linear interpolation).
    pub p10: f64,
    /// 90th percentile (linear interpolation).
    pub p90: f64,
    /// Sample standard deviation (0 for one sample).
    pub stddev: f64,
}

impl Stats {
    /// Statistics of `xs`; `None` if it is empty or holds a non-finite value.
    pub fn of(xs: &[f64]) -> Option<Stats> {
        if xs.is_empty() || xs.iter().any(|x| !x.is_finite()) {
            return None;
        }
        let mut v = xs.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let q = |p: f64| {
            let pos = p * (n - 1) as f64;
            let lo = pos.floor() as usize;
            let hi = pos.ceil() as usize;
            v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
        };
        let mean = v.iter().sum::<f64>() / n as f64;
        let var = if n > 1 {
            v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1) as f64
        } else {
            0.0
        };
        Some(Stats {
            count: n,
            median: q(0.5),
            mean,
            min: v[0],
            max: v[n - 1],
            p10: q(0.1),
            p90: q(0.9),
            stddev: var.sqrt(),
        })
    }

    /// Relative spread `(p90 − p10) / |median|` (infinite when the median is 0 and p90 > p10).
    pub fn rel_spread(&self) -> f64 {
        let w = self.p90 - self.p10;
        if w == 0.0 {
            0.0
        } else {
            w / self.median.abs()
        }
    }
}

/// Statistics derived from the samples of one message size.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DerivedStats {
    /// HLogP latency `L` of `src -> dst` (ping-pong formula, or PLogP's first-bit latency).
    pub l: Stats,
    /// Send overhead of `src` for this message.
    pub os: Stats,
    /// Receive overhead of `dst` for this message.
    pub or: Stats,
    /// Round trip.
    pub rtt: Stats,
    /// Ping-pong only: `dst`'s send overhead for the echo.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os_back: Option<Stats>,
    /// Ping-pong only: `src`'s receive overhead for the echo.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub or_back: Option<Stats>,
    /// PLogP only: the gap g(m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub g: Option<Stats>,
}

/// All samples of one message size within a sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SizeResult {
    /// Message size in bytes.
    pub bytes: u64,
    /// Warm-up repetitions done (and discarded) before the samples.
    #[serde(default)]
    pub warmup: u32,
    /// Ping-pong samples (method `ping-pong`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub samples: Vec<PingPongSample>,
    /// PLogP samples (method `plogp`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub plogp: Vec<PLogPSample>,
    /// Filled by [`Calibration::finalize`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<DerivedStats>,
}

impl SizeResult {
    /// Compute the derived statistics from the raw samples of `method`.
    pub fn derive(&self, method: Method) -> Option<DerivedStats> {
        let col = |f: &dyn Fn(&PingPongSample) -> f64| -> Option<Stats> {
            Stats::of(&self.samples.iter().map(f).collect::<Vec<_>>())
        };
        let colp = |f: &dyn Fn(&PLogPSample) -> f64| -> Option<Stats> {
            Stats::of(&self.plogp.iter().map(f).collect::<Vec<_>>())
        };
        match method {
            Method::PingPong => Some(DerivedStats {
                l: col(&|s| s.latency_us())?,
                os: col(&|s| s.os_src_us)?,
                or: col(&|s| s.or_dst_us)?,
                rtt: col(&|s| s.rtt_us)?,
                os_back: col(&|s| s.os_dst_us),
                or_back: col(&|s| s.or_src_us),
                g: None,
            }),
            Method::Plogp => Some(DerivedStats {
                l: colp(&|s| s.latency_us())?,
                os: colp(&|s| s.os_us)?,
                or: colp(&|s| s.or_us)?,
                rtt: colp(&|s| s.rtt_us)?,
                os_back: None,
                or_back: None,
                g: colp(&|s| s.gap_us()),
            }),
        }
    }
}

/// The sweep of one ordered host pair in one send mode (`src` = measure, `dst` = mirror).
/// `src == dst` is a same-host pair (two processes on one host).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairSweep {
    /// Measuring host.
    pub src: String,
    /// Mirroring host.
    pub dst: String,
    /// Send mode of the measured message.
    pub mode: SendMode,
    /// Protocol.
    pub method: Method,
    /// Results per message size, in the order measured.
    pub sizes: Vec<SizeResult>,
    /// Why this sweep stopped early, if it did (its samples are kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial: Option<String>,
}

impl PairSweep {
    /// The result for `bytes`, if measured.
    pub fn size(&self, bytes: u64) -> Option<&SizeResult> {
        self.sizes.iter().find(|s| s.bytes == bytes)
    }
}

/// An ordered pair of hosts.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PairRef {
    /// Source (sender / measure).
    pub src: String,
    /// Destination (receiver / mirror).
    pub dst: String,
}

impl PairRef {
    /// Build from two names.
    pub fn new(src: &str, dst: &str) -> Self {
        PairRef {
            src: src.to_string(),
            dst: dst.to_string(),
        }
    }
}

impl std::fmt::Display for PairRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} -> {}", self.src, self.dst)
    }
}

/// An unmeasured pair that takes the values of a measured one.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Inheritance {
    /// The unmeasured pair.
    pub pair: PairRef,
    /// The measured pair whose values it takes.
    pub from: PairRef,
}

/// A cluster of similar hosts of one site (type-sampled strategy).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cluster {
    /// Site.
    pub site: String,
    /// The measured representative.
    pub representative: String,
    /// Every member, the representative first.
    pub members: Vec<String>,
}

/// One link probe of a type-sampled calibration: a short ping-pong between two hosts of a site.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkProbe {
    /// Measuring host.
    pub src: String,
    /// Mirroring host.
    pub dst: String,
    /// Message size.
    pub bytes: u64,
    /// Median round trip (µs).
    pub rtt_us: f64,
}

/// Where the data came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    /// Strategy that chose the measured pairs.
    pub strategy: StrategyKind,
    /// Unmeasured pairs and the measured pair each inherits from.
    #[serde(default)]
    pub inherited: Vec<Inheritance>,
    /// Type-sampled clusters (empty for other strategies).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<Cluster>,
    /// Ordered pairs whose sweep is the echo direction of the reverse pair's ping-pong (one
    /// ping-pong between a and b times a → b and b → a; `mutirao calibrate` measures each
    /// unordered pair once unless told `--both-directions`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub echoed: Vec<PairRef>,
    /// Type-sampled: the quick intra-site ping-pongs that gave each host its preliminary link
    /// speed for clustering.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub link_probes: Vec<LinkProbe>,
    /// Start of the calibration, milliseconds since the Unix epoch.
    pub started_unix_ms: u64,
    /// End of the calibration, milliseconds since the Unix epoch (0 while running).
    #[serde(default)]
    pub finished_unix_ms: u64,
    /// Version of the tool that measured (e.g. `mutirao 0.1.0`).
    pub tool_version: String,
    /// Transport the messages went through (e.g. `tcp`, `shm`).
    #[serde(default)]
    pub transport: String,
    /// Clock used for the timings.
    #[serde(default = "default_clock")]
    pub clock: String,
    /// The runtime's eager limit between hosts during the sweeps (bytes): messages above it
    /// went by rendezvous. `fit` copies it into the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eager_limit_bytes: Option<u64>,
}

fn default_clock() -> String {
    "monotonic".to_string()
}

/// A host that failed during calibration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailedHost {
    /// Host name.
    pub name: String,
    /// What happened (e.g. `agent unreachable at 10.0.0.3:7000`, `died during 65536 B sweep`).
    pub reason: String,
}

/// Present when the calibration did not complete.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartialInfo {
    /// Summary of why.
    pub reason: String,
    /// Hosts that failed.
    #[serde(default)]
    pub failed_hosts: Vec<FailedHost>,
}

/// A whole `mutirao-calib/1` document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// Always [`CALIB_FORMAT`].
    pub format: String,
    /// Hosts, in the order given.
    pub hosts: Vec<CalibHost>,
    /// Measured sweeps.
    pub pairs: Vec<PairSweep>,
    /// Where the data came from.
    pub provenance: Provenance,
    /// `Some` when the calibration did not complete; the data present is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial: Option<PartialInfo>,
    /// Two ranks on the launcher's own host, measured through the runtime's shared memory when
    /// no calibrated host pair is a same-host pair (one rank per host): `fit` turns it into the
    /// model's class-wide `same-host` link. `src` and `dst` name the launcher's host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launcher_same_host: Option<PairSweep>,
    /// Concurrent-stream measurements of link capacities (`mutirao calibrate`, after the
    /// sweeps): what [`crate::capacity::estimate`] turns into the model's capacities.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capacity: Vec<CapacityMeasurement>,
    /// Direct measurements of each host's push cost (`mutirao calibrate`, after the capacities):
    /// the same computation timed alone and while a rendezvous message to a peer moves, the
    /// runtime tested between 1 ms slices as a program overlapping its sends would. `fit` makes
    /// the model's `push_cost` from them where present.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub push: Vec<PushMeasurement>,
}

/// One host's push measurement: `bytes` sent by rendezvous to `peer` while the host computed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PushMeasurement {
    pub host: String,
    pub peer: String,
    pub bytes: u64,
    /// One per repetition, alone and sending interleaved.
    pub samples: Vec<PushSample>,
}

/// Wall seconds of one computation alone and of the same computation while the message moved.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PushSample {
    pub alone_s: f64,
    pub sending_s: f64,
}

impl PushMeasurement {
    /// The host's time per byte (µs): the median over repetitions of what sending added to the
    /// computation, divided by the bytes; never negative. `None` without usable samples.
    pub fn us_per_byte(&self) -> Option<f64> {
        if self.bytes == 0 {
            return None;
        }
        let mut d: Vec<f64> = self
            .samples
            .iter()
            .filter(|s| s.alone_s.is_finite() && s.sending_s.is_finite())
            .map(|s| s.sending_s - s.alone_s)
            .collect();
        if d.is_empty() {
            return None;
        }
        d.sort_by(f64::total_cmp);
        let mid = d.len() / 2;
        let median = if d.len() % 2 == 1 {
            d[mid]
        } else {
            0.5 * (d[mid - 1] + d[mid])
        };
        Some((median * 1e6 / self.bytes as f64).max(0.0))
    }
}

/// Which shared resource a capacity measurement loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CapacityKind {
    /// One host sending to several peers at once.
    NicOut,
    /// Several peers sending to one host at once.
    NicIn,
    /// One host of `from_site` sending to every host of `to_site` at once.
    SiteLink,
}

/// One concurrent-stream measurement: `streams` ran at the same time, `bytes_per_stream` each;
/// each sample is the aggregate rate of one repetition (all bytes over the time from the first
/// byte sent to the last received), Mbit/s (10⁶ bit/s).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapacityMeasurement {
    pub kind: CapacityKind,
    /// The host whose NIC is measured (NIC kinds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_site: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_site: Option<String>,
    pub streams: Vec<PairRef>,
    pub bytes_per_stream: u64,
    pub samples_mbit: Vec<f64>,
    pub median_mbit: f64,
}

impl Calibration {
    /// An empty calibration.
    pub fn new(strategy: StrategyKind, tool_version: &str, started_unix_ms: u64) -> Self {
        Calibration {
            format: CALIB_FORMAT.to_string(),
            hosts: Vec::new(),
            pairs: Vec::new(),
            provenance: Provenance {
                strategy,
                inherited: Vec::new(),
                clusters: Vec::new(),
                echoed: Vec::new(),
                link_probes: Vec::new(),
                started_unix_ms,
                finished_unix_ms: 0,
                tool_version: tool_version.to_string(),
                transport: String::new(),
                clock: default_clock(),
                eager_limit_bytes: None,
            },
            partial: None,
            launcher_same_host: None,
            capacity: Vec::new(),
            push: Vec::new(),
        }
    }

    /// Add a host (its name must be new).
    pub fn add_host(&mut self, host: CalibHost) -> Result<(), CalibError> {
        if self.hosts.iter().any(|h| h.name == host.name) {
            return Err(field(
                format!("hosts ({})", host.name),
                "host listed twice; host names must be unique",
            ));
        }
        self.hosts.push(host);
        Ok(())
    }

    /// The host named `name`.
    pub fn host(&self, name: &str) -> Option<&CalibHost> {
        self.hosts.iter().find(|h| h.name == name)
    }

    fn sweep_mut(&mut self, src: &str, dst: &str, mode: SendMode, method: Method) -> usize {
        if let Some(i) = self
            .pairs
            .iter()
            .position(|p| p.src == src && p.dst == dst && p.mode == mode && p.method == method)
        {
            return i;
        }
        self.pairs.push(PairSweep {
            src: src.to_string(),
            dst: dst.to_string(),
            mode,
            method,
            sizes: Vec::new(),
            partial: None,
        });
        self.pairs.len() - 1
    }

    fn check_pair(&self, src: &str, dst: &str) -> Result<(), CalibError> {
        for h in [src, dst] {
            if self.host(h).is_none() {
                return Err(CalibError::UnknownHost {
                    at: format!("pair {src} -> {dst}"),
                    host: h.to_string(),
                });
            }
        }
        Ok(())
    }

    /// Append ping-pong samples for (`src`, `dst`, `mode`, `bytes`), creating the sweep and size
    /// entry as needed. Both hosts must have been added.
    pub fn record_pingpong(
        &mut self,
        src: &str,
        dst: &str,
        mode: SendMode,
        bytes: u64,
        warmup: u32,
        samples: &[PingPongSample],
    ) -> Result<(), CalibError> {
        self.check_pair(src, dst)?;
        let i = self.sweep_mut(src, dst, mode, Method::PingPong);
        let sizes = &mut self.pairs[i].sizes;
        let s = match sizes.iter().position(|s| s.bytes == bytes) {
            Some(j) => &mut sizes[j],
            None => {
                sizes.push(SizeResult {
                    bytes,
                    warmup,
                    samples: Vec::new(),
                    plogp: Vec::new(),
                    stats: None,
                });
                sizes.last_mut().expect("just pushed")
            }
        };
        s.samples.extend_from_slice(samples);
        s.stats = None;
        Ok(())
    }

    /// Append PLogP samples for (`src`, `dst`, `bytes`); PLogP always uses a blocking send.
    pub fn record_plogp(
        &mut self,
        src: &str,
        dst: &str,
        bytes: u64,
        samples: &[PLogPSample],
    ) -> Result<(), CalibError> {
        self.check_pair(src, dst)?;
        let i = self.sweep_mut(src, dst, SendMode::Send, Method::Plogp);
        let sizes = &mut self.pairs[i].sizes;
        let s = match sizes.iter().position(|s| s.bytes == bytes) {
            Some(j) => &mut sizes[j],
            None => {
                sizes.push(SizeResult {
                    bytes,
                    warmup: 0,
                    samples: Vec::new(),
                    plogp: Vec::new(),
                    stats: None,
                });
                sizes.last_mut().expect("just pushed")
            }
        };
        s.plogp.extend_from_slice(samples);
        s.stats = None;
        Ok(())
    }

    /// Mark the calibration partial because `host` failed with `reason`; every sweep involving
    /// that host that is already present is marked partial too. Data is kept.
    pub fn mark_partial(&mut self, host: &str, reason: &str) {
        let p = self.partial.get_or_insert_with(|| PartialInfo {
            reason: String::new(),
            failed_hosts: Vec::new(),
        });
        p.failed_hosts.push(FailedHost {
            name: host.to_string(),
            reason: reason.to_string(),
        });
        p.reason = p
            .failed_hosts
            .iter()
            .map(|f| format!("{}: {}", f.name, f.reason))
            .collect::<Vec<_>>()
            .join("; ");
        for s in &mut self.pairs {
            if (s.src == host || s.dst == host) && s.partial.is_none() {
                s.partial = Some(format!("host {host} failed: {reason}"));
            }
        }
    }

    /// Compute every size's statistics and stamp the end time.
    pub fn finalize(&mut self, finished_unix_ms: u64) {
        for p in &mut self.pairs {
            let method = p.method;
            for s in &mut p.sizes {
                s.stats = s.derive(method);
            }
        }
        self.provenance.finished_unix_ms = finished_unix_ms;
    }

    /// Parse and validate.
    pub fn from_json(text: &str) -> Result<Self, CalibError> {
        let c: Calibration =
            serde_json::from_str(text).map_err(|e| CalibError::Json(e.to_string()))?;
        c.validate()?;
        Ok(c)
    }

    /// Pretty JSON text.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a calibration always serializes")
    }

    /// The sweep measured for (`src`, `dst`, `mode`), preferring ping-pong over PLogP.
    pub fn sweep(&self, src: &str, dst: &str, mode: SendMode) -> Option<&PairSweep> {
        let mut best = None;
        for p in &self.pairs {
            if p.src == src && p.dst == dst && p.mode == mode {
                if p.method == Method::PingPong {
                    return Some(p);
                }
                best = Some(p);
            }
        }
        best
    }

    /// The measured pair whose values `src -> dst` uses: itself if measured in `mode`,
    /// else the pair it inherits from (per `provenance.inherited`).
    pub fn source_of(&self, src: &str, dst: &str, mode: SendMode) -> Option<&PairSweep> {
        self.sweep(src, dst, mode).or_else(|| {
            self.provenance
                .inherited
                .iter()
                .find(|i| i.pair.src == src && i.pair.dst == dst)
                .and_then(|i| self.sweep(&i.from.src, &i.from.dst, mode))
        })
    }

    /// The send modes present in the sweeps.
    pub fn modes(&self) -> Vec<SendMode> {
        let mut m: Vec<SendMode> = Vec::new();
        for p in &self.pairs {
            if !m.contains(&p.mode) {
                m.push(p.mode);
            }
        }
        m
    }

    /// Check every invariant: format tag, unique hosts, known host references, finite samples,
    /// sizes unique within a sweep, samples matching the sweep's method, inheritance sources
    /// measured (unless the calibration is partial).
    pub fn validate(&self) -> Result<(), CalibError> {
        if self.format != CALIB_FORMAT {
            return Err(CalibError::Format {
                found: self.format.clone(),
            });
        }
        let mut names = HashSet::new();
        for (i, h) in self.hosts.iter().enumerate() {
            let at = format!("hosts[{i}] ({})", h.name);
            if h.name.is_empty() {
                return Err(field(format!("hosts[{i}].name"), "is empty"));
            }
            if !names.insert(h.name.as_str()) {
                return Err(field(at, "host listed twice; host names must be unique"));
            }
            if let Some(sp) = &h.speed {
                if sp.reps == 0 {
                    return Err(field(format!("{at}.speed.reps"), "must be at least 1"));
                }
                for (k, s) in sp.samples.iter().enumerate() {
                    for (n, v) in [("wall_us", s.wall_us), ("cpu_us", s.cpu_us)] {
                        if !(timing_ok(v) && v >= 0.0) {
                            return Err(field(
                                format!("{at}.speed.samples[{k}].{n}"),
                                format!(
                                    "is {v}; times must be finite, >= 0 and <= {MAX_TIMING_US} µs"
                                ),
                            ));
                        }
                    }
                    if s.wall_us <= 0.0 {
                        return Err(field(
                            format!("{at}.speed.samples[{k}].wall_us"),
                            "is 0; a kernel run takes time",
                        ));
                    }
                }
            }
            if let Some(l) = &h.load {
                if !(l.loadavg_1m.is_finite() && l.loadavg_1m >= 0.0) {
                    return Err(field(
                        format!("{at}.load.loadavg_1m"),
                        format!("is {}; must be finite and >= 0", l.loadavg_1m),
                    ));
                }
            }
        }
        let mut sweeps = HashSet::new();
        for (i, p) in self.pairs.iter().enumerate() {
            let at = format!("pairs[{i}] ({} -> {}, {})", p.src, p.dst, p.mode.as_str());
            for h in [&p.src, &p.dst] {
                if !names.contains(h.as_str()) {
                    return Err(CalibError::UnknownHost {
                        at: at.clone(),
                        host: h.clone(),
                    });
                }
            }
            if !sweeps.insert((p.src.as_str(), p.dst.as_str(), p.mode, p.method)) {
                return Err(field(
                    at,
                    "the same pair, mode and method appear twice; merge the sweeps",
                ));
            }
            let mut seen = HashSet::new();
            for (j, s) in p.sizes.iter().enumerate() {
                let at = format!("{at} sizes[{j}] ({} B)", s.bytes);
                if !seen.insert(s.bytes) {
                    return Err(field(at, "size listed twice in one sweep"));
                }
                let (n_own, n_other, other) = match p.method {
                    Method::PingPong => (s.samples.len(), s.plogp.len(), "plogp"),
                    Method::Plogp => (s.plogp.len(), s.samples.len(), "samples"),
                };
                if n_other > 0 {
                    return Err(field(
                        at,
                        format!(
                            "has `{other}` entries but the sweep's method is {:?}",
                            p.method
                        ),
                    ));
                }
                let _ = n_own;
                for (k, smp) in s.samples.iter().enumerate() {
                    for (n, v) in smp.fields() {
                        if let Some(v) = v {
                            if !timing_ok(v) {
                                return Err(field(
                                    format!("{at}: samples[{k}].{n}"),
                                    format!("is {v}; timings must be finite and within ±{MAX_TIMING_US} µs"),
                                ));
                            }
                        }
                    }
                }
                for (k, smp) in s.plogp.iter().enumerate() {
                    for (n, v) in smp.fields() {
                        if !timing_ok(v) {
                            return Err(field(
                                format!("{at}: plogp[{k}].{n}"),
                                format!(
                                    "is {v}; timings must be finite and within ±{MAX_TIMING_US} µs"
                                ),
                            ));
                        }
                    }
                }
            }
        }
        let mut inherited = HashMap::new();
        for (i, inh) in self.provenance.inherited.iter().enumerate() {
            let at = format!("provenance.inherited[{i}] ({} from {})", inh.pair, inh.from);
            for h in [&inh.pair.src, &inh.pair.dst, &inh.from.src, &inh.from.dst] {
                if !names.contains(h.as_str()) {
                    return Err(CalibError::UnknownHost {
                        at: at.clone(),
                        host: h.clone(),
                    });
                }
            }
            if inherited.insert(inh.pair.clone(), ()).is_some() {
                return Err(field(at, "pair inherits twice"));
            }
            let measured = self
                .pairs
                .iter()
                .any(|p| p.src == inh.from.src && p.dst == inh.from.dst);
            if !measured && self.partial.is_none() {
                return Err(field(
                    at,
                    "the source pair was not measured (and the calibration is not marked partial)",
                ));
            }
        }
        for (i, c) in self.provenance.clusters.iter().enumerate() {
            for h in c.members.iter().chain(std::iter::once(&c.representative)) {
                if !names.contains(h.as_str()) {
                    return Err(CalibError::UnknownHost {
                        at: format!("provenance.clusters[{i}]"),
                        host: h.clone(),
                    });
                }
            }
        }
        for (i, p) in self.push.iter().enumerate() {
            let at = format!("push[{i}] ({} -> {})", p.host, p.peer);
            for h in [&p.host, &p.peer] {
                if !names.contains(h.as_str()) {
                    return Err(CalibError::UnknownHost {
                        at: at.clone(),
                        host: h.clone(),
                    });
                }
            }
            if p.bytes == 0 {
                return Err(field(format!("{at}.bytes"), "must be at least 1"));
            }
            for (k, smp) in p.samples.iter().enumerate() {
                for (n, v) in [("alone_s", smp.alone_s), ("sending_s", smp.sending_s)] {
                    if !(v.is_finite() && (0.0..1e6).contains(&v)) {
                        return Err(field(
                            format!("{at}.samples[{k}].{n}"),
                            format!("is {v}; a wall time in seconds, finite and not negative"),
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pp(rtt: f64, osa: f64, orb: f64, osb: f64, ora: f64) -> PingPongSample {
        PingPongSample {
            rtt_us: rtt,
            os_src_us: osa,
            or_dst_us: orb,
            os_dst_us: osb,
            or_src_us: ora,
            probe_us: None,
            wait_src_us: None,
        }
    }

    fn speed(reps: u64, runs: &[(f64, f64)]) -> SpeedMeasurement {
        SpeedMeasurement {
            kernel: "k".into(),
            reps,
            samples: runs
                .iter()
                .map(|&(wall_us, cpu_us)| SpeedSample { wall_us, cpu_us })
                .collect(),
        }
    }

    #[test]
    fn h_ignores_a_disturbed_run_and_keeps_the_quota_share() {
        // An unlimited host with one run slowed by interference: the least CPU wins.
        let fast = speed(100, &[(465.0, 465.0), (600.0, 598.0), (470.0, 470.0)]);
        assert!((fast.h_us().unwrap() - 4.65).abs() < 1e-9);
        // Its median wall time would have said 4.70.
        assert!((fast.h_wall_median_us().unwrap() - 4.70).abs() < 1e-9);
        // A host at a quarter of a core (wall ≈ 4 × CPU), one run disturbed: min CPU 470 ×
        // median ratio 3.96 — the quota ratio survives (4.65 / 18.61 ≈ 0.25).
        let slow = speed(100, &[(1860.0, 470.0), (2111.0, 533.0), (1907.0, 480.0)]);
        let h = slow.h_us().unwrap();
        let ratio = 2111.0 / 533.0; // the median of 3.957, 3.961, 3.973;
        assert!((h - 4.70 * ratio).abs() < 1e-9, "{h}");
        assert!((4.65 / h - 0.25).abs() < 0.005, "{}", 4.65 / h);
        // No CPU times (an old file): the median wall time.
        let old = speed(10, &[(100.0, 0.0), (300.0, 0.0), (200.0, 0.0)]);
        assert_eq!(old.h_us(), Some(20.0));
        assert_eq!(speed(10, &[]).h_us(), None);
    }

    #[test]
    fn latency_follows_the_thesis_formula() {
        // L = (RTT − Os_a − Or_b − Os_b − Or_a)/2
        assert_eq!(pp(100.0, 5.0, 7.0, 6.0, 2.0).latency_us(), 40.0);
        // overlap gives a negative L, kept raw
        assert!(pp(10.0, 20.0, 20.0, 1.0, 1.0).latency_us() < 0.0);
    }

    #[test]
    fn plogp_derivations() {
        let s = PLogPSample {
            rtt0_us: 400.0,
            g0_us: 20.0,
            rtt_us: 1000.0,
            os_us: 30.0,
            or_us: 10.0,
        };
        assert_eq!(s.latency_us(), 180.0);
        assert_eq!(s.gap_us(), 620.0);
    }

    #[test]
    fn proc_loadavg_parses() {
        let l = LoadInfo::from_proc_loadavg("0.52 0.58 0.59 2/1234 5678\n").unwrap();
        assert_eq!(
            (l.loadavg_1m, l.run_queue, l.total_procs),
            (0.52, 2, Some(1234))
        );
        assert!(LoadInfo::from_proc_loadavg("0.5 0.5").is_none());
        assert!(LoadInfo::from_proc_loadavg("x 0.5 0.5 1/2 3").is_none());
    }

    #[test]
    fn stats_median_and_percentiles() {
        let s = Stats::of(&[5.0, 1.0, 3.0, 2.0, 4.0]).unwrap();
        assert_eq!(s.median, 3.0);
        assert_eq!(s.min, 1.0);
        assert_eq!(s.max, 5.0);
        assert_eq!(s.count, 5);
        assert!((s.p10 - 1.4).abs() < 1e-12);
        assert!((s.p90 - 4.6).abs() < 1e-12);
        assert!(Stats::of(&[]).is_none());
        assert!(Stats::of(&[1.0, f64::NAN]).is_none());
    }

    #[test]
    fn record_finalize_round_trip_and_partial() {
        let mut c = Calibration::new(StrategyKind::AllPairs, "test", 1);
        c.add_host(CalibHost::new("a", "s", "10.0.0.1:1")).unwrap();
        c.add_host(CalibHost::new("b", "s", "10.0.0.2:1")).unwrap();
        assert!(c.add_host(CalibHost::new("a", "s", "x")).is_err());
        c.record_pingpong(
            "a",
            "b",
            SendMode::Isend,
            64,
            2,
            &[pp(100.0, 5.0, 7.0, 6.0, 2.0), pp(110.0, 5.0, 7.0, 6.0, 2.0)],
        )
        .unwrap();
        let e = c
            .record_pingpong("a", "zz", SendMode::Isend, 64, 0, &[])
            .unwrap_err();
        assert!(e.to_string().contains("\"zz\""), "{e}");
        c.mark_partial("b", "agent unreachable");
        c.finalize(2);
        let st = c.pairs[0].sizes[0].stats.unwrap();
        assert_eq!(st.l.median, 42.5);
        assert!(c.pairs[0].partial.as_deref().unwrap().contains("b"));
        let back = Calibration::from_json(&c.to_json()).unwrap();
        assert_eq!(back, c);
        assert!(back.partial.unwrap().reason.contains("agent unreachable"));
    }

    #[test]
    fn validation_names_the_place() {
        let mut c = Calibration::new(StrategyKind::AllPairs, "test", 1);
        c.add_host(CalibHost::new("a", "s", "x")).unwrap();
        c.record_pingpong(
            "a",
            "a",
            SendMode::Send,
            64,
            0,
            &[pp(1.0, 0.0, 0.0, 0.0, 0.0)],
        )
        .unwrap();
        let mut text = c.to_json();
        text = text.replace("\"rtt_us\": 1.0", "\"rtt_us\": -1e999");
        let e = Calibration::from_json(&text).unwrap_err();
        assert!(matches!(e, CalibError::Json(_)), "{e}");
        c.pairs[0].sizes[0].samples[0].os_src_us = f64::INFINITY;
        let e = c.validate().unwrap_err();
        assert!(e.to_string().contains("samples[0].os_src_us"), "{e}");
        c.pairs[0].sizes[0].samples[0].os_src_us = 0.0;
        c.provenance.inherited.push(Inheritance {
            pair: PairRef::new("a", "a"),
            from: PairRef::new("a", "q"),
        });
        let e = c.validate().unwrap_err();
        assert!(e.to_string().contains("\"q\""), "{e}");
    }
}
