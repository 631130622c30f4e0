//! Grid-scope query latency across 8 directory servers on loopback, and the aggregate
//! global-lookup rate with 4 vs 8 servers (digest 002 §7.8 check 9).
//!
//! `cargo run --release -p mutirao-dir --example grid_bench [QUERIES] [ROUNDS] [CLIENTS] [LOCAL%]`
//!
//! Every server holds 100 resources of its own; servers talk over loopback TCP (HMAC
//! handshake, one connection per pair), clients over each server's Unix socket.
//!
//! 1. Latency: one client on server 0 asks QUERIES times (default 2000), at grid scope, for
//!    resources held by the other servers (a local miss, then a fan-out where only the holder
//!    answers); prints p50/p99/max.
//! 2. Check 9, the workload of the thesis's Figs 5.2–5.3 (digest 002 §4.1): on every server
//!    CLIENTS clients (default 2; the thesis swept 1–16 per node) each issue single-answer
//!    grid-scope lookups, one at a time; LOCAL% of them (default 0; the thesis swept 0–75 %)
//!    ask for a resource of the client's own server, the rest for one held by another server
//!    (round robin). The aggregate rate is all lookups answered per second. Each of ROUNDS
//!    rounds (default 5) measures 4 servers then 8 servers for 1 s each (after 0.2 s of
//!    warm-up); the result is the median over rounds of the 8-server rate divided by the
//!    4-server rate of the same round (the target: a loss of at most 30 %).
//!
//! `GB_MODE=threads` (or `tasks`) serves local clients in that [`LocalMode`] instead of the
//! event loop.
//!
//! All servers and clients share this machine's cores, unlike the thesis's one node per
//! server: doubling the servers here doubles the peers each lookup is sent to without adding
//! CPU, so the check measures how cheap a fan-out is per peer.

use mutirao_dir::client::Client;
use mutirao_dir::server::{DirServer, LocalMode, ServerConfig, ServerHandles};
use mutirao_dir::{Acl, AttrList, Cred, DirConfig, Gid, Scope};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const PER_SERVER: usize = 100;

fn start(
    rt: &tokio::runtime::Runtime,
    n: usize,
    dir: &std::path::Path,
) -> (Vec<PathBuf>, Vec<ServerHandles>) {
    let ls: Vec<tokio::net::TcpListener> = (0..n)
        .map(|_| {
            rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
                .unwrap()
        })
        .collect();
    let addrs: Vec<SocketAddr> = ls.iter().map(|l| l.local_addr().unwrap()).collect();
    let mut socks = vec![];
    let mut hs = vec![];
    for (i, l) in ls.into_iter().enumerate() {
        let s = DirServer::new(ServerConfig {
            dir: DirConfig {
                cluster: 1,
                node: i as u64 + 1,
                ..DirConfig::default()
            },
            peers: addrs
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, a)| *a)
                .collect(),
            cluster_key: b"bench key".to_vec(),
            peer_timeout: Duration::from_millis(500),
            ..ServerConfig::default()
        })
        .unwrap();
        s.set_local_mode(local_mode());
        s.with_directory(|d| {
            for k in 0..PER_SERVER {
                let a =
                    AttrList::from_pairs([("owner", i.to_string()), ("k", k.to_string())]).unwrap();
                d.register(Cred::new(0, 0), Gid::NONE, a, Acl::Public, false)
                    .unwrap();
            }
        });
        let sock = dir.join(format!("n{n}-s{i}.sock"));
        let _g = rt.enter();
        hs.push(s.spawn(Some(sock.clone()), Some(l)).unwrap());
        socks.push(sock);
    }
    (socks, hs)
}

/// The x-th lookup of a client on server `me` of `n`: `local_pct` of every 100 consecutive
/// lookups ask for a resource of `me`, the others for one of another server, round robin.
fn query_for(n: usize, me: usize, x: usize, local_pct: usize) -> AttrList {
    let other = if x % 100 < local_pct {
        me
    } else {
        (me + 1 + x % (n - 1)) % n
    };
    AttrList::from_pairs([
        ("owner", other.to_string()),
        ("k", (x % PER_SERVER).to_string()),
    ])
    .unwrap()
}

/// Aggregate lookups/s of `clients` clients per server over `socks` for `dur`.
fn aggregate(socks: &[PathBuf], clients: usize, local_pct: usize, dur: Duration) -> f64 {
    let n = socks.len();
    let t = Instant::now();
    let stop = t + dur;
    let total: usize = std::thread::scope(|s| {
        let mut js = vec![];
        for (i, sock) in socks.iter().enumerate() {
            for cl in 0..clients {
                js.push(s.spawn(move || {
                    let mut c = Client::connect(sock).expect("connect");
                    let mut done = 0;
                    let mut x = cl * 13;
                    while Instant::now() < stop {
                        x += 1;
                        c.query(None, &query_for(n, i, x, local_pct), Scope::Grid)
                            .expect("every resource asked for exists");
                        done += 1;
                    }
                    done
                }));
            }
        }
        js.into_iter()
            .map(|j| j.join().expect("client thread"))
            .sum()
    });
    total as f64 / t.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// `GB_MODE=threads|tasks` serves local clients in another [`LocalMode`] (default: the
/// event loop).
fn local_mode() -> LocalMode {
    match std::env::var("GB_MODE").as_deref() {
        Ok("threads") => LocalMode::Threads,
        Ok("tasks") => LocalMode::Tasks,
        _ => LocalMode::EventLoop,
    }
}

fn main() {
    let arg = |k: usize, d: usize| -> usize {
        std::env::args()
            .nth(k)
            .and_then(|a| a.parse().ok())
            .unwrap_or(d)
    };
    let queries = arg(1, 2000).max(1);
    let rounds = arg(2, 5).max(1);
    let clients = arg(3, 2).max(1);
    let local_pct = arg(4, 0).min(100);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = std::env::temp_dir().join(format!("mutirao-grid-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");

    let (socks8, hs8) = start(&rt, 8, &dir);
    let mut c = Client::connect(&socks8[0]).expect("connect");
    for x in 0..50 {
        // warm the peer connections
        c.query(None, &query_for(8, 0, x, 0), Scope::Grid)
            .expect("found");
    }
    let mut lat = Vec::with_capacity(queries);
    for x in 0..queries {
        let q = query_for(8, 0, x * 7, 0);
        let t = Instant::now();
        c.query(None, &q, Scope::Grid).expect("found");
        lat.push(t.elapsed());
    }
    drop(c);
    lat.sort();
    let pct = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
    println!(
        "grid query, 8 servers, {queries} queries: p50 {:?}  p99 {:?}  max {:?}",
        pct(0.50),
        pct(0.99),
        lat[lat.len() - 1]
    );

    let (socks4, hs4) = start(&rt, 4, &dir);
    let warm = Duration::from_millis(200);
    let dur = Duration::from_secs(1);
    let (mut r4, mut r8, mut ratio) = (vec![], vec![], vec![]);
    for _ in 0..rounds {
        aggregate(&socks4, clients, local_pct, warm);
        let a = aggregate(&socks4, clients, local_pct, dur);
        aggregate(&socks8, clients, local_pct, warm);
        let b = aggregate(&socks8, clients, local_pct, dur);
        println!(
            "  round: 4 servers {a:.0}/s, 8 servers {b:.0}/s ({:+.1}%)",
            (b / a - 1.0) * 100.0
        );
        r4.push(a);
        r8.push(b);
        ratio.push(b / a);
    }
    println!(
        "aggregate global lookups, {clients} clients/server, {local_pct}% local, median of {rounds} rounds: \
         4 servers {:.0}/s, 8 servers {:.0}/s",
        median(r4),
        median(r8)
    );
    println!(
        "4 -> 8 servers: aggregate rate changes by {:+.1}% (median of per-round ratios)",
        (median(ratio) - 1.0) * 100.0
    );
    for h in hs8.iter().chain(&hs4) {
        h.abort();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
