//! JoiN's static task shares (thesis Eq. 3.6): `S_i = ⌈f·c·W_i / ΣW⌉`, with a rounding that
//! makes the shares sum to the statically allocated total.
//!
//! # Rounding policy (largest remainder)
//! Let `T = ⌈f·c⌉` (so `T = c` when `f = 1`) and the quota `q_i = T·W_i/ΣW` (the thesis's
//! `f·c·W_i/ΣW` when `f·c` is whole). Every machine first gets `⌊q_i⌋`; the
//! `T − Σ⌊q_i⌋` tasks left go one each to the machines with the largest remainders
//! `q_i − ⌊q_i⌋`, ties to the lower position (the faster machine when the list is sorted
//! fastest first). Hence:
//! * `Σ S_i = T` exactly;
//! * `⌊q_i⌋ ≤ S_i ≤ ⌈q_i⌉` (each share is the thesis's ceiling or one less);
//! * whenever the thesis's ceilings already sum to `T`, `S_i = ⌈q_i⌉` for every i, i.e. the
//!   result is the thesis's;
//! * `W_i > W_j ⇒ S_i ≥ S_j`.
//!
//! Quotas within 1e-9 of an integer are treated as that integer, so that floating-point noise
//! in `W` (e.g. `0.4/1.6·128 = 31.999…`) does not move a task.

/// Errors in share computation.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ShareError {
    /// No machine.
    #[error("no machines: give at least one weight")]
    Empty,
    /// A weight is not finite and positive.
    #[error("weight #{index} is {w}; every performance factor W must be a finite number > 0")]
    BadWeight {
        /// Position of the weight (0-based).
        index: usize,
        /// Its value.
        w: f64,
    },
    /// The static fraction f is outside [0, 1].
    #[error("static fraction f = {0} must be in [0, 1]")]
    BadFraction(f64),
}

/// The thesis's raw ceilings `⌈f·c·W_i/ΣW⌉` (which may sum to more than `c`).
pub fn thesis_ceilings(weights: &[f64], c: u64, f: f64) -> Result<Vec<u64>, ShareError> {
    let q = quotas(weights, c, f)?;
    Ok(q.iter().map(|&x| x.ceil() as u64).collect())
}

fn check(weights: &[f64], f: f64) -> Result<f64, ShareError> {
    if weights.is_empty() {
        return Err(ShareError::Empty);
    }
    if !(0.0..=1.0).contains(&f) {
        return Err(ShareError::BadFraction(f));
    }
    let mut sum = 0.0;
    for (index, &w) in weights.iter().enumerate() {
        if !(w.is_finite() && w > 0.0) {
            return Err(ShareError::BadWeight { index, w });
        }
        sum += w;
    }
    Ok(sum)
}

/// Statically allocated total `T = ⌈f·c⌉`.
pub fn static_total(c: u64, f: f64) -> u64 {
    let t = f * c as f64;
    let r = t.round();
    if (t - r).abs() < 1e-9 {
        r as u64
    } else {
        t.ceil() as u64
    }
    .min(c)
}

fn quotas(weights: &[f64], c: u64, f: f64) -> Result<Vec<f64>, ShareError> {
    let sum = check(weights, f)?;
    let t = static_total(c, f) as f64;
    Ok(weights
        .iter()
        .map(|w| {
            let q = t * w / sum;
            let r = q.round();
            if (q - r).abs() < 1e-9 {
                r
            } else {
                q
            }
        })
        .collect())
}

/// Shares `S_i` of `c` tasks over machines with performance factors `weights`, static
/// fraction `f`, by the largest-remainder policy documented in this module.
pub fn static_shares(weights: &[f64], c: u64, f: f64) -> Result<Vec<u64>, ShareError> {
    let q = quotas(weights, c, f)?;
    let total = static_total(c, f);
    let mut s: Vec<u64> = q.iter().map(|x| x.floor() as u64).collect();
    let given: u64 = s.iter().sum();
    let mut left = total.saturating_sub(given);
    if left > 0 {
        let mut order: Vec<usize> = (0..q.len()).collect();
        order.sort_by(|&a, &b| {
            let ra = q[a] - q[a].floor();
            let rb = q[b] - q[b].floor();
            rb.total_cmp(&ra).then(a.cmp(&b))
        });
        for &i in order.iter().cycle() {
            if left == 0 {
                break;
            }
            s[i] += 1;
            left -= 1;
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflow_resolved() {
        // Ceilings 34+34+34 = 102 > 100.
        let w = [1.0, 1.0, 1.0];
        assert_eq!(thesis_ceilings(&w, 100, 1.0).unwrap(), vec![34, 34, 34]);
        assert_eq!(static_shares(&w, 100, 1.0).unwrap(), vec![34, 33, 33]);
    }

    #[test]
    fn bad_weight_named() {
        let e = static_shares(&[1.0, 0.0], 10, 1.0).unwrap_err();
        assert_eq!(e, ShareError::BadWeight { index: 1, w: 0.0 });
    }
}
