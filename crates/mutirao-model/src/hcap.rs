//! Estimators of a host's current processing capacity H from its calibrated H and operating-system
//! counters (thesis Eq. 4.1–4.3, digest 000 §3.2 and §11.5).
//!
//! H is a normalised benchmark time: larger means slower or more loaded. `H_cal` is measured once
//! (at calibration, with its context: run-queue length and load); at scheduling time the current H
//! is estimated cheaply:
//!
//! * [`HEstimator::QueueLength`], Eq. 4.1: `H_cal · q_now / q_cal`;
//! * [`HEstimator::LoadAverage`], Eq. 4.2: `H_cal · max(1, load_now)` (the clamp is what the
//!   thesis's Table 4.28 applies);
//! * [`HEstimator::WallCpu`], Eq. 4.3: `H_cal · wall / cpu` of a short kernel run now.
//!
//! **The default is Eq. 4.3** ([`HEstimator::default`]): it had the lowest mean absolute error in the
//! thesis (5.3% against 14.4% and 9.4%), and it is the only one that sees a CPU quota (a cgroup
//! throttles wall time but not CPU time), which the queue length and load average do not.
//!
//! ```
//! use mutirao_model::hcap::{estimate, HCalibrated, HEstimator, HNow};
//! let cal = HCalibrated { h: 26.0, queue_len: 1.0, load: 0.0 };
//! let now = HNow { wall_us: Some(4818706.0), cpu_us: Some(2790000.0), ..HNow::default() };
//! let h = estimate(HEstimator::default(), &cal, &now).unwrap();
//! assert_eq!(h.round(), 45.0); // thesis Table 4.29, host sn00
//! ```

use serde::{Deserialize, Serialize};

/// Which estimator to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HEstimator {
    /// Eq. 4.1: scale by the run-queue length.
    QueueLength,
    /// Eq. 4.2: scale by the 1-minute load average (at least 1).
    LoadAverage,
    /// Eq. 4.3: scale by the wall/CPU time ratio of a short run (the default).
    #[default]
    WallCpu,
}

/// The calibrated H and its context.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HCalibrated {
    /// H measured at calibration.
    pub h: f64,
    /// Run-queue length when it was measured (≥ 1: the benchmark itself runs).
    pub queue_len: f64,
    /// Load average when it was measured.
    pub load: f64,
}

impl HCalibrated {
    /// The calibrated H of a calibration host (median kernel wall time per repetition) with its
    /// run queue and load; `None` if the host has no speed measurement. A missing load record
    /// counts as an idle host (queue 1, load 0).
    pub fn from_calib_host(h: &crate::calib::CalibHost) -> Option<HCalibrated> {
        let hv = h.speed.as_ref()?.h_us()?;
        Some(HCalibrated {
            h: hv,
            queue_len: h.load.map(|l| l.run_queue.max(1) as f64).unwrap_or(1.0),
            load: h.load.map(|l| l.loadavg_1m).unwrap_or(0.0),
        })
    }
}

/// What is known about the host now; each estimator needs some of it.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct HNow {
    /// Current run-queue length (Eq. 4.1).
    pub queue_len: Option<f64>,
    /// Current 1-minute load average (Eq. 4.2).
    pub load: Option<f64>,
    /// Wall time of a short kernel run now (Eq. 4.3), µs.
    pub wall_us: Option<f64>,
    /// CPU time of that run (Eq. 4.3), µs.
    pub cpu_us: Option<f64>,
}

/// Why an estimate cannot be made.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum HError {
    /// A required input is absent.
    #[error("{estimator:?} needs `{input}`, which was not given")]
    Missing {
        /// The estimator asked for.
        estimator: HEstimator,
        /// The missing input.
        input: &'static str,
    },
    /// An input is not a finite positive number.
    #[error("`{input}` is {value}; it must be a finite number > 0")]
    Bad {
        /// The input.
        input: &'static str,
        /// Its value.
        value: f64,
    },
}

fn positive(input: &'static str, value: f64) -> Result<f64, HError> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(HError::Bad { input, value })
    }
}

/// Eq. 4.1: `H_cal · q_now / q_cal`.
pub fn eq41(h_cal: f64, q_cal: f64, q_now: f64) -> f64 {
    h_cal * q_now / q_cal
}

/// Eq. 4.2 as Table 4.28 applies it: `H_cal · max(1, load_now)`.
pub fn eq42(h_cal: f64, load_now: f64) -> f64 {
    h_cal * load_now.max(1.0)
}

/// Eq. 4.3: `H_cal · wall / cpu`.
pub fn eq43(h_cal: f64, wall_us: f64, cpu_us: f64) -> f64 {
    h_cal * wall_us / cpu_us
}

/// Estimate the current H with `estimator`, checking its inputs.
pub fn estimate(estimator: HEstimator, cal: &HCalibrated, now: &HNow) -> Result<f64, HError> {
    let h = positive("h_cal", cal.h)?;
    let need = |v: Option<f64>, input: &'static str| {
        v.ok_or(HError::Missing { estimator, input })
            .and_then(|v| positive(input, v))
    };
    Ok(match estimator {
        HEstimator::QueueLength => eq41(
            h,
            positive("queue_len_cal", cal.queue_len)?,
            need(now.queue_len, "queue_len")?,
        ),
        HEstimator::LoadAverage => {
            let load = now.load.ok_or(HError::Missing {
                estimator,
                input: "load",
            })?;
            if !(load.is_finite() && load >= 0.0) {
                return Err(HError::Bad {
                    input: "load",
                    value: load,
                });
            }
            eq42(h, load)
        }
        HEstimator::WallCpu => eq43(
            h,
            need(now.wall_us, "wall_us")?,
            need(now.cpu_us, "cpu_us")?,
        ),
    })
}

/// The error convention of thesis Tables 4.27–4.29, in percent:
/// `(estimated − measured) / min(estimated, measured) · 100`.
pub fn thesis_error_pct(estimated: f64, measured: f64) -> f64 {
    (estimated - measured) / estimated.min(measured) * 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_bad_inputs_are_named() {
        let cal = HCalibrated {
            h: 26.0,
            queue_len: 1.0,
            load: 0.0,
        };
        let e = estimate(HEstimator::QueueLength, &cal, &HNow::default()).unwrap_err();
        assert_eq!(
            e,
            HError::Missing {
                estimator: HEstimator::QueueLength,
                input: "queue_len"
            }
        );
        let now = HNow {
            wall_us: Some(1.0),
            cpu_us: Some(0.0),
            ..HNow::default()
        };
        let e = estimate(HEstimator::WallCpu, &cal, &now).unwrap_err();
        assert!(e.to_string().contains("cpu_us"), "{e}");
        assert_eq!(HEstimator::default(), HEstimator::WallCpu);
    }
}
