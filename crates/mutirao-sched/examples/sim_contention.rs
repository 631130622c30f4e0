//! The contention benchmark's simulation alone, once, with its CPU time (from
//! `/proc/self/schedstat`, Linux) — for profiling (`perf record`, `valgrind --tool=callgrind`)
//! and for before/after timings on a loaded machine, where the CPU time is the figure that
//! means something. Same graph and platform as `benches/sched.rs`'s
//! `simulate_1e6_tasks_contention`: random layered graph (fan-out ≤ 4), 64 hosts on 4 sites,
//! 1 Gbit/s NICs and site links, round-robin placement.
//!
//! ```text
//! cargo run --release -p mutirao-sched --example sim_contention [TASKS]   # default 1000000
//! ```

use mutirao_sched::gen::{self, RandomParams};
use mutirao_sched::platform::Platform;
use mutirao_sched::sim::{simulate, Placement, SimOptions};
use std::time::Instant;

/// Nanoseconds this process has run on a CPU, if the kernel reports it.
fn cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = match std::env::args().nth(1) {
        Some(a) => a
            .parse()
            .map_err(|e| format!("TASKS must be a whole number, not {a:?}: {e}"))?,
        None => 1_000_000,
    };
    let platform = Platform::from_model(&gen::with_sites_and_capacities(
        gen::random_model(64, 0.5, 1e8, 1)?,
        4,
        1000.0,
    ))?;
    let dag = gen::random(&RandomParams {
        n,
        out_degree: 3,
        seed: 1,
        ..Default::default()
    })?;
    let mut pos = vec![0usize; dag.len()];
    for (i, &v) in dag.topo_order().iter().enumerate() {
        pos[v] = i;
    }
    let placement = Placement {
        host: (0..dag.len()).map(|v| v % 64).collect(),
        start: pos.iter().map(|&p| p as f64).collect(),
        seq: pos,
    };
    let (wall, cpu) = (Instant::now(), cpu_ns());
    let r = simulate(
        &dag,
        &platform,
        &placement,
        SimOptions {
            contention: true,
            ..SimOptions::default()
        },
    )?;
    let wall = wall.elapsed().as_secs_f64();
    match (cpu, cpu_ns()) {
        (Some(a), Some(b)) => println!(
            "simulate {n} tasks with contention: wall {wall:.3} s, cpu {:.3} s (makespan {:.6} s)",
            (b - a) as f64 * 1e-9,
            r.makespan_s
        ),
        _ => println!(
            "simulate {n} tasks with contention: wall {wall:.3} s (makespan {:.6} s)",
            r.makespan_s
        ),
    }
    Ok(())
}
