//! Every policy on simulated workers with seed 003's Table 3 speeds: makespan and efficiency
//! (speedup / Σnorm), and the makespan when the fastest worker drops to a third of its speed a
//! quarter of the way through.
//!
//! `cargo run -p mutirao-mw --example policies [TASKS] [TAM_BLOCO]` (defaults 20000 and 40).

use mutirao_mw::config::Config;
use mutirao_mw::sim::{run, SimSpec, SimWorker};
use mutirao_mw::PolicyKind;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let total: u64 = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(20_000);
    let tam: u64 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(40);
    let table3 = [0.983564, 1.0, 0.983497, 0.345583, 0.260023];
    let sum: f64 = table3.iter().sum();
    // 100 tasks/s on the fastest host; a block costs 1 ms to move, a task 0.1 ms.
    let ideal = total as f64 / (100.0 * sum);
    let cfg = Config {
        tam_bloco: tam,
        threshold_min: 90.0,
        threshold_max: 110.0,
        ..Config::default()
    };
    println!("{total} tasks, TAM_BLOCO {tam}, Σnorm {sum:.6}, ideal {ideal:.2} s\n");
    println!(
        "| policy | makespan s | efficiency (speedup / Σnorm) | worker02 slowed: makespan s |"
    );
    println!("|---|---|---|---|");
    for k in PolicyKind::ALL {
        let mut row = format!("| {} ", k.name());
        for slowed in [false, true] {
            let mut workers: Vec<SimWorker> = table3
                .iter()
                .enumerate()
                .map(|(i, &s)| SimWorker::new(i as u32 + 1, s * 100.0))
                .collect();
            if slowed {
                // worker02 (the fastest) drops to a third a quarter of the way through.
                workers[1].slow = Some((ideal / 4.0, 1.0 / 3.0));
            }
            let spec = SimSpec {
                total,
                comm_per_block_s: 0.001,
                comm_per_task_s: 0.0001,
                workers,
                add: Vec::new(),
                perc_cons_add: 100.0,
            };
            let mut p = k.build(&cfg)?;
            for (i, s) in table3.iter().enumerate() {
                p.hint_speed(i as u32 + 1, *s);
            }
            let r = run(p.as_mut(), &spec)?;
            if slowed {
                row += &format!("| {:.2} ", r.makespan_s);
            } else {
                let eff = total as f64 / 100.0 / r.makespan_s / sum;
                row += &format!("| {:.2} | {:.1} % ", r.makespan_s, eff * 100.0);
            }
        }
        println!("{row}|");
    }
    Ok(())
}
