//! Spawn: a running job adds ranks (issue 13; docs/spawn.md).
//!
//! Under a launcher that can spawn, rank 0 asks for `N` more ranks of this program (`--add N`,
//! default 4) `--rounds R` times (default 10); each child sends one message to the parent as
//! soon as it is up. Rank 0 prints, per round, the time from its request to the first child
//! message, the spawn call's time and the per-host latency, then min/median/max.
//!
//! Run alone (no launcher), it is its own harness: it starts 4 ranks of itself on this host
//! through `mutirao::local_job` (whose bootstrap server spawns) and prints rank 0's report —
//! the benchmark of "4 ranks added to a running 4-rank job, request → first message":
//!
//! ```text
//! cargo run --release -p mutirao --example spawn            # 4 + 4, 10 rounds
//! cargo run --release -p mutirao --example spawn -- --add 2 --rounds 3
//! ```

use mutirao::local_job::LocalJob;
use mutirao::{Comm, SpawnSpec, ANY_SOURCE};
use std::time::{Duration, Instant};

fn arg(name: &str, default: usize) -> Result<usize, String> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name) {
        None => Ok(default),
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .filter(|v| *v > 0)
            .ok_or_else(|| format!("{name} needs a positive number")),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn parent(world: &Comm, add: usize, rounds: usize) -> Result<(), String> {
    let mut firsts = Vec::with_capacity(rounds);
    println!(
        "adding {add} ranks to a running {}-rank job, {rounds} rounds",
        world.size()
    );
    for round in 0..rounds {
        let t0 = Instant::now();
        let s = world
            .spawn(&SpawnSpec::new(add).timeout(Duration::from_secs(30)))
            .map_err(|e| e.to_string())?;
        let mut b = [0u64];
        s.comm
            .recv(&mut b, ANY_SOURCE, 1)
            .map_err(|e| e.to_string())?;
        let first = t0.elapsed();
        for _ in 1..add {
            s.comm
                .recv(&mut b, ANY_SOURCE, 1)
                .map_err(|e| e.to_string())?;
        }
        // Matches the children's finalize.
        s.comm.barrier().map_err(|e| e.to_string())?;
        let hosts: Vec<String> = s
            .latency
            .iter()
            .map(|(h, d)| format!("{h} {:.1} ms", ms(*d)))
            .collect();
        println!(
            "round {round:2}: first message after {:6.2} ms; spawn call {:6.2} ms; per host [{}]",
            ms(first),
            ms(s.elapsed),
            hosts.join(", ")
        );
        firsts.push(first);
    }
    firsts.sort();
    println!(
        "request -> first message: min {:.2} ms, median {:.2} ms, max {:.2} ms",
        ms(firsts[0]),
        ms(firsts[firsts.len() / 2]),
        ms(firsts[firsts.len() - 1])
    );
    Ok(())
}

fn rank_main() -> Result<(), String> {
    let world = mutirao::init().map_err(|e| e.to_string())?;
    if world.is_spawned() {
        // Tell the parent we are up, then leave together with it.
        world
            .send(&[world.rank() as u64], 0, 1)
            .map_err(|e| e.to_string())?;
    } else if world.rank() == 0 {
        parent(&world, arg("--add", 4)?, arg("--rounds", 10)?)?;
    }
    world.finalize().map_err(|e| e.to_string())
}

fn harness() -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let out = LocalJob::new(exe, 4)
        .args(args)
        .limit(Duration::from_secs(120))
        .run()?;
    print!("{}", out.stdout[0]);
    let bad_kids: Vec<_> = out
        .spawned
        .iter()
        .filter(|s| s.code != Some(0))
        .map(|s| format!("spawned rank {}: {:?}\n{}", s.rank, s.code, s.stderr))
        .collect();
    if out.codes.iter().any(|c| *c != Some(0)) || !bad_kids.is_empty() {
        return Err(format!(
            "exit codes {:?}\n{}\n{}",
            out.codes,
            out.stderr.join("\n"),
            bad_kids.join("\n")
        ));
    }
    Ok(())
}

fn main() {
    let res = if std::env::var_os("MUTIRAO_RANK").is_some() {
        rank_main()
    } else {
        harness()
    };
    if let Err(e) = res {
        eprintln!("spawn: {e}");
        std::process::exit(1);
    }
}
