//! The dispatcher over a scripted executor (no processes): a waiting job is placed on an
//! eligible host, its program verified, its output logged and its end recorded; a job no host
//! can take waits with its reasons journalled once; a tampered program fails its job without
//! running; a cancel reaches the execution; a restarted coordinator re-queues orphans.

use mutirao_coord::api::Coordinator;
use mutirao_coord::auth::Tokens;
use mutirao_coord::exec::{Dispatcher, EventSink, ExecEvent, Execution, Executor, Launch};
use mutirao_coord::policy::OwnerState;
use mutirao_coord::{HostReport, JobState, NewJob, Repo, SqliteStore};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Default)]
struct Script {
    launches: Mutex<Vec<Launch>>,
    cancelled: Arc<AtomicBool>,
    finish: bool,
}

struct Handle(Arc<AtomicBool>);
impl Execution for Handle {
    fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

impl Executor for Script {
    fn start(
        &self,
        l: &Launch,
        mut events: EventSink,
    ) -> mutirao_coord::Result<Box<dyn Execution>> {
        assert_eq!(std::fs::read(&l.program).unwrap(), b"prog");
        self.launches.lock().unwrap().push(l.clone());
        let finish = self.finish;
        std::thread::spawn(move || {
            events(ExecEvent::Output(b"[0] hello\n".to_vec()));
            if finish {
                events(ExecEvent::Exited {
                    success: true,
                    detail: "exit 0".into(),
                });
            }
        });
        Ok(Box::new(Handle(self.cancelled.clone())))
    }
}

fn setup(
    tag: &str,
    finish: bool,
) -> (
    Arc<Coordinator>,
    Arc<Script>,
    Arc<Dispatcher>,
    std::path::PathBuf,
) {
    let dir = std::env::temp_dir().join(format!("mutirao-exec-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let c = Coordinator::new(
        Arc::new(SqliteStore::open_in_memory().unwrap()),
        Tokens::new(),
        Repo::open(&dir.join("repo"), 1000).unwrap(),
    );
    let s = Arc::new(Script {
        finish,
        ..Script::default()
    });
    let d = Dispatcher::install(c.clone(), s.clone(), &dir.join("jobs")).unwrap();
    (c, s, d, dir)
}

fn host(c: &Coordinator, name: &str, idle: f64, owner: bool) {
    c.store()
        .report_host(&HostReport {
            name: name.into(),
            addr: "127.0.0.1:7207".into(),
            idle_cpu: idle,
            free_mem_mib: 100,
            load: 0.0,
            owner_active: owner,
            ..Default::default()
        })
        .unwrap();
}

fn submit(c: &Coordinator, ranks: u32, require: &str) -> i64 {
    let program = c.repo().put(b"prog").unwrap();
    c.store()
        .create_job(&NewJob {
            owner: "ana".into(),
            ranks,
            program,
            args: vec![],
            require: Some(require.into()),
            checkpoint_interval_s: None,
            dag: false,
            env: Default::default(),
        })
        .unwrap()
        .id
}

fn wait(c: &Coordinator, id: i64, want: JobState) {
    let t0 = Instant::now();
    while c.store().job(id).unwrap().state != want {
        assert!(t0.elapsed() < Duration::from_secs(10), "not {want}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_waiting_job_is_placed_run_logged_and_finished() {
    let (c, s, d, dir) = setup("run", true);
    host(&c, "n1", 2.0, false);
    host(&c, "n2", 8.0, true);
    let id = submit(&c, 3, "cpu>=1");
    assert_eq!(d.place_waiting().unwrap(), 1);
    wait(&c, id, JobState::Finished);
    let l = s.launches.lock().unwrap()[0].clone();
    assert_eq!(l.hosts.len(), 1);
    assert_eq!((l.hosts[0].name.as_str(), l.hosts[0].ranks), ("n1", 3));
    assert_eq!(c.store().read_log(id, 0, 100).unwrap().data, b"[0] hello\n");
    let story: Vec<String> = c
        .store()
        .events(id)
        .unwrap()
        .into_iter()
        .map(|e| format!("{} {}", e.kind, e.detail))
        .collect();
    assert_eq!(
        story[1],
        format!(
            "placement 3 ranks on n1×3 (hosts likely to stay idle first, then idle cores; program {} verified)",
            l.job.spec.program
        )
    );
    assert_eq!(story[2], "order eligible hosts in order of preference: n1 (stays idle 0.25) (stays idle: probability of the owner staying away 2 h, from the usage history)");
    assert_eq!(story[3], "refused n2: its owner is active");
    // The run agents label its ranks with (a restarted coordinator asks them about it).
    assert_eq!(story[4], "run run 1: 3 ranks on n1×3");
    assert_eq!(l.run, 1);
    assert!(
        story[5].starts_with("start placed in ")
            && story[5].contains(" ms, program read and checked in "),
        "{}",
        story[5]
    );
    assert_eq!(story[6], "state started on n1");
    assert_eq!(story[7], "state exit 0");
    assert_eq!(d.running(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_job_no_host_can_take_waits_and_says_why_once() {
    let (c, s, d, dir) = setup("wait", true);
    let id = submit(&c, 2, "cpu>=4");
    host(&c, "n1", 2.0, false);
    for _ in 0..3 {
        assert_eq!(d.place_waiting().unwrap(), 0);
    }
    let ev = c.store().events(id).unwrap();
    assert_eq!(ev.len(), 2, "{ev:#?}");
    assert_eq!(
        ev[1].detail,
        "no eligible host (n1: cpu is 2, not >=4); waiting"
    );
    assert!(s.launches.lock().unwrap().is_empty());
    host(&c, "n2", 4.0, false);
    assert_eq!(d.place_waiting().unwrap(), 1);
    wait(&c, id, JobState::Finished);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_tampered_program_fails_its_job_and_never_runs() {
    let (c, s, d, dir) = setup("tamper", true);
    host(&c, "n1", 2.0, false);
    let id = submit(&c, 1, "");
    let digest = c.store().job(id).unwrap().spec.program;
    std::fs::write(dir.join("repo").join(&digest["sha256:".len()..]), b"evil").unwrap();
    d.place_waiting().unwrap();
    let j = c.store().job(id).unwrap();
    assert_eq!(j.state, JobState::Failed);
    let last = c.store().events(id).unwrap().pop().unwrap().detail;
    assert!(last.contains("altered or corrupted"), "{last}");
    assert!(s.launches.lock().unwrap().is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cancel_reaches_the_execution_and_a_restart_requeues_orphans() {
    let (c, s, d, dir) = setup("cancel", false);
    host(&c, "n1", 2.0, false);
    let a = submit(&c, 1, "");
    let b = submit(&c, 1, "");
    d.place_waiting().unwrap();
    assert_eq!(d.running(), 2);
    let j = c
        .transition(a, JobState::Cancelled, "cancelled by ana")
        .unwrap();
    use mutirao_coord::api::JobHook;
    d.cancelled(&c, &j);
    assert!(s.cancelled.load(Ordering::SeqCst));
    assert_eq!(d.running(), 1);
    // A new coordinator over the same store: b was running under the old one.
    let c2 = Coordinator::new(c.store().clone(), Tokens::new(), c.repo().clone());
    let d2 =
        Dispatcher::install(c2.clone(), Arc::new(Script::default()), &dir.join("jobs")).unwrap();
    assert_eq!(d2.reconcile_orphans().unwrap(), 1);
    // n1's agent reports after the restart, remembering no rank of b's run: re-queued.
    host(&c2, "n1", 2.0, false);
    wait(&c, b, JobState::Waiting);
    assert_eq!(c.store().job(a).unwrap().state, JobState::Cancelled);
    let story: Vec<String> = c
        .store()
        .events(b)
        .unwrap()
        .into_iter()
        .map(|e| e.detail)
        .collect();
    let n = story.len();
    assert_eq!(
        story[n - 2],
        "no agent of n1 remembers a rank of run 1 (they keep exits for an hour)",
        "{story:#?}"
    );
    assert!(
        story[n - 1].starts_with("re-queued after the coordinator's restart"),
        "{story:#?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// An executor whose runs end only when cancelled (then with `Exited`, as the launch
/// library's do).
#[derive(Default)]
struct UntilCancelled {
    launches: Mutex<Vec<Launch>>,
}

struct Ender(Mutex<Option<EventSink>>);
impl Execution for Ender {
    fn cancel(&self) {
        if let Some(mut ev) = self.0.lock().unwrap().take() {
            ev(ExecEvent::Exited {
                success: false,
                detail: "cancelled".into(),
            });
        }
    }
}

impl Executor for UntilCancelled {
    fn start(&self, l: &Launch, events: EventSink) -> mutirao_coord::Result<Box<dyn Execution>> {
        self.launches.lock().unwrap().push(l.clone());
        Ok(Box::new(Ender(Mutex::new(Some(events)))))
    }
}

fn owner(c: &Coordinator, name: &str, state: OwnerState) {
    c.store()
        .report_host(&HostReport {
            name: name.into(),
            addr: "127.0.0.1:7207".into(),
            idle_cpu: 4.0,
            free_mem_mib: 100,
            owner_active: state != OwnerState::Available,
            owner: state,
            owner_why: if state == OwnerState::Available {
                String::new()
            } else {
                "/tmp/owner-here exists".into()
            },
            ..Default::default()
        })
        .unwrap();
}

fn story(c: &Coordinator, id: i64) -> Vec<String> {
    c.store()
        .events(id)
        .unwrap()
        .into_iter()
        .map(|e| format!("{} {}", e.kind, e.detail))
        .collect()
}

/// A coordinator (in-memory store, repository in a fresh scratch directory `tag`) and a
/// dispatcher running jobs with `x`.
fn with_executor(
    tag: &str,
    x: Arc<dyn Executor>,
) -> (Arc<Coordinator>, Arc<Dispatcher>, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("mutirao-exec-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let c = Coordinator::new(
        Arc::new(SqliteStore::open_in_memory().unwrap()),
        Tokens::new(),
        Repo::open(&dir.join("repo"), 1000).unwrap(),
    );
    let d = Dispatcher::install(c.clone(), x, &dir.join("jobs")).unwrap();
    (c, d, dir)
}

#[test]
fn an_owner_suspends_resumes_and_vacates_a_job_which_is_placed_again_elsewhere() {
    let x = Arc::new(UntilCancelled::default());
    let (c, d, dir) = with_executor("owner", x.clone());
    owner(&c, "n1", OwnerState::Available);
    let id = submit(&c, 2, "");
    let ck = c
        .store()
        .create_job(&NewJob {
            owner: "ana".into(),
            ranks: 2,
            program: c.repo().put(b"prog").unwrap(),
            args: vec![],
            require: None,
            checkpoint_interval_s: Some(1.0),
            dag: false,
            env: Default::default(),
        })
        .unwrap()
        .id;
    assert_eq!(d.place_waiting().unwrap(), 2);
    // The owner comes back: suspended; leaves: running again.
    owner(&c, "n1", OwnerState::Suspend);
    d.watch_owners().unwrap();
    assert_eq!(c.store().job(id).unwrap().state, JobState::Suspended);
    d.watch_owners().unwrap(); // journalled once
    owner(&c, "n1", OwnerState::Available);
    d.watch_owners().unwrap();
    assert_eq!(c.store().job(id).unwrap().state, JobState::Running);
    // Back, and past the grace period: vacated, re-queued; n1 refuses it while its owner stays.
    owner(&c, "n1", OwnerState::Suspend);
    d.watch_owners().unwrap();
    std::fs::create_dir_all(dir.join(format!("jobs/{ck}/ckpt"))).unwrap();
    std::fs::write(dir.join(format!("jobs/{ck}/ckpt/COMMITTED")), "4\n").unwrap();
    owner(&c, "n1", OwnerState::Vacate);
    d.watch_owners().unwrap();
    assert_eq!(c.store().job(id).unwrap().state, JobState::Waiting);
    assert_eq!(c.store().job(ck).unwrap().state, JobState::Waiting);
    assert_eq!(d.running(), 0);
    assert_eq!(d.place_waiting().unwrap(), 0);
    let s = story(&c, id);
    let owner_lines: Vec<&String> = s.iter().filter(|l| l.starts_with("owner ")).collect();
    assert_eq!(owner_lines.len(), 5, "{s:#?}");
    assert!(owner_lines[0].contains("owner active on n1 (/tmp/owner-here exists)"));
    assert!(owner_lines[1].contains("left"), "{s:#?}");
    assert!(owner_lines[3].contains("vacating n1"), "{s:#?}");
    assert!(s.iter().any(|l| l == "state owner active on n1"), "{s:#?}");
    assert!(
        s.iter()
            .any(|l| l == "state resumed: no owner active on its hosts"),
        "{s:#?}"
    );
    assert!(
        s.iter()
            .any(|l| l
                .starts_with("state re-queued after vacating n1; no checkpoints: it starts again")),
        "{s:#?}"
    );
    assert_eq!(
        s.last().unwrap(),
        "refused no eligible host (n1: its owner is active (/tmp/owner-here exists)); waiting"
    );
    let s = story(&c, ck);
    assert!(
        s.iter()
            .any(|l| l == "state vacated n1; resumes from committed epoch 4"),
        "{s:#?}"
    );
    // Another host comes: both are placed there.
    owner(&c, "n2", OwnerState::Available);
    assert_eq!(d.place_waiting().unwrap(), 2);
    let l = x.launches.lock().unwrap();
    assert_eq!(l.len(), 4);
    assert!(l[2..].iter().all(|l| l.hosts[0].name == "n2"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// An executor that hands each run's events to the test.
#[derive(Default)]
struct Handed {
    events: Mutex<Vec<Arc<Mutex<EventSink>>>>,
}

impl Executor for Handed {
    fn start(&self, _: &Launch, events: EventSink) -> mutirao_coord::Result<Box<dyn Execution>> {
        self.events
            .lock()
            .unwrap()
            .push(Arc::new(Mutex::new(events)));
        Ok(Box::new(Handle(Arc::new(AtomicBool::new(false)))))
    }
}

#[test]
fn checkpoint_waves_make_the_job_checkpointing_until_committed_and_an_owner_keeps_it_suspended() {
    let x = Arc::new(Handed::default());
    let (c, d, dir) = with_executor("waves", x.clone());
    owner(&c, "n1", OwnerState::Available);
    let id = submit(&c, 2, "");
    assert_eq!(d.place_waiting().unwrap(), 1);
    let ev = x.events.lock().unwrap()[0].clone();
    let tell = |e: ExecEvent| (ev.lock().unwrap())(e);
    let state = || c.store().job(id).unwrap().state;
    tell(ExecEvent::Wave(1));
    assert_eq!(state(), JobState::Checkpointing);
    tell(ExecEvent::Committed(1));
    assert_eq!(state(), JobState::Running);
    // A wave begun, then the owner comes: suspended; the wave's commit does not resume it.
    tell(ExecEvent::Wave(2));
    owner(&c, "n1", OwnerState::Suspend);
    d.watch_owners().unwrap();
    assert_eq!(state(), JobState::Suspended);
    tell(ExecEvent::Committed(2));
    assert_eq!(state(), JobState::Suspended);
    // Nor does a wave move a suspended job.
    tell(ExecEvent::Wave(3));
    assert_eq!(state(), JobState::Suspended);
    owner(&c, "n1", OwnerState::Available);
    d.watch_owners().unwrap();
    assert_eq!(state(), JobState::Running);
    tell(ExecEvent::Exited {
        success: true,
        detail: "exit 0".into(),
    });
    assert_eq!(state(), JobState::Finished);
    let moves: Vec<String> = story(&c, id)
        .into_iter()
        .filter(|l| l.starts_with("state "))
        .collect();
    assert_eq!(
        moves,
        [
            "state submitted",
            "state started on n1",
            "state wave of epoch 1: the ranks' checkpoints are arriving",
            "state epoch 1 committed",
            "state wave of epoch 2: the ranks' checkpoints are arriving",
            "state owner active on n1",
            "state resumed: no owner active on its hosts",
            "state exit 0",
        ],
        "{moves:#?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn placement_prefers_the_host_whose_agent_s_history_says_it_stays_idle() {
    use mutirao_coord::usage::Keeper;
    let (c, s, d, dir) = setup("usage", true);
    host(&c, "n1", 2.0, false);
    host(&c, "n2", 1.0, false);
    // Without histories, the idler host wins.
    let first = submit(&c, 1, "");
    d.place_waiting().unwrap();
    wait(&c, first, JobState::Finished);
    assert_eq!(s.launches.lock().unwrap()[0].hosts[0].name, "n1");
    // n1's agent: its owner is at work at this hour and the next; n2's owner is away. The
    // hours are the agents' own (each sends its hour of the week).
    let (mut busy, mut away) = (Keeper::default(), Keeper::default());
    for _ in 0..100 {
        for h in [40, 41] {
            busy.sample(h, false);
            away.sample(h, true);
        }
    }
    // A new hour: each sends its whole history, as at registration.
    c.usage().reported("n1", &busy.sample(40, false));
    c.usage().reported("n2", &away.sample(40, true));
    let second = submit(&c, 1, "");
    d.place_waiting().unwrap();
    wait(&c, second, JobState::Finished);
    assert_eq!(s.launches.lock().unwrap()[1].hosts[0].name, "n2");
    let order = c
        .store()
        .events(second)
        .unwrap()
        .into_iter()
        .find(|e| e.kind == "order")
        .unwrap()
        .detail;
    assert!(
        order.starts_with("eligible hosts in order of preference: n2 (stays idle 0.98"),
        "{order}"
    );
    assert!(order.contains("n1 (stays idle 0.00"), "{order}");
    let _ = std::fs::remove_dir_all(&dir);
}
