//! SCAn for Rust: count the operations a task function executes, by op × type.
//!
//! [`analyse`] parses a Rust source file with `syn`, starts at one function and walks its body,
//! producing a cost tree ([`Node`]) that prints as an Extended-PAMELA `taskrun{}` body
//! ([`Analysis::to_pamela`]) and flattens into op × type counts ([`Analysis::counts`]).
//!
//! # The supported subset (anything else is an error naming its line and column)
//! * Items: `fn` with typed parameters (`name: T` or `mut name: T`) and `const NAME: T = expr;`
//!   (a constant folded at analysis time, free to read).
//! * Scalar types: `i8 u8` → `byte`, `i16 u16` → `short`, `i32 u32` → `int`,
//!   `i64 u64 i128 u128 isize usize` → `long`, `f32` → `float`, `f64` → `double`, `char`,
//!   `bool` → `boolean`; arrays `[T; N]`, slices `[T]`, `Vec<T>` and references to all of these.
//!   An unsuffixed integer literal takes the other operand's type, else `int`; a float literal
//!   `double`.
//! * Statements: `let x[: T] [= e];`, `x = e`, `x op= e`, `a[i] = e`, `a[i] op= e`, expression
//!   statements, `return e` as the last statement of a function.
//! * Expressions: literals, variables, `+ - * / %`, comparisons, `&& || ! -`, `& | ^ << >>`,
//!   `a[i]`, `e as T`, `(e)`, `&e`, `*e`, `[v; N]`, blocks, `if`/`else`, `match` (arms without
//!   guards), calls of functions defined in the same file (inlined) and `black_box(e)`.
//! * Loops: `for v in a..b`, `a..=b`, `(a..b).step_by(k)`, and `while v < e { …; v += k; }`
//!   (also `<= > >= !=` and `-=`), where the bounds and step are constants after constant
//!   propagation — through `let`, `const` and call arguments ([`analyse`]'s `args` give values
//!   to the entry function's parameters). `loop`, `break`, `continue`, closures, method calls,
//!   macros, structs and early returns are not supported.
//!
//! # Charges (thesis Tab. 4.1–4.4, Figs 4.17–4.20)
//! * reading a variable: `access`; constants and literals are free;
//! * `a op b`: the operands, then `op_T` (`sum sub mpy div mod`, `bit`, `shift`) on their type;
//!   comparisons: the operands, then `compare`; `&&`/`||`: both operands (short-circuiting is
//!   not modelled), then `and`/`or`; `-e`: `neg_T`; `!e`: `not_T`; `e as T`: `cast`;
//! * `let x: T = e` and `x = e`: `e`, then `assign_T`; `x op= e`: `access`, `e`, `op_T`,
//!   `assign_T` (so `i += 1` is Fig. 4.18's `access; sum_int; assign_int`);
//! * `a[i]` (read): the index, then `array_access`; `a[i] = e`: `e`, the index, `array_access`,
//!   `assign_T`; `[v; N]`: `v`, then `N × assign_T`;
//! * `for v in a..b {B}` (Fig. 4.18): `assign_T` (init), the condition once (`access`, the bound,
//!   `compare`), then `seq(i=1,N){ B; access; sum_T; assign_T; access; bound; compare; }`;
//! * `while c {B}`: `c` once, then `seq(i=1,N){ B; c }`;
//! * `if c {A} else {B}` (Fig. 4.19): `c`, then `if{A}else{B}` — both branches are kept, whatever
//!   constant propagation knows about `c`; the policy decides at costing time. `match s {…}`:
//!   `s`, then one branch per arm as an `if/else` chain;
//! * calls (Fig. 4.20): the arguments, then the callee's body inlined with the argument values;
//!   no call overhead is charged (the thesis had no call benchmark).
//!
//! ```
//! use mutirao_predict::analyse::analyse;
//! use mutirao_predict::analytic::Policy;
//! let src = "fn task(n: usize) -> f64 {
//!     let mut s: f64 = 0.0;
//!     for i in 0..n { s += 2.0 * (i as f64); }
//!     s
//! }";
//! let a = analyse(src, "task", &[("n".into(), 1000.0)]).unwrap();
//! let c = a.counts(Policy::Worst).unwrap();
//! assert_eq!(c["mpy_double"], 1000.0);
//! assert_eq!(c["cast"], 1000.0);
//! assert!(a.to_pamela().contains("seq(i=1,1000){"));
//! ```

use crate::analytic::Policy;
use crate::machine::{CostKey, DataType, Op};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use syn::spanned::Spanned;
use syn::visit::Visit;

/// An analysis error, with the place in the source (1-based line and column).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {column}: {msg}")]
pub struct AnalyseError {
    /// Line (1-based).
    pub line: usize,
    /// Column (1-based).
    pub column: usize,
    /// What is wrong and what to do.
    pub msg: String,
}

fn err_at<T>(s: &impl Spanned, msg: impl Into<String>) -> Result<T, AnalyseError> {
    let p = s.span().start();
    Err(AnalyseError {
        line: p.line,
        column: p.column + 1,
        msg: msg.into(),
    })
}

/// A node of the cost tree.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    /// One operation.
    Op(CostKey),
    /// `seq(i=1,trips){body}`.
    Loop {
        /// Number of iterations.
        trips: u64,
        /// Cost of one iteration.
        body: Vec<Node>,
    },
    /// `if{then}else{els}`: mutually exclusive blocks (the condition is charged before).
    If {
        /// The `if` block.
        then: Vec<Node>,
        /// The `else` block, if any.
        els: Option<Vec<Node>>,
    },
}

/// The result of analysing one function.
#[derive(Debug, Clone, PartialEq)]
pub struct Analysis {
    /// The entry function's name.
    pub function: String,
    /// Its cost tree.
    pub body: Vec<Node>,
}

fn add_counts(
    nodes: &[Node],
    k: f64,
    policy: Policy,
    out: &mut BTreeMap<String, f64>,
) -> Result<(), AnalyseError> {
    for n in nodes {
        match n {
            Node::Op(key) => *out.entry(key.to_string()).or_insert(0.0) += k,
            Node::Loop { trips, body } => add_counts(body, k * *trips as f64, policy, out)?,
            Node::If { then, els } => {
                let empty = Vec::new();
                let els = els.as_ref().unwrap_or(&empty);
                let total = |b: &[Node]| -> Result<f64, AnalyseError> {
                    let mut m = BTreeMap::new();
                    add_counts(b, 1.0, policy, &mut m)?;
                    Ok(m.values().sum())
                };
                let (wt, we) = match policy {
                    Policy::Worst => {
                        if total(then)? >= total(els)? {
                            (1.0, 0.0)
                        } else {
                            (0.0, 1.0)
                        }
                    }
                    Policy::Best => {
                        if total(then)? <= total(els)? {
                            (1.0, 0.0)
                        } else {
                            (0.0, 1.0)
                        }
                    }
                    Policy::Mean => (0.5, 0.5),
                    Policy::Probability { default_q: Some(q) } if (0.0..=1.0).contains(&q) => (q, 1.0 - q),
                    Policy::Probability { default_q } => {
                        return Err(AnalyseError {
                            line: 0,
                            column: 0,
                            msg: format!(
                                "the probability policy needs a branch probability Q in [0, 1] (got {default_q:?})"
                            ),
                        })
                    }
                };
                if wt > 0.0 {
                    add_counts(then, k * wt, policy, out)?;
                }
                if we > 0.0 {
                    add_counts(els, k * we, policy, out)?;
                }
            }
        }
    }
    Ok(())
}

fn print_nodes(nodes: &[Node], depth: usize, out: &mut String) {
    let ind = "   ".repeat(depth);
    for n in nodes {
        match n {
            Node::Op(k) => {
                let _ = writeln!(out, "{ind}{k};");
            }
            Node::Loop { trips, body } => {
                let _ = writeln!(out, "{ind}seq(i=1,{trips}){{");
                print_nodes(body, depth + 1, out);
                let _ = writeln!(out, "{ind}}}");
            }
            Node::If { then, els } => {
                let _ = writeln!(out, "{ind}if{{");
                print_nodes(then, depth + 1, out);
                match els {
                    Some(e) => {
                        let _ = writeln!(out, "{ind}}}else{{");
                        print_nodes(e, depth + 1, out);
                        let _ = writeln!(out, "{ind}}}");
                    }
                    None => {
                        let _ = writeln!(out, "{ind}}}");
                    }
                }
            }
        }
    }
}

impl Analysis {
    /// Op × type counts (keys as in the machine model: `sum_int`, `access`, …), with
    /// conditionals resolved by `policy`: `Worst`/`Best` take the branch with the most/fewest
    /// operations, `Mean` weighs both by ½, `Probability` by Q and 1−Q (its `default_q` is
    /// required).
    pub fn counts(&self, policy: Policy) -> Result<BTreeMap<String, f64>, AnalyseError> {
        let mut out = BTreeMap::new();
        add_counts(&self.body, 1.0, policy, &mut out)?;
        Ok(out)
    }

    /// The cost tree as the body of an Extended-PAMELA `taskrun{}` block (one op per line).
    pub fn to_pamela(&self) -> String {
        let mut s = String::new();
        print_nodes(&self.body, 0, &mut s);
        s
    }

    /// A complete task definition `NAME(p,0)={ taskrun{ … } }` for a model file.
    pub fn task_def(&self, name: &str) -> String {
        let mut s = format!("{name}(p,0)={{\n   taskrun{{\n");
        print_nodes(&self.body, 2, &mut s);
        s.push_str("   }\n}\n");
        s
    }
}

// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq)]
enum Ty {
    S(DataType),
    IntLit,
    FloatLit,
    Arr(DataType),
    Unit,
}

impl Ty {
    fn scalar(self) -> Option<DataType> {
        match self {
            Ty::S(t) => Some(t),
            Ty::IntLit => Some(DataType::Int),
            Ty::FloatLit => Some(DataType::Double),
            Ty::Arr(_) | Ty::Unit => None,
        }
    }
}

fn unify(a: Ty, b: Ty) -> Ty {
    match (a, b) {
        (Ty::S(_), _) => a,
        (_, Ty::S(_)) => b,
        (Ty::FloatLit, _) | (_, Ty::FloatLit) => Ty::FloatLit,
        (Ty::IntLit, _) | (_, Ty::IntLit) => Ty::IntLit,
        _ => a,
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Val {
    I(i128),
    F(f64),
    B(bool),
}

impl Val {
    fn as_f64(self) -> f64 {
        match self {
            Val::I(i) => i as f64,
            Val::F(f) => f,
            Val::B(b) => f64::from(u8::from(b)),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Var {
    ty: Ty,
    val: Option<Val>,
}

fn scalar_name(id: &str) -> Option<DataType> {
    Some(match id {
        "i8" | "u8" => DataType::Byte,
        "i16" | "u16" => DataType::Short,
        "i32" | "u32" => DataType::Int,
        "i64" | "u64" | "i128" | "u128" | "isize" | "usize" => DataType::Long,
        "f32" => DataType::Float,
        "f64" => DataType::Double,
        "char" => DataType::Char,
        "bool" => DataType::Boolean,
        _ => return None,
    })
}

fn map_type(t: &syn::Type) -> Result<Ty, AnalyseError> {
    match t {
        syn::Type::Reference(r) => map_type(&r.elem),
        syn::Type::Paren(p) => map_type(&p.elem),
        syn::Type::Tuple(tt) if tt.elems.is_empty() => Ok(Ty::Unit),
        syn::Type::Array(a) => elem_type(&a.elem),
        syn::Type::Slice(s) => elem_type(&s.elem),
        syn::Type::Path(p) if p.qself.is_none() => {
            let Some(last) = p.path.segments.last() else {
                return err_at(t, "empty type path");
            };
            let id = last.ident.to_string();
            if let Some(s) = scalar_name(&id) {
                return Ok(Ty::S(s));
            }
            if id == "Vec" {
                if let syn::PathArguments::AngleBracketed(args) = &last.arguments {
                    if let Some(syn::GenericArgument::Type(inner)) = args.args.first() {
                        return elem_type(inner);
                    }
                }
            }
            err_at(t, format!("type `{id}` is outside the supported subset (scalars, arrays, slices, Vec of scalars)"))
        }
        _ => err_at(
            t,
            "this type is outside the supported subset (scalars, arrays, slices, Vec of scalars)",
        ),
    }
}

fn elem_type(t: &syn::Type) -> Result<Ty, AnalyseError> {
    match map_type(t)? {
        Ty::S(s) | Ty::Arr(s) => Ok(Ty::Arr(s)),
        _ => err_at(t, "array elements must be scalars"),
    }
}

fn key(op: Op, ty: Option<DataType>) -> Node {
    Node::Op(CostKey { op, ty })
}

/// Variables assigned (or borrowed mutably) inside a loop body: unknown while it runs.
#[derive(Default)]
struct Assigned(HashSet<String>, HashMap<String, usize>);

fn base_ident(e: &syn::Expr) -> Option<String> {
    match e {
        syn::Expr::Path(p) => p.path.get_ident().map(|i| i.to_string()),
        syn::Expr::Index(i) => base_ident(&i.expr),
        syn::Expr::Paren(p) => base_ident(&p.expr),
        syn::Expr::Unary(u) => base_ident(&u.expr),
        _ => None,
    }
}

impl Assigned {
    fn note(&mut self, e: &syn::Expr) {
        if let Some(n) = base_ident(e) {
            *self.1.entry(n.clone()).or_insert(0) += 1;
            self.0.insert(n);
        }
    }
}

impl<'ast> Visit<'ast> for Assigned {
    fn visit_expr_assign(&mut self, e: &'ast syn::ExprAssign) {
        self.note(&e.left);
        syn::visit::visit_expr_assign(self, e);
    }
    fn visit_expr_binary(&mut self, e: &'ast syn::ExprBinary) {
        if compound(&e.op).is_some() {
            self.note(&e.left);
        }
        syn::visit::visit_expr_binary(self, e);
    }
    fn visit_expr_reference(&mut self, e: &'ast syn::ExprReference) {
        if e.mutability.is_some() {
            self.note(&e.expr);
        }
        syn::visit::visit_expr_reference(self, e);
    }
}

fn compound(op: &syn::BinOp) -> Option<Op> {
    use syn::BinOp as B;
    Some(match op {
        B::AddAssign(_) => Op::Sum,
        B::SubAssign(_) => Op::Sub,
        B::MulAssign(_) => Op::Mpy,
        B::DivAssign(_) => Op::Div,
        B::RemAssign(_) => Op::Mod,
        B::BitAndAssign(_) | B::BitOrAssign(_) | B::BitXorAssign(_) => Op::Bit,
        B::ShlAssign(_) | B::ShrAssign(_) => Op::Shift,
        _ => return None,
    })
}

struct Cx<'f> {
    fns: HashMap<String, &'f syn::ItemFn>,
    consts: HashMap<String, Var>,
    scopes: Vec<HashMap<String, Var>>,
    stack: Vec<String>,
}

const MAX_INLINE_DEPTH: usize = 64;

impl<'f> Cx<'f> {
    fn lookup(&self, name: &str) -> Option<(Var, bool)> {
        for s in self.scopes.iter().rev() {
            if let Some(v) = s.get(name) {
                return Some((*v, false));
            }
        }
        self.consts.get(name).map(|v| (*v, true))
    }

    fn set(&mut self, name: &str, val: Option<Val>) {
        for s in self.scopes.iter_mut().rev() {
            if let Some(v) = s.get_mut(name) {
                v.val = val;
                return;
            }
        }
    }

    fn declare(&mut self, name: String, v: Var) {
        if let Some(s) = self.scopes.last_mut() {
            s.insert(name, v);
        }
    }

    fn forget(&mut self, names: &HashSet<String>) {
        for n in names {
            self.set(n, None);
        }
    }

    fn block(
        &mut self,
        b: &syn::Block,
        out: &mut Vec<Node>,
        is_fn_body: bool,
    ) -> Result<(Ty, Option<Val>), AnalyseError> {
        self.scopes.push(HashMap::new());
        let r = self.stmts(&b.stmts, out, is_fn_body);
        self.scopes.pop();
        r
    }

    fn stmts(
        &mut self,
        stmts: &[syn::Stmt],
        out: &mut Vec<Node>,
        is_fn_body: bool,
    ) -> Result<(Ty, Option<Val>), AnalyseError> {
        let mut last = (Ty::Unit, None);
        for (i, s) in stmts.iter().enumerate() {
            let is_last = i + 1 == stmts.len();
            last = (Ty::Unit, None);
            match s {
                syn::Stmt::Local(l) => self.local(l, out)?,
                syn::Stmt::Item(it) => return err_at(
                    it,
                    "items inside function bodies are not supported; move them to the top level",
                ),
                syn::Stmt::Macro(m) => {
                    return err_at(
                        m,
                        "macros are not supported (only the documented subset is analysed)",
                    )
                }
                syn::Stmt::Expr(syn::Expr::Return(r), _) => {
                    if !(is_last && is_fn_body) {
                        return err_at(r, "early `return` is not supported: return only as the last statement of a function");
                    }
                    if let Some(e) = &r.expr {
                        last = self.expr(e, out)?;
                    }
                }
                syn::Stmt::Expr(e, semi) => {
                    let v = self.expr(e, out)?;
                    if semi.is_none() {
                        last = v;
                    }
                }
            }
        }
        Ok(last)
    }

    fn local(&mut self, l: &syn::Local, out: &mut Vec<Node>) -> Result<(), AnalyseError> {
        let (name, ann) = match &l.pat {
            syn::Pat::Ident(pi) if pi.subpat.is_none() => (pi.ident.to_string(), None),
            syn::Pat::Type(pt) => match &*pt.pat {
                syn::Pat::Ident(pi) if pi.subpat.is_none() => {
                    (pi.ident.to_string(), Some(map_type(&pt.ty)?))
                }
                other => {
                    return err_at(
                        other,
                        "only `let name` or `let name: T` bindings are supported",
                    )
                }
            },
            other => {
                return err_at(
                    other,
                    "only `let name` or `let name: T` bindings are supported",
                )
            }
        };
        let Some(init) = &l.init else {
            let Some(ty) = ann else {
                return err_at(&l.pat, "`let` without a value needs a type annotation");
            };
            self.declare(name, Var { ty, val: None });
            return Ok(());
        };
        if init.diverge.is_some() {
            return err_at(l, "`let … else` is not supported");
        }
        let (ety, val) = self.expr(&init.expr, out)?;
        let ty = match ann {
            Some(t) => t,
            None => match ety {
                Ty::IntLit => Ty::S(DataType::Int),
                Ty::FloatLit => Ty::S(DataType::Double),
                Ty::Unit => return err_at(&init.expr, "this expression has no value to bind"),
                t => t,
            },
        };
        if let Ty::S(t) = ty {
            out.push(key(Op::Assign, Some(t)));
        }
        let val = match (ty, val) {
            (Ty::S(t), Some(v)) => Some(convert(v, t)),
            _ => None,
        };
        self.declare(name, Var { ty, val });
        Ok(())
    }

    fn expr(
        &mut self,
        e: &syn::Expr,
        out: &mut Vec<Node>,
    ) -> Result<(Ty, Option<Val>), AnalyseError> {
        use syn::Expr as E;
        match e {
            E::Lit(l) => lit(&l.lit),
            E::Paren(p) => self.expr(&p.expr, out),
            E::Group(g) => self.expr(&g.expr, out),
            E::Reference(r) => self.expr(&r.expr, out),
            E::Path(p) => {
                let Some(id) = p.path.get_ident() else {
                    return err_at(p, "only plain variable and constant names are supported here");
                };
                let name = id.to_string();
                match self.lookup(&name) {
                    Some((v, true)) => Ok((v.ty, v.val)),
                    Some((v, false)) => {
                        if !matches!(v.ty, Ty::Arr(_)) {
                            out.push(key(Op::Access, None));
                        }
                        Ok((v.ty, v.val))
                    }
                    None => err_at(p, format!("`{name}` is not a variable, parameter or constant in scope")),
                }
            }
            E::Binary(b) => self.binary(b, out),
            E::Assign(a) => {
                let (rt, rv) = self.expr(&a.right, out)?;
                self.store(&a.left, rt, rv, None, out)?;
                Ok((Ty::Unit, None))
            }
            E::Unary(u) => {
                let (t, v) = self.expr(&u.expr, out)?;
                match u.op {
                    syn::UnOp::Deref(_) => Ok((t, v)),
                    syn::UnOp::Neg(_) => {
                        out.push(key(Op::Neg, t.scalar()));
                        let v = match v {
                            Some(Val::I(i)) => Some(Val::I(-i)),
                            Some(Val::F(f)) => Some(Val::F(-f)),
                            _ => None,
                        };
                        Ok((t, v))
                    }
                    syn::UnOp::Not(_) => {
                        out.push(key(Op::Not, t.scalar()));
                        let v = match v {
                            Some(Val::B(b)) => Some(Val::B(!b)),
                            _ => None,
                        };
                        Ok((t, v))
                    }
                    _ => err_at(u, "this unary operator is not supported"),
                }
            }
            E::Index(ix) => {
                let (bt, _) = self.expr(&ix.expr, out)?;
                self.expr(&ix.index, out)?;
                out.push(key(Op::ArrayAccess, None));
                match bt {
                    Ty::Arr(t) => Ok((Ty::S(t), None)),
                    _ => err_at(ix, "indexing something that is not an array, slice or Vec"),
                }
            }
            E::Cast(c) => {
                let (_, v) = self.expr(&c.expr, out)?;
                let ty = map_type(&c.ty)?;
                out.push(key(Op::Cast, None));
                let v = match (ty, v) {
                    (Ty::S(t), Some(v)) => Some(convert(v, t)),
                    _ => None,
                };
                Ok((ty, v))
            }
            E::Repeat(r) => {
                let (t, _) = self.expr(&r.expr, out)?;
                let Some(n) = self.const_count(&r.len)? else {
                    return err_at(&r.len, "the array length must be a constant");
                };
                let Some(st) = t.scalar() else {
                    return err_at(&r.expr, "array elements must be scalars");
                };
                if n > 0 {
                    out.push(Node::Loop {
                        trips: n,
                        body: vec![key(Op::Assign, Some(st))],
                    });
                }
                Ok((Ty::Arr(st), None))
            }
            E::Block(b) => {
                if b.label.is_some() {
                    return err_at(b, "labelled blocks are not supported");
                }
                self.block(&b.block, out, false)
            }
            E::If(i) => self.if_expr(i, out),
            E::Match(m) => self.match_expr(m, out),
            E::ForLoop(f) => self.for_loop(f, out),
            E::While(w) => self.while_loop(w, out),
            E::Call(c) => self.call(c, out),
            E::Loop(l) => err_at(l, "`loop` has no trip count the analyser can determine; use `for` over a constant range"),
            E::Break(b) => err_at(b, "`break` is not supported (trip counts must be fixed)"),
            E::Continue(c) => err_at(c, "`continue` is not supported (trip counts must be fixed)"),
            E::Return(r) => err_at(r, "early `return` is not supported: return only as the last statement of a function"),
            E::MethodCall(m) => err_at(m, format!("method call `.{}()` is not supported (only free functions of the same file are inlined)", m.method)),
            E::Closure(c) => err_at(c, "closures are not supported"),
            E::Macro(m) => err_at(m, "macros are not supported (only the documented subset is analysed)"),
            other => err_at(other, "this expression is outside the supported subset"),
        }
    }

    fn const_count(&mut self, e: &syn::Expr) -> Result<Option<u64>, AnalyseError> {
        let mut scratch = Vec::new();
        let (_, v) = self.expr(e, &mut scratch)?;
        Ok(match v {
            Some(Val::I(i)) if i >= 0 => u64::try_from(i).ok(),
            _ => None,
        })
    }

    fn binary(
        &mut self,
        b: &syn::ExprBinary,
        out: &mut Vec<Node>,
    ) -> Result<(Ty, Option<Val>), AnalyseError> {
        use syn::BinOp as B;
        if let Some(op) = compound(&b.op) {
            // x op= e: read x, e, op, store.
            let mut lhs_read = Vec::new();
            let (lt, lv) = self.expr(&b.left, &mut lhs_read)?;
            out.extend(lhs_read);
            let (rt, rv) = self.expr(&b.right, out)?;
            let t = unify(lt, rt);
            out.push(key(op, t.scalar()));
            let v = match (lv, rv) {
                (Some(x), Some(y)) => fold(op_char(&b.op), x, y),
                _ => None,
            };
            self.store_after_read(&b.left, t, v, out)?;
            return Ok((Ty::Unit, None));
        }
        let (lt, lv) = self.expr(&b.left, out)?;
        let (rt, rv) = self.expr(&b.right, out)?;
        let t = unify(lt, rt);
        let c = op_char(&b.op);
        let v = match (lv, rv) {
            (Some(x), Some(y)) => fold(c, x, y),
            _ => None,
        };
        let (node, ty) = match b.op {
            B::Add(_) => (key(Op::Sum, t.scalar()), t),
            B::Sub(_) => (key(Op::Sub, t.scalar()), t),
            B::Mul(_) => (key(Op::Mpy, t.scalar()), t),
            B::Div(_) => (key(Op::Div, t.scalar()), t),
            B::Rem(_) => (key(Op::Mod, t.scalar()), t),
            B::BitAnd(_) | B::BitOr(_) | B::BitXor(_) => (key(Op::Bit, t.scalar()), t),
            B::Shl(_) | B::Shr(_) => (key(Op::Shift, lt.scalar()), lt),
            B::And(_) => (key(Op::And, None), Ty::S(DataType::Boolean)),
            B::Or(_) => (key(Op::Or, None), Ty::S(DataType::Boolean)),
            B::Eq(_) | B::Ne(_) | B::Lt(_) | B::Le(_) | B::Gt(_) | B::Ge(_) => {
                (key(Op::Compare, None), Ty::S(DataType::Boolean))
            }
            _ => return err_at(b, "this binary operator is not supported"),
        };
        if matches!(ty, Ty::Arr(_) | Ty::Unit) {
            return err_at(b, "arithmetic on arrays or on `()` is not supported");
        }
        out.push(node);
        Ok((ty, v))
    }

    /// Store after `x op= e` (the read of x was charged already).
    fn store_after_read(
        &mut self,
        lhs: &syn::Expr,
        t: Ty,
        v: Option<Val>,
        out: &mut Vec<Node>,
    ) -> Result<(), AnalyseError> {
        match lhs {
            syn::Expr::Index(_) => {
                out.push(key(Op::Assign, t.scalar()));
                Ok(())
            }
            _ => self.store(lhs, t, v, Some(()), out),
        }
    }

    /// `lhs = value` (value already charged). `read_done` skips the index charges for `op=`.
    fn store(
        &mut self,
        lhs: &syn::Expr,
        rt: Ty,
        rv: Option<Val>,
        read_done: Option<()>,
        out: &mut Vec<Node>,
    ) -> Result<(), AnalyseError> {
        match lhs {
            syn::Expr::Path(p) => {
                let Some(id) = p.path.get_ident() else {
                    return err_at(p, "only plain variables can be assigned");
                };
                let name = id.to_string();
                match self.lookup(&name) {
                    Some((_, true)) => {
                        err_at(p, format!("`{name}` is a constant and cannot be assigned"))
                    }
                    Some((v, false)) => {
                        let t = match v.ty {
                            Ty::S(t) => t,
                            _ => {
                                return err_at(
                                    p,
                                    "whole arrays cannot be assigned; assign elements",
                                )
                            }
                        };
                        out.push(key(Op::Assign, Some(t)));
                        let _ = rt;
                        self.set(&name, rv.map(|x| convert(x, t)));
                        Ok(())
                    }
                    None => err_at(p, format!("`{name}` is not a variable in scope")),
                }
            }
            syn::Expr::Index(ix) if read_done.is_none() => {
                let (bt, _) = self.expr_base(&ix.expr, out)?;
                self.expr(&ix.index, out)?;
                out.push(key(Op::ArrayAccess, None));
                let t = match bt {
                    Ty::Arr(t) => t,
                    _ => {
                        return err_at(ix, "indexing something that is not an array, slice or Vec")
                    }
                };
                out.push(key(Op::Assign, Some(t)));
                Ok(())
            }
            syn::Expr::Paren(p) => self.store(&p.expr, rt, rv, read_done, out),
            syn::Expr::Unary(u) if matches!(u.op, syn::UnOp::Deref(_)) => {
                self.store(&u.expr, rt, rv, read_done, out)
            }
            other => err_at(
                other,
                "this assignment target is not supported (use a variable or `a[i]`)",
            ),
        }
    }

    /// The array being stored into (`a` of `a[i][j] = …` charges the inner index reads).
    fn expr_base(
        &mut self,
        e: &syn::Expr,
        out: &mut Vec<Node>,
    ) -> Result<(Ty, Option<Val>), AnalyseError> {
        match e {
            syn::Expr::Index(ix) => {
                let (bt, _) = self.expr_base(&ix.expr, out)?;
                self.expr(&ix.index, out)?;
                out.push(key(Op::ArrayAccess, None));
                Ok((bt, None))
            }
            _ => self.expr(e, out),
        }
    }

    fn if_expr(
        &mut self,
        i: &syn::ExprIf,
        out: &mut Vec<Node>,
    ) -> Result<(Ty, Option<Val>), AnalyseError> {
        self.expr(&i.cond, out)?;
        let mut then = Vec::new();
        let (t, _) = self.block(&i.then_branch, &mut then, false)?;
        let els = match &i.else_branch {
            None => None,
            Some((_, e)) => {
                let mut b = Vec::new();
                self.expr(e, &mut b)?;
                Some(b)
            }
        };
        out.push(Node::If { then, els });
        Ok((t, None))
    }

    fn match_expr(
        &mut self,
        m: &syn::ExprMatch,
        out: &mut Vec<Node>,
    ) -> Result<(Ty, Option<Val>), AnalyseError> {
        self.expr(&m.expr, out)?;
        let mut branches = Vec::new();
        let mut ty = Ty::Unit;
        for arm in &m.arms {
            if let Some((_, g)) = &arm.guard {
                return err_at(g, "match guards are not supported");
            }
            let mut b = Vec::new();
            self.scopes.push(HashMap::new());
            let r = self.expr(&arm.body, &mut b);
            self.scopes.pop();
            ty = r?.0;
            branches.push(b);
        }
        // Arms a, b, c → if{a}else{if{b}else{c}}.
        let mut acc: Option<Vec<Node>> = None;
        while let Some(b) = branches.pop() {
            acc = Some(match acc {
                None => b,
                Some(rest) => vec![Node::If {
                    then: b,
                    els: Some(rest),
                }],
            });
        }
        if let Some(nodes) = acc {
            out.extend(nodes);
        }
        Ok((ty, None))
    }

    fn bound(&mut self, e: &syn::Expr, what: &str) -> Result<(Ty, Vec<Node>, i128), AnalyseError> {
        let mut cost = Vec::new();
        let (t, v) = self.expr(e, &mut cost)?;
        match v {
            Some(Val::I(i)) => Ok((t, cost, i)),
            _ => err_at(e, format!("the loop's {what} is not a constant integer after constant propagation; give it a value (a literal, a `const`, or a constant argument — `--arg name=value` for the entry function)")),
        }
    }

    fn for_loop(
        &mut self,
        f: &syn::ExprForLoop,
        out: &mut Vec<Node>,
    ) -> Result<(Ty, Option<Val>), AnalyseError> {
        if f.label.is_some() {
            return err_at(f, "loop labels are not supported");
        }
        let var = match &*f.pat {
            syn::Pat::Ident(pi) => Some(pi.ident.to_string()),
            syn::Pat::Wild(_) => None,
            other => return err_at(other, "the loop variable must be a name or `_`"),
        };
        let (range, step) = match &*f.expr {
            syn::Expr::MethodCall(mc) if mc.method == "step_by" && mc.args.len() == 1 => {
                let (_, _, k) = self.bound(&mc.args[0], "step")?;
                if k <= 0 {
                    return err_at(&mc.args[0], "the step must be positive");
                }
                (strip(&mc.receiver), k)
            }
            other => (strip(other), 1),
        };
        let syn::Expr::Range(r) = range else {
            return err_at(
                &f.expr,
                "only `for v in a..b`, `a..=b` and `(a..b).step_by(k)` loops are supported",
            );
        };
        let (Some(lo_e), Some(hi_e)) = (&r.start, &r.end) else {
            return err_at(r, "the range needs both bounds");
        };
        let (lt, lo_cost, lo) = self.bound(lo_e, "start")?;
        let (ht, hi_cost, hi) = self.bound(hi_e, "end")?;
        let inclusive = matches!(r.limits, syn::RangeLimits::Closed(_));
        let span = if inclusive { hi - lo + 1 } else { hi - lo };
        let trips = if span <= 0 {
            0
        } else {
            (span + step - 1) / step
        };
        let trips = u64::try_from(trips).unwrap_or(u64::MAX);
        let t = unify(lt, ht).scalar().unwrap_or(DataType::Int);
        // init, then the condition once.
        out.extend(lo_cost);
        out.push(key(Op::Assign, Some(t)));
        let cond: Vec<Node> = [key(Op::Access, None)]
            .into_iter()
            .chain(hi_cost)
            .chain([key(Op::Compare, None)])
            .collect();
        out.extend(cond.iter().cloned());
        let mut asg = Assigned::default();
        asg.visit_block(&f.body);
        self.forget(&asg.0);
        let mut body = Vec::new();
        self.scopes.push(HashMap::new());
        if let Some(v) = var {
            self.declare(
                v,
                Var {
                    ty: Ty::S(t),
                    val: None,
                },
            );
        }
        let r = self.block(&f.body, &mut body, false);
        self.scopes.pop();
        r?;
        body.extend([
            key(Op::Access, None),
            key(Op::Sum, Some(t)),
            key(Op::Assign, Some(t)),
        ]);
        body.extend(cond);
        if trips > 0 {
            out.push(Node::Loop { trips, body });
        }
        Ok((Ty::Unit, None))
    }

    fn while_loop(
        &mut self,
        w: &syn::ExprWhile,
        out: &mut Vec<Node>,
    ) -> Result<(Ty, Option<Val>), AnalyseError> {
        let shape = "the supported form is `while v < bound { …; v += step; }` (or `<=`, `>`, `>=`, `!=`, `-=`) with constant start, bound and step, and `v` changed only by that one statement at the end of the body";
        if w.label.is_some() {
            return err_at(w, "loop labels are not supported");
        }
        let syn::Expr::Binary(c) = strip(&w.cond) else {
            return err_at(
                &w.cond,
                format!("cannot determine this while loop's trip count: {shape}"),
            );
        };
        let Some(var) =
            base_ident(&c.left).filter(|_| matches!(strip(&c.left), syn::Expr::Path(_)))
        else {
            return err_at(
                &c.left,
                format!("cannot determine this while loop's trip count: {shape}"),
            );
        };
        let Some((v, false)) = self.lookup(&var) else {
            return err_at(&c.left, format!("`{var}` is not a variable in scope"));
        };
        let mut asg = Assigned::default();
        asg.visit_block(&w.body);
        let last_step = w.body.stmts.last().and_then(|s| match s {
            syn::Stmt::Expr(syn::Expr::Binary(b), _)
                if base_ident(&b.left).as_deref() == Some(var.as_str())
                    && matches!(strip(&b.left), syn::Expr::Path(_)) =>
            {
                match b.op {
                    syn::BinOp::AddAssign(_) => Some((1i128, &b.right)),
                    syn::BinOp::SubAssign(_) => Some((-1, &b.right)),
                    _ => None,
                }
            }
            _ => None,
        });
        let Some((sign, step_e)) = last_step else {
            return err_at(
                w,
                format!("cannot determine this while loop's trip count: {shape}"),
            );
        };
        if asg.1.get(&var).copied().unwrap_or(0) != 1 {
            return err_at(
                w,
                format!("`{var}` is changed more than once in the loop: {shape}"),
            );
        }
        let mut scratch = Vec::new();
        let (_, sv) = self.expr(step_e, &mut scratch)?;
        let mut scratch2 = Vec::new();
        let (_, bv) = self.expr(&c.right, &mut scratch2)?;
        let (Some(start), Some(bound), Some(step)) = (v.val, bv, sv) else {
            return err_at(&w.cond, format!("the start, bound or step of this loop is not constant after constant propagation: {shape}"));
        };
        let (s0, b, st) = (start.as_f64(), bound.as_f64(), sign as f64 * step.as_f64());
        if !(st.is_finite() && st != 0.0 && s0.is_finite() && b.is_finite()) {
            return err_at(step_e, "the step must be a non-zero finite constant");
        }
        use syn::BinOp as B;
        // Number of k >= 0 with cond(s0 + k·st) true, for a monotone condition.
        let n = match c.op {
            B::Lt(_) if st > 0.0 => ((b - s0) / st).ceil(),
            B::Le(_) if st > 0.0 => ((b - s0) / st).floor() + 1.0,
            B::Gt(_) if st < 0.0 => ((s0 - b) / -st).ceil(),
            B::Ge(_) if st < 0.0 => ((s0 - b) / -st).floor() + 1.0,
            B::Ne(_) => {
                let k = (b - s0) / st;
                if k < 0.0 || k.fract() != 0.0 {
                    return err_at(&w.cond, "this `!=` loop never reaches its bound");
                }
                k
            }
            _ => {
                return err_at(
                    &w.cond,
                    format!(
                        "this loop does not terminate or has an unsupported condition: {shape}"
                    ),
                )
            }
        };
        let trips = if n > 0.0 { n as u64 } else { 0 };
        let mut cond = Vec::new();
        self.expr(&w.cond, &mut cond)?;
        out.extend(cond.iter().cloned());
        self.forget(&asg.0);
        let mut body = Vec::new();
        self.block(&w.body, &mut body, false)?;
        body.extend(cond);
        if trips > 0 {
            out.push(Node::Loop { trips, body });
        }
        let end = s0 + trips as f64 * st;
        let final_val = match start {
            Val::I(_) => Some(Val::I(end as i128)),
            Val::F(_) => Some(Val::F(end)),
            Val::B(_) => None,
        };
        self.set(&var, final_val);
        Ok((Ty::Unit, None))
    }

    fn call(
        &mut self,
        c: &syn::ExprCall,
        out: &mut Vec<Node>,
    ) -> Result<(Ty, Option<Val>), AnalyseError> {
        let syn::Expr::Path(p) = &*c.func else {
            return err_at(&c.func, "only calls of named functions are supported");
        };
        let Some(last) = p.path.segments.last() else {
            return err_at(p, "empty function path");
        };
        let name = last.ident.to_string();
        if name == "black_box" && c.args.len() == 1 {
            return self.expr(&c.args[0], out);
        }
        let Some(f) = self
            .fns
            .get(&name)
            .copied()
            .filter(|_| p.path.segments.len() == 1)
        else {
            return err_at(p, format!("call of `{name}`, which is not a function of this file; only functions of the analysed file are inlined"));
        };
        if self.stack.contains(&name) {
            return err_at(
                c,
                format!("`{name}` is recursive; recursion has no fixed operation count"),
            );
        }
        if self.stack.len() >= MAX_INLINE_DEPTH {
            return err_at(c, "calls nest too deeply to inline");
        }
        if f.sig.inputs.len() != c.args.len() {
            return err_at(
                c,
                format!(
                    "`{name}` takes {} arguments, {} given",
                    f.sig.inputs.len(),
                    c.args.len()
                ),
            );
        }
        let mut frame = HashMap::new();
        for (param, arg) in f.sig.inputs.iter().zip(&c.args) {
            let (at, av) = self.expr(arg, out)?;
            let (pname, pty) = param_of(param)?;
            let ty = match pty {
                Ty::S(t) => Ty::S(t),
                other => {
                    let _ = at;
                    other
                }
            };
            let val = match (ty, av) {
                (Ty::S(t), Some(v)) => Some(convert(v, t)),
                _ => None,
            };
            frame.insert(pname, Var { ty, val });
        }
        let ret = ret_type(&f.sig)?;
        let saved = std::mem::replace(&mut self.scopes, vec![frame]);
        self.stack.push(name);
        let r = self.block(&f.block, out, true);
        self.stack.pop();
        self.scopes = saved;
        let (_, v) = r?;
        let v = match (ret, v) {
            (Ty::S(t), Some(v)) => Some(convert(v, t)),
            _ => None,
        };
        Ok((ret, v))
    }
}

fn strip(e: &syn::Expr) -> &syn::Expr {
    match e {
        syn::Expr::Paren(p) => strip(&p.expr),
        syn::Expr::Group(g) => strip(&g.expr),
        other => other,
    }
}

fn param_of(a: &syn::FnArg) -> Result<(String, Ty), AnalyseError> {
    match a {
        syn::FnArg::Typed(pt) => match &*pt.pat {
            syn::Pat::Ident(pi) if pi.subpat.is_none() => {
                Ok((pi.ident.to_string(), map_type(&pt.ty)?))
            }
            other => err_at(other, "parameters must be plain names"),
        },
        syn::FnArg::Receiver(r) => err_at(r, "methods (`self`) are not supported"),
    }
}

fn ret_type(sig: &syn::Signature) -> Result<Ty, AnalyseError> {
    match &sig.output {
        syn::ReturnType::Default => Ok(Ty::Unit),
        syn::ReturnType::Type(_, t) => map_type(t),
    }
}

fn lit(l: &syn::Lit) -> Result<(Ty, Option<Val>), AnalyseError> {
    match l {
        syn::Lit::Int(i) => {
            let v: i128 = match i.base10_parse() {
                Ok(v) => v,
                Err(_) => return err_at(i, "integer literal out of range"),
            };
            let ty = match i.suffix() {
                "" => Ty::IntLit,
                s => match scalar_name(s) {
                    Some(t) => Ty::S(t),
                    None => return err_at(i, format!("unknown literal suffix `{s}`")),
                },
            };
            Ok((
                ty,
                Some(Val::I(v)).map(|v| match ty {
                    Ty::S(t) => convert(v, t),
                    _ => v,
                }),
            ))
        }
        syn::Lit::Float(f) => {
            let v: f64 = match f.base10_parse() {
                Ok(v) => v,
                Err(_) => return err_at(f, "bad float literal"),
            };
            let ty = match f.suffix() {
                "" => Ty::FloatLit,
                "f32" => Ty::S(DataType::Float),
                "f64" => Ty::S(DataType::Double),
                s => return err_at(f, format!("unknown literal suffix `{s}`")),
            };
            Ok((ty, Some(Val::F(v))))
        }
        syn::Lit::Bool(b) => Ok((Ty::S(DataType::Boolean), Some(Val::B(b.value)))),
        syn::Lit::Char(_) => Ok((Ty::S(DataType::Char), None)),
        other => err_at(
            other,
            "this literal is not supported (numbers, booleans and chars only)",
        ),
    }
}

fn convert(v: Val, t: DataType) -> Val {
    match (t, v) {
        (DataType::Float | DataType::Double, Val::I(i)) => Val::F(i as f64),
        (
            DataType::Byte | DataType::Short | DataType::Int | DataType::Long | DataType::Char,
            Val::F(f),
        ) => Val::I(f.trunc() as i128),
        (_, v) => v,
    }
}

fn op_char(op: &syn::BinOp) -> char {
    use syn::BinOp as B;
    match op {
        B::Add(_) | B::AddAssign(_) => '+',
        B::Sub(_) | B::SubAssign(_) => '-',
        B::Mul(_) | B::MulAssign(_) => '*',
        B::Div(_) | B::DivAssign(_) => '/',
        B::Rem(_) | B::RemAssign(_) => '%',
        B::Lt(_) => '<',
        B::Le(_) => 'l',
        B::Gt(_) => '>',
        B::Ge(_) => 'g',
        B::Eq(_) => '=',
        B::Ne(_) => '!',
        _ => '?',
    }
}

fn fold(c: char, x: Val, y: Val) -> Option<Val> {
    match (x, y) {
        (Val::I(a), Val::I(b)) => Some(match c {
            '+' => Val::I(a.checked_add(b)?),
            '-' => Val::I(a.checked_sub(b)?),
            '*' => Val::I(a.checked_mul(b)?),
            '/' => Val::I(a.checked_div(b)?),
            '%' => Val::I(a.checked_rem(b)?),
            '<' => Val::B(a < b),
            'l' => Val::B(a <= b),
            '>' => Val::B(a > b),
            'g' => Val::B(a >= b),
            '=' => Val::B(a == b),
            '!' => Val::B(a != b),
            _ => return None,
        }),
        (Val::B(_), _) | (_, Val::B(_)) => None,
        (a, b) => {
            let (a, b) = (a.as_f64(), b.as_f64());
            Some(match c {
                '+' => Val::F(a + b),
                '-' => Val::F(a - b),
                '*' => Val::F(a * b),
                '/' => Val::F(a / b),
                '%' => Val::F(a % b),
                '<' => Val::B(a < b),
                'l' => Val::B(a <= b),
                '>' => Val::B(a > b),
                'g' => Val::B(a >= b),
                '=' => Val::B(a == b),
                '!' => Val::B(a != b),
                _ => return None,
            })
        }
    }
}

/// Analyse function `function` of Rust source `src`. `args` gives constant values to the
/// entry function's parameters (by name); parameters without a value are unknown, which is
/// fine unless they set a trip count.
pub fn analyse(
    src: &str,
    function: &str,
    args: &[(String, f64)],
) -> Result<Analysis, AnalyseError> {
    let file = syn::parse_file(src).map_err(|e| {
        let p = e.span().start();
        AnalyseError {
            line: p.line,
            column: p.column + 1,
            msg: format!("not valid Rust: {e}"),
        }
    })?;
    let mut cx = Cx {
        fns: HashMap::new(),
        consts: HashMap::new(),
        scopes: Vec::new(),
        stack: Vec::new(),
    };
    for it in &file.items {
        match it {
            syn::Item::Fn(f) => {
                let previous = cx.fns.insert(f.sig.ident.to_string(), f);
                if previous.is_some() {
                    return err_at(
                        &f.sig.ident,
                        format!("function `{}` is defined twice", f.sig.ident),
                    );
                }
            }
            syn::Item::Const(c) => {
                let ty = map_type(&c.ty)?;
                let mut scratch = Vec::new();
                let (_, v) = cx.expr(&c.expr, &mut scratch)?;
                let v = match (ty, v) {
                    (Ty::S(t), Some(v)) => Some(convert(v, t)),
                    _ => None,
                };
                cx.consts.insert(c.ident.to_string(), Var { ty, val: v });
            }
            _ => {}
        }
    }
    let Some(f) = cx.fns.get(function).copied() else {
        let mut names: Vec<&String> = cx.fns.keys().collect();
        names.sort();
        return Err(AnalyseError {
            line: 1,
            column: 1,
            msg: format!("no function `{function}` in this file (functions: {names:?})"),
        });
    };
    let known: HashSet<String> = f
        .sig
        .inputs
        .iter()
        .filter_map(|a| param_of(a).ok().map(|p| p.0))
        .collect();
    for (n, _) in args {
        if !known.contains(n) {
            return Err(AnalyseError {
                line: f.sig.ident.span().start().line,
                column: f.sig.ident.span().start().column + 1,
                msg: format!("`{function}` has no parameter `{n}`"),
            });
        }
    }
    let mut frame = HashMap::new();
    for a in &f.sig.inputs {
        let (name, ty) = param_of(a)?;
        let val = args
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| match ty {
                Ty::S(t) => convert(Val::F(*v), t),
                _ => Val::F(*v),
            });
        frame.insert(name, Var { ty, val });
    }
    cx.scopes.push(frame);
    cx.stack.push(function.to_string());
    let mut body = Vec::new();
    cx.block(&f.block, &mut body, true)?;
    Ok(Analysis {
        function: function.to_string(),
        body,
    })
}
