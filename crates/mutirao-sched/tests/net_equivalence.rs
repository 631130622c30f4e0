//! The incremental network (`mutirao_sched::net::Network`: rates recomputed only when the set of
//! paths in flight changes, a heap of finish times) gives the same finishes and delays as the
//! straightforward one it replaced: every start and every finish recomputes every rate, every
//! step scans every flow. That reference is kept in `common/reference.rs`.

mod common;

use common::reference::Reference;
use mutirao_sched::net::{Capacities, Done, FlowNetwork, Network};
use proptest::prelude::*;

/// Four hosts on two sites; capacities from the case (a site link may be absent: infinite).
fn caps(nic: [f64; 4], wan_ab: Option<f64>, wan_ba: Option<f64>) -> Capacities {
    Capacities {
        nic_out: nic.to_vec(),
        nic_in: nic.iter().map(|c| c * 1.5).collect(),
        site_of: vec![0, 0, 1, 1],
        sites: 2,
        site_link: vec![None, wan_ab, wan_ba, None],
    }
}

/// Feeds `net` the starts (time, src, dst, bytes), interleaving starts and finishes as the
/// simulator does: a start at `t` goes in before finishes after `t`.
fn drive(net: &mut impl FlowNetwork, flows: &[(f64, usize, usize, u64)]) -> Vec<Done> {
    let mut starts: Vec<(f64, usize)> = flows.iter().enumerate().map(|(i, f)| (f.0, i)).collect();
    starts.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut out = Vec::new();
    let mut k = 0;
    loop {
        let next_start = starts.get(k).map(|s| s.0);
        match (next_start, net.next_finish()) {
            (None, None) => break,
            (s, Some(fin)) if s.is_none_or(|s| fin <= s) => net.finish_until(fin, &mut out),
            _ => {
                let (t, i) = starts[k];
                let (_, src, dst, bytes) = flows[i];
                net.start(i, src, dst, bytes, t);
                k += 1;
            }
        }
    }
    out
}

/// Runs both networks on the same flows.
fn run_both(c: &Capacities, flows: &[(f64, usize, usize, u64)]) -> (Vec<Done>, Vec<Done>) {
    (
        drive(&mut Network::new(c.clone()), flows),
        drive(&mut Reference::new(c.clone()), flows),
    )
}

fn close(x: f64, y: f64) -> bool {
    (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0)
}

fn flow() -> impl Strategy<Value = (f64, usize, usize, u64)> {
    (
        // Start times on a coarse grid, so that many flows start at the same instant.
        (0u32..40).prop_map(|t| t as f64 * 0.05),
        0usize..4,
        1usize..4,
        prop_oneof![Just(0u64), 1u64..2_000, 1_000u64..5_000_000],
    )
        .prop_map(|(t, s, d, b)| (t, s, (s + d) % 4, b))
}

/// Compares the finishes and delays of both networks, flow by flow.
fn check(c: &Capacities, flows: &[(f64, usize, usize, u64)]) -> Result<(), TestCaseError> {
    let (new, old) = run_both(c, flows);
    prop_assert_eq!(new.len(), flows.len());
    prop_assert_eq!(old.len(), flows.len());
    let by_key = |v: &[Done]| {
        let mut m = vec![None; flows.len()];
        for d in v {
            m[d.key] = Some(*d);
        }
        m
    };
    let (n, o) = (by_key(&new), by_key(&old));
    for k in 0..flows.len() {
        let (Some(x), Some(y)) = (n[k], o[k]) else {
            return Err(TestCaseError::fail(format!(
                "flow {k} did not finish in both"
            )));
        };
        prop_assert!(
            close(x.at, y.at),
            "flow {}: finish {} vs reference {}",
            k,
            x.at,
            y.at
        );
        prop_assert!(
            (x.delay - y.delay).abs() <= 1e-9 * x.at.abs().max(1.0),
            "flow {}: delay {} vs reference {}",
            k,
            x.delay,
            y.delay
        );
    }
    Ok(())
}

/// A platform of 2–8 hosts on 1–3 sites: every NIC in and out its own capacity (some
/// infinite: flows crossing only infinite resources end at once), every directed site link
/// present or not.
fn platform() -> impl Strategy<Value = Capacities> {
    (2usize..9, 1usize..4).prop_flat_map(|(hosts, sites)| {
        let cap = || prop_oneof![8 => 1e4f64..1e8, 1 => Just(f64::INFINITY)];
        (
            prop::collection::vec(cap(), hosts),
            prop::collection::vec(cap(), hosts),
            prop::collection::vec(0..sites, hosts),
            prop::collection::vec(prop::option::of(1e4f64..1e8), sites * sites),
        )
            .prop_map(move |(nic_out, nic_in, site_of, links)| Capacities {
                nic_out,
                nic_in,
                site_of,
                sites,
                site_link: links
                    .into_iter()
                    .enumerate()
                    .map(|(i, l)| if i / sites == i % sites { None } else { l })
                    .collect(),
            })
    })
}

/// Flows between the hosts of `c` (source and destination different).
fn flows_on(hosts: usize) -> impl Strategy<Value = Vec<(f64, usize, usize, u64)>> {
    prop::collection::vec(
        (
            (0u32..40).prop_map(|t| t as f64 * 0.05),
            0..hosts,
            1..hosts,
            prop_oneof![Just(0u64), 1u64..2_000, 1_000u64..5_000_000],
        )
            .prop_map(move |(t, s, d, b)| (t, s, (s + d) % hosts, b)),
        1..120,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_incremental_network_finishes_every_flow_as_the_reference_does(
        nic in prop::array::uniform4(1e5f64..1e8),
        wan_ab in prop::option::of(1e4f64..1e8),
        wan_ba in prop::option::of(1e4f64..1e8),
        flows in prop::collection::vec(flow(), 1..60),
    ) {
        check(&caps(nic, wan_ab, wan_ba), &flows)?;
    }

    /// More hosts and sites, unequal NICs in and out, some infinite: flows change bottleneck
    /// (group) often, and several groups share resources.
    #[test]
    fn on_random_platforms_too(
        (c, flows) in platform().prop_flat_map(|c| {
            let hosts = c.nic_out.len();
            (Just(c), flows_on(hosts))
        }),
    ) {
        check(&c, &flows)?;
    }
}

#[test]
fn a_successor_on_a_busy_connection_costs_no_recompute() {
    // Ten messages on one connection, back to back: the set of paths in flight never changes
    // between the first start and the last finish.
    let c = caps([100.0; 4], Some(10.0), Some(10.0));
    let mut net = Network::new(c);
    for k in 0..10 {
        net.start(k, 0, 2, 10, 0.0);
    }
    let mut out = Vec::new();
    while let Some(t) = net.next_finish() {
        net.finish_until(t, &mut out);
    }
    assert_eq!(out.len(), 10);
    for (i, d) in out.iter().enumerate() {
        assert_eq!(d.key, i);
        assert!(close(d.at, (i + 1) as f64), "{out:?}");
    }
    // Once when the connection started, once when it went idle.
    assert_eq!(net.recomputes(), 2);
}

#[test]
fn recomputes_stay_local_on_a_busy_platform() {
    // 16 hosts on 4 sites, every host sending to four others across the sites, starts spread
    // over time: every recompute is solved locally (no filling over every resource), and the
    // finishes are the reference's.
    let hosts = 16;
    let c = Capacities {
        nic_out: vec![1e8; hosts],
        nic_in: vec![1e8; hosts],
        site_of: (0..hosts).map(|h| h % 4).collect(),
        sites: 4,
        site_link: (0..16)
            .map(|i| if i / 4 == i % 4 { None } else { Some(2e8) })
            .collect(),
    };
    let flows: Vec<(f64, usize, usize, u64)> = (0..hosts * 4)
        .map(|i| {
            let (s, k) = (i % hosts, i / hosts);
            (i as f64 * 1e-3, s, (s + 1 + 3 * k) % hosts, 1_000_000)
        })
        .collect();
    let mut net = Network::new(c.clone());
    let new = drive(&mut net, &flows);
    let old = drive(&mut Reference::new(c), &flows);
    assert_eq!(new.len(), flows.len());
    for d in &new {
        let r = old
            .iter()
            .find(|o| o.key == d.key)
            .expect("reference finish");
        assert!(close(d.at, r.at), "flow {}: {} vs {}", d.key, d.at, r.at);
    }
    assert!(
        net.recomputes() >= flows.len() as u64,
        "{}",
        net.recomputes()
    );
    assert_eq!(net.full_fills(), 0);
}
