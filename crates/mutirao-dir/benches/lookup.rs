//! Directory lookup throughput (digest 002 §7.8 check 8; issue 5 speed targets).
//!
//! `cargo bench -p mutirao-dir --bench lookup`
//!
//! - `inproc/*`: the in-process [`Directory`] (target ≥ 1 M lookups/s);
//! - `socket/sync/N`: N clients, each one request at a time, over the Unix socket, 256-byte
//!   replies (target ≥ 100 k/s at N = 1; aggregate at 16 not lower than at 1);
//! - `socket/pipelined/N`: the same with 64 queries in flight per client.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use mutirao_dir::client::Client;
use mutirao_dir::server::{DirServer, ServerConfig};
use mutirao_dir::{Acl, Attr, AttrList, Cred, DirConfig, Directory, Gid, Scope};
use std::time::{Duration, Instant};

const N_RES: usize = 10_000;
const ME: Cred = Cred { uid: 0, gid: 0 };

fn res_attrs(i: usize) -> AttrList {
    // 256-byte reply packets (header included), as `examples/local_bench.rs` prints
    AttrList::from_attrs([
        Attr::full("name", format!("res{i:05}")),
        Attr::full("kind", "mailbox"),
        Attr::full("payload", vec![b'x'; 169]),
    ])
    .unwrap()
}

fn inproc(c: &mut Criterion) {
    let mut d = Directory::new(DirConfig::default()).unwrap();
    let gids: Vec<Gid> = (0..N_RES)
        .map(|i| {
            d.register(ME, Gid::NONE, res_attrs(i), Acl::Public, false)
                .unwrap()
                .gid
        })
        .collect();
    let queries: Vec<AttrList> = (0..N_RES)
        .map(|i| AttrList::from_attrs([Attr::full("name", format!("res{i:05}"))]).unwrap())
        .collect();
    let partial: Vec<AttrList> = (0..N_RES)
        .map(|i| {
            AttrList::from_attrs([
                Attr::full("name", format!("res{i:05}")),
                Attr::want("payload", 64),
            ])
            .unwrap()
        })
        .collect();
    let mut g = c.benchmark_group("inproc");
    g.throughput(Throughput::Elements(1));
    let empty = AttrList::new();
    let mut i = 0usize;
    g.bench_function("by_gid", |b| {
        b.iter(|| {
            i = (i + 7919) % N_RES;
            d.query(ME, Some(gids[i]), &empty).unwrap()
        })
    });
    g.bench_function("by_full_attr", |b| {
        b.iter(|| {
            i = (i + 7919) % N_RES;
            d.query(ME, None, &queries[i]).unwrap()
        })
    });
    g.bench_function("partial_want", |b| {
        b.iter(|| {
            i = (i + 7919) % N_RES;
            d.query(ME, None, &partial[i]).unwrap()
        })
    });
    g.finish();
}

fn socket(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = std::env::temp_dir().join(format!("mutirao-dir-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("d.sock");
    let server = DirServer::new(ServerConfig::default()).unwrap();
    let gids: Vec<Gid> = server.with_directory(|d| {
        (0..N_RES)
            .map(|i| {
                d.register(ME, Gid::NONE, res_attrs(i), Acl::Public, false)
                    .unwrap()
                    .gid
            })
            .collect()
    });
    let h = {
        let _g = rt.enter();
        server.spawn(Some(sock.clone()), None).unwrap()
    };
    std::thread::sleep(Duration::from_millis(50));
    let empty = AttrList::new();
    for &(mode, batch) in &[("sync", 1usize), ("pipelined", 64usize)] {
        let mut g = c.benchmark_group(format!("socket/{mode}"));
        g.sample_size(10);
        g.measurement_time(Duration::from_secs(3));
        for &clients in &[1usize, 2, 16] {
            g.throughput(Throughput::Elements(1));
            g.bench_with_input(
                BenchmarkId::from_parameter(clients),
                &clients,
                |b, &clients| {
                    let mut conns: Vec<Client> = (0..clients)
                        .map(|_| Client::connect(&sock).unwrap())
                        .collect();
                    b.iter_custom(|iters| {
                        let per = (iters as usize).div_ceil(clients).max(1);
                        let t = Instant::now();
                        std::thread::scope(|s| {
                            for (k, cl) in conns.iter_mut().enumerate() {
                                let gids = &gids;
                                let empty = &empty;
                                s.spawn(move || {
                                    let mut j = k * 31;
                                    let mut left = per;
                                    while left > 0 {
                                        let n = left.min(batch);
                                        if n == 1 {
                                            j = (j + 7919) % N_RES;
                                            cl.query(Some(gids[j]), empty, Scope::Local).unwrap();
                                        } else {
                                            let qs: Vec<(Option<Gid>, AttrList)> = (0..n)
                                                .map(|_| {
                                                    j = (j + 7919) % N_RES;
                                                    (Some(gids[j]), AttrList::new())
                                                })
                                                .collect();
                                            for r in cl.query_pipelined(&qs, Scope::Local).unwrap()
                                            {
                                                r.unwrap();
                                            }
                                        }
                                        left -= n;
                                    }
                                });
                            }
                        });
                        // time per lookup in aggregate: wall time scaled to `iters` lookups
                        t.elapsed().mul_f64(iters as f64 / (per * clients) as f64)
                    })
                },
            );
        }
        g.finish();
    }
    h.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, inproc, socket);
criterion_main!(benches);
