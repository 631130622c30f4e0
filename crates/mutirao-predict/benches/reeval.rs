//! Re-evaluating an already-compiled analytic model for a new host set (digest 001 §7.3 item 9,
//! issue 4 target: < 10 ms).
//!
//! The model is the thesis's Appendix-A Monte Carlo π (100 tasks, with the `codeSize` erratum
//! fixed and 64-byte task data); the machine model is synthetic: a coordinator plus N workers
//! with decreasing W, every op on untyped/int/long/double/obj, and sends measured at two sizes.
//! * `reeval/pi_fastest_32_of_33`: the P = 32 fastest of 33 machines (the thesis's lab size);
//! * `reeval/pi_explicit_8`: an explicit host list;
//! * `reeval/pi_fastest_1000_of_1000`: scale check with 1000 workers;
//! * `compile/pi`: parse + compile, for comparison;
//! * `pipeline/pi_flow_source_32`: the whole pipeline of digest 001 §7.3 item 8 — parse the PASL
//!   flow, analyse the Rust task source, generate the model (AMGen), parse, compile and
//!   evaluate on the 32 fastest of 33 machines (target < 1 s, goal < 100 ms).
//!
//! Run: `cargo bench -p mutirao-predict --bench reeval`.

use criterion::{criterion_group, criterion_main, Criterion};
use mutirao_predict::amgen::{generate, BatchCost};
use mutirao_predict::analyse::analyse;
use mutirao_predict::analytic::{self, Policy, Selection};
use mutirao_predict::interval::Interval;
use mutirao_predict::machine::{CostKey, Machine, MachineModel, Op, SendPoint};
use mutirao_predict::{pamela, pasl};
use std::collections::BTreeMap;
use std::hint::black_box;

fn pi_model() -> String {
    include_str!("../tests/data/pi_appendix_a3.pamela").replace(
        "codeSize(task[2,0])=879;",
        "codeSize(task[1,0])=879;\ndataSizeIn(task[1,0])=64;\ndataSizeOut(task[1,0])=64;",
    )
}

fn machines(workers: usize) -> MachineModel {
    let mut ms = Vec::new();
    let mut sends = Vec::new();
    for i in 0..=workers {
        let slow = 1.0 + i as f64 / workers as f64;
        let mut costs = BTreeMap::new();
        let mut names: Vec<String> = Vec::new();
        for op in Op::NAMES {
            names.push(op.to_string());
            for ty in ["int", "long", "double", "obj"] {
                names.push(format!("{op}_{ty}"));
            }
        }
        for (k, name) in names.iter().enumerate() {
            let key: CostKey = name.parse().expect("known key");
            let lo = 1e-10 * (1.0 + (k % 20) as f64) * slow;
            costs.insert(key, Interval::new(lo, lo * 1.05).expect("lo <= hi"));
        }
        ms.push(Machine {
            index: i,
            name: None,
            w: (i > 0).then(|| 1.0 / slow),
            costs,
        });
        if i > 0 {
            for (from, to) in [(0, i), (i, 0)] {
                for (size, ms_lo) in [(64.0, 8.0), (65536.0, 60.0)] {
                    sends.push(SendPoint {
                        from,
                        to,
                        size,
                        cost: Interval::new(ms_lo, ms_lo * 2.0).expect("lo <= hi"),
                    });
                }
            }
        }
    }
    MachineModel {
        send_unit_s: 1e-3,
        machines: ms,
        sends,
    }
}

const FLOW: &str = "path = \"PIMonteCarlo\";
B1 = \"DistributeData.class\";
B2 = \"ProcessData.class\";
B3 = \"GatherResults.class\";
%%
T1 = B1(1) << NULL;
T2 = B2(200) << T1;
T3 = B3(1) << T2;
";

const SOURCE: &str = "
const TASKS: i32 = 200;
fn distribute() { let mut limits = [0i32; 200]; for i in 0..TASKS { limits[i] = 10000000; } }
fn rand01(state: i64) -> f64 { ((state * 1103515245 + 12345) % 2147483648) as f64 / 2147483648.0 }
fn process(limit: i32) -> i32 {
    let mut total: i32 = 0;
    let mut seed: i64 = 1;
    for _i in 0..limit {
        let x: f64 = rand01(seed);
        seed += 1;
        let y: f64 = rand01(seed);
        seed += 1;
        if x * x + y * y < 1.0 { total += 1; }
    }
    total
}
fn work() -> i32 { process(10000000) }
fn gather() { let mut total: i64 = 0; for i in 0..TASKS { total += 1; } }
";

fn pipeline(mm: &MachineModel) -> f64 {
    let dag = pasl::parse(FLOW)
        .expect("flow")
        .dag(&Default::default())
        .expect("dag");
    let cost = |f: &str| BatchCost {
        taskrun: analyse(SOURCE, f, &[]).expect("analyses").to_pamela(),
        code_size: 879.0,
        data_in: 64.0,
        data_out: 64.0,
    };
    let text =
        generate(&dag, &[cost("distribute"), cost("work"), cost("gather")]).expect("generates");
    let compiled = analytic::compile(&pamela::parse(&text).expect("parses")).expect("compiles");
    analytic::evaluate(&compiled, mm, &Selection::Fastest(32), Policy::Worst)
        .expect("evaluates")
        .interval
        .hi
}

fn benches(c: &mut Criterion) {
    let text = pi_model();
    let compiled = analytic::compile(&pamela::parse(&text).expect("parses")).expect("compiles");
    let m33 = machines(32);
    let m1000 = machines(1000);
    let mut g = c.benchmark_group("reeval");
    g.bench_function("pi_fastest_32_of_33", |b| {
        b.iter(|| {
            analytic::evaluate(
                black_box(&compiled),
                &m33,
                &Selection::Fastest(32),
                Policy::Worst,
            )
            .expect("evaluates")
        })
    });
    g.bench_function("pi_explicit_8", |b| {
        let sel = Selection::Explicit(vec![3, 1, 4, 15, 9, 2, 6, 5]);
        b.iter(|| {
            analytic::evaluate(black_box(&compiled), &m33, &sel, Policy::Worst).expect("evaluates")
        })
    });
    g.sample_size(20);
    g.bench_function("pi_fastest_1000_of_1000", |b| {
        b.iter(|| {
            analytic::evaluate(
                black_box(&compiled),
                &m1000,
                &Selection::Fastest(1000),
                Policy::Worst,
            )
            .expect("evaluates")
        })
    });
    g.finish();
    c.bench_function("pipeline/pi_flow_source_32", |b| {
        b.iter(|| pipeline(black_box(&m33)))
    });
    c.bench_function("compile/pi", |b| {
        b.iter(|| {
            analytic::compile(&pamela::parse(black_box(&text)).expect("parses")).expect("compiles")
        })
    });
}

criterion_group!(reeval, benches);
criterion_main!(reeval);
