//! The master/worker driver over real ranks: every trial starts N copies of this binary as the
//! ranks of one job (an in-test bootstrap server, as in the runtime's own tests), rank 0 the
//! master. Each task t contributes t² to a sum the master checks; every policy must give the
//! exact sum (every task exactly once), also when a worker dies mid-run, and the repository
//! log must pass the exactly-once audit (`log::audit`).

use libtest_mimic::{Arguments, Failed, Trial};
use mutirao::local_job::LocalJob;
use mutirao_mw::{driver, Config, PolicyKind};
use std::time::Duration;

fn scenario() -> Result<(), String> {
    let policy: PolicyKind = std::env::var("MW_POLICY")
        .map_err(|e| e.to_string())?
        .parse()
        .map_err(|e: mutirao_mw::Error| e.to_string())?;
    let total: u64 = 5_000;
    let die_after: Option<u64> = std::env::var("MW_DIE_AFTER")
        .ok()
        .and_then(|v| v.parse().ok());
    let world = mutirao::init().map_err(|e| e.to_string())?;
    let cfg = Config {
        tam_bloco: 37,
        ..Config::default()
    };
    if world.rank() == 0 {
        let mut p = policy.build(&cfg).map_err(|e| e.to_string())?;
        let mut sum = 0u128;
        let mut log = Vec::new();
        let rep = driver::master(
            &world,
            p.as_mut(),
            total,
            &mut |_, _, b: &[u8]| {
                sum += u128::from_le_bytes(b.try_into().expect("16 bytes"));
            },
            Some(&mut log),
        )
        .map_err(|e| format!("master: {e}"))?;
        let want: u128 = (0..total as u128).map(|t| t * t).sum();
        if sum != want || rep.tasks != total {
            return Err(format!("sum {sum} want {want}; {rep:?}"));
        }
        let records = mutirao_mw::log::parse(std::str::from_utf8(&log).unwrap())
            .map_err(|e| e.to_string())?;
        if die_after.is_some() && rep.lost.is_empty() {
            return Err(format!("a worker died but the master lost none: {rep:?}"));
        }
        if records.is_empty() {
            return Err("empty repository log".into());
        }
        // Seed 003 check 2, from the log alone: every task in exactly one counted block.
        mutirao_mw::log::audit(&records, total).map_err(|e| e.to_string())?;
    } else {
        let mut blocks = 0u64;
        let me = world.rank();
        driver::worker(&world, &mut |start, len| {
            blocks += 1;
            if me == 2 && die_after == Some(blocks) {
                // A crash mid-block: no result, no finalize.
                std::process::exit(9);
            }
            std::thread::sleep(Duration::from_micros(50 * len * me as u64));
            (start..start + len)
                .map(|t| (t as u128) * (t as u128))
                .sum::<u128>()
                .to_le_bytes()
                .to_vec()
        })
        .map_err(|e| format!("worker: {e}"))?;
    }
    match world.finalize() {
        Ok(()) => Ok(()),
        // With a dead rank, finalize reports it; that rank's death is this scenario's point.
        Err(mutirao::Error::PeerFailed { rank: 2, .. }) if die_after.is_some() => Ok(()),
        Err(e) => Err(format!("finalize: {e}")),
    }
}

fn launch(policy: &str, n: usize, die_after: Option<u64>, transport: &str) -> Result<(), Failed> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut job = LocalJob::new(exe, n)
        .env("MW_SCENARIO", "1")
        .env("MW_POLICY", policy)
        .env("MUTIRAO_TRANSPORT", transport)
        .limit(Duration::from_secs(60));
    if let Some(d) = die_after {
        job = job.env("MW_DIE_AFTER", d.to_string());
    }
    let out = job.run()?;
    let ok = out
        .codes
        .iter()
        .enumerate()
        .all(|(r, c)| match (r, die_after) {
            (2, Some(_)) => *c == Some(9),
            _ => *c == Some(0),
        });
    if ok {
        Ok(())
    } else {
        Err(format!("exit codes {:?}\n{}", out.codes, out.stderr.join("\n")).into())
    }
}

fn main() {
    if std::env::var_os("MW_SCENARIO").is_some() {
        match scenario() {
            Ok(()) => std::process::exit(0),
            Err(e) => {
                eprintln!("rank {:?}: {e}", std::env::var("MUTIRAO_RANK"));
                std::process::exit(1);
            }
        }
    }
    if std::env::var_os("MUTIRAO_RANK").is_some() {
        eprintln!("started as a rank without MW_SCENARIO: refusing to run the test suite");
        std::process::exit(1);
    }
    let args = Arguments::from_args();
    let mut trials = Vec::new();
    for p in PolicyKind::ALL {
        let name = p.name();
        trials.push(Trial::test(format!("every_task_once_{name}"), move || {
            launch(name, 4, None, "auto")
        }));
    }
    // Worker 2 dies at the start of its `die`-th block. GSS hands out halving blocks: with
    // three workers and 5 000 tasks a worker may get only two, so it dies in its first.
    for (name, transport, die) in [
        ("hnow", "tcp", 3),
        ("join", "tcp", 3),
        ("gss", "tcp", 1),
        ("hnow", "auto", 3),
        ("steal", "auto", 3),
    ] {
        trials.push(Trial::test(
            format!("a_dead_worker_loses_no_task_{name}_{transport}"),
            move || launch(name, 4, Some(die), transport),
        ));
    }
    libtest_mimic::run(&args, trials).exit();
}
