//! Recovery on an emulated grid (needs root; without it each test prints `skipped: …` and
//! returns): three testbed hosts, an agent in each (`common::up_with_agents`), jacobi with
//! checkpoints on all three — the failure scenarios of digest 004 §15.5:
//! - a rank killed (SIGKILL) on its host once an epoch is committed, with the default store
//!   (replicas on two agents other than each rank's host), or the agent of a host holding
//!   replicas killed with everything it started: every rank restarts from the committed epoch,
//!   read from the replicas on the other hosts;
//! - a rank killed during a wave (its blob not stored yet): the previous committed epoch is used;
//! - a host's network goes down (its link set down: no socket is closed, nothing exits): the
//!   launcher notices the missing heartbeats and restarts every rank on the two hosts left;
//! - on the restart, a rank that never reaches the start-up barrier: the others time out, the
//!   job is recovered again, nothing blocks;
//! - a registration with the previous incarnation's job token, from a testbed host: refused;
//! - a failure during recovery (a rank of the restarted incarnation killed before the barrier):
//!   the incarnation rises again and the job finishes;
//! - a rank killed before any checkpoint is committed: the job restarts from scratch.
//!
//! Each ends with the failure-free run's checksum. The per-scenario behaviour is driven by a
//! wrapper script around jacobi that acts on `MUTIRAO_INCARNATION` and `MUTIRAO_RANK`.

mod common;
use common::{
    agent_ckpt_files, checksum, committed, dir_blob, jacobi_wrapper, kill9, poll, restart_epoch,
    resumed, up_with_agents, Ended, Grid,
};

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

const SPEC: &str = r#"
[[site]]
name = "lab"
nic_mbit = 1000
hosts = [ { name = "h1", cpu = 1.0 }, { name = "h2", cpu = 1.0 }, { name = "h3", cpu = 1.0 } ]
"#;

/// jacobi's arguments for most scenarios: a few seconds on the testbed.
const ARGS: [&str; 4] = ["--n", "96", "--iters", "4000"];

/// How long a test waits for the launcher (a job takes a few seconds; the bound only keeps a
/// broken recovery from hanging the suite).
const LIMIT: Duration = Duration::from_secs(90);

/// The store options of the scenarios that watch the directory store.
fn dir_store(g: &Grid) -> Vec<String> {
    vec![
        "--checkpoint-store".into(),
        "dir".into(),
        "--checkpoint-dir".into(),
        g.dir.join("ckpt").display().to_string(),
    ]
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// A wrapper around jacobi in the grid's scratch directory (see `common::jacobi_wrapper`).
fn wrapper(g: &Grid, name: &str, cases: &str) -> PathBuf {
    jacobi_wrapper(&g.dir.0, &g.jacobi, name, cases)
}

/// The job ended well, with the failure-free checksum.
fn assert_same_result(g: &Grid, out: &Ended) {
    let (so, se) = (&out.stdout, &out.stderr);
    assert!(out.status.success(), "{so}\n{se}");
    assert_eq!(
        checksum(so).as_deref(),
        Some(g.want.as_str()),
        "not the failure-free result:\n{so}\n{se}"
    );
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) with a pid read from /proc; no memory is involved.
    unsafe {
        libc::kill(pid, sig);
    }
}

#[test]
fn a_rank_killed_on_a_testbed_host_restarts_from_replicas_on_the_other_hosts() {
    replicas_on_testbed_agents(false);
}

#[test]
fn a_testbed_agent_killed_with_its_replicas_restores_from_the_other_hosts() {
    replicas_on_testbed_agents(true);
}

/// Jacobi on three testbed hosts with the default checkpoint store (no `--checkpoint-store`:
/// with three agents, two replicas per blob on agents other than the rank's). Once epoch 2's
/// blobs are on the agents, either rank 1 is killed on its host, or the third host's agent is
/// killed (taking its replicas and rank 2 with it).
fn replicas_on_testbed_agents(kill_agent: bool) {
    let tag = if kill_agent { "agent" } else { "rank" };
    let Some(g) = up_with_agents(tag, SPEC, 3, &ARGS) else {
        return;
    };
    let mut run = g.run(&["--checkpoint-interval", "0.3"], &g.jacobi, &[]);
    let killed = poll(&mut run, || {
        let epoch2 = g.stores.iter().any(|s| {
            agent_ckpt_files(s)
                .iter()
                .any(|f| f.split('/').nth(2) == Some("2"))
        });
        let pid = if kill_agent {
            Some(g.agents[2] as i32)
        } else {
            g.rank_pid(1, Some(0))
        };
        match pid {
            Some(pid) if epoch2 => {
                kill9(pid);
                true
            }
            _ => false,
        }
    });
    let out = run.wait(LIMIT);
    let se = &out.stderr;
    assert!(
        killed,
        "no epoch reached the agents before the job ended:\n{se}"
    );
    assert_same_result(&g, &out);
    assert!(
        se.contains("go to 2 agent(s) other than each rank's host"),
        "the default store on three agents is not the replicated one:\n{se}"
    );
    assert!(
        se.contains("restart 1 of 3: every rank from committed epoch"),
        "no restart from a committed epoch reported:\n{se}"
    );
    if kill_agent {
        assert!(
            se.contains(&format!("not on {}", g.hosts()[2].addr)),
            "the dead agent's host was used again:\n{se}"
        );
        // Two hosts are left: each blob can have one replica off its producer's host, and the
        // job keeps checkpointing with that rather than running unprotected.
        let after = se.split_once("restart 1: ranks on").map_or("", |(_, a)| a);
        assert!(
            !after.contains("will not commit"),
            "waves after the restart did not commit:\n{se}"
        );
    }
    eprintln!("{se}");
}

#[test]
fn a_host_whose_network_goes_down_is_detected_and_its_ranks_restart_elsewhere() {
    let Some(g) = up_with_agents("link", SPEC, 3, &ARGS) else {
        return;
    };
    let ck = g.dir.join("ckpt");
    let mut opts = vec!["--checkpoint-interval".to_string(), "0.3".into()];
    opts.extend(dir_store(&g));
    let victim = g.hosts()[2].clone();
    let mut run = g.run(&strs(&opts), &g.jacobi, &[]);
    let cut = poll(&mut run, || {
        if committed(&ck).is_none_or(|e| e < 2) {
            return false;
        }
        let st = Command::new("ip")
            .args(["-n", &victim.netns, "link", "set", "eth0", "down"])
            .status()
            .unwrap();
        assert!(st.success(), "ip link set down failed");
        true
    });
    let out = run.wait(LIMIT);
    let se = &out.stderr;
    assert!(cut, "the job ended before the link could be cut:\n{se}");
    assert_same_result(&g, &out);
    assert!(
        se.contains(&format!("agent of {} sent no heartbeat", victim.addr)),
        "the cut host was not detected by heartbeat:\n{se}"
    );
    assert!(
        se.contains("restart 1 of 3: every rank from committed epoch"),
        "no restart reported:\n{se}"
    );
    assert!(
        se.contains(&format!("not on {}", victim.addr)),
        "the cut host was used again:\n{se}"
    );
    // The launcher's story, for `--no-capture` readers.
    eprintln!("{se}");
}

/// Rank 1's host has a slow link (5 Mbit/s against 1000 for the others), so its blob of a wave
/// reaches the store tens of milliseconds after the others': the test sees a wave in progress
/// (another rank's blob of epoch c+1 stored, rank 1's not) and kills rank 1 then.
const SPEC_SLOW_H2: &str = r#"
[[site]]
name = "lab"
nic_mbit = 1000
hosts = [ { name = "h1", cpu = 1.0 }, { name = "h2", cpu = 1.0, nic_mbit = 5 }, { name = "h3", cpu = 1.0 } ]
"#;

#[test]
fn a_rank_killed_during_a_wave_restarts_from_the_previous_committed_epoch() {
    // 128 rows: about 43 KiB of state per rank, 70 ms through rank 1's 5 Mbit/s link.
    let Some(g) = up_with_agents("wave", SPEC_SLOW_H2, 3, &["--n", "128", "--iters", "1500"])
    else {
        return;
    };
    let ck = g.dir.join("ckpt");
    let mut opts = vec!["--checkpoint-interval".to_string(), "0.2".into()];
    opts.extend(dir_store(&g));
    let mut run = g.run(&strs(&opts), &g.jacobi, &[]);
    let mut killed_after = None;
    let found = poll(&mut run, || {
        let Some(c) = committed(&ck) else {
            return false;
        };
        let next = c + 1;
        let in_progress =
            (dir_blob(&ck, next, 0) || dir_blob(&ck, next, 2)) && !dir_blob(&ck, next, 1);
        if !in_progress {
            return false;
        }
        let Some(pid) = g.rank_pid(1, Some(0)) else {
            return false;
        };
        // Stopped, rank 1 can neither finish storing its blob nor tell rank 0 it is done, so
        // if its blob is still missing now, wave `next` can no longer commit.
        signal(pid, libc::SIGSTOP);
        if !dir_blob(&ck, next, 1) && committed(&ck) == Some(c) {
            kill9(pid);
            killed_after = Some(c);
            return true;
        }
        signal(pid, libc::SIGCONT);
        false
    });
    let out = run.wait(LIMIT);
    let se = &out.stderr;
    assert!(
        found,
        "no wave was seen in progress before the job ended:\n{se}"
    );
    let c = killed_after.unwrap();
    assert_same_result(&g, &out);
    assert!(
        se.contains("rank 1 on") && se.contains("was killed by signal 9"),
        "the failure is not rank 1's SIGKILL:\n{se}"
    );
    assert_eq!(
        restart_epoch(se, 1),
        Some(c),
        "the restart did not use epoch {c}, the last committed before the wave:\n{se}"
    );
    assert_eq!(resumed(se), vec![c; 3], "{se}");
    eprintln!("{se}");
}

#[test]
fn a_rank_that_never_reaches_the_barrier_on_restart_times_out_and_the_job_recovers_again() {
    let Some(g) = up_with_agents("barrier", SPEC, 3, &ARGS) else {
        return;
    };
    // Incarnation 1's rank 1 never registers with the launcher (never reaches the barrier).
    let w = wrapper(&g, "hang.sh", "1:1) exec sleep 600 ;;");
    let ck = g.dir.join("ckpt");
    let mut opts = vec!["--checkpoint-interval".to_string(), "0.3".into()];
    opts.extend(dir_store(&g));
    // The ranks' start-up waits at most 3 s for the launcher's barrier (default 60).
    let mut run = g.run(&strs(&opts), &w, &[("MUTIRAO_CONNECT_TIMEOUT_S", "3")]);
    let killed = poll(&mut run, || match g.rank_pid(1, Some(0)) {
        Some(pid) if committed(&ck).is_some_and(|e| e >= 1) => {
            kill9(pid);
            true
        }
        _ => false,
    });
    let hung = killed && poll(&mut run, || g.rank_pid(1, Some(1)).is_some());
    let out = run.wait(LIMIT);
    let se = &out.stderr;
    assert!(killed, "the job ended before a commit:\n{se}");
    assert!(hung, "incarnation 1's rank 1 never ran:\n{se}");
    assert_same_result(&g, &out);
    let (e1, e2) = (restart_epoch(se, 1), restart_epoch(se, 2));
    assert!(e1.is_some(), "no restart from a committed epoch:\n{se}");
    // Incarnation 1 never passed its barrier, so it committed nothing.
    assert_eq!(e2, e1, "the second restart's epoch:\n{se}");
    // The others were told why by the launcher, whose barrier gives up first (at 80 % of the
    // ranks' 3 s), naming the rank that never came.
    assert!(
        se.contains("timed out after 2.4s waiting for ranks [1] to reach the fence"),
        "no rank said the barrier timed out waiting for rank 1:\n{se}"
    );
    // Nothing blocked: the time lost is the barrier's timeout (3 s) plus two restarts, not the
    // job's --timeout.
    assert!(
        out.elapsed < Duration::from_secs(45),
        "{:?}:\n{se}",
        out.elapsed
    );
    assert!(
        g.rank_pid(1, Some(1)).is_none(),
        "the hung rank was left running"
    );
    eprintln!("{se}");
}

#[test]
fn a_registration_with_the_previous_incarnations_token_is_refused_on_the_testbed() {
    let Some(g) = up_with_agents("stale", SPEC, 3, &ARGS) else {
        return;
    };
    let d = g.dir.0.display().to_string();
    // Incarnation 0's rank 1 (on h2) leaves its job token behind; incarnation 1's rank 0 (on h1)
    // says hello as rank 1 with it to the new bootstrap server, over the testbed's network
    // (answering the server's challenge with a proof under the old token, as a rank would),
    // and keeps the answer, then runs jacobi as usual.
    let probe = r#"
import hashlib, hmac, json, os, socket, sys
host, port = sys.argv[1].rsplit(":", 1)
token = bytes.fromhex(open(sys.argv[2]).read().strip())
f = socket.create_connection((host, int(port)), timeout=5).makefile("rwb")
challenge = json.loads(f.readline())
mine = os.urandom(32).hex()
part = lambda b: len(b).to_bytes(8, "little") + b
proof = part(b"mutirao-bootstrap-hello-v2") + part(challenge["nonce"].encode()) + part(mine.encode()) + part(b"1")
mac = hmac.new(token, proof, hashlib.sha256).hexdigest()
f.write((json.dumps({"op": "hello", "rank": 1, "nonce": mine, "mac": mac}) + "\n").encode())
f.flush()
sys.stdout.write(f.readline().decode())
"#;
    std::fs::write(g.dir.join("probe.py"), probe).expect("write the probe");
    let w = wrapper(
        &g,
        "stale.sh",
        &format!(
            r#"0:1) printf '%s' "$MUTIRAO_JOB_TOKEN" > '{d}/old.token' ;;
1:0) printf '%s' "$MUTIRAO_JOB_TOKEN" > '{d}/new.token'
     timeout 10 python3 '{d}/probe.py' "$MUTIRAO_PMI_ADDR" '{d}/old.token' > '{d}/answer.tmp' 2>&1
     mv '{d}/answer.tmp' '{d}/answer' ;;"#
        ),
    );
    let ck = g.dir.join("ckpt");
    let mut opts = vec!["--checkpoint-interval".to_string(), "0.3".into()];
    opts.extend(dir_store(&g));
    let mut run = g.run(&strs(&opts), &w, &[]);
    let killed = poll(&mut run, || match g.rank_pid(1, Some(0)) {
        Some(pid) if committed(&ck).is_some_and(|e| e >= 1) => {
            kill9(pid);
            true
        }
        _ => false,
    });
    let out = run.wait(LIMIT);
    let se = &out.stderr;
    assert!(killed, "the job ended before a commit:\n{se}");
    assert_same_result(&g, &out);
    assert!(
        restart_epoch(se, 1).is_some(),
        "no restart from a committed epoch:\n{se}"
    );
    let read = |f: &str| std::fs::read_to_string(g.dir.join(f)).unwrap_or_default();
    let (old, new) = (read("old.token"), read("new.token"));
    assert!(
        old.len() == 64 && new.len() == 64 && old != new,
        "every incarnation has a new job token: {old:?} {new:?}"
    );
    let answer = read("answer");
    assert!(
        answer.contains(r#""op":"error""#) && answer.contains("wrong job token"),
        "the stale registration was not refused: {answer:?}\n{se}"
    );
    eprintln!("stale registration answered {answer}\n{se}");
}

#[test]
fn a_failure_during_recovery_raises_the_incarnation_again_and_the_job_finishes() {
    let Some(g) = up_with_agents("twice", SPEC, 3, &ARGS) else {
        return;
    };
    // Incarnation 1's rank 2 starts slowly (2 s before jacobi), so the test can kill it while
    // the job is being recovered: before the new barrier, before any rank restored.
    let d = g.dir.0.display().to_string();
    let w = wrapper(
        &g,
        "slow.sh",
        &format!("1:2) : > '{d}/slow-start'; sleep 2 ;;"),
    );
    let ck = g.dir.join("ckpt");
    let mut opts = vec!["--checkpoint-interval".to_string(), "0.3".into()];
    opts.extend(dir_store(&g));
    let mut run = g.run(&strs(&opts), &w, &[]);
    let first = poll(&mut run, || match g.rank_pid(1, Some(0)) {
        Some(pid) if committed(&ck).is_some_and(|e| e >= 1) => {
            kill9(pid);
            true
        }
        _ => false,
    });
    let second = first
        && poll(&mut run, || match g.rank_pid(2, Some(1)) {
            Some(pid) if g.dir.join("slow-start").is_file() => {
                kill9(pid);
                true
            }
            _ => false,
        });
    let out = run.wait(LIMIT);
    let se = &out.stderr;
    assert!(first, "the job ended before a commit:\n{se}");
    assert!(
        second,
        "incarnation 1's rank 2 was not seen starting:\n{se}"
    );
    assert_same_result(&g, &out);
    let (e1, e2) = (restart_epoch(se, 1), restart_epoch(se, 2));
    assert!(
        e1.is_some(),
        "no first restart from a committed epoch:\n{se}"
    );
    assert_eq!(e2, e1, "the second restart's epoch:\n{se}");
    assert!(!se.contains("restart 3 of 3"), "{se}");
    // Only incarnation 2 restored (incarnation 1 never passed its barrier).
    assert_eq!(resumed(se), vec![e2.unwrap(); 3], "{se}");
    eprintln!("{se}");
}

#[test]
fn a_rank_killed_before_any_checkpoint_restarts_the_job_from_scratch() {
    let Some(g) = up_with_agents("scratch", SPEC, 3, &ARGS) else {
        return;
    };
    let ck = g.dir.join("ckpt");
    // The first wave would come after 60 s: the job is long over by then.
    let mut opts = vec!["--checkpoint-interval".to_string(), "60".into()];
    opts.extend(dir_store(&g));
    let mut run = g.run(&strs(&opts), &g.jacobi, &[]);
    let mut since: Option<Instant> = None;
    let killed = poll(&mut run, || {
        let all = (0..3).all(|r| g.rank_pid(r, Some(0)).is_some());
        let t = *since.get_or_insert_with(Instant::now);
        if !all {
            since = None;
            return false;
        }
        // Half a second into the computation.
        if t.elapsed() < Duration::from_millis(500) {
            return false;
        }
        let Some(pid) = g.rank_pid(1, Some(0)) else {
            return false;
        };
        assert_eq!(committed(&ck), None, "a checkpoint was committed");
        kill9(pid);
        true
    });
    let out = run.wait(LIMIT);
    let se = &out.stderr;
    assert!(killed, "the job ended before rank 1 could be killed:\n{se}");
    assert_same_result(&g, &out);
    assert!(
        se.contains("restart 1 of 3: every rank from the beginning (no checkpoint committed yet)"),
        "no restart from scratch:\n{se}"
    );
    assert!(
        resumed(se).is_empty(),
        "a rank restored a checkpoint:\n{se}"
    );
    eprintln!("{se}");
}
