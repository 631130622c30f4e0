//! Contention only adds (issue 11): simulating the **same** schedule (task → host mapping and
//! per-host order), the contention model never predicts anything earlier than the thesis's
//! HLogP — no task starts or finishes earlier, no message arrives earlier, the makespan is not
//! shorter — whatever the platform's capacities are next to its link classes' fitted
//! bandwidths (larger or smaller), with or without the runtime's rendezvous protocol. And a
//! message alone is exactly HLogP's, even when the capacities exceed the class's bandwidth.

use mutirao_model::{
    Capacity, Host, Link, LinkClass, Model, NicCapacity, Piecewise, Segment, SiteLinkCapacity,
};
use mutirao_sched::dag::{Dag, Edge, Task};
use mutirao_sched::gen::{self, RandomParams};
use mutirao_sched::net::Capacities;
use mutirao_sched::platform::Platform;
use mutirao_sched::sim::{simulate, CommMode, Placement, SimOptions, WaitMode};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A link class whose wire moves `mbit` Mbit/s: `L = 50 µs + bytes / rate` up to the eager
/// limit (all of it when there is none), and above it the transfer in `Or` instead (a
/// calibration of the runtime's rendezvous fits it so).
fn link(class: LinkClass, mbit: f64, eager: Option<u64>) -> Link {
    let per_byte = 8.0 / mbit; // µs per byte
    let (l, or) = match eager {
        None => (
            Piecewise::linear(50.0, per_byte),
            Piecewise::linear(5.0, 0.0),
        ),
        Some(e) => (
            Piecewise(vec![
                Segment {
                    from: 0,
                    base_us: 50.0,
                    per_byte_us: per_byte,
                },
                Segment {
                    from: e + 1,
                    base_us: 50.0,
                    per_byte_us: 0.0,
                },
            ]),
            Piecewise(vec![
                Segment {
                    from: 0,
                    base_us: 5.0,
                    per_byte_us: 0.0,
                },
                Segment {
                    from: e + 1,
                    base_us: 55.0 + per_byte * (e + 1) as f64,
                    per_byte_us: per_byte,
                },
            ]),
        ),
    };
    Link {
        class,
        site: None,
        sites: None,
        src: None,
        dst: None,
        os: Piecewise::linear(5.0, 0.01 * per_byte),
        or,
        l,
    }
}

/// A random platform: `nhosts` hosts of random speeds over `sites` sites, intra- and
/// inter-site classes of random bandwidths, an eager limit or none, and capacities each a
/// random factor in [0.25, 4] of the bandwidth of the class that crosses the resource (so
/// often larger than what the class was fitted at).
fn platform(nhosts: usize, sites: usize, eager: Option<u64>, seed: u64) -> Platform {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let hosts: Vec<Host> = (0..nhosts)
        .map(|i| Host {
            name: format!("h{i}"),
            site: format!("s{}", i % sites),
            speed: rng.gen_range(0.5..2.0),
            addr: None,
        })
        .collect();
    let intra = rng.gen_range(50.0..1000.0);
    let inter = rng.gen_range(5.0..200.0);
    let mut m = Model::new(
        hosts.clone(),
        vec![
            link(LinkClass::SameHost, 10_000.0, None),
            link(LinkClass::IntraSite, intra, eager),
            link(LinkClass::InterSite, inter, eager),
        ],
    )
    .expect("model");
    m.eager_limit_bytes = eager;
    let mut factor = || rng.gen_range(0.25..4.0);
    let nic = intra.max(inter);
    let nics = hosts
        .iter()
        .map(|h| NicCapacity {
            host: h.name.clone(),
            out_mbit: nic * factor(),
            in_mbit: nic * factor(),
        })
        .collect();
    let mut site_links = Vec::new();
    for a in 0..sites {
        for b in 0..sites {
            if a != b {
                site_links.push(SiteLinkCapacity {
                    from: format!("s{a}"),
                    to: format!("s{b}"),
                    mbit: inter * factor(),
                });
            }
        }
    }
    m.capacity = Some(Capacity {
        source: Some("test".into()),
        nics,
        site_links,
    });
    Platform::from_model(&m).expect("platform")
}

/// A random schedule: each task on a random host, and the hosts running their tasks in a
/// random topological order (Kahn's algorithm taking a random ready task each time); the
/// messages leave in that order of their receivers.
fn schedule(dag: &Dag, nhosts: usize, seed: u64) -> Placement {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x0dd5);
    let n = dag.len();
    let host = (0..n).map(|_| rng.gen_range(0..nhosts)).collect();
    let mut remaining: Vec<usize> = (0..n).map(|t| dag.in_edges(t).len()).collect();
    let mut ready: Vec<usize> = (0..n).filter(|&t| remaining[t] == 0).collect();
    let mut seq = vec![0usize; n];
    let mut next = 0;
    while !ready.is_empty() {
        let v = ready.swap_remove(rng.gen_range(0..ready.len()));
        seq[v] = next;
        next += 1;
        for &ei in dag.out_edges(v) {
            let w = dag.edges()[ei].to;
            remaining[w] -= 1;
            if remaining[w] == 0 {
                ready.push(w);
            }
        }
    }
    Placement {
        host,
        start: seq.iter().map(|&s| s as f64).collect(),
        seq,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_same_schedule_is_never_earlier_with_contention(
        n in 2usize..50,
        seed in any::<u64>(),
        ccr in prop_oneof![Just(0.5), Just(2.0), Just(8.0)],
        out_degree in 1usize..5,
        nhosts in 2usize..7,
        sites in 1usize..4,
        eager in prop_oneof![Just(None), Just(Some(16u64 << 10)), Just(Some(64u64 << 10))],
    ) {
        let dag = gen::random(&RandomParams {
            n, ccr, out_degree, mean_work: 0.02, bytes_per_s: 4.0e6, seed, ..Default::default()
        })
        .expect("graph");
        let p = platform(nhosts, sites.min(nhosts), eager, seed);
        let pl = schedule(&dag, nhosts, seed);
        for wait in [WaitMode::Block, WaitMode::Poll] {
            for comm in [CommMode::HLogP, CommMode::LatencyOnly] {
                let o = SimOptions { comm, wait, record_messages: true, contention: false };
                let without = simulate(&dag, &p, &pl, o).expect("simulate");
                let with = simulate(&dag, &p, &pl, SimOptions { contention: true, ..o })
                    .expect("simulate with contention");
                let tol = |x: f64| 1e-9 * (1.0 + x.abs());
                prop_assert!(
                    with.makespan_s + tol(without.makespan_s) >= without.makespan_s,
                    "{comm:?} {wait:?}: makespan {} with contention, {} without",
                    with.makespan_s, without.makespan_s
                );
                for (v, (a, b)) in with.tasks.iter().zip(&without.tasks).enumerate() {
                    prop_assert!(
                        a.start_s + tol(b.start_s) >= b.start_s
                            && a.finish_s + tol(b.finish_s) >= b.finish_s,
                        "{comm:?} {wait:?}: task {v} {a:?} with contention, {b:?} without"
                    );
                }
                for (a, b) in with.messages.iter().zip(&without.messages) {
                    prop_assert!(
                        a.arrival_s + tol(b.arrival_s) >= b.arrival_s,
                        "{comm:?} {wait:?}: message {a:?} with contention, {b:?} without"
                    );
                }
            }
        }
    }
}

/// A message alone arrives exactly at its HLogP time, and its receiver starts exactly then,
/// whether the resources it crosses carry 4× or a quarter of the class's fitted bandwidth —
/// eager or by rendezvous, within a site or across two.
#[test]
fn a_lone_message_is_hlogp_whatever_the_capacities() {
    for eager in [None, Some(16u64 << 10)] {
        for sites in [1, 2] {
            for factor in [4.0, 0.25] {
                let mut p = platform(2, sites, eager, 7);
                // The class's bandwidth: the L (eager) or Or (rendezvous) slope of the link.
                let class_bytes_per_s = {
                    let big = 1u64 << 20;
                    let l = p.l_s(big, 0, 1) - p.l_s(big / 2, 0, 1);
                    let or = p.or_s(big, 0, 1) - p.or_s(big / 2, 0, 1);
                    (big / 2) as f64 / (l + or)
                };
                let c = class_bytes_per_s * factor;
                p.set_capacities(Capacities {
                    nic_out: vec![c; 2],
                    nic_in: vec![c; 2],
                    site_of: (0..2).map(|h| h % sites).collect(),
                    sites,
                    site_link: (0..sites * sites)
                        .map(|i| (i / sites != i % sites).then_some(c))
                        .collect(),
                })
                .expect("capacities");
                let dag = Dag::new(
                    vec![
                        Task {
                            id: "a".into(),
                            work: 0.01,
                        },
                        Task {
                            id: "b".into(),
                            work: 0.01,
                        },
                    ],
                    vec![Edge {
                        from: 0,
                        to: 1,
                        bytes: 1 << 20,
                    }],
                )
                .expect("graph");
                let pl = Placement {
                    host: vec![0, 1],
                    start: vec![0.0, 1.0],
                    seq: vec![0, 1],
                };
                let o = SimOptions {
                    record_messages: true,
                    ..SimOptions::default()
                };
                let without = simulate(&dag, &p, &pl, o).expect("simulate");
                let with = simulate(
                    &dag,
                    &p,
                    &pl,
                    SimOptions {
                        contention: true,
                        ..o
                    },
                )
                .expect("simulate");
                let case = format!("eager {eager:?}, {sites} site(s), capacity {factor}x");
                assert_eq!(with.messages, without.messages, "{case}");
                assert_eq!(with.tasks, without.tasks, "{case}");
            }
        }
    }
}

/// The case behind issue 11's "faster with contention": a task with two rendezvous inputs
/// from two other sites, over resources that carry 4× the class's bandwidth. Both transfers
/// move at once and, sharing only the receiver's NIC, each gets twice the class's rate; but
/// HLogP takes the two receive overheads (which carry the transfers) one after the other, and
/// contention must not undercut that: the sink starts exactly when HLogP says.
#[test]
fn two_rendezvous_inputs_end_no_earlier_than_the_hlogp_chain() {
    let mut p = platform(3, 3, Some(16 << 10), 11);
    let c = 1e9; // bytes/s: far above any class here
    p.set_capacities(Capacities {
        nic_out: vec![c; 3],
        nic_in: vec![c; 3],
        site_of: vec![0, 1, 2],
        sites: 3,
        site_link: (0..9).map(|i| (i / 3 != i % 3).then_some(c)).collect(),
    })
    .expect("capacities");
    let task = |id: &str| Task {
        id: id.into(),
        work: 0.01,
    };
    let dag = Dag::new(
        vec![task("p0"), task("p1"), task("sink")],
        vec![
            Edge {
                from: 0,
                to: 2,
                bytes: 1 << 20,
            },
            Edge {
                from: 1,
                to: 2,
                bytes: 1 << 20,
            },
        ],
    )
    .expect("graph");
    let pl = Placement {
        host: vec![0, 2, 1],
        start: vec![0.0, 0.0, 1.0],
        seq: vec![0, 1, 2],
    };
    let without = simulate(&dag, &p, &pl, SimOptions::default()).expect("simulate");
    let with = simulate(
        &dag,
        &p,
        &pl,
        SimOptions {
            contention: true,
            ..SimOptions::default()
        },
    )
    .expect("simulate");
    let or = p.or_s(1 << 20, 0, 1);
    // HLogP: the two receives in turn after the later request arrives.
    assert!(
        without.tasks[2].start_s >= 2.0 * or,
        "{:?}, Or {or}",
        without.tasks[2]
    );
    assert_eq!(with.tasks[2], without.tasks[2]);
    assert_eq!(with.makespan_s, without.makespan_s);
}
