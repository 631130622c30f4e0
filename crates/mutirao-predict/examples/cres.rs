//! CRES on this host: time every basic operation × data type and print the machine model in
//! the thesis's Appendix-B format (`inter_<op>_<type>[INDEX]=[lo;hi]`, seconds per operation).
//!
//! Run: `cargo run --release -p mutirao-predict --example cres -- [INDEX [NAME]]`
//! (INDEX defaults to 0, the coordinator; NAME to this host's name).
//!
//! Method: each operation runs in a loop of `N` iterations with its operands passed through
//! `std::hint::black_box` so the compiler can neither fold nor hoist it; the same loop with the
//! same `black_box` traffic but no operation is timed right after, and the difference ÷ N is one
//! sample (clamped at 0). `K` samples per key become an interval with Huerta's construction
//! (keep C = 80 %, narrowest window), as CRES did. `loop_iteration` is the empty loop itself.
//! `W` (a whole-application benchmark, Eq. 3.5) and send costs (a ping-pong with a peer) are
//! not measured here: add `W[INDEX]=…` and `inter_send[…]` lines from those measurements.

use mutirao_predict::interval::from_samples;
use mutirao_predict::machine::{CostKey, Machine, MachineModel};
use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Instant;

const N: u64 = 1_000_000;
const K: usize = 15;
const KEEP_PERCENT: f64 = 80.0;

type Bench = Box<dyn Fn(u64) -> f64>;

fn per_iter(n: u64, mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed().as_secs_f64() / n as f64
}

/// One sample: (loop with the op) − (loop with the same black_box traffic), per iteration.
fn diff(n: u64, op: impl FnMut(), base: impl FnMut()) -> f64 {
    let with = per_iter(n, op);
    let without = per_iter(n, base);
    (with - without).max(0.0)
}

macro_rules! typed {
    ($out:ident, $t:ty, $name:literal) => {{
        let (a, z, one, five) = (7 as $t, 0 as $t, 1 as $t, 5 as $t);
        let base = move || {
            let x = black_box(a);
            black_box(z);
            black_box(x);
        };
        let bin: [(&str, fn($t, $t) -> $t, $t); 5] = [
            ("sum", |x, y| x + y, z),
            ("sub", |x, y| x - y, z),
            ("mpy", |x, y| x * y, one),
            ("div", |x, y| x / y, one),
            ("mod", |x, y| x % y, five),
        ];
        for (op, f, rhs) in bin {
            $out.push((
                format!("{op}_{}", $name),
                Box::new(move |n| {
                    diff(
                        n,
                        || {
                            black_box(f(black_box(a), black_box(rhs)));
                        },
                        base,
                    )
                }) as Bench,
            ));
        }
        $out.push((
            format!("assign_{}", $name),
            Box::new(move |n| {
                let mut slot: $t = z;
                let mut other: $t = z;
                let d = diff(
                    n,
                    || {
                        let p = black_box(&mut slot);
                        *p = black_box(a);
                    },
                    || {
                        black_box(&mut other);
                        black_box(a);
                    },
                );
                black_box(slot);
                d
            }) as Bench,
        ));
    }};
}

fn benches() -> Vec<(String, Bench)> {
    let mut out: Vec<(String, Bench)> = Vec::new();
    typed!(out, i8, "byte");
    typed!(out, i16, "short");
    typed!(out, i32, "int");
    typed!(out, i64, "long");
    typed!(out, f32, "float");
    typed!(out, f64, "double");
    out.push((
        "access".into(),
        Box::new(|n| {
            let slot = 42i32;
            diff(
                n,
                || {
                    black_box(*black_box(&slot));
                },
                || {
                    black_box(black_box(&slot));
                },
            )
        }),
    ));
    out.push((
        "array_access".into(),
        Box::new(|n| {
            let arr = [3i32; 64];
            diff(
                n,
                || {
                    let a = black_box(&arr);
                    black_box(a[black_box(17usize) & 63]);
                },
                || {
                    black_box(&arr);
                    black_box(black_box(17usize) & 63);
                },
            )
        }),
    ));
    out.push((
        "compare".into(),
        Box::new(|n| {
            diff(
                n,
                || {
                    black_box(black_box(3i32) < black_box(5i32));
                },
                || {
                    let x = black_box(3i32);
                    black_box(5i32);
                    black_box(x);
                },
            )
        }),
    ));
    out.push((
        "cast".into(),
        Box::new(|n| {
            diff(
                n,
                || {
                    black_box(black_box(12345i32) as f64);
                },
                || {
                    black_box(black_box(12345i32));
                },
            )
        }),
    ));
    out.push((
        "loop_iteration".into(),
        Box::new(|n| {
            let t = Instant::now();
            for i in 0..n {
                black_box(i);
            }
            t.elapsed().as_secs_f64() / n as f64
        }),
    ));
    out
}

fn main() {
    let mut args = std::env::args().skip(1);
    let index: usize = match args.next().map(|s| s.parse()) {
        None => 0,
        Some(Ok(i)) => i,
        Some(Err(_)) => {
            eprintln!("usage: cres [INDEX [NAME]]  (INDEX is a machine index: 0 = coordinator)");
            std::process::exit(2);
        }
    };
    let name = args.next().or_else(|| {
        std::fs::read_to_string("/etc/hostname")
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    });
    let started = Instant::now();
    let mut costs = BTreeMap::new();
    for (key, bench) in benches() {
        let samples: Vec<f64> = (0..K).map(|_| bench(N)).collect();
        let k: CostKey = match key.parse() {
            Ok(k) => k,
            Err(e) => {
                eprintln!("internal: bad key {key}: {e}");
                std::process::exit(1);
            }
        };
        match from_samples(&samples, KEEP_PERCENT) {
            Ok(iv) => {
                costs.insert(k, iv);
            }
            Err(e) => eprintln!("{key}: no interval ({e})"),
        }
    }
    let mm = MachineModel {
        send_unit_s: 1e-3,
        machines: vec![Machine {
            index,
            name,
            w: None,
            costs,
        }],
        sends: Vec::new(),
    };
    print!("{}", mm.to_appendix_b());
    eprintln!(
        "cres: {} keys, {K} samples of {N} iterations each, C = {KEEP_PERCENT} %, in {:.1} s",
        mm.machines[0].costs.len(),
        started.elapsed().as_secs_f64()
    );
}
