//! Task-graph generators (the EasyGrid classes, the HEFT paper's application graphs, and
//! Topcuoglu's seeded random layered graphs) and a random platform with heterogeneity β.
//!
//! The structured generators give every task the same `work` and every edge the same `bytes`.

use crate::dag::{Dag, DagError, Edge, Task};
use mutirao_model::{
    Capacity, Host, Link, LinkClass, Model, ModelError, NicCapacity, Piecewise, SiteLinkCapacity,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// What is wrong with generator parameters.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum GenError {
    /// A parameter is out of range.
    #[error("{param} = {value}: {need}")]
    Param {
        /// Parameter name.
        param: &'static str,
        /// Its value, as text.
        value: String,
        /// What it must be.
        need: &'static str,
    },
    /// The generated graph failed validation (a bug if it happens).
    #[error(transparent)]
    Dag(#[from] DagError),
    /// The generated model failed validation.
    #[error(transparent)]
    Model(#[from] ModelError),
}

fn check_work_bytes(work: f64) -> Result<(), GenError> {
    if !(work.is_finite() && work >= 0.0) {
        return Err(GenError::Param {
            param: "work",
            value: work.to_string(),
            need: "must be a finite number >= 0",
        });
    }
    Ok(())
}

fn at_least(param: &'static str, v: usize, min: usize, need: &'static str) -> Result<(), GenError> {
    if v < min {
        return Err(GenError::Param {
            param,
            value: v.to_string(),
            need,
        });
    }
    Ok(())
}

fn task(id: String, work: f64) -> Task {
    Task { id, work }
}

/// A `k × k` diamond (mesh): task `d{i}_{j}` depends on `d{i-1}_{j}` and `d{i}_{j-1}`.
pub fn diamond(k: usize, work: f64, bytes: u64) -> Result<Dag, GenError> {
    at_least("k", k, 1, "must be >= 1")?;
    check_work_bytes(work)?;
    let id = |i: usize, j: usize| i * k + j;
    let tasks = (0..k * k)
        .map(|t| task(format!("d{}_{}", t / k, t % k), work))
        .collect();
    let mut edges = Vec::new();
    for i in 0..k {
        for j in 0..k {
            if i + 1 < k {
                edges.push(Edge {
                    from: id(i, j),
                    to: id(i + 1, j),
                    bytes,
                });
            }
            if j + 1 < k {
                edges.push(Edge {
                    from: id(i, j),
                    to: id(i, j + 1),
                    bytes,
                });
            }
        }
    }
    Ok(Dag::new(tasks, edges)?)
}

/// A fork: `root` sends one message to each of `c1 … cn`.
pub fn fork(n: usize, work: f64, bytes: u64) -> Result<Dag, GenError> {
    at_least("n", n, 1, "must be >= 1")?;
    check_work_bytes(work)?;
    let mut tasks = vec![task("root".into(), work)];
    tasks.extend((1..=n).map(|i| task(format!("c{i}"), work)));
    let edges = (1..=n)
        .map(|i| Edge {
            from: 0,
            to: i,
            bytes,
        })
        .collect();
    Ok(Dag::new(tasks, edges)?)
}

/// A join: `p0 … p{n-1}` each send one message to `sink`.
pub fn join(n: usize, work: f64, bytes: u64) -> Result<Dag, GenError> {
    at_least("n", n, 1, "must be >= 1")?;
    check_work_bytes(work)?;
    let mut tasks: Vec<Task> = (0..n).map(|i| task(format!("p{i}"), work)).collect();
    tasks.push(task("sink".into(), work));
    let edges = (0..n)
        .map(|i| Edge {
            from: i,
            to: n,
            bytes,
        })
        .collect();
    Ok(Dag::new(tasks, edges)?)
}

/// The thesis's ring application: `r0 → r1 → … → r{n-1} → r0_end`, where `r0_end` (work 0)
/// is `r0`'s final receive; map it to `r0`'s host to measure the ring.
pub fn ring(n: usize, work: f64, bytes: u64) -> Result<Dag, GenError> {
    at_least("n", n, 2, "a ring needs >= 2 tasks")?;
    check_work_bytes(work)?;
    let mut tasks: Vec<Task> = (0..n).map(|i| task(format!("r{i}"), work)).collect();
    tasks.push(task("r0_end".into(), 0.0));
    let edges = (0..n)
        .map(|i| Edge {
            from: i,
            to: i + 1,
            bytes,
        })
        .collect();
    Ok(Dag::new(tasks, edges)?)
}

/// Gaussian elimination on an `m × m` matrix (HEFT paper, Fig. 7): pivot tasks `p{k}` and
/// update tasks `u{k}_{j}`; `(m² + m − 2) / 2` tasks.
#[allow(clippy::needless_range_loop)] // j indexes two rows of `upd`
pub fn gauss(m: usize, work: f64, bytes: u64) -> Result<Dag, GenError> {
    at_least("m", m, 2, "the matrix size must be >= 2")?;
    check_work_bytes(work)?;
    let mut tasks = Vec::new();
    let mut pivot = vec![0usize; m];
    let mut upd = vec![vec![usize::MAX; m + 1]; m];
    for k in 1..m {
        pivot[k] = tasks.len();
        tasks.push(task(format!("p{k}"), work));
        for (j, slot) in upd[k].iter_mut().enumerate().skip(k + 1) {
            *slot = tasks.len();
            tasks.push(task(format!("u{k}_{j}"), work));
        }
    }
    let mut edges = Vec::new();
    for k in 1..m {
        for j in k + 1..=m {
            edges.push(Edge {
                from: pivot[k],
                to: upd[k][j],
                bytes,
            });
            if k + 1 < m {
                if j == k + 1 {
                    edges.push(Edge {
                        from: upd[k][j],
                        to: pivot[k + 1],
                        bytes,
                    });
                } else {
                    edges.push(Edge {
                        from: upd[k][j],
                        to: upd[k + 1][j],
                        bytes,
                    });
                }
            }
        }
    }
    Ok(Dag::new(tasks, edges)?)
}

/// FFT on `points` inputs (a power of two; HEFT paper, Fig. 9): `2·points − 1` recursive-call
/// tasks `c{i}` forming a binary tree, then `log2(points)` butterfly levels of `points`
/// tasks `b{l}_{i}`.
pub fn fft(points: usize, work: f64, bytes: u64) -> Result<Dag, GenError> {
    if points < 2 || !points.is_power_of_two() {
        return Err(GenError::Param {
            param: "points",
            value: points.to_string(),
            need: "must be a power of two >= 2",
        });
    }
    check_work_bytes(work)?;
    let mut tasks: Vec<Task> = (0..2 * points - 1)
        .map(|i| task(format!("c{i}"), work))
        .collect();
    let mut edges = Vec::new();
    for i in 0..points - 1 {
        edges.push(Edge {
            from: i,
            to: 2 * i + 1,
            bytes,
        });
        edges.push(Edge {
            from: i,
            to: 2 * i + 2,
            bytes,
        });
    }
    let levels = points.trailing_zeros() as usize;
    let base = tasks.len();
    for l in 0..levels {
        for i in 0..points {
            tasks.push(task(format!("b{l}_{i}"), work));
        }
    }
    let b = |l: usize, i: usize| base + l * points + i;
    let leaf = |i: usize| points - 1 + i;
    for i in 0..points {
        edges.push(Edge {
            from: leaf(i),
            to: b(0, i),
            bytes,
        });
        edges.push(Edge {
            from: leaf(i ^ 1),
            to: b(0, i),
            bytes,
        });
    }
    for l in 1..levels {
        for i in 0..points {
            edges.push(Edge {
                from: b(l - 1, i),
                to: b(l, i),
                bytes,
            });
            edges.push(Edge {
                from: b(l - 1, i ^ (1 << l)),
                to: b(l, i),
                bytes,
            });
        }
    }
    Ok(Dag::new(tasks, edges)?)
}

/// Parameters of Topcuoglu's random layered graphs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomParams {
    /// Number of tasks `v`.
    pub n: usize,
    /// Communication-to-computation ratio: mean message time / mean task time.
    pub ccr: f64,
    /// Shape α: height has mean `√v / α`, level width mean `α·√v`.
    pub alpha: f64,
    /// Out-degree: each non-exit task gets 1 … `out_degree` successors.
    pub out_degree: usize,
    /// Mean task work `w_DAG` (seconds at speed 1.0); work is uniform in (0, 2·w_DAG].
    pub mean_work: f64,
    /// Bytes per second of the reference link, turning message times into sizes.
    pub bytes_per_s: f64,
    /// Random seed (ChaCha8).
    pub seed: u64,
}

impl Default for RandomParams {
    fn default() -> Self {
        RandomParams {
            n: 100,
            ccr: 1.0,
            alpha: 1.0,
            out_degree: 3,
            mean_work: 1.0,
            bytes_per_s: 1.0e8,
            seed: 0,
        }
    }
}

/// A seeded random layered graph with Topcuoglu's parameters. Message times are uniform in
/// `[0, 2·CCR·w_DAG]` and sizes are those times × `bytes_per_s`, so on a platform whose links
/// move `bytes_per_s` the CCR holds.
#[allow(clippy::needless_range_loop)] // task indices address several arrays
pub fn random(p: &RandomParams) -> Result<Dag, GenError> {
    at_least("n", p.n, 1, "must be >= 1")?;
    at_least("out_degree", p.out_degree, 1, "must be >= 1")?;
    for (param, v) in [
        ("ccr", p.ccr),
        ("alpha", p.alpha),
        ("mean_work", p.mean_work),
        ("bytes_per_s", p.bytes_per_s),
    ] {
        let ok = v.is_finite() && if param == "ccr" { v >= 0.0 } else { v > 0.0 };
        if !ok {
            return Err(GenError::Param {
                param,
                value: v.to_string(),
                need: "must be a finite number > 0 (ccr may be 0)",
            });
        }
    }
    let mut rng = ChaCha8Rng::seed_from_u64(p.seed);
    let n = p.n;
    let sq = (n as f64).sqrt();
    let height = ((sq / p.alpha * rng.gen_range(0.5..1.5)).round() as usize).clamp(1, n);
    let widths: Vec<f64> = (0..height).map(|_| rng.gen_range(0.5..1.5)).collect();
    let total: f64 = widths.iter().sum();
    // One task per level, the rest spread in proportion to the drawn widths.
    let mut count = vec![1usize; height];
    for _ in height..n {
        let mut x = rng.gen_range(0.0..total);
        let mut lvl = height - 1;
        for (i, w) in widths.iter().enumerate() {
            if x < *w {
                lvl = i;
                break;
            }
            x -= w;
        }
        count[lvl] += 1;
    }
    let mut level_start = vec![0usize; height + 1];
    for i in 0..height {
        level_start[i + 1] = level_start[i] + count[i];
    }
    let tasks: Vec<Task> = (0..n)
        .map(|i| {
            task(
                format!("t{i}"),
                rng.gen_range(0.0..2.0 * p.mean_work).max(1e-9),
            )
        })
        .collect();
    let msg_bytes = |rng: &mut ChaCha8Rng| -> u64 {
        let c = if p.ccr > 0.0 {
            rng.gen_range(0.0..2.0 * p.ccr * p.mean_work)
        } else {
            0.0
        };
        (c * p.bytes_per_s).round() as u64
    };
    let mut edges = Vec::new();
    let mut has_pred = vec![false; n];
    let mut seen = std::collections::HashSet::new();
    for lvl in 0..height.saturating_sub(1) {
        let lo = level_start[lvl + 1];
        let hi = level_start[(lvl + 3).min(height)];
        for u in level_start[lvl]..level_start[lvl + 1] {
            let d = rng.gen_range(1..=p.out_degree).min(hi - lo);
            seen.clear();
            while seen.len() < d {
                let v = rng.gen_range(lo..hi);
                if seen.insert(v) {
                    has_pred[v] = true;
                    edges.push(Edge {
                        from: u,
                        to: v,
                        bytes: msg_bytes(&mut rng),
                    });
                }
            }
        }
    }
    for lvl in 1..height {
        for v in level_start[lvl]..level_start[lvl + 1] {
            if !has_pred[v] {
                let u = rng.gen_range(level_start[lvl - 1]..level_start[lvl]);
                edges.push(Edge {
                    from: u,
                    to: v,
                    bytes: msg_bytes(&mut rng),
                });
            }
        }
    }
    Ok(Dag::new(tasks, edges)?)
}

/// A one-site platform of `hosts` hosts named `h0 …` whose relative costs `1/speed` are
/// uniform in `[1 − β/2, 1 + β/2]` (Topcuoglu's heterogeneity β, for related machines), with
/// links that move `bytes_per_s`: per byte, 10% of the time is send overhead, 80% latency and
/// 10% receive overhead (plus 5 µs, 50 µs, 5 µs fixed). Same-host messages cost a tenth.
pub fn random_model(
    hosts: usize,
    beta: f64,
    bytes_per_s: f64,
    seed: u64,
) -> Result<Model, GenError> {
    at_least("hosts", hosts, 1, "must be >= 1")?;
    if !(beta.is_finite() && (0.0..2.0).contains(&beta)) {
        return Err(GenError::Param {
            param: "beta",
            value: beta.to_string(),
            need: "must be in [0, 2)",
        });
    }
    if !(bytes_per_s.is_finite() && bytes_per_s > 0.0) {
        return Err(GenError::Param {
            param: "bytes_per_s",
            value: bytes_per_s.to_string(),
            need: "must be a finite number > 0",
        });
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_4a11);
    let hs = (0..hosts)
        .map(|i| {
            let cost = if beta > 0.0 {
                rng.gen_range(1.0 - beta / 2.0..=1.0 + beta / 2.0)
            } else {
                1.0
            };
            Host {
                name: format!("h{i}"),
                site: "s".into(),
                speed: 1.0 / cost,
                addr: None,
            }
        })
        .collect();
    let us_per_byte = 1e6 / bytes_per_s;
    let link = |class, scale: f64| Link {
        class,
        site: None,
        sites: None,
        src: None,
        dst: None,
        os: Piecewise::linear(5.0 * scale, 0.1 * us_per_byte * scale),
        or: Piecewise::linear(5.0 * scale, 0.1 * us_per_byte * scale),
        l: Piecewise::linear(50.0 * scale, 0.8 * us_per_byte * scale),
    };
    Ok(Model::new(
        hs,
        vec![
            link(LinkClass::IntraSite, 1.0),
            link(LinkClass::SameHost, 0.1),
        ],
    )?)
}

/// `model`'s hosts spread round-robin over `sites` sites `s0 …`, an inter-site link class with
/// the intra-site one's parameters, and capacities of `mbit` Mbit/s for every NIC (both
/// directions) and every directed site link: a platform for contention benchmarks.
pub fn with_sites_and_capacities(mut model: Model, sites: usize, mbit: f64) -> Model {
    let sites = sites.max(1);
    for (i, h) in model.hosts.iter_mut().enumerate() {
        h.site = format!("s{}", i % sites);
    }
    if let Some(intra) = model
        .links
        .iter()
        .find(|l| l.class == LinkClass::IntraSite)
        .cloned()
    {
        model.links.push(Link {
            class: LinkClass::InterSite,
            ..intra
        });
    }
    model.capacity = Some(Capacity {
        source: Some("gen::with_sites_and_capacities".into()),
        nics: model
            .hosts
            .iter()
            .map(|h| NicCapacity {
                host: h.name.clone(),
                out_mbit: mbit,
                in_mbit: mbit,
            })
            .collect(),
        site_links: (0..sites)
            .flat_map(|a| (0..sites).filter(move |&b| b != a).map(move |b| (a, b)))
            .map(|(a, b)| SiteLinkCapacity {
                from: format!("s{a}"),
                to: format!("s{b}"),
                mbit,
            })
            .collect(),
    });
    model
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structured_sizes() {
        let d = diamond(5, 1.0, 4).unwrap();
        assert_eq!((d.len(), d.edges().len()), (25, 40));
        assert_eq!(d.tasks()[7].id, "d1_2");
        let f = fork(9, 1.0, 4).unwrap();
        assert_eq!((f.len(), f.edges().len()), (10, 9));
        let j = join(9, 1.0, 4).unwrap();
        assert_eq!(j.in_edges(9).len(), 9);
        let r = ring(3, 1.0, 4).unwrap();
        assert_eq!((r.len(), r.edges().len()), (4, 3));
        // HEFT paper: Gaussian elimination has (m² + m − 2)/2 tasks.
        for m in 2..8 {
            assert_eq!(gauss(m, 1.0, 1).unwrap().len(), (m * m + m - 2) / 2);
        }
        assert_eq!(gauss(5, 1.0, 1).unwrap().len(), 14);
        // FFT: 2n − 1 recursive calls + n·log2 n butterflies.
        for (pts, lg) in [(2usize, 1usize), (4, 2), (16, 4)] {
            let g = fft(pts, 1.0, 1).unwrap();
            assert_eq!(g.len(), 2 * pts - 1 + pts * lg);
        }
        assert!(fft(6, 1.0, 1).is_err());
        assert!(diamond(0, 1.0, 1).is_err());
        assert!(ring(3, -1.0, 1).is_err());
    }

    #[test]
    fn random_is_seeded_and_connected() {
        let p = RandomParams {
            n: 300,
            seed: 7,
            ..Default::default()
        };
        let a = random(&p).unwrap();
        let b = random(&p).unwrap();
        assert_eq!(a, b);
        let c = random(&RandomParams { seed: 8, ..p }).unwrap();
        assert_ne!(a, c);
        assert_eq!(a.len(), 300);
        let entries = (0..a.len()).filter(|&t| a.in_edges(t).is_empty()).count();
        assert!((1..300).contains(&entries));
        for t in 0..a.len() {
            assert!(a.out_edges(t).len() <= 3 + a.len());
        }
    }

    #[test]
    fn random_ccr_is_close_to_requested() {
        let p = RandomParams {
            n: 2000,
            ccr: 2.0,
            seed: 1,
            ..Default::default()
        };
        let d = random(&p).unwrap();
        let mean_work = d.tasks().iter().map(|t| t.work).sum::<f64>() / d.len() as f64;
        let mean_msg = d
            .edges()
            .iter()
            .map(|e| e.bytes as f64 / p.bytes_per_s)
            .sum::<f64>()
            / d.edges().len() as f64;
        let ccr = mean_msg / mean_work;
        assert!((ccr - 2.0).abs() < 0.2, "ccr {ccr}");
    }

    #[test]
    fn random_model_heterogeneity() {
        let m = random_model(16, 1.0, 1e8, 3).unwrap();
        let costs: Vec<f64> = m.hosts.iter().map(|h| 1.0 / h.speed).collect();
        assert!(costs.iter().all(|&c| (0.5..=1.5).contains(&c)));
        let m0 = random_model(4, 0.0, 1e8, 3).unwrap();
        assert!(m0.hosts.iter().all(|h| h.speed == 1.0));
        m.check_complete().unwrap();
    }
}
