//! The owner's policy end to end on loopback: a coordinator and two agents (`n1`, `n2`) with
//! `--owner-policy`, whose owner activity is simulated by the policy's `active_file` (the
//! owner is active while the file exists). A job's ranks on the host whose owner comes back
//! are stopped by their agent (SIGSTOP, seen in /proc), the job is `suspended`; the owner
//! leaving continues them and the job runs again; the owner staying past the grace period
//! vacates the host: the job is re-queued and placed on the other host, where it finishes.
//! Every step is in the job's journal.

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_mutirao");
const ANA: &str = "ana-token-0123456789";

/// Processes ended and the scratch directory removed when dropped.
struct Grid {
    procs: Vec<Child>,
    dir: PathBuf,
}

impl Drop for Grid {
    fn drop(&mut self) {
        for c in &mut self.procs {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn first_line(child: &mut Child) -> String {
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    rx.recv_timeout(Duration::from_secs(30))
        .expect("a first line within 30 s")
}

fn mutirao(url: &str, args: &[&str]) -> Output {
    common::grid_client(url, ANA, args)
}

fn job(url: &str, id: i64) -> serde_json::Value {
    let o = mutirao(url, &["job", "--json", &id.to_string()]);
    serde_json::from_slice(&o.stdout).unwrap_or_default()
}

fn story(v: &serde_json::Value) -> Vec<String> {
    v["events"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| {
                    format!(
                        "{} {}",
                        e["kind"].as_str().unwrap_or(""),
                        e["detail"].as_str().unwrap_or("")
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn wait_for(
    url: &str,
    id: i64,
    what: &str,
    limit: Duration,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let t0 = Instant::now();
    loop {
        let v = job(url, id);
        if ok(&v) {
            return v;
        }
        assert!(
            t0.elapsed() < limit,
            "job {id}: not {what} after {limit:?}: {:#?}",
            story(&v)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn state_is(want: &'static str) -> impl Fn(&serde_json::Value) -> bool {
    move |v| v["job"]["state"] == want
}

/// The run states (`/proc/PID/stat`'s third field) of the children of `parent` and of their
/// process groups (the ranks and what they started).
fn rank_states(parent: u32) -> Vec<char> {
    let mut groups = Vec::new();
    let mut all = Vec::new();
    for ent in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = ent.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.len() < 4 {
            continue;
        }
        let (state, ppid, pgrp) = (
            f[0].chars().next().unwrap_or('?'),
            f[1].parse::<u32>().unwrap_or(0),
            f[2].parse::<u32>().unwrap_or(0),
        );
        if ppid == parent {
            groups.push(pgrp);
        }
        all.push((state, pgrp));
    }
    all.into_iter()
        .filter(|(_, g)| groups.contains(g))
        .map(|(s, _)| s)
        .collect()
}

fn hosts_placed(line: &str) -> Vec<String> {
    // "placement 2 ranks on n1×1, n2×1 (…)"
    let list = line
        .split(" on ")
        .nth(1)
        .and_then(|r| r.split(" (").next())
        .unwrap_or("");
    list.split(", ")
        .filter_map(|h| h.split('×').next())
        .map(str::to_string)
        .collect()
}

/// A coordinator and agents n1 and n2 with owner policies whose owner is active while
/// `DIR/owner-NAME` exists; returns the grid, its URL and each agent's pid.
fn setup(
    tag: &str,
    grace_s: f64,
    extra: &[&str],
) -> (Grid, String, std::collections::HashMap<String, u32>) {
    let dir = std::env::temp_dir().join(format!("mutirao-grid-owner-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut g = Grid {
        procs: Vec::new(),
        dir: dir.clone(),
    };
    let tok = common::gen_token(&dir);
    std::fs::write(
        dir.join("grid.tokens"),
        format!(
            "user ana {ANA}\nagent n1 n1-agent-token-0123456\nagent n2 n2-agent-token-0123456\n"
        ),
    )
    .unwrap();
    // Private, as an operator keeps it (grid tests' jobs look for tokens on this machine).
    std::fs::set_permissions(
        dir.join("grid.tokens"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let mut coord = Command::new(BIN)
        .args([
            "coordinator",
            "--listen",
            "127.0.0.1:0",
            "--heartbeat-interval",
            "0.3",
        ])
        .arg("--db")
        .arg(dir.join("coord.sqlite"))
        .arg("--tokens")
        .arg(dir.join("grid.tokens"))
        .arg("--agent-token-file")
        .arg(&tok)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let line = first_line(&mut coord);
    g.procs.push(coord);
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in {line:?}"))
        .to_string();
    let mut agent_pid = std::collections::HashMap::new();
    for n in ["n1", "n2"] {
        let policy = dir.join(format!("{n}.owner.toml"));
        std::fs::write(
            &policy,
            format!(
                "# the owner is active while this file exists\nactive_file = {:?}\ngrace_s = {grace_s}\n",
                dir.join(format!("owner-{n}")).display().to_string()
            ),
        )
        .unwrap();
        let mut a = Command::new(BIN)
            .args([
                "agent",
                "--listen",
                "127.0.0.1:0",
                "--print-addr",
                "--no-dir",
                "--no-store",
            ])
            .arg("--token-file")
            .arg(&tok)
            // Program caches go in the test's directory, not /tmp.
            .env("TMPDIR", &dir)
            .args(["--coordinator", &url, "--name", n])
            .arg("--owner-policy")
            .arg(&policy)
            .env("MUTIRAO_COORD_TOKEN", format!("{n}-agent-token-0123456"))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let addr = first_line(&mut a);
        assert!(!addr.trim().is_empty(), "agent {n} printed no address");
        agent_pid.insert(n.to_string(), a.id());
        g.procs.push(a);
    }
    let ana = mutirao_coord::client::Client::new(&url, ANA).unwrap();
    let t0 = Instant::now();
    while ana.hosts().map(|h| h.len()).unwrap_or(0) < 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the agents did not register"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    (g, url, agent_pid)
}

/// `mutirao submit ARGS…` (`submit` included); waits until the job runs: its id and its
/// `placement` event.
fn submit_running(url: &str, submit: &[&str]) -> (i64, String) {
    let o = mutirao(url, submit);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let id: i64 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
    let v = wait_for(
        url,
        id,
        "running",
        Duration::from_secs(30),
        state_is("running"),
    );
    let placed = story(&v)
        .into_iter()
        .find(|l| l.starts_with("placement "))
        .unwrap();
    (id, placed)
}

/// Until job `id` has committed an epoch (its checkpoint directory's `COMMITTED`), running
/// all along.
fn wait_committed(g: &Grid, url: &str, id: i64) {
    let committed = g.dir.join(format!("coord.sqlite.jobs/{id}/ckpt/COMMITTED"));
    let t0 = Instant::now();
    while std::fs::read_to_string(&committed)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .is_none_or(|e| e < 1)
    {
        let v = job(url, id);
        assert!(
            t0.elapsed() < Duration::from_secs(60)
                && (v["job"]["state"] == "running" || v["job"]["state"] == "checkpointing"),
            "no epoch committed while the job ran: {:#?}",
            story(&v)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_active_owner_suspends_the_job_there_then_vacates_it_to_the_other_host() {
    let (g, url, agent_pid) = setup("plain", 4.0, &[]);
    let dir = g.dir.clone();
    // A job that runs until told to stop, printing as it goes.
    let done = dir.join("done");
    let prog = dir.join("ticks.sh");
    std::fs::write(
        &prog,
        format!(
            "#!/bin/sh\nwhile [ ! -e {:?} ]; do echo \"rank $MUTIRAO_RANK tick\"; sleep 0.2; done\necho \"rank $MUTIRAO_RANK done\"\n",
            done.display().to_string()
        ),
    )
    .unwrap();
    let o = mutirao(
        &url,
        &[
            "submit",
            "-n",
            "2",
            "--require",
            "mem>=1",
            prog.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let id: i64 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
    let v = wait_for(
        &url,
        id,
        "running",
        Duration::from_secs(30),
        state_is("running"),
    );
    let placed = story(&v)
        .into_iter()
        .find(|l| l.starts_with("placement "))
        .unwrap();
    let first = hosts_placed(&placed);
    let h = first[0].clone();
    let other = if h == "n1" { "n2" } else { "n1" };
    let pid = agent_pid[&h];
    let t0 = Instant::now();
    while rank_states(pid).is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no rank runs under {h}'s agent"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // The owner comes back briefly: stopped, suspended; leaves: continued, running.
    let owner_file = dir.join(format!("owner-{h}"));
    std::fs::write(&owner_file, "").unwrap();
    let t_owner = Instant::now();
    wait_for(
        &url,
        id,
        "suspended",
        Duration::from_secs(10),
        state_is("suspended"),
    );
    println!(
        "figure: owner active -> job suspended in the journal: {:.2} s",
        t_owner.elapsed().as_secs_f64()
    );
    let s = rank_states(pid);
    assert!(
        !s.is_empty() && s.iter().all(|c| *c == 'T'),
        "ranks on {h} not all stopped: {s:?}"
    );
    std::fs::remove_file(&owner_file).unwrap();
    wait_for(
        &url,
        id,
        "running again",
        Duration::from_secs(10),
        state_is("running"),
    );
    let s = rank_states(pid);
    assert!(
        s.iter().all(|c| *c != 'T'),
        "ranks on {h} still stopped: {s:?}"
    );

    // Back for good: suspended, then vacated after the grace period (4 s), re-queued and
    // placed on the other host only.
    std::fs::write(&owner_file, "").unwrap();
    let t_owner = Instant::now();
    let v = wait_for(&url, id, "placed again", Duration::from_secs(30), |v| {
        story(v)
            .iter()
            .filter(|l| l.starts_with("placement "))
            .count()
            == 2
            && v["job"]["state"] == "running"
    });
    println!(
        "figure: owner active for good -> job running on {other} (grace 4 s included): {:.2} s",
        t_owner.elapsed().as_secs_f64()
    );
    assert!(
        t_owner.elapsed() >= Duration::from_secs(4),
        "vacated before the grace period: {:?}",
        t_owner.elapsed()
    );
    let s = story(&v);
    let again = s.iter().rfind(|l| l.starts_with("placement ")).unwrap();
    assert_eq!(hosts_placed(again), [other.to_string()], "{s:#?}");
    for want in [
        format!("owner owner active on {h} ("),
        format!("owner the owner of {h} left"),
        format!("owner vacating {h}: its owner stayed active past the grace period"),
        format!("state re-queued after vacating {h}; no checkpoints"),
        format!("refused {h}: its owner is active ("),
    ] {
        assert!(
            s.iter().any(|l| l.starts_with(&want)),
            "no {want:?} in {s:#?}"
        );
    }
    // Nothing of the job is left on the vacated host.
    let t0 = Instant::now();
    while !rank_states(pid).is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "ranks left on {h}: {:?}",
            rank_states(pid)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::write(&done, "").unwrap();
    let v = wait_for(
        &url,
        id,
        "finished",
        Duration::from_secs(30),
        state_is("finished"),
    );
    let log =
        String::from_utf8_lossy(&mutirao(&url, &["logs", &id.to_string()]).stdout).into_owned();
    assert!(
        log.contains("[0] rank 0 done") && log.contains("[1] rank 1 done"),
        "{log}"
    );
    println!("{:#?}", story(&v));
}

#[test]
fn a_vacated_job_with_checkpoints_resumes_elsewhere_from_its_last_committed_epoch() {
    let Some(j) = common::jacobi() else {
        println!(
            "skipped: the jacobi example is not built (cargo build -p mutirao --example jacobi)"
        );
        return;
    };
    let args = ["--n", "64", "--iters", "20000"];
    let want = common::plain_checksum(&j, 2, &args);

    let (g, url, _) = setup("ckpt", 1.0, &[]);
    let mut submit = vec![
        "submit",
        "-n",
        "2",
        "--require",
        "mem>=1",
        "--checkpoint-interval",
        "0.2",
    ];
    submit.push(j.to_str().unwrap());
    submit.extend(args);
    let (id, placed) = submit_running(&url, &submit);
    let h = hosts_placed(&placed)[0].clone();
    let other = if h == "n1" { "n2" } else { "n1" };
    // Once an epoch is committed, the owner of the first host comes back for good.
    wait_committed(&g, &url, id);
    std::fs::write(g.dir.join(format!("owner-{h}")), "").unwrap();
    let v = wait_for(&url, id, "finished", Duration::from_secs(120), |v| {
        let st = v["job"]["state"].as_str().unwrap_or("");
        st == "finished" || st == "failed" || st == "cancelled"
    });
    let s = story(&v);
    assert_eq!(v["job"]["state"], "finished", "{s:#?}");
    let again = s.iter().rfind(|l| l.starts_with("placement ")).unwrap();
    assert_eq!(hosts_placed(again), [other.to_string()], "{s:#?}");
    // Its waves: checkpointing from a wave's first checkpoint until its epoch is committed.
    assert!(
        s.iter()
            .any(|l| l.starts_with("state wave of epoch ")
                && l.ends_with("checkpoints are arriving"))
            && s.iter()
                .any(|l| l.starts_with("state epoch ") && l.ends_with(" committed")),
        "{s:#?}"
    );
    let epoch_line = s
        .iter()
        .find(|l| l.starts_with(&format!("state vacated {h}; resumes from committed epoch ")))
        .unwrap_or_else(|| panic!("no resume epoch journalled: {s:#?}"));
    assert!(
        s.iter().any(|l| l.starts_with(&format!(
            "state re-queued after vacating {h}; it resumes from committed epoch"
        ))),
        "{s:#?}"
    );
    let log =
        String::from_utf8_lossy(&mutirao(&url, &["logs", &id.to_string()]).stdout).into_owned();
    let epoch = epoch_line.rsplit(' ').next().unwrap();
    assert!(
        log.contains(&format!("(epoch {epoch})")) && log.contains("resumes at iteration"),
        "the second run did not resume from epoch {epoch}:\n{log}"
    );
    assert_eq!(
        common::checksum(&log).as_deref(),
        Some(want.as_str()),
        "{log}"
    );
    println!("{s:#?}");
}

#[test]
fn a_calibrated_model_sends_the_ranks_to_the_faster_host_and_why_says_so() {
    let model =
        std::env::temp_dir().join(format!("mutirao-grid-model-{}.json", std::process::id()));
    std::fs::write(
        &model,
        r#"{"format": "mutirao-model/1",
            "hosts": [{"name": "n1", "site": "s", "speed": 1.0}, {"name": "n2", "site": "s", "speed": 4.0}],
            "links": [{"class": "intra-site", "sites": ["s", "s"],
                       "os": [{"from": 0, "base_us": 1.0, "per_byte_us": 0.001}],
                       "or": [{"from": 0, "base_us": 1.0, "per_byte_us": 0.001}],
                       "l":  [{"from": 0, "base_us": 5.0, "per_byte_us": 0.01}]}]}"#,
    )
    .unwrap();
    let (g, url, _) = setup("model", 60.0, &["--model", model.to_str().unwrap()]);
    let _ = std::fs::remove_file(&model);
    let prog = g.dir.join("hello.sh");
    std::fs::write(&prog, "#!/bin/sh\necho \"rank $MUTIRAO_RANK here\"\n").unwrap();
    let o = mutirao(
        &url,
        &[
            "submit",
            "-n",
            "2",
            "--require",
            "mem>=1",
            prog.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let id: i64 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
    wait_for(
        &url,
        id,
        "finished",
        Duration::from_secs(30),
        state_is("finished"),
    );
    let why = mutirao(&url, &["job", "--why", &id.to_string()]);
    let why = String::from_utf8_lossy(&why.stdout).into_owned();
    assert!(why.contains("2 ranks on n2×2 (calibrated model"), "{why}");
    // Never worse than idle cores first (better whenever n1, four times slower, is the
    // idler of the two at that moment: both agents read the same /proc).
    let relative: f64 = why
        .split("(relative ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("no predicted makespan: {why}"));
    assert!(relative <= 1.0, "{why}");
    assert!(
        why.contains("n2 (stays idle") && why.contains("speed 4"),
        "{why}"
    );
    assert!(why.contains("n1: not needed"), "{why}");
    // A model that is not one is refused at start, saying what is wrong.
    let bad = g.dir.join("bad-model.json");
    std::fs::write(&bad, r#"{"format": "something-else"}"#).unwrap();
    let o = Command::new(BIN)
        .args(["coordinator", "--listen", "127.0.0.1:0", "--model"])
        .arg(&bad)
        .arg("--db")
        .arg(g.dir.join("other.sqlite"))
        .arg("--tokens")
        .arg(g.dir.join("grid.tokens"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--model"), "{err}");
}

#[test]
fn an_agent_runs_a_program_only_if_it_matches_the_digest_it_was_named_by() {
    let dir = std::env::temp_dir().join(format!("mutirao-grid-digest-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut g = Grid {
        procs: Vec::new(),
        dir: dir.clone(),
    };
    let tok = common::gen_token(&dir);
    let mut a = Command::new(BIN)
        .args([
            "agent",
            "--listen",
            "127.0.0.1:0",
            "--print-addr",
            "--no-dir",
            "--no-store",
        ])
        .arg("--token-file")
        .arg(&tok)
        // Program caches go in the test's directory, not /tmp.
        .env("TMPDIR", &dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let addr = first_line(&mut a).trim().to_string();
    g.procs.push(a);
    let (host, port) = addr.rsplit_once(':').unwrap();
    std::fs::write(dir.join("hosts"), format!("{host} slots=1 port={port}\n")).unwrap();
    let prog = dir.join("hi.sh");
    std::fs::write(&prog, "#!/bin/sh\necho hello from the agent\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let digest = mutirao_coord::repo::digest_of(&std::fs::read(&prog).unwrap());
    let run = |d: &str| {
        Command::new(BIN)
            .args(["run", "-n", "1", "--timeout", "30", "--hostfile"])
            .arg(dir.join("hosts"))
            .env("MUTIRAO_AGENT_TOKEN_FILE", &tok)
            .env("MUTIRAO_PROGRAM_DIGEST", d)
            .arg(&prog)
            .output()
            .unwrap()
    };
    let o = run(&digest);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && out.contains("hello from the agent"),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // The program changed after it was named: the agent refuses to start it.
    let wrong = format!("sha256:{}", "0".repeat(64));
    let o = run(&wrong);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("altered or corrupted") && err.contains(&wrong),
        "{err}"
    );
    assert!(!String::from_utf8_lossy(&o.stdout).contains("hello"));
}

#[test]
fn without_a_coordinator_an_agent_ends_its_ranks_when_the_owner_stays() {
    let dir = std::env::temp_dir().join(format!("mutirao-grid-alone-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut g = Grid {
        procs: Vec::new(),
        dir: dir.clone(),
    };
    let tok = common::gen_token(&dir);
    let owner = dir.join("owner");
    std::fs::write(
        dir.join("owner.toml"),
        format!(
            "active_file = {:?}\ngrace_s = 0.5\n",
            owner.display().to_string()
        ),
    )
    .unwrap();
    let mut a = Command::new(BIN)
        .args([
            "agent",
            "--listen",
            "127.0.0.1:0",
            "--print-addr",
            "--no-dir",
            "--no-store",
        ])
        .arg("--token-file")
        .arg(&tok)
        // Program caches go in the test's directory, not /tmp.
        .env("TMPDIR", &dir)
        .arg("--owner-policy")
        .arg(dir.join("owner.toml"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let addr = first_line(&mut a).trim().to_string();
    let agent = a.id();
    g.procs.push(a);
    let (host, port) = addr.rsplit_once(':').unwrap();
    std::fs::write(dir.join("hosts"), format!("{host} slots=1 port={port}\n")).unwrap();
    let run = Command::new(BIN)
        .args(["run", "-n", "1", "--timeout", "60", "--hostfile"])
        .arg(dir.join("hosts"))
        .env("MUTIRAO_AGENT_TOKEN_FILE", &tok)
        .args(["sh", "-c", "echo started; sleep 50"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while rank_states(agent).is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the rank did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::write(&owner, "").unwrap();
    let t0 = Instant::now();
    let out = run.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("killed by signal 9"), "{err}");
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "the run took {:?} to end",
        t0.elapsed()
    );
}

#[test]
fn a_restart_within_the_run_shows_the_job_recovering_then_running_again() {
    let Some(j) = common::jacobi() else {
        println!(
            "skipped: the jacobi example is not built (cargo build -p mutirao --example jacobi)"
        );
        return;
    };
    let args = ["--n", "64", "--iters", "5000"];
    let want = common::plain_checksum(&j, 4, &args);
    // Owners never active here: the policy's file is never created.
    let (mut g, url, agent_pid) = setup("inrun", 60.0, &[]);
    let mut submit = vec!["submit", "-n", "4", "--checkpoint-interval", "0.2"];
    submit.push(j.to_str().unwrap());
    submit.extend(args);
    let (id, placed) = submit_running(&url, &submit);
    // Each host takes at most its idle cores (2 here) and at least one rank: both have ranks.
    assert_eq!(hosts_placed(&placed).len(), 2, "{placed}");
    wait_committed(&g, &url, id);
    // n2's agent dies (SIGKILL): the launcher restarts every rank on n1 within the run.
    let pid = agent_pid["n2"];
    let a = g.procs.iter_mut().find(|c| c.id() == pid).unwrap();
    a.kill().unwrap();
    let _ = a.wait();
    let v = wait_for(&url, id, "finished", Duration::from_secs(120), |v| {
        let st = v["job"]["state"].as_str().unwrap_or("");
        st == "finished" || st == "failed" || st == "cancelled"
    });
    let moves: Vec<(String, String)> = v["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "state")
        .map(|e| {
            (
                e["to"].as_str().unwrap_or("").to_string(),
                e["detail"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert_eq!(
        v["job"]["state"],
        "finished",
        "{moves:#?}\n{:#?}",
        story(&v)
    );
    let rec = moves
        .iter()
        .position(|(to, d)| {
            to == "recovering"
                && d.starts_with("recovering within the run")
                && d.contains("restart 1 of 3")
        })
        .unwrap_or_else(|| panic!("no recovering within the run: {moves:#?}"));
    let (to, back) = &moves[rec + 1];
    assert_eq!(to, "running", "{moves:#?}");
    assert!(
        back.starts_with("restart 1: every rank running again from committed epoch "),
        "{moves:#?}"
    );
    assert_eq!(moves.last().unwrap().1, "exit 0", "{moves:#?}");
    // One run of the coordinator's: the launcher recovered without leaving it.
    assert_eq!(
        story(&v)
            .iter()
            .filter(|l| l.starts_with("run run "))
            .count(),
        1,
        "{:#?}",
        story(&v)
    );
    let log =
        String::from_utf8_lossy(&mutirao(&url, &["logs", &id.to_string()]).stdout).into_owned();
    assert_eq!(
        common::checksum(&log).as_deref(),
        Some(want.as_str()),
        "{log}"
    );
}
