//! Calibration plans: pair counts (digest 000 §11.8 item 7), complete coverage, inheritance
//! sources, and type-sampled clustering of mixed sites.

use mutirao_model::calib::StrategyKind;
use mutirao_model::strategy::{plan, Plan, PlanError, PlanHost, PlanOptions};
use std::collections::HashSet;

fn ten_hosts_three_sites() -> Vec<PlanHost> {
    let mut v = Vec::new();
    for n in ["u1", "u2", "u3", "u4"] {
        v.push(PlanHost::with_h(n, "uff", 26.0));
    }
    for n in ["s1", "s2", "s3"] {
        v.push(PlanHost::with_h(n, "sin", 26.0));
    }
    for n in ["p1", "p2", "p3"] {
        v.push(PlanHost::with_h(n, "puc", 40.0));
    }
    v
}

/// Every ordered pair (same-host ones when asked) is measured or inherited exactly once, and
/// every inheritance source is measured.
fn assert_complete(p: &Plan, hosts: &[PlanHost], same_host: bool) {
    let measured: HashSet<_> = p.measure.iter().cloned().collect();
    assert_eq!(measured.len(), p.measure.len(), "a pair measured twice");
    let mut all = measured.clone();
    for i in &p.inherit {
        assert!(
            measured.contains(&i.from),
            "{} inherits from unmeasured {}",
            i.pair,
            i.from
        );
        assert!(all.insert(i.pair.clone()), "{} covered twice", i.pair);
    }
    let n = hosts.len();
    let expect = if same_host { n * n } else { n * (n - 1) };
    assert_eq!(all.len(), expect);
    for a in hosts {
        for b in hosts {
            if a.name != b.name || same_host {
                assert!(p.source_for(&a.name, &b.name).is_some());
            }
        }
    }
}

#[test]
fn pair_counts_match_the_thesis_example() {
    let hosts = ten_hosts_three_sites();
    let bare = PlanOptions {
        same_host: false,
        both_directions: false,
        ..PlanOptions::default()
    };
    let all = plan(StrategyKind::AllPairs, &hosts, &bare).unwrap();
    assert_eq!(all.measure.len(), 90);
    assert!(all.inherit.is_empty());
    assert_complete(&all, &hosts, false);
    let site = plan(StrategyKind::SiteSampled, &hosts, &bare).unwrap();
    // 3 intra pairs + 6 inter.
    assert_eq!(site.measure.len(), 9);
    assert_complete(&site, &hosts, false);
    let full = plan(StrategyKind::SiteSampled, &hosts, &PlanOptions::default()).unwrap();
    // 6 intra (both directions) + 6 inter + 3 same-host.
    assert_eq!(full.measure.len(), 15);
    assert_complete(&full, &hosts, true);
    let all_full = plan(StrategyKind::AllPairs, &hosts, &PlanOptions::default()).unwrap();
    assert_eq!(all_full.measure.len(), 100);
}

#[test]
fn site_sampled_inherits_from_site_representatives() {
    let hosts = ten_hosts_three_sites();
    let p = plan(StrategyKind::SiteSampled, &hosts, &PlanOptions::default()).unwrap();
    assert_eq!(p.source_for("u3", "u4").unwrap().to_string(), "u1 -> u2");
    assert_eq!(p.source_for("u3", "p2").unwrap().to_string(), "u1 -> p1");
    assert_eq!(p.source_for("p3", "p3").unwrap().to_string(), "p1 -> p1");
    assert_eq!(p.source_for("u2", "u1").unwrap().to_string(), "u2 -> u1");
    assert!(p.clusters.is_empty());
}

#[test]
fn type_sampled_separates_host_types_of_a_mixed_site() {
    // The thesis's UFF: four P4s (H 26) and two Athlons (H 40, 42) on one site.
    let mut hosts = vec![
        PlanHost::with_h("sn02", "uff", 26.0),
        PlanHost::with_h("sn04", "uff", 26.5),
        PlanHost::with_h("jenipapo", "uff", 40.0),
        PlanHost::with_h("caju", "uff", 42.0),
        PlanHost::with_h("sn00", "uff", 25.5),
    ];
    hosts.push(PlanHost::with_h("n19", "puc", 40.0));
    hosts.push(PlanHost::with_h("n20", "puc", 40.0));
    let p = plan(StrategyKind::TypeSampled, &hosts, &PlanOptions::default()).unwrap();
    let members: Vec<(String, Vec<String>)> = p
        .clusters
        .iter()
        .map(|c| (c.representative.clone(), c.members.clone()))
        .collect();
    assert_eq!(
        members,
        [
            (
                "sn02".to_string(),
                vec!["sn02".to_string(), "sn04".into(), "sn00".into()]
            ),
            (
                "jenipapo".to_string(),
                vec!["jenipapo".to_string(), "caju".into()]
            ),
            ("n19".to_string(), vec!["n19".to_string(), "n20".into()]),
        ]
    );
    assert_complete(&p, &hosts, true);
    // An Athlon's links come from an Athlon representative, never from a P4.
    assert_eq!(
        p.source_for("caju", "sn00").unwrap().to_string(),
        "jenipapo -> sn02"
    );
    // Both directions of the sampled pair inside a cluster are measured.
    assert_eq!(
        p.source_for("caju", "jenipapo").unwrap().to_string(),
        "caju -> jenipapo"
    );
    assert_eq!(
        p.source_for("caju", "n20").unwrap().to_string(),
        "jenipapo -> n19"
    );
    assert_eq!(
        p.source_for("n20", "caju").unwrap().to_string(),
        "n19 -> jenipapo"
    );
    // Site-sampled on the same hosts makes the Athlons inherit from P4s.
    let s = plan(StrategyKind::SiteSampled, &hosts, &PlanOptions::default()).unwrap();
    assert_eq!(
        s.source_for("caju", "sn00").unwrap().to_string(),
        "sn02 -> sn04"
    );
    assert!(p.measure.len() > s.measure.len());
    assert!(p.measure.len() < 49);
}

#[test]
fn link_and_cpu_model_split_clusters() {
    let mut a = PlanHost::with_h("a1", "s", 10.0);
    a.link = Some(800.0);
    let mut b = PlanHost::with_h("a2", "s", 10.0);
    b.link = Some(200.0);
    let mut c = PlanHost::with_h("a3", "s", 10.0);
    c.cpu_model = Some("x".into());
    let mut d = PlanHost::with_h("a4", "s", 10.0);
    d.cpu_model = Some("y".into());
    let hosts = vec![a, b, c, d];
    let p = plan(StrategyKind::TypeSampled, &hosts, &PlanOptions::default()).unwrap();
    // a1 | a2 | a3 joins a1 (no link/cpu conflict) | a4 conflicts with a3 only -> joins a1.
    assert_eq!(p.clusters.len(), 2);
    assert_eq!(p.clusters[0].members, ["a1", "a3", "a4"]);
    assert_complete(&p, &hosts, true);
}

#[test]
fn bad_inputs_are_named() {
    let hosts = vec![PlanHost::new("a", "s"), PlanHost::new("a", "s")];
    assert_eq!(
        plan(StrategyKind::AllPairs, &hosts, &PlanOptions::default()).unwrap_err(),
        PlanError::DuplicateHost("a".into())
    );
    let hosts = vec![PlanHost::with_h("a", "s", 1.0), PlanHost::new("b", "s")];
    let e = plan(StrategyKind::TypeSampled, &hosts, &PlanOptions::default()).unwrap_err();
    assert_eq!(e, PlanError::MissingSpeed("b".into()));
    let hosts = vec![PlanHost::with_h("a", "s", f64::NAN)];
    let e = plan(StrategyKind::SiteSampled, &hosts, &PlanOptions::default()).unwrap_err();
    assert!(e.to_string().contains("\"a\""), "{e}");
}

#[test]
fn plans_cover_every_pair_for_many_shapes() {
    // Deterministic sweep of shapes: 1..=7 hosts over 1..=3 sites, mixed speeds.
    for n in 1..=7usize {
        for sites in 1..=3usize {
            let hosts: Vec<PlanHost> = (0..n)
                .map(|i| {
                    PlanHost::with_h(
                        &format!("h{i}"),
                        &format!("s{}", i % sites),
                        [1.0, 1.05, 2.0, 4.0][i % 4],
                    )
                })
                .collect();
            for strat in [
                StrategyKind::AllPairs,
                StrategyKind::SiteSampled,
                StrategyKind::TypeSampled,
            ] {
                for same_host in [true, false] {
                    for both_directions in [true, false] {
                        let o = PlanOptions {
                            same_host,
                            both_directions,
                            tolerance: 0.1,
                        };
                        let p = plan(strat, &hosts, &o).unwrap();
                        assert_complete(&p, &hosts, same_host);
                    }
                }
            }
        }
    }
}
