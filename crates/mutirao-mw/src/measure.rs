//! The measurement algorithm (AM, seed 003 §2.2 and §9.1.7 — proposed by the paper, never
//! built there): reads the repository log of a run and reports how the balancing went, then
//! proposes `TAM_BLOCO` and thresholds for the next run.
//!
//! Heuristics (stated, so a user can judge them):
//! * **TAM_BLOCO**: the characterization round should cost about 5% of the run. Its cost is the
//!   worst compute time of iteration 1; the proposal scales the current `TAM_BLOCO` by
//!   `0.05 × run time / characterization time`, at least 1.
//! * **thresholds**: the band must hold the steady-state noise of a worker's compute time
//!   around its iteration's reference, or rules fire on noise. The proposal is
//!   `100 ± max(5, 2 × p90 of |t_comp / reference − 1|)` percent over the second half of the
//!   iterations (reference = that iteration's worst).

use crate::log::Record;
use crate::{Error, Result, WorkerId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One iteration's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IterationReport {
    /// The iteration.
    pub iteration: u64,
    /// Workers that computed.
    pub workers: usize,
    /// Tasks done.
    pub tasks: u64,
    /// Worst compute time, s.
    pub worst_s: f64,
    /// max / min compute time (1 = perfectly balanced).
    pub imbalance: f64,
    /// Σ t_comm / Σ (t_comp + t_comm).
    pub comm_share: f64,
}

/// The analysis of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Analysis {
    /// Per iteration.
    pub iterations: Vec<IterationReport>,
    /// Characterization round's worst time ÷ Σ of every iteration's worst time.
    pub characterization_share: f64,
    /// Final share of tasks per worker (last iteration).
    pub final_shares: BTreeMap<WorkerId, f64>,
    /// Proposed `TAM_BLOCO`.
    pub propose_tam_bloco: u64,
    /// Proposed `THRESHOLD_MIN`, percent.
    pub propose_threshold_min: f64,
    /// Proposed `THRESHOLD_MAX`, percent.
    pub propose_threshold_max: f64,
}

/// Analyse a log (block records of synchronized iterations; others are skipped). `tam_bloco`
/// is the value the run used.
pub fn analyse(records: &[Record], tam_bloco: u64) -> Result<Analysis> {
    let mut by_it: BTreeMap<u64, Vec<(WorkerId, u64, f64, f64)>> = BTreeMap::new();
    for r in records {
        if let Record::Block {
            iteration,
            worker,
            len,
            t_comp_s,
            t_comm_s,
            ..
        } = r
        {
            if *iteration > 0 {
                by_it
                    .entry(*iteration)
                    .or_default()
                    .push((*worker, *len, *t_comp_s, *t_comm_s));
            }
        }
    }
    if by_it.is_empty() {
        return Err(Error::Invalid(
            "the log holds no block of a synchronized iteration: nothing to analyse".into(),
        ));
    }
    let mut its = Vec::new();
    for (&k, v) in &by_it {
        let worst = v.iter().map(|x| x.2).fold(0.0f64, f64::max);
        let best = v.iter().map(|x| x.2).fold(f64::INFINITY, f64::min);
        let comm: f64 = v.iter().map(|x| x.3).sum();
        let all: f64 = v.iter().map(|x| x.2 + x.3).sum();
        its.push(IterationReport {
            iteration: k,
            workers: v.len(),
            tasks: v.iter().map(|x| x.1).sum(),
            worst_s: worst,
            imbalance: if best > 0.0 {
                worst / best
            } else {
                f64::INFINITY
            },
            comm_share: if all > 0.0 { comm / all } else { 0.0 },
        });
    }
    let run: f64 = its.iter().map(|i| i.worst_s).sum();
    let char_s = its[0].worst_s;
    let char_share = if run > 0.0 { char_s / run } else { 0.0 };
    let last = by_it.values().next_back().expect("non-empty");
    let last_total: u64 = last.iter().map(|x| x.1).sum();
    let final_shares = last
        .iter()
        .map(|x| (x.0, x.1 as f64 / last_total.max(1) as f64))
        .collect();
    let propose_tam_bloco = if char_s > 0.0 {
        ((tam_bloco as f64) * 0.05 * run / char_s).floor().max(1.0) as u64
    } else {
        tam_bloco
    };
    // Steady-state noise: second half of the iterations after characterization.
    let keys: Vec<u64> = by_it.keys().copied().filter(|&k| k > 1).collect();
    let half = &keys[keys.len() / 2..];
    let mut dev: Vec<f64> = Vec::new();
    for k in half {
        let v = &by_it[k];
        let worst = v.iter().map(|x| x.2).fold(0.0f64, f64::max);
        if worst > 0.0 {
            dev.extend(v.iter().map(|x| (x.2 / worst - 1.0).abs() * 100.0));
        }
    }
    dev.sort_by(f64::total_cmp);
    let p90 = if dev.is_empty() {
        0.0
    } else {
        dev[((dev.len() - 1) as f64 * 0.9).round() as usize]
    };
    let d = (2.0 * p90).max(5.0);
    Ok(Analysis {
        iterations: its,
        characterization_share: char_share,
        final_shares,
        propose_tam_bloco,
        propose_threshold_min: (100.0 - d).max(1.0),
        propose_threshold_max: 100.0 + d,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(it: u64, w: WorkerId, len: u64, t: f64) -> Record {
        Record::Block {
            iteration: it,
            worker: w,
            q: len,
            fator_het: 1.0,
            rule: "keep".into(),
            start: 0,
            len,
            t_comp_s: t,
            t_comm_s: 0.1 * t,
            thr_low_s: None,
            thr_up_s: None,
            duplicate: false,
        }
    }

    #[test]
    fn a_costly_characterization_asks_for_a_smaller_block_and_noise_widens_the_band() {
        // Characterization 10 s, then 9 iterations of 2 s with ±10% noise: run 28 s;
        // 5% of it is 1.4 s, so TAM_BLOCO 100 → 14.
        let mut r = vec![block(1, 1, 100, 10.0), block(1, 2, 100, 2.0)];
        for it in 2..=10 {
            r.push(block(it, 1, 20, 2.0));
            r.push(block(it, 2, 100, 1.8));
        }
        let a = analyse(&r, 100).unwrap();
        assert_eq!(a.propose_tam_bloco, 14);
        assert!((a.characterization_share - 10.0 / 28.0).abs() < 1e-9);
        assert!((a.iterations[0].imbalance - 5.0).abs() < 1e-9);
        // |1.8/2 − 1| = 10% → band ±20%.
        assert!((a.propose_threshold_min - 80.0).abs() < 1e-9, "{a:?}");
        assert!((a.final_shares[&2] - 100.0 / 120.0).abs() < 1e-9);
    }

    #[test]
    fn an_empty_log_is_an_error() {
        assert!(analyse(&[], 10).is_err());
    }
}
