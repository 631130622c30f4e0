//! Closed time intervals `[lo; hi]` and their construction from benchmark samples
//! (thesis §2.2.3, after Schopf & Berman and Huerta Yero).
//!
//! The operations of the thesis's table (X + Y, p + X, p·X, max) are monotone, so a cost
//! expression built only from them satisfies `t_min = T(all lower bounds)` and
//! `t_max = T(all upper bounds)`. Proper interval subtraction and division are provided too,
//! for completeness; the analytic compiler never emits them.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::fmt;
use std::ops::{Add, Div, Mul, Sub};

/// Errors building or combining intervals.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum IntervalError {
    /// `lo > hi` or a bound is not finite.
    #[error("invalid interval [{lo};{hi}]: bounds must be finite with lo <= hi")]
    Invalid {
        /// Lower bound given.
        lo: f64,
        /// Upper bound given.
        hi: f64,
    },
    /// No samples were given.
    #[error("cannot build an interval from zero samples; run the benchmark at least once")]
    NoSamples,
    /// A sample is NaN or infinite.
    #[error("sample #{index} is {value}; samples must be finite numbers")]
    BadSample {
        /// Position of the sample (0-based).
        index: usize,
        /// Its value.
        value: f64,
    },
    /// The kept percentage is outside (0, 100].
    #[error("kept percentage C = {0} must be in (0, 100]")]
    BadKeep(f64),
    /// Division by an interval that contains zero.
    #[error("division by the interval [{lo};{hi}], which contains 0")]
    DivByZero {
        /// Lower bound of the divisor.
        lo: f64,
        /// Upper bound of the divisor.
        hi: f64,
    },
    /// A scalar factor that must be non-negative is negative.
    #[error("scalar factor {0} is negative; cost multipliers must be >= 0")]
    NegativeScale(f64),
}

/// A closed interval `[lo; hi]` with `lo <= hi` (thesis Eq. 2.1).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    /// Lower bound (t_min).
    pub lo: f64,
    /// Upper bound (t_max).
    pub hi: f64,
}

impl Interval {
    /// The degenerate interval `[0; 0]`.
    pub const ZERO: Interval = Interval { lo: 0.0, hi: 0.0 };

    /// A checked interval: both bounds finite and `lo <= hi`.
    pub fn new(lo: f64, hi: f64) -> Result<Interval, IntervalError> {
        if lo.is_finite() && hi.is_finite() && lo <= hi {
            Ok(Interval { lo, hi })
        } else {
            Err(IntervalError::Invalid { lo, hi })
        }
    }

    /// The degenerate interval `[x; x]`.
    pub fn point(x: f64) -> Interval {
        Interval { lo: x, hi: x }
    }

    /// Midpoint `(lo + hi) / 2` (the thesis's T̄_E).
    pub fn mid(&self) -> f64 {
        (self.lo + self.hi) / 2.0
    }

    /// Amplitude `hi − lo`.
    pub fn width(&self) -> f64 {
        self.hi - self.lo
    }

    /// Whether `x` lies in the closed interval.
    pub fn contains(&self, x: f64) -> bool {
        self.lo <= x && x <= self.hi
    }

    /// `p + X = [p + lo; p + hi]`.
    pub fn add_scalar(self, p: f64) -> Interval {
        Interval {
            lo: p + self.lo,
            hi: p + self.hi,
        }
    }

    /// `p · X = [p·lo; p·hi]` for `p >= 0` (the only scaling a cost expression uses).
    pub fn scale(self, p: f64) -> Result<Interval, IntervalError> {
        if p < 0.0 || p.is_nan() {
            return Err(IntervalError::NegativeScale(p));
        }
        Ok(self.scale_unchecked_nonneg(p))
    }

    /// `p · X` where the caller guarantees `p >= 0` (used on the hot evaluation path; counts
    /// are validated when a model is compiled).
    pub(crate) fn scale_unchecked_nonneg(self, p: f64) -> Interval {
        Interval {
            lo: p * self.lo,
            hi: p * self.hi,
        }
    }

    /// `max(X, Y) = [max(lo); max(hi)]`.
    pub fn max(self, o: Interval) -> Interval {
        Interval {
            lo: self.lo.max(o.lo),
            hi: self.hi.max(o.hi),
        }
    }

    /// `min(X, Y) = [min(lo); min(hi)]`.
    pub fn min(self, o: Interval) -> Interval {
        Interval {
            lo: self.lo.min(o.lo),
            hi: self.hi.min(o.hi),
        }
    }

    /// n-ary sum; the empty sum is `[0; 0]`.
    pub fn sum<I: IntoIterator<Item = Interval>>(items: I) -> Interval {
        items.into_iter().fold(Interval::ZERO, |a, b| a + b)
    }

    /// Mean of intervals, bound by bound; `None` for an empty list.
    pub fn mean(items: &[Interval]) -> Option<Interval> {
        if items.is_empty() {
            return None;
        }
        let n = items.len() as f64;
        let s = Interval::sum(items.iter().copied());
        Some(Interval {
            lo: s.lo / n,
            hi: s.hi / n,
        })
    }

    /// The Q-weighted mix of the thesis (§2.5): `Q·A + (1 − Q)·B`, `0 <= Q <= 1`.
    pub fn mix(q: f64, a: Interval, b: Interval) -> Result<Interval, IntervalError> {
        if !(0.0..=1.0).contains(&q) {
            return Err(IntervalError::NegativeScale(q.min(1.0 - q)));
        }
        Ok(a.scale_unchecked_nonneg(q) + b.scale_unchecked_nonneg(1.0 - q))
    }

    /// Standard interval division `X / Y = X · [1/hi_y; 1/lo_y]` (Y must not contain 0).
    pub fn checked_div(self, y: Interval) -> Result<Interval, IntervalError> {
        if y.lo <= 0.0 && y.hi >= 0.0 {
            return Err(IntervalError::DivByZero { lo: y.lo, hi: y.hi });
        }
        Ok(self
            * Interval {
                lo: 1.0 / y.hi,
                hi: 1.0 / y.lo,
            })
    }
}

impl fmt::Display for Interval {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{};{}]", self.lo, self.hi)
    }
}

impl Add for Interval {
    type Output = Interval;
    /// `X + Y = [lo_x + lo_y; hi_x + hi_y]`.
    fn add(self, o: Interval) -> Interval {
        Interval {
            lo: self.lo + o.lo,
            hi: self.hi + o.hi,
        }
    }
}

impl Sub for Interval {
    type Output = Interval;
    /// Standard interval subtraction `X − Y = [lo_x − hi_y; hi_x − lo_y]`.
    fn sub(self, o: Interval) -> Interval {
        Interval {
            lo: self.lo - o.hi,
            hi: self.hi - o.lo,
        }
    }
}

impl Mul for Interval {
    type Output = Interval;
    /// Standard interval product: min and max of the four bound products.
    fn mul(self, o: Interval) -> Interval {
        let c = [
            self.lo * o.lo,
            self.lo * o.hi,
            self.hi * o.lo,
            self.hi * o.hi,
        ];
        Interval {
            lo: c.iter().copied().fold(f64::INFINITY, f64::min),
            hi: c.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }
}

impl Div for Interval {
    type Output = Result<Interval, IntervalError>;
    /// Standard interval division; an error if the divisor contains 0.
    fn div(self, o: Interval) -> Result<Interval, IntervalError> {
        self.checked_div(o)
    }
}

/// How to turn repeated benchmark samples into an interval (thesis §2.4 lists the
/// alternatives; Huerta's narrowest window is the one PeMPSys chose).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Construction {
    /// Huerta's method: keep `C` % of the points, choosing the narrowest window (Eq. 2.2/2.3).
    Huerta {
        /// Percentage of samples kept, in (0, 100].
        keep_percent: f64,
    },
    /// The extremes `[min; max]`.
    MinMax,
    /// Drop the `k` smallest and `k` largest samples, then take the extremes.
    Trimmed {
        /// How many to drop at each end (clamped so at least one sample stays).
        k: usize,
    },
    /// `mean ± k·σ` (population σ), clamped at 0 from below.
    MeanSigma {
        /// Number of standard deviations.
        k: f64,
    },
    /// Empirical quantiles `[q_lo; q_hi]` (nearest-rank), e.g. 0.05 and 0.95.
    Quantiles {
        /// Lower quantile in [0, 1].
        lo: f64,
        /// Upper quantile in [lo, 1].
        hi: f64,
    },
}

fn sorted_checked(samples: &[f64]) -> Result<Vec<f64>, IntervalError> {
    if samples.is_empty() {
        return Err(IntervalError::NoSamples);
    }
    for (index, &value) in samples.iter().enumerate() {
        if !value.is_finite() {
            return Err(IntervalError::BadSample { index, value });
        }
    }
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    Ok(s)
}

/// Number of points Huerta's method drops: `D = ⌊(100 − C)·N/100⌋` (Eq. 2.2).
pub fn huerta_drop_count(n: usize, keep_percent: f64) -> Result<usize, IntervalError> {
    if !(keep_percent > 0.0 && keep_percent <= 100.0) {
        return Err(IntervalError::BadKeep(keep_percent));
    }
    // Compute in integer-friendly order to avoid 80·10/100 = 1.9999… style slips.
    let d = ((100.0 - keep_percent) * n as f64 / 100.0 + 1e-9).floor() as usize;
    Ok(d.min(n.saturating_sub(1)))
}

/// Huerta's narrowest window (Eq. 2.3): over `X_{i,j}`, `1 <= i <= D+1`, `j = N−D+i−1`,
/// minimise `x_j − x_i`; ties go to the lowest `i`.
pub fn from_samples(samples: &[f64], keep_percent: f64) -> Result<Interval, IntervalError> {
    let s = sorted_checked(samples)?;
    let n = s.len();
    let d = huerta_drop_count(n, keep_percent)?;
    // 0-based: i0 in 0..=d, j0 = n - d + i0 - 1.
    let mut best = (0usize, n - d - 1);
    let mut best_amp = s[n - d - 1] - s[0];
    for i0 in 1..=d {
        let j0 = n - d + i0 - 1;
        let amp = s[j0] - s[i0];
        if amp < best_amp {
            best_amp = amp;
            best = (i0, j0);
        }
    }
    Ok(Interval {
        lo: s[best.0],
        hi: s[best.1],
    })
}

/// Build an interval from samples with the chosen construction.
pub fn construct(samples: &[f64], how: Construction) -> Result<Interval, IntervalError> {
    match how {
        Construction::Huerta { keep_percent } => from_samples(samples, keep_percent),
        Construction::MinMax => {
            let s = sorted_checked(samples)?;
            Ok(Interval {
                lo: s[0],
                hi: s[s.len() - 1],
            })
        }
        Construction::Trimmed { k } => {
            let s = sorted_checked(samples)?;
            let k = k.min((s.len() - 1) / 2);
            Ok(Interval {
                lo: s[k],
                hi: s[s.len() - 1 - k],
            })
        }
        Construction::MeanSigma { k } => {
            let s = sorted_checked(samples)?;
            if !(k >= 0.0 && k.is_finite()) {
                return Err(IntervalError::NegativeScale(k));
            }
            let n = s.len() as f64;
            let mean = s.iter().sum::<f64>() / n;
            let var = s.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
            let sd = var.sqrt();
            Ok(Interval {
                lo: (mean - k * sd).max(0.0).min(mean),
                hi: mean + k * sd,
            })
        }
        Construction::Quantiles { lo, hi } => {
            let s = sorted_checked(samples)?;
            if !(0.0..=1.0).contains(&lo) || !(lo..=1.0).contains(&hi) {
                return Err(IntervalError::Invalid { lo, hi });
            }
            let rank = |q: f64| -> usize {
                let r = (q * s.len() as f64).ceil() as usize;
                r.clamp(1, s.len()) - 1
            };
            Ok(Interval {
                lo: s[rank(lo)],
                hi: s[rank(hi)],
            })
        }
    }
}

/// A bounded FIFO of the last `K` raw samples of one (machine, parameter) pair, as CRES kept
/// (the oldest sample is dropped when a new one arrives at capacity).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleFifo {
    capacity: usize,
    samples: VecDeque<f64>,
}

impl SampleFifo {
    /// A FIFO keeping at most `capacity` samples (`capacity >= 1`; 0 is treated as 1).
    pub fn new(capacity: usize) -> SampleFifo {
        SampleFifo {
            capacity: capacity.max(1),
            samples: VecDeque::new(),
        }
    }

    /// Append a sample, dropping the oldest if full.
    pub fn push(&mut self, x: f64) {
        if self.samples.len() == self.capacity {
            self.samples.pop_front();
        }
        self.samples.push_back(x);
    }

    /// The samples held, oldest first.
    pub fn samples(&self) -> Vec<f64> {
        self.samples.iter().copied().collect()
    }

    /// Number of samples held.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Whether the FIFO holds no sample.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The interval of the samples held, with the given construction.
    pub fn interval(&self, how: Construction) -> Result<Interval, IntervalError> {
        construct(&self.samples(), how)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_table() {
        let x = Interval::new(1.0, 3.0).unwrap();
        let y = Interval::new(2.0, 5.0).unwrap();
        assert_eq!(x + y, Interval::new(3.0, 8.0).unwrap());
        assert_eq!(x.add_scalar(2.0), Interval::new(3.0, 5.0).unwrap());
        assert_eq!(x.scale(3.0).unwrap(), Interval::new(3.0, 9.0).unwrap());
        assert_eq!(x.max(y), Interval::new(2.0, 5.0).unwrap());
        assert!(x.scale(-1.0).is_err());
        assert!(Interval::new(2.0, 1.0).is_err());
    }

    #[test]
    fn fifo_drops_oldest() {
        let mut f = SampleFifo::new(3);
        for x in [1.0, 2.0, 3.0, 4.0] {
            f.push(x);
        }
        assert_eq!(f.samples(), vec![2.0, 3.0, 4.0]);
    }
}
