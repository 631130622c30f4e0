//! `mutirao submit --dag` end to end on loopback: a coordinator process and three agents that
//! register with it; a diamond of four tasks whose commands really pass files (a writes a
//! number, b and c transform it, d combines them) runs task by task on the eligible hosts, its
//! result is checked in the log and in the repository; a malformed graph is refused naming the
//! edge and nothing is submitted; a failing task fails the job naming it; a cancelled graph
//! stops its running task.

mod common;
use common::ok;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_mutirao");
const ANA: &str = "ana-token-0123456789";

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Grid {
    url: String,
    dir: PathBuf,
    // Dropped first: agents, then the coordinator.
    agents: Vec<Proc>,
    coord: Proc,
    extra: Vec<String>,
}

impl Drop for Grid {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A coordinator and agents `n1`…: each `(name, site)`.
fn grid(tag: &str, agents: &[(&str, &str)], extra: &[&str]) -> Grid {
    let dir = std::env::temp_dir().join(format!("mutirao-griddag-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut tokens = format!("user ana {ANA}\n");
    for (n, _) in agents {
        tokens.push_str(&format!("agent {n} {n}-agent-token-0123456\n"));
    }
    std::fs::write(dir.join("grid.tokens"), tokens).unwrap();
    // Private, as an operator keeps it (grid tests' jobs look for tokens on this machine).
    std::fs::set_permissions(
        dir.join("grid.tokens"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let secret = dir.join("agent.token");
    let o = Command::new(BIN)
        .args(["agent", "--gen-token"])
        .arg(&secret)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut child = Command::new(BIN)
        .args([
            "coordinator",
            "--listen",
            "127.0.0.1:0",
            "--heartbeat-interval",
            "1",
        ])
        .arg("--db")
        .arg(dir.join("coord.sqlite"))
        .arg("--tokens")
        .arg(dir.join("grid.tokens"))
        .arg("--agent-token-file")
        .arg(&secret)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start mutirao coordinator");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let coord = Proc(child);
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in {line:?}"))
        .to_string();
    let mut procs = Vec::new();
    for (n, site) in agents {
        let mut child = Command::new(BIN)
            .args([
                "agent",
                "--listen",
                "127.0.0.1:0",
                "--print-addr",
                "--token-file",
            ])
            .arg(&secret)
            .arg("--dir-socket")
            .arg(dir.join(format!("{n}-dir.sock")))
            // The agent's default store and program cache go in the test's directory.
            .env("TMPDIR", &dir)
            .arg("--program-cache")
            .arg(dir.join(format!("{n}-programs")))
            .args(["--coordinator", &url, "--name", n, "--site", site])
            .env("MUTIRAO_COORD_TOKEN", format!("{n}-agent-token-0123456"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(!line.trim().is_empty(), "agent {n} printed no address");
        procs.push(Proc(child));
    }
    let ana = mutirao_coord::client::Client::new(&url, ANA).unwrap();
    let t0 = Instant::now();
    while ana.hosts().map(|h| h.len()).unwrap_or(0) < agents.len() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the agents did not all register"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Grid {
        url,
        dir,
        agents: procs,
        coord,
        extra: extra.iter().map(|s| s.to_string()).collect(),
    }
}

fn coordinator<S: AsRef<std::ffi::OsStr>>(dir: &Path, listen: &str, extra: &[S]) -> (Proc, String) {
    let mut child = Command::new(BIN)
        .args([
            "coordinator",
            "--listen",
            listen,
            "--heartbeat-interval",
            "1",
        ])
        .arg("--db")
        .arg(dir.join("coord.sqlite"))
        .arg("--tokens")
        .arg(dir.join("grid.tokens"))
        .arg("--agent-token-file")
        .arg(dir.join("agent.token"))
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start mutirao coordinator");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in {line:?}"))
        .to_string();
    (Proc(child), url)
}

impl Grid {
    /// Kill the coordinator (SIGKILL: what a crash leaves) and start another on its files, at
    /// the same address (the agents go on reporting there).
    fn crash_and_restart(&mut self) {
        let _ = self.coord.0.kill();
        let _ = self.coord.0.wait();
        let addr = self
            .url
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        let (c, url) = coordinator(&self.dir, &addr, &self.extra);
        self.coord = c;
        assert_eq!(url.trim_end_matches('/'), self.url.trim_end_matches('/'));
    }
}

fn mutirao(g: &Grid, args: &[&str]) -> Output {
    common::grid_client(&g.url, ANA, args)
}

fn wait_state(g: &Grid, id: i64, want: &str, limit: Duration) -> serde_json::Value {
    let t0 = Instant::now();
    loop {
        let o = mutirao(g, &["job", "--json", &id.to_string()]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        if v["job"]["state"] == want {
            return v;
        }
        assert!(
            t0.elapsed() < limit,
            "job {id} not {want} after {limit:?}: {v:#}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn events(v: &serde_json::Value, kind: &str) -> Vec<String> {
    v["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == kind)
        .map(|e| e["detail"].as_str().unwrap().to_string())
        .collect()
}

const DIAMOND: &str = r#"{ "format": "mutirao-taskgraph/1",
  "tasks": [
    { "id": "a", "work": 1, "cmd": ["sh", "-c", "echo 3 > n; echo a wrote 3"], "outputs": ["n"] },
    { "id": "b", "work": 2, "cmd": ["sh", "-c", "echo $(( $(cat n) * 2 )) > b; echo b on $(hostname)"], "outputs": ["b"] },
    { "id": "c", "work": 2, "cmd": ["sh", "-c", "echo $(( $(cat n) + 10 )) > c"], "outputs": ["c"] },
    { "id": "d", "work": 1, "cmd": ["sh", "-c", "echo $(( $(cat b) + $(cat c) )) > d; echo d says $(cat d)"], "outputs": ["d"] } ],
  "edges": [
    { "from": "a", "to": "b", "bytes": 8, "files": ["n"] },
    { "from": "a", "to": "c", "bytes": 8, "files": ["n"] },
    { "from": "b", "to": "d", "bytes": 8, "files": ["b"] },
    { "from": "c", "to": "d", "bytes": 8, "files": ["c"] } ] }"#;

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

#[test]
fn a_diamond_of_commands_passes_its_files_and_d_computes_19() {
    let g = grid(
        "diamond",
        &[("n1", "north"), ("n2", "north"), ("n3", "south")],
        &[],
    );
    // A malformed graph first: refused by name, nothing uploaded or queued.
    let bad = write(
        &g.dir,
        "bad.json",
        &DIAMOND.replace(r#""files": ["c"]"#, r#""files": ["nope"]"#),
    );
    let o = mutirao(&g, &["submit", "--dag", &bad]);
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("edge 4 (c -> d)")
            && e.contains("\"nope\"")
            && e.contains("nothing was submitted"),
        "{e}"
    );
    assert!(ok(&mutirao(&g, &["jobs"])).contains("no jobs"));
    let o = mutirao(&g, &["submit", "--dag", &bad, "--algo", "peft"]);
    assert!(!o.status.success());

    let graph = write(&g.dir, "diamond.json", DIAMOND);
    let id: i64 = ok(&mutirao(
        &g,
        &[
            "submit",
            "--dag",
            &graph,
            "--require",
            "site=north",
            "--algo",
            "heft",
        ],
    ))
    .trim()
    .parse()
    .unwrap();
    let o = mutirao(&g, &["logs", "--follow", &id.to_string()]);
    let log = ok(&o);
    let v = wait_state(&g, id, "finished", Duration::from_secs(60));
    assert!(log.contains("[a] a wrote 3\n"), "{log}");
    assert!(log.contains("[d] d says 19\n"), "{log}");
    assert!(
        !log.contains("@@mutirao"),
        "the files' markers leak into the log: {log}"
    );
    // Every task finished once, on a north host; d's output is in the repository.
    let done = events(&v, "task-done");
    assert_eq!(done.len(), 4, "{v:#}");
    let mut d_digest = String::new();
    for t in &done {
        let r: serde_json::Value = serde_json::from_str(t).unwrap();
        assert!(r["host"] == "n1" || r["host"] == "n2", "{t}");
        if r["task"] == "d" {
            d_digest = r["outputs"]["d"].as_str().unwrap().to_string();
        }
    }
    let ana = mutirao_coord::client::Client::new(&g.url, ANA).unwrap();
    assert_eq!(ana.download(&d_digest, 1 << 20).unwrap(), b"19\n");
    // Both north hosts were used (round-robin without a model), south refused.
    let why = ok(&mutirao(&g, &["job", "--why", &id.to_string()]));
    assert!(why.contains("task graph of 4 tasks"), "{why}");
    assert!(why.contains("no calibrated model"), "{why}");
    assert!(why.contains("n3: ") && why.contains("site"), "{why}");
    let placement = events(&v, "placement").join("\n");
    assert!(
        placement.contains("n1") && placement.contains("n2"),
        "{placement}"
    );
    assert!(
        events(&v, "state")
            .last()
            .unwrap()
            .contains("all 4 tasks finished")
            || v["events"].as_array().unwrap().last().unwrap()["detail"]
                .as_str()
                .unwrap()
                .contains("all 4 tasks finished"),
        "{v:#}"
    );

    // A failing task fails the job, naming it; its successor never starts.
    let failing = write(
        &g.dir,
        "failing.json",
        &DIAMOND.replace(
            "echo $(( $(cat n) + 10 )) > c",
            "echo c gives up >&2; exit 3",
        ),
    );
    let id: i64 = ok(&mutirao(&g, &["submit", "--dag", &failing]))
        .trim()
        .parse()
        .unwrap();
    let v = wait_state(&g, id, "failed", Duration::from_secs(60));
    let last = v["events"].as_array().unwrap().last().unwrap()["detail"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(last.starts_with("task c failed on n"), "{v:#}");
    assert!(
        !events(&v, "task")
            .iter()
            .any(|e| e.starts_with("d started")),
        "{v:#}"
    );
    let log = ok(&mutirao(&g, &["logs", &id.to_string()]));
    assert!(log.contains("[c] c gives up"), "{log}");

    // A task's own program, a file next to the graph: uploaded by submit, run from its copy.
    std::fs::create_dir_all(g.dir.join("progs")).unwrap();
    write(
        &g.dir.join("progs"),
        "combine",
        "#!/bin/sh\necho $(( $(cat b) * $(cat c) )) > d\necho combined $(cat d)\n",
    );
    let own = DIAMOND.replace(
        r#""cmd": ["sh", "-c", "echo $(( $(cat b) + $(cat c) )) > d; echo d says $(cat d)"]"#,
        r#""cmd": ["./combine"], "files": { "combine": "progs/combine" }"#,
    );
    assert_ne!(own, DIAMOND);
    let missing = write(
        &g.dir,
        "missing.json",
        &own.replace("progs/combine", "progs/nothing"),
    );
    let o = mutirao(&g, &["submit", "--dag", &missing]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && e.contains("task \"d\": file \"combine\": cannot read"),
        "{e}"
    );
    let own = write(&g.dir, "own.json", &own);
    let id: i64 = ok(&mutirao(&g, &["submit", "--dag", &own]))
        .trim()
        .parse()
        .unwrap();
    wait_state(&g, id, "finished", Duration::from_secs(60));
    let log = ok(&mutirao(&g, &["logs", &id.to_string()]));
    assert!(log.contains("[d] combined 78"), "{log}");
    assert_eq!(
        ok(&mutirao(&g, &["jobs", "--json"]))
            .matches("\"id\"")
            .count(),
        3
    );
}

#[test]
fn a_cancelled_graph_stops_its_running_task() {
    let g = grid("cancel", &[("n1", "north"), ("n2", "north")], &[]);
    let marker = g.dir.join("survived");
    let graph = write(
        &g.dir,
        "slow.json",
        &format!(
            r#"{{ "format": "mutirao-taskgraph/1", "tasks": [
                {{ "id": "slow", "work": 1, "cmd": ["sh", "-c", "echo started; sleep 4; touch {m}"] }},
                {{ "id": "after", "work": 1, "cmd": ["true"] }} ],
              "edges": [ {{ "from": "slow", "to": "after", "bytes": 0 }} ] }}"#,
            m = marker.display()
        ),
    );
    let id: i64 = ok(&mutirao(&g, &["submit", "--dag", &graph]))
        .trim()
        .parse()
        .unwrap();
    let t0 = Instant::now();
    while !ok(&mutirao(&g, &["logs", &id.to_string()])).contains("[slow] started") {
        assert!(t0.elapsed() < Duration::from_secs(30), "slow never started");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(ok(&mutirao(&g, &["cancel", &id.to_string()])).contains("cancelled"));
    std::thread::sleep(Duration::from_secs(6));
    assert!(!marker.exists(), "the cancelled task went on running");
    let v = wait_state(&g, id, "cancelled", Duration::from_secs(5));
    assert!(events(&v, "task-done").is_empty(), "{v:#}");
}

#[test]
fn a_coordinator_restarted_mid_graph_keeps_the_finished_tasks() {
    let mut g = grid("restart", &[("n1", "north")], &[]);
    let counter = g.dir.join("a-ran");
    // The task may run as a uid of its own (a root agent): it must be able to append here.
    std::fs::write(&counter, "").unwrap();
    std::fs::set_permissions(
        &counter,
        std::os::unix::fs::PermissionsExt::from_mode(0o666),
    )
    .unwrap();
    let graph = write(
        &g.dir,
        "restart.json",
        &format!(
            r#"{{ "format": "mutirao-taskgraph/1", "tasks": [
                {{ "id": "a", "work": 1, "cmd": ["sh", "-c", "echo ran >> {k}; echo 5 > n"], "outputs": ["n"] }},
                {{ "id": "slow", "work": 1, "cmd": ["sh", "-c", "echo started; sleep 3; echo $(( $(cat n) * 7 )) > m; echo slow says $(cat m)"], "outputs": ["m"] }} ],
              "edges": [ {{ "from": "a", "to": "slow", "bytes": 8, "files": ["n"] }} ] }}"#,
            k = counter.display()
        ),
    );
    let id: i64 = ok(&mutirao(&g, &["submit", "--dag", &graph]))
        .trim()
        .parse()
        .unwrap();
    let t0 = Instant::now();
    while !ok(&mutirao(&g, &["logs", &id.to_string()])).contains("[slow] started") {
        assert!(t0.elapsed() < Duration::from_secs(30), "slow never started");
        std::thread::sleep(Duration::from_millis(100));
    }
    g.crash_and_restart();
    let v = wait_state(&g, id, "finished", Duration::from_secs(60));
    let resumed = events(&v, "resume").join("\n");
    assert!(
        resumed.contains("tasks a finished in an earlier run"),
        "{v:#}"
    );
    assert_eq!(
        std::fs::read_to_string(&counter).unwrap(),
        "ran\n",
        "a ran again after the restart: {v:#}"
    );
    let log = ok(&mutirao(&g, &["logs", &id.to_string()]));
    assert!(log.contains("[slow] slow says 35"), "{log}");
}

#[test]
fn with_a_calibrated_model_tasks_are_scheduled_and_the_makespan_predicted() {
    let dir =
        std::env::temp_dir().join(format!("mutirao-griddag-{}-model.json", std::process::id()));
    let lin = r#"[ { "from": 0, "base_us": 50.0, "per_byte_us": 0.001 } ]"#;
    std::fs::write(
        &dir,
        format!(
            r#"{{ "format": "mutirao-model/1",
              "hosts": [ {{ "name": "n1", "site": "s", "speed": 1.0 }}, {{ "name": "n2", "site": "s", "speed": 8.0 }} ],
              "links": [ {{ "class": "same-host", "os": {lin}, "or": {lin}, "l": {lin} }},
                         {{ "class": "intra-site", "os": {lin}, "or": {lin}, "l": {lin} }} ] }}"#
        ),
    )
    .unwrap();
    let g = grid(
        "model",
        &[("n1", "north"), ("n2", "north")],
        &["--model", dir.to_str().unwrap()],
    );
    let _ = std::fs::remove_file(&dir);
    let graph = write(&g.dir, "diamond.json", DIAMOND);
    let id: i64 = ok(&mutirao(&g, &["submit", "--dag", &graph]))
        .trim()
        .parse()
        .unwrap();
    let v = wait_state(&g, id, "finished", Duration::from_secs(60));
    let placement = events(&v, "placement").join("\n");
    assert!(
        placement
            .contains("hlogp-heft with the calibrated model over 2 host(s); predicted makespan"),
        "{placement}"
    );
    // n2 is eight times faster and messages cost little: the critical path goes there.
    assert!(
        placement.contains("a→n2") && placement.contains("d→n2"),
        "{placement}"
    );
    let log = ok(&mutirao(&g, &["logs", &id.to_string()]));
    assert!(log.contains("[d] d says 19"), "{log}");
}

#[test]
fn a_task_whose_host_is_lost_runs_again_on_another() {
    let mut g = grid("lost", &[("n1", "north"), ("n2", "north")], &[]);
    let graph = write(
        &g.dir,
        "lost.json",
        r#"{ "format": "mutirao-taskgraph/1", "tasks": [
            { "id": "long", "work": 1, "cmd": ["sh", "-c", "echo started; sleep 4; echo 42 > r"], "outputs": ["r"] } ] }"#,
    );
    let id: i64 = ok(&mutirao(&g, &["submit", "--dag", &graph]))
        .trim()
        .parse()
        .unwrap();
    let t0 = Instant::now();
    while !ok(&mutirao(&g, &["logs", &id.to_string()])).contains("[long] started") {
        assert!(t0.elapsed() < Duration::from_secs(30), "long never started");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Round-robin without a model: the only task went to n1 (first by name). Its agent dies.
    drop(g.agents.remove(0));
    let v = wait_state(&g, id, "finished", Duration::from_secs(60));
    let tasks = events(&v, "task").join("\n");
    assert!(
        tasks.contains("long lost its host n1") && tasks.contains("started again on n2"),
        "{v:#}"
    );
    let done = events(&v, "task-done");
    assert_eq!(done.len(), 1, "{v:#}");
    assert!(done[0].contains(r#""host":"n2""#), "{v:#}");
}
