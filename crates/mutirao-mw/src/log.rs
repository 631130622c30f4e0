//! The repository log: one JSON object per line, appended per iteration and worker (seed 003
//! §9.1.2), plus membership events (a worker joined with its spawn latency, a worker left).
//! The measurement algorithm ([`crate::measure`]) and the exactly-once audit read it back.
//!
//! ```
//! use mutirao_mw::log::{parse, Record};
//! let r = Record::Block { iteration: 1, worker: 2, q: 10, fator_het: 1.0, rule: "characterization".into(),
//!     start: 0, len: 10, t_comp_s: 0.5, t_comm_s: 0.01, thr_low_s: None, thr_up_s: None,
//!     duplicate: false };
//! let line = r.to_line();
//! assert_eq!(parse(&line).unwrap(), vec![r]);
//! ```

use crate::{Error, Result, WorkerId};
use serde::{Deserialize, Serialize};

/// One line of the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub enum Record {
    /// A block came back: what the balancer gave the worker and what it measured.
    Block {
        /// Iteration (1 = characterization; 0 for pull policies).
        iteration: u64,
        /// The worker.
        worker: WorkerId,
        /// Tasks planned for it.
        q: u64,
        /// Its heterogeneity factor (Eq. 2).
        fator_het: f64,
        /// The rule applied (`characterization`, `increase`, `decrease`, `keep`, …).
        rule: String,
        /// First task of the block.
        start: u64,
        /// Tasks in the block.
        len: u64,
        /// Compute time, s.
        t_comp_s: f64,
        /// Communication time, s.
        t_comm_s: f64,
        /// Lower threshold of the iteration, s.
        thr_low_s: Option<f64>,
        /// Upper threshold of the iteration, s.
        thr_up_s: Option<f64>,
        /// The block's tasks had already been completed by another holder (a replica, JoiN):
        /// its result was discarded. Absent in logs written before this field: `false`.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        duplicate: bool,
    },
    /// A worker joined the job.
    Join {
        /// The worker.
        worker: WorkerId,
        /// Its host.
        host: String,
        /// From the spawn request to its first message, s.
        spawn_latency_s: f64,
    },
    /// A worker left (died, disconnected or was released); its outstanding tasks went back.
    Leave {
        /// The worker.
        worker: WorkerId,
        /// Why.
        reason: String,
        /// Tasks re-queued.
        requeued: u64,
    },
}

impl Record {
    /// The record as one line of JSON (no trailing newline).
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).expect("a record always serializes")
    }
}

/// Parse a log; an error names the line that is not a record.
pub fn parse(text: &str) -> Result<Vec<Record>> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| Error::Invalid(format!("log line {}: {e}", i + 1)))
        })
        .collect()
}

/// The exactly-once audit of a log (seed 003 §9.3 check 2): the blocks whose results were
/// counted (not `duplicate`) cover tasks `0..total` exactly once. Returns the number of counted
/// blocks; an error names the first task completed 0 or 2+ times, or a block past `total`.
pub fn audit(records: &[Record], total: u64) -> Result<usize> {
    let blocks: Vec<(u64, u64)> = records
        .iter()
        .filter_map(|r| match r {
            Record::Block {
                start,
                len,
                duplicate: false,
                ..
            } if *len > 0 => Some((*start, *len)),
            _ => None,
        })
        .collect();
    let n = blocks.len();
    crate::ledger::exactly_once(blocks, total)
        .map(|()| n)
        .map_err(|e| Error::Invalid(format!("log audit: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(start: u64, len: u64, duplicate: bool) -> Record {
        Record::Block {
            iteration: 0,
            worker: 1,
            q: len,
            fator_het: 1.0,
            rule: "pull".into(),
            start,
            len,
            t_comp_s: 0.1,
            t_comm_s: 0.0,
            thr_low_s: None,
            thr_up_s: None,
            duplicate,
        }
    }

    #[test]
    fn the_audit_counts_each_task_once_and_skips_discarded_replicas() {
        let leave = Record::Leave {
            worker: 2,
            reason: "gone".into(),
            requeued: 5,
        };
        let ok = vec![
            block(5, 5, false),
            leave,
            block(0, 5, false),
            block(5, 5, true),
        ];
        assert_eq!(audit(&ok, 10).unwrap(), 2);
        // A replica counted twice, a missing block, a block past the end: each named.
        let twice = [block(0, 5, false), block(5, 5, false), block(5, 5, false)];
        assert!(audit(&twice, 10)
            .unwrap_err()
            .to_string()
            .contains("task 5 was completed 2 times"));
        let hole = [block(0, 5, false), block(7, 3, false)];
        assert!(audit(&hole, 10)
            .unwrap_err()
            .to_string()
            .contains("task 5 was completed 0 times"));
        let short = [block(0, 5, false)];
        assert!(audit(&short, 10)
            .unwrap_err()
            .to_string()
            .contains("task 5 was completed 0 times"));
        let long = [block(0, 12, false)];
        assert!(audit(&long, 10)
            .unwrap_err()
            .to_string()
            .contains("past the job's 10 tasks"));
    }

    #[test]
    fn a_block_without_the_duplicate_field_reads_as_counted() {
        let line = r#"{"event":"block","iteration":1,"worker":2,"q":10,"fator_het":1.0,"rule":"keep","start":0,"len":10,"t_comp_s":0.5,"t_comm_s":0.01,"thr_low_s":null,"thr_up_s":null}"#;
        assert_eq!(parse(line).unwrap(), vec![block_at(1, 2)]);
        assert!(!line.contains("duplicate") && !block_at(1, 2).to_line().contains("duplicate"));
    }

    fn block_at(iteration: u64, worker: WorkerId) -> Record {
        Record::Block {
            iteration,
            worker,
            q: 10,
            fator_het: 1.0,
            rule: "keep".into(),
            start: 0,
            len: 10,
            t_comp_s: 0.5,
            t_comm_s: 0.01,
            thr_low_s: None,
            thr_up_s: None,
            duplicate: false,
        }
    }

    #[test]
    fn a_torn_line_is_named() {
        let ok = Record::Leave {
            worker: 1,
            reason: "gone".into(),
            requeued: 3,
        }
        .to_line();
        let e = parse(&format!("{ok}\n{{\"event\":\"block\",\"iter")).unwrap_err();
        assert!(e.to_string().contains("log line 2"), "{e}");
    }
}
