//! Multi-process checkpoint tests (issue 12): N copies of this binary run as the ranks of one
//! job, with an in-test bootstrap server whose checkpoint sink is a map shared by the runs of a
//! test. A process started with `CK_SCENARIO` set is a rank.
//!
//! - `waves_commit_and_a_restart_resumes_with_the_same_result`: a loop (ring exchange,
//!   allreduce on the world and on a split communicator, a message left unreceived across each
//!   checkpoint point) with waves every 0.05 s commits epochs and ends with the result of a run
//!   without checkpoints; restarted from its last committed epoch, it resumes from the saved
//!   iteration and ends with the same result.
//! - `a_rank_dying_mid_wave_leaves_the_previous_epoch_committed`: a rank stalls (so a wave
//!   starts and the others wait for its cut) and dies; no blob of it exists above the last
//!   committed epoch, and restarting from that epoch finishes with the uninterrupted result.
//! - a rendezvous message crossing every checkpoint point: waves are abandoned at their
//!   timeout, none commits, the job finishes with the right result.
//! - large isends in flight at every checkpoint point (held by their senders, their places
//!   kept by their receivers), a rank killed after commits: restarts from the last and the
//!   first committed epoch end with the result of a run without checkpoints (both modes).
//! - the examples jacobi, ring and matmul, with waves and restarted, print the result of a run
//!   without checkpoints. They run the example binaries `cargo test -p mutirao` builds
//!   (`cargo test --test checkpoints` alone does not rebuild them: build with
//!   `cargo build -p mutirao --examples` first).

use libtest_mimic::{Arguments, Failed, Trial};
use mutirao::local_job::LocalJob;
use mutirao::op;
use mutirao::pmi::CheckpointSink;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// ------------------------------------------------------------------ the rank program

#[derive(Serialize, Deserialize)]
struct State {
    iter: u64,
    x: f64,
    hist: Vec<u64>,
}

fn env_u64(k: &str) -> Option<u64> {
    std::env::var(k).ok().and_then(|v| v.parse().ok())
}

fn rank_main() -> Result<(), String> {
    if std::env::var("CK_PROG").as_deref() == Ok("comms") {
        return comms_main();
    }
    let e = |err: mutirao::Error| err.to_string();
    let w = mutirao::init().map_err(e)?;
    let (r, n) = (w.rank(), w.size());
    let out = PathBuf::from(std::env::var("CK_OUT").map_err(|_| "CK_OUT unset")?);
    let iters = env_u64("CK_ITERS").unwrap_or(40);
    // Communicators are made again after a restart, in the same order: same context ids.
    let half = w
        .split(Some((r % 2) as u32), r as i32)
        .map_err(e)?
        .ok_or("split gave no communicator")?;
    let restored = w.restored::<State>().map_err(e)?;
    if env_u64("CK_EXPECT_RESTORE") == Some(1) {
        let rec = w.recovery().ok_or("a restart without recovery()")?;
        if restored.is_none() {
            return Err(format!("restart from epoch {} gave no state", rec.epoch));
        }
    }
    let mut st = restored.unwrap_or(State {
        iter: 0,
        x: r as f64,
        hist: Vec::new(),
    });
    std::fs::write(out.join(format!("start.{r}")), st.iter.to_string())
        .map_err(|x| x.to_string())?;
    if std::env::var("MUTIRAO_CKPT_INTERVAL").is_ok() && n > 1 && st.iter == 0 {
        // A checkpoint point with a large (rendezvous) send in flight is taken (the send is
        // held in a checkpoint, if a wave cuts here) and the message arrives whole, once.
        let big = w.isend(vec![7u64; 1 << 20], (r + 1) % n, 77).map_err(e)?;
        w.checkpoint_point(&st)
            .map_err(|x| format!("checkpoint point with a large isend in flight: {x}"))?;
        let (v, _) = w.recv_vec::<u64>((r + n - 1) % n, 77).map_err(e)?;
        big.wait().map_err(e)?;
        if v != vec![7u64; 1 << 20] {
            return Err("the large message came short".into());
        }
        if w.iprobe(mutirao::ANY_SOURCE, 77).map_err(e)?.is_some() {
            return Err("the large message came twice".into());
        }
    }
    // Large isends in flight at every checkpoint point (`CK_BIGISEND`): each rank's to the
    // next, received only after the receiver's checkpoint point (so never matched before its
    // cut: held), and rank 0's to rank 1 into a receive rank 1 posted before its checkpoint
    // point (rank 0 sends late, so the announcement comes after rank 1's cut). On a restart
    // the requests come back from `restored_requests`.
    let bigisend = env_u64("CK_BIGISEND") == Some(1) && n > 2;
    let mut ring_send: Option<mutirao::Request<u64>> = None;
    let mut send01: Option<mutirao::Request<u64>> = None;
    let mut recv01: Option<mutirao::Request<u64>> = None;
    for q in w.restored_requests() {
        match (q.is_recv(), q.tag()) {
            (false, Some(21)) => ring_send = Some(q.into_request().map_err(e)?),
            (false, Some(22)) => send01 = Some(q.into_request().map_err(e)?),
            (true, Some(22)) => recv01 = Some(q.into_request().map_err(e)?),
            _ => {}
        }
    }
    let big_of = |iter: u64, from: usize| -> Vec<u64> {
        (0..40_000u64).map(|i| i * iter + from as u64 * 7).collect()
    };
    let die = (env_u64("CK_DIE_RANK"), env_u64("CK_DIE_AT"));
    let big = env_u64("CK_BIG") == Some(1) && n > 2;
    while st.iter < iters {
        // A large (rendezvous) message sent before rank 0's checkpoint point and received after
        // rank 2's: it crosses every cut, so every wave must be abandoned, never hang.
        if big && r == 2 && st.iter > 0 {
            let (v, _) = w.recv_vec::<u64>(0, 11).map_err(e)?;
            st.hist.push(v.iter().sum::<u64>() % 1_000_003);
        }
        if bigisend && st.iter > 0 {
            let from = (r + n - 1) % n;
            let (v, _) = w.recv_vec::<u64>(from, 21).map_err(e)?;
            if v != big_of(st.iter, from) {
                return Err(format!(
                    "iteration {}: the large ring message differs",
                    st.iter
                ));
            }
            st.hist.push(v.iter().sum::<u64>() % 1_000_003);
            ring_send
                .take()
                .ok_or("no large ring send in flight")?
                .wait()
                .map_err(e)?;
            if r == 1 {
                let (v, _) = recv01
                    .take()
                    .ok_or("no receive from rank 0")?
                    .wait()
                    .map_err(e)?;
                if v != big_of(st.iter + 1000, 0) {
                    return Err(format!(
                        "iteration {}: rank 0's large message differs",
                        st.iter
                    ));
                }
                st.hist.push(v.iter().sum::<u64>() % 1_000_007);
            }
            if r == 0 {
                send01
                    .take()
                    .ok_or("no send to rank 1")?
                    .wait()
                    .map_err(e)?;
            }
        }
        // A message rank 0 sent before its last checkpoint point, received after ours.
        if r == 1 && st.iter > 0 {
            let mut b = [0u64];
            w.recv(&mut b, 0, 9).map_err(e)?;
            st.hist.push(b[0] * 1000);
        }
        let (to, from) = ((r + 1) % n, (r + n - 1) % n);
        let mut inb = [0f64];
        w.sendrecv(&[st.x], to, 1, &mut inb, from, 1).map_err(e)?;
        let mut s = [0f64];
        w.allreduce(&[inb[0]], &mut s, &op::Sum).map_err(e)?;
        let mut h = [0u64];
        half.allreduce(&[st.iter + r as u64], &mut h, &op::Sum)
            .map_err(e)?;
        st.x = (st.x * 0.5 + inb[0] * 0.25 + s[0] * 0.01).sin() + 1.0;
        st.hist.push(h[0]);
        st.iter += 1;
        if r == 0 && n > 1 && st.iter < iters {
            if env_u64("CK_SLOW0") == Some(1) {
                // Let rank 1 reach its checkpoint point first: in nonblocking mode this
                // message then arrives after its snapshot and before rank 0's cut (late).
                std::thread::sleep(Duration::from_millis(8));
            }
            w.send(&[st.iter], 1, 9).map_err(e)?;
            if bigisend {
                send01 = Some(w.isend(big_of(st.iter + 1000, 0), 1, 22).map_err(e)?);
            }
            if big {
                let v: Vec<u64> = (0..40_000).map(|i| i * st.iter).collect();
                w.send(&v, 2, 11).map_err(e)?;
            }
        }
        if bigisend && st.iter < iters {
            ring_send = Some(w.isend(big_of(st.iter, r), (r + 1) % n, 21).map_err(e)?);
            if r == 1 {
                recv01 = Some(w.irecv(0, 22).map_err(e)?);
            }
        }
        if die == (Some(r as u64), Some(st.iter)) {
            // Stall so that a wave starts and the others wait for this rank's cut, then die.
            std::thread::sleep(Duration::from_millis(400));
            std::process::exit(9);
        }
        std::thread::sleep(Duration::from_millis(4));
        w.checkpoint_point(&st).map_err(e)?;
    }
    let (committed, _aborted) = w.checkpoint_history();
    let res = format!("{} {:?}", st.x.to_bits(), st.hist);
    std::fs::write(out.join(format!("result.{r}")), res).map_err(|x| x.to_string())?;
    if r == 0 {
        std::fs::write(out.join("commits"), format!("{committed:?}")).map_err(|x| x.to_string())?;
    }
    w.finalize().map_err(e)
}

/// The state of the communicators scenario.
#[derive(Serialize, Deserialize)]
struct CommsState {
    iter: u64,
    acc: u64,
    hist: Vec<u64>,
}

/// Communicators and requests across checkpoints: a "row" communicator split at the start and
/// a "pair" one duplicated from it at iteration 5; a receive posted for the next iteration's
/// message and an eager isend are in flight at every checkpoint point. On a restart
/// (`CK_COMMS`): `restored` takes them back with `restored_comm`/`restored_requests`;
/// `remake` makes the communicators again in the same order; `wrong` makes "row" with other
/// colours (must be an error naming it). The dying rank (`CK_DIE_RANK`) exits at `CK_DIE_AT`.
fn comms_main() -> Result<(), String> {
    use mutirao::{Comm, Request};
    let e = |err: mutirao::Error| err.to_string();
    let w = mutirao::init().map_err(e)?;
    let (r, n) = (w.rank(), w.size());
    let out = PathBuf::from(std::env::var("CK_OUT").map_err(|_| "CK_OUT unset")?);
    let iters = env_u64("CK_ITERS").unwrap_or(40);
    let how = std::env::var("CK_COMMS").unwrap_or_default();
    let restored = w.restored::<CommsState>().map_err(e)?;
    let color = |r: usize| (r < n.div_ceil(2)) as u32;
    let make_row = |color: u32| -> Result<Comm, String> {
        let row = w
            .split(Some(color), -(r as i32))
            .map_err(e)?
            .ok_or("split gave no communicator")?;
        row.set_name("row").map_err(e)?;
        Ok(row)
    };
    let mut pend_recv: Option<Request<u64>> = None;
    let mut pend8: Option<Request<u64>> = None;
    let mut pend_send: Option<Request<u64>> = None;
    let (row, mut pair, mut st) = match restored {
        None => (
            make_row(color(r))?,
            None,
            CommsState {
                iter: 0,
                acc: r as u64 + 1,
                hist: Vec::new(),
            },
        ),
        Some(st) => {
            let (row, pair) = match how.as_str() {
                "restored" => {
                    let all = w.restored_comms();
                    let row = w.restored_comm("row").ok_or("no restored \"row\"")?;
                    let pair = w.restored_comm("pair");
                    if all.len() != 1 + usize::from(pair.is_some()) {
                        return Err(format!("{} restored communicators", all.len()));
                    }
                    (row, pair)
                }
                "wrong" => (make_row(1 - color(r))?, None),
                _ => {
                    let row = make_row(color(r))?;
                    let pair = if st.iter > 5 {
                        let p = row.dup().map_err(e)?;
                        p.set_name("pair").map_err(e)?;
                        Some(p)
                    } else {
                        None
                    };
                    (row, pair)
                }
            };
            let reqs = w.restored_requests();
            if reqs.len() != 3 {
                return Err(format!("{} restored requests: {reqs:?}", reqs.len()));
            }
            for q in reqs {
                if q.comm().name().as_deref() != Some("row") {
                    return Err(format!("a restored request on {:?}", q.comm().name()));
                }
                match (q.is_recv(), q.tag()) {
                    (true, Some(5)) => pend_recv = Some(q.into_request().map_err(e)?),
                    (true, Some(8)) => pend8 = Some(q.into_request().map_err(e)?),
                    (false, Some(6)) => pend_send = Some(q.into_request().map_err(e)?),
                    other => return Err(format!("unexpected restored request {other:?}")),
                }
            }
            (row, pair, st)
        }
    };
    std::fs::write(out.join(format!("start.{r}")), st.iter.to_string())
        .map_err(|x| x.to_string())?;
    let (rr, rn) = (row.rank(), row.size());
    let (right, left) = ((rr + 1) % rn, (rr + rn - 1) % rn);
    let die = (env_u64("CK_DIE_RANK"), env_u64("CK_DIE_AT"));
    loop {
        // After the checkpoint point: the message sent before the sender's checkpoint point
        // (already in, or late), the isend's buffer back, its message received.
        if let Some(q) = pend8.take() {
            let (v, _) = q.wait().map_err(e)?;
            st.hist.push(v[0] % 977);
        }
        if let Some(s6) = pend_send.take() {
            let (buf, _) = s6.wait().map_err(e)?;
            let (x, _) = row.recv_vec::<u64>(left, 6).map_err(e)?;
            st.hist.push(x[0] ^ buf[0].rotate_left(7));
        }
        if st.iter >= iters {
            break;
        }
        if pend_recv.is_none() {
            pend_recv = Some(row.irecv::<u64>(left, 5).map_err(e)?);
        }
        row.send(&[st.acc.wrapping_mul(31) + st.iter], right, 5)
            .map_err(e)?;
        let (v, _) = pend_recv.take().ok_or("no receive")?.wait().map_err(e)?;
        let mut s = [0u64];
        w.allreduce(&[v[0] % 1_000_003], &mut s, &op::Sum)
            .map_err(e)?;
        st.acc = st.acc.wrapping_mul(6364136223846793005).wrapping_add(s[0]);
        if let Some(p) = &pair {
            let mut m = [0u64];
            p.allreduce(&[st.acc % 1000], &mut m, &op::Max).map_err(e)?;
            st.hist.push(m[0]);
        }
        if st.iter == 5 {
            let p = row.dup().map_err(e)?;
            p.set_name("pair").map_err(e)?;
            pair = Some(p);
        }
        // In flight at the checkpoint point: the receive of the next iteration's message (its
        // sender sends it after its own checkpoint point), a receive of a message its sender
        // sends before its checkpoint point (rank 0 late: in nonblocking mode it arrives after
        // the receiver's snapshot, as channel state), and an eager send.
        pend_recv = Some(row.irecv::<u64>(left, 5).map_err(e)?);
        pend8 = Some(row.irecv::<u64>(left, 8).map_err(e)?);
        pend_send = Some(row.isend(vec![st.acc], right, 6).map_err(e)?);
        if r == 0 {
            std::thread::sleep(Duration::from_millis(6));
        }
        row.send(&[st.acc ^ 0x5555], right, 8).map_err(e)?;
        st.iter += 1;
        if die == (Some(r as u64), Some(st.iter)) {
            std::thread::sleep(Duration::from_millis(100));
            std::process::exit(9);
        }
        std::thread::sleep(Duration::from_millis(3));
        w.checkpoint_point(&st).map_err(e)?;
    }
    drop(pend_recv);
    let res = format!("{} {:?}", st.acc, st.hist);
    std::fs::write(out.join(format!("result.{r}")), res).map_err(|x| x.to_string())?;
    w.finalize().map_err(e)
}

// ------------------------------------------------------------------ the launcher side

#[derive(Default)]
struct MapSink {
    blobs: Mutex<BTreeMap<(u64, u32), Vec<u8>>>,
    committed: Mutex<Vec<u64>>,
}

impl CheckpointSink for MapSink {
    fn put(&self, epoch: u64, rank: u32, blob: &[u8]) -> Result<(), String> {
        self.blobs
            .lock()
            .map_err(|_| "poisoned")?
            .insert((epoch, rank), blob.to_vec());
        Ok(())
    }
    fn get(&self, epoch: u64, rank: u32) -> Result<Vec<u8>, String> {
        self.blobs
            .lock()
            .map_err(|_| "poisoned")?
            .get(&(epoch, rank))
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

struct Outcome {
    /// Channel failures the ranks reported to the launcher.
    failures: Vec<mutirao::pmi::FailureReport>,
    codes: Vec<Option<i32>>,
    stderr: Vec<String>,
    stdout: Vec<String>,
}

fn launch(
    n: usize,
    sink: &Arc<MapSink>,
    out: &Path,
    env: &[(&str, String)],
    limit: Duration,
) -> Result<Outcome, Failed> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    launch_prog(&exe, &[], n, sink, out, env, limit)
}

fn launch_prog(
    exe: &Path,
    args: &[&str],
    n: usize,
    sink: &Arc<MapSink>,
    out: &Path,
    env: &[(&str, String)],
    limit: Duration,
) -> Result<Outcome, Failed> {
    let per = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect::<Vec<_>>();
    std::fs::create_dir_all(out).map_err(|e| e.to_string())?;
    let mut job = LocalJob::new(exe, n)
        .args(args.iter().copied())
        .env("CK_SCENARIO", "loop")
        .env("CK_OUT", out.to_string_lossy())
        .checkpoints(sink.clone())
        .limit(limit);
    for (k, v) in per {
        job = job.env(k, v);
    }
    let o = job
        .run()
        .map_err(|e| e.replace(&format!("{} on {n} ranks ", exe.display()), "the job "))?;
    Ok(Outcome {
        failures: o.failures,
        codes: o.codes,
        stderr: o.stderr,
        stdout: o.stdout,
    })
}

fn results(out: &Path, n: usize) -> Result<Vec<String>, Failed> {
    (0..n)
        .map(|r| {
            std::fs::read_to_string(out.join(format!("result.{r}")))
                .map_err(|e| format!("rank {r} wrote no result: {e}").into())
        })
        .collect()
}

fn all_ok(o: &Outcome, what: &str) -> Result<(), Failed> {
    if o.codes.iter().all(|c| *c == Some(0)) {
        return Ok(());
    }
    Err(format!("{what}: exit codes {:?}; stderr: {:?}", o.codes, o.stderr).into())
}

/// Rank 1 died with status 9 (`CK_DIE_RANK`).
fn rank1_died(o: &Outcome) -> Result<(), Failed> {
    if o.codes[1] != Some(9) {
        return Err(format!(
            "rank 1 should have died with 9: {:?} {:?}",
            o.codes, o.stderr
        )
        .into());
    }
    Ok(())
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mutirao-ck-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

const N: usize = 3;
const ITERS: u64 = 50;

fn ckpt_env() -> Vec<(&'static str, String)> {
    ckpt_env_mode("blocking")
}

fn ckpt_env_mode(mode: &str) -> Vec<(&'static str, String)> {
    vec![
        ("MUTIRAO_CKPT_MODE", mode.to_string()),
        ("CK_SLOW0", "1".to_string()),
        ("CK_ITERS", ITERS.to_string()),
        ("MUTIRAO_CKPT_INTERVAL", "0.05".into()),
        ("MUTIRAO_CKPT_TIMEOUT", "5".into()),
    ]
}

fn reference(name: &str) -> Result<Vec<String>, Failed> {
    let out = scratch(name);
    let sink = Arc::new(MapSink::default());
    let o = launch(
        N,
        &sink,
        &out,
        &[("CK_ITERS", ITERS.to_string())],
        Duration::from_secs(60),
    )?;
    all_ok(&o, "uninterrupted run without checkpoints")?;
    let r = results(&out, N)?;
    let _ = std::fs::remove_dir_all(&out);
    Ok(r)
}

fn restart_matches(
    sink: &Arc<MapSink>,
    epoch: u64,
    want: &[String],
    name: &str,
) -> Result<(), Failed> {
    restart_matches_with(sink, epoch, want, name, ckpt_env())
}

/// [`restart_matches`] with `env` (checkpoint settings and scenario) for the restarted ranks.
fn restart_matches_with(
    sink: &Arc<MapSink>,
    epoch: u64,
    want: &[String],
    name: &str,
    mut env: Vec<(&'static str, String)>,
) -> Result<(), Failed> {
    let out = scratch(name);
    env.push(("MUTIRAO_RESTART_EPOCH", epoch.to_string()));
    env.push(("MUTIRAO_INCARNATION", "1".into()));
    env.push(("CK_EXPECT_RESTORE", "1".into()));
    let o = launch(N, sink, &out, &env, Duration::from_secs(60))?;
    all_ok(&o, &format!("restart from epoch {epoch}"))?;
    let start: u64 = std::fs::read_to_string(out.join("start.0"))
        .map_err(|e| e.to_string())?
        .parse()
        .map_err(|_| "bad start file")?;
    if start == 0 {
        return Err(format!("the restart from epoch {epoch} began at iteration 0").into());
    }
    let got = results(&out, N)?;
    let _ = std::fs::remove_dir_all(&out);
    if got != want {
        return Err(format!("restart from epoch {epoch} (iteration {start}) ended with {got:?}, the uninterrupted run with {want:?}").into());
    }
    Ok(())
}

fn waves_commit_and_restart(mode: &str) -> Result<(), Failed> {
    let want = reference(&format!("ref-waves-{mode}"))?;
    let sink = Arc::new(MapSink::default());
    let out = scratch(&format!("waves-{mode}"));
    let o = launch(
        N,
        &sink,
        &out,
        &ckpt_env_mode(mode),
        Duration::from_secs(60),
    )?;
    all_ok(&o, "run with checkpoints")?;
    let got = results(&out, N)?;
    let commits = std::fs::read_to_string(out.join("commits")).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&out);
    if got != want {
        return Err(format!("checkpointing changed the result: {got:?} vs {want:?}").into());
    }
    let committed = sink.committed.lock().unwrap().clone();
    if committed.is_empty() {
        return Err(format!(
            "no epoch committed (rank 0 saw {commits}); stderr {:?}",
            o.stderr
        )
        .into());
    }
    if !committed.windows(2).all(|w| w[0] < w[1]) {
        return Err(format!("epochs committed out of order: {committed:?}").into());
    }
    for e in &committed {
        for r in 0..N as u32 {
            if !sink.blobs.lock().unwrap().contains_key(&(*e, r)) {
                return Err(format!("epoch {e} committed without rank {r}'s blob").into());
            }
        }
    }
    // How much channel state (late messages) and unexpected state the committed epochs hold.
    let (mut late, mut unexpected) = (0, 0);
    for e in &committed {
        for r in 0..N as u32 {
            let blob = sink.blobs.lock().unwrap()[&(*e, r)].clone();
            let c = mutirao::ckpt::RankCheckpoint::decode(&blob, *e, r, N as u32)?;
            late += c.late.len();
            unexpected += c.unexpected.len();
        }
    }
    if mode == "blocking" && late > 0 {
        return Err(format!("blocking mode recorded {late} late messages").into());
    }
    if mode == "nonblocking" && late == 0 {
        return Err("nonblocking mode recorded no late message although rank 0 sends late".into());
    }
    println!(
        "{mode}: {} epochs committed, {late} late and {unexpected} unexpected messages saved",
        committed.len()
    );
    let last = *committed.last().unwrap();
    restart_matches(&sink, last, &want, &format!("restart-{mode}"))?;
    // An earlier epoch restores too.
    restart_matches(&sink, committed[0], &want, &format!("restart-first-{mode}"))
}

/// Large isends in flight at every checkpoint point (`CK_BIGISEND`, rendezvous above 16 KiB):
/// waves commit with them held, rank 1 is killed (with its own large isend in flight) after
/// commits, and restarts from the last and the first committed epoch end with the result of
/// the run without checkpoints.
fn large_isends_in_flight_survive_a_kill(mode: &str) -> Result<(), Failed> {
    let big = || {
        vec![
            ("CK_BIGISEND", "1".to_string()),
            ("MUTIRAO_EAGER_LIMIT", "16384".to_string()),
        ]
    };
    let out = scratch(&format!("ref-bigisend-{mode}"));
    let mut env = big();
    env.push(("CK_ITERS", ITERS.to_string()));
    let o = launch(
        N,
        &Arc::new(MapSink::default()),
        &out,
        &env,
        Duration::from_secs(60),
    )?;
    all_ok(&o, "large isends without checkpoints")?;
    let want = results(&out, N)?;
    let _ = std::fs::remove_dir_all(&out);

    let sink = Arc::new(MapSink::default());
    let out = scratch(&format!("bigisend-{mode}"));
    let mut env = ckpt_env_mode(mode);
    env.extend(big());
    env.push(("CK_DIE_RANK", "1".into()));
    env.push(("CK_DIE_AT", "35".into()));
    let o = launch(N, &sink, &out, &env, Duration::from_secs(60))?;
    let _ = std::fs::remove_dir_all(&out);
    rank1_died(&o)?;
    let committed = sink.committed.lock().unwrap().clone();
    let (Some(&first), Some(&last)) = (committed.first(), committed.last()) else {
        return Err(format!("no epoch committed before the kill; stderr {:?}", o.stderr).into());
    };
    // Every committed epoch holds each rank's large ring send, and each receiver keeps as
    // many places for a sender's held messages as that sender holds for it.
    let (mut held_total, mut late_places, mut pending22) = (0, 0, 0);
    for e in &committed {
        let blobs: Vec<mutirao::ckpt::RankCheckpoint> = (0..N as u32)
            .map(|r| {
                let b = sink.blobs.lock().unwrap()[&(*e, r)].clone();
                mutirao::ckpt::RankCheckpoint::decode(&b, *e, r, N as u32)
            })
            .collect::<Result<_, _>>()?;
        late_places += blobs[1].resent.iter().filter(|p| p.late).count();
        pending22 += blobs[1]
            .requests
            .iter()
            .filter(|q| {
                matches!(
                    q.state,
                    mutirao::ckpt::SavedRequestState::Recv { tag: Some(22), .. }
                )
            })
            .count();
        for (s, c) in blobs.iter().enumerate() {
            for (d, rc) in blobs.iter().enumerate() {
                let held = c
                    .requests
                    .iter()
                    .filter(|q| {
                        matches!(q.state, mutirao::ckpt::SavedRequestState::Held { dest, .. } if dest as usize == d)
                    })
                    .count();
                let places = rc.resent.iter().filter(|p| p.source as usize == s).count();
                if held != places {
                    return Err(format!(
                        "epoch {e}: rank {s} holds {held} sends to rank {d}, which keeps {places} places for them"
                    )
                    .into());
                }
                held_total += held;
            }
        }
    }
    if held_total < committed.len() * N {
        return Err(format!(
            "{held_total} held sends in {} committed epochs: each rank's large ring send should be held in every one",
            committed.len()
        )
        .into());
    }
    // Rank 0 sends late (CK_SLOW0): its announcement reaches rank 1 after rank 1's cut, so
    // rank 1 keeps its place in channel state (nonblocking) or saves the receive it matched
    // after its cut as pending (blocking).
    if mode == "nonblocking" && late_places == 0 {
        return Err("nonblocking: no committed epoch keeps a place in channel state".into());
    }
    if mode == "blocking" && pending22 == 0 {
        return Err(
            "blocking: no committed epoch has rank 1's receive of rank 0's large message pending"
                .into(),
        );
    }
    println!(
        "{mode}: {} epochs committed with {held_total} held large sends; rank 1 kept {late_places} \
         places in channel state and {pending22} receives of rank 0's large message pending",
        committed.len()
    );
    for (epoch, name) in [(last, "last"), (first, "first")] {
        let mut env = ckpt_env_mode(mode);
        env.extend(big());
        restart_matches_with(
            &sink,
            epoch,
            &want,
            &format!("bigisend-restart-{name}-{mode}"),
            env,
        )?;
    }
    Ok(())
}

fn killed_mid_wave() -> Result<(), Failed> {
    let want = reference("ref-kill")?;
    let sink = Arc::new(MapSink::default());
    let out = scratch("kill");
    let mut env = ckpt_env();
    env.push(("CK_DIE_RANK", "1".into()));
    env.push(("CK_DIE_AT", "35".into()));
    let o = launch(N, &sink, &out, &env, Duration::from_secs(60))?;
    let _ = std::fs::remove_dir_all(&out);
    // The survivors told the launcher which channel broke.
    let reported: Vec<(u32, u32)> = o.failures.iter().map(|f| (f.rank, f.peer)).collect();
    if !reported.contains(&(0, 1)) || !reported.contains(&(2, 1)) {
        return Err(format!(
            "ranks 0 and 2 should have reported rank 1: {:?}",
            o.failures
        )
        .into());
    }
    if o.codes[1] != Some(9) || o.codes.iter().all(|c| *c == Some(0)) {
        return Err(format!("rank 1 should have died alone with 9: {:?}", o.codes).into());
    }
    let committed = sink.committed.lock().unwrap().clone();
    let Some(&last) = committed.last() else {
        return Err(format!(
            "no epoch committed before the failure; stderr {:?}",
            o.stderr
        )
        .into());
    };
    // The wave under way when rank 1 died never committed: rank 1 stored nothing after `last`.
    let later: Vec<_> = sink
        .blobs
        .lock()
        .unwrap()
        .keys()
        .filter(|(e, r)| *e > last && *r == 1)
        .copied()
        .collect();
    if !later.is_empty() {
        return Err(
            format!("rank 1 stored {later:?} after the last committed epoch {last}").into(),
        );
    }
    restart_matches(&sink, last, &want, "kill-restart")
}

/// An example with waves, then restarted from its last committed epoch: both print what a run
/// without checkpoints prints (each example also checks its own result).
fn example_restarts(name: &str, args: &[&str], resume_note: Option<&str>) -> Result<(), Failed> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let Some(prog) = exe
        .parent()
        .and_then(|d| d.parent())
        .map(|d| d.join("examples").join(name))
        .filter(|p| p.exists())
    else {
        println!("skipped: the {name} example is not built (run `cargo test -p mutirao`, which builds it)");
        return Ok(());
    };
    let line = |o: &Outcome| -> String {
        o.stdout[0]
            .lines()
            .find(|l| l.starts_with(name))
            .map(|l| l.split(" elapsed_s").next().unwrap_or("").to_string())
            .unwrap_or_default()
    };
    let sink = Arc::new(MapSink::default());
    let out = scratch(name);
    let limit = Duration::from_secs(60);
    let plain = launch_prog(&prog, args, N, &sink, &out, &[], limit)?;
    all_ok(&plain, &format!("{name} without checkpoints"))?;
    // Waves every 20 ms, or often enough for several in the run: an optimized build of the
    // example runs 400 Jacobi iterations in ~5 ms, inside the first interval.
    let elapsed: f64 = plain.stdout[0]
        .lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split("elapsed_s=").nth(1))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("{name} printed no elapsed_s: {:?}", plain.stdout))?;
    let interval = (elapsed / 5.0).clamp(0.0005, 0.02);
    let env = vec![
        ("MUTIRAO_CKPT_INTERVAL", format!("{interval:.4}")),
        ("MUTIRAO_CKPT_TIMEOUT", "5".to_string()),
    ];
    let waves = launch_prog(&prog, args, N, &sink, &out, &env, limit)?;
    all_ok(&waves, &format!("{name} with checkpoints"))?;
    let Some(last) = sink.committed.lock().unwrap().last().copied() else {
        return Err(format!("{name} committed no epoch: {:?}", waves.stderr).into());
    };
    let mut env2 = env.clone();
    env2.push(("MUTIRAO_RESTART_EPOCH", last.to_string()));
    let again = launch_prog(&prog, args, N, &sink, &out, &env2, limit)?;
    all_ok(&again, &format!("{name} restarted from epoch {last}"))?;
    let _ = std::fs::remove_dir_all(&out);
    if let Some(note) = resume_note {
        if !again.stderr[0].contains(note) {
            return Err(format!("the restart did not resume: {:?}", again.stderr).into());
        }
    }
    let (a, b, c) = (line(&plain), line(&waves), line(&again));
    if a.is_empty() || a != b || a != c {
        return Err(format!("{name}: plain run {a:?}, with waves {b:?}, restarted {c:?}").into());
    }
    Ok(())
}

fn large_message_across_checkpoint_points() -> Result<(), Failed> {
    // Rendezvous above 4 KiB on every transport (shared memory's default limit is the ring).
    let plain = [
        ("CK_ITERS", "30".to_string()),
        ("CK_BIG", "1".to_string()),
        ("MUTIRAO_EAGER_LIMIT", "4096".to_string()),
    ];
    let sink = Arc::new(MapSink::default());
    let out = scratch("big-ref");
    let o = launch(N, &sink, &out, &plain, Duration::from_secs(60))?;
    all_ok(&o, "large messages without checkpoints")?;
    let want = results(&out, N)?;
    let out = scratch("big");
    let mut env = plain.to_vec();
    env.push(("MUTIRAO_CKPT_INTERVAL", "0.05".into()));
    env.push(("MUTIRAO_CKPT_TIMEOUT", "0.3".into()));
    let t = Instant::now();
    let o = launch(N, &sink, &out, &env, Duration::from_secs(60))?;
    all_ok(&o, "large messages with checkpoints")?;
    let got = results(&out, N)?;
    let _ = std::fs::remove_dir_all(&out);
    if got != want {
        return Err(format!("result changed: {got:?} vs {want:?}").into());
    }
    if !o.stderr[0].contains("abandoned") {
        return Err(format!(
            "no wave was abandoned although a message crosses every checkpoint point (took {:?}): {:?}",
            t.elapsed(),
            o.stderr
        )
        .into());
    }
    // Rank 0 sends no large message after the last safe point (CK_ITERS = 30), so a wave cut
    // there is consistent and may commit; a wave cut at any earlier safe point has a
    // rendezvous message crossing it and must not.
    let committed = sink.committed.lock().unwrap().clone();
    let blobs = sink.blobs.lock().unwrap().clone();
    for e in &committed {
        let blob = blobs
            .get(&(*e, 0))
            .ok_or_else(|| format!("epoch {e} committed without rank 0's checkpoint"))?;
        let c = mutirao::ckpt::RankCheckpoint::decode(blob, *e, 0, N as u32)?;
        let st: State = bincode::deserialize(&c.app).map_err(|x| x.to_string())?;
        if st.iter < 30 {
            return Err(format!(
                "epoch {e} committed at safe point {} across a message in flight (committed: {committed:?})",
                st.iter
            )
            .into());
        }
    }
    Ok(())
}

/// The communicators scenario: a failure-free run without checkpoints; a run with waves whose
/// rank 1 dies; restarts from the last committed epoch taking communicators and requests back,
/// making the communicators again, and making "row" wrongly (a clear error naming it).
fn comms_and_pending_requests(mode: &str) -> Result<(), Failed> {
    let base = vec![
        ("CK_PROG", "comms".to_string()),
        ("CK_ITERS", "60".to_string()),
    ];
    let sink = Arc::new(MapSink::default());
    let out = scratch(&format!("comms-ref-{mode}"));
    let o = launch(N, &sink, &out, &base, Duration::from_secs(60))?;
    all_ok(&o, "the communicators scenario without checkpoints")?;
    let want = results(&out, N)?;
    let _ = std::fs::remove_dir_all(&out);

    let mut env = base.clone();
    env.extend([
        ("MUTIRAO_CKPT_MODE", mode.to_string()),
        ("MUTIRAO_CKPT_INTERVAL", "0.03".to_string()),
        ("MUTIRAO_CKPT_TIMEOUT", "5".to_string()),
        ("CK_DIE_RANK", "1".to_string()),
        ("CK_DIE_AT", "45".to_string()),
    ]);
    let out = scratch(&format!("comms-{mode}"));
    let o = launch(N, &sink, &out, &env, Duration::from_secs(60))?;
    let _ = std::fs::remove_dir_all(&out);
    rank1_died(&o)?;
    let committed = sink.committed.lock().unwrap().clone();
    let Some(&last) = committed.last() else {
        return Err(format!("no epoch committed before the failure: {:?}", o.stderr).into());
    };
    // The committed epoch has what this test is about: the communicator table (row, and pair
    // once it exists) and, on every rank, a pending receive, a receive pending or completed,
    // and a finished send. Blocking mode: rank 1's receive from rank 0 completed before the
    // snapshot; nonblocking mode: it is pending and its message late (channel state) in some
    // committed epoch.
    let mut late8 = 0;
    for &ep in &committed {
        let blob = sink.blobs.lock().unwrap()[&(ep, 1)].clone();
        let c = mutirao::ckpt::RankCheckpoint::decode(&blob, ep, 1, N as u32)?;
        late8 += c.late.iter().filter(|m| m.tag == 8).count();
    }
    println!(
        "{mode}: {} epochs committed, {late8} late messages into pending receives",
        committed.len()
    );
    if mode == "nonblocking" && late8 == 0 {
        return Err("no committed epoch has a late message for rank 1's pending receive".into());
    }
    for r in 0..N as u32 {
        let blob = sink.blobs.lock().unwrap()[&(last, r)].clone();
        let c = mutirao::ckpt::RankCheckpoint::decode(&blob, last, r, N as u32)?;
        let names: Vec<_> = c.comms.iter().filter_map(|s| s.name.clone()).collect();
        if !names.contains(&"row".to_string()) || !names.contains(&"pair".to_string()) {
            return Err(format!("epoch {last} rank {r}: communicator table {:?}", c.comms).into());
        }
        let kinds: Vec<_> = c
            .requests
            .iter()
            .map(|q| match q.state {
                mutirao::ckpt::SavedRequestState::Recv { .. } => "recv",
                mutirao::ckpt::SavedRequestState::Received { .. } => "received",
                mutirao::ckpt::SavedRequestState::Sent { .. } => "sent",
                mutirao::ckpt::SavedRequestState::Held { .. } => "held",
            })
            .collect();
        let second = if mode == "blocking" && r == 1 {
            "received"
        } else {
            kinds.get(1).copied().unwrap_or("")
        };
        if kinds != ["recv", second, "sent"] || !["recv", "received"].contains(&second) {
            return Err(format!("epoch {last} rank {r}: requests {kinds:?}").into());
        }
    }
    // Restored communicators, then again from an epoch the restored run committed (its
    // re-posted requests and its table checkpointed in turn); then made again in order.
    let runs = [("restored", last), ("restored-again", 0), ("remake", last)];
    for (i, &(how, mut epoch)) in runs.iter().enumerate() {
        if how == "restored-again" {
            let now = *sink.committed.lock().unwrap().last().unwrap_or(&0);
            if now <= last {
                return Err("the restored run committed no epoch".into());
            }
            epoch = now;
        }
        let last = epoch;
        let how = how.trim_end_matches("-again");
        let out = scratch(&format!("comms-{mode}-{how}-{i}"));
        let mut env2 = base.clone();
        env2.extend([
            ("MUTIRAO_CKPT_MODE", mode.to_string()),
            ("MUTIRAO_CKPT_INTERVAL", "0.03".to_string()),
            ("MUTIRAO_CKPT_TIMEOUT", "5".to_string()),
            ("MUTIRAO_RESTART_EPOCH", last.to_string()),
            ("MUTIRAO_INCARNATION", (i + 1).to_string()),
            ("CK_COMMS", how.to_string()),
        ]);
        let o = launch(N, &sink, &out, &env2, Duration::from_secs(60))?;
        all_ok(&o, &format!("restart from epoch {last} ({how})"))?;
        let start = std::fs::read_to_string(out.join("start.0")).map_err(|e| e.to_string())?;
        let got = results(&out, N)?;
        let _ = std::fs::remove_dir_all(&out);
        if start == "0" {
            return Err(format!("the restart ({how}) began at iteration 0").into());
        }
        if got != want {
            return Err(format!(
                "restart from epoch {last} ({how}, iteration {start}) ended with {got:?}, the failure-free run with {want:?}"
            )
            .into());
        }
    }
    let out = scratch(&format!("comms-{mode}-wrong"));
    let mut env3 = base;
    env3.extend([
        ("MUTIRAO_RESTART_EPOCH", last.to_string()),
        ("CK_COMMS", "wrong".to_string()),
    ]);
    let o = launch(N, &sink, &out, &env3, Duration::from_secs(60))?;
    let _ = std::fs::remove_dir_all(&out);
    if o.codes.contains(&Some(0)) {
        return Err(format!("a disagreeing split was accepted: {:?}", o.codes).into());
    }
    for (r, err) in o.stderr.iter().enumerate() {
        if !err.contains("communicator \"row\"") || !err.contains("restored from the checkpoint") {
            return Err(format!("rank {r}: no clear error naming \"row\": {err:?}").into());
        }
    }
    Ok(())
}

fn main() {
    if std::env::var("CK_SCENARIO").is_ok() {
        match rank_main() {
            Ok(()) => std::process::exit(0),
            Err(e) => {
                eprintln!("rank failed: {e}");
                std::process::exit(1);
            }
        }
    }
    let args = Arguments::from_args();
    let trials = vec![
        Trial::test(
            "waves_commit_and_a_restart_resumes_with_the_same_result",
            || waves_commit_and_restart("blocking"),
        ),
        Trial::test(
            "nonblocking_waves_commit_and_a_restart_resumes_with_the_same_result",
            || waves_commit_and_restart("nonblocking"),
        ),
        Trial::test(
            "a_rank_dying_mid_wave_leaves_the_previous_epoch_committed",
            killed_mid_wave,
        ),
        Trial::test(
            "split_communicators_and_a_pending_irecv_survive_a_kill_and_restart",
            || comms_and_pending_requests("blocking"),
        ),
        Trial::test(
            "nonblocking_split_communicators_and_a_pending_irecv_survive_a_kill_and_restart",
            || comms_and_pending_requests("nonblocking"),
        ),
        Trial::test(
            "a_rank_killed_with_large_isends_in_flight_restarts_with_the_same_result",
            || large_isends_in_flight_survive_a_kill("blocking"),
        ),
        Trial::test(
            "nonblocking_a_rank_killed_with_large_isends_in_flight_restarts_with_the_same_result",
            || large_isends_in_flight_survive_a_kill("nonblocking"),
        ),
        Trial::test(
            "a_large_message_across_checkpoint_points_abandons_waves_and_never_hangs",
            large_message_across_checkpoint_points,
        ),
        Trial::test("jacobi_example_restarts_with_the_same_checksum", || {
            example_restarts(
                "jacobi",
                &["--n", "48", "--iters", "400"],
                Some("resumes at iteration"),
            )
        }),
        Trial::test("ring_example_restarts_with_the_same_result", || {
            example_restarts("ring", &["150", "64", "300"], None)
        }),
        Trial::test("matmul_example_restarts_with_the_same_result", || {
            example_restarts("matmul", &["300"], None)
        }),
    ];
    let conclusion = libtest_mimic::run(&args, trials);
    remove_scratch_dirs();
    conclusion.exit();
}

/// Remove every scratch directory this test process made (`mutirao-ck-PID-…` in the temporary
/// directory), also those of failed trials, once all trials have run.
fn remove_scratch_dirs() {
    let mine = format!("mutirao-ck-{}-", std::process::id());
    if let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with(&mine) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}
