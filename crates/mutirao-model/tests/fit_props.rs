//! Properties: the modeller never panics, and every model it produces validates.

use mutirao_model::calib::{
    CalibHost, Calibration, PingPongSample, SendMode, SpeedMeasurement, SpeedSample, StrategyKind,
};
use mutirao_model::fit::{fit, segmented_fit, FitOptions, SegOptions};
use proptest::prelude::*;

fn value() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => 0.0f64..1e7,
        1 => -1e6f64..0.0,
        1 => Just(0.0),
        1 => 1e-9f64..1e-3,
        1 => -1e15f64..1e15,
    ]
}

fn sample() -> impl Strategy<Value = PingPongSample> {
    (value(), value(), value(), value(), value()).prop_map(|(r, a, b, c, d)| PingPongSample {
        rtt_us: r,
        os_src_us: a,
        or_dst_us: b,
        os_dst_us: c,
        or_src_us: d,
        probe_us: None,
        wait_src_us: None,
    })
}

/// A random calibration: 1–4 hosts on 1–2 sites, random measured pairs, sizes and samples, some
/// hosts without a speed measurement.
fn calibration() -> impl Strategy<Value = Calibration> {
    (1usize..=4, 1usize..=2)
        .prop_flat_map(|(n, sites)| {
            let hosts =
                prop::collection::vec((prop::option::weighted(0.85, 1e-3f64..1e6), 1u64..1000), n);
            let pairs = prop::collection::vec(
                (
                    0..n,
                    0..n,
                    prop::bool::ANY,
                    prop::collection::vec(
                        (
                            prop_oneof![0u64..100, 64u64..(1u64 << 26), Just(u64::MAX / 2)],
                            prop::collection::vec(sample(), 1..4),
                        ),
                        1..8,
                    ),
                ),
                0..8,
            );
            (Just(n), Just(sites), hosts, pairs)
        })
        .prop_map(|(n, sites, hosts, pairs)| {
            let mut c = Calibration::new(StrategyKind::AllPairs, "prop", 0);
            for (i, (h, reps)) in hosts.into_iter().enumerate() {
                let mut host = CalibHost::new(&format!("h{i}"), &format!("s{}", i % sites), "x");
                host.speed = h.map(|h| SpeedMeasurement {
                    kernel: "k".into(),
                    reps,
                    samples: vec![SpeedSample {
                        wall_us: h,
                        cpu_us: h / 2.0,
                    }],
                });
                c.add_host(host).unwrap();
            }
            let _ = n;
            for (a, b, isend, sizes) in pairs {
                let mode = if isend {
                    SendMode::Isend
                } else {
                    SendMode::Send
                };
                for (bytes, samples) in sizes {
                    c.record_pingpong(&format!("h{a}"), &format!("h{b}"), mode, bytes, 0, &samples)
                        .unwrap();
                }
            }
            c.finalize(1);
            c
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn fit_never_panics_and_models_validate(c in calibration(), max_segments in 1usize..6, min_sizes in 1usize..4) {
        let mut o = FitOptions::default();
        o.seg.max_segments = max_segments;
        o.seg.min_sizes_per_segment = min_sizes;
        if let Ok((model, report)) = fit(&c, &o) {
            prop_assert!(model.validate().is_ok());
            prop_assert_eq!(report.hosts.len(), model.hosts.len());
            for h in &model.hosts {
                prop_assert!(h.speed > 0.0 && h.speed <= 1.0 + 1e-12);
            }
            // Every pair is either covered or reported as uncovered.
            let mut uncovered = 0;
            for a in &model.hosts {
                for b in &model.hosts {
                    if model.link_for(&a.name, &b.name).is_err() {
                        uncovered += 1;
                    }
                }
            }
            prop_assert_eq!(uncovered, report.uncovered.len());
            // The JSON round-trips through the validating parser.
            prop_assert!(mutirao_model::Model::from_json(&model.to_json()).is_ok());
        }
        // The calibration itself round-trips.
        let back = Calibration::from_json(&c.to_json());
        prop_assert!(back.is_ok(), "{:?}", back.err());
    }

    #[test]
    fn segmented_fit_gives_valid_functions(
        pts in prop::collection::vec((0u64..(1u64 << 40), -1e9f64..1e9), 1..60),
        max_segments in 1usize..6,
        min_sizes in 1usize..4,
        max_candidates in 2usize..10,
    ) {
        let o = SegOptions { max_segments, min_sizes_per_segment: min_sizes, weight_floor_us: 0.5, max_candidates, rel_tolerance: 0.02, max_precise_miss: 0.10 };
        let f = segmented_fit(&pts, &o).expect("finite points always fit");
        let segs = &f.function.0;
        prop_assert_eq!(segs[0].from, 0);
        prop_assert!(segs.len() <= max_segments);
        for w in segs.windows(2) {
            prop_assert!(w[0].from < w[1].from);
        }
        for s in segs {
            prop_assert!(s.base_us.is_finite() && s.base_us >= 0.0);
            prop_assert!(s.per_byte_us.is_finite() && s.per_byte_us >= 0.0);
        }
    }
}

#[test]
fn timings_beyond_the_bound_are_rejected_with_their_place() {
    let mut c = Calibration::new(StrategyKind::AllPairs, "t", 0);
    c.add_host(CalibHost::new("a", "s", "x")).unwrap();
    let s = PingPongSample {
        rtt_us: 1e300,
        os_src_us: 0.0,
        or_dst_us: 0.0,
        os_dst_us: 0.0,
        or_src_us: 0.0,
        probe_us: None,
        wait_src_us: None,
    };
    c.record_pingpong("a", "a", SendMode::Send, 8, 0, &[s])
        .unwrap();
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("sizes[0] (8 B): samples[0].rtt_us"), "{e}");
}
