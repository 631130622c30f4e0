//! Scheduler quality: average SLR, speedup and efficiency over seeded random graphs, and the
//! overhead-dominated diamond check.
//!
//! ```text
//! cargo run --release -p mutirao-sched --example slr_table [GRAPHS]
//! ```
//!
//! Each graph is a Topcuoglu random layered graph (v ∈ {20, 40, 60, 80, 100},
//! CCR ∈ {0.1, 0.5, 1, 5, 10}, α ∈ {0.5, 1, 2}, out-degree ∈ {1..5}, β ∈ {0.1, 0.25, 0.5, 0.75, 1},
//! hosts ∈ {4, 8, 16}, all drawn from the graph's seed) on `gen::random_model`. Every schedule is
//! evaluated twice: by the algorithm's own estimate and by the HLogP simulator (overheads block
//! the CPU), which is the fair judge for all four.

use mutirao_model::presets::gridrio2004;
use mutirao_sched::gen::{self, RandomParams};
use mutirao_sched::platform::Platform;
use mutirao_sched::sched::{metrics, schedule, Algorithm};
use mutirao_sched::sim::{simulate, CommMode, SimOptions};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let graphs: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(1000);
    let algos = Algorithm::ALL;
    let mut own_slr = [0.0f64; 4];
    let mut sim_slr = [0.0f64; 4];
    let mut speedup = [0.0f64; 4];
    let mut eff = [0.0f64; 4];
    let mut best = [0usize; 4];
    for g in 0..graphs {
        let mut rng = ChaCha8Rng::seed_from_u64(g as u64);
        let pick = |rng: &mut ChaCha8Rng, xs: &[f64]| xs[rng.gen_range(0..xs.len())];
        let p = RandomParams {
            n: [20, 40, 60, 80, 100][rng.gen_range(0..5)],
            ccr: pick(&mut rng, &[0.1, 0.5, 1.0, 5.0, 10.0]),
            alpha: pick(&mut rng, &[0.5, 1.0, 2.0]),
            out_degree: rng.gen_range(1..=5),
            mean_work: 1.0,
            bytes_per_s: 1.0e8,
            seed: g as u64,
        };
        let beta = pick(&mut rng, &[0.1, 0.25, 0.5, 0.75, 1.0]);
        let hosts = [4, 8, 16][rng.gen_range(0..3)];
        let dag = gen::random(&p)?;
        let platform = Platform::from_model(&gen::random_model(hosts, beta, 1.0e8, g as u64)?)?;
        let mut sims = [0.0f64; 4];
        for (i, &a) in algos.iter().enumerate() {
            let s = schedule(&dag, &platform, a)?;
            let pl = s.placement(&dag, &platform)?;
            let r = simulate(&dag, &platform, &pl, SimOptions::default())?;
            own_slr[i] += metrics(&dag, &platform, s.makespan_s).slr;
            let m = metrics(&dag, &platform, r.makespan_s);
            sim_slr[i] += m.slr;
            speedup[i] += m.speedup;
            eff[i] += m.efficiency;
            sims[i] = r.makespan_s;
        }
        let min = sims.iter().copied().fold(f64::INFINITY, f64::min);
        for i in 0..4 {
            if sims[i] <= min * (1.0 + 1e-12) {
                best[i] += 1;
            }
        }
    }
    let n = graphs as f64;
    println!("Average over {graphs} seeded random graphs (HEFT-paper metrics)");
    println!(
        "{:<12} {:>10} {:>10} {:>10} {:>10} {:>8}",
        "algorithm", "SLR(own)", "SLR(HLogP)", "speedup", "efficiency", "best"
    );
    for (i, a) in algos.iter().enumerate() {
        println!(
            "{:<12} {:>10.3} {:>10.3} {:>10.3} {:>10.3} {:>8}",
            a.as_str(),
            own_slr[i] / n,
            sim_slr[i] / n,
            speedup[i] / n,
            eff[i] / n,
            best[i]
        );
    }
    println!("(SLR(own): the algorithm's own estimate; SLR(HLogP), speedup, efficiency: HLogP simulator;");
    println!(" best: graphs where the algorithm's HLogP-simulated makespan was the lowest, ties counted)");

    println!();
    println!("Overhead-dominated check: 5x5 diamond, 4 MiB edges, preset gridrio2004");
    println!(
        "{:<8} {:<12} {:>14} {:>14} {:>14}",
        "work_s", "algorithm", "own (s)", "HLogP sim (s)", "latency sim (s)"
    );
    let platform = Platform::from_model(&gridrio2004())?;
    for work in [0.5, 2.0, 5.0] {
        let dag = gen::diamond(5, work, 4 << 20)?;
        for a in algos {
            let s = schedule(&dag, &platform, a)?;
            let pl = s.placement(&dag, &platform)?;
            let h = simulate(&dag, &platform, &pl, SimOptions::default())?;
            let l = simulate(
                &dag,
                &platform,
                &pl,
                SimOptions {
                    comm: CommMode::LatencyOnly,
                    ..Default::default()
                },
            )?;
            println!(
                "{:<8} {:<12} {:>14.3} {:>14.3} {:>14.3}",
                work,
                a.as_str(),
                s.makespan_s,
                h.makespan_s,
                l.makespan_s
            );
        }
    }
    Ok(())
}
