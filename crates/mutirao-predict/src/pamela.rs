//! The Extended-PAMELA model language (thesis Appendix A.3): abstract syntax, parser and
//! printer.
//!
//! # Syntax
//! ```text
//! file      := { item }                       items end at a newline (or `;`) outside brackets
//! item      := NAME "=" INT [";"]             constant            COORD=0;
//!            | NAME "=" process               named process       L=L_0;L_1;L_2
//!            | "task" "[" int "," int "]" "(" int ")" "=" NAME "(" args ")" [";"]
//!                                             task map            task[1,taskNumber](p)=ProcessData(p,taskNumber);
//!            | NAME "(" args ")" "=" block    task cost function  ProcessData(p,0)={ taskrun{ … } }
//!            | SIZEFN "(" "task" "[" int "," int "]" ")" "=" NUMBER [";"]
//!                                             size (bytes)        codeSize(task[1,0])=879;
//! process   := par { ";" par }                sequential composition
//! par       := atom { ("||" | "‖") atom }     parallel composition
//! block     := "{" { par [";"] } "}"          statements in sequence (newlines are spaces)
//! atom      := block | "(" process ")"
//!            | ("seq" | "par" | "for") "(" NAME "=" int "," int ")" block
//!            | "use" "(" resource "," atom ")" | "delay" "(" atom ")"
//!            | "if" [ "(" PROB ")" ] block [ "else" (block | if) ]
//!            | "taskrun" block
//!            | "task" "[" int "," int "]" "(" int ")"          a task's cost on a machine
//!            | "send" "[" int "," int "]" "(" size ")"          a send's cost
//!            | NUMBER "*" atom | NUMBER                         count × cost | seconds
//!            | NAME "=" int                                     counter update (id=id+1)
//!            | NAME                                             cost (assign_int) or process name
//! resource  := int (a machine: COORD, p, 0) | NAME (a shared resource: net) | NAME "[" int "]"
//! size      := NUMBER | SIZEFN "(" "task" "[" int "," int "]" ")"
//! int       := integer expression over literals, names, `W[p]`, + − × ÷ and parentheses
//! SIZEFN    := codeSize | dataSizeIn | dataSizeOut
//! ```
//! Comments run from `//` to the end of the line. Cost names may carry the thesis's `_p`
//! suffix (`assign_int_p`), which is ignored.

use serde::Serialize;
use std::fmt::{self, Write as _};

/// A source position, 1-based.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Serialize)]
pub struct Pos {
    /// Line.
    pub line: usize,
    /// Column (characters).
    pub col: usize,
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}, column {}", self.line, self.col)
    }
}

/// A syntax error with its position.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{pos}: {msg}")]
pub struct ParseError {
    /// Where.
    pub pos: Pos,
    /// What was wrong and what was expected.
    pub msg: String,
}

/// Integer expressions (reduction bounds, machine indices, counters).
#[derive(Debug, Clone, PartialEq)]
pub enum IntExpr {
    /// A literal.
    Lit(i64),
    /// A name: `P`, a constant, a reduction variable, a counter.
    Var(String, Pos),
    /// `NAME[index]`, e.g. `W[p]`.
    Index(String, Box<IntExpr>, Pos),
    /// A binary operation `+ - * /`.
    Bin(char, Box<IntExpr>, Box<IntExpr>),
}

/// Size functions of a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum SizeFn {
    /// Size of the task's class, shipped once to each worker.
    CodeSize,
    /// Size of a task's input data.
    DataSizeIn,
    /// Size of a task's output data.
    DataSizeOut,
}

impl SizeFn {
    /// The name used in the language.
    pub fn name(self) -> &'static str {
        match self {
            SizeFn::CodeSize => "codeSize",
            SizeFn::DataSizeIn => "dataSizeIn",
            SizeFn::DataSizeOut => "dataSizeOut",
        }
    }
    fn from_name(s: &str) -> Option<SizeFn> {
        match s {
            "codeSize" => Some(SizeFn::CodeSize),
            "dataSizeIn" => Some(SizeFn::DataSizeIn),
            "dataSizeOut" => Some(SizeFn::DataSizeOut),
            _ => None,
        }
    }
}

/// A message size: a literal or a size function of a task.
#[derive(Debug, Clone, PartialEq)]
pub enum SizeExpr {
    /// Bytes.
    Lit(f64),
    /// `fn(task[batch,task])`.
    Of {
        /// The function.
        func: SizeFn,
        /// Batch.
        batch: IntExpr,
        /// Task number.
        task: IntExpr,
        /// Where.
        pos: Pos,
    },
}

/// Reduction kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedKind {
    /// `seq(i=a,b)`.
    Seq,
    /// `for(i=a,b)`: an alias of `seq` (Fig. 4.22), printed as written.
    For,
    /// `par(i=a,b)`.
    Par,
}

/// A process or cost statement.
#[derive(Debug, Clone, PartialEq)]
pub enum Stmt {
    /// `a ; b ; …`
    Seq(Vec<Stmt>),
    /// `a || b || …`
    Par(Vec<Stmt>),
    /// `{ … }` (sequential).
    Block(Vec<Stmt>),
    /// A name: a cost parameter or a named process.
    Name(String, Pos),
    /// `count * stmt`.
    Mul(f64, Box<Stmt>, Pos),
    /// A delay given in seconds.
    Seconds(f64, Pos),
    /// `seq/par/for(var=lo,hi){body}`.
    Reduce {
        /// Kind.
        kind: RedKind,
        /// Bound variable.
        var: String,
        /// Lower bound (inclusive).
        lo: IntExpr,
        /// Upper bound (inclusive).
        hi: IntExpr,
        /// Body.
        body: Vec<Stmt>,
        /// Where.
        pos: Pos,
    },
    /// `use(resource, tau)`.
    Use {
        /// The resource.
        res: IntExpr,
        /// The cost.
        tau: Box<Stmt>,
        /// Where.
        pos: Pos,
    },
    /// `delay(tau)`.
    Delay(Box<Stmt>, Pos),
    /// `if[(q)]{…}[else{…}]`.
    If {
        /// Optional branch probability of the `if` block.
        prob: Option<f64>,
        /// The `if` block.
        then: Vec<Stmt>,
        /// The `else` block.
        els: Option<Vec<Stmt>>,
        /// Where.
        pos: Pos,
    },
    /// `taskrun{…}`.
    Taskrun(Vec<Stmt>),
    /// `task[batch,task](machine)`.
    Task {
        /// Batch.
        batch: IntExpr,
        /// Task number.
        task: IntExpr,
        /// Machine.
        machine: IntExpr,
        /// Where.
        pos: Pos,
    },
    /// `send[from,to](size)`.
    Send {
        /// Sender machine.
        from: IntExpr,
        /// Receiver machine.
        to: IntExpr,
        /// Size.
        size: SizeExpr,
        /// Where.
        pos: Pos,
    },
    /// `var = value` (the thesis's task counter `id`; no cost).
    Counter {
        /// Variable.
        var: String,
        /// New value.
        value: IntExpr,
    },
}

/// A top-level item of a model file.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    /// `NAME=INT;`
    Const {
        /// Name.
        name: String,
        /// Value.
        value: i64,
        /// Where.
        pos: Pos,
    },
    /// `NAME=process`
    Process {
        /// Name.
        name: String,
        /// Body.
        body: Stmt,
        /// Where.
        pos: Pos,
    },
    /// `task[b,t](m)=Func(args);`
    TaskMap {
        /// Batch.
        batch: IntExpr,
        /// Task-number pattern.
        task: IntExpr,
        /// Machine parameter.
        machine: IntExpr,
        /// Function name.
        func: String,
        /// Arguments.
        args: Vec<IntExpr>,
        /// Where.
        pos: Pos,
    },
    /// `Func(args)={…}`
    TaskDef {
        /// Function name.
        name: String,
        /// Parameters.
        params: Vec<IntExpr>,
        /// Body block.
        body: Vec<Stmt>,
        /// Where.
        pos: Pos,
    },
    /// `sizefn(task[b,t])=N;`
    Size {
        /// The function.
        func: SizeFn,
        /// Batch.
        batch: IntExpr,
        /// Task number.
        task: IntExpr,
        /// Bytes.
        value: f64,
        /// Where.
        pos: Pos,
    },
}

/// A parsed model file.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ModelFile {
    /// Items in source order.
    pub items: Vec<Item>,
}

// ---------------------------------------------------------------------------------------------
// Lexer

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Num(f64, bool), // value, is_integer
    P(char),        // = ; , ( ) [ ] { } + - * /
    ParBar,         // || or ‖
    Newline,
    Eof,
}

#[derive(Debug, Clone)]
struct Token {
    tok: Tok,
    pos: Pos,
}

fn lex(src: &str) -> Result<Vec<Token>, ParseError> {
    let mut out = Vec::new();
    let chars: Vec<char> = src.chars().collect();
    let (mut i, mut line, mut col) = (0usize, 1usize, 1usize);
    while i < chars.len() {
        let c = chars[i];
        let pos = Pos { line, col };
        if c == '\n' {
            out.push(Token {
                tok: Tok::Newline,
                pos,
            });
            i += 1;
            line += 1;
            col = 1;
            continue;
        }
        if c.is_whitespace() {
            i += 1;
            col += 1;
            continue;
        }
        if c == '/' && chars.get(i + 1) == Some(&'/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
            continue;
        }
        if c.is_ascii_alphabetic() || c == '_' {
            let s = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[s..i].iter().collect();
            col += i - s;
            out.push(Token {
                tok: Tok::Ident(word),
                pos,
            });
            continue;
        }
        if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit()))
        {
            let s = i;
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
            if i < chars.len() && (chars[i] == 'e' || chars[i] == 'E') {
                let save = i;
                i += 1;
                if i < chars.len() && (chars[i] == '-' || chars[i] == '+') {
                    i += 1;
                }
                if i < chars.len() && chars[i].is_ascii_digit() {
                    while i < chars.len() && chars[i].is_ascii_digit() {
                        i += 1;
                    }
                } else {
                    i = save;
                }
            }
            let text: String = chars[s..i].iter().collect();
            col += i - s;
            let is_int = text.chars().all(|d| d.is_ascii_digit());
            let v: f64 = text.parse().map_err(|_| ParseError {
                pos,
                msg: format!("malformed number {text:?}"),
            })?;
            out.push(Token {
                tok: Tok::Num(v, is_int),
                pos,
            });
            continue;
        }
        if c == '|' && chars.get(i + 1) == Some(&'|') {
            out.push(Token {
                tok: Tok::ParBar,
                pos,
            });
            i += 2;
            col += 2;
            continue;
        }
        if c == '‖' {
            out.push(Token {
                tok: Tok::ParBar,
                pos,
            });
            i += 1;
            col += 1;
            continue;
        }
        if "=;,()[]{}+-*/".contains(c) {
            out.push(Token {
                tok: Tok::P(c),
                pos,
            });
            i += 1;
            col += 1;
            continue;
        }
        return Err(ParseError {
            pos,
            msg: format!("unexpected character {c:?}"),
        });
    }
    out.push(Token {
        tok: Tok::Eof,
        pos: Pos { line, col },
    });
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Parser

struct Parser {
    toks: Vec<Token>,
    i: usize,
    /// Newlines end items only outside brackets.
    nl: bool,
}

fn describe(t: &Tok) -> String {
    match t {
        Tok::Ident(s) => format!("`{s}`"),
        Tok::Num(v, _) => format!("number {v}"),
        Tok::P(c) => format!("`{c}`"),
        Tok::ParBar => "`||`".into(),
        Tok::Newline => "end of line".into(),
        Tok::Eof => "end of file".into(),
    }
}

impl Parser {
    fn skip(&mut self) {
        if !self.nl {
            while matches!(self.toks[self.i].tok, Tok::Newline) {
                self.i += 1;
            }
        }
    }
    fn peek(&mut self) -> &Token {
        self.skip();
        &self.toks[self.i]
    }
    fn peek_at(&mut self, k: usize) -> Tok {
        self.skip();
        let mut j = self.i;
        let mut n = 0;
        while j < self.toks.len() {
            if self.nl || !matches!(self.toks[j].tok, Tok::Newline) {
                if n == k {
                    return self.toks[j].tok.clone();
                }
                n += 1;
            }
            j += 1;
        }
        Tok::Eof
    }
    fn next(&mut self) -> Token {
        self.skip();
        let t = self.toks[self.i].clone();
        if !matches!(t.tok, Tok::Eof) {
            self.i += 1;
        }
        t
    }
    fn err<T>(&mut self, msg: impl Into<String>) -> Result<T, ParseError> {
        let t = self.peek().clone();
        Err(ParseError {
            pos: t.pos,
            msg: format!("{}, found {}", msg.into(), describe(&t.tok)),
        })
    }
    fn is_p(&mut self, c: char) -> bool {
        matches!(self.peek().tok, Tok::P(x) if x == c)
    }
    fn expect(&mut self, c: char) -> Result<Pos, ParseError> {
        if self.is_p(c) {
            Ok(self.next().pos)
        } else {
            self.err(format!("expected `{c}`"))
        }
    }
    fn ident(&mut self) -> Result<(String, Pos), ParseError> {
        match self.peek().tok.clone() {
            Tok::Ident(s) => {
                let p = self.next().pos;
                Ok((s, p))
            }
            _ => self.err("expected a name"),
        }
    }
    fn with_nl<T>(
        &mut self,
        nl: bool,
        f: impl FnOnce(&mut Parser) -> Result<T, ParseError>,
    ) -> Result<T, ParseError> {
        let save = self.nl;
        self.nl = nl;
        let r = f(self);
        self.nl = save;
        r
    }

    // ---- integer expressions
    fn int_expr(&mut self) -> Result<IntExpr, ParseError> {
        self.with_nl(false, |p| p.int_sum())
    }
    fn int_sum(&mut self) -> Result<IntExpr, ParseError> {
        let mut a = self.int_prod()?;
        while self.is_p('+') || self.is_p('-') {
            let op = match self.next().tok {
                Tok::P(c) => c,
                _ => '+',
            };
            let b = self.int_prod()?;
            a = IntExpr::Bin(op, Box::new(a), Box::new(b));
        }
        Ok(a)
    }
    fn int_prod(&mut self) -> Result<IntExpr, ParseError> {
        let mut a = self.int_atom()?;
        while self.is_p('*') || self.is_p('/') {
            let op = match self.next().tok {
                Tok::P(c) => c,
                _ => '*',
            };
            let b = self.int_atom()?;
            a = IntExpr::Bin(op, Box::new(a), Box::new(b));
        }
        Ok(a)
    }
    fn int_atom(&mut self) -> Result<IntExpr, ParseError> {
        let t = self.peek().clone();
        match t.tok {
            Tok::Num(v, true) if v <= i64::MAX as f64 => {
                self.next();
                Ok(IntExpr::Lit(v as i64))
            }
            Tok::Ident(s) => {
                self.next();
                if self.is_p('[') {
                    self.next();
                    let idx = self.int_expr()?;
                    self.expect(']')?;
                    Ok(IntExpr::Index(s, Box::new(idx), t.pos))
                } else {
                    Ok(IntExpr::Var(s, t.pos))
                }
            }
            Tok::P('(') => {
                self.next();
                let e = self.int_expr()?;
                self.expect(')')?;
                Ok(e)
            }
            Tok::P('-') => {
                self.next();
                let e = self.int_atom()?;
                Ok(IntExpr::Bin('-', Box::new(IntExpr::Lit(0)), Box::new(e)))
            }
            _ => {
                self.err("expected an integer expression (a whole number, a name, `W[p]` or `(…)`)")
            }
        }
    }

    fn task_ref(&mut self) -> Result<(IntExpr, IntExpr), ParseError> {
        match self.peek().tok.clone() {
            Tok::Ident(s) if s == "task" => {
                self.next();
            }
            _ => return self.err("expected `task[batch,task]`"),
        }
        self.expect('[')?;
        let b = self.int_expr()?;
        self.expect(',')?;
        let t = self.int_expr()?;
        self.expect(']')?;
        Ok((b, t))
    }

    fn size_expr(&mut self) -> Result<SizeExpr, ParseError> {
        let t = self.peek().clone();
        match t.tok {
            Tok::Num(v, _) => {
                self.next();
                Ok(SizeExpr::Lit(v))
            }
            Tok::Ident(s) => match SizeFn::from_name(&s) {
                Some(func) => {
                    self.next();
                    self.expect('(')?;
                    let (batch, task) = self.task_ref()?;
                    self.expect(')')?;
                    Ok(SizeExpr::Of { func, batch, task, pos: t.pos })
                }
                None => self.err("expected a size: a number of bytes, codeSize(…), dataSizeIn(…) or dataSizeOut(…)"),
            },
            _ => self.err("expected a size: a number of bytes, codeSize(…), dataSizeIn(…) or dataSizeOut(…)"),
        }
    }

    // ---- statements
    fn block(&mut self) -> Result<Vec<Stmt>, ParseError> {
        self.with_nl(false, |p| {
            p.expect('{')?;
            let mut out = Vec::new();
            loop {
                if p.is_p('}') {
                    p.next();
                    break;
                }
                if matches!(p.peek().tok, Tok::Eof) {
                    return p.err("expected `}` to close the block");
                }
                if p.is_p(';') {
                    p.next();
                    continue;
                }
                out.push(p.par()?);
            }
            Ok(out)
        })
    }

    /// `a ; b ; c` — at top level ends at a newline.
    fn process(&mut self) -> Result<Stmt, ParseError> {
        let mut parts = vec![self.par()?];
        while self.is_p(';') {
            self.next();
            if matches!(self.peek().tok, Tok::Newline | Tok::Eof | Tok::P(')')) {
                break;
            }
            parts.push(self.par()?);
        }
        Ok(if parts.len() == 1 {
            parts.remove(0)
        } else {
            Stmt::Seq(parts)
        })
    }

    fn par(&mut self) -> Result<Stmt, ParseError> {
        let mut parts = vec![self.atom()?];
        while matches!(self.peek().tok, Tok::ParBar) {
            self.next();
            parts.push(self.atom()?);
        }
        Ok(if parts.len() == 1 {
            parts.remove(0)
        } else {
            Stmt::Par(parts)
        })
    }

    fn atom(&mut self) -> Result<Stmt, ParseError> {
        let t = self.peek().clone();
        match t.tok {
            Tok::P('{') => Ok(Stmt::Block(self.block()?)),
            Tok::P('(') => {
                self.next();
                let s = self.with_nl(false, |p| p.process())?;
                self.expect(')')?;
                Ok(s)
            }
            Tok::Num(v, _) => {
                self.next();
                if self.is_p('*') {
                    self.next();
                    let inner = self.atom()?;
                    if v.is_nan() || v < 0.0 {
                        return Err(ParseError {
                            pos: t.pos,
                            msg: "a count must be >= 0".into(),
                        });
                    }
                    Ok(Stmt::Mul(v, Box::new(inner), t.pos))
                } else {
                    Ok(Stmt::Seconds(v, t.pos))
                }
            }
            Tok::Ident(ref s) => {
                let s = s.clone();
                let next = self.peek_at(1);
                match (s.as_str(), &next) {
                    ("seq" | "par" | "for", Tok::P('(')) => self.reduce(s, t.pos),
                    ("use", Tok::P('(')) => {
                        self.next();
                        self.expect('(')?;
                        let res = self.int_expr()?;
                        self.expect(',')?;
                        let tau = self.with_nl(false, |p| p.atom())?;
                        self.expect(')')?;
                        Ok(Stmt::Use {
                            res,
                            tau: Box::new(tau),
                            pos: t.pos,
                        })
                    }
                    ("delay", Tok::P('(')) => {
                        self.next();
                        self.expect('(')?;
                        let tau = self.with_nl(false, |p| p.atom())?;
                        self.expect(')')?;
                        Ok(Stmt::Delay(Box::new(tau), t.pos))
                    }
                    ("if", Tok::P('{') | Tok::P('(')) => self.if_stmt(),
                    ("taskrun", Tok::P('{')) => {
                        self.next();
                        Ok(Stmt::Taskrun(self.block()?))
                    }
                    ("task", Tok::P('[')) => {
                        let (batch, task) = self.task_ref()?;
                        self.expect('(')?;
                        let machine = self.int_expr()?;
                        self.expect(')')?;
                        Ok(Stmt::Task {
                            batch,
                            task,
                            machine,
                            pos: t.pos,
                        })
                    }
                    ("send", Tok::P('[')) => {
                        self.next();
                        self.expect('[')?;
                        let from = self.int_expr()?;
                        self.expect(',')?;
                        let to = self.int_expr()?;
                        self.expect(']')?;
                        self.expect('(')?;
                        let size = self.with_nl(false, |p| p.size_expr())?;
                        self.expect(')')?;
                        Ok(Stmt::Send {
                            from,
                            to,
                            size,
                            pos: t.pos,
                        })
                    }
                    (_, Tok::P('=')) => {
                        self.next();
                        self.next();
                        let value = self.int_expr()?;
                        Ok(Stmt::Counter { var: s, value })
                    }
                    _ => {
                        self.next();
                        Ok(Stmt::Name(s, t.pos))
                    }
                }
            }
            _ => self
                .err("expected a statement (a cost name, use(…), seq(…), par(…), if{…}, {…}, …)"),
        }
    }

    fn reduce(&mut self, kw: String, pos: Pos) -> Result<Stmt, ParseError> {
        self.next();
        let kind = match kw.as_str() {
            "seq" => RedKind::Seq,
            "for" => RedKind::For,
            _ => RedKind::Par,
        };
        let (var, lo, hi) = self.with_nl(false, |p| {
            p.expect('(')?;
            let (var, _) = p.ident()?;
            p.expect('=')?;
            let lo = p.int_expr()?;
            p.expect(',')?;
            let hi = p.int_expr()?;
            p.expect(')')?;
            Ok((var, lo, hi))
        })?;
        let body = self.block()?;
        Ok(Stmt::Reduce {
            kind,
            var,
            lo,
            hi,
            body,
            pos,
        })
    }

    fn if_stmt(&mut self) -> Result<Stmt, ParseError> {
        let pos = self.next().pos;
        let mut prob = None;
        if self.is_p('(') {
            self.next();
            let t = self.peek().clone();
            match t.tok {
                Tok::Num(v, _) if (0.0..=1.0).contains(&v) => {
                    self.next();
                    prob = Some(v);
                }
                _ => return self.err("expected a branch probability between 0 and 1"),
            }
            self.expect(')')?;
        }
        let then = self.block()?;
        let els = if matches!(self.peek_at(0), Tok::Ident(ref s) if s == "else") {
            // `else` may follow on the next line.
            self.with_nl(false, |p| {
                p.next();
                Ok(())
            })?;
            if matches!(self.peek_at(0), Tok::Ident(ref s) if s == "if") {
                Some(vec![self.if_stmt()?])
            } else {
                Some(self.block()?)
            }
        } else {
            None
        };
        Ok(Stmt::If {
            prob,
            then,
            els,
            pos,
        })
    }

    // ---- items
    fn item(&mut self) -> Result<Item, ParseError> {
        let (name, pos) = self.ident()?;
        if name == "task" && self.is_p('[') {
            self.i -= 1;
            let (batch, task) = self.task_ref()?;
            self.expect('(')?;
            let machine = self.int_expr()?;
            self.expect(')')?;
            self.expect('=')?;
            let (func, _) = self.ident()?;
            let args = self.arg_list()?;
            return Ok(Item::TaskMap {
                batch,
                task,
                machine,
                func,
                args,
                pos,
            });
        }
        if self.is_p('(') {
            if let Some(func) = SizeFn::from_name(&name) {
                self.expect('(')?;
                let (batch, task) = self.task_ref()?;
                self.expect(')')?;
                self.expect('=')?;
                let value = match self.peek().tok {
                    Tok::Num(v, _) if v >= 0.0 => {
                        self.next();
                        v
                    }
                    _ => return self.err("expected a size in bytes (a number >= 0)"),
                };
                return Ok(Item::Size {
                    func,
                    batch,
                    task,
                    value,
                    pos,
                });
            }
            let params = self.arg_list()?;
            self.expect('=')?;
            let body = self.block()?;
            return Ok(Item::TaskDef {
                name,
                params,
                body,
                pos,
            });
        }
        self.expect('=')?;
        if let Tok::Num(v, true) = self.peek().tok {
            if matches!(self.peek_at(1), Tok::P(';') | Tok::Newline | Tok::Eof) {
                self.next();
                return Ok(Item::Const {
                    name,
                    value: v as i64,
                    pos,
                });
            }
        }
        let body = self.process()?;
        Ok(Item::Process { name, body, pos })
    }

    fn arg_list(&mut self) -> Result<Vec<IntExpr>, ParseError> {
        self.expect('(')?;
        let mut args = Vec::new();
        if !self.is_p(')') {
            loop {
                args.push(self.int_expr()?);
                if self.is_p(',') {
                    self.next();
                } else {
                    break;
                }
            }
        }
        self.expect(')')?;
        Ok(args)
    }
}

/// Parse a model file.
pub fn parse(src: &str) -> Result<ModelFile, ParseError> {
    let toks = lex(src)?;
    let mut p = Parser {
        toks,
        i: 0,
        nl: true,
    };
    let mut items = Vec::new();
    loop {
        match p.peek().tok {
            Tok::Eof => break,
            Tok::Newline | Tok::P(';') => {
                p.next();
            }
            _ => {
                items.push(p.item()?);
                match p.peek().tok {
                    Tok::Newline | Tok::Eof | Tok::P(';') => {}
                    _ => return p.err("expected the end of the line after this definition"),
                }
            }
        }
    }
    Ok(ModelFile { items })
}

// ---------------------------------------------------------------------------------------------
// Printer

impl fmt::Display for IntExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn prec(e: &IntExpr) -> u8 {
            match e {
                IntExpr::Bin('+' | '-', ..) => 1,
                IntExpr::Bin(..) => 2,
                _ => 3,
            }
        }
        match self {
            IntExpr::Lit(v) => write!(f, "{v}"),
            IntExpr::Var(s, _) => f.write_str(s),
            IntExpr::Index(s, i, _) => write!(f, "{s}[{i}]"),
            IntExpr::Bin(op, a, b) => {
                let p = prec(self);
                if prec(a) < p {
                    write!(f, "({a})")?;
                } else {
                    write!(f, "{a}")?;
                }
                write!(f, "{op}")?;
                // Right operand: parenthesise at equal precedence (left-associative ops).
                if prec(b) <= p {
                    write!(f, "({b})")
                } else {
                    write!(f, "{b}")
                }
            }
        }
    }
}

impl fmt::Display for SizeExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SizeExpr::Lit(v) => write!(f, "{v}"),
            SizeExpr::Of {
                func, batch, task, ..
            } => write!(f, "{}(task[{batch},{task}])", func.name()),
        }
    }
}

fn fmt_num(v: f64) -> String {
    format!("{v}")
}

fn indent(out: &mut String, n: usize) {
    for _ in 0..n {
        out.push_str("   ");
    }
}

fn print_block(out: &mut String, body: &[Stmt], depth: usize) {
    out.push_str("{\n");
    for s in body {
        indent(out, depth + 1);
        print_stmt(out, s, depth + 1);
        if needs_semi(s) {
            out.push(';');
        }
        out.push('\n');
    }
    indent(out, depth);
    out.push('}');
}

fn needs_semi(s: &Stmt) -> bool {
    !matches!(
        s,
        Stmt::Block(_) | Stmt::Reduce { .. } | Stmt::If { .. } | Stmt::Taskrun(_)
    )
}

fn print_stmt(out: &mut String, s: &Stmt, depth: usize) {
    match s {
        Stmt::Seq(v) | Stmt::Par(v) => {
            let sep = if matches!(s, Stmt::Seq(_)) {
                "; "
            } else {
                " || "
            };
            for (i, x) in v.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                let wrap = matches!(x, Stmt::Seq(_) | Stmt::Par(_));
                if wrap {
                    out.push('(');
                }
                print_stmt(out, x, depth);
                if wrap {
                    out.push(')');
                }
            }
        }
        Stmt::Block(b) => print_block(out, b, depth),
        Stmt::Name(n, _) => out.push_str(n),
        Stmt::Mul(k, x, _) => {
            let _ = write!(out, "{} * ", fmt_num(*k));
            let wrap = matches!(**x, Stmt::Seq(_) | Stmt::Par(_));
            if wrap {
                out.push('(');
            }
            print_stmt(out, x, depth);
            if wrap {
                out.push(')');
            }
        }
        Stmt::Seconds(v, _) => out.push_str(&fmt_num(*v)),
        Stmt::Reduce {
            kind,
            var,
            lo,
            hi,
            body,
            ..
        } => {
            let kw = match kind {
                RedKind::Seq => "seq",
                RedKind::For => "for",
                RedKind::Par => "par",
            };
            let _ = write!(out, "{kw}({var}={lo},{hi})");
            print_block(out, body, depth);
        }
        Stmt::Use { res, tau, .. } => {
            let _ = write!(out, "use({res},");
            print_stmt(out, tau, depth);
            out.push(')');
        }
        Stmt::Delay(tau, _) => {
            out.push_str("delay(");
            print_stmt(out, tau, depth);
            out.push(')');
        }
        Stmt::If {
            prob, then, els, ..
        } => {
            out.push_str("if");
            if let Some(q) = prob {
                let _ = write!(out, "({})", fmt_num(*q));
            }
            print_block(out, then, depth);
            if let Some(e) = els {
                out.push_str("else");
                print_block(out, e, depth);
            }
        }
        Stmt::Taskrun(b) => {
            out.push_str("taskrun");
            print_block(out, b, depth);
        }
        Stmt::Task {
            batch,
            task,
            machine,
            ..
        } => {
            let _ = write!(out, "task[{batch},{task}]({machine})");
        }
        Stmt::Send { from, to, size, .. } => {
            let _ = write!(out, "send[{from},{to}]({size})");
        }
        Stmt::Counter { var, value } => {
            let _ = write!(out, "{var}={value}");
        }
    }
}

impl fmt::Display for Stmt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = String::new();
        print_stmt(&mut s, self, 0);
        f.write_str(&s)
    }
}

fn join(args: &[IntExpr]) -> String {
    args.iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

impl fmt::Display for Item {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        match self {
            Item::Const { name, value, .. } => {
                let _ = write!(out, "{name}={value};");
            }
            Item::Process { name, body, .. } => {
                let _ = write!(out, "{name}=");
                print_stmt(&mut out, body, 0);
            }
            Item::TaskMap {
                batch,
                task,
                machine,
                func,
                args,
                ..
            } => {
                let _ = write!(
                    out,
                    "task[{batch},{task}]({machine})={func}({});",
                    join(args)
                );
            }
            Item::TaskDef {
                name, params, body, ..
            } => {
                let _ = write!(out, "{name}({})=", join(params));
                print_block(&mut out, body, 0);
            }
            Item::Size {
                func,
                batch,
                task,
                value,
                ..
            } => {
                let _ = write!(
                    out,
                    "{}(task[{batch},{task}])={};",
                    func.name(),
                    fmt_num(*value)
                );
            }
        }
        f.write_str(&out)
    }
}

impl fmt::Display for ModelFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for it in &self.items {
            writeln!(f, "{it}")?;
        }
        Ok(())
    }
}

/// Structural equality that ignores source positions (used by round-trip tests).
pub fn same_shape(a: &ModelFile, b: &ModelFile) -> bool {
    a.to_string() == b.to_string()
}
