//! Grid-scope query latency across N directory servers on loopback, and the aggregate
//! global-lookup rate with 4 vs 8 servers (digest 002 §7.8 check 9).
//!
//! `cargo run --release -p mutirao-dir --example grid_bench [QUERIES]`
//!
//! Every server holds 100 resources of its own; a client on server 0 asks, at grid scope,
//! for resources held by the other servers (a local miss, then a fan-out where only the
//! holder answers). Prints p50/p99/max latency for 8 servers, then the aggregate rate of
//! 2 clients per server doing global lookups for 2 s with 4 and with 8 servers.

use mutirao_dir::client::Client;
use mutirao_dir::server::{DirServer, ServerConfig, ServerHandles};
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

fn query_for(n: usize, me: usize, x: usize) -> AttrList {
    let other = (me + 1 + x % (n - 1)) % n;
    AttrList::from_pairs([
        ("owner", other.to_string()),
        ("k", (x % PER_SERVER).to_string()),
    ])
    .unwrap()
}

fn main() {
    let queries: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = std::env::temp_dir().join(format!("mutirao-grid-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    let (socks, hs) = start(&rt, 8, &dir);
    let mut c = Client::connect(&socks[0]).unwrap();
    for x in 0..50 {
        c.query(None, &query_for(8, 0, x), Scope::Grid).unwrap(); // warm the peer connections
    }
    let mut lat = Vec::with_capacity(queries);
    for x in 0..queries {
        let q = query_for(8, 0, x * 7);
        let t = Instant::now();
        c.query(None, &q, Scope::Grid).unwrap();
        lat.push(t.elapsed());
    }
    lat.sort();
    let pct = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
    println!(
        "grid query, 8 servers, {queries} queries: p50 {:?}  p99 {:?}  max {:?}",
        pct(0.50),
        pct(0.99),
        lat[lat.len() - 1]
    );
    for h in &hs {
        h.abort();
    }

    let mut rates = vec![];
    for n in [4usize, 8] {
        let (socks, hs) = start(&rt, n, &dir);
        let stop = Instant::now() + Duration::from_secs(2);
        let total: usize = std::thread::scope(|s| {
            let mut js = vec![];
            for (i, sock) in socks.iter().enumerate() {
                for cl in 0..2 {
                    js.push(s.spawn(move || {
                        let mut c = Client::connect(sock).unwrap();
                        let mut done = 0;
                        let mut x = cl * 13;
                        while Instant::now() < stop {
                            x += 1;
                            c.query(None, &query_for(n, i, x), Scope::Grid).unwrap();
                            done += 1;
                        }
                        done
                    }));
                }
            }
            js.into_iter().map(|j| j.join().unwrap()).sum()
        });
        let rate = total as f64 / 2.0;
        println!("aggregate global lookups, {n} servers x 2 clients: {rate:.0}/s");
        rates.push(rate);
        for h in &hs {
            h.abort();
        }
    }
    println!(
        "4 -> 8 servers: aggregate rate changes by {:+.1}%",
        (rates[1] / rates[0] - 1.0) * 100.0
    );
    let _ = std::fs::remove_dir_all(&dir);
}
