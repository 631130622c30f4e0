//! `mutirao coordinator` as a process on loopback, driven by the client commands: submit
//! (uploads, then queues), jobs, job, logs, cancel; an unknown token (401) and another user's
//! job (404, as if it did not exist) refused with a message, changing nothing; and a job run end to end through a
//! registered agent on this machine (submit → running → finished, its output in its log).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

#[path = "../../mutirao-coord/tests/common/pg.rs"]
mod pg;

mod common;
use common::{err, ok};

const BIN: &str = env!("CARGO_BIN_EXE_mutirao");
const ANA: &str = "ana-token-0123456789";
const BIA: &str = "bia-token-0123456789";

struct Coord {
    child: Child,
    url: String,
    dir: PathBuf,
}

impl Drop for Coord {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !self.dir.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn start(tag: &str) -> Coord {
    start_with(tag, &[])
}

fn start_with(tag: &str, extra: &[&str]) -> Coord {
    start_with_env(tag, extra, &[])
}

/// A coordinator with `env` added to its environment.
fn start_with_env(tag: &str, extra: &[&str], env: &[(&str, &str)]) -> Coord {
    let dir = std::env::temp_dir().join(format!("mutirao-grid-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("grid.tokens"),
        format!("# test grid\nuser ana {ANA}\nuser bia {BIA}\nagent n1 n1-agent-token-0123456\n"),
    )
    .unwrap();
    // Private, as an operator keeps it (jobs of other tests look for tokens on this machine).
    std::fs::set_permissions(
        dir.join("grid.tokens"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    spawn_coord_env(dir, extra, env)
}

impl Coord {
    /// Kill this coordinator (SIGKILL: what a crash leaves) and start another on its files.
    fn crash_and_restart(mut self, extra: &[&str]) -> Coord {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let dir = std::mem::take(&mut self.dir);
        drop(self); // removes nothing: its dir was taken
        spawn_coord(dir, extra)
    }
}

fn spawn_coord(dir: PathBuf, extra: &[&str]) -> Coord {
    spawn_coord_env(dir, extra, &[])
}

fn spawn_coord_env(dir: PathBuf, extra: &[&str], env: &[(&str, &str)]) -> Coord {
    let tokens = dir.join("grid.tokens");
    let mut cmd = Command::new(BIN);
    cmd.envs(env.iter().copied());
    cmd.arg("coordinator");
    if !extra.contains(&"--listen") {
        cmd.args(["--listen", "127.0.0.1:0"]);
    }
    if extra.contains(&"--postgres") {
        cmd.arg("--repo")
            .arg(dir.join("repo"))
            .arg("--jobs-dir")
            .arg(dir.join("jobs"));
    } else {
        cmd.arg("--db").arg(dir.join("coord.sqlite"));
    }
    let mut child = cmd
        .arg("--tokens")
        .arg(&tokens)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start mutirao coordinator");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the coordinator says where it listens within 30 s");
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in {line:?}"))
        .to_string();
    Coord { child, url, dir }
}

fn mutirao(c: &Coord, token: &str, args: &[&str]) -> Output {
    common::grid_client(&c.url, token, args)
}

/// `mutirao submit ARGS` as ana: the job's id.
fn submit_id(c: &Coord, args: &[&str]) -> i64 {
    let mut all = vec!["submit"];
    all.extend_from_slice(args);
    let out = ok(&mutirao(c, ANA, &all));
    out.trim()
        .parse()
        .unwrap_or_else(|_| panic!("no job id: {out:?}"))
}

/// The details of the journal's events of `kind`, in order.
fn details<'a>(v: &'a serde_json::Value, kind: &str) -> Vec<&'a str> {
    v["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["kind"] == kind)
        .filter_map(|e| e["detail"].as_str())
        .collect()
}

#[test]
fn submit_jobs_job_logs_cancel_through_a_coordinator_process() {
    let c = start("cli");
    let prog = c.dir.join("hello.sh");
    std::fs::write(&prog, "#!/bin/sh\necho hello from $1\n").unwrap();
    let id = ok(&mutirao(
        &c,
        ANA,
        &[
            "submit",
            "-n",
            "2",
            "--require",
            "cpu>=1",
            "--",
            prog.to_str().unwrap(),
            "--flag",
            "x",
        ],
    ));
    let id: i64 = id.trim().parse().expect("submit prints the job id");

    let list = ok(&mutirao(&c, ANA, &["jobs"]));
    assert!(
        list.contains("waiting") && list.contains("--flag x"),
        "{list}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&ok(&mutirao(&c, ANA, &["jobs", "--json"]))).unwrap();
    assert_eq!(json[0]["id"], id);
    assert_eq!(json[0]["spec"]["ranks"], 2);
    assert_eq!(json[0]["spec"]["require"], "cpu>=1");
    let limited = ok(&mutirao(&c, ANA, &["jobs", "--limit", "1"]));
    assert!(
        limited.contains("the newest 1; --all for every job"),
        "{limited}"
    );
    // bia sees none of ana's jobs.
    assert!(ok(&mutirao(&c, BIA, &["jobs"])).contains("no jobs"));

    let one = ok(&mutirao(&c, ANA, &["job", &id.to_string()]));
    assert!(
        one.contains("waiting") && one.contains("submitted"),
        "{one}"
    );
    let why = ok(&mutirao(&c, ANA, &["job", &id.to_string(), "--why"]));
    // No agent registered: the coordinator journals why the job waits.
    assert!(why.contains("no host has registered"), "{why}");
    assert_eq!(ok(&mutirao(&c, ANA, &["logs", &id.to_string()])), "");

    // 401: an unknown token; 404: bia cancelling ana's job, answered as a job that does not
    // exist. Neither changes anything.
    let e = err(&mutirao(
        &c,
        "not-a-token-of-this-grid",
        &["cancel", &id.to_string()],
    ));
    assert!(e.contains("401") && e.contains("unknown token"), "{e}");
    let e = err(&mutirao(&c, BIA, &["cancel", &id.to_string()]));
    assert!(
        e.contains("404") && e.contains(&format!("job {id} does not exist")),
        "{e}"
    );
    let e = err(&mutirao(&c, BIA, &["logs", &id.to_string()]));
    assert!(e.contains("404"), "{e}");
    assert!(ok(&mutirao(&c, ANA, &["jobs"])).contains("waiting"));

    let out = ok(&mutirao(&c, ANA, &["cancel", &id.to_string()]));
    assert!(out.contains("cancelled"), "{out}");
    let one = ok(&mutirao(&c, ANA, &["job", &id.to_string()]));
    assert!(one.contains("cancelled by ana"), "{one}");
    // Following a cancelled job's log ends at once, saying why, with a failing status.
    let t0 = Instant::now();
    let o = mutirao(&c, ANA, &["logs", "--follow", &id.to_string()]);
    assert!(err(&o).contains("cancelled"));
    assert!(t0.elapsed() < Duration::from_secs(10));
    let e = err(&mutirao(&c, ANA, &["cancel", &id.to_string()]));
    assert!(e.contains("409"), "{e}");
    let e = err(&mutirao(&c, ANA, &["job", "424242"]));
    assert!(e.contains("404") && e.contains("does not exist"), "{e}");
}

#[test]
fn client_commands_explain_what_is_missing() {
    let c = start("missing");
    let e = err(&mutirao(&c, "", &["jobs"]));
    assert!(e.contains("MUTIRAO_COORD_TOKEN"), "{e}");
    let e = err(&mutirao(
        &c,
        ANA,
        &["submit", "-n", "2", "/no/such/program"],
    ));
    assert!(e.contains("cannot read the program"), "{e}");
    let o = Command::new(BIN)
        .args(["jobs", "--coord", "http://127.0.0.1:9"])
        .env("MUTIRAO_COORD_TOKEN", ANA)
        .output()
        .unwrap();
    let e = err(&o);
    assert!(e.contains("cannot reach the coordinator"), "{e}");
    let o = Command::new(BIN)
        .args(["coordinator", "--listen", "127.0.0.1:0"])
        .env_remove("MUTIRAO_COORD_TOKENS")
        .output()
        .unwrap();
    assert!(err(&o).contains("no token file"));
}

const N1: &str = "n1-agent-token-0123456";

struct Agent {
    child: Child,
    addr: String,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_agent(dir: &std::path::Path, coord: Option<(&str, &str)>) -> (Agent, PathBuf) {
    let tok = dir.join("agent.token");
    let o = Command::new(BIN)
        .args(["agent", "--gen-token"])
        .arg(&tok)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut child = Command::new(BIN)
        .args([
            "agent",
            "--listen",
            "127.0.0.1:0",
            "--print-addr",
            "--token-file",
        ])
        .arg(&tok)
        .arg("--dir-socket")
        .arg(dir.join("agent-dir.sock"))
        .arg("--program-cache")
        .arg(dir.join("programs"))
        // The agent's default replica store goes in the test's directory, not /tmp.
        .env("TMPDIR", dir)
        .args(
            coord
                .map(|(url, _)| {
                    vec![
                        "--coordinator",
                        url,
                        "--name",
                        "n1",
                        "--site",
                        "north",
                        "--prop",
                        "arch=test",
                    ]
                })
                .unwrap_or_default(),
        )
        .env(
            "MUTIRAO_COORD_TOKEN",
            coord.map(|(_, t)| t).unwrap_or_default(),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line.trim().to_string();
    assert!(!addr.is_empty(), "the agent printed no address");
    (Agent { child, addr }, tok)
}

fn wait_state(c: &Coord, id: i64, want: &str, limit: Duration) -> serde_json::Value {
    wait_state_as(c, ANA, id, want, limit)
}

/// [`wait_state`] of a job of the user whose token is `token`.
fn wait_state_as(
    c: &Coord,
    token: &str,
    id: i64,
    want: &str,
    limit: Duration,
) -> serde_json::Value {
    let t0 = Instant::now();
    loop {
        let o = mutirao(c, token, &["job", "--json", &id.to_string()]);
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

/// A scratch directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    /// An empty `mutirao-grid-PID-TAG` in the temporary directory.
    fn new(tag: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("mutirao-grid-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A coordinator (SQLite) and one agent, `n1` of site north, registered with it and caching
/// programs in the scratch directory's `programs`. Drop them in this order: agent,
/// coordinator, scratch.
fn grid_with_agent(tag: &str) -> (Agent, Coord, Scratch) {
    grid_with_agent_env(tag, &[])
}

/// [`grid_with_agent`], with `env` added to the coordinator's environment.
fn grid_with_agent_env(tag: &str, env: &[(&str, &str)]) -> (Agent, Coord, Scratch) {
    let tmp = Scratch::new(&format!("{tag}-agent"));
    // The agent's token file first (the coordinator starts ranks through the agent with it),
    // then the agent, which registers with the coordinator itself (`--coordinator`).
    let agent_tok = gen_agent_token(&tmp);
    let c = start_with_env(
        tag,
        &["--agent-token-file", agent_tok.to_str().unwrap()],
        env,
    );
    let (agent, _) = start_agent(&tmp.0, Some((&c.url, N1)));
    wait_registered(&c);
    (agent, c, tmp)
}

/// A new agent token file in `tmp`.
fn gen_agent_token(tmp: &Scratch) -> PathBuf {
    let agent_tok = tmp.0.join("agent.token");
    let o = Command::new(BIN)
        .args(["agent", "--gen-token"])
        .arg(&agent_tok)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    agent_tok
}

/// Until agent n1 has registered with `c`.
fn wait_registered(c: &Coord) {
    let ana = mutirao_coord::client::Client::new(&c.url, ANA).unwrap();
    let t0 = Instant::now();
    while !ana
        .hosts()
        .map(|h| h.iter().any(|h| h.host.report.name == "n1"))
        .unwrap_or(false)
    {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the agent did not register with the coordinator"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The runtime's example `name`, built by `cargo test`/`nextest` for the workspace.
fn example(name: &str) -> Option<PathBuf> {
    let p = std::path::Path::new(BIN)
        .parent()?
        .join("examples")
        .join(name);
    p.is_file().then_some(p)
}

#[test]
fn submit_env_reaches_the_ranks_and_a_reserved_name_is_refused_before_anything_is_sent() {
    let (_agent, c, _tmp) = grid_with_agent("env");
    let prog = c.dir.join("env.sh");
    std::fs::write(
        &prog,
        "#!/bin/sh\necho \"rank $MUTIRAO_RANK greets $GREETING, home $FROM_SHELL, empty [$EMPTY]\"\n",
    )
    .unwrap();
    let p = prog.to_str().unwrap();
    let submit = |args: &[&str]| {
        Command::new(BIN)
            .arg("submit")
            .args(args)
            .env("MUTIRAO_COORD", &c.url)
            .env("MUTIRAO_COORD_TOKEN", ANA)
            .env("FROM_SHELL", "/home/ana")
            .output()
            .unwrap()
    };
    // Refused, each with the reason, before the upload: nothing is submitted.
    for (bad, why) in [
        (&["--env", "MUTIRAO_RANK=7"][..], "reserved"),
        (&["--env", "mutirao_transport=tcp"][..], "reserved"),
        (&["--env", "1ABC=x"][..], "a name is a letter or _"),
        (&["--env", "NOT_SET_ANYWHERE_42"][..], "no such variable"),
        (&["--env", "A=1", "--env", "A=2"][..], "given twice"),
    ] {
        let mut args = vec!["-n", "1"];
        args.extend_from_slice(bad);
        args.push(p);
        let e = err(&submit(&args));
        assert!(e.contains(why), "{bad:?}: {e}");
    }
    assert!(ok(&mutirao(&c, ANA, &["jobs"])).contains("no jobs"));
    assert!(
        std::fs::read_dir(c.dir.join("coord.sqlite.repo"))
            .map(|d| d.count() == 0)
            .unwrap_or(true),
        "a refused submission uploaded its program"
    );
    let id: i64 = ok(&submit(&[
        "-n",
        "2",
        "--env",
        "GREETING=olá mundo",
        "--env",
        "FROM_SHELL",
        "--env",
        "EMPTY=",
        p,
    ]))
    .trim()
    .parse()
    .unwrap();
    let v = wait_state(&c, id, "finished", Duration::from_secs(30));
    let log = ok(&mutirao(&c, ANA, &["logs", &id.to_string()]));
    for r in 0..2 {
        assert!(
            log.contains(&format!(
                "[{r}] rank {r} greets olá mundo, home /home/ana, empty []"
            )),
            "{log:?} {v:#}"
        );
    }
    // Shown by `jobs` and `job`, kept in the job's spec.
    let list = ok(&mutirao(&c, ANA, &["jobs"]));
    assert!(list.contains("GREETING=olá mundo"), "{list}");
    let one = ok(&mutirao(&c, ANA, &["job", &id.to_string()]));
    assert!(
        one.contains("environment EMPTY= FROM_SHELL=/home/ana GREETING=olá mundo"),
        "{one}"
    );
    assert_eq!(v["job"]["spec"]["env"]["FROM_SHELL"], "/home/ana");

    // A program of the runtime: the journal tells how its start-up went.
    let Some(hello) = example("hello") else {
        println!("skipped the init journal: the hello example is not built");
        return;
    };
    let id = submit_id(&c, &["-n", "2", hello.to_str().unwrap()]);
    let v = wait_state(&c, id, "finished", Duration::from_secs(30));
    let init = details(&v, "init");
    assert!(
        init.len() == 1
            && init[0].starts_with("init of 2 ranks, max over ranks: register ")
            && init[0].contains(" ms, address exchange ")
            && init[0].contains("all connected "),
        "{v:#}"
    );
}

#[test]
fn a_submitted_job_runs_through_a_registered_agent_to_finished() {
    let (_agent, c, _tmp) = grid_with_agent("run");
    let prog = c.dir.join("hello.sh");
    std::fs::write(
        &prog,
        "#!/bin/sh\necho \"rank $MUTIRAO_RANK of $MUTIRAO_SIZE says $1\"\n",
    )
    .unwrap();
    let id: i64 = ok(&mutirao(
        &c,
        ANA,
        &[
            "submit",
            "-n",
            "2",
            // The agent reports what /proc says; idle CPU depends on the rest of the test
            // suite (a loaded CI machine has none), free memory does not.
            // Its declared site and property are matched too.
            "--require",
            "mem>=1 & site=north & arch=test",
            prog.to_str().unwrap(),
            "hi",
        ],
    ))
    .trim()
    .parse()
    .unwrap();
    // --follow prints the output as it comes and ends with the job, successfully.
    let o = mutirao(&c, ANA, &["logs", "--follow", &id.to_string()]);
    let out = ok(&o);
    let v = wait_state(&c, id, "finished", Duration::from_secs(30));
    let all = ok(&mutirao(&c, ANA, &["logs", &id.to_string()]));
    for r in 0..2 {
        assert!(
            out.contains(&format!("[{r}] rank {r} of 2 says hi")),
            "followed: {out:?}; whole log: {all:?}; {v:#}"
        );
    }
    let story: Vec<String> = v["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            format!(
                "{} {}",
                e["kind"].as_str().unwrap(),
                e["detail"].as_str().unwrap()
            )
        })
        .collect();
    assert!(
        story
            .iter()
            .any(|l| l.starts_with("placement 2 ranks on n1×2")),
        "{story:#?}"
    );
    assert!(
        story.iter().any(|l| l == "state started on n1"),
        "{story:#?}"
    );
    assert_eq!(story.last().unwrap(), "state exit 0", "{story:#?}");
    let why = ok(&mutirao(&c, ANA, &["job", "--why", &id.to_string()]));
    assert!(why.contains("n1×2") && why.contains("verified"), "{why}");

    // A job for another site waits, and says why n1 is refused.
    let id: i64 = ok(&mutirao(
        &c,
        ANA,
        &[
            "submit",
            "-n",
            "1",
            "--require",
            "site=south",
            prog.to_str().unwrap(),
        ],
    ))
    .trim()
    .parse()
    .unwrap();
    let t0 = Instant::now();
    loop {
        let why = ok(&mutirao(&c, ANA, &["job", "--why", &id.to_string()]));
        if why.contains("site is \"north\", not =\"south\"") {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "{why}");
        std::thread::sleep(Duration::from_millis(100));
    }
    ok(&mutirao(&c, ANA, &["cancel", &id.to_string()]));

    // A failing program fails its job; a long one is cancelled and ends.
    let bad = c.dir.join("bad.sh");
    std::fs::write(&bad, "#!/bin/sh\necho failing >&2\nexit 3\n").unwrap();
    let id: i64 = ok(&mutirao(
        &c,
        ANA,
        &["submit", "-n", "1", bad.to_str().unwrap()],
    ))
    .trim()
    .parse()
    .unwrap();
    let v = wait_state(&c, id, "failed", Duration::from_secs(30));
    let last = v["events"].as_array().unwrap().last().unwrap()["detail"].clone();
    assert!(last.as_str().unwrap().contains("exit status"), "{v:#}");
    assert!(ok(&mutirao(&c, ANA, &["logs", &id.to_string()])).contains("failing"));

    let slow = c.dir.join("slow.sh");
    std::fs::write(&slow, "#!/bin/sh\necho started\nsleep 60\n").unwrap();
    let id: i64 = ok(&mutirao(
        &c,
        ANA,
        &["submit", "-n", "1", slow.to_str().unwrap()],
    ))
    .trim()
    .parse()
    .unwrap();
    wait_state(&c, id, "running", Duration::from_secs(30));
    let t0 = Instant::now();
    while !ok(&mutirao(&c, ANA, &["logs", &id.to_string()])).contains("started") {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no output from the slow job"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The agent runs its own copy, fetched from the repository by digest (a root agent runs
    // a copy of it in the job's own directory, owned by the job's uid).
    let digest = mutirao_coord::repo::digest_of(&std::fs::read(&slow).unwrap());
    let program = digest.replace(':', "-");
    let program = program.as_str();
    let ps = || {
        let o = Command::new("ps").args(["-eo", "args"]).output().unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    assert!(
        ps().contains(program),
        "the job's rank is not running:\n{}",
        ps()
    );
    ok(&mutirao(&c, ANA, &["cancel", &id.to_string()]));
    wait_state(&c, id, "cancelled", Duration::from_secs(5));
    // Its launcher and rank are gone within the grace period.
    let t0 = Instant::now();
    loop {
        let ps = ps();
        if !ps.contains(program) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "the cancelled job still runs:\n{ps}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_rank_that_never_reaches_the_barrier_fails_the_job_within_the_timeout_naming_it() {
    // The EM barrier's timeout (digest 004 §15.5): the coordinator's launcher gives the ranks
    // 0.8 × MUTIRAO_CONNECT_TIMEOUT_S to meet; without checkpoints the job fails, and its
    // journal names the rank that never came (not those that gave up waiting for it).
    let Some(hello) = example("hello") else {
        println!(
            "skipped: the hello example is not built (cargo build -p mutirao --example hello)"
        );
        return;
    };
    let (_agent, c, _tmp) = grid_with_agent_env("barrier", &[("MUTIRAO_CONNECT_TIMEOUT_S", "3")]);
    let prog = c.dir.join("hang.sh");
    std::fs::write(
        &prog,
        format!(
            "#!/bin/sh\n[ \"$MUTIRAO_RANK\" = 1 ] && exec sleep 600\nexec {} \"$@\"\n",
            hello.display()
        ),
    )
    .unwrap();
    let t0 = Instant::now();
    let id = submit_id(&c, &["-n", "2", prog.to_str().unwrap()]);
    let v = wait_state(&c, id, "failed", Duration::from_secs(60));
    let took = t0.elapsed();
    assert!(
        details(&v, "launcher")
            .iter()
            .any(|n| n.contains("rank 1 on n1 never reached the start-up barrier")),
        "{v:#}"
    );
    let last = v["events"].as_array().unwrap().last().unwrap();
    assert!(
        last["to"] == "failed" && last["detail"].as_str().unwrap().starts_with("exit status "),
        "{v:#}"
    );
    // Nothing waited for the hung rank beyond the barrier's timeout (2.4 s) and the ending.
    assert!(took < Duration::from_secs(30), "{took:?}: {v:#}");
}

#[test]
fn an_agent_runs_the_program_it_fetched_by_digest_and_refuses_an_altered_copy() {
    let (_agent, c, tmp) = grid_with_agent("fetch");
    // The program says where it runs from and in which directory.
    let prog = c.dir.join("where.sh");
    std::fs::write(&prog, "#!/bin/sh\necho \"from $0 in $(pwd)\"\n").unwrap();
    let digest = mutirao_coord::repo::digest_of(&std::fs::read(&prog).unwrap());
    let cached = tmp.0.join("programs").join(digest.replace(':', "-"));
    let submit = || -> i64 {
        ok(&mutirao(
            &c,
            ANA,
            &["submit", "-n", "1", prog.to_str().unwrap()],
        ))
        .trim()
        .parse()
        .unwrap()
    };
    let id = submit();
    let v = wait_state(&c, id, "finished", Duration::from_secs(30));
    let out = ok(&mutirao(&c, ANA, &["logs", &id.to_string()]));
    // The agent's copy: its cached file, or (a root agent) a copy of it in the job's own
    // directory, named by the same digest.
    let copy = cached.file_name().unwrap().to_str().unwrap();
    assert!(
        out.contains(&format!("[0] from {}", cached.display()))
            || (out.contains("[0] from /") && out.contains(&format!("/{copy} in /"))),
        "the rank did not run the agent's copy: {out:?} {v:#}"
    );
    assert!(cached.exists());
    // Someone alters the cached copy on the agent's host: the launch there is refused and the
    // altered copy removed, the journal says why; the host is not lost, so the re-queued job
    // goes to it again, which fetches a fresh copy from the repository and runs it.
    std::fs::write(&cached, "#!/bin/sh\necho evil\n").unwrap();
    let id = submit();
    let v = wait_state(&c, id, "finished", Duration::from_secs(60));
    let story: Vec<(String, String)> = v["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["kind"].as_str().unwrap().to_string(),
                e["detail"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let has = |kind: &str, text: &str| story.iter().any(|(k, d)| k == kind && d.contains(text));
    assert!(
        has("launcher", "altered on this host") && has("launcher", &digest),
        "the agent's reason is not in the journal: {story:#?}"
    );
    assert!(
        has("refused", "n1 refused the launch")
            && has(
                "state",
                "re-queued (refused launch; re-queue 1 of at most 3)"
            ),
        "{story:#?}"
    );
    assert!(
        !story
            .iter()
            .any(|(k, d)| k == "host-lost" || d.contains("lost during")),
        "a refusal counted as a lost host: {story:#?}"
    );
    let out = ok(&mutirao(&c, ANA, &["logs", &id.to_string()]));
    assert!(!out.contains("evil"), "the altered copy ran: {out}");
    assert!(
        out.contains(&format!("[0] from {}", cached.display()))
            || (out.contains("[0] from /") && out.contains(&format!("/{copy} in /"))),
        "{out}"
    );
    assert_eq!(
        mutirao_coord::repo::digest_of(&std::fs::read(&cached).unwrap()),
        digest,
        "the cached copy is not the fresh one"
    );
}

#[test]
fn a_coordinator_crash_mid_job_loses_nothing_and_the_job_completes() {
    let tmp = Scratch::new("crash-agent");
    let (agent, agent_tok) = start_agent(&tmp.0, None);
    let extra = ["--agent-token-file", agent_tok.to_str().unwrap()];
    let c = start_with("crash", &extra);
    let report = mutirao_coord::HostReport {
        name: "n1".into(),
        addr: agent.addr.clone(),
        idle_cpu: 2.0,
        free_mem_mib: 4096,
        load: 0.1,
        owner_active: false,
        ..Default::default()
    };
    mutirao_coord::client::Client::new(&c.url, N1)
        .unwrap()
        .register(&report)
        .unwrap();
    let prog = c.dir.join("slow.sh");
    std::fs::write(
        &prog,
        "#!/bin/sh\necho begun $MUTIRAO_RANK\nsleep 2\necho done $MUTIRAO_RANK\n",
    )
    .unwrap();
    let id: i64 = ok(&mutirao(
        &c,
        ANA,
        &["submit", "-n", "2", prog.to_str().unwrap()],
    ))
    .trim()
    .parse()
    .unwrap();
    wait_state(&c, id, "running", Duration::from_secs(30));

    let c = c.crash_and_restart(&extra);
    // The host's registration survived too; the agent reports again to the new coordinator.
    mutirao_coord::client::Client::new(&c.url, N1)
        .unwrap()
        .heartbeat(&report)
        .unwrap();
    let v = wait_state(&c, id, "finished", Duration::from_secs(60));
    let story: Vec<String> = v["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["detail"].as_str().unwrap().to_string())
        .collect();
    let restarted = story
        .iter()
        .position(|d| d.contains("re-queued"))
        .unwrap_or_else(|| panic!("{story:#?}"));
    assert!(
        story[restarted..].iter().any(|d| d == "started on n1"),
        "started again after the restart: {story:#?}"
    );
    assert_eq!(story.last().unwrap(), "exit 0", "{story:#?}");
    let log = ok(&mutirao(&c, ANA, &["logs", &id.to_string()]));
    assert!(
        log.contains("[0] done 0") && log.contains("[1] done 1"),
        "{log}"
    );
}

#[test]
fn a_coordinator_on_postgresql_keeps_jobs_across_a_crash() {
    let server = match pg::PgServer::start("cli") {
        Ok(s) => s,
        Err(why) => {
            println!("skipped: cannot start a PostgreSQL server: {why}");
            return;
        }
    };
    let url = server.fresh_db();
    let extra = ["--postgres", url.as_str()];
    let c = start_with("pg", &extra);
    let prog = c.dir.join("p.sh");
    std::fs::write(&prog, "#!/bin/sh\ntrue\n").unwrap();
    let id: i64 = ok(&mutirao(
        &c,
        ANA,
        &[
            "submit",
            "-n",
            "3",
            "--require",
            "mem>=1",
            prog.to_str().unwrap(),
            "a b",
        ],
    ))
    .trim()
    .parse()
    .unwrap();
    let c = c.crash_and_restart(&extra);
    let v: serde_json::Value =
        serde_json::from_str(&ok(&mutirao(&c, ANA, &["job", "--json", &id.to_string()]))).unwrap();
    assert_eq!(v["job"]["state"], "waiting");
    assert_eq!(v["job"]["spec"]["args"][0], "a b");
    assert_eq!(v["events"][0]["detail"], "submitted");
    assert!(ok(&mutirao(&c, ANA, &["jobs"])).contains("waiting"));
    let e = err(&mutirao(&c, BIA, &["job", &id.to_string()]));
    assert!(e.contains("404"), "{e}");
}

/// A TCP forwarder on a fixed loopback port to a coordinator that may move (restarted on
/// another port): agents keep their `--coordinator` URL across the coordinator's restart.
/// Retargeting (or cutting) closes every connection forwarded so far.
struct Forward {
    url: String,
    target: std::sync::Arc<std::sync::Mutex<Option<String>>>,
    conns: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl Forward {
    fn new(to: &str) -> Forward {
        use std::sync::{Arc, Mutex};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let target = Arc::new(Mutex::new(Some(
            to.trim_start_matches("http://").to_string(),
        )));
        let conns: Arc<Mutex<Vec<std::net::TcpStream>>> = Arc::new(Mutex::new(Vec::new()));
        let (t, cs) = (target.clone(), conns.clone());
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { continue };
                let Some(to) = t.lock().unwrap().clone() else {
                    continue; // cut: dropped
                };
                let Ok(up) = std::net::TcpStream::connect(&to) else {
                    continue;
                };
                let mut g = cs.lock().unwrap();
                g.push(c.try_clone().unwrap());
                g.push(up.try_clone().unwrap());
                for (mut a, mut b) in [(c.try_clone().unwrap(), up.try_clone().unwrap()), (up, c)] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut a, &mut b);
                        let _ = b.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Forward { url, target, conns }
    }

    /// Forward to `to` from now on (`None`: refuse), closing the connections made so far.
    fn retarget(&self, to: Option<&str>) {
        *self.target.lock().unwrap() = to.map(|u| u.trim_start_matches("http://").to_string());
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// `kill -SIG pid`.
fn signal(child: &Child, sig: &str) {
    let st = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success(), "kill {sig}");
}

/// The journal's events as (kind, detail).
fn story(v: &serde_json::Value) -> Vec<(String, String)> {
    v["events"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            (
                e["kind"].as_str().unwrap_or("").to_string(),
                e["detail"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// The agent's rank journal (`ranks.json` in its state directory, by default its program cache).
fn agent_journal(tmp: &Scratch) -> mutirao_launch::journal::Journal {
    std::fs::read(tmp.0.join("programs").join("ranks.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Wait until `f` holds of the agent's rank journal.
fn wait_journal(tmp: &Scratch, what: &str, f: impl Fn(&mutirao_launch::journal::Journal) -> bool) {
    let t0 = Instant::now();
    while !f(&agent_journal(tmp)) {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the agent's journal never showed {what}: {:#?}",
            agent_journal(tmp)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A coordinator (heartbeats every 0.5 s) behind a [`Forward`], and agent n1 registered with
/// it through the forwarder. Drop order: agent, coordinator, scratch.
fn grid_behind_forward(tag: &str) -> (Agent, Coord, Forward, Scratch, Vec<String>) {
    let tmp = Scratch::new(&format!("{tag}-agent"));
    let agent_tok = gen_agent_token(&tmp);
    let extra: Vec<String> = vec![
        "--agent-token-file".into(),
        agent_tok.display().to_string(),
        "--heartbeat-interval".into(),
        "0.5".into(),
    ];
    let e: Vec<&str> = extra.iter().map(String::as_str).collect();
    let c = start_with(tag, &e);
    let fw = Forward::new(&c.url);
    let (agent, _) = start_agent(&tmp.0, Some((&fw.url, N1)));
    wait_registered(&c);
    (agent, c, fw, tmp, extra)
}

/// Freeze coordinator `c` (SIGSTOP) with the agents cut off from it first (no write of theirs
/// is left half done), start another on its files, and forward the agents to it. The frozen
/// one is killed when the returned handle drops.
fn freeze_and_replace(mut c: Coord, fw: &Forward, extra: &[String]) -> (Coord, Coord) {
    fw.retarget(None);
    std::thread::sleep(Duration::from_millis(300));
    signal(&c.child, "-STOP");
    let dir = std::mem::take(&mut c.dir);
    let e: Vec<&str> = extra.iter().map(String::as_str).collect();
    let fresh = spawn_coord(dir, &e);
    (fresh, c)
}

#[test]
fn a_restarted_coordinator_waits_for_the_old_ranks_to_be_gone_then_runs_the_job_once_more() {
    let (_agent, c, fw, tmp, extra) = grid_behind_forward("reconcile-alive");
    let prog = c.dir.join("long.sh");
    let marks = tmp.0.join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    // The job may run as a uid of its own (a root agent): it must be able to leave marks here.
    std::fs::set_permissions(&marks, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    // The first run sleeps long; the second (the marks exist) ends at once.
    std::fs::write(
        &prog,
        format!(
            "#!/bin/sh\nm={}/ran-$MUTIRAO_RANK\nif [ -e $m ]; then echo again $MUTIRAO_RANK; exit 0; fi\ntouch $m\necho begun $MUTIRAO_RANK\nsleep 120\n",
            marks.display()
        ),
    )
    .unwrap();
    let id = submit_id(&c, &["-n", "2", prog.to_str().unwrap()]);
    wait_state(&c, id, "running", Duration::from_secs(30));
    wait_journal(&tmp, "two ranks alive", |j| {
        j.entries.iter().filter(|e| e.ended_ms.is_none()).count() == 2
    });
    // The coordinator freezes: its launcher's sessions stay open, so the agent keeps the
    // ranks until it finds the launcher silent (5 s); a new coordinator starts meanwhile.
    let (c, frozen) = freeze_and_replace(c, &fw, &extra);
    fw.retarget(Some(&c.url));
    let v = wait_state(&c, id, "finished", Duration::from_secs(90));
    drop(frozen);
    let s = story(&v);
    let pos = |f: &dyn Fn(&(String, String)) -> bool| {
        s.iter()
            .position(f)
            .unwrap_or_else(|| panic!("not in the journal: {s:#?}"))
    };
    let began = pos(&|(k, d)| k == "reconcile" && d.contains("waiting up to"));
    let alive = pos(&|(k, d)| {
        k == "reconcile" && d.contains("still alive") && d.contains("n1 ranks [0, 1] of run 1")
    });
    let requeued = pos(&|(k, d)| {
        k == "state"
            && d.contains("the agents report that run 1 did not succeed")
            && d.contains("signal 9")
    });
    let again = pos(&|(k, d)| k == "run" && d.starts_with("run 2:"));
    assert!(
        began < alive && alive < requeued && requeued < again,
        "{s:#?}"
    );
    assert_eq!(
        s.iter().filter(|(k, _)| k == "run").count(),
        2,
        "run once more: {s:#?}"
    );
    assert_eq!(s.last().unwrap().1, "exit 0", "{s:#?}");
    // No two copies at once: the second run started after every first-run rank had ended.
    let j = agent_journal(&tmp);
    let first_end = j
        .entries
        .iter()
        .filter(|e| e.label.run == 1)
        .filter_map(|e| e.ended_ms)
        .max()
        .unwrap();
    let second_start = j
        .entries
        .iter()
        .filter(|e| e.label.run == 2)
        .map(|e| e.started_ms)
        .min()
        .unwrap();
    assert!(first_end <= second_start, "{j:#?}");
    let log = ok(&mutirao(&c, ANA, &["logs", &id.to_string()]));
    assert!(
        log.contains("[0] again 0") && log.contains("[1] again 1"),
        "{log}"
    );
}

#[test]
fn a_job_that_ended_while_the_coordinator_was_down_is_finished_without_running_again() {
    let (_agent, c, fw, tmp, extra) = grid_behind_forward("reconcile-done");
    let prog = c.dir.join("gated.sh");
    let go = tmp.0.join("go");
    let runs = tmp.0.join("runs");
    // The job may run as a uid of its own (a root agent): it must be able to append here.
    std::fs::write(&runs, "").unwrap();
    std::fs::set_permissions(&runs, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    std::fs::write(
        &prog,
        format!(
            "#!/bin/sh\necho x >> {}\nwhile [ ! -e {} ]; do sleep 0.05; done\necho done $MUTIRAO_RANK\n",
            runs.display(),
            go.display()
        ),
    )
    .unwrap();
    let id = submit_id(&c, &["-n", "2", prog.to_str().unwrap()]);
    wait_state(&c, id, "running", Duration::from_secs(30));
    wait_journal(&tmp, "two ranks alive", |j| {
        j.entries.iter().filter(|e| e.ended_ms.is_none()).count() == 2
    });
    // Frozen before the ranks end; they end (exit 0) while it cannot record it; then it dies.
    fw.retarget(None);
    std::thread::sleep(Duration::from_millis(300));
    signal(&c.child, "-STOP");
    std::fs::write(&go, "").unwrap();
    wait_journal(&tmp, "both ranks exited 0", |j| {
        j.entries.len() == 2 && j.entries.iter().all(|e| e.code == Some(0))
    });
    let c = c.crash_and_restart(&extra.iter().map(String::as_str).collect::<Vec<_>>());
    fw.retarget(Some(&c.url));
    let v = wait_state(&c, id, "finished", Duration::from_secs(60));
    let s = story(&v);
    let (_, last) = s.last().unwrap();
    assert!(
        last.contains("every rank of run 1 exited 0 (n1 ranks [0, 1])")
            && last.contains("without running it again"),
        "{s:#?}"
    );
    assert_eq!(s.iter().filter(|(k, _)| k == "run").count(), 1, "{s:#?}");
    assert!(!s.iter().any(|(_, d)| d.contains("re-queued")), "{s:#?}");
    // The program ran once per rank, not again.
    assert_eq!(std::fs::read_to_string(&runs).unwrap().lines().count(), 2);
}

#[test]
fn a_job_whose_agent_never_reports_after_a_restart_is_requeued_after_the_bound() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let tmp = Scratch::new("reconcile-silent-agent");
    // An agent that does not report by itself: the test reports for it, and stops.
    let (agent, agent_tok) = start_agent(&tmp.0, None);
    let extra = [
        "--agent-token-file",
        agent_tok.to_str().unwrap(),
        "--heartbeat-interval",
        "0.5",
    ];
    let c = start_with("reconcile-silent", &extra);
    let report = mutirao_coord::HostReport {
        name: "n1".into(),
        addr: agent.addr.clone(),
        idle_cpu: 2.0,
        free_mem_mib: 4096,
        load: 0.1,
        ..Default::default()
    };
    let url = Arc::new(Mutex::new(c.url.clone()));
    let quiet = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let beats = {
        let (url, quiet, stop, report) = (url.clone(), quiet.clone(), stop.clone(), report.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                if !quiet.load(Ordering::SeqCst) {
                    let cl = mutirao_coord::client::Client::new(&url.lock().unwrap(), N1).unwrap();
                    let _ = cl.register(&report);
                }
                std::thread::sleep(Duration::from_millis(150));
            }
        })
    };
    let prog = c.dir.join("slow.sh");
    std::fs::write(&prog, "#!/bin/sh\nsleep 1\necho done $MUTIRAO_RANK\n").unwrap();
    let id = submit_id(&c, &["-n", "2", prog.to_str().unwrap()]);
    wait_state(&c, id, "running", Duration::from_secs(30));
    quiet.store(true, Ordering::SeqCst);
    let c = c.crash_and_restart(&extra);
    *url.lock().unwrap() = c.url.clone();
    // n1 says nothing: after the bound (2 × 0.5 s + 5 s + 1 s) the job is re-queued.
    let t0 = Instant::now();
    let v = wait_state(&c, id, "waiting", Duration::from_secs(30));
    let waited = t0.elapsed();
    let s = story(&v);
    assert!(
        s.iter().any(|(k, d)| k == "state"
            && d.starts_with("n1 did not report within 7.0 s of the coordinator's restart")),
        "{s:#?}"
    );
    assert!(
        waited >= Duration::from_secs(5),
        "re-queued after {waited:?}: {s:#?}"
    );
    // Back: the job runs again to its end.
    quiet.store(false, Ordering::SeqCst);
    let v = wait_state(&c, id, "finished", Duration::from_secs(60));
    stop.store(true, Ordering::SeqCst);
    let _ = beats.join();
    let s = story(&v);
    assert_eq!(s.iter().filter(|(k, _)| k == "run").count(), 2, "{s:#?}");
    assert_eq!(s.last().unwrap().1, "exit 0", "{s:#?}");
}

fn is_root() -> bool {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn a_grid_job_finds_neither_the_agent_s_tokens_nor_another_user_s_secrets() {
    if !is_root() {
        println!("skipped: needs root (a root agent gives each job a uid of its own)");
        return;
    }
    let (_agent, c, tmp) = grid_with_agent("secrets");
    // The operator's token file is private, as it should be (a readable one is warned about).
    let tokens = c.dir.join("grid.tokens");
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let agent_tok = tmp.0.join("agent.token");
    let agent_secret = std::fs::read_to_string(&agent_tok)
        .unwrap()
        .trim()
        .to_string();
    // bia's job holds a secret in its environment while ana's job looks for it.
    let nap = c.dir.join("nap.sh");
    std::fs::write(
        &nap,
        "#!/bin/sh
echo napping
sleep 30
",
    )
    .unwrap();
    let out = ok(&common::grid_client(
        &c.url,
        BIA,
        &[
            "submit",
            "-n",
            "1",
            "--env",
            "BIA_SECRET=bia-secret-0123456789",
            nap.to_str().unwrap(),
        ],
    ));
    let bia_job: i64 = out.trim().parse().unwrap();
    wait_state_as(&c, BIA, bia_job, "running", Duration::from_secs(30));
    let snoop = c.dir.join("snoop.sh");
    std::fs::write(
        &snoop,
        r#"#!/bin/sh
id
env
for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do tr '\0' '\n' < "$f"; done 2>/dev/null
cat "$@" 2>/dev/null
find /tmp /root /etc /run -xdev -maxdepth 4 -type f \( -name '*token*' -o -name '*.sqlite*' \) -exec cat {} + 2>/dev/null | head -c 2000000
echo snooped
"#,
    )
    .unwrap();
    let id = submit_id(
        &c,
        &[
            "-n",
            "1",
            "--",
            snoop.to_str().unwrap(),
            agent_tok.to_str().unwrap(),
            tokens.to_str().unwrap(),
        ],
    );
    wait_state(&c, id, "finished", Duration::from_secs(120));
    let log = ok(&mutirao(&c, ANA, &["logs", &id.to_string()]));
    assert!(log.contains("snooped"), "{log}");
    assert!(!log.contains("uid=0("), "the job ran as root: {log}");
    assert!(!log.contains(&agent_secret), "the job read the agent token");
    assert!(
        !log.contains(N1),
        "the job read the agent's coordinator token"
    );
    assert!(
        !log.contains("bia-secret-0123456789"),
        "the job read another user's secret"
    );
    assert!(!log.contains(BIA), "the job read a user's token");
    ok(&common::grid_client(
        &c.url,
        BIA,
        &["cancel", &bia_job.to_string()],
    ));
}

#[test]
fn an_agent_started_before_its_coordinator_registers_once_the_coordinator_is_up() {
    let tmp = Scratch::new("early-agent");
    let agent_tok = gen_agent_token(&tmp);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let (mut agent, _) = start_agent(&tmp.0, Some((&url, N1)));
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        agent.child.try_wait().unwrap().is_none(),
        "the agent exited while its coordinator was not up"
    );
    let listen = format!("127.0.0.1:{port}");
    let c = start_with(
        "early",
        &[
            "--listen",
            &listen,
            "--agent-token-file",
            agent_tok.to_str().unwrap(),
        ],
    );
    let t0 = Instant::now();
    wait_registered(&c);
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "registered {:?} after the coordinator started",
        t0.elapsed()
    );
}
