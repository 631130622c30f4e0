//! Write a synthetic `mutirao-calib/1` file with a known truth, for trying `mutirao fit` and the
//! legacy writers without a testbed:
//!
//! ```text
//! cargo run -p mutirao-model --example synth_calib -- [all-pairs|site-sampled|type-sampled] > calib.json
//! mutirao fit calib.json -o model.json --report
//! ```
//!
//! Truth: site `a` (800 Mbit/s host links, hosts at cpu 1.0, 0.5, 0.25), site `b` (200 Mbit/s,
//! cpu 1.0), 40 Mbit/s between them; an eager → rendezvous switch above 64 KiB; ±2% noise.

use mutirao_model::calib::{
    CalibHost, Calibration, PingPongSample, SendMode, SpeedMeasurement, SpeedSample, StrategyKind,
};
use mutirao_model::strategy::{plan, PlanHost, PlanOptions};

fn main() {
    let strategy = match std::env::args().nth(1).as_deref() {
        None | Some("all-pairs") => StrategyKind::AllPairs,
        Some("site-sampled") => StrategyKind::SiteSampled,
        Some("type-sampled") => StrategyKind::TypeSampled,
        Some(other) => {
            eprintln!("unknown strategy {other:?}: use all-pairs, site-sampled or type-sampled");
            std::process::exit(2);
        }
    };
    let hosts = [
        ("a1", "a", 1.0),
        ("a2", "a", 0.5),
        ("a3", "a", 0.25),
        ("b1", "b", 1.0),
    ];
    let mut seed = 0x9E3779B97F4A7C15u64;
    let mut noise = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        1.0 + 0.02 * (2.0 * ((seed >> 11) as f64 / (1u64 << 53) as f64) - 1.0)
    };
    let site = |h: &str| hosts.iter().find(|x| x.0 == h).map(|x| x.1).unwrap_or("?");
    let cpu = |h: &str| hosts.iter().find(|x| x.0 == h).map(|x| x.2).unwrap_or(1.0);
    let mut c = Calibration::new(strategy, "synth_calib example", 0);
    c.provenance.transport = "synthetic".into();
    for (n, s, q) in hosts {
        let mut h = CalibHost::new(n, s, "127.0.0.1:0");
        h.os = Some("linux".into());
        h.speed = Some(SpeedMeasurement {
            kernel: "synthetic".into(),
            reps: 1000,
            samples: (0..5)
                .map(|_| SpeedSample {
                    wall_us: 2.0e5 / q * noise(),
                    cpu_us: 2.0e5,
                })
                .collect(),
        });
        c.add_host(h).expect("unique names");
    }
    let ph: Vec<PlanHost> = hosts
        .iter()
        .map(|&(n, s, q)| PlanHost::with_h(n, s, 1.0 / q))
        .collect();
    let p = plan(strategy, &ph, &PlanOptions::default()).expect("valid hosts");
    let sizes: Vec<u64> = (6..=24).map(|k| 1u64 << k).collect();
    for pair in &p.measure {
        let (s, d) = (pair.src.as_str(), pair.dst.as_str());
        let mbit = if s == d {
            40000.0
        } else if site(s) != site(d) {
            40.0
        } else if site(s) == "a" {
            800.0
        } else {
            200.0
        };
        for &m in &sizes {
            let l = 30.0 + if m > 65536 { 60.0 } else { 0.0 } + m as f64 * 8.0 / mbit;
            let samples: Vec<PingPongSample> = (0..9)
                .map(|_| {
                    let osa = (3.0 + 1e-5 * m as f64) / cpu(s) * noise();
                    let orb = (2.0 + 2e-4 * m as f64) / cpu(d) * noise();
                    let osb = (3.0 + 1e-5 * m as f64) / cpu(d) * noise();
                    let ora = (2.0 + 2e-4 * m as f64) / cpu(s) * noise();
                    PingPongSample {
                        rtt_us: osa + orb + osb + ora + 2.0 * l * noise(),
                        os_src_us: osa,
                        or_dst_us: orb,
                        os_dst_us: osb,
                        or_src_us: ora,
                        probe_us: None,
                        wait_src_us: None,
                    }
                })
                .collect();
            c.record_pingpong(s, d, SendMode::Isend, m, 5, &samples)
                .expect("hosts were added");
        }
    }
    c.provenance.inherited = p.inherit;
    c.provenance.clusters = p.clusters;
    c.finalize(1);
    println!("{}", c.to_json());
}
