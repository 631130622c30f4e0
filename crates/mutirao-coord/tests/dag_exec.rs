//! The dispatcher running a task graph over an executor that runs each task's script with the
//! local `sh` (no agents, no sockets): tasks start when their predecessors finished and get
//! their files; an owner suspending the job holds back the tasks that become ready; vacating
//! re-queues the job, which is placed again elsewhere and runs only its unfinished tasks.

use mutirao_coord::api::Coordinator;
use mutirao_coord::auth::Tokens;
use mutirao_coord::exec::{Dispatcher, EventSink, ExecEvent, Execution, Executor, Launch};
use mutirao_coord::policy::OwnerState;
use mutirao_coord::{HostReport, JobState, NewJob, Repo, SqliteStore};
use std::io::BufRead;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Runs a launch's program with `sh`, here; remembers (task script, host) per start.
#[derive(Default)]
struct Sh {
    starts: Mutex<Vec<(String, String)>>,
}

struct Kill(u32);
impl Execution for Kill {
    fn cancel(&self) {
        let _ = std::process::Command::new("kill")
            .arg(self.0.to_string())
            .status();
    }
}

impl Executor for Sh {
    fn start(
        &self,
        l: &Launch,
        mut events: EventSink,
    ) -> mutirao_coord::Result<Box<dyn Execution>> {
        let script = std::fs::read_to_string(&l.program).unwrap();
        self.starts
            .lock()
            .unwrap()
            .push((script, l.hosts[0].name.clone()));
        let mut child = std::process::Command::new("sh")
            .arg(&l.program)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                events(ExecEvent::Output(format!("[0] {line}\n").into_bytes()));
            }
            let st = child.wait().unwrap();
            events(ExecEvent::Exited {
                success: st.success(),
                detail: format!("{st}"),
            });
        });
        Ok(Box::new(Kill(pid)))
    }
}

fn owner(c: &Coordinator, name: &str, o: OwnerState) {
    c.store()
        .report_host(&HostReport {
            name: name.into(),
            addr: "127.0.0.1:7207".into(),
            idle_cpu: 1.0,
            free_mem_mib: 100,
            load: 0.0,
            owner_active: false,
            owner: o,
            ..Default::default()
        })
        .unwrap();
}

fn wait(c: &Coordinator, id: i64, want: JobState) {
    let t0 = Instant::now();
    while c.store().job(id).unwrap().state != want {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "job {id} not {want}: {:#?}",
            c.store().events(id).unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn story(c: &Coordinator, id: i64) -> Vec<String> {
    c.store()
        .events(id)
        .unwrap()
        .into_iter()
        .map(|e| format!("{} {}", e.kind, e.detail))
        .collect()
}

#[test]
fn suspend_holds_back_ready_tasks_and_vacate_reruns_only_the_unfinished_ones_elsewhere() {
    let dir = std::env::temp_dir().join(format!("mutirao-dagexec-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let c = Coordinator::new(
        Arc::new(SqliteStore::open_in_memory().unwrap()),
        Tokens::new(),
        Repo::open(&dir.join("repo"), 1 << 20).unwrap(),
    );
    let x = Arc::new(Sh::default());
    let d = Dispatcher::install(c.clone(), x.clone(), &dir.join("jobs")).unwrap();
    owner(&c, "n1", OwnerState::Available);
    let gate = dir.join("gate");
    let graph = format!(
        r#"{{ "format": "mutirao-taskgraph/1", "tasks": [
            {{ "id": "a", "work": 1, "cmd": ["sh", "-c", "echo 5 > n"], "outputs": ["n"] }},
            {{ "id": "b", "work": 1, "cmd": ["sh", "-c", "echo b up; while [ ! -e {g} ]; do sleep 0.05; done; echo $(( $(cat n) * 3 )) > m"], "outputs": ["m"] }},
            {{ "id": "c", "work": 1, "cmd": ["sh", "-c", "echo c has $(cat m)"] }} ],
          "edges": [ {{ "from": "a", "to": "b", "bytes": 8, "files": ["n"] }},
                     {{ "from": "b", "to": "c", "bytes": 8, "files": ["m"] }} ] }}"#,
        g = gate.display()
    );
    let id = c
        .store()
        .create_job(&NewJob {
            owner: "ana".into(),
            ranks: 3,
            program: c.repo().put(graph.as_bytes()).unwrap(),
            args: vec!["round-robin".into()],
            require: None,
            checkpoint_interval_s: None,
            dag: true,
            env: Default::default(),
        })
        .unwrap()
        .id;
    assert_eq!(d.place_waiting().unwrap(), 1);
    // a finishes; b waits for the gate.
    let t0 = Instant::now();
    while !String::from_utf8_lossy(&c.store().read_log(id, 0, 1 << 20).unwrap().data)
        .contains("[b] b up")
    {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "{:#?}",
            story(&c, id)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The owner of n1 comes back: the job is suspended; b ends meanwhile, c must not start.
    owner(&c, "n1", OwnerState::Suspend);
    d.watch_owners().unwrap();
    assert_eq!(c.store().job(id).unwrap().state, JobState::Suspended);
    std::fs::write(&gate, "").unwrap();
    let t0 = Instant::now();
    while !story(&c, id)
        .iter()
        .any(|l| l.starts_with("task-done {\"task\":\"b\""))
    {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "{:#?}",
            story(&c, id)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(
        x.starts.lock().unwrap().len(),
        2,
        "c started while suspended"
    );
    // Vacated: re-queued; placed again on n2 it runs c only, with b's output.
    owner(&c, "n1", OwnerState::Vacate);
    d.watch_owners().unwrap();
    wait(&c, id, JobState::Waiting);
    owner(&c, "n2", OwnerState::Available);
    assert_eq!(d.place_waiting().unwrap(), 1);
    wait(&c, id, JobState::Finished);
    let s = story(&c, id);
    assert!(
        s.iter()
            .any(|l| l.starts_with("resume tasks a, b finished in an earlier run")),
        "{s:#?}"
    );
    let starts = x.starts.lock().unwrap();
    assert_eq!(starts.len(), 3, "{s:#?}");
    assert_eq!(starts[2].1, "n2");
    let log =
        String::from_utf8_lossy(&c.store().read_log(id, 0, 1 << 20).unwrap().data).into_owned();
    assert!(log.contains("[c] c has 15"), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}
