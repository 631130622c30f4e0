//! The analytic compiler (AMC) and the evaluator (TPT).
//!
//! [`compile`] turns an Extended-PAMELA [`ModelFile`] into symbolic expressions: `T_0` (no
//! contention) and one `T_r` per shared resource r, with `T = max(T_0, T_r…)` (thesis §2.5,
//! Eq. 3.4). Reductions over machines stay symbolic (`sum/max over p`), and reductions over
//! identical tasks become closed forms (`count × τ`, or `τ` if the count is ≥ 1), so a
//! compiled model is evaluated for any machine set without enumerating tasks.
//!
//! [`evaluate`] substitutes the intervals of the chosen machines and returns `[t_min; t_max]`
//! with a breakdown of which term dominates.
//!
//! # Semantics (documented choices, see also `docs/prediction.md`)
//! * Root process: the item named `L`.
//! * Machines: `COORD`/`0` is the coordinator (machine 0). A reduction `seq/par(p=1,P)` binds
//!   `p` to each selected worker in turn; any other reduction counts identical repetitions.
//! * Resources in `use(r, τ)`: a machine expression is that machine's CPU (`comp[0]`, or the
//!   family `comp[p]`, one resource per worker, whose `T_r` is the max over workers); any other
//!   name is one shared resource (`net`); `name[p]` is a per-worker family (`net[p]`).
//! * `T_r` = Σ τ over the uses of r (`;`, `||`, `seq`, `par` all sum), other resources and plain
//!   delays contribute 0 — the thesis's worked example, not its double-counting `F_r × τ` (§8).
//! * `N*W[p]` in a reduction bound is worker p's static share of N tasks
//!   ([`crate::shares::static_shares`], f = 1), so `par(i=0,100*W[p]-1)` runs over S_p tasks.
//! * All tasks of a batch are identical (JoiN): `task[b,t](m)` costs batch b's task function on
//!   machine m whatever t is; counter updates (`id=id+1`) cost nothing.
//! * Conditionals keep both branches; the [`Policy`] chooses at evaluation time.

use crate::interval::Interval;
use crate::machine::{CostKey, Fallback, MachineError, MachineModel, SendIndex};
use crate::pamela::{IntExpr, Item, ModelFile, Pos, RedKind, SizeExpr, SizeFn, Stmt};
use crate::shares::{static_shares, ShareError};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::{self, Write as _};

/// Errors compiling or evaluating a model.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AnalyticError {
    /// A semantic error at a place in the model.
    #[error("{pos}: {msg}")]
    At {
        /// Where.
        pos: Pos,
        /// What and what to do.
        msg: String,
    },
    /// A model-wide problem.
    #[error("{0}")]
    Model(String),
    /// A machine-model problem.
    #[error(transparent)]
    Machine(#[from] MachineError),
    /// A share problem.
    #[error(transparent)]
    Share(#[from] ShareError),
}

fn at<T>(pos: Pos, msg: impl Into<String>) -> Result<T, AnalyticError> {
    Err(AnalyticError::At {
        pos,
        msg: msg.into(),
    })
}

/// How conditionals `if{A}else{B}` are costed (a missing `else` is the empty block, cost 0).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Policy {
    /// `max(A, B)` — the thesis's implemented worst case (Appendix A.4); the default.
    Worst,
    /// `(A + B)/2` — the arithmetic mean the thesis's text describes.
    Mean,
    /// `min(A, B)`.
    Best,
    /// `Q·A + (1−Q)·B` with the `if(Q)` annotation, else `default_q`, else an error.
    Probability {
        /// Q for conditionals without an annotation.
        default_q: Option<f64>,
    },
}

/// A machine reference in the compiled model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum MRef {
    /// Machine 0.
    Coord,
    /// The worker bound by the enclosing machine reduction.
    Worker,
    /// A fixed machine index ≥ 1.
    Fixed(usize),
}

impl fmt::Display for MRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MRef::Coord => f.write_str("COORD"),
            MRef::Worker => f.write_str("p"),
            MRef::Fixed(k) => write!(f, "{k}"),
        }
    }
}

/// Count expressions (how many identical repetitions).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Count {
    /// A number.
    Lit(f64),
    /// The number of selected workers.
    P,
    /// Worker p's static share of N tasks.
    Share(u64),
    /// Worker p's rank (1..P) in the selection.
    Rank,
    /// `a op b`.
    Bin(char, Box<Count>, Box<Count>),
}

impl fmt::Display for Count {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Count::Lit(v) => write!(f, "{v}"),
            Count::P => f.write_str("P"),
            Count::Share(n) => write!(f, "S{n}[p]"),
            Count::Rank => f.write_str("p"),
            Count::Bin(op, a, b) => write!(f, "({a}{op}{b})"),
        }
    }
}

/// A message size in the compiled model.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Size {
    /// Bytes.
    Lit(f64),
    /// A size function of batch `b`'s task (bound from the model's size items).
    Of(SizeFn, i64),
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Size::Lit(v) => write!(f, "{v}"),
            Size::Of(func, b) => write!(f, "{}(task[{b}])", func.name()),
        }
    }
}

/// A task's cost as a machine-independent expression over cost parameters.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum CostExpr {
    /// A cost parameter (`inter_<key>` of the executing machine).
    Key(CostKey),
    /// Seconds.
    Seconds(f64),
    /// Sum of terms, each with a count.
    Sum(Vec<(f64, CostExpr)>),
    /// A conditional: the branches (a missing `else` is an empty sum) and its probability.
    Cond {
        /// Branches (then, else).
        branches: Vec<CostExpr>,
        /// `if(Q)` annotation.
        prob: Option<f64>,
        /// Where the `if` is.
        pos: Pos,
    },
}

/// A compiled analytic expression over machines.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum AExpr {
    /// Zero.
    Zero,
    /// Seconds.
    Seconds(f64),
    /// A cost parameter on a machine.
    Cost(CostKey, MRef),
    /// Task function `func` (index into [`Compiled::tasks`]) on a machine.
    Task(usize, MRef),
    /// A send's cost.
    Send(MRef, MRef, Size),
    /// Sum.
    Add(Vec<AExpr>),
    /// Max.
    Max(Vec<AExpr>),
    /// `count × e`.
    Scale(Count, Box<AExpr>),
    /// `e` if `count ≥ 1`, else 0 (a `par` over identical items).
    MaxIf(Count, Box<AExpr>),
    /// Σ over selected workers.
    SumP(Box<AExpr>),
    /// max over selected workers.
    MaxP(Box<AExpr>),
    /// A conditional at process level.
    Cond {
        /// Branches.
        branches: Vec<AExpr>,
        /// `if(Q)` annotation.
        prob: Option<f64>,
        /// Where.
        pos: Pos,
    },
}

/// One compiled task function.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TaskFn {
    /// Its name in the model.
    pub name: String,
    /// Its cost.
    pub cost: CostExpr,
}

/// One term of `T = max(…)`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Term {
    /// `T_0`, `T_comp[COORD]`, `T_comp[p]`, `T_net`, …
    pub name: String,
    /// Human meaning.
    pub meaning: String,
    /// The expression.
    pub expr: AExpr,
}

/// A compiled analytic model: re-evaluate it with [`evaluate`] for any machine set.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Compiled {
    /// Task functions.
    pub tasks: Vec<TaskFn>,
    /// `T_0` first, then one term per resource.
    pub terms: Vec<Term>,
    /// Declared sizes `(function, batch) → bytes`.
    pub sizes: BTreeMap<String, f64>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Res {
    Comp(MRef),
    Named(String),
    NamedAt(String, MRef),
}

impl Res {
    fn term_name(&self) -> String {
        match self {
            Res::Comp(m) => format!("T_comp[{m}]"),
            Res::Named(n) => format!("T_{n}"),
            Res::NamedAt(n, m) => format!("T_{n}[{m}]"),
        }
    }
    fn meaning(&self) -> String {
        match self {
            Res::Comp(MRef::Coord) => "coordinator CPU (everything it runs, in sequence)".into(),
            Res::Comp(MRef::Worker) => {
                "busiest worker CPU (max over p of its tasks in sequence)".into()
            }
            Res::Comp(MRef::Fixed(k)) => format!("CPU of machine {k}"),
            Res::Named(n) => format!("shared resource `{n}` (all its uses serialised)"),
            Res::NamedAt(n, MRef::Worker) => format!("busiest `{n}[p]` (max over p)"),
            Res::NamedAt(n, m) => format!("resource `{n}[{m}]`"),
        }
    }
    fn family(&self) -> bool {
        matches!(
            self,
            Res::Comp(MRef::Worker) | Res::NamedAt(_, MRef::Worker)
        )
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Mode<'a> {
    Free,
    Res(&'a Res),
}

#[derive(Clone, Copy, PartialEq)]
enum Bind {
    Machine,
    Count,
}

struct Ctx<'m> {
    consts: HashMap<String, i64>,
    processes: HashMap<String, (&'m Stmt, Pos)>,
    task_map: HashMap<i64, (String, Pos)>,
    task_defs: HashMap<String, (&'m [Stmt], Pos)>,
    task_index: HashMap<String, usize>,
    tasks: Vec<TaskFn>,
    sizes: BTreeMap<String, f64>,
}

fn size_key(f: SizeFn, b: i64) -> String {
    format!("{}(task[{b}])", f.name())
}

impl<'m> Ctx<'m> {
    fn const_int(&self, e: &IntExpr, scope: &[(String, Bind)]) -> Result<i64, AnalyticError> {
        match e {
            IntExpr::Lit(v) => Ok(*v),
            IntExpr::Var(n, pos) => {
                if scope.iter().any(|(s, _)| s == n) {
                    return at(
                        *pos,
                        format!("`{n}` is a reduction variable; a constant is needed here"),
                    );
                }
                self.consts
                    .get(n)
                    .copied()
                    .ok_or_else(|| AnalyticError::At {
                        pos: *pos,
                        msg: format!("`{n}` is not a constant; define it with `{n}=<integer>;`"),
                    })
            }
            IntExpr::Index(n, _, pos) => at(*pos, format!("`{n}[…]` is not a constant")),
            IntExpr::Bin(op, a, b) => {
                let (a, b) = (self.const_int(a, scope)?, self.const_int(b, scope)?);
                Ok(match op {
                    '+' => a + b,
                    '-' => a - b,
                    '*' => a * b,
                    _ => {
                        if b == 0 {
                            return Err(AnalyticError::Model(
                                "division by zero in a constant expression".into(),
                            ));
                        }
                        a / b
                    }
                })
            }
        }
    }

    fn mref(&self, e: &IntExpr, scope: &[(String, Bind)]) -> Result<MRef, AnalyticError> {
        if let IntExpr::Var(n, pos) = e {
            if let Some((_, b)) = scope.iter().rev().find(|(s, _)| s == n) {
                return match b {
                    Bind::Machine => Ok(MRef::Worker),
                    Bind::Count => at(*pos, format!("`{n}` counts repetitions; only a variable of `seq/par({n}=1,P)` names a machine")),
                };
            }
        }
        let k = self.const_int(e, scope)?;
        if k < 0 {
            return Err(AnalyticError::Model(format!(
                "machine index {k} is negative"
            )));
        }
        Ok(if k == 0 {
            MRef::Coord
        } else {
            MRef::Fixed(k as usize)
        })
    }

    fn count(&self, e: &IntExpr, scope: &[(String, Bind)]) -> Result<Count, AnalyticError> {
        Ok(match e {
            IntExpr::Lit(v) => Count::Lit(*v as f64),
            IntExpr::Var(n, pos) => {
                if n == "P" && !self.consts.contains_key("P") {
                    Count::P
                } else if let Some((_, b)) = scope.iter().rev().find(|(s, _)| s == n) {
                    match b {
                        Bind::Machine => Count::Rank,
                        Bind::Count => {
                            return at(
                                *pos,
                                format!("bounds may not depend on the repetition variable `{n}`"),
                            )
                        }
                    }
                } else {
                    Count::Lit(self.const_int(e, scope)? as f64)
                }
            }
            IntExpr::Index(n, idx, pos) => {
                return at(
                    *pos,
                    format!(
                        "`{n}[{idx}]` may only appear as `N*W[p]` (worker p's share of N tasks)"
                    ),
                )
            }
            IntExpr::Bin('*', a, b) => {
                let share = |n: &IntExpr, w: &IntExpr| -> Option<Result<Count, AnalyticError>> {
                    if let IntExpr::Index(name, idx, ipos) = w {
                        if name == "W" {
                            let is_p = matches!(&**idx, IntExpr::Var(v, _) if scope.iter().any(|(s, b)| s == v && *b == Bind::Machine));
                            if !is_p {
                                return Some(at(*ipos, "`W[…]` must be indexed by the machine variable of `seq/par(p=1,P)`"));
                            }
                            return Some(match self.const_int(n, scope) {
                                Ok(k) if k >= 0 => Ok(Count::Share(k as u64)),
                                Ok(k) => {
                                    at(*ipos, format!("task count {k} in `{k}*W[p]` must be >= 0"))
                                }
                                Err(e) => Err(e),
                            });
                        }
                    }
                    None
                };
                if let Some(r) = share(a, b).or_else(|| share(b, a)) {
                    return r;
                }
                Count::Bin(
                    '*',
                    Box::new(self.count(a, scope)?),
                    Box::new(self.count(b, scope)?),
                )
            }
            IntExpr::Bin(op, a, b) => Count::Bin(
                *op,
                Box::new(self.count(a, scope)?),
                Box::new(self.count(b, scope)?),
            ),
        })
    }

    fn size(&mut self, s: &SizeExpr, scope: &[(String, Bind)]) -> Result<Size, AnalyticError> {
        Ok(match s {
            SizeExpr::Lit(v) => Size::Lit(*v),
            SizeExpr::Of { func, batch, .. } => Size::Of(*func, self.const_int(batch, scope)?),
        })
    }

    fn task_fn(
        &mut self,
        name: &str,
        pos: Pos,
        stack: &mut Vec<String>,
    ) -> Result<usize, AnalyticError> {
        if let Some(&i) = self.task_index.get(name) {
            return Ok(i);
        }
        let (body, _) = *self.task_defs.get(name).ok_or_else(|| AnalyticError::At {
            pos,
            msg: format!(
                "task function `{name}` is not defined; add `{name}(p,0)={{ taskrun{{ … }} }}`"
            ),
        })?;
        if stack.iter().any(|s| s == name) {
            return at(pos, format!("task function `{name}` refers to itself"));
        }
        stack.push(name.to_string());
        let cost = self.cost_block(body, stack)?;
        stack.pop();
        let i = self.tasks.len();
        self.tasks.push(TaskFn {
            name: name.to_string(),
            cost,
        });
        self.task_index.insert(name.to_string(), i);
        Ok(i)
    }

    fn cost_block(
        &mut self,
        body: &[Stmt],
        stack: &mut Vec<String>,
    ) -> Result<CostExpr, AnalyticError> {
        let mut terms = Vec::new();
        for s in body {
            self.cost_stmt(s, 1.0, &mut terms, stack)?;
        }
        Ok(normalise(terms))
    }

    fn cost_stmt(
        &mut self,
        s: &Stmt,
        k: f64,
        out: &mut Vec<(f64, CostExpr)>,
        stack: &mut Vec<String>,
    ) -> Result<(), AnalyticError> {
        match s {
            Stmt::Name(n, pos) => {
                if self.task_defs.contains_key(n.as_str()) {
                    let i = self.task_fn(n, *pos, stack)?;
                    out.push((k, self.tasks[i].cost.clone()));
                } else {
                    out.push((k, CostExpr::Key(cost_key(n, *pos)?)));
                }
            }
            Stmt::Seconds(v, _) => out.push((k, CostExpr::Seconds(*v))),
            Stmt::Mul(m, x, _) => self.cost_stmt(x, k * m, out, stack)?,
            Stmt::Block(b) | Stmt::Taskrun(b) | Stmt::Seq(b) => {
                for x in b {
                    self.cost_stmt(x, k, out, stack)?;
                }
            }
            Stmt::Reduce {
                kind: RedKind::Seq | RedKind::For,
                lo,
                hi,
                body,
                ..
            } => {
                let n = (self.const_int(hi, &[])? - self.const_int(lo, &[])? + 1).max(0) as f64;
                let inner = self.cost_block(body, stack)?;
                out.push((k * n, inner));
            }
            Stmt::If {
                prob,
                then,
                els,
                pos,
            } => {
                let a = self.cost_block(then, stack)?;
                let b = match els {
                    Some(e) => self.cost_block(e, stack)?,
                    None => CostExpr::Sum(vec![]),
                };
                out.push((
                    k,
                    CostExpr::Cond {
                        branches: vec![a, b],
                        prob: *prob,
                        pos: *pos,
                    },
                ));
            }
            Stmt::Counter { .. } => {}
            Stmt::Reduce { pos, .. }
            | Stmt::Use { pos, .. }
            | Stmt::Delay(_, pos)
            | Stmt::Task { pos, .. }
            | Stmt::Send { pos, .. } => {
                return at(
                    *pos,
                    "only costs, seq/for loops and if/else may appear inside a task function",
                );
            }
            Stmt::Par(_) => {
                return Err(AnalyticError::Model(
                    "`||` may not appear inside a task function".into(),
                ))
            }
        }
        Ok(())
    }

    /// The cost τ of a `use`/`delay`, evaluated on machine `m` when it is a bare cost name.
    fn tau(
        &mut self,
        s: &Stmt,
        m: Option<MRef>,
        scope: &[(String, Bind)],
        stack: &mut Vec<String>,
    ) -> Result<AExpr, AnalyticError> {
        Ok(match s {
            Stmt::Task { batch, machine, pos, .. } => {
                let b = self.const_int(batch, scope)?;
                let (func, _) = self.task_map.get(&b).cloned().ok_or_else(|| AnalyticError::At {
                    pos: *pos,
                    msg: format!("batch {b} has no task map; add `task[{b},taskNumber](p)=Func(p,taskNumber);`"),
                })?;
                let i = self.task_fn(&func, *pos, stack)?;
                AExpr::Task(i, self.mref(machine, scope)?)
            }
            Stmt::Send { from, to, size, .. } => AExpr::Send(self.mref(from, scope)?, self.mref(to, scope)?, self.size(size, scope)?),
            Stmt::Name(n, pos) => {
                if self.processes.contains_key(n.as_str()) {
                    return at(*pos, format!("`{n}` is a process, not a cost"));
                }
                if self.task_defs.contains_key(n.as_str()) {
                    let i = self.task_fn(n, *pos, stack)?;
                    match m {
                        Some(m) => AExpr::Task(i, m),
                        None => return at(*pos, format!("`{n}` needs a machine: write use(MACHINE, {n})")),
                    }
                } else {
                    let k = cost_key(n, *pos)?;
                    match m {
                        Some(m) => AExpr::Cost(k, m),
                        None => return at(*pos, format!("cost `{n}` needs a machine: write use(MACHINE, {n})")),
                    }
                }
            }
            Stmt::Seconds(v, _) => AExpr::Seconds(*v),
            Stmt::Mul(k, x, _) => simplify(AExpr::Scale(Count::Lit(*k), Box::new(self.tau(x, m, scope, stack)?))),
            Stmt::Block(b) | Stmt::Seq(b) => {
                let mut v = Vec::new();
                for x in b {
                    v.push(self.tau(x, m, scope, stack)?);
                }
                simplify(AExpr::Add(v))
            }
            Stmt::If { prob, then, els, pos } => {
                let a = self.tau(&Stmt::Block(then.clone()), m, scope, stack)?;
                let b = match els {
                    Some(e) => self.tau(&Stmt::Block(e.clone()), m, scope, stack)?,
                    None => AExpr::Zero,
                };
                AExpr::Cond { branches: vec![a, b], prob: *prob, pos: *pos }
            }
            Stmt::Use { pos, .. } | Stmt::Delay(_, pos) | Stmt::Reduce { pos, .. } => {
                return at(*pos, "the cost of use/delay must be a task, a send, a cost name, a number or a block of these")
            }
            Stmt::Par(_) | Stmt::Taskrun(_) | Stmt::Counter { .. } => {
                return Err(AnalyticError::Model("the cost of use/delay must be a task, a send, a cost name, a number or a block of these".into()))
            }
        })
    }

    fn resource(&self, r: &IntExpr, scope: &[(String, Bind)]) -> Result<Res, AnalyticError> {
        match r {
            IntExpr::Var(n, _) if !self.consts.contains_key(n) && !scope.iter().any(|(s, _)| s == n) => Ok(Res::Named(n.clone())),
            IntExpr::Index(n, idx, _) if n != "W" => Ok(Res::NamedAt(n.clone(), self.mref(idx, scope)?)),
            _ => match self.mref(r, scope)? {
                MRef::Fixed(k) => Err(AnalyticError::Model(format!(
                    "use({r}, …): a fixed worker index ({k}) as a resource is not supported; use the coordinator (COORD) or a machine variable bound by seq/par(p=1,P)"
                ))),
                m => Ok(Res::Comp(m)),
            },
        }
    }

    fn collect_res(
        &self,
        s: &Stmt,
        scope: &mut Vec<(String, Bind)>,
        out: &mut BTreeSet<Res>,
        seen: &mut Vec<String>,
    ) -> Result<(), AnalyticError> {
        match s {
            Stmt::Use { res, .. } => {
                out.insert(self.resource(res, scope)?);
            }
            Stmt::Seq(v) | Stmt::Par(v) | Stmt::Block(v) | Stmt::Taskrun(v) => {
                for x in v {
                    self.collect_res(x, scope, out, seen)?;
                }
            }
            Stmt::Reduce {
                var, lo, hi, body, ..
            } => {
                scope.push((var.clone(), self.bind_kind(lo, hi)));
                for x in body {
                    self.collect_res(x, scope, out, seen)?;
                }
                scope.pop();
            }
            Stmt::If { then, els, .. } => {
                for x in then.iter().chain(els.iter().flatten()) {
                    self.collect_res(x, scope, out, seen)?;
                }
            }
            Stmt::Mul(_, x, _) => self.collect_res(x, scope, out, seen)?,
            Stmt::Name(n, _) => {
                if let Some((p, _)) = self.processes.get(n.as_str()) {
                    if !seen.contains(n) {
                        seen.push(n.clone());
                        self.collect_res(p, scope, out, seen)?;
                        seen.pop();
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn bind_kind(&self, lo: &IntExpr, hi: &IntExpr) -> Bind {
        let lo1 = matches!(lo, IntExpr::Lit(1));
        let hip = matches!(hi, IntExpr::Var(n, _) if n == "P" && !self.consts.contains_key("P"));
        if lo1 && hip {
            Bind::Machine
        } else {
            Bind::Count
        }
    }

    fn proc(
        &mut self,
        s: &Stmt,
        mode: Mode,
        scope: &mut Vec<(String, Bind)>,
        stack: &mut Vec<String>,
    ) -> Result<AExpr, AnalyticError> {
        let free = mode == Mode::Free;
        Ok(simplify(match s {
            Stmt::Seq(v) | Stmt::Block(v) | Stmt::Taskrun(v) => {
                let mut out = Vec::new();
                for x in v {
                    out.push(self.proc(x, mode, scope, stack)?);
                }
                AExpr::Add(out)
            }
            Stmt::Par(v) => {
                let mut out = Vec::new();
                for x in v {
                    out.push(self.proc(x, mode, scope, stack)?);
                }
                if free {
                    AExpr::Max(out)
                } else {
                    AExpr::Add(out)
                }
            }
            Stmt::Reduce {
                kind,
                var,
                lo,
                hi,
                body,
                pos,
            } => {
                let b = self.bind_kind(lo, hi);
                if b == Bind::Machine && scope.iter().any(|(_, k)| *k == Bind::Machine) {
                    return at(
                        *pos,
                        "a reduction over machines (1..P) inside another one is not supported",
                    );
                }
                let count = if b == Bind::Count {
                    Some(simplify_count(Count::Bin(
                        '+',
                        Box::new(Count::Bin(
                            '-',
                            Box::new(self.count(hi, scope)?),
                            Box::new(self.count(lo, scope)?),
                        )),
                        Box::new(Count::Lit(1.0)),
                    )))
                } else {
                    None
                };
                scope.push((var.clone(), b));
                let mut parts = Vec::new();
                for x in body {
                    parts.push(self.proc(x, mode, scope, stack)?);
                }
                scope.pop();
                let inner = Box::new(simplify(AExpr::Add(parts)));
                match (count, mode) {
                    (None, Mode::Res(r)) if r.family() => *inner,
                    (None, Mode::Res(_)) => AExpr::SumP(inner),
                    (None, Mode::Free) => match kind {
                        RedKind::Par => AExpr::MaxP(inner),
                        _ => AExpr::SumP(inner),
                    },
                    (Some(c), Mode::Free) if *kind == RedKind::Par => AExpr::MaxIf(c, inner),
                    (Some(c), _) => AExpr::Scale(c, inner),
                }
            }
            Stmt::Use { res, tau, .. } => {
                let r = self.resource(res, scope)?;
                let m = match r {
                    Res::Comp(m) => Some(m),
                    _ => None,
                };
                match mode {
                    Mode::Free => self.tau(tau, m, scope, stack)?,
                    Mode::Res(want) if *want == r => self.tau(tau, m, scope, stack)?,
                    Mode::Res(_) => {
                        self.tau(tau, m, scope, stack)?; // still validate
                        AExpr::Zero
                    }
                }
            }
            Stmt::Delay(tau, _) => {
                let t = self.tau(tau, None, scope, stack)?;
                if free {
                    t
                } else {
                    AExpr::Zero
                }
            }
            Stmt::Task { .. } | Stmt::Send { .. } | Stmt::Seconds(..) => {
                let t = self.tau(s, None, scope, stack)?;
                if free {
                    t
                } else {
                    AExpr::Zero
                }
            }
            Stmt::Mul(k, x, _) => {
                AExpr::Scale(Count::Lit(*k), Box::new(self.proc(x, mode, scope, stack)?))
            }
            Stmt::If {
                prob,
                then,
                els,
                pos,
            } => {
                let a = self.proc(&Stmt::Block(then.clone()), mode, scope, stack)?;
                let b = match els {
                    Some(e) => self.proc(&Stmt::Block(e.clone()), mode, scope, stack)?,
                    None => AExpr::Zero,
                };
                AExpr::Cond {
                    branches: vec![a, b],
                    prob: *prob,
                    pos: *pos,
                }
            }
            Stmt::Counter { .. } => AExpr::Zero,
            Stmt::Name(n, pos) => {
                if let Some((body, _)) = self.processes.get(n.as_str()).copied() {
                    if stack.iter().any(|x| x == n) {
                        return at(*pos, format!("process `{n}` refers to itself"));
                    }
                    stack.push(n.clone());
                    let r = self.proc(body, mode, scope, stack)?;
                    stack.pop();
                    r
                } else {
                    return at(*pos, format!("`{n}` is not a process defined in this model (a bare cost name needs use(MACHINE, {n}))"));
                }
            }
        }))
    }
}

fn cost_key(n: &str, pos: Pos) -> Result<CostKey, AnalyticError> {
    let base = n.strip_prefix("inter_").unwrap_or(n);
    let base = base.strip_suffix("_p").unwrap_or(base);
    base.parse().map_err(|e: MachineError| AnalyticError::At {
        pos,
        msg: e.to_string(),
    })
}

/// Merge repeated keys (counts add up, first appearance order) and nested sums with count 1.
fn normalise(terms: Vec<(f64, CostExpr)>) -> CostExpr {
    let mut out: Vec<(f64, CostExpr)> = Vec::new();
    let push = |k: f64, e: CostExpr, out: &mut Vec<(f64, CostExpr)>| {
        if k == 0.0 {
            return;
        }
        if let CostExpr::Key(_) = e {
            if let Some(slot) = out.iter_mut().find(|(_, x)| *x == e) {
                slot.0 += k;
                return;
            }
        }
        out.push((k, e));
    };
    for (k, e) in terms {
        match e {
            CostExpr::Sum(inner) if k == 1.0 => {
                for (k2, e2) in inner {
                    push(k2, e2, &mut out);
                }
            }
            CostExpr::Sum(inner) if inner.is_empty() => {}
            other => push(k, other, &mut out),
        }
    }
    CostExpr::Sum(out)
}

fn simplify_count(c: Count) -> Count {
    match c {
        Count::Bin(op, a, b) => {
            let (a, b) = (simplify_count(*a), simplify_count(*b));
            match (&a, &b, op) {
                (Count::Lit(x), Count::Lit(y), _) => Count::Lit(match op {
                    '+' => x + y,
                    '-' => x - y,
                    '*' => x * y,
                    _ => x / y,
                }),
                // (x - 1) + 1 and (x - 0) + 1 patterns
                (Count::Bin('-', x, one), Count::Lit(y), '+') if **one == Count::Lit(*y) => {
                    (**x).clone()
                }
                (_, Count::Lit(z), '-') if *z == 0.0 => a,
                _ => Count::Bin(op, Box::new(a), Box::new(b)),
            }
        }
        c => c,
    }
}

fn simplify(e: AExpr) -> AExpr {
    match e {
        AExpr::Add(v) => {
            let mut out = Vec::new();
            for x in v {
                match x {
                    AExpr::Zero => {}
                    AExpr::Add(inner) => out.extend(inner),
                    x => out.push(x),
                }
            }
            match out.len() {
                0 => AExpr::Zero,
                1 => out.remove(0),
                _ => AExpr::Add(out),
            }
        }
        AExpr::Max(v) => {
            let mut out: Vec<AExpr> = v.into_iter().filter(|x| *x != AExpr::Zero).collect();
            match out.len() {
                0 => AExpr::Zero,
                1 => out.remove(0),
                _ => AExpr::Max(out),
            }
        }
        AExpr::Scale(c, x) | AExpr::MaxIf(c, x) if *x == AExpr::Zero => {
            let _ = c;
            AExpr::Zero
        }
        AExpr::Scale(Count::Lit(1.0), x) => *x,
        AExpr::SumP(x) | AExpr::MaxP(x) if *x == AExpr::Zero => AExpr::Zero,
        AExpr::Cond { ref branches, .. } if branches.iter().all(|b| *b == AExpr::Zero) => {
            AExpr::Zero
        }
        e => e,
    }
}

/// Compile a parsed model into its analytic form.
pub fn compile(model: &ModelFile) -> Result<Compiled, AnalyticError> {
    let mut ctx = Ctx {
        consts: HashMap::new(),
        processes: HashMap::new(),
        task_map: HashMap::new(),
        task_defs: HashMap::new(),
        task_index: HashMap::new(),
        tasks: Vec::new(),
        sizes: BTreeMap::new(),
    };
    let dup = |pos: Pos, n: &str| AnalyticError::At {
        pos,
        msg: format!("`{n}` is defined twice"),
    };
    for it in &model.items {
        match it {
            Item::Const { name, value, pos } => {
                let previous = ctx.consts.insert(name.clone(), *value);
                if previous.is_some() {
                    return Err(dup(*pos, name));
                }
            }
            Item::Process { name, body, pos } => {
                let previous = ctx.processes.insert(name.clone(), (body, *pos));
                if previous.is_some() {
                    return Err(dup(*pos, name));
                }
            }
            Item::TaskDef {
                name, body, pos, ..
            } => {
                let previous = ctx.task_defs.insert(name.clone(), (body.as_slice(), *pos));
                if previous.is_some() {
                    return Err(dup(*pos, name));
                }
            }
            _ => {}
        }
    }
    for it in &model.items {
        match it {
            Item::TaskMap {
                batch, func, pos, ..
            } => {
                let b = ctx.const_int(batch, &[])?;
                if ctx.task_map.insert(b, (func.clone(), *pos)).is_some() {
                    return at(*pos, format!("batch {b} is mapped twice"));
                }
            }
            Item::Size {
                func,
                batch,
                value,
                pos,
                ..
            } => {
                let b = ctx.const_int(batch, &[])?;
                if ctx.sizes.insert(size_key(*func, b), *value).is_some() {
                    return at(
                        *pos,
                        format!("{} of batch {b} is defined twice", func.name()),
                    );
                }
            }
            _ => {}
        }
    }
    let (root, _) = *ctx.processes.get("L").ok_or_else(|| {
        AnalyticError::Model("the model has no root process `L`; add `L=…`".into())
    })?;
    let mut stack = vec!["L".to_string()];
    let mut resources = BTreeSet::new();
    ctx.collect_res(root, &mut Vec::new(), &mut resources, &mut stack.clone())?;
    let t0 = ctx.proc(root, Mode::Free, &mut Vec::new(), &mut stack)?;
    let mut terms = vec![Term {
        name: "T_0".into(),
        meaning: "no contention (critical path with unlimited resources)".into(),
        expr: t0,
    }];
    for r in &resources {
        let e = ctx.proc(root, Mode::Res(r), &mut Vec::new(), &mut stack)?;
        let e = if r.family() {
            simplify(AExpr::MaxP(Box::new(e)))
        } else {
            e
        };
        terms.push(Term {
            name: r.term_name(),
            meaning: r.meaning(),
            expr: e,
        });
    }
    // Check every size used is declared (a clear compile-time error, never a silent 0).
    let mut missing = BTreeSet::new();
    for t in &terms {
        sizes_used(&t.expr, &mut |s| {
            if let Size::Of(f, b) = s {
                if !ctx.sizes.contains_key(&size_key(f, b)) {
                    missing.insert(size_key(f, b));
                }
            }
        });
    }
    let compiled = Compiled {
        tasks: ctx.tasks,
        terms,
        sizes: ctx.sizes,
    };
    if let Some(m) = missing.into_iter().next() {
        let (f, b) = m.split_once("(task[").unwrap_or((&m, ""));
        let b = b.trim_end_matches("])");
        return Err(AnalyticError::Model(format!(
            "size {m} is used but not defined; add `{f}(task[{b},0])=BYTES;`"
        )));
    }
    Ok(compiled)
}

/// Compile without requiring every size to be declared (for printing a model's analytic form).
pub fn compile_symbolic(model: &ModelFile) -> Result<Compiled, AnalyticError> {
    match compile(model) {
        Err(AnalyticError::Model(m)) if m.starts_with("size ") => {
            // Re-run with placeholder sizes recorded as undefined: compile() only failed on sizes.
            let mut m2 = model.clone();
            let mut declared = BTreeSet::new();
            for it in &model.items {
                if let Item::Size {
                    func,
                    batch: IntExpr::Lit(b),
                    ..
                } = it
                {
                    declared.insert(size_key(*func, *b));
                }
            }
            let mut extra = Vec::new();
            collect_size_uses(model, &mut |f, b| {
                if !declared.contains(&size_key(f, b)) {
                    declared.insert(size_key(f, b));
                    extra.push(Item::Size {
                        func: f,
                        batch: IntExpr::Lit(b),
                        task: IntExpr::Lit(0),
                        value: f64::NAN,
                        pos: Pos::default(),
                    });
                }
            });
            m2.items.extend(extra);
            compile(&m2)
        }
        r => r,
    }
}

fn collect_size_uses(model: &ModelFile, f: &mut impl FnMut(SizeFn, i64)) {
    fn walk(s: &Stmt, f: &mut impl FnMut(SizeFn, i64)) {
        match s {
            Stmt::Send {
                size:
                    SizeExpr::Of {
                        func,
                        batch: IntExpr::Lit(b),
                        ..
                    },
                ..
            } => f(*func, *b),
            Stmt::Seq(v) | Stmt::Par(v) | Stmt::Block(v) | Stmt::Taskrun(v) => {
                v.iter().for_each(|x| walk(x, f))
            }
            Stmt::Reduce { body, .. } => body.iter().for_each(|x| walk(x, f)),
            Stmt::If { then, els, .. } => then
                .iter()
                .chain(els.iter().flatten())
                .for_each(|x| walk(x, f)),
            Stmt::Use { tau, .. } | Stmt::Delay(tau, _) | Stmt::Mul(_, tau, _) => walk(tau, f),
            _ => {}
        }
    }
    for it in &model.items {
        if let Item::Process { body, .. } = it {
            walk(body, f);
        }
    }
}

fn sizes_used(e: &AExpr, f: &mut impl FnMut(Size)) {
    match e {
        AExpr::Send(_, _, s) => f(*s),
        AExpr::Add(v) | AExpr::Max(v) => v.iter().for_each(|x| sizes_used(x, f)),
        AExpr::Cond { branches, .. } => branches.iter().for_each(|x| sizes_used(x, f)),
        AExpr::Scale(_, x) | AExpr::MaxIf(_, x) | AExpr::SumP(x) | AExpr::MaxP(x) => {
            sizes_used(x, f)
        }
        _ => {}
    }
}

// ---------------------------------------------------------------------------------------------
// Printing the analytic model

fn cost_to_string(e: &CostExpr, policy: Option<Policy>) -> String {
    match e {
        CostExpr::Key(k) => format!("inter_{k}"),
        CostExpr::Seconds(v) => format!("{v}"),
        CostExpr::Sum(v) => {
            if v.is_empty() {
                return "0".into();
            }
            v.iter()
                .map(|(k, x)| {
                    let inner = cost_to_string(x, policy);
                    let wrap = matches!(x, CostExpr::Sum(s) if s.len() > 1);
                    match (*k == 1.0, wrap) {
                        (true, _) => inner,
                        (false, true) => format!("{k}*({inner})"),
                        (false, false) => format!("{k}*{inner}"),
                    }
                })
                .collect::<Vec<_>>()
                .join("+")
        }
        CostExpr::Cond { branches, prob, .. } => {
            let bs: Vec<String> = branches.iter().map(|b| cost_to_string(b, policy)).collect();
            cond_text(&bs, *prob, policy)
        }
    }
}

fn cond_text(bs: &[String], prob: Option<f64>, policy: Option<Policy>) -> String {
    match policy {
        Some(Policy::Worst) => format!("max({})", bs.join(",")),
        Some(Policy::Best) => format!("min({})", bs.join(",")),
        Some(Policy::Mean) => format!("mean({})", bs.join(",")),
        Some(Policy::Probability { default_q }) => match prob.or(default_q) {
            Some(q) if bs.len() == 2 => format!("{q}*({})+{}*({})", bs[0], 1.0 - q, bs[1]),
            _ => format!("prob?({})", bs.join(",")),
        },
        None => format!(
            "if({}{})",
            prob.map(|q| format!("{q}: ")).unwrap_or_default(),
            bs.join(" | ")
        ),
    }
}

fn aexpr_to_string(e: &AExpr, c: &Compiled, policy: Option<Policy>) -> String {
    let s = |x: &AExpr| aexpr_to_string(x, c, policy);
    match e {
        AExpr::Zero => "0".into(),
        AExpr::Seconds(v) => format!("{v}"),
        AExpr::Cost(k, m) => format!("inter_{k}[{m}]"),
        AExpr::Task(i, m) => format!(
            "{}[{m}]",
            c.tasks.get(*i).map(|t| t.name.as_str()).unwrap_or("?")
        ),
        AExpr::Send(a, b, sz) => format!("inter_send[{a},{b}]({sz})"),
        AExpr::Add(v) => v.iter().map(s).collect::<Vec<_>>().join(" + "),
        AExpr::Max(v) => format!("max({})", v.iter().map(s).collect::<Vec<_>>().join(", ")),
        AExpr::Scale(k, x) => format!("{k}*({})", s(x)),
        AExpr::MaxIf(k, x) => format!("max[i=1,{k}]({})", s(x)),
        AExpr::SumP(x) => format!("sum[p=1,P]({})", s(x)),
        AExpr::MaxP(x) => format!("max[p=1,P]({})", s(x)),
        AExpr::Cond { branches, prob, .. } => {
            let bs: Vec<String> = branches.iter().map(s).collect();
            cond_text(&bs, *prob, policy)
        }
    }
}

impl Compiled {
    /// The task function's cost as text in the Appendix A.4 style (`2*inter_assign_obj+…`),
    /// conditionals shown per `policy` (`None`: both branches).
    pub fn task_text(&self, name: &str, policy: Option<Policy>) -> Option<String> {
        self.tasks
            .iter()
            .find(|t| t.name == name)
            .map(|t| cost_to_string(&t.cost, policy))
    }

    /// A term's expression as text.
    pub fn term_text(&self, name: &str, policy: Option<Policy>) -> Option<String> {
        self.terms
            .iter()
            .find(|t| t.name == name)
            .map(|t| aexpr_to_string(&t.expr, self, policy))
    }

    /// The whole analytic model as text (task costs, terms, and `T = max(…)`).
    pub fn to_text(&self, policy: Option<Policy>) -> String {
        let mut out = String::from("//Task cost\n");
        for t in &self.tasks {
            let _ = writeln!(out, "{}={}", t.name, cost_to_string(&t.cost, policy));
        }
        out.push_str("//Terms\n");
        for t in &self.terms {
            let _ = writeln!(
                out,
                "{}={}    // {}",
                t.name,
                aexpr_to_string(&t.expr, self, policy),
                t.meaning
            );
        }
        let names: Vec<&str> = self.terms.iter().map(|t| t.name.as_str()).collect();
        let _ = writeln!(out, "T=max({})", names.join(", "));
        out
    }
}

// ---------------------------------------------------------------------------------------------
// Evaluation (TPT)

/// Which machines to predict for.
#[derive(Debug, Clone, PartialEq)]
pub enum Selection {
    /// The `P` fastest workers by `W` (the thesis's TPT and JoiN's machine selection).
    Fastest(usize),
    /// These workers, in this order (indices may repeat: fictitious copies).
    Explicit(Vec<usize>),
    /// `P` copies of worker `like` ("32 machines all equal to the fastest").
    Homogeneous {
        /// How many.
        p: usize,
        /// Which machine to copy.
        like: usize,
    },
}

/// The value of one term.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TermValue {
    /// Term name.
    pub name: String,
    /// What it means.
    pub meaning: String,
    /// Its interval (seconds).
    pub value: Interval,
    /// For a max-over-workers term: the worker machine index that attains `t_max`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub argmax_worker: Option<usize>,
}

/// A prediction: `[t_min; t_max]` and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Prediction {
    /// `T = max(T_0, T_r…)`, seconds.
    pub interval: Interval,
    /// Every term.
    pub terms: Vec<TermValue>,
    /// The term attaining `t_max`.
    pub dominant_max: String,
    /// The term attaining `t_min`.
    pub dominant_min: String,
    /// Worker machine indices used, in order.
    pub workers: Vec<usize>,
    /// Static shares used, per task count N.
    pub shares: BTreeMap<u64, Vec<u64>>,
    /// Predicted speedup: midpoint on the fastest selected worker alone ÷ midpoint on all.
    pub speedup: f64,
    /// `speedup / P`.
    pub efficiency: f64,
    /// Every fallback taken for a missing cost (never a silent 0).
    pub fallbacks: Vec<Fallback>,
}

struct Env<'a> {
    c: &'a Compiled,
    mm: &'a MachineModel,
    policy: Policy,
    workers: Vec<usize>,
    shares: HashMap<u64, Vec<u64>>,
    /// task cost per (machine index, task fn)
    task_cost: HashMap<(usize, usize), Interval>,
    sends: HashMap<(usize, usize, u64), Interval>,
    send_index: SendIndex<'a>,
    fallbacks: BTreeSet<(usize, String, String)>,
}

fn cond_pick(
    branches: &[Interval],
    prob: Option<f64>,
    policy: Policy,
    pos: Pos,
) -> Result<Interval, AnalyticError> {
    let first = branches.first().copied().unwrap_or(Interval::ZERO);
    Ok(match policy {
        Policy::Worst => branches.iter().fold(first, |a, b| a.max(*b)),
        Policy::Best => branches.iter().fold(first, |a, b| a.min(*b)),
        Policy::Mean => Interval::mean(branches).unwrap_or(Interval::ZERO),
        Policy::Probability { default_q } => {
            let q = prob.or(default_q).ok_or_else(|| AnalyticError::At {
                pos,
                msg: "this conditional has no probability: annotate it `if(Q){…}` or give a default Q".into(),
            })?;
            if branches.len() != 2 {
                return at(pos, "probability costing needs exactly two branches");
            }
            Interval::mix(q, branches[0], branches[1]).map_err(|e| AnalyticError::At {
                pos,
                msg: e.to_string(),
            })?
        }
    })
}

fn eval_cost(e: &CostExpr, m: usize, env: &mut Env) -> Result<Interval, AnalyticError> {
    Ok(match e {
        CostExpr::Key(k) => {
            let machine = env.mm.machine(m)?;
            let (iv, fb) = env.mm.cost(machine, *k)?;
            if let Some(f) = fb {
                env.fallbacks.insert((f.machine, f.wanted, f.used));
            }
            iv
        }
        CostExpr::Seconds(v) => Interval::point(*v),
        CostExpr::Sum(v) => {
            let mut acc = Interval::ZERO;
            for (k, x) in v {
                acc = acc + eval_cost(x, m, env)?.scale_unchecked_nonneg(*k);
            }
            acc
        }
        CostExpr::Cond {
            branches,
            prob,
            pos,
        } => {
            let mut bs = Vec::with_capacity(branches.len());
            for b in branches {
                bs.push(eval_cost(b, m, env)?);
            }
            cond_pick(&bs, *prob, env.policy, *pos)?
        }
    })
}

impl<'a> Env<'a> {
    fn machine(&self, r: MRef, w: Option<usize>) -> Result<usize, AnalyticError> {
        Ok(match r {
            MRef::Coord => 0,
            MRef::Fixed(k) => k,
            MRef::Worker => {
                let pos = w.ok_or_else(|| {
                    AnalyticError::Model("worker reference outside a reduction over p".into())
                })?;
                self.workers[pos]
            }
        })
    }

    fn count(&self, c: &Count, w: Option<usize>) -> Result<f64, AnalyticError> {
        Ok(match c {
            Count::Lit(v) => *v,
            Count::P => self.workers.len() as f64,
            Count::Rank => w.map(|x| x + 1).unwrap_or(0) as f64,
            Count::Share(n) => {
                let pos = w.ok_or_else(|| {
                    AnalyticError::Model("N*W[p] outside a reduction over p".into())
                })?;
                self.shares.get(n).map(|s| s[pos] as f64).unwrap_or(0.0)
            }
            Count::Bin(op, a, b) => {
                let (a, b) = (self.count(a, w)?, self.count(b, w)?);
                match op {
                    '+' => a + b,
                    '-' => a - b,
                    '*' => a * b,
                    _ => {
                        if b == 0.0 {
                            return Err(AnalyticError::Model("division by zero in a count".into()));
                        }
                        (a / b).floor()
                    }
                }
            }
        })
    }

    fn task(&mut self, f: usize, m: usize) -> Result<Interval, AnalyticError> {
        if let Some(iv) = self.task_cost.get(&(m, f)) {
            return Ok(*iv);
        }
        let c = self.c;
        let iv = eval_cost(&c.tasks[f].cost, m, self)?;
        self.task_cost.insert((m, f), iv);
        Ok(iv)
    }

    fn send(&mut self, a: usize, b: usize, size: &Size) -> Result<Interval, AnalyticError> {
        let bytes = match size {
            Size::Lit(v) => *v,
            Size::Of(f, batch) => {
                let k = size_key(*f, *batch);
                match self.c.sizes.get(&k) {
                    Some(v) if v.is_finite() => *v,
                    _ => {
                        return Err(AnalyticError::Model(format!(
                            "size {k} is not defined; add `{}(task[{batch},0])=BYTES;`",
                            f.name()
                        )))
                    }
                }
            }
        };
        let key = (a, b, bytes.to_bits());
        if let Some(iv) = self.sends.get(&key) {
            return Ok(*iv);
        }
        let (iv, fb) = self.mm.send_cost_indexed(&self.send_index, a, b, bytes)?;
        if let Some(f) = fb {
            self.fallbacks.insert((f.machine, f.wanted, f.used));
        }
        self.sends.insert(key, iv);
        Ok(iv)
    }

    fn eval(&mut self, e: &AExpr, w: Option<usize>) -> Result<Interval, AnalyticError> {
        Ok(match e {
            AExpr::Zero => Interval::ZERO,
            AExpr::Seconds(v) => Interval::point(*v),
            AExpr::Cost(k, m) => {
                let m = self.machine(*m, w)?;
                eval_cost(&CostExpr::Key(*k), m, self)?
            }
            AExpr::Task(f, m) => {
                let m = self.machine(*m, w)?;
                self.task(*f, m)?
            }
            AExpr::Send(a, b, s) => {
                let (a, b) = (self.machine(*a, w)?, self.machine(*b, w)?);
                self.send(a, b, s)?
            }
            AExpr::Add(v) => {
                let mut acc = Interval::ZERO;
                for x in v {
                    acc = acc + self.eval(x, w)?;
                }
                acc
            }
            AExpr::Max(v) => {
                let mut acc = Interval::ZERO;
                for x in v {
                    acc = acc.max(self.eval(x, w)?);
                }
                acc
            }
            AExpr::Scale(c, x) => {
                let k = self.count(c, w)?.max(0.0);
                if k == 0.0 {
                    Interval::ZERO
                } else {
                    self.eval(x, w)?.scale_unchecked_nonneg(k)
                }
            }
            AExpr::MaxIf(c, x) => {
                if self.count(c, w)? >= 1.0 {
                    self.eval(x, w)?
                } else {
                    Interval::ZERO
                }
            }
            AExpr::SumP(x) => {
                let mut acc = Interval::ZERO;
                for p in 0..self.workers.len() {
                    acc = acc + self.eval(x, Some(p))?;
                }
                acc
            }
            AExpr::MaxP(x) => self.max_p(x)?.0,
            AExpr::Cond {
                branches,
                prob,
                pos,
            } => {
                let mut bs = Vec::with_capacity(branches.len());
                for b in branches {
                    bs.push(self.eval(b, w)?);
                }
                cond_pick(&bs, *prob, self.policy, *pos)?
            }
        })
    }

    fn max_p(&mut self, x: &AExpr) -> Result<(Interval, Option<usize>), AnalyticError> {
        let mut acc = Interval::ZERO;
        let mut arg = None;
        for p in 0..self.workers.len() {
            let v = self.eval(x, Some(p))?;
            if arg.is_none() || v.hi > acc.hi {
                arg = Some(self.workers[p]);
            }
            acc = acc.max(v);
        }
        Ok((acc, arg))
    }
}

fn share_ns(e: &AExpr, out: &mut BTreeSet<u64>) {
    fn cn(c: &Count, out: &mut BTreeSet<u64>) {
        match c {
            Count::Share(n) => {
                out.insert(*n);
            }
            Count::Bin(_, a, b) => {
                cn(a, out);
                cn(b, out);
            }
            _ => {}
        }
    }
    match e {
        AExpr::Add(v) | AExpr::Max(v) => v.iter().for_each(|x| share_ns(x, out)),
        AExpr::Cond { branches, .. } => branches.iter().for_each(|x| share_ns(x, out)),
        AExpr::Scale(c, x) | AExpr::MaxIf(c, x) => {
            cn(c, out);
            share_ns(x, out)
        }
        AExpr::SumP(x) | AExpr::MaxP(x) => share_ns(x, out),
        _ => {}
    }
}

/// One evaluation: the interval, the per-term values, the shares per task count, and the
/// fallbacks used (machine, wanted key, used key).
type EvalOnce = (
    Interval,
    Vec<TermValue>,
    BTreeMap<u64, Vec<u64>>,
    BTreeSet<(usize, String, String)>,
);

fn eval_once(
    c: &Compiled,
    mm: &MachineModel,
    policy: Policy,
    workers: Vec<usize>,
) -> Result<EvalOnce, AnalyticError> {
    let mut ns = BTreeSet::new();
    for t in &c.terms {
        share_ns(&t.expr, &mut ns);
    }
    let mut weights = Vec::with_capacity(workers.len());
    for &w in &workers {
        let m = mm.machine(w)?;
        match m.w {
            Some(x) if x.is_finite() && x > 0.0 => weights.push(x),
            other => {
                return Err(MachineError::BadWeight {
                    machine: w,
                    w: other,
                }
                .into())
            }
        }
    }
    let mut shares = HashMap::new();
    let mut shares_out = BTreeMap::new();
    for n in ns {
        let s = static_shares(&weights, n, 1.0)?;
        shares_out.insert(n, s.clone());
        shares.insert(n, s);
    }
    let mut env = Env {
        c,
        mm,
        policy,
        workers,
        shares,
        task_cost: HashMap::new(),
        sends: HashMap::new(),
        send_index: mm.send_index(),
        fallbacks: BTreeSet::new(),
    };
    let mut terms = Vec::with_capacity(c.terms.len());
    let mut total = Interval::ZERO;
    for t in &c.terms {
        let (value, argmax_worker) = match &t.expr {
            AExpr::MaxP(x) => env.max_p(x)?,
            e => (env.eval(e, None)?, None),
        };
        total = total.max(value);
        terms.push(TermValue {
            name: t.name.clone(),
            meaning: t.meaning.clone(),
            value,
            argmax_worker,
        });
    }
    Ok((total, terms, shares_out, env.fallbacks))
}

/// Evaluate a compiled model on a machine model for a selection of workers (TPT).
pub fn evaluate(
    c: &Compiled,
    mm: &MachineModel,
    sel: &Selection,
    policy: Policy,
) -> Result<Prediction, AnalyticError> {
    let workers = match sel {
        Selection::Fastest(p) => {
            let all = mm.workers_by_speed()?;
            if *p == 0 || *p > all.len() {
                return Err(AnalyticError::Model(format!(
                    "P = {p} workers requested but the machine model has {} workers (indices >= 1)",
                    all.len()
                )));
            }
            all[..*p].to_vec()
        }
        Selection::Explicit(v) => {
            if v.is_empty() {
                return Err(AnalyticError::Model(
                    "the explicit worker list is empty".into(),
                ));
            }
            for &w in v {
                mm.machine(w)?;
            }
            v.clone()
        }
        Selection::Homogeneous { p, like } => {
            mm.machine(*like)?;
            if *p == 0 {
                return Err(AnalyticError::Model("P must be >= 1".into()));
            }
            vec![*like; *p]
        }
    };
    let (interval, terms, shares, fb) = eval_once(c, mm, policy, workers.clone())?;
    // Speedup against the fastest selected worker alone.
    let fastest = workers
        .iter()
        .copied()
        .max_by(|a, b| {
            let wa = mm.machine(*a).ok().and_then(|m| m.w).unwrap_or(0.0);
            let wb = mm.machine(*b).ok().and_then(|m| m.w).unwrap_or(0.0);
            wa.total_cmp(&wb).then(b.cmp(a))
        })
        .unwrap_or(workers[0]);
    let (one, _, _, _) = eval_once(c, mm, policy, vec![fastest])?;
    let speedup = if interval.mid() > 0.0 {
        one.mid() / interval.mid()
    } else {
        1.0
    };
    let pick = |f: fn(&Interval) -> f64| -> String {
        terms
            .iter()
            .fold(None::<&TermValue>, |best, t| match best {
                Some(b) if f(&b.value) >= f(&t.value) => Some(b),
                _ => Some(t),
            })
            .map(|t| t.name.clone())
            .unwrap_or_default()
    };
    let dominant_max = pick(|i| i.hi);
    let dominant_min = pick(|i| i.lo);
    let p = workers.len() as f64;
    Ok(Prediction {
        interval,
        terms,
        dominant_max,
        dominant_min,
        workers,
        shares,
        speedup,
        efficiency: speedup / p,
        fallbacks: fb
            .into_iter()
            .map(|(machine, wanted, used)| Fallback {
                machine,
                wanted,
                used,
            })
            .collect(),
    })
}
