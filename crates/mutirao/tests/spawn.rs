//! Spawn (issue 13), multi-process: every trial starts N copies of this binary as the ranks of
//! one job through `LocalJob` (whose bootstrap server can spawn), and a rank spawns more. A
//! process started with `SPAWN_SCENARIO` set is a rank (or a spawned child): it runs the
//! scenario and exits 0 (pass) or 1 (fail, message on stderr).

use libtest_mimic::{Arguments, Failed, Trial};
use mutirao::local_job::{LocalJob, Outcome};
use mutirao::op;
use mutirao::pmi::CheckpointSink;
use mutirao::{Comm, Error, SpawnSpec};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type R = Result<(), String>;

fn e(err: Error) -> String {
    err.to_string()
}

macro_rules! check {
    ($cond:expr, $($fmt:tt)*) => {
        if !$cond {
            return Err(format!($($fmt)*));
        }
    };
}

const START: i32 = 98;
const DONE: i32 = 99;
const PING: i32 = 7;
const BIG: i32 = 5;

/// The children's side of `basic`: talk to the parent and the sibling over the merged comm.
fn child(m: &Comm) -> R {
    check!(
        m.is_spawned(),
        "a spawned rank does not know it was spawned"
    );
    let (r, n) = (m.rank(), m.size());
    check!(n == 3 && (1..=2).contains(&r), "child sees rank {r} of {n}");
    let me = m.world_rank(r).ok_or("no world rank")? as u64;
    check!(
        me >= 3,
        "child's world rank {me} is inside the original job"
    );
    let mut b = [0u64];
    m.recv(&mut b, 0, 1).map_err(e)?;
    check!(b[0] == 10 * r as u64, "child {r} got {b:?} from the parent");
    m.send(&[me], 0, 2).map_err(e)?;
    // A rendezvous-sized message from the parent.
    let (big, _) = m.recv_vec::<u32>(0, 3).map_err(e)?;
    check!(
        big.len() == 300_000
            && big
                .iter()
                .enumerate()
                .all(|(i, x)| *x == i as u32 + r as u32),
        "child {r}: large message corrupt"
    );
    // Siblings reach each other.
    let other = 3 - r;
    let mut s = [0u64];
    m.sendrecv(&[me], other, 4, &mut s, other, 4).map_err(e)?;
    check!(s[0] != me && s[0] >= 3, "sibling sent {s:?}");
    let mut sum = [0u64];
    m.allreduce(&[r as u64], &mut sum, &op::Sum).map_err(e)?;
    check!(sum[0] == 3, "allreduce over the merged comm gave {sum:?}");
    m.barrier().map_err(e)?;
    Ok(())
}

/// Rank 0 spawns 2 children while ranks 1 and 2 ping-pong; the merged communicator carries
/// point-to-point both ways and collectives.
fn basic(w: &Comm) -> R {
    if w.is_spawned() {
        return child(w);
    }
    check!(w.size() == 3, "run with 3 ranks");
    match w.rank() {
        0 => {
            // A large (rendezvous) message from rank 1 arrives while this rank spawns.
            let big = w.irecv::<u32>(1, BIG).map_err(e)?;
            w.send(&[0u8], 1, START).map_err(e)?;
            // The children wait 300 ms before they start up, so the spawn surely spans many
            // ping-pong rounds of ranks 1 and 2 however loaded the machine is.
            let spec = SpawnSpec::new(2)
                .args(["--delay-ms", "300"])
                .timeout(Duration::from_secs(30));
            let s = w.spawn(&spec).map_err(e)?;
            w.send(&[s.elapsed.as_micros() as u64], 1, DONE)
                .map_err(e)?;
            let (v, _) = big.wait().map_err(e)?;
            check!(
                v.len() == 1 << 20 && v.iter().enumerate().all(|(i, x)| *x == i as u32),
                "rank 1's large message is corrupt"
            );
            let m = &s.comm;
            check!(
                m.rank() == 0 && m.size() == 3 && !w.is_spawned(),
                "parent sees {m:?}"
            );
            check!(
                s.ranks.len() == 2 && s.ranks.iter().all(|r| *r >= 3),
                "ranks {:?}",
                s.ranks
            );
            check!(
                s.latency.len() == 1
                    && s.latency[0].0 == "localhost"
                    && s.latency[0].1 <= s.elapsed,
                "latency {:?} elapsed {:?}",
                s.latency,
                s.elapsed
            );
            for r in 1..3 {
                m.send(&[10 * r as u64], r, 1).map_err(e)?;
            }
            for r in 1..3 {
                let mut b = [0u64];
                m.recv(&mut b, r, 2).map_err(e)?;
                check!(
                    b[0] == s.ranks[r - 1] as u64,
                    "child {r} says world rank {b:?}"
                );
            }
            for r in 1..3u32 {
                let big: Vec<u32> = (0..300_000u32).map(|i| i + r).collect();
                m.send(&big, r as usize, 3).map_err(e)?;
            }
            let mut sum = [0u64];
            m.allreduce(&[0u64], &mut sum, &op::Sum).map_err(e)?;
            check!(sum[0] == 3, "allreduce over the merged comm gave {sum:?}");
            // Matches the children's barrier, then their finalize.
            m.barrier().map_err(e)?;
            m.barrier().map_err(e)?;
            println!("spawn of 2 took {:?} ({:?})", s.elapsed, s.latency);
        }
        1 => {
            let mut b = [0u8];
            w.recv(&mut b, 0, START).map_err(e)?;
            // Rank 0 is inside its spawn (its children wait 300 ms before starting up), and
            // still takes this rendezvous message: the spawning rank keeps progressing.
            let t = Instant::now();
            let big: Vec<u32> = (0..1u32 << 20).collect();
            w.send(&big, 0, BIG).map_err(e)?;
            let took = t.elapsed();
            check!(
                w.iprobe(0, DONE).map_err(e)?.is_none() && took < Duration::from_millis(250),
                "the 4 MiB send to the spawning rank 0 completed only after its spawn ({took:?})"
            );
            let mut rounds = 0u64;
            let spawn_us = loop {
                if w.iprobe(0, DONE).map_err(e)?.is_some() {
                    let mut d = [0u64];
                    w.recv(&mut d, 0, DONE).map_err(e)?;
                    break d[0];
                }
                let mut x = [0u64];
                w.sendrecv(&[rounds], 2, PING, &mut x, 2, PING).map_err(e)?;
                check!(x[0] == rounds, "pong {x:?} for ping {rounds}");
                rounds += 1;
                check!(rounds < 10_000_000, "no DONE from rank 0");
            };
            w.send(&[u64::MAX], 2, PING).map_err(e)?;
            // Rank 0 was inside its spawn call for the whole of these rounds.
            check!(
                rounds >= 20 && spawn_us >= 300_000,
                "only {rounds} ping-pong rounds while rank 0 spawned for {spawn_us} µs"
            );
            println!("{rounds} rounds during a {spawn_us} µs spawn");
        }
        _ => loop {
            let mut x = [0u64];
            w.recv(&mut x, 1, PING).map_err(e)?;
            if x[0] == u64::MAX {
                break;
            }
            w.send(&x, 1, PING).map_err(e)?;
        },
    }
    Ok(())
}

/// Rank 0's spawn fails as `want` says; then the job goes on (a ping-pong and a barrier).
fn failing(w: &Comm, spec: SpawnSpec, want: &str, within: Duration) -> R {
    if w.is_spawned() {
        return Err("a failing spawn's child ran the scenario".into());
    }
    if w.rank() == 0 {
        let t0 = Instant::now();
        let err = match w.spawn(&spec) {
            Ok(s) => return Err(format!("spawn succeeded: {:?}", s.ranks)),
            Err(err) => err,
        };
        let took = t0.elapsed();
        check!(
            matches!(err, Error::Spawn(_)) && err.to_string().contains(want),
            "spawn error {err:?} does not say {want:?}"
        );
        check!(
            took <= within,
            "the failing spawn took {took:?} (> {within:?})"
        );
        w.send(&[5u32], 1, 1).map_err(e)?;
        let mut b = [0u32];
        w.recv(&mut b, 1, 2).map_err(e)?;
        check!(b[0] == 6, "rank 1 answered {b:?}");
    } else {
        let mut b = [0u32];
        w.recv(&mut b, 0, 1).map_err(e)?;
        w.send(&[b[0] + 1], 0, 2).map_err(e)?;
    }
    w.barrier().map_err(e)?;
    Ok(())
}

/// A spawned child dies: the parent's operations on the merged communicator fail with
/// `PeerFailed` (any source included), while the job's own any-source receive, posted before
/// the spawn, is untouched and completes.
fn child_dies(w: &Comm) -> R {
    if w.is_spawned() {
        return Err("the child should have died".into());
    }
    match w.rank() {
        0 => {
            let pending = w.irecv::<u32>(mutirao::ANY_SOURCE, 2).map_err(e)?;
            let s = w.spawn(&SpawnSpec::new(1).args(["--die"])).map_err(e)?;
            let mut b = [0u32];
            let err = s.comm.recv(&mut b, 1, 1).unwrap_err();
            check!(
                matches!(err, Error::PeerFailed { rank, .. } if rank == s.ranks[0]),
                "receive from the dead child: {err:?}"
            );
            let err = s.comm.recv(&mut b, mutirao::ANY_SOURCE, 1).unwrap_err();
            check!(
                matches!(err, Error::PeerFailed { .. }),
                "any-source on the merged comm: {err:?}"
            );
            w.send(&[1u32], 1, 1).map_err(e)?;
            let (v, st) = pending.wait().map_err(e)?;
            check!(
                v == [41] && st.map(|s| s.source) == Some(1),
                "world any-source got {v:?}"
            );
        }
        1 => {
            let mut b = [0u32];
            w.recv(&mut b, 0, 1).map_err(e)?;
            w.send(&[41u32], 0, 2).map_err(e)?;
        }
        _ => {}
    }
    w.barrier().map_err(e)?;
    Ok(())
}

/// A child of `concurrent`: echo its world rank to the parent, count the group by allreduce.
fn echo_child(m: &Comm) -> R {
    let me = m.world_rank(m.rank()).ok_or("no world rank")? as u64;
    let mut b = [0u64];
    m.recv(&mut b, 0, 1).map_err(e)?;
    m.send(&[b[0], me], 0, 2).map_err(e)?;
    let mut n = [0u64];
    m.allreduce(&[1u64], &mut n, &op::Sum).map_err(e)?;
    check!(
        n[0] == m.size() as u64,
        "allreduce counted {n:?} of {}",
        m.size()
    );
    Ok(())
}

/// The parent's side of [`echo_child`]; returns the children's world ranks.
fn echo_parent(s: &mutirao::Spawned, salt: u64) -> Result<Vec<u64>, String> {
    let m = &s.comm;
    let mut seen = Vec::new();
    for r in 1..m.size() {
        m.send(&[salt + r as u64], r, 1).map_err(e)?;
        let mut b = [0u64; 2];
        m.recv(&mut b, r, 2).map_err(e)?;
        check!(b[0] == salt + r as u64, "child {r} echoed {b:?}");
        check!(
            b[1] == s.ranks[r - 1] as u64,
            "child {r} says world rank {}",
            b[1]
        );
        seen.push(b[1]);
    }
    let mut n = [0u64];
    m.allreduce(&[1u64], &mut n, &op::Sum).map_err(e)?;
    check!(n[0] == m.size() as u64, "allreduce counted {n:?}");
    m.barrier().map_err(e)?; // the children's finalize
    Ok(seen)
}

/// Ranks 0 and 1 spawn at the same time (2 children each), then rank 0 once more (1 child):
/// every group works and the world ranks given out are all distinct.
fn concurrent(w: &Comm) -> R {
    if w.is_spawned() {
        return echo_child(w);
    }
    let r = w.rank() as u64;
    let s = w.spawn(&SpawnSpec::new(2)).map_err(e)?;
    let mut mine = echo_parent(&s, 100 * r)?;
    if r == 0 {
        let s2 = w.spawn(&SpawnSpec::new(1)).map_err(e)?;
        mine.extend(echo_parent(&s2, 1000)?);
        check!(mine.len() == 3, "rank 0 has {mine:?}");
        w.send(&mine, 1, 9).map_err(e)?;
    } else {
        let mut theirs = [0u64; 3];
        w.recv(&mut theirs, 0, 9).map_err(e)?;
        let mut all: Vec<u64> = theirs.iter().chain(&mine).copied().collect();
        all.sort();
        all.dedup();
        check!(
            all.len() == 5 && all.iter().all(|x| *x >= 2),
            "world ranks of spawned ranks overlap or fall inside the job: {theirs:?} {mine:?}"
        );
    }
    w.barrier().map_err(e)?;
    Ok(())
}

/// With checkpoint waves running (every 20 ms), rank 0 spawns mid-run: the spawn works, the
/// children (which inherit the checkpoint settings) stay out of the waves, and waves keep
/// committing afterwards.
fn with_checkpoints(w: &Comm) -> R {
    if w.is_spawned() {
        // The children keep in step with their parent: one checkpoint point per round.
        for it in 16..40u32 {
            w.barrier().map_err(e)?;
            w.checkpoint_point(&it).map_err(e)?;
        }
        check!(
            w.checkpoint_history().0.is_empty(),
            "a spawned rank committed a wave (only rank 0 commits)"
        );
        return Ok(());
    }
    let mut before = 0;
    let mut kids: Option<Comm> = None;
    for it in 0..40u32 {
        std::thread::sleep(Duration::from_millis(4));
        // The ranks keep in step (as an iterative program's messages make them): checkpoint
        // points are reached as often by each.
        w.barrier().map_err(e)?;
        if let Some(m) = &kids {
            m.barrier().map_err(e)?;
        }
        w.checkpoint_point(&it).map_err(e)?;
        if it == 15 && w.rank() == 0 {
            before = w.checkpoint_history().0.len();
            kids = Some(w.spawn(&SpawnSpec::new(2)).map_err(e)?.comm);
        }
    }
    if w.rank() == 0 {
        let after = w.checkpoint_history().0.len();
        check!(
            after > before,
            "no wave committed after the spawn ({before} → {after})"
        );
    }
    if let Some(m) = kids {
        m.barrier().map_err(e)?; // the children's finalize
    }
    Ok(())
}

/// `SpawnSpec::outside_waves`: the children never reach checkpoint points in step, and the
/// waves still commit after the spawn, without them.
fn outside_waves(w: &Comm) -> R {
    if w.is_spawned() {
        check!(
            w.checkpoint_history() == (vec![], vec![]),
            "a spawned rank outside the waves takes part in them"
        );
        w.checkpoint_point(&0u32).map_err(e)?; // does nothing
        return echo_child(w);
    }
    let mut before = 0;
    for it in 0..40u32 {
        std::thread::sleep(Duration::from_millis(4));
        w.barrier().map_err(e)?;
        w.checkpoint_point(&it).map_err(e)?;
        if it == 15 && w.rank() == 0 {
            before = w.checkpoint_history().0.len();
            let s = w.spawn(&SpawnSpec::new(2).outside_waves()).map_err(e)?;
            echo_parent(&s, 7)?;
        }
    }
    if w.rank() == 0 {
        let after = w.checkpoint_history().0.len();
        check!(
            after > before,
            "no wave committed after the spawn ({before} → {after})"
        );
    }
    Ok(())
}

/// Rounds of the `family` scenario, the round rank 0 spawns at, the round rank 1 dies at.
const FAM_ROUNDS: u32 = 70;
const FAM_SPAWN_AT: u32 = 10;
const FAM_DIE_AT: u32 = 50;

/// The `family` round rank 0 spawns at (`FAM_SPAWN_AT` in the environment, else 10).
fn fam_spawn_at() -> u32 {
    std::env::var("FAM_SPAWN_AT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(FAM_SPAWN_AT)
}

/// The `family` round rank 1 dies at (`FAM_DIE`: a round, or `1` for round 50); `None`: never.
fn fam_die_at() -> Option<u32> {
    match std::env::var("FAM_DIE").ok()?.as_str() {
        "1" => Some(FAM_DIE_AT),
        r => r.parse().ok(),
    }
}

/// Two ranks; rank 0 spawns two children at round 10; every round the job's ranks allreduce,
/// rank 0 sends its value to both children and adds their answers, and all four reach a
/// checkpoint point. With `FAM_DIE` set, rank 1 dies at round 50. Restarted, the ranks and the
/// re-created children resume from the restored round (rank 0 takes its children back with
/// `respawned`). Prints each rank's final value.
fn family(w: &Comm) -> R {
    if w.is_spawned() {
        return family_child(w);
    }
    let (start, mut acc, mut spawned) = match w.restored::<(u32, u64, bool)>().map_err(e)? {
        Some((it, acc, sp)) => (it + 1, acc, sp),
        None => (0, 1, false),
    };
    let mut kids: Option<Comm> = None;
    let mut back = w.respawned();
    if spawned {
        check!(
            back.len() == 1 && back[0].comm.size() == 3 && back[0].comm.rank() == 0,
            "rank {} restored after its spawn got {} groups back",
            w.rank(),
            back.len()
        );
        kids = Some(back.remove(0).comm);
    } else {
        check!(back.is_empty(), "groups re-created that were never spawned");
    }
    if start > 0 {
        println!("rank {} resumes at round {start}", w.rank());
    }
    for it in start..FAM_ROUNDS {
        std::thread::sleep(Duration::from_millis(3));
        if it == fam_spawn_at() && w.rank() == 0 && !spawned {
            kids = Some(w.spawn(&SpawnSpec::new(2)).map_err(e)?.comm);
            spawned = true;
        }
        let mut sum = [0u64];
        w.allreduce(&[acc % 1000 + it as u64], &mut sum, &op::Sum)
            .map_err(e)?;
        acc = acc.wrapping_mul(31).wrapping_add(sum[0]);
        if let Some(m) = &kids {
            for r in 1..3 {
                m.send(&[acc, it as u64], r, 1).map_err(e)?;
            }
            for r in 1..3 {
                let mut b = [0u64];
                m.recv(&mut b, r, 2).map_err(e)?;
                acc = acc.wrapping_add(b[0]);
            }
            if it > fam_spawn_at() {
                // The children's message of the previous round, left unreceived across its
                // checkpoint point (in this rank's checkpoint: restored on the merged
                // communicator after a restart).
                acc = late_from_children(m, acc, it - 1)?;
            }
        }
        if Some(it) == fam_die_at() && w.rank() == 1 {
            std::process::exit(9);
        }
        w.checkpoint_point(&(it, acc, spawned)).map_err(e)?;
    }
    if let Some(m) = &kids {
        acc = late_from_children(m, acc, FAM_ROUNDS - 1)?;
    }
    println!("rank {} result {acc}", w.rank());
    if let Some(m) = kids {
        m.barrier().map_err(e)?; // the children's finalize
    }
    Ok(())
}

/// Receive the children's round-`it` message sent one round before it is received.
fn late_from_children(m: &Comm, mut acc: u64, it: u32) -> Result<u64, String> {
    for r in 1..3 {
        let mut b = [0u64; 2];
        m.recv(&mut b, r, 3).map_err(e)?;
        check!(
            b[1] == it as u64,
            "the late message of child {r} is of round {}, not {it}",
            b[1]
        );
        acc = acc.wrapping_add(b[0] ^ 0x55);
    }
    Ok(acc)
}

fn family_child(m: &Comm) -> R {
    let (start, mut acc) = match m.restored::<(u32, u64)>().map_err(e)? {
        Some((it, acc)) => (it + 1, acc),
        None => (fam_spawn_at(), m.rank() as u64),
    };
    if start > fam_spawn_at() {
        println!("child {} resumes at round {start}", m.rank());
    }
    for it in start..FAM_ROUNDS {
        let mut b = [0u64; 2];
        m.recv(&mut b, 0, 1).map_err(e)?;
        check!(b[1] == it as u64, "child at round {it} got round {}", b[1]);
        acc = acc.wrapping_mul(7).wrapping_add(b[0]);
        m.send(&[acc], 0, 2).map_err(e)?;
        m.send(&[acc.rotate_left(7), it as u64], 0, 3).map_err(e)?;
        m.checkpoint_point(&(it, acc)).map_err(e)?;
    }
    println!("child {} result {acc}", m.rank());
    Ok(())
}

/// A one-rank job spawns a child, which spawns a grandchild: each pair talks on its own group.
fn nested(w: &Comm) -> R {
    if !w.is_spawned() {
        check!(w.size() == 1, "run with 1 rank");
        let s = w.spawn(&SpawnSpec::new(1).args(["--nest"])).map_err(e)?;
        echo_parent(&s, 10)?;
        return Ok(());
    }
    if std::env::args().any(|a| a == "--nest") {
        // The child: first a parent itself, then its own parent's echo.
        let s = w.spawn(&SpawnSpec::new(1)).map_err(e)?;
        let grand = echo_parent(&s, 20)?;
        let me = w.world_rank(w.rank()).ok_or("no world rank")? as u64;
        check!(grand[0] > me, "grandchild {grand:?}, child {me}");
        return echo_child(w);
    }
    echo_child(w)
}

/// A nonblocking spawn: rank 0 asks for a child that waits 400 ms before it starts up and
/// keeps ping-ponging with rank 1 until `PendingSpawn::test` says the child is there; then it
/// talks to the child. The ping-pong must go on during the spawn (rank 0 does not pause).
fn nonblocking(w: &Comm) -> R {
    if w.is_spawned() {
        let mut b = [0u64];
        w.recv(&mut b, 0, 1).map_err(e)?;
        w.send(&[b[0] + 1], 0, 2).map_err(e)?;
        return Ok(());
    }
    check!(w.size() == 2, "run with 2 ranks");
    if w.rank() == 1 {
        loop {
            let mut b = [0u64];
            let st = w.recv(&mut b, 0, mutirao::ANY_TAG).map_err(e)?;
            if st.tag == DONE {
                check!(
                    b[0] >= 3,
                    "only {} ping-pongs while the spawn was pending",
                    b[0]
                );
                return Ok(());
            }
            w.send(&b, 0, PING).map_err(e)?;
        }
    }
    let spec = SpawnSpec::new(1)
        .args(["--delay-ms", "400"])
        .timeout(Duration::from_secs(30));
    let mut pending = w.spawn_nonblocking(&spec).map_err(e)?;
    let mut rounds = 0u64;
    let s = loop {
        if let Some(s) = pending.test().map_err(e)? {
            break s;
        }
        w.send(&[rounds], 1, PING).map_err(e)?;
        let mut b = [0u64];
        w.recv(&mut b, 1, PING).map_err(e)?;
        check!(b[0] == rounds, "rank 1 echoed {b:?} for round {rounds}");
        rounds += 1;
    };
    check!(
        s.elapsed >= Duration::from_millis(350),
        "the spawn completed in {:?}, before its child could have started",
        s.elapsed
    );
    match pending.test() {
        Err(Error::Invalid(_)) => {}
        other => return Err(format!("a second test gave {other:?}, not Invalid")),
    }
    w.send(&[rounds], 1, DONE).map_err(e)?;
    s.comm.send(&[41u64], 1, 1).map_err(e)?;
    let mut b = [0u64];
    s.comm.recv(&mut b, 1, 2).map_err(e)?;
    check!(b[0] == 42, "the child answered {b:?}");
    s.comm.barrier().map_err(e)?; // the child's finalize
    Ok(())
}

/// A nonblocking spawn of a missing program: `test` reports the launcher's error, the job's
/// communicator still works, and a spawn after it succeeds (the launcher connection is back).
fn nonblocking_missing(w: &Comm) -> R {
    if w.is_spawned() {
        return Ok(());
    }
    let mut p = w
        .spawn_nonblocking(&SpawnSpec::new(1).program("/nonexistent/mutirao-nb"))
        .map_err(e)?;
    let t0 = Instant::now();
    let err = loop {
        match p.test() {
            Ok(None) if t0.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Ok(None) => return Err("the failed spawn never completed".into()),
            Ok(Some(_)) => return Err("a missing program was spawned".into()),
            Err(err) => break err.to_string(),
        }
    };
    check!(
        err.contains("cannot start /nonexistent/mutirao-nb"),
        "{err}"
    );
    w.barrier().map_err(e)?;
    let s = w
        .spawn_nonblocking(&SpawnSpec::new(1))
        .map_err(e)?
        .wait()
        .map_err(e)?;
    s.comm.barrier().map_err(e)?;
    Ok(())
}

fn run_scenario(name: &str) -> ! {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--delay-ms") {
        let ms = args.get(i + 1).and_then(|v| v.parse().ok()).unwrap_or(0);
        std::thread::sleep(Duration::from_millis(ms));
    }
    let w = match mutirao::init() {
        Ok(w) => w,
        Err(err) => {
            eprintln!("init: {err}");
            std::process::exit(1);
        }
    };
    if args.iter().any(|a| a == "--die") {
        std::process::exit(9);
    }
    let res = match name {
        "basic" => basic(&w),
        "childdies" => child_dies(&w),
        "concurrent" => concurrent(&w),
        "ckpt" => with_checkpoints(&w),
        "family" => family(&w),
        "outside" => outside_waves(&w),
        "nested" => nested(&w),
        "nonblocking" => nonblocking(&w),
        "nbmissing" => nonblocking_missing(&w),
        "missing" => failing(
            &w,
            SpawnSpec::new(2).program("/nonexistent/mutirao-spawn-test"),
            "cannot start /nonexistent/mutirao-spawn-test",
            Duration::from_secs(5),
        ),
        "never" => failing(
            &w,
            SpawnSpec::new(2)
                .program("/bin/sleep")
                .args(["30"])
                .timeout(Duration::from_millis(800)),
            "timed out",
            Duration::from_secs(4),
        ),
        "exits" => failing(
            &w,
            SpawnSpec::new(2)
                .program("/bin/true")
                .timeout(Duration::from_secs(30)),
            "ended before the spawn completed",
            Duration::from_secs(5),
        ),
        "nospawner" => failing(
            &w,
            SpawnSpec::new(1),
            "cannot spawn ranks",
            Duration::from_secs(5),
        ),
        other => Err(format!("unknown scenario {other}")),
    };
    let res = res.and_then(|_| w.finalize().map_err(e));
    match res {
        Ok(()) => std::process::exit(0),
        Err(msg) => {
            eprintln!("scenario {name}: {msg}");
            std::process::exit(1);
        }
    }
}

fn launch(scenario: &str, n: usize, transport: &str, spawn: bool) -> Result<Outcome, Failed> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut job = LocalJob::new(exe, n)
        .env("SPAWN_SCENARIO", scenario)
        .env("MUTIRAO_TRANSPORT", transport)
        .limit(Duration::from_secs(40));
    if !spawn {
        job = job.without_spawn();
    }
    Ok(job.run()?)
}

#[derive(Default)]
struct MemSink {
    blobs: Mutex<BTreeMap<(u64, u32), Vec<u8>>>,
    committed: Mutex<Vec<u64>>,
}

impl CheckpointSink for MemSink {
    fn put(&self, epoch: u64, rank: u32, blob: &[u8]) -> Result<(), String> {
        let mut b = self.blobs.lock().map_err(|_| "poisoned")?;
        b.insert((epoch, rank), blob.to_vec());
        Ok(())
    }
    fn get(&self, epoch: u64, rank: u32) -> Result<Vec<u8>, String> {
        let b = self.blobs.lock().map_err(|_| "poisoned")?;
        b.get(&(epoch, rank))
            .cloned()
            .ok_or_else(|| format!("no checkpoint of rank {rank} at epoch {epoch}"))
    }
    fn commit(&self, epoch: u64) -> Result<(), String> {
        self.committed.lock().map_err(|_| "poisoned")?.push(epoch);
        Ok(())
    }
    fn last_committed(&self) -> Result<Option<u64>, String> {
        Ok(self
            .committed
            .lock()
            .map_err(|_| "poisoned")?
            .last()
            .copied())
    }
}

/// Committed epochs and the ranks with a checkpoint in each.
fn committed_ranks(sink: &MemSink) -> Vec<(u64, Vec<u32>)> {
    let blobs = sink.blobs.lock().unwrap();
    sink.committed
        .lock()
        .unwrap()
        .iter()
        .map(|&c| {
            let ranks = blobs.keys().filter(|(e, _)| *e == c).map(|(_, r)| *r);
            (c, ranks.collect())
        })
        .collect()
}

/// The committed epochs whose checkpoints are exactly those of `ranks`.
fn epochs_with(sink: &MemSink, ranks: &[u32]) -> Vec<u64> {
    committed_ranks(sink)
        .into_iter()
        .filter(|(_, r)| r == ranks)
        .map(|(e, _)| e)
        .collect()
}

/// The `family` scenario's result lines (ranks', then children's, sorted).
fn results(o: &Outcome) -> Vec<String> {
    let mut v: Vec<String> = o
        .stdout
        .iter()
        .chain(o.spawned.iter().map(|s| &s.stdout))
        .flat_map(|s| s.lines())
        .filter(|l| l.contains(" result "))
        .map(String::from)
        .collect();
    v.sort();
    v
}

/// A spawn after the last committed epoch is not restored: rank 1 dies at round 29, before
/// rank 0's spawn at round 30 is in any committed epoch; the restart resumes the two ranks, rank 0 gets no group back and spawns
/// again, and every result is the failure-free run's.
fn spawn_after_the_epoch_is_made_again() -> Result<(), Failed> {
    let late = [("FAM_SPAWN_AT", "30".to_string())];
    let reference = Arc::new(MemSink::default());
    let o = family_job(&reference, "blocking", &late)?;
    all_ok(&o, 2, Some(0))?;
    let want = results(&o);
    let sink = Arc::new(MemSink::default());
    let o = family_job(
        &sink,
        "blocking",
        &[late[0].clone(), ("FAM_DIE", "29".into())],
    )?;
    // (Rank 0 may still spawn at round 30 before it meets the failure.)
    if o.codes[1] != Some(9) {
        return Err(format!("rank 1 should have died with 9: {:?}", o.codes).into());
    }
    let committed = committed_ranks(&sink);
    let Some((last, ranks)) = committed.last().cloned() else {
        return Err(format!("no epoch committed before the failure: {:?}", o.stderr).into());
    };
    if ranks != [0, 1] {
        return Err(format!("epoch {last} holds {ranks:?} before any spawn").into());
    }
    let o = family_job(
        &sink,
        "blocking",
        &[late[0].clone(), ("MUTIRAO_RESTART_EPOCH", last.to_string())],
    )?;
    // The two children of the new spawn, none re-created.
    all_ok(&o, 2, Some(0))?;
    let resumed = o
        .stdout
        .iter()
        .filter(|s| s.contains("resumes at round"))
        .count();
    let kids_resumed = o
        .spawned
        .iter()
        .filter(|s| s.stdout.contains("resumes"))
        .count();
    if resumed != 2 || kids_resumed != 0 {
        return Err(format!("{resumed} ranks and {kids_resumed} children resumed").into());
    }
    let got = results(&o);
    if got != want {
        return Err(format!("restarted from epoch {last}: {got:?}, failure-free: {want:?}").into());
    }
    Ok(())
}

fn family_job(
    sink: &Arc<MemSink>,
    mode: &str,
    extra: &[(&str, String)],
) -> Result<Outcome, Failed> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut job = LocalJob::new(exe, 2)
        .env("SPAWN_SCENARIO", "family")
        .env("MUTIRAO_CKPT_INTERVAL", "0.02")
        .env("MUTIRAO_CKPT_MODE", mode)
        .checkpoints(sink.clone())
        .limit(Duration::from_secs(40));
    for (k, v) in extra {
        job = job.env(*k, v.clone());
    }
    Ok(job.run()?)
}

/// Issue 13: waves after a spawn include the children (the committed epochs hold four
/// checkpoints); rank 1 is killed; a restart from the last committed epoch starts the two
/// ranks and re-creates the two children, all four resume there, and every result is the
/// failure-free run's.
fn family_kill_and_restart(mode: &str) -> Result<(), Failed> {
    let reference = Arc::new(MemSink::default());
    let o = family_job(&reference, mode, &[])?;
    all_ok(&o, 2, Some(0))?;
    let want = results(&o);
    if want.len() != 4 {
        return Err(format!("the failure-free run printed {want:?}").into());
    }
    let sink = Arc::new(MemSink::default());
    let o = family_job(&sink, mode, &[("FAM_DIE", "1".into())])?;
    if o.codes[1] != Some(9) {
        return Err(format!("rank 1 should have died with 9: {:?}", o.codes).into());
    }
    let committed = committed_ranks(&sink);
    let Some((last, ranks)) = committed.last().cloned() else {
        return Err(format!("no epoch committed before the failure: {:?}", o.stderr).into());
    };
    if ranks != [0, 1, 2, 3] {
        return Err(format!(
            "the last committed epoch {last} holds the checkpoints of {ranks:?}, not of both \
             ranks and both children (committed: {committed:?})"
        )
        .into());
    }
    let o = family_job(&sink, mode, &[("MUTIRAO_RESTART_EPOCH", last.to_string())])?;
    all_ok(&o, 2, Some(0))?;
    let resumed: Vec<&str> = o
        .stdout
        .iter()
        .chain(o.spawned.iter().map(|s| &s.stdout))
        .flat_map(|s| s.lines())
        .filter(|l| l.contains("resumes at round"))
        .collect();
    if resumed.len() != 4 {
        return Err(format!("not all four resumed from epoch {last}: {resumed:?}").into());
    }
    let got = results(&o);
    if got != want {
        return Err(format!("restarted from epoch {last}: {got:?}, failure-free: {want:?}").into());
    }
    Ok(())
}

fn all_ok(o: &Outcome, spawned: usize, spawned_code: Option<i32>) -> Result<(), Failed> {
    let kids: Vec<_> = o.spawned.iter().map(|s| s.code).collect();
    if o.codes.iter().all(|c| *c == Some(0))
        && o.spawned.len() == spawned
        && kids.iter().all(|c| *c == spawned_code)
    {
        return Ok(());
    }
    let kid_err: Vec<_> = o.spawned.iter().map(|s| s.stderr.as_str()).collect();
    Err(format!(
        "exit codes {:?}, spawned {kids:?} (want {spawned} × {spawned_code:?})\n{}\n{}",
        o.codes,
        o.stderr.join("\n"),
        kid_err.join("\n")
    )
    .into())
}

fn main() {
    if let Ok(s) = std::env::var("SPAWN_SCENARIO") {
        run_scenario(&s);
    }
    if std::env::var_os("MUTIRAO_RANK").is_some() {
        eprintln!("started as a rank without SPAWN_SCENARIO: refusing to run the test suite");
        std::process::exit(1);
    }
    let args = Arguments::from_args();
    let mut trials = Vec::new();
    for transport in ["auto", "tcp"] {
        trials.push(Trial::test(
            format!("parent_and_two_children_talk_while_others_run_{transport}"),
            move || {
                let o = launch("basic", 3, transport, true)?;
                all_ok(&o, 2, Some(0))
            },
        ));
    }
    for transport in ["auto", "tcp"] {
        trials.push(Trial::test(
            format!("a_nonblocking_spawn_lets_the_parent_work_until_its_child_arrives_{transport}"),
            move || {
                let o = launch("nonblocking", 2, transport, true)?;
                all_ok(&o, 1, Some(0))
            },
        ));
    }
    trials.push(Trial::test(
        "a_failed_nonblocking_spawn_reports_its_error_and_the_next_spawn_works",
        || {
            let o = launch("nbmissing", 2, "auto", true)?;
            all_ok(&o, 2, Some(0))
        },
    ));
    trials.push(Trial::test(
        "two_ranks_spawn_at_once_and_one_twice_with_distinct_world_ranks",
        || {
            let o = launch("concurrent", 2, "auto", true)?;
            all_ok(&o, 5, Some(0))
        },
    ));
    trials.push(Trial::test(
        "a_wave_after_a_spawn_includes_the_children_and_commits_with_their_checkpoints",
        || {
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            let sink = Arc::new(MemSink::default());
            let o = LocalJob::new(exe, 2)
                .env("SPAWN_SCENARIO", "ckpt")
                .env("MUTIRAO_CKPT_INTERVAL", "0.02")
                .checkpoints(sink.clone())
                .limit(Duration::from_secs(40))
                .run()?;
            all_ok(&o, 2, Some(0))?;
            let with_kids = epochs_with(&sink, &[0, 1, 2, 3]);
            if with_kids.is_empty() {
                return Err(format!(
                    "no committed epoch holds the checkpoints of both ranks and both children: {:?}",
                    committed_ranks(&sink)
                )
                .into());
            }
            Ok(())
        },
    ));
    trials.push(Trial::test(
        "a_spawn_outside_waves_keeps_its_children_out_of_them_and_waves_commit",
        || {
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            let sink = Arc::new(MemSink::default());
            let o = LocalJob::new(exe, 2)
                .env("SPAWN_SCENARIO", "outside")
                .env("MUTIRAO_CKPT_INTERVAL", "0.02")
                .checkpoints(sink.clone())
                .limit(Duration::from_secs(40))
                .run()?;
            all_ok(&o, 2, Some(0))?;
            let ranks: std::collections::BTreeSet<u32> =
                sink.blobs.lock().unwrap().keys().map(|(_, r)| *r).collect();
            if ranks.iter().any(|r| *r >= 2) {
                return Err(format!("spawned ranks stored checkpoints: {ranks:?}").into());
            }
            Ok(())
        },
    ));
    trials.push(Trial::test(
        "a_killed_rank_restarts_the_job_and_its_spawned_children_from_the_committed_epoch",
        || family_kill_and_restart("blocking"),
    ));
    trials.push(Trial::test(
        "a_spawn_after_the_committed_epoch_is_not_restored_and_the_program_spawns_again",
        spawn_after_the_epoch_is_made_again,
    ));
    trials.push(Trial::test(
        "nonblocking_a_killed_rank_restarts_the_job_and_its_spawned_children_from_the_committed_epoch",
        || family_kill_and_restart("nonblocking"),
    ));
    trials.push(Trial::test(
        "a_one_rank_job_spawns_a_child_that_spawns_a_grandchild",
        || {
            let o = launch("nested", 1, "auto", true)?;
            all_ok(&o, 2, Some(0))
        },
    ));
    trials.push(Trial::test(
        "a_dead_child_fails_merged_comm_operations_but_not_the_jobs_any_source_receives",
        || {
            let o = launch("childdies", 3, "auto", true)?;
            all_ok(&o, 1, Some(9))
        },
    ));
    trials.push(Trial::test(
        "spawn_of_a_missing_program_fails_and_the_job_goes_on",
        || {
            let o = launch("missing", 2, "auto", true)?;
            all_ok(&o, 0, None)
        },
    ));
    trials.push(Trial::test(
        "children_that_never_connect_fail_the_spawn_within_its_timeout_and_are_killed",
        || {
            let o = launch("never", 2, "auto", true)?;
            // The two `sleep 30`s were killed when the group timed out (no exit code).
            all_ok(&o, 2, None)?;
            if o.elapsed > Duration::from_secs(15) {
                return Err(format!("the job took {:?}: children not killed?", o.elapsed).into());
            }
            Ok(())
        },
    ));
    trials.push(Trial::test(
        "children_that_exit_at_once_fail_the_spawn_long_before_its_timeout",
        || {
            let o = launch("exits", 2, "auto", true)?;
            // The first `true` to end fails the group; the other has ended too, or is killed.
            let kids: Vec<_> = o.spawned.iter().map(|s| s.code).collect();
            let kids_ok = kids.len() == 2 && kids.iter().all(|c| matches!(c, Some(0) | None));
            if kids_ok && o.codes.iter().all(|c| *c == Some(0)) {
                Ok(())
            } else {
                Err(format!(
                    "exit codes {:?}, spawned {kids:?}\n{}",
                    o.codes,
                    o.stderr.join("\n")
                )
                .into())
            }
        },
    ));
    trials.push(Trial::test(
        "without_a_spawner_spawn_fails_clearly_and_the_job_goes_on",
        || {
            let o = launch("nospawner", 2, "auto", false)?;
            all_ok(&o, 0, None)
        },
    ));
    libtest_mimic::run(&args, trials).exit();
}
