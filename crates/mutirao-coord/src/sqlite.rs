//! [`Store`] on SQLite: one file, WAL, `synchronous=FULL` (a commit is on disk when it
//! returns), every method one transaction, the schema versioned by `PRAGMA user_version` and
//! migrated forward on open.

use crate::model::{Event, Host, HostReport, Job, JobState, LogChunk, NewJob};
use crate::{Appended, BlobAdd, Error, Result, Store};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use std::path::Path;
use std::sync::Mutex;

/// Schema migrations, in order; `user_version` is how many have been applied.
const MIGRATIONS: &[&str] = &[
    // 1: jobs, their journal, hosts.
    "CREATE TABLE jobs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        owner TEXT NOT NULL,
        spec TEXT NOT NULL,
        state TEXT NOT NULL,
        created_ms INTEGER NOT NULL,
        updated_ms INTEGER NOT NULL
     );
     CREATE TABLE events (
        job INTEGER NOT NULL REFERENCES jobs(id),
        seq INTEGER NOT NULL,
        at_ms INTEGER NOT NULL,
        kind TEXT NOT NULL,
        to_state TEXT,
        detail TEXT NOT NULL,
        PRIMARY KEY (job, seq)
     );
     CREATE TABLE hosts (
        name TEXT PRIMARY KEY,
        report TEXT NOT NULL,
        last_seen_ms INTEGER NOT NULL
     );",
    // 2: a user's jobs are listed often.
    "CREATE INDEX jobs_owner ON jobs(owner, id);",
    // 3: each job's output, in chunks at their byte offsets.
    "CREATE TABLE logs (
        job INTEGER NOT NULL REFERENCES jobs(id),
        start INTEGER NOT NULL,
        data BLOB NOT NULL,
        PRIMARY KEY (job, start)
     );",
    // 4: the dispatcher scans jobs by state.
    "CREATE INDEX jobs_state ON jobs(state, id);",
    // 5: who has which content in the repository (their uploads, their jobs' kept outputs),
    // for quotas and downloads. Programs of the jobs already stored are their owners', of
    // unknown size (not counted).
    "CREATE TABLE blobs (
        owner TEXT NOT NULL,
        digest TEXT NOT NULL,
        size INTEGER NOT NULL,
        at_ms INTEGER NOT NULL,
        PRIMARY KEY (owner, digest)
     );
     INSERT OR IGNORE INTO blobs (owner, digest, size, at_ms)
        SELECT owner, json_extract(spec, '$.program'), 0, created_ms FROM jobs
        WHERE json_extract(spec, '$.program') LIKE 'sha256:%';",
];

/// The SQLite store.
pub struct SqliteStore {
    conn: Mutex<Connection>,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl SqliteStore {
    /// Open (or create) the database at `path` and migrate it to this version's schema.
    pub fn open(path: &Path) -> Result<SqliteStore> {
        // Users' jobs, environments and logs: readable by this user only (SQLite gives its WAL
        // and shared-memory files the database's mode).
        {
            use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(path)
                .and_then(|_| {
                    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                })
                .map_err(|e| Error::Db(format!("cannot open {}: {e}", path.display())))?;
        }
        let conn = Connection::open(path)
            .map_err(|e| Error::Db(format!("cannot open {}: {e}", path.display())))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        Self::setup(conn)
    }

    /// A private in-memory database (tests, dry runs).
    pub fn open_in_memory() -> Result<SqliteStore> {
        Self::setup(Connection::open_in_memory()?)
    }

    fn setup(mut conn: Connection) -> Result<SqliteStore> {
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        let have: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        if have < 0 || have as usize > MIGRATIONS.len() {
            return Err(Error::Db(format!(
                "schema version {have} is newer than this mutirão knows ({}); use a newer coordinator",
                MIGRATIONS.len()
            )));
        }
        for (i, m) in MIGRATIONS.iter().enumerate().skip(have as usize) {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Exclusive)?;
            tx.execute_batch(m)
                .map_err(|e| Error::Db(format!("migration {}: {e}", i + 1)))?;
            tx.pragma_update(None, "user_version", (i + 1) as i64)?;
            tx.commit()?;
        }
        Ok(SqliteStore {
            conn: Mutex::new(conn),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Connection> {
        // rusqlite rolls back an unfinished transaction when it is dropped, so a panic in
        // another thread leaves the database consistent: a poisoned lock is still usable.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn job_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(i64, String, String, i64, i64)> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
}

fn to_job(row: (i64, String, String, i64, i64)) -> Result<Job> {
    let (id, spec, state, created_ms, updated_ms) = row;
    Ok(Job {
        id,
        spec: serde_json::from_str(&spec)
            .map_err(|e| Error::Db(format!("job {id}: stored spec is malformed: {e}")))?,
        state: JobState::parse(&state)
            .ok_or_else(|| Error::Db(format!("job {id}: unknown stored state {state:?}")))?,
        created_ms,
        updated_ms,
    })
}

fn append(
    tx: &rusqlite::Transaction<'_>,
    job: i64,
    at: i64,
    kind: &str,
    to: Option<JobState>,
    detail: &str,
) -> Result<Event> {
    let seq: i64 = tx.query_row(
        "SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE job = ?1",
        [job],
        |r| r.get(0),
    )?;
    tx.execute(
        "INSERT INTO events (job, seq, at_ms, kind, to_state, detail) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![job, seq, at, kind, to.map(JobState::as_str), detail],
    )?;
    Ok(Event {
        job,
        seq,
        at_ms: at,
        kind: kind.to_string(),
        to,
        detail: detail.to_string(),
    })
}

/// Bytes of the content recorded for `owner`.
fn blob_usage(c: &Connection, owner: &str) -> Result<u64> {
    let used: i64 = c.query_row(
        "SELECT COALESCE(SUM(size), 0) FROM blobs WHERE owner = ?1",
        [owner],
        |r| r.get(0),
    )?;
    Ok(used.max(0) as u64)
}

/// Whether `digest` is recorded for `owner`.
fn has_blob(c: &Connection, owner: &str, digest: &str) -> Result<bool> {
    Ok(c.query_row(
        "SELECT 1 FROM blobs WHERE owner = ?1 AND digest = ?2",
        params![owner, digest],
        |_| Ok(true),
    )
    .optional()?
    .unwrap_or(false))
}

impl Store for SqliteStore {
    fn schema_version(&self) -> Result<i64> {
        Ok(self
            .lock()
            .pragma_query_value(None, "user_version", |r| r.get(0))?)
    }

    fn create_job(&self, j: &NewJob) -> Result<Job> {
        j.validate().map_err(Error::Invalid)?;
        let spec = serde_json::to_string(j).map_err(|e| Error::Invalid(e.to_string()))?;
        let mut c = self.lock();
        let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let at = now_ms();
        tx.execute(
            "INSERT INTO jobs (owner, spec, state, created_ms, updated_ms) VALUES (?1, ?2, ?3, ?4, ?4)",
            params![j.owner, spec, JobState::Waiting.as_str(), at],
        )?;
        let id = tx.last_insert_rowid();
        append(&tx, id, at, "state", Some(JobState::Waiting), "submitted")?;
        tx.commit()?;
        Ok(Job {
            id,
            spec: j.clone(),
            state: JobState::Waiting,
            created_ms: at,
            updated_ms: at,
        })
    }

    fn job(&self, id: i64) -> Result<Job> {
        let c = self.lock();
        let row = c
            .query_row(
                "SELECT id, spec, state, created_ms, updated_ms FROM jobs WHERE id = ?1",
                [id],
                job_row,
            )
            .optional()?
            .ok_or(Error::NoJob(id))?;
        to_job(row)
    }

    fn jobs_newest(&self, owner: Option<&str>, limit: u64) -> Result<Vec<Job>> {
        let c = self.lock();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut st = match owner {
            Some(_) => c.prepare_cached(
                "SELECT id, spec, state, created_ms, updated_ms FROM jobs
                 WHERE owner = ?1 ORDER BY id DESC LIMIT ?2",
            )?,
            None => c.prepare_cached(
                "SELECT id, spec, state, created_ms, updated_ms FROM jobs
                 WHERE ?1 IS NULL ORDER BY id DESC LIMIT ?2",
            )?,
        };
        let rows = st.query_map(params![owner, limit], job_row)?;
        rows.map(|r| to_job(r?)).collect()
    }

    fn jobs_in(&self, states: &[JobState]) -> Result<Vec<Job>> {
        let c = self.lock();
        let mut st = c.prepare(
            "SELECT id, spec, state, created_ms, updated_ms FROM jobs WHERE state = ?1 ORDER BY id",
        )?;
        let mut out = Vec::new();
        for s in states {
            let rows = st.query_map([s.as_str()], job_row)?;
            for r in rows {
                out.push(to_job(r?)?);
            }
        }
        out.sort_by_key(|j| j.id);
        Ok(out)
    }

    fn transition_noting(
        &self,
        id: i64,
        notes: &[(&str, &str)],
        to: JobState,
        detail: &str,
    ) -> Result<Job> {
        for (kind, _) in notes {
            crate::check_note_kind(kind)?;
        }
        let mut c = self.lock();
        let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let row = tx
            .query_row(
                "SELECT id, spec, state, created_ms, updated_ms FROM jobs WHERE id = ?1",
                [id],
                job_row,
            )
            .optional()?
            .ok_or(Error::NoJob(id))?;
        let mut job = to_job(row)?;
        if !job.state.can_become(to) {
            return Err(Error::Transition {
                job: id,
                from: job.state,
                to,
            });
        }
        let at = now_ms();
        for (kind, d) in notes {
            append(&tx, id, at, kind, None, d)?;
        }
        tx.execute(
            "UPDATE jobs SET state = ?1, updated_ms = ?2 WHERE id = ?3",
            params![to.as_str(), at, id],
        )?;
        append(&tx, id, at, "state", Some(to), detail)?;
        tx.commit()?;
        job.state = to;
        job.updated_ms = at;
        Ok(job)
    }

    fn note(&self, id: i64, kind: &str, detail: &str) -> Result<Event> {
        crate::check_note_kind(kind)?;
        let mut c = self.lock();
        let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let exists: bool = tx
            .query_row("SELECT 1 FROM jobs WHERE id = ?1", [id], |_| Ok(true))
            .optional()?
            .unwrap_or(false);
        if !exists {
            return Err(Error::NoJob(id));
        }
        let e = append(&tx, id, now_ms(), kind, None, detail)?;
        tx.commit()?;
        Ok(e)
    }

    fn events(&self, id: i64) -> Result<Vec<Event>> {
        let c = self.lock();
        let mut st = c.prepare(
            "SELECT job, seq, at_ms, kind, to_state, detail FROM events WHERE job = ?1 ORDER BY seq",
        )?;
        let rows = st.query_map([id], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, Option<String>>(4)?,
                r.get::<_, String>(5)?,
            ))
        })?;
        let mut out = Vec::new();
        for r in rows {
            let (job, seq, at_ms, kind, to, detail) = r?;
            let to = match to {
                Some(s) => Some(JobState::parse(&s).ok_or_else(|| {
                    Error::Db(format!("job {job} event {seq}: unknown state {s:?}"))
                })?),
                None => None,
            };
            out.push(Event {
                job,
                seq,
                at_ms,
                kind,
                to,
                detail,
            });
        }
        if out.is_empty() {
            // Every job has its "submitted" event: no events means no job.
            return Err(Error::NoJob(id));
        }
        Ok(out)
    }

    fn report_host(&self, r: &HostReport) -> Result<Host> {
        r.validate().map_err(Error::Invalid)?;
        let at = now_ms();
        let text = serde_json::to_string(r).map_err(|e| Error::Invalid(e.to_string()))?;
        self.lock()
            .prepare_cached(
                "INSERT INTO hosts (name, report, last_seen_ms) VALUES (?1, ?2, ?3)
                 ON CONFLICT(name) DO UPDATE SET report = excluded.report, last_seen_ms = excluded.last_seen_ms",
            )?
            .execute(params![r.name, text, at])?;
        Ok(Host {
            report: r.clone(),
            last_seen_ms: at,
        })
    }

    fn heartbeat_host(&self, r: &HostReport) -> Result<Option<Host>> {
        r.validate().map_err(Error::Invalid)?;
        let at = now_ms();
        let text = serde_json::to_string(r).map_err(|e| Error::Invalid(e.to_string()))?;
        let c = self.lock();
        // A heartbeat is soft state, restored by the next one: committed to the WAL without
        // waiting for the disk (a coordinator crash loses nothing; an OS crash may lose the
        // last seconds of heartbeats). Jobs and events stay synchronous=FULL.
        c.pragma_update(None, "synchronous", "NORMAL")?;
        let n = c
            .prepare_cached("UPDATE hosts SET report = ?2, last_seen_ms = ?3 WHERE name = ?1")
            .and_then(|mut st| st.execute(params![r.name, text, at]));
        c.pragma_update(None, "synchronous", "FULL")?;
        Ok((n? > 0).then(|| Host {
            report: r.clone(),
            last_seen_ms: at,
        }))
    }

    fn hosts(&self) -> Result<Vec<Host>> {
        let c = self.lock();
        let mut st = c.prepare("SELECT name, report, last_seen_ms FROM hosts ORDER BY name")?;
        let rows = st.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })?;
        let mut out = Vec::new();
        for r in rows {
            let (name, text, last_seen_ms) = r?;
            out.push(Host {
                report: serde_json::from_str(&text).map_err(|e| {
                    Error::Db(format!("host {name}: stored report is malformed: {e}"))
                })?,
                last_seen_ms,
            });
        }
        Ok(out)
    }

    fn host(&self, name: &str) -> Result<Option<Host>> {
        let c = self.lock();
        let row = c
            .query_row(
                "SELECT report, last_seen_ms FROM hosts WHERE name = ?1",
                [name],
                |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)),
            )
            .optional()?;
        match row {
            None => Ok(None),
            Some((text, last_seen_ms)) => Ok(Some(Host {
                report: serde_json::from_str(&text).map_err(|e| {
                    Error::Db(format!("host {name}: stored report is malformed: {e}"))
                })?,
                last_seen_ms,
            })),
        }
    }

    fn append_log_capped(&self, id: i64, data: &[u8], cap: u64) -> Result<Appended> {
        let mut c = self.lock();
        let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let exists: bool = tx
            .query_row("SELECT 1 FROM jobs WHERE id = ?1", [id], |_| Ok(true))
            .optional()?
            .unwrap_or(false);
        if !exists {
            return Err(Error::NoJob(id));
        }
        let len: i64 = tx.query_row(
            "SELECT COALESCE(MAX(start + length(data)), 0) FROM logs WHERE job = ?1",
            [id],
            |r| r.get(0),
        )?;
        let len = len.max(0) as u64;
        let (stored, truncated) = crate::cap_output(len, data, cap);
        let mut at = len;
        for row in stored.chunks(crate::LOG_ROW) {
            tx.prepare_cached("INSERT INTO logs (job, start, data) VALUES (?1, ?2, ?3)")?
                .execute(params![id, at as i64, row])?;
            at += row.len() as u64;
        }
        if !stored.is_empty() {
            tx.commit()?;
        }
        Ok(crate::appended(len, data, &stored, truncated, cap))
    }

    fn read_log(&self, id: i64, offset: u64, max: usize) -> Result<LogChunk> {
        let c = self.lock();
        let exists: bool = c
            .query_row("SELECT 1 FROM jobs WHERE id = ?1", [id], |_| Ok(true))
            .optional()?
            .unwrap_or(false);
        if !exists {
            return Err(Error::NoJob(id));
        }
        let length: i64 = c.query_row(
            "SELECT COALESCE(MAX(start + length(data)), 0) FROM logs WHERE job = ?1",
            [id],
            |r| r.get(0),
        )?;
        let off = i64::try_from(offset).unwrap_or(i64::MAX);
        let mut st = c.prepare(
            "SELECT start, data FROM logs WHERE job = ?1 AND start + length(data) > ?2 ORDER BY start",
        )?;
        let mut rows = st.query(params![id, off])?;
        let mut data = Vec::new();
        while let Some(r) = rows.next()? {
            if data.len() >= max {
                break;
            }
            let start: i64 = r.get(0)?;
            let chunk: Vec<u8> = r.get(1)?;
            crate::gather(&mut data, start, &chunk, offset, max);
        }
        Ok(LogChunk {
            data,
            length: length as u64,
        })
    }

    fn add_blob(&self, owner: &str, digest: &str, size: u64, quota: u64) -> Result<BlobAdd> {
        let mut c = self.lock();
        let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
        if has_blob(&tx, owner, digest)? {
            return Ok(BlobAdd::Already);
        }
        let used = blob_usage(&tx, owner)?;
        if used.saturating_add(size) > quota {
            return Ok(BlobAdd::OverQuota { used });
        }
        tx.execute(
            "INSERT INTO blobs (owner, digest, size, at_ms) VALUES (?1, ?2, ?3, ?4)",
            params![
                owner,
                digest,
                i64::try_from(size).unwrap_or(i64::MAX),
                now_ms()
            ],
        )?;
        tx.commit()?;
        Ok(BlobAdd::Added)
    }

    fn blob_usage(&self, owner: &str) -> Result<u64> {
        blob_usage(&self.lock(), owner)
    }

    fn has_blob(&self, owner: &str, digest: &str) -> Result<bool> {
        has_blob(&self.lock(), owner, digest)
    }
}
