//! One trait for every distribution policy, chosen by a flag ([`PolicyKind`]).
//!
//! Two families: **synchronized** policies plan a whole round at once (every member gets a
//! block, the master gathers all results, then plans again: HNOW, static equal split), and
//! **pull** policies answer each idle worker (guided self-scheduling, adaptive weighted
//! factoring, JoiN, work stealing). The driver (the simulator in [`crate::sim`], or a real
//! master) calls [`Policy::plan_round`] for the first and [`Policy::on_idle`] for the second;
//! both keep their hand-outs in a [`Ledger`].

use crate::config::Config;
use crate::hnow::{Hnow, Mode};
use crate::ledger::Ledger;
use crate::{Error, LoadIndex, Result, WorkerId};
use std::collections::BTreeMap;

/// The policies, by name (`static`, `hnow`, `hnow-improved`, `join`, `gss`, `awf`, `steal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyKind {
    /// Equal split, one block per worker.
    Static,
    /// HNOW, Eqs. 1–5 as written.
    Hnow,
    /// HNOW, improved mode.
    HnowImproved,
    /// JoiN: blocks sized by static shares, pulled on demand, the slowest outstanding block
    /// replicated when nothing new is left (first result wins).
    Join,
    /// Guided self-scheduling: `ceil(remaining / P)`.
    Gss,
    /// Adaptive weighted factoring: half the remaining work per batch, split by measured rates.
    Awf,
    /// Work stealing: equal reserves, taken in chunks; an idle worker steals half of the
    /// largest reserve.
    Steal,
}

impl PolicyKind {
    /// Every policy, in the order reports list them.
    pub const ALL: [PolicyKind; 7] = [
        PolicyKind::Static,
        PolicyKind::Hnow,
        PolicyKind::HnowImproved,
        PolicyKind::Join,
        PolicyKind::Gss,
        PolicyKind::Awf,
        PolicyKind::Steal,
    ];

    /// The flag value.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Static => "static",
            PolicyKind::Hnow => "hnow",
            PolicyKind::HnowImproved => "hnow-improved",
            PolicyKind::Join => "join",
            PolicyKind::Gss => "gss",
            PolicyKind::Awf => "awf",
            PolicyKind::Steal => "steal",
        }
    }

    /// Build the policy for `cfg` (HNOW's parameters; `tam_bloco` is also the chunk of JoiN and
    /// work stealing).
    pub fn build(self, cfg: &Config) -> Result<Box<dyn Policy>> {
        cfg.validate()?;
        Ok(match self {
            PolicyKind::Static => Box::new(StaticSplit { done: false }),
            PolicyKind::Hnow => Box::new(HnowPolicy(
                Hnow::new(cfg.clone(), Mode::Faithful)?,
                "hnow",
                BTreeMap::new(),
            )),
            PolicyKind::HnowImproved => Box::new(HnowPolicy(
                Hnow::new(cfg.clone(), Mode::Improved { ewma: 0.5 })?,
                "hnow-improved",
                BTreeMap::new(),
            )),
            PolicyKind::Join => Box::new(Join {
                chunk: cfg.tam_bloco,
                speed: BTreeMap::new(),
            }),
            PolicyKind::Gss => Box::new(Gss),
            PolicyKind::Awf => Box::new(Awf {
                rate: BTreeMap::new(),
                batch_left: BTreeMap::new(),
            }),
            PolicyKind::Steal => Box::new(Steal {
                chunk: cfg.tam_bloco,
                reserve: BTreeMap::new(),
                started: false,
            }),
        })
    }
}

impl std::str::FromStr for PolicyKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        PolicyKind::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "unknown policy {s:?}; choose one of: {}",
                    PolicyKind::ALL.map(|p| p.name()).join(", ")
                ))
            })
    }
}

/// What an idle worker gets from a pull policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Hand it up to this many new (or re-queued) tasks.
    Assign(u64),
    /// Give it a copy of this outstanding block.
    Replicate(u64),
    /// Nothing for it now.
    Wait,
}

/// A distribution policy.
pub trait Policy {
    /// Its flag name.
    fn name(&self) -> &'static str;
    /// Synchronized rounds (`plan_round`) or pull (`on_idle`).
    fn synchronized(&self) -> bool;
    /// Synchronized policies: amounts for the next round, per member in order.
    fn plan_round(
        &mut self,
        _members: &[WorkerId],
        _last: &BTreeMap<WorkerId, LoadIndex>,
        _remaining: u64,
    ) -> Vec<(WorkerId, u64)> {
        Vec::new()
    }
    /// Pull policies: worker `w` is idle.
    fn on_idle(&mut self, _w: WorkerId, _members: &[WorkerId], _ledger: &Ledger) -> Action {
        Action::Wait
    }
    /// A result came back: `tasks` done by `w` with this load index.
    fn on_result(&mut self, _w: WorkerId, _tasks: u64, _li: LoadIndex) {}
    /// A worker's expected speed (relative, e.g. from the machine model or the normalization
    /// table), for the policies that size blocks by static shares.
    fn hint_speed(&mut self, _w: WorkerId, _speed: f64) {}
    /// A worker left; forget its state.
    fn on_leave(&mut self, _w: WorkerId) {}
    /// For the repository log: the heterogeneity factor and the rule behind `w`'s amount in
    /// the last planned round (HNOW only).
    fn detail(&self, _w: WorkerId) -> Option<(f64, String)> {
        None
    }
}

struct StaticSplit {
    done: bool,
}

impl Policy for StaticSplit {
    fn name(&self) -> &'static str {
        "static"
    }
    fn synchronized(&self) -> bool {
        true
    }
    fn plan_round(
        &mut self,
        members: &[WorkerId],
        _last: &BTreeMap<WorkerId, LoadIndex>,
        remaining: u64,
    ) -> Vec<(WorkerId, u64)> {
        let p = members.len() as u64;
        if p == 0 {
            return Vec::new();
        }
        // One round of equal blocks; a later round only happens when workers joined or a
        // block was lost, and splits what remains the same way.
        self.done = true;
        members
            .iter()
            .enumerate()
            .map(|(i, &w)| (w, remaining / p + u64::from((i as u64) < remaining % p)))
            .collect()
    }
}

struct HnowPolicy(Hnow, &'static str, BTreeMap<WorkerId, (f64, String)>);

impl Policy for HnowPolicy {
    fn name(&self) -> &'static str {
        self.1
    }
    fn synchronized(&self) -> bool {
        true
    }
    fn plan_round(
        &mut self,
        members: &[WorkerId],
        last: &BTreeMap<WorkerId, LoadIndex>,
        remaining: u64,
    ) -> Vec<(WorkerId, u64)> {
        let plan = self.0.plan(members, last, remaining);
        self.2 = plan
            .assignments
            .iter()
            .map(|a| {
                let rule = serde_json::to_value(a.rule)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default();
                (a.worker, (a.fator_het, rule))
            })
            .collect();
        plan.assignments
            .into_iter()
            .map(|a| (a.worker, a.q))
            .collect()
    }
    fn detail(&self, w: WorkerId) -> Option<(f64, String)> {
        self.2.get(&w).cloned()
    }
    fn hint_speed(&mut self, w: WorkerId, speed: f64) {
        self.0.hint_rate(w, speed);
    }
    fn on_leave(&mut self, w: WorkerId) {
        self.0.remove(w);
    }
}

struct Gss;

impl Policy for Gss {
    fn name(&self) -> &'static str {
        "gss"
    }
    fn synchronized(&self) -> bool {
        false
    }
    fn on_idle(&mut self, _w: WorkerId, members: &[WorkerId], ledger: &Ledger) -> Action {
        let r = ledger.unassigned();
        if r == 0 {
            return Action::Wait;
        }
        Action::Assign(r.div_ceil(members.len().max(1) as u64))
    }
}

struct Awf {
    rate: BTreeMap<WorkerId, f64>,
    batch_left: BTreeMap<WorkerId, u64>,
}

impl Policy for Awf {
    fn name(&self) -> &'static str {
        "awf"
    }
    fn synchronized(&self) -> bool {
        false
    }
    fn on_idle(&mut self, w: WorkerId, members: &[WorkerId], ledger: &Ledger) -> Action {
        let r = ledger.unassigned();
        if r == 0 {
            return Action::Wait;
        }
        // A batch is half of what remains, split in proportion to the measured rates (equal
        // until a worker has reported); each worker takes its part of the current batch.
        if self.batch_left.get(&w).copied().unwrap_or(0) == 0 {
            let known: Vec<f64> = members
                .iter()
                .filter_map(|m| self.rate.get(m))
                .copied()
                .collect();
            let mean = if known.is_empty() {
                1.0
            } else {
                known.iter().sum::<f64>() / known.len() as f64
            };
            let sum: f64 = members
                .iter()
                .map(|m| self.rate.get(m).copied().unwrap_or(mean))
                .sum();
            let mine = self.rate.get(&w).copied().unwrap_or(mean);
            let part = (r as f64 / 2.0 * mine / sum).ceil().max(1.0) as u64;
            self.batch_left.insert(w, part);
        }
        let n = self.batch_left.insert(w, 0).unwrap_or(1).max(1);
        Action::Assign(n)
    }
    fn on_result(&mut self, w: WorkerId, tasks: u64, li: LoadIndex) {
        let t = li.t_comp_s + li.t_comm_s;
        if t > 0.0 && tasks > 0 {
            let r = tasks as f64 / t;
            let e = self.rate.entry(w).or_insert(r);
            *e = 0.5 * r + 0.5 * *e;
        }
    }
    fn on_leave(&mut self, w: WorkerId) {
        self.rate.remove(&w);
        self.batch_left.remove(&w);
    }
}

struct Join {
    chunk: u64,
    speed: BTreeMap<WorkerId, f64>,
}

impl Policy for Join {
    fn name(&self) -> &'static str {
        "join"
    }
    fn synchronized(&self) -> bool {
        false
    }
    fn on_idle(&mut self, w: WorkerId, _members: &[WorkerId], ledger: &Ledger) -> Action {
        if ledger.unassigned() > 0 {
            // Static share: the chunk scaled by the worker's speed relative to the fastest.
            let top = self.speed.values().copied().fold(0.0f64, f64::max);
            let s = match (self.speed.get(&w), top > 0.0) {
                (Some(&s), true) => s / top,
                _ => 1.0,
            };
            return Action::Assign(((self.chunk as f64) * s).round().max(1.0) as u64);
        }
        match ledger.oldest_outstanding(w) {
            Some(id) => Action::Replicate(id),
            None => Action::Wait,
        }
    }
    fn hint_speed(&mut self, w: WorkerId, speed: f64) {
        if speed.is_finite() && speed > 0.0 {
            self.speed.insert(w, speed);
        }
    }
    fn on_leave(&mut self, w: WorkerId) {
        self.speed.remove(&w);
    }
}

struct Steal {
    chunk: u64,
    reserve: BTreeMap<WorkerId, u64>,
    started: bool,
}

impl Policy for Steal {
    fn name(&self) -> &'static str {
        "steal"
    }
    fn synchronized(&self) -> bool {
        false
    }
    fn on_idle(&mut self, w: WorkerId, members: &[WorkerId], ledger: &Ledger) -> Action {
        if !self.started {
            // Equal reserves of the whole index space: the workers' private deques.
            self.started = true;
            let n = ledger.unassigned();
            let p = members.len().max(1) as u64;
            for (i, &m) in members.iter().enumerate() {
                self.reserve
                    .insert(m, n / p + u64::from((i as u64) < n % p));
            }
        }
        // A newcomer (or a re-queue after a failure) draws from what nobody reserved.
        let reserved: u64 = self.reserve.values().sum();
        let unreserved = ledger.unassigned().saturating_sub(reserved);
        if unreserved > 0 {
            *self.reserve.entry(w).or_insert(0) += unreserved;
        }
        let mine = self.reserve.get(&w).copied().unwrap_or(0);
        if mine == 0 {
            // Steal half of the largest reserve.
            let victim = self
                .reserve
                .iter()
                .filter(|(v, r)| **v != w && **r > 1)
                .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
                .map(|(v, r)| (*v, *r));
            let Some((v, r)) = victim else {
                return Action::Wait;
            };
            let take = r / 2;
            self.reserve.insert(v, r - take);
            self.reserve.insert(w, take);
        }
        let mine = self.reserve.get(&w).copied().unwrap_or(0);
        if mine == 0 {
            return Action::Wait;
        }
        let n = mine.min(self.chunk);
        self.reserve.insert(w, mine - n);
        Action::Assign(n)
    }
    fn on_leave(&mut self, w: WorkerId) {
        // Its reserve goes back to the pool (the ledger re-queues its blocks).
        self.reserve.remove(&w);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_list_the_choices() {
        for p in PolicyKind::ALL {
            assert_eq!(p.name().parse::<PolicyKind>().unwrap(), p);
        }
        let e = "fifo".parse::<PolicyKind>().unwrap_err().to_string();
        assert!(e.contains("hnow-improved") && e.contains("steal"), "{e}");
    }

    #[test]
    fn gss_hands_out_a_pth_of_what_remains() {
        let mut p = PolicyKind::Gss.build(&Config::default()).unwrap();
        let l = Ledger::new(100);
        assert_eq!(p.on_idle(1, &[1, 2, 3, 4], &l), Action::Assign(25));
    }

    #[test]
    fn static_split_is_equal_and_complete() {
        let mut p = PolicyKind::Static.build(&Config::default()).unwrap();
        let r = p.plan_round(&[1, 2, 3], &BTreeMap::new(), 10);
        assert_eq!(r, vec![(1, 4), (2, 3), (3, 3)]);
    }

    #[test]
    fn join_replicates_the_oldest_block_when_nothing_new_is_left() {
        let mut p = PolicyKind::Join.build(&Config::default()).unwrap();
        let mut l = Ledger::new(10);
        let Action::Assign(n) = p.on_idle(1, &[1, 2], &l) else {
            panic!("assign")
        };
        let b = l.assign(1, n, 0.0).unwrap();
        assert_eq!(b.len, 10);
        assert_eq!(p.on_idle(2, &[1, 2], &l), Action::Replicate(b.id));
    }

    #[test]
    fn steal_takes_half_of_the_largest_reserve() {
        let cfg = Config {
            tam_bloco: 5,
            ..Config::default()
        };
        let mut p = PolicyKind::Steal.build(&cfg).unwrap();
        let mut l = Ledger::new(40);
        // Reserves 20 and 20; worker 1 takes its chunks until empty.
        for _ in 0..4 {
            let Action::Assign(n) = p.on_idle(1, &[1, 2], &l) else {
                panic!()
            };
            assert_eq!(n, 5);
            l.assign(1, n, 0.0).unwrap();
        }
        // Worker 1's reserve is empty: it steals 10 of worker 2's 20 and takes a chunk of 5.
        assert_eq!(p.on_idle(1, &[1, 2], &l), Action::Assign(5));
    }
}
