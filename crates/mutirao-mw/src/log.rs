//! The repository log: one JSON object per line, appended per iteration and worker (seed 003
//! §9.1.2), plus membership events (a worker joined with its spawn latency, a worker left).
//! The measurement algorithm ([`crate::measure`]) and the exactly-once audit read it back.
//!
//! ```
//! use mutirao_mw::log::{parse, Record};
//! let r = Record::Block { iteration: 1, worker: 2, q: 10, fator_het: 1.0, rule: "characterization".into(),
//!     start: 0, len: 10, t_comp_s: 0.5, t_comm_s: 0.01, thr_low_s: None, thr_up_s: None };
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

#[cfg(test)]
mod tests {
    use super::*;

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
