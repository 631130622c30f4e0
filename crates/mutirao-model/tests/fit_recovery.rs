//! Truth recovery (issue 11, item 3): synthetic calibrations drawn from known piecewise truths,
//! with noise and random size lists of 3–20 sizes, are fitted by the default options to a model
//! whose one-way time (Os + L + Or) is within 5% of the truth at every measured size; and a
//! fit's quality check never lets a model that misses the measurements through silently.

use mutirao_model::calib::{
    CalibHost, Calibration, PingPongSample, SendMode, SpeedMeasurement, SpeedSample, StrategyKind,
};
use mutirao_model::fit::{fit_default, poor_fits, FitError};
use mutirao_model::{Piecewise, Segment};
use proptest::prelude::*;

/// A piecewise-linear truth: (from bytes, intercept µs, slope µs/B), sorted by `from`.
#[derive(Debug, Clone)]
struct Truth(Vec<(u64, f64, f64)>);

impl Truth {
    fn at(&self, m: u64) -> f64 {
        let &(from, a, b) = self.0.iter().rev().find(|s| s.0 <= m).unwrap();
        a + b * (m - from) as f64
    }
}

/// A link's L: a latency of 5 µs–2 ms and a rate of 1 Mbit/s–10 Gbit/s, optionally switching at
/// a breakpoint (eager → rendezvous) to an extra round trip and another rate.
fn l_truth() -> impl Strategy<Value = Truth> {
    (
        5.0f64..2000.0,
        1.0f64..10_000.0,
        prop::option::of((1024u64..(512 << 10), 1.0f64..3.0, 0.5f64..2.0)),
    )
        .prop_map(|(lat, mbit, switch)| {
            let slope = 8.0 / mbit; // µs per byte
            let mut segs = vec![(0, lat, slope)];
            if let Some((at, extra, rate_factor)) = switch {
                let base = lat + slope * at as f64;
                segs.push((at, base + extra * lat, slope * rate_factor));
            }
            Truth(segs)
        })
}

/// An overhead: a few µs, a copy cost per byte, optionally flattening (or growing) past a size.
fn overhead_truth() -> impl Strategy<Value = Truth> {
    (
        1.0f64..50.0,
        0.0f64..2e-3,
        prop::option::of((4096u64..(512 << 10), 0.0f64..2.0)),
    )
        .prop_map(|(a, b, bend)| {
            let mut segs = vec![(0, a, b)];
            if let Some((at, f)) = bend {
                segs.push((at, a + b * at as f64, b * f));
            }
            Truth(segs)
        })
}

/// 3–20 distinct sizes from 0 to 1 MiB, log-uniform.
fn size_list() -> impl Strategy<Value = Vec<u64>> {
    prop::collection::vec(prop_oneof![1 => Just(-1.0f64), 9 => 0.0f64..20.0], 3..=20)
        .prop_map(|s| {
            let mut v: Vec<u64> = s
                .into_iter()
                .map(|e| {
                    if e < 0.0 {
                        0
                    } else {
                        2f64.powf(e).round() as u64
                    }
                })
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        })
        .prop_filter("at least three distinct sizes", |v| v.len() >= 3)
}

/// xorshift64*: deterministic noise.
struct Rng(u64);
impl Rng {
    fn noise(&mut self, a: f64) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let u = (self.0.wrapping_mul(0x2545F4914F6CDD1D) >> 11) as f64 / (1u64 << 53) as f64;
        1.0 + a * (2.0 * u - 1.0)
    }
}

/// A two-host calibration of `a -> b` (and back) under the truths, seven samples per size with
/// uniform multiplicative noise of ±`noise`.
fn calibration(
    l: &Truth,
    os: &Truth,
    or: &Truth,
    sizes: &[u64],
    noise: f64,
    seed: u64,
) -> Calibration {
    let mut rng = Rng(seed | 1);
    let mut c = Calibration::new(StrategyKind::AllPairs, "recovery", 1);
    for n in ["a", "b"] {
        let mut h = CalibHost::new(n, "s", "127.0.0.1:0");
        h.speed = Some(SpeedMeasurement {
            kernel: "k".into(),
            reps: 100,
            samples: vec![SpeedSample {
                wall_us: 100.0,
                cpu_us: 100.0,
            }],
        });
        c.add_host(h).unwrap();
    }
    for &(src, dst) in &[("a", "b"), ("b", "a")] {
        for &m in sizes {
            let samples: Vec<PingPongSample> = (0..7)
                .map(|_| {
                    let (osa, orb) = (os.at(m) * rng.noise(noise), or.at(m) * rng.noise(noise));
                    let (osb, ora) = (os.at(m) * rng.noise(noise), or.at(m) * rng.noise(noise));
                    let lat = l.at(m) * rng.noise(noise);
                    PingPongSample {
                        rtt_us: osa + orb + osb + ora + 2.0 * lat,
                        os_src_us: osa,
                        or_dst_us: orb,
                        os_dst_us: osb,
                        or_src_us: ora,
                        probe_us: None,
                        wait_src_us: None,
                    }
                })
                .collect();
            c.record_pingpong(src, dst, SendMode::Isend, m, 1, &samples)
                .unwrap();
        }
    }
    c.finalize(1);
    c.validate().unwrap();
    c
}

fn one_way(l: &Piecewise, os: &Piecewise, or: &Piecewise, m: u64) -> f64 {
    l.value(m) + os.value(m) + or.value(m)
}

/// The default list of `mutirao calibrate --sizes`.
fn default_sizes() -> Vec<u64> {
    vec![
        0, 64, 256, 1024, 4096, 16384, 32768, 65536, 131072, 262144, 524288, 1048576,
    ]
}

fn check_recovery(
    l: &Truth,
    os: &Truth,
    or: &Truth,
    sizes: &[u64],
    seed: u64,
) -> Result<(), TestCaseError> {
    let c = calibration(l, os, or, sizes, 0.02, seed);
    let (model, report) = fit_default(&c).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let link = model.link_for("a", "b").unwrap();
    for &m in sizes {
        let truth = l.at(m) + os.at(m) + or.at(m);
        let got = one_way(&link.l, &link.os, &link.or, m);
        prop_assert!(
            (got / truth - 1.0).abs() <= 0.05,
            "at {} B: truth {:.2} us, model {:.2} us ({:+.1}%); sizes {:?}\nL {:?}\nOs {:?}\nOr {:?}",
            m,
            truth,
            got,
            100.0 * (got / truth - 1.0),
            sizes,
            link.l,
            link.os,
            link.or
        );
    }
    // The fit's own quality check agrees: nothing missed.
    let misses = poor_fits(&c, &model, &report, 0.10, 5.0);
    prop_assert!(misses.is_empty(), "{misses:?}");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn truths_are_recovered_from_any_size_list(
        l in l_truth(), os in overhead_truth(), or in overhead_truth(),
        sizes in size_list(), seed in any::<u64>(),
    ) {
        check_recovery(&l, &os, &or, &sizes, seed)?;
    }

    #[test]
    fn truths_are_recovered_from_the_default_size_list(
        l in l_truth(), os in overhead_truth(), or in overhead_truth(), seed in any::<u64>(),
    ) {
        check_recovery(&l, &os, &or, &default_sizes(), seed)?;
    }
}

/// Issue 11's report: five sizes (0, 1K, 64K, 256K, 1M) across a 30 Mbit/s WAN; the old fit
/// drew one line whose bandwidth the small sizes set and predicted 3.7 ms for a 258 ms message.
#[test]
fn a_short_size_list_across_a_slow_wan_keeps_the_measured_bandwidth() {
    let l = Truth(vec![(0, 15_000.0, 8.0 / 30.0)]);
    let os = Truth(vec![(0, 20.0, 1e-4)]);
    let or = Truth(vec![(0, 10.0, 1e-4)]);
    let sizes = [0, 1024, 65536, 262144, 1048576];
    let c = calibration(&l, &os, &or, &sizes, 0.02, 7);
    let (model, _) = fit_default(&c).unwrap();
    let link = model.link_for("a", "b").unwrap();
    let got = one_way(&link.l, &link.os, &link.or, 1 << 20);
    let truth = l.at(1 << 20) + os.at(1 << 20) + or.at(1 << 20);
    assert!(
        (got / truth - 1.0).abs() < 0.05,
        "1 MiB: model {got:.0} us, truth {truth:.0} us"
    );
    // The last segment's slope is the measured rate (30 Mbit/s), not the small sizes'.
    let last: &Segment = link.l.0.last().unwrap();
    assert!(
        (last.per_byte_us / (8.0 / 30.0) - 1.0).abs() < 0.05,
        "{last:?}"
    );
}

/// A model that misses the measurements is named: class/pair, size, measured and modelled.
#[test]
fn a_model_that_misses_is_reported_with_its_place() {
    let l = Truth(vec![(0, 100.0, 0.01), (65536, 2000.0, 0.02)]);
    let os = Truth(vec![(0, 5.0, 0.0)]);
    let or = Truth(vec![(0, 5.0, 0.0)]);
    let sizes = default_sizes();
    let c = calibration(&l, &os, &or, &sizes, 0.01, 3);
    let (mut model, report) = fit_default(&c).unwrap();
    assert!(poor_fits(&c, &model, &report, 0.10, 5.0).is_empty());
    // Break the model: one line through the origin at the small sizes' rate.
    for link in &mut model.links {
        link.l = Piecewise(vec![Segment {
            from: 0,
            base_us: 100.0,
            per_byte_us: 0.01,
        }]);
    }
    let misses = poor_fits(&c, &model, &report, 0.10, 5.0);
    assert!(!misses.is_empty());
    assert!(
        misses
            .iter()
            .any(|m| m.contains("a -> b") && m.contains("1048576 B")),
        "{misses:?}"
    );
}

/// Fewer than three sizes cannot be fitted: a clear error that says how many and what to do.
#[test]
fn fewer_than_three_sizes_is_an_error() {
    let l = Truth(vec![(0, 100.0, 0.01)]);
    let o = Truth(vec![(0, 5.0, 0.0)]);
    let c = calibration(&l, &o, &o, &[1024, 65536], 0.01, 1);
    let e = fit_default(&c).unwrap_err();
    assert!(matches!(e, FitError::TooFewSizes { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains('2') && msg.contains("--sizes"), "{msg}");
}
