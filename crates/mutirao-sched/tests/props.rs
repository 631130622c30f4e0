//! Property tests: every schedule respects precedence and host serialisation; the simulator
//! never beats the critical-path bound; the latency model never predicts later than HLogP;
//! parsers never panic.

use mutirao_sched::dag::Dag;
use mutirao_sched::gen::{self, RandomParams};
use mutirao_sched::platform::Platform;
use mutirao_sched::sched::{schedule, Algorithm, Schedule};
use mutirao_sched::sim::{
    critical_path_bound_s, simulate, CommMode, Placement, SimOptions, SimResult, WaitMode,
};
use proptest::prelude::*;

const EPS: f64 = 1e-9;

fn case() -> impl Strategy<Value = (Dag, Platform)> {
    (
        1usize..40,
        0.0f64..5.0,
        0.5f64..2.0,
        1usize..5,
        0.0f64..1.0,
        1usize..6,
        any::<u64>(),
    )
        .prop_map(|(n, ccr, alpha, out_degree, beta, hosts, seed)| {
            let dag = gen::random(&RandomParams {
                n,
                ccr,
                alpha,
                out_degree,
                mean_work: 1.0,
                bytes_per_s: 1.0e8,
                seed,
            })
            .unwrap();
            let model = gen::random_model(hosts, beta, 1.0e8, seed).unwrap();
            (dag, Platform::from_model(&model).unwrap())
        })
}

/// Intervals on one host never overlap; every edge's receiver starts after its sender ends.
fn check_timeline(dag: &Dag, host: &[usize], start: &[f64], finish: &[f64]) {
    for e in dag.edges() {
        assert!(
            start[e.to] + EPS >= finish[e.from],
            "{} starts at {} before {} ends at {}",
            dag.tasks()[e.to].id,
            start[e.to],
            dag.tasks()[e.from].id,
            finish[e.from]
        );
    }
    let mut by_host: Vec<(usize, f64, f64)> = (0..dag.len())
        .map(|t| (host[t], start[t], finish[t]))
        .collect();
    by_host.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    for w in by_host.windows(2) {
        if w[0].0 == w[1].0 {
            assert!(
                w[1].1 + EPS >= w[0].2,
                "overlap on host {}: {:?}",
                w[0].0,
                w
            );
        }
    }
}

fn sim(dag: &Dag, p: &Platform, pl: &Placement, comm: CommMode, wait: WaitMode) -> SimResult {
    simulate(
        dag,
        p,
        pl,
        SimOptions {
            comm,
            wait,
            record_messages: true,
            contention: false,
        },
    )
    .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn schedules_respect_precedence_and_host_serialisation((dag, platform) in case()) {
        let cp = critical_path_bound_s(&dag, &platform);
        for algo in Algorithm::ALL {
            let s = schedule(&dag, &platform, algo).unwrap();
            prop_assert_eq!(s.tasks.len(), dag.len());
            let pl = s.placement(&dag, &platform).unwrap();
            let ids = dag.id_index();
            let mut start = vec![0.0; dag.len()];
            let mut finish = vec![0.0; dag.len()];
            for st in &s.tasks {
                let t = ids[st.id.as_str()];
                start[t] = st.start_s;
                finish[t] = st.finish_s;
                // A task takes its work at its host's speed.
                let want = dag.tasks()[t].work / platform.speed(pl.host[t]);
                prop_assert!((st.finish_s - st.start_s - want).abs() < 1e-9);
            }
            check_timeline(&dag, &pl.host, &start, &finish);
            prop_assert!(s.makespan_s + EPS >= cp, "{} estimate {} < bound {}", algo.as_str(), s.makespan_s, cp);
            // The simulator's replay respects the same invariants and the bound.
            let r = sim(&dag, &platform, &pl, CommMode::HLogP, WaitMode::Block);
            let rs: Vec<f64> = r.tasks.iter().map(|t| t.start_s).collect();
            let rf: Vec<f64> = r.tasks.iter().map(|t| t.finish_s).collect();
            check_timeline(&dag, &pl.host, &rs, &rf);
            prop_assert!(r.makespan_s + EPS >= cp);
            // Schedule JSON round trip.
            let back = Schedule::from_json(&s.to_json()).unwrap();
            prop_assert_eq!(back.placement(&dag, &platform).unwrap(), pl);
        }
    }

    #[test]
    fn simulator_bounds_and_model_ordering((dag, platform) in case(), hosts_seed in any::<u64>()) {
        // An arbitrary mapping, run in topological order on each host.
        let np = platform.len();
        let mut pos = vec![0usize; dag.len()];
        for (i, &t) in dag.topo_order().iter().enumerate() {
            pos[t] = i;
        }
        let pl = Placement {
            host: (0..dag.len()).map(|t| ((t as u64).wrapping_mul(hosts_seed | 1) >> 7) as usize % np).collect(),
            start: pos.iter().map(|&p| p as f64).collect(),
            seq: pos.clone(),
        };
        let cp = critical_path_bound_s(&dag, &platform);
        let h = sim(&dag, &platform, &pl, CommMode::HLogP, WaitMode::Block);
        let l = sim(&dag, &platform, &pl, CommMode::LatencyOnly, WaitMode::Block);
        let p = sim(&dag, &platform, &pl, CommMode::HLogP, WaitMode::Poll);
        prop_assert!(h.makespan_s + EPS >= cp);
        prop_assert!(l.makespan_s + EPS >= cp);
        prop_assert!(l.makespan_s <= h.makespan_s + EPS, "latency {} > hlogp {}", l.makespan_s, h.makespan_s);
        prop_assert!(h.makespan_s <= p.makespan_s + EPS, "block {} > poll {}", h.makespan_s, p.makespan_s);
        // Busy time = work + overheads; idle = makespan - busy.
        let total_busy: f64 = h.hosts.iter().map(|u| u.busy_s).sum();
        let total_exec: f64 = (0..dag.len()).map(|t| platform.exec_s(dag.tasks()[t].work, pl.host[t])).sum();
        let total_oh: f64 = h.messages.iter().map(|m| (m.send_end_s - m.send_start_s) + (m.recv_end_s - m.recv_start_s)).sum();
        prop_assert!((total_busy - total_exec - total_oh).abs() < 1e-6);
        for u in &h.hosts {
            prop_assert!((u.busy_s + u.idle_s - h.makespan_s).abs() < 1e-6 || u.busy_s > h.makespan_s);
        }
        // Every message: send overhead, then arrival, then receive overhead before the task.
        for m in &h.messages {
            let e = dag.edges()[m.edge];
            prop_assert!(m.send_start_s + EPS >= h.tasks[e.from].finish_s);
            prop_assert!(m.recv_start_s + EPS >= m.arrival_s);
            prop_assert!(h.tasks[e.to].start_s + EPS >= m.recv_end_s);
        }
    }

    #[test]
    fn dag_json_round_trips((dag, _p) in case()) {
        let back = Dag::from_json(&dag.to_json()).unwrap();
        prop_assert_eq!(back, dag);
    }

    #[test]
    fn parsers_never_panic(s in ".{0,200}") {
        let _ = Dag::from_json(&s);
        let _ = Schedule::from_json(&s);
    }
}
