//! Block-cyclic dynamic distribution with an exactly-once ledger (seed 003 §2.10, §9.1.6, §9.2).
//!
//! A cursor runs over the task index space `0..total`; each hand-out is the next `n`
//! consecutive tasks (a block), dealt to the workers in turn with sizes that vary per worker
//! and round. The ledger remembers every block still out: a worker that dies or disconnects
//! has its blocks re-queued (handed out again before new tasks), a block may be replicated to
//! a second worker (JoiN: the slowest outstanding block), and the first result of a block wins —
//! later ones are reported as duplicates and not counted. [`Ledger::audit`] proves that every
//! task was completed exactly once.
//!
//! ```
//! use mutirao_mw::ledger::{Completion, Ledger};
//! let mut l = Ledger::new(25);
//! let a = l.assign(1, 10, 0.0).unwrap();          // tasks 0..10 to worker 1
//! let b = l.assign(2, 10, 0.0).unwrap();          // 10..20 to worker 2
//! assert_eq!(l.fail(1), 10);                      // worker 1 died: 0..10 back in the queue
//! let c = l.assign(2, 100, 1.0).unwrap();         // re-queued tasks first
//! assert_eq!((c.start, c.len), (0, 10));
//! assert!(matches!(l.complete(b.id, 2).unwrap(), Completion::First { .. }));
//! assert!(l.complete(a.id, 1).is_err());          // a dead worker's block is no longer its
//! l.complete(c.id, 2).unwrap();
//! let d = l.assign(2, 100, 2.0).unwrap();
//! assert_eq!((d.start, d.len), (20, 5));
//! l.complete(d.id, 2).unwrap();
//! assert!(l.is_finished() && l.audit().is_ok());
//! ```

use crate::{Error, Result, WorkerId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// A hand-out: tasks `start .. start + len` to `worker`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Block {
    /// The block's id (a replica has the id of the block it copies).
    pub id: u64,
    /// First task index.
    pub start: u64,
    /// Number of tasks.
    pub len: u64,
    /// Who got it.
    pub worker: WorkerId,
}

/// What a result did to the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// The first result for these tasks: count them.
    First {
        /// First task index.
        start: u64,
        /// Number of tasks.
        len: u64,
    },
    /// Another holder of the same (replicated) block finished first: ignore this result.
    Duplicate,
}

#[derive(Debug, Clone)]
struct Out {
    start: u64,
    len: u64,
    holders: Vec<WorkerId>,
    issued_at: f64,
}

/// Every task handed out and completed exactly once.
#[derive(Debug, Clone)]
pub struct Ledger {
    total: u64,
    cursor: u64,
    next_id: u64,
    requeue: VecDeque<(u64, u64)>,
    out: BTreeMap<u64, Out>,
    /// Ids of blocks completed (so a late replica's result is a duplicate, not an error).
    finished: BTreeMap<u64, (u64, u64)>,
    completed: Vec<(u64, u64)>,
    done: u64,
}

impl Ledger {
    /// A ledger over tasks `0..total`.
    pub fn new(total: u64) -> Ledger {
        Ledger {
            total,
            cursor: 0,
            next_id: 0,
            requeue: VecDeque::new(),
            out: BTreeMap::new(),
            finished: BTreeMap::new(),
            completed: Vec::new(),
            done: 0,
        }
    }

    /// Tasks in all.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Tasks completed (first results only).
    pub fn done(&self) -> u64 {
        self.done
    }

    /// Tasks not handed out yet (new or re-queued).
    pub fn unassigned(&self) -> u64 {
        (self.total - self.cursor) + self.requeue.iter().map(|r| r.1).sum::<u64>()
    }

    /// Blocks out, with their holders.
    pub fn outstanding(&self) -> usize {
        self.out.len()
    }

    /// Every task completed.
    pub fn is_finished(&self) -> bool {
        self.done == self.total
    }

    /// Hand `worker` up to `n` tasks at time `now` (s): re-queued tasks first, then the next
    /// ones of the cursor. `None` when nothing is left to hand out (or `n` is 0).
    pub fn assign(&mut self, worker: WorkerId, n: u64, now: f64) -> Option<Block> {
        if n == 0 {
            return None;
        }
        let (start, len) = if let Some((s, l)) = self.requeue.pop_front() {
            if l > n {
                self.requeue.push_front((s + n, l - n));
                (s, n)
            } else {
                (s, l)
            }
        } else if self.cursor < self.total {
            let len = n.min(self.total - self.cursor);
            let s = self.cursor;
            self.cursor += len;
            (s, len)
        } else {
            return None;
        };
        let id = self.next_id;
        self.next_id += 1;
        self.out.insert(
            id,
            Out {
                start,
                len,
                holders: vec![worker],
                issued_at: now,
            },
        );
        Some(Block {
            id,
            start,
            len,
            worker,
        })
    }

    /// Give a copy of outstanding block `id` to `worker` as well (the first result wins).
    pub fn replicate(&mut self, id: u64, worker: WorkerId) -> Result<Block> {
        let o = self
            .out
            .get_mut(&id)
            .ok_or_else(|| Error::Ledger(format!("block {id} is not outstanding")))?;
        if o.holders.contains(&worker) {
            return Err(Error::Ledger(format!(
                "worker {worker} already holds block {id}"
            )));
        }
        o.holders.push(worker);
        Ok(Block {
            id,
            start: o.start,
            len: o.len,
            worker,
        })
    }

    /// The outstanding block handed out earliest that `worker` does not hold and that has a
    /// single holder (JoiN's candidate for replication).
    pub fn oldest_outstanding(&self, worker: WorkerId) -> Option<u64> {
        self.out
            .iter()
            .filter(|(_, o)| o.holders.len() == 1 && !o.holders.contains(&worker))
            .min_by(|a, b| a.1.issued_at.total_cmp(&b.1.issued_at).then(a.0.cmp(b.0)))
            .map(|(id, _)| *id)
    }

    /// The largest outstanding block held by someone other than `worker` (work stealing's
    /// victim), as (id, holder, len).
    pub fn largest_outstanding(&self, worker: WorkerId) -> Option<(u64, WorkerId, u64)> {
        self.out
            .iter()
            .filter(|(_, o)| o.holders.len() == 1 && o.holders[0] != worker)
            .max_by(|a, b| a.1.len.cmp(&b.1.len).then(b.0.cmp(a.0)))
            .map(|(id, o)| (*id, o.holders[0], o.len))
    }

    /// Take back the last `n` tasks of outstanding block `id` (not yet started by its holder:
    /// the caller's protocol must guarantee that) and re-queue them; the block shrinks.
    pub fn split_off(&mut self, id: u64, n: u64) -> Result<()> {
        let o = self
            .out
            .get_mut(&id)
            .ok_or_else(|| Error::Ledger(format!("block {id} is not outstanding")))?;
        if n == 0 || n >= o.len {
            return Err(Error::Ledger(format!(
                "cannot take {n} of block {id}'s {} tasks",
                o.len
            )));
        }
        o.len -= n;
        self.requeue.push_front((o.start + o.len, n));
        Ok(())
    }

    /// `worker` finished block `id`.
    pub fn complete(&mut self, id: u64, worker: WorkerId) -> Result<Completion> {
        if let Some(o) = self.out.get(&id) {
            if !o.holders.contains(&worker) {
                return Err(Error::Ledger(format!(
                    "worker {worker} does not hold block {id} (its holders: {:?})",
                    o.holders
                )));
            }
            let o = self.out.remove(&id).expect("checked above");
            self.completed.push((o.start, o.len));
            self.done += o.len;
            self.finished.insert(id, (o.start, o.len));
            return Ok(Completion::First {
                start: o.start,
                len: o.len,
            });
        }
        if self.finished.contains_key(&id) {
            return Ok(Completion::Duplicate);
        }
        Err(Error::Ledger(format!(
            "block {id} was never handed out, or was taken back from worker {worker}"
        )))
    }

    /// `worker` is gone: it no longer holds anything; blocks it held alone go back to the
    /// queue. Returns the number of tasks re-queued.
    pub fn fail(&mut self, worker: WorkerId) -> u64 {
        let mut back = 0;
        let ids: Vec<u64> = self
            .out
            .iter()
            .filter(|(_, o)| o.holders.contains(&worker))
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            let o = self.out.get_mut(&id).expect("listed above");
            o.holders.retain(|&h| h != worker);
            if o.holders.is_empty() {
                let o = self.out.remove(&id).expect("listed above");
                self.requeue.push_back((o.start, o.len));
                back += o.len;
            }
        }
        back
    }

    /// Check that every task was completed exactly once (an error names the first task that
    /// was not, and how many times it was).
    pub fn audit(&self) -> Result<()> {
        exactly_once(self.completed.clone(), self.total).map_err(Error::Ledger)
    }
}

/// Blocks `(start, len)` cover `0..total` exactly once; otherwise a message naming the first
/// task completed 0 or 2+ times, or a block past `total`.
pub(crate) fn exactly_once(
    mut blocks: Vec<(u64, u64)>,
    total: u64,
) -> std::result::Result<(), String> {
    blocks.sort_unstable();
    let mut next = 0u64;
    for &(s, l) in &blocks {
        if s > next {
            return Err(format!(
                "task {next} was completed 0 times (want exactly once)"
            ));
        }
        if s < next {
            return Err(format!(
                "task {s} was completed 2 times (want exactly once)"
            ));
        }
        next = s + l;
    }
    if next < total {
        return Err(format!(
            "task {next} was completed 0 times (want exactly once)"
        ));
    }
    if next > total {
        return Err(format!(
            "a block ends at task {next}, past the job's {total} tasks"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_first_result_wins_and_the_second_is_a_duplicate() {
        let mut l = Ledger::new(10);
        let a = l.assign(1, 10, 0.0).unwrap();
        assert_eq!(l.oldest_outstanding(2), Some(a.id));
        let r = l.replicate(a.id, 2).unwrap();
        assert_eq!((r.start, r.len), (0, 10));
        assert!(l.replicate(a.id, 2).is_err());
        assert!(matches!(
            l.complete(a.id, 2).unwrap(),
            Completion::First { .. }
        ));
        assert_eq!(l.complete(a.id, 1).unwrap(), Completion::Duplicate);
        l.audit().unwrap();
    }

    #[test]
    fn a_failed_worker_with_a_replica_elsewhere_loses_nothing() {
        let mut l = Ledger::new(4);
        let a = l.assign(1, 4, 0.0).unwrap();
        l.replicate(a.id, 2).unwrap();
        assert_eq!(l.fail(1), 0); // worker 2 still holds it
        l.complete(a.id, 2).unwrap();
        l.audit().unwrap();
    }

    #[test]
    fn split_off_requeues_the_tail_of_a_block() {
        let mut l = Ledger::new(10);
        let a = l.assign(1, 10, 0.0).unwrap();
        l.split_off(a.id, 4).unwrap();
        let b = l.assign(2, 10, 0.0).unwrap();
        assert_eq!((b.start, b.len), (6, 4));
        assert!(matches!(
            l.complete(a.id, 1).unwrap(),
            Completion::First { start: 0, len: 6 }
        ));
        l.complete(b.id, 2).unwrap();
        l.audit().unwrap();
        assert!(l.split_off(a.id, 1).is_err());
    }

    #[test]
    fn audit_catches_missing_tasks() {
        let mut l = Ledger::new(3);
        let a = l.assign(1, 2, 0.0).unwrap();
        l.complete(a.id, 1).unwrap();
        assert!(l
            .audit()
            .unwrap_err()
            .to_string()
            .contains("task 2 was completed 0 times"));
    }
}
