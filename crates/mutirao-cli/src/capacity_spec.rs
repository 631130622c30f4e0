//! Link capacities from a mεμ resource spec (`--resources NAME.meu` on `simulate`, `schedule`
//! and `fit`): a host domain's `nic_mbit` is its NIC's capacity in both directions, the root's
//! `wan.A.B=MBIT` the capacity of the link between sites A and B in each direction (the testbed
//! shapes both ends). A model host matches a spec host by name or by `addr`. Capacities the
//! model already has win.

use anyhow::{bail, Context};
use mutirao_dir::meu::props::PropValue;
use mutirao_dir::meu::spec;
use mutirao_model::{Capacity, Model, NicCapacity, SiteLinkCapacity};
use std::path::Path;

/// The capacities a resource spec gives for `model`'s hosts and sites.
pub fn from_spec(path: &str, text: &str, model: &Model) -> anyhow::Result<Capacity> {
    let sp = spec::parse(text).with_context(|| format!("resource spec {path}"))?;
    let prop = |d: &spec::DomainSpec, name: &str| -> Option<PropValue> {
        d.props
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.value.clone())
    };
    let number = |v: Option<PropValue>| match v {
        Some(PropValue::Acc(_, n)) => Some(n as f64),
        Some(PropValue::Exact(s)) => s.parse::<f64>().ok(),
        _ => None,
    };
    let mut nics = Vec::new();
    for h in &model.hosts {
        // Only domains with a NIC capacity: an alias or a site named like a host is skipped.
        let found = sp
            .domains
            .iter()
            .filter(|d| prop(d, "nic_mbit").is_some())
            .find(|d| {
                let addr = match prop(d, "addr") {
                    Some(PropValue::Exact(a)) => Some(a),
                    _ => None,
                };
                d.name == h.name
                    || (addr.is_some()
                        && (addr.as_deref() == Some(h.name.as_str())
                            || (h.addr.is_some() && addr == h.addr)))
            });
        if let Some(mbit) = found.and_then(|d| number(prop(d, "nic_mbit"))) {
            if mbit > 0.0 {
                nics.push(NicCapacity {
                    host: h.name.clone(),
                    out_mbit: mbit,
                    in_mbit: mbit,
                });
            }
        }
    }
    let mut site_links = Vec::new();
    for d in &sp.domains {
        for p in &d.props {
            let Some(rest) = p.name.strip_prefix("wan.") else {
                continue;
            };
            let Some((a, b)) = rest.split_once('.') else {
                bail!(
                    "resource spec {path} line {}: property {:?} should be wan.SITE1.SITE2=MBIT",
                    d.line,
                    p.name
                );
            };
            let Some(mbit) = number(Some(p.value.clone())).filter(|m| *m > 0.0) else {
                bail!(
                    "resource spec {path} line {}: {} needs a positive number of Mbit/s",
                    d.line,
                    p.name
                );
            };
            for (from, to) in [(a, b), (b, a)] {
                if !site_links
                    .iter()
                    .any(|l: &SiteLinkCapacity| l.from == from && l.to == to)
                {
                    site_links.push(SiteLinkCapacity {
                        from: from.to_string(),
                        to: to.to_string(),
                        mbit,
                    });
                }
            }
        }
    }
    Ok(Capacity {
        source: Some(format!("resource-spec {path}")),
        nics,
        site_links,
    })
}

/// Fill the capacities `model` lacks from `extra` (the model's own win).
pub fn merge(model: &mut Model, extra: Capacity) {
    let cap = model.capacity.get_or_insert_with(Capacity::default);
    let mut took = false;
    for n in extra.nics {
        if !cap.nics.iter().any(|m| m.host == n.host) {
            cap.nics.push(n);
            took = true;
        }
    }
    for l in extra.site_links {
        if !cap
            .site_links
            .iter()
            .any(|m| m.from == l.from && m.to == l.to)
        {
            cap.site_links.push(l);
            took = true;
        }
    }
    if took {
        cap.source = Some(match (&cap.source, &extra.source) {
            (Some(a), Some(b)) => format!("{a}; missing ones from {b}"),
            (None, b) => b.clone().unwrap_or_default(),
            (a, None) => a.clone().unwrap_or_default(),
        });
    }
}

/// Read `path` and fill `model`'s missing capacities from it.
pub fn apply_file(model: &mut Model, path: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read resource spec {}", path.display()))?;
    let cap = from_spec(&path.display().to_string(), &text, model)?;
    merge(model, cap);
    model
        .validate()
        .with_context(|| format!("capacities from {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mutirao_model::Host;

    fn model() -> Model {
        let h = |n: &str, s: &str| Host {
            name: n.into(),
            site: s.into(),
            speed: 1.0,
            addr: None,
        };
        Model::new(vec![h("a1", "a"), h("10.213.1.2", "b")], vec![]).unwrap()
    }

    const SPEC: &str = r#"tb: "g1" { testbed, "wan.a.b"=40 };
s0: "a" <tb> { site };
s1: "b" <tb> { site };
h0: "a1" <s0> { host, addr=10.213.0.2, cpu=1, cpu_milli=1000, nic_mbit=800 };
h1: "b1" <s1> { host, addr=10.213.1.2, cpu=1, cpu_milli=1000, nic_mbit=200 };
"#;

    #[test]
    fn hosts_match_by_name_or_address_and_the_wan_goes_both_ways() {
        let mut m = model();
        let c = from_spec("g1.meu", SPEC, &m).unwrap();
        assert_eq!(c.nics.len(), 2);
        assert_eq!(c.nics[1].host, "10.213.1.2");
        assert_eq!(c.nics[1].in_mbit, 200.0);
        assert_eq!(c.site_links.len(), 2);
        merge(&mut m, c);
        assert_eq!(m.site_link_mbit("b", "a"), Some(40.0));
        m.validate().unwrap();
    }

    #[test]
    fn the_model_s_own_capacities_win() {
        let mut m = model();
        m.capacity = Some(Capacity {
            source: Some("calibrate".into()),
            nics: vec![NicCapacity {
                host: "a1".into(),
                out_mbit: 780.0,
                in_mbit: 790.0,
            }],
            site_links: vec![],
        });
        let c = from_spec("g1.meu", SPEC, &m).unwrap();
        merge(&mut m, c);
        assert_eq!(m.nic_capacity("a1").unwrap().out_mbit, 780.0);
        assert_eq!(m.nic_capacity("10.213.1.2").unwrap().out_mbit, 200.0);
        assert!(m.capacity.unwrap().source.unwrap().contains("calibrate"));
    }

    #[test]
    fn a_bad_spec_is_named() {
        let e = from_spec("x.meu", "r: root {", &model()).unwrap_err();
        assert!(format!("{e:#}").contains("x.meu"), "{e:#}");
        let e = from_spec("x.meu", r#"r: "g" { "wan.a"=4 };"#, &model()).unwrap_err();
        assert!(e.to_string().contains("wan.SITE1.SITE2"), "{e}");
    }
}
