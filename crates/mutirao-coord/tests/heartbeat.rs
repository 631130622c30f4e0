//! An agent's heartbeat thread against a coordinator serving on loopback: it registers at
//! once, reports again every interval the coordinator asks for, refuses to start with a wrong
//! token, and stops when dropped.

use mutirao_coord::api::{serve, Coordinator};
use mutirao_coord::auth::{Kind, Tokens};
use mutirao_coord::client::Client;
use mutirao_coord::report::{measure, spawn_heartbeat};
use mutirao_coord::{Repo, SqliteStore, Store};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
fn an_agent_registers_heartbeats_and_stops() {
    let dir = std::env::temp_dir().join(format!("mutirao-hb-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut tokens = Tokens::new();
    tokens
        .add(Kind::Agent, "n1", "n1-agent-token-0123456")
        .unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.join("c.sqlite")).unwrap());
    let c = Coordinator::with_heartbeat(
        store.clone(),
        tokens,
        Repo::open(&dir.join("repo"), 100).unwrap(),
        Duration::from_millis(100),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = rt.spawn(serve(listener, c, async {
        let _ = rx.await;
    }));

    let bad = Client::new(&url, "not-the-agent-token-xx").unwrap();
    let e = spawn_heartbeat(
        bad,
        Box::new(|| measure("n1", "127.0.0.1:7207", &Default::default())),
    )
    .err()
    .expect("a wrong token is refused at once")
    .to_string();
    assert!(e.contains("401"), "{e}");

    let beats = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let b2 = beats.clone();
    let hb = spawn_heartbeat(
        Client::new(&url, "n1-agent-token-0123456").unwrap(),
        Box::new(move || {
            b2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            measure("n1", "127.0.0.1:7207", &Default::default())
        }),
    )
    .unwrap();
    let first = store
        .host("n1")
        .unwrap()
        .expect("registered before spawn returns");
    let t0 = Instant::now();
    while beats.load(std::sync::atomic::Ordering::SeqCst) < 4 {
        assert!(t0.elapsed() < Duration::from_secs(10), "no heartbeats");
        std::thread::sleep(Duration::from_millis(20));
    }
    let later = store.host("n1").unwrap().unwrap();
    assert!(later.last_seen_ms > first.last_seen_ms);
    drop(hb);
    let n = beats.load(std::sync::atomic::Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(
        beats.load(std::sync::atomic::Ordering::SeqCst),
        n,
        "beats after drop"
    );
    let _ = tx.send(());
    rt.block_on(server).unwrap().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
