//! Master/worker applications over `mutirao run`, any policy: matrix multiplication (a task is
//! one row of C), a primes count, and Mandelbrot; each checks its result against a serial
//! computation (all of it for primes; up to 64 rows spread over the matrix or image otherwise).
//! The last line is `… elapsed_s=T`, the master's time from the first hand-out to the last result.
//!
//! ```text
//! cargo build --release -p mutirao-mw --example mw
//! mutirao run -n 5 target/release/examples/mw matmul --n 300 --policy hnow --table
//! mutirao run -n 4 target/release/examples/mw primes --n 2000000 --policy join
//! mutirao run -n 4 target/release/examples/mw mandelbrot --n 600 --policy awf --log mw.jsonl
//! ```
//!
//! Options: `--policy static|hnow|hnow-improved|join|gss|awf|steal` (default hnow),
//! `--n N` (problem size), `--tam T` (TAM_BLOCO, default 10), `--config FILE` (the repository's
//! KEY=VALUE file; `--tam` overrides it), `--log FILE` (append the JSON-lines repository log),
//! `--table` (print the per-iteration table and the measurement algorithm's proposals),
//! `--add N --add-at PCT` (WORKERS_ADD, PERC_CONS_ADD: spawn N more workers once PCT % of the
//! tasks are done — HNOW's dynamic inclusion; needs a launcher that spawns, `mutirao run`).
//! Every rank builds A and B from the same seed (B is "broadcast" by construction); the rows of
//! C travel back as 64-bit integers, so the result is bit-exact.

use mutirao_mw::{driver, measure, Config, PolicyKind};
use std::io::Write;

const USAGE: &str = "usage: mw (matmul|primes|mandelbrot) [--n N] [--policy P] [--tam T] [--config FILE] [--log FILE] [--table] [--add N] [--add-at PCT]
  run it under the launcher: mutirao run -n 4 target/release/examples/mw matmul --n 300";

struct Opts {
    app: String,
    n: u64,
    policy: PolicyKind,
    cfg: Config,
    log: Option<String>,
    table: bool,
}

fn parse() -> Result<Opts, String> {
    let mut a = std::env::args().skip(1);
    let app = a.next().ok_or(USAGE)?;
    if app == "--help" || app == "-h" {
        return Err(USAGE.into());
    }
    let mut o = Opts {
        n: match app.as_str() {
            "matmul" => 300,
            "primes" => 1_000_000,
            "mandelbrot" => 400,
            _ => return Err(format!("unknown application {app:?}\n{USAGE}")),
        },
        app,
        policy: PolicyKind::Hnow,
        cfg: Config::default(),
        log: None,
        table: false,
    };
    let mut tam = None;
    while let Some(k) = a.next() {
        let mut v = || a.next().ok_or(format!("{k} needs a value\n{USAGE}"));
        match k.as_str() {
            "--n" => o.n = v()?.parse().map_err(|_| "--n: not a number".to_string())?,
            "--policy" => o.policy = v()?.parse().map_err(|e: mutirao_mw::Error| e.to_string())?,
            "--tam" => {
                tam = Some(
                    v()?.parse::<u64>()
                        .map_err(|_| "--tam: not a number".to_string())?,
                )
            }
            "--config" => {
                let f = v()?;
                let text = std::fs::read_to_string(&f).map_err(|e| format!("{f}: {e}"))?;
                o.cfg = Config::parse(&text).map_err(|e| format!("{f}: {e}"))?;
            }
            "--log" => o.log = Some(v()?),
            "--add" => {
                o.cfg.workers_add = v()?
                    .parse()
                    .map_err(|_| "--add: not a number".to_string())?
            }
            "--add-at" => {
                o.cfg.perc_cons_add = v()?
                    .parse()
                    .map_err(|_| "--add-at: not a number".to_string())?
            }
            "--table" => o.table = true,
            "--help" | "-h" => return Err(USAGE.into()),
            other => return Err(format!("unknown option {other:?}\n{USAGE}")),
        }
    }
    if let Some(t) = tam {
        o.cfg.tam_bloco = t;
    }
    o.cfg.validate().map_err(|e| e.to_string())?;
    Ok(o)
}

fn lcg(seed: u64, i: u64) -> i64 {
    let x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(i.wrapping_mul(1442695040888963407));
    ((x >> 33) % 19) as i64 - 9
}

/// A block's computation: (first task, tasks) → result bytes.
type Task = Box<dyn FnMut(u64, u64) -> Vec<u8>>;

/// The number of tasks and the task function.
fn app(o: &Opts) -> (u64, Task) {
    let n = o.n;
    match o.app.as_str() {
        "matmul" => {
            let a: Vec<i64> = (0..n * n).map(|i| lcg(1, i)).collect();
            let b: Vec<i64> = (0..n * n).map(|i| lcg(2, i)).collect();
            (
                n,
                Box::new(move |first, len| {
                    let mut out = Vec::with_capacity((len * n * 8) as usize);
                    for i in first..first + len {
                        for j in 0..n {
                            let mut s = 0i64;
                            for k in 0..n {
                                s += a[(i * n + k) as usize] * b[(k * n + j) as usize];
                            }
                            out.extend_from_slice(&s.to_le_bytes());
                        }
                    }
                    out
                }),
            )
        }
        "primes" => {
            // Tasks are ranges of 1000 numbers below n.
            let tasks = n.div_ceil(1000);
            (
                tasks,
                Box::new(move |first, len| {
                    let lo = first * 1000;
                    let hi = ((first + len) * 1000).min(n);
                    let c = (lo..hi).filter(|&x| is_prime(x)).count() as u64;
                    c.to_le_bytes().to_vec()
                }),
            )
        }
        _ => (
            n,
            Box::new(move |first, len| {
                // Rows of an n × n image of [-2, 1] × [-1.5, 1.5], 500 iterations at most.
                let mut out = Vec::with_capacity((len * n * 2) as usize);
                for y in first..first + len {
                    for x in 0..n {
                        let (cr, ci) = (
                            -2.0 + 3.0 * x as f64 / n as f64,
                            -1.5 + 3.0 * y as f64 / n as f64,
                        );
                        let (mut zr, mut zi, mut k) = (0.0f64, 0.0f64, 0u16);
                        while k < 500 && zr * zr + zi * zi <= 4.0 {
                            (zr, zi) = (zr * zr - zi * zi + cr, 2.0 * zr * zi + ci);
                            k += 1;
                        }
                        out.extend_from_slice(&k.to_le_bytes());
                    }
                }
                out
            }),
        ),
    }
}

fn is_prime(x: u64) -> bool {
    if x < 2 {
        return false;
    }
    let mut d = 2;
    while d * d <= x {
        if x % d == 0 {
            return false;
        }
        d += 1;
    }
    true
}

fn main() {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&o) {
        eprintln!("mw: {e}");
        std::process::exit(1);
    }
}

fn run(o: &Opts) -> Result<(), Box<dyn std::error::Error>> {
    let world = mutirao::init()?;
    let (tasks, mut task) = app(o);
    if world.is_spawned() {
        // A worker added while the job runs: the master is rank 0 of `world` (the merged
        // communicator of the spawn).
        driver::worker(&world, &mut *task)?;
        world.finalize()?;
        return Ok(());
    }
    if world.size() < 2 {
        return Err("a master/worker run needs at least 2 ranks: mutirao run -n 4 …".into());
    }
    // Workers the master lost (their death is normal, not an error of the job).
    let mut lost: Vec<usize> = Vec::new();
    if world.rank() == 0 {
        let mut policy = o.policy.build(&o.cfg)?;
        let per_task = match o.app.as_str() {
            "matmul" => o.n * 8,
            "mandelbrot" => o.n * 2,
            _ => 8,
        } as usize;
        let mut result: Vec<u8> = vec![
            0;
            if o.app == "primes" {
                0
            } else {
                tasks as usize * per_task
            }
        ];
        let mut primes = 0u64;
        let mut log: Vec<u8> = Vec::new();
        // Dynamic inclusion (HNOW): WORKERS_ADD more workers of this program once
        // PERC_CONS_ADD % of the tasks are done; a spawn that fails leaves the job as it is.
        let mut added: Vec<mutirao::Spawned> = Vec::new();
        let mut tried = o.cfg.workers_add == 0;
        let mut grow = |done: u64, total: u64| -> Vec<driver::Joined> {
            if tried || (done as f64) * 100.0 < o.cfg.perc_cons_add * total as f64 {
                return Vec::new();
            }
            tried = true;
            let spec =
                mutirao::SpawnSpec::new(o.cfg.workers_add as usize).args(std::env::args().skip(1));
            match world.spawn(&spec) {
                Ok(s) => {
                    let lat = s.elapsed.as_secs_f64();
                    let joined = (1..s.comm.size())
                        .map(|r| driver::Joined {
                            comm: s.comm.clone(),
                            rank: r,
                            host: s
                                .latency
                                .get((r - 1).min(s.latency.len().saturating_sub(1)))
                                .map(|(h, _)| h.clone())
                                .unwrap_or_default(),
                            spawn_latency_s: lat,
                        })
                        .collect();
                    eprintln!(
                        "mw: {} worker(s) added at {done}/{total} tasks in {:.1} ms",
                        s.comm.size() - 1,
                        lat * 1e3
                    );
                    added.push(s);
                    joined
                }
                Err(e) => {
                    eprintln!("mw: no workers added ({e}); going on with those there are");
                    Vec::new()
                }
            }
        };
        let rep = driver::master_growing(
            &world,
            policy.as_mut(),
            tasks,
            &mut |first, len, bytes: &[u8]| {
                if o.app == "primes" {
                    primes += u64::from_le_bytes(bytes.try_into().unwrap_or([0; 8]));
                } else {
                    let at = first as usize * per_task;
                    let end = (at + bytes.len()).min(result.len());
                    debug_assert_eq!(bytes.len(), len as usize * per_task);
                    result[at..end].copy_from_slice(&bytes[..end - at]);
                }
            },
            Some(&mut log),
            Some(&mut grow),
        )?;
        // The added workers' finalize is a barrier on their spawn communicator.
        for s in &added {
            s.comm.barrier()?;
        }
        // Check against a serial computation on the master: everything for primes, up to 64
        // rows spread over the image or matrix otherwise (a whole serial product of a large
        // matrix would take longer than the parallel run).
        let t = std::time::Instant::now();
        let ok = if o.app == "primes" {
            let serial = task(0, tasks);
            primes == u64::from_le_bytes(serial[..8].try_into()?)
        } else {
            let step = tasks.div_ceil(64).max(1);
            (0..tasks).step_by(step as usize).all(|r| {
                let row = task(r, 1);
                result[r as usize * per_task..(r as usize + 1) * per_task] == row[..]
            })
        };
        let serial_s = t.elapsed().as_secs_f64();
        println!(
            "{} n={} policy={} ranks={}: {} tasks in {:.3} s (check on the master {:.3} s), per worker {:?}{}; result {}",
            o.app,
            o.n,
            o.policy.name(),
            world.size(),
            rep.tasks,
            rep.elapsed_s,
            serial_s,
            rep.per_worker,
            if rep.lost.is_empty() { String::new() } else { format!(", lost {:?}", rep.lost) },
            if ok { "correct" } else { "WRONG" }
        );
        println!("elapsed_s={:.6}", rep.elapsed_s);
        lost = rep.lost.iter().map(|&w| w as usize).collect();
        if let Some(f) = &o.log {
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(f)?;
            file.write_all(&log)?;
            file.sync_all()?;
        }
        if o.table {
            let records = mutirao_mw::log::parse(std::str::from_utf8(&log)?)?;
            match measure::analyse(&records, o.cfg.tam_bloco) {
                Ok(a) => {
                    println!(
                        "| iteration | workers | tasks | worst t_comp s | max/min | comm share |"
                    );
                    println!("|---|---|---|---|---|---|");
                    for i in &a.iterations {
                        println!(
                            "| {} | {} | {} | {:.4} | {:.2} | {:.1} % |",
                            i.iteration,
                            i.workers,
                            i.tasks,
                            i.worst_s,
                            i.imbalance,
                            i.comm_share * 100.0
                        );
                    }
                    println!(
                        "AM proposes TAM_BLOCO={} THRESHOLD_MIN={:.0} THRESHOLD_MAX={:.0} (characterization took {:.1} % of the run)",
                        a.propose_tam_bloco,
                        a.propose_threshold_min,
                        a.propose_threshold_max,
                        a.characterization_share * 100.0
                    );
                }
                Err(e) => println!("(no per-iteration table: {e})"),
            }
        }
        if !ok {
            let _ = finalize(world, &lost);
            std::process::exit(3);
        }
    } else {
        driver::worker(&world, &mut *task)?;
    }
    finalize(world, &lost)
}

/// Finalize, where a worker the master already lost may be reported dead again: that is the
/// scenario `mutirao run --continue-on-failure` is for, not an error.
fn finalize(world: mutirao::Comm, lost: &[usize]) -> Result<(), Box<dyn std::error::Error>> {
    match world.finalize() {
        Err(mutirao::Error::PeerFailed { rank, .. }) if lost.contains(&rank) => Ok(()),
        r => Ok(r?),
    }
}
