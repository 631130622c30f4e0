//! The simulator with contention gives the same schedule whether its flows go through the
//! incremental network (`mutirao_sched::net::Network`) or through the straightforward
//! reference solver it replaced (`common/reference.rs`): random graphs, placements, NIC and
//! site-link capacities (some too large to matter; `net_equivalence.rs` has truly infinite
//! ones), both communication modes, messages that start before the network's clock.

mod common;

use common::reference::Reference;
use mutirao_sched::gen::{self, RandomParams};
use mutirao_sched::platform::Platform;
use mutirao_sched::sim::{simulate, simulate_with_network, CommMode, Placement, SimOptions};
use proptest::prelude::*;

fn close(x: f64, y: f64) -> bool {
    (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0)
}

/// Each task on the host `hosts[v]`, hosts running their tasks in topological order.
fn placement(dag: &mutirao_sched::Dag, hosts: &[usize]) -> Placement {
    let n = dag.len();
    let mut pos = vec![0usize; n];
    for (i, &v) in dag.topo_order().iter().enumerate() {
        pos[v] = i;
    }
    Placement {
        host: hosts[..n].to_vec(),
        start: pos.iter().map(|&p| p as f64).collect(),
        seq: pos,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn the_simulator_finishes_every_task_as_with_the_reference_network(
        n in 2usize..60,
        seed in 0u64..1_000,
        ccr in prop_oneof![Just(0.5), Just(2.0), Just(8.0)],
        nhosts in 2usize..8,
        sites in 1usize..4,
        nic_mbit in proptest::collection::vec(20.0f64..2_000.0, 16),
        wan_mbit in 5.0f64..1_000.0,
        keep_link in proptest::collection::vec(any::<bool>(), 16),
        hosts in proptest::collection::vec(0usize..8, 60),
        latency_only in any::<bool>(),
    ) {
        let dag = gen::random(&RandomParams { n, ccr, out_degree: 4, seed, ..Default::default() })
            .expect("graph");
        let mut model = gen::with_sites_and_capacities(
            gen::random_model(nhosts, 0.5, 1e8, seed).expect("model"),
            sites,
            wan_mbit,
        );
        if let Some(c) = model.capacity.as_mut() {
            for (i, nic) in c.nics.iter_mut().enumerate() {
                nic.out_mbit = nic_mbit[2 * i];
                nic.in_mbit = nic_mbit[2 * i + 1];
            }
            for (link, keep) in c.site_links.iter_mut().zip(&keep_link) {
                if !keep {
                    link.mbit = 1e9; // never the bottleneck (models reject infinite capacities)
                }
            }
        }
        let platform = Platform::from_model(&model).expect("platform");
        let hosts: Vec<usize> = hosts.iter().map(|h| h % nhosts).collect();
        let pl = placement(&dag, &hosts);
        let opts = SimOptions {
            contention: true,
            comm: if latency_only { CommMode::LatencyOnly } else { CommMode::HLogP },
            ..SimOptions::default()
        };
        let fast = simulate(&dag, &platform, &pl, opts).expect("simulate");
        let reference = simulate_with_network(&dag, &platform, &pl, opts, |c| {
            Reference::new(c.clone())
        })
        .expect("simulate with the reference network");
        prop_assert!(
            close(fast.makespan_s, reference.makespan_s),
            "makespan {} vs reference {}", fast.makespan_s, reference.makespan_s
        );
        for (v, (a, b)) in fast.tasks.iter().zip(&reference.tasks).enumerate() {
            prop_assert!(
                close(a.finish_s, b.finish_s),
                "task {}: finish {} vs reference {}", v, a.finish_s, b.finish_s
            );
        }
    }
}

/// The network is plugged in: a reference that gives every flow no bandwidth is caught by the
/// simulator (so the property above does compare two networks, not one with itself).
#[test]
fn the_plugged_network_is_the_one_used() {
    struct Stuck;
    impl mutirao_sched::net::FlowNetwork for Stuck {
        fn start(&mut self, _: usize, _: usize, _: usize, _: u64, _: f64) {}
        fn next_finish(&mut self) -> Option<f64> {
            Some(f64::INFINITY)
        }
        fn finish_until(&mut self, _: f64, _: &mut Vec<mutirao_sched::net::Done>) {}
    }
    let dag = gen::random(&RandomParams {
        n: 20,
        seed: 1,
        ..Default::default()
    })
    .expect("graph");
    let model =
        gen::with_sites_and_capacities(gen::random_model(4, 0.5, 1e8, 1).expect("model"), 2, 100.0);
    let platform = Platform::from_model(&model).expect("platform");
    let hosts: Vec<usize> = (0..20).map(|v| v % 4).collect();
    let pl = placement(&dag, &hosts);
    let opts = SimOptions {
        contention: true,
        ..SimOptions::default()
    };
    assert!(simulate(&dag, &platform, &pl, opts).is_ok());
    assert!(simulate_with_network(&dag, &platform, &pl, opts, |_| Stuck).is_err());
}
