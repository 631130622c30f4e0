//! Monte Carlo π in PeMPSys's master/worker form (JoiN's coordinator and workers, digest 001
//! §2.7): rank 0 is the coordinator, ranks 1..=P the workers. The coordinator sends every task
//! its input (a seed) — each worker's static share of the TASKS tasks — and gathers one result
//! per task; each task throws `SAMPLES` darts.
//!
//!     mutirao run -n 5 target/release/examples/pi_tasks 100 [S1,S2,S3,S4]
//!
//! TASKS is the number of tasks; S1,…,SP the workers' shares (default: equal shares, the first
//! workers one more). `mutirao predict` prints the static shares of a machine model's workers
//! (`shares of 100 tasks: […]`); pass them here to run what it predicts.
//!
//! Prints `pi_tasks tasks=… samples=… workers=… shares=… estimate=… error=… elapsed_s=…`,
//! where `elapsed_s` is the coordinator's time from a barrier after start-up to the last
//! result (the application, without the launcher's start-up). Exits 1 if the estimate is
//! further than 6 standard deviations from π.
//!
//! The task functions (`distribute`, `task`, `gather`) are written in the subset of Rust that
//! `mutirao predict analyse` counts (constant-bound loops, no method calls), so the model of
//! this program is generated from this file:
//!
//!     mutirao predict generate crates/mutirao/examples/pi_tasks.pasl \
//!         --source crates/mutirao/examples/pi_tasks.rs --card tasks=100 \
//!         --task T1=distribute --task T2=task:in=8:out=16:code=0 --task T3=gather -o pi.pamela

/// Darts per task.
const SAMPLES: u64 = 1_200_000;
/// 2^-53: a 53-bit integer times this is uniform in [0, 1).
const SCALE: f64 = 1.0 / 9007199254740992.0;

/// The coordinator's batch before the tasks: the total number of darts.
fn distribute(tasks: u64) -> u64 {
    tasks * SAMPLES
}

/// One task: `SAMPLES` darts from the xorshift64 stream started at `seed` (non-zero); returns
/// how many fell inside the quarter circle.
fn task(seed: u64) -> u64 {
    let mut s: u64 = seed;
    let mut hits: u64 = 0;
    for _i in 0..SAMPLES {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let x: f64 = (s >> 11) as f64 * SCALE;
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let y: f64 = (s >> 11) as f64 * SCALE;
        if x * x + y * y <= 1.0 {
            hits += 1;
        }
    }
    hits
}

/// The coordinator's batch after the tasks: the estimate from all hits.
fn gather(hits: u64, darts: u64) -> f64 {
    4.0 * hits as f64 / darts as f64
}

/// Task `t`'s seed: distinct, non-zero, far apart in the stream's state space.
fn seed_of(t: u64) -> u64 {
    (t + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}

fn shares(arg: Option<&str>, tasks: u64, workers: u64) -> Result<Vec<u64>, String> {
    match arg {
        None => Ok((0..workers)
            .map(|i| tasks / workers + u64::from(i < tasks % workers))
            .collect()),
        Some(s) => {
            let v: Vec<u64> = s
                .split(',')
                .map(|x| x.trim().parse::<u64>())
                .collect::<Result<_, _>>()
                .map_err(|e| format!("shares `{s}`: {e}; give one count per worker, e.g. 30,20"))?;
            if v.len() as u64 != workers {
                return Err(format!(
                    "{} shares for {workers} workers; give one per worker (ranks 1..{workers})",
                    v.len()
                ));
            }
            if v.iter().sum::<u64>() != tasks {
                return Err(format!(
                    "shares {s} sum to {}, not to the {tasks} tasks",
                    v.iter().sum::<u64>()
                ));
            }
            Ok(v)
        }
    }
}

fn main() -> Result<(), mutirao::Error> {
    let world = mutirao::init()?;
    let (rank, size) = (world.rank(), world.size());
    let args: Vec<String> = std::env::args().collect();
    let fail = |msg: String| -> ! {
        if rank == 0 {
            eprintln!("pi_tasks: {msg}");
        }
        std::process::exit(2)
    };
    if size < 2 {
        fail("needs a coordinator and at least one worker: mutirao run -n 2 or more".into());
    }
    let tasks: u64 = match args.get(1).map(|a| a.parse()) {
        Some(Ok(t)) if t > 0 => t,
        None => 100,
        _ => fail(format!("TASKS `{}` is not a positive count", args[1])),
    };
    let workers = (size - 1) as u64;
    let share = shares(args.get(2).map(String::as_str), tasks, workers).unwrap_or_else(|e| fail(e));
    world.barrier()?;
    let t0 = std::time::Instant::now();
    if rank == 0 {
        let darts = distribute(tasks);
        let mut t = 0u64;
        for (w, &n) in share.iter().enumerate() {
            for _ in 0..n {
                world.send(&[seed_of(t)], w + 1, 1)?;
                t += 1;
            }
        }
        let mut hits = 0u64;
        for _ in 0..tasks {
            let mut r = [0u64; 2];
            world.recv(&mut r, mutirao::ANY_SOURCE, 2)?;
            hits += r[1];
        }
        let est = gather(hits, darts);
        let elapsed = t0.elapsed().as_secs_f64();
        let p = std::f64::consts::PI;
        let sigma = 4.0 * ((p / 4.0) * (1.0 - p / 4.0) / darts as f64).sqrt();
        let err = (est - p).abs();
        let list: Vec<String> = share.iter().map(u64::to_string).collect();
        println!(
            "pi_tasks tasks={tasks} samples={darts} workers={workers} shares={} estimate={est:.8} error={err:.2e} elapsed_s={elapsed:.6}",
            list.join(",")
        );
        if err > 6.0 * sigma {
            eprintln!(
                "pi_tasks: estimate is {:.1} standard deviations off",
                err / sigma
            );
            std::process::exit(1);
        }
    } else {
        for _ in 0..share[rank - 1] {
            let mut seed = [0u64];
            world.recv(&mut seed, 0, 1)?;
            let hits = task(seed[0]);
            world.send(&[seed[0], hits], 0, 2)?;
        }
    }
    world.finalize()
}
