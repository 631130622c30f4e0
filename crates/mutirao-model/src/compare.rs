//! Compare two models of the same hosts: how far apart are their predictions?
//!
//! Used to judge a cheap calibration strategy against all-pairs (site-sampled, type-sampled),
//! two calibrations in a row (run-to-run), or a refreshed model against a fresh one. For every
//! ordered host pair both models know (same-host pairs included), and every requested message
//! size, the one-way time `Os + L + Or` of `other` is compared with `reference`'s; for every
//! common host, the relative speed.
//!
//! ```
//! use mutirao_model::compare::compare;
//! use mutirao_model::{Host, Link, LinkClass, Model, Piecewise};
//!
//! let host = |n: &str, s: f64| Host { name: n.into(), site: "a".into(), speed: s, addr: None };
//! let link = |class: LinkClass, l_us: f64| Link {
//!     class, site: None, sites: None, src: None, dst: None,
//!     os: Piecewise::linear(1.0, 0.0), or: Piecewise::linear(1.0, 0.0),
//!     l: Piecewise::linear(l_us, 0.01),
//! };
//! let links = |l_us| vec![link(LinkClass::IntraSite, l_us), link(LinkClass::SameHost, 0.5)];
//! let a = Model::new(vec![host("x", 1.0), host("y", 0.5)], links(10.0)).unwrap();
//! let b = Model::new(vec![host("x", 1.0), host("y", 0.55)], links(12.0)).unwrap();
//! let c = compare(&a, &b, &[0, 1 << 20]);
//! assert_eq!(c.pairs.len(), 8); // 4 ordered pairs (same-host included) × 2 sizes
//! assert!((c.worst_speed().unwrap().rel - 0.1).abs() < 1e-12);
//! // at 0 bytes: (1 + 12 + 1) vs (1 + 10 + 1)
//! let w = c.worst_time(0).unwrap();
//! assert!((w.rel - 2.0 / 12.0).abs() < 1e-12);
//! ```

use crate::{LinkClass, Model};
use serde::{Deserialize, Serialize};

/// The one-way times of one ordered pair at one size in both models.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairDiff {
    /// Sender.
    pub src: String,
    /// Receiver.
    pub dst: String,
    /// Class of the link `reference` uses for this pair.
    pub class: LinkClass,
    /// Message size in bytes.
    pub bytes: u64,
    /// One-way time in `reference` (µs).
    pub reference_us: f64,
    /// One-way time in `other` (µs).
    pub other_us: f64,
    /// `(other − reference) / reference` (0 when both are 0).
    pub rel: f64,
}

/// The relative speed of one host in both models.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpeedDiff {
    /// Host name.
    pub host: String,
    /// Speed in `reference`.
    pub reference: f64,
    /// Speed in `other`.
    pub other: f64,
    /// `(other − reference) / reference`.
    pub rel: f64,
}

/// The result of [`compare`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// Every (pair, size) both models cover, pairs in `reference`'s host order.
    pub pairs: Vec<PairDiff>,
    /// Every common host.
    pub speeds: Vec<SpeedDiff>,
    /// Pairs of common hosts that one of the models does not cover (`src -> dst: why`).
    pub uncovered: Vec<String>,
}

fn rel(reference: f64, other: f64) -> f64 {
    if reference == 0.0 && other == 0.0 {
        0.0
    } else if reference == 0.0 {
        f64::INFINITY
    } else {
        (other - reference) / reference
    }
}

/// Compare `other` against `reference` at `sizes` (see the module docs).
pub fn compare(reference: &Model, other: &Model, sizes: &[u64]) -> Comparison {
    let common: Vec<&str> = reference
        .hosts
        .iter()
        .filter(|h| other.host(&h.name).is_ok())
        .map(|h| h.name.as_str())
        .collect();
    let mut out = Comparison {
        pairs: Vec::new(),
        speeds: Vec::new(),
        uncovered: Vec::new(),
    };
    for &h in &common {
        if let (Ok(a), Ok(b)) = (reference.host(h), other.host(h)) {
            out.speeds.push(SpeedDiff {
                host: h.to_string(),
                reference: a.speed,
                other: b.speed,
                rel: rel(a.speed, b.speed),
            });
        }
    }
    for &s in &common {
        for &d in &common {
            let (la, lb) = match (reference.link_for(s, d), other.link_for(s, d)) {
                (Ok(a), Ok(b)) => (a, b),
                (Err(e), _) | (_, Err(e)) => {
                    out.uncovered.push(format!("{s} -> {d}: {e}"));
                    continue;
                }
            };
            let (pa, pb) = (la.params(), lb.params());
            for &m in sizes {
                let (ta, tb) = (pa.one_way_s(m) * 1e6, pb.one_way_s(m) * 1e6);
                out.pairs.push(PairDiff {
                    src: s.to_string(),
                    dst: d.to_string(),
                    class: la.class,
                    bytes: m,
                    reference_us: ta,
                    other_us: tb,
                    rel: rel(ta, tb),
                });
            }
        }
    }
    out
}

impl Comparison {
    /// The (pair, size) with the largest |rel| among sizes ≥ `min_bytes`.
    pub fn worst_time(&self, min_bytes: u64) -> Option<&PairDiff> {
        self.pairs
            .iter()
            .filter(|p| p.bytes >= min_bytes)
            .max_by(|a, b| a.rel.abs().total_cmp(&b.rel.abs()))
    }

    /// The host with the largest |rel| speed difference.
    pub fn worst_speed(&self) -> Option<&SpeedDiff> {
        self.speeds
            .iter()
            .max_by(|a, b| a.rel.abs().total_cmp(&b.rel.abs()))
    }

    /// Median |rel| over the (pair, size) entries with sizes ≥ `min_bytes`.
    pub fn median_abs_time(&self, min_bytes: u64) -> Option<f64> {
        let mut v: Vec<f64> = self
            .pairs
            .iter()
            .filter(|p| p.bytes >= min_bytes)
            .map(|p| p.rel.abs())
            .collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        Some(v[v.len() / 2])
    }

    /// Per size ≥ `min_bytes`: the worst |rel| over all pairs, in size order.
    pub fn worst_by_size(&self, min_bytes: u64) -> Vec<(u64, &PairDiff)> {
        let mut sizes: Vec<u64> = self
            .pairs
            .iter()
            .map(|p| p.bytes)
            .filter(|&b| b >= min_bytes)
            .collect();
        sizes.sort_unstable();
        sizes.dedup();
        sizes
            .into_iter()
            .filter_map(|m| {
                self.pairs
                    .iter()
                    .filter(|p| p.bytes == m)
                    .max_by(|a, b| a.rel.abs().total_cmp(&b.rel.abs()))
                    .map(|p| (m, p))
            })
            .collect()
    }

    /// A plain-text report: speeds, the worst pair per size, the overall worst and median at
    /// sizes ≥ `min_bytes`, uncovered pairs.
    pub fn to_text(&self, min_bytes: u64) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        for h in &self.speeds {
            let _ = writeln!(
                s,
                "speed {:<12} {:>8.4} vs {:>8.4}  {:+7.1}%",
                h.host,
                h.reference,
                h.other,
                100.0 * h.rel
            );
        }
        for (m, p) in self.worst_by_size(0) {
            let _ = writeln!(
                s,
                "size {:>9} B  worst {:>10} -> {:<10} {:>12.1} vs {:>12.1} us  {:+8.1}%",
                m,
                p.src,
                p.dst,
                p.reference_us,
                p.other_us,
                100.0 * p.rel
            );
        }
        if let (Some(w), Some(med)) = (self.worst_time(min_bytes), self.median_abs_time(min_bytes))
        {
            let _ = writeln!(
                s,
                "sizes >= {min_bytes} B: worst {:+.1}% ({} -> {} at {} B), median |diff| {:.1}%",
                100.0 * w.rel,
                w.src,
                w.dst,
                w.bytes,
                100.0 * med
            );
        }
        for u in &self.uncovered {
            let _ = writeln!(s, "uncovered: {u}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Host, Link, Piecewise};

    fn host(n: &str, site: &str, speed: f64) -> Host {
        Host {
            name: n.into(),
            site: site.into(),
            speed,
            addr: None,
        }
    }

    fn link(class: LinkClass, l: f64, slope: f64) -> Link {
        Link {
            class,
            site: None,
            sites: None,
            src: None,
            dst: None,
            os: Piecewise::linear(2.0, 0.0),
            or: Piecewise::linear(3.0, 0.0),
            l: Piecewise::linear(l, slope),
        }
    }

    #[test]
    fn pair_links_and_classes_are_compared_per_direction() {
        let hosts = vec![host("a1", "a", 1.0), host("a2", "a", 0.25)];
        let base = vec![
            link(LinkClass::SameHost, 1.0, 0.0),
            link(LinkClass::IntraSite, 10.0, 0.01),
        ];
        let a = Model::new(hosts.clone(), base.clone()).unwrap();
        let mut pair = link(LinkClass::Pair, 10.0, 0.02);
        pair.src = Some("a2".into());
        pair.dst = Some("a1".into());
        let mut links = base;
        links.push(pair);
        let b = Model::new(hosts, links).unwrap();
        let c = compare(&a, &b, &[0, 1000]);
        assert!(c.uncovered.is_empty());
        assert_eq!(c.pairs.len(), 8);
        let w = c.worst_time(1).unwrap();
        assert_eq!(
            (w.src.as_str(), w.dst.as_str(), w.bytes),
            ("a2", "a1", 1000)
        );
        // reference 2 + 10 + 10 + 3 = 25, other 2 + 10 + 20 + 3 = 35
        assert!((w.rel - 0.4).abs() < 1e-12, "{w:?}");
        assert_eq!(c.worst_time(0).unwrap().bytes, 1000);
        assert_eq!(c.median_abs_time(1), Some(0.0));
        assert!(c.to_text(1).contains("worst +40.0% (a2 -> a1 at 1000 B)"));
    }

    #[test]
    fn hosts_missing_from_one_model_are_skipped_and_gaps_reported() {
        let a = Model::new(
            vec![host("x", "s", 1.0), host("y", "s", 1.0)],
            vec![
                link(LinkClass::IntraSite, 5.0, 0.0),
                link(LinkClass::SameHost, 1.0, 0.0),
            ],
        )
        .unwrap();
        let b = Model::new(
            vec![host("x", "s", 1.0), host("z", "s", 1.0)],
            vec![link(LinkClass::IntraSite, 5.0, 0.0)],
        )
        .unwrap();
        let c = compare(&a, &b, &[64]);
        assert_eq!(c.speeds.len(), 1);
        // x -> x is same-host: b has no same-host link.
        assert_eq!(c.uncovered.len(), 1, "{:?}", c.uncovered);
        assert!(c.uncovered[0].starts_with("x -> x"));
        assert!(c.pairs.is_empty());
    }
}
