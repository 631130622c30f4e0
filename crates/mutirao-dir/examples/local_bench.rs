//! Local-socket lookup throughput, server and client variants side by side (digest 002 §7.8
//! check 8; issue 5: ≥ 100 k lookups/s with one client, aggregate at 16 clients not lower
//! than at one).
//!
//! `cargo run --release -p mutirao-dir --example local_bench [ROUNDS] [MILLIS]`
//!
//! One server holds 10 000 resources whose replies are 256 bytes; N clients (threads) each
//! look resources up by gid, one request at a time (send, wait for the reply, next). Every
//! round measures every variant at N = 1, 2, 4 and 16 for MILLIS ms (default 5 rounds of
//! 500 ms), interleaved so that machine noise hits all variants alike; the table gives the
//! median over rounds, in lookups/s, and each variant's ratio to the first one.
//!
//! `LB_SPINS=10,20` adds thread variants polling for 10 and 20 µs; `LB_ONLY=thread+spin:16`
//! runs one variant at one client count (for profiling).
//!
//! Variants: `task+block` serves each client as a tokio task and sleeps in the kernel on both
//! sides (the design before issue 5's speed work); `thread+block` serves each client on its
//! own thread, still sleeping; `thread+spin` also polls briefly before sleeping, on both
//! sides; `loop+spin` (the default, `LocalMode::EventLoop`) serves every client from one
//! epoll thread that polls briefly after requests, with polling clients.

use mutirao_dir::client::Client;
use mutirao_dir::net::DEFAULT_SPIN;
use mutirao_dir::server::{DirServer, LocalMode, ServerConfig};
use mutirao_dir::{Acl, Attr, AttrList, Cred, Gid, Scope};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const N_RES: usize = 10_000;

struct Variant {
    name: &'static str,
    mode: LocalMode,
    spin: Duration,
}

fn res_attrs(i: usize) -> AttrList {
    AttrList::from_attrs([
        Attr::full("name", format!("res{i:05}")),
        Attr::full("kind", "mailbox"),
        Attr::full("payload", vec![b'x'; 169]), // 256-byte reply packets
    ])
    .expect("valid attributes")
}

fn measure(
    server: &DirServer,
    sock: &std::path::Path,
    gids: &[Gid],
    v: &Variant,
    n: usize,
    dur: Duration,
) -> f64 {
    server.set_local_mode(v.mode);
    server.set_local_spin(v.spin);
    let mut clients: Vec<Client> = (0..n)
        .map(|_| {
            let mut c = Client::connect(sock).expect("connect");
            c.set_spin(v.spin);
            c
        })
        .collect();
    let stop = AtomicBool::new(false);
    let t = Instant::now();
    let total: usize = std::thread::scope(|s| {
        let hs: Vec<_> = clients
            .iter_mut()
            .enumerate()
            .map(|(k, c)| {
                let stop = &stop;
                s.spawn(move || {
                    let empty = AttrList::new();
                    let mut j = k * 31;
                    let mut done = 0usize;
                    while !stop.load(Ordering::Relaxed) {
                        j = (j + 7919) % gids.len();
                        c.query(Some(gids[j]), &empty, Scope::Local)
                            .expect("lookup");
                        done += 1;
                    }
                    done
                })
            })
            .collect();
        std::thread::sleep(dur);
        stop.store(true, Ordering::Relaxed);
        hs.into_iter()
            .map(|h| h.join().expect("client thread"))
            .sum()
    });
    total as f64 / t.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    let millis: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(500);
    let dur = Duration::from_millis(millis);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = std::env::temp_dir().join(format!("mutirao-local-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let sock = dir.join("d.sock");
    let server = DirServer::new(ServerConfig::default()).expect("server");
    let gids: Vec<Gid> = server.with_directory(|d| {
        (0..N_RES)
            .map(|i| {
                d.register(Cred::new(0, 0), Gid::NONE, res_attrs(i), Acl::Public, false)
                    .expect("register")
                    .gid
            })
            .collect()
    });
    let h = {
        let _g = rt.enter();
        server.spawn(Some(sock.clone()), None).expect("spawn")
    };
    // The reply size the check asks for.
    {
        let mut c = Client::connect(&sock).expect("connect");
        let g = gids[0];
        let p = c
            .call(mutirao_dir::Packet::new(
                {
                    let mut h = mutirao_dir::wire::Header::new(mutirao_dir::Kind::Query);
                    h.target = g;
                    h
                },
                AttrList::new(),
            ))
            .expect("lookup");
        println!("reply size: {} bytes", p.encoded_len());
    }
    let mut variants = vec![
        Variant {
            name: "task+block",
            mode: LocalMode::Tasks,
            spin: Duration::ZERO,
        },
        Variant {
            name: "thread+block",
            mode: LocalMode::Threads,
            spin: Duration::ZERO,
        },
        Variant {
            name: "thread+spin",
            mode: LocalMode::Threads,
            spin: DEFAULT_SPIN,
        },
        Variant {
            name: "loop+spin",
            mode: LocalMode::EventLoop,
            spin: DEFAULT_SPIN,
        },
    ];
    if let Ok(v) = std::env::var("LB_SPINS") {
        for us in v.split(',') {
            let us: u64 = us.parse().expect("LB_SPINS");
            variants.push(Variant {
                name: Box::leak(format!("spin{us}").into_boxed_str()),
                mode: LocalMode::Threads,
                spin: Duration::from_micros(us),
            });
        }
    }
    let mut counts = vec![1usize, 2, 4, 16];
    if let Ok(v) = std::env::var("LB_ONLY") {
        let (name, n) = v.split_once(':').expect("LB_ONLY=variant:clients");
        variants.retain(|x| x.name == name);
        counts = vec![n.parse().expect("clients")];
    }
    let mut res = vec![vec![vec![]; counts.len()]; variants.len()];
    for _ in 0..rounds {
        for (ci, &n) in counts.iter().enumerate() {
            for (vi, v) in variants.iter().enumerate() {
                res[vi][ci].push(measure(&server, &sock, &gids, v, n, dur));
            }
        }
    }
    println!(
        "median lookups/s over {rounds} rounds of {millis} ms (ratio to {}):",
        variants[0].name
    );
    print!("{:<14}", "clients");
    for &n in &counts {
        print!("{n:>20}");
    }
    println!();
    let base: Vec<f64> = res[0].iter().map(|r| median(r.clone())).collect();
    for (vi, v) in variants.iter().enumerate() {
        print!("{:<14}", v.name);
        for (ci, b) in base.iter().enumerate() {
            let m = median(res[vi][ci].clone());
            print!("{:>12.0} ({:>4.2}x)", m, m / b);
        }
        println!();
    }
    if counts.len() > 1 {
        println!("median over rounds of each round's ratio to the same round's 1-client rate:");
        for (vi, v) in variants.iter().enumerate() {
            print!("{:<14}", v.name);
            for ci in 0..counts.len() {
                let r: Vec<f64> = (0..rounds)
                    .map(|k| res[vi][ci][k] / res[vi][0][k])
                    .collect();
                print!("{:>20.2}", median(r));
            }
            println!();
        }
    }
    h.abort();
    let _ = std::fs::remove_dir_all(&dir);
}
