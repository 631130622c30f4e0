//! Running task-graph jobs (`submit --dag`): each task a one-rank run of its script
//! ([`crate::taskgraph::task_script`]) on the host the plan gave it, through the same
//! [`Executor`] as SPMD jobs, started when its predecessors have finished. Finished tasks are
//! journalled (`task-done`, with their outputs' digests in the repository), so a coordinator
//! restarted mid-job, or a job re-queued after vacating a host, runs only what is left.

use super::{
    requeue_vacated, write_atomic, Dispatcher, EventSink, ExecEvent, Execution, Launch, Run,
};
use crate::api::Coordinator;
use crate::place::{place_with, Prefs, Requirement, Slot};
use crate::taskgraph::{self, OutputParser, TaskGraph};
use crate::{Error, Host, Job, JobState, NewJob, Result};
use mutirao_sched::Dag;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// How often one task is started again after losing its host before the job fails.
pub const MAX_TASK_HOST_LOSSES: u32 = 3;

/// The journal's record of a finished task (`task-done` events, JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskDone {
    /// Task id.
    pub task: String,
    /// Where it ran.
    pub host: String,
    /// Its outputs: file name → digest in the repository.
    pub outputs: BTreeMap<String, String>,
}

/// The tasks a job's journal says finished (a later record of a task replaces an earlier one).
pub fn finished_tasks(c: &Coordinator, id: i64) -> Result<HashMap<String, TaskDone>> {
    let mut done = HashMap::new();
    for e in c.store().events(id)? {
        if e.kind == "task-done" {
            if let Ok(t) = serde_json::from_str::<TaskDone>(&e.detail) {
                done.insert(t.task.clone(), t);
            }
        }
    }
    Ok(done)
}

/// A running task graph: cancelling it cancels its running tasks and starts no more.
struct DagExecution {
    cancelled: AtomicBool,
    tasks: Mutex<HashMap<usize, Box<dyn Execution>>>,
}

impl Execution for DagExecution {
    fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
        for x in self
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            x.cancel();
        }
    }
}

/// How one task's run ended.
struct TaskEnd {
    task: usize,
    success: bool,
    detail: String,
    lost: bool,
    files: std::result::Result<Vec<(String, Vec<u8>)>, String>,
}

impl Dispatcher {
    /// Place a waiting task-graph job: the eligible hosts (alive, owner away, meeting the
    /// requirement, not lost by an earlier run), the plan ([`taskgraph::plan`]) journalled
    /// with the hosts refused, then the runner thread. `Ok(false)`: no eligible host yet.
    pub(super) fn try_start_dag(
        &self,
        j: &Job,
        hosts: &[(Host, bool)],
        left_out: &[(Host, bool)],
        req: &Requirement,
        prefs: &Prefs,
    ) -> Result<bool> {
        let store = self.c.store();
        let mut refused = place_with(0, req, hosts, prefs).refused;
        let eligible: Vec<(String, String)> = {
            let no: BTreeSet<&str> = refused.iter().map(|(h, _)| h.as_str()).collect();
            let mut v: Vec<(String, String)> = hosts
                .iter()
                .filter(|(h, _)| !no.contains(h.report.name.as_str()))
                .map(|(h, _)| (h.report.name.clone(), h.report.addr.clone()))
                .collect();
            v.sort();
            v
        };
        for (h, _) in left_out {
            refused.push((
                h.report.name.clone(),
                "lost during an earlier run of this job".to_string(),
            ));
        }
        if !self.journal_refusal(j.id, eligible.is_empty(), &refused)? {
            return Ok(false);
        }
        let text = self.c.repo().get(&j.spec.program)?;
        let text = String::from_utf8(text)
            .map_err(|_| Error::Invalid("the task graph is not UTF-8 text".into()))?;
        let (graph, dag) = TaskGraph::parse(&text)
            .map_err(|e| Error::Invalid(format!("task graph {}: {e}", j.spec.program)))?;
        let algo = taskgraph::algorithm(&j.spec.args).map_err(Error::Invalid)?;
        let done = finished_tasks(&self.c, j.id)?;
        let names: Vec<String> = eligible.iter().map(|(n, _)| n.clone()).collect();
        let model = self
            .calibrated
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let plan = taskgraph::plan(&dag, model.as_ref(), &names, algo).map_err(Error::Invalid)?;
        let mapping: Vec<String> = graph
            .tasks
            .iter()
            .map(|t| format!("{}→{}", t.id, plan.host_of[&t.id]))
            .collect();
        store.note(
            j.id,
            "placement",
            &format!(
                "task graph of {} tasks: {} ({}; graph {} verified)",
                graph.tasks.len(),
                mapping.join(", "),
                plan.how,
                j.spec.program
            ),
        )?;
        for (h, why) in &refused {
            store.note(j.id, "refused", &format!("{h}: {why}"))?;
        }
        if !done.is_empty() {
            let mut ids: Vec<&str> = done.keys().map(String::as_str).collect();
            ids.sort();
            store.note(
                j.id,
                "resume",
                &format!(
                    "tasks {} finished in an earlier run; their outputs are kept in the repository and they do not run again",
                    ids.join(", ")
                ),
            )?;
        }
        let used: BTreeSet<String> = plan.host_of.values().cloned().collect();
        let used: Vec<String> = used.into_iter().collect();
        self.c.transition(
            j.id,
            JobState::Running,
            &format!("started task graph on {}", used.join(", ")),
        )?;
        let dir = self.work.join(j.id.to_string());
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::Io(format!("cannot create {}: {e}", dir.display())))?;
        let x = Arc::new(DagExecution {
            cancelled: AtomicBool::new(false),
            tasks: Mutex::new(HashMap::new()),
        });
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                j.id,
                Run {
                    exec: x.clone(),
                    hosts: used,
                    suspended_on: BTreeSet::new(),
                    vacating: None,
                },
            );
        let runner = Runner {
            c: self.c.clone(),
            me: self.me.clone(),
            exec: self.exec.clone(),
            job: j.clone(),
            graph,
            dag,
            host_of: plan.host_of,
            eligible,
            done,
            dir,
            x,
        };
        std::thread::Builder::new()
            .name(format!("dag-{}", j.id))
            .spawn(move || runner.run())
            .map_err(|e| Error::Io(format!("cannot start the task graph's thread: {e}")))?;
        Ok(true)
    }
}

struct Runner {
    c: Arc<Coordinator>,
    me: Weak<Dispatcher>,
    exec: Arc<dyn super::Executor>,
    job: Job,
    graph: TaskGraph,
    dag: Dag,
    host_of: BTreeMap<String, String>,
    eligible: Vec<(String, String)>,
    done: HashMap<String, TaskDone>,
    dir: PathBuf,
    x: Arc<DagExecution>,
}

impl Runner {
    fn run(mut self) {
        let id = self.job.id;
        let (end, detail) = self.drive();
        let d = self.me.upgrade();
        let run = d.as_ref().and_then(|d| {
            d.running
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id)
        });
        if let Some(host) = run.and_then(|r| r.vacating) {
            if let Err(e) = requeue_vacated(&self.c, id, &host, &detail, &self.dir.join("ckpt")) {
                eprintln!("mutirao coordinator: job {id}: cannot re-queue it: {e}");
            }
            return;
        }
        let Some(to) = end else { return };
        if self
            .c
            .store()
            .job(id)
            .is_ok_and(|j| j.state == JobState::Suspended)
        {
            let _ = self
                .c
                .transition(id, JobState::Running, "its run ended while suspended");
        }
        // Already cancelled: the transition is refused, the journal says so already.
        let _ = self.c.transition(id, to, &detail);
    }

    /// Run the graph; the state it ends in (`None`: cancelled or vacated) and why.
    fn drive(&mut self) -> (Option<JobState>, String) {
        let n = self.dag.len();
        let (tx, rx) = mpsc::channel::<TaskEnd>();
        let mut finished: Vec<bool> = (0..n)
            .map(|t| self.done.contains_key(&self.dag.tasks()[t].id))
            .collect();
        let mut running: BTreeSet<usize> = BTreeSet::new();
        let mut losses: HashMap<usize, u32> = HashMap::new();
        let mut lost_hosts: BTreeSet<String> = BTreeSet::new();
        let mut failure: Option<String> = None;
        loop {
            let stop = self.x.cancelled.load(Ordering::SeqCst) || failure.is_some();
            // While an owner keeps the job suspended, no task starts (its agent stopped the
            // running ones); they start again once it is running.
            let mut suspended = None;
            if !stop {
                for t in 0..n {
                    if finished[t] || running.contains(&t) {
                        continue;
                    }
                    let ready = self
                        .dag
                        .in_edges(t)
                        .iter()
                        .all(|&e| finished[self.dag.edges()[e].from]);
                    if !ready {
                        continue;
                    }
                    let held = *suspended.get_or_insert_with(|| {
                        self.c
                            .store()
                            .job(self.job.id)
                            .is_ok_and(|j| j.state == JobState::Suspended)
                    });
                    if held {
                        break;
                    }
                    match self.start(t, tx.clone()) {
                        Ok(()) => {
                            running.insert(t);
                        }
                        Err(e) => {
                            failure = Some(format!(
                                "task {} could not start: {e}",
                                self.dag.tasks()[t].id
                            ));
                            self.x.cancel_tasks();
                            break;
                        }
                    }
                }
            }
            if running.is_empty() {
                if let Some(f) = failure {
                    return (Some(JobState::Failed), f);
                }
                if self.x.cancelled.load(Ordering::SeqCst) {
                    return (None, "cancelled".into());
                }
                if finished.iter().all(|&f| f) {
                    return (Some(JobState::Finished), format!("all {n} tasks finished"));
                }
                if suspended == Some(true) {
                    std::thread::sleep(Duration::from_millis(200));
                    continue;
                }
                return (
                    Some(JobState::Failed),
                    "no task can start (internal error: the graph is not acyclic?)".into(),
                );
            }
            let Ok(end) = rx.recv_timeout(Duration::from_millis(200)) else {
                continue;
            };
            running.remove(&end.task);
            self.x
                .tasks
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&end.task);
            let tid = self.dag.tasks()[end.task].id.clone();
            let host = self.host_of[&tid].clone();
            if self.x.cancelled.load(Ordering::SeqCst) {
                continue;
            }
            if failure.is_some() && !end.success {
                // Ended by the job's failure: the first failure is the story.
                continue;
            }
            if end.success {
                match end.files.and_then(|f| self.keep(&tid, &host, f)) {
                    Ok(()) => finished[end.task] = true,
                    Err(e) => {
                        let _ = self.c.store().note(
                            self.job.id,
                            "task",
                            &format!("{tid} failed on {host}: {e}"),
                        );
                        failure.get_or_insert(format!("task {tid} failed on {host}: {e}"));
                        self.x.cancel_tasks();
                    }
                }
                continue;
            }
            let tries = losses.entry(end.task).or_default();
            if end.lost && *tries < MAX_TASK_HOST_LOSSES {
                *tries += 1;
                lost_hosts.insert(host.clone());
                let next = self
                    .eligible
                    .iter()
                    .map(|(n, _)| n)
                    .find(|n| !lost_hosts.contains(*n))
                    .cloned();
                if let Some(next) = next {
                    let _ = self.c.store().note(
                        self.job.id,
                        "task",
                        &format!(
                            "{tid} lost its host {host} ({}); started again on {next} (host loss {tries} of at most {MAX_TASK_HOST_LOSSES})",
                            end.detail
                        ),
                    );
                    self.host_of.insert(tid, next);
                    continue;
                }
            }
            let why = format!("task {tid} failed on {host}: {}", end.detail);
            let _ = self.c.store().note(self.job.id, "task", &why);
            failure.get_or_insert(why);
            self.x.cancel_tasks();
        }
    }

    /// Store a finished task's outputs in the repository and journal it.
    fn keep(
        &mut self,
        tid: &str,
        host: &str,
        files: Vec<(String, Vec<u8>)>,
    ) -> std::result::Result<(), String> {
        let mut outputs = BTreeMap::new();
        for (name, bytes) in files {
            let d = self
                .c
                .repo()
                .put(&bytes)
                .map_err(|e| format!("cannot keep its output {name}: {e}"))?;
            // The job's owner may download it (kept for them, counted in their quota).
            self.c
                .own_blob(&self.job.spec.owner, &d, bytes.len() as u64)
                .map_err(|e| format!("cannot record its output {name}: {e}"))?;
            outputs.insert(name, d);
        }
        let rec = TaskDone {
            task: tid.to_string(),
            host: host.to_string(),
            outputs,
        };
        let text = serde_json::to_string(&rec).map_err(|e| e.to_string())?;
        self.c
            .store()
            .note(self.job.id, "task-done", &text)
            .map_err(|e| format!("cannot journal it: {e}"))?;
        self.done.insert(tid.to_string(), rec);
        Ok(())
    }

    /// Start task `t` on its host: its inputs from the repository into its script, the
    /// script into the repository (the agent fetches it by digest), a one-rank launch.
    fn start(&self, t: usize, tx: mpsc::Sender<TaskEnd>) -> Result<()> {
        let spec = &self.graph.tasks[t];
        let host = &self.host_of[&spec.id];
        let addr = self
            .eligible
            .iter()
            .find(|(n, _)| n == host)
            .map(|(_, a)| a.clone())
            .ok_or_else(|| Error::Invalid(format!("host {host} is not eligible")))?;
        let mut inputs = Vec::new();
        for e in &self.graph.edges {
            if e.to != spec.id {
                continue;
            }
            for f in &e.files {
                let d = self
                    .done
                    .get(&e.from)
                    .and_then(|r| r.outputs.get(f))
                    .ok_or_else(|| {
                        Error::Invalid(format!("input {f} of task {} has no record", e.from))
                    })?;
                inputs.push((f.clone(), self.c.repo().get(d)?, false));
            }
        }
        for (f, d) in &spec.files {
            inputs.push((f.clone(), self.c.repo().get(d)?, true));
        }
        let nonce = crate::repo::digest_of(
            format!(
                "{}:{}:{:?}",
                self.job.id,
                spec.id,
                std::time::SystemTime::now()
            )
            .as_bytes(),
        )[7..23]
            .to_string();
        let script = taskgraph::task_script(spec, &inputs, &nonce);
        let digest = self.c.repo().put(script.as_bytes())?;
        let path = self.dir.join(format!("task-{t}.sh"));
        write_atomic(&path, script.as_bytes(), true)
            .map_err(|e| Error::Io(format!("cannot write {}: {e}", path.display())))?;
        let launch = Launch {
            job: Job {
                spec: NewJob {
                    ranks: 1,
                    program: digest,
                    args: Vec::new(),
                    checkpoint_interval_s: None,
                    dag: false,
                    ..self.job.spec.clone()
                },
                ..self.job.clone()
            },
            program: path,
            work_dir: self.dir.clone(),
            hosts: vec![Slot {
                name: host.clone(),
                addr,
                ranks: 1,
            }],
            // Tasks are not reconciled run by run: a restarted coordinator waits for their
            // ranks to be gone and runs the unfinished tasks again.
            run: 0,
        };
        let _ = self.c.store().note(
            self.job.id,
            "task",
            &format!("{} started on {host}", spec.id),
        );
        let (c, id) = (self.c.clone(), self.job.id);
        let mut parser = Some(OutputParser::new(
            &spec.id,
            &nonce,
            self.c.repo().max_bytes(),
        ));
        let declared = spec.outputs.clone();
        let mut lost = false;
        let mut log = Some(crate::logbatch::JobLog::start(c.clone(), id));
        let sink: EventSink = Box::new(move |ev| match ev {
            ExecEvent::Output(b) => {
                if let (Some(p), Some(l)) = (parser.as_mut(), log.as_mut()) {
                    l.push(p.feed(&b));
                }
            }
            ExecEvent::Note(n) => {
                let _ = c.store().note(id, "launcher", &n);
            }
            // A task is a one-rank run: its start-up says nothing worth a journal line each.
            // Tasks take no checkpoints.
            // Tasks run without checkpoints: no waves, no restarts within a run.
            ExecEvent::Init(_)
            | ExecEvent::Wave(_)
            | ExecEvent::Committed(_)
            | ExecEvent::Recovering(_)
            | ExecEvent::Recovered(_) => {}
            ExecEvent::HostLost(h) => {
                let _ = c.store().note(id, "host-lost", &h);
                lost = true;
            }
            // The task runs again elsewhere, as after a lost host.
            ExecEvent::Refused(h) => {
                let _ = c
                    .store()
                    .note(id, "refused", &format!("{h} refused the task's launch"));
                lost = true;
            }
            ExecEvent::Exited { success, detail } => {
                if let Some(l) = log.take() {
                    l.finish();
                }
                let files = match parser.take() {
                    Some(p) if success => p.finish(&declared),
                    _ => Ok(Vec::new()),
                };
                let _ = tx.send(TaskEnd {
                    task: t,
                    success,
                    detail,
                    lost,
                    files,
                });
            }
        });
        let x = self.exec.start(&launch, sink)?;
        let mut tasks = self.x.tasks.lock().unwrap_or_else(|p| p.into_inner());
        if self.x.cancelled.load(Ordering::SeqCst) {
            x.cancel();
        }
        tasks.insert(t, x);
        Ok(())
    }
}

impl DagExecution {
    fn cancel_tasks(&self) {
        for x in self
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            x.cancel();
        }
    }
}
