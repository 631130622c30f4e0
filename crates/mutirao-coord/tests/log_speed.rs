//! Issue 29: a job printing 5000 lines through the coordinator (placed, run through an agent
//! on this machine, its output stored in a SQLite file with `synchronous=FULL`) takes at most
//! twice the same run through the same agent without a coordinator (`mutirao run`'s launcher),
//! plus a small constant, and its log holds every line in order. Alone in its test binary: no
//! other test competes for the two cores while it is timed.

use mutirao_coord::api::Coordinator;
use mutirao_coord::auth::Tokens;
use mutirao_coord::exec::{Dispatcher, LaunchExecutor};
use mutirao_coord::{HostReport, JobState, NewJob, Repo, SqliteStore, Store};
use mutirao_launch::agent::{AgentConfig, Procs};
use mutirao_launch::hostfile::HostEntry;
use mutirao_launch::job::{Job, JobSpec};
use mutirao_launch::supervise::{supervise, Report, Watch};
use std::sync::Arc;
use std::time::{Duration, Instant};

const LINES: usize = 5000;
const SCRIPT: &str = "#!/bin/sh\ni=0; while [ $i -lt 5000 ]; do echo line $i; i=$((i+1)); done\n";

/// An agent in this process on loopback, knowing `secret`; its port.
fn start_agent(secret: &[u8]) -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let cfg = AgentConfig {
        secret: Arc::new(secret.to_vec()),
        dir_socket: None,
        log: Arc::new(|_| {}),
        store: None,
        procs: Procs::default(),
        programs: None,
        journal: None,
        sandbox: Arc::new(
            mutirao_launch::sandbox::Sandbox::new(
                mutirao_launch::sandbox::RunAs::Agent,
                &std::env::temp_dir().join(format!("mutirao-logspeed-jobs-{}", std::process::id())),
            )
            .unwrap(),
        ),
        limits: Default::default(),
    };
    std::thread::spawn(move || mutirao_launch::agent::serve_forever(l, cfg));
    port
}

/// The script run through the agent by the launcher alone: its time and its output lines.
fn bare_run(program: &std::path::Path, port: u16, secret: &[u8]) -> (Duration, usize) {
    let mut spec = JobSpec::local(1, program.display().to_string(), Vec::new());
    spec.hosts = Some(vec![HostEntry {
        host: "127.0.0.1".into(),
        slots: 1,
        port,
    }]);
    spec.secret = Some(secret.to_vec());
    let t0 = Instant::now();
    let job = Job::start(&spec).unwrap();
    let mut lines = 0;
    let e = supervise(&job, 1, &Watch::default(), &mut |r| {
        if let Report::Output { .. } = r {
            lines += 1;
        }
    });
    assert_eq!(e.code, 0);
    (t0.elapsed(), lines)
}

/// ana's job of one rank of `program`.
fn one_rank(program: &str) -> NewJob {
    NewJob {
        owner: "ana".into(),
        ranks: 1,
        program: program.into(),
        args: Vec::new(),
        require: None,
        checkpoint_interval_s: None,
        dag: false,
        env: Default::default(),
    }
}

#[test]
fn a_5000_line_job_through_the_coordinator_takes_at_most_twice_the_bare_run_and_keeps_every_line_even_one_of_1_mib(
) {
    let dir = std::env::temp_dir().join(format!("mutirao-logspeed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let secret = b"log-speed-agent-secret-0123456789".to_vec();
    let token_file = dir.join("agent.token");
    std::fs::write(&token_file, &secret).unwrap();
    let port = start_agent(&secret);
    let program = dir.join("lines.sh");
    std::fs::write(&program, SCRIPT).unwrap();
    std::fs::set_permissions(
        &program,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();

    // A file on disk, fsynced as the coordinator keeps it: the cost of a store change is real.
    let store = Arc::new(SqliteStore::open(&dir.join("coord.sqlite")).unwrap());
    let c = Coordinator::new(
        store.clone(),
        Tokens::new(),
        Repo::open(&dir.join("repo"), 1 << 20).unwrap(),
    );
    let d = Dispatcher::install(
        c.clone(),
        Arc::new(LaunchExecutor {
            agent_token_file: token_file,
        }),
        &dir.join("jobs"),
    )
    .unwrap();
    let agent_host = HostReport {
        name: "n1".into(),
        addr: format!("127.0.0.1:{port}"),
        idle_cpu: 2.0,
        free_mem_mib: 1000,
        load: 0.0,
        owner_active: false,
        ..Default::default()
    };
    let digest = c.repo().put(SCRIPT.as_bytes()).unwrap();

    // Warm the agent, the shell and the disk cache once each way.
    bare_run(&program, port, &secret);
    let mut bare = Vec::new();
    let mut coord = Vec::new();
    for _ in 0..2 {
        let (t, lines) = bare_run(&program, port, &secret);
        assert_eq!(lines, LINES);
        bare.push(t);
        // The agent's report, fresh (a host silent for three heartbeats is not placed on).
        store.report_host(&agent_host).unwrap();
        let t0 = Instant::now();
        let id = store.create_job(&one_rank(&digest)).unwrap().id;
        assert_eq!(d.place_waiting().unwrap(), 1);
        loop {
            let s = store.job(id).unwrap().state;
            if s.is_final() {
                assert_eq!(s, JobState::Finished, "{:#?}", store.events(id).unwrap());
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "job {id} still {s}"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        coord.push(t0.elapsed());
        let log = store.read_log(id, 0, 1 << 20).unwrap();
        let text = String::from_utf8(log.data).unwrap();
        let want: String = (0..LINES).map(|i| format!("[0] line {i}\n")).collect();
        assert!(
            text == want,
            "the log is not the 5000 lines in order: {} bytes, {} lines",
            text.len(),
            text.lines().count()
        );
    }
    let t_sh = Instant::now();
    let o = std::process::Command::new(&program).output().unwrap();
    assert_eq!(o.stdout.iter().filter(|b| **b == b'\n').count(), LINES);
    let sh = t_sh.elapsed();
    let (bare, coord) = (*bare.iter().min().unwrap(), *coord.iter().min().unwrap());
    eprintln!(
        "5000 lines: through the coordinator {:.3} s, through the agent alone {:.3} s, the shell alone {:.3} s",
        coord.as_secs_f64(),
        bare.as_secs_f64(),
        sh.as_secs_f64()
    );
    assert!(
        coord <= bare * 2 + Duration::from_millis(500),
        "through the coordinator {coord:?} against {bare:?} through the agent alone"
    );

    // A line of 1 MiB is kept, every byte of it, as pieces of at most 64 KiB (the agent sends
    // long lines in pieces), and the job finishes on its host.
    let long = c
        .repo()
        .put(b"#!/bin/sh\nhead -c 1048576 /dev/zero | tr '\\0' x; echo; echo after\n")
        .unwrap();
    store.report_host(&agent_host).unwrap();
    let id = store.create_job(&one_rank(&long)).unwrap().id;
    assert_eq!(d.place_waiting().unwrap(), 1);
    let t0 = Instant::now();
    while !store.job(id).unwrap().state.is_final() {
        assert!(t0.elapsed() < Duration::from_secs(60), "still running");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        store.job(id).unwrap().state,
        JobState::Finished,
        "{:#?}",
        store.events(id).unwrap()
    );
    let log = store.read_log(id, 0, 4 << 20).unwrap().data;
    let piece = format!("[0] {}\n", "x".repeat(64 << 10));
    let want = format!("{}[0] after\n", piece.repeat(16));
    assert!(
        log == want.as_bytes(),
        "{} bytes, not the long line and the next",
        log.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
