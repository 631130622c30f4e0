//! Speed benchmarks of issue 4:
//! * `simulate_1e6_tasks`: HLogP simulation of a 10⁶-task random layered graph on 64 hosts
//!   (target < 5 s);
//! * `simulate_1e6_tasks_contention`: the same with link contention, the 64 hosts in 4 sites
//!   (1 Gbit/s NICs and site links, about the model's 800 Mbit/s links; issue 11 target < 5 s;
//!   3.6–4.1 s of CPU per iteration since 2026-11-25, 5–8 s of wall time on the loaded shared
//!   development machine, see docs/scheduling.md, so its ten samples take a minute or two);
//! * `simulate_1e5_tasks_contention`: the same graph shape at 10⁵ tasks (about a second per
//!   iteration: the one to run before and after a change to the network);
//! * `hlogp_heft_1e4_tasks_64_hosts`: the thesis's scheduler on 10⁴ tasks (target < 10 s);
//! * `predict_200_tasks_32_hosts`: resolve the model, check the schedule and simulate
//!   (target < 50 ms).
//!
//! Run: `cargo bench -p mutirao-sched --bench sched` (one: `... -- sched/simulate_1e5`).

use criterion::{criterion_group, criterion_main, Criterion};
use mutirao_sched::gen::{self, RandomParams};
use mutirao_sched::platform::Platform;
use mutirao_sched::sched::{schedule, Algorithm};
use mutirao_sched::sim::{simulate, Placement, SimOptions};
use std::hint::black_box;

fn round_robin_placement(dag: &mutirao_sched::Dag, hosts: usize) -> Placement {
    let n = dag.len();
    let mut pos = vec![0usize; n];
    for (i, &t) in dag.topo_order().iter().enumerate() {
        pos[t] = i;
    }
    Placement {
        host: (0..n).map(|t| t % hosts).collect(),
        start: pos.iter().map(|&p| p as f64).collect(),
        seq: pos,
    }
}

fn benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("sched");
    g.sample_size(10);

    let big = gen::random(&RandomParams {
        n: 1_000_000,
        ccr: 1.0,
        alpha: 1.0,
        out_degree: 3,
        seed: 1,
        ..Default::default()
    })
    .expect("generate 1e6 tasks");
    let p64 = Platform::from_model(&gen::random_model(64, 0.5, 1e8, 1).expect("model"))
        .expect("platform");
    let pl = round_robin_placement(&big, 64);
    g.bench_function("simulate_1e6_tasks", |b| {
        b.iter(|| simulate(black_box(&big), &p64, &pl, SimOptions::default()).expect("simulate"))
    });
    let p64c = Platform::from_model(&gen::with_sites_and_capacities(
        gen::random_model(64, 0.5, 1e8, 1).expect("model"),
        4,
        1000.0,
    ))
    .expect("platform");
    g.bench_function("simulate_1e6_tasks_contention", |b| {
        b.iter(|| {
            simulate(
                black_box(&big),
                &p64c,
                &pl,
                SimOptions {
                    contention: true,
                    ..SimOptions::default()
                },
            )
            .expect("simulate")
        })
    });
    drop(big);
    // The same at 10⁵ tasks: one iteration takes seconds, not a minute, so this one can be run
    // before and after a change in a few minutes.
    let g5 = gen::random(&RandomParams {
        n: 100_000,
        ccr: 1.0,
        alpha: 1.0,
        out_degree: 3,
        seed: 1,
        ..Default::default()
    })
    .expect("generate 1e5 tasks");
    let pl5 = round_robin_placement(&g5, 64);
    g.bench_function("simulate_1e5_tasks_contention", |b| {
        b.iter(|| {
            simulate(
                black_box(&g5),
                &p64c,
                &pl5,
                SimOptions {
                    contention: true,
                    ..SimOptions::default()
                },
            )
            .expect("simulate")
        })
    });
    drop(g5);

    let mid = gen::random(&RandomParams {
        n: 10_000,
        ccr: 1.0,
        alpha: 1.0,
        out_degree: 3,
        seed: 2,
        ..Default::default()
    })
    .expect("generate 1e4 tasks");
    g.bench_function("hlogp_heft_1e4_tasks_64_hosts", |b| {
        b.iter(|| schedule(black_box(&mid), &p64, Algorithm::HlogpHeft).expect("schedule"))
    });
    g.bench_function("heft_1e4_tasks_64_hosts", |b| {
        b.iter(|| schedule(black_box(&mid), &p64, Algorithm::Heft).expect("schedule"))
    });
    g.finish();

    let small = gen::random(&RandomParams {
        n: 200,
        seed: 3,
        ..Default::default()
    })
    .expect("generate 200 tasks");
    let model32 = gen::random_model(32, 0.5, 1e8, 3).expect("model");
    let p32 = Platform::from_model(&model32).expect("platform");
    let s = schedule(&small, &p32, Algorithm::HlogpHeft).expect("schedule");
    c.bench_function("predict_200_tasks_32_hosts", |b| {
        b.iter(|| {
            let p = Platform::from_model(black_box(&model32)).expect("platform");
            let pl = s.placement(&small, &p).expect("placement");
            simulate(&small, &p, &pl, SimOptions::default()).expect("simulate")
        })
    });
    c.bench_function("hlogp_heft_200_tasks_32_hosts", |b| {
        b.iter(|| schedule(black_box(&small), &p32, Algorithm::HlogpHeft).expect("schedule"))
    });
}

criterion_group!(sched_benches, benches);
criterion_main!(sched_benches);
