//! The analytic modeller: from a calibration to a `mutirao-model/1` [`Model`] and a [`FitReport`].
//!
//! ## What is fitted
//! For the chosen send mode, the per-size **medians** of every measured sweep are pooled per class
//! and fitted, separately for `l`, `os` and `or`:
//! * `same-host` per site (a host talking to itself), `intra-site` per site, `inter-site` per
//!   unordered site pair (both directions pooled);
//! * `pair`: for each measured pair, its own fit replaces the class function of a parameter when
//!   the class function misses that pair's medians by more than `pair_threshold` (mean relative
//!   error); unmeasured pairs that inherit from such a pair (per the calibration's provenance) get
//!   the same pair link;
//! * when some host pair is covered by no class (e.g. a site whose same-host link was not measured),
//!   an unrestricted link of that class is fitted from all the class's data.
//!
//! `os` is the sender's overhead for the measured message (`os_src`), `or` the receiver's
//! (`or_dst`), and `l` the ping-pong latency (digest 000 §11.4). For PLogP sweeps, `l` is
//! `L + g(m) − Os − Or` so that `Os + l + Or` equals PLogP's one-way time `L + g(m)`.
//!
//! ## How: segmented least squares
//! Each function is piecewise linear in the message size m. Breakpoints may fall only at measured
//! sizes (a segment starts at its first size; the first segment starts at 0). For k = 1 …
//! `max_segments` segments, dynamic programming finds the breakpoints with the least weighted
//! squared error; the k with the lowest BIC, `χ²/s² + (3k−1)·ln N`, wins (s² ≥ 1 is the excess
//! scatter the richest segmentation leaves, Mallows-style, so noisier data get fewer segments). Each point (the median of
//! one size of one measured pair) weighs `1/σ²` with `σ² = se² + (r·max(|y|, floor))²`: `se` is
//! the standard error of that median (from the spread of its samples), `r` the relative tolerance
//! of the model (`rel_tolerance`, default 1%) and `floor` `weight_floor_us` (0.5 µs). So relative
//! errors are what counts (a 64-byte latency as much as a 64-MiB one), a deviation of about `r`
//! or within the measurement noise is noise, and a small, noisy value (an `L` of −0.8 µs derived
//! from overheads of a throttled host) cannot drown a systematic 20% miss at large sizes: it adds
//! the same χ² to every segmentation. Each segment is fitted under `base ≥ 0`, `slope ≥ 0` (what
//! the model format allows); the thesis's negative LAM latencies therefore become 0, and the
//! report shows the residual.
//!
//! Why this matters on shaped links: a token bucket (tbf) lets its burst through at line rate, so
//! the one-way time of messages up to a few bursts grows more slowly than the shaped rate. A fit
//! that pooled 64 KiB … 4 MiB into one segment reported 38% more bandwidth than the shaper gives;
//! the χ² criterion splits the range and the last segment carries the sustained rate.
//!
//! ## Example: what a measurement loop does, end to end
//! ```
//! use mutirao_model::calib::*;
//! use mutirao_model::strategy::{plan, PlanHost, PlanOptions};
//! use mutirao_model::fit::fit_default;
//!
//! let hosts = [PlanHost::new("a1", "a"), PlanHost::new("a2", "a")];
//! let p = plan(StrategyKind::AllPairs, &hosts, &PlanOptions::default()).unwrap();
//! let mut c = Calibration::new(p.strategy, "mutirao 0.1.0", 1_700_000_000_000);
//! for (h, wall) in [("a1", 1000.0), ("a2", 2000.0)] {
//!     let mut host = CalibHost::new(h, "a", "127.0.0.1:7207");
//!     host.speed = Some(SpeedMeasurement {
//!         kernel: "inc+matmul+gauss".into(),
//!         reps: 10,
//!         samples: vec![SpeedSample { wall_us: wall, cpu_us: 1000.0 }],
//!     });
//!     c.add_host(host).unwrap();
//! }
//! for pair in &p.measure {
//!     for m in [64u64, 1024, 65536, 1 << 20] {
//!         let l = 20.0 + 0.01 * m as f64; // what the ping-pong would observe
//!         let s = PingPongSample { rtt_us: 2.0 * l + 20.0, os_src_us: 5.0, or_dst_us: 5.0,
//!             os_dst_us: 5.0, or_src_us: 5.0, probe_us: None, wait_src_us: None };
//!         c.record_pingpong(&pair.src, &pair.dst, SendMode::Isend, m, 3, &[s]).unwrap();
//!     }
//! }
//! p.record_in(&mut c);
//! c.finalize(1_700_000_060_000);
//! let (model, _report) = fit_default(&c).unwrap();
//! assert_eq!(model.host("a2").unwrap().speed, 0.5);
//! let l = model.link_params("a1", "a2").unwrap().l;
//! assert!((l.value(1 << 20) - (20.0 + 0.01 * (1u64 << 20) as f64)).abs() < 1e-6);
//! ```
//!
//! ## Host speeds
//! `speed = H_ref / H_host`, where H is the median kernel wall time per repetition and `H_ref` is
//! the **fastest host's** H by default (that host gets speed 1.0), or a named host's
//! ([`SpeedReference::Host`]). Hosts without an H measurement are left out of the model and named
//! in the report.

use crate::calib::{Calibration, DerivedStats, FailedHost, Method, SendMode};
use crate::{Host, Link, LinkClass, Model, ModelError, Piecewise, Segment};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};

/// Which host has speed 1.0.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SpeedReference {
    /// The host with the smallest H (the fastest) has speed 1.0; every other is ≤ 1.
    #[default]
    Fastest,
    /// This host has speed 1.0.
    Host(String),
}

/// Options of the segmented least-squares fit of one function.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SegOptions {
    /// Most segments a function may have. Default 6.
    pub max_segments: usize,
    /// Fewest distinct message sizes in a segment. Default 2: a short size list (e.g. 0, 1K,
    /// 64K, 256K, 1M) can then end in a segment through its two largest sizes, whose slope is
    /// the measured bandwidth (with 3, five sizes allowed one line whose slope the small sizes
    /// set: 2.7x–68x the measured bandwidth).
    pub min_sizes_per_segment: usize,
    /// Floor of |y| in the relative part of a point's σ, µs. Default 0.5.
    pub weight_floor_us: f64,
    /// Most candidate breakpoints (log-spaced subset of the sizes beyond that). Default 200.
    pub max_candidates: usize,
    /// Relative tolerance r of the model: a point's σ includes `r·|y|`, so misses of about r are
    /// treated as noise when choosing the number of segments. Default 0.01.
    #[serde(default = "default_rel_tolerance")]
    pub rel_tolerance: f64,
    /// Largest relative miss tolerated at a precise point (one whose standard error is at most
    /// 2% of its value, and whose value is at least 50 × `weight_floor_us`): while the chosen segmentation misses such a point by more and one more
    /// segment (within `max_segments`) misses less, the fit takes that segment. BIC alone let
    /// noisy small sizes inflate the scale until a 3-size segment missed a precise large size
    /// by 19–27%, and two calibrations whose data agreed within 2% got models 25% apart.
    /// Default 0.10; 0 or less turns the guard off.
    #[serde(default = "default_max_precise_miss")]
    pub max_precise_miss: f64,
}

fn default_rel_tolerance() -> f64 {
    0.01
}

fn default_max_precise_miss() -> f64 {
    0.04
}

/// One point of a segmented fit: the median of the samples of one size (of one pair), with the
/// standard error of that median (0 when unknown).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FitPoint {
    /// Message size in bytes.
    pub bytes: u64,
    /// Value in µs.
    pub value_us: f64,
    /// Standard error of `value_us` in µs (≥ 0).
    pub se_us: f64,
}

impl FitPoint {
    /// The point of `stats` (median, with the standard error of the median estimated from the
    /// lower half of the samples' spread: σ ≈ (median − p10)/1.2816, se ≈ 1.2533·σ/√count).
    ///
    /// The lower half, not the 10–90% spread: interference (a descheduled rank, a busy
    /// neighbour) only ever adds time, so on a loaded host the upper tail is long — a same-host
    /// 1 MiB message measured 106–130 µs at p10–median and 2.8 ms at p90 — while the median
    /// itself is pinned by the many clean samples. The 10–90% spread took such a median for
    /// noise worth ±400 µs, the segmented fit drew one line through 12 sizes, and `fit`
    /// refused its own model (a 22% miss at 1 MiB). For symmetric noise both estimates agree.
    pub fn of_stats(bytes: u64, st: &crate::calib::Stats) -> FitPoint {
        let sigma = ((st.median - st.p10) / 1.2816).max(0.0);
        let se = if st.count > 0 && sigma.is_finite() {
            1.2533 * sigma / (st.count as f64).sqrt()
        } else {
            0.0
        };
        FitPoint {
            bytes,
            value_us: st.median,
            se_us: se,
        }
    }
}

impl Default for SegOptions {
    fn default() -> Self {
        SegOptions {
            max_segments: 6,
            min_sizes_per_segment: 2,
            weight_floor_us: 0.5,
            max_candidates: 200,
            rel_tolerance: default_rel_tolerance(),
            max_precise_miss: default_max_precise_miss(),
        }
    }
}

/// Options of [`fit`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FitOptions {
    /// Send mode whose sweeps are fitted; `None` = `isend` if present (the thesis adopted Isend
    /// values), else `send`.
    pub mode: Option<SendMode>,
    /// Segmented-fit options.
    pub seg: SegOptions,
    /// Which host has speed 1.0.
    pub speed_reference: SpeedReference,
    /// Emit a pair link when the class function misses a measured pair by more than this mean
    /// relative error (0.10 = 10%); `None` = never. Default `Some(0.10)`.
    pub pair_threshold: Option<f64>,
}

impl Default for FitOptions {
    fn default() -> Self {
        FitOptions {
            mode: None,
            seg: SegOptions::default(),
            speed_reference: SpeedReference::Fastest,
            pair_threshold: Some(0.10),
        }
    }
}

/// Why a fit failed.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FitError {
    /// The calibration itself is invalid.
    #[error(transparent)]
    Calib(#[from] crate::calib::CalibError),
    /// No host has an H measurement.
    #[error(
        "no host of the calibration has a speed (H) measurement; the model needs at least one"
    )]
    NoSpeed,
    /// The speed reference host is unknown or unmeasured.
    #[error("speed reference host {0:?} is not in the calibration or has no speed measurement")]
    BadReference(String),
    /// No sweep in the requested mode.
    #[error("the calibration has no sweep in mode {mode:?} (modes present: {present})")]
    NoMode {
        /// Requested mode.
        mode: &'static str,
        /// Modes found.
        present: String,
    },
    /// No sweep has three measured sizes: a line through two sizes cannot be checked.
    #[error(
        "the calibration's {mode} sweeps have at most {sizes} measured size(s); a fit needs at \
         least 3 (the intercept, the slope and one size to check them). Calibrate again with \
         more sizes, e.g. `mutirao calibrate --sizes 0,1024,65536,262144,1048576`"
    )]
    TooFewSizes {
        /// Mode fitted.
        mode: &'static str,
        /// Most distinct sizes with statistics in one sweep.
        sizes: usize,
    },
    /// Fitting produced a non-finite coefficient.
    #[error(
        "fitting {what} produced a non-finite coefficient; check its samples for extreme values"
    )]
    Numeric {
        /// Class and parameter.
        what: String,
    },
    /// The produced model does not validate (a bug, or extreme input).
    #[error("the fitted model is invalid: {0}")]
    Model(#[from] ModelError),
}

// ---------------------------------------------------------------------------------------------
// Segmented least squares
// ---------------------------------------------------------------------------------------------

/// One segment of a fitted function, with its residuals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SegmentReport {
    /// First size of the segment (0 for the first segment).
    pub from: u64,
    /// Value at `from` (µs).
    pub base_us: f64,
    /// Slope (µs per byte).
    pub per_byte_us: f64,
    /// Data points in the segment.
    pub points: usize,
    /// Distinct sizes in the segment.
    pub sizes: usize,
    /// Root mean square relative residual.
    pub rms_rel: f64,
    /// Largest absolute relative residual.
    pub max_rel: f64,
}

/// The residual of a fitted function at one size (median over the points at that size).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Residual {
    /// Message size.
    pub bytes: u64,
    /// Median of the measured values at this size.
    pub measured_us: f64,
    /// Fitted value.
    pub fitted_us: f64,
    /// `(fitted − measured) / measured` (measured floored at `weight_floor_us`).
    pub rel: f64,
}

/// A fitted piecewise function with its diagnostics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SegFit {
    /// The function.
    pub function: Piecewise,
    /// Segments with their residuals.
    pub segments: Vec<SegmentReport>,
    /// BIC of the chosen segmentation.
    pub bic: f64,
    /// BIC of every segment count tried (index 0 = 1 segment; infinite = infeasible).
    pub bic_by_k: Vec<f64>,
    /// Residuals per size.
    pub residuals: Vec<Residual>,
}

#[derive(Clone, Copy, Default)]
struct Sums {
    s0: f64,
    s1: f64,
    s2: f64,
    t0: f64,
    t1: f64,
    u: f64,
}

impl Sums {
    fn add(&mut self, w: f64, u: f64, y: f64) {
        self.s0 += w;
        self.s1 += w * u;
        self.s2 += w * u * u;
        self.t0 += w * y;
        self.t1 += w * u * y;
        self.u += w * y * y;
    }

    fn sse(&self, a: f64, b: f64) -> f64 {
        let v = self.u - 2.0 * a * self.t0 - 2.0 * b * self.t1
            + a * a * self.s0
            + 2.0 * a * b * self.s1
            + b * b * self.s2;
        v.max(0.0)
    }

    /// Weighted least squares of y = a + b·u under a ≥ 0, b ≥ 0: (a, b, sse).
    fn fit(&self) -> (f64, f64, f64) {
        let det = self.s0 * self.s2 - self.s1 * self.s1;
        if self.s0 <= 0.0 {
            return (0.0, 0.0, self.u.max(0.0));
        }
        if det > 1e-12 * self.s0 * self.s2 {
            let b = (self.s0 * self.t1 - self.s1 * self.t0) / det;
            let a = (self.t0 - b * self.s1) / self.s0;
            if a >= 0.0 && b >= 0.0 {
                return (a, b, self.sse(a, b));
            }
        }
        let a0 = (self.t0 / self.s0).max(0.0);
        let c0 = (a0, 0.0, self.sse(a0, 0.0));
        let b1 = if self.s2 > 0.0 {
            (self.t1 / self.s2).max(0.0)
        } else {
            0.0
        };
        let c1 = (0.0, b1, self.sse(0.0, b1));
        if c1.2 < c0.2 {
            c1
        } else {
            c0
        }
    }
}

/// Fit a piecewise linear function of the message size to `points` (size, µs) by segmented
/// least squares with BIC model selection (see the module docs). `None` if `points` is empty or
/// holds a non-finite value.
pub fn segmented_fit(points: &[(u64, f64)], opts: &SegOptions) -> Option<SegFit> {
    let pts: Vec<FitPoint> = points
        .iter()
        .map(|&(bytes, value_us)| FitPoint {
            bytes,
            value_us,
            se_us: 0.0,
        })
        .collect();
    segmented_fit_points(&pts, opts)
}

/// [`segmented_fit`] of points that carry their own standard error (see the module docs).
/// `None` if `points` is empty or holds a non-finite value.
pub fn segmented_fit_points(points: &[FitPoint], opts: &SegOptions) -> Option<SegFit> {
    let fit = segmented_fit_sized(points, opts, false)?;
    if opts.max_precise_miss <= 0.0 || opts.min_sizes_per_segment <= 1 {
        return Some(fit);
    }
    let floor = floor_of(opts);
    let worst = worst_miss(points, &fit.function, floor);
    if worst <= opts.max_precise_miss {
        return Some(fit);
    }
    // No segmentation of `min_sizes_per_segment` sizes follows the points (three sizes across
    // a bend, say): let inner segments hold one size — the last keeps two, so that its slope
    // is measured — and take that if it misses less.
    match segmented_fit_sized(points, opts, true) {
        Some(f) if worst_miss(points, &f.function, floor) < worst => Some(f),
        _ => Some(fit),
    }
}

/// The relative miss of a point of value `y` (µs) with standard error `se` by an error `e`, if
/// it counts: the value is at least 10 × the floor (L, Os and Or of a few µs sit on timer noise
/// and may be negative) and the error is beyond both 10 × the floor (5 µs by default) and three
/// standard errors of the point's median. The precise-miss guard looks at these.
fn counted_miss(y: f64, se: f64, e: f64, floor: f64) -> Option<f64> {
    let y = y.abs();
    (y >= 10.0 * floor && e.abs() > (10.0 * floor).max(3.0 * se.abs())).then(|| e.abs() / y)
}

/// `SegOptions::weight_floor_us`, or its default 0.5 µs when it is not a positive number.
fn floor_of(opts: &SegOptions) -> f64 {
    if opts.weight_floor_us.is_finite() && opts.weight_floor_us > 0.0 {
        opts.weight_floor_us
    } else {
        0.5
    }
}

/// The largest counted miss (`counted_miss`) of `function` at `points`.
fn worst_miss(points: &[FitPoint], function: &Piecewise, floor: f64) -> f64 {
    points
        .iter()
        .filter_map(|p| {
            counted_miss(
                p.value_us,
                p.se_us,
                function.value(p.bytes) - p.value_us,
                floor,
            )
        })
        .fold(0.0f64, f64::max)
}

fn segmented_fit_sized(
    points: &[FitPoint],
    opts: &SegOptions,
    inner_singles: bool,
) -> Option<SegFit> {
    if points.is_empty()
        || points
            .iter()
            .any(|p| !p.value_us.is_finite() || !p.se_us.is_finite())
    {
        return None;
    }
    let floor = floor_of(opts);
    let r = if opts.rel_tolerance.is_finite() && opts.rel_tolerance > 0.0 {
        opts.rel_tolerance
    } else {
        default_rel_tolerance()
    };
    let mut sorted = points.to_vec();
    sorted.sort_by(|a, b| {
        a.bytes
            .cmp(&b.bytes)
            .then(a.value_us.total_cmp(&b.value_us))
    });
    let pts: Vec<(u64, f64)> = sorted.iter().map(|p| (p.bytes, p.value_us)).collect();
    let ses: Vec<f64> = sorted.iter().map(|p| p.se_us.abs()).collect();
    let weight = |i: usize| {
        let y = r * pts[i].1.abs().max(floor);
        1.0 / (ses[i] * ses[i] + y * y)
    };
    // Distinct sizes: group g covers pts[gstart[g]..gstart[g+1]].
    let mut gstart = Vec::new();
    for (i, p) in pts.iter().enumerate() {
        if i == 0 || pts[i - 1].0 != p.0 {
            gstart.push(i);
        }
    }
    let n = gstart.len();
    gstart.push(pts.len());
    // Candidate segment starts (group indices).
    let max_c = opts.max_candidates.max(2);
    let cand: Vec<usize> = if n <= max_c {
        (0..n).collect()
    } else {
        let lo = (pts[0].0.max(1) as f64).ln();
        let hi = (pts[pts.len() - 1].0.max(1) as f64).ln();
        let mut c = vec![0usize];
        for t in 1..max_c {
            let target = lo + (hi - lo) * t as f64 / max_c as f64;
            let g = (0..n)
                .find(|&g| (pts[gstart[g]].0.max(1) as f64).ln() >= target)
                .unwrap_or(n - 1);
            if c.last() != Some(&g) {
                c.push(g);
            }
        }
        c
    };
    let k_c = cand.len();
    let mut bounds = cand.clone();
    bounds.push(n);
    let min_sizes = opts.min_sizes_per_segment.max(1);
    // cost[i][j]: segment covering groups bounds[i]..bounds[j].
    let mut cost = vec![vec![(0.0, 0.0, f64::INFINITY); k_c + 1]; k_c + 1];
    for i in 0..k_c {
        let g0 = bounds[i];
        let from = if g0 == 0 { 0 } else { pts[gstart[g0]].0 };
        let mut sums = Sums::default();
        let mut g = g0;
        for j in (i + 1)..=k_c {
            while g < bounds[j] {
                for (i, p) in pts.iter().enumerate().take(gstart[g + 1]).skip(gstart[g]) {
                    sums.add(weight(i), (p.0 - from) as f64, p.1);
                }
                g += 1;
            }
            let whole = i == 0 && j == k_c;
            if bounds[j] - g0 >= min_sizes || whole || (inner_singles && j < k_c) {
                cost[i][j] = sums.fit();
            }
        }
    }
    // DP over the number of segments.
    let kmax = opts.max_segments.max(1).min(k_c);
    let mut best = vec![vec![f64::INFINITY; k_c + 1]; kmax + 1];
    let mut back = vec![vec![usize::MAX; k_c + 1]; kmax + 1];
    for j in 1..=k_c {
        best[1][j] = cost[0][j].2;
        back[1][j] = 0;
    }
    for k in 2..=kmax {
        for j in 1..=k_c {
            for i in 1..j {
                let v = best[k - 1][i] + cost[i][j].2;
                if v < best[k][j] {
                    best[k][j] = v;
                    back[k][j] = i;
                }
            }
        }
    }
    let npts = pts.len() as f64;
    // The weighted SSE is a χ² (weights are 1/σ²). When even the richest feasible segmentation
    // leaves more scatter than the σ explain (noisier data than `rel_tolerance`), the χ² are
    // scaled by that excess so that noise is not chased with segments. The excess is estimated
    // robustly, from the median squared normalised residual (a χ²₁ has median 0.455), so a few
    // wild points (pairs that disagree at one size) do not hide real structure elsewhere.
    let backtrack = |k: usize| -> Option<Vec<usize>> {
        let mut cuts = vec![k_c];
        let mut j = k_c;
        for kk in (1..=k).rev() {
            let i = back[kk][j];
            if i == usize::MAX {
                return None;
            }
            cuts.push(i);
            j = i;
        }
        cuts.reverse(); // [0, ..., k_c]
        Some(cuts)
    };
    // (point index, model − value) of every point under the segmentation `cuts`.
    let residuals = |cuts: &[usize]| -> Vec<(usize, f64)> {
        let mut out = Vec::with_capacity(pts.len());
        for w in cuts.windows(2) {
            let (i, j) = (w[0], w[1]);
            let (a, b, _) = cost[i][j];
            let g0 = bounds[i];
            let from = if g0 == 0 { 0 } else { pts[gstart[g0]].0 };
            for (q, p) in pts
                .iter()
                .enumerate()
                .take(gstart[bounds[j]])
                .skip(gstart[g0])
            {
                out.push((q, a + b * (p.0 - from) as f64 - p.1));
            }
        }
        out
    };
    let scale = (1..=kmax)
        .rev()
        .find(|&k| best[k][k_c].is_finite())
        .and_then(backtrack)
        .map(|cuts| {
            let mut z2: Vec<f64> = residuals(&cuts)
                .into_iter()
                .map(|(q, e)| weight(q) * e * e)
                .collect();
            z2.sort_by(f64::total_cmp);
            let med = z2.get(z2.len() / 2).copied().unwrap_or(0.0);
            (med / 0.455).max(1.0)
        })
        .unwrap_or(1.0);
    let mut bic_by_k = Vec::new();
    let mut chosen = (f64::INFINITY, 1usize);
    for (k, row) in best.iter().enumerate().skip(1) {
        let sse = row[k_c];
        let bic = if sse.is_finite() {
            sse / scale + (3 * k - 1) as f64 * npts.ln()
        } else {
            f64::INFINITY
        };
        bic_by_k.push(bic);
        if bic < chosen.0 {
            chosen = (bic, k);
        }
    }
    // The 1-segment fit is always feasible (whole range), so chosen.0 is finite unless the data
    // are numerically extreme.
    // Guard: the worst relative miss at a precise point; one more segment while it is too big
    // and the richer segmentation does better (see `SegOptions::max_precise_miss`).
    let worst_precise_miss = |k: usize| -> Option<f64> {
        let cuts = backtrack(k)?;
        let worst = residuals(&cuts)
            .into_iter()
            .filter_map(|(q, e)| counted_miss(pts[q].1, ses[q], e, floor))
            .fold(0.0f64, f64::max);
        Some(worst)
    };
    let mut k = chosen.1;
    if opts.max_precise_miss > 0.0 {
        // The fewest segments (from BIC's choice up) that miss no point by more than the
        // guard; if none does, the segmentation that misses least.
        let mut best_k = (worst_precise_miss(k).unwrap_or(f64::INFINITY), k);
        let mut kk = k;
        while best_k.0 > opts.max_precise_miss && kk < kmax && best[kk + 1][k_c].is_finite() {
            kk += 1;
            if let Some(w) = worst_precise_miss(kk) {
                if w < best_k.0 {
                    best_k = (w, kk);
                }
            }
        }
        k = best_k.1;
    }
    let cuts = backtrack(k)?;
    let mut segs = Vec::new();
    let mut reports = Vec::new();
    for w in cuts.windows(2) {
        let (i, j) = (w[0], w[1]);
        let (a, b, _) = cost[i][j];
        let g0 = bounds[i];
        let from = if g0 == 0 { 0 } else { pts[gstart[g0]].0 };
        let seg_pts = &pts[gstart[g0]..gstart[bounds[j]]];
        let rels: Vec<f64> = seg_pts
            .iter()
            .map(|p| (a + b * (p.0 - from) as f64 - p.1) / p.1.abs().max(floor))
            .collect();
        let rms = (rels.iter().map(|r| r * r).sum::<f64>() / rels.len().max(1) as f64).sqrt();
        let maxr = rels.iter().fold(0.0f64, |m, r| m.max(r.abs()));
        segs.push(Segment {
            from,
            base_us: a,
            per_byte_us: b,
        });
        reports.push(SegmentReport {
            from,
            base_us: a,
            per_byte_us: b,
            points: seg_pts.len(),
            sizes: bounds[j] - g0,
            rms_rel: rms,
            max_rel: maxr,
        });
    }
    let function = Piecewise(segs);
    let residuals = (0..n)
        .map(|g| {
            let mut ys: Vec<f64> = pts[gstart[g]..gstart[g + 1]].iter().map(|p| p.1).collect();
            ys.sort_by(f64::total_cmp);
            let m = ys.len();
            let med = if m % 2 == 1 {
                ys[m / 2]
            } else {
                (ys[m / 2 - 1] + ys[m / 2]) / 2.0
            };
            let bytes = pts[gstart[g]].0;
            let fitted = function.value(bytes);
            Residual {
                bytes,
                measured_us: med,
                fitted_us: fitted,
                rel: (fitted - med) / med.abs().max(floor),
            }
        })
        .collect();
    Some(SegFit {
        function,
        segments: reports,
        bic: chosen.0,
        bic_by_k,
        residuals,
    })
}

// ---------------------------------------------------------------------------------------------
// The modeller
// ---------------------------------------------------------------------------------------------

/// Report of one fitted parameter of a link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParamReport {
    /// `l`, `os` or `or`.
    pub param: String,
    /// Where the function came from: `class fit`, `pair fit`, `class function`.
    pub source: String,
    /// The fit (absent when the class function was kept for a pair link).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fit: Option<SegFit>,
}

/// Report of one link of the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkReport {
    /// Link class.
    pub class: LinkClass,
    /// Human-readable scope, e.g. `intra-site a`, `inter-site a-b`, `pair a1 -> b2`.
    pub scope: String,
    /// Measured pairs whose data were fitted.
    pub pairs: Vec<String>,
    /// For a pair link copied from another pair (inheritance): that pair.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inherited_from: Option<String>,
    /// Per-parameter fits (empty for inherited pair links).
    pub params: Vec<ParamReport>,
}

/// A host of the fitted model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostReport {
    /// Name.
    pub name: String,
    /// H (median kernel wall time per repetition, µs).
    pub h_us: f64,
    /// Relative speed written to the model.
    pub speed: f64,
    /// Median wall/CPU ratio of its kernel runs (Eq. 4.3's load factor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_cpu_ratio: Option<f64>,
}

/// Everything the fit decided, with residuals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FitReport {
    /// Send mode fitted.
    pub mode: SendMode,
    /// Host whose speed is 1.0.
    pub speed_reference: String,
    /// Hosts in the model.
    pub hosts: Vec<HostReport>,
    /// Hosts left out, with the reason.
    pub excluded_hosts: Vec<FailedHost>,
    /// Links in the model, in the same order.
    pub links: Vec<LinkReport>,
    /// Host pairs no link covers (the model cannot predict them).
    pub uncovered: Vec<String>,
    /// The calibration's partial reason, if it was partial.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial: Option<String>,
    /// Other remarks.
    pub warnings: Vec<String>,
}

impl FitReport {
    /// A human-readable summary.
    pub fn to_text(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "mode {}; speeds relative to {}",
            self.mode.as_str(),
            self.speed_reference
        );
        if let Some(p) = &self.partial {
            let _ = writeln!(s, "PARTIAL calibration: {p}");
        }
        for h in &self.hosts {
            let _ = writeln!(
                s,
                "host {:<16} H {:>12.3} us  speed {:.4}",
                h.name, h.h_us, h.speed
            );
        }
        for h in &self.excluded_hosts {
            let _ = writeln!(s, "host {} EXCLUDED: {}", h.name, h.reason);
        }
        for l in &self.links {
            let _ = write!(s, "{} ({} pairs)", l.scope, l.pairs.len());
            if let Some(f) = &l.inherited_from {
                let _ = write!(s, " inherited from {f}");
            }
            let _ = writeln!(s);
            for p in &l.params {
                let Some(fit) = &p.fit else {
                    let _ = writeln!(s, "  {:<2} {}", p.param, p.source);
                    continue;
                };
                for (i, g) in fit.segments.iter().enumerate() {
                    let bw = if p.param == "l" && g.per_byte_us > 0.0 {
                        format!("{:.1} MB/s", 1.0 / g.per_byte_us)
                    } else {
                        "-".to_string()
                    };
                    let _ = writeln!(
                        s,
                        "  {:<2} {} from {:>10} B: {:>12.3} us + {:.6e} us/B ({bw}); {} sizes, rms {:.1}%, max {:.1}%",
                        if i == 0 { p.param.as_str() } else { "" },
                        if i == 0 { p.source.as_str() } else { "         " },
                        g.from,
                        g.base_us,
                        g.per_byte_us,
                        g.sizes,
                        g.rms_rel * 100.0,
                        g.max_rel * 100.0
                    );
                }
            }
        }
        for u in &self.uncovered {
            let _ = writeln!(s, "UNCOVERED: {u}");
        }
        for w in &self.warnings {
            let _ = writeln!(s, "warning: {w}");
        }
        s
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum ClassKey {
    SameHost(String),
    Intra(String),
    Inter(String, String),
}

impl ClassKey {
    fn of(src_site: &str, dst_site: &str, same_host: bool) -> Self {
        if same_host {
            ClassKey::SameHost(src_site.to_string())
        } else if src_site == dst_site {
            ClassKey::Intra(src_site.to_string())
        } else if src_site < dst_site {
            ClassKey::Inter(src_site.to_string(), dst_site.to_string())
        } else {
            ClassKey::Inter(dst_site.to_string(), src_site.to_string())
        }
    }

    fn class(&self) -> LinkClass {
        match self {
            ClassKey::SameHost(_) => LinkClass::SameHost,
            ClassKey::Intra(_) => LinkClass::IntraSite,
            ClassKey::Inter(..) => LinkClass::InterSite,
        }
    }

    fn scope(&self) -> String {
        match self {
            ClassKey::SameHost(s) => format!("same-host {s}"),
            ClassKey::Intra(s) => format!("intra-site {s}"),
            ClassKey::Inter(a, b) => format!("inter-site {a}-{b}"),
        }
    }

    fn link(&self, os: Piecewise, or: Piecewise, l: Piecewise) -> Link {
        let (site, sites) = match self {
            ClassKey::SameHost(s) | ClassKey::Intra(s) => (Some(s.clone()), None),
            ClassKey::Inter(a, b) => (None, Some([a.clone(), b.clone()])),
        };
        Link {
            class: self.class(),
            site,
            sites,
            src: None,
            dst: None,
            os,
            or,
            l,
        }
    }
}

/// Per-size points of (l, os, or) a sweep contributes.
fn values(method: Method, bytes: u64, st: &DerivedStats) -> [FitPoint; 3] {
    let mut l = FitPoint::of_stats(bytes, &st.l);
    if method == Method::Plogp {
        let g = st.g.map(|g| g.median).unwrap_or(0.0);
        l.value_us = st.l.median + g - st.os.median - st.or.median;
    } else if let (Some(os_back), Some(or_back)) = (st.os_back, st.or_back) {
        // L from the medians, so that the two directions' modelled one-way times add up to the
        // median round trip. The median of the per-sample L does not: where a throttled
        // receiver makes `or` lumpy, the sum of the parameters' medians fell 15% below the
        // median RTT at 4 MiB (testbed, receiver at a quarter of a core), and every prediction
        // over that link with it.
        l.value_us =
            (st.rtt.median - st.os.median - st.or.median - os_back.median - or_back.median) / 2.0;
    }
    let mut or = FitPoint::of_stats(bytes, &st.or);
    if l.value_us < 0.0 && or.value_us + l.value_us > 0.0 {
        // The overheads' medians add up to more than the median round trip (a receiver held to
        // part of a core: its rendezvous Or is lumpy, 40–84 ms around a 48 ms median at 1 MiB).
        // L cannot be negative (the model's segments are ≥ 0), so the one-way time Os + L + Or
        // that the round trip gives is kept by taking the excess off Or, which carries the
        // transfer such a receive waits for; L is 0 there.
        or.value_us += l.value_us;
        l.value_us = 0.0;
    }
    [l, FitPoint::of_stats(bytes, &st.os), or]
}

const PARAMS: [&str; 3] = ["l", "os", "or"];

#[derive(Default, Clone)]
struct Data {
    pairs: Vec<String>,
    pts: [Vec<FitPoint>; 3],
}

fn fit3(
    data: &Data,
    seg: &SegOptions,
    scope: &str,
    split: Option<u64>,
) -> Result<([Piecewise; 3], [SegFit; 3]), FitError> {
    // Os and Or first; then L on what they leave of each measured one-way time: the point's L
    // plus the Os and Or fits' residuals there. The one-way time Os + L + Or is what a message
    // costs a prediction and what `poor_fits` judges; fitted apart, three functions that each
    // stay within their points' noise could add up to a miss (a 0.25-core receiver whose Or
    // holds the rendezvous transfer: medians that do not add, a pair link 15% over its
    // one-way time at 1 MiB). With exact data the residuals are 0 and L is its own fit.
    let os = fit_one(&data.pts[1], seg, &format!("{scope} os"), split)?;
    let or = fit_one(&data.pts[2], seg, &format!("{scope} or"), split)?;
    let (l, worst) = fit_l(data, seg, scope, &os.function, &or.function, split)?;
    // Where even that misses, Or's points were called noise too (a lumpy rendezvous receive
    // whose medians exceed what the round trip leaves): Or follows its medians as well, and the
    // pair is kept if the one-way times are missed less.
    if worst > 0.10 {
        let exact: Vec<FitPoint> = data.pts[2]
            .iter()
            .map(|p| FitPoint { se_us: 0.0, ..*p })
            .collect();
        let or_follow = fit_one(&exact, seg, &format!("{scope} or"), split)?;
        let (l_follow, w) = fit_l(data, seg, scope, &os.function, &or_follow.function, split)?;
        if w < worst {
            return Ok((
                [
                    l_follow.function.clone(),
                    os.function.clone(),
                    or_follow.function.clone(),
                ],
                [l_follow, os, or_follow],
            ));
        }
    }
    Ok((
        [l.function.clone(), os.function.clone(), or.function.clone()],
        [l, os, or],
    ))
}

/// L fitted to what the `os` and `or` functions leave of each point's one-way time (see
/// [`fit3`]), and the worst relative miss of a one-way time (by more than 5 µs) it leaves.
fn fit_l(
    data: &Data,
    seg: &SegOptions,
    scope: &str,
    os: &Piecewise,
    or: &Piecewise,
    split: Option<u64>,
) -> Result<(SegFit, f64), FitError> {
    let l_pts: Vec<FitPoint> = data.pts[0]
        .iter()
        .enumerate()
        .map(|(k, p)| match (data.pts[1].get(k), data.pts[2].get(k)) {
            (Some(o), Some(r)) if o.bytes == p.bytes && r.bytes == p.bytes => FitPoint {
                bytes: p.bytes,
                value_us: p.value_us
                    + (o.value_us - os.value(p.bytes))
                    + (r.value_us - or.value(p.bytes)),
                se_us: (p.se_us * p.se_us + o.se_us * o.se_us + r.se_us * r.se_us).sqrt(),
            },
            _ => *p,
        })
        .collect();
    let mut l = fit_one(&l_pts, seg, &format!("{scope} l"), split)?;
    // Where that L still misses a point's one-way time by more than `poor_fits` allows (10%
    // and 5 µs), the points' spread called the miss noise: a few samples of a lumpy link
    // (five round trips of 1 MiB to a 0.25-core host, 86–135 ms). The medians are what was
    // measured, so fit L to follow them (standard errors set aside, the precise-miss guard
    // on every point) and keep that if it misses less.
    let one_way_miss = |f: &Piecewise| -> f64 {
        l_pts
            .iter()
            .enumerate()
            .map(|(k, p)| {
                let one_way: f64 = (0..3)
                    .filter_map(|j| data.pts[j].get(k))
                    .map(|q| q.value_us)
                    .sum::<f64>()
                    .abs();
                let e = (f.value(p.bytes) - p.value_us).abs();
                if e > 5.0 && one_way > 0.0 {
                    e / one_way
                } else {
                    0.0
                }
            })
            .fold(0.0f64, f64::max)
    };
    let mut worst = one_way_miss(&l.function);
    if worst > 0.10 {
        let exact: Vec<FitPoint> = l_pts
            .iter()
            .map(|p| FitPoint { se_us: 0.0, ..*p })
            .collect();
        if let Ok(follow) = fit_one(&exact, seg, &format!("{scope} l"), split) {
            let w = one_way_miss(&follow.function);
            if w < worst {
                l = follow;
                worst = w;
            }
        }
    }
    Ok((l, worst))
}

/// One parameter's segmented fit. With `split` (the runtime's eager limit, between hosts), no
/// segment straddles it: sizes up to the limit and sizes above it are fitted apart, and the
/// first segment above starts at `split + 1`, extended down from the first measured size above
/// (the protocol changes there: above the limit the receive holds the transfer). Without that,
/// a size list with nothing between 64 KiB and 128 KiB left every message in between to the
/// eager segment, whose Or holds no transfer: a 100 KB message across a 10 Mbit/s WAN cost a
/// prediction 0 ms of wire where it took ~90 ms. When either side has fewer sizes than a
/// segment needs, the fit is made as without a split.
fn fit_one(
    pts: &[FitPoint],
    seg: &SegOptions,
    what: &str,
    split: Option<u64>,
) -> Result<SegFit, FitError> {
    if let Some(limit) = split {
        let (lo, hi): (Vec<FitPoint>, Vec<FitPoint>) = pts.iter().partition(|p| p.bytes <= limit);
        let sizes = |v: &[FitPoint]| {
            let mut b: Vec<u64> = v.iter().map(|p| p.bytes).collect();
            b.sort_unstable();
            b.dedup();
            b.len()
        };
        let need = seg.min_sizes_per_segment.max(1);
        if sizes(&lo) >= need && sizes(&hi) >= need {
            let below = fit_one(&lo, seg, what, None)?;
            let above = fit_one(&hi, seg, what, None)?;
            return Ok(join_at(below, above, limit + 1));
        }
    }
    let f = segmented_fit_points(pts, seg).ok_or_else(|| FitError::Numeric {
        what: what.to_string(),
    })?;
    if f.function
        .0
        .iter()
        .any(|s| !s.base_us.is_finite() || !s.per_byte_us.is_finite())
    {
        return Err(FitError::Numeric {
            what: what.to_string(),
        });
    }
    Ok(f)
}

/// `below` then `above`, whose first segment is moved down to start at `from` (a segment's
/// value is `base + per_byte × (bytes − from)`: the same line, extended).
fn join_at(below: SegFit, mut above: SegFit, from: u64) -> SegFit {
    if let Some(first) = above.function.0.first_mut() {
        first.base_us += first.per_byte_us * (from as f64 - first.from as f64);
        first.from = from;
    }
    if let Some(first) = above.segments.first_mut() {
        first.base_us += first.per_byte_us * (from as f64 - first.from as f64);
        first.from = from;
    }
    let mut function = below.function.0;
    function.extend(above.function.0);
    let mut segments = below.segments;
    segments.extend(above.segments);
    let mut residuals = below.residuals;
    residuals.extend(above.residuals);
    SegFit {
        function: Piecewise(function),
        segments,
        bic: below.bic + above.bic,
        bic_by_k: below.bic_by_k,
        residuals,
    }
}

fn mean_rel_miss(f: &Piecewise, pts: &[FitPoint], floor: f64) -> f64 {
    if pts.is_empty() {
        return 0.0;
    }
    pts.iter()
        .map(|p| ((f.value(p.bytes) - p.value_us) / p.value_us.abs().max(floor)).abs())
        .sum::<f64>()
        / pts.len() as f64
}

/// Fit a model to a calibration with the default options.
pub fn fit_default(calib: &Calibration) -> Result<(Model, FitReport), FitError> {
    fit(calib, &FitOptions::default())
}

/// Fit a `mutirao-model/1` model to `calib` (see the module docs). The model validates.
pub fn fit(calib: &Calibration, opts: &FitOptions) -> Result<(Model, FitReport), FitError> {
    calib.validate()?;
    let modes = calib.modes();
    let mode = match opts.mode {
        Some(m) => m,
        None if modes.contains(&SendMode::Isend) => SendMode::Isend,
        None => SendMode::Send,
    };
    if !modes.contains(&mode) {
        return Err(FitError::NoMode {
            mode: mode.as_str(),
            present: if modes.is_empty() {
                "none".to_string()
            } else {
                modes
                    .iter()
                    .map(|m| m.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        });
    }
    let most_sizes = calib
        .pairs
        .iter()
        .filter(|p| p.mode == mode)
        .map(|p| {
            p.sizes
                .iter()
                .filter(|s| s.stats.is_some() || s.derive(p.method).is_some())
                .map(|s| s.bytes)
                .collect::<HashSet<u64>>()
                .len()
        })
        .max()
        .unwrap_or(0);
    if most_sizes < 3 {
        return Err(FitError::TooFewSizes {
            mode: mode.as_str(),
            sizes: most_sizes,
        });
    }
    let mut warnings = Vec::new();
    // Hosts and speeds.
    let mut excluded = Vec::new();
    let mut measured: Vec<(&str, &str, f64, Option<f64>)> = Vec::new();
    for h in &calib.hosts {
        match h.speed.as_ref().and_then(|s| s.h_us().map(|x| (x, s))) {
            Some((hu, s)) if hu > 0.0 && hu.is_finite() => {
                measured.push((&h.name, &h.site, hu, s.wall_cpu_ratio()))
            }
            _ => excluded.push(FailedHost {
                name: h.name.clone(),
                reason: "no usable speed (H) measurement".to_string(),
            }),
        }
    }
    if measured.is_empty() {
        return Err(FitError::NoSpeed);
    }
    let (ref_name, h_ref) = match &opts.speed_reference {
        SpeedReference::Fastest => measured
            .iter()
            .min_by(|a, b| a.2.total_cmp(&b.2))
            .map(|m| (m.0.to_string(), m.2))
            .expect("non-empty"),
        SpeedReference::Host(n) => measured
            .iter()
            .find(|m| m.0 == n)
            .map(|m| (m.0.to_string(), m.2))
            .ok_or_else(|| FitError::BadReference(n.clone()))?,
    };
    let kernels: HashSet<&str> = calib
        .hosts
        .iter()
        .filter_map(|h| h.speed.as_ref().map(|s| s.kernel.as_str()))
        .collect();
    if kernels.len() > 1 {
        warnings.push(format!(
            "hosts were measured with different kernels ({}); their H are not comparable",
            kernels.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
    let hosts: Vec<Host> = measured
        .iter()
        .map(|m| Host {
            name: m.0.to_string(),
            site: m.1.to_string(),
            speed: h_ref / m.2,
            addr: None,
        })
        .collect();
    let host_reports = measured
        .iter()
        .map(|m| HostReport {
            name: m.0.to_string(),
            h_us: m.2,
            speed: h_ref / m.2,
            wall_cpu_ratio: m.3,
        })
        .collect();
    let site_of: HashMap<&str, &str> = measured.iter().map(|m| (m.0, m.1)).collect();

    // Gather points per class and per pair.
    let mut classes: BTreeMap<ClassKey, Data> = BTreeMap::new();
    let mut pairs: BTreeMap<(String, String), (ClassKey, Data)> = BTreeMap::new();
    for sw in calib.pairs.iter().filter(|p| p.mode == mode) {
        if sw.method == Method::Plogp
            && calib.sweep(&sw.src, &sw.dst, mode).map(|p| p.method) == Some(Method::PingPong)
        {
            continue; // ping-pong preferred when both exist
        }
        let (Some(ss), Some(ds)) = (site_of.get(sw.src.as_str()), site_of.get(sw.dst.as_str()))
        else {
            continue;
        };
        let key = ClassKey::of(ss, ds, sw.src == sw.dst);
        let mut pd = Data {
            pairs: vec![format!("{} -> {}", sw.src, sw.dst)],
            ..Data::default()
        };
        for s in &sw.sizes {
            let Some(st) = s.stats.or_else(|| s.derive(sw.method)) else {
                continue;
            };
            for (i, v) in values(sw.method, s.bytes, &st).into_iter().enumerate() {
                pd.pts[i].push(v);
            }
        }
        if pd.pts[0].is_empty() {
            warnings.push(format!(
                "pair {} -> {} has no usable samples in mode {}",
                sw.src,
                sw.dst,
                mode.as_str()
            ));
            continue;
        }
        let cd = classes.entry(key.clone()).or_default();
        cd.pairs.extend(pd.pairs.iter().cloned());
        for i in 0..3 {
            cd.pts[i].extend_from_slice(&pd.pts[i]);
        }
        pairs.insert((sw.src.clone(), sw.dst.clone()), (key, pd));
    }

    // The runtime's eager limit between hosts, where its protocol changes: no segment of a
    // link between hosts straddles it.
    let eager_split = calib.provenance.eager_limit_bytes;
    let mut links = Vec::new();
    let mut reports = Vec::new();
    let mut class_fns: HashMap<ClassKey, [Piecewise; 3]> = HashMap::new();
    for (key, data) in &classes {
        let split = match key {
            ClassKey::SameHost(_) => None,
            _ => eager_split,
        };
        let (f, fits) = fit3(data, &opts.seg, &key.scope(), split)?;
        let [l, os, or] = f.clone();
        links.push(key.link(os, or, l));
        reports.push(LinkReport {
            class: key.class(),
            scope: key.scope(),
            pairs: data.pairs.clone(),
            inherited_from: None,
            params: fits
                .into_iter()
                .zip(PARAMS)
                .map(|(fit, p)| ParamReport {
                    param: p.to_string(),
                    source: "class fit".to_string(),
                    fit: Some(fit),
                })
                .collect(),
        });
        class_fns.insert(key.clone(), f);
    }

    // Pair links where the class misses a pair.
    let mut pair_links: HashMap<(String, String), [Piecewise; 3]> = HashMap::new();
    if let Some(th) = opts.pair_threshold {
        let floor = opts.seg.weight_floor_us.max(1e-9);
        for ((src, dst), (key, pd)) in &pairs {
            let Some(cf) = class_fns.get(key) else {
                continue;
            };
            if classes.get(key).map(|c| c.pairs.len()) == Some(1) {
                continue; // the class is this pair
            }
            // A parameter gets the pair's own fit when the class misses the pair on average,
            // or at any size by more than the threshold and more than `poor_fits`' slack
            // (10 × the floor, 2% of the pair's one-way time there).
            let mut misses: Vec<bool> = (0..3)
                .map(|i| {
                    mean_rel_miss(&cf[i], &pd.pts[i], floor) > th
                        || pd.pts[i].iter().enumerate().any(|(k, p)| {
                            let one_way: f64 = (0..3)
                                .filter_map(|j| pd.pts[j].get(k))
                                .map(|q| q.value_us.max(0.0))
                                .sum();
                            let err = (cf[i].value(p.bytes) - p.value_us).abs();
                            err > th * p.value_us.abs() && err > (10.0 * floor).max(0.02 * one_way)
                        })
                })
                .collect();
            if !misses.iter().any(|&m| m) {
                continue;
            }
            // The pair's L is fitted to what the pair's own Os and Or leave of its one-way
            // times (`fit3`): beside an own Os or Or, it must be the pair's too.
            misses[0] = true;
            let scope = format!("pair {src} -> {dst}");
            let split = match key {
                ClassKey::SameHost(_) => None,
                _ => eager_split,
            };
            let (own, fits) = fit3(pd, &opts.seg, &scope, split)?;
            let mut chosen: [Piecewise; 3] = cf.clone();
            let mut params = Vec::new();
            for (i, fit) in fits.into_iter().enumerate() {
                if misses[i] {
                    chosen[i] = own[i].clone();
                    params.push(ParamReport {
                        param: PARAMS[i].to_string(),
                        source: "pair fit".to_string(),
                        fit: Some(fit),
                    });
                } else {
                    params.push(ParamReport {
                        param: PARAMS[i].to_string(),
                        source: format!("class function ({})", key.scope()),
                        fit: None,
                    });
                }
            }
            let [l, os, or] = chosen.clone();
            links.push(pair_link(src, dst, os, or, l));
            reports.push(LinkReport {
                class: LinkClass::Pair,
                scope,
                pairs: pd.pairs.clone(),
                inherited_from: None,
                params,
            });
            pair_links.insert((src.clone(), dst.clone()), chosen);
        }
        for inh in &calib.provenance.inherited {
            let from = (inh.from.src.clone(), inh.from.dst.clone());
            let Some(f) = pair_links.get(&from) else {
                continue;
            };
            let (src, dst) = (&inh.pair.src, &inh.pair.dst);
            if !site_of.contains_key(src.as_str()) || !site_of.contains_key(dst.as_str()) {
                continue;
            }
            if pairs.contains_key(&(src.clone(), dst.clone())) {
                continue; // measured after all
            }
            let [l, os, or] = f.clone();
            links.push(pair_link(src, dst, os, or, l));
            reports.push(LinkReport {
                class: LinkClass::Pair,
                scope: format!("pair {src} -> {dst}"),
                pairs: Vec::new(),
                inherited_from: Some(format!("{} -> {}", inh.from.src, inh.from.dst)),
                params: Vec::new(),
            });
        }
    }

    // Unrestricted class links where a pair would be uncovered.
    let mut model = Model::new(hosts, links)?;
    let uncovered_classes: Vec<LinkClass> = {
        let mut v = Vec::new();
        for a in &model.hosts {
            for b in &model.hosts {
                if let Err(ModelError::MissingClass { .. }) = model.link_for(&a.name, &b.name) {
                    let c = model.class_of(a, b);
                    if !v.contains(&c) {
                        v.push(c);
                    }
                }
            }
        }
        v
    };
    for c in uncovered_classes {
        let mut data = Data::default();
        for (key, d) in &classes {
            if key.class() == c {
                data.pairs.extend(d.pairs.iter().cloned());
                for i in 0..3 {
                    data.pts[i].extend_from_slice(&d.pts[i]);
                }
            }
        }
        if data.pts[0].is_empty() {
            continue;
        }
        let scope = format!("{} (any site)", c.as_str());
        let split = if c == LinkClass::SameHost {
            None
        } else {
            eager_split
        };
        let (f, fits) = fit3(&data, &opts.seg, &scope, split)?;
        let [l, os, or] = f;
        model.links.push(Link {
            class: c,
            site: None,
            sites: None,
            src: None,
            dst: None,
            os,
            or,
            l,
        });
        reports.push(LinkReport {
            class: c,
            scope,
            pairs: data.pairs,
            inherited_from: None,
            params: fits
                .into_iter()
                .zip(PARAMS)
                .map(|(fit, p)| ParamReport {
                    param: p.to_string(),
                    source: "class fit, all sites pooled (fallback)".to_string(),
                    fit: Some(fit),
                })
                .collect(),
        });
    }
    model.push_cost = push_costs(
        calib,
        mode,
        &measured.iter().map(|m| (m.0, m.3)).collect::<Vec<_>>(),
    );
    model.validate()?;
    let mut uncovered = Vec::new();
    for a in &model.hosts {
        for b in &model.hosts {
            if let Err(e) = model.link_for(&a.name, &b.name) {
                uncovered.push(format!("{} -> {}: {e}", a.name, b.name));
            }
        }
    }
    let report = FitReport {
        mode,
        speed_reference: ref_name,
        hosts: host_reports,
        excluded_hosts: excluded,
        links: reports,
        uncovered,
        partial: calib.partial.as_ref().map(|p| p.reason.clone()),
        warnings,
    };
    Ok((model, report))
}

/// Per host, the time it spends per byte pushing a rendezvous message to another host
/// ([`Model::push_cost`]): the slope of its send overhead between the smallest measured size and
/// the largest eager one (at least 16 KiB) — an eager send call does that copy and protocol
/// work itself, a rendezvous send does it later, while the program computes — the median over
/// its sweeps to other hosts, times its wall/CPU ratio (a host held to part of a core spends
/// that much longer on the same work). Nothing when the calibration does not record the eager
/// limit. On the testbed (1500-byte frames through the stack) it is about 6 µs per KiB of CPU:
/// a task on a half-core host computed for 50 ms while its rank pushed 3 MiB took 90–120 ms.
/// Where the calibration measured a host's push cost directly ([`Calibration::push`]), that
/// median is used instead: the eager slope leaves out what moving a large message costs beyond
/// its copy (on the testbed's veths the receiving stack runs in the sender's context too; a
/// half-core host's 50 ms tasks took 61–85 ms while it pushed 512 KiB where the slope said
/// 56 ms).
fn push_costs(
    calib: &Calibration,
    mode: SendMode,
    ratios: &[(&str, Option<f64>)],
) -> Vec<crate::PushCost> {
    const MIN_EAGER: u64 = 16 << 10;
    let Some(eager) = calib.provenance.eager_limit_bytes else {
        return Vec::new();
    };
    if eager < MIN_EAGER {
        return Vec::new();
    }
    let mut slopes: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for sw in calib
        .pairs
        .iter()
        .filter(|p| p.mode == mode && p.method == Method::PingPong && p.src != p.dst)
    {
        let os: Vec<(u64, f64)> = sw
            .sizes
            .iter()
            .filter_map(|s| Some((s.bytes, s.stats.or_else(|| s.derive(sw.method))?.os.median)))
            .filter(|(_, v)| v.is_finite())
            .collect();
        let small = os.iter().min_by_key(|p| p.0);
        let big = os
            .iter()
            .filter(|p| p.0 <= eager && p.0 >= MIN_EAGER)
            .max_by_key(|p| p.0);
        if let (Some(&(b0, v0)), Some(&(b1, v1))) = (small, big) {
            if b1 > b0 {
                slopes
                    .entry(sw.src.as_str())
                    .or_default()
                    .push(((v1 - v0) / (b1 - b0) as f64).max(0.0));
            }
        }
    }
    // Measured directly (calibrate's push probe): that, as measured, in the host's wall time.
    let mut measured: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for p in &calib.push {
        if let Some(v) = p.us_per_byte() {
            measured.entry(p.host.as_str()).or_default().push(v);
        }
    }
    ratios
        .iter()
        .filter_map(|&(host, ratio)| {
            if let Some(mut v) = measured.remove(host) {
                v.sort_by(f64::total_cmp);
                return Some(crate::PushCost {
                    host: host.to_string(),
                    us_per_byte: v[v.len() / 2],
                });
            }
            let mut v = slopes.remove(host)?;
            v.sort_by(f64::total_cmp);
            let median = v[v.len() / 2];
            let r = ratio.filter(|r| r.is_finite()).unwrap_or(1.0).max(1.0);
            Some(crate::PushCost {
                host: host.to_string(),
                us_per_byte: median * r,
            })
        })
        .collect()
}

fn pair_link(src: &str, dst: &str, os: Piecewise, or: Piecewise, l: Piecewise) -> Link {
    Link {
        class: LinkClass::Pair,
        site: None,
        sites: None,
        src: Some(src.to_string()),
        dst: Some(dst.to_string()),
        os,
        or,
        l,
    }
}

// ---------------------------------------------------------------------------------------------
// Intercept refresh
// ---------------------------------------------------------------------------------------------

/// How one function of one link was shifted by [`refresh_intercepts`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Shift {
    /// Index of the link in the model's `links`.
    pub link: usize,
    /// `l`, `os` or `or`.
    pub param: String,
    /// Median of (probe − model) over the probe points, added to every segment's base (µs).
    pub delta_us: f64,
    /// Probe points (pair × size) that went into the median.
    pub points: usize,
}

/// Keep a model's slopes and breakpoints, and move its intercepts to what a cheap probe measured
/// now (the thesis's analytic refresh: "314 is the 64-byte latency measured by II(b)").
///
/// For every probe sweep in `mode` (default as in [`fit`]) between hosts of the model, the link
/// that applies to the pair collects, per parameter, the residuals `probe median − model value`;
/// the link's function is then shifted by their median (each base clamped at 0). Links no probe
/// touched are unchanged. The probe is typically a site-sampled calibration at one small size.
pub fn refresh_intercepts(
    model: &Model,
    probe: &Calibration,
    mode: Option<SendMode>,
) -> Result<(Model, Vec<Shift>), FitError> {
    probe.validate()?;
    model.validate()?;
    let modes = probe.modes();
    let mode = match mode {
        Some(m) => m,
        None if modes.contains(&SendMode::Isend) => SendMode::Isend,
        None => SendMode::Send,
    };
    let mut resid: BTreeMap<(usize, usize), Vec<f64>> = BTreeMap::new();
    for sw in probe.pairs.iter().filter(|p| p.mode == mode) {
        let Ok(link) = model.link_for(&sw.src, &sw.dst) else {
            continue;
        };
        let idx = model
            .links
            .iter()
            .position(|l| std::ptr::eq(l, link))
            .expect("link_for returns one of the model's links");
        let fns = [&link.l, &link.os, &link.or];
        for s in &sw.sizes {
            let Some(st) = s.stats.or_else(|| s.derive(sw.method)) else {
                continue;
            };
            for (i, y) in values(sw.method, s.bytes, &st).into_iter().enumerate() {
                resid
                    .entry((idx, i))
                    .or_default()
                    .push(y.value_us - fns[i].value(s.bytes));
            }
        }
    }
    let mut out = model.clone();
    let mut shifts = Vec::new();
    for ((idx, i), mut r) in resid {
        r.sort_by(f64::total_cmp);
        let n = r.len();
        let delta = if n % 2 == 1 {
            r[n / 2]
        } else {
            (r[n / 2 - 1] + r[n / 2]) / 2.0
        };
        let link = &mut out.links[idx];
        let f = match i {
            0 => &mut link.l,
            1 => &mut link.os,
            _ => &mut link.or,
        };
        for seg in &mut f.0 {
            seg.base_us = (seg.base_us + delta).max(0.0);
        }
        shifts.push(Shift {
            link: idx,
            param: PARAMS[i].to_string(),
            delta_us: delta,
            points: n,
        });
    }
    out.validate()?;
    Ok((out, shifts))
}

/// The measured medians the model misses: for every measured pair (in `report.mode`), at every
/// measured size, the one-way time Os + L + Or the model gives that pair (its pair link, or the
/// class link that covers it) against the sum of the pair's medians. A miss is off by more
/// than `rel` of it and by more than `abs_us` microseconds (so that a 3 µs message measured
/// with 1 µs of noise is not a "miss"), and lies outside the band of the middle 80% of the
/// samples (the sum of each parameter's p10–p90 spread around its median). The one-way time is what a message costs a prediction;
/// how it splits between Os, L and Or may be off by more where the runtime's protocol changes
/// (an eager message filling the socket, the rendezvous moving the transfer into Or), and
/// `--report` shows those residuals.
pub fn poor_fits(
    calib: &Calibration,
    model: &Model,
    report: &FitReport,
    rel: f64,
    abs_us: f64,
) -> Vec<String> {
    let mut out = Vec::new();
    for sw in calib.pairs.iter().filter(|p| p.mode == report.mode) {
        if sw.method == Method::Plogp
            && calib.sweep(&sw.src, &sw.dst, report.mode).map(|p| p.method)
                == Some(Method::PingPong)
        {
            continue;
        }
        let Ok(link) = model.link_for(&sw.src, &sw.dst) else {
            continue;
        };
        for sz in &sw.sizes {
            let Some(st) = sz.stats.or_else(|| sz.derive(sw.method)) else {
                continue;
            };
            let v = values(sw.method, sz.bytes, &st);
            let measured: f64 = v.iter().map(|p| p.value_us).sum();
            let modelled =
                link.l.value(sz.bytes) + link.os.value(sz.bytes) + link.or.value(sz.bytes);
            let err = modelled - measured;
            // The band where the middle 80% of each parameter's samples lie, summed: a model
            // inside it is as close as the measurement can tell (a bimodal link, a CPU quota
            // throttling one size's samples but not its neighbours').
            let spread = |f: fn(&crate::calib::Stats) -> f64| f(&st.l) + f(&st.os) + f(&st.or);
            let below = spread(|s| (s.median - s.p10).max(0.0));
            let above = spread(|s| (s.p90 - s.median).max(0.0));
            let outside = modelled < measured - below || modelled > measured + above;
            if measured > 0.0 && outside && err.abs() > abs_us && err.abs() > rel * measured {
                out.push(format!(
                    "{} -> {} ({} link): one-way time at {} B measured {:.1} us, modelled {:.1} us ({:+.0}%)",
                    sw.src,
                    sw.dst,
                    link.class.as_str(),
                    sz.bytes,
                    measured,
                    modelled,
                    100.0 * err / measured
                ));
            }
        }
    }
    out
}
