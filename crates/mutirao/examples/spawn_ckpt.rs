//! Spawned ranks in checkpoint waves (issue 13): rank 0 spawns two children at a given round;
//! every round the job's ranks allreduce, rank 0 sends its value to both children and adds
//! their answers, and every rank — the children too — reaches a checkpoint point.
//!
//!     mutirao run -n 2 --checkpoint-interval 0.02 target/release/examples/spawn_ckpt \
//!         [ROUNDS [SPAWN_AT [DIE_AT]]]
//!
//! Defaults: 80 rounds, spawn at round 10, nobody dies. With DIE_AT, rank 1 of the first
//! incarnation (`MUTIRAO_INCARNATION` 0 or unset) exits with status 9 at that round, so that a
//! launcher with checkpoints restarts the job: the ranks resume at the restored round, and
//! when the restored epoch includes the children, rank 0 takes them back with
//! `Comm::respawned` (the launcher started them again; they restored their own checkpoints).
//! A spawn after the restored epoch is not restored: the program spawns again.
//!
//! Prints `resumes at round R` on a restart, then one `spawn_ckpt rank=W value=V` per rank
//! (W: world rank), the same in every run that ends without failure.

use mutirao::{op, Comm, SpawnSpec};
use std::time::Duration;

fn main() {
    let args: Vec<u32> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let rounds = args.first().copied().unwrap_or(80);
    let spawn_at = args.get(1).copied().unwrap_or(10).min(rounds);
    let die_at = args.get(2).copied();
    if let Err(e) = run(rounds, spawn_at, die_at) {
        eprintln!("spawn_ckpt: {e}");
        std::process::exit(1);
    }
}

fn run(rounds: u32, spawn_at: u32, die_at: Option<u32>) -> Result<(), mutirao::Error> {
    let w = mutirao::init()?;
    if w.is_spawned() {
        child(&w, rounds, spawn_at)?;
    } else {
        parent(&w, rounds, spawn_at, die_at)?;
    }
    w.finalize()
}

fn parent(w: &Comm, rounds: u32, spawn_at: u32, die_at: Option<u32>) -> Result<(), mutirao::Error> {
    let (start, mut acc, mut spawned) = match w.restored::<(u32, u64, bool)>()? {
        Some((it, acc, sp)) => (it + 1, acc, sp),
        None => (0, 1, false),
    };
    let mut kids: Option<Comm> = None;
    let mut back = w.respawned();
    if spawned {
        if back.len() != 1 {
            return Err(mutirao::Error::Invalid(format!(
                "restored after the spawn but {} spawn groups came back",
                back.len()
            )));
        }
        kids = Some(back.remove(0).comm);
    }
    if start > 0 {
        println!("rank {} resumes at round {start}", w.rank());
    }
    let first_incarnation = std::env::var("MUTIRAO_INCARNATION").map_or(true, |v| v == "0");
    for it in start..rounds {
        std::thread::sleep(Duration::from_millis(4));
        if it == spawn_at && w.rank() == 0 && !spawned {
            let args = std::env::args().skip(1).collect::<Vec<_>>();
            kids = Some(w.spawn(&SpawnSpec::new(2).args(args))?.comm);
            spawned = true;
        }
        let mut sum = [0u64];
        w.allreduce(&[acc % 1000 + u64::from(it)], &mut sum, &op::Sum)?;
        acc = acc.wrapping_mul(31).wrapping_add(sum[0]);
        if let Some(m) = &kids {
            for r in 1..m.size() {
                m.send(&[acc, u64::from(it)], r, 1)?;
            }
            for r in 1..m.size() {
                let mut b = [0u64];
                m.recv(&mut b, r, 2)?;
                acc = acc.wrapping_add(b[0]);
            }
        }
        if Some(it) == die_at && w.rank() == 1 && first_incarnation {
            std::process::exit(9);
        }
        w.checkpoint_point(&(it, acc, spawned))?;
    }
    println!("spawn_ckpt rank={} value={acc}", w.rank());
    if let Some(m) = kids {
        m.barrier()?; // the children's finalize
    }
    Ok(())
}

fn child(m: &Comm, rounds: u32, spawn_at: u32) -> Result<(), mutirao::Error> {
    let (start, mut acc) = match m.restored::<(u32, u64)>()? {
        Some((it, acc)) => (it + 1, acc),
        None => (spawn_at, m.rank() as u64),
    };
    if start > spawn_at {
        println!("child {} resumes at round {start}", m.rank());
    }
    for it in start..rounds {
        let mut b = [0u64; 2];
        m.recv(&mut b, 0, 1)?;
        if b[1] != u64::from(it) {
            return Err(mutirao::Error::Invalid(format!(
                "child at round {it} got round {}",
                b[1]
            )));
        }
        acc = acc.wrapping_mul(7).wrapping_add(b[0]);
        m.send(&[acc], 0, 2)?;
        m.checkpoint_point(&(it, acc))?;
    }
    let me = m.world_rank(m.rank()).unwrap_or(0);
    println!("spawn_ckpt rank={me} value={acc}");
    Ok(())
}
