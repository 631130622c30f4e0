//! Pure placement logic: requirement expressions over agents' reports, and a first placement
//! of a job's ranks on the eligible hosts. No I/O; tested alone.
//!
//! A requirement is terms joined by `&`: `ATTR OP NUMBER`, with ATTR one of `cpu` (idle
//! cores), `mem` (free MiB) and `load` (1-minute load), OP one of `>= <= > < = !=`. Example:
//! `cpu>=2 & mem>=1024 & load<1.5`. Attributes of the resource hierarchy (`site=north`) are
//! not known to the coordinator yet and are refused at submission with that reason.

use crate::{Host, HostReport};

/// An attribute of a host report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attr {
    /// Idle cores.
    Cpu,
    /// Free memory, MiB.
    Mem,
    /// 1-minute load.
    Load,
}

/// A comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `>=`
    Ge,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `<`
    Lt,
    /// `=` or `==`
    Eq,
    /// `!=`
    Ne,
}

/// One term of a requirement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Term {
    /// What is compared.
    pub attr: Attr,
    /// How.
    pub op: Op,
    /// With what.
    pub value: f64,
}

/// A parsed requirement: every term must hold.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Requirement(pub Vec<Term>);

impl Attr {
    fn name(self) -> &'static str {
        match self {
            Attr::Cpu => "cpu",
            Attr::Mem => "mem",
            Attr::Load => "load",
        }
    }
    fn of(self, r: &HostReport) -> f64 {
        match self {
            Attr::Cpu => r.idle_cpu,
            Attr::Mem => r.free_mem_mib as f64,
            Attr::Load => r.load,
        }
    }
}

impl Op {
    fn text(self) -> &'static str {
        match self {
            Op::Ge => ">=",
            Op::Le => "<=",
            Op::Gt => ">",
            Op::Lt => "<",
            Op::Eq => "=",
            Op::Ne => "!=",
        }
    }
    fn holds(self, a: f64, b: f64) -> bool {
        match self {
            Op::Ge => a >= b,
            Op::Le => a <= b,
            Op::Gt => a > b,
            Op::Lt => a < b,
            Op::Eq => a == b,
            Op::Ne => a != b,
        }
    }
}

impl Requirement {
    /// Parse `cpu>=2 & mem>=1024`; the error says which term and why.
    pub fn parse(expr: &str) -> Result<Requirement, String> {
        let mut terms = Vec::new();
        if expr.trim().is_empty() {
            return Ok(Requirement(terms));
        }
        for raw in expr.split('&') {
            let t = raw.trim();
            let pos = t
                .find(['<', '>', '=', '!'])
                .ok_or_else(|| format!("term {t:?}: expected ATTR OP NUMBER, e.g. cpu>=2"))?;
            let (name, rest) = t.split_at(pos);
            let (op, value) = [
                (">=", Op::Ge),
                ("<=", Op::Le),
                ("!=", Op::Ne),
                ("==", Op::Eq),
                (">", Op::Gt),
                ("<", Op::Lt),
                ("=", Op::Eq),
            ]
            .into_iter()
            .find_map(|(s, op)| rest.strip_prefix(s).map(|v| (op, v)))
            .ok_or_else(|| format!("term {t:?}: unknown comparison"))?;
            let attr = match name.trim() {
                "cpu" => Attr::Cpu,
                "mem" => Attr::Mem,
                "load" => Attr::Load,
                other => {
                    return Err(format!(
                        "term {t:?}: the coordinator knows the attributes cpu, mem and load of agents' reports, not {other:?} (resource-hierarchy attributes are not wired into placement yet)"
                    ))
                }
            };
            let value: f64 = value
                .trim()
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite())
                .ok_or_else(|| format!("term {t:?}: {:?} is not a number", value.trim()))?;
            terms.push(Term { attr, op, value });
        }
        Ok(Requirement(terms))
    }

    /// Why `r` does not meet the requirement, if it does not.
    pub fn refuses(&self, r: &HostReport) -> Option<String> {
        self.0.iter().find_map(|t| {
            let have = t.attr.of(r);
            (!t.op.holds(have, t.value)).then(|| {
                format!(
                    "{} is {have}, not {}{}",
                    t.attr.name(),
                    t.op.text(),
                    t.value
                )
            })
        })
    }
}

/// Some of a job's ranks on one host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// The host.
    pub name: String,
    /// Its agent's address (`host:port`).
    pub addr: String,
    /// Ranks placed there.
    pub ranks: u32,
}

/// A placement decision: the hosts chosen, and each host refused with its reason.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Placement {
    /// Hosts with ranks, most ranks first.
    pub chosen: Vec<Slot>,
    /// Hosts not used, and why.
    pub refused: Vec<(String, String)>,
}

/// Place `ranks` ranks on `hosts` (each with its last report, and whether it still reports):
/// hosts that are alive, whose owner is away and that meet `req` are eligible; each takes up
/// to its idle cores (at least one), the idlest first; ranks beyond every host's idle cores
/// are spread one at a time over the eligible hosts. No eligible host: `chosen` is empty.
pub fn place(ranks: u32, req: &Requirement, hosts: &[(Host, bool)]) -> Placement {
    let mut p = Placement::default();
    let mut ok: Vec<&HostReport> = Vec::new();
    for (h, alive) in hosts {
        let r = &h.report;
        let why = if !alive {
            Some("no heartbeat lately".to_string())
        } else if r.owner_busy() {
            Some(if r.owner_why.is_empty() {
                "its owner is active".to_string()
            } else {
                format!("its owner is active ({})", r.owner_why)
            })
        } else if r.addr.is_empty() {
            Some("its agent gave no address".to_string())
        } else {
            req.refuses(r)
        };
        match why {
            Some(w) => p.refused.push((r.name.clone(), w)),
            None => ok.push(r),
        }
    }
    if ok.is_empty() || ranks == 0 {
        return p;
    }
    ok.sort_by(|a, b| {
        b.idle_cpu
            .total_cmp(&a.idle_cpu)
            .then_with(|| a.name.cmp(&b.name))
    });
    let mut given = vec![0u32; ok.len()];
    let mut left = ranks;
    for (i, r) in ok.iter().enumerate() {
        let cap = (r.idle_cpu.floor() as u32).max(1);
        let n = cap.min(left);
        given[i] = n;
        left -= n;
    }
    let mut i = 0;
    while left > 0 {
        given[i % ok.len()] += 1;
        left -= 1;
        i += 1;
    }
    for (r, n) in ok.iter().zip(given) {
        if n > 0 {
            p.chosen.push(Slot {
                name: r.name.clone(),
                addr: r.addr.clone(),
                ranks: n,
            });
        } else {
            p.refused
                .push((r.name.clone(), "not needed: the job fits elsewhere".into()));
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(name: &str, idle: f64, owner: bool) -> Host {
        Host {
            report: HostReport {
                name: name.into(),
                addr: format!("127.0.0.1:{}", 7000 + name.len()),
                idle_cpu: idle,
                free_mem_mib: 1000,
                load: 2.0 - idle.min(2.0),
                owner_active: owner,
                ..Default::default()
            },
            last_seen_ms: 0,
        }
    }

    #[test]
    fn requirements_parse_and_say_why_a_host_is_refused() {
        let r = Requirement::parse("cpu>=2 & mem >= 512&load<1.5").unwrap();
        assert_eq!(r.0.len(), 3);
        let h = host("a", 1.0, false);
        assert_eq!(r.refuses(&h.report).unwrap(), "cpu is 1, not >=2");
        assert_eq!(r.refuses(&host("b", 2.0, false).report), None);
        assert_eq!(Requirement::parse("").unwrap(), Requirement::default());
        for (bad, why) in [
            ("cpu", "expected ATTR OP NUMBER"),
            ("cpu>=two", "not a number"),
            ("site=north", "not \"site\""),
            ("cpu=>2", "\">2\" is not a number"),
            ("cpu~2", "expected ATTR OP NUMBER"),
            ("cpu>=inf", "not a number"),
        ] {
            let e = Requirement::parse(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn placement_uses_idle_cores_first_and_refuses_busy_or_lost_hosts() {
        let hosts = [
            (host("n1", 2.0, false), true),
            (host("n2", 4.0, false), true),
            (host("n3", 8.0, true), true),
            (host("n4", 8.0, false), false),
            (host("n5", 0.3, false), true),
        ];
        let req = Requirement::parse("cpu>=1").unwrap();
        let p = place(5, &req, &hosts);
        let got: Vec<(&str, u32)> = p
            .chosen
            .iter()
            .map(|s| (s.name.as_str(), s.ranks))
            .collect();
        assert_eq!(got, [("n2", 4), ("n1", 1)]);
        let refused: Vec<&str> = p.refused.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(refused, ["n3", "n4", "n5"]);
        assert!(p.refused[0].1.contains("owner"));
        assert!(p.refused[1].1.contains("heartbeat"));
        assert!(p.refused[2].1.contains("cpu is 0.3"));
        // More ranks than idle cores: spread over the eligible hosts.
        let p = place(9, &req, &hosts);
        let got: Vec<(&str, u32)> = p
            .chosen
            .iter()
            .map(|s| (s.name.as_str(), s.ranks))
            .collect();
        assert_eq!(got, [("n2", 6), ("n1", 3)]);
        assert_eq!(p.chosen.iter().map(|s| s.ranks).sum::<u32>(), 9);
        // Nobody eligible: nothing chosen, every host has its reason.
        let p = place(2, &Requirement::parse("cpu>=100").unwrap(), &hosts);
        assert!(p.chosen.is_empty());
        assert_eq!(p.refused.len(), 5);
    }
}
