//! Properties and their algebra: accumulation ∇, satisfaction ⊆ and difference ∖
//! (digest 002 §3.3, Figs 4.5–4.7).
//!
//! A property is a quality (`Myrinet`), an exact value (`GFS=/ethfs`) or an accumulable value
//! (`CPU=2`, summed over a subtree). Accumulation ops live in a fixed, versioned table whose
//! indices are part of the wire encoding: 0 none (exact), 1 `SumI64`, 2 `MinI64`, 3 `MaxI64`.
//!
//! Names ending in `'` (occupied, `Mem'`) or `''` (reserved, `CPU''`) are usage counters: as a
//! requirement they are upper bounds (`Mem'=0` means "nothing occupied"), and a missing usage
//! counter counts as 0.

use crate::error::DirError;
use crate::gid::Gid;
use std::collections::{BTreeMap, BTreeSet, HashSet};

/// An accumulation operation (stable wire index in parentheses).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// Sum of integers (1).
    SumI64,
    /// Minimum (2).
    MinI64,
    /// Maximum (3).
    MaxI64,
}

impl Op {
    /// The op's stable index.
    pub fn index(self) -> u16 {
        match self {
            Op::SumI64 => 1,
            Op::MinI64 => 2,
            Op::MaxI64 => 3,
        }
    }

    /// The op with this index (0 = no op, i.e. exact).
    pub fn from_index(i: u16) -> Result<Option<Op>, DirError> {
        match i {
            0 => Ok(None),
            1 => Ok(Some(Op::SumI64)),
            2 => Ok(Some(Op::MinI64)),
            3 => Ok(Some(Op::MaxI64)),
            n => Err(DirError::Meu(format!(
                "unknown accumulation op index {n}; this build knows 0-3"
            ))),
        }
    }

    /// ∇ on two values.
    pub fn accumulate(self, a: i64, b: i64) -> i64 {
        match self {
            Op::SumI64 => a.saturating_add(b),
            Op::MinI64 => a.min(b),
            Op::MaxI64 => a.max(b),
        }
    }

    /// ⊆: does `offer` satisfy requirement `req`?
    pub fn satisfies(self, offer: i64, req: i64) -> bool {
        offer >= req
    }

    /// ∖: what remains of requirement `req` after `offer` (None: nothing remains).
    pub fn inverse(self, req: i64, offer: i64) -> Option<i64> {
        match self {
            Op::SumI64 => {
                let r = req.saturating_sub(offer);
                (r > 0).then_some(r)
            }
            Op::MinI64 | Op::MaxI64 => (offer < req).then_some(req),
        }
    }
}

/// A property's value.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PropValue {
    /// A quality: present or not.
    Flag,
    /// An exact value, matched bit for bit.
    Exact(String),
    /// An accumulable integer.
    Acc(Op, i64),
}

/// A named property.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Property {
    /// Name (`CPU`, `Myrinet`, `Mem'`).
    pub name: String,
    /// Value.
    pub value: PropValue,
}

impl Property {
    /// A quality.
    pub fn flag(name: impl Into<String>) -> Self {
        Property {
            name: name.into(),
            value: PropValue::Flag,
        }
    }

    /// An exact value.
    pub fn exact(name: impl Into<String>, v: impl Into<String>) -> Self {
        Property {
            name: name.into(),
            value: PropValue::Exact(v.into()),
        }
    }

    /// A summed integer.
    pub fn sum(name: impl Into<String>, v: i64) -> Self {
        Property {
            name: name.into(),
            value: PropValue::Acc(Op::SumI64, v),
        }
    }

    /// An accumulable integer with `op`.
    pub fn acc(name: impl Into<String>, op: Op, v: i64) -> Self {
        Property {
            name: name.into(),
            value: PropValue::Acc(op, v),
        }
    }

    /// The directory attribute value: `op_index u16 LE | payload` (payload: empty for a
    /// quality, UTF-8 for an exact value, `i64 LE` for an accumulable one).
    pub fn encode_value(&self) -> Vec<u8> {
        match &self.value {
            PropValue::Flag => 0u16.to_le_bytes().to_vec(),
            PropValue::Exact(s) => {
                let mut v = 0u16.to_le_bytes().to_vec();
                v.extend_from_slice(s.as_bytes());
                v
            }
            PropValue::Acc(op, x) => {
                let mut v = op.index().to_le_bytes().to_vec();
                v.extend_from_slice(&x.to_le_bytes());
                v
            }
        }
    }

    /// Decodes [`Property::encode_value`]'s output.
    pub fn decode_value(name: &str, b: &[u8]) -> Result<Property, DirError> {
        if b.len() < 2 {
            return Err(DirError::Meu(format!(
                "property {name:?}: value shorter than its 2-byte op index"
            )));
        }
        let op = Op::from_index(u16::from_le_bytes([b[0], b[1]]))?;
        let payload = &b[2..];
        let value = match op {
            None if payload.is_empty() => PropValue::Flag,
            None => PropValue::Exact(String::from_utf8(payload.to_vec()).map_err(|_| {
                DirError::Meu(format!("property {name:?}: exact value is not UTF-8"))
            })?),
            Some(op) => {
                let a: [u8; 8] = payload.try_into().map_err(|_| {
                    DirError::Meu(format!(
                        "property {name:?}: accumulable value must be 8 bytes, got {}",
                        payload.len()
                    ))
                })?;
                PropValue::Acc(op, i64::from_le_bytes(a))
            }
        };
        Ok(Property {
            name: name.to_string(),
            value,
        })
    }
}

/// True for usage counters (`X'`, `X''`).
pub fn is_usage(name: &str) -> bool {
    name.ends_with('\'')
}

/// A bag of properties tagged with the entity they come from, before ∇.
/// Tagging keeps distinct-but-equal values apart while the same (property, origin)
/// arriving twice (through aliases) counts once.
pub type Bag = HashSet<(Property, Gid)>;

/// An accumulated property set (the result of ∇, or a requirement).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PropSet {
    /// Qualities and exact values: `(name, value)`, value `None` for a quality.
    pub exact: BTreeSet<(String, Option<String>)>,
    /// Accumulable values by name.
    pub acc: BTreeMap<String, (Op, i64)>,
}

impl PropSet {
    /// An empty set.
    pub fn new() -> Self {
        PropSet::default()
    }

    /// A set from properties (equal names accumulate).
    pub fn of(props: impl IntoIterator<Item = Property>) -> Self {
        let mut s = PropSet::new();
        for p in props {
            s.add(&p);
        }
        s
    }

    /// Adds one property (accumulating with an existing one of the same name; on an op
    /// mismatch the first op wins).
    pub fn add(&mut self, p: &Property) {
        match &p.value {
            PropValue::Flag => {
                self.exact.insert((p.name.clone(), None));
            }
            PropValue::Exact(v) => {
                self.exact.insert((p.name.clone(), Some(v.clone())));
            }
            PropValue::Acc(op, v) => {
                self.acc
                    .entry(p.name.clone())
                    .and_modify(|(o, x)| *x = o.accumulate(*x, *v))
                    .or_insert((*op, *v));
            }
        }
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.acc.is_empty()
    }

    /// The accumulated value of `name`.
    pub fn get(&self, name: &str) -> Option<i64> {
        self.acc.get(name).map(|(_, v)| *v)
    }

    /// True when the quality or exact value is present.
    pub fn has(&self, name: &str, value: Option<&str>) -> bool {
        self.exact
            .contains(&(name.to_string(), value.map(str::to_string)))
    }

    /// ⊆: `self` (a requirement) is satisfied by `offer`.
    pub fn satisfied_by(&self, offer: &PropSet) -> bool {
        self.exact.iter().all(|e| offer.exact.contains(e))
            && self.acc.iter().all(|(name, (op, req))| {
                if is_usage(name) {
                    offer.get(name).unwrap_or(0) <= *req
                } else {
                    offer
                        .acc
                        .get(name)
                        .is_some_and(|(_, o)| op.satisfies(*o, *req))
                }
            })
    }

    /// ∖: `self` minus `sub`. Accumulables are reduced by the op's inverse, exact values
    /// present in `sub` are removed, names absent from `self` are ignored. Usage bounds
    /// already met are removed.
    pub fn minus(&self, sub: &PropSet) -> PropSet {
        let exact = self
            .exact
            .iter()
            .filter(|e| !sub.exact.contains(*e))
            .cloned()
            .collect();
        let acc = self
            .acc
            .iter()
            .filter_map(|(name, (op, v))| {
                if is_usage(name) {
                    let used = sub.get(name).unwrap_or(0);
                    return (used > *v).then(|| (name.clone(), (*op, *v)));
                }
                match sub.acc.get(name) {
                    None => Some((name.clone(), (*op, *v))),
                    Some((_, o)) => op.inverse(*v, *o).map(|r| (name.clone(), (*op, r))),
                }
            })
            .collect();
        PropSet { exact, acc }
    }
}

/// ∇ over a tagged bag.
pub fn accumulate(bag: &Bag) -> PropSet {
    // Deterministic order regardless of hashing.
    let mut items: Vec<&(Property, Gid)> = bag.iter().collect();
    items.sort();
    let mut s = PropSet::new();
    for (p, _) in items {
        s.add(p);
    }
    s
}

impl std::fmt::Display for PropSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts: Vec<String> = vec![];
        for (n, v) in &self.exact {
            parts.push(match v {
                None => n.clone(),
                Some(v) => format!("{n}={v}"),
            });
        }
        for (n, (op, v)) in &self.acc {
            parts.push(match op {
                Op::SumI64 => format!("{n}={v}"),
                Op::MinI64 => format!("{n}=min:{v}"),
                Op::MaxI64 => format!("{n}=max:{v}"),
            });
        }
        write!(f, "{{{}}}", parts.join(", "))
    }
}
