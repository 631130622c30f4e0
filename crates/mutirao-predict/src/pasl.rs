//! PASL, JoiN's flow-specification language (thesis §3.2), and the batch DAG it describes.
//!
//! Grammar (reconstructed from the thesis's three examples; `//` comments to end of line):
//! ```text
//! program := decls [ "%%" ] links
//! decls   := { "path" "=" (STRING | WORD) [";"] | BATCH "=" (STRING | WORD) ";" }
//! links   := { TASK "=" BATCH "(" (INT | NAME) ")" ("<<" | "«") inputs [ (">>" | "»") FILE ] ";" }
//! inputs  := "NULL" | FILE | TASK { "," TASK }
//! ```
//! A cardinality may be a name (`B2(c2)`), bound later by [`FlowSpec::dag`]. The DAG is validated
//! as JoiN requires: the first and last batches have cardinality 1, a task reads only tasks
//! defined above it (so edges go to higher indices, and there are no cycles).
//! [`BatchDag::series_parallel`] then composes the application model of Fig. 4.10/4.12
//! (`𝕃_i = 𝔹_i; (𝕃_j ‖ 𝕃_k)`, with join batches factored out as in lines 13→15).
//!
//! ```
//! use mutirao_predict::pasl;
//! let spec = pasl::parse("path=\"app\";\nB1=\"A.class\";\nB2=\"B.class\";\nB3=\"C.class\";\n%%\n\
//!     T1=B1(1) << NULL;\nT2=B2(10) << T1;\nT3=B3(1) << T2;\n").unwrap();
//! let dag = spec.dag(&Default::default()).unwrap();
//! assert_eq!(dag.series_parallel().unwrap().to_string(), "𝔹1; 𝔹2; 𝔹3");
//! ```

use std::collections::{BTreeSet, HashMap};
use std::fmt;

/// A PASL error with its place (1-based line and column; 0 for whole-spec problems).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {column}: {msg}")]
pub struct PaslError {
    /// Line.
    pub line: usize,
    /// Column.
    pub column: usize,
    /// What is wrong and what to do.
    pub msg: String,
}

/// A place in the spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct At {
    /// Line (1-based).
    pub line: usize,
    /// Column (1-based).
    pub column: usize,
}

fn err<T>(at: At, msg: impl Into<String>) -> Result<T, PaslError> {
    Err(PaslError {
        line: at.line,
        column: at.column,
        msg: msg.into(),
    })
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Word(String),
    Str(String),
    P(char),
    In,
    Out,
    Sep,
    End,
}

fn lex(src: &str) -> Result<Vec<(Tok, At)>, PaslError> {
    let mut out = Vec::new();
    let cs: Vec<char> = src.chars().collect();
    let (mut i, mut line, mut col) = (0usize, 1usize, 1usize);
    let special = |c: char| c.is_whitespace() || "=;(),\"«»<>".contains(c);
    while i < cs.len() {
        let c = cs[i];
        let at = At { line, column: col };
        let adv = |n: usize, i: &mut usize, col: &mut usize| {
            *i += n;
            *col += n;
        };
        if c == '\n' {
            i += 1;
            line += 1;
            col = 1;
        } else if c.is_whitespace() {
            adv(1, &mut i, &mut col);
        } else if c == '/' && cs.get(i + 1) == Some(&'/') {
            while i < cs.len() && cs[i] != '\n' {
                i += 1;
            }
        } else if c == '<' || c == '>' {
            if cs.get(i + 1) != Some(&c) {
                return err(at, format!("`{c}` must be doubled (`{c}{c}`)"));
            }
            out.push((if c == '<' { Tok::In } else { Tok::Out }, at));
            adv(2, &mut i, &mut col);
        } else if c == '«' || c == '»' {
            out.push((if c == '«' { Tok::In } else { Tok::Out }, at));
            adv(1, &mut i, &mut col);
        } else if c == '"' {
            let mut s = String::new();
            adv(1, &mut i, &mut col);
            loop {
                match cs.get(i) {
                    None | Some('\n') => return err(at, "unterminated string"),
                    Some('"') => break,
                    Some(&ch) => {
                        s.push(ch);
                        adv(1, &mut i, &mut col);
                    }
                }
            }
            adv(1, &mut i, &mut col);
            out.push((Tok::Str(s), at));
        } else if "=;(),".contains(c) {
            out.push((Tok::P(c), at));
            adv(1, &mut i, &mut col);
        } else {
            let mut w = String::new();
            while i < cs.len() && !special(cs[i]) && !(cs[i] == '/' && cs.get(i + 1) == Some(&'/'))
            {
                w.push(cs[i]);
                adv(1, &mut i, &mut col);
            }
            out.push((if w == "%%" { Tok::Sep } else { Tok::Word(w) }, at));
        }
    }
    out.push((Tok::End, At { line, column: col }));
    Ok(out)
}

/// A batch's cardinality as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Card {
    /// A number.
    Int(u64),
    /// A name bound by [`FlowSpec::dag`].
    Name(String),
}

/// Where a link's input comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// `NULL`.
    Null,
    /// A data file.
    File(String),
    /// Earlier tasks' outputs.
    Tasks(Vec<String>),
}

/// `BATCH = "Class.class";`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchDecl {
    /// Batch name (`B1`).
    pub name: String,
    /// Class file.
    pub class: String,
    /// Where.
    pub at: At,
}

/// `TASK = BATCH(c) << inputs [>> file];`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// Task name (`T1`).
    pub task: String,
    /// Batch name.
    pub batch: String,
    /// Cardinality.
    pub card: Card,
    /// Input.
    pub input: Input,
    /// Output file, if any.
    pub output: Option<String>,
    /// Where.
    pub at: At,
}

/// A parsed flow specification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowSpec {
    /// `path = …`.
    pub path: Option<String>,
    /// Batch declarations.
    pub batches: Vec<BatchDecl>,
    /// Links, in order.
    pub links: Vec<Link>,
}

struct P {
    t: Vec<(Tok, At)>,
    i: usize,
}

impl P {
    fn peek(&self) -> &Tok {
        &self.t[self.i].0
    }
    fn at(&self) -> At {
        self.t[self.i].1
    }
    fn next(&mut self) -> (Tok, At) {
        let r = self.t[self.i].clone();
        if self.i + 1 < self.t.len() {
            self.i += 1;
        }
        r
    }
    fn expect(&mut self, c: char) -> Result<(), PaslError> {
        match self.next() {
            (Tok::P(x), _) if x == c => Ok(()),
            (t, at) => err(at, format!("expected `{c}`, found {}", show(&t))),
        }
    }
    fn word(&mut self, what: &str) -> Result<(String, At), PaslError> {
        match self.next() {
            (Tok::Word(w), at) => Ok((w, at)),
            (t, at) => err(at, format!("expected {what}, found {}", show(&t))),
        }
    }
}

fn show(t: &Tok) -> String {
    match t {
        Tok::Word(w) => format!("`{w}`"),
        Tok::Str(s) => format!("\"{s}\""),
        Tok::P(c) => format!("`{c}`"),
        Tok::In => "`<<`".into(),
        Tok::Out => "`>>`".into(),
        Tok::Sep => "`%%`".into(),
        Tok::End => "the end of the file".into(),
    }
}

/// Parse a PASL flow specification.
pub fn parse(src: &str) -> Result<FlowSpec, PaslError> {
    let mut p = P { t: lex(src)?, i: 0 };
    let mut spec = FlowSpec {
        path: None,
        batches: Vec::new(),
        links: Vec::new(),
    };
    let mut in_links = false;
    loop {
        match p.peek().clone() {
            Tok::End => break,
            Tok::Sep => {
                if in_links {
                    return err(p.at(), "`%%` appears twice");
                }
                in_links = true;
                p.next();
            }
            Tok::Word(_) => {
                let (name, at) = p.word("a name")?;
                p.expect('=')?;
                let (rhs, rat) = p.next();
                let rhs = match rhs {
                    Tok::Word(w) | Tok::Str(w) => w,
                    t => {
                        return err(
                            rat,
                            format!(
                                "expected a class, path or batch after `=`, found {}",
                                show(&t)
                            ),
                        )
                    }
                };
                if matches!(p.peek(), Tok::P('(')) {
                    in_links = true;
                    p.next();
                    let (c, cat) = p.word("a cardinality")?;
                    let card = match c.parse::<u64>() {
                        Ok(n) => Card::Int(n),
                        Err(_) if c.chars().all(|ch| ch.is_alphanumeric() || ch == '_') => {
                            Card::Name(c)
                        }
                        Err(_) => {
                            return err(
                                cat,
                                format!("`{c}` is not a cardinality (a number or a name)"),
                            )
                        }
                    };
                    p.expect(')')?;
                    match p.next() {
                        (Tok::In, _) => {}
                        (t, a) => {
                            return err(
                                a,
                                format!(
                                    "expected `<<` (or `«`) after the cardinality, found {}",
                                    show(&t)
                                ),
                            )
                        }
                    }
                    let input = match p.next() {
                        (Tok::Word(w), _) if w == "NULL" => Input::Null,
                        (Tok::Word(w) | Tok::Str(w), _) => {
                            let mut names = vec![w];
                            while matches!(p.peek(), Tok::P(',')) {
                                p.next();
                                names.push(p.word("a task name")?.0);
                            }
                            let known = |n: &String| spec.links.iter().any(|l| &l.task == n);
                            if names.len() == 1 && !known(&names[0]) {
                                Input::File(names.remove(0))
                            } else {
                                Input::Tasks(names)
                            }
                        }
                        (t, a) => {
                            return err(
                                a,
                                format!(
                                    "expected `NULL`, a file or task names, found {}",
                                    show(&t)
                                ),
                            )
                        }
                    };
                    let output = if matches!(p.peek(), Tok::Out) {
                        p.next();
                        match p.next() {
                            (Tok::Word(w) | Tok::Str(w), _) => Some(w),
                            (t, a) => {
                                return err(
                                    a,
                                    format!(
                                        "expected an output file after `>>`, found {}",
                                        show(&t)
                                    ),
                                )
                            }
                        }
                    } else {
                        None
                    };
                    p.expect(';')?;
                    if spec.links.iter().any(|l| l.task == name) {
                        return err(at, format!("task `{name}` is defined twice"));
                    }
                    spec.links.push(Link {
                        task: name,
                        batch: rhs,
                        card,
                        input,
                        output,
                        at,
                    });
                } else {
                    if in_links {
                        return err(at, format!("`{name} = {rhs}` looks like a declaration, but declarations must come before the links"));
                    }
                    if name == "path" {
                        spec.path = Some(rhs);
                        if matches!(p.peek(), Tok::P(';')) {
                            p.next();
                        }
                    } else {
                        p.expect(';')?;
                        if spec.batches.iter().any(|b| b.name == name) {
                            return err(at, format!("batch `{name}` is declared twice"));
                        }
                        spec.batches.push(BatchDecl {
                            name,
                            class: rhs,
                            at,
                        });
                    }
                }
            }
            t => {
                return err(
                    p.at(),
                    format!("expected a declaration or a link, found {}", show(&t)),
                )
            }
        }
    }
    if spec.links.is_empty() {
        return err(
            At { line: 1, column: 1 },
            "the specification has no links (`T1 = B1(1) << NULL;`)",
        );
    }
    Ok(spec)
}

/// One node of the batch DAG (batch i = the i-th link, 1-based).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchNode {
    /// Task name of the link (`T3`).
    pub task: String,
    /// Batch name (`B3`).
    pub batch: String,
    /// Its class file.
    pub class: String,
    /// Cardinality c_i.
    pub c: u64,
}

/// The batch DAG: nodes in link order (a topological order), edges to higher indices only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchDag {
    /// Nodes; node `k` is batch `k + 1`.
    pub nodes: Vec<BatchNode>,
    /// Successors of each node (0-based).
    pub succ: Vec<Vec<usize>>,
}

impl FlowSpec {
    /// Build and validate the batch DAG, binding named cardinalities from `bindings`.
    pub fn dag(&self, bindings: &HashMap<String, u64>) -> Result<BatchDag, PaslError> {
        let mut nodes = Vec::new();
        let mut succ: Vec<Vec<usize>> = Vec::new();
        let mut index: HashMap<&str, usize> = HashMap::new();
        for l in &self.links {
            let Some(decl) = self.batches.iter().find(|b| b.name == l.batch) else {
                return err(
                    l.at,
                    format!(
                        "batch `{}` is not declared (add `{} = \"Class.class\";`)",
                        l.batch, l.batch
                    ),
                );
            };
            let c = match &l.card {
                Card::Int(n) => *n,
                Card::Name(n) => match bindings.get(n) {
                    Some(v) => *v,
                    None => {
                        return err(
                            l.at,
                            format!(
                                "cardinality `{n}` has no value; bind it (e.g. `--card {n}=4`)"
                            ),
                        )
                    }
                },
            };
            if c == 0 {
                return err(
                    l.at,
                    format!(
                        "task `{}` has cardinality 0; every batch needs at least one task",
                        l.task
                    ),
                );
            }
            let k = nodes.len();
            if let Input::Tasks(ts) = &l.input {
                for t in ts {
                    match index.get(t.as_str()) {
                        Some(&j) => {
                            if !succ[j].contains(&k) {
                                succ[j].push(k);
                            }
                        }
                        None => return err(l.at, format!("task `{}` reads `{t}`, which is not defined above it (edges must go to later batches)", l.task)),
                    }
                }
            }
            index.insert(&l.task, k);
            nodes.push(BatchNode {
                task: l.task.clone(),
                batch: l.batch.clone(),
                class: decl.class.clone(),
                c,
            });
            succ.push(Vec::new());
        }
        let first = &self.links[0];
        if nodes[0].c != 1 {
            return err(
                first.at,
                format!(
                    "the first batch must have cardinality 1 (it has {})",
                    nodes[0].c
                ),
            );
        }
        let last_link = &self.links[self.links.len() - 1];
        if nodes[nodes.len() - 1].c != 1 {
            return err(
                last_link.at,
                format!(
                    "the last batch must have cardinality 1 (it has {})",
                    nodes[nodes.len() - 1].c
                ),
            );
        }
        Ok(BatchDag { nodes, succ })
    }
}

/// A series-parallel composition of batches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sp {
    /// Batch i (1-based).
    Batch(usize),
    /// `a; b; …`.
    Seq(Vec<Sp>),
    /// `a ‖ b ‖ …`.
    Par(Vec<Sp>),
}

impl Sp {
    fn seq(mut v: Vec<Sp>) -> Sp {
        let mut flat = Vec::new();
        for s in v.drain(..) {
            match s {
                Sp::Seq(inner) => flat.extend(inner),
                other => flat.push(other),
            }
        }
        if flat.len() == 1 {
            flat.remove(0)
        } else {
            Sp::Seq(flat)
        }
    }
    fn batches(&self, out: &mut Vec<usize>) {
        match self {
            Sp::Batch(i) => out.push(*i),
            Sp::Seq(v) | Sp::Par(v) => v.iter().for_each(|s| s.batches(out)),
        }
    }
    fn write(&self, f: &mut fmt::Formatter<'_>, ascii: bool, nested: bool) -> fmt::Result {
        match self {
            Sp::Batch(i) => {
                if ascii {
                    write!(f, "B{i}")
                } else {
                    write!(f, "𝔹{i}")
                }
            }
            Sp::Seq(v) | Sp::Par(v) => {
                let is_par = matches!(self, Sp::Par(_));
                if nested {
                    f.write_str("(")?;
                }
                for (k, s) in v.iter().enumerate() {
                    if k > 0 {
                        f.write_str(match (is_par, ascii) {
                            (true, true) => " || ",
                            (true, false) => " ‖ ",
                            (false, _) => "; ",
                        })?;
                    }
                    let child_nested =
                        matches!((is_par, s), (true, Sp::Seq(_)) | (false, Sp::Par(_)));
                    s.write(f, ascii, child_nested)?;
                }
                if nested {
                    f.write_str(")")?;
                }
                Ok(())
            }
        }
    }
    /// The ASCII form (`B1; (B2 || B3); B4`).
    pub fn ascii(&self) -> String {
        struct A<'a>(&'a Sp);
        impl fmt::Display for A<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.write(f, true, false)
            }
        }
        A(self).to_string()
    }
}

impl fmt::Display for Sp {
    /// The thesis's form (`𝔹1; (𝔹2 ‖ 𝔹3); 𝔹4`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write(f, false, false)
    }
}

impl BatchDag {
    /// Immediate post-dominator of each node (None for sinks and nodes whose branches never
    /// meet again).
    fn ipdom(&self) -> Vec<Option<usize>> {
        let n = self.nodes.len();
        let mut pdom: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); n];
        for i in (0..n).rev() {
            let mut acc: Option<BTreeSet<usize>> = None;
            for &s in &self.succ[i] {
                acc = Some(match acc {
                    None => pdom[s].clone(),
                    Some(a) => a.intersection(&pdom[s]).copied().collect(),
                });
            }
            let mut set = acc.unwrap_or_default();
            set.insert(i);
            pdom[i] = set;
        }
        (0..n)
            .map(|i| pdom[i].iter().copied().find(|&j| j != i))
            .collect()
    }

    fn walk(&self, start: usize, stop: Option<usize>, ip: &[Option<usize>]) -> Sp {
        let mut parts = Vec::new();
        let mut cur = Some(start);
        while let Some(i) = cur {
            if Some(i) == stop {
                break;
            }
            parts.push(Sp::Batch(i + 1));
            cur = match self.succ[i].len() {
                0 => None,
                1 => Some(self.succ[i][0]),
                _ => {
                    let join = ip[i];
                    let branches: Vec<Sp> = self.succ[i]
                        .iter()
                        .filter(|&&s| Some(s) != join)
                        .map(|&s| self.walk(s, join, ip))
                        .collect();
                    if !branches.is_empty() {
                        parts.push(if branches.len() == 1 {
                            branches.into_iter().next().unwrap_or(Sp::Seq(Vec::new()))
                        } else {
                            Sp::Par(branches)
                        });
                    }
                    join
                }
            };
        }
        Sp::seq(parts)
    }

    /// The application model's batch composition `L` (Fig. 4.10, with join batches factored out
    /// as in Fig. 4.12 lines 13→15). Errors when the DAG is not series-parallel (some batch
    /// would appear twice or not at all); such graphs need a longest-path T_0 instead.
    pub fn series_parallel(&self) -> Result<Sp, PaslError> {
        let ip = self.ipdom();
        let sp = self.walk(0, None, &ip);
        let mut seen = Vec::new();
        sp.batches(&mut seen);
        let mut sorted = seen.clone();
        sorted.sort_unstable();
        let want: Vec<usize> = (1..=self.nodes.len()).collect();
        if sorted != want {
            return err(
                At::default(),
                format!(
                    "the batch graph is not series-parallel (composition visits batches {seen:?}); \
                     it cannot be written as `𝕃_i = 𝔹_i; (𝕃_j ‖ …)`"
                ),
            );
        }
        Ok(sp)
    }
}
