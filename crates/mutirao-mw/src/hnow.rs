//! HNOW's load-balancing algorithm (ABC, seed 003 §2.5–2.8): synchronized iterations, a
//! characterization round, the heterogeneity factor and Eqs. 1–5, exactly; and an improved mode.
//!
//! Faithful mode, per iteration k ≥ 2 and worker i (times in seconds here, the paper's ms):
//! `FatorHet_i = Q_i(k−1) / TAM_BLOCO` (Eq. 2); thresholds `Thr_low = THRESHOLD_MIN % × T_ref`,
//! `Thr_up = THRESHOLD_MAX % × T_ref`; then Eq. 3 (`T_comp < Thr_low`: increase), Eq. 4
//! (`T_comp > Thr_up`: decrease) or Eq. 5 (in band: keep), rounded down. Two departures the
//! paper leaves open (seed 003 §8): a floor of 0 becomes 1 (a worker is never silently starved;
//! [`Rule::ClampedToOne`] says so), and a `T_comp` of 0 (too fast to time) keeps the amount.
//!
//! ```
//! use mutirao_mw::hnow::{eq3, eq4, eq5};
//! // seed 003 §9.3 check 3: TAM_BLOCO = 10, Q_prev = 10 (FatorHet = 1)
//! assert_eq!(eq3(0.080, 10, 0.040, 1.0).floor(), 20.0);
//! assert_eq!(eq4(0.120, 0.240, 10, 1.0).floor(), 5.0);
//! assert_eq!(eq5(10, 1.0), 10.0);
//! ```
//!
//! Improved mode ([`Mode::Improved`]): each worker's rate (tasks per second) is smoothed by an
//! EWMA; a worker out of band is moved to the **centre** of the band, not its edge; a newcomer
//! whose speed is known (from the machine model) starts at its share instead of `TAM_BLOCO`;
//! and when fewer tasks remain than the round would hand out, every worker's amount shrinks in
//! proportion to its rate so that all finish together (no last-round starvation).

use crate::config::{Config, TRef};
use crate::{Error, LoadIndex, Result, WorkerId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Eq. 1: `QtarefaW = TAM_BLOCO × FatorHet_i` (the characterization round, FatorHet = 1).
pub fn eq1(tam_bloco: u64, fator_het: f64) -> f64 {
    tam_bloco as f64 * fator_het
}

/// Eq. 2 (as the prose defines it): `FatorHet_i = Q_i(previous) / TAM_BLOCO`.
pub fn eq2(q_prev: u64, tam_bloco: u64) -> f64 {
    q_prev as f64 / tam_bloco as f64
}

/// Eq. 3, under-utilized: `(Thr_low × TAM_BLOCO / T_comp,i) × FatorHet_i`.
pub fn eq3(thr_low: f64, tam_bloco: u64, t_comp: f64, fator_het: f64) -> f64 {
    (thr_low * tam_bloco as f64 / t_comp) * fator_het
}

/// Eq. 4, overloaded: `(Thr_up / T_comp,i) × TAM_BLOCO × FatorHet_i`.
pub fn eq4(thr_up: f64, t_comp: f64, tam_bloco: u64, fator_het: f64) -> f64 {
    (thr_up / t_comp) * tam_bloco as f64 * fator_het
}

/// Eq. 5, in band: `TAM_BLOCO × FatorHet_i`.
pub fn eq5(tam_bloco: u64, fator_het: f64) -> f64 {
    tam_bloco as f64 * fator_het
}

/// Faithful to the paper, or improved (seed 003 §8).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Eqs. 1–5 as written.
    Faithful,
    /// Centre-of-band target, EWMA-smoothed rates (weight of the newest round), tail shrinking.
    Improved {
        /// Weight of the newest round in each worker's rate, (0, 1].
        ewma: f64,
    },
}

/// Which rule set a worker's amount this round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    /// First block of a worker: Eq. 1 with FatorHet = 1 (or, improved, its known share).
    Characterization,
    /// Eq. 3: below the lower threshold, more work.
    Increase,
    /// Eq. 4: above the upper threshold, less work.
    Decrease,
    /// Eq. 5: in band, unchanged.
    Keep,
    /// The rule gave less than one task; one is handed out.
    ClampedToOne,
    /// Fewer tasks remain than the round would hand out: cut to what is left.
    Tail,
}

/// One worker's amount for the coming iteration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Assignment {
    /// The worker.
    pub worker: WorkerId,
    /// Tasks to hand it (0 only in a tail round).
    pub q: u64,
    /// Its heterogeneity factor (Eq. 2) this round.
    pub fator_het: f64,
    /// The rule that set `q`.
    pub rule: Rule,
}

/// The plan of one iteration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundPlan {
    /// 1 = characterization.
    pub iteration: u64,
    /// The reference time of the thresholds, s (`None` in the characterization round).
    pub t_ref_s: Option<f64>,
    /// `Thr_low`, s.
    pub thr_low_s: Option<f64>,
    /// `Thr_up`, s.
    pub thr_up_s: Option<f64>,
    /// One entry per member, in membership order.
    pub assignments: Vec<Assignment>,
}

impl RoundPlan {
    /// Tasks handed out this round.
    pub fn total(&self) -> u64 {
        self.assignments.iter().map(|a| a.q).sum()
    }
}

/// The balancer's state across iterations.
#[derive(Debug, Clone)]
pub struct Hnow {
    cfg: Config,
    mode: Mode,
    iteration: u64,
    q: BTreeMap<WorkerId, u64>,
    rate: BTreeMap<WorkerId, f64>,
    hint: BTreeMap<WorkerId, f64>,
    t_ref: Option<f64>,
}

impl Hnow {
    /// A balancer for `cfg` (validated) in `mode`.
    pub fn new(cfg: Config, mode: Mode) -> Result<Hnow> {
        cfg.validate()?;
        if let Mode::Improved { ewma } = mode {
            if !(ewma > 0.0 && ewma <= 1.0) {
                return Err(Error::Config(format!(
                    "improved mode: EWMA weight {ewma} must be in (0, 1]"
                )));
            }
        }
        Ok(Hnow {
            cfg,
            mode,
            iteration: 0,
            q: BTreeMap::new(),
            rate: BTreeMap::new(),
            hint: BTreeMap::new(),
            t_ref: None,
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Improved mode: a newcomer's expected rate (tasks/s, e.g. its model speed × the measured
    /// rate of a reference worker) so its first block is its share, not `TAM_BLOCO`.
    pub fn hint_rate(&mut self, w: WorkerId, tasks_per_s: f64) {
        if tasks_per_s.is_finite() && tasks_per_s > 0.0 {
            self.hint.insert(w, tasks_per_s);
        }
    }

    /// Forget a worker that left (its state goes; it is a newcomer if it comes back).
    pub fn remove(&mut self, w: WorkerId) {
        self.q.remove(&w);
        self.rate.remove(&w);
        self.hint.remove(&w);
    }

    /// Plan the next iteration for `members` (in the order blocks are dealt), given what each
    /// worker reported for its block of the previous iteration (`last`; a worker that got no
    /// block is absent) and the tasks not yet handed out.
    pub fn plan(
        &mut self,
        members: &[WorkerId],
        last: &BTreeMap<WorkerId, LoadIndex>,
        remaining: u64,
    ) -> RoundPlan {
        self.iteration += 1;
        let tam = self.cfg.tam_bloco;
        // Rates and the reference time from the previous round.
        let worst = last
            .iter()
            .filter(|(w, _)| self.q.contains_key(w))
            .map(|(_, li)| li.t_comp_s)
            .filter(|t| t.is_finite() && *t > 0.0)
            .fold(None, |m: Option<f64>, t| Some(m.map_or(t, |m| m.max(t))));
        if let Some(worst) = worst {
            self.t_ref = Some(match (self.cfg.t_ref, self.t_ref) {
                (TRef::WorstOfLastIteration, _) | (_, None) => worst,
                (TRef::CharacterizationWorst, Some(r)) => r,
                (TRef::Ewma(a), Some(r)) => a * worst + (1.0 - a) * r,
            });
        }
        for (w, li) in last {
            let Some(&q) = self.q.get(w) else { continue };
            if li.t_comp_s > 0.0 && li.t_comp_s.is_finite() && q > 0 {
                let r = q as f64 / li.t_comp_s;
                let a = match self.mode {
                    Mode::Improved { ewma } => ewma,
                    Mode::Faithful => 1.0,
                };
                let e = self.rate.entry(*w).or_insert(r);
                *e = a * r + (1.0 - a) * *e;
            }
        }
        let (thr_low, thr_up) = match self.t_ref {
            Some(r) => (
                Some(self.cfg.threshold_min / 100.0 * r),
                Some(self.cfg.threshold_max / 100.0 * r),
            ),
            None => (None, None),
        };
        let mut out = Vec::with_capacity(members.len());
        for &w in members {
            let prev = self.q.get(&w).copied();
            let (q, fh, rule) = match (prev, thr_low, thr_up) {
                (None, _, _) | (_, None, _) | (_, _, None) => self.first_block(w, tam),
                (Some(qp), Some(lo), Some(hi)) => {
                    let fh = eq2(qp, tam);
                    match last.get(&w).map(|li| li.t_comp_s) {
                        Some(t) if t.is_finite() && t > 0.0 => {
                            let (x, rule) = if t < lo {
                                (self.retarget(w, lo, hi, tam, t, fh, true), Rule::Increase)
                            } else if t > hi {
                                (self.retarget(w, lo, hi, tam, t, fh, false), Rule::Decrease)
                            } else {
                                (eq5(tam, fh), Rule::Keep)
                            };
                            let q = x.floor();
                            if q < 1.0 {
                                (1, fh, Rule::ClampedToOne)
                            } else {
                                (q.min(u64::MAX as f64) as u64, fh, rule)
                            }
                        }
                        // No block last round (tail) or untimeable: keep.
                        _ => (qp.max(1), fh, Rule::Keep),
                    }
                }
            };
            out.push(Assignment {
                worker: w,
                q,
                fator_het: fh,
                rule,
            });
        }
        self.tail(&mut out, remaining);
        for a in &out {
            if a.q > 0 {
                self.q.insert(a.worker, a.q);
            } else {
                self.q.entry(a.worker).or_insert(tam);
            }
        }
        RoundPlan {
            iteration: self.iteration,
            t_ref_s: self.t_ref,
            thr_low_s: thr_low,
            thr_up_s: thr_up,
            assignments: out,
        }
    }

    fn first_block(&self, w: WorkerId, tam: u64) -> (u64, f64, Rule) {
        if let (Mode::Improved { .. }, Some(r), Some(t)) =
            (self.mode, self.hint.get(&w), self.centre_time())
        {
            let q = (r * t).floor().max(1.0) as u64;
            return (q, eq2(q, tam), Rule::Characterization);
        }
        (eq1(tam, 1.0) as u64, 1.0, Rule::Characterization)
    }

    fn centre_time(&self) -> Option<f64> {
        self.t_ref
            .map(|r| (self.cfg.threshold_min + self.cfg.threshold_max) / 200.0 * r)
    }

    #[allow(clippy::too_many_arguments)]
    fn retarget(&self, w: WorkerId, lo: f64, hi: f64, tam: u64, t: f64, fh: f64, up: bool) -> f64 {
        match self.mode {
            Mode::Faithful => {
                if up {
                    eq3(lo, tam, t, fh)
                } else {
                    eq4(hi, t, tam, fh)
                }
            }
            Mode::Improved { .. } => {
                let centre = (lo + hi) / 2.0;
                match self.rate.get(&w) {
                    Some(r) => r * centre,
                    None => eq3(centre, tam, t, fh),
                }
            }
        }
    }

    /// Cut the round to the tasks that remain. Faithful: blocks are dealt in order until the
    /// tasks run out (later workers may get nothing, the paper's caveat). Improved: every
    /// amount shrinks in proportion to the worker's rate (largest remainders get the rest).
    fn tail(&self, out: &mut [Assignment], remaining: u64) {
        let total: u64 = out.iter().map(|a| a.q).sum();
        if total <= remaining {
            return;
        }
        match self.mode {
            Mode::Faithful => {
                let mut left = remaining;
                for a in out.iter_mut() {
                    let q = a.q.min(left);
                    if q < a.q {
                        a.q = q;
                        a.rule = Rule::Tail;
                    }
                    left -= q;
                }
            }
            Mode::Improved { .. } => {
                let weight = |a: &Assignment| {
                    self.rate
                        .get(&a.worker)
                        .copied()
                        .unwrap_or(a.q as f64)
                        .max(1e-12)
                };
                let sum: f64 = out.iter().map(weight).sum();
                let mut given = 0u64;
                let mut rema: Vec<(f64, usize)> = Vec::with_capacity(out.len());
                for (i, a) in out.iter_mut().enumerate() {
                    let exact = remaining as f64 * weight(a) / sum;
                    a.q = exact.floor() as u64;
                    a.rule = Rule::Tail;
                    given += a.q;
                    rema.push((exact - exact.floor(), i));
                }
                rema.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
                for &(_, i) in rema.iter().take((remaining - given) as usize) {
                    out[i].q += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn li(t: f64) -> LoadIndex {
        LoadIndex {
            t_comp_s: t,
            t_comm_s: 0.0,
        }
    }

    #[test]
    fn hand_computed_cases_of_eqs_1_to_5() {
        assert_eq!(eq1(10, 1.0), 10.0);
        assert_eq!(eq2(25, 10), 2.5);
        // Non-integer results are floored by the planner: 80 × 10 / 30 = 26.67 → 26.
        assert!((eq3(0.080, 10, 0.030, 1.0) - 26.666_666).abs() < 1e-3);
        assert_eq!(eq4(0.120, 0.250, 10, 2.0), 9.6);
    }

    #[test]
    fn characterization_then_thresholds_in_faithful_mode() {
        let cfg = Config {
            tam_bloco: 10,
            ..Config::default()
        };
        let mut h = Hnow::new(cfg, Mode::Faithful).unwrap();
        let p = h.plan(&[1, 2, 3], &BTreeMap::new(), 1000);
        assert!(p
            .assignments
            .iter()
            .all(|a| a.q == 10 && a.rule == Rule::Characterization));
        assert_eq!(p.t_ref_s, None);
        // Worst 0.1 s: band [0.08, 0.12]. Worker 1 at 0.04 → Eq. 3: 0.08×10/0.04 = 20;
        // worker 2 at 0.09 in band → 10; worker 3 is the worst (0.1), in band → 10.
        let last = BTreeMap::from([(1, li(0.04)), (2, li(0.09)), (3, li(0.1))]);
        let p = h.plan(&[1, 2, 3], &last, 1000);
        assert_eq!(p.t_ref_s, Some(0.1));
        let q: Vec<(u64, Rule)> = p.assignments.iter().map(|a| (a.q, a.rule)).collect();
        assert_eq!(
            q,
            vec![(20, Rule::Increase), (10, Rule::Keep), (10, Rule::Keep)]
        );
        // Worker 1 now FatorHet 2; it slowed to 0.3 s while the others stayed: worst 0.3,
        // band [0.24, 0.36]: 1 in band (keep 20); 2 at 0.09 → 0.24×10/0.09×1 = 26.67 → 26.
        let last = BTreeMap::from([(1, li(0.3)), (2, li(0.09)), (3, li(0.1))]);
        let p = h.plan(&[1, 2, 3], &last, 1000);
        assert_eq!(p.assignments[0].fator_het, 2.0);
        assert_eq!(
            (p.assignments[0].q, p.assignments[0].rule),
            (20, Rule::Keep)
        );
        assert_eq!(
            (p.assignments[1].q, p.assignments[1].rule),
            (26, Rule::Increase)
        );
    }

    #[test]
    fn decrease_under_a_fixed_reference_and_clamp_to_one() {
        let cfg = Config {
            tam_bloco: 10,
            t_ref: TRef::CharacterizationWorst,
            ..Config::default()
        };
        let mut h = Hnow::new(cfg, Mode::Faithful).unwrap();
        h.plan(&[1, 2], &BTreeMap::new(), 100);
        h.plan(&[1, 2], &BTreeMap::from([(1, li(0.1)), (2, li(0.1))]), 100);
        // Reference stays 0.1: worker 2 took 0.24 s → Eq. 4: 0.12/0.24 × 10 × 1 = 5.
        let p = h.plan(&[1, 2], &BTreeMap::from([(1, li(0.1)), (2, li(0.24))]), 100);
        assert_eq!(
            (p.assignments[1].q, p.assignments[1].rule),
            (5, Rule::Decrease)
        );
        // Worker 2 then took 10 s for its 5 tasks: 0.12/10 × 10 × 0.5 = 0.06 → clamped to 1.
        let p = h.plan(&[1, 2], &BTreeMap::from([(1, li(0.1)), (2, li(10.0))]), 100);
        assert_eq!(
            (p.assignments[1].q, p.assignments[1].rule),
            (1, Rule::ClampedToOne)
        );
    }

    #[test]
    fn tail_rounds_never_hand_out_more_than_remains() {
        for mode in [Mode::Faithful, Mode::Improved { ewma: 0.5 }] {
            let mut h = Hnow::new(Config::default(), mode).unwrap();
            let p = h.plan(&[1, 2, 3], &BTreeMap::new(), 25);
            assert_eq!(p.total(), 25, "{mode:?}");
            if mode == Mode::Faithful {
                let q: Vec<u64> = p.assignments.iter().map(|a| a.q).collect();
                assert_eq!(q, vec![10, 10, 5]);
            } else {
                assert!(p.assignments.iter().all(|a| a.q >= 8), "{p:?}");
            }
        }
    }

    #[test]
    fn newcomers_are_characterized_and_improved_mode_uses_their_hint() {
        let mut h = Hnow::new(Config::default(), Mode::Improved { ewma: 1.0 }).unwrap();
        h.plan(&[1], &BTreeMap::new(), 10_000);
        h.plan(&[1], &BTreeMap::from([(1, li(1.0))]), 10_000); // 10 tasks/s, ref 1 s
        h.hint_rate(2, 5.0);
        let p = h.plan(&[1, 2, 3], &BTreeMap::from([(1, li(1.0))]), 10_000);
        // Worker 2: 5 tasks/s × the centre of the band (1.0 × 100 %) = 5; 3 unknown: TAM_BLOCO.
        assert_eq!(
            (p.assignments[1].q, p.assignments[1].rule),
            (5, Rule::Characterization)
        );
        assert_eq!(
            (p.assignments[2].q, p.assignments[2].rule),
            (10, Rule::Characterization)
        );
    }
}
