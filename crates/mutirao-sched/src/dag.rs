//! Task graphs: the `mutirao-dag/1` format, validation, and DOT export.
//!
//! A [`Dag`] holds tasks (an id and an amount of `work`, seconds on a speed-1.0 host) and edges
//! (a message of `bytes` bytes from one task to another). It is always acyclic, its ids are
//! unique and every edge joins two known tasks: the constructors check this.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fmt::Write as _;

/// The format tag every task-graph file carries.
pub const DAG_FORMAT: &str = "mutirao-dag/1";

/// What is wrong with a task graph; every variant says where.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DagError {
    /// The text is not JSON of the expected shape.
    #[error("task graph is not valid mutirao-dag/1 JSON: {0}")]
    Json(String),
    /// The `format` field is not `mutirao-dag/1`.
    #[error("task graph format is {found:?}, expected {DAG_FORMAT:?}")]
    Format {
        /// The tag found in the file.
        found: String,
    },
    /// Two tasks share an id.
    #[error(
        "tasks[{index}]: id {id:?} is already used by tasks[{first}]; task ids must be unique"
    )]
    DuplicateId {
        /// Index of the second task with this id.
        index: usize,
        /// Index of the first task with this id.
        first: usize,
        /// The id.
        id: String,
    },
    /// A task has negative or non-finite work.
    #[error("tasks[{index}] (id {id:?}): work is {work}; it must be a finite number >= 0 (seconds on a speed-1.0 host)")]
    BadWork {
        /// Index of the task.
        index: usize,
        /// Its id.
        id: String,
        /// The bad value.
        work: f64,
    },
    /// An edge names a task that does not exist.
    #[error("edges[{index}]: `{field}` names task {id:?}, which is not in `tasks`")]
    UnknownTask {
        /// Index of the edge.
        index: usize,
        /// `from` or `to`.
        field: &'static str,
        /// The unknown id.
        id: String,
    },
    /// An edge has a negative, fractional or non-finite size.
    #[error(
        "edges[{index}] ({from:?} -> {to:?}): bytes is {bytes}; it must be a whole number >= 0"
    )]
    BadBytes {
        /// Index of the edge.
        index: usize,
        /// Source id.
        from: String,
        /// Destination id.
        to: String,
        /// The bad value.
        bytes: f64,
    },
    /// The same ordered pair of tasks is joined twice.
    #[error("edges[{index}] ({from:?} -> {to:?}) repeats edges[{first}]; merge them into one edge by adding their bytes")]
    DuplicateEdge {
        /// Index of the repeated edge.
        index: usize,
        /// Index of the first edge.
        first: usize,
        /// Source id.
        from: String,
        /// Destination id.
        to: String,
    },
    /// The edges form a cycle; the ids along it are listed, first one repeated at the end.
    #[error("the task graph has a cycle: {}; remove one of these edges", .0.join(" -> "))]
    Cycle(Vec<String>),
}

/// One task: `work` seconds on a speed-1.0 host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    /// Unique id.
    pub id: String,
    /// Seconds of computation on a host of speed 1.0.
    pub work: f64,
}

/// One message between two tasks, by task index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Edge {
    /// Index of the sending task.
    pub from: usize,
    /// Index of the receiving task.
    pub to: usize,
    /// Message size in bytes.
    pub bytes: u64,
}

#[derive(Deserialize)]
struct RawDag {
    format: String,
    tasks: Vec<Task>,
    edges: Vec<RawEdge>,
}

#[derive(Deserialize)]
struct RawEdge {
    from: String,
    to: String,
    bytes: f64,
}

#[derive(Serialize)]
struct OutDag<'a> {
    format: &'static str,
    tasks: &'a [Task],
    edges: Vec<OutEdge<'a>>,
}

#[derive(Serialize)]
struct OutEdge<'a> {
    from: &'a str,
    to: &'a str,
    bytes: u64,
}

/// A validated, acyclic task graph with adjacency lists.
#[derive(Debug, Clone, PartialEq)]
pub struct Dag {
    tasks: Vec<Task>,
    edges: Vec<Edge>,
    // CSR adjacency: edge indices leaving / entering each task, in edge order.
    succ_off: Vec<usize>,
    succ: Vec<usize>,
    pred_off: Vec<usize>,
    pred: Vec<usize>,
    topo: Vec<usize>,
}

impl Dag {
    /// Build and validate a graph from tasks and index-based edges.
    ///
    /// Errors name the offending task or edge; a cycle is reported with its ids.
    pub fn new(tasks: Vec<Task>, edges: Vec<Edge>) -> Result<Self, DagError> {
        let mut first: HashMap<&str, usize> = HashMap::with_capacity(tasks.len());
        for (index, t) in tasks.iter().enumerate() {
            if let Some(&f) = first.get(t.id.as_str()) {
                return Err(DagError::DuplicateId {
                    index,
                    first: f,
                    id: t.id.clone(),
                });
            }
            first.insert(&t.id, index);
            if !(t.work.is_finite() && t.work >= 0.0) {
                return Err(DagError::BadWork {
                    index,
                    id: t.id.clone(),
                    work: t.work,
                });
            }
        }
        drop(first);
        let n = tasks.len();
        for (index, e) in edges.iter().enumerate() {
            for (field, t) in [("from", e.from), ("to", e.to)] {
                if t >= n {
                    return Err(DagError::UnknownTask {
                        index,
                        field,
                        id: format!("#{t}"),
                    });
                }
            }
        }
        let (succ_off, succ) = csr(n, edges.iter().map(|e| e.from));
        let (pred_off, pred) = csr(n, edges.iter().map(|e| e.to));
        // Duplicate (from, to) pairs: look through each task's out-edges.
        let mut last_seen: Vec<usize> = vec![usize::MAX; n];
        for u in 0..n {
            for &ei in &succ[succ_off[u]..succ_off[u + 1]] {
                let v = edges[ei].to;
                if last_seen[v] != usize::MAX && edges[last_seen[v]].from == u {
                    return Err(DagError::DuplicateEdge {
                        index: ei.max(last_seen[v]),
                        first: ei.min(last_seen[v]),
                        from: tasks[u].id.clone(),
                        to: tasks[v].id.clone(),
                    });
                }
                last_seen[v] = ei;
            }
        }
        let mut dag = Dag {
            tasks,
            edges,
            succ_off,
            succ,
            pred_off,
            pred,
            topo: Vec::new(),
        };
        dag.topo = dag.topological_order()?;
        Ok(dag)
    }

    /// Parse and validate `mutirao-dag/1` JSON text. JSON syntax errors carry line and column.
    pub fn from_json(text: &str) -> Result<Self, DagError> {
        let raw: RawDag = serde_json::from_str(text).map_err(|e| DagError::Json(e.to_string()))?;
        if raw.format != DAG_FORMAT {
            return Err(DagError::Format { found: raw.format });
        }
        let mut index: HashMap<&str, usize> = HashMap::with_capacity(raw.tasks.len());
        for (i, t) in raw.tasks.iter().enumerate() {
            if let Some(&f) = index.get(t.id.as_str()) {
                return Err(DagError::DuplicateId {
                    index: i,
                    first: f,
                    id: t.id.clone(),
                });
            }
            index.insert(&t.id, i);
        }
        let mut edges = Vec::with_capacity(raw.edges.len());
        for (i, e) in raw.edges.iter().enumerate() {
            let look = |field: &'static str, id: &str| {
                index.get(id).copied().ok_or_else(|| DagError::UnknownTask {
                    index: i,
                    field,
                    id: id.to_string(),
                })
            };
            let from = look("from", &e.from)?;
            let to = look("to", &e.to)?;
            if !(e.bytes.is_finite()
                && e.bytes >= 0.0
                && e.bytes.fract() == 0.0
                && e.bytes <= 9.0e15)
            {
                return Err(DagError::BadBytes {
                    index: i,
                    from: e.from.clone(),
                    to: e.to.clone(),
                    bytes: e.bytes,
                });
            }
            edges.push(Edge {
                from,
                to,
                bytes: e.bytes as u64,
            });
        }
        drop(index);
        Dag::new(raw.tasks, edges)
    }

    /// Pretty `mutirao-dag/1` JSON text.
    pub fn to_json(&self) -> String {
        let raw = OutDag {
            format: DAG_FORMAT,
            tasks: &self.tasks,
            edges: self
                .edges
                .iter()
                .map(|e| OutEdge {
                    from: &self.tasks[e.from].id,
                    to: &self.tasks[e.to].id,
                    bytes: e.bytes,
                })
                .collect(),
        };
        // Serializing plain strings and finite numbers cannot fail.
        serde_json::to_string_pretty(&raw).unwrap_or_default()
    }

    /// Graphviz DOT text: one node per task (labelled with id and work), one arc per edge
    /// (labelled with its bytes).
    pub fn to_dot(&self) -> String {
        let mut s = String::from("digraph dag {\n  node [shape=box];\n");
        for t in &self.tasks {
            let _ = writeln!(
                s,
                "  {} [label=\"{}\\nwork {}\"];",
                dot_quote(&t.id),
                dot_escape(&t.id),
                t.work
            );
        }
        for e in &self.edges {
            let _ = writeln!(
                s,
                "  {} -> {} [label=\"{}\"];",
                dot_quote(&self.tasks[e.from].id),
                dot_quote(&self.tasks[e.to].id),
                e.bytes
            );
        }
        s.push_str("}\n");
        s
    }

    /// The tasks, in file order (task index = position).
    pub fn tasks(&self) -> &[Task] {
        &self.tasks
    }

    /// The edges, in file order (edge index = position).
    pub fn edges(&self) -> &[Edge] {
        &self.edges
    }

    /// Number of tasks.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// True when the graph has no task.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Indices of the edges leaving task `t`, in edge order.
    pub fn out_edges(&self, t: usize) -> &[usize] {
        &self.succ[self.succ_off[t]..self.succ_off[t + 1]]
    }

    /// Indices of the edges entering task `t`, in edge order.
    pub fn in_edges(&self, t: usize) -> &[usize] {
        &self.pred[self.pred_off[t]..self.pred_off[t + 1]]
    }

    /// A topological order (Kahn's algorithm, lowest index first among ready tasks).
    pub fn topo_order(&self) -> &[usize] {
        &self.topo
    }

    /// Index of the task with id `id`, if any (linear search).
    pub fn index_of(&self, id: &str) -> Option<usize> {
        self.tasks.iter().position(|t| t.id == id)
    }

    /// A map from id to task index.
    pub fn id_index(&self) -> HashMap<&str, usize> {
        self.tasks
            .iter()
            .enumerate()
            .map(|(i, t)| (t.id.as_str(), i))
            .collect()
    }

    fn topological_order(&self) -> Result<Vec<usize>, DagError> {
        let n = self.tasks.len();
        let mut indeg: Vec<usize> = (0..n).map(|t| self.in_edges(t).len()).collect();
        let mut heap: std::collections::BinaryHeap<std::cmp::Reverse<usize>> = (0..n)
            .filter(|&t| indeg[t] == 0)
            .map(std::cmp::Reverse)
            .collect();
        let mut order = Vec::with_capacity(n);
        while let Some(std::cmp::Reverse(u)) = heap.pop() {
            order.push(u);
            for &ei in self.out_edges(u) {
                let v = self.edges[ei].to;
                indeg[v] -= 1;
                if indeg[v] == 0 {
                    heap.push(std::cmp::Reverse(v));
                }
            }
        }
        if order.len() == n {
            return Ok(order);
        }
        // A cycle exists among the tasks with indeg > 0: walk predecessors that are still
        // blocked until a task repeats.
        let start = (0..n).find(|&t| indeg[t] > 0).unwrap_or(0);
        let mut seen_at: HashMap<usize, usize> = HashMap::new();
        let mut path = Vec::new();
        let mut cur = start;
        loop {
            if let Some(&pos) = seen_at.get(&cur) {
                let mut cyc: Vec<String> = path[pos..]
                    .iter()
                    .rev()
                    .map(|&t: &usize| self.tasks[t].id.clone())
                    .collect();
                cyc.push(cyc[0].clone());
                return Err(DagError::Cycle(cyc));
            }
            seen_at.insert(cur, path.len());
            path.push(cur);
            // Every blocked task has a blocked predecessor.
            cur = self
                .in_edges(cur)
                .iter()
                .map(|&ei| self.edges[ei].from)
                .find(|&p| indeg[p] > 0)
                .unwrap_or(cur);
        }
    }
}

fn csr(n: usize, keys: impl Iterator<Item = usize> + Clone) -> (Vec<usize>, Vec<usize>) {
    let mut off = vec![0usize; n + 1];
    for k in keys.clone() {
        off[k + 1] += 1;
    }
    for i in 0..n {
        off[i + 1] += off[i];
    }
    let mut fill = off.clone();
    let mut items = vec![0usize; off[n]];
    for (ei, k) in keys.enumerate() {
        items[fill[k]] = ei;
        fill[k] += 1;
    }
    (off, items)
}

fn dot_escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

fn dot_quote(s: &str) -> String {
    format!("\"{}\"", dot_escape(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(tasks: &str, edges: &str) -> String {
        format!(r#"{{"format":"mutirao-dag/1","tasks":[{tasks}],"edges":[{edges}]}}"#)
    }

    #[test]
    fn parses_and_round_trips() {
        let text = doc(
            r#"{"id":"a","work":1.5},{"id":"b","work":2}"#,
            r#"{"from":"a","to":"b","bytes":1024}"#,
        );
        let d = Dag::from_json(&text).unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!(d.edges()[0].bytes, 1024);
        assert_eq!(d.out_edges(0), &[0]);
        assert_eq!(d.in_edges(1), &[0]);
        let back = Dag::from_json(&d.to_json()).unwrap();
        assert_eq!(back, d);
        assert!(d.to_json().contains("\"bytes\": 1024\n"), "{}", d.to_json());
    }

    #[test]
    fn cycle_is_named_with_its_ids() {
        let text = doc(
            r#"{"id":"s","work":1},{"id":"a","work":1},{"id":"b","work":1},{"id":"c","work":1}"#,
            r#"{"from":"s","to":"a","bytes":0},{"from":"a","to":"b","bytes":0},{"from":"b","to":"c","bytes":0},{"from":"c","to":"a","bytes":0}"#,
        );
        let e = Dag::from_json(&text).unwrap_err();
        match &e {
            DagError::Cycle(ids) => {
                assert_eq!(ids.len(), 4);
                assert_eq!(ids.first(), ids.last());
                let mut inner = ids[..3].to_vec();
                inner.sort();
                assert_eq!(inner, ["a", "b", "c"]);
            }
            other => panic!("expected a cycle, got {other}"),
        }
        assert!(e.to_string().contains(" -> "), "{e}");
    }

    #[test]
    fn self_loop_is_a_cycle() {
        let text = doc(
            r#"{"id":"a","work":1}"#,
            r#"{"from":"a","to":"a","bytes":0}"#,
        );
        assert_eq!(
            Dag::from_json(&text).unwrap_err(),
            DagError::Cycle(vec!["a".into(), "a".into()])
        );
    }

    #[test]
    fn bad_inputs_name_the_place() {
        let e = Dag::from_json(&doc(r#"{"id":"a","work":1},{"id":"a","work":2}"#, "")).unwrap_err();
        assert!(e.to_string().starts_with("tasks[1]: id \"a\""), "{e}");
        let e = Dag::from_json(&doc(r#"{"id":"a","work":-1}"#, "")).unwrap_err();
        assert!(
            e.to_string().starts_with("tasks[0] (id \"a\"): work is -1"),
            "{e}"
        );
        let e = Dag::from_json(&doc(
            r#"{"id":"a","work":1}"#,
            r#"{"from":"a","to":"zz","bytes":1}"#,
        ))
        .unwrap_err();
        assert!(
            e.to_string().contains("edges[0]: `to` names task \"zz\""),
            "{e}"
        );
        let e = Dag::from_json(&doc(
            r#"{"id":"a","work":1},{"id":"b","work":1}"#,
            r#"{"from":"a","to":"b","bytes":-5}"#,
        ))
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("edges[0] (\"a\" -> \"b\"): bytes is -5"),
            "{e}"
        );
        let e = Dag::from_json(&doc(
            r#"{"id":"a","work":1},{"id":"b","work":1}"#,
            r#"{"from":"a","to":"b","bytes":1},{"from":"a","to":"b","bytes":2}"#,
        ))
        .unwrap_err();
        assert!(
            e.to_string().contains("edges[1]") && e.to_string().contains("edges[0]"),
            "{e}"
        );
        let e = Dag::from_json("{\"format\":\"mutirao-dag/1\",\n\"tasks\": [ }").unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
        let e = Dag::from_json(r#"{"format":"x","tasks":[],"edges":[]}"#).unwrap_err();
        assert!(matches!(e, DagError::Format { .. }));
        let e = Dag::from_json(&doc(r#"{"id":"a","work":1e999}"#, "")).unwrap_err();
        assert!(
            matches!(e, DagError::Json(_) | DagError::BadWork { .. }),
            "{e}"
        );
    }

    #[test]
    fn dot_lists_every_task_and_edge() {
        let d = Dag::new(
            vec![
                Task {
                    id: "a\"x".into(),
                    work: 1.0,
                },
                Task {
                    id: "b".into(),
                    work: 2.0,
                },
            ],
            vec![Edge {
                from: 0,
                to: 1,
                bytes: 7,
            }],
        )
        .unwrap();
        let dot = d.to_dot();
        assert!(dot.starts_with("digraph"));
        assert!(dot.contains(r#""a\"x" -> "b" [label="7"]"#), "{dot}");
        assert!(dot.contains(r#""b" [label="b\nwork 2"]"#), "{dot}");
    }
}
