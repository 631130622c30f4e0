//! Import of WfCommons workflow instances (WfFormat 1.5/1.6 JSON, as the `wfcommons` Python
//! package generates) into a [`Dag`].
//!
//! Mapping:
//! * one task per `workflow.specification.tasks[]` entry, in file order, with its `id`;
//! * `work` = the task's `runtimeInSeconds` in `workflow.execution.tasks[]` (the trace machine is
//!   taken as the speed-1.0 reference); a task with no execution entry gets work 0;
//! * one edge per parent → child dependency (the union of every task's `parents` and
//!   `children`, each pair once);
//! * `bytes` of an edge = the sum of `sizeInBytes` of the files that are both among the parent's
//!   `outputFiles` and the child's `inputFiles` (0 when they share none: a control dependency).
//!   Workflow input files (produced by no task) are not messages and are ignored.

use crate::dag::{Dag, DagError, Edge, Task};
use serde::Deserialize;
use std::collections::{HashMap, HashSet};

/// What is wrong with a WfCommons instance.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WfError {
    /// Not JSON of the WfFormat shape.
    #[error("not a WfCommons (WfFormat 1.5/1.6) instance: {0}")]
    Json(String),
    /// A reference to an undeclared task or file.
    #[error("workflow.specification.tasks[{index}] (id {id:?}): {field} names {what} {name:?}, which is not declared")]
    Unknown {
        /// Task index.
        index: usize,
        /// Task id.
        id: String,
        /// The field (`parents`, `children`, `inputFiles`, `outputFiles`).
        field: &'static str,
        /// `task` or `file`.
        what: &'static str,
        /// The undeclared name.
        name: String,
    },
    /// A runtime or file size is negative or not finite.
    #[error("{place}: {value} must be a finite number >= 0")]
    BadNumber {
        /// Where.
        place: String,
        /// The value.
        value: f64,
    },
    /// The resulting graph is invalid (duplicate ids, cycle).
    #[error(transparent)]
    Dag(#[from] DagError),
}

#[derive(Deserialize)]
struct Instance {
    workflow: Workflow,
}

#[derive(Deserialize)]
struct Workflow {
    specification: Spec,
    #[serde(default)]
    execution: Option<Execution>,
}

#[derive(Deserialize)]
struct Spec {
    tasks: Vec<SpecTask>,
    #[serde(default)]
    files: Vec<File>,
}

#[derive(Deserialize)]
struct SpecTask {
    id: String,
    #[serde(default)]
    parents: Vec<String>,
    #[serde(default)]
    children: Vec<String>,
    #[serde(default, rename = "inputFiles")]
    input_files: Vec<String>,
    #[serde(default, rename = "outputFiles")]
    output_files: Vec<String>,
}

#[derive(Deserialize)]
struct File {
    id: String,
    #[serde(rename = "sizeInBytes")]
    size_in_bytes: f64,
}

#[derive(Deserialize)]
struct Execution {
    tasks: Vec<ExecTask>,
}

#[derive(Deserialize)]
struct ExecTask {
    id: String,
    #[serde(rename = "runtimeInSeconds")]
    runtime_in_seconds: f64,
}

/// Convert a WfCommons instance (JSON text) into a task graph; see the module docs.
pub fn from_wfcommons(text: &str) -> Result<Dag, WfError> {
    let inst: Instance = serde_json::from_str(text).map_err(|e| WfError::Json(e.to_string()))?;
    let spec = inst.workflow.specification;
    let mut size: HashMap<&str, u64> = HashMap::new();
    for (i, f) in spec.files.iter().enumerate() {
        if !(f.size_in_bytes.is_finite() && f.size_in_bytes >= 0.0) {
            return Err(WfError::BadNumber {
                place: format!(
                    "workflow.specification.files[{i}] (id {:?}) sizeInBytes",
                    f.id
                ),
                value: f.size_in_bytes,
            });
        }
        size.insert(&f.id, f.size_in_bytes.round() as u64);
    }
    let mut runtime: HashMap<&str, f64> = HashMap::new();
    if let Some(exec) = &inst.workflow.execution {
        for (i, t) in exec.tasks.iter().enumerate() {
            if !(t.runtime_in_seconds.is_finite() && t.runtime_in_seconds >= 0.0) {
                return Err(WfError::BadNumber {
                    place: format!(
                        "workflow.execution.tasks[{i}] (id {:?}) runtimeInSeconds",
                        t.id
                    ),
                    value: t.runtime_in_seconds,
                });
            }
            runtime.insert(&t.id, t.runtime_in_seconds);
        }
    }
    let index: HashMap<&str, usize> = spec
        .tasks
        .iter()
        .enumerate()
        .map(|(i, t)| (t.id.as_str(), i))
        .collect();
    for (i, t) in spec.tasks.iter().enumerate() {
        for (field, list) in [
            ("inputFiles", &t.input_files),
            ("outputFiles", &t.output_files),
        ] {
            if let Some(f) = list.iter().find(|f| !size.contains_key(f.as_str())) {
                return Err(WfError::Unknown {
                    index: i,
                    id: t.id.clone(),
                    field,
                    what: "file",
                    name: f.clone(),
                });
            }
        }
    }
    let mut pairs: Vec<(usize, usize)> = Vec::new();
    let mut seen: HashSet<(usize, usize)> = HashSet::new();
    for (i, t) in spec.tasks.iter().enumerate() {
        for (field, list, is_parent) in [
            ("parents", &t.parents, true),
            ("children", &t.children, false),
        ] {
            for other in list {
                let j = *index.get(other.as_str()).ok_or_else(|| WfError::Unknown {
                    index: i,
                    id: t.id.clone(),
                    field,
                    what: "task",
                    name: other.clone(),
                })?;
                let p = if is_parent { (j, i) } else { (i, j) };
                if seen.insert(p) {
                    pairs.push(p);
                }
            }
        }
    }
    let edges = pairs
        .into_iter()
        .map(|(from, to)| {
            let outs: HashSet<&str> = spec.tasks[from]
                .output_files
                .iter()
                .map(String::as_str)
                .collect();
            let bytes = spec.tasks[to]
                .input_files
                .iter()
                .filter(|f| outs.contains(f.as_str()))
                .map(|f| size.get(f.as_str()).copied().unwrap_or(0))
                .sum();
            Edge { from, to, bytes }
        })
        .collect();
    let tasks = spec
        .tasks
        .iter()
        .map(|t| Task {
            id: t.id.clone(),
            work: runtime.get(t.id.as_str()).copied().unwrap_or(0.0),
        })
        .collect();
    Ok(Dag::new(tasks, edges)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"{
      "name": "w", "schemaVersion": "1.5",
      "workflow": {
        "specification": {
          "tasks": [
            {"name": "split", "id": "A", "parents": [], "children": ["B", "C"],
             "inputFiles": ["in"], "outputFiles": ["x", "y"]},
            {"name": "work", "id": "B", "parents": ["A"], "children": ["D"],
             "inputFiles": ["x", "in"], "outputFiles": ["bx"]},
            {"name": "work", "id": "C", "parents": ["A"], "children": ["D"],
             "inputFiles": ["x", "y"], "outputFiles": ["cx"]},
            {"name": "merge", "id": "D", "parents": ["B", "C"], "children": [],
             "inputFiles": ["bx"], "outputFiles": []}
          ],
          "files": [{"id": "in", "sizeInBytes": 1000}, {"id": "x", "sizeInBytes": 10},
                    {"id": "y", "sizeInBytes": 20}, {"id": "bx", "sizeInBytes": 5},
                    {"id": "cx", "sizeInBytes": 7}]
        },
        "execution": {"makespanInSeconds": 9, "executedAt": "2020-01-01T00:00:00Z",
          "tasks": [{"id": "A", "runtimeInSeconds": 1.5}, {"id": "B", "runtimeInSeconds": 2},
                    {"id": "C", "runtimeInSeconds": 3}]}
      }
    }"#;

    #[test]
    fn maps_runtimes_dependencies_and_shared_files() {
        let d = from_wfcommons(EXAMPLE).unwrap();
        let work: Vec<f64> = d.tasks().iter().map(|t| t.work).collect();
        assert_eq!(work, [1.5, 2.0, 3.0, 0.0]);
        let ids = |e: &Edge| {
            (
                d.tasks()[e.from].id.as_str(),
                d.tasks()[e.to].id.as_str(),
                e.bytes,
            )
        };
        let mut edges: Vec<_> = d.edges().iter().map(ids).collect();
        edges.sort();
        // A->B shares x (the workflow input `in` is not a message); A->C shares x and y;
        // C->D shares nothing (control dependency).
        assert_eq!(
            edges,
            [("A", "B", 10), ("A", "C", 30), ("B", "D", 5), ("C", "D", 0)]
        );
    }

    #[test]
    fn undeclared_references_are_named() {
        let bad = EXAMPLE.replace(r#""parents": ["B", "C"]"#, r#""parents": ["B", "Z"]"#);
        let e = from_wfcommons(&bad).unwrap_err();
        assert!(
            e.to_string()
                .contains("tasks[3] (id \"D\"): parents names task \"Z\""),
            "{e}"
        );
        let bad = EXAMPLE.replace(r#""inputFiles": ["bx"]"#, r#""inputFiles": ["nope"]"#);
        let e = from_wfcommons(&bad).unwrap_err();
        assert!(
            e.to_string().contains("inputFiles names file \"nope\""),
            "{e}"
        );
        let bad = EXAMPLE.replace(r#""runtimeInSeconds": 2"#, r#""runtimeInSeconds": -2"#);
        assert!(matches!(
            from_wfcommons(&bad),
            Err(WfError::BadNumber { .. })
        ));
        let cyc = EXAMPLE.replace(r#""children": []"#, r#""children": ["A"]"#);
        assert!(matches!(
            from_wfcommons(&cyc),
            Err(WfError::Dag(DagError::Cycle(_)))
        ));
        assert!(matches!(from_wfcommons("{}"), Err(WfError::Json(_))));
    }
}
