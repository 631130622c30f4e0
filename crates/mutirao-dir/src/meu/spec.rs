//! The physical resource specification language (digest 002 §3.2, Figs 4.3/4.4).
//!
//! ```text
//! Spec        :: (comment | Domain)+
//! Domain      :: [label ':'] name [Ancestor] [Originals] [Properties] ['@' host] ';'
//! Ancestor    :: '<' label '>'
//! Originals   :: '(' label (',' label)* ')'
//! Properties  :: '{' Property (',' Property)* '}'
//! Property    :: name ['=' value]
//! ```
//! Comments are `/* … */`; names with spaces are double-quoted (`\"` and `\\` escape);
//! a statement ends with `;` as in the printed Fig. 4.4. A line holding only an ellipsis
//! (three or more dots, as printed at the end of Fig. 4.4) is ignored. `@host` is the thesis's
//! optional "register on this node" extension. Integer values are summed over subtrees
//! (`CPU=2`); other values match exactly; a property without a value is a quality.

use super::props::Property;
use std::fmt;

/// A parse or resolution error with its position.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {col}: {msg}")]
pub struct SpecError {
    /// 1-based line.
    pub line: usize,
    /// 1-based column (in characters).
    pub col: usize,
    /// What is wrong and what to do.
    pub msg: String,
}

/// A label use with its position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelRef {
    /// The label.
    pub label: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub col: usize,
}

/// One domain statement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainSpec {
    /// Its label, if any.
    pub label: Option<String>,
    /// Its name.
    pub name: String,
    /// Its ancestor's label.
    pub ancestor: Option<LabelRef>,
    /// Its originals' labels (an alias when non-empty).
    pub originals: Vec<LabelRef>,
    /// Its own properties.
    pub props: Vec<Property>,
    /// The host to register it on (`@host`).
    pub host: Option<String>,
    /// 1-based line of the statement.
    pub line: usize,
    /// 1-based column of the statement.
    pub col: usize,
}

/// A parsed specification.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Spec {
    /// Domains in file order.
    pub domains: Vec<DomainSpec>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    Word(String),
    Str(String),
    Punct(char),
    Ellipsis,
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Word(w) => write!(f, "{w:?}"),
            Tok::Str(s) => write!(f, "\"{s}\""),
            Tok::Punct(c) => write!(f, "'{c}'"),
            Tok::Ellipsis => write!(f, "'...'"),
        }
    }
}

const PUNCT: &[char] = &[':', ';', '<', '>', '(', ')', '{', '}', ',', '=', '@'];

fn lex(text: &str) -> Result<Vec<(Tok, usize, usize)>, SpecError> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = vec![];
    let (mut i, mut line, mut col) = (0usize, 1usize, 1usize);
    let adv = |c: char, line: &mut usize, col: &mut usize| {
        if c == '\n' {
            *line += 1;
            *col = 1;
        } else {
            *col += 1;
        }
    };
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            adv(c, &mut line, &mut col);
            i += 1;
        } else if c == '/' && chars.get(i + 1) == Some(&'*') {
            let (sl, sc) = (line, col);
            i += 2;
            col += 2;
            loop {
                if i >= chars.len() {
                    return Err(SpecError {
                        line: sl,
                        col: sc,
                        msg: "comment opened here is never closed with */".into(),
                    });
                }
                if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    i += 2;
                    col += 2;
                    break;
                }
                adv(chars[i], &mut line, &mut col);
                i += 1;
            }
        } else if c == '"' {
            let (sl, sc) = (line, col);
            let mut s = String::new();
            i += 1;
            col += 1;
            loop {
                match chars.get(i) {
                    None | Some('\n') => {
                        return Err(SpecError {
                            line: sl,
                            col: sc,
                            msg: "quoted name opened here is not closed on the same line".into(),
                        })
                    }
                    Some('"') => {
                        i += 1;
                        col += 1;
                        break;
                    }
                    Some('\\') if matches!(chars.get(i + 1), Some('"') | Some('\\')) => {
                        s.push(chars[i + 1]);
                        i += 2;
                        col += 2;
                    }
                    Some(&ch) => {
                        s.push(ch);
                        i += 1;
                        col += 1;
                    }
                }
            }
            if s.is_empty() {
                return Err(SpecError {
                    line: sl,
                    col: sc,
                    msg: "empty quoted name".into(),
                });
            }
            out.push((Tok::Str(s), sl, sc));
        } else if PUNCT.contains(&c) {
            out.push((Tok::Punct(c), line, col));
            i += 1;
            col += 1;
        } else {
            let (sl, sc) = (line, col);
            let mut w = String::new();
            while let Some(&ch) = chars.get(i) {
                if ch.is_whitespace()
                    || PUNCT.contains(&ch)
                    || ch == '"'
                    || (ch == '/' && chars.get(i + 1) == Some(&'*'))
                {
                    break;
                }
                w.push(ch);
                i += 1;
                col += 1;
            }
            if w.len() >= 3 && w.chars().all(|c| c == '.') {
                out.push((Tok::Ellipsis, sl, sc));
            } else {
                out.push((Tok::Word(w), sl, sc));
            }
        }
    }
    Ok(out)
}

struct Parser {
    toks: Vec<(Tok, usize, usize)>,
    pos: usize,
    end: (usize, usize),
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|t| &t.0)
    }
    fn here(&self) -> (usize, usize) {
        self.toks
            .get(self.pos)
            .map(|t| (t.1, t.2))
            .unwrap_or(self.end)
    }
    fn err(&self, msg: String) -> SpecError {
        let (line, col) = self.here();
        SpecError { line, col, msg }
    }
    fn found(&self) -> String {
        match self.peek() {
            Some(t) => t.to_string(),
            None => "the end of the file".into(),
        }
    }
    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(&Tok::Punct(c)) {
            self.pos += 1;
            true
        } else {
            false
        }
    }
    fn expect(&mut self, c: char, ctx: &str) -> Result<(), SpecError> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(self.err(format!("expected '{c}' {ctx}, found {}", self.found())))
        }
    }
    fn name(&mut self, what: &str) -> Result<(String, usize, usize), SpecError> {
        let (l, c) = self.here();
        match self.peek().cloned() {
            Some(Tok::Word(w)) | Some(Tok::Str(w)) => {
                self.pos += 1;
                Ok((w, l, c))
            }
            _ => Err(self.err(format!(
                "expected {what} (a word or a \"quoted name\"), found {}",
                self.found()
            ))),
        }
    }
    fn label(&mut self, ctx: &str) -> Result<LabelRef, SpecError> {
        let (label, line, col) = self.name(&format!("a label {ctx}"))?;
        Ok(LabelRef { label, line, col })
    }
}

/// Parses a specification. Errors carry the line and column of the offending token.
pub fn parse(text: &str) -> Result<Spec, SpecError> {
    let toks = lex(text)?;
    let lines = text.split('\n').count().max(1);
    let last_col = text
        .split('\n')
        .next_back()
        .map_or(0, |l| l.chars().count())
        + 1;
    let mut p = Parser {
        toks,
        pos: 0,
        end: (lines, last_col),
    };
    let mut spec = Spec::default();
    while p.peek().is_some() {
        if p.peek() == Some(&Tok::Ellipsis) {
            p.pos += 1;
            continue;
        }
        let (line, col) = p.here();
        let (first, _, _) = p.name("a domain name or label")?;
        let (label, name) = if p.eat(':') {
            let (n, _, _) = p.name(&format!("the name of the domain labelled {first:?}"))?;
            (Some(first), n)
        } else {
            (None, first)
        };
        let mut d = DomainSpec {
            label,
            name,
            ancestor: None,
            originals: vec![],
            props: vec![],
            host: None,
            line,
            col,
        };
        if p.eat('<') {
            d.ancestor = Some(p.label("naming the ancestor")?);
            p.expect('>', "after the ancestor label")?;
        }
        if p.eat('(') {
            loop {
                d.originals.push(p.label("naming an original")?);
                if !p.eat(',') {
                    break;
                }
            }
            p.expect(')', "closing the list of originals")?;
        }
        if p.eat('{') {
            loop {
                let (pname, pl, pc) = p.name("a property name")?;
                let prop = if p.eat('=') {
                    let (v, _, _) = p.name(&format!("the value of property {pname:?}"))?;
                    match v.parse::<i64>() {
                        Ok(n) => Property::sum(pname, n),
                        Err(_) => Property::exact(pname, v),
                    }
                } else {
                    Property::flag(pname)
                };
                if d.props.iter().any(|q| q.name == prop.name) {
                    return Err(SpecError {
                        line: pl,
                        col: pc,
                        msg: format!(
                            "property {:?} given twice for domain {:?}",
                            prop.name, d.name
                        ),
                    });
                }
                d.props.push(prop);
                if !p.eat(',') {
                    break;
                }
            }
            p.expect('}', "closing the property list")?;
        }
        if p.eat('@') {
            d.host = Some(p.name("a host name after '@'")?.0);
        }
        p.expect(
            ';',
            &format!("ending the domain {:?} (statements end with ';')", d.name),
        )?;
        spec.domains.push(d);
    }
    if spec.domains.is_empty() {
        return Err(SpecError {
            line: 1,
            col: 1,
            msg: "the specification declares no domain".into(),
        });
    }
    Ok(spec)
}

impl Spec {
    /// Checks labels (defined once, every use defined) and returns an order in which every
    /// domain comes after the domains whose labels it uses (topological order). Cycles are
    /// errors.
    pub fn registration_order(&self) -> Result<Vec<usize>, SpecError> {
        use std::collections::HashMap;
        let mut def: HashMap<&str, usize> = HashMap::new();
        for (i, d) in self.domains.iter().enumerate() {
            if let Some(l) = &d.label {
                if let Some(&j) = def.get(l.as_str()) {
                    return Err(SpecError {
                        line: d.line,
                        col: d.col,
                        msg: format!(
                            "label {l:?} is already defined on line {}",
                            self.domains[j].line
                        ),
                    });
                }
                def.insert(l, i);
            }
        }
        let mut deps: Vec<Vec<usize>> = vec![];
        for d in &self.domains {
            let mut v = vec![];
            for r in d.ancestor.iter().chain(&d.originals) {
                match def.get(r.label.as_str()) {
                    Some(&j) => v.push(j),
                    None => {
                        return Err(SpecError {
                            line: r.line,
                            col: r.col,
                            msg: format!(
                                "unknown label {:?}: define it with `{}: name …;`",
                                r.label, r.label
                            ),
                        })
                    }
                }
            }
            deps.push(v);
        }
        let n = self.domains.len();
        let mut done = vec![false; n];
        let mut order = vec![];
        while order.len() < n {
            let before = order.len();
            for i in 0..n {
                if !done[i] && deps[i].iter().all(|&j| done[j]) {
                    done[i] = true;
                    order.push(i);
                }
            }
            if order.len() == before {
                let i = (0..n).find(|&i| !done[i]).unwrap_or(0);
                let d = &self.domains[i];
                let stuck: Vec<String> = (0..n)
                    .filter(|&k| !done[k])
                    .map(|k| {
                        let dk = &self.domains[k];
                        dk.label.clone().unwrap_or_else(|| dk.name.clone())
                    })
                    .collect();
                return Err(SpecError {
                    line: d.line,
                    col: d.col,
                    msg: format!(
                        "cycle among ancestors/originals: {} — no domain can be registered first",
                        stuck.join(", ")
                    ),
                });
            }
        }
        Ok(order)
    }
}
