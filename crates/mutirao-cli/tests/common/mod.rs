//! Helpers shared by the recovery tests (`recover`, `recover_testbed`, `recover_s3`) and the
//! grid's (`grid`, `grid_dag`, `grid_owner`: a client command, its output checked): the
//! jacobi example's path and failure-free checksum, agent tokens, finding a rank's process, the
//! checkpoint blobs under a directory, a launcher run with a time bound, a testbed with an
//! agent on every host ([`up_with_agents`]) and moto's S3 server ([`moto`]). Each test binary
//! uses some of them.
#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// moto's S3 server, shared with `mutirao-ckpt`'s S3 tests.
#[path = "../../../mutirao-ckpt/tests/support/moto.rs"]
pub mod moto;

/// The `mutirao` binary under test.
pub const MUTIRAO: &str = env!("CARGO_BIN_EXE_mutirao");

/// `mutirao ARGS` as a grid client of the coordinator at `url` with `token`.
pub fn grid_client(url: &str, token: &str, args: &[&str]) -> Output {
    Command::new(MUTIRAO)
        .args(args)
        .env("MUTIRAO_COORD", url)
        .env("MUTIRAO_COORD_TOKEN", token)
        .output()
        .unwrap()
}

/// The standard output of a command that must have succeeded (else both outputs in the panic).
pub fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "failed: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The standard error of a command that must have failed.
pub fn err(o: &Output) -> String {
    assert!(
        !o.status.success(),
        "succeeded: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The runtime's jacobi example, built by `cargo test`/`nextest` for the workspace.
pub fn jacobi() -> Option<PathBuf> {
    let p = Path::new(MUTIRAO).parent()?.join("examples").join("jacobi");
    p.is_file().then_some(p)
}

/// mutirao-mw's `mw` example (master/worker matmul, primes, Mandelbrot), when built.
pub fn mw() -> Option<PathBuf> {
    let p = Path::new(MUTIRAO).parent()?.join("examples").join("mw");
    p.is_file().then_some(p)
}

/// The `checksum=…` word of jacobi's output.
pub fn checksum(out: &str) -> Option<String> {
    out.split_whitespace()
        .find(|w| w.starts_with("checksum="))
        .map(str::to_string)
}

/// The checksum jacobi (`j`) prints after a failure-free local run of `n` ranks with `args`.
/// Remembered per build of jacobi (its size and modification time) in the tests' target
/// temporary directory, so the tests of one run that share arguments run it once.
pub fn plain_checksum(j: &Path, n: usize, args: &[&str]) -> String {
    use std::io::Write;
    let meta = std::fs::metadata(j).unwrap();
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let key = format!(
        "{} {} {mtime} {n} {}",
        j.display(),
        meta.len(),
        args.join(" ")
    );
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("jacobi-plain-checksums");
    let known = std::fs::read_to_string(&cache).unwrap_or_default();
    if let Some(c) = known
        .lines()
        .find_map(|l| l.split_once('\t').filter(|(k, _)| *k == key))
    {
        return c.1.to_string();
    }
    let plain = Command::new(MUTIRAO)
        .args(["run", "-n", &n.to_string(), "--timeout", "120"])
        .arg(j)
        .arg("--")
        .args(args)
        .output()
        .unwrap();
    assert!(
        plain.status.success(),
        "the failure-free run failed: {}",
        String::from_utf8_lossy(&plain.stderr)
    );
    let c = checksum(&String::from_utf8_lossy(&plain.stdout)).expect("a checksum");
    // One short append (atomic with O_APPEND): concurrent tests at worst both compute it.
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&cache)
    {
        let _ = f.write_all(format!("{key}\t{c}\n").as_bytes());
    }
    c
}

/// A new agent token, `d/agent.token`.
pub fn gen_token(d: &Path) -> PathBuf {
    let token = d.join("agent.token");
    let out = Command::new(MUTIRAO)
        .args(["agent", "--gen-token"])
        .arg(&token)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mutirao agent --gen-token: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    token
}

/// `MUTIRAO_RANK`, `MUTIRAO_INCARNATION` of a process, from its environment (`None`: not a rank
/// or already gone).
fn rank_of(pid: i32) -> Option<(usize, u32)> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let var = |name: &str| -> Option<String> {
        env.split(|b| *b == 0).find_map(|kv| {
            let kv = std::str::from_utf8(kv).ok()?;
            kv.strip_prefix(name)?.strip_prefix('=').map(str::to_string)
        })
    };
    let rank = var("MUTIRAO_RANK")?.parse().ok()?;
    let inc = var("MUTIRAO_INCARNATION").map_or(Some(0), |s| s.parse().ok())?;
    Some((rank, inc))
}

/// The parent pid of `pid`.
fn ppid(pid: i32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // pid (comm) state ppid …
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(1))
        .and_then(|p| p.parse::<u32>().ok())
}

/// The child of one of `parents` that is rank `rank` (of incarnation `incarnation` if given),
/// from the children's environments. A zombie (exited, not yet reaped) is not one.
pub fn rank_pid_of(parents: &[u32], rank: usize, incarnation: Option<u32>) -> Option<i32> {
    for ent in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = ent.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if !ppid(pid).is_some_and(|p| parents.contains(&p)) {
            continue;
        }
        let Some((r, inc)) = rank_of(pid) else {
            continue;
        };
        if r == rank && incarnation.is_none_or(|i| i == inc) {
            return Some(pid);
        }
    }
    None
}

/// The child of `parent` whose environment says `MUTIRAO_RANK=rank`.
pub fn rank_pid(parent: u32, rank: usize) -> Option<i32> {
    rank_pid_of(&[parent], rank, None)
}

/// SIGKILL `pid` (a rank or an agent a test found).
pub fn kill9(pid: i32) {
    // SAFETY: kill(2) with a pid this test started or read from /proc; no memory is involved.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
}

/// Relative paths of the checkpoint blobs under `dir` (`jobs/<job>/<epoch>/<rank>.ckpt`).
pub fn ckpt_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "ckpt") {
                out.push(p.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    out
}

/// The checkpoint files an agent keeps in its store `dir`, as `jobs/<job>/<epoch>/<rank>.ckpt`:
/// every one must be inside a job's scope (`scopes/<scope>/…`, one per job's checkpoint key).
pub fn agent_ckpt_files(dir: &Path) -> Vec<String> {
    ckpt_files(dir)
        .into_iter()
        .map(|f| {
            f.strip_prefix("scopes/")
                .and_then(|r| r.split_once('/'))
                .map(|(_, r)| r.to_string())
                .unwrap_or_else(|| panic!("a replica outside any job's scope: {f}"))
        })
        .collect()
}

/// The epoch `mutirao run --checkpoint-store dir` last committed in `dir` (`dir/COMMITTED`).
pub fn committed(dir: &Path) -> Option<u64> {
    std::fs::read_to_string(dir.join("COMMITTED"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// Is rank `rank`'s blob of `epoch` in the checkpoint directory `dir`? (Written atomically:
/// present means complete and durable.)
pub fn dir_blob(dir: &Path, epoch: u64, rank: usize) -> bool {
    dir.join(format!("epoch-{epoch}"))
        .join(format!("rank-{rank}.ckpt"))
        .is_file()
}

/// A wrapper script `dir/name` around jacobi (`j`): runs the shell `cases` (the body of a `case`
/// on `INCARNATION:RANK`, e.g. `1:2) sleep 2 ;;`) first, then jacobi with the same arguments
/// (`exec`: the rank keeps its pid).
pub fn jacobi_wrapper(dir: &Path, j: &Path, name: &str, cases: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(
        &p,
        format!(
            "#!/bin/bash\ncase \"${{MUTIRAO_INCARNATION:-0}}:${{MUTIRAO_RANK}}\" in\n{cases}\nesac\nexec '{}' \"$@\"\n",
            j.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// The epoch the launcher's notice `restart K of 3` names (`None`: no such restart, or one
/// from the beginning).
pub fn restart_epoch(se: &str, k: u32) -> Option<u64> {
    se.split(&format!(
        "restart {k} of 3: every rank from committed epoch "
    ))
    .nth(1)?
    .split(|c: char| !c.is_ascii_digit())
    .next()?
    .parse()
    .ok()
}

/// The epochs jacobi's ranks said they resumed from (`… resumes at iteration I (epoch E)`).
pub fn resumed(se: &str) -> Vec<u64> {
    se.lines()
        .filter(|l| l.contains("resumes at iteration"))
        .filter_map(|l| l.split("(epoch ").nth(1)?.split(')').next()?.parse().ok())
        .collect()
}

/// A scratch directory under the temporary directory, made empty; removed when dropped.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("mutirao-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }

    pub fn join(&self, p: impl AsRef<Path>) -> PathBuf {
        self.0.join(p)
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for Scratch {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running command whose output is collected in the background; killed and reaped when
/// dropped (a failing assertion leaves nothing running).
pub struct Running {
    child: Child,
    started: Instant,
    out: Option<JoinHandle<Vec<u8>>>,
    err: Option<JoinHandle<Vec<u8>>>,
}

/// How a [`Running`] command ended.
pub struct Ended {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// From [`Running::spawn`] to its exit.
    pub elapsed: Duration,
}

fn collect(mut r: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = r.read_to_end(&mut b);
        b
    })
}

impl Running {
    pub fn spawn(mut cmd: Command) -> Running {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {:?}: {e}", cmd.get_program()));
        let out = child.stdout.take().map(collect);
        let err = child.stderr.take().map(collect);
        Running {
            child,
            started: Instant::now(),
            out,
            err,
        }
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Has it exited?
    pub fn exited(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_some()
    }

    /// Wait at most `limit` for it to exit; past that it is killed and the test fails with its
    /// output so far.
    pub fn wait(mut self, limit: Duration) -> Ended {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break Some(st);
            }
            if Instant::now() > deadline {
                self.stop();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let elapsed = self.started.elapsed();
        let text = |h: Option<JoinHandle<Vec<u8>>>| {
            String::from_utf8_lossy(&h.and_then(|h| h.join().ok()).unwrap_or_default()).into_owned()
        };
        let (stdout, stderr) = (text(self.out.take()), text(self.err.take()));
        let Some(status) = status else {
            panic!("still running after {limit:?}; killed\nstdout:\n{stdout}\nstderr:\n{stderr}");
        };
        Ended {
            status,
            stdout,
            stderr,
            elapsed,
        }
    }
}

impl Running {
    /// End it if it still runs: SIGINT first (`mutirao run` then ends its ranks, which a
    /// SIGKILL of the launcher alone would leave running), SIGKILL after 5 s.
    fn stop(&mut self) {
        if self.child.try_wait().ok().flatten().is_some() {
            return;
        }
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGINT);
        }
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(5) {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Call `f` every 2 ms until it returns true (→ true), or `run` exited or 60 s passed (→ false).
pub fn poll(run: &mut Running, mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(60) {
        if f() {
            return true;
        }
        if run.exited() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    false
}

/// Why a test that builds testbeds cannot run here (not root), or `None` when it can.
pub fn root_skip_reason() -> Option<&'static str> {
    (!mutirao_testbed::sys::is_root())
        .then_some("needs root (the testbed creates network namespaces, veth links and cgroups)")
}

/// The reason printed when a testbed test cannot run here, or `None` when it can.
pub fn testbed_skip_reason() -> Option<&'static str> {
    if let Some(why) = root_skip_reason() {
        return Some(why);
    }
    if jacobi().is_none() {
        return Some("the jacobi example is not built (cargo build -p mutirao --examples)");
    }
    None
}

/// The port every testbed agent listens on (each host has its own address).
pub const AGENT_PORT: u16 = 7207;

/// A testbed with an agent on every host, a token, a hostfile and a scratch directory, and
/// jacobi's failure-free checksum for the job's arguments. Dropping it tears the testbed down
/// (killing every process in it), and removes the agents' stores and the scratch directory.
pub struct Grid {
    /// `None` once dropped.
    tb: Option<mutirao_testbed::Testbed>,
    pub jacobi: PathBuf,
    /// jacobi's arguments, and the checksum of a failure-free run with them.
    pub args: Vec<String>,
    pub want: String,
    pub ranks: usize,
    pub token: PathBuf,
    pub hostfile: PathBuf,
    /// The agents' default checkpoint stores, one per host in spec order.
    pub stores: Vec<PathBuf>,
    /// The agents' pids, in spec order (each rank is a child of its host's agent).
    pub agents: Vec<u32>,
    /// Dropped last.
    pub dir: Scratch,
}

/// Bring `spec` up (needs root) with `mutirao agent` on every host, after computing jacobi's
/// failure-free checksum for `ranks` ranks and `args` locally. `None` (with the reason printed
/// as `skipped: …`) when the testbed cannot run here.
pub fn up_with_agents(tag: &str, spec: &str, ranks: usize, args: &[&str]) -> Option<Grid> {
    use mutirao_testbed::{AgentLaunch, Spec, Testbed, UpOptions};
    if let Some(why) = testbed_skip_reason() {
        println!("skipped: {why}");
        return None;
    }
    let j = jacobi().expect("checked above");
    let dir = Scratch::new(&format!("recover-tb-{tag}"));
    let token = gen_token(&dir.0);
    let want = plain_checksum(&j, ranks, args);
    let spec = Spec::parse(spec, 2).expect("valid spec");
    let tb = Testbed::up(
        &spec,
        UpOptions {
            agent: Some(AgentLaunch {
                program: MUTIRAO.into(),
                args: vec![
                    "agent".into(),
                    "--listen".into(),
                    "{addr}".into(),
                    "--no-dir".into(),
                    "--token-file".into(),
                    token.display().to_string(),
                    // Jobs as root, as on `mutirao testbed up`: the scenarios' files are the
                    // test's.
                    "--run-as".into(),
                    "root".into(),
                ],
                port: AGENT_PORT,
                log_dir: None,
                ready_timeout: Duration::from_secs(10),
            }),
            ..UpOptions::default()
        },
    )
    .expect("testbed up");
    let stores: Vec<PathBuf> = tb
        .hosts()
        .iter()
        .map(|h| std::env::temp_dir().join(format!("mutirao-agent-store-{}-{AGENT_PORT}", h.addr)))
        .collect();
    for s in &stores {
        let _ = std::fs::remove_dir_all(s);
    }
    let agents: Vec<u32> = tb.state().agents.iter().map(|a| a.pid).collect();
    assert_eq!(agents.len(), tb.hosts().len(), "one agent per host");
    let hostfile = dir.join("hosts");
    std::fs::write(&hostfile, tb.hostfile()).unwrap();
    Some(Grid {
        tb: Some(tb),
        jacobi: j,
        args: args.iter().map(|s| s.to_string()).collect(),
        want,
        ranks,
        token,
        hostfile,
        stores,
        agents,
        dir,
    })
}

impl Grid {
    pub fn hosts(&self) -> &[mutirao_testbed::HostInfo] {
        self.tb.as_ref().expect("up").hosts()
    }

    /// `mutirao run -n RANKS --timeout 120 --heartbeat 0.2` on the testbed's agents with
    /// `opts`, running `program` (jacobi, or a wrapper that ends by running it) with jacobi's
    /// arguments; `env` is added to the launcher's environment (its `MUTIRAO_*` variables
    /// reach the ranks).
    pub fn run(&self, opts: &[&str], program: &Path, env: &[(&str, &str)]) -> Running {
        let mut cmd = Command::new(MUTIRAO);
        cmd.args(["run", "-n", &self.ranks.to_string()])
            .args(["--timeout", "120", "--heartbeat", "0.2"])
            .arg("--hostfile")
            .arg(&self.hostfile)
            .arg("--token-file")
            .arg(&self.token)
            .args(opts)
            .arg(program)
            .arg("--")
            .args(&self.args)
            .envs(env.iter().copied());
        Running::spawn(cmd)
    }

    /// Rank `rank` of incarnation `incarnation` (any if `None`), on whichever host runs it.
    pub fn rank_pid(&self, rank: usize, incarnation: Option<u32>) -> Option<i32> {
        rank_pid_of(&self.agents, rank, incarnation)
    }
}

impl Drop for Grid {
    fn drop(&mut self) {
        drop(self.tb.take());
        for s in &self.stores {
            let _ = std::fs::remove_dir_all(s);
        }
    }
}
