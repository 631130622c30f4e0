//! CRES (thesis §4.1, digest 001 §1.1): the machine model from measurements on each host.
//!
//! Three measurements per host, then one pure assembly step:
//! * **op × type costs** ([`measure_ops`]): each operation runs in a loop of `n` iterations
//!   with its operands passed through [`std::hint::black_box`], minus the same loop with the
//!   same `black_box` traffic but no operation; the difference ÷ n is one sample (clamped at
//!   0). The caller hands in the clock: a **CPU-time** clock (the CLI uses the thread's CPU
//!   clock) makes a sample independent of when a CPU quota or another process takes the core
//!   away, which a wall clock over a millisecond loop is not (a host at a quarter of a core runs
//!   1.25 ms of every 5 ms: a sample either misses the stall or counts all of it);
//! * **the host's share of a core** and **W** ([`KernelRun`]): a fixed kernel
//!   ([`kernel`]) timed on the wall clock and the CPU clock over at least 15 quota periods;
//!   wall ÷ CPU is how much longer than its CPU time anything takes on this host (the
//!   *availability*), and kernel iterations per wall second give W (Eq. 3.5: W_i =
//!   min_j T(App, M_j) / T(App, M_i), fastest worker = 1);
//! * **send costs**: one-way times (half a ping-pong round trip) between the coordinator and
//!   each host at a few sizes, measured through the runtime by the caller.
//!
//! [`build_model`] turns these raw samples into the Appendix-B machine model: every op
//! interval (Huerta's construction, keep C %) is the CPU-time interval × the availability
//! interval, so the model's costs are wall seconds on that host; W from the kernel's median
//! speed; sends in milliseconds (`send_unit_s = 1e-3`, the Appendix-B unit). Everything but
//! the timing loops is pure and tested.

use crate::analytic::Policy;
use crate::interval::{from_samples, Interval, IntervalError};
use crate::machine::{CostKey, DataType, Machine, MachineModel, Op, SendPoint};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::hint::black_box;

/// Errors building a machine model from measurements.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CresError {
    /// A set of samples gave no interval.
    #[error("host {host} ({what}): {source}")]
    Samples {
        /// Machine index.
        host: usize,
        /// Which measurement.
        what: String,
        /// Why.
        source: IntervalError,
    },
    /// Inconsistent or missing measurements.
    #[error("{0}")]
    Input(String),
}

/// A clock in seconds (any origin): the thread's CPU time, or a monotonic wall clock.
pub type Clock<'a> = &'a dyn Fn() -> f64;

/// One benchmark: a function taking `(iterations, clock)` and returning one sample (seconds per
/// operation).
pub struct OpBench {
    /// What it measures.
    pub key: CostKey,
    run: Box<dyn Fn(u64, Clock<'_>) -> f64>,
}

impl OpBench {
    /// One sample: seconds per operation over `n` iterations, timed with `clock`.
    pub fn sample(&self, n: u64, clock: Clock<'_>) -> f64 {
        (self.run)(n, clock)
    }
}

fn per_iter(n: u64, clock: Clock<'_>, mut f: impl FnMut()) -> f64 {
    let t = clock();
    for _ in 0..n {
        f();
    }
    (clock() - t) / n.max(1) as f64
}

/// One sample: (loop with the op) − (loop with the same black_box traffic), per iteration.
fn diff(n: u64, clock: Clock<'_>, op: impl FnMut(), base: impl FnMut()) -> f64 {
    let with = per_iter(n, clock, op);
    let without = per_iter(n, clock, base);
    (with - without).max(0.0)
}

macro_rules! typed {
    ($out:ident, $t:ty, $ty:expr) => {{
        let (a, z, one, five): ($t, $t, $t, $t) = (7 as $t, 0 as $t, 1 as $t, 5 as $t);
        let bin: [(Op, fn($t, $t) -> $t, $t); 5] = [
            (Op::Sum, |x, y| x + y, z),
            (Op::Sub, |x, y| x - y, z),
            (Op::Mpy, |x, y| x * y, one),
            (Op::Div, |x, y| x / y, one),
            (Op::Mod, |x, y| x % y, five),
        ];
        for (op, f, rhs) in bin {
            $out.push(OpBench {
                key: CostKey::typed(op, $ty),
                run: Box::new(move |n, clock| {
                    diff(
                        n,
                        clock,
                        || {
                            black_box(f(black_box(a), black_box(rhs)));
                        },
                        || {
                            let x = black_box(a);
                            black_box(rhs);
                            black_box(x);
                        },
                    )
                }),
            });
        }
        $out.push(OpBench {
            key: CostKey::typed(Op::Neg, $ty),
            run: Box::new(move |n, clock| {
                diff(
                    n,
                    clock,
                    || {
                        black_box(-black_box(a));
                    },
                    || {
                        black_box(black_box(a));
                    },
                )
            }),
        });
        $out.push(OpBench {
            key: CostKey::typed(Op::Assign, $ty),
            run: Box::new(move |n, clock| {
                let mut slot: $t = z;
                let mut other: $t = z;
                let d = diff(
                    n,
                    clock,
                    || {
                        let p = black_box(&mut slot);
                        *p = black_box(a);
                    },
                    || {
                        black_box(&mut other);
                        black_box(a);
                    },
                );
                black_box(slot);
                d
            }),
        });
    }};
}

macro_rules! integer {
    ($out:ident, $t:ty, $ty:expr) => {{
        let (a, b, s): ($t, $t, u32) = (0x5a as $t, 0x33 as $t, 3);
        let ops: [(Op, fn($t, $t, u32) -> $t); 2] =
            [(Op::Bit, |x, y, _| x ^ y), (Op::Shift, |x, _, s| x >> s)];
        for (op, f) in ops {
            $out.push(OpBench {
                key: CostKey::typed(op, $ty),
                run: Box::new(move |n, clock| {
                    diff(
                        n,
                        clock,
                        || {
                            black_box(f(black_box(a), black_box(b), black_box(s)));
                        },
                        || {
                            let x = black_box(a);
                            black_box(b);
                            black_box(s);
                            black_box(x);
                        },
                    )
                }),
            });
        }
        $out.push(OpBench {
            key: CostKey::typed(Op::Not, $ty),
            run: Box::new(move |n, clock| {
                diff(
                    n,
                    clock,
                    || {
                        black_box(!black_box(a));
                    },
                    || {
                        black_box(black_box(a));
                    },
                )
            }),
        });
    }};
}

/// Every benchmark CRES runs: `sum sub mpy div mod neg assign` on `byte short int long float
/// double`; `bit shift not` on the integer types; `access`, `array_access`, `compare`, `cast`,
/// `and`, `or`, `loop_iteration`. (`alloc` and `call` are not measured: the Rust analyser never
/// charges them.)
pub fn op_benches() -> Vec<OpBench> {
    let mut out: Vec<OpBench> = Vec::new();
    typed!(out, i8, DataType::Byte);
    typed!(out, i16, DataType::Short);
    typed!(out, i32, DataType::Int);
    typed!(out, i64, DataType::Long);
    typed!(out, f32, DataType::Float);
    typed!(out, f64, DataType::Double);
    integer!(out, i8, DataType::Byte);
    integer!(out, i16, DataType::Short);
    integer!(out, i32, DataType::Int);
    integer!(out, i64, DataType::Long);
    out.push(OpBench {
        key: CostKey::untyped(Op::Access),
        run: Box::new(|n, clock| {
            let slot = 42i32;
            diff(
                n,
                clock,
                || {
                    black_box(*black_box(&slot));
                },
                || {
                    black_box(black_box(&slot));
                },
            )
        }),
    });
    out.push(OpBench {
        key: CostKey::untyped(Op::ArrayAccess),
        run: Box::new(|n, clock| {
            let arr = [3i32; 64];
            diff(
                n,
                clock,
                || {
                    let a = black_box(&arr);
                    black_box(a[black_box(17usize) & 63]);
                },
                || {
                    black_box(&arr);
                    black_box(black_box(17usize) & 63);
                },
            )
        }),
    });
    out.push(OpBench {
        key: CostKey::untyped(Op::Compare),
        run: Box::new(|n, clock| {
            diff(
                n,
                clock,
                || {
                    black_box(black_box(3i32) < black_box(5i32));
                },
                || {
                    let x = black_box(3i32);
                    black_box(5i32);
                    black_box(x);
                },
            )
        }),
    });
    out.push(OpBench {
        key: CostKey::untyped(Op::Cast),
        run: Box::new(|n, clock| {
            diff(
                n,
                clock,
                || {
                    black_box(black_box(12345i32) as f64);
                },
                || {
                    black_box(black_box(12345i32));
                },
            )
        }),
    });
    for (op, f) in [
        (
            Op::And,
            (|x: bool, y: bool| x & y) as fn(bool, bool) -> bool,
        ),
        (Op::Or, |x: bool, y: bool| x | y),
    ] {
        out.push(OpBench {
            key: CostKey::untyped(op),
            run: Box::new(move |n, clock| {
                diff(
                    n,
                    clock,
                    || {
                        black_box(f(black_box(true), black_box(false)));
                    },
                    || {
                        let x = black_box(true);
                        black_box(false);
                        black_box(x);
                    },
                )
            }),
        });
    }
    out.push(OpBench {
        key: CostKey::untyped(Op::LoopIteration),
        run: Box::new(|n, clock| {
            let t = clock();
            for i in 0..n {
                black_box(i);
            }
            (clock() - t) / n.max(1) as f64
        }),
    });
    out
}

/// Run every benchmark `samples` times with `n` iterations per sample (keys in
/// [`op_benches`] order; samples of one key are taken in rounds over all keys, so a slow spell
/// spreads over every key instead of spoiling one).
pub fn measure_ops(n: u64, samples: usize, clock: Clock<'_>) -> Vec<(CostKey, Vec<f64>)> {
    let benches = op_benches();
    let mut out: Vec<(CostKey, Vec<f64>)> = benches
        .iter()
        .map(|b| (b.key, Vec::with_capacity(samples)))
        .collect();
    for _ in 0..samples {
        for (b, (_, s)) in benches.iter().zip(out.iter_mut()) {
            s.push(b.sample(n, clock));
        }
    }
    out
}

mod reference_kernel {
    include!("cres_kernel.rs");
}
pub use reference_kernel::{reference, REF_ITERS};

/// The source text of [`reference`] (the file it is compiled from), for the analyser.
pub const REFERENCE_SOURCE: &str = include_str!("cres_kernel.rs");

/// The op × type counts of one [`reference`] run, from its source (worst-case conditionals,
/// as `mutirao predict` costs them by default).
pub fn reference_counts() -> Result<BTreeMap<CostKey, f64>, CresError> {
    let an = crate::analyse::analyse(REFERENCE_SOURCE, "reference", &[])
        .map_err(|e| CresError::Input(format!("internal: the reference kernel: {e}")))?;
    let counts = an
        .counts(Policy::Worst)
        .map_err(|e| CresError::Input(format!("internal: the reference kernel: {e}")))?;
    counts
        .into_iter()
        .map(|(k, n)| {
            k.parse::<CostKey>()
                .map(|k| (k, n))
                .map_err(|e| CresError::Input(format!("internal: reference kernel key {k}: {e}")))
        })
        .collect()
}

/// Σ count × cost over `counts`, each cost from `costs` (no fallback: every key must be
/// there), as an interval.
pub fn op_model_time(
    counts: &BTreeMap<CostKey, f64>,
    costs: &BTreeMap<CostKey, Interval>,
) -> Result<Interval, CresError> {
    let mut t = Interval { lo: 0.0, hi: 0.0 };
    for (k, n) in counts {
        let c = costs
            .get(k)
            .ok_or_else(|| CresError::Input(format!("no measured cost for `{k}`")))?;
        t = Interval {
            lo: t.lo + n * c.lo,
            hi: t.hi + n * c.hi,
        };
    }
    Ok(t)
}

/// Time [`reference`] `samples` times on `clock` (seconds per run).
pub fn measure_reference(samples: usize, clock: Clock<'_>) -> Vec<f64> {
    (0..samples)
        .map(|i| {
            let t = clock();
            black_box(reference(black_box(i as u64 + 1)));
            clock() - t
        })
        .collect()
}

/// The fixed kernel of the W benchmark: dependent multiply-adds the compiler cannot remove.
pub fn kernel(iters: u64) -> u64 {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for i in 0..iters {
        x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
    }
    x
}

/// One timed run of [`kernel`]: iterations, wall seconds, CPU seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct KernelRun {
    /// Kernel iterations.
    pub iters: u64,
    /// Wall-clock seconds.
    pub wall_s: f64,
    /// CPU seconds of the thread that ran it.
    pub cpu_s: f64,
}

/// Time [`kernel`] `runs` times, each at least `min_wall_s` of wall time (the iteration count
/// is doubled from 10⁶ until one run takes that long). `wall` and `cpu` are the two clocks.
pub fn measure_kernel(
    runs: usize,
    min_wall_s: f64,
    wall: Clock<'_>,
    cpu: Clock<'_>,
) -> Vec<KernelRun> {
    let time = |iters: u64| {
        let (w, c) = (wall(), cpu());
        black_box(kernel(iters));
        KernelRun {
            iters,
            wall_s: (wall() - w).max(1e-9),
            cpu_s: (cpu() - c).max(1e-9),
        }
    };
    let mut iters = 1_000_000u64;
    while time(iters).wall_s < min_wall_s && iters < 1 << 40 {
        iters *= 2;
    }
    (0..runs).map(|_| time(iters)).collect()
}

/// What one host measured (sent to the coordinator, which assembles the model).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostMeasure {
    /// Machine index (0 = coordinator).
    pub index: usize,
    /// Host name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// CPU seconds per operation, every sample, per key.
    pub ops: Vec<(CostKey, Vec<f64>)>,
    /// The W benchmark runs.
    pub kernel: Vec<KernelRun>,
    /// One-way seconds (half round trips) between the coordinator and this host: (size in
    /// bytes, samples). Empty for the coordinator.
    #[serde(default)]
    pub pingpong: Vec<(f64, Vec<f64>)>,
    /// CPU seconds of [`reference`] runs (for [`Calibration::ReferenceKernel`]).
    #[serde(default)]
    pub reference: Vec<f64>,
}

/// How [`build_model`] treats the op costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Calibration {
    /// As measured, one op at a time (the thesis's CRES).
    None,
    /// Scaled per host so that the op model reproduces the measured CPU time of the
    /// [`reference`] kernel (its counts from its source): compiled code keeps values in
    /// registers and overlaps independent operations, which ops timed one by one through
    /// `black_box` do not show.
    ReferenceKernel,
}

/// What [`build_model`] derived per host, besides the model (for a report).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostSummary {
    /// Machine index.
    pub index: usize,
    /// Host name.
    pub name: Option<String>,
    /// Wall ÷ CPU time of the kernel: how much longer than its CPU time work takes here.
    pub availability: Interval,
    /// Kernel iterations per wall second (median of the runs).
    pub kernel_rate: f64,
    /// W (workers only).
    pub w: Option<f64>,
    /// Measured ÷ op-model CPU time of the reference kernel (op costs were multiplied by it
    /// with [`Calibration::ReferenceKernel`]; reported either way when measured).
    pub reference_ratio: Option<f64>,
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// W (Eq. 3.5) from each worker's speed on the same benchmark (iterations per second, or
/// 1/time): `W_i = speed_i / max speed` = `min_j T_j / T_i`; the fastest has W = 1.
pub fn w_factors(speeds: &[f64]) -> Result<Vec<f64>, CresError> {
    if let Some((i, s)) = speeds
        .iter()
        .enumerate()
        .find(|(_, s)| !(s.is_finite() && **s > 0.0))
    {
        return Err(CresError::Input(format!(
            "worker {} has speed {s}; a benchmark speed must be finite and > 0",
            i + 1
        )));
    }
    let max = speeds.iter().copied().fold(0.0f64, f64::max);
    Ok(speeds.iter().map(|s| s / max).collect())
}

/// Every cost interval multiplied by a positive interval `factor` (e.g. CPU seconds per op ×
/// wall ÷ CPU = wall seconds per op): `[lo·f_lo; hi·f_hi]`.
pub fn scale_costs(
    costs: &BTreeMap<CostKey, Interval>,
    factor: Interval,
) -> Result<BTreeMap<CostKey, Interval>, CresError> {
    if !(factor.lo > 0.0 && factor.lo <= factor.hi && factor.hi.is_finite()) {
        return Err(CresError::Input(format!(
            "scale factor [{};{}] must be a finite interval above 0",
            factor.lo, factor.hi
        )));
    }
    Ok(costs
        .iter()
        .map(|(k, iv)| {
            (
                *k,
                Interval {
                    lo: iv.lo * factor.lo,
                    hi: iv.hi * factor.hi,
                },
            )
        })
        .collect())
}

/// Assemble the machine model from every host's measurements (`hosts[i].index` must be `i`;
/// host 0 is the coordinator). `keep_percent` is Huerta's C for every interval.
///
/// Per host: op intervals from the CPU-time samples × the availability interval (wall ÷ CPU of
/// the kernel runs); W for workers from the median kernel speeds ([`w_factors`]); send points
/// `send[i][0](size)` and `send[0][i](size)` from the one-way samples, in milliseconds.
pub fn build_model(
    hosts: &[HostMeasure],
    keep_percent: f64,
    calibration: Calibration,
) -> Result<(MachineModel, Vec<HostSummary>), CresError> {
    if hosts.is_empty() {
        return Err(CresError::Input("no host measured".into()));
    }
    for (i, h) in hosts.iter().enumerate() {
        if h.index != i {
            return Err(CresError::Input(format!(
                "measurement {i} is for host {}; hosts must be given in index order",
                h.index
            )));
        }
        if h.kernel.is_empty() {
            return Err(CresError::Input(format!("host {i} has no W benchmark run")));
        }
        if i > 0 && h.pingpong.is_empty() {
            return Err(CresError::Input(format!(
                "host {i} has no send-cost measurement"
            )));
        }
    }
    let iv = |host: usize, what: &str, s: &[f64]| {
        from_samples(s, keep_percent).map_err(|source| CresError::Samples {
            host,
            what: what.to_string(),
            source,
        })
    };
    let rates: Vec<f64> = hosts
        .iter()
        .map(|h| {
            median(
                &h.kernel
                    .iter()
                    .map(|r| r.iters as f64 / r.wall_s)
                    .collect::<Vec<_>>(),
            )
        })
        .collect();
    let ws = if hosts.len() > 1 {
        w_factors(&rates[1..])?
    } else {
        Vec::new()
    };
    let mut machines = Vec::new();
    let mut sends = Vec::new();
    let mut summary = Vec::new();
    for (i, h) in hosts.iter().enumerate() {
        let ratios: Vec<f64> = h.kernel.iter().map(|r| r.wall_s / r.cpu_s).collect();
        let avail = iv(i, "availability", &ratios)?;
        // Wall time never beats CPU time: a ratio below 1 is clock granularity.
        let avail = Interval {
            lo: avail.lo.max(1.0),
            hi: avail.hi.max(1.0),
        };
        let mut cpu = BTreeMap::new();
        for (k, s) in &h.ops {
            cpu.insert(*k, iv(i, &k.to_string(), s)?);
        }
        let reference_ratio = if h.reference.is_empty() {
            None
        } else {
            let model = op_model_time(&reference_counts()?, &cpu)
                .map_err(|e| CresError::Input(format!("host {i}: reference kernel: {e}")))?;
            let measured = median(&h.reference);
            if !(model.mid() > 0.0 && measured.is_finite() && measured > 0.0) {
                return Err(CresError::Input(format!(
                    "host {i}: reference kernel measured {measured} s against an op model of {} s; both must be > 0",
                    model.mid()
                )));
            }
            Some(measured / model.mid())
        };
        let cpu = match (calibration, reference_ratio) {
            (Calibration::None, _) => cpu,
            (Calibration::ReferenceKernel, Some(r)) => {
                scale_costs(&cpu, Interval { lo: r, hi: r })?
            }
            (Calibration::ReferenceKernel, None) => {
                return Err(CresError::Input(format!(
                    "host {i} has no reference-kernel run to calibrate its op costs with"
                )))
            }
        };
        let costs = scale_costs(&cpu, avail)?;
        let w = if i == 0 { None } else { Some(ws[i - 1]) };
        for (size, s) in &h.pingpong {
            if !(size.is_finite() && *size >= 0.0) {
                return Err(CresError::Input(format!(
                    "host {i}: send size {size} is not a size in bytes"
                )));
            }
            let c = iv(i, &format!("send({size})"), s)?;
            let ms = Interval {
                lo: c.lo * 1e3,
                hi: c.hi * 1e3,
            };
            for (from, to) in [(i, 0), (0, i)] {
                sends.push(SendPoint {
                    from,
                    to,
                    size: *size,
                    cost: ms,
                });
            }
        }
        summary.push(HostSummary {
            index: i,
            name: h.name.clone(),
            availability: avail,
            kernel_rate: rates[i],
            w,
            reference_ratio,
        });
        machines.push(Machine {
            index: i,
            name: h.name.clone(),
            w,
            costs,
        });
    }
    let mm = MachineModel {
        send_unit_s: 1e-3,
        machines,
        sends,
    };
    mm.validate()
        .map_err(|e| CresError::Input(format!("internal: the assembled model: {e}")))?;
    Ok((mm, summary))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn host(index: usize, rate: f64, avail: f64, one_way_s: f64) -> HostMeasure {
        HostMeasure {
            index,
            name: Some(format!("h{index}")),
            ops: vec![
                (CostKey::typed(Op::Sum, DataType::Int), vec![1e-9; 10]),
                (
                    CostKey::typed(Op::Mpy, DataType::Double),
                    vec![2e-9, 2e-9, 2e-9, 2e-9, 2e-9, 2e-9, 2e-9, 2e-9, 3e-9, 9e-9],
                ),
            ],
            kernel: (0..5)
                .map(|_| KernelRun {
                    iters: 1_000_000,
                    wall_s: 1e6 / rate,
                    cpu_s: 1e6 / rate / avail,
                })
                .collect(),
            pingpong: if index == 0 {
                Vec::new()
            } else {
                vec![
                    (16.0, vec![one_way_s; 5]),
                    (1024.0, vec![2.0 * one_way_s; 5]),
                ]
            },
            reference: Vec::new(),
        }
    }

    #[test]
    fn model_costs_are_cpu_costs_times_availability_and_w_is_relative_speed() {
        let hosts = [
            host(0, 4e8, 1.0, 0.0),
            host(1, 2e8, 2.0, 1e-4),
            host(2, 1e8, 4.0, 2e-4),
        ];
        let (mm, sum) = build_model(&hosts, 80.0, Calibration::None).unwrap();
        assert_eq!(mm.machines[0].w, None);
        assert_eq!(mm.machines[1].w, Some(1.0));
        assert_eq!(mm.machines[2].w, Some(0.5));
        let key = CostKey::typed(Op::Sum, DataType::Int);
        let c2 = mm.machines[2].costs[&key];
        assert!((c2.lo - 4e-9).abs() < 1e-18 && (c2.hi - 4e-9).abs() < 1e-18);
        // Huerta keeps 8 of 10: the two outliers 3e-9 and 9e-9 are dropped.
        let m = mm.machines[1].costs[&CostKey::typed(Op::Mpy, DataType::Double)];
        assert!((m.lo - 4e-9).abs() < 1e-18 && (m.hi - 4e-9).abs() < 1e-18);
        assert!((sum[2].availability.lo - 4.0).abs() < 1e-12);
        // Sends in ms, both directions, interpolated by the model.
        let (s, fb) = mm.send_cost(2, 0, 16.0).unwrap();
        assert!(fb.is_none());
        assert!((s.lo - 2e-4).abs() < 1e-12);
        let (s, _) = mm.send_cost(0, 1, 1024.0).unwrap();
        assert!((s.hi - 2e-4).abs() < 1e-12);
        assert_eq!(mm.sends.len(), 8);
        // The text form round-trips through the Appendix-B reader with names and W.
        let text = mm.to_appendix_b().to_string();
        assert!(text.contains("name[2]=h2"), "{text}");
        assert!(text.contains("W[2]=0.5"), "{text}");
    }

    #[test]
    fn reference_calibration_scales_op_costs_so_the_kernel_time_is_reproduced() {
        let counts = reference_counts().unwrap();
        // Every counted key is benchmarked, and the loop dominates the count.
        let benched: Vec<CostKey> = op_benches().iter().map(|b| b.key).collect();
        for k in counts.keys() {
            assert!(benched.contains(k), "{k} is counted but not benchmarked");
        }
        let total: f64 = counts.values().sum();
        assert!(total > 10.0 * REF_ITERS as f64, "{total}");
        // Host 0: every op 1 ns on the CPU clock; the kernel measured at a quarter of the op
        // model, on a host at half a core.
        let ops: Vec<(CostKey, Vec<f64>)> = benched.iter().map(|k| (*k, vec![1e-9; 5])).collect();
        let cpu: BTreeMap<CostKey, Interval> = benched
            .iter()
            .map(|k| (*k, Interval { lo: 1e-9, hi: 1e-9 }))
            .collect();
        let model = op_model_time(&counts, &cpu).unwrap();
        assert!((model.mid() - total * 1e-9).abs() < 1e-12);
        let mut h = host(0, 1e8, 2.0, 0.0);
        h.ops = ops;
        h.reference = vec![model.mid() / 4.0; 5];
        let (raw, s) = build_model(std::slice::from_ref(&h), 80.0, Calibration::None).unwrap();
        let (cal, _) =
            build_model(std::slice::from_ref(&h), 80.0, Calibration::ReferenceKernel).unwrap();
        assert!((s[0].reference_ratio.unwrap() - 0.25).abs() < 1e-12);
        let k = CostKey::typed(Op::Sum, DataType::Long);
        assert!((raw.machines[0].costs[&k].lo - 2e-9).abs() < 1e-18);
        assert!((cal.machines[0].costs[&k].lo - 0.5e-9).abs() < 1e-18);
        // Without reference runs, calibration is an error naming the host.
        h.reference.clear();
        let e = build_model(&[h], 80.0, Calibration::ReferenceKernel).unwrap_err();
        assert!(
            e.to_string().contains("host 0 has no reference-kernel run"),
            "{e}"
        );
        // A missing cost is named.
        let e = op_model_time(&counts, &BTreeMap::new()).unwrap_err();
        assert!(e.to_string().contains("no measured cost"), "{e}");
        // The compiled kernel runs and depends on its seed.
        assert_ne!(reference(1), reference(2));
    }

    #[test]
    fn availability_below_one_is_clock_granularity_and_clamped() {
        let mut h = host(0, 1e8, 1.0, 0.0);
        for r in &mut h.kernel {
            r.cpu_s = r.wall_s * 1.01;
        }
        let (_, sum) = build_model(&[h], 80.0, Calibration::None).unwrap();
        assert_eq!(sum[0].availability, Interval { lo: 1.0, hi: 1.0 });
    }

    #[test]
    fn bad_measurements_are_errors_naming_the_host() {
        let mut h1 = host(1, 1e8, 1.0, 1e-4);
        h1.pingpong.clear();
        let e = build_model(&[host(0, 1e8, 1.0, 0.0), h1], 80.0, Calibration::None).unwrap_err();
        assert!(e.to_string().contains("host 1 has no send-cost"), "{e}");
        let e = build_model(&[host(1, 1e8, 1.0, 1e-4)], 80.0, Calibration::None).unwrap_err();
        assert!(e.to_string().contains("index order"), "{e}");
        let mut h0 = host(0, 1e8, 1.0, 0.0);
        h0.ops[0].1 = vec![f64::NAN];
        let e = build_model(&[h0], 80.0, Calibration::None).unwrap_err();
        assert!(e.to_string().contains("sum_int"), "{e}");
        assert!(build_model(&[], 80.0, Calibration::None).is_err());
        let e = w_factors(&[1.0, 0.0]).unwrap_err();
        assert!(e.to_string().contains("worker 2"), "{e}");
        assert!(scale_costs(&BTreeMap::new(), Interval { lo: 0.0, hi: 1.0 }).is_err());
    }

    #[test]
    fn benchmarks_cover_every_key_the_analyser_charges_for_the_common_types() {
        let keys: Vec<String> = op_benches().iter().map(|b| b.key.to_string()).collect();
        for k in [
            "sum_long",
            "mpy_double",
            "mod_long",
            "bit_long",
            "shift_long",
            "neg_double",
            "not_int",
            "assign_double",
            "access",
            "array_access",
            "compare",
            "cast",
            "and",
            "or",
            "loop_iteration",
        ] {
            assert!(keys.contains(&k.to_string()), "{k} not benchmarked");
        }
        let mut sorted = keys.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), keys.len(), "a key is benchmarked twice");
    }

    #[test]
    fn measurement_uses_the_given_clock() {
        // A fake clock advancing 1 s per reading: every loop takes 1 s, so each diff is 0 and
        // loop_iteration is 1 s / n.
        let t = Cell::new(0.0);
        let clock = || {
            t.set(t.get() + 1.0);
            t.get()
        };
        let raw = measure_ops(4, 2, &clock);
        assert_eq!(raw.len(), op_benches().len());
        for (k, s) in &raw {
            assert_eq!(s.len(), 2);
            let want = if *k == CostKey::untyped(Op::LoopIteration) {
                0.25
            } else {
                0.0
            };
            assert!(s.iter().all(|&x| x == want), "{k}: {s:?}");
        }
        // Separate clocks: the wall clock 1 s per reading, the CPU clock 0.25 s.
        let w = Cell::new(0.0);
        let wall = || {
            w.set(w.get() + 1.0);
            w.get()
        };
        let c = Cell::new(0.0);
        let cpu = || {
            c.set(c.get() + 0.25);
            c.get()
        };
        let runs = measure_kernel(3, 0.5, &wall, &cpu);
        assert_eq!(runs.len(), 3);
        assert!(
            runs.iter().all(|r| r.wall_s == 1.0 && r.cpu_s == 0.25),
            "{runs:?}"
        );
    }
}
