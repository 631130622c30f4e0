//! The HLogP simulator: replay a mapped task graph and predict its makespan.
//!
//! Semantics (thesis §6, digest 000 §11.6):
//! * each host is one serial CPU; it runs its tasks in the order of their planned start;
//! * task `v` on host `q` takes `work(v) / speed(q)`;
//! * right after a task ends, its host sends the task's messages one after the other, each
//!   occupying the CPU for `Os(m, p, q)`; the message arrives `L(m, p, q)` after its send
//!   overhead ends. Messages leave in the order their receivers appear in the schedule;
//! * before a task starts, its host takes the receive overhead `Or(m, p, q)` of each incoming
//!   message in order of arrival, each no earlier than its arrival and after the host's previous
//!   activity; the task starts after the last one;
//! * messages between tasks on the same host use the model's same-host class (never zero);
//! * with contention ([`SimOptions::contention`]), messages between hosts are flows sharing
//!   NICs and site links ([`crate::net`]); a message above the model's eager limit (when it
//!   records one) is a rendezvous: its receive is posted when the host reaches the task (all of
//!   a task's such receives at once), its transfer is a flow from max(post, arrival of its
//!   request), its receive ends `Or` plus what sharing cost after the post — never before
//!   its end in HLogP's chain of receive overheads — and the task starts after the last; its
//!   sender's CPU is busy for the model's push cost of those bytes after its sends (the
//!   runtime moves them while the sender goes on; the message is not delayed by it);
//! * a rendezvous transfer's clear-to-send is a small flow on the receiver's own connection to
//!   the sender, so it waits behind the data the receiver already sends there (the runtime has
//!   one FIFO stream per peer); the data moves once it has crossed (in L of a small message)
//!   and not before the sender's burst of send calls and of posting its next task's receives
//!   is over (a sender reads its connections only then, so the clear-to-sends of that burst go
//!   ahead of the data its sends announced); those waits add to the receive;
//! * contention only adds: for the same placement, no message arrives, no receive chain ends
//!   and no task starts earlier than without it (`tests/contention_floor.rs`);
//! * [`CommMode::LatencyOnly`] is the thesis's latency-model baseline: no CPU occupation,
//!   a message between different hosts takes `Os + L + Or`, one within a host takes 0;
//! * [`WaitMode::Poll`] models busy-polling MPI libraries (MPICH-G2): every task mapped to a
//!   host is a process started at time 0 that polls until it has finished, so the `k`-th of
//!   `n` tasks on a host runs its CPU activity `n − k` times slower (three chained 5 s tasks on
//!   one host take 30 s, the thesis measured 31 s; with [`WaitMode::Block`] they take 15 s).

use crate::dag::Dag;
use crate::net::{Capacities, Done, FlowNetwork, Network};
use crate::platform::Platform;
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// Bytes of a rendezvous clear-to-send on the wire (the runtime's control frame in a TCP
/// segment): it matters only for what it waits behind.
const CTS_BYTES: u64 = 64;

/// A flow start event: (time, edge), ordered by time then edge.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Start(f64, usize);

impl Eq for Start {}

impl PartialOrd for Start {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for Start {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&o.0).then(self.1.cmp(&o.1))
    }
}

/// A task waiting for its rendezvous transfers.
struct Parked {
    /// When its receives end so far: the HLogP chain of all of them, then each transfer's end
    /// with what sharing cost it, as it ends.
    t: f64,
    /// CPU used so far.
    used: f64,
    /// Its slowdown factor (polling).
    f: f64,
    /// Transfers not yet ended.
    pending: u32,
}

/// How communication is charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CommMode {
    /// HLogP: overheads occupy the sender's and receiver's CPUs.
    #[default]
    HLogP,
    /// Latency model: `Os + L + Or` of delay between hosts, nothing within a host, no CPU use.
    LatencyOnly,
}

/// What a process waiting for a message does to its host's CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WaitMode {
    /// It sleeps (MPI-LAM): co-located tasks do not slow each other.
    #[default]
    Block,
    /// It busy-polls (MPICH-G2, most modern MPIs): co-located unfinished tasks share the CPU.
    Poll,
}

/// Simulator options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SimOptions {
    /// How communication is charged.
    pub comm: CommMode,
    /// Waiting behaviour.
    pub wait: WaitMode,
    /// Record one [`MessageEvent`] per edge (needed for a Gantt chart with overheads).
    pub record_messages: bool,
    /// Messages between different hosts share the NICs and site links they cross, max–min fair
    /// ([`crate::net`]); needs the platform's capacities. Off: the thesis's HLogP, where every
    /// message crosses the wire as if alone.
    pub contention: bool,
}

/// Where and in which order tasks run.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    /// Host index of each task.
    pub host: Vec<usize>,
    /// Planned start of each task: a host runs its tasks in increasing planned start
    /// (ties broken by `seq`).
    pub start: Vec<f64>,
    /// Position of each task in the schedule's list: a task sends its messages in increasing
    /// `seq` of their receivers (ties by edge order).
    pub seq: Vec<usize>,
}

/// What is wrong with a simulation request.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SimError {
    /// Placement vectors do not match the graph.
    #[error("placement covers {found} tasks but the graph has {expected}")]
    Size {
        /// Tasks in the placement.
        found: usize,
        /// Tasks in the graph.
        expected: usize,
    },
    /// A task is mapped to a host index the platform does not have.
    #[error("task {task:?} is placed on host #{host}, but the model has only {hosts} hosts")]
    UnknownHost {
        /// Task id.
        task: String,
        /// Host index.
        host: usize,
        /// Number of hosts.
        hosts: usize,
    },
    /// Contention was asked for but the platform lacks a capacity.
    #[error("{0}")]
    NoCapacity(String),
    /// The per-host order contradicts the task graph.
    #[error("the schedule cannot run: task {waiting:?} on host {host:?} is ordered before task {blocked_by:?} (host {other_host:?}) that it waits for; fix the start times so that each host runs its tasks in dependency order")]
    Deadlock {
        /// The task at the head of a host's queue that cannot start.
        waiting: String,
        /// Its host.
        host: String,
        /// A predecessor it waits for that never runs.
        blocked_by: String,
        /// That predecessor's host.
        other_host: String,
    },
}

/// Start and finish of one task.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TaskTimes {
    /// Start of the computation (after its receive overheads), seconds.
    pub start_s: f64,
    /// End of the computation, seconds.
    pub finish_s: f64,
}

/// Busy and idle time of one host over the makespan.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct HostUse {
    /// CPU time spent computing and in overheads, seconds.
    pub busy_s: f64,
    /// `makespan − busy`, seconds.
    pub idle_s: f64,
}

/// Timeline of one message (one edge).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MessageEvent {
    /// Edge index in the graph.
    pub edge: usize,
    /// Sending host index.
    pub src_host: usize,
    /// Receiving host index.
    pub dst_host: usize,
    /// Start of the send overhead.
    pub send_start_s: f64,
    /// End of the send overhead.
    pub send_end_s: f64,
    /// Arrival at the receiver.
    pub arrival_s: f64,
    /// Start of the receive overhead.
    pub recv_start_s: f64,
    /// End of the receive overhead.
    pub recv_end_s: f64,
}

/// The simulator's prediction.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimResult {
    /// Predicted makespan: the last task's finish, seconds.
    pub makespan_s: f64,
    /// Per-host busy and idle time.
    pub hosts: Vec<HostUse>,
    /// Per-task start and finish.
    pub tasks: Vec<TaskTimes>,
    /// Per-edge message events (empty unless [`SimOptions::record_messages`]).
    pub messages: Vec<MessageEvent>,
}

/// Simulate `dag` on `platform` with the given placement.
///
/// Runs in O((V + E) log) time; a 10⁶-task graph takes well under a second (see the
/// `sched` benchmark).
pub fn simulate(
    dag: &Dag,
    platform: &Platform,
    placement: &Placement,
    opts: SimOptions,
) -> Result<SimResult, SimError> {
    simulate_with_network(dag, platform, placement, opts, |c| Network::new(c.clone()))
}

/// [`simulate`] with another flow network for contention (tests compare [`Network`] with a
/// straightforward reference solver through this).
#[doc(hidden)]
pub fn simulate_with_network<N: FlowNetwork>(
    dag: &Dag,
    platform: &Platform,
    placement: &Placement,
    opts: SimOptions,
    network: impl FnOnce(&Capacities) -> N,
) -> Result<SimResult, SimError> {
    let n = dag.len();
    let np = platform.len();
    for (found, _) in [
        (placement.host.len(), 0),
        (placement.start.len(), 1),
        (placement.seq.len(), 2),
    ] {
        if found != n {
            return Err(SimError::Size { found, expected: n });
        }
    }
    if let Some(t) = (0..n).find(|&t| placement.host[t] >= np) {
        return Err(SimError::UnknownHost {
            task: dag.tasks()[t].id.clone(),
            host: placement.host[t],
            hosts: np,
        });
    }
    // Per-host run order.
    // Sorted by (host, start, seq, task): keys side by side, the start as an integer ordered
    // as `f64::total_cmp` orders the floats.
    let mut keyed: Vec<(usize, i64, usize, usize)> = (0..n)
        .map(|t| {
            let b = placement.start[t].to_bits() as i64;
            let start = b ^ (((b >> 63) as u64) >> 1) as i64;
            (placement.host[t], start, placement.seq[t], t)
        })
        .collect();
    keyed.sort_unstable();
    let order: Vec<usize> = keyed.into_iter().map(|k| k.3).collect();
    let mut host_off = vec![0usize; np + 1];
    for &t in &order {
        host_off[placement.host[t] + 1] += 1;
    }
    for h in 0..np {
        host_off[h + 1] += host_off[h];
    }
    let mut pos = vec![0usize; n];
    for (i, &t) in order.iter().enumerate() {
        pos[t] = i - host_off[placement.host[t]];
    }
    let edges = dag.edges();
    let mut remaining: Vec<u32> = (0..n).map(|t| dag.in_edges(t).len() as u32).collect();
    let mut host_next = vec![0usize; np];
    let mut host_free = vec![0.0f64; np];
    let mut busy = vec![0.0f64; np];
    let mut arrival = vec![0.0f64; edges.len()];
    let mut messages: Vec<MessageEvent> = Vec::new();
    if opts.record_messages {
        messages = edges
            .iter()
            .enumerate()
            .map(|(ei, e)| MessageEvent {
                edge: ei,
                src_host: placement.host[e.from],
                dst_host: placement.host[e.to],
                send_start_s: 0.0,
                send_end_s: 0.0,
                arrival_s: 0.0,
                recv_start_s: 0.0,
                recv_end_s: 0.0,
            })
            .collect();
    }
    let mut times = vec![
        TaskTimes {
            start_s: 0.0,
            finish_s: 0.0
        };
        n
    ];
    let mut ready: Vec<usize> = (0..np)
        .filter(|&h| host_off[h] < host_off[h + 1])
        .map(|h| order[host_off[h]])
        .filter(|&t| remaining[t] == 0)
        .collect();
    let mut buf: Vec<(f64, usize)> = Vec::new();
    let mut sbuf: Vec<(usize, usize)> = Vec::new();
    let mut done = 0usize;
    let hlogp = opts.comm == CommMode::HLogP;
    // Contention: messages between different hosts become flows of the network, started at
    // their send end; each one's HLogP arrival is delayed by what sharing costs it (net.rs).
    // Event order: tasks are computed as soon as all their inputs are known. A task computed
    // when the network reaches time T starts at or after T (its last input arrived at T, or it
    // follows on its host a task that did), so every flow it starts begins at or after T: the
    // network always learns of a flow before it processes any later instant.
    let mut net = if opts.contention {
        let caps = platform
            .capacities()
            .map_err(|e| SimError::NoCapacity(e.to_string()))?;
        Some(network(caps))
    } else {
        None
    };
    let mut starts: BinaryHeap<Reverse<Start>> = BinaryHeap::new();
    let mut finished: Vec<Done> = Vec::new();
    // Rendezvous (contention with HLogP, when the model records the eager limit): tasks waiting
    // for their transfers, when each transfer's receive was posted, tasks ready to go on.
    let rdv_flows = net.is_some() && hlogp;
    let mut parked: HashMap<usize, Parked> = HashMap::new();
    let mut recv_post: Vec<f64> = if rdv_flows {
        vec![0.0; edges.len()]
    } else {
        Vec::new()
    };
    // Each rendezvous receive's end in the HLogP chain: it never ends earlier.
    let mut rdv_floor: Vec<f64> = if rdv_flows {
        vec![0.0; edges.len()]
    } else {
        Vec::new()
    };
    // Each rendezvous transfer: started yet, and what sharing cost it once it ended (NaN until
    // then). A transfer starts when both its request has been sent and its receiver's host has
    // reached the task (the runtime posts a task's receives when its host is free for it, not
    // when the last of its inputs is announced), whichever is known last.
    let mut rdv_started: Vec<bool> = if rdv_flows {
        vec![false; edges.len()]
    } else {
        Vec::new()
    };
    let mut rdv_delay: Vec<f64> = if rdv_flows {
        vec![f64::NAN; edges.len()]
    } else {
        Vec::new()
    };
    // What each rendezvous transfer's clear-to-send waited behind: it travels on the
    // receiver's own connection to the sender (network key `n_edges + edge`), after the data
    // the receiver already sends there (the runtime's one FIFO stream per peer).
    let n_edges = edges.len();
    let mut cts_delay: Vec<f64> = if rdv_flows {
        vec![0.0; edges.len()]
    } else {
        Vec::new()
    };
    // When each task's host ended its send calls and went on to post its next task's
    // receives: a sender queues a transfer's data only when it next reads its connections,
    // after that burst of calls (so the clear-to-sends of those receives go ahead of it).
    let mut burst_end: Vec<f64> = if rdv_flows { vec![0.0; n] } else { Vec::new() };
    // When each host posted the receives of the task it is at: after the previous task's send
    // calls, before their push (the runtime pushes the bytes while the program waits).
    let mut host_posted: Vec<f64> = vec![0.0; platform.len()];
    // When each rendezvous message's request reached its receiver: a small control message
    // sent with the send call, ahead of the clear-to-sends of the receives its sender posts
    // next on the same connection (so a receiver answers it before it starts pushing data
    // those clear-to-sends ask for). Not HLogP's L of the message's size.
    let mut rts_arrival: Vec<f64> = if rdv_flows {
        vec![0.0; edges.len()]
    } else {
        Vec::new()
    };
    // The receive counts from its post or HLogP's arrival (so a lone transfer is HLogP's);
    // the clear-to-send leaves when the request came, which orders it among the connection's
    // other traffic.
    let rdv_start = |ei: usize,
                     post: f64,
                     arrival: f64,
                     rts: f64,
                     started: &mut Vec<bool>,
                     recv_post: &mut Vec<f64>,
                     starts: &mut BinaryHeap<Reverse<Start>>,
                     messages: &mut Vec<MessageEvent>| {
        let ps = post.max(arrival);
        started[ei] = true;
        recv_post[ei] = ps;
        starts.push(Reverse(Start(post.max(rts), ei)));
        if opts.record_messages {
            messages[ei].recv_start_s = ps;
        }
    };
    let mut resume: Vec<usize> = Vec::new();
    loop {
        loop {
            // A task whose rendezvous transfers have all ended goes on; else the next ready task.
            let (v, mut t, mut used, f) = if let Some(v) = resume.pop() {
                let Some(p) = parked.remove(&v) else { continue };
                (v, p.t, p.used, p.f)
            } else if let Some(v) = ready.pop() {
                (v, 0.0, 0.0, 0.0)
            } else {
                break;
            };
            let q = placement.host[v];
            let resumed = f > 0.0;
            let f = if resumed {
                f
            } else {
                match opts.wait {
                    WaitMode::Block => 1.0,
                    WaitMode::Poll => (host_off[q + 1] - host_off[q] - pos[v]) as f64,
                }
            };
            if !resumed {
                done += 1;
                t = host_free[q];
                let mut pending = 0u32;
                let mut rdv_end = f64::NEG_INFINITY;
                // Receive overheads in arrival order (HLogP's chain). With contention,
                // rendezvous receives are all posted when the host reaches the task, and each
                // transfer is a flow from then (or from its request's arrival, if later); such a
                // receive ends Or after that plus what sharing cost it, and never before its end
                // in the chain: contention only adds. The task waits for the last.
                buf.clear();
                buf.extend(dag.in_edges(v).iter().map(|&ei| (arrival[ei], ei)));
                buf.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                for &(a, ei) in &buf {
                    let p = placement.host[edges[ei].from];
                    let rs = t.max(a);
                    if hlogp {
                        let or = platform.or_s(edges[ei].bytes, p, q) * f;
                        t = rs + or;
                        used += or;
                    } else {
                        t = rs;
                    }
                    if rdv_flows && platform.rendezvous(edges[ei].bytes, p, q) {
                        rdv_floor[ei] = t;
                        // Started already: when it was sent, or when the host reached v.
                        debug_assert!(rdv_started[ei], "edge {ei}: its transfer never started");
                        let d = rdv_delay[ei];
                        if d.is_nan() {
                            pending += 1;
                        } else {
                            let end = (recv_post[ei]
                                + platform.or_s(edges[ei].bytes, p, q) * f
                                + cts_delay[ei]
                                + d)
                                .max(t);
                            rdv_end = rdv_end.max(end);
                            if opts.record_messages {
                                messages[ei].recv_end_s = end;
                            }
                        }
                        continue;
                    }
                    if opts.record_messages {
                        messages[ei].recv_start_s = rs;
                        messages[ei].recv_end_s = t;
                    }
                }
                t = t.max(rdv_end);
                if pending > 0 {
                    parked.insert(
                        v,
                        Parked {
                            t,
                            used,
                            f,
                            pending,
                        },
                    );
                    continue;
                }
            }
            let exec = platform.exec_s(dag.tasks()[v].work, q) * f;
            times[v] = TaskTimes {
                start_s: t,
                finish_s: t + exec,
            };
            t += exec;
            used += exec;
            // Sends in the order of the receivers' schedule position.
            sbuf.clear();
            sbuf.extend(
                dag.out_edges(v)
                    .iter()
                    .map(|&ei| (placement.seq[edges[ei].to], ei)),
            );
            sbuf.sort_unstable();
            let finish = t;
            for &(_, ei) in &sbuf {
                let e = edges[ei];
                let r = placement.host[e.to];
                let ss;
                let send_end;
                if hlogp {
                    ss = t;
                    let os = platform.os_s(e.bytes, q, r) * f;
                    t += os;
                    used += os;
                    send_end = t;
                    arrival[ei] = t + platform.l_s(e.bytes, q, r);
                } else {
                    ss = finish;
                    send_end = finish;
                    arrival[ei] = if r == q {
                        finish
                    } else {
                        finish + platform.one_way_s(e.bytes, q, r)
                    };
                }
                if opts.record_messages {
                    messages[ei].send_start_s = ss;
                    messages[ei].send_end_s = send_end;
                    messages[ei].arrival_s = arrival[ei];
                }
                let rdv = rdv_flows && platform.rendezvous(e.bytes, q, r);
                if rdv {
                    rts_arrival[ei] = send_end + platform.l_s(CTS_BYTES, q, r);
                }
                if rdv && host_next[r] == pos[e.to] {
                    // Its receiver's host already waits at that task: the transfer starts now.
                    rdv_start(
                        ei,
                        host_posted[r],
                        arrival[ei],
                        rts_arrival[ei],
                        &mut rdv_started,
                        &mut recv_post,
                        &mut starts,
                        &mut messages,
                    );
                }
                if net.is_some() && r != q && !rdv {
                    starts.push(Reverse(Start(send_end, ei)));
                } else {
                    let w = e.to;
                    remaining[w] -= 1;
                    if remaining[w] == 0 && host_next[placement.host[w]] == pos[w] {
                        ready.push(w);
                    }
                }
            }
            // The bytes of its rendezvous messages: the runtime pushes them after the send
            // calls returned, while the host goes on; that CPU time delays the host's next
            // activity, not the messages (whose transfers are the flows above).
            if rdv_flows {
                burst_end[v] = t;
                host_posted[q] = t;
                for &(_, ei) in &sbuf {
                    let e = edges[ei];
                    let push = platform.push_s(e.bytes, q, placement.host[e.to]) * f;
                    t += push;
                    used += push;
                }
            }
            host_free[q] = t;
            busy[q] += used;
            host_next[q] += 1;
            if host_next[q] < host_off[q + 1] - host_off[q] {
                let w = order[host_off[q] + host_next[q]];
                if rdv_flows {
                    // The host reaches w: the transfers of its rendezvous receives whose
                    // requests were sent start now (the others when they are sent).
                    for &ei in dag.in_edges(w) {
                        let p = placement.host[edges[ei].from];
                        // Sent: its sender task has been computed.
                        let sender = edges[ei].from;
                        if !rdv_started[ei]
                            && host_next[placement.host[sender]] > pos[sender]
                            && platform.rendezvous(edges[ei].bytes, p, q)
                        {
                            rdv_start(
                                ei,
                                host_posted[q],
                                arrival[ei],
                                rts_arrival[ei],
                                &mut rdv_started,
                                &mut recv_post,
                                &mut starts,
                                &mut messages,
                            );
                        }
                    }
                }
                if remaining[w] == 0 {
                    ready.push(w);
                }
            }
        }
        let Some(net) = net.as_mut() else { break };
        let next_start = starts.peek().map(|Reverse(s)| s.0);
        match (next_start, net.next_finish()) {
            (None, None) => break,
            (_, Some(fin)) if !fin.is_finite() => {
                return Err(SimError::NoCapacity(
                    "a flow has no bandwidth left on its path (a capacity of 0?)".to_string(),
                ))
            }
            (s, Some(fin)) if s.is_none_or(|s| fin <= s) => {
                finished.clear();
                net.finish_until(fin, &mut finished);
                for d in &finished {
                    if d.key >= n_edges {
                        // A clear-to-send reached the sender: the transfer moves from now, or
                        // once the sender's burst of calls is over. What the clear-to-send
                        // waited behind, and that, add to the receive.
                        let ei = d.key - n_edges;
                        let e = edges[ei];
                        let (p, r) = (placement.host[e.from], placement.host[e.to]);
                        // It crosses in L of a small message (which Or already holds, as
                        // it holds the whole handshake: only waits beyond it are added).
                        let came = fin + platform.l_s(CTS_BYTES, r, p);
                        let go = came.max(burst_end[e.from]);
                        cts_delay[ei] = d.delay + (go - came);
                        starts.push(Reverse(Start(go, n_edges + ei)));
                        continue;
                    }
                    let ei = d.key;
                    let e = edges[ei];
                    let (p, r) = (placement.host[e.from], placement.host[e.to]);
                    if rdv_flows && platform.rendezvous(e.bytes, p, r) {
                        // A rendezvous transfer ended: its receive ends Or after it was posted
                        // (Or carries the transfer alone), plus what sharing cost it, and not
                        // before its end in the HLogP chain.
                        rdv_delay[ei] = d.delay;
                        if let Some(w) = parked.get_mut(&e.to) {
                            let end = (recv_post[ei]
                                + platform.or_s(e.bytes, p, r) * w.f
                                + cts_delay[ei]
                                + d.delay)
                                .max(rdv_floor[ei]);
                            w.t = w.t.max(end);
                            w.pending -= 1;
                            if opts.record_messages {
                                messages[ei].recv_end_s = end;
                            }
                            if w.pending == 0 {
                                resume.push(e.to);
                            }
                        }
                        continue;
                    }
                    arrival[ei] += d.delay;
                    if opts.record_messages {
                        messages[ei].arrival_s = arrival[ei];
                    }
                    let w = edges[ei].to;
                    remaining[w] -= 1;
                    if remaining[w] == 0 && host_next[placement.host[w]] == pos[w] {
                        ready.push(w);
                    }
                }
            }
            _ => {
                if let Some(Reverse(Start(at, key))) = starts.pop() {
                    // Keys below n_edges: a message (an eager one's flow, a rendezvous one's
                    // clear-to-send); above: a rendezvous transfer's data.
                    if key >= n_edges {
                        let ei = key - n_edges;
                        let e = edges[ei];
                        net.start(
                            ei,
                            placement.host[e.from],
                            placement.host[e.to],
                            e.bytes,
                            at,
                        );
                        continue;
                    }
                    let ei = key;
                    let e = edges[ei];
                    let (p, r) = (placement.host[e.from], placement.host[e.to]);
                    if rdv_flows && p != r && platform.rendezvous(e.bytes, p, r) {
                        // The receiver's clear-to-send goes first, on its own connection to
                        // the sender: behind whatever the receiver already sends there.
                        net.start(n_edges + ei, r, p, CTS_BYTES, at);
                    } else {
                        net.start(ei, p, r, e.bytes, at);
                    }
                }
            }
        }
    }
    if done < n {
        return Err(deadlock(
            dag, platform, placement, &order, &host_off, &host_next, &remaining,
        ));
    }
    let makespan = times.iter().map(|t| t.finish_s).fold(0.0, f64::max);
    let hosts = busy
        .iter()
        .map(|&b| HostUse {
            busy_s: b,
            idle_s: (makespan - b).max(0.0),
        })
        .collect();
    Ok(SimResult {
        makespan_s: makespan,
        hosts,
        tasks: times,
        messages,
    })
}

fn deadlock(
    dag: &Dag,
    platform: &Platform,
    placement: &Placement,
    order: &[usize],
    host_off: &[usize],
    host_next: &[usize],
    remaining: &[u32],
) -> SimError {
    let name = |h: usize| platform.hosts()[h].name.clone();
    for h in 0..platform.len() {
        if host_next[h] < host_off[h + 1] - host_off[h] {
            let v = order[host_off[h] + host_next[h]];
            if remaining[v] > 0 {
                // A predecessor that has not run.
                if let Some(&ei) = dag.in_edges(v).iter().find(|&&ei| {
                    let u = dag.edges()[ei].from;
                    let hu = placement.host[u];
                    let pu = order[host_off[hu]..host_off[hu + 1]]
                        .iter()
                        .position(|&x| x == u)
                        .unwrap_or(0);
                    pu >= host_next[hu]
                }) {
                    let u = dag.edges()[ei].from;
                    return SimError::Deadlock {
                        waiting: dag.tasks()[v].id.clone(),
                        host: name(h),
                        blocked_by: dag.tasks()[u].id.clone(),
                        other_host: name(placement.host[u]),
                    };
                }
            }
        }
    }
    SimError::Deadlock {
        waiting: String::new(),
        host: String::new(),
        blocked_by: String::new(),
        other_host: String::new(),
    }
}

/// Critical-path lower bound: the longest path where each task takes its time on the fastest
/// host and messages cost nothing. No placement can finish earlier (with non-negative link
/// parameters).
pub fn critical_path_bound_s(dag: &Dag, platform: &Platform) -> f64 {
    let vmax = platform.max_speed();
    let mut eft = vec![0.0f64; dag.len()];
    let mut best: f64 = 0.0;
    for &v in dag.topo_order() {
        let ready = dag
            .in_edges(v)
            .iter()
            .map(|&ei| eft[dag.edges()[ei].from])
            .fold(0.0, f64::max);
        eft[v] = ready + dag.tasks()[v].work / vmax;
        best = best.max(eft[v]);
    }
    best
}
