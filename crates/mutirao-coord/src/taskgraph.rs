//! Task graphs whose tasks are commands (`mutirao submit --dag`, docs/grid.md "Task graphs").
//!
//! The `mutirao-taskgraph/1` format is `mutirao-dag/1` (tasks with `work`, edges with `bytes`,
//! what the schedulers of `mutirao-sched` read) where every task also names the command it runs
//! (`cmd`, an argv) and the files it leaves behind (`outputs`), and every edge the files of its
//! source handed to its destination (`files`):
//!
//! ```json
//! { "format": "mutirao-taskgraph/1",
//!   "tasks": [ { "id": "a", "work": 1.0, "cmd": ["sh", "-c", "echo 3 > n"], "outputs": ["n"] },
//!              { "id": "b", "work": 1.0, "cmd": ["sh", "-c", "echo $(( $(cat n) * 2 )) > m"], "outputs": ["m"] } ],
//!   "edges": [ { "from": "a", "to": "b", "bytes": 8, "files": ["n"] } ] }
//! ```
//!
//! Everything here is pure: [`TaskGraph::parse`] validates a document strictly (every error
//! names the task, edge or field), [`plan`] maps tasks to eligible hosts (a function of the
//! graph, the model and the hosts, tested alone), [`task_script`] writes the shell script an
//! agent runs for one task, and [`OutputParser`] takes the files it hands back out of its
//! output.
//!
//! How files travel: a task's script carries its input files (base64, inside the script), runs
//! the command in a fresh directory, and after it exits 0 prints each declared output between
//! markers carrying a per-run nonce. The coordinator stores those outputs in its
//! content-addressed repository and journals their digests (`task-done` events); a successor's
//! script, built from the repository, is itself stored there and fetched by the successor's
//! agent by digest (and checked), like any program.

use mutirao_sched::{dag, Algorithm, Dag};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};

/// The format tag.
pub const TASKGRAPH_FORMAT: &str = "mutirao-taskgraph/1";
/// Most tasks a graph may have.
pub const MAX_TASKS: usize = 10_000;
/// Longest file name.
const MAX_NAME: usize = 255;

/// One task as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    /// Unique id.
    pub id: String,
    /// Seconds of computation on a host of speed 1.0 (for the scheduler).
    pub work: f64,
    /// The command (argv; run with `PATH` lookup in the task's own directory).
    pub cmd: Vec<String>,
    /// Files the command leaves in its directory that successors may receive.
    #[serde(default)]
    pub outputs: Vec<String>,
    /// Files of the submitter put into the task's directory before it starts (mode 0755, so
    /// a program can be one): name → digest in the repository (`submit --dag` uploads the
    /// local paths written here and puts their digests in their place).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<String, String>,
}

/// One edge as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EdgeSpec {
    /// Source task id.
    pub from: String,
    /// Destination task id.
    pub to: String,
    /// Bytes it carries (for the scheduler).
    pub bytes: u64,
    /// Outputs of `from` copied into `to`'s directory before it starts.
    #[serde(default)]
    pub files: Vec<String>,
}

/// A `mutirao-taskgraph/1` document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskGraph {
    /// Always [`TASKGRAPH_FORMAT`].
    pub format: String,
    /// Tasks.
    pub tasks: Vec<TaskSpec>,
    /// Edges.
    #[serde(default)]
    pub edges: Vec<EdgeSpec>,
}

fn check_file_name(what: &str, f: &str) -> Result<(), String> {
    if f.is_empty() || f.len() > MAX_NAME || f == "." || f == ".." {
        return Err(format!(
            "{what}: file name {f:?} must be 1 to {MAX_NAME} characters and not . or .."
        ));
    }
    if let Some(c) = f
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "{what}: file name {f:?} has {c:?}; use letters, digits, '.', '_' and '-' (files live in the task's own directory)"
        ));
    }
    Ok(())
}

impl TaskGraph {
    /// Parse and validate a document; the error names the task, edge or field at fault.
    pub fn parse(text: &str) -> Result<(TaskGraph, Dag), String> {
        let g: TaskGraph = serde_json::from_str(text)
            .map_err(|e| format!("not a {TASKGRAPH_FORMAT} document: {e}"))?;
        let d = g.validate()?;
        Ok((g, d))
    }

    /// Check everything the format promises and build the scheduler's graph.
    pub fn validate(&self) -> Result<Dag, String> {
        if self.format != TASKGRAPH_FORMAT {
            return Err(format!(
                "format {:?}: expected {TASKGRAPH_FORMAT:?}",
                self.format
            ));
        }
        if self.tasks.is_empty() {
            return Err("the graph has no tasks".into());
        }
        if self.tasks.len() > MAX_TASKS {
            return Err(format!(
                "{} tasks; at most {MAX_TASKS} are accepted",
                self.tasks.len()
            ));
        }
        let mut outputs: HashMap<&str, HashSet<&str>> = HashMap::new();
        for (i, t) in self.tasks.iter().enumerate() {
            let what = format!("task {} ({:?})", i + 1, t.id);
            crate::model::check_text(&format!("{what}: id"), &t.id)?;
            if t.id.trim().is_empty() {
                return Err(format!("task {}: empty id", i + 1));
            }
            if t.id.chars().any(char::is_control) {
                return Err(format!("{what}: the id has a control character"));
            }
            if t.cmd.is_empty() || t.cmd[0].is_empty() {
                return Err(format!(
                    "{what}: `cmd` must name a command (an argv such as [\"sh\", \"-c\", \"...\"])"
                ));
            }
            if t.cmd.len() > crate::MAX_ARGS {
                return Err(format!(
                    "{what}: `cmd` has more than {} words",
                    crate::MAX_ARGS
                ));
            }
            for (k, a) in t.cmd.iter().enumerate() {
                crate::model::check_text(&format!("{what}: cmd word {}", k + 1), a)?;
            }
            let mut seen = HashSet::new();
            for f in &t.outputs {
                check_file_name(&format!("{what}: outputs"), f)?;
                if !seen.insert(f.as_str()) {
                    return Err(format!("{what}: output {f:?} is listed twice"));
                }
            }
            for (f, d) in &t.files {
                check_file_name(&format!("{what}: files"), f)?;
                crate::repo::check_digest(d).map_err(|e| {
                    format!("{what}: files: {f:?}: {e} (submit --dag uploads local files and writes their digests)")
                })?;
            }
            if outputs.insert(&t.id, seen).is_some() {
                return Err(format!("{what}: id {:?} is used by another task", t.id));
            }
        }
        let mut inputs: HashMap<&str, HashMap<&str, &str>> = HashMap::new();
        for (i, e) in self.edges.iter().enumerate() {
            let what = format!("edge {} ({} -> {})", i + 1, e.from, e.to);
            let Some(outs) = outputs.get(e.from.as_str()) else {
                return Err(format!("{what}: `from` names no task"));
            };
            if !outputs.contains_key(e.to.as_str()) {
                return Err(format!("{what}: `to` names no task"));
            }
            for f in &e.files {
                check_file_name(&format!("{what}: files"), f)?;
                if !outs.contains(f.as_str()) {
                    return Err(format!(
                        "{what}: file {f:?} is not among task {:?}'s outputs; add it to its `outputs`",
                        e.from
                    ));
                }
                if self
                    .tasks
                    .iter()
                    .any(|t| t.id == e.to && t.files.contains_key(f))
                {
                    return Err(format!(
                        "{what}: task {:?} has its own file {f:?} already; rename one",
                        e.to
                    ));
                }
                let got = inputs.entry(&e.to).or_default();
                if let Some(other) = got.insert(f, &e.from) {
                    return Err(format!(
                        "{what}: task {:?} would receive file {f:?} from both {other:?} and {:?}; rename one",
                        e.to, e.from
                    ));
                }
            }
        }
        let tasks = self
            .tasks
            .iter()
            .map(|t| dag::Task {
                id: t.id.clone(),
                work: t.work,
            })
            .collect();
        let idx: HashMap<&str, usize> = self
            .tasks
            .iter()
            .enumerate()
            .map(|(i, t)| (t.id.as_str(), i))
            .collect();
        let edges = self
            .edges
            .iter()
            .map(|e| dag::Edge {
                from: idx[e.from.as_str()],
                to: idx[e.to.as_str()],
                bytes: e.bytes,
            })
            .collect();
        Dag::new(tasks, edges).map_err(|e| e.to_string())
    }
}

/// The scheduling algorithm a task-graph job's `args` name (none: `hlogp-heft`).
pub fn algorithm(args: &[String]) -> Result<Algorithm, String> {
    match args {
        [] => Ok(Algorithm::HlogpHeft),
        [a] => match a.parse::<Algorithm>() {
            Ok(x @ (Algorithm::HlogpHeft | Algorithm::Heft | Algorithm::RoundRobin)) => Ok(x),
            _ => Err(format!(
                "algorithm {a:?}: use hlogp-heft, heft or round-robin"
            )),
        },
        _ => Err("a task graph job takes at most one argument, the algorithm".into()),
    }
}

/// Where each task runs and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Task id → host name.
    pub host_of: BTreeMap<String, String>,
    /// The scheduler's predicted makespan, seconds (`None` without a model).
    pub makespan_s: Option<f64>,
    /// How it was decided, for the journal.
    pub how: String,
}

/// Map `dag`'s tasks to `eligible` hosts (in order of preference, at least one): with a
/// calibrated `model` naming some of them, `algo` from `mutirao-sched` over those hosts (the
/// model restricted to them) and its predicted makespan; without one (or when the model names
/// none of them, or cannot be restricted), round-robin in topological order over the eligible
/// hosts, the reason said in `how`.
pub fn plan(
    dag: &Dag,
    model: Option<&mutirao_model::Model>,
    eligible: &[String],
    algo: Algorithm,
) -> Result<Plan, String> {
    if eligible.is_empty() {
        return Err("no eligible host".into());
    }
    let fallback = |why: String| {
        let mut host_of = BTreeMap::new();
        for (k, &t) in dag.topo_order().iter().enumerate() {
            host_of.insert(
                dag.tasks()[t].id.clone(),
                eligible[k % eligible.len()].clone(),
            );
        }
        Plan {
            host_of,
            makespan_s: None,
            how: format!(
                "{why}: tasks dealt round-robin in topological order over the eligible hosts ({}); no makespan predicted",
                eligible.join(", ")
            ),
        }
    };
    let Some(m) = model else {
        return Ok(fallback("no calibrated model (coordinator --model)".into()));
    };
    let keep: HashSet<&str> = eligible.iter().map(String::as_str).collect();
    let mut sub = m.clone();
    sub.hosts.retain(|h| keep.contains(h.name.as_str()));
    if sub.hosts.is_empty() {
        return Ok(fallback(
            "the calibrated model names none of the eligible hosts".into(),
        ));
    }
    let named: HashSet<String> = sub.hosts.iter().map(|h| h.name.clone()).collect();
    let in_model = |h: &Option<String>| h.as_ref().is_none_or(|h| named.contains(h));
    sub.links.retain(|l| in_model(&l.src) && in_model(&l.dst));
    sub.push_cost.retain(|p| named.contains(&p.host));
    // Capacities describe the whole calibrated platform; the restricted one goes without.
    sub.capacity = None;
    let platform = match mutirao_sched::Platform::from_model(&sub) {
        Ok(p) => p,
        Err(e) => {
            return Ok(fallback(format!(
                "the calibrated model restricted to the eligible hosts is unusable ({e})"
            )))
        }
    };
    let s = mutirao_sched::sched::schedule(dag, &platform, algo)
        .map_err(|e| format!("{}: {e}", algo.as_str()))?;
    let host_of: BTreeMap<String, String> = s
        .tasks
        .iter()
        .map(|t| (t.id.clone(), t.host.clone()))
        .collect();
    if host_of.len() != dag.len() {
        return Err(format!(
            "{} placed {} of {} tasks",
            algo.as_str(),
            host_of.len(),
            dag.len()
        ));
    }
    let left: Vec<&str> = eligible
        .iter()
        .filter(|h| !named.contains(*h))
        .map(String::as_str)
        .collect();
    let mut how = format!(
        "{} with the calibrated model over {} host(s); predicted makespan {:.3} s",
        algo.as_str(),
        named.len(),
        s.makespan_s
    );
    if !left.is_empty() {
        how.push_str(&format!(
            "; eligible but not in the model, so unused: {}",
            left.join(", ")
        ));
    }
    Ok(Plan {
        host_of,
        makespan_s: Some(s.makespan_s),
        how,
    })
}

/// `s` quoted for a POSIX shell.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Marker lines of a task's output files.
const BEGIN: &str = "@@mutirao-file";
const END: &str = "@@mutirao-end";

/// The POSIX shell script an agent runs for `task`: it writes `inputs` (name, bytes,
/// executable) into a fresh directory, runs the command there, and after it exits 0 prints each declared output
/// between markers with `nonce` (base64, 76 columns); a missing output fails it (exit 124).
/// Needs `sh`, `mktemp`, `base64` and `fold` on the host.
pub fn task_script(task: &TaskSpec, inputs: &[(String, Vec<u8>, bool)], nonce: &str) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    s.push_str("#!/bin/sh\n# a task of a mutirão task graph\n");
    s.push_str("d=$(mktemp -d \"${TMPDIR:-/tmp}/mutirao-task.XXXXXX\") || exit 125\n");
    s.push_str("trap 'rm -rf \"$d\"' EXIT\ncd \"$d\" || exit 125\n");
    for (name, bytes, exe) in inputs {
        let _ = writeln!(
            s,
            "base64 -d > {} <<'MUTIRAO_{nonce}' || exit 125",
            sh_quote(name)
        );
        let b64 = base64(bytes);
        for chunk in b64.as_bytes().chunks(76) {
            s.push_str(std::str::from_utf8(chunk).unwrap_or_default());
            s.push('\n');
        }
        let _ = writeln!(s, "MUTIRAO_{nonce}");
        if *exe {
            let _ = writeln!(s, "chmod 755 {} || exit 125", sh_quote(name));
        }
    }
    let argv: Vec<String> = task.cmd.iter().map(|a| sh_quote(a)).collect();
    let _ = writeln!(s, "{} </dev/null", argv.join(" "));
    s.push_str("rc=$?\n[ \"$rc\" -eq 0 ] || exit \"$rc\"\n");
    for f in &task.outputs {
        let q = sh_quote(f);
        let _ = writeln!(
            s,
            "[ -f {q} ] || {{ echo \"mutirao: task {}: declared output {f} was not produced\" >&2; exit 124; }}",
            task.id.replace(['"', '$', '`', '\\'], "_")
        );
        let _ = writeln!(
            s,
            "echo '{BEGIN} {nonce} {f}'; base64 < {q} | fold -w 76 || exit 125; echo '{END} {nonce}'"
        );
    }
    s.push_str("exit 0\n");
    s
}

fn base64(bytes: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for k in 0..4 {
            if k <= c.len() {
                out.push(T[(n >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn unbase64(text: &str) -> Option<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let clean: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    if clean.len() % 4 != 0 {
        return None;
    }
    let mut out = Vec::with_capacity(clean.len() / 4 * 3);
    for q in clean.chunks(4) {
        let pad = q.iter().rev().take_while(|&&b| b == b'=').count();
        if pad > 2 || q[..4 - pad].contains(&b'=') {
            return None;
        }
        let mut n = 0u32;
        for &b in &q[..4 - pad] {
            n = n << 6 | val(b)?;
        }
        n <<= 6 * pad as u32;
        out.push((n >> 16) as u8);
        if pad < 2 {
            out.push((n >> 8) as u8);
        }
        if pad < 1 {
            out.push(n as u8);
        }
    }
    Some(out)
}

/// Splits a task's output (lines as the launcher tags them, `[rank] line`) into what goes to
/// the job's log (tagged `[task]`) and the files between the script's markers.
pub struct OutputParser {
    task: String,
    nonce: String,
    partial: Vec<u8>,
    current: Option<(String, String)>,
    files: Vec<(String, Vec<u8>)>,
    error: Option<String>,
    /// Largest file taken back (base64 text beyond 4/3 of it is refused).
    max: u64,
    /// Base64 text held so far (all files).
    held: u64,
}

impl OutputParser {
    /// A parser for one run of `task` with `nonce`, taking back at most `max` bytes of
    /// files in all (the repository's limit).
    pub fn new(task: &str, nonce: &str, max: u64) -> OutputParser {
        OutputParser {
            task: task.to_string(),
            nonce: nonce.to_string(),
            partial: Vec::new(),
            current: None,
            files: Vec::new(),
            error: None,
            max,
            held: 0,
        }
    }

    /// Take output bytes; returns what goes to the job's log.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<u8> {
        self.partial.extend_from_slice(bytes);
        let mut log = Vec::new();
        while let Some(i) = self.partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=i).collect();
            let line = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
            // The launcher's tag of rank 0 (the only rank of a task).
            let body = line
                .strip_prefix("[0] ")
                .or_else(|| line.strip_prefix("[0]"))
                .unwrap_or(&line);
            if let Some((name, data)) = &mut self.current {
                if body == format!("{END} {}", self.nonce) {
                    match unbase64(data) {
                        Some(b) => self.files.push((name.clone(), b)),
                        None => {
                            self.error = Some(format!("output {name} came back garbled"));
                        }
                    }
                    self.current = None;
                } else {
                    self.held += body.len() as u64;
                    if self.held > self.max.saturating_mul(4) / 3 + 4 {
                        if self.error.is_none() {
                            self.error = Some(format!(
                                "its outputs exceed {} bytes, the repository's limit (--max-upload-mib)",
                                self.max
                            ));
                        }
                        data.clear();
                    } else {
                        data.push_str(body);
                    }
                }
                continue;
            }
            if let Some(rest) = body.strip_prefix(&format!("{BEGIN} {} ", self.nonce)) {
                self.current = Some((rest.to_string(), String::new()));
                continue;
            }
            if line.starts_with("mutirao: ") {
                log.extend_from_slice(line.as_bytes());
            } else {
                log.extend_from_slice(format!("[{}] {body}", self.task).as_bytes());
            }
            log.push(b'\n');
        }
        log
    }

    /// The files received, or why they cannot be trusted.
    pub fn finish(self, declared: &[String]) -> Result<Vec<(String, Vec<u8>)>, String> {
        if let Some(e) = self.error {
            return Err(e);
        }
        if let Some((name, _)) = self.current {
            return Err(format!("output {name} was cut short"));
        }
        for f in declared {
            if !self.files.iter().any(|(n, _)| n == f) {
                return Err(format!("declared output {f} did not come back"));
            }
        }
        Ok(self
            .files
            .into_iter()
            .filter(|(n, _)| declared.contains(n))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIAMOND: &str = r#"{ "format": "mutirao-taskgraph/1",
      "tasks": [
        { "id": "a", "work": 1, "cmd": ["sh", "-c", "echo 3 > n"], "outputs": ["n"] },
        { "id": "b", "work": 2, "cmd": ["sh", "-c", "echo $(( $(cat n) * 2 )) > b"], "outputs": ["b"] },
        { "id": "c", "work": 2, "cmd": ["sh", "-c", "echo $(( $(cat n) + 10 )) > c"], "outputs": ["c"] },
        { "id": "d", "work": 1, "cmd": ["sh", "-c", "echo $(( $(cat b) + $(cat c) )) > d; cat d"], "outputs": ["d"] } ],
      "edges": [
        { "from": "a", "to": "b", "bytes": 8, "files": ["n"] },
        { "from": "a", "to": "c", "bytes": 8, "files": ["n"] },
        { "from": "b", "to": "d", "bytes": 8, "files": ["b"] },
        { "from": "c", "to": "d", "bytes": 8, "files": ["c"] } ] }"#;

    #[test]
    fn a_diamond_parses_and_bad_graphs_are_refused_by_name() {
        let (g, d) = TaskGraph::parse(DIAMOND).unwrap();
        assert_eq!((g.tasks.len(), d.len(), d.edges().len()), (4, 4, 4));
        let bad = |from: &str, to: &str| DIAMOND.replacen(from, to, 1);
        for (text, want) in [
            (bad("mutirao-taskgraph/1", "mutirao-dag/1"), "format"),
            (
                bad(r#""from": "b", "to": "d""#, r#""from": "x", "to": "d""#),
                "edge 3 (x -> d): `from` names no task",
            ),
            (
                bad(r#""files": ["b"]"#, r#""files": ["zz"]"#),
                "edge 3 (b -> d): file \"zz\" is not among task \"b\"'s outputs",
            ),
            (
                bad(r#""cmd": ["sh", "-c", "echo 3 > n"]"#, r#""cmd": []"#),
                "task 1 (\"a\"): `cmd`",
            ),
            (
                bad(r#""outputs": ["n"]"#, r#""outputs": ["../n"]"#),
                "task 1 (\"a\"): outputs: file name \"../n\"",
            ),
            (
                bad(r#""id": "c""#, r#""id": "b""#),
                "task 3 (\"b\"): id \"b\" is used by another task",
            ),
            (
                bad(r#""files": ["c"]"#, r#""files": ["c"], "extra": 1"#),
                "unknown field `extra`",
            ),
            (
                bad(
                    r#""from": "c", "to": "d", "bytes": 8, "files": ["c"]"#,
                    r#""from": "d", "to": "a", "bytes": 8, "files": []"#,
                ),
                "cycle",
            ),
            (bad(r#""work": 1,"#, r#""work": -1,"#), "work"),
        ] {
            let e = TaskGraph::parse(&text).unwrap_err();
            assert!(e.contains(want), "{want:?} not in {e:?}");
        }
        // Two predecessors handing over the same name.
        let e = TaskGraph::parse(
            &DIAMOND
                .replace(r#""outputs": ["c"]"#, r#""outputs": ["c", "b"]"#)
                .replace(r#""files": ["c"]"#, r#""files": ["b"]"#),
        )
        .unwrap_err();
        assert!(e.contains("from both \"b\" and \"c\""), "{e}");
    }

    #[test]
    fn a_task_s_own_files_are_digests_and_do_not_clash_with_its_inputs() {
        let (mut g, _) = TaskGraph::parse(DIAMOND).unwrap();
        g.tasks[3].files.insert("tool".into(), "./tool".into());
        let e = g.validate().unwrap_err();
        assert!(e.contains("task 4 (\"d\"): files: \"tool\""), "{e}");
        let d = crate::repo::digest_of(b"tool");
        g.tasks[3].files.insert("tool".into(), d.clone());
        g.validate().unwrap();
        g.tasks[3].files.insert("b".into(), d);
        let e = g.validate().unwrap_err();
        assert!(
            e.contains("task \"d\" has its own file \"b\" already"),
            "{e}"
        );
        g.tasks[3].files.clear();
        g.tasks[3].id = "d\necho".into();
        assert!(g.validate().unwrap_err().contains("control character"));
    }

    #[test]
    fn base64_round_trips() {
        for n in 0..40usize {
            let b: Vec<u8> = (0..n).map(|i| (i * 37 + 11) as u8).collect();
            assert_eq!(unbase64(&base64(&b)).unwrap(), b);
        }
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert!(unbase64("Zm9=v").is_none());
    }

    #[test]
    fn without_a_model_tasks_go_round_robin_in_topological_order() {
        let (_, d) = TaskGraph::parse(DIAMOND).unwrap();
        let hosts = vec!["h1".to_string(), "h2".to_string()];
        let p = plan(&d, None, &hosts, Algorithm::HlogpHeft).unwrap();
        assert_eq!(p.makespan_s, None);
        assert!(p.how.contains("no calibrated model"), "{}", p.how);
        assert_eq!(p.host_of.len(), 4);
        assert_eq!(p.host_of["a"], "h1");
        assert!(p.host_of.values().any(|h| h == "h2"));
        assert!(plan(&d, None, &[], Algorithm::Heft).is_err());
    }

    fn model(speeds: &[(&str, f64)]) -> mutirao_model::Model {
        let hosts: Vec<serde_json::Value> = speeds
            .iter()
            .map(|(n, s)| serde_json::json!({ "name": n, "site": "s", "speed": s }))
            .collect();
        let lin = serde_json::json!([ { "from": 0, "base_us": 10.0, "per_byte_us": 0.001 } ]);
        let m = serde_json::json!({ "format": "mutirao-model/1", "hosts": hosts, "links": [
            { "class": "same-host", "os": lin, "or": lin, "l": lin },
            { "class": "intra-site", "os": lin, "or": lin, "l": lin } ] });
        mutirao_model::Model::from_json(&m.to_string()).unwrap()
    }

    #[test]
    fn with_a_model_the_scheduler_maps_tasks_to_eligible_hosts_only() {
        let (_, d) = TaskGraph::parse(DIAMOND).unwrap();
        // "fast" is in the model but not eligible; "slow" and "mid" are; "other" is not modelled.
        let m = model(&[("fast", 100.0), ("slow", 1.0), ("mid", 4.0)]);
        let eligible = vec!["slow".to_string(), "mid".to_string(), "other".to_string()];
        for algo in [Algorithm::HlogpHeft, Algorithm::Heft] {
            let p = plan(&d, Some(&m), &eligible, algo).unwrap();
            let ms = p.makespan_s.unwrap();
            assert!(ms > 0.0 && ms.is_finite(), "{ms}");
            assert!(
                p.host_of.values().all(|h| h == "slow" || h == "mid"),
                "{:?}",
                p.host_of
            );
            // The critical path (a, one of b/c, d) goes to the faster host.
            assert_eq!(p.host_of["a"], "mid");
            assert_eq!(p.host_of["d"], "mid");
            assert!(
                p.how.contains(algo.as_str()) && p.how.contains("other"),
                "{}",
                p.how
            );
        }
        let p = plan(&d, Some(&m), &["nope".to_string()], Algorithm::HlogpHeft).unwrap();
        assert!(
            p.how.contains("names none of the eligible hosts"),
            "{}",
            p.how
        );
        assert!(p.host_of.values().all(|h| h == "nope"));
    }

    #[test]
    fn the_parser_takes_files_out_of_the_log_and_checks_them() {
        let mut p = OutputParser::new("b", "N1", 1 << 20);
        let mut log = p.feed(b"[0] hello\n[0] @@mutirao-file N1 out\n[0] aGVs");
        log.extend(p.feed(b"bG8=\n[0] @@mutirao-end N1\n[0] @@mutirao-file WRONG x\n"));
        assert_eq!(
            String::from_utf8(log).unwrap(),
            "[b] hello\n[b] @@mutirao-file WRONG x\n"
        );
        let files = p.finish(&["out".to_string()]).unwrap();
        assert_eq!(files, vec![("out".to_string(), b"hello".to_vec())]);
        let mut p = OutputParser::new("b", "N1", 1 << 20);
        p.feed(b"[0] @@mutirao-file N1 out\n[0] aGVs\n");
        assert!(p
            .finish(&["out".to_string()])
            .unwrap_err()
            .contains("cut short"));
        let mut p = OutputParser::new("b", "N1", 2);
        p.feed(b"[0] @@mutirao-file N1 out\n[0] aGVsbG8=\n[0] @@mutirao-end N1\n");
        assert!(p
            .finish(&["out".to_string()])
            .unwrap_err()
            .contains("exceed 2 bytes"));
        let p = OutputParser::new("b", "N1", 1 << 20);
        assert!(p
            .finish(&["out".to_string()])
            .unwrap_err()
            .contains("did not come back"));
    }

    #[test]
    fn the_script_runs_the_command_and_hands_its_outputs_back() {
        let (g, _) = TaskGraph::parse(DIAMOND).unwrap();
        let s = task_script(
            &g.tasks[3],
            &[
                ("b".into(), b"6\n".to_vec(), false),
                ("c".into(), b"13\n".to_vec(), false),
            ],
            "XY",
        );
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&s)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut p = OutputParser::new("d", "XY", 1 << 20);
        let tagged: String = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| format!("[0] {l}\n"))
            .collect();
        let log = p.feed(tagged.as_bytes());
        assert_eq!(String::from_utf8(log).unwrap(), "[d] 19\n");
        assert_eq!(
            p.finish(&g.tasks[3].outputs).unwrap(),
            vec![("d".to_string(), b"19\n".to_vec())]
        );
        // A missing output fails the task.
        let mut t = g.tasks[0].clone();
        t.outputs.push("never".into());
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(task_script(&t, &[], "Z"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(124));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("declared output never was not produced")
        );
    }
}
