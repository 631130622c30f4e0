//! The error harness (thesis Eq. 5.2 and 5.3): interval error per run, mean absolute error
//! per P, the per-version mean of the Ē_P values, and the hit rate; plus a checker that
//! recomputes printed tables and flags where the printed numbers do not follow from the data.
//!
//! # Runs file format
//! ```text
//! # comment
//! [pi_A signed mean=2.238]          version name; `signed` (E printed with sign) or `abs`
//!                                   (|E| printed); optional printed per-version mean (%)
//! 2  714 807 | 726 706 774 758 | 0 -1.05 0 0 | 0.26
//! ```
//! A row is `P t_min t_max | measured runs… [| printed E (%)… [| printed Ē_P (%)]]`.

use crate::interval::Interval;
use serde::Serialize;
use std::fmt::Write as _;

/// Errors reading a runs file.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HarnessError {
    /// A line could not be read.
    #[error("line {line}: {msg}")]
    Syntax {
        /// 1-based line.
        line: usize,
        /// What is wrong.
        msg: String,
    },
}

/// Eq. 5.2: 0 inside `[t_min; t_max]`, else the distance to the nearest bound over the
/// interval's midpoint — positive when the run was slower than predicted, negative when
/// faster. A fraction (multiply by 100 for %).
pub fn run_error(iv: Interval, t_x: f64) -> f64 {
    let mid = iv.mid();
    if t_x > iv.hi {
        (t_x - iv.hi) / mid
    } else if t_x < iv.lo {
        (t_x - iv.lo) / mid
    } else {
        0.0
    }
}

/// Eq. 5.3: `Ē_P = (1/k) Σ |E_{P,i}|` (a fraction); 0 for no runs.
pub fn mean_abs_error(iv: Interval, runs: &[f64]) -> f64 {
    if runs.is_empty() {
        return 0.0;
    }
    runs.iter().map(|&t| run_error(iv, t).abs()).sum::<f64>() / runs.len() as f64
}

/// One configuration (one P) of a version.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// Number of workers.
    pub p: u32,
    /// Predicted interval.
    pub interval: Interval,
    /// Measured times.
    pub runs: Vec<f64>,
    /// Printed per-run errors (%), if any.
    pub printed_e: Option<Vec<f64>>,
    /// Printed Ē_P (%), if any.
    pub printed_mean: Option<f64>,
}

/// One application version (a table).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Version {
    /// Name.
    pub name: String,
    /// Printed errors carry their sign (else they are |E|).
    pub signed: bool,
    /// Printed per-version mean Ē (%), if any.
    pub printed_mean: Option<f64>,
    /// Rows.
    pub rows: Vec<Row>,
}

/// A printed number that does not follow from the data.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Slip {
    /// Where (`prim_D+Q P=8 run 2`, `prim_D+Q mean`).
    pub what: String,
    /// Printed value (%).
    pub printed: f64,
    /// Recomputed value (%).
    pub computed: f64,
}

/// Recomputed results for one version.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VersionReport {
    /// Name.
    pub name: String,
    /// Per P: (P, E per run %, Ē_P %, hits).
    pub rows: Vec<(u32, Vec<f64>, f64, usize)>,
    /// Mean of the recomputed Ē_P (%).
    pub mean: f64,
    /// Mean of the printed Ē_P (%), when all are printed.
    pub mean_of_printed: Option<f64>,
    /// Runs inside their interval.
    pub hits: usize,
    /// Runs in total.
    pub runs: usize,
    /// Printed numbers that do not follow, beyond the tolerance.
    pub slips: Vec<Slip>,
}

/// Recompute a version and compare with what was printed, to within `tol` percentage points.
pub fn check(v: &Version, tol: f64) -> VersionReport {
    let mut rows = Vec::new();
    let mut slips = Vec::new();
    let mut hits = 0;
    let mut runs = 0;
    let mut printed_means = Vec::new();
    for r in &v.rows {
        let e: Vec<f64> = r
            .runs
            .iter()
            .map(|&t| 100.0 * run_error(r.interval, t))
            .collect();
        let ebar = 100.0 * mean_abs_error(r.interval, &r.runs);
        let h = e.iter().filter(|x| **x == 0.0).count();
        hits += h;
        runs += e.len();
        if let Some(pe) = &r.printed_e {
            for (i, (&pr, &co)) in pe.iter().zip(&e).enumerate() {
                let co_cmp = if v.signed { co } else { co.abs() };
                if (pr - co_cmp).abs() > tol {
                    slips.push(Slip {
                        what: format!("{} P={} run {}", v.name, r.p, i + 1),
                        printed: pr,
                        computed: co_cmp,
                    });
                }
            }
        }
        if let Some(pm) = r.printed_mean {
            printed_means.push(pm);
            if (pm - ebar).abs() > tol {
                slips.push(Slip {
                    what: format!("{} P={} mean", v.name, r.p),
                    printed: pm,
                    computed: ebar,
                });
            }
        }
        rows.push((r.p, e, ebar, h));
    }
    let n = rows.len().max(1) as f64;
    let mean = rows.iter().map(|r| r.2).sum::<f64>() / n;
    let mean_of_printed = (printed_means.len() == v.rows.len() && !v.rows.is_empty())
        .then(|| printed_means.iter().sum::<f64>() / printed_means.len() as f64);
    if let Some(pm) = v.printed_mean {
        if (pm - mean).abs() > tol {
            slips.push(Slip {
                what: format!("{} per-version mean", v.name),
                printed: pm,
                computed: mean,
            });
        }
    }
    VersionReport {
        name: v.name.clone(),
        rows,
        mean,
        mean_of_printed,
        hits,
        runs,
        slips,
    }
}

fn nums(s: &str, line: usize) -> Result<Vec<f64>, HarnessError> {
    s.split(|c: char| c.is_whitespace() || c == ',')
        .filter(|t| !t.is_empty())
        .map(|t| {
            t.replace('\u{2212}', "-")
                .parse::<f64>()
                .map_err(|_| HarnessError::Syntax {
                    line,
                    msg: format!("expected a number, found {t:?}"),
                })
        })
        .collect()
}

/// Parse a runs file (format in the module docs).
pub fn parse_runs(text: &str) -> Result<Vec<Version>, HarnessError> {
    let mut out: Vec<Version> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let s = raw.split('#').next().unwrap_or("").trim();
        if s.is_empty() {
            continue;
        }
        if let Some(h) = s.strip_prefix('[') {
            let h = h.strip_suffix(']').ok_or(HarnessError::Syntax {
                line,
                msg: "a header must end with `]`".into(),
            })?;
            let mut parts = h.split_whitespace();
            let name = parts.next().ok_or(HarnessError::Syntax {
                line,
                msg: "a header needs a version name".into(),
            })?;
            let mut v = Version {
                name: name.to_string(),
                signed: false,
                printed_mean: None,
                rows: vec![],
            };
            for p in parts {
                match p {
                    "signed" => v.signed = true,
                    "abs" => v.signed = false,
                    _ => match p.strip_prefix("mean=") {
                        Some(m) => {
                            v.printed_mean = Some(m.parse().map_err(|_| HarnessError::Syntax {
                                line,
                                msg: format!("bad mean {m:?}"),
                            })?)
                        }
                        None => {
                            return Err(HarnessError::Syntax {
                                line,
                                msg: format!(
                                    "unknown header word {p:?}; expected signed, abs or mean=N"
                                ),
                            })
                        }
                    },
                }
            }
            out.push(v);
            continue;
        }
        let v = out.last_mut().ok_or(HarnessError::Syntax {
            line,
            msg: "a row before any `[version]` header".into(),
        })?;
        let cols: Vec<&str> = s.split('|').collect();
        let head = nums(cols[0], line)?;
        if head.len() != 3 {
            return Err(HarnessError::Syntax {
                line,
                msg: "a row starts with `P t_min t_max`".into(),
            });
        }
        let interval = Interval::new(head[1], head[2]).map_err(|e| HarnessError::Syntax {
            line,
            msg: e.to_string(),
        })?;
        let runs = match cols.get(1) {
            Some(c) => nums(c, line)?,
            None => {
                return Err(HarnessError::Syntax {
                    line,
                    msg: "missing `| runs…`".into(),
                })
            }
        };
        let printed_e = cols.get(2).map(|c| nums(c, line)).transpose()?;
        if let Some(pe) = &printed_e {
            if pe.len() != runs.len() {
                return Err(HarnessError::Syntax {
                    line,
                    msg: format!("{} runs but {} printed errors", runs.len(), pe.len()),
                });
            }
        }
        let printed_mean = match cols.get(3) {
            Some(c) => {
                let v = nums(c, line)?;
                if v.len() != 1 {
                    return Err(HarnessError::Syntax {
                        line,
                        msg: "the last column is one number (Ē_P)".into(),
                    });
                }
                Some(v[0])
            }
            None => None,
        };
        if head[0] < 1.0 || head[0].fract() != 0.0 {
            return Err(HarnessError::Syntax {
                line,
                msg: "P must be a whole number >= 1".into(),
            });
        }
        v.rows.push(Row {
            p: head[0] as u32,
            interval,
            runs,
            printed_e,
            printed_mean,
        });
    }
    Ok(out)
}

/// A plain-text report of recomputed versions.
pub fn report_text(reports: &[VersionReport]) -> String {
    let mut out = String::new();
    for r in reports {
        let ps: Vec<String> = r
            .rows
            .iter()
            .map(|(p, _, e, _)| format!("P={p}: {e:.2}"))
            .collect();
        let _ = writeln!(
            out,
            "{:<10} mean Ē = {:.3} %  hits {}/{}  ({})",
            r.name,
            r.mean,
            r.hits,
            r.runs,
            ps.join(", ")
        );
        for s in &r.slips {
            let _ = writeln!(
                out,
                "  SLIP {}: printed {} but the data give {:.3}",
                s.what, s.printed, s.computed
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_convention() {
        let iv = Interval::new(714.0, 807.0).unwrap();
        assert_eq!(run_error(iv, 726.0), 0.0);
        assert!((100.0 * run_error(iv, 706.0) - (-1.05)).abs() < 0.005);
        assert!(run_error(iv, 900.0) > 0.0);
    }
}
