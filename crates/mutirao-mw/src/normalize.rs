//! The normalization tool (seed 003 §4): a serial benchmark's time per host becomes each host's
//! capacity relative to the fastest, `norm_i = T_best / T_i`; Σnorm is the cluster's effective
//! processor count, and efficiency = speedup / Σnorm.
//!
//! ```
//! use mutirao_mw::normalize::{normalize, table};
//! let rows = normalize(&[("Worker02".into(), 28.964), ("Worker04".into(), 111.39)]).unwrap();
//! assert_eq!(format!("{:.6}", rows[1].norm), "0.260023");
//! assert!(table(&rows).contains("| Worker04 | 111.390000 | 28.964000 | 0.260023 |"));
//! ```

use crate::{Error, Result};
use serde::{Deserialize, Serialize};

/// One row of Table 3.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NormRow {
    /// Host or worker name.
    pub name: String,
    /// Its benchmark time, s.
    pub time_s: f64,
    /// The best time of all, s.
    pub best_s: f64,
    /// `best / time`.
    pub norm: f64,
}

/// Table 2 → Table 3. Errors on an empty list or a time that is not a positive number.
pub fn normalize(times: &[(String, f64)]) -> Result<Vec<NormRow>> {
    if times.is_empty() {
        return Err(Error::Invalid("no benchmark times to normalize".into()));
    }
    for (n, t) in times {
        if !(t.is_finite() && *t > 0.0) {
            return Err(Error::Invalid(format!(
                "{n}: benchmark time {t} s must be a positive number"
            )));
        }
    }
    let best = times.iter().map(|x| x.1).fold(f64::INFINITY, f64::min);
    Ok(times
        .iter()
        .map(|(n, t)| NormRow {
            name: n.clone(),
            time_s: *t,
            best_s: best,
            norm: best / t,
        })
        .collect())
}

/// Σnorm: the effective processor count.
pub fn sum_norm(rows: &[NormRow]) -> f64 {
    rows.iter().map(|r| r.norm).sum()
}

/// Efficiency of a run: `speedup / Σnorm`, with speedup = serial time on the fastest host ÷
/// parallel time.
pub fn efficiency(serial_s: f64, parallel_s: f64, sum_norm: f64) -> f64 {
    serial_s / parallel_s / sum_norm
}

/// Table 3 as markdown, times and norms to 6 decimals (the paper's precision).
pub fn table(rows: &[NormRow]) -> String {
    let mut s = String::from(
        "| Worker | Benchmark time (s) | Best time obtained (s) | Normalized value |\n|---|---|---|---|\n",
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {:.6} | {:.6} | {:.6} |\n",
            r.name, r.time_s, r.best_s, r.norm
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_2_gives_table_3_to_six_decimals() {
        let t2 = [
            ("Worker01", 29.448),
            ("Worker02", 28.964),
            ("Worker03", 29.450),
            ("Worker05", 83.812),
            ("Worker04", 111.390),
        ];
        let rows = normalize(&t2.map(|(n, t)| (n.to_string(), t))).unwrap();
        let got: Vec<String> = rows.iter().map(|r| format!("{:.6}", r.norm)).collect();
        assert_eq!(
            got,
            ["0.983564", "1.000000", "0.983497", "0.345583", "0.260023"]
        );
        assert!(rows.iter().all(|r| r.best_s == 28.964));
        // The digest sums the rounded norms (3.572667); unrounded it is 3.572668.
        assert!((sum_norm(&rows) - 3.572668).abs() < 1e-6);
    }

    #[test]
    fn bad_times_are_refused() {
        assert!(normalize(&[]).is_err());
        let e = normalize(&[("w".into(), 0.0)]).unwrap_err().to_string();
        assert!(e.contains("w: benchmark time 0"), "{e}");
    }
}
