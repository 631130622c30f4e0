//! A discrete-event master/worker simulator: workers of given speeds (tasks per second, which
//! may drop mid-run, as on a non-dedicated host), a cost per block and per task for moving
//! work, workers that fail, and workers added while the job runs (after a spawn delay, when a
//! share of the tasks is done: `PERC_CONS_ADD`). It drives any [`Policy`] through a [`Ledger`],
//! so every run is audited exactly-once, and returns the makespan and the per-round table.

use crate::ledger::{Completion, Ledger};
use crate::policy::{Action, Policy};
use crate::{Error, LoadIndex, Result, WorkerId};
use std::collections::BTreeMap;

/// A simulated worker.
#[derive(Debug, Clone, PartialEq)]
pub struct SimWorker {
    /// Its id.
    pub id: WorkerId,
    /// Tasks per second.
    pub speed: f64,
    /// From this time (s) on, its speed is multiplied by the factor (a host's owner came back).
    pub slow: Option<(f64, f64)>,
    /// It dies at this time (s): its outstanding block is lost.
    pub fail_at: Option<f64>,
    /// Seconds from the spawn request to the worker's first block (added workers only).
    pub spawn_delay_s: f64,
}

impl SimWorker {
    /// A worker of `speed` tasks/s, steady, never failing.
    pub fn new(id: WorkerId, speed: f64) -> SimWorker {
        SimWorker {
            id,
            speed,
            slow: None,
            fail_at: None,
            spawn_delay_s: 0.0,
        }
    }

    fn speed_at(&self, t: f64) -> f64 {
        match self.slow {
            Some((at, f)) if t >= at => self.speed * f,
            _ => self.speed,
        }
    }

    /// When `n` tasks started at `t` end (the speed may change on the way).
    fn compute_end(&self, t: f64, n: u64) -> f64 {
        let n = n as f64;
        match self.slow {
            Some((at, f)) if t < at => {
                let before = (at - t) * self.speed;
                if before >= n {
                    t + n / self.speed
                } else {
                    at + (n - before) / (self.speed * f)
                }
            }
            _ => t + n / self.speed_at(t),
        }
    }
}

/// What to simulate.
#[derive(Debug, Clone, PartialEq)]
pub struct SimSpec {
    /// Tasks in all.
    pub total: u64,
    /// Seconds to move a block, whatever its size (latency, the result's return).
    pub comm_per_block_s: f64,
    /// Seconds to move one task's data.
    pub comm_per_task_s: f64,
    /// The workers at the start.
    pub workers: Vec<SimWorker>,
    /// Workers to add when `PERC_CONS_ADD` percent of the tasks are done (in this order).
    pub add: Vec<SimWorker>,
    /// `PERC_CONS_ADD`.
    pub perc_cons_add: f64,
}

/// One worker's block in one round (synchronized policies) or one hand-out (pull policies).
#[derive(Debug, Clone, PartialEq)]
pub struct SimBlock {
    /// Round (synchronized) or 0 (pull).
    pub round: u64,
    /// The worker.
    pub worker: WorkerId,
    /// Tasks.
    pub tasks: u64,
    /// When it was handed out, s.
    pub start_s: f64,
    /// Its load index (None: the worker died with it, or a replica lost the race).
    pub load: Option<LoadIndex>,
}

/// The outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct SimResult {
    /// When the last task completed, s.
    pub makespan_s: f64,
    /// First-result tasks per worker.
    pub tasks: BTreeMap<WorkerId, u64>,
    /// Every hand-out.
    pub blocks: Vec<SimBlock>,
    /// Results discarded because another replica finished first.
    pub duplicates: u64,
    /// When each added worker joined, s.
    pub joined: BTreeMap<WorkerId, f64>,
}

impl SimResult {
    /// The blocks of round `r` (synchronized policies).
    pub fn round(&self, r: u64) -> impl Iterator<Item = &SimBlock> {
        self.blocks.iter().filter(move |b| b.round == r)
    }
}

const MAX_STEPS: usize = 10_000_000;

/// Simulate `policy` on `spec`. Errors: a spec that cannot finish (no worker alive with tasks
/// left, a zero speed) or a policy that breaks the ledger's rules.
pub fn run(policy: &mut dyn Policy, spec: &SimSpec) -> Result<SimResult> {
    for w in spec.workers.iter().chain(&spec.add) {
        if !(w.speed.is_finite() && w.speed > 0.0) {
            return Err(Error::Invalid(format!(
                "worker {}: speed {} must be a positive number of tasks per second",
                w.id, w.speed
            )));
        }
    }
    if policy.synchronized() {
        rounds(policy, spec)
    } else {
        pull(policy, spec)
    }
}

struct State<'a> {
    spec: &'a SimSpec,
    ledger: Ledger,
    res: SimResult,
    added: bool,
    pending_join: Vec<(f64, &'a SimWorker)>,
}

impl<'a> State<'a> {
    fn new(spec: &'a SimSpec) -> Self {
        State {
            spec,
            ledger: Ledger::new(spec.total),
            res: SimResult {
                makespan_s: 0.0,
                tasks: BTreeMap::new(),
                blocks: Vec::new(),
                duplicates: 0,
                joined: BTreeMap::new(),
            },
            added: spec.add.is_empty(),
            pending_join: Vec::new(),
        }
    }

    /// Ask for the added workers once enough is done (the spawn runs in the background).
    fn maybe_spawn(&mut self, now: f64) {
        if !self.added
            && self.ledger.done() as f64 >= self.spec.perc_cons_add / 100.0 * self.spec.total as f64
        {
            self.added = true;
            for w in &self.spec.add {
                self.pending_join.push((now + w.spawn_delay_s, w));
            }
        }
    }

    fn comm(&self, n: u64) -> f64 {
        self.spec.comm_per_block_s + self.spec.comm_per_task_s * n as f64
    }
}

fn rounds(policy: &mut dyn Policy, spec: &SimSpec) -> Result<SimResult> {
    let mut st = State::new(spec);
    let mut members: Vec<&SimWorker> = spec.workers.iter().collect();
    let mut last: BTreeMap<WorkerId, LoadIndex> = BTreeMap::new();
    let mut now = 0.0f64;
    let mut round = 0u64;
    while !st.ledger.is_finished() {
        round += 1;
        if round as usize > MAX_STEPS {
            return Err(Error::Invalid("simulation did not finish".into()));
        }
        // Workers whose spawn completed join from this round on; dead ones are gone.
        let (ready, wait): (Vec<_>, Vec<_>) =
            st.pending_join.drain(..).partition(|(t, _)| *t <= now);
        st.pending_join = wait;
        for (t, w) in ready {
            st.res.joined.insert(w.id, t);
            members.push(w);
        }
        members.retain(|w| w.fail_at.is_none_or(|f| f > now));
        if members.is_empty() {
            if let Some(t) = st.pending_join.iter().map(|p| p.0).reduce(f64::min) {
                now = t;
                continue;
            }
            return Err(Error::Invalid(format!(
                "every worker is gone with {} tasks left",
                spec.total - st.ledger.done()
            )));
        }
        let ids: Vec<WorkerId> = members.iter().map(|w| w.id).collect();
        let plan = policy.plan_round(&ids, &last, st.ledger.unassigned());
        last.clear();
        let mut end = now;
        let mut handed = 0;
        for (wid, q) in plan {
            let Some(w) = members.iter().find(|w| w.id == wid) else {
                continue;
            };
            let Some(b) = st.ledger.assign(wid, q, now) else {
                continue;
            };
            handed += 1;
            let comm = st.comm(b.len);
            let done_at = w.compute_end(now + comm, b.len);
            let mut blk = SimBlock {
                round,
                worker: wid,
                tasks: b.len,
                start_s: now,
                load: None,
            };
            match w.fail_at {
                Some(f) if f < done_at => {
                    st.ledger.fail(wid);
                    policy.on_leave(wid);
                    end = end.max(f);
                }
                _ => {
                    let li = LoadIndex {
                        t_comp_s: done_at - now - comm,
                        t_comm_s: comm,
                    };
                    if let Completion::First { len, .. } = st.ledger.complete(b.id, wid)? {
                        *st.res.tasks.entry(wid).or_insert(0) += len;
                    }
                    policy.on_result(wid, b.len, li);
                    last.insert(wid, li);
                    blk.load = Some(li);
                    end = end.max(done_at);
                    st.res.makespan_s = st.res.makespan_s.max(done_at);
                }
            }
            st.res.blocks.push(blk);
        }
        if handed == 0 && st.ledger.unassigned() > 0 {
            return Err(Error::Invalid(format!(
                "policy {} handed out nothing with {} tasks left",
                policy.name(),
                st.ledger.unassigned()
            )));
        }
        now = end;
        st.maybe_spawn(now);
    }
    st.ledger.audit()?;
    Ok(st.res)
}

fn pull(policy: &mut dyn Policy, spec: &SimSpec) -> Result<SimResult> {
    let mut st = State::new(spec);
    let mut members: Vec<&SimWorker> = spec.workers.iter().collect();
    // Per worker: (finish time, block id, tasks, start, comm) of what it is computing.
    let mut busy: BTreeMap<WorkerId, (f64, u64, u64, f64, f64)> = BTreeMap::new();
    let mut now = 0.0f64;
    let mut steps = 0usize;
    loop {
        steps += 1;
        if steps > MAX_STEPS {
            return Err(Error::Invalid("simulation did not finish".into()));
        }
        // Hand work to every idle live member.
        let ids: Vec<WorkerId> = members.iter().map(|w| w.id).collect();
        for w in members.clone() {
            if busy.contains_key(&w.id) {
                continue;
            }
            let b = match policy.on_idle(w.id, &ids, &st.ledger) {
                Action::Assign(n) => st.ledger.assign(w.id, n, now),
                Action::Replicate(id) => Some(st.ledger.replicate(id, w.id)?),
                Action::Wait => None,
            };
            if let Some(b) = b {
                let comm = st.comm(b.len);
                let end = w.compute_end(now + comm, b.len);
                busy.insert(w.id, (end, b.id, b.len, now, comm));
            }
        }
        if st.ledger.is_finished() {
            break;
        }
        // Next event: a finish, a failure or a join.
        let next_finish = busy
            .iter()
            .map(|(w, b)| (b.0, *w))
            .min_by(|a, b| a.0.total_cmp(&b.0));
        let next_fail = members
            .iter()
            .filter_map(|w| w.fail_at.map(|f| (f, w.id)))
            .filter(|(f, _)| *f >= now)
            .min_by(|a, b| a.0.total_cmp(&b.0));
        let next_join = st
            .pending_join
            .iter()
            .enumerate()
            .min_by(|a, b| a.1 .0.total_cmp(&b.1 .0))
            .map(|(i, p)| (p.0, i));
        let t_finish = next_finish.map_or(f64::INFINITY, |x| x.0);
        let t_fail = next_fail.map_or(f64::INFINITY, |x| x.0);
        let t_join = next_join.map_or(f64::INFINITY, |x| x.0);
        let t = t_finish.min(t_fail).min(t_join);
        if !t.is_finite() {
            return Err(Error::Invalid(format!(
                "policy {} is stuck: {} tasks left, nobody computing",
                policy.name(),
                spec.total - st.ledger.done()
            )));
        }
        now = t;
        if t == t_fail {
            let (_, wid) = next_fail.expect("finite");
            members.retain(|w| w.id != wid);
            if let Some((_, _, n, s, _)) = busy.remove(&wid) {
                st.res.blocks.push(SimBlock {
                    round: 0,
                    worker: wid,
                    tasks: n,
                    start_s: s,
                    load: None,
                });
            }
            st.ledger.fail(wid);
            policy.on_leave(wid);
        } else if t == t_join {
            let (_, i) = next_join.expect("finite");
            let (jt, w) = st.pending_join.remove(i);
            st.res.joined.insert(w.id, jt);
            members.push(w);
        } else {
            let (_, wid) = next_finish.expect("finite");
            let (end, id, n, s, comm) = busy.remove(&wid).expect("busy");
            let li = LoadIndex {
                t_comp_s: end - s - comm,
                t_comm_s: comm,
            };
            let c = st.ledger.complete(id, wid)?;
            let mut blk = SimBlock {
                round: 0,
                worker: wid,
                tasks: n,
                start_s: s,
                load: Some(li),
            };
            match c {
                Completion::First { len, .. } => {
                    *st.res.tasks.entry(wid).or_insert(0) += len;
                    st.res.makespan_s = st.res.makespan_s.max(end);
                    policy.on_result(wid, n, li);
                    // Other holders of the same block drop it.
                    let losers: Vec<WorkerId> = busy
                        .iter()
                        .filter(|(_, b)| b.1 == id)
                        .map(|(w, _)| *w)
                        .collect();
                    for l in losers {
                        let (_, _, ln, ls, _) = busy.remove(&l).expect("listed");
                        st.res.duplicates += 1;
                        st.res.blocks.push(SimBlock {
                            round: 0,
                            worker: l,
                            tasks: ln,
                            start_s: ls,
                            load: None,
                        });
                    }
                }
                Completion::Duplicate => {
                    st.res.duplicates += 1;
                    blk.load = None;
                }
            }
            st.res.blocks.push(blk);
            st.maybe_spawn(now);
        }
        if members.is_empty() && st.pending_join.is_empty() {
            return Err(Error::Invalid(format!(
                "every worker is gone with {} tasks left",
                spec.total - st.ledger.done()
            )));
        }
    }
    st.ledger.audit()?;
    Ok(st.res)
}
