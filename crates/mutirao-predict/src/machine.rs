//! The machine model (thesis §2.3, tool CRES): per machine, one interval per operation × data
//! type (seconds per single operation), a relative performance factor `W_p`, and send costs
//! between machines; plus the thesis's Appendix-B text format.
//!
//! Machine 0 is the coordinator (it runs the `c = 1` batches); workers are 1, 2, ….

use crate::interval::Interval;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::str::FromStr;

/// Errors in machine models and in the Appendix-B text.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MachineError {
    /// A line of the Appendix-B text could not be read.
    #[error("line {line}, column {col}: {msg}")]
    Syntax {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        col: usize,
        /// What is wrong and what was expected.
        msg: String,
    },
    /// A cost name is not `<op>` or `<op>_<type>` with known names.
    #[error("unknown cost name {0:?}: expected <op> or <op>_<type> with op in {ops} and type in {types}", ops = Op::NAMES.join("|"), types = DataType::NAMES.join("|"))]
    UnknownCost(String),
    /// No value (and no fallback) for a cost on a machine.
    #[error("machine {machine} has no value for {key} and no fallback applies; benchmark it (examples/cres.rs) or add `inter_{key}[{machine}]=[lo;hi]`")]
    MissingCost {
        /// Machine index.
        machine: usize,
        /// The cost wanted.
        key: CostKey,
    },
    /// No send cost between two machines in either direction.
    #[error("no send cost between machines {from} and {to} (either direction); add `inter_send[{from}][{to}](SIZE)=[lo;hi]`")]
    MissingSend {
        /// Sender.
        from: usize,
        /// Receiver.
        to: usize,
    },
    /// A machine index is referenced that the model does not have.
    #[error("machine {0} is not in the machine model")]
    UnknownMachine(usize),
    /// A performance factor is missing or invalid.
    #[error("machine {machine}: performance factor W = {w:?}; every worker needs a finite W > 0 (add `W[{machine}]=…`)")]
    BadWeight {
        /// Machine index.
        machine: usize,
        /// The value found, if any.
        w: Option<f64>,
    },
    /// The JSON form could not be read.
    #[error("machine model JSON: {0}")]
    Json(String),
}

/// A basic operation whose cost CRES benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Op {
    /// `+`
    Sum,
    /// `-`
    Sub,
    /// `*`
    Mpy,
    /// `/`
    Div,
    /// `%`
    Mod,
    /// `== != < > <= >=`
    Compare,
    /// Store into a variable.
    Assign,
    /// Read a variable.
    Access,
    /// Read or write an array element.
    ArrayAccess,
    /// Type conversion.
    Cast,
    /// One trip of an empty loop.
    LoopIteration,
    /// Heap allocation.
    Alloc,
    /// Non-inlined call.
    Call,
    /// Unary minus.
    Neg,
    /// Logical not.
    Not,
    /// Logical and.
    And,
    /// Logical or.
    Or,
    /// Bitwise and/or/xor.
    Bit,
    /// Shift.
    Shift,
}

impl Op {
    /// Every op, in the order of [`Op::NAMES`].
    pub const ALL: [Op; 19] = [
        Op::Sum,
        Op::Sub,
        Op::Mpy,
        Op::Div,
        Op::Mod,
        Op::Compare,
        Op::Assign,
        Op::Access,
        Op::ArrayAccess,
        Op::Cast,
        Op::LoopIteration,
        Op::Alloc,
        Op::Call,
        Op::Neg,
        Op::Not,
        Op::And,
        Op::Or,
        Op::Bit,
        Op::Shift,
    ];
    /// Text names, as in `inter_<op>_<type>`.
    pub const NAMES: [&'static str; 19] = [
        "sum",
        "sub",
        "mpy",
        "div",
        "mod",
        "compare",
        "assign",
        "access",
        "array_access",
        "cast",
        "loop_iteration",
        "alloc",
        "call",
        "neg",
        "not",
        "and",
        "or",
        "bit",
        "shift",
    ];

    /// The op's text name.
    pub fn name(self) -> &'static str {
        Op::NAMES[Op::ALL.iter().position(|o| *o == self).unwrap_or(0)]
    }

    /// Parse a text name.
    pub fn from_name(s: &str) -> Option<Op> {
        Op::NAMES.iter().position(|n| *n == s).map(|i| Op::ALL[i])
    }
}

/// Data types (thesis Tab. 4.2, plus `obj` for references).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DataType {
    /// 8-bit integer.
    Byte,
    /// 16-bit integer.
    Short,
    /// 32-bit integer.
    Int,
    /// 64-bit integer.
    Long,
    /// 32-bit float.
    Float,
    /// 64-bit float.
    Double,
    /// Character.
    Char,
    /// Boolean.
    Boolean,
    /// Object reference.
    Obj,
}

impl DataType {
    /// Every type, in the order of [`DataType::NAMES`].
    pub const ALL: [DataType; 9] = [
        DataType::Byte,
        DataType::Short,
        DataType::Int,
        DataType::Long,
        DataType::Float,
        DataType::Double,
        DataType::Char,
        DataType::Boolean,
        DataType::Obj,
    ];
    /// Text names.
    pub const NAMES: [&'static str; 9] = [
        "byte", "short", "int", "long", "float", "double", "char", "boolean", "obj",
    ];

    /// The type's text name.
    pub fn name(self) -> &'static str {
        DataType::NAMES[DataType::ALL.iter().position(|o| *o == self).unwrap_or(0)]
    }

    /// Parse a text name.
    pub fn from_name(s: &str) -> Option<DataType> {
        DataType::NAMES
            .iter()
            .position(|n| *n == s)
            .map(|i| DataType::ALL[i])
    }
}

/// A cost parameter: an operation, optionally on a data type (`access`, `sum_int`, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct CostKey {
    /// The operation.
    pub op: Op,
    /// The data type, if the cost is typed.
    pub ty: Option<DataType>,
}

impl CostKey {
    /// A typed key.
    pub fn typed(op: Op, ty: DataType) -> CostKey {
        CostKey { op, ty: Some(ty) }
    }
    /// An untyped key.
    pub fn untyped(op: Op) -> CostKey {
        CostKey { op, ty: None }
    }

    /// The keys tried, in order, when `self` has no benchmarked value on a machine
    /// (the first is `self`). Documented policy, every use is reported:
    /// 1. the same op on a related type: `long/short/byte/char/boolean/obj → int`,
    ///    `float ↔ double`, then the untyped op (`access_double → access`);
    /// 2. an untyped op takes the thesis's float costing (`assign → assign_float`), then int;
    /// 3. a related op: `sub → sum`, `mod → div`, `compare → sum_int`, `neg → sub/sum`,
    ///    `not/and/or/bit/shift → sum_int`.
    ///
    /// `alloc`, `call` and `loop_iteration` have no related op: they must be benchmarked.
    pub fn fallback_chain(self) -> Vec<CostKey> {
        let types: Vec<Option<DataType>> = match self.ty {
            Some(DataType::Long)
            | Some(DataType::Short)
            | Some(DataType::Byte)
            | Some(DataType::Char)
            | Some(DataType::Boolean)
            | Some(DataType::Obj) => vec![self.ty, Some(DataType::Int), None],
            Some(DataType::Float) => vec![self.ty, Some(DataType::Double), None],
            Some(DataType::Double) => vec![self.ty, Some(DataType::Float), None],
            Some(DataType::Int) => vec![self.ty, None],
            None => vec![None, Some(DataType::Float), Some(DataType::Int)],
        };
        let ops: Vec<(Op, Option<Option<DataType>>)> = match self.op {
            Op::Sub => vec![(Op::Sub, None), (Op::Sum, None)],
            Op::Mod => vec![(Op::Mod, None), (Op::Div, None)],
            Op::Compare => vec![(Op::Compare, None), (Op::Sum, Some(Some(DataType::Int)))],
            Op::Neg => vec![(Op::Neg, None), (Op::Sub, None), (Op::Sum, None)],
            Op::Not | Op::And | Op::Or | Op::Bit | Op::Shift => {
                vec![(self.op, None), (Op::Sum, Some(Some(DataType::Int)))]
            }
            o => vec![(o, None)],
        };
        let mut out: Vec<CostKey> = Vec::new();
        for (op, forced) in ops {
            let tys: Vec<Option<DataType>> = match forced {
                Some(t) => vec![t],
                None => types.clone(),
            };
            for ty in tys {
                let k = CostKey { op, ty };
                if !out.contains(&k) {
                    out.push(k);
                }
            }
        }
        out
    }
}

impl fmt::Display for CostKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ty {
            Some(t) => write!(f, "{}_{}", self.op.name(), t.name()),
            None => f.write_str(self.op.name()),
        }
    }
}

impl FromStr for CostKey {
    type Err = MachineError;
    /// Parse `op` or `op_type` (e.g. `array_access`, `sum_int`, `assign_obj`).
    fn from_str(s: &str) -> Result<CostKey, MachineError> {
        if let Some(op) = Op::from_name(s) {
            return Ok(CostKey::untyped(op));
        }
        if let Some((head, tail)) = s.rsplit_once('_') {
            if let (Some(op), Some(ty)) = (Op::from_name(head), DataType::from_name(tail)) {
                return Ok(CostKey::typed(op, ty));
            }
        }
        Err(MachineError::UnknownCost(s.to_string()))
    }
}

impl From<CostKey> for String {
    fn from(k: CostKey) -> String {
        k.to_string()
    }
}

impl TryFrom<String> for CostKey {
    type Error = MachineError;
    fn try_from(s: String) -> Result<CostKey, MachineError> {
        s.parse()
    }
}

/// One machine: its costs, performance factor and name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// Index (0 = coordinator).
    pub index: usize,
    /// Host name, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Relative performance factor `W_p` (Eq. 3.5: fastest = 1). The coordinator has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub w: Option<f64>,
    /// Seconds per operation, as an interval.
    pub costs: BTreeMap<CostKey, Interval>,
}

/// A measured send cost: `inter_send[from][to](size) = cost` (in the model's send unit).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SendPoint {
    /// Sender index.
    pub from: usize,
    /// Receiver index.
    pub to: usize,
    /// Message size (bytes, or the thesis's unstated unit).
    pub size: f64,
    /// Cost interval, in units of `send_unit_s` seconds.
    pub cost: Interval,
}

/// A fallback taken while resolving a cost: reported with every prediction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fallback {
    /// Machine index.
    pub machine: usize,
    /// What the model asked for (`compare`, or `send[1][0](879)`).
    pub wanted: String,
    /// What was used instead.
    pub used: String,
}

/// Send points grouped by `(from, to)` ([`MachineModel::send_index`]).
#[derive(Debug, Clone, Default)]
pub struct SendIndex<'a>(HashMap<(usize, usize), Vec<&'a SendPoint>>);

/// The machine model of one JoiN group: machine 0 is the coordinator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MachineModel {
    /// Seconds per unit of the send costs. The thesis never states the unit of `inter_send`
    /// (its magnitudes suggest milliseconds); the Appendix-B importer sets 1e-3.
    pub send_unit_s: f64,
    /// The machines, by index.
    pub machines: Vec<Machine>,
    /// Measured send costs.
    #[serde(default)]
    pub sends: Vec<SendPoint>,
}

impl MachineModel {
    /// Read the native JSON form.
    pub fn from_json(text: &str) -> Result<MachineModel, MachineError> {
        let m: MachineModel =
            serde_json::from_str(text).map_err(|e| MachineError::Json(e.to_string()))?;
        m.validate()?;
        Ok(m)
    }

    /// Write the native JSON form.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Check indices are unique and weights, costs and send points valid.
    pub fn validate(&self) -> Result<(), MachineError> {
        let mut seen = std::collections::BTreeSet::new();
        for m in &self.machines {
            if !seen.insert(m.index) {
                return Err(MachineError::Json(format!(
                    "machine index {} appears twice",
                    m.index
                )));
            }
            if let Some(w) = m.w {
                if !(w.is_finite() && w > 0.0) {
                    return Err(MachineError::BadWeight {
                        machine: m.index,
                        w: Some(w),
                    });
                }
            }
            for (k, iv) in &m.costs {
                if Interval::new(iv.lo, iv.hi).is_err() || iv.lo < 0.0 {
                    return Err(MachineError::Json(format!(
                        "machine {}: {k} = [{};{}] is not a valid non-negative interval",
                        m.index, iv.lo, iv.hi
                    )));
                }
            }
        }
        for s in &self.sends {
            if Interval::new(s.cost.lo, s.cost.hi).is_err() || s.cost.lo < 0.0 || s.size < 0.0 {
                return Err(MachineError::Json(format!(
                    "send[{}][{}]({}) = [{};{}] is not valid (non-negative size and interval)",
                    s.from, s.to, s.size, s.cost.lo, s.cost.hi
                )));
            }
        }
        if !(self.send_unit_s.is_finite() && self.send_unit_s > 0.0) {
            return Err(MachineError::Json(format!(
                "send_unit_s = {} must be > 0",
                self.send_unit_s
            )));
        }
        Ok(())
    }

    /// The machine with this index.
    pub fn machine(&self, index: usize) -> Result<&Machine, MachineError> {
        self.machines
            .iter()
            .find(|m| m.index == index)
            .ok_or(MachineError::UnknownMachine(index))
    }

    fn machine_mut(&mut self, index: usize) -> &mut Machine {
        let pos = match self.machines.iter().position(|m| m.index == index) {
            Some(p) => p,
            None => {
                self.machines.push(Machine {
                    index,
                    name: None,
                    w: None,
                    costs: BTreeMap::new(),
                });
                self.machines.len() - 1
            }
        };
        &mut self.machines[pos]
    }

    /// The cost of `key` on machine `m`, following [`CostKey::fallback_chain`]; the second
    /// value says which fallback was used, if any.
    pub fn cost(
        &self,
        m: &Machine,
        key: CostKey,
    ) -> Result<(Interval, Option<Fallback>), MachineError> {
        for (i, k) in key.fallback_chain().into_iter().enumerate() {
            if let Some(iv) = m.costs.get(&k) {
                let fb = (i > 0).then(|| Fallback {
                    machine: m.index,
                    wanted: key.to_string(),
                    used: k.to_string(),
                });
                return Ok((*iv, fb));
            }
        }
        Err(MachineError::MissingCost {
            machine: m.index,
            key,
        })
    }

    /// The cost in seconds of sending `size` from `from` to `to`.
    ///
    /// Size model: with two or more measured sizes for the pair, linear interpolation between
    /// neighbouring sizes (latency + size × per-unit, bound by bound), extrapolated with the
    /// nearest segment's slope (never below 0); with one measured size, that cost for every size
    /// (reported as a fallback). If the pair has no measurement, the reverse direction is used
    /// (the thesis's `send_{p→q} = send_{q→p}` assumption, reported as a fallback).
    pub fn send_cost(
        &self,
        from: usize,
        to: usize,
        size: f64,
    ) -> Result<(Interval, Option<Fallback>), MachineError> {
        let pts = |a: usize, b: usize| -> Vec<&SendPoint> {
            self.sends
                .iter()
                .filter(|s| s.from == a && s.to == b)
                .collect()
        };
        self.send_cost_of(from, to, size, pts(from, to), pts(to, from))
    }

    /// The send points grouped by `(from, to)`, for [`MachineModel::send_cost_indexed`]:
    /// build it once when many sends are costed (one evaluation over many workers).
    pub fn send_index(&self) -> SendIndex<'_> {
        let mut m: HashMap<(usize, usize), Vec<&SendPoint>> = HashMap::new();
        for s in &self.sends {
            m.entry((s.from, s.to)).or_default().push(s);
        }
        SendIndex(m)
    }

    /// [`MachineModel::send_cost`] through an index made by [`MachineModel::send_index`].
    pub fn send_cost_indexed(
        &self,
        index: &SendIndex<'_>,
        from: usize,
        to: usize,
        size: f64,
    ) -> Result<(Interval, Option<Fallback>), MachineError> {
        let get = |a: usize, b: usize| index.0.get(&(a, b)).cloned().unwrap_or_default();
        self.send_cost_of(from, to, size, get(from, to), get(to, from))
    }

    fn send_cost_of(
        &self,
        from: usize,
        to: usize,
        size: f64,
        direct: Vec<&SendPoint>,
        reverse: Vec<&SendPoint>,
    ) -> Result<(Interval, Option<Fallback>), MachineError> {
        let (mut pts, reversed) = if direct.is_empty() {
            (reverse, true)
        } else {
            (direct, false)
        };
        if pts.is_empty() {
            return Err(MachineError::MissingSend { from, to });
        }
        pts.sort_by(|a, b| a.size.total_cmp(&b.size));
        let wanted = format!("send[{from}][{to}]({size})");
        let (iv, note) = if let Some(p) = pts.iter().find(|p| p.size == size) {
            (p.cost, None)
        } else if pts.len() == 1 {
            (
                pts[0].cost,
                Some(format!("single measured size {}", pts[0].size)),
            )
        } else {
            let seg = match pts.iter().position(|p| p.size > size) {
                Some(0) => (pts[0], pts[1]),
                Some(i) => (pts[i - 1], pts[i]),
                None => (pts[pts.len() - 2], pts[pts.len() - 1]),
            };
            let t = (size - seg.0.size) / (seg.1.size - seg.0.size);
            let lerp = |a: f64, b: f64| (a + t * (b - a)).max(0.0);
            let lo = lerp(seg.0.cost.lo, seg.1.cost.lo);
            let hi = lerp(seg.0.cost.hi, seg.1.cost.hi).max(lo);
            (Interval { lo, hi }, None)
        };
        let note = match (reversed, note) {
            (true, Some(n)) => Some(format!("send[{to}][{from}], {n}")),
            (true, None) => Some(format!("send[{to}][{from}]")),
            (false, n) => n,
        };
        let fb = note.map(|used| Fallback {
            machine: from,
            wanted,
            used,
        });
        Ok((iv.scale_unchecked_nonneg(self.send_unit_s), fb))
    }

    /// Workers (index ≥ 1) ordered fastest first by `W_p` (ties: lower index first).
    /// Errors if a worker lacks a valid `W`.
    pub fn workers_by_speed(&self) -> Result<Vec<usize>, MachineError> {
        let mut ws: Vec<(usize, f64)> = Vec::new();
        for m in self.machines.iter().filter(|m| m.index != 0) {
            match m.w {
                Some(w) if w.is_finite() && w > 0.0 => ws.push((m.index, w)),
                w => {
                    return Err(MachineError::BadWeight {
                        machine: m.index,
                        w,
                    })
                }
            }
        }
        ws.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        Ok(ws.into_iter().map(|x| x.0).collect())
    }

    /// Build from a parsed Appendix-B document.
    pub fn from_appendix_b(doc: &AppendixB) -> MachineModel {
        let mut mm = MachineModel {
            send_unit_s: 1e-3,
            machines: Vec::new(),
            sends: Vec::new(),
        };
        for line in &doc.lines {
            match line {
                BLine::Cost {
                    key,
                    machine,
                    value,
                    ..
                } => {
                    mm.machine_mut(*machine).costs.insert(*key, *value);
                }
                BLine::Send {
                    from,
                    to,
                    size,
                    value,
                    ..
                } => {
                    mm.machine_mut(*from);
                    mm.machine_mut(*to);
                    mm.sends.push(SendPoint {
                        from: *from,
                        to: *to,
                        size: *size,
                        cost: *value,
                    });
                }
                BLine::Weight { machine, w } => mm.machine_mut(*machine).w = Some(*w),
                BLine::Name { machine, name } => mm.machine_mut(*machine).name = Some(name.clone()),
                BLine::Comment(_) | BLine::Blank => {}
            }
        }
        mm.machines.sort_by_key(|m| m.index);
        mm
    }

    /// Export as an Appendix-B document (sorted by machine, then key; names and `W` as the
    /// documented extension lines). Send costs are written in the model's send unit.
    pub fn to_appendix_b(&self) -> AppendixB {
        let mut lines = Vec::new();
        let mut ms: Vec<&Machine> = self.machines.iter().collect();
        ms.sort_by_key(|m| m.index);
        for m in ms {
            let role = if m.index == 0 {
                "coordinator"
            } else {
                "worker"
            };
            lines.push(BLine::Comment(format!(
                "//{role} (index {}){}",
                m.index,
                m.name
                    .as_deref()
                    .map(|n| format!(": {n}"))
                    .unwrap_or_default()
            )));
            if let Some(n) = &m.name {
                lines.push(BLine::Name {
                    machine: m.index,
                    name: n.clone(),
                });
            }
            if let Some(w) = m.w {
                lines.push(BLine::Weight {
                    machine: m.index,
                    w,
                });
            }
            for (k, v) in &m.costs {
                lines.push(BLine::Cost {
                    key: *k,
                    machine: m.index,
                    value: *v,
                    raw: None,
                });
            }
            for s in self.sends.iter().filter(|s| s.from == m.index) {
                lines.push(BLine::Send {
                    from: s.from,
                    to: s.to,
                    size: s.size,
                    value: s.cost,
                    raw: None,
                });
            }
        }
        AppendixB { lines }
    }
}

/// One line of an Appendix-B machine-model file.
#[derive(Debug, Clone, PartialEq)]
pub enum BLine {
    /// `//…` (kept verbatim, including the slashes).
    Comment(String),
    /// An empty line.
    Blank,
    /// `inter_<key>[m]=[lo;hi]`.
    Cost {
        /// Cost key.
        key: CostKey,
        /// Machine index.
        machine: usize,
        /// Seconds per operation.
        value: Interval,
        /// The bounds exactly as written in the file, if read from one (see [`RawBounds`]).
        raw: Option<RawBounds>,
    },
    /// `inter_send[from][to](size)=[lo;hi]`.
    Send {
        /// Sender.
        from: usize,
        /// Receiver.
        to: usize,
        /// Message size.
        size: f64,
        /// Cost in the file's send unit.
        value: Interval,
        /// The bounds exactly as written in the file, if read from one.
        raw: Option<RawBounds>,
    },
    /// Extension: `W[m]=value` (performance factor, Eq. 3.5).
    Weight {
        /// Machine index.
        machine: usize,
        /// W_p.
        w: f64,
    },
    /// Extension: `name[m]=hostname`.
    Name {
        /// Machine index.
        machine: usize,
        /// Host name.
        name: String,
    },
}

/// The two bounds of an interval as written in a file. CRES ran on Java 1.4, whose
/// `Double.toString` sometimes printed a 17th digit that the shortest round-trip form omits
/// (`6.7347440944881885E-8` in Appendix B); keeping the lexemes makes printing exact.
#[derive(Debug, Clone, PartialEq)]
pub struct RawBounds {
    /// Lower bound text.
    pub lo: String,
    /// Upper bound text.
    pub hi: String,
}

fn bound_text(v: &Interval, raw: &Option<RawBounds>) -> (String, String) {
    match raw {
        Some(r)
            if r.lo.parse::<f64>().ok() == Some(v.lo) && r.hi.parse::<f64>().ok() == Some(v.hi) =>
        {
            (r.lo.clone(), r.hi.clone())
        }
        _ => (java_double(v.lo), java_double(v.hi)),
    }
}

/// A parsed Appendix-B file: its lines in order, so that printing reproduces it exactly.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AppendixB {
    /// The lines.
    pub lines: Vec<BLine>,
}

/// Format a double as Java's `Double.toString` does for the values CRES wrote: plain decimal
/// in [1e-3, 1e7) and `d.dddE±n` outside, always with a fractional digit (`8.0`, `1.0E-8`).
/// The digits are Rust's shortest round-trip digits.
pub fn java_double(x: f64) -> String {
    if x == 0.0 {
        return if x.is_sign_negative() {
            "-0.0".into()
        } else {
            "0.0".into()
        };
    }
    let a = x.abs();
    if (1e-3..1e7).contains(&a) {
        let s = format!("{x}");
        if s.contains('.') {
            s
        } else {
            format!("{s}.0")
        }
    } else {
        let s = format!("{x:e}");
        let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let mant = if mant.contains('.') {
            mant.to_string()
        } else {
            format!("{mant}.0")
        };
        format!("{mant}E{exp}")
    }
}

fn fmt_size(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        format!("{x}")
    }
}

impl fmt::Display for AppendixB {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for l in &self.lines {
            match l {
                BLine::Comment(c) => writeln!(f, "{c}")?,
                BLine::Blank => writeln!(f)?,
                BLine::Cost {
                    key,
                    machine,
                    value,
                    raw,
                } => {
                    let (lo, hi) = bound_text(value, raw);
                    writeln!(f, "inter_{key}[{machine}]=[{lo};{hi}]")?
                }
                BLine::Send {
                    from,
                    to,
                    size,
                    value,
                    raw,
                } => {
                    let (lo, hi) = bound_text(value, raw);
                    writeln!(
                        f,
                        "inter_send[{from}][{to}]({})=[{lo};{hi}]",
                        fmt_size(*size)
                    )?
                }
                BLine::Weight { machine, w } => writeln!(f, "W[{machine}]={w}")?,
                BLine::Name { machine, name } => writeln!(f, "name[{machine}]={name}")?,
            }
        }
        Ok(())
    }
}

/// A tiny cursor over one line, for column-accurate errors.
struct Cur<'a> {
    s: &'a str,
    pos: usize,
    line: usize,
}

impl<'a> Cur<'a> {
    fn err(&self, msg: impl Into<String>) -> MachineError {
        MachineError::Syntax {
            line: self.line,
            col: self.s[..self.pos].chars().count() + 1,
            msg: msg.into(),
        }
    }
    fn eat(&mut self, lit: &str) -> Result<(), MachineError> {
        if self.s[self.pos..].starts_with(lit) {
            self.pos += lit.len();
            Ok(())
        } else {
            Err(self.err(format!("expected `{lit}`")))
        }
    }
    fn take_while(&mut self, f: impl Fn(char) -> bool) -> &'a str {
        let start = self.pos;
        while let Some(c) = self.s[self.pos..].chars().next() {
            if !f(c) {
                break;
            }
            self.pos += c.len_utf8();
        }
        &self.s[start..self.pos]
    }
    fn index(&mut self) -> Result<usize, MachineError> {
        self.eat("[")?;
        let d = self.take_while(|c| c.is_ascii_digit());
        let v = d
            .parse()
            .map_err(|_| self.err("expected a machine index (digits)"))?;
        self.eat("]")?;
        Ok(v)
    }
    fn number(&mut self) -> Result<f64, MachineError> {
        let at = self.pos;
        let t = self.take_while(|c| c.is_ascii_digit() || matches!(c, '.' | 'E' | 'e' | '-' | '+'));
        t.parse::<f64>().map_err(|_| {
            self.pos = at;
            self.err(format!("expected a number, found {t:?}"))
        })
    }
    fn interval(&mut self) -> Result<(Interval, RawBounds), MachineError> {
        self.eat("[")?;
        let a = self.pos;
        let lo = self.number()?;
        let lo_t = self.s[a..self.pos].to_string();
        self.eat(";")?;
        let b = self.pos;
        let hi = self.number()?;
        let hi_t = self.s[b..self.pos].to_string();
        self.eat("]")?;
        let iv = Interval::new(lo, hi).map_err(|e| self.err(e.to_string()))?;
        Ok((iv, RawBounds { lo: lo_t, hi: hi_t }))
    }
    fn end(&self) -> Result<(), MachineError> {
        if self.s[self.pos..].trim().is_empty() {
            Ok(())
        } else {
            Err(self.err("unexpected text after the value"))
        }
    }
}

impl FromStr for AppendixB {
    type Err = MachineError;
    /// Parse the Appendix-B text (plus the `W[m]=` and `name[m]=` extension lines).
    fn from_str(text: &str) -> Result<AppendixB, MachineError> {
        let mut lines = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let s = raw.trim_end_matches('\r');
            let mut c = Cur {
                s,
                pos: 0,
                line: i + 1,
            };
            if s.trim().is_empty() {
                lines.push(BLine::Blank);
            } else if s.starts_with("//") {
                lines.push(BLine::Comment(s.to_string()));
            } else if s.starts_with("inter_send[") {
                c.eat("inter_send")?;
                let from = c.index()?;
                let to = c.index()?;
                c.eat("(")?;
                let size = c.number()?;
                if size < 0.0 {
                    return Err(c.err("message size must be >= 0"));
                }
                c.eat(")")?;
                c.eat("=")?;
                let (value, raw) = c.interval()?;
                if value.lo < 0.0 {
                    return Err(c.err("costs must be >= 0"));
                }
                c.end()?;
                lines.push(BLine::Send {
                    from,
                    to,
                    size,
                    value,
                    raw: Some(raw),
                });
            } else if s.starts_with("inter_") {
                c.eat("inter_")?;
                let at = c.pos;
                let name = c.take_while(|ch| ch.is_ascii_alphanumeric() || ch == '_');
                let key: CostKey = name.parse().map_err(|e: MachineError| {
                    c.pos = at;
                    c.err(e.to_string())
                })?;
                let machine = c.index()?;
                c.eat("=")?;
                let (value, raw) = c.interval()?;
                if value.lo < 0.0 {
                    return Err(c.err("costs must be >= 0"));
                }
                c.end()?;
                lines.push(BLine::Cost {
                    key,
                    machine,
                    value,
                    raw: Some(raw),
                });
            } else if s.starts_with("W[") {
                c.eat("W")?;
                let machine = c.index()?;
                c.eat("=")?;
                let w = c.number()?;
                if !(w.is_finite() && w > 0.0) {
                    return Err(c.err("W must be a finite number > 0"));
                }
                c.end()?;
                lines.push(BLine::Weight { machine, w });
            } else if s.starts_with("name[") {
                c.eat("name")?;
                let machine = c.index()?;
                c.eat("=")?;
                let name = s[c.pos..].trim().to_string();
                if name.is_empty() {
                    return Err(c.err("expected a host name after `=`"));
                }
                lines.push(BLine::Name { machine, name });
            } else {
                return Err(c.err(
                    "expected `//comment`, `inter_<op>[_<type>][m]=[lo;hi]`, `inter_send[p][q](size)=[lo;hi]`, `W[m]=w` or `name[m]=host`",
                ));
            }
        }
        Ok(AppendixB { lines })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_key_names() {
        for s in [
            "array_access",
            "sum_int",
            "loop_iteration",
            "assign_obj",
            "access",
        ] {
            let k: CostKey = s.parse().unwrap();
            assert_eq!(k.to_string(), s);
        }
        assert!("foo_int".parse::<CostKey>().is_err());
    }

    #[test]
    fn fallback_compare_goes_to_sum_int() {
        let chain = CostKey::untyped(Op::Compare).fallback_chain();
        assert_eq!(
            chain.last().copied(),
            Some(CostKey::typed(Op::Sum, DataType::Int))
        );
    }

    #[test]
    fn java_format() {
        assert_eq!(java_double(8.0), "8.0");
        assert_eq!(java_double(1e-8), "1.0E-8");
        assert_eq!(java_double(3.927165354330709E-8), "3.927165354330709E-8");
    }
}
