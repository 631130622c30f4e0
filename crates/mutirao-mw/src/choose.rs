//! Whom to add (issue 13 item 5): for each candidate host, the predicted makespan of the
//! remaining work if it is added now — it only starts helping after its spawn cost — against
//! adding nobody; the best candidate if it shortens the makespan, else none. No special case
//! makes a cheap, slow host beat a dear, fast one: it follows from the arithmetic.
//!
//! With the members' combined rate `R` (tasks/s), `N` tasks left, a candidate of rate `r` and
//! spawn cost `s`: without it `T₀ = N / R`; with it, if `R·s ≥ N` it arrives too late (`T₀`),
//! else `T = s + (N − R·s) / (R + r)`.
//!
//! ```
//! use mutirao_mw::choose::{choose, Candidate};
//! let c = [Candidate { name: "w05".into(), rate: 0.35, spawn_s: 5.0 },
//!          Candidate { name: "w04".into(), rate: 0.26, spawn_s: 60.0 }];
//! let pick = choose(&c, 3.0, 300.0);
//! assert_eq!(pick.best, Some(0));
//! ```

use serde::{Deserialize, Serialize};

/// A host that may join.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    /// Host name.
    pub name: String,
    /// Its expected rate, tasks per second (model speed × the measured per-task rate).
    pub rate: f64,
    /// Its measured (or expected) spawn cost, s.
    pub spawn_s: f64,
}

/// The choice and its reasons.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Choice {
    /// Index of the candidate to add, if any shortens the makespan.
    pub best: Option<usize>,
    /// Predicted remaining time without adding, s.
    pub without_s: f64,
    /// Predicted remaining time with each candidate, s (same order as the input).
    pub with_s: Vec<f64>,
}

/// Predicted remaining time with a candidate of `rate` and `spawn_s` joining members of
/// combined `members_rate`, `remaining` tasks left.
pub fn with_candidate(members_rate: f64, remaining: f64, rate: f64, spawn_s: f64) -> f64 {
    let t0 = remaining / members_rate;
    let by_then = members_rate * spawn_s;
    if by_then >= remaining || rate <= 0.0 {
        return t0;
    }
    spawn_s + (remaining - by_then) / (members_rate + rate)
}

/// Pick the candidate that shortens the predicted makespan most (none if none does).
pub fn choose(cands: &[Candidate], members_rate: f64, remaining: f64) -> Choice {
    let without_s = remaining / members_rate;
    let with_s: Vec<f64> = cands
        .iter()
        .map(|c| with_candidate(members_rate, remaining, c.rate, c.spawn_s))
        .collect();
    let best = with_s
        .iter()
        .enumerate()
        .filter(|(_, t)| **t < without_s * (1.0 - 1e-9))
        .min_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i);
    Choice {
        best,
        without_s,
        with_s,
    }
}

/// Choose up to `k` hosts greedily (each pick joins the members before the next is weighed).
pub fn choose_k(cands: &[Candidate], members_rate: f64, remaining: f64, k: usize) -> Vec<usize> {
    let mut rate = members_rate;
    let mut left: Vec<usize> = (0..cands.len()).collect();
    let mut out = Vec::new();
    while out.len() < k {
        let sub: Vec<Candidate> = left.iter().map(|&i| cands[i].clone()).collect();
        let c = choose(&sub, rate, remaining);
        let Some(b) = c.best else { break };
        let i = left.remove(b);
        rate += cands[i].rate;
        out.push(i);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Table 3 speeds as rates (tasks/s of a fastest host = 1).
    fn thesis() -> Vec<Candidate> {
        vec![
            Candidate {
                name: "worker03".into(),
                rate: 0.983497,
                spawn_s: 2.0,
            },
            Candidate {
                name: "worker05".into(),
                rate: 0.345583,
                spawn_s: 6.0,
            },
            Candidate {
                name: "worker04".into(),
                rate: 0.260023,
                spawn_s: 50.0,
            },
        ]
    }

    #[test]
    fn a_dear_spawn_is_not_worth_it_and_a_cheap_slow_host_is() {
        // Members worker01 + worker02 + worker03 (rate 2.967), 150 tasks left.
        let c = thesis();
        let pick = choose(&c[1..], 2.967061, 150.0);
        assert_eq!(pick.best, Some(0), "worker05 joins: {pick:?}");
        // With worker05 in (rate 3.313), worker04's 50 s spawn comes after 166 tasks, more than the 150
        // remaining: adding it cannot shorten the run.
        let pick = choose(&c[2..], 3.312644, 150.0);
        assert_eq!(pick.best, None, "{pick:?}");
        // The same host with a cheap spawn is worth adding.
        let cheap = Candidate {
            spawn_s: 1.0,
            ..c[2].clone()
        };
        assert_eq!(choose(&[cheap], 3.312644, 150.0).best, Some(0));
    }

    #[test]
    fn greedy_k_prefers_fast_cheap_hosts() {
        let c = thesis();
        assert_eq!(choose_k(&c, 1.983564, 150.0, 3), vec![0, 1]);
    }
}
