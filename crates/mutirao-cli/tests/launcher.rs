//! End-to-end tests of `mutirao run` and `mutirao agent`. This binary is also the rank program:
//! started with `MUTIRAO_SCENARIO` set, it plays that scenario.

use libtest_mimic::{Arguments, Failed, Trial};
use mutirao::op;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const MUTIRAO: &str = env!("CARGO_BIN_EXE_mutirao");

/// Scenarios that act before `init` (checkpoint recovery's failure cases).
fn before_init(name: &str) {
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let incarnation = var("MUTIRAO_INCARNATION");
    let rank = var("MUTIRAO_RANK");
    match name {
        // The first incarnation's rank 1 hangs before it ever reaches the start-up barrier.
        "hang" if incarnation == "0" && rank == "1" => {
            std::thread::sleep(Duration::from_secs(600));
        }
        // The first incarnation's rank 1 leaves its job token behind and dies; in the next
        // incarnation rank 0 tries to register with it as rank 1 and must be refused.
        "stale" if incarnation == "0" && rank == "1" => {
            let dir = var("MARK_DIR");
            let _ = std::fs::write(
                Path::new(&dir).join("stale.token"),
                var("MUTIRAO_JOB_TOKEN"),
            );
            std::process::exit(3);
        }
        "stale" if incarnation == "1" && rank == "0" => {
            let dir = var("MARK_DIR");
            let old =
                std::fs::read_to_string(Path::new(&dir).join("stale.token")).unwrap_or_default();
            let Some(token) = mutirao::pmi::unhex_token(old.trim()) else {
                eprintln!("no stale token left by the first incarnation");
                std::process::exit(5);
            };
            match mutirao::pmi::PmiClient::connect(
                &var("MUTIRAO_PMI_ADDR"),
                1,
                &token,
                Duration::from_secs(5),
            ) {
                Ok(_) => {
                    eprintln!("a registration with the previous incarnation's token was accepted");
                    std::process::exit(6);
                }
                Err(e) => println!("stale registration refused: {e}"),
            }
        }
        _ => {}
    }
}

fn scenario(name: &str) -> ! {
    before_init(name);
    let w = match mutirao::init() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("init: {e}");
            std::process::exit(1)
        }
    };
    let r = w.rank();
    if let Ok(dir) = std::env::var("MARK_DIR") {
        let _ = std::fs::write(
            Path::new(&dir).join(format!("rank{r}.pid")),
            std::process::id().to_string(),
        );
    }
    match name {
        "hello" => {
            println!("hi from {r} of {}", w.size());
            eprintln!("note from {r}");
        }
        "fail2" => {
            w.barrier().ok();
            if r == 2 {
                std::process::exit(7);
            }
            // The others wait for a message that never comes; the launcher must end them.
            let mut b = [0u8];
            let _ = w.recv(&mut b, 2, 0);
            std::thread::sleep(Duration::from_secs(60));
        }
        "kill" => {
            let mut out = vec![0u64; 512];
            for i in 0..u64::MAX {
                if r == 1 && i == 100 {
                    // SAFETY: kill(2) on our own pid has no memory-safety preconditions.
                    unsafe { libc::kill(std::process::id() as i32, libc::SIGKILL) };
                }
                if let Err(e) = w.allreduce(&vec![i; 512], &mut out, &op::Sum) {
                    eprintln!("rank {r}: allreduce failed as expected: {e}");
                    std::process::exit(3);
                }
            }
        }
        "sleep" => std::thread::sleep(Duration::from_secs(60)),
        "hang" | "stale" => println!("rank {r} of {} done", w.size()),
        // Rank 0 adds two ranks of this program (placement hints from SPAWN_HINT, if set); each
        // child sends its world rank to the parent over the merged communicator.
        "spawn" if w.is_spawned() => {
            w.send(&[w.rank() as u64], 0, 5).ok();
        }
        "spawn" if r == 0 => {
            let hints: Vec<String> = std::env::var("SPAWN_HINT")
                .map(|h| h.split(',').map(str::to_string).collect())
                .unwrap_or_default();
            let spec = mutirao::SpawnSpec::new(2)
                .hosts(hints)
                .timeout(Duration::from_secs(20));
            match w.spawn(&spec) {
                Ok(s) => {
                    let mut got = Vec::new();
                    for c in 1..s.comm.size() {
                        let mut b = [0u64];
                        if let Err(e) = s.comm.recv(&mut b, c, 5) {
                            eprintln!("child {c}: {e}");
                            std::process::exit(4);
                        }
                        got.push(b[0]);
                    }
                    s.comm.barrier().ok();
                    let hosts: Vec<&str> = s.latency.iter().map(|(h, _)| h.as_str()).collect();
                    println!(
                        "spawned {} children: group ranks {got:?} on {hosts:?}",
                        got.len()
                    );
                }
                Err(e) => println!("spawn refused: {e}"),
            }
        }
        "spawn" => {}
        "affinity" => println!("rank {r} cpus {}", cpus_allowed()),
        other => {
            eprintln!("unknown scenario {other}");
            std::process::exit(1)
        }
    }
    match w.finalize() {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("finalize: {e}");
            std::process::exit(1)
        }
    }
}

/// This process's `Cpus_allowed_list` (`0-1`, `3`).
fn cpus_allowed() -> String {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap_or("")
        .trim()
        .to_string()
}

/// The CPUs of a `Cpus_allowed_list`.
fn cpu_list(s: &str) -> Vec<usize> {
    let mut out = vec![];
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) {
            out.extend(a..=b);
        }
    }
    out
}

fn me() -> PathBuf {
    std::env::current_exe().expect("test binary path")
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mutirao-cli-test-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// Removes a test's directory when dropped, also when the test fails.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Run a command with a time limit; kill it if it overruns.
fn run_limited(mut cmd: Command, limit: Duration) -> Result<(Output, Duration), Failed> {
    let start = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawn: {e}"))?;
    loop {
        if child.try_wait().map_err(|e| e.to_string())?.is_some() {
            break;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().map_err(|e| e.to_string())?;
            return Err(format!(
                "did not finish within {limit:?}\nstdout: {}\nstderr: {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let el = start.elapsed();
    Ok((child.wait_with_output().map_err(|e| e.to_string())?, el))
}

fn mutirao_run(args: &[&str], scen: &str, mark: Option<&Path>) -> Command {
    let mut c = Command::new(MUTIRAO);
    c.arg("run")
        .args(args)
        .arg(me())
        .env("MUTIRAO_SCENARIO", scen);
    if let Some(m) = mark {
        c.env("MARK_DIR", m);
    }
    c
}

fn no_rank_left(mark: &Path) -> Result<(), Failed> {
    for e in std::fs::read_dir(mark)
        .map_err(|e| e.to_string())?
        .flatten()
    {
        let pid = std::fs::read_to_string(e.path()).unwrap_or_default();
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()));
        if let Ok(st) = stat {
            // A zombie awaiting its reaper is already dead.
            if !st.contains(") Z ") {
                return Err(format!("rank process {} is still running", pid.trim()).into());
            }
        }
    }
    Ok(())
}

/// Until `n` ranks of the launcher `child` have left their mark (20 s at most: then it is
/// killed and this is an error).
fn wait_ranks_up(child: &mut Child, mark: &Path, n: usize) -> Result<(), Failed> {
    let t0 = Instant::now();
    while std::fs::read_dir(mark).map(|d| d.count()).unwrap_or(0) < n {
        if t0.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            return Err("ranks never started".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

// ------------------------------------------------------------------ agent helpers

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

/// The "hang" scenario on 3 ranks with checkpoints in `dir/ckpt` and `extra` options (incarnation
/// 0's rank 1 never reaches the start-up barrier; the ranks give up on it after 2 s).
fn hang_job(dir: &Path, extra: &[&str]) -> Result<(Output, Duration), Failed> {
    let ck = dir.join("ckpt");
    let mut args = vec!["-n", "3", "--timeout", "60", "--checkpoint-interval", "1"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--checkpoint-dir", ck.to_str().ok_or("path")?]);
    let mut cmd = mutirao_run(&args, "hang", None);
    cmd.env("MUTIRAO_CONNECT_TIMEOUT_S", "2");
    run_limited(cmd, Duration::from_secs(60))
}

/// A hostfile `dir/hosts` naming `agents` (host and port), `slots` each.
fn hostfile(dir: &Path, agents: &[&Agent], slots: usize) -> Result<PathBuf, Failed> {
    let mut hosts = String::new();
    for a in agents {
        let (host, port) = a.addr.rsplit_once(':').ok_or("bad agent address")?;
        hosts.push_str(&format!("{host} slots={slots} port={port}\n"));
    }
    let hf = dir.join("hosts");
    std::fs::write(&hf, hosts).map_err(|e| e.to_string())?;
    Ok(hf)
}

/// The "spawn" scenario on 2 ranks over `agents` (2 slots each), children hinted to `hint`.
fn spawn_through_agents(
    dir: &Path,
    token: &Path,
    agents: &[&Agent],
    hint: &str,
) -> Result<Output, Failed> {
    let hf = hostfile(dir, agents, 2)?;
    let mut cmd = mutirao_run(
        &[
            "-n",
            "2",
            "--hostfile",
            hf.to_str().ok_or("path")?,
            "--token-file",
            token.to_str().ok_or("path")?,
        ],
        "spawn",
        None,
    );
    cmd.env("SPAWN_HINT", hint);
    Ok(run_limited(cmd, Duration::from_secs(60))?.0)
}

fn start_agent(token_file: &Path) -> Result<Agent, Failed> {
    // Every test agent gets its own directory socket.
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let k = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir_sock = token_file.with_extension(format!("dir{k}.sock"));
    start_agent_with(
        token_file,
        &["--dir-socket", dir_sock.to_str().ok_or("path")?],
    )
}

fn start_agent_with(token_file: &Path, extra: &[&str]) -> Result<Agent, Failed> {
    let mut child = Command::new(MUTIRAO)
        .args([
            "agent",
            "--listen",
            "127.0.0.1:0",
            "--print-addr",
            "--token-file",
        ])
        .arg(token_file)
        .args(extra)
        // The agent's default store and caches go in the test's directory, not /tmp.
        .env("TMPDIR", token_file.parent().unwrap_or(Path::new(".")))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("agent: {e}"))?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().ok_or("no stdout")?)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    let addr = line.trim().to_string();
    if addr.is_empty() {
        let _ = child.kill();
        return Err("the agent printed no address".into());
    }
    Ok(Agent { child, addr })
}

fn gen_token(dir: &Path, name: &str) -> Result<PathBuf, Failed> {
    let p = dir.join(name);
    let st = Command::new(MUTIRAO)
        .args(["agent", "--gen-token"])
        .arg(&p)
        .output()
        .map_err(|e| e.to_string())?;
    if !st.status.success() {
        return Err(format!("gen-token failed: {}", text(&st.stderr)).into());
    }
    Ok(p)
}

// ------------------------------------------------------------------ tests

fn tests() -> Vec<Trial> {
    vec![
        Trial::test("bind_to_core_pins_each_rank_to_one_core_in_blocks", || {
            let allowed = cpu_list(&cpus_allowed());
            let n = 4;
            let cpus_of = |bind: &str| -> Result<Vec<Vec<usize>>, Failed> {
                let (out, _) = run_limited(
                    mutirao_run(&["-n", "4", "--bind-to", bind], "affinity", None),
                    Duration::from_secs(30),
                )?;
                if !out.status.success() {
                    return Err(format!("exit {:?}: {}", out.status, text(&out.stderr)).into());
                }
                let so = text(&out.stdout);
                (0..n)
                    .map(|r| {
                        so.lines()
                            .find_map(|l| l.strip_prefix(&format!("rank {r} cpus ")))
                            .map(cpu_list)
                            .ok_or_else(|| format!("no line from rank {r}:\n{so}").into())
                    })
                    .collect()
            };
            let free = cpus_of("none")?;
            if free.iter().any(|c| *c != allowed) {
                return Err(
                    format!("unbound ranks changed affinity: {free:?} vs {allowed:?}").into(),
                );
            }
            let bound = cpus_of("core")?;
            // One core each, the allowed cores filled in blocks in rank order.
            let want: Vec<Vec<usize>> = (0..n)
                .map(|r| vec![allowed[r * allowed.len() / n]])
                .collect();
            if bound != want {
                return Err(format!("--bind-to core gave {bound:?}, expected {want:?}").into());
            }
            Ok(())
        }),
        Trial::test(
            "run_init_timings_prints_each_phase_max_over_the_ranks_once",
            || {
                let line = |args: &[&str]| -> Result<Vec<String>, Failed> {
                    let (out, _) =
                        run_limited(mutirao_run(args, "hello", None), Duration::from_secs(30))?;
                    if !out.status.success() {
                        return Err(format!("exit {:?}: {}", out.status, text(&out.stderr)).into());
                    }
                    Ok(text(&out.stderr)
                        .lines()
                        .filter(|l| l.contains("init of "))
                        .map(str::to_string)
                        .collect())
                };
                // Asked for: once, for every rank, each phase a number of ms.
                let got = line(&["-n", "3", "--init-timings"])?;
                let [l] = &got[..] else {
                    return Err(format!("want one init line, got {got:?}").into());
                };
                let ms = |what: &str| -> Option<f64> {
                    let rest = &l[l.find(what)? + what.len()..];
                    rest.split(" ms").next()?.trim().parse().ok()
                };
                let phases = [
                    "register ",
                    "address exchange ",
                    "connect ",
                    "all connected ",
                ];
                if !l.starts_with("mutirao run: init of 3 ranks")
                    || phases.iter().any(|p| !ms(p).is_some_and(|v| v >= 0.0))
                {
                    return Err(format!("malformed init line {l:?}").into());
                }
                // Not asked for: nothing.
                let none = line(&["-n", "3"])?;
                if !none.is_empty() {
                    return Err(format!("init printed without --init-timings: {none:?}").into());
                }
                Ok(())
            },
        ),
        Trial::test("run_local_tags_output_and_sets_env", || {
            let (out, _) = run_limited(
                mutirao_run(&["-n", "3", "--tag-output"], "hello", None),
                Duration::from_secs(30),
            )?;
            let so = text(&out.stdout);
            let se = text(&out.stderr);
            if !out.status.success() {
                return Err(format!("exit {:?}: {se}", out.status).into());
            }
            for r in 0..3 {
                if !so.contains(&format!("[{r}] hi from {r} of 3"))
                    || !se.contains(&format!("[{r}] note from {r}"))
                {
                    return Err(format!("missing output of rank {r}:\n{so}\n{se}").into());
                }
            }
            Ok(())
        }),
        Trial::test(
            "run_exit_status_is_the_failing_ranks_and_others_are_ended",
            || {
                let mark = tmpdir("fail");
                let (out, el) = run_limited(
                    mutirao_run(&["-n", "3"], "fail2", Some(&mark)),
                    Duration::from_secs(30),
                )?;
                let se = text(&out.stderr);
                if out.status.code() != Some(7) {
                    return Err(format!("exit {:?}, want 7: {se}", out.status).into());
                }
                if !se.contains("rank 2 on localhost exited with code 7") {
                    return Err(format!("no message naming rank, host and cause: {se}").into());
                }
                if el > Duration::from_secs(8) {
                    return Err(format!("took {el:?} to end the job").into());
                }
                no_rank_left(&mark)
            },
        ),
        Trial::test(
            "kill9_of_a_rank_mid_collective_ends_the_job_nonzero_within_5s",
            || {
                let mark = tmpdir("kill");
                let (out, el) = run_limited(
                    mutirao_run(&["-n", "4"], "kill", Some(&mark)),
                    Duration::from_secs(30),
                )?;
                let se = text(&out.stderr);
                if out.status.success() {
                    return Err(format!("the launcher exited 0: {se}").into());
                }
                // The first failure the launcher hears of is the killed rank or a survivor that
                // already saw the broken connection (exit 3): either way rank, host and cause.
                if !se.contains("rank 1 on localhost was killed by signal 9")
                    && !se.contains("on localhost exited with code 3")
                {
                    return Err(format!("no message naming rank, host and cause: {se}").into());
                }
                if el > Duration::from_secs(5) {
                    return Err(format!("took {el:?}").into());
                }
                no_rank_left(&mark)
            },
        ),
        Trial::test("run_timeout_ends_everything_with_124", || {
            let mark = tmpdir("timeout");
            let (out, el) = run_limited(
                mutirao_run(&["-n", "2", "--timeout", "1"], "sleep", Some(&mark)),
                Duration::from_secs(30),
            )?;
            if out.status.code() != Some(124) || el > Duration::from_secs(6) {
                return Err(
                    format!("exit {:?} after {el:?}: {}", out.status, text(&out.stderr)).into(),
                );
            }
            no_rank_left(&mark)
        }),
        Trial::test("ctrl_c_ends_all_ranks", || {
            let mark = tmpdir("sigint");
            let mut cmd = mutirao_run(&["-n", "2"], "sleep", Some(&mark));
            let mut child = cmd
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| e.to_string())?;
            // Wait until both ranks are up.
            wait_ranks_up(&mut child, &mark, 2)?;
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
            let t1 = Instant::now();
            loop {
                if let Some(st) = child.try_wait().map_err(|e| e.to_string())? {
                    if st.code() != Some(130) {
                        return Err(format!("exit {st:?}, want 130").into());
                    }
                    break;
                }
                if t1.elapsed() > Duration::from_secs(8) {
                    let _ = child.kill();
                    return Err("the launcher ignored Ctrl-C".into());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            no_rank_left(&mark)
        }),
        Trial::test("sigkill_of_the_launcher_leaves_no_rank_a_second_later", || {
            let mark = tmpdir("sigkill");
            let mut cmd = mutirao_run(&["-n", "3"], "sleep", Some(&mark));
            let mut child = cmd
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| e.to_string())?;
            wait_ranks_up(&mut child, &mark, 3)?;
            // SIGKILL: the launcher cannot clean up; its ranks must go with it all the same.
            child.kill().map_err(|e| e.to_string())?;
            let _ = child.wait();
            std::thread::sleep(Duration::from_secs(1));
            no_rank_left(&mark)
        }),
        Trial::test("run_reports_a_missing_program_clearly", || {
            let out = Command::new(MUTIRAO)
                .args(["run", "-n", "2", "/nonexistent/prog"])
                .output()
                .map_err(|e| e.to_string())?;
            let se = text(&out.stderr);
            if out.status.success() || !se.contains("cannot start \"/nonexistent/prog\"") {
                return Err(format!("exit {:?}: {se}", out.status).into());
            }
            Ok(())
        }),
        Trial::test("hostfile_errors_name_the_line", || {
            let d = tmpdir("hostfile");
            let hf = d.join("hosts");
            std::fs::write(&hf, "127.0.0.1 slots=2\nbad slots=x\n").map_err(|e| e.to_string())?;
            let out = Command::new(MUTIRAO)
                .args(["run", "-n", "2", "--hostfile"])
                .arg(&hf)
                .arg("true")
                .output()
                .map_err(|e| e.to_string())?;
            let se = text(&out.stderr);
            if out.status.code() != Some(2) || !se.contains("line 2") {
                return Err(format!("exit {:?}: {se}", out.status).into());
            }
            Ok(())
        }),
        Trial::test("agent_runs_ranks_for_an_authenticated_launcher", || {
            let d = tmpdir("agent-ok");
            let tok = gen_token(&d, "agent.token")?;
            let agent = start_agent(&tok)?;
            let (host, port) = agent.addr.rsplit_once(':').ok_or("bad agent address")?;
            let hf = d.join("hosts");
            std::fs::write(&hf, format!("{host} slots=3 port={port}\n"))
                .map_err(|e| e.to_string())?;
            let mut cmd = mutirao_run(
                &[
                    "-n",
                    "3",
                    "--tag-output",
                    "--hostfile",
                    hf.to_str().ok_or("path")?,
                    "--token-file",
                    tok.to_str().ok_or("path")?,
                ],
                "hello",
                None,
            );
            cmd.env_remove("MUTIRAO_AGENT_TOKEN_FILE");
            let (out, _) = run_limited(cmd, Duration::from_secs(30))?;
            let so = text(&out.stdout);
            if !out.status.success()
                || (0..3).any(|r| !so.contains(&format!("[{r}] hi from {r} of 3")))
            {
                return Err(format!("exit {:?}\n{so}\n{}", out.status, text(&out.stderr)).into());
            }
            Ok(())
        }),
        Trial::test("two_agents_ending_their_sessions_is_a_clean_exit", || {
            // Each agent closes its session once its ranks end; that must not count as a failure
            // while the other host's ranks are still finishing.
            let d = tmpdir("agent-two");
            let tok = gen_token(&d, "agent.token")?;
            let a1 = start_agent(&tok)?;
            let a2 = start_agent(&tok)?;
            let mut hosts = String::new();
            for a in [&a1, &a2] {
                let (host, port) = a.addr.rsplit_once(':').ok_or("bad agent address")?;
                hosts.push_str(&format!("{host} slots=2 port={port}\n"));
            }
            let hf = d.join("hosts");
            std::fs::write(&hf, hosts).map_err(|e| e.to_string())?;
            for _ in 0..3 {
                let (out, _) = run_limited(
                    mutirao_run(
                        &[
                            "-n",
                            "4",
                            "--hostfile",
                            hf.to_str().ok_or("path")?,
                            "--token-file",
                            tok.to_str().ok_or("path")?,
                        ],
                        "hello",
                        None,
                    ),
                    Duration::from_secs(30),
                )?;
                if !out.status.success() {
                    return Err(format!("exit {:?}: {}", out.status, text(&out.stderr)).into());
                }
            }
            Ok(())
        }),
        Trial::test(
            "spawn_through_mutirao_run_joins_two_children_to_the_parent",
            || {
                let (out, _) = run_limited(
                    mutirao_run(&["-n", "3"], "spawn", None),
                    Duration::from_secs(60),
                )?;
                let so = text(&out.stdout);
                if !out.status.success() || !so.contains("spawned 2 children: group ranks [1, 2]") {
                    return Err(
                        format!("exit {:?}\n{so}\n{}", out.status, text(&out.stderr)).into(),
                    );
                }
                Ok(())
            },
        ),
        Trial::test(
            "spawn_to_an_unknown_host_is_refused_and_the_job_goes_on",
            || {
                let mut cmd = mutirao_run(&["-n", "2"], "spawn", None);
                cmd.env("SPAWN_HINT", "nowhere.invalid");
                let (out, _) = run_limited(cmd, Duration::from_secs(60))?;
                let so = text(&out.stdout);
                if !out.status.success()
                    || !so.contains("spawn refused:")
                    || !so.contains("unknown host")
                {
                    return Err(
                        format!("exit {:?}\n{so}\n{}", out.status, text(&out.stderr)).into(),
                    );
                }
                Ok(())
            },
        ),
        Trial::test(
            "spawn_to_a_host_whose_agent_refuses_the_launcher_is_refused_and_the_job_goes_on",
            || {
                // The second agent holds another token: it refuses the launcher's requests.
                let d = tmpdir("agent-refuses");
                let _rm = RemoveOnDrop(d.clone());
                let tok = gen_token(&d, "agent.token")?;
                let other = gen_token(&d, "other.token")?;
                let a1 = start_agent(&tok)?;
                let a2 = start_agent(&other)?;
                let out = spawn_through_agents(&d, &tok, &[&a1, &a2], &a2.addr)?;
                let (so, se) = (text(&out.stdout), text(&out.stderr));
                if !out.status.success()
                    || !so.contains("spawn refused:")
                    || !so.contains(&a2.addr)
                {
                    return Err(format!("exit {:?}\n{so}\n{se}", out.status).into());
                }
                Ok(())
            },
        ),
        Trial::test(
            "spawn_through_agents_starts_children_on_the_hinted_agent",
            || {
                let d = tmpdir("agent-spawn");
                let tok = gen_token(&d, "agent.token")?;
                let a1 = start_agent(&tok)?;
                let a2 = start_agent(&tok)?;
                // Both children on the second agent (named host:port: both agents are 127.0.0.1).
                let out = spawn_through_agents(&d, &tok, &[&a1, &a2], &a2.addr)?;
                let so = text(&out.stdout);
                if !out.status.success() || !so.contains("spawned 2 children: group ranks [1, 2]") {
                    return Err(
                        format!("exit {:?}\n{so}\n{}", out.status, text(&out.stderr)).into(),
                    );
                }
                Ok(())
            },
        ),
        Trial::test(
            "a_rank_that_never_reaches_the_start_up_barrier_times_out_and_the_job_recovers",
            || {
                let d = tmpdir("hang");
                let _rm = RemoveOnDrop(d.clone());
                let (out, el) = hang_job(&d, &[])?;
                let (so, se) = (text(&out.stdout), text(&out.stderr));
                if !out.status.success()
                    || !se.contains("restart 1 of 3: every rank from the beginning")
                    || (0..3).any(|r| !so.contains(&format!("rank {r} of 3 done")))
                    // The launcher's barrier gives up first (80 % of the ranks' 2 s) and says
                    // which rank never came.
                    || !se.contains("waiting for ranks [1] to reach the fence")
                    || el > Duration::from_secs(30)
                {
                    return Err(format!("exit {:?} after {el:?}\n{so}\n{se}", out.status).into());
                }
                Ok(())
            },
        ),
        Trial::test(
            "on_a_hostfile_the_host_of_a_rank_that_never_reaches_the_barrier_is_left_out_not_the_waiting_ranks_hosts",
            || {
                // Three loopback "hosts" (one agent each, one slot each): rank r on agent r.
                let d = tmpdir("hang-hosts");
                let _rm = RemoveOnDrop(d.clone());
                let tok = gen_token(&d, "agent.token")?;
                let agents = [
                    start_agent(&tok)?,
                    start_agent(&tok)?,
                    start_agent(&tok)?,
                ];
                let hf = hostfile(&d, &[&agents[0], &agents[1], &agents[2]], 1)?;
                let (out, el) = hang_job(
                    &d,
                    &[
                        "--hostfile",
                        hf.to_str().ok_or("path")?,
                        "--token-file",
                        tok.to_str().ok_or("path")?,
                        "--checkpoint-store",
                        "dir",
                    ],
                )?;
                let (so, se) = (text(&out.stdout), text(&out.stderr));
                let fail = |why: &str| -> Result<(), Failed> {
                    Err(format!("{why}; exit {:?} after {el:?}\n{so}\n{se}", out.status).into())
                };
                if !out.status.success() || (0..3).any(|r| !so.contains(&format!("rank {r} of 3 done")))
                {
                    return fail("the job did not finish on every rank");
                }
                // The launcher names the rank that never came (rank 1, on the second agent),
                // not rank 0 or 2, which gave up waiting for it.
                // Agents sharing an address are named by address and port: rank 1's own.
                if !se.contains(&format!(
                    "rank 1 on {} never reached the start-up barrier (ranks [",
                    agents[1].addr
                )) {
                    return fail("the notice does not name rank 1 as the one that never came");
                }
                // The restart leaves out rank 1's agent and uses the two others.
                let placed = se
                    .lines()
                    .find(|l| l.contains("restart 1: ranks on ["))
                    .ok_or("no placement of restart 1")?;
                if placed.contains(&agents[1].addr)
                    || !placed.contains(&agents[0].addr)
                    || !placed.contains(&agents[2].addr)
                {
                    return fail(&format!(
                        "restart 1 placed {placed:?}: want the agents {} and {}, never {}",
                        agents[0].addr, agents[2].addr, agents[1].addr
                    ));
                }
                Ok(())
            },
        ),
        Trial::test(
            "a_registration_with_an_earlier_incarnations_token_is_refused",
            || {
                let d = tmpdir("stale");
                let _rm = RemoveOnDrop(d.clone());
                let (out, _) = run_limited(
                    mutirao_run(
                        &[
                            "-n",
                            "2",
                            "--timeout",
                            "60",
                            "--checkpoint-interval",
                            "1",
                            "--checkpoint-dir",
                            d.join("ckpt").to_str().ok_or("path")?,
                        ],
                        "stale",
                        Some(&d),
                    ),
                    Duration::from_secs(60),
                )?;
                let (so, se) = (text(&out.stdout), text(&out.stderr));
                if !out.status.success()
                    || !so.contains("stale registration refused")
                    || !se.contains("restart 1 of 3")
                {
                    return Err(format!("exit {:?}\n{so}\n{se}", out.status).into());
                }
                Ok(())
            },
        ),
        Trial::test("agent_hosts_the_directory", || {
            let d = tmpdir("agent-dir");
            let tok = gen_token(&d, "agent.token")?;
            let sock = d.join("dir.sock");
            let _agent = start_agent_with(&tok, &["--dir-socket", sock.to_str().ok_or("path")?])?;
            let dir = |args: &[&str]| -> Result<String, Failed> {
                let out = Command::new(MUTIRAO)
                    .args(["dir"])
                    .args(args)
                    .args(["--socket", sock.to_str().ok_or("path")?])
                    .output()
                    .map_err(|e| e.to_string())?;
                if !out.status.success() {
                    return Err(format!("dir {args:?}: {}", text(&out.stderr)).into());
                }
                Ok(text(&out.stdout))
            };
            dir(&["register", "type=mailbox", "name=worker-1"])?;
            let found = dir(&["query", "type=mailbox", "name?"])?;
            if !found.contains("name=worker-1") {
                return Err(format!("query found {found:?}").into());
            }
            Ok(())
        }),
        Trial::test("exec_dag_runs_a_schedule_and_respects_precedence", || {
            let d = tmpdir("exec");
            let path = |n: &str| d.join(n).to_str().map(str::to_string).ok_or("path");
            let run = |args: &[&str]| -> Result<Output, Failed> {
                Command::new(MUTIRAO)
                    .args(args)
                    .output()
                    .map_err(|e| e.to_string().into())
            };
            let model = r#"{"format":"mutirao-model/1",
              "hosts":[{"name":"h1","site":"s","speed":1.0},{"name":"h2","site":"s","speed":1.0}],
              "links":[{"class":"same-host","os":[{"from":0,"base_us":0,"per_byte_us":0}],"or":[{"from":0,"base_us":0,"per_byte_us":0}],"l":[{"from":0,"base_us":0,"per_byte_us":0}]},
                       {"class":"intra-site","os":[{"from":0,"base_us":2,"per_byte_us":0.0001}],"or":[{"from":0,"base_us":2,"per_byte_us":0.0001}],"l":[{"from":0,"base_us":5,"per_byte_us":0.0002}]}],
              "capacity":{"source":"test","nics":[{"host":"h1","out_mbit":1000,"in_mbit":1000},{"host":"h2","out_mbit":1000,"in_mbit":1000}],"site_links":[]}}"#;
            std::fs::write(d.join("m.json"), model).map_err(|e| e.to_string())?;
            for args in [
                vec![
                    "dag",
                    "gen",
                    "diamond",
                    "--k",
                    "3",
                    "--work",
                    "0.002",
                    "--bytes",
                    "100000",
                    "-o",
                    &path("d.json")?,
                ],
                vec![
                    "schedule",
                    "--model",
                    &path("m.json")?,
                    "--dag",
                    &path("d.json")?,
                    "--algo",
                    "heft",
                    "-o",
                    &path("s.json")?,
                ],
            ] {
                let out = run(&args)?;
                if !out.status.success() {
                    return Err(format!("{args:?}: {}", text(&out.stderr)).into());
                }
            }
            // `mutirao exec-dag --dag d.json --schedule SCHEDULE EXTRA…`
            let exec_dag = |schedule: &str, extra: &[&str]| -> Result<Output, Failed> {
                let (d, s) = (path("d.json")?, path(schedule)?);
                let mut args = vec!["exec-dag", "--dag", &d, "--schedule", &s];
                args.extend_from_slice(extra);
                run(&args)
            };
            let out = exec_dag("s.json", &["--json"])?;
            if !out.status.success() {
                return Err(format!("exec-dag: {}", text(&out.stderr)).into());
            }
            let j = text(&out.stdout);
            let v: serde_json::Value = serde_json::from_str(&j).map_err(|e| format!("{e}: {j}"))?;
            let tasks = v["tasks"].as_array().ok_or("no tasks")?;
            let times: std::collections::HashMap<String, (f64, f64)> = tasks
                .iter()
                .map(|t| {
                    (
                        t["id"].as_str().unwrap_or("").to_string(),
                        (
                            t["start_s"].as_f64().unwrap_or(-1.0),
                            t["finish_s"].as_f64().unwrap_or(-1.0),
                        ),
                    )
                })
                .collect();
            if times.len() != 9 || times.values().any(|(a, b)| *a < 0.0 || b < a) {
                return Err(format!("bad trace: {j}").into());
            }
            let dag: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(d.join("d.json")).map_err(|e| e.to_string())?,
            )
            .map_err(|e| e.to_string())?;
            for e in dag["edges"].as_array().ok_or("no edges")? {
                let (from, to) = (
                    e["from"].as_str().unwrap_or(""),
                    e["to"].as_str().unwrap_or(""),
                );
                if times[to].0 < times[from].1 {
                    return Err(format!(
                        "{to} started before its predecessor {from} finished: {j}"
                    )
                    .into());
                }
            }
            // Every message between tasks on different hosts is in the trace, received after
            // it was sent, and the reference rate measured at start is reported.
            let host: std::collections::HashMap<&str, &str> = tasks
                .iter()
                .map(|t| {
                    (
                        t["id"].as_str().unwrap_or(""),
                        t["host"].as_str().unwrap_or(""),
                    )
                })
                .collect();
            let remote = dag["edges"]
                .as_array()
                .ok_or("no edges")?
                .iter()
                .filter(|e| {
                    host[e["from"].as_str().unwrap_or("")] != host[e["to"].as_str().unwrap_or("")]
                })
                .count();
            let msgs = v["messages"].as_array().ok_or("no messages")?;
            if remote == 0 || msgs.len() != remote {
                return Err(format!(
                    "{remote} messages between hosts, trace has {}: {j}",
                    msgs.len()
                )
                .into());
            }
            for m in msgs {
                let f = |k: &str| m[k].as_f64().unwrap_or(f64::NAN);
                if !(f("recv_end_s") >= f("send_start_s") && f("recv_end_s") >= f("recv_start_s")) {
                    return Err(format!("message received before it was sent: {m}").into());
                }
                if m["bytes"].as_u64() != Some(100000) {
                    return Err(format!("message of the wrong size: {m}").into());
                }
            }
            if v["rate"].as_f64().is_none_or(|r| r <= 0.0) {
                return Err(format!("no reference rate: {j}").into());
            }
            if v["rate_from"] != "fastest host" {
                return Err(format!("without a model the fastest host sets the rate: {j}").into());
            }
            // With the model, the reference rate is the median of each host's measured rate
            // over its model speed (two hosts at speed 1.0: the mean of their two rates).
            let out = exec_dag("s.json", &["--model", &path("m.json")?, "--json"])?;
            if !out.status.success() {
                return Err(format!("exec-dag --model: {}", text(&out.stderr)).into());
            }
            let w: serde_json::Value =
                serde_json::from_str(&text(&out.stdout)).map_err(|e| e.to_string())?;
            let hr = w["host_rates"].as_array().ok_or("no host_rates")?;
            let rates: Vec<f64> = hr.iter().filter_map(|h| h["rate"].as_f64()).collect();
            let rate = w["rate"].as_f64().unwrap_or(f64::NAN);
            if w["rate_from"] != "model speeds"
                || rates.len() != 2
                || hr.iter().any(|h| h["model_speed"].as_f64() != Some(1.0))
                || (rate - (rates[0] + rates[1]) / 2.0).abs() > 1e-6 * rate
            {
                return Err(format!("rate from the model's speeds: {w}").into());
            }
            // A model without one of the schedule's hosts is refused before anything runs.
            let partial = model.replace(r#""h2""#, r#""h9""#);
            std::fs::write(d.join("m1.json"), partial).map_err(|e| e.to_string())?;
            let out = exec_dag("s.json", &["--model", &path("m1.json")?])?;
            if out.status.success() || !text(&out.stderr).contains("is not in the model") {
                return Err(format!(
                    "a model missing a host: {:?} {}",
                    out.status,
                    text(&out.stderr)
                )
                .into());
            }
            let makespan = v["makespan_s"].as_f64().ok_or("no makespan")?;
            if makespan < 0.002 * 5.0 {
                return Err(format!(
                    "makespan {makespan} is shorter than the critical path's work"
                )
                .into());
            }
            // A schedule that misses a task is refused before anything runs.
            let sched = std::fs::read_to_string(d.join("s.json")).map_err(|e| e.to_string())?;
            let mut sv: serde_json::Value =
                serde_json::from_str(&sched).map_err(|e| e.to_string())?;
            sv["tasks"].as_array_mut().ok_or("tasks")?.pop();
            std::fs::write(d.join("bad.json"), sv.to_string()).map_err(|e| e.to_string())?;
            let out = exec_dag("bad.json", &[])?;
            if out.status.success() || !text(&out.stderr).contains("is not placed") {
                return Err(format!(
                    "incomplete schedule: {:?} {}",
                    out.status,
                    text(&out.stderr)
                )
                .into());
            }
            Ok(())
        }),
        Trial::test("agent_refuses_a_wrong_token_and_runs_nothing", || {
            let d = tmpdir("agent-bad");
            let tok = gen_token(&d, "agent.token")?;
            let wrong = gen_token(&d, "wrong.token")?;
            let agent = start_agent(&tok)?;
            let (host, port) = agent.addr.rsplit_once(':').ok_or("bad agent address")?;
            let hf = d.join("hosts");
            std::fs::write(&hf, format!("{host} slots=2 port={port}\n"))
                .map_err(|e| e.to_string())?;
            let mark = d.join("marks");
            std::fs::create_dir_all(&mark).map_err(|e| e.to_string())?;
            let cmd = mutirao_run(
                &[
                    "-n",
                    "2",
                    "--hostfile",
                    hf.to_str().ok_or("path")?,
                    "--token-file",
                    wrong.to_str().ok_or("path")?,
                ],
                "hello",
                Some(&mark),
            );
            let (out, _) = run_limited(cmd, Duration::from_secs(30))?;
            let se = text(&out.stderr);
            if out.status.success() || !(se.contains("refused") || se.contains("authentication")) {
                return Err(format!("exit {:?}: {se}", out.status).into());
            }
            if std::fs::read_dir(&mark).map(|d| d.count()).unwrap_or(0) != 0 {
                return Err("a rank ran for an unauthenticated launcher".into());
            }
            Ok(())
        }),
        Trial::test(
            "agent_answers_malformed_requests_with_an_error_and_keeps_serving",
            || {
                let d = tmpdir("agent-garbage");
                let tok = gen_token(&d, "agent.token")?;
                let agent = start_agent(&tok)?;
                for garbage in ["GET / HTTP/1.1\r\n\r\n", "{\"op\":\"launch\",\"program\":\"/bin/true\",\"args\":[],\"cwd\":null,\"ranks\":[]}\n", "\u{0}\u{1}\u{2}\n"] {
                let mut s = std::net::TcpStream::connect(&agent.addr).map_err(|e| e.to_string())?;
                s.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
                let mut r = BufReader::new(s.try_clone().map_err(|e| e.to_string())?);
                let mut challenge = String::new();
                r.read_line(&mut challenge).map_err(|e| e.to_string())?;
                if !challenge.contains("challenge") {
                    return Err(format!("no challenge: {challenge}").into());
                }
                s.write_all(garbage.as_bytes()).map_err(|e| e.to_string())?;
                let mut answer = String::new();
                r.read_line(&mut answer).map_err(|e| e.to_string())?;
                if !answer.contains("\"error\"") {
                    return Err(format!("garbage {garbage:?} got {answer:?}").into());
                }
            }
                // Still serving: a real launcher works.
                let (host, port) = agent.addr.rsplit_once(':').ok_or("bad agent address")?;
                let hf = d.join("hosts");
                std::fs::write(&hf, format!("{host}:2 port={port}\n"))
                    .map_err(|e| e.to_string())?;
                let (out, _) = run_limited(
                    mutirao_run(
                        &[
                            "-n",
                            "2",
                            "--hostfile",
                            hf.to_str().ok_or("path")?,
                            "--token-file",
                            tok.to_str().ok_or("path")?,
                        ],
                        "hello",
                        None,
                    ),
                    Duration::from_secs(30),
                )?;
                if !out.status.success() {
                    return Err(format!("agent stopped serving: {}", text(&out.stderr)).into());
                }
                Ok(())
            },
        ),
    ]
}

fn main() {
    // Started as a rank without a scenario: never run the suite recursively.
    if std::env::var_os("MUTIRAO_RANK").is_some() && std::env::var_os("MUTIRAO_SCENARIO").is_none()
    {
        eprintln!("started as a rank without MUTIRAO_SCENARIO: refusing to run the test suite");
        std::process::exit(1);
    }
    if let Ok(s) = std::env::var("MUTIRAO_SCENARIO") {
        scenario(&s);
    }
    let args = Arguments::from_args();
    let conclusion = libtest_mimic::run(&args, tests());
    remove_scratch_dirs();
    conclusion.exit();
}

/// Remove every scratch directory this test process made (`mutirao-cli-test-PID-…` in the temporary
/// directory), also those of failed trials, once all trials have run.
fn remove_scratch_dirs() {
    let mine = format!("mutirao-cli-test-{}-", std::process::id());
    if let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with(&mine) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}
