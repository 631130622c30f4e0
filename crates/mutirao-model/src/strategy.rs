//! Calibration plans: which ordered host pairs to measure, and which measured pair every other
//! pair inherits its values from. Pure functions of the host list.
//!
//! * [`StrategyKind::AllPairs`] (thesis versions I and II(a)): every ordered pair, same-host pairs
//!   included; nothing is inherited.
//! * [`StrategyKind::SiteSampled`] (version II(b)): per site, its first two hosts measure the
//!   intra-site link (both directions) and its first host the same-host link; the first host of
//!   each site measures to the first host of every other site (S(S−1) ordered site pairs). All
//!   other pairs inherit from the measured pair of their class.
//! * [`StrategyKind::TypeSampled`] (beyond the thesis): the hosts of each site are clustered by
//!   preliminary speed (and link speed and CPU model when given); hosts join the first cluster
//!   whose leader is within `tolerance` (relative) on every feature. One representative (the
//!   leader) per cluster is measured against the representative of every other cluster, so each
//!   sender type and receiver type is seen; a pair inherits from the pair of its clusters'
//!   representatives. This is the fix for II(b)'s −300%/−400% overhead errors on mixed sites.
//!
//! ```
//! use mutirao_model::strategy::{plan, PlanHost, PlanOptions};
//! use mutirao_model::calib::StrategyKind;
//! let hosts: Vec<PlanHost> = ["a1", "a2", "a3"].iter().map(|n| PlanHost::new(n, "a"))
//!     .chain(["b1", "b2"].iter().map(|n| PlanHost::new(n, "b"))).collect();
//! let p = plan(StrategyKind::SiteSampled, &hosts, &PlanOptions::default()).unwrap();
//! // intra a (2) + intra b (2) + same-host (2) + inter (2)
//! assert_eq!(p.measure.len(), 8);
//! assert_eq!(p.measure.len() + p.inherit.len(), 25);
//! ```

use crate::calib::{Cluster, Inheritance, PairRef, StrategyKind};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};

/// A host as the planner sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanHost {
    /// Unique name.
    pub name: String,
    /// Site.
    pub site: String,
    /// Preliminary H (any consistent unit, larger = slower); required by type-sampled.
    #[serde(default)]
    pub h: Option<f64>,
    /// Preliminary link speed (e.g. measured Mbit/s to a site peer, or a small-message RTT);
    /// used by type-sampled when given for every host of a site.
    #[serde(default)]
    pub link: Option<f64>,
    /// CPU model string; hosts with different models never share a cluster when both are given.
    #[serde(default)]
    pub cpu_model: Option<String>,
}

impl PlanHost {
    /// A host with no preliminary measurements.
    pub fn new(name: &str, site: &str) -> Self {
        PlanHost {
            name: name.to_string(),
            site: site.to_string(),
            h: None,
            link: None,
            cpu_model: None,
        }
    }

    /// Same, with a preliminary H.
    pub fn with_h(name: &str, site: &str, h: f64) -> Self {
        PlanHost {
            h: Some(h),
            ..PlanHost::new(name, site)
        }
    }
}

/// Options of the planners.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PlanOptions {
    /// Measure same-host pairs (two processes on one host). Default true.
    pub same_host: bool,
    /// Measure both directions of sampled intra-site pairs. Default true.
    pub both_directions: bool,
    /// Type-sampled: relative tolerance for joining a cluster (0.10 = ±10%). Default 0.10.
    pub tolerance: f64,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            same_host: true,
            both_directions: true,
            tolerance: 0.10,
        }
    }
}

/// A calibration plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The strategy that made it.
    pub strategy: StrategyKind,
    /// Pairs to measure, one at a time, in this order.
    pub measure: Vec<PairRef>,
    /// Every other pair and the measured pair it takes its values from.
    pub inherit: Vec<Inheritance>,
    /// Type-sampled clusters (empty otherwise).
    pub clusters: Vec<Cluster>,
}

impl Plan {
    /// Record the plan's inheritance map and clusters in a calibration's provenance (what
    /// [`crate::fit::fit`] and the legacy writer use to fill in unmeasured pairs).
    pub fn record_in(&self, calib: &mut crate::calib::Calibration) {
        calib.provenance.strategy = self.strategy;
        calib.provenance.inherited = self.inherit.clone();
        calib.provenance.clusters = self.clusters.clone();
    }

    /// The measured pair whose values `src -> dst` uses (itself when measured).
    pub fn source_for(&self, src: &str, dst: &str) -> Option<&PairRef> {
        self.measure
            .iter()
            .find(|p| p.src == src && p.dst == dst)
            .or_else(|| {
                self.inherit
                    .iter()
                    .find(|i| i.pair.src == src && i.pair.dst == dst)
                    .map(|i| &i.from)
            })
    }
}

/// Why a plan cannot be made.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PlanError {
    /// A host name appears twice.
    #[error("host {0:?} is listed twice; host names must be unique")]
    DuplicateHost(String),
    /// Type-sampled needs a preliminary H for every host.
    #[error("type-sampled needs a preliminary speed (h) for host {0:?}; measure H first")]
    MissingSpeed(String),
    /// A preliminary measurement is not a finite positive number.
    #[error("host {host:?}: preliminary {what} is {value}; it must be a finite number > 0")]
    BadValue {
        /// Host.
        host: String,
        /// Which input.
        what: &'static str,
        /// Value.
        value: f64,
    },
    /// Tolerance out of range.
    #[error("tolerance {0} must be a finite number >= 0")]
    BadTolerance(f64),
}

/// Make the plan of `strategy` for `hosts`.
pub fn plan(
    strategy: StrategyKind,
    hosts: &[PlanHost],
    opts: &PlanOptions,
) -> Result<Plan, PlanError> {
    let mut seen = HashSet::new();
    for h in hosts {
        if !seen.insert(h.name.as_str()) {
            return Err(PlanError::DuplicateHost(h.name.clone()));
        }
        for (what, v) in [("h", h.h), ("link", h.link)] {
            if let Some(v) = v {
                if !(v.is_finite() && v > 0.0) {
                    return Err(PlanError::BadValue {
                        host: h.name.clone(),
                        what,
                        value: v,
                    });
                }
            }
        }
    }
    if !(opts.tolerance.is_finite() && opts.tolerance >= 0.0) {
        return Err(PlanError::BadTolerance(opts.tolerance));
    }
    match strategy {
        StrategyKind::AllPairs => Ok(all_pairs(hosts, opts)),
        StrategyKind::SiteSampled => {
            let groups: Vec<Cluster> = sites(hosts)
                .into_iter()
                .map(|(site, members)| Cluster {
                    site,
                    representative: members[0].clone(),
                    members,
                })
                .collect();
            Ok(sampled(StrategyKind::SiteSampled, hosts, groups, opts))
        }
        StrategyKind::TypeSampled => {
            for h in hosts {
                if h.h.is_none() {
                    return Err(PlanError::MissingSpeed(h.name.clone()));
                }
            }
            let clusters = cluster(hosts, opts.tolerance);
            Ok(sampled(StrategyKind::TypeSampled, hosts, clusters, opts))
        }
    }
}

fn all_pairs(hosts: &[PlanHost], opts: &PlanOptions) -> Plan {
    let mut measure = Vec::new();
    for a in hosts {
        for b in hosts {
            if a.name != b.name || opts.same_host {
                measure.push(PairRef::new(&a.name, &b.name));
            }
        }
    }
    Plan {
        strategy: StrategyKind::AllPairs,
        measure,
        inherit: Vec::new(),
        clusters: Vec::new(),
    }
}

/// Sites in order of first appearance, with their hosts in input order.
fn sites(hosts: &[PlanHost]) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for h in hosts {
        match out.iter_mut().find(|(s, _)| *s == h.site) {
            Some((_, m)) => m.push(h.name.clone()),
            None => out.push((h.site.clone(), vec![h.name.clone()])),
        }
    }
    out
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * a.abs().min(b.abs())
}

/// Leader clustering per site, in input order.
fn cluster(hosts: &[PlanHost], tol: f64) -> Vec<Cluster> {
    let by_name: HashMap<&str, &PlanHost> = hosts.iter().map(|h| (h.name.as_str(), h)).collect();
    let mut out = Vec::new();
    for (site, members) in sites(hosts) {
        let mut cl: Vec<Cluster> = Vec::new();
        for m in members {
            let h = by_name[m.as_str()];
            let fits = |c: &Cluster| {
                let leader = by_name[c.representative.as_str()];
                let speed_ok = match (h.h, leader.h) {
                    (Some(a), Some(b)) => close(a, b, tol),
                    _ => true,
                };
                let link_ok = match (h.link, leader.link) {
                    (Some(a), Some(b)) => close(a, b, tol),
                    _ => true,
                };
                let cpu_ok = match (&h.cpu_model, &leader.cpu_model) {
                    (Some(a), Some(b)) => a == b,
                    _ => true,
                };
                speed_ok && link_ok && cpu_ok
            };
            match cl.iter_mut().find(|c| fits(c)) {
                Some(c) => c.members.push(m),
                None => cl.push(Cluster {
                    site: site.clone(),
                    representative: m.clone(),
                    members: vec![m],
                }),
            }
        }
        out.extend(cl);
    }
    out
}

/// The plan that measures between group representatives: used by site-sampled (one group per
/// site) and type-sampled (one group per cluster).
fn sampled(
    strategy: StrategyKind,
    hosts: &[PlanHost],
    groups: Vec<Cluster>,
    opts: &PlanOptions,
) -> Plan {
    let group_of: HashMap<&str, usize> = groups
        .iter()
        .enumerate()
        .flat_map(|(i, g)| g.members.iter().map(move |m| (m.as_str(), i)))
        .collect();
    let mut measure: Vec<PairRef> = Vec::new();
    let mut push = |p: PairRef| {
        if !measure.contains(&p) {
            measure.push(p);
        }
    };
    // Same-host: one per group.
    if opts.same_host {
        for g in &groups {
            push(PairRef::new(&g.representative, &g.representative));
        }
    }
    // Within a group of >= 2 hosts: representative <-> second member.
    for g in &groups {
        if let Some(second) = g.members.get(1) {
            push(PairRef::new(&g.representative, second));
            if opts.both_directions {
                push(PairRef::new(second, &g.representative));
            }
        }
    }
    // Between groups of the same site: every ordered pair of representatives.
    for a in &groups {
        for b in &groups {
            if a.site == b.site && a.representative != b.representative {
                push(PairRef::new(&a.representative, &b.representative));
            }
        }
    }
    // Between sites. Site-sampled: the first group (site representative) of each site to the
    // other's. Type-sampled: every group to every group of the other site.
    let first_of_site: HashSet<usize> = {
        let mut s = HashSet::new();
        let mut seen = HashSet::new();
        for (i, g) in groups.iter().enumerate() {
            if seen.insert(g.site.as_str()) {
                s.insert(i);
            }
        }
        s
    };
    for (i, a) in groups.iter().enumerate() {
        for (j, b) in groups.iter().enumerate() {
            if a.site == b.site {
                continue;
            }
            if strategy == StrategyKind::SiteSampled
                && !(first_of_site.contains(&i) && first_of_site.contains(&j))
            {
                continue;
            }
            push(PairRef::new(&a.representative, &b.representative));
        }
    }
    let measured: HashSet<PairRef> = measure.iter().cloned().collect();
    let mut inherit = Vec::new();
    for x in hosts {
        for y in hosts {
            let pair = PairRef::new(&x.name, &y.name);
            if measured.contains(&pair) || (x.name == y.name && !opts.same_host) {
                continue;
            }
            let (gx, gy) = (
                &groups[group_of[x.name.as_str()]],
                &groups[group_of[y.name.as_str()]],
            );
            let from = if x.name == y.name {
                PairRef::new(&gx.representative, &gx.representative)
            } else if std::ptr::eq(gx, gy) {
                // Same group, different hosts: the sampled pair of the group.
                PairRef::new(&gx.representative, &gx.members[1])
            } else if gx.site == gy.site || strategy == StrategyKind::TypeSampled {
                PairRef::new(&gx.representative, &gy.representative)
            } else {
                // Site-sampled, different sites: the site representatives.
                let rx = &groups[first_group(&groups, &gx.site)].representative;
                let ry = &groups[first_group(&groups, &gy.site)].representative;
                PairRef::new(rx, ry)
            };
            inherit.push(Inheritance { pair, from });
        }
    }
    let clusters = if strategy == StrategyKind::TypeSampled {
        groups
    } else {
        Vec::new()
    };
    Plan {
        strategy,
        measure,
        inherit,
        clusters,
    }
}

fn first_group(groups: &[Cluster], site: &str) -> usize {
    groups.iter().position(|g| g.site == site).unwrap_or(0)
}
