//! The thesis's file formats (HLogP modeller, digest 000 §1.3, §1.4, §11.3).
//!
//! * **Host list** (Fig. 4.1): one host per line, `hostname [exec_path]`. Beyond the thesis:
//!   blank lines and `#` comments are ignored, and a `site=NAME` token may follow; otherwise the
//!   site is inferred from the domain ([`infer_site`]).
//! * **Output** (Fig. 4.2): line 1 `n`; then n lines `H host Os Or operating_system [exec_path]`;
//!   then an n×n latency matrix (row = origin, column = destination, 0 on the diagonal). One file
//!   holds one message size; our writer records it in a trailing `#` comment, which our reader
//!   skips. Numbers such as `23,567` are accepted: by default the comma is a thousands separator
//!   (23567), and every such reading is reported as a warning ([`CommaStyle`]).
//!
//! ```
//! use mutirao_model::legacy::{parse_host_list, write_host_list};
//! let text = "caju.ic.uff.br\nn01.par.inf.puc-rio.br /home/helder\n";
//! let hosts = parse_host_list(text).unwrap();
//! assert_eq!(hosts[1].exec_path.as_deref(), Some("/home/helder"));
//! assert_eq!(write_host_list(&hosts), text);
//! ```

use crate::calib::{Calibration, SendMode};
use serde::{Deserialize, Serialize};

/// A syntax or content error, with its place.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("line {line}, column {col}: {msg}")]
pub struct LegacyError {
    /// 1-based line (0 when the error is not tied to a line).
    pub line: usize,
    /// 1-based column.
    pub col: usize,
    /// What is wrong.
    pub msg: String,
}

fn err(line: usize, col: usize, msg: impl Into<String>) -> LegacyError {
    LegacyError {
        line,
        col,
        msg: msg.into(),
    }
}

/// One line of a Fig. 4.1 host list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LegacyHost {
    /// Host name.
    pub name: String,
    /// Path of the executables on that host, if given.
    pub exec_path: Option<String>,
    /// `site=NAME`, if given (beyond the thesis).
    pub site: Option<String>,
}

/// Split a line into (1-based column, token), stopping at a `#` comment.
fn tokens(line: &str) -> Vec<(usize, &str)> {
    let line = match line.find('#') {
        Some(i) => &line[..i],
        None => line,
    };
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in line.char_indices() {
        if c.is_whitespace() {
            if let Some(s) = start.take() {
                out.push((line[..s].chars().count() + 1, &line[s..i]));
            }
        } else if start.is_none() {
            start = Some(i);
        }
    }
    if let Some(s) = start {
        out.push((line[..s].chars().count() + 1, &line[s..]));
    }
    out
}

/// Parse a Fig. 4.1 host list.
pub fn parse_host_list(text: &str) -> Result<Vec<LegacyHost>, LegacyError> {
    let mut out: Vec<LegacyHost> = Vec::new();
    for (ln, line) in text.lines().enumerate() {
        let ln = ln + 1;
        let toks = tokens(line);
        let Some(&(_, name)) = toks.first() else {
            continue;
        };
        if name.starts_with("site=") {
            return Err(err(ln, toks[0].0, "the line must start with a host name"));
        }
        if out.iter().any(|h| h.name == name) {
            return Err(err(ln, toks[0].0, format!("host {name:?} is listed twice")));
        }
        let mut h = LegacyHost {
            name: name.to_string(),
            exec_path: None,
            site: None,
        };
        for &(col, t) in &toks[1..] {
            if let Some(s) = t.strip_prefix("site=") {
                if s.is_empty() || h.site.is_some() {
                    return Err(err(
                        ln,
                        col,
                        "expected one `site=NAME` with a non-empty name",
                    ));
                }
                h.site = Some(s.to_string());
            } else if h.exec_path.is_none() {
                h.exec_path = Some(t.to_string());
            } else {
                return Err(err(
                    ln,
                    col,
                    format!("unexpected {t:?}: a line is `hostname [exec_path] [site=NAME]`"),
                ));
            }
        }
        out.push(h);
    }
    Ok(out)
}

/// Write a host list in the Fig. 4.1 layout (`site=` only where a site is set).
pub fn write_host_list(hosts: &[LegacyHost]) -> String {
    let mut s = String::new();
    for h in hosts {
        s.push_str(&h.name);
        if let Some(p) = &h.exec_path {
            s.push(' ');
            s.push_str(p);
        }
        if let Some(site) = &h.site {
            s.push_str(" site=");
            s.push_str(site);
        }
        s.push('\n');
    }
    s
}

/// The site of a host: the explicit `site=` if any; else the first `(suffix, site)` of `map`
/// whose suffix ends the name (longest suffix wins); else the domain (the name after its first
/// dot, e.g. `ic.uff.br`); else the name itself.
pub fn infer_site(host: &LegacyHost, map: &[(String, String)]) -> String {
    if let Some(s) = &host.site {
        return s.clone();
    }
    if let Some((_, site)) = map
        .iter()
        .filter(|(suf, _)| host.name.ends_with(suf.as_str()))
        .max_by_key(|(suf, _)| suf.len())
    {
        return site.clone();
    }
    match host.name.split_once('.') {
        Some((_, dom)) if !dom.is_empty() => dom.to_string(),
        _ => host.name.clone(),
    }
}

/// How to read a comma inside a number such as `23,567`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CommaStyle {
    /// `23,567` = 23567 (the default: the reading that makes Fig. 4.2's inter-site latencies
    /// larger than its intra-site ones).
    #[default]
    Thousands,
    /// `23,567` = 23.567 (the thesis's Portuguese decimal comma).
    Decimal,
}

/// A host line of Fig. 4.2.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LegacyOutHost {
    /// H.
    pub h: f64,
    /// Host name.
    pub name: String,
    /// Send overhead (µs), one per host.
    pub os: f64,
    /// Receive overhead (µs), one per host.
    pub or: f64,
    /// Operating system (one token).
    pub system: String,
    /// Executable path, if given.
    pub exec_path: Option<String>,
}

/// A whole Fig. 4.2 file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LegacyOutput {
    /// Host lines, in file order.
    pub hosts: Vec<LegacyOutHost>,
    /// `latency[i][j]`: L from host i to host j (µs), 0 on the diagonal.
    pub latency: Vec<Vec<f64>>,
}

fn number(
    tok: &str,
    comma: CommaStyle,
    line: usize,
    col: usize,
    warnings: &mut Vec<String>,
) -> Result<f64, LegacyError> {
    let value = if tok.contains(',') {
        let t = match comma {
            CommaStyle::Thousands => {
                let mut parts = tok.split(',');
                let head = parts.next().unwrap_or("");
                let ok = !head.is_empty()
                    && head
                        .trim_start_matches('-')
                        .chars()
                        .all(|c| c.is_ascii_digit())
                    && parts.all(|p| p.len() == 3 && p.chars().all(|c| c.is_ascii_digit()));
                if !ok {
                    return Err(err(
                        line,
                        col,
                        format!("{tok:?} is not a number with thousands separators (use the decimal-comma reading if it is one)"),
                    ));
                }
                tok.replace(',', "")
            }
            CommaStyle::Decimal => tok.replace(',', "."),
        };
        let v: f64 = t
            .parse()
            .map_err(|_| err(line, col, format!("{tok:?} is not a number")))?;
        warnings.push(format!(
            "line {line}, column {col}: {tok:?} read as {v} ({})",
            match comma {
                CommaStyle::Thousands => "comma as thousands separator",
                CommaStyle::Decimal => "comma as decimal separator",
            }
        ));
        v
    } else {
        tok.parse()
            .map_err(|_| err(line, col, format!("{tok:?} is not a number")))?
    };
    if !value.is_finite() {
        return Err(err(line, col, format!("{tok:?} is not a finite number")));
    }
    Ok(value)
}

/// Parse a Fig. 4.2 output file. Returns the data and the warnings (comma readings).
pub fn parse_output(
    text: &str,
    comma: CommaStyle,
) -> Result<(LegacyOutput, Vec<String>), LegacyError> {
    let mut warnings = Vec::new();
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, tokens(l)))
        .filter(|(_, t)| !t.is_empty());
    let (ln, toks) = lines
        .next()
        .ok_or_else(|| err(0, 0, "empty file: expected the number of hosts on line 1"))?;
    if toks.len() != 1 {
        return Err(err(
            ln,
            toks[1].0,
            "line 1 must hold only the number of hosts",
        ));
    }
    let n: usize = toks[0].1.parse().map_err(|_| {
        err(
            ln,
            toks[0].0,
            format!("{:?} is not a host count", toks[0].1),
        )
    })?;
    let mut hosts: Vec<LegacyOutHost> = Vec::with_capacity(n.min(4096));
    for k in 0..n {
        let (ln, t) = lines
            .next()
            .ok_or_else(|| err(0, 0, format!("file ends after {k} of {n} host lines")))?;
        if t.len() < 5 || t.len() > 6 {
            return Err(err(
                ln,
                t[0].0,
                format!(
                    "a host line is `H host Os Or operating_system [exec_path]`; found {} fields",
                    t.len()
                ),
            ));
        }
        let h = LegacyOutHost {
            h: number(t[0].1, comma, ln, t[0].0, &mut warnings)?,
            name: t[1].1.to_string(),
            os: number(t[2].1, comma, ln, t[2].0, &mut warnings)?,
            or: number(t[3].1, comma, ln, t[3].0, &mut warnings)?,
            system: t[4].1.to_string(),
            exec_path: t.get(5).map(|p| p.1.to_string()),
        };
        if hosts.iter().any(|o| o.name == h.name) {
            return Err(err(
                ln,
                t[1].0,
                format!("host {:?} is listed twice", h.name),
            ));
        }
        hosts.push(h);
    }
    let mut latency = Vec::with_capacity(n.min(4096));
    for i in 0..n {
        let (ln, t) = lines.next().ok_or_else(|| {
            err(
                0,
                0,
                format!("file ends after {i} of {n} latency matrix rows"),
            )
        })?;
        if t.len() != n {
            return Err(err(
                ln,
                t[0].0,
                format!("latency row {} has {} values; expected {n}", i + 1, t.len()),
            ));
        }
        let mut row = Vec::with_capacity(n);
        for (j, &(col, tok)) in t.iter().enumerate() {
            let v = number(tok, comma, ln, col, &mut warnings)?;
            if i == j && v != 0.0 {
                warnings.push(format!(
                    "line {ln}, column {col}: diagonal entry is {v}, the thesis writes 0"
                ));
            }
            row.push(v);
        }
        latency.push(row);
    }
    if let Some((ln, t)) = lines.next() {
        return Err(err(ln, t[0].0, "unexpected data after the latency matrix"));
    }
    Ok((LegacyOutput { hosts, latency }, warnings))
}

fn fmt_num(v: f64) -> String {
    let r = (v * 1000.0).round() / 1000.0;
    if r == 0.0 {
        "0".to_string()
    } else {
        format!("{r}")
    }
}

/// Write a Fig. 4.2 file (single-space separators, numbers rounded to 3 decimals, `.` as the
/// decimal point). `comment`, if given, is appended as a final `# ...` line (e.g. the message
/// size), which the thesis's layout has no place for.
pub fn write_output(out: &LegacyOutput, comment: Option<&str>) -> String {
    let mut s = format!("{}\n", out.hosts.len());
    for h in &out.hosts {
        s.push_str(&format!(
            "{} {} {} {} {}",
            fmt_num(h.h),
            h.name,
            fmt_num(h.os),
            fmt_num(h.or),
            h.system
        ));
        if let Some(p) = &h.exec_path {
            s.push(' ');
            s.push_str(p);
        }
        s.push('\n');
    }
    for row in &out.latency {
        let r: Vec<String> = row.iter().map(|&v| fmt_num(v)).collect();
        s.push_str(&r.join(" "));
        s.push('\n');
    }
    if let Some(c) = comment {
        for l in c.lines() {
            s.push_str("# ");
            s.push_str(l);
            s.push('\n');
        }
    }
    s
}

/// Build the Fig. 4.2 data of `calib` for one message size and send mode.
///
/// * H: the host's median kernel wall time per repetition (µs) — on its own scale, like the
///   thesis's H;
/// * Os of a host: the mean, over the other hosts it sends to, of the median send overhead at
///   `bytes` (the thesis prints one Os per host without saying how it aggregated);
/// * Or of a host: the same mean over the hosts it receives from;
/// * latency: the median L of each ordered pair (measured, or inherited per the provenance), 0 on
///   the diagonal.
///
/// Fails, naming the host or pair, if something is missing.
pub fn output_from_calibration(
    calib: &Calibration,
    bytes: u64,
    mode: SendMode,
) -> Result<LegacyOutput, LegacyError> {
    let n = calib.hosts.len();
    let mut latency = vec![vec![0.0; n]; n];
    let mut os_sum = vec![(0.0, 0usize); n];
    let mut or_sum = vec![(0.0, 0usize); n];
    for (i, a) in calib.hosts.iter().enumerate() {
        for (j, b) in calib.hosts.iter().enumerate() {
            if i == j {
                continue;
            }
            let sw = calib.source_of(&a.name, &b.name, mode).ok_or_else(|| {
                err(
                    0,
                    0,
                    format!(
                        "pair {} -> {} has no {} sweep (measured or inherited)",
                        a.name,
                        b.name,
                        mode.as_str()
                    ),
                )
            })?;
            let st = sw
                .size(bytes)
                .and_then(|s| s.stats.or_else(|| s.derive(sw.method)))
                .ok_or_else(|| {
                    err(
                        0,
                        0,
                        format!(
                            "pair {} -> {} (data from {} -> {}) has no samples at {bytes} B",
                            a.name, b.name, sw.src, sw.dst
                        ),
                    )
                })?;
            latency[i][j] = st.l.median;
            os_sum[i].0 += st.os.median;
            os_sum[i].1 += 1;
            or_sum[j].0 += st.or.median;
            or_sum[j].1 += 1;
        }
    }
    let mut hosts = Vec::with_capacity(n);
    for (i, h) in calib.hosts.iter().enumerate() {
        let hv = h.speed.as_ref().and_then(|s| s.h_us()).ok_or_else(|| {
            err(
                0,
                0,
                format!("host {} has no speed (H) measurement", h.name),
            )
        })?;
        let mean = |(s, c): (f64, usize)| if c == 0 { 0.0 } else { s / c as f64 };
        hosts.push(LegacyOutHost {
            h: hv,
            name: h.name.clone(),
            os: mean(os_sum[i]),
            or: mean(or_sum[i]),
            system: h
                .os
                .as_deref()
                .map(|s| s.split_whitespace().collect::<Vec<_>>().join("_"))
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "unknown".to_string()),
            exec_path: h.exec_path.clone(),
        });
    }
    Ok(LegacyOutput { hosts, latency })
}
