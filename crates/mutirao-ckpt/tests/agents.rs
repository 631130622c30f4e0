//! The hostfile default end to end: a job's checkpoints kept by `RepoSink` over `Replicated`
//! (k = 2) over `RemoteStore`s talking to three in-process agents on loopback TCP; one agent is
//! killed and a replica corrupted, and the committed epoch is still restored, from good replicas.

use mutirao::pmi::CheckpointSink;
use mutirao_ckpt::remote::{serve, ReadWrite, RemoteStore};
use mutirao_ckpt::replicated::{Peer, Replicated};
use mutirao_ckpt::repo::{parse_rank_key, CheckpointRepo, RepoSink};
use mutirao_ckpt::{BlobStore, DirStore};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// An agent serving a directory store on a loopback port until killed.
struct Agent {
    addr: SocketAddr,
    dead: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    thread: Option<std::thread::JoinHandle<()>>,
    store: Arc<DirStore>,
    _dir: tempfile::TempDir,
}

impl Agent {
    fn start() -> Agent {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(DirStore::open(dir.path()).unwrap());
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let dead = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(Mutex::new(Vec::new()));
        let (d, c, s) = (dead.clone(), conns.clone(), store.clone());
        let thread = std::thread::spawn(move || {
            for conn in l.incoming() {
                if d.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                c.lock().unwrap().push(conn.try_clone().unwrap());
                let s = s.clone();
                std::thread::spawn(move || {
                    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
                    let _ = serve(conn, &*s);
                });
            }
        });
        Agent {
            addr,
            dead,
            conns,
            thread: Some(thread),
            store,
            _dir: dir,
        }
    }

    /// Stops accepting and breaks every open connection (as if the host went away).
    fn kill(&mut self) {
        self.dead.store(true, Ordering::SeqCst);
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
        let _ = TcpStream::connect(self.addr); // wake the accept loop
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
    }
}

fn remote(host: &str, addr: SocketAddr) -> Peer {
    let connect = move || {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.set_write_timeout(Some(Duration::from_secs(5)))?;
        Ok(Box::new(s) as Box<dyn ReadWrite + Send>)
    };
    (
        host.to_string(),
        Arc::new(RemoteStore::new(format!("agent {host}"), connect)) as Arc<dyn BlobStore>,
    )
}

#[test]
fn replicated_checkpoints_on_agents_survive_a_lost_agent_and_a_corrupt_replica() {
    let hosts = ["h0", "h1", "h2"];
    let mut agents: Vec<Agent> = hosts.iter().map(|_| Agent::start()).collect();
    let peers: Vec<Peer> = hosts
        .iter()
        .zip(&agents)
        .map(|(h, a)| remote(h, a.addr))
        .collect();
    // Rank r runs on host h<r>: its replicas must go to the two other hosts.
    let producer = Arc::new(|key: &str| parse_rank_key(key).map(|(_, _, r)| format!("h{r}")));
    let store = Replicated::new(peers, 2).unwrap().with_producer(producer);
    let sink = RepoSink::new(CheckpointRepo::new(store, "job").unwrap(), 3);

    for epoch in 1..=2u64 {
        for rank in 0..3u32 {
            sink.put(epoch, rank, format!("rank {rank} epoch {epoch}").as_bytes())
                .unwrap();
        }
        sink.commit(epoch).unwrap();
    }
    assert_eq!(sink.last_committed().unwrap(), Some(2));
    // Placement: no replica on its producer's host, two elsewhere; epoch 1 collected.
    for (i, a) in agents.iter().enumerate() {
        let keys = a.store.list("jobs/job/").unwrap();
        assert!(
            !keys.contains(&format!("jobs/job/2/{i}.ckpt")),
            "h{i}: {keys:?}"
        );
        assert!(
            !keys.iter().any(|k| k.starts_with("jobs/job/1/")),
            "{keys:?}"
        );
    }
    for r in 0..3 {
        let holders = agents
            .iter()
            .filter(|a| {
                a.store
                    .get(&format!("jobs/job/2/{r}.ckpt"))
                    .unwrap()
                    .is_some()
            })
            .count();
        assert_eq!(holders, 2, "rank {r}");
    }

    // Host h2 is lost, and h1's replica of rank 0 is corrupted on disk.
    agents[2].kill();
    let key0 = "jobs/job/2/0.ckpt";
    let mut bad = agents[1].store.get(key0).unwrap().unwrap();
    let n = bad.len();
    bad[n - 1] ^= 0xff;
    agents[1].store.put(key0, &bad).unwrap();

    // Ranks 1 and 2 still have one good replica each (h0, and h0 or h1).
    for r in 1..3u32 {
        assert_eq!(
            sink.get(2, r).unwrap(),
            format!("rank {r} epoch 2").as_bytes()
        );
    }
    // Rank 0's replicas were on h1 (corrupt) and h2 (gone): an error naming both, no data.
    let e = sink.get(2, 0).unwrap_err();
    assert!(e.contains("h1: corrupt"), "{e}");
    assert!(
        e.contains("h2: unreachable") && e.contains("agent h2"),
        "{e}"
    );
    // Rank 1's replicas are on h0 and h2 (not its own h1): served by h0, h2 reported if asked.
    let (data, report) = sink
        .repo()
        .store()
        .get_with_report("jobs/job/2/1.ckpt")
        .unwrap();
    // The replica's data is the repository's blob: header, then the rank's bytes.
    assert!(data.unwrap().ends_with(b"rank 1 epoch 2"));
    assert_eq!(report.served_by.as_deref(), Some("h0"));
    assert!(
        report.corrupt.is_empty() && report.missing.is_empty(),
        "{report:?}"
    );
    assert!(
        report.unreachable.iter().all(|(h, _)| h == "h2"),
        "{report:?}"
    );
}
