//! Seed 003 §9.3 checks that are exact, on the simulator: convergence to the normalized shares
//! with Table 3's speeds, a slowed worker's amount shrinking (Eq. 4), dynamic inclusion
//! (newcomer characterized with TAM_BLOCO, no iteration stalled by the spawn), exactly-once
//! under failures for every policy (property test), and the policies against the Σnorm ideal.

use mutirao_mw::config::{Config, TRef};
use mutirao_mw::hnow::{Hnow, Mode, Rule};
use mutirao_mw::sim::{run, SimSpec, SimWorker};
use mutirao_mw::{LoadIndex, PolicyKind};
use proptest::prelude::*;
use std::collections::BTreeMap;

/// Table 3: normalized capacities of worker01, 02, 03, 05, 04.
const TABLE3: [f64; 5] = [0.983564, 1.0, 0.983497, 0.345583, 0.260023];

fn workers(speeds: &[f64]) -> Vec<SimWorker> {
    speeds
        .iter()
        .enumerate()
        .map(|(i, &s)| SimWorker::new(i as u32 + 1, s * 100.0))
        .collect()
}

fn spec(speeds: &[f64], total: u64) -> SimSpec {
    SimSpec {
        total,
        comm_per_block_s: 0.001,
        comm_per_task_s: 0.0,
        workers: workers(speeds),
        add: Vec::new(),
        perc_cons_add: 100.0,
    }
}

/// Each worker's share of round `r`'s tasks against norm_i / Σnorm: the worst relative miss.
fn share_miss(res: &mutirao_mw::sim::SimResult, r: u64) -> f64 {
    let blocks: Vec<_> = res.round(r).collect();
    let total: u64 = blocks.iter().map(|b| b.tasks).sum();
    let sum: f64 = TABLE3.iter().sum();
    blocks
        .iter()
        .map(|b| {
            let want = TABLE3[(b.worker - 1) as usize] / sum;
            (b.tasks as f64 / total as f64 / want - 1.0).abs()
        })
        .fold(0.0, f64::max)
}

#[test]
fn hnow_converges_to_the_normalized_shares_within_five_rounds() {
    let run_with = |lo: f64, hi: f64, kind: PolicyKind| {
        let cfg = Config {
            tam_bloco: 40,
            threshold_min: lo,
            threshold_max: hi,
            ..Config::default()
        };
        let mut p = kind.build(&cfg).unwrap();
        run(p.as_mut(), &spec(&TABLE3, 20_000)).unwrap()
    };
    // Faithful, band 95–105 % of the worst time: shares within ±10 % of norm_i/Σnorm by the
    // 6th iteration (characterization + 5), and every compute time inside the band.
    let res = run_with(95.0, 105.0, PolicyKind::Hnow);
    let miss = share_miss(&res, 6);
    assert!(
        miss <= 0.10,
        "faithful: worst share miss {:.1} % at iteration 6",
        miss * 100.0
    );
    let r6: Vec<f64> = res.round(6).map(|b| b.load.unwrap().t_comp_s).collect();
    let worst = r6.iter().copied().fold(0.0, f64::max);
    // (Eq. 3 targets the edge and floors: a worker may end up to one task below it.)
    for b in res.round(6) {
        let t = b.load.unwrap().t_comp_s;
        assert!(t >= 0.95 * worst - t / b.tasks as f64, "{r6:?}");
    }
    // With the band 90–110 the paper's rule moves a worker to the band's *edge*: the others
    // settle at 90 % of the slowest's time, so the slowest keeps up to 1/0.9 − 1 = 11 % more
    // than its share (measured: +10.6 %).
    let miss = share_miss(&run_with(90.0, 110.0, PolicyKind::Hnow), 6);
    assert!(miss > 0.05 && miss <= 1.0 / 0.9 - 1.0 + 0.005, "{miss}");
    // Improved mode (centre of the band, smoothed rates): within ±5 % even with 90–110.
    let miss = share_miss(&run_with(90.0, 110.0, PolicyKind::HnowImproved), 6);
    assert!(
        miss <= 0.05,
        "improved: worst share miss {:.1} % at iteration 6",
        miss * 100.0
    );
}

#[test]
fn a_worker_slowed_mid_run_gets_less_by_eq_4() {
    // The reference follows the worst time slowly (EWMA), so a worker that suddenly takes
    // three times as long is above the upper threshold and Eq. 4 cuts its amount.
    let cfg = Config {
        tam_bloco: 20,
        t_ref: TRef::Ewma(0.3),
        ..Config::default()
    };
    let mut h = Hnow::new(cfg, Mode::Faithful).unwrap();
    let li = |t: f64| LoadIndex {
        t_comp_s: t,
        t_comm_s: 0.0,
    };
    h.plan(&[1, 2], &BTreeMap::new(), 10_000);
    let p = h.plan(
        &[1, 2],
        &BTreeMap::from([(1, li(1.0)), (2, li(1.0))]),
        10_000,
    );
    assert_eq!(p.assignments[1].q, 20);
    let p = h.plan(
        &[1, 2],
        &BTreeMap::from([(1, li(1.0)), (2, li(3.0))]),
        10_000,
    );
    // ref = 0.3 × 3 + 0.7 × 1 = 1.6; Thr_up = 1.92 s; Eq. 4: 1.92 / 3 × 20 × 1 = 12.8 → 12.
    assert_eq!(
        (p.assignments[1].q, p.assignments[1].rule),
        (12, Rule::Decrease)
    );
}

#[test]
fn dynamic_inclusion_characterizes_the_newcomer_and_stalls_no_iteration() {
    let cfg = Config {
        tam_bloco: 10,
        ..Config::default()
    };
    let mut s = spec(&[1.0, 0.5], 3_000);
    s.perc_cons_add = 30.0;
    let mut newcomer = SimWorker::new(9, 80.0);
    newcomer.spawn_delay_s = 0.5; // several iterations long
    s.add = vec![newcomer];
    let mut p = PolicyKind::Hnow.build(&cfg).unwrap();
    let res = run(p.as_mut(), &s).unwrap();
    let joined = res.joined[&9];
    let first = res
        .blocks
        .iter()
        .find(|b| b.worker == 9)
        .expect("newcomer worked");
    assert_eq!(first.tasks, 10, "the newcomer's first block is TAM_BLOCO");
    assert!(first.start_s >= joined);
    // Iterations went on while it was being spawned: some started between the request and
    // its arrival.
    let asked = joined - 0.5;
    assert!(
        res.blocks
            .iter()
            .any(|b| b.start_s > asked && b.start_s < joined),
        "no iteration ran during the spawn"
    );
    assert!(
        res.tasks[&9] > 10,
        "the newcomer got more than its first block"
    );
    assert_eq!(res.tasks.values().sum::<u64>(), 3_000);
}

#[test]
fn the_best_policy_reaches_ninety_percent_of_the_sum_norm_ideal() {
    let cfg = Config {
        tam_bloco: 20,
        ..Config::default()
    };
    let total = 20_000;
    let sum: f64 = TABLE3.iter().sum();
    let ideal = total as f64 / (100.0 * sum);
    let mut best = (f64::INFINITY, "");
    for k in PolicyKind::ALL {
        let mut p = k.build(&cfg).unwrap();
        for (i, s) in TABLE3.iter().enumerate() {
            p.hint_speed(i as u32 + 1, *s);
        }
        let res = run(p.as_mut(), &spec(&TABLE3, total)).unwrap();
        if res.makespan_s < best.0 {
            best = (res.makespan_s, k.name());
        }
    }
    let eff = ideal / best.0;
    assert!(
        eff >= 0.9,
        "best policy {} at {:.1} % of the ideal",
        best.1,
        eff * 100.0
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, .. ProptestConfig::default() })]
    #[test]
    fn every_policy_completes_every_task_exactly_once_despite_failures(
        speeds in prop::collection::vec(0.1f64..2.0, 2..6),
        fails in prop::collection::vec(prop::option::of(0.01f64..2.0), 6),
        total in 1u64..2_000,
        tam in 1u64..50,
        policy in 0usize..7,
    ) {
        let mut s = spec(&speeds, total);
        // Every worker but the first may die (one always survives to finish).
        for (w, f) in s.workers.iter_mut().skip(1).zip(&fails) {
            w.fail_at = *f;
        }
        let cfg = Config { tam_bloco: tam, ..Config::default() };
        let mut p = PolicyKind::ALL[policy].build(&cfg).unwrap();
        let res = run(p.as_mut(), &s).unwrap(); // audits the ledger: exactly once
        prop_assert_eq!(res.tasks.values().sum::<u64>(), total);
    }
}
