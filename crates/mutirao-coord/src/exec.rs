//! Running placed jobs. The coordinator calls an [`Executor`] to start a job's ranks on the
//! hosts chosen and gets its events back ([`ExecEvent`]: output, a host lost, the end). The
//! [`Dispatcher`] ties it to the API: it places waiting jobs ([`crate::place`]), fetches and
//! verifies the program from the repository, journals the decision, starts the job, feeds
//! output into the job's log and the end into its state, and cancels on request.
//!
//! [`LaunchExecutor`] runs jobs in this process with the launch library `mutirao run` is made
//! of (`mutirao-launch`), through the chosen hosts' agents.

#[path = "dagrun.rs"]
pub mod dagrun;
#[path = "reconcile.rs"]
pub mod reconcile;

use reconcile::run_detail;

use crate::api::{Coordinator, JobHook};
use crate::place::{place_with, Placement, Prefs, Requirement, Slot};
use crate::{Error, Job, JobState, Result};
use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// What an execution reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    /// Output of the job's ranks (stdout and stderr, as it comes).
    Output(Vec<u8>),
    /// A host of the job stopped answering (its name).
    HostLost(String),
    /// A host's agent refused the launch (it answered with an error, e.g. its cached copy of
    /// the program no longer matched the digest): the host is alive (its name).
    Refused(String),
    /// What the launcher tells about the run (a host lost, a restart from a checkpoint), for
    /// the job's journal besides its log.
    Note(String),
    /// The first checkpoint of a wave (its epoch) reached the job's checkpoint store: the job
    /// is `checkpointing` until the wave is committed.
    Wave(u64),
    /// Every rank's checkpoint of the epoch is durable and the epoch committed.
    Committed(u64),
    /// The launcher is restarting the job within its run, from its last committed epoch (a
    /// rank or host failed): the job is `recovering` (the journal's text).
    Recovering(String),
    /// Every rank of the restart runs again: the job is `running` again (the journal's text).
    Recovered(String),
    /// Every rank has started and connected: how long the start-up phases took (the text of
    /// a [`mutirao_launch::supervise::InitReport`]), journalled as an `init` event.
    Init(String),
    /// The job ended; nothing follows.
    Exited {
        /// The program succeeded on every rank.
        success: bool,
        /// For the journal (`exit 0`, `exit status 3`, `cancelled`, …).
        detail: String,
    },
}

/// A job to start.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The job.
    pub job: Job,
    /// The verified program, executable, on this host.
    pub program: PathBuf,
    /// A directory of its own (hostfile, checkpoints).
    pub work_dir: PathBuf,
    /// Where its ranks go.
    pub hosts: Vec<Slot>,
    /// The coordinator's run of the job (1 for its first placement; journalled as a `run`
    /// event): agents journal its ranks under the job's id and this number, and report them.
    pub run: u32,
}

/// Where a job's events go; called from one thread at a time, in order.
pub type EventSink = Box<dyn FnMut(ExecEvent) + Send>;

/// Starts placed jobs.
pub trait Executor: Send + Sync {
    /// Start `l`; its events go to `events` until an [`ExecEvent::Exited`].
    fn start(&self, l: &Launch, events: EventSink) -> Result<Box<dyn Execution>>;
}

/// A started job.
pub trait Execution: Send + Sync {
    /// End it (an `Exited` event follows).
    fn cancel(&self);
}

/// Runs placed jobs through the launch library (`mutirao-launch`, the same code as `mutirao
/// run`): ranks on the chosen agents, output tagged `[rank]`, and with a checkpoint interval,
/// waves and recovery from the last committed epoch (checkpoints in the job's directory).
pub struct LaunchExecutor {
    /// The agents' shared secret.
    pub agent_token_file: PathBuf,
}

struct LaunchExecution {
    cancelled: Arc<AtomicBool>,
}

impl Execution for LaunchExecution {
    fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
    }
}

/// `text` with every host address of `by_addr` (address, name) that stands alone (not part of
/// a longer address or number) replaced by the host's name.
fn name_hosts(text: &str, by_addr: &[(String, String)]) -> String {
    let mut out = text.to_string();
    for (addr, name) in by_addr {
        if addr.is_empty() || addr == name {
            continue;
        }
        let mut done = String::with_capacity(out.len());
        let mut rest = out.as_str();
        while let Some(i) = rest.find(addr.as_str()) {
            let before = rest[..i].chars().next_back();
            let after = rest[i + addr.len()..].chars().next();
            let part = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '.');
            // A trailing '.' ends a sentence; a digit after it continues an address.
            let after_part = match after {
                Some('.') => rest[i + addr.len() + 1..]
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_digit()),
                c => part(c),
            };
            done.push_str(&rest[..i]);
            if part(before) || after_part {
                done.push_str(addr);
            } else {
                done.push_str(name);
            }
            rest = &rest[i + addr.len()..];
        }
        done.push_str(rest);
        out = done;
    }
    out
}

/// The job's checkpoint store, telling the job's events when a wave's first checkpoint
/// arrives ([`ExecEvent::Wave`]) and when its epoch is committed ([`ExecEvent::Committed`]).
struct WaveSink<S> {
    inner: S,
    /// The epoch of the last checkpoint stored.
    wave: Mutex<Option<u64>>,
    tell: Arc<dyn Fn(ExecEvent) + Send + Sync>,
}

impl<S: mutirao::pmi::CheckpointSink> mutirao::pmi::CheckpointSink for WaveSink<S> {
    fn put(&self, epoch: u64, rank: u32, blob: &[u8]) -> std::result::Result<(), String> {
        self.inner.put(epoch, rank, blob)?;
        let first = {
            let mut w = self.wave.lock().unwrap_or_else(|p| p.into_inner());
            let first = *w != Some(epoch);
            *w = Some(epoch);
            first
        };
        if first {
            (self.tell)(ExecEvent::Wave(epoch));
        }
        Ok(())
    }

    fn get(&self, epoch: u64, rank: u32) -> std::result::Result<Vec<u8>, String> {
        self.inner.get(epoch, rank)
    }

    fn commit(&self, epoch: u64) -> std::result::Result<(), String> {
        self.inner.commit(epoch)?;
        (self.tell)(ExecEvent::Committed(epoch));
        Ok(())
    }

    fn last_committed(&self) -> std::result::Result<Option<u64>, String> {
        self.inner.last_committed()
    }
}

/// The hostfile entries of a placement: one per host, as many slots as ranks placed there.
fn host_entries(hosts: &[Slot]) -> Result<Vec<mutirao_launch::hostfile::HostEntry>> {
    hosts
        .iter()
        .map(|h| {
            let (host, port) = h.addr.rsplit_once(':').ok_or_else(|| {
                Error::Invalid(format!(
                    "host {}: agent address {:?} has no port",
                    h.name, h.addr
                ))
            })?;
            let port = port.parse().map_err(|_| {
                Error::Invalid(format!(
                    "host {}: agent port {port:?} is not a number",
                    h.name
                ))
            })?;
            Ok(mutirao_launch::hostfile::HostEntry {
                host: host.to_string(),
                slots: h.ranks as usize,
                port,
            })
        })
        .collect()
}

impl Executor for LaunchExecutor {
    fn start(&self, l: &Launch, events: EventSink) -> Result<Box<dyn Execution>> {
        use mutirao_launch::job::JobSpec;
        // Told from the job's thread and from the bootstrap server's (checkpoint waves), one
        // at a time.
        let events = Arc::new(Mutex::new(events));
        let tell: Arc<dyn Fn(ExecEvent) + Send + Sync> =
            Arc::new(move |ev| (events.lock().unwrap_or_else(|p| p.into_inner()))(ev));
        let events = tell.clone();
        use mutirao_launch::supervise::{supervise, Cause, Report, Watch};
        let hosts = host_entries(&l.hosts)?;
        let n: usize = hosts.iter().map(|h| h.slots).sum();
        let secret = mutirao_launch::proto::read_token_file(&self.agent_token_file)
            .map_err(Error::Invalid)?;
        let mut spec = JobSpec::local(n, l.program.display().to_string(), l.job.spec.args.clone());
        spec.hosts = Some(hosts);
        spec.secret = Some(secret);
        spec.cwd = Some(l.work_dir.clone());
        // The submitter's variables (validated: none of the runtime's MUTIRAO_* ones, which
        // the launcher sets per rank and the digest check below adds).
        spec.env
            .extend(l.job.spec.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        if l.job.spec.program.starts_with("sha256:") {
            // Each agent checks the program against its digest before it starts a rank.
            spec.env.insert(
                mutirao_launch::agent::PROGRAM_DIGEST_ENV.to_string(),
                l.job.spec.program.clone(),
            );
            spec.env.insert(
                mutirao_launch::agent::PROGRAM_DIGEST_OF_ENV.to_string(),
                spec.program.clone(),
            );
        }
        // The label agents journal the ranks under (a restarted coordinator asks about it).
        spec.env.insert(
            mutirao_launch::journal::GRID_JOB_ENV.to_string(),
            l.job.id.to_string(),
        );
        spec.env.insert(
            mutirao_launch::journal::GRID_RUN_ENV.to_string(),
            l.run.to_string(),
        );
        let cancelled = Arc::new(AtomicBool::new(false));
        let watch = Watch {
            interrupted: cancelled.clone(),
            ..Watch::default()
        };
        let interval = l.job.spec.checkpoint_interval_s;
        let ckpt_dir = l.work_dir.join("ckpt");
        let job_id = l.job.id;
        let handle = cancelled.clone();
        // Hostfile index → the host's name (the hostfile holds addresses).
        let names: Vec<String> = l.hosts.iter().map(|s| s.name.clone()).collect();
        // The launcher names hosts by agent (address, or address:port where agents share
        // one); the journal by the names the agents registered.
        let agents = spec.hosts.clone().unwrap_or_default();
        let by_addr: Vec<(String, String)> = (0..agents.len())
            .map(|i| mutirao_launch::hostfile::agent_name(&agents, i))
            .zip(names.iter().cloned())
            .collect();
        std::thread::Builder::new()
            .name(format!("job-{job_id}"))
            .spawn(move || {
                let mut on = |r: Report| {
                    let line = match r {
                        Report::Output { rank, line, .. } => format!("[{rank}] {line}\n"),
                        Report::Notice(n) => {
                            // Failures and restarts only: the journal tells the run's story.
                            events(ExecEvent::Note(name_hosts(&n, &by_addr)));
                            format!("mutirao: {n}\n")
                        }
                        Report::Init(r) => {
                            // The journal only: the log is the program's output.
                            events(ExecEvent::Init(r.to_string()));
                            return;
                        }
                        Report::Recovery(step) => {
                            use mutirao_launch::supervise::RecoveryStep;
                            events(match step {
                                RecoveryStep::Failed { incarnation, max } => ExecEvent::Recovering(format!(
                                    "recovering within the run (the launcher event before says what failed): restart {incarnation} of {max}, every rank from the last committed epoch"
                                )),
                                RecoveryStep::Restarted { incarnation, epoch } => ExecEvent::Recovered(format!(
                                    "restart {incarnation}: every rank running again from {}",
                                    match epoch {
                                        Some(e) => format!("committed epoch {e}"),
                                        None => "the beginning (no epoch was committed)".to_string(),
                                    }
                                )),
                            });
                            return;
                        }
                    };
                    events(ExecEvent::Output(line.into_bytes()));
                };
                let ended = match interval {
                    None => mutirao_launch::job::Job::start(&spec).map(|job| {
                        let e = supervise(&job, spec.n, &watch, &mut on);
                        (e.code, e.cause)
                    }),
                    Some(s) => mutirao_launch::ckpt_dir::DirSink::new(&ckpt_dir, n as u32)
                        .and_then(|sink| {
                            let rec = mutirao_launch::recovery::Recovery {
                                sink: Arc::new(WaveSink {
                                    inner: sink,
                                    wave: Mutex::new(None),
                                    tell,
                                }),
                                interval: s,
                                mode: Default::default(),
                                max_restarts: 3,
                                rank_hosts: None,
                            };
                            mutirao_launch::recovery::run_with_recovery(
                                &spec, &rec, &watch, &mut on,
                            )
                        })
                        .map(|o| (o.code, None)),
                };
                let (success, detail) = match ended {
                    _ if cancelled.load(Ordering::SeqCst) => (false, "cancelled".to_string()),
                    Ok((0, _)) => (true, "exit 0".to_string()),
                    Ok((code, cause)) => {
                        match &cause {
                            Some(Cause::HostLost { host, .. }) => {
                                if let Some(name) = names.get(*host) {
                                    events(ExecEvent::HostLost(name.clone()));
                                }
                            }
                            Some(Cause::Refused { host, .. }) => {
                                if let Some(name) = names.get(*host) {
                                    events(ExecEvent::Refused(name.clone()));
                                }
                            }
                            _ => {}
                        }
                        (false, format!("exit status {code}"))
                    }
                    Err(e) => (false, format!("cannot run the job: {e:#}")),
                };
                events(ExecEvent::Exited { success, detail });
            })
            .map_err(|e| Error::Io(format!("job {job_id}: cannot start its thread: {e}")))?;
        Ok(Box::new(LaunchExecution { cancelled: handle }))
    }
}

/// Put `src` (whose content is `bytes`) at `dst`, executable: a hard link to `src` when the
/// file system allows one (its mode then gains the execute bits), else a copy of `bytes`.
/// Either way renamed into place whole, not fsynced.
fn link_or_copy(src: &Path, dst: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let tmp = dst.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    if std::fs::hard_link(src, &tmp).is_ok() {
        let linked = std::fs::metadata(&tmp).and_then(|m| {
            let mode = m.permissions().mode();
            if mode & 0o111 != 0o111 {
                std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode | 0o755))?;
            }
            std::fs::rename(&tmp, dst)
        });
        if linked.is_ok() {
            return Ok(());
        }
        let _ = std::fs::remove_file(&tmp);
    }
    write_replacing(dst, bytes, true)
}

/// Write `bytes` to `path` atomically (temporary file, fsync, rename), executable if asked.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8], executable: bool) -> std::io::Result<()> {
    write_renamed(path, bytes, executable, true)
}

/// Replace `path` with `bytes` whole (temporary file, rename: a reader never sees a partial
/// file), without waiting for the disk: for files rewritten before each use.
fn write_replacing(path: &Path, bytes: &[u8], executable: bool) -> std::io::Result<()> {
    write_renamed(path, bytes, executable, false)
}

fn write_renamed(path: &Path, bytes: &[u8], executable: bool, sync: bool) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    if executable {
        f.set_permissions(std::fs::Permissions::from_mode(0o755))?;
    }
    if sync {
        f.sync_all()?;
    }
    drop(f);
    std::fs::rename(&tmp, path)?;
    if let (true, Some(d)) = (sync, path.parent()) {
        std::fs::File::open(d)?.sync_all()?;
    }
    Ok(())
}

/// A checkpoint wave's move of job `id`, `from` → `to`, made only if it is still `from` (a job
/// suspended, re-queued or ended meanwhile stays as it is).
fn follow_wave(c: &Coordinator, id: i64, (from, to): (JobState, JobState), why: &str) {
    if let Err(e) = c.transition_if(id, &[from], to, why) {
        eprintln!("mutirao coordinator: job {id}: cannot journal its checkpoint wave: {e}");
    }
}

/// Milliseconds since `t`.
fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// A job the dispatcher started.
struct Run {
    exec: Arc<dyn Execution>,
    /// The hosts it was placed on.
    hosts: Vec<String>,
    /// Hosts whose owner is active, where its ranks are stopped.
    suspended_on: BTreeSet<String>,
    /// The host being vacated: the run was ended to place the job again.
    vacating: Option<String>,
}

/// What the owner watch decided for one job, done outside the lock.
enum OwnerAction {
    Suspended(i64, String, String),
    Resumed(i64, String, bool),
    Vacate(i64, String, String, Arc<dyn Execution>),
}

/// The last committed epoch in a job's checkpoint directory (`COMMITTED`), if any.
fn committed_epoch(ckpt_dir: &Path) -> Option<u64> {
    std::fs::read_to_string(ckpt_dir.join("COMMITTED"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// A run ended because `host` was vacated: re-queue its job, through `recovering` when it
/// checkpoints (it resumes from its last committed epoch wherever it is placed next).
fn requeue_vacated(
    c: &Coordinator,
    id: i64,
    host: &str,
    ended: &str,
    ckpt_dir: &Path,
) -> Result<()> {
    let store = c.store();
    let job = store.job(id)?;
    if job.state.is_final() {
        return Ok(());
    }
    store.note(id, "owner", &format!("the run left {host} ({ended})"))?;
    if matches!(job.state, JobState::Running | JobState::Checkpointing) {
        c.transition(id, JobState::Suspended, &format!("owner active on {host}"))?;
    }
    if job.spec.checkpoint_interval_s.is_some() {
        let from = match committed_epoch(ckpt_dir) {
            Some(e) => format!("resumes from committed epoch {e}"),
            None => "no epoch was committed: starts again from the beginning".to_string(),
        };
        c.transition(id, JobState::Recovering, &format!("vacated {host}; {from}"))?;
        c.transition(
            id,
            JobState::Waiting,
            &format!("re-queued after vacating {host}; it {from} on hosts whose owners are away"),
        )?;
    } else {
        c.transition(id, JobState::Waiting, &format!("re-queued after vacating {host}; no checkpoints: it starts again from the beginning on hosts whose owners are away"))?;
    }
    Ok(())
}

/// Places waiting jobs and runs them through an [`Executor`].
pub struct Dispatcher {
    c: Arc<Coordinator>,
    exec: Arc<dyn Executor>,
    work: PathBuf,
    running: Mutex<HashMap<i64, Run>>,
    last_refusal: Mutex<HashMap<i64, String>>,
    placing: Mutex<()>,
    model: Mutex<Option<HashMap<String, f64>>>,
    /// The calibrated model itself (task graphs are scheduled with it).
    calibrated: Mutex<Option<mutirao_model::Model>>,
    /// Per job, hosts lost by its earlier runs (left out of its placements) and how often it
    /// was re-queued for it.
    excluded: Mutex<HashMap<i64, (BTreeSet<String>, u32)>>,
    me: Weak<Dispatcher>,
}

/// Hours ahead a host should stay idle for placement to prefer it (jobs do not say how long
/// they run).
pub const STAY_IDLE_HOURS: u32 = 2;

/// How often a job whose run failed with lost hosts is placed again before it fails.
pub const MAX_HOST_LOSS_REQUEUES: u32 = 3;

/// The hosts' relative speeds of a calibrated model (`mutirao-model/1` JSON), for
/// [`Dispatcher::set_model`]; the error says what is wrong with the file.
pub fn model_speeds(json: &str) -> Result<HashMap<String, f64>> {
    let m = mutirao_model::Model::from_json(json)
        .map_err(|e| Error::Invalid(format!("the calibrated model: {e}")))?;
    Ok(m.hosts.into_iter().map(|h| (h.name, h.speed)).collect())
}

impl Dispatcher {
    /// When no host can take job `id` (`none`), journal why — once per distinct reason, so a
    /// waiting job's journal does not grow at every pass — and answer false; otherwise forget
    /// the job's last refusal and answer true. Shared by SPMD jobs and task graphs.
    pub(crate) fn journal_refusal(
        &self,
        id: i64,
        none: bool,
        refused: &[(String, String)],
    ) -> Result<bool> {
        let mut last = self.last_refusal.lock().unwrap_or_else(|p| p.into_inner());
        if !none {
            last.remove(&id);
            return Ok(true);
        }
        let why = if refused.is_empty() {
            "no host has registered; waiting for agents".to_string()
        } else {
            let list: Vec<String> = refused.iter().map(|(h, w)| format!("{h}: {w}")).collect();
            format!("no eligible host ({}); waiting", list.join("; "))
        };
        if last.get(&id) != Some(&why) {
            self.c.store().note(id, "refused", &why)?;
            last.insert(id, why);
        }
        Ok(false)
    }
}

impl Dispatcher {
    /// A dispatcher for `c`, running jobs with `exec`, each in a directory under `work`;
    /// installed as `c`'s job hook.
    pub fn install(
        c: Arc<Coordinator>,
        exec: Arc<dyn Executor>,
        work: &Path,
    ) -> Result<Arc<Dispatcher>> {
        // Not 0700 yet: agents without a program cache run the program from here, as the
        // job's own uid.
        std::fs::create_dir_all(work).map_err(|e| {
            Error::Io(format!(
                "cannot create the jobs directory {}: {e}",
                work.display()
            ))
        })?;
        let d = Arc::new_cyclic(|me| Dispatcher {
            c: c.clone(),
            exec,
            work: work.to_path_buf(),
            running: Mutex::new(HashMap::new()),
            last_refusal: Mutex::new(HashMap::new()),
            placing: Mutex::new(()),
            model: Mutex::new(None),
            calibrated: Mutex::new(None),
            excluded: Mutex::new(HashMap::new()),
            me: me.clone(),
        });
        c.set_hook(d.clone());
        Ok(d)
    }

    /// Place SPMD jobs with a calibrated model's host speeds ([`model_speeds`]): more ranks to
    /// faster hosts, the predicted makespan journalled.
    pub fn set_model(&self, speeds: HashMap<String, f64>) {
        *self.model.lock().unwrap_or_else(|p| p.into_inner()) = Some(speeds);
    }

    /// Place with a calibrated model: SPMD jobs by its hosts' speeds ([`Dispatcher::set_model`]),
    /// task graphs with a scheduler of `mutirao-sched` over it (`submit --dag`).
    pub fn set_calibrated_model(&self, m: mutirao_model::Model) {
        self.set_model(m.hosts.iter().map(|h| (h.name.clone(), h.speed)).collect());
        *self.calibrated.lock().unwrap_or_else(|p| p.into_inner()) = Some(m);
    }

    /// Try to place and start every waiting job, oldest first; returns how many started.
    pub fn place_waiting(&self) -> Result<usize> {
        let _one_at_a_time = self.placing.lock().unwrap_or_else(|p| p.into_inner());
        let store = self.c.store();
        let waiting = store.jobs_in(&[JobState::Waiting])?;
        let mut started = 0;
        for j in waiting {
            match self.try_start(&j) {
                Ok(true) => started += 1,
                Ok(false) => {}
                Err(e) => {
                    let _ =
                        self.c
                            .transition(j.id, JobState::Failed, &format!("cannot start: {e}"));
                }
            }
        }
        Ok(started)
    }

    fn try_start(&self, j: &Job) -> Result<bool> {
        let store = self.c.store();
        let lost_after = 3 * self.c.heartbeat_interval.as_millis() as i64;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        let left_out: BTreeSet<String> = self
            .excluded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&j.id)
            .map(|e| e.0.clone())
            .unwrap_or_default();
        let (hosts, out): (Vec<_>, Vec<_>) = store
            .hosts()?
            .into_iter()
            .map(|h| {
                let alive = now - h.last_seen_ms <= lost_after;
                (h, alive)
            })
            .partition(|(h, _)| !left_out.contains(&h.report.name));
        let req =
            Requirement::parse(j.spec.require.as_deref().unwrap_or("")).map_err(Error::Invalid)?;
        let prefs = Prefs {
            stay_idle: hosts
                .iter()
                .map(|(h, _)| {
                    let n = &h.report.name;
                    (n.clone(), self.c.usage().stay_idle(n, STAY_IDLE_HOURS))
                })
                .collect(),
            speed: self.model.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        };
        if j.spec.dag {
            return self.try_start_dag(j, &hosts, &out, &req, &prefs);
        }
        let t_place = Instant::now();
        let mut p: Placement = place_with(j.spec.ranks, &req, &hosts, &prefs);
        for (h, _) in &out {
            p.refused.push((
                h.report.name.clone(),
                "lost during an earlier run of this job".to_string(),
            ));
        }
        if !self.journal_refusal(j.id, p.chosen.is_empty(), &p.refused)? {
            return Ok(false);
        }
        let placed_ms = ms_since(t_place);
        // The program, checked against its digest before anything runs it.
        let t_read = Instant::now();
        let bytes = self.c.repo().get(&j.spec.program)?;
        let read_ms = ms_since(t_read);
        let t_copy = Instant::now();
        let dir = self.work.join(j.id.to_string());
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::Io(format!("cannot create {}: {e}", dir.display())))?;
        let program = dir.join("program");
        // The repository's file itself (a hard link; it is never changed in place), else a
        // copy. Renamed into place whole but not fsynced: it is put there again at every
        // placement, and a coordinator that crashes re-queues its jobs, so one lost with the
        // machine is never used. (Copying 12.6 MB cost ~100 ms on a busy disk even unsynced.)
        link_or_copy(&self.c.repo().file(&j.spec.program)?, &program, &bytes)
            .map_err(|e| Error::Io(format!("cannot write {}: {e}", program.display())))?;
        let copy_ms = ms_since(t_copy);
        let chosen: Vec<String> = p
            .chosen
            .iter()
            .map(|s| format!("{}×{}", s.name, s.ranks))
            .collect();
        let how = match p.predicted {
            None => "hosts likely to stay idle first, then idle cores".to_string(),
            Some((m, plain)) => format!(
                "calibrated model: fastest free cores first, then speed-proportional; predicted makespan {m:.3} against {plain:.3} idle cores first (relative {:.2})",
                if plain > 0.0 { m / plain } else { 1.0 }
            ),
        };
        let placement = format!(
            "{} ranks on {} ({how}; program {} verified)",
            j.spec.ranks,
            chosen.join(", "),
            j.spec.program
        );
        let order = format!(
            "eligible hosts in order of preference: {} (stays idle: probability of the owner staying away {STAY_IDLE_HOURS} h, from the usage history)",
            p.order.join(", ")
        );
        let refused: Vec<String> = p
            .refused
            .iter()
            .map(|(h, why)| format!("{h}: {why}"))
            .collect();
        let timing = format!(
            "placed in {placed_ms:.1} ms, program read and checked in {read_ms:.1} ms, copied into the job's directory in {copy_ms:.1} ms"
        );
        let run = store
            .events(j.id)?
            .iter()
            .filter(|e| e.kind == "run")
            .count() as u32
            + 1;
        let run_note = run_detail(run, j.spec.ranks, &p.chosen);
        let mut notes: Vec<(&str, &str)> = vec![("placement", &placement), ("order", &order)];
        notes.extend(refused.iter().map(|r| ("refused", r.as_str())));
        notes.push(("run", &run_note));
        notes.push(("start", &timing));
        let names: Vec<&str> = p.chosen.iter().map(|s| s.name.as_str()).collect();
        // The decision and the start: one durable write.
        self.c.transition_noting(
            j.id,
            &notes,
            JobState::Running,
            &format!("started on {}", names.join(", ")),
        )?;
        let launch = Launch {
            job: j.clone(),
            program,
            work_dir: dir,
            hosts: p.chosen,
            run,
        };
        let (c, id, me) = (self.c.clone(), j.id, self.me.clone());
        let ckpt_dir = launch.work_dir.join("ckpt");
        let hosts_used: Vec<String> = launch.hosts.iter().map(|s| s.name.clone()).collect();
        let mut lost_here: BTreeSet<String> = BTreeSet::new();
        let mut refused_here: BTreeSet<String> = BTreeSet::new();
        // Output in batches (one store change per 50 ms or 64 KiB), within the log's cap.
        let mut log = Some(crate::logbatch::JobLog::start(c.clone(), id));
        let sink: EventSink = Box::new(move |ev| match ev {
            ExecEvent::Output(b) => {
                if let Some(l) = log.as_mut() {
                    l.push(b);
                }
            }
            ExecEvent::Note(n) => {
                let _ = c.store().note(id, "launcher", &n);
            }
            ExecEvent::Init(n) => {
                let _ = c.store().note(id, "init", &n);
            }
            ExecEvent::Wave(e) => follow_wave(
                &c,
                id,
                (JobState::Running, JobState::Checkpointing),
                &format!("wave of epoch {e}: the ranks' checkpoints are arriving"),
            ),
            ExecEvent::Committed(e) => follow_wave(
                &c,
                id,
                (JobState::Checkpointing, JobState::Running),
                &format!("epoch {e} committed"),
            ),
            ExecEvent::Recovering(why) => {
                if let Err(e) = c.transition_if(
                    id,
                    &[JobState::Running, JobState::Checkpointing],
                    JobState::Recovering,
                    &why,
                ) {
                    eprintln!("mutirao coordinator: job {id}: cannot journal its recovery: {e}");
                }
            }
            ExecEvent::Recovered(why) => {
                if let Err(e) =
                    c.transition_if(id, &[JobState::Recovering], JobState::Running, &why)
                {
                    eprintln!("mutirao coordinator: job {id}: cannot journal its recovery: {e}");
                }
            }
            ExecEvent::HostLost(h) => {
                let _ = c.store().note(id, "host-lost", &h);
                lost_here.insert(h);
            }
            ExecEvent::Refused(h) => {
                let _ = c.store().note(
                    id,
                    "refused",
                    &format!("{h} refused the launch (its agent's reason is in the launcher event before); the host is not lost"),
                );
                refused_here.insert(h);
            }
            ExecEvent::Exited { success, detail } => {
                // The whole log is stored before the end is journalled.
                if let Some(l) = log.take() {
                    l.finish();
                }
                let d = me.upgrade();
                let run = d.as_ref().and_then(|d| {
                    d.running
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&id)
                });
                if let Some(host) = run.and_then(|r| r.vacating) {
                    if let Err(e) = requeue_vacated(&c, id, &host, &detail, &ckpt_dir) {
                        eprintln!("mutirao coordinator: job {id}: cannot re-queue it: {e}");
                    }
                    return;
                }
                let requeue = if !lost_here.is_empty() {
                    Some((&lost_here, true))
                } else if !refused_here.is_empty() {
                    Some((&refused_here, false))
                } else {
                    None
                };
                if let (false, Some((hosts, lost)), Some(d)) = (success, requeue, &d) {
                    match d.requeue_lost(id, hosts, lost, &detail, &ckpt_dir) {
                        Ok(true) => return,
                        Ok(false) => {}
                        Err(e) => {
                            eprintln!("mutirao coordinator: job {id}: cannot re-queue it: {e}")
                        }
                    }
                }
                let to = if success {
                    JobState::Finished
                } else {
                    JobState::Failed
                };
                if c.store()
                    .job(id)
                    .is_ok_and(|j| j.state == JobState::Suspended)
                {
                    let _ = c.transition(id, JobState::Running, "its run ended while suspended");
                }
                // Already cancelled: the transition is refused, the journal says so already.
                let _ = c.transition(id, to, &detail);
            }
        });
        match self.exec.start(&launch, sink) {
            Ok(x) => {
                let mut run = self.running.lock().unwrap_or_else(|p| p.into_inner());
                if store.job(id)?.state.is_final() {
                    // Cancelled (or ended) while starting.
                    x.cancel();
                } else {
                    run.insert(
                        id,
                        Run {
                            exec: Arc::from(x),
                            hosts: hosts_used,
                            suspended_on: BTreeSet::new(),
                            vacating: None,
                        },
                    );
                }
                Ok(true)
            }
            Err(e) => {
                self.c
                    .transition(id, JobState::Failed, &format!("cannot start: {e}"))?;
                Ok(false)
            }
        }
    }

    /// Follow the owners of the hosts running jobs, from the agents' last reports: a host
    /// whose owner's policy says `suspend` (its agent stopped the ranks there) suspends its
    /// jobs, `available` again resumes them, `vacate` (the owner stayed past the policy's
    /// grace period) ends the run and re-queues the job, which is placed again on hosts whose
    /// owners are away and, with checkpoints, resumes from its last committed epoch. Every
    /// step is journalled. Called by the placement loop.
    pub fn watch_owners(&self) -> Result<()> {
        use crate::policy::OwnerState;
        let reports: HashMap<String, crate::HostReport> = self
            .c
            .store()
            .hosts()?
            .into_iter()
            .map(|h| (h.report.name.clone(), h.report))
            .collect();
        let mut actions = Vec::new();
        {
            let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
            for (&id, run) in running.iter_mut() {
                if run.vacating.is_some() {
                    continue;
                }
                for h in &run.hosts {
                    let Some(r) = reports.get(h) else { continue };
                    let why = if r.owner_why.is_empty() {
                        "the owner is active".to_string()
                    } else {
                        r.owner_why.clone()
                    };
                    match r.owner {
                        OwnerState::Suspend if run.suspended_on.insert(h.clone()) => {
                            actions.push(OwnerAction::Suspended(id, h.clone(), why));
                        }
                        OwnerState::Available if run.suspended_on.remove(h) => {
                            let all = run.suspended_on.is_empty();
                            actions.push(OwnerAction::Resumed(id, h.clone(), all));
                        }
                        OwnerState::Vacate => {
                            run.vacating = Some(h.clone());
                            actions.push(OwnerAction::Vacate(id, h.clone(), why, run.exec.clone()));
                            break;
                        }
                        _ => {}
                    }
                }
            }
        }
        let store = self.c.store();
        // A running (or checkpointing) job whose host's owner came back is `suspended`.
        let suspend = |id: i64, h: &str| {
            self.c.transition_if(
                id,
                &[JobState::Running, JobState::Checkpointing],
                JobState::Suspended,
                &format!("owner active on {h}"),
            )
        };
        for a in actions {
            match a {
                OwnerAction::Suspended(id, h, why) => {
                    store.note(
                        id,
                        "owner",
                        &format!("owner active on {h} ({why}): its agent stopped the job's ranks there (SIGSTOP); they are vacated after the owner's grace period unless the owner leaves"),
                    )?;
                    suspend(id, &h)?;
                }
                OwnerAction::Resumed(id, h, all) => {
                    store.note(
                        id,
                        "owner",
                        &format!("the owner of {h} left: its agent continued the job's ranks there (SIGCONT)"),
                    )?;
                    if all {
                        self.c.transition_if(
                            id,
                            &[JobState::Suspended],
                            JobState::Running,
                            "resumed: no owner active on its hosts",
                        )?;
                    }
                }
                OwnerAction::Vacate(id, h, why, x) => {
                    store.note(
                        id,
                        "owner",
                        &format!("vacating {h}: its owner stayed active past the grace period ({why}); ending the run to place the job again"),
                    )?;
                    suspend(id, &h)?;
                    x.cancel();
                }
            }
        }
        Ok(())
    }

    /// A run that failed because hosts were lost: unless the job was cancelled meanwhile or
    /// has been re-queued [`MAX_HOST_LOSS_REQUEUES`] times already, it goes back to `waiting`
    /// through `recovering` (journalled, with the committed epoch it resumes from, if any) and
    /// its next placements leave the lost hosts out. Returns whether it was re-queued.
    ///
    /// `lost`: the hosts were lost (they are left out of the job's next placements); else
    /// their agents refused the launch (they stay eligible: an agent refusing an altered cached
    /// copy removes it and fetches a fresh one next time). Both count towards the same limit.
    fn requeue_lost(
        &self,
        id: i64,
        hosts: &BTreeSet<String>,
        lost: bool,
        ended: &str,
        ckpt_dir: &Path,
    ) -> Result<bool> {
        let job = self.c.store().job(id)?;
        if job.state.is_final() {
            return Ok(false);
        }
        let names: Vec<&str> = hosts.iter().map(String::as_str).collect();
        let names = names.join(", ");
        let tries = {
            let mut ex = self.excluded.lock().unwrap_or_else(|p| p.into_inner());
            let e = ex.entry(id).or_default();
            if lost {
                e.0.extend(hosts.iter().cloned());
            }
            e.1 += 1;
            e.1
        };
        let (kind, what) = if lost {
            ("host-lost", format!("lost {names}"))
        } else {
            ("refused", format!("{names} refused the launch"))
        };
        if tries > MAX_HOST_LOSS_REQUEUES {
            self.c.store().note(
                id,
                kind,
                &format!(
                    "{what} ({ended}); re-queued {MAX_HOST_LOSS_REQUEUES} times already: giving up"
                ),
            )?;
            return Ok(false);
        }
        if job.state == JobState::Suspended {
            self.c
                .transition(id, JobState::Running, "its run ended while suspended")?;
        }
        let from = match (job.spec.checkpoint_interval_s, committed_epoch(ckpt_dir)) {
            (Some(_), Some(e)) => format!("it resumes from committed epoch {e}"),
            (Some(_), None) => {
                "no epoch was committed: it starts again from the beginning".to_string()
            }
            (None, _) => "no checkpoints: it runs again from the beginning".to_string(),
        };
        if job.state == JobState::Recovering {
            // Its launcher was restarting it within the run when the run ended.
            self.c
                .store()
                .note(id, kind, &format!("{what} ({ended})"))?;
        } else {
            self.c
                .transition(id, JobState::Recovering, &format!("{what} ({ended})"))?;
        }
        let again = if lost {
            format!("re-queued (host loss {tries} of at most {MAX_HOST_LOSS_REQUEUES}): {from}, on hosts other than {names}")
        } else {
            format!("re-queued (refused launch; re-queue {tries} of at most {MAX_HOST_LOSS_REQUEUES}): {from}; {names} may be chosen again")
        };
        self.c.transition(id, JobState::Waiting, &again)?;
        Ok(true)
    }

    /// How many jobs run now.
    pub fn running(&self) -> usize {
        self.running.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Place waiting jobs every `every` (hosts come and go) until the handle is dropped.
    pub fn spawn_loop(self: &Arc<Self>, every: Duration) -> LoopHandle {
        let stop = Arc::new(AtomicBool::new(false));
        let (d, s) = (Arc::downgrade(self), stop.clone());
        let th = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                let Some(d) = d.upgrade() else { return };
                if let Err(e) = d.watch_owners() {
                    eprintln!("mutirao coordinator: following the hosts' owners: {e}");
                }
                if let Err(e) = d.place_waiting() {
                    eprintln!("mutirao coordinator: placing waiting jobs: {e}");
                }
                drop(d);
                let t0 = Instant::now();
                while t0.elapsed() < every && !s.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        });
        LoopHandle { stop, th: Some(th) }
    }
}

/// Stops the placement loop when dropped.
pub struct LoopHandle {
    stop: Arc<AtomicBool>,
    th: Option<std::thread::JoinHandle<()>>,
}

impl Drop for LoopHandle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.th.take() {
            let _ = t.join();
        }
    }
}

impl JobHook for Dispatcher {
    fn submitted(&self, _c: &Arc<Coordinator>, _job: &Job) {
        if let Err(e) = self.place_waiting() {
            eprintln!("mutirao coordinator: placing waiting jobs: {e}");
        }
    }

    fn runs_on(&self, job: i64, host: &str) -> bool {
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&job)
            .is_some_and(|r| r.hosts.iter().any(|h| h == host))
    }

    fn cancelled(&self, _c: &Arc<Coordinator>, job: &Job) {
        let x = self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&job.id);
        if let Some(x) = x {
            x.exec.cancel();
        }
    }
}

#[cfg(test)]
mod name_tests {
    #[test]
    fn launcher_notices_name_hosts_as_they_registered() {
        let by = [
            ("10.0.0.1".to_string(), "a1".to_string()),
            ("10.0.0.12".to_string(), "a12".to_string()),
        ];
        assert_eq!(
            super::name_hosts("agent of 10.0.0.1 lost; not on 10.0.0.12, 10.0.0.1.", &by),
            "agent of a1 lost; not on a12, a1."
        );
        assert_eq!(
            super::name_hosts("x110.0.0.1 10.0.0.100", &by),
            "x110.0.0.1 10.0.0.100"
        );
    }

    #[test]
    fn three_agents_on_one_address_are_three_hosts_in_the_journal() {
        use mutirao_launch::hostfile::{agent_name, HostEntry};
        let agents: Vec<HostEntry> = [7207, 7208, 7209]
            .iter()
            .map(|&port| HostEntry {
                host: "127.0.0.1".into(),
                slots: 1,
                port,
            })
            .collect();
        let by: Vec<(String, String)> = (0..3)
            .map(|i| (agent_name(&agents, i), format!("n{}", i + 1)))
            .collect();
        assert_eq!(by[1].0, "127.0.0.1:7208");
        assert_eq!(
            super::name_hosts(
                "rank 1 on 127.0.0.1:7208 was killed by signal 9; restarted every rank; not on 127.0.0.1:7208",
                &by
            ),
            "rank 1 on n2 was killed by signal 9; restarted every rank; not on n2"
        );
    }
}
