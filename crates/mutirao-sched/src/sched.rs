//! List schedulers and the `mutirao-schedule/1` format.
//!
//! * [`Algorithm::Heft`]: HEFT (Topcuoglu, Hariri & Wu 2002), insertion-based, under the
//!   latency model (a message between hosts costs `Os + L + Or` of delay, none within a host,
//!   no CPU time) — the thesis's baseline.
//! * [`Algorithm::HlogpHeft`]: the thesis's overhead-aware HEFT (digest 000 §11.7). Same
//!   upward rank; for each candidate host the predecessors' send slots are placed in their
//!   reserved send windows, receive overheads are placed on the candidate in arrival order right
//!   before the task, and after the task a send window of `Σ_succ max_q Os(m, p, q)` is
//!   reserved, shrunk to the actual `Os` as each successor is placed. The schedule's times are
//!   then the HLogP simulator's replay of that mapping and order (the list scheduler's own
//!   times are conservative where a window shrank after a later block was placed behind it), so
//!   `makespan_s` equals what `mutirao simulate` predicts for the schedule.
//! * [`Algorithm::Peft`]: PEFT (Arabnejad & Barbosa 2014), optimistic cost table, latency model.
//! * [`Algorithm::RoundRobin`]: `mpirun`'s default: task `i` (rank order = task order in the
//!   graph) on host `i mod P`; times from the HLogP simulator.
//!
//! Every algorithm picks, among the tasks whose predecessors are all placed, the one with the
//! highest priority, so every schedule respects precedence even with zero or negative costs.

use crate::dag::Dag;
use crate::net::Capacities;
use crate::platform::Platform;
use crate::sim::{self, CommMode, Placement, SimError, SimOptions, WaitMode};
use serde::{Deserialize, Serialize};
use std::collections::BinaryHeap;
use std::fmt::Write as _;

/// The format tag every schedule file carries.
pub const SCHEDULE_FORMAT: &str = "mutirao-schedule/1";

/// A scheduling algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Insertion-based HEFT under the latency model.
    Heft,
    /// The thesis's HLogP-aware HEFT.
    HlogpHeft,
    /// PEFT under the latency model.
    Peft,
    /// Round-robin in rank order.
    RoundRobin,
}

impl Algorithm {
    /// Every algorithm, in a fixed order.
    pub const ALL: [Algorithm; 4] = [
        Algorithm::Heft,
        Algorithm::Peft,
        Algorithm::HlogpHeft,
        Algorithm::RoundRobin,
    ];

    /// The name used on the command line and in schedule files.
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::Heft => "heft",
            Algorithm::HlogpHeft => "hlogp-heft",
            Algorithm::Peft => "peft",
            Algorithm::RoundRobin => "round-robin",
        }
    }

    /// The model the algorithm's own makespan estimate uses.
    pub fn own_model(self) -> CommMode {
        match self {
            Algorithm::Heft | Algorithm::Peft => CommMode::LatencyOnly,
            Algorithm::HlogpHeft | Algorithm::RoundRobin => CommMode::HLogP,
        }
    }
}

impl std::str::FromStr for Algorithm {
    type Err = SchedError;
    fn from_str(s: &str) -> Result<Self, SchedError> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| SchedError::UnknownAlgorithm(s.to_string()))
    }
}

/// What is wrong with a scheduling request or a schedule file.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SchedError {
    /// Unknown algorithm name.
    #[error("unknown algorithm {0:?}; use one of heft, hlogp-heft, peft, round-robin")]
    UnknownAlgorithm(String),
    /// The schedule text is not JSON of the expected shape.
    #[error("schedule is not valid mutirao-schedule/1 JSON: {0}")]
    Json(String),
    /// Wrong format tag.
    #[error("schedule format is {found:?}, expected {SCHEDULE_FORMAT:?}")]
    Format {
        /// The tag found.
        found: String,
    },
    /// A schedule entry names a task the graph lacks.
    #[error("schedule tasks[{index}]: task {id:?} is not in the task graph")]
    UnknownTask {
        /// Entry index.
        index: usize,
        /// Task id.
        id: String,
    },
    /// A schedule entry names a host the model lacks.
    #[error("schedule tasks[{index}] (task {id:?}): host {host:?} is not in the model")]
    UnknownHost {
        /// Entry index.
        index: usize,
        /// Task id.
        id: String,
        /// Host name.
        host: String,
    },
    /// A task appears twice.
    #[error("schedule tasks[{index}]: task {id:?} is already placed by tasks[{first}]")]
    DuplicateTask {
        /// Entry index.
        index: usize,
        /// First entry.
        first: usize,
        /// Task id.
        id: String,
    },
    /// A task of the graph is not placed.
    #[error("the schedule does not place task {0:?} of the task graph")]
    MissingTask(String),
    /// A start time is not a finite number.
    #[error("schedule tasks[{index}] (task {id:?}): start_s is not a finite number")]
    BadTime {
        /// Entry index.
        index: usize,
        /// Task id.
        id: String,
    },
    /// The simulator rejected the placement.
    #[error(transparent)]
    Sim(#[from] SimError),
}

/// One placed task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduledTask {
    /// Task id.
    pub id: String,
    /// Host name.
    pub host: String,
    /// Predicted start, seconds.
    pub start_s: f64,
    /// Predicted finish, seconds.
    pub finish_s: f64,
}

/// A `mutirao-schedule/1` document. `tasks` lists the tasks in the order the algorithm placed
/// them; the simulator sends each task's messages in this order of their receivers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    /// Always [`SCHEDULE_FORMAT`].
    pub format: String,
    /// Algorithm name.
    pub algorithm: String,
    /// The algorithm's own makespan estimate, seconds.
    pub makespan_s: f64,
    /// The simulator's makespan for this schedule under both network models (absent in files
    /// written before contention existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_s: Option<Predicted>,
    /// The hosts the schedule uses, with the address each was calibrated at (when the model
    /// has one): `exec-dag --hostfile` finds them by name or address.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<ScheduleHost>,
    /// Placed tasks, in placement order.
    pub tasks: Vec<ScheduledTask>,
}

/// The simulator's makespan of a schedule under both network models: both replay the same
/// placement (task → host mapping and per-host order), so `contention ≥ no_contention`
/// (contention only delays messages; `tests/contention_floor.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Predicted {
    /// With contention (`None` when the model has no capacities).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contention: Option<f64>,
    /// Without: the thesis's HLogP.
    pub no_contention: f64,
}

/// A host of a schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleHost {
    /// Name in the model.
    pub name: String,
    /// Address, when the model has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
}

impl Schedule {
    /// Parse a schedule (format tag checked; contents checked by [`Schedule::placement`]).
    pub fn from_json(text: &str) -> Result<Self, SchedError> {
        let s: Schedule =
            serde_json::from_str(text).map_err(|e| SchedError::Json(e.to_string()))?;
        if s.format != SCHEDULE_FORMAT {
            return Err(SchedError::Format { found: s.format });
        }
        Ok(s)
    }

    /// Pretty JSON text.
    pub fn to_json(&self) -> String {
        // Strings and finite floats always serialize.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Check the schedule against a graph and a platform and turn it into a [`Placement`].
    pub fn placement(&self, dag: &Dag, platform: &Platform) -> Result<Placement, SchedError> {
        let n = dag.len();
        let ids = dag.id_index();
        let mut host = vec![usize::MAX; n];
        let mut start = vec![0.0; n];
        let mut seq = vec![0; n];
        let mut first = vec![usize::MAX; n];
        for (index, st) in self.tasks.iter().enumerate() {
            let t = *ids
                .get(st.id.as_str())
                .ok_or_else(|| SchedError::UnknownTask {
                    index,
                    id: st.id.clone(),
                })?;
            if first[t] != usize::MAX {
                return Err(SchedError::DuplicateTask {
                    index,
                    first: first[t],
                    id: st.id.clone(),
                });
            }
            first[t] = index;
            host[t] = platform
                .host_index(&st.host)
                .ok_or_else(|| SchedError::UnknownHost {
                    index,
                    id: st.id.clone(),
                    host: st.host.clone(),
                })?;
            if !st.start_s.is_finite() {
                return Err(SchedError::BadTime {
                    index,
                    id: st.id.clone(),
                });
            }
            start[t] = st.start_s;
            seq[t] = index;
        }
        if let Some(t) = (0..n).find(|&t| first[t] == usize::MAX) {
            return Err(SchedError::MissingTask(dag.tasks()[t].id.clone()));
        }
        Ok(Placement { host, start, seq })
    }

    /// A hostfile for `mutirao run`: one `host slots=1` line per rank, rank `i` being task `i`
    /// of the graph (task order in the graph file). `exec-dag --hostfile` accepts it as is.
    pub fn hostfile(&self, dag: &Dag) -> String {
        self.rank_hosts(dag)
            .iter()
            .map(|h| format!("{h} slots=1\n"))
            .collect()
    }

    /// An Open MPI-style rankfile: `rank i=HOST slot=0` per task, rank `i` being task `i`.
    pub fn rankfile(&self, dag: &Dag) -> String {
        let mut s = String::new();
        for (i, h) in self.rank_hosts(dag).iter().enumerate() {
            let _ = writeln!(s, "rank {i}={h} slot=0");
        }
        s
    }

    /// Host of each task, by rank: the address the host was calibrated at when the schedule
    /// has one (that is where its agent listens), else its name.
    fn rank_hosts<'a>(&'a self, dag: &Dag) -> Vec<&'a str> {
        let ids = dag.id_index();
        let mut out = vec![""; dag.len()];
        for st in &self.tasks {
            if let Some(&t) = ids.get(st.id.as_str()) {
                out[t] = self
                    .hosts
                    .iter()
                    .find(|h| h.name == st.host)
                    .and_then(|h| h.addr.as_deref())
                    .unwrap_or(st.host.as_str());
            }
        }
        out
    }
}

/// The quality figures of the HEFT paper for one makespan.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Metrics {
    /// Schedule length ratio: makespan / Σ over the min-cost critical path of min execution time.
    pub slr: f64,
    /// Best single-host sequential time / makespan.
    pub speedup: f64,
    /// Speedup / number of hosts.
    pub efficiency: f64,
}

/// SLR, speedup and efficiency of `makespan_s` (Topcuoglu et al. 2002, §6.1).
pub fn metrics(dag: &Dag, platform: &Platform, makespan_s: f64) -> Metrics {
    let cp = sim::critical_path_bound_s(dag, platform);
    let seq = dag.tasks().iter().map(|t| t.work).sum::<f64>() / platform.max_speed();
    let slr = if cp > 0.0 { makespan_s / cp } else { 1.0 };
    let speedup = if makespan_s > 0.0 {
        seq / makespan_s
    } else {
        1.0
    };
    Metrics {
        slr,
        speedup,
        efficiency: speedup / platform.len() as f64,
    }
}

/// HEFT upward rank with mean execution time and mean one-way message time.
pub fn upward_rank(dag: &Dag, platform: &Platform) -> Vec<f64> {
    let inv = platform.mean_inv_speed();
    let mut rank = vec![0.0f64; dag.len()];
    for &v in dag.topo_order().iter().rev() {
        let best = dag
            .out_edges(v)
            .iter()
            .map(|&ei| {
                let e = dag.edges()[ei];
                platform.mean_one_way_s(e.bytes) + rank[e.to]
            })
            .fold(0.0, f64::max);
        rank[v] = dag.tasks()[v].work * inv + best;
    }
    rank
}

/// The schedulers' estimate of contention: per shared resource (NIC out, NIC in, site link), the
/// intervals during which messages already placed use it. A message of `m` bytes needs each
/// resource `r` of its path for `m / C_r` seconds (its share of the resource's time); it is
/// placed in the first gap of each resource at or after its send, and arrives as much later
/// than alone as the latest of those ends exceeds `start + m / bottleneck`. Equal to the
/// simulator's max–min sharing for the last of messages that compete for one resource; an
/// estimate otherwise (the simulator's replay gives the schedule's times).
#[derive(Debug, Clone)]
pub struct LinkBook {
    caps: Capacities,
    busy: Vec<Vec<(f64, f64)>>,
    log: Vec<(usize, f64)>,
}

impl LinkBook {
    /// An empty book over `caps`.
    pub fn new(caps: Capacities) -> Self {
        let r = caps.resources();
        LinkBook {
            caps,
            busy: vec![Vec::new(); r],
            log: Vec::new(),
        }
    }

    /// A point to [`LinkBook::undo`] back to.
    pub fn mark(&self) -> usize {
        self.log.len()
    }

    /// Remove every reservation made since `mark`.
    pub fn undo(&mut self, mark: usize) {
        while self.log.len() > mark {
            let Some((r, s)) = self.log.pop() else { break };
            let iv = &mut self.busy[r];
            if let Some(i) = iv.iter().position(|x| x.0 == s) {
                iv.remove(i);
            }
        }
    }

    /// Reserve the path `src -> dst` for `bytes` sent at `at`; returns the delay over alone.
    /// `_edge` names the message for debugging.
    pub fn reserve(&mut self, src: usize, dst: usize, bytes: u64, at: f64, _edge: usize) -> f64 {
        let Some(path) = self.caps.path(src, dst) else {
            return 0.0;
        };
        let b = self.caps.bottleneck(&path);
        if !(b.is_finite() && b > 0.0) || bytes == 0 {
            return 0.0;
        }
        let alone_end = at + bytes as f64 / b;
        let mut end = alone_end;
        for &r in path.ids() {
            let c = self.caps.capacity(r);
            if !c.is_finite() {
                continue;
            }
            let dur = bytes as f64 / c;
            let iv = &mut self.busy[r];
            // First gap at or after `at` that holds `dur`.
            let mut i = iv.partition_point(|x| x.1 <= at);
            let mut s = at;
            while i < iv.len() {
                if s + dur <= iv[i].0 {
                    break;
                }
                s = s.max(iv[i].1);
                i += 1;
            }
            iv.insert(i, (s, s + dur));
            self.log.push((r, s));
            end = end.max(s + dur);
        }
        end - alone_end
    }
}

/// Intervals of one host's timeline, sorted and disjoint.
#[derive(Default, Clone)]
struct Timeline {
    // (start, end, owner task)
    iv: Vec<(f64, f64, usize)>,
}

impl Timeline {
    /// Gaps `[gs, ge)` that end after `from`, in time order (the last one is unbounded).
    fn gaps_from(&self, from: f64) -> impl Iterator<Item = (f64, f64)> + '_ {
        let i0 = self.iv.partition_point(|&(_, e, _)| e <= from);
        (i0..=self.iv.len()).map(move |i| {
            let gs = if i == 0 { 0.0 } else { self.iv[i - 1].1 };
            let ge = if i == self.iv.len() {
                f64::INFINITY
            } else {
                self.iv[i].0
            };
            (gs, ge)
        })
    }

    fn insert(&mut self, s: f64, e: f64, owner: usize) {
        let i = self.iv.partition_point(|&(a, _, _)| a <= s);
        self.iv.insert(i, (s, e, owner));
    }

    fn set_end(&mut self, s: f64, owner: usize, e: f64) {
        let mut i = self.iv.partition_point(|&(a, _, _)| a < s);
        while i < self.iv.len() {
            if self.iv[i].2 == owner {
                self.iv[i].1 = e;
                return;
            }
            i += 1;
        }
    }
}

struct Plan {
    host: Vec<usize>,
    start: Vec<f64>,
    finish: Vec<f64>,
    order: Vec<usize>,
}

/// Scheduler options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SchedOptions {
    /// HEFT and HLogP-HEFT estimate each message's arrival with the contention of the messages
    /// already placed ([`LinkBook`]), and the HLogP replays (hlogp-heft, round-robin) simulate
    /// contention. Needs the platform's capacities.
    pub contention: bool,
}

/// Schedule `dag` on `platform` with `algo` (the thesis's semantics: no contention).
pub fn schedule(dag: &Dag, platform: &Platform, algo: Algorithm) -> Result<Schedule, SchedError> {
    schedule_with(dag, platform, algo, SchedOptions::default())
}

/// Schedule `dag` on `platform` with `algo` and `opts`. `predicted_s` holds the simulator's
/// makespan of the result under both network models (contention only when the platform has
/// capacities).
pub fn schedule_with(
    dag: &Dag,
    platform: &Platform,
    algo: Algorithm,
    opts: SchedOptions,
) -> Result<Schedule, SchedError> {
    let mut book = if opts.contention {
        let caps = platform
            .capacities()
            .map_err(|e| SimError::NoCapacity(e.to_string()))?;
        Some(LinkBook::new(caps.clone()))
    } else {
        None
    };
    let plan = match algo {
        Algorithm::Heft => {
            let rank = upward_rank(dag, platform);
            list_latency(dag, platform, &rank, None, book.as_mut())
        }
        Algorithm::Peft => {
            let (oct, rank) = peft_oct(dag, platform);
            list_latency(dag, platform, &rank, Some(&oct), None)
        }
        Algorithm::HlogpHeft => {
            let rank = upward_rank(dag, platform);
            let plan = hlogp_heft(dag, platform, &rank, book.as_mut());
            replay(dag, platform, plan, opts.contention)?
        }
        Algorithm::RoundRobin => round_robin(dag, platform, opts.contention)?,
    };
    let makespan = plan.finish.iter().copied().fold(0.0, f64::max);
    let tasks = plan
        .order
        .iter()
        .map(|&t| ScheduledTask {
            id: dag.tasks()[t].id.clone(),
            host: platform.hosts()[plan.host[t]].name.clone(),
            start_s: plan.start[t],
            finish_s: plan.finish[t],
        })
        .collect();
    let mut seq = vec![0usize; dag.len()];
    for (i, &t) in plan.order.iter().enumerate() {
        seq[t] = i;
    }
    let placement = Placement {
        host: plan.host.clone(),
        start: plan.start.clone(),
        seq,
    };
    let no_contention = sim::simulate(dag, platform, &placement, SimOptions::default())?.makespan_s;
    let contention = match platform.capacities() {
        Ok(_) => Some(
            sim::simulate(
                dag,
                platform,
                &placement,
                SimOptions {
                    contention: true,
                    ..SimOptions::default()
                },
            )?
            .makespan_s,
        ),
        Err(_) => None,
    };
    let mut used: Vec<usize> = Vec::new();
    for &t in &plan.order {
        if !used.contains(&plan.host[t]) {
            used.push(plan.host[t]);
        }
    }
    let hosts = used
        .iter()
        .map(|&h| ScheduleHost {
            name: platform.hosts()[h].name.clone(),
            addr: platform.hosts()[h].addr.clone(),
        })
        .collect();
    Ok(Schedule {
        format: SCHEDULE_FORMAT.to_string(),
        algorithm: algo.as_str().to_string(),
        makespan_s: makespan,
        predicted_s: Some(Predicted {
            contention,
            no_contention,
        }),
        hosts,
        tasks,
    })
}

/// Ready-list driver: repeatedly take the ready task with the highest `rank` (ties: earlier in
/// topological order) and hand it to `place`.
fn by_priority(dag: &Dag, rank: &[f64], mut place: impl FnMut(usize)) -> Vec<usize> {
    #[derive(PartialEq)]
    struct Item(f64, usize, usize);
    impl Eq for Item {}
    impl PartialOrd for Item {
        fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
            Some(self.cmp(o))
        }
    }
    impl Ord for Item {
        fn cmp(&self, o: &Self) -> std::cmp::Ordering {
            self.0.total_cmp(&o.0).then(o.1.cmp(&self.1))
        }
    }
    let n = dag.len();
    let mut topo_pos = vec![0usize; n];
    for (i, &t) in dag.topo_order().iter().enumerate() {
        topo_pos[t] = i;
    }
    let mut remaining: Vec<usize> = (0..n).map(|t| dag.in_edges(t).len()).collect();
    let mut heap: BinaryHeap<Item> = (0..n)
        .filter(|&t| remaining[t] == 0)
        .map(|t| Item(rank[t], topo_pos[t], t))
        .collect();
    let mut order = Vec::with_capacity(n);
    while let Some(Item(_, _, v)) = heap.pop() {
        place(v);
        order.push(v);
        for &ei in dag.out_edges(v) {
            let w = dag.edges()[ei].to;
            remaining[w] -= 1;
            if remaining[w] == 0 {
                heap.push(Item(rank[w], topo_pos[w], w));
            }
        }
    }
    order
}

/// Insertion-based EFT list scheduling under the latency model (HEFT; PEFT with `oct`).
fn list_latency(
    dag: &Dag,
    platform: &Platform,
    rank: &[f64],
    oct: Option<&[f64]>,
    mut book: Option<&mut LinkBook>,
) -> Plan {
    let n = dag.len();
    let np = platform.len();
    let mut host = vec![0usize; n];
    let mut start = vec![0.0; n];
    let mut finish = vec![0.0; n];
    let mut tl = vec![Timeline::default(); np];
    let order = by_priority(dag, rank, |v| {
        let mut best = (f64::INFINITY, f64::INFINITY, 0usize, 0.0);
        for p in 0..np {
            let mark = book.as_ref().map_or(0, |b| b.mark());
            let mut ready: f64 = 0.0;
            for &ei in dag.in_edges(v) {
                let e = dag.edges()[ei];
                let hu = host[e.from];
                let a = if hu == p {
                    finish[e.from]
                } else {
                    let d = book.as_mut().map_or(0.0, |b| {
                        b.reserve(hu, p, e.bytes, finish[e.from], usize::MAX)
                    });
                    finish[e.from] + platform.one_way_s(e.bytes, hu, p) + d
                };
                ready = ready.max(a);
            }
            if let Some(b) = book.as_mut() {
                b.undo(mark);
            }
            let w = platform.exec_s(dag.tasks()[v].work, p);
            let mut s = ready;
            for (gs, ge) in tl[p].gaps_from(ready) {
                s = gs.max(ready);
                if s + w <= ge {
                    break;
                }
            }
            let eft = s + w;
            let key = eft + oct.map_or(0.0, |o| o[v * np + p]);
            if key < best.0 || (key == best.0 && eft < best.1) {
                best = (key, eft, p, s);
            }
        }
        let (_, eft, p, s) = best;
        host[v] = p;
        start[v] = s;
        finish[v] = eft;
        tl[p].insert(s, eft, v);
        if let Some(b) = book.as_mut() {
            for &ei in dag.in_edges(v) {
                let e = dag.edges()[ei];
                let hu = host[e.from];
                if hu != p {
                    b.reserve(hu, p, e.bytes, finish[e.from], ei);
                }
            }
        }
    });
    Plan {
        host,
        start,
        finish,
        order,
    }
}

/// PEFT's optimistic cost table (row-major, `tasks × hosts`) and rank_oct (row means).
pub fn peft_oct(dag: &Dag, platform: &Platform) -> (Vec<f64>, Vec<f64>) {
    let n = dag.len();
    let np = platform.len();
    let mut oct = vec![0.0f64; n * np];
    let mut x = vec![0.0f64; np];
    for &v in dag.topo_order().iter().rev() {
        for &ei in dag.out_edges(v) {
            let e = dag.edges()[ei];
            let s = e.to;
            let c = platform.mean_one_way_s(e.bytes);
            let mut m = f64::INFINITY;
            for w in 0..np {
                x[w] = oct[s * np + w] + platform.exec_s(dag.tasks()[s].work, w);
                m = m.min(x[w]);
            }
            for p in 0..np {
                let val = x[p].min(m + c);
                if val > oct[v * np + p] {
                    oct[v * np + p] = val;
                }
            }
        }
    }
    let rank = (0..n)
        .map(|v| oct[v * np..(v + 1) * np].iter().sum::<f64>() / np as f64)
        .collect();
    (oct, rank)
}

/// The thesis's HLogP-aware HEFT.
fn hlogp_heft(
    dag: &Dag,
    platform: &Platform,
    rank: &[f64],
    mut book: Option<&mut LinkBook>,
) -> Plan {
    let n = dag.len();
    let np = platform.len();
    let edges = dag.edges();
    let mut host = vec![0usize; n];
    let mut start = vec![0.0; n];
    let mut finish = vec![0.0; n];
    let mut block_start = vec![0.0; n];
    let mut sent = vec![0.0f64; n];
    let mut pending = vec![0.0f64; n];
    let mut unplaced = vec![0usize; n];
    let mut tl = vec![Timeline::default(); np];
    let mut arr: Vec<(f64, usize, f64)> = Vec::new();
    // With contention (a link book), a rendezvous message also costs its sender the push of its
    // bytes after the send call, as the simulator charges it: the sender's slot grows, the
    // message does not leave later.
    let with_push = book.is_some();
    let push = |bytes: u64, src: usize, dst: usize| {
        if with_push {
            platform.push_s(bytes, src, dst)
        } else {
            0.0
        }
    };
    let max_push = |bytes: u64, src: usize| {
        if with_push {
            platform.max_push_s(bytes, src)
        } else {
            0.0
        }
    };
    let order = by_priority(dag, rank, |v| {
        // (finish, host, start, block start, window)
        let mut best = (f64::INFINITY, 0usize, 0.0, 0.0, 0.0);
        for (p, tlp) in tl.iter().enumerate() {
            arr.clear();
            let mark = book.as_ref().map_or(0, |b| b.mark());
            // Predecessors on one host send one after the other (their send slots).
            let mut extra: Vec<(usize, f64)> = Vec::new();
            for &ei in dag.in_edges(v) {
                let e = edges[ei];
                let u = e.from;
                let hu = host[u];
                let before: f64 = extra.iter().filter(|x| x.0 == u).map(|x| x.1).sum();
                let ss = finish[u] + sent[u] + before;
                let lp = platform.link(hu, p);
                let os = lp.os.value(e.bytes) * 1e-6;
                extra.push((u, os + push(e.bytes, hu, p)));
                let mut a = ss + os + lp.l.value(e.bytes) * 1e-6;
                if hu != p {
                    if let Some(b) = book.as_mut() {
                        a += b.reserve(hu, p, e.bytes, ss + os, usize::MAX);
                    }
                }
                arr.push((a, ei, lp.or.value(e.bytes) * 1e-6));
            }
            if let Some(b) = book.as_mut() {
                b.undo(mark);
            }
            arr.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            let window: f64 = dag
                .out_edges(v)
                .iter()
                .map(|&ei| platform.max_os_s(edges[ei].bytes, p) + max_push(edges[ei].bytes, p))
                .sum();
            let w = platform.exec_s(dag.tasks()[v].work, p);
            let first = arr.first().map_or(0.0, |x| x.0);
            let mut found = (f64::INFINITY, 0.0, 0.0);
            for (gs, ge) in tlp.gaps_from(first) {
                let mut t = gs;
                for &(a, _, or) in arr.iter() {
                    t = t.max(a) + or;
                }
                let st = t;
                let fin = st + w;
                if fin + window <= ge {
                    found = (fin, st, gs.max(first));
                    break;
                }
            }
            if found.0 < best.0 {
                best = (found.0, p, found.1, found.2, window);
            }
        }
        let (fin, p, st, bs, window) = best;
        host[v] = p;
        start[v] = st;
        finish[v] = fin;
        block_start[v] = bs;
        unplaced[v] = dag.out_edges(v).len();
        pending[v] = window;
        tl[p].insert(bs, fin + window, v);
        // Place the predecessors' send slots and shrink their windows.
        for &ei in dag.in_edges(v) {
            let e = edges[ei];
            let u = e.from;
            let hu = host[u];
            let os = platform.os_s(e.bytes, hu, p);
            if hu != p {
                if let Some(b) = book.as_mut() {
                    b.reserve(hu, p, e.bytes, finish[u] + sent[u] + os, ei);
                }
            }
            sent[u] += os + push(e.bytes, hu, p);
            unplaced[u] -= 1;
            pending[u] = if unplaced[u] == 0 {
                0.0
            } else {
                (pending[u] - platform.max_os_s(e.bytes, hu) - max_push(e.bytes, hu)).max(0.0)
            };
            tl[hu].set_end(block_start[u], u, finish[u] + sent[u] + pending[u]);
        }
    });
    Plan {
        host,
        start,
        finish,
        order,
    }
}

/// Replace a plan's times by the HLogP simulator's replay of its mapping and per-host order
/// (HLogP-HEFT's reserved send windows make its internal times conservative).
fn replay(
    dag: &Dag,
    platform: &Platform,
    plan: Plan,
    contention: bool,
) -> Result<Plan, SchedError> {
    let mut seq = vec![0usize; dag.len()];
    for (i, &t) in plan.order.iter().enumerate() {
        seq[t] = i;
    }
    let placement = Placement {
        host: plan.host,
        start: plan.start,
        seq,
    };
    let r = sim::simulate(
        dag,
        platform,
        &placement,
        SimOptions {
            contention,
            ..SimOptions::default()
        },
    )?;
    Ok(Plan {
        host: placement.host,
        start: r.tasks.iter().map(|t| t.start_s).collect(),
        finish: r.tasks.iter().map(|t| t.finish_s).collect(),
        order: plan.order,
    })
}

fn round_robin(dag: &Dag, platform: &Platform, contention: bool) -> Result<Plan, SchedError> {
    let n = dag.len();
    let np = platform.len();
    let mut topo_pos = vec![0usize; n];
    for (i, &t) in dag.topo_order().iter().enumerate() {
        topo_pos[t] = i;
    }
    let placement = Placement {
        host: (0..n).map(|t| t % np).collect(),
        start: topo_pos.iter().map(|&p| p as f64).collect(),
        seq: topo_pos,
    };
    let r = sim::simulate(
        dag,
        platform,
        &placement,
        SimOptions {
            comm: CommMode::HLogP,
            wait: WaitMode::Block,
            record_messages: false,
            contention,
        },
    )?;
    Ok(Plan {
        host: placement.host,
        start: r.tasks.iter().map(|t| t.start_s).collect(),
        finish: r.tasks.iter().map(|t| t.finish_s).collect(),
        order: dag.topo_order().to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dag::{Edge, Task};
    use mutirao_model::{Host, Link, LinkClass, Model, Piecewise};

    fn model(speeds: &[f64], l_us: f64, os_us: f64, or_us: f64) -> Model {
        let hosts = speeds
            .iter()
            .enumerate()
            .map(|(i, &speed)| Host {
                name: format!("h{i}"),
                addr: None,
                site: "s".into(),
                speed,
            })
            .collect();
        let link = |class, scale: f64| Link {
            class,
            site: None,
            sites: None,
            src: None,
            dst: None,
            os: Piecewise::linear(os_us * scale, 0.0),
            or: Piecewise::linear(or_us * scale, 0.0),
            l: Piecewise::linear(l_us * scale, 0.0),
        };
        Model::new(
            hosts,
            vec![
                link(LinkClass::IntraSite, 1.0),
                link(LinkClass::SameHost, 0.0),
            ],
        )
        .unwrap()
    }

    fn chain(n: usize) -> Dag {
        let tasks = (0..n)
            .map(|i| Task {
                id: format!("t{i}"),
                work: 1.0,
            })
            .collect();
        let edges = (1..n)
            .map(|i| Edge {
                from: i - 1,
                to: i,
                bytes: 10,
            })
            .collect();
        Dag::new(tasks, edges).unwrap()
    }

    #[test]
    fn algorithm_names_round_trip_and_unknown_is_named() {
        for a in Algorithm::ALL {
            assert_eq!(a.as_str().parse::<Algorithm>().unwrap(), a);
        }
        let e = "fastest".parse::<Algorithm>().unwrap_err();
        assert!(e.to_string().contains("\"fastest\""), "{e}");
    }

    #[test]
    fn chain_goes_to_the_fastest_host_when_messages_cost() {
        let p = Platform::from_model(&model(&[1.0, 2.0, 0.5], 1e6, 0.0, 0.0)).unwrap();
        let dag = chain(4);
        for algo in [Algorithm::Heft, Algorithm::Peft, Algorithm::HlogpHeft] {
            let s = schedule(&dag, &p, algo).unwrap();
            assert!(s.tasks.iter().all(|t| t.host == "h1"), "{algo:?}: {s:?}");
            assert!((s.makespan_s - 2.0).abs() < 1e-12);
            let m = metrics(&dag, &p, s.makespan_s);
            assert!((m.slr - 1.0).abs() < 1e-12);
            assert!((m.speedup - 1.0).abs() < 1e-12);
            assert!((m.efficiency - 1.0 / 3.0).abs() < 1e-12);
        }
    }

    #[test]
    fn independent_tasks_spread_over_hosts() {
        let tasks = (0..4)
            .map(|i| Task {
                id: format!("t{i}"),
                work: 1.0,
            })
            .collect();
        let dag = Dag::new(tasks, vec![]).unwrap();
        let p = Platform::from_model(&model(&[1.0; 4], 10.0, 1.0, 1.0)).unwrap();
        for algo in Algorithm::ALL {
            let s = schedule(&dag, &p, algo).unwrap();
            assert_eq!(s.makespan_s, 1.0, "{algo:?}");
            let mut hosts: Vec<&str> = s.tasks.iter().map(|t| t.host.as_str()).collect();
            hosts.sort();
            hosts.dedup();
            assert_eq!(hosts.len(), 4, "{algo:?}");
        }
    }

    #[test]
    fn hlogp_heft_charges_overheads_heft_does_not() {
        // Fork of 1 -> 2 with big overheads: HEFT thinks remote messages only delay; HLogP-HEFT
        // knows the sender's CPU is busy for Os.
        let tasks = vec![
            Task {
                id: "r".into(),
                work: 1.0,
            },
            Task {
                id: "a".into(),
                work: 1.0,
            },
            Task {
                id: "b".into(),
                work: 1.0,
            },
        ];
        let edges = vec![
            Edge {
                from: 0,
                to: 1,
                bytes: 1,
            },
            Edge {
                from: 0,
                to: 2,
                bytes: 1,
            },
        ];
        let dag = Dag::new(tasks, edges).unwrap();
        let p = Platform::from_model(&model(&[1.0, 1.0], 0.0, 400_000.0, 400_000.0)).unwrap();
        let heft = schedule(&dag, &p, Algorithm::Heft).unwrap();
        let hl = schedule(&dag, &p, Algorithm::HlogpHeft).unwrap();
        // HEFT: r, then a local (t=1..2), b remote arriving at 1.8 -> 2.8.
        assert!((heft.makespan_s - 2.8).abs() < 1e-9, "{heft:?}");
        // HEFT starts `a` right after `r` on h0, as if the send to h1 cost h0 nothing.
        let a_heft = heft.tasks.iter().find(|t| t.id == "a").unwrap();
        assert_eq!((a_heft.host.as_str(), a_heft.start_s), ("h0", 1.0));
        // HLogP-HEFT reserves r's send window (Os 0.4 for b) on h0 before anything else runs
        // there; b pays Os 0.4 on h0 and Or 0.4 on h1: 1 + 0.4 + 0.4 + 1 = 2.8.
        assert!((hl.makespan_s - 2.8).abs() < 1e-9, "{hl:?}");
        let a_hl = hl.tasks.iter().find(|t| t.id == "a").unwrap();
        let b_hl = hl.tasks.iter().find(|t| t.id == "b").unwrap();
        assert_ne!(a_hl.host, b_hl.host);
        if a_hl.host == "h0" {
            assert!(a_hl.start_s >= 1.4 - 1e-9, "{hl:?}");
        }
        let pl = hl.placement(&dag, &p).unwrap();
        let r = crate::sim::simulate(&dag, &p, &pl, SimOptions::default()).unwrap();
        assert!((r.makespan_s - hl.makespan_s).abs() < 1e-9);
    }

    #[test]
    fn placement_errors_name_the_entry() {
        let p = Platform::from_model(&model(&[1.0, 1.0], 1.0, 1.0, 1.0)).unwrap();
        let dag = chain(2);
        let good = schedule(&dag, &p, Algorithm::Heft).unwrap();
        let mut s = good.clone();
        s.tasks[1].host = "nowhere".into();
        let e = s.placement(&dag, &p).unwrap_err();
        assert!(
            e.to_string().contains("tasks[1]") && e.to_string().contains("\"nowhere\""),
            "{e}"
        );
        let mut s = good.clone();
        s.tasks[0].id = "ghost".into();
        assert!(matches!(
            s.placement(&dag, &p),
            Err(SchedError::UnknownTask { index: 0, .. })
        ));
        let mut s = good.clone();
        s.tasks[1].id = s.tasks[0].id.clone();
        assert!(matches!(
            s.placement(&dag, &p),
            Err(SchedError::DuplicateTask {
                index: 1,
                first: 0,
                ..
            })
        ));
        let mut s = good.clone();
        s.tasks.pop();
        assert!(matches!(
            s.placement(&dag, &p),
            Err(SchedError::MissingTask(_))
        ));
        let e =
            Schedule::from_json(r#"{"format":"nope","algorithm":"x","makespan_s":1,"tasks":[]}"#)
                .unwrap_err();
        assert!(matches!(e, SchedError::Format { .. }));
    }

    #[test]
    fn out_of_order_schedule_is_a_named_deadlock() {
        let p = Platform::from_model(&model(&[1.0], 1.0, 1.0, 1.0)).unwrap();
        let dag = chain(2);
        let mut s = schedule(&dag, &p, Algorithm::Heft).unwrap();
        // Put t1 before t0 on the only host.
        s.tasks[0].start_s = 5.0;
        let pl = s.placement(&dag, &p).unwrap();
        let e = crate::sim::simulate(&dag, &p, &pl, SimOptions::default()).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("\"t1\"") && msg.contains("\"t0\"") && msg.contains("\"h0\""),
            "{msg}"
        );
    }

    #[test]
    fn hostfile_and_rankfile_list_ranks_in_task_order() {
        let p = Platform::from_model(&model(&[1.0, 1.0], 1e9, 0.0, 0.0)).unwrap();
        let dag = chain(2);
        let mut s = schedule(&dag, &p, Algorithm::RoundRobin).unwrap();
        assert_eq!(s.hostfile(&dag), "h0 slots=1\nh1 slots=1\n");
        s.tasks.reverse();
        assert_eq!(s.rankfile(&dag), "rank 0=h0 slot=0\nrank 1=h1 slot=0\n");
    }

    #[test]
    fn peft_oct_of_exit_tasks_is_zero_and_parents_see_children() {
        let p = Platform::from_model(&model(&[1.0, 0.5], 0.0, 0.0, 0.0)).unwrap();
        let dag = chain(2);
        let (oct, rank) = peft_oct(&dag, &p);
        assert_eq!(&oct[2..4], &[0.0, 0.0]);
        // OCT(t0, p) = min over w of work(t1)/speed(w) + comm (0 here) = 1.0.
        assert_eq!(&oct[0..2], &[1.0, 1.0]);
        assert_eq!(rank, vec![1.0, 0.0]);
    }
}
