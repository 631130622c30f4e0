//! Thesis Tables 4.27–4.29 (digest 000 §3.2): the H estimators Eq. 4.1–4.3 reproduce the printed
//! H_est columns, and the error convention reproduces the printed error columns.

use mutirao_model::hcap::{estimate, thesis_error_pct, HCalibrated, HEstimator, HNow};

/// (host, q_cal, h_cal, q_now, h_est printed, h_measured, error % printed) — Table 4.27.
const T427: [(&str, f64, f64, f64, f64, f64, f64); 12] = [
    ("sn00", 1.0, 26.0, 3.0, 78.0, 54.0, 44.44),
    ("sn01", 1.0, 26.0, 2.0, 52.0, 40.0, 30.00),
    ("sn02", 1.0, 26.0, 1.0, 26.0, 25.0, 4.00),
    ("sn04", 1.0, 26.0, 1.0, 26.0, 25.0, 4.00),
    ("jenipapo", 1.0, 40.0, 1.0, 40.0, 40.0, 0.00),
    ("caju", 1.0, 42.0, 1.0, 42.0, 42.0, 0.00),
    ("sn16", 1.0, 26.0, 2.0, 52.0, 39.0, 33.33),
    ("sn17", 1.0, 26.0, 1.0, 26.0, 25.0, 4.00),
    ("n19", 1.0, 42.0, 6.0, 252.0, 221.0, 14.02),
    ("sn20", 1.0, 42.0, 6.0, 252.0, 222.0, 13.51),
    ("sn21", 1.0, 42.0, 6.0, 252.0, 224.0, 12.50),
    ("sn22", 1.0, 42.0, 6.0, 252.0, 223.0, 13.00),
];

/// (host, h_cal, load_now, h_est printed, h_measured, error % printed) — Table 4.28.
const T428: [(&str, f64, f64, f64, f64, f64); 12] = [
    ("sn00", 26.0, 2.11, 55.0, 54.0, 1.81),
    ("sn01", 26.0, 1.05, 27.0, 40.0, -48.14),
    ("sn02", 26.0, 0.05, 26.0, 25.0, 4.00),
    ("sn04", 26.0, 0.07, 26.0, 25.0, 4.00),
    ("jenipapo", 40.0, 0.06, 40.0, 40.0, 0.00),
    ("caju", 42.0, 0.13, 42.0, 42.0, 0.00),
    ("sn16", 26.0, 1.10, 29.0, 39.0, -34.48),
    ("sn17", 26.0, 0.06, 26.0, 25.0, 4.00),
    ("n19", 42.0, 5.08, 213.0, 221.0, -3.75),
    ("n20", 42.0, 5.12, 215.0, 222.0, -3.25),
    ("n21", 42.0, 5.05, 212.0, 224.0, -4.24),
    ("n22", 42.0, 5.06, 212.0, 223.0, -5.18),
];

/// (host, h_cal, wall_us, cpu_us, h_est printed, h_real, error % printed) — Table 4.29.
const T429: [(&str, f64, f64, f64, f64, f64, f64); 12] = [
    ("sn00", 26.0, 4818706.0, 2790000.0, 45.0, 54.0, -19.90),
    ("sn01", 26.0, 3644149.0, 2800000.0, 34.0, 40.0, -17.64),
    ("sn02", 26.0, 2790625.0, 2790000.0, 26.0, 26.0, 0.00),
    ("sn04", 26.0, 2791409.0, 2790000.0, 26.0, 26.0, 0.00),
    ("jenipapo", 40.0, 3506312.0, 3450000.0, 41.0, 40.0, 2.50),
    ("caju", 42.0, 4026773.0, 3810000.0, 44.0, 42.0, 4.76),
    ("sn16", 26.0, 3933088.0, 2800000.0, 36.0, 39.0, -8.33),
    ("sn17", 26.0, 2795377.0, 2800000.0, 26.0, 25.0, 4.00),
    ("n19", 42.0, 24105993.0, 4490000.0, 225.0, 221.0, 1.81),
    ("n20", 42.0, 23664450.0, 4520000.0, 220.0, 222.0, -1.00),
    ("n21", 42.0, 23906317.0, 4510000.0, 223.0, 224.0, -0.50),
    ("n22", 42.0, 22690068.0, 4440000.0, 215.0, 223.0, -3.72),
];

/// Rows whose printed H_est is not the rounded value (the thesis's own rounding slips):
/// Eq. 4.2 n22: 42·5.06 = 212.52, printed 212; Eq. 4.3 sn16: 36.52, printed 36.
const SLIPS: [(&str, &str); 2] = [("4.2", "n22"), ("4.3", "sn16")];

fn check(eq: &str, host: &str, est: f64, printed: f64) {
    assert!(
        (est - printed).abs() <= 1.0,
        "Eq. {eq} {host}: computed {est:.3}, printed {printed}"
    );
    if SLIPS.contains(&(eq, host)) {
        assert_ne!(est.round(), printed, "Eq. {eq} {host} is a known slip");
    } else {
        assert_eq!(est.round(), printed, "Eq. {eq} {host}: computed {est:.3}");
    }
}

#[test]
fn eq41_reproduces_table_4_27() {
    for (host, qc, hc, qn, printed, _, _) in T427 {
        let cal = HCalibrated {
            h: hc,
            queue_len: qc,
            load: 0.0,
        };
        let now = HNow {
            queue_len: Some(qn),
            ..HNow::default()
        };
        check(
            "4.1",
            host,
            estimate(HEstimator::QueueLength, &cal, &now).unwrap(),
            printed,
        );
    }
}

#[test]
fn eq42_reproduces_table_4_28_with_the_clamp_at_one() {
    for (host, hc, load, printed, _, _) in T428 {
        let cal = HCalibrated {
            h: hc,
            queue_len: 1.0,
            load: 0.0,
        };
        let now = HNow {
            load: Some(load),
            ..HNow::default()
        };
        check(
            "4.2",
            host,
            estimate(HEstimator::LoadAverage, &cal, &now).unwrap(),
            printed,
        );
    }
}

#[test]
fn eq43_reproduces_table_4_29() {
    for (host, hc, wall, cpu, printed, _, _) in T429 {
        let cal = HCalibrated {
            h: hc,
            queue_len: 1.0,
            load: 0.0,
        };
        let now = HNow {
            wall_us: Some(wall),
            cpu_us: Some(cpu),
            ..HNow::default()
        };
        check(
            "4.3",
            host,
            estimate(HEstimator::WallCpu, &cal, &now).unwrap(),
            printed,
        );
    }
}

/// Printed error cells that no single convention reproduces (the thesis mixes conventions and
/// truncations, digest 000 §9 item 13).
const ERROR_SLIPS: [(&str, &str); 5] = [
    ("4.28", "sn00"),
    ("4.28", "n21"),
    ("4.29", "sn00"),
    ("4.29", "n20"),
    ("4.29", "n21"),
];

#[test]
fn error_columns_follow_the_min_denominator_convention() {
    // From the printed H_est and H_measured, (est − meas)/min(est, meas) gives the printed error
    // within 0.02 points in 31 of the 36 rows; the other 5 are listed slips.
    let mut rows: Vec<(&str, &str, f64, f64, f64)> = Vec::new();
    rows.extend(T427.iter().map(|r| ("4.27", r.0, r.4, r.5, r.6)));
    rows.extend(T428.iter().map(|r| ("4.28", r.0, r.3, r.4, r.5)));
    rows.extend(T429.iter().map(|r| ("4.29", r.0, r.4, r.5, r.6)));
    for (table, host, est, meas, pct) in rows {
        let e = thesis_error_pct(est, meas);
        let ok = (e - pct).abs() < 0.02;
        if ERROR_SLIPS.contains(&(table, host)) {
            assert!(!ok, "{table} {host} was listed as a slip but matches");
        } else {
            assert!(ok, "{table} {host}: {e:.3} vs printed {pct}");
        }
    }
}

#[test]
fn mean_absolute_errors_rank_eq43_best() {
    let mae = |v: &[f64]| v.iter().map(|x| x.abs()).sum::<f64>() / v.len() as f64;
    let e41: Vec<f64> = T427.iter().map(|r| r.6).collect();
    let e42: Vec<f64> = T428.iter().map(|r| r.5).collect();
    let e43: Vec<f64> = T429.iter().map(|r| r.6).collect();
    // Digest 000 §3.2: 14.4% / 9.4% / 5.3%.
    assert!((mae(&e41) - 14.4).abs() < 0.05, "{}", mae(&e41));
    assert!((mae(&e42) - 9.4).abs() < 0.05, "{}", mae(&e42));
    assert!((mae(&e43) - 5.3).abs() < 0.05, "{}", mae(&e43));
    // Our estimates, scored against the measured H with the same convention, rank the same way.
    let ours = |f: &dyn Fn(usize) -> f64, meas: &dyn Fn(usize) -> f64| {
        mae(&(0..12)
            .map(|i| thesis_error_pct(f(i), meas(i)))
            .collect::<Vec<_>>())
    };
    let o41 = ours(&|i| T427[i].2 * T427[i].3 / T427[i].1, &|i| T427[i].5);
    let o42 = ours(&|i| T428[i].1 * T428[i].2.max(1.0), &|i| T428[i].4);
    let o43 = ours(&|i| T429[i].1 * T429[i].2 / T429[i].3, &|i| T429[i].5);
    assert!(o43 < o42 && o42 < o41, "{o41} {o42} {o43}");
    assert_eq!(HEstimator::default(), HEstimator::WallCpu);
}
