//! A running job's output on its way to the job's log, in batches: what arrives within
//! [`BATCH_WAIT`] of the first byte, or [`BATCH_BYTES`] of it, is stored in one store change
//! (one transaction, one fsync) instead of one per line, within the log's cap
//! ([`crate::api::Limits::log_cap`]). Output past the cap is dropped and counted; the count is
//! journalled when the log is finished.

use crate::api::Coordinator;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest a byte of output waits before it is stored.
pub const BATCH_WAIT: Duration = Duration::from_millis(50);
/// Output stored at once when it comes faster than [`BATCH_WAIT`].
pub const BATCH_BYTES: usize = 64 << 10;

/// What a batcher did with a job's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogTotals {
    /// Store changes made.
    pub batches: u64,
    /// Bytes stored.
    pub stored: u64,
    /// Bytes dropped past the log's cap.
    pub dropped: u64,
}

/// One job's (or task's) output, batched into its log by a thread of its own (or, if no
/// thread can be started, stored as it comes).
pub struct JobLog {
    c: Arc<Coordinator>,
    id: i64,
    tx: Option<Sender<Vec<u8>>>,
    th: Option<std::thread::JoinHandle<LogTotals>>,
    direct: LogTotals,
}

impl JobLog {
    /// Start batching output into job `id`'s log.
    pub fn start(c: Arc<Coordinator>, id: i64) -> JobLog {
        let (tx, rx) = mpsc::channel();
        let c2 = c.clone();
        let th = std::thread::Builder::new()
            .name(format!("log-{id}"))
            .spawn(move || batch(&c2, id, &rx));
        match th {
            Ok(th) => JobLog {
                c,
                id,
                tx: Some(tx),
                th: Some(th),
                direct: LogTotals::default(),
            },
            Err(e) => {
                eprintln!("mutirao coordinator: job {id}: no thread to batch its output ({e}); storing it as it comes");
                JobLog {
                    c,
                    id,
                    tx: None,
                    th: None,
                    direct: LogTotals::default(),
                }
            }
        }
    }

    /// Output to append (stored within [`BATCH_WAIT`]).
    pub fn push(&mut self, mut data: Vec<u8>) {
        if data.is_empty() {
            return;
        }
        if let Some(tx) = &self.tx {
            if let Err(mpsc::SendError(back)) = tx.send(data) {
                data = back;
            } else {
                return;
            }
        }
        store(&self.c, self.id, &mut data, &mut self.direct);
    }

    /// Store everything pushed so far, journal what the cap dropped, and stop; returns the
    /// totals. Call it before the job's end is journalled: a log follower that sees a final
    /// state then reads the whole log.
    pub fn finish(mut self) -> LogTotals {
        self.tx = None;
        let mut t = self
            .th
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default();
        t.batches += self.direct.batches;
        t.stored += self.direct.stored;
        t.dropped += self.direct.dropped;
        if t.dropped > 0 {
            let _ = self.c.store().note(
                self.id,
                "log-cap",
                &format!(
                    "{} bytes of output were dropped past the log's cap of {} bytes",
                    t.dropped,
                    self.c.limits().log_cap
                ),
            );
        }
        t
    }
}

fn store(c: &Coordinator, id: i64, buf: &mut Vec<u8>, t: &mut LogTotals) {
    if buf.is_empty() {
        return;
    }
    match c.append_log(id, buf) {
        Ok(a) => {
            t.batches += 1;
            t.stored += a.stored;
            t.dropped += a.dropped;
        }
        Err(e) => eprintln!("mutirao coordinator: job {id}: cannot store output: {e}"),
    }
    buf.clear();
}

fn batch(c: &Coordinator, id: i64, rx: &Receiver<Vec<u8>>) -> LogTotals {
    let mut t = LogTotals::default();
    let mut buf: Vec<u8> = Vec::new();
    let mut deadline: Option<Instant> = None;
    loop {
        let msg = match deadline {
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(d) => rx.recv_timeout(d.saturating_duration_since(Instant::now())),
        };
        match msg {
            Ok(b) => {
                buf.extend_from_slice(&b);
                deadline.get_or_insert_with(|| Instant::now() + BATCH_WAIT);
                if buf.len() < BATCH_BYTES {
                    continue;
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        store(c, id, &mut buf, &mut t);
        deadline = None;
    }
    store(c, id, &mut buf, &mut t);
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Limits;
    use crate::{NewJob, SqliteStore, Store};

    fn coordinator(tag: &str, log_cap: u64) -> (Arc<Coordinator>, i64, std::path::PathBuf) {
        let dir =
            std::env::temp_dir().join(format!("mutirao-logbatch-{}-{tag}", std::process::id()));
        let store = Arc::new(SqliteStore::open_in_memory().unwrap());
        let id = store
            .create_job(&NewJob {
                owner: "ana".into(),
                ranks: 1,
                program: "prog".into(),
                args: Vec::new(),
                require: None,
                checkpoint_interval_s: None,
                dag: false,
                env: Default::default(),
            })
            .unwrap()
            .id;
        let c = Coordinator::with_limits(
            store,
            crate::auth::Tokens::new(),
            crate::Repo::open(&dir, 10).unwrap(),
            Duration::from_secs(5),
            Limits {
                log_cap,
                ..Limits::default()
            },
        );
        (c, id, dir)
    }

    #[test]
    fn output_arriving_together_is_stored_in_few_changes_in_order() {
        let (c, id, dir) = coordinator("batches", 64 << 20);
        let mut log = JobLog::start(c.clone(), id);
        let want: String = (0..5000).map(|i| format!("[0] line {i}\n")).collect();
        for i in 0..5000 {
            log.push(format!("[0] line {i}\n").into_bytes());
        }
        let t = log.finish();
        assert_eq!(t.stored, want.len() as u64);
        assert_eq!(t.dropped, 0);
        // 5000 lines, about 66 KB: one change per 64 KiB or 50 ms, not one per line.
        assert!(t.batches <= 5, "{t:?}");
        let got = c.store().read_log(id, 0, 1 << 20).unwrap().data;
        assert!(got == want.as_bytes(), "{} bytes", got.len());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_log_past_its_cap_gets_one_notice_and_the_journal_counts_the_dropped_bytes() {
        let (c, id, dir) = coordinator("cap", 100);
        let mut log = JobLog::start(c.clone(), id);
        for i in 0..30 {
            log.push(format!("line {i:04}\n").into_bytes()); // 10 bytes each
            if i == 5 {
                // Crosses a batch boundary too.
                std::thread::sleep(BATCH_WAIT * 2);
            }
        }
        let t = log.finish();
        assert_eq!((t.stored, t.dropped), (100, 200), "{t:?}");
        let got = String::from_utf8(c.store().read_log(id, 0, 1 << 20).unwrap().data).unwrap();
        let kept: String = (0..10).map(|i| format!("line {i:04}\n")).collect();
        assert_eq!(got, format!("{kept}{}", crate::cap_notice(100)));
        assert_eq!(got.matches("reached its cap").count(), 1);
        let notes: Vec<String> = c
            .store()
            .events(id)
            .unwrap()
            .into_iter()
            .filter(|e| e.kind == "log-cap")
            .map(|e| e.detail)
            .collect();
        assert_eq!(
            notes,
            ["200 bytes of output were dropped past the log's cap of 100 bytes"]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn output_trickling_in_is_stored_within_the_batch_wait() {
        let (c, id, dir) = coordinator("trickle", 64 << 20);
        let mut log = JobLog::start(c.clone(), id);
        log.push(b"first\n".to_vec());
        let t0 = Instant::now();
        while c.store().read_log(id, 0, 100).unwrap().length == 0 {
            assert!(
                t0.elapsed() < Duration::from_secs(2),
                "not stored after 2 s"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(t0.elapsed() < BATCH_WAIT * 10, "{:?}", t0.elapsed());
        log.finish();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
