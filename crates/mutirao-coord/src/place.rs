//! Pure placement logic: requirement expressions over agents' reports, and a first placement
//! of a job's ranks on the eligible hosts. No I/O; tested alone.
//!
//! A requirement is terms joined by `&`: `ATTR OP VALUE`, with ATTR one of `cpu` (idle
//! cores), `mem` (free MiB) and `load` (1-minute load), `name` (the host's), or a property the
//! host's agent declares (`site`, `arch`, …: `mutirao agent --site north --prop arch=x86_64`);
//! OP one of `>= <= > < = !=`. Example: `cpu>=2 & mem>=1024 & load<1.5 & site=north`. The
//! numeric attributes compare numbers; a property compares as a number when both sides are
//! numbers, else as text (`=`/`!=` only); a host without the property does not meet a term
//! that names it (except `!=`).

use crate::{Host, HostReport};
use std::collections::HashMap;

/// An attribute of a host report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attr {
    /// Idle cores.
    Cpu,
    /// Free memory, MiB.
    Mem,
    /// 1-minute load.
    Load,
    /// The host's name.
    Name,
    /// A property its agent declares.
    Prop(String),
}

/// What a term compares with.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A number.
    Num(f64),
    /// Text (property values that are not numbers).
    Text(String),
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
#[derive(Debug, Clone, PartialEq)]
pub struct Term {
    /// What is compared.
    pub attr: Attr,
    /// How.
    pub op: Op,
    /// With what.
    pub value: Value,
}

/// A parsed requirement: every term must hold.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Requirement(pub Vec<Term>);

impl Attr {
    fn name(&self) -> &str {
        match self {
            Attr::Cpu => "cpu",
            Attr::Mem => "mem",
            Attr::Load => "load",
            Attr::Name => "name",
            Attr::Prop(p) => p,
        }
    }
    /// The host's value, `None` when it does not declare the property.
    fn of(&self, r: &HostReport) -> Option<Value> {
        Some(match self {
            Attr::Cpu => Value::Num(r.idle_cpu),
            Attr::Mem => Value::Num(r.free_mem_mib as f64),
            Attr::Load => Value::Num(r.load),
            Attr::Name => Value::Text(r.name.clone()),
            Attr::Prop(p) => Value::parse(r.props.get(p)?),
        })
    }
}

impl Value {
    fn parse(v: &str) -> Value {
        match v.trim().parse::<f64>() {
            Ok(x) if x.is_finite() => Value::Num(x),
            _ => Value::Text(v.trim().to_string()),
        }
    }
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Num(x) => write!(f, "{x}"),
            Value::Text(t) => write!(f, "{t:?}"),
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
    fn holds_on(self, a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Num(a), Value::Num(b)) => self.holds(*a, *b),
            (a, b) => match self {
                Op::Eq => a == b,
                Op::Ne => a != b,
                // Parsing refuses an ordering against text; a host's text against a number
                // does not compare.
                _ => false,
            },
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
                "name" => Attr::Name,
                p if !p.is_empty()
                    && p
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.') =>
                {
                    Attr::Prop(p.to_string())
                }
                other => {
                    return Err(format!(
                        "term {t:?}: {other:?} is not an attribute: cpu, mem, load, name, or a property agents declare (letters, digits, _ - .)"
                    ))
                }
            };
            let raw_value = value.trim();
            if raw_value.is_empty() {
                return Err(format!("term {t:?}: no value after the comparison"));
            }
            let value = match attr {
                Attr::Cpu | Attr::Mem | Attr::Load => Value::Num(
                    raw_value
                        .parse()
                        .ok()
                        .filter(|v: &f64| v.is_finite())
                        .ok_or_else(|| format!("term {t:?}: {raw_value:?} is not a number"))?,
                ),
                _ => Value::parse(raw_value),
            };
            if matches!(value, Value::Text(_)) && !matches!(op, Op::Eq | Op::Ne) {
                return Err(format!(
                    "term {t:?}: {raw_value:?} is text: compare it with = or !="
                ));
            }
            terms.push(Term { attr, op, value });
        }
        Ok(Requirement(terms))
    }

    /// Why `r` does not meet the requirement, if it does not.
    pub fn refuses(&self, r: &HostReport) -> Option<String> {
        self.0.iter().find_map(|t| match t.attr.of(r) {
            None if t.op == Op::Ne => None,
            None => Some(format!(
                "it declares no {} (its agent's --site/--prop)",
                t.attr.name()
            )),
            Some(have) => (!t.op.holds_on(&have, &t.value)).then(|| {
                format!(
                    "{} is {have}, not {}{}",
                    t.attr.name(),
                    t.op.text(),
                    t.value
                )
            }),
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
    /// Hosts with ranks, in the order of preference.
    pub chosen: Vec<Slot>,
    /// Hosts not used, and why.
    pub refused: Vec<(String, String)>,
    /// The eligible hosts in the order of preference, each with what ordered it.
    pub order: Vec<String>,
    /// With a model: the predicted makespan of this placement and of the idle-cores-first
    /// placement on the same hosts (units of one rank's work on a speed-1 core).
    pub predicted: Option<(f64, f64)>,
}

/// What placement may prefer besides the reports: the usage history and a calibrated model.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Prefs {
    /// Host → probability it stays idle for the next hours (usage history); a host not named
    /// scores ½.
    pub stay_idle: HashMap<String, f64>,
    /// Host → relative speed (a `mutirao-model/1` model); `None`: no model. Hosts the model
    /// does not name take its slowest speed.
    pub speed: Option<HashMap<String, f64>>,
}

impl Prefs {
    fn stay(&self, h: &str) -> f64 {
        self.stay_idle.get(h).copied().unwrap_or(0.5)
    }

    /// A host's speed under the model, and whether the model names it.
    pub fn speed_of(&self, h: &str) -> Option<(f64, bool)> {
        let m = self.speed.as_ref()?;
        match m.get(h) {
            Some(&v) => Some((v, true)),
            None => {
                let slowest = m.values().copied().fold(f64::INFINITY, f64::min);
                Some((if slowest.is_finite() { slowest } else { 1.0 }, false))
            }
        }
    }
}

/// Place `ranks` ranks on `hosts` (each with its last report, and whether it still reports):
/// hosts that are alive, whose owner is away and that meet `req` are eligible; each takes up
/// to its idle cores (at least one), the idlest first; ranks beyond every host's idle cores
/// are spread one at a time over the eligible hosts. No eligible host: `chosen` is empty.
pub fn place(ranks: u32, req: &Requirement, hosts: &[(Host, bool)]) -> Placement {
    place_with(ranks, req, hosts, &Prefs::default())
}

/// The SPMD makespan of `counts` ranks on hosts of `slots` cores and relative `speed`, in
/// units of one rank's work on a speed-1 core: each host takes `max(1, ranks/slots)/speed`
/// (ranks beyond its cores share them), the job the slowest host's.
pub fn makespan(counts: &[u32], slots: &[u32], speed: &[f64]) -> f64 {
    counts
        .iter()
        .zip(slots)
        .zip(speed)
        .filter(|((&r, _), _)| r > 0)
        .map(|((&r, &c), &v)| (r as f64 / c.max(1) as f64).max(1.0) / v)
        .fold(0.0, f64::max)
}

/// [`place`] with preferences. Eligible hosts are ordered by the probability they stay idle
/// (rounded to tenths, so that noise does not decide), then idle cores, then name. Without a
/// model, each takes up to its idle cores in that order, the rest spread one at a time. With
/// a model, each rank goes where the job's predicted makespan ([`makespan`]) grows least —
/// the fastest hosts' free cores first, then speed-proportionally — ties in that order.
pub fn place_with(
    ranks: u32,
    req: &Requirement,
    hosts: &[(Host, bool)],
    prefs: &Prefs,
) -> Placement {
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
    let tenths = |h: &str| (prefs.stay(h) * 10.0).round() as i64;
    ok.sort_by(|a, b| {
        tenths(&b.name)
            .cmp(&tenths(&a.name))
            .then_with(|| b.idle_cpu.total_cmp(&a.idle_cpu))
            .then_with(|| a.name.cmp(&b.name))
    });
    let slots: Vec<u32> = ok
        .iter()
        .map(|r| (r.idle_cpu.floor() as u32).max(1))
        .collect();
    let mut given = vec![0u32; ok.len()];
    if prefs.speed.is_some() {
        let speed: Vec<f64> = ok
            .iter()
            .map(|r| prefs.speed_of(&r.name).map_or(1.0, |s| s.0))
            .collect();
        for _ in 0..ranks {
            // The host whose time with one more rank is least (first in order on ties).
            let cost = |i: usize| ((given[i] + 1) as f64 / slots[i] as f64).max(1.0) / speed[i];
            let best = (0..ok.len())
                .min_by(|&a, &b| cost(a).total_cmp(&cost(b)).then(a.cmp(&b)))
                .unwrap_or(0);
            given[best] += 1;
        }
        // Without the model's guidance: the same hosts, idle cores first, for comparison.
        let plain = fill_by_slots(ranks, &slots);
        p.predicted = Some((
            makespan(&given, &slots, &speed),
            makespan(&plain, &slots, &speed),
        ));
    } else {
        given = fill_by_slots(ranks, &slots);
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
    p.order = ok
        .iter()
        .map(|r| {
            let mut s = format!("{} (stays idle {:.2}", r.name, prefs.stay(&r.name));
            if let Some((v, known)) = prefs.speed_of(&r.name) {
                s.push_str(&format!(", speed {v}"));
                if !known {
                    s.push_str(" — not in the model: its slowest");
                }
            }
            s.push(')');
            s
        })
        .collect();
    p
}

/// Up to each host's slots in order, the rest spread one at a time.
fn fill_by_slots(ranks: u32, slots: &[u32]) -> Vec<u32> {
    let mut given = vec![0u32; slots.len()];
    if slots.is_empty() {
        return given;
    }
    let mut left = ranks;
    for (i, &cap) in slots.iter().enumerate() {
        let n = cap.min(left);
        given[i] = n;
        left -= n;
    }
    let mut i = 0;
    while left > 0 {
        given[i % slots.len()] += 1;
        left -= 1;
        i += 1;
    }
    given
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
            ("site>=north", "is text: compare it with = or !="),
            ("site=", "no value"),
            ("si te=north", "is not an attribute"),
            ("cpu=>2", "\">2\" is not a number"),
            ("cpu~2", "expected ATTR OP NUMBER"),
            ("cpu>=inf", "not a number"),
        ] {
            let e = Requirement::parse(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn declared_properties_and_names_are_matched() {
        let mut north = host("n1", 2.0, false).report;
        north.props.insert("site".into(), "north".into());
        north.props.insert("gpu".into(), "2".into());
        let mut south = host("s1", 2.0, false).report;
        south.props.insert("site".into(), "south".into());
        let bare = host("x1", 2.0, false).report;
        let r = Requirement::parse("cpu>=2 & site=north").unwrap();
        assert_eq!(r.refuses(&north), None);
        assert_eq!(
            r.refuses(&south).unwrap(),
            "site is \"south\", not =\"north\""
        );
        assert!(r.refuses(&bare).unwrap().contains("declares no site"));
        // != holds for a host without the property; numbers compare as numbers.
        let r = Requirement::parse("site!=south & gpu>=1").unwrap();
        assert_eq!(r.refuses(&north), None);
        assert!(r.refuses(&south).is_some());
        assert!(r.refuses(&bare).unwrap().contains("declares no gpu"));
        let r = Requirement::parse("name=s1").unwrap();
        assert_eq!(r.refuses(&south), None);
        assert!(r.refuses(&north).is_some());
        // A host's text against a numeric term never matches, and is said.
        let mut odd = bare.clone();
        odd.props.insert("gpu".into(), "many".into());
        assert!(Requirement::parse("gpu>=1")
            .unwrap()
            .refuses(&odd)
            .is_some());
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

    fn prefs(stay: &[(&str, f64)], speed: Option<&[(&str, f64)]>) -> Prefs {
        Prefs {
            stay_idle: stay.iter().map(|(h, p)| (h.to_string(), *p)).collect(),
            speed: speed.map(|s| s.iter().map(|(h, v)| (h.to_string(), *v)).collect()),
        }
    }

    fn got(p: &Placement) -> Vec<(&str, u32)> {
        p.chosen
            .iter()
            .map(|s| (s.name.as_str(), s.ranks))
            .collect()
    }

    #[test]
    fn hosts_likely_to_stay_idle_come_first() {
        let hosts = [
            (host("n1", 4.0, false), true),
            (host("n2", 2.0, false), true),
            (host("n3", 2.0, false), true),
        ];
        let req = Requirement::default();
        // No history: the idlest first.
        assert_eq!(got(&place(2, &req, &hosts)), [("n1", 2)]);
        // n2's owner is usually away now, n1's usually back within the hour.
        let pr = prefs(&[("n1", 0.2), ("n2", 0.9)], None);
        let p = place_with(3, &req, &hosts, &pr);
        assert_eq!(got(&p), [("n2", 2), ("n3", 1)]);
        assert!(
            p.order[0].starts_with("n2 (stays idle 0.90"),
            "{:?}",
            p.order
        );
        assert!(p
            .refused
            .iter()
            .any(|(h, w)| h == "n1" && w.contains("not needed")));
        // Probabilities in the same tenth do not outweigh idle cores.
        let pr = prefs(&[("n1", 0.51), ("n2", 0.54)], None);
        assert_eq!(got(&place_with(2, &req, &hosts, &pr)), [("n1", 2)]);
        assert_eq!(place_with(2, &req, &hosts, &pr).predicted, None);
    }

    #[test]
    fn a_model_sends_ranks_to_faster_hosts_and_predicts_the_makespan() {
        let req = Requirement::default();
        // The slow host is the idlest: without the model it takes both ranks.
        let hosts = [
            (host("slow", 4.0, false), true),
            (host("fast", 2.0, false), true),
        ];
        let model = [("slow", 1.0), ("fast", 2.0)];
        assert_eq!(got(&place(2, &req, &hosts)), [("slow", 2)]);
        let p = place_with(2, &req, &hosts, &prefs(&[], Some(&model)));
        assert_eq!(got(&p), [("fast", 2)]);
        assert_eq!(p.predicted, Some((0.5, 1.0)));
        // More ranks than cores: speed-proportional (4 : 1), not one at a time.
        let hosts = [(host("a", 1.0, false), true), (host("b", 1.0, false), true)];
        let p = place_with(
            5,
            &req,
            &hosts,
            &prefs(&[], Some(&[("a", 4.0), ("b", 1.0)])),
        );
        assert_eq!(got(&p), [("a", 4), ("b", 1)]);
        assert_eq!(p.predicted, Some((1.0, 2.0)));
        // A host the model does not name counts as its slowest, and says so.
        let p = place_with(
            1,
            &req,
            &hosts,
            &prefs(&[], Some(&[("a", 4.0), ("c", 0.5)])),
        );
        assert_eq!(got(&p), [("a", 1)]);
        assert!(
            p.order[1].contains("speed 0.5 — not in the model"),
            "{:?}",
            p.order
        );
        assert_eq!(makespan(&[0, 3], &[4, 2], &[9.0, 1.5]), 1.0);
    }
}
