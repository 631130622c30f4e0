//! Master/worker over the `mutirao` runtime: rank 0 runs [`master`] with a [`Policy`], every
//! other rank runs [`worker`] with the application's task function. The only module of this
//! crate that does I/O.
//!
//! Protocol (tags 0x4d57_0000…): master → worker `WORK [block id, first task, tasks]` or
//! `STOP`; worker → master `DONE [block id, compute ns]` followed by the result bytes. The
//! master times each block from its hand-out to its result; the load index's `t_comm` is that
//! time minus the worker's compute time. A worker that fails (the runtime reports
//! `PeerFailed`) has its blocks re-queued and the job goes on without it.
//!
//! ```no_run
//! use mutirao_mw::{driver, Config, PolicyKind};
//! let world = mutirao::init()?;
//! let cfg = Config::default();
//! if world.rank() == 0 {
//!     let mut policy = PolicyKind::Hnow.build(&cfg)?;
//!     let mut sum = 0u64;
//!     let rep = driver::master(&world, policy.as_mut(), 1000, &mut |_start, _len, bytes: &[u8]| {
//!         sum += u64::from_le_bytes(bytes.try_into().unwrap_or([0; 8]));
//!     }, None)?;
//!     println!("{} tasks in {:.2} s, sum {sum}", rep.tasks, rep.elapsed_s);
//! } else {
//!     driver::worker(&world, &mut |start, len| (start..start + len).sum::<u64>().to_le_bytes().to_vec())?;
//! }
//! world.finalize()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::ledger::{Completion, Ledger};
use crate::log::Record;
use crate::policy::{Action, Policy};
use crate::{LoadIndex, WorkerId};
use mutirao::{Comm, Error as MpiError};
use std::collections::BTreeMap;
use std::io::Write;
use std::time::Instant;

const TAG_WORK: i32 = 0x4d57_0001;
const TAG_STOP: i32 = 0x4d57_0002;
const TAG_DONE: i32 = 0x4d57_0003;
const TAG_DATA: i32 = 0x4d57_0004;

/// Errors of a master/worker run.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The runtime failed in a way the job cannot survive (the master's own connection, …).
    #[error(transparent)]
    Runtime(#[from] MpiError),
    /// The ledger or policy refused a step (a bug in a policy, or a malformed message).
    #[error(transparent)]
    Balance(#[from] crate::Error),
    /// Every worker is gone with tasks left.
    #[error("every worker is gone with {0} tasks not done; add workers or restart the job")]
    NoWorkers(u64),
    /// Writing the repository log failed.
    #[error("cannot write the repository log: {0}")]
    Log(std::io::Error),
}

/// What the master saw.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// Tasks completed (every task, exactly once).
    pub tasks: u64,
    /// From the first hand-out to the last result, s.
    pub elapsed_s: f64,
    /// First-result tasks per worker rank.
    pub per_worker: BTreeMap<WorkerId, u64>,
    /// Synchronized iterations run (0 for pull policies).
    pub iterations: u64,
    /// Results discarded because a replica finished first.
    pub duplicates: u64,
    /// Workers lost during the run.
    pub lost: Vec<WorkerId>,
}

/// A worker that joins a running master (dynamic inclusion): where to reach it.
#[derive(Clone)]
pub struct Joined {
    /// The communicator that joins it to the master (the master is rank 0 there), e.g. the
    /// merged communicator of a spawn.
    pub comm: Comm,
    /// Its rank in `comm`.
    pub rank: usize,
    /// Its host, for the log.
    pub host: String,
    /// From the spawn request to the worker being reachable, s.
    pub spawn_latency_s: f64,
}

/// Asked at every iteration (synchronized policies) or result (pull policies) with the tasks
/// done and the total; returns the workers to add now (HNOW's dynamic inclusion at
/// `PERC_CONS_ADD`, JoiN's joining workers), usually none.
pub type Grow<'g> = &'g mut dyn FnMut(u64, u64) -> Vec<Joined>;

struct Master<'a> {
    /// Worker id → its communicator and rank there.
    routes: BTreeMap<WorkerId, (Comm, usize)>,
    ledger: Ledger,
    t0: Instant,
    issued: BTreeMap<(WorkerId, u64), (f64, u64, u64)>,
    report: Report,
    log: Option<&'a mut dyn Write>,
}

impl Master<'_> {
    fn now(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    fn route(&self, w: WorkerId) -> Result<(Comm, usize), DriverError> {
        self.routes
            .get(&w)
            .cloned()
            .ok_or_else(|| crate::Error::Invalid(format!("no route to worker {w}")).into())
    }

    /// Take in workers that joined: new ids, routes, members; logged.
    fn join(
        &mut self,
        joined: Vec<Joined>,
        members: &mut Vec<WorkerId>,
    ) -> Result<Vec<WorkerId>, DriverError> {
        let mut ids = Vec::new();
        for j in joined {
            let w = self.routes.keys().next_back().map_or(1, |m| m + 1);
            self.routes.insert(w, (j.comm, j.rank));
            members.push(w);
            ids.push(w);
            self.write(&Record::Join {
                worker: w,
                host: j.host,
                spawn_latency_s: j.spawn_latency_s,
            })?;
        }
        Ok(ids)
    }

    fn hand(&mut self, w: WorkerId, start: u64, len: u64, id: u64) -> Result<bool, DriverError> {
        let now = self.now();
        let (c, r) = self.route(w)?;
        match c.send(&[id, start, len], r, TAG_WORK) {
            Ok(()) => {
                self.issued.insert((w, id), (now, start, len));
                Ok(true)
            }
            Err(MpiError::PeerFailed { .. }) | Err(MpiError::PeerFinalized(_)) => {
                self.lose(w, "its connection failed when sent work")?;
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    fn lose(&mut self, w: WorkerId, why: &str) -> Result<(), DriverError> {
        let back = self.ledger.fail(w);
        self.issued.retain(|(h, _), _| *h != w);
        self.report.lost.push(w);
        self.write(&Record::Leave {
            worker: w,
            reason: why.to_string(),
            requeued: back,
        })
    }

    /// Log one returned block.
    #[allow(clippy::too_many_arguments)]
    fn write_block(
        &mut self,
        iteration: u64,
        worker: WorkerId,
        q: u64,
        (fator_het, rule): (f64, String),
        start: u64,
        len: u64,
        li: LoadIndex,
        duplicate: bool,
    ) -> Result<(), DriverError> {
        self.write(&Record::Block {
            iteration,
            worker,
            q,
            fator_het,
            rule,
            start,
            len,
            t_comp_s: li.t_comp_s,
            t_comm_s: li.t_comm_s,
            thr_low_s: None,
            thr_up_s: None,
            duplicate,
        })
    }

    fn write(&mut self, r: &Record) -> Result<(), DriverError> {
        if let Some(l) = self.log.as_deref_mut() {
            writeln!(l, "{}", r.to_line()).map_err(DriverError::Log)?;
        }
        Ok(())
    }

    /// Wait for one result from a worker that holds a block. `Ok(None)`: a worker failed
    /// instead (already handled). The master polls each holder by its rank rather than
    /// receiving from any source: once one peer has failed, the runtime fails every
    /// any-source receive (ULFM's rule), and the job must go on.
    #[allow(clippy::type_complexity)]
    fn next_result(
        &mut self,
        members: &mut Vec<WorkerId>,
    ) -> Result<Option<(WorkerId, u64, u64, u64, LoadIndex, Vec<u8>)>, DriverError> {
        let mut idle_polls = 0u32;
        loop {
            let holders: Vec<WorkerId> = {
                let mut h: Vec<WorkerId> = self.issued.keys().map(|k| k.0).collect();
                h.dedup();
                h
            };
            if holders.is_empty() {
                return Err(
                    crate::Error::Invalid("waiting for a result with no block out".into()).into(),
                );
            }
            for w in holders {
                let (c, r) = self.route(w)?;
                match c.iprobe(r, TAG_DONE) {
                    Ok(Some(_)) => return self.take_result(w).map(Some),
                    Ok(None) => {}
                    Err(MpiError::PeerFailed { reason, .. }) => {
                        members.retain(|m| *m != w);
                        self.lose(w, &reason)?;
                        return Ok(None);
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            // Spin briefly, then offer the core: workers may share it with the master.
            idle_polls = idle_polls.saturating_add(1);
            if idle_polls > 64 {
                std::thread::sleep(std::time::Duration::from_micros(50));
            } else {
                std::thread::yield_now();
            }
        }
    }

    #[allow(clippy::type_complexity)]
    fn take_result(
        &mut self,
        w: WorkerId,
    ) -> Result<(WorkerId, u64, u64, u64, LoadIndex, Vec<u8>), DriverError> {
        let mut hdr = [0u64; 2];
        let (c, r) = self.route(w)?;
        c.recv(&mut hdr, r, TAG_DONE)?;
        let (data, _) = c.recv_vec::<u8>(r, TAG_DATA)?;
        let (sent, start, len) = self.issued.remove(&(w, hdr[0])).ok_or_else(|| {
            crate::Error::Ledger(format!(
                "worker {w} returned block {} it was not given",
                hdr[0]
            ))
        })?;
        let round_trip = self.now() - sent;
        let comp = hdr[1] as f64 * 1e-9;
        let li = LoadIndex {
            t_comp_s: comp,
            t_comm_s: (round_trip - comp).max(0.0),
        };
        Ok((w, hdr[0], start, len, li, data))
    }
}

/// Run the master on rank 0: hand out `total` tasks to ranks 1.. through `policy`, call
/// `accept(first task, tasks, result bytes)` once per completed block (never twice for the
/// same tasks), append the repository log to `log` if given, and stop the workers at the end.
pub fn master<'a>(
    world: &'a Comm,
    policy: &mut dyn Policy,
    total: u64,
    accept: &mut dyn FnMut(u64, u64, &[u8]),
    log: Option<&'a mut dyn Write>,
) -> Result<Report, DriverError> {
    master_growing(world, policy, total, accept, log, None)
}

/// [`master`], and take in the workers `grow` returns while the run goes on (dynamic
/// inclusion: they get work from the next iteration, or at once for pull policies).
pub fn master_growing<'a>(
    world: &'a Comm,
    policy: &mut dyn Policy,
    total: u64,
    accept: &mut dyn FnMut(u64, u64, &[u8]),
    log: Option<&'a mut dyn Write>,
    mut grow: Option<Grow<'_>>,
) -> Result<Report, DriverError> {
    let mut members: Vec<WorkerId> = (1..world.size() as WorkerId).collect();
    let mut m = Master {
        routes: members
            .iter()
            .map(|&w| (w, (world.clone(), w as usize)))
            .collect(),
        ledger: Ledger::new(total),
        t0: Instant::now(),
        issued: BTreeMap::new(),
        report: Report {
            tasks: 0,
            elapsed_s: 0.0,
            per_worker: BTreeMap::new(),
            iterations: 0,
            duplicates: 0,
            lost: Vec::new(),
        },
        log,
    };
    if members.is_empty() && total > 0 {
        return Err(DriverError::NoWorkers(total));
    }
    if policy.synchronized() {
        let mut last: BTreeMap<WorkerId, LoadIndex> = BTreeMap::new();
        let mut planned: BTreeMap<WorkerId, u64> = BTreeMap::new();
        // Lost workers the policy has been told about.
        let mut told = 0;
        while !m.ledger.is_finished() {
            if members.is_empty() {
                return Err(DriverError::NoWorkers(total - m.ledger.done()));
            }
            if let Some(g) = grow.as_mut() {
                let joined = g(m.ledger.done(), total);
                m.join(joined, &mut members)?;
            }
            m.report.iterations += 1;
            let plan = policy.plan_round(&members, &last, m.ledger.unassigned());
            last.clear();
            let mut out = 0;
            for (w, q) in plan {
                planned.insert(w, q);
                if let Some(b) = m.ledger.assign(w, q, m.now()) {
                    if m.hand(w, b.start, b.len, b.id)? {
                        out += 1;
                    } else {
                        members.retain(|x| *x != w);
                        policy.on_leave(w);
                    }
                }
            }
            while out > 0 {
                out -= 1;
                let Some((w, id, start, len, li, data)) = m.next_result(&mut members)? else {
                    continue;
                };
                let first = matches!(m.ledger.complete(id, w)?, Completion::First { .. });
                if first {
                    accept(start, len, &data);
                    *m.report.per_worker.entry(w).or_insert(0) += len;
                } else {
                    m.report.duplicates += 1;
                }
                policy.on_result(w, len, li);
                last.insert(w, li);
                let it = m.report.iterations;
                let detail = policy.detail(w).unwrap_or((0.0, policy.name().to_string()));
                let q = planned.get(&w).copied().unwrap_or(len);
                m.write_block(it, w, q, detail, start, len, li, !first)?;
            }
            // Lost workers' tasks are re-queued; their departure ends their membership.
            for w in &m.report.lost[told..] {
                policy.on_leave(*w);
            }
            told = m.report.lost.len();
        }
    } else {
        let mut busy: BTreeMap<WorkerId, bool> = members.iter().map(|w| (*w, false)).collect();
        loop {
            if let Some(g) = grow.as_mut() {
                let joined = g(m.ledger.done(), total);
                for w in m.join(joined, &mut members)? {
                    busy.insert(w, false);
                }
            }
            // Feed every idle member.
            for w in members.clone() {
                if busy.get(&w) == Some(&true) {
                    continue;
                }
                let b = match policy.on_idle(w, &members, &m.ledger) {
                    Action::Assign(n) => m.ledger.assign(w, n, m.now()),
                    Action::Replicate(id) => Some(m.ledger.replicate(id, w)?),
                    Action::Wait => None,
                };
                if let Some(b) = b {
                    if m.hand(w, b.start, b.len, b.id)? {
                        busy.insert(w, true);
                    } else {
                        members.retain(|x| *x != w);
                        policy.on_leave(w);
                    }
                }
            }
            if m.ledger.is_finished() && !busy.values().any(|b| *b) {
                break;
            }
            if !busy.values().any(|b| *b) {
                return Err(DriverError::NoWorkers(total - m.ledger.done()));
            }
            let Some((w, id, start, len, li, data)) = m.next_result(&mut members)? else {
                let gone: Vec<WorkerId> = busy
                    .keys()
                    .filter(|w| !members.contains(w))
                    .copied()
                    .collect();
                for w in gone {
                    busy.remove(&w);
                    policy.on_leave(w);
                }
                continue;
            };
            busy.insert(w, false);
            let first = match m.ledger.complete(id, w)? {
                Completion::First { .. } => {
                    accept(start, len, &data);
                    *m.report.per_worker.entry(w).or_insert(0) += len;
                    policy.on_result(w, len, li);
                    true
                }
                Completion::Duplicate => {
                    m.report.duplicates += 1;
                    false
                }
            };
            let detail = (0.0, policy.name().to_string());
            m.write_block(0, w, len, detail, start, len, li, !first)?;
        }
    }
    m.ledger.audit()?;
    m.report.tasks = m.ledger.done();
    m.report.elapsed_s = m.now();
    for (w, (c, r)) in &m.routes {
        if !m.report.lost.contains(w) {
            // A worker that died after its last result just misses its stop.
            match c.send(&[0u64; 0], *r, TAG_STOP) {
                Ok(()) | Err(MpiError::PeerFailed { .. }) | Err(MpiError::PeerFinalized(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(m.report)
}

/// Tell a worker that joined after the work ended (e.g. a spawn that completed late) that there
/// is nothing to do: it returns from [`worker`] as if the run had ended normally.
pub fn dismiss(comm: &Comm, rank: usize) -> Result<(), DriverError> {
    match comm.send(&[0u64; 0], rank, TAG_STOP) {
        Ok(()) | Err(MpiError::PeerFailed { .. }) | Err(MpiError::PeerFinalized(_)) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Run a worker: compute each block the master hands out with `task(first task, tasks)` and
/// send its result bytes back, until the master says stop.
pub fn worker(world: &Comm, task: &mut dyn FnMut(u64, u64) -> Vec<u8>) -> Result<(), DriverError> {
    loop {
        let st = world.probe(0, mutirao::ANY_TAG)?;
        match st.tag {
            TAG_STOP => {
                world.recv::<u8>(&mut [], 0, TAG_STOP)?;
                return Ok(());
            }
            TAG_WORK => {
                let mut w = [0u64; 3];
                world.recv(&mut w, 0, TAG_WORK)?;
                let t = Instant::now();
                let out = task(w[1], w[2]);
                let ns = t.elapsed().as_nanos().min(u64::MAX as u128) as u64;
                world.send(&[w[0], ns], 0, TAG_DONE)?;
                world.send(&out, 0, TAG_DATA)?;
            }
            other => {
                return Err(crate::Error::Invalid(format!(
                    "worker {}: unexpected message with tag {other} from the master",
                    world.rank()
                ))
                .into())
            }
        }
    }
}
