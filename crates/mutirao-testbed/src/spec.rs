//! The testbed spec (TOML): sites with hosts and a NIC rate, and shaped WAN links between sites.
//!
//! Pure: parsing and validation do no I/O. The number of cores used to bound `cpu` is a parameter.

use serde::Deserialize;
use std::collections::{HashMap, VecDeque};

/// Most sites one testbed may have (one /24 of the testbed's /20 each; the 16th /24 is the
/// control and WAN transfer network).
pub const MAX_SITES: usize = 15;
/// Most hosts one site may have (addresses `.1` to `.250` of the site's /24).
pub const MAX_HOSTS_PER_SITE: usize = 250;
/// Most WAN links one testbed may have (one /31 each in the transfer network).
pub const MAX_WANS: usize = 96;
/// Smallest accepted rate in Mbit/s (100 kbit/s).
pub const MIN_MBIT: f64 = 0.1;
/// Largest accepted rate in Mbit/s (100 Gbit/s).
pub const MAX_MBIT: f64 = 100_000.0;
/// Smallest accepted CPU fraction (the kernel's minimum quota is 1 ms per period of at most 1 s).
pub const MIN_CPU: f64 = 0.001;

/// Errors from parsing or validating a spec. Each names the field at fault.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SpecError {
    /// The text is not valid TOML or does not have the spec's shape (message has line/column).
    #[error("testbed spec is not valid: {0}")]
    Syntax(String),
    /// A field has a value the testbed cannot build.
    #[error("testbed spec field `{field}`: {message}")]
    Invalid {
        /// Path of the field, e.g. `site[1].hosts[0].cpu`.
        field: String,
        /// What is wrong and what to do.
        message: String,
    },
}

/// A host of a site: a name and the fraction of one core it may use.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSpec {
    /// Host name, unique in the testbed (letters, digits, `-`, `_`, `.`; at most 63 characters).
    pub name: String,
    /// CPU share as a fraction of one core, in (0, ncores].
    pub cpu: f64,
    /// This host's link rate in Mbit/s, when it differs from its site's `nic_mbit` (a site that
    /// mixes link speeds, e.g. an old 100 Mbit/s machine on a gigabit switch).
    #[serde(default)]
    pub nic_mbit: Option<f64>,
}

/// A site: hosts on one switch, each joined to it by a link of `nic_mbit`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SiteSpec {
    /// Site name, unique in the testbed.
    pub name: String,
    /// Rate of each host's link to the site switch, in Mbit/s, both directions.
    pub nic_mbit: f64,
    /// The site's hosts (at least one).
    pub hosts: Vec<HostSpec>,
}

/// A WAN link joining two sites, shaped at `mbit` in both directions.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WanSpec {
    /// The two sites it joins.
    pub sites: Vec<String>,
    /// Rate in Mbit/s, both directions.
    pub mbit: f64,
}

/// A whole testbed spec, exactly the TOML shape of SYSTEM.md (`[[site]]` and `[[wan]]` tables).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// The sites, in file order (their index fixes their addresses).
    #[serde(rename = "site", default)]
    pub sites: Vec<SiteSpec>,
    /// The WAN links between sites.
    #[serde(rename = "wan", default)]
    pub wans: Vec<WanSpec>,
}

/// One host of a validated spec, flattened: its global index, its site index and its index in the site.
#[derive(Debug, Clone, PartialEq)]
pub struct HostRef<'a> {
    /// Index over all hosts in file order.
    pub index: usize,
    /// Index of its site in `Spec::sites`.
    pub site: usize,
    /// Index inside its site.
    pub local: usize,
    /// The host itself.
    pub spec: &'a HostSpec,
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> SpecError {
    SpecError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

fn check_name(field: String, name: &str) -> Result<(), SpecError> {
    if name.is_empty() || name.len() > 63 {
        return Err(invalid(field, "must have 1 to 63 characters"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(invalid(
            field,
            format!("`{name}` contains `{c}`; use only letters, digits, `-`, `_` and `.`"),
        ));
    }
    Ok(())
}

fn check_rate(field: String, mbit: f64) -> Result<(), SpecError> {
    if !mbit.is_finite() || !(MIN_MBIT..=MAX_MBIT).contains(&mbit) {
        return Err(invalid(
            field,
            format!(
                "rate {mbit} Mbit/s is out of range; give a number from {MIN_MBIT} to {MAX_MBIT}"
            ),
        ));
    }
    Ok(())
}

impl Spec {
    /// Parse TOML text and validate it for a machine with `ncores` cores.
    pub fn parse(text: &str, ncores: usize) -> Result<Spec, SpecError> {
        let spec: Spec = toml::from_str(text).map_err(|e| SpecError::Syntax(e.to_string()))?;
        spec.validate(ncores)?;
        Ok(spec)
    }

    /// Check everything the testbed needs: at least one site; unique, well-formed names; cpu in
    /// (0, ncores]; rates in range; WAN links between two distinct, existing sites, no pair twice;
    /// every site reachable from every other over WAN links.
    pub fn validate(&self, ncores: usize) -> Result<(), SpecError> {
        if self.sites.is_empty() {
            return Err(invalid("site", "no sites; add at least one [[site]] table"));
        }
        if self.sites.len() > MAX_SITES {
            return Err(invalid(
                "site",
                format!(
                    "{} sites; a testbed has at most {MAX_SITES}",
                    self.sites.len()
                ),
            ));
        }
        let mut site_names: HashMap<&str, usize> = HashMap::new();
        let mut host_names: HashMap<&str, String> = HashMap::new();
        for (s, site) in self.sites.iter().enumerate() {
            check_name(format!("site[{s}].name"), &site.name)?;
            if site_names.insert(&site.name, s).is_some() {
                return Err(invalid(
                    format!("site[{s}].name"),
                    format!("site name `{}` is used twice", site.name),
                ));
            }
            check_rate(format!("site[{s}].nic_mbit"), site.nic_mbit)?;
            if site.hosts.is_empty() {
                return Err(invalid(
                    format!("site[{s}].hosts"),
                    "a site needs at least one host",
                ));
            }
            if site.hosts.len() > MAX_HOSTS_PER_SITE {
                return Err(invalid(
                    format!("site[{s}].hosts"),
                    format!(
                        "{} hosts; a site has at most {MAX_HOSTS_PER_SITE}",
                        site.hosts.len()
                    ),
                ));
            }
            for (h, host) in site.hosts.iter().enumerate() {
                let field = format!("site[{s}].hosts[{h}]");
                check_name(format!("{field}.name"), &host.name)?;
                if let Some(prev) = host_names.insert(&host.name, field.clone()) {
                    return Err(invalid(
                        format!("{field}.name"),
                        format!("host name `{}` is already used by {prev}", host.name),
                    ));
                }
                if let Some(r) = host.nic_mbit {
                    check_rate(format!("{field}.nic_mbit"), r)?;
                }
                let max = ncores as f64;
                if !host.cpu.is_finite() || host.cpu < MIN_CPU || host.cpu > max {
                    return Err(invalid(
                        format!("{field}.cpu"),
                        format!(
                            "cpu {} is out of range; give a fraction of one core in [{MIN_CPU}, {ncores}] (this machine has {ncores} cores)",
                            host.cpu
                        ),
                    ));
                }
            }
        }
        if self.wans.len() > MAX_WANS {
            return Err(invalid(
                "wan",
                format!(
                    "{} WAN links; a testbed has at most {MAX_WANS}",
                    self.wans.len()
                ),
            ));
        }
        let mut pairs: HashMap<(usize, usize), usize> = HashMap::new();
        for (w, wan) in self.wans.iter().enumerate() {
            let field = format!("wan[{w}].sites");
            let [a, b] = wan.sites.as_slice() else {
                return Err(invalid(
                    field,
                    format!(
                        "lists {} sites; a WAN link joins exactly two",
                        wan.sites.len()
                    ),
                ));
            };
            let ia = *site_names.get(a.as_str()).ok_or_else(|| {
                invalid(
                    field.clone(),
                    format!("site `{a}` is not defined by any [[site]]"),
                )
            })?;
            let ib = *site_names.get(b.as_str()).ok_or_else(|| {
                invalid(
                    field.clone(),
                    format!("site `{b}` is not defined by any [[site]]"),
                )
            })?;
            if ia == ib {
                return Err(invalid(field, format!("joins site `{a}` to itself")));
            }
            if let Some(prev) = pairs.insert((ia.min(ib), ia.max(ib)), w) {
                return Err(invalid(
                    field,
                    format!("sites `{a}` and `{b}` are already joined by wan[{prev}]"),
                ));
            }
            check_rate(format!("wan[{w}].mbit"), wan.mbit)?;
        }
        let routes = self.next_hops();
        for (t, site) in self.sites.iter().enumerate().skip(1) {
            if routes[0][t].is_none() {
                return Err(invalid(
                    "wan",
                    format!(
                        "site `{}` cannot reach site `{}`; add a [[wan]] link joining them",
                        self.sites[0].name, site.name
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Every host in file order with its site and indices.
    pub fn hosts(&self) -> Vec<HostRef<'_>> {
        let mut out = Vec::new();
        for (s, site) in self.sites.iter().enumerate() {
            for (local, spec) in site.hosts.iter().enumerate() {
                out.push(HostRef {
                    index: out.len(),
                    site: s,
                    local,
                    spec,
                });
            }
        }
        out
    }

    /// The two site indices of every WAN link (unknown names give `None`).
    pub fn wan_ends(&self) -> Vec<Option<(usize, usize)>> {
        let find = |n: &str| self.sites.iter().position(|s| s.name == n);
        self.wans
            .iter()
            .map(|w| match w.sites.as_slice() {
                [a, b] => Some((find(a)?, find(b)?)),
                _ => None,
            })
            .collect()
    }

    /// Shortest-path routing over WAN links: `r[s][t] = Some(wan index)` is the WAN link site `s`
    /// sends traffic for site `t` over (`None` for `s == t` or when `t` is unreachable).
    /// Ties go to the WAN link listed first, so routes are deterministic.
    pub fn next_hops(&self) -> Vec<Vec<Option<usize>>> {
        let n = self.sites.len();
        let ends = self.wan_ends();
        let mut out = vec![vec![None; n]; n];
        for (s, row) in out.iter_mut().enumerate() {
            // BFS from s, remembering the first WAN link of each path.
            let mut first: Vec<Option<usize>> = vec![None; n];
            let mut seen = vec![false; n];
            seen[s] = true;
            let mut queue = VecDeque::from([s]);
            while let Some(u) = queue.pop_front() {
                for (w, e) in ends.iter().enumerate() {
                    let Some((a, b)) = *e else { continue };
                    let v = if a == u {
                        b
                    } else if b == u {
                        a
                    } else {
                        continue;
                    };
                    if !seen[v] {
                        seen[v] = true;
                        first[v] = if u == s { Some(w) } else { first[u] };
                        queue.push_back(v);
                    }
                }
            }
            *row = first;
        }
        out
    }

    /// Total number of hosts.
    pub fn host_count(&self) -> usize {
        self.sites.iter().map(|s| s.hosts.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
[[site]]
name = "a"
nic_mbit = 800                 # each host's link to the site switch
hosts = [ { name = "a1", cpu = 1.0 }, { name = "a2", cpu = 0.5 } ]   # cpu: fraction of one core

[[site]]
name = "b"
nic_mbit = 200
hosts = [ { name = "b1", cpu = 0.25 } ]

[[wan]]
sites = ["a", "b"]
mbit = 40
"#;

    fn field_of(e: SpecError) -> String {
        match e {
            SpecError::Invalid { field, .. } => field,
            other => panic!("expected an Invalid error, got {other:?}"),
        }
    }

    #[test]
    fn parses_the_system_md_example() {
        let s = Spec::parse(EXAMPLE, 2).expect("valid");
        assert_eq!(s.sites.len(), 2);
        assert_eq!(s.sites[0].nic_mbit, 800.0);
        assert_eq!(
            s.sites[1].hosts[0],
            HostSpec {
                name: "b1".into(),
                cpu: 0.25,
                nic_mbit: None,
            }
        );
        assert_eq!(s.wans[0].sites, vec!["a".to_string(), "b".to_string()]);
        assert_eq!(s.wans[0].mbit, 40.0);
        let hosts = s.hosts();
        assert_eq!(hosts.len(), 3);
        assert_eq!((hosts[2].index, hosts[2].site, hosts[2].local), (2, 1, 0));
        assert_eq!(s.next_hops()[0][1], Some(0));
        assert_eq!(s.next_hops()[1][0], Some(0));
    }

    #[test]
    fn syntax_errors_carry_the_line() {
        let e = Spec::parse("[[site]]\nname = \"a\"\nnic_mbit = \n", 2).unwrap_err();
        let SpecError::Syntax(msg) = e else {
            panic!("expected syntax error")
        };
        assert!(msg.contains("line 3"), "{msg}");
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let text = EXAMPLE.replace("nic_mbit = 200", "nic_mbit = 200\nlatency_ms = 3");
        let e = Spec::parse(&text, 2).unwrap_err();
        assert!(
            matches!(&e, SpecError::Syntax(m) if m.contains("latency_ms")),
            "{e}"
        );
    }

    #[test]
    fn duplicate_host_name_names_both_places() {
        let text = EXAMPLE.replace("name = \"b1\"", "name = \"a2\"");
        let e = Spec::parse(&text, 2).unwrap_err();
        assert!(e.to_string().contains("site[0].hosts[1]"), "{e}");
        assert_eq!(field_of(e), "site[1].hosts[0].name");
    }

    #[test]
    fn duplicate_site_name() {
        let text = EXAMPLE.replace("name = \"b\"", "name = \"a\"");
        assert_eq!(field_of(Spec::parse(&text, 2).unwrap_err()), "site[1].name");
    }

    #[test]
    fn cpu_must_be_positive_and_at_most_ncores() {
        for bad in ["0.0", "-1.0", "2.5", "nan"] {
            let text = EXAMPLE.replace("cpu = 0.5", &format!("cpu = {bad}"));
            assert_eq!(
                field_of(Spec::parse(&text, 2).unwrap_err()),
                "site[0].hosts[1].cpu",
                "cpu = {bad}"
            );
        }
        let text = EXAMPLE.replace("cpu = 0.5", "cpu = 2");
        assert!(Spec::parse(&text, 2).is_ok());
        assert_eq!(
            field_of(Spec::parse(&text, 1).unwrap_err()),
            "site[0].hosts[1].cpu"
        );
    }

    #[test]
    fn rates_must_be_positive() {
        let text = EXAMPLE.replace("nic_mbit = 200", "nic_mbit = 0");
        assert_eq!(
            field_of(Spec::parse(&text, 2).unwrap_err()),
            "site[1].nic_mbit"
        );
        let text = EXAMPLE.replace("mbit = 40", "mbit = -3");
        assert_eq!(field_of(Spec::parse(&text, 2).unwrap_err()), "wan[0].mbit");
    }

    #[test]
    fn wan_sites_must_exist_and_differ() {
        let text = EXAMPLE.replace("[\"a\", \"b\"]", "[\"a\", \"c\"]");
        let e = Spec::parse(&text, 2).unwrap_err();
        assert!(e.to_string().contains("`c`"), "{e}");
        assert_eq!(field_of(e), "wan[0].sites");
        let text = EXAMPLE.replace("[\"a\", \"b\"]", "[\"a\", \"a\"]");
        assert_eq!(field_of(Spec::parse(&text, 2).unwrap_err()), "wan[0].sites");
        let text = EXAMPLE.replace("[\"a\", \"b\"]", "[\"a\"]");
        assert_eq!(field_of(Spec::parse(&text, 2).unwrap_err()), "wan[0].sites");
    }

    #[test]
    fn duplicate_wan_pair_is_rejected() {
        let text = format!("{EXAMPLE}\n[[wan]]\nsites = [\"b\", \"a\"]\nmbit = 10\n");
        let e = Spec::parse(&text, 2).unwrap_err();
        assert!(e.to_string().contains("wan[0]"), "{e}");
        assert_eq!(field_of(e), "wan[1].sites");
    }

    #[test]
    fn disconnected_sites_are_rejected() {
        let text = EXAMPLE.split("[[wan]]").next().unwrap_or_default();
        let e = Spec::parse(text, 2).unwrap_err();
        assert!(e.to_string().contains("add a [[wan]]"), "{e}");
        assert_eq!(field_of(e), "wan");
    }

    #[test]
    fn empty_spec_and_empty_site_are_rejected() {
        assert_eq!(field_of(Spec::parse("", 2).unwrap_err()), "site");
        let e = Spec::parse("[[site]]\nname=\"x\"\nnic_mbit=10\nhosts=[]\n", 2).unwrap_err();
        assert_eq!(field_of(e), "site[0].hosts");
    }

    #[test]
    fn bad_names_are_rejected() {
        let text = EXAMPLE.replace("name = \"a1\"", "name = \"a 1\"");
        assert_eq!(
            field_of(Spec::parse(&text, 2).unwrap_err()),
            "site[0].hosts[0].name"
        );
        let text = EXAMPLE.replace("name = \"a1\"", "name = \"\"");
        assert_eq!(
            field_of(Spec::parse(&text, 2).unwrap_err()),
            "site[0].hosts[0].name"
        );
    }

    #[test]
    fn routes_go_through_intermediate_sites() {
        let text = r#"
[[site]]
name = "x"
nic_mbit = 100
hosts = [ { name = "x1", cpu = 1 } ]
[[site]]
name = "y"
nic_mbit = 100
hosts = [ { name = "y1", cpu = 1 } ]
[[site]]
name = "z"
nic_mbit = 100
hosts = [ { name = "z1", cpu = 1 } ]
[[wan]]
sites = ["x", "y"]
mbit = 10
[[wan]]
sites = ["y", "z"]
mbit = 20
"#;
        let s = Spec::parse(text, 2).expect("valid chain");
        let r = s.next_hops();
        assert_eq!(r[0][2], Some(0), "x reaches z over x-y");
        assert_eq!(r[2][0], Some(1), "z reaches x over y-z");
        assert_eq!(r[1][0], Some(0));
        assert_eq!(r[1][2], Some(1));
        assert_eq!(r[1][1], None);
    }
}
