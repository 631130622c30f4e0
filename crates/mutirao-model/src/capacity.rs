//! Link capacities from a calibration's concurrent-stream measurements (pure).
//!
//! A NIC's capacity (per direction) is the median aggregate rate measured through it while
//! several streams ran at once, and at least the rate one stream alone reached through it at
//! the calibration's largest size (a resource carries at least what one stream got through it).
//! A directed site link likewise. Resources without a measurement are left out: the contention
//! model then names them, and a resource spec may give them.

use crate::calib::{Calibration, CapacityKind};
use crate::{Capacity, NicCapacity, SiteLinkCapacity};
use std::collections::HashMap;

/// The capacities `calib` measured (`None` when it measured none).
pub fn estimate(calib: &Calibration) -> Option<Capacity> {
    if calib.capacity.is_empty() {
        return None;
    }
    let site: HashMap<&str, &str> = calib
        .hosts
        .iter()
        .map(|h| (h.name.as_str(), h.site.as_str()))
        .collect();
    // Single-stream rates at the largest size of each sweep, Mbit/s: a one-way time is half the
    // median round trip.
    let mut single: Vec<(&str, &str, f64)> = Vec::new();
    for sw in &calib.pairs {
        if sw.src == sw.dst {
            continue;
        }
        let Some(sz) = sw
            .sizes
            .iter()
            .filter(|s| s.bytes > 0)
            .max_by_key(|s| s.bytes)
        else {
            continue;
        };
        let Some(st) = sz.stats.or_else(|| sz.derive(sw.method)) else {
            continue;
        };
        let one_way_us = st.rtt.median / 2.0;
        if one_way_us > 0.0 {
            single.push((&sw.src, &sw.dst, sz.bytes as f64 * 8.0 / one_way_us));
        }
    }
    let floor = |f: &dyn Fn(&str, &str) -> bool| {
        single
            .iter()
            .filter(|(s, d, _)| f(s, d))
            .map(|x| x.2)
            .fold(0.0, f64::max)
    };
    let mut out: HashMap<&str, (Option<f64>, Option<f64>)> = HashMap::new();
    let mut links: Vec<SiteLinkCapacity> = Vec::new();
    for m in &calib.capacity {
        let v = m.median_mbit;
        if !(v.is_finite() && v > 0.0) {
            continue;
        }
        match (m.kind, m.host.as_deref(), &m.from_site, &m.to_site) {
            (CapacityKind::NicOut, Some(h), _, _) => {
                let f = floor(&|s, _| s == h);
                out.entry(h).or_default().0 = Some(v.max(f));
            }
            (CapacityKind::NicIn, Some(h), _, _) => {
                let f = floor(&|_, d| d == h);
                out.entry(h).or_default().1 = Some(v.max(f));
            }
            (CapacityKind::SiteLink, _, Some(a), Some(b)) => {
                let f = floor(&|s, d| {
                    site.get(s) == Some(&a.as_str()) && site.get(d) == Some(&b.as_str())
                });
                links.push(SiteLinkCapacity {
                    from: a.clone(),
                    to: b.clone(),
                    mbit: v.max(f),
                });
            }
            _ => {}
        }
    }
    let mut nics: Vec<NicCapacity> = calib
        .hosts
        .iter()
        .filter_map(|h| match out.get(h.name.as_str()) {
            Some((Some(o), Some(i))) => Some(NicCapacity {
                host: h.name.clone(),
                out_mbit: *o,
                in_mbit: *i,
            }),
            // One direction measured: the NIC is taken as symmetric.
            Some((Some(x), None)) | Some((None, Some(x))) => Some(NicCapacity {
                host: h.name.clone(),
                out_mbit: *x,
                in_mbit: *x,
            }),
            _ => None,
        })
        .collect();
    nics.sort_by(|a, b| a.host.cmp(&b.host));
    Some(Capacity {
        source: Some("calibrate".into()),
        nics,
        site_links: links,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calib::{CalibHost, CapacityMeasurement, PairRef, StrategyKind};

    fn calib() -> Calibration {
        let mut c = Calibration::new(StrategyKind::AllPairs, "test", 0);
        for (n, s) in [("a1", "a"), ("a2", "a"), ("b1", "b")] {
            c.add_host(CalibHost::new(n, s, n)).unwrap();
        }
        let m =
            |kind, host: Option<&str>, sites: Option<(&str, &str)>, v: f64| CapacityMeasurement {
                kind,
                host: host.map(str::to_string),
                from_site: sites.map(|x| x.0.to_string()),
                to_site: sites.map(|x| x.1.to_string()),
                streams: vec![PairRef::new("a1", "a2")],
                bytes_per_stream: 1 << 20,
                samples_mbit: vec![v],
                median_mbit: v,
            };
        c.capacity = vec![
            m(CapacityKind::NicOut, Some("a1"), None, 780.0),
            m(CapacityKind::NicIn, Some("a1"), None, 790.0),
            m(CapacityKind::NicOut, Some("b1"), None, 38.0),
            m(CapacityKind::SiteLink, None, Some(("a", "b")), 39.0),
        ];
        c
    }

    #[test]
    fn measurements_become_capacities_and_gaps_stay_gaps() {
        let cap = estimate(&calib()).unwrap();
        assert_eq!(cap.source.as_deref(), Some("calibrate"));
        let a1 = cap.nics.iter().find(|n| n.host == "a1").unwrap();
        assert_eq!((a1.out_mbit, a1.in_mbit), (780.0, 790.0));
        // b1 measured one direction only: symmetric.
        let b1 = cap.nics.iter().find(|n| n.host == "b1").unwrap();
        assert_eq!((b1.out_mbit, b1.in_mbit), (38.0, 38.0));
        // a2 unmeasured: absent, so the contention model names it.
        assert!(cap.nics.iter().all(|n| n.host != "a2"));
        assert_eq!(cap.site_links.len(), 1);
        assert_eq!(cap.site_links[0].mbit, 39.0);
    }

    #[test]
    fn no_measurement_no_capacity() {
        let mut c = calib();
        c.capacity.clear();
        assert!(estimate(&c).is_none());
    }
}
