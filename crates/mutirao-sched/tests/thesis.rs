//! Golden tests with the HLogP thesis's numbers (digest 000 §11.8 items 3, 5 and 6, plus the
//! co-location observation of thesis Ch. 5), run through the simulator and the schedulers.

use mutirao_model::presets::{gridrio2004, gridrio2004_lam, LamClass};
use mutirao_model::{Host, LinkParams, Piecewise};
use mutirao_sched::dag::{Dag, Edge, Task};
use mutirao_sched::gen;
use mutirao_sched::platform::Platform;
use mutirao_sched::sched::{schedule, Algorithm};
use mutirao_sched::sim::{simulate, CommMode, Placement, SimOptions, WaitMode};

fn konst(os: f64, l: f64, or: f64) -> LinkParams {
    LinkParams {
        os: Piecewise::linear(os, 0.0),
        or: Piecewise::linear(or, 0.0),
        l: Piecewise::linear(l, 0.0),
    }
}

fn hosts(n: usize) -> Vec<Host> {
    (0..n)
        .map(|i| Host {
            name: format!("h{i}"),
            site: "s".into(),
            speed: 1.0,
            addr: None,
        })
        .collect()
}

fn us(s: f64) -> i64 {
    (s * 1e6).round() as i64
}

/// The ring application of thesis Fig. 4.7 with the per-step values of a prediction table:
/// `steps` = [Proc(T0), Os01, L01, Or10, Proc(T1), Os12, L12, Or21, Proc(T2), Os20, L20, Or02].
fn ring_prediction(steps: [f64; 12]) -> i64 {
    let dag = gen::ring(3, 1.0, 2_097_152).unwrap();
    // Work of each task = its Proc (speed 1.0); r0_end is r0's final receive.
    let tasks: Vec<Task> = dag
        .tasks()
        .iter()
        .zip([steps[0], steps[4], steps[8], 0.0])
        .map(|(t, p)| Task {
            id: t.id.clone(),
            work: p * 1e-6,
        })
        .collect();
    let dag = Dag::new(tasks, dag.edges().to_vec()).unwrap();
    // Host 0 = T0, host 1 = T1, host 2 = T2; one pair link per hop.
    let links = vec![
        konst(0.0, 0.0, 0.0),
        konst(steps[1], steps[2], steps[3]),
        konst(steps[5], steps[6], steps[7]),
        konst(steps[9], steps[10], steps[11]),
    ];
    let mut pair = vec![0u32; 9];
    pair[1] = 1; // 0 -> 1
    pair[3 + 2] = 2; // 1 -> 2
    pair[6] = 3; // 2 -> 0
    let platform = Platform::from_parts(hosts(3), links, pair).unwrap();
    let placement = Placement {
        host: vec![0, 1, 2, 0],
        start: vec![0.0, 1.0, 2.0, 3.0],
        seq: vec![0, 1, 2, 3],
    };
    let r = simulate(&dag, &platform, &placement, SimOptions::default()).unwrap();
    us(r.makespan_s)
}

// §11.8 item 3: Table 4.24 (versions II(a) and II(b)).
#[test]
fn item3_ring_table_4_24() {
    let cols: [([f64; 12], i64); 4] = [
        (
            [
                5133257.0, 20.0, 6126.0, 60.0, 5079766.0, 19.0, 6073.0, 51.0, 5057399.0, 71.0,
                6044.0, 281.0,
            ],
            15_289_167,
        ),
        (
            [
                5133257.0, 18.0, 124914.0, 58.0, 8161396.0, 52.0, 149797.0, 148.0, 5057399.0, 21.0,
                5948.0, 94.0,
            ],
            18_633_102,
        ),
        (
            [
                5133257.0, 20.0, 6126.0, 60.0, 5079766.0, 20.0, 6126.0, 60.0, 5057399.0, 20.0,
                6126.0, 60.0,
            ],
            15_289_040,
        ),
        (
            [
                5133257.0, 18.0, 124914.0, 58.0, 8161396.0, 53.0, 131723.0, 147.0, 5057399.0, 20.0,
                6126.0, 60.0,
            ],
            18_615_171,
        ),
    ];
    for (steps, want) in cols {
        assert_eq!(ring_prediction(steps), want);
    }
}

// §11.8 item 3: Table 5.10 (LAM analytic; negative latencies enter the sum unchanged).
#[test]
fn item3_ring_table_5_10_negative_latency() {
    let uff_uff = [
        10088984.0, 172133.0, -173024.0, 178497.0, 10088984.0, 172133.0, -173024.0, 178497.0,
        10088984.0, 172133.0, -173024.0, 178497.0,
    ];
    assert_eq!(ring_prediction(uff_uff), 30_799_770);
    let uff_sinergia = [
        10088984.0, 3063740.0, -2781950.0, 178497.0, 10088984.0, 3063740.0, -2781950.0, 3136989.0,
        10088984.0, 172133.0, -173024.0, 3136989.0,
    ];
    assert_eq!(ring_prediction(uff_sinergia), 37_282_116);
}

// §11.8 item 3: Table 4.11 (version I, g in place of Os/Or) and the thesis's arithmetic slips.
#[test]
fn item3_ring_table_4_11_and_known_slips() {
    // Proc + L + g per hop: g is charged as the receive overhead.
    let uff_puc = [
        4544870.0, 0.0, 5871.0, 192828.0, 6923074.0, 0.0, 5871.0, 177890.0, 4544512.0, 0.0, 156.0,
        6112.0,
    ];
    assert_eq!(ring_prediction(uff_puc), 16_401_184);
    // Printed 13,650,426; the column sums to 13,655,926 (digest §9 item 4).
    let uff_uff = [
        4544512.0, 0.0, 156.0, 6112.0, 4544870.0, 0.0, 157.0, 6112.0, 4547739.0, 0.0, 156.0, 6112.0,
    ];
    assert_eq!(ring_prediction(uff_uff), 13_655_926);
    assert_ne!(ring_prediction(uff_uff), 13_650_426);
    // Table 4.37 UFF-UFF: printed 31,549,625; the column sums to 31,570,320 (§9 item 5).
    let t437 = [
        10331554.0, 37.0, 181712.0, 3438.0, 10331554.0, 37.0, 181712.0, 3438.0, 10351651.0, 37.0,
        181712.0, 3438.0,
    ];
    assert_eq!(ring_prediction(t437), 31_570_320);
}

// The LAM equations reproduce Table 5.10's UFF-Sinergia hop values through the simulator to
// within 0.01% (the table's inputs are rounded differently).
#[test]
fn lam_equations_through_the_ring_are_within_0_01_percent_of_table_5_10() {
    let m = 2_097_152;
    let us_ = gridrio2004_lam(LamClass::UffSinergia);
    let uff = gridrio2004_lam(LamClass::Uff);
    let proc_ = 10088984.0;
    let steps = [
        proc_,
        us_.os.value(m),
        us_.l.value(m),
        178497.0, // Table 5.10 takes the UFF value here (digest §4.4)
        proc_,
        us_.os.value(m),
        us_.l.value(m),
        us_.or.value(m),
        proc_,
        172133.0,
        -173024.0,
        us_.or.value(m),
    ];
    let got = ring_prediction(steps) as f64;
    assert!(((got - 37_282_116.0) / 37_282_116.0).abs() < 1e-4, "{got}");
    assert!(uff.l.value(m) < 0.0);
}

fn fork_join_platform(n: usize, remote: LinkParams, same: LinkParams) -> Platform {
    let mut pair = vec![0u32; n * n];
    for i in 0..n {
        pair[i * n + i] = 1;
    }
    Platform::from_parts(hosts(n), vec![remote, same], pair).unwrap()
}

// §11.8 item 5, fork: 8 remote sends of Os = 357,241 µs serialise on T0's CPU before the local
// message (8,136 µs in total) to T9, delaying T9 by 2,866,064 µs (thesis measured 2,866,306).
#[test]
fn item5_fork_send_overheads_serialise() {
    let dag = gen::fork(9, 1.0, 4 << 20).unwrap(); // root, c1..c9
    let platform = fork_join_platform(9, konst(357_241.0, 100.0, 50.0), konst(4068.0, 0.0, 4068.0));
    // root and c9 on host 0, c_i on host i; c9 is sent to last.
    let host: Vec<usize> = (0..10).map(|t| if t == 9 { 0 } else { t }).collect();
    let placement = Placement {
        host,
        start: (0..10).map(|t| t as f64).collect(),
        seq: (0..10).collect(),
    };
    let r = simulate(&dag, &platform, &placement, SimOptions::default()).unwrap();
    let root_end = r.tasks[0].finish_s;
    let delay_us = (r.tasks[9].start_s - root_end) * 1e6;
    assert_eq!(delay_us.round() as i64, 2_866_064);
    let measured = 2_866_306.0;
    assert!(((delay_us - measured) / measured).abs() < 1e-4);
    // Without the 8 remote messages only the local one delays T9.
    let dag1 = Dag::new(
        vec![
            Task {
                id: "t0".into(),
                work: 1.0,
            },
            Task {
                id: "t9".into(),
                work: 1.0,
            },
        ],
        vec![Edge {
            from: 0,
            to: 1,
            bytes: 4 << 20,
        }],
    )
    .unwrap();
    let p1 = Placement {
        host: vec![0, 0],
        start: vec![0.0, 1.0],
        seq: vec![0, 1],
    };
    let r1 = simulate(&dag1, &platform, &p1, SimOptions::default()).unwrap();
    assert_eq!(us(r1.tasks[1].start_s - r1.tasks[0].finish_s), 8136);
}

// §11.8 item 5, join: 8 receive overheads of Or = 361,216 µs serialise on T9's CPU, plus the
// local message from T8 (12,126 µs): T9 is delayed by 2,901,854 µs (measured 2,906,737).
#[test]
fn item5_join_receive_overheads_serialise() {
    let dag = gen::join(9, 1.0, 4 << 20).unwrap(); // p0..p8, sink
    let platform = fork_join_platform(9, konst(0.0, 0.0, 361_216.0), konst(6063.0, 0.0, 6063.0));
    let host: Vec<usize> = (0..10).map(|t| if t == 9 { 8 } else { t }).collect();
    let placement = Placement {
        host,
        start: (0..10).map(|t| t as f64).collect(),
        seq: (0..10).collect(),
    };
    let r = simulate(&dag, &platform, &placement, SimOptions::default()).unwrap();
    let delay_us = (r.tasks[9].start_s - r.tasks[8].finish_s) * 1e6;
    assert_eq!(delay_us.round() as i64, 2_901_854);
    let measured = 2_906_737.0;
    assert!(((delay_us - measured) / measured).abs() < 2e-3);
    // Host 8 was busy for its own task, one send and nine receives, then the sink.
    assert_eq!(us(r.hosts[8].busy_s), 1_000_000 * 2 + 2_901_854);
}

// Thesis Ch. 5: three chained 5 s processes on one host took 31 s under MPICH-G2 (polling)
// and 15 s under LAM (blocking). The poll model gives 30 s, the block model 15 s.
#[test]
fn colocated_polling_tasks_share_the_cpu() {
    let dag = gen::ring(2, 5.0, 64).unwrap(); // r0 -> r1 -> r0_end (work 0)
    let tasks = vec![
        Task {
            id: "a".into(),
            work: 5.0,
        },
        Task {
            id: "b".into(),
            work: 5.0,
        },
        Task {
            id: "c".into(),
            work: 5.0,
        },
    ];
    let dag = Dag::new(tasks, dag.edges().to_vec()).unwrap();
    let platform = Platform::from_parts(hosts(1), vec![konst(0.0, 0.0, 0.0)], vec![0]).unwrap();
    let placement = Placement {
        host: vec![0, 0, 0],
        start: vec![0.0, 1.0, 2.0],
        seq: vec![0, 1, 2],
    };
    let block = simulate(&dag, &platform, &placement, SimOptions::default()).unwrap();
    assert_eq!(block.makespan_s, 15.0);
    let poll = simulate(
        &dag,
        &platform,
        &placement,
        SimOptions {
            wait: WaitMode::Poll,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(poll.makespan_s, 30.0);
}

/// The 5×5 diamond with 4 MiB edges on the gridrio2004 preset.
fn diamond_case(work: f64) -> (Dag, Platform) {
    (
        gen::diamond(5, work, 4 << 20).unwrap(),
        Platform::from_model(&gridrio2004()).unwrap(),
    )
}

fn simulated(dag: &Dag, platform: &Platform, algo: Algorithm, comm: CommMode) -> (f64, f64) {
    let s = schedule(dag, platform, algo).unwrap();
    let placement = s.placement(dag, platform).unwrap();
    let r = simulate(
        dag,
        platform,
        &placement,
        SimOptions {
            comm,
            ..Default::default()
        },
    )
    .unwrap();
    (s.makespan_s, r.makespan_s)
}

// §11.8 item 6: on the overhead-dominated 5×5 diamond (4 MiB edges, gridrio2004), HLogP-HEFT's
// makespan under the HLogP simulator is <= latency-HEFT's and round-robin's, and latency-HEFT's
// own prediction underestimates its HLogP-simulated makespan.
#[test]
fn item6_hlogp_heft_wins_on_the_overhead_dominated_diamond() {
    for work in [0.5, 2.0, 5.0] {
        let (dag, platform) = diamond_case(work);
        let (_, hlogp) = simulated(&dag, &platform, Algorithm::HlogpHeft, CommMode::HLogP);
        let (heft_own, heft) = simulated(&dag, &platform, Algorithm::Heft, CommMode::HLogP);
        let (_, rr) = simulated(&dag, &platform, Algorithm::RoundRobin, CommMode::HLogP);
        assert!(
            hlogp <= heft,
            "work {work}: hlogp-heft {hlogp} > heft {heft}"
        );
        assert!(
            hlogp <= rr,
            "work {work}: hlogp-heft {hlogp} > round-robin {rr}"
        );
        assert!(
            heft_own < heft,
            "work {work}: heft predicted {heft_own}, simulated {heft}"
        );
    }
}

// HLogP-HEFT's schedule carries the simulator's replay: simulating it again changes nothing.
#[test]
fn hlogp_heft_estimate_matches_the_simulator_on_the_diamond() {
    let (dag, platform) = diamond_case(2.0);
    let (own, sim) = simulated(&dag, &platform, Algorithm::HlogpHeft, CommMode::HLogP);
    assert!(sim <= own + 1e-9, "simulated {sim} > estimate {own}");
    assert!(
        (own - sim) / sim < 0.05,
        "estimate {own} vs simulated {sim}"
    );
}

// A real instance generated by the `wfcommons` 1.6 Python package (BlastRecipe, 45 tasks
// requested) imports, schedules and simulates.
#[test]
fn wfcommons_generated_instance_imports() {
    let text = include_str!("data/wfcommons-blast-45.json");
    let dag = mutirao_sched::wfcommons::from_wfcommons(text).unwrap();
    assert_eq!(dag.len(), 43);
    assert_eq!(dag.edges().len(), 120);
    assert_eq!(dag.tasks()[0].id, "split_fasta_00000001");
    assert_eq!(dag.tasks()[0].work, 3.157);
    assert_eq!(dag.tasks()[1].work, 828.462);
    assert!(dag.edges().iter().any(|e| e.bytes > 0));
    let platform = Platform::from_model(&gridrio2004()).unwrap();
    let s = schedule(&dag, &platform, Algorithm::HlogpHeft).unwrap();
    let pl = s.placement(&dag, &platform).unwrap();
    let r = simulate(&dag, &platform, &pl, SimOptions::default()).unwrap();
    assert!(r.makespan_s >= mutirao_sched::sim::critical_path_bound_s(&dag, &platform));
}
