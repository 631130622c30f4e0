//! One-shot timings of the issue's speed targets: wall clock and this process's CPU time (from
//! `/proc/self/schedstat`, Linux), one run each. On a shared, overloaded machine the CPU time is
//! the meaningful figure; the criterion bench `benches/sched.rs` measures wall time.
//!
//! ```text
//! cargo run --release -p mutirao-sched --example speed
//! ```

use mutirao_sched::gen::{self, RandomParams};
use mutirao_sched::platform::Platform;
use mutirao_sched::sched::{schedule, Algorithm};
use mutirao_sched::sim::{simulate, Placement, SimOptions};
use std::time::Instant;

/// Nanoseconds this process has run on a CPU, if the kernel reports it.
fn cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// Task `i` on host `i mod hosts`, each host running its tasks in topological order.
fn round_robin(dag: &mutirao_sched::Dag, hosts: usize) -> Placement {
    let n = dag.len();
    let mut pos = vec![0usize; n];
    for (i, &v) in dag.topo_order().iter().enumerate() {
        pos[v] = i;
    }
    Placement {
        host: (0..n).map(|v| v % hosts).collect(),
        start: pos.iter().map(|&p| p as f64).collect(),
        seq: pos,
    }
}

struct Clock(Instant, Option<u64>);

impl Clock {
    fn start() -> Self {
        Clock(Instant::now(), cpu_ns())
    }
    fn show(&self) -> String {
        let wall = self.0.elapsed().as_secs_f64();
        match (self.1, cpu_ns()) {
            (Some(a), Some(b)) => format!("wall {wall:.3} s, cpu {:.3} s", (b - a) as f64 * 1e-9),
            _ => format!("wall {wall:.3} s"),
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let p64 = Platform::from_model(&gen::random_model(64, 0.5, 1e8, 1)?)?;
    let t = Clock::start();
    let big = gen::random(&RandomParams {
        n: 1_000_000,
        out_degree: 3,
        seed: 1,
        ..Default::default()
    })?;
    println!(
        "generate 1e6 tasks, {} edges: {}",
        big.edges().len(),
        t.show()
    );
    let pl = round_robin(&big, 64);
    let t = Clock::start();
    let r = simulate(&big, &p64, &pl, SimOptions::default())?;
    println!(
        "simulate 1e6 tasks on 64 hosts: {} (makespan {:.1} s)",
        t.show(),
        r.makespan_s
    );
    let mid = gen::random(&RandomParams {
        n: 10_000,
        out_degree: 3,
        seed: 2,
        ..Default::default()
    })?;
    for algo in Algorithm::ALL {
        let t = Clock::start();
        let s = schedule(&mid, &p64, algo)?;
        println!(
            "{} on 1e4 tasks, 64 hosts: {} (makespan {:.1} s)",
            algo.as_str(),
            t.show(),
            s.makespan_s
        );
    }
    // Contention: the bench's platform (64 hosts on 4 sites, 1 Gbit/s NICs and site links), a
    // round-robin placement, growing graphs until one takes over 5 s.
    let pc = Platform::from_model(&gen::with_sites_and_capacities(
        gen::random_model(64, 0.5, 1e8, 1)?,
        4,
        1000.0,
    ))?;
    for n in [1_000usize, 10_000, 100_000, 1_000_000] {
        let g = gen::random(&RandomParams {
            n,
            out_degree: 3,
            seed: 1,
            ..Default::default()
        })?;
        let pl = round_robin(&g, 64);
        let t = Clock::start();
        let r = simulate(
            &g,
            &pc,
            &pl,
            SimOptions {
                contention: true,
                ..SimOptions::default()
            },
        )?;
        let wall = t.0.elapsed().as_secs_f64();
        println!(
            "simulate {n} tasks with contention, 64 hosts on 4 sites: {} (makespan {:.1} s)",
            t.show(),
            r.makespan_s
        );
        if wall > 5.0 {
            println!("  (stopping: over 5 s)");
            break;
        }
    }
    let small = gen::random(&RandomParams {
        n: 200,
        seed: 3,
        ..Default::default()
    })?;
    let model32 = gen::random_model(32, 0.5, 1e8, 3)?;
    let s = schedule(
        &small,
        &Platform::from_model(&model32)?,
        Algorithm::HlogpHeft,
    )?;
    let t = Clock::start();
    let p32 = Platform::from_model(&model32)?;
    let pl = s.placement(&small, &p32)?;
    let r = simulate(&small, &p32, &pl, SimOptions::default())?;
    println!(
        "predict 200 tasks on 32 hosts (resolve model, check schedule, simulate): {} (makespan {:.1} s)",
        t.show(),
        r.makespan_s
    );
    Ok(())
}
