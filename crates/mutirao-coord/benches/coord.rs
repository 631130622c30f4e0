//! The coordinator's figures (issue 14): `jobs` answered with 10⁴ jobs in the database
//! (target < 50 ms), and heartbeats of 1000 simulated agents every 5 s (target < 10% of a
//! core), over real loopback HTTP with a file database (SQLite; PostgreSQL too when
//! MUTIRAO_BENCH_PG names a connection string).
//!
//!     cargo bench -p mutirao-coord --bench coord
//!
//! The server runs on its own runtime whose threads are named `coord-srv`; its CPU time is
//! read from /proc/self/task/*/stat for those threads only (the simulated agents' threads are
//! not counted).

use mutirao_coord::api::{serve, Coordinator};
use mutirao_coord::auth::{Kind, Tokens};
use mutirao_coord::client::Client;
use mutirao_coord::{HostReport, NewJob, PgStore, Repo, SqliteStore, Store};
use std::sync::Arc;
use std::time::{Duration, Instant};

const AGENTS: usize = 1000;
const JOBS: usize = 10_000;
const PERIOD: Duration = Duration::from_secs(5);
const ROUNDS: u32 = 2;

fn server_cpu_s() -> f64 {
    let tick = 100.0; // USER_HZ on Linux
    let mut total = 0.0;
    for e in std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
    {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let Some((head, rest)) = stat.rsplit_once(") ") else {
            continue;
        };
        if !head.ends_with("(coord-srv") {
            continue;
        }
        let f: Vec<&str> = rest.split_whitespace().collect();
        // After "pid (comm) ": state is field 0, utime 11, stime 12.
        let ut: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0);
        let st: f64 = f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
        total += (ut + st) / tick;
    }
    total
}

fn report(i: usize) -> HostReport {
    HostReport {
        name: format!("h{i:04}"),
        addr: format!("127.0.0.1:{}", 10_000 + i),
        idle_cpu: 1.0 + (i % 4) as f64,
        free_mem_mib: 4096,
        load: 0.25,
        owner_active: i % 17 == 0,
        // What a busy agent's heartbeat carries besides: its rank journal (one job, two ranks
        // alive, one exit) and this hour's usage bucket.
        jobs: vec![mutirao_launch::journal::JobRanks {
            job: i as i64,
            run: 1,
            alive: vec![0, 1],
            exits: vec![mutirao_launch::journal::RankExit {
                rank: 2,
                code: Some(0),
                ended_ms: 1_764_000_000_000,
                ..Default::default()
            }],
        }],
        usage: Some(mutirao_coord::usage::UsageReport {
            hour: 10,
            now: mutirao_coord::usage::Bucket {
                samples: 120.0,
                idle: 90.0,
            },
            history: Vec::new(),
        }),
        ..Default::default()
    }
}

fn bench(label: &str, store: Arc<dyn Store>, dir: &std::path::Path) {
    let mut tokens = Tokens::new();
    tokens
        .add(Kind::User, "bia", "bia-token-0123456789")
        .unwrap();
    tokens
        .add(Kind::User, "ana", "ana-token-0123456789")
        .unwrap();
    for i in 0..AGENTS {
        tokens
            .add(
                Kind::Agent,
                &format!("h{i:04}"),
                &format!("agent-token-{i:08}-xyz"),
            )
            .unwrap();
    }
    let c = Coordinator::new(
        store.clone(),
        tokens,
        Repo::open(&dir.join("repo"), 1 << 20).unwrap(),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("coord-srv")
        .thread_keep_alive(Duration::from_secs(600))
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = rt.spawn(serve(listener, c.clone(), async {
        let _ = stop_rx.await;
    }));

    // 10⁴ jobs, all ana's (the worst case for her `jobs`).
    let t0 = Instant::now();
    for i in 0..JOBS {
        store
            .create_job(&NewJob {
                owner: "ana".into(),
                ranks: 8,
                program: format!("sha256:{:064x}", i),
                args: vec!["2000".into()],
                require: Some("cpu>=1".into()),
                checkpoint_interval_s: None,
                dag: false,
                env: Default::default(),
            })
            .unwrap();
    }
    // bia has 100 jobs among them (a typical user of a busy grid).
    for _ in 0..100 {
        store
            .create_job(&NewJob {
                owner: "bia".into(),
                ranks: 4,
                program: format!("sha256:{:064x}", 7),
                args: vec![],
                require: None,
                checkpoint_interval_s: None,
                dag: false,
                env: Default::default(),
            })
            .unwrap();
    }
    eprintln!(
        "{label}: {} jobs stored in {:.1} s",
        JOBS + 100,
        t0.elapsed().as_secs_f64()
    );
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[v.len() - 1])
    };
    let (mut st, mut ser) = (Vec::new(), Vec::new());
    for _ in 0..11 {
        let t = Instant::now();
        let jobs = store.jobs(Some("ana")).unwrap();
        st.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let bytes = serde_json::to_vec(&jobs).unwrap();
        ser.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(bytes.len() > JOBS);
    }
    println!(
        "{label}: ana's {JOBS} jobs: the store's query {:.1} ms, JSON encoding {:.1} ms (medians)",
        median(st).0,
        median(ser).0
    );
    let ana = Client::new(&url, "ana-token-0123456789").unwrap();
    let mut times = Vec::new();
    for _ in 0..21 {
        let t = Instant::now();
        assert_eq!(ana.jobs_newest(100).unwrap().len(), 100);
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let (m, x) = median(times);
    println!("{label}: GET /jobs?limit=100 (what `mutirao jobs` asks) of a user owning {JOBS} jobs: median {m:.1} ms, max {x:.1} ms");
    let bia = Client::new(&url, "bia-token-0123456789").unwrap();
    let mut times = Vec::new();
    for _ in 0..21 {
        let t = Instant::now();
        assert_eq!(bia.jobs().unwrap().len(), 100);
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let (m, x) = median(times);
    println!(
        "{label}: GET /jobs of a user with 100 of the {} jobs: median {m:.1} ms, max {x:.1} ms",
        JOBS + 100
    );
    let ana = Client::new(&url, "ana-token-0123456789").unwrap();
    let mut times = Vec::new();
    for _ in 0..21 {
        let t = Instant::now();
        let n = ana.jobs().unwrap().len();
        times.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(n, JOBS);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "{label}: GET /jobs of a user owning {JOBS} jobs (client's decoding included): median {:.1} ms, max {:.1} ms (target < 50 ms)",
        times[times.len() / 2],
        times[times.len() - 1]
    );

    // 1000 agents register, then heartbeat every 5 s, spread evenly over the period.
    let threads = 8;
    let per = AGENTS / threads;
    std::thread::scope(|s| {
        for t in 0..threads {
            let url = url.clone();
            s.spawn(move || {
                for i in t * per..(t + 1) * per {
                    Client::new(&url, &format!("agent-token-{i:08}-xyz"))
                        .unwrap()
                        .register(&report(i))
                        .unwrap();
                }
            });
        }
    });
    // The store's part of a heartbeat, alone on this thread.
    let t = Instant::now();
    for i in 0..2000 {
        assert!(store.heartbeat_host(&report(i % AGENTS)).unwrap().is_some());
    }
    println!(
        "{label}: Store::heartbeat_host alone: {:.0} µs each (wall, this thread)",
        t.elapsed().as_secs_f64() * 1e6 / 2000.0
    );
    let cpu0 = server_cpu_s();
    let t0 = Instant::now();
    let sent = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (url, sent) = (url.clone(), &sent);
            s.spawn(move || {
                let clients: Vec<Client> = (t * per..(t + 1) * per)
                    .map(|i| Client::new(&url, &format!("agent-token-{i:08}-xyz")).unwrap())
                    .collect();
                for round in 0..ROUNDS {
                    for (k, cl) in clients.iter().enumerate() {
                        // Agent i beats at i/AGENTS of the period.
                        let i = t * per + k;
                        let due = PERIOD * round + PERIOD.mul_f64(i as f64 / AGENTS as f64);
                        if let Some(w) = due.checked_sub(t0.elapsed()) {
                            std::thread::sleep(w);
                        }
                        cl.heartbeat(&report(i)).unwrap();
                        sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let wall = t0.elapsed().as_secs_f64();
    let cpu = server_cpu_s() - cpu0;
    println!(
        "{label}: {} heartbeats from {AGENTS} agents in {wall:.1} s: coordinator CPU {cpu:.2} s = {:.1}% of a core (target < 10%)",
        sent.into_inner(),
        100.0 * cpu / wall
    );
    let _ = stop_tx.send(());
    let _ = rt.block_on(server);
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` lists; nothing to list.
    }
    let dir = std::env::temp_dir().join(format!("mutirao-coord-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sqlite = Arc::new(SqliteStore::open(&dir.join("coord.sqlite")).unwrap());
    bench("sqlite", sqlite, &dir);
    if let Ok(url) = std::env::var("MUTIRAO_BENCH_PG") {
        bench("postgres", Arc::new(PgStore::connect(&url).unwrap()), &dir);
    } else {
        eprintln!(
            "postgres: skipped (set MUTIRAO_BENCH_PG to a connection string of an empty database)"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
