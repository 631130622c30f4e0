//! Start N copies of a program as the ranks of one job on this host, with an in-process
//! bootstrap server instead of `mutirao run`: for multi-process tests and for harnesses that
//! embed mutirão. Output is read while the ranks run (a chatty rank never blocks on a full
//! pipe); a job that outlives its limit is killed and reported as an error.
//!
//! Ranks may spawn more ranks ([`crate::Comm::spawn`]): the job's bootstrap server has a
//! spawner that starts them here with the job's environment (not the per-rank one), supervises
//! them with the others, and reports them in [`Outcome::spawned`]; a failed spawn group's
//! children are killed. [`LocalJob::without_spawn`] leaves the spawner out.
//!
//! ```no_run
//! use mutirao::local_job::LocalJob;
//! use std::time::Duration;
//! let out = LocalJob::new("target/debug/examples/ring", 4)
//!     .env("MUTIRAO_TRANSPORT", "tcp")
//!     .limit(Duration::from_secs(30))
//!     .run()?;
//! assert!(out.codes.iter().all(|c| *c == Some(0)), "{}", out.stderr.join("\n"));
//! # Ok::<(), String>(())
//! ```

use crate::pmi::{
    hex, new_token, CheckpointSink, FailureReport, PmiServer, SpawnRequest, SpawnedProc, Spawner,
};
use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Per-rank extra environment.
type RankEnv = Box<dyn Fn(usize) -> Vec<(String, String)>>;

/// A job to start on this host.
pub struct LocalJob {
    exe: PathBuf,
    args: Vec<String>,
    n: usize,
    env: Vec<(String, String)>,
    unset: Vec<String>,
    per_rank: Option<RankEnv>,
    sink: Option<Arc<dyn CheckpointSink>>,
    limit: Duration,
    spawn: bool,
    stopped_lost: bool,
}

/// How a spawned rank ended.
#[derive(Debug, Clone)]
pub struct SpawnedOutcome {
    /// Its spawn group.
    pub group: u64,
    /// Its world rank.
    pub rank: u32,
    /// Its exit code (`None`: ended by a signal, e.g. killed after its group failed).
    pub code: Option<i32>,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

/// How the ranks ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Each rank's exit code (`None`: ended by a signal).
    pub codes: Vec<Option<i32>>,
    /// Each rank's standard output.
    pub stdout: Vec<String>,
    /// Each rank's standard error.
    pub stderr: Vec<String>,
    /// From the first start to the last exit.
    pub elapsed: Duration,
    /// Broken channels the ranks reported to the bootstrap server (with checkpoints on).
    pub failures: Vec<FailureReport>,
    /// Ranks started by spawns, in the order started.
    pub spawned: Vec<SpawnedOutcome>,
    /// Per rank, the start-up phases it reported to the bootstrap server
    /// ([`PmiServer::init_phases`]; `None`: it did not reach the connection barrier).
    pub init: Vec<Option<crate::pmi::InitPhases>>,
}

type Drain = JoinHandle<String>;

fn drain(p: Option<Box<dyn Read + Send>>) -> Drain {
    std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut p) = p {
            let _ = p.read_to_string(&mut s);
        }
        s
    })
}

/// Read a child's output while it runs.
fn drains(child: &mut Child) -> (Drain, Drain) {
    let o = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let e = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    (o, e)
}

struct Kid {
    group: u64,
    rank: u32,
    child: Child,
    code: Option<Option<i32>>,
    out: Option<(Drain, Drain)>,
}

/// Starts spawned ranks on this host for a [`LocalJob`].
struct LocalSpawner {
    env: Vec<(String, String)>,
    unset: Vec<String>,
    n: usize,
    kids: Mutex<Vec<Kid>>,
}

impl Spawner for LocalSpawner {
    fn spawn(&self, req: &SpawnRequest) -> Result<Vec<SpawnedProc>, String> {
        let mut kids = self
            .kids
            .lock()
            .map_err(|_| "the spawned-process list is poisoned".to_string())?;
        let local = self.n + kids.len() + req.ranks.len();
        let mut started: Vec<Kid> = Vec::with_capacity(req.ranks.len());
        for (rank, env) in req.ranks.iter().zip(&req.env) {
            let mut c = Command::new(&req.program);
            for k in &self.unset {
                c.env_remove(k);
            }
            c.args(&req.args)
                .envs(self.env.iter().map(|(k, v)| (k, v)))
                .envs(env.iter().map(|(k, v)| (k, v)))
                .env("MUTIRAO_LOCAL_RANKS", local.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            match c.spawn() {
                Ok(mut child) => {
                    let out = Some(drains(&mut child));
                    started.push(Kid {
                        group: req.group,
                        rank: *rank,
                        child,
                        code: None,
                        out,
                    });
                }
                Err(e) => {
                    for k in started.iter_mut() {
                        let _ = k.child.kill();
                        let _ = k.child.wait();
                    }
                    return Err(format!("cannot start {}: {e}", req.program.display()));
                }
            }
        }
        let procs = started
            .iter()
            .map(|k| SpawnedProc {
                rank: k.rank,
                host: "localhost".into(),
            })
            .collect();
        kids.extend(started);
        Ok(procs)
    }

    fn abort(&self, group: u64, _why: &str) {
        if let Ok(mut kids) = self.kids.lock() {
            for k in kids
                .iter_mut()
                .filter(|k| k.group == group && k.code.is_none())
            {
                let _ = k.child.kill();
            }
        }
    }
}

impl LocalSpawner {
    /// Reap whatever has ended (telling `pmi`, so a spawn still in progress fails at once);
    /// true when every spawned rank has ended.
    fn reap(&self, pmi: &PmiServer) -> bool {
        let mut ended = Vec::new();
        let all = {
            let Ok(mut kids) = self.kids.lock() else {
                return true;
            };
            for k in kids.iter_mut().filter(|k| k.code.is_none()) {
                if let Ok(Some(st)) = k.child.try_wait() {
                    k.code = Some(st.code());
                    ended.push((k.rank, st));
                }
            }
            kids.iter().all(|k| k.code.is_some())
        };
        // Outside the lock: the server may call back into `abort`.
        for (rank, st) in ended {
            pmi.spawned_exited(rank, &format!("its process ended ({st})"));
        }
        all
    }

    fn kill_all(&self) {
        if let Ok(mut kids) = self.kids.lock() {
            for k in kids.iter_mut().filter(|k| k.code.is_none()) {
                let _ = k.child.kill();
                let _ = k.child.wait();
            }
        }
    }

    fn outcomes(&self) -> Vec<SpawnedOutcome> {
        let Ok(mut kids) = self.kids.lock() else {
            return Vec::new();
        };
        kids.iter_mut()
            .map(|k| {
                let (stdout, stderr) = match k.out.take() {
                    Some((o, e)) => (o.join().unwrap_or_default(), e.join().unwrap_or_default()),
                    None => Default::default(),
                };
                SpawnedOutcome {
                    group: k.group,
                    rank: k.rank,
                    code: k.code.flatten(),
                    stdout,
                    stderr,
                }
            })
            .collect()
    }
}

impl LocalJob {
    /// `n` copies of `exe`, no arguments, a 60 s limit.
    pub fn new(exe: impl Into<PathBuf>, n: usize) -> LocalJob {
        LocalJob {
            exe: exe.into(),
            args: Vec::new(),
            n,
            env: Vec::new(),
            unset: Vec::new(),
            per_rank: None,
            sink: None,
            limit: Duration::from_secs(60),
            spawn: true,
            stopped_lost: false,
        }
    }

    /// A rank whose process is stopped (SIGSTOP: alive, its sockets open, silent — what a host
    /// cut off from the network looks like) is declared lost to the others, as a launcher does
    /// for a silent host under `--continue-on-failure` ([`PmiServer::peers_lost`]); once every
    /// other rank has ended it is killed, and its code is `None`.
    pub fn stopped_ranks_are_lost(mut self) -> Self {
        self.stopped_lost = true;
        self
    }

    /// Arguments for every rank.
    pub fn args<S: Into<String>>(mut self, a: impl IntoIterator<Item = S>) -> Self {
        self.args.extend(a.into_iter().map(Into::into));
        self
    }

    /// An environment variable for every rank.
    pub fn env(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }

    /// Remove a variable this process has from the ranks' environment.
    pub fn env_remove(mut self, k: impl Into<String>) -> Self {
        self.unset.push(k.into());
        self
    }

    /// Extra environment per rank.
    pub fn per_rank_env(mut self, f: impl Fn(usize) -> Vec<(String, String)> + 'static) -> Self {
        self.per_rank = Some(Box::new(f));
        self
    }

    /// Keep checkpoints in `sink` (the bootstrap server serves the ranks' checkpoint calls).
    pub fn checkpoints(mut self, sink: Arc<dyn CheckpointSink>) -> Self {
        self.sink = Some(sink);
        self
    }

    /// Give the bootstrap server no spawner: a rank's spawn fails with "cannot spawn".
    pub fn without_spawn(mut self) -> Self {
        self.spawn = false;
        self
    }

    /// Kill the job if it runs longer.
    pub fn limit(mut self, d: Duration) -> Self {
        self.limit = d;
        self
    }

    /// Start the ranks and wait for all of them.
    pub fn run(&self) -> Result<Outcome, String> {
        let token = new_token().map_err(|e| format!("cannot make a job token: {e}"))?;
        let bind = "127.0.0.1:0".parse().expect("literal address");
        let n32 = u32::try_from(self.n).map_err(|_| format!("{} ranks is too many", self.n))?;
        let job = format!("lj{}{}", std::process::id(), &hex(&token)[..8]);
        let spawner = Arc::new(LocalSpawner {
            env: self.env.clone(),
            unset: self.unset.clone(),
            n: self.n,
            kids: Mutex::new(Vec::new()),
        });
        let mut b = PmiServer::builder(bind, n32, token, Duration::from_secs(30));
        if let Some(s) = &self.sink {
            b = b.checkpoints(s.clone());
        }
        if self.spawn {
            b = b.spawner(spawner.clone());
        }
        let pmi = b
            .start()
            .map_err(|e| format!("cannot start the bootstrap server: {e}"))?;
        let start = Instant::now();
        let mut kids = Vec::with_capacity(self.n);
        let mut readers = Vec::with_capacity(self.n);
        for r in 0..self.n {
            let mut c = Command::new(&self.exe);
            for k in &self.unset {
                c.env_remove(k);
            }
            c.args(&self.args)
                .env("MUTIRAO_RANK", r.to_string())
                .env("MUTIRAO_SIZE", self.n.to_string())
                .env("MUTIRAO_PMI_ADDR", pmi.addr().to_string())
                .env("MUTIRAO_JOB_TOKEN", hex(&token))
                .env("MUTIRAO_JOB_ID", &job)
                .env("MUTIRAO_LOCAL_RANKS", self.n.to_string())
                .envs(self.env.iter().map(|(k, v)| (k, v)))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            if let Some(f) = &self.per_rank {
                c.envs(f(r));
            }
            let mut child = match c.spawn() {
                Ok(c) => c,
                Err(e) => {
                    for k in kids.iter_mut() {
                        let _ = std::process::Child::kill(k);
                        let _ = std::process::Child::wait(k);
                    }
                    return Err(format!("cannot start {}: {e}", self.exe.display()));
                }
            };
            readers.push(drains(&mut child));
            kids.push(child);
        }
        let mut codes = vec![None; self.n];
        let mut done = vec![false; self.n];
        let mut lost = vec![false; self.n];
        // Spawned ranks are started by the parent's spawn call, which returns only after the
        // spawner did: once every original rank has ended no new ones can appear.
        while done.iter().any(|d| !d) | !spawner.reap(&pmi) {
            for (i, k) in kids.iter_mut().enumerate() {
                if !done[i] {
                    if let Ok(Some(st)) = k.try_wait() {
                        codes[i] = st.code();
                        done[i] = true;
                    } else if self.stopped_lost && !lost[i] && stopped(k.id()) {
                        lost[i] = true;
                        pmi.peers_lost(&[i as u32]);
                    }
                }
            }
            if (0..self.n).all(|i| done[i] || lost[i]) && lost.iter().any(|l| *l) {
                for (i, k) in kids.iter_mut().enumerate() {
                    if !done[i] {
                        let _ = k.kill();
                        let _ = k.wait();
                        done[i] = true;
                    }
                }
            }
            if start.elapsed() > self.limit {
                for k in kids.iter_mut() {
                    let _ = k.kill();
                    let _ = k.wait();
                }
                spawner.kill_all();
                return Err(format!(
                    "{} on {} ranks did not finish within {:?}",
                    self.exe.display(),
                    self.n,
                    self.limit
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let elapsed = start.elapsed();
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        for (o, e) in readers {
            stdout.push(o.join().unwrap_or_default());
            stderr.push(e.join().unwrap_or_default());
        }
        Ok(Outcome {
            codes,
            stdout,
            stderr,
            elapsed,
            failures: pmi.take_failures(),
            spawned: spawner.outcomes(),
            init: pmi.init_phases(),
        })
    }
}

/// Whether process `pid` is stopped (state `T` in `/proc/PID/stat`).
fn stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|st| {
            // The state follows the command name, which is in parentheses and may hold spaces.
            let after = &st[st.rfind(')')? + 1..];
            after.split_whitespace().next().map(|s| s == "T")
        })
        .unwrap_or(false)
}
