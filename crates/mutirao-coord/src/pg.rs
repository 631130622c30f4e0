//! [`Store`] on PostgreSQL (for grids too large for one SQLite file): the same tables and
//! the same migration semantics as [`crate::SqliteStore`] — the schema version is kept in the
//! table `mutirao_schema`, migrations run forward on connect, each in its own transaction, and
//! a database from a newer mutirão is refused. Every method is one transaction; PostgreSQL's
//! default `synchronous_commit` makes a commit durable when it returns. Concurrent changes to
//! one job are serialized by locking its row (`SELECT … FOR UPDATE`).
//!
//! The client is the synchronous `postgres` crate: call it from a blocking thread (the API
//! does, through `spawn_blocking`), never from inside an async task.

use crate::model::{Event, Host, HostReport, Job, JobState, LogChunk, NewJob};
use crate::{Appended, BlobAdd, Error, Result, Store};
use postgres::{Client, NoTls, Transaction};
use std::sync::Mutex;

const MIGRATIONS: &[&str] = &[
    // 1: jobs, their journal, hosts.
    "CREATE TABLE jobs (
        id BIGSERIAL PRIMARY KEY,
        owner TEXT NOT NULL,
        spec TEXT NOT NULL,
        state TEXT NOT NULL,
        created_ms BIGINT NOT NULL,
        updated_ms BIGINT NOT NULL
     );
     CREATE TABLE events (
        job BIGINT NOT NULL REFERENCES jobs(id),
        seq BIGINT NOT NULL,
        at_ms BIGINT NOT NULL,
        kind TEXT NOT NULL,
        to_state TEXT,
        detail TEXT NOT NULL,
        PRIMARY KEY (job, seq)
     );
     CREATE TABLE hosts (
        name TEXT PRIMARY KEY,
        report TEXT NOT NULL,
        last_seen_ms BIGINT NOT NULL
     );",
    // 2: a user's jobs are listed often.
    "CREATE INDEX jobs_owner ON jobs(owner, id);",
    // 3: each job's output, in chunks at their byte offsets.
    "CREATE TABLE logs (
        job BIGINT NOT NULL REFERENCES jobs(id),
        start BIGINT NOT NULL,
        data BYTEA NOT NULL,
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
        size BIGINT NOT NULL,
        at_ms BIGINT NOT NULL,
        PRIMARY KEY (owner, digest)
     );
     INSERT INTO blobs (owner, digest, size, at_ms)
        SELECT owner, spec::json->>'program', 0, created_ms FROM jobs
        WHERE spec::json->>'program' LIKE 'sha256:%'
        ON CONFLICT DO NOTHING;",
];

/// The PostgreSQL store.
pub struct PgStore {
    client: Mutex<Client>,
    /// A second connection for heartbeats, soft state: `synchronous_commit = off` (no wait
    /// for the WAL flush; a server crash may lose the last heartbeats, never consistency), and
    /// its own lock, so 200 heartbeats a second do not queue job changes behind them.
    soft: Mutex<(Client, postgres::Statement)>,
}

fn db(e: postgres::Error) -> Error {
    Error::Db(describe(&e))
}

/// The server's own message when there is one (`postgres::Error` alone says only "db error").
fn describe(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("{}: {} ({})", d.severity(), d.message(), d.code().code()),
        None => e.to_string(),
    }
}

/// The advisory lock key under which coordinators migrate one at a time.
const MIGRATION_LOCK: i64 = 0x6d75_7469_7261_6f00;

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl PgStore {
    /// Connect to `url` (`postgresql://user@host/db`, or `host=/run/postgresql user=… dbname=…`)
    /// and migrate the database to this version's schema.
    pub fn connect(url: &str) -> Result<PgStore> {
        let mut client = Client::connect(url, NoTls).map_err(|e| {
            Error::Db(format!(
                "cannot connect to PostgreSQL ({url}): {}",
                describe(&e)
            ))
        })?;
        // Held for the session's migration step only; dropping the connection on an error
        // releases it too.
        client
            .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
            .map_err(db)?;
        Self::migrate(&mut client)?;
        client
            .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
            .map_err(db)?;
        let mut soft = Client::connect(url, NoTls).map_err(|e| {
            Error::Db(format!(
                "cannot connect to PostgreSQL ({url}): {}",
                describe(&e)
            ))
        })?;
        soft.batch_execute("SET synchronous_commit = off")
            .map_err(db)?;
        // Prepared once: a query given as text is parsed on every call.
        let heartbeat = soft
            .prepare("UPDATE hosts SET report = $2, last_seen_ms = $3 WHERE name = $1")
            .map_err(db)?;
        Ok(PgStore {
            client: Mutex::new(client),
            soft: Mutex::new((soft, heartbeat)),
        })
    }

    fn migrate(c: &mut Client) -> Result<()> {
        c.batch_execute(
            "CREATE TABLE IF NOT EXISTS mutirao_schema (one INT PRIMARY KEY CHECK (one = 1), version INT NOT NULL);
             INSERT INTO mutirao_schema VALUES (1, 0) ON CONFLICT DO NOTHING;",
        )
        .map_err(|e| Error::Db(format!("cannot create the schema table: {}", describe(&e))))?;
        loop {
            let mut tx = c.transaction().map_err(db)?;
            // The row lock makes two coordinators starting at once migrate one after the other.
            let have: i32 = tx
                .query_one("SELECT version FROM mutirao_schema FOR UPDATE", &[])
                .map_err(db)?
                .get(0);
            if have < 0 || have as usize > MIGRATIONS.len() {
                return Err(Error::Db(format!(
                    "schema version {have} is newer than this mutirão knows ({}); use a newer coordinator",
                    MIGRATIONS.len()
                )));
            }
            let Some(m) = MIGRATIONS.get(have as usize) else {
                return Ok(());
            };
            tx.batch_execute(m)
                .map_err(|e| Error::Db(format!("migration {}: {}", have + 1, describe(&e))))?;
            tx.execute("UPDATE mutirao_schema SET version = $1", &[&(have + 1)])
                .map_err(db)?;
            tx.commit().map_err(db)?;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Client> {
        // An unfinished transaction is rolled back when dropped: a poisoned lock is usable.
        self.client.lock().unwrap_or_else(|p| p.into_inner())
    }
}

type JobRow = (i64, String, String, i64, i64);

fn job_row(r: &postgres::Row) -> JobRow {
    (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4))
}

fn to_job(row: JobRow) -> Result<Job> {
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

fn lock_job(tx: &mut Transaction<'_>, id: i64) -> Result<JobRow> {
    tx.query_opt(
        "SELECT id, spec, state, created_ms, updated_ms FROM jobs WHERE id = $1 FOR UPDATE",
        &[&id],
    )
    .map_err(db)?
    .map(|r| job_row(&r))
    .ok_or(Error::NoJob(id))
}

fn append(
    tx: &mut Transaction<'_>,
    job: i64,
    at: i64,
    kind: &str,
    to: Option<JobState>,
    detail: &str,
) -> Result<Event> {
    let seq: i64 = tx
        .query_one(
            "SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE job = $1",
            &[&job],
        )
        .map_err(db)?
        .get(0);
    tx.execute(
        "INSERT INTO events (job, seq, at_ms, kind, to_state, detail) VALUES ($1, $2, $3, $4, $5, $6)",
        &[&job, &seq, &at, &kind, &to.map(JobState::as_str), &detail],
    )
    .map_err(db)?;
    Ok(Event {
        job,
        seq,
        at_ms: at,
        kind: kind.to_string(),
        to,
        detail: detail.to_string(),
    })
}

fn log_len(tx: &mut Transaction<'_>, id: i64) -> Result<i64> {
    Ok(tx
        .query_one(
            "SELECT COALESCE(MAX(start + octet_length(data)), 0)::BIGINT FROM logs WHERE job = $1",
            &[&id],
        )
        .map_err(db)?
        .get(0))
}

fn to_host(name: &str, text: &str, last_seen_ms: i64) -> Result<Host> {
    Ok(Host {
        report: serde_json::from_str(text)
            .map_err(|e| Error::Db(format!("host {name}: stored report is malformed: {e}")))?,
        last_seen_ms,
    })
}

/// Bytes of the content recorded for `owner`.
fn blob_usage(c: &mut impl postgres::GenericClient, owner: &str) -> Result<u64> {
    let used: i64 = c
        .query_one(
            "SELECT COALESCE(SUM(size), 0)::BIGINT FROM blobs WHERE owner = $1",
            &[&owner],
        )
        .map_err(db)?
        .get(0);
    Ok(used.max(0) as u64)
}

/// Whether `digest` is recorded for `owner`.
fn has_blob(c: &mut impl postgres::GenericClient, owner: &str, digest: &str) -> Result<bool> {
    Ok(c.query_opt(
        "SELECT 1 FROM blobs WHERE owner = $1 AND digest = $2",
        &[&owner, &digest],
    )
    .map_err(db)?
    .is_some())
}

impl Store for PgStore {
    fn schema_version(&self) -> Result<i64> {
        let v: i32 = self
            .lock()
            .query_one("SELECT version FROM mutirao_schema", &[])
            .map_err(db)?
            .get(0);
        Ok(v as i64)
    }

    fn create_job(&self, j: &NewJob) -> Result<Job> {
        j.validate().map_err(Error::Invalid)?;
        let spec = serde_json::to_string(j).map_err(|e| Error::Invalid(e.to_string()))?;
        let mut c = self.lock();
        let mut tx = c.transaction().map_err(db)?;
        let at = now_ms();
        let id: i64 = tx
            .query_one(
                "INSERT INTO jobs (owner, spec, state, created_ms, updated_ms) VALUES ($1, $2, $3, $4, $4) RETURNING id",
                &[&j.owner, &spec, &JobState::Waiting.as_str(), &at],
            )
            .map_err(db)?
            .get(0);
        append(
            &mut tx,
            id,
            at,
            "state",
            Some(JobState::Waiting),
            "submitted",
        )?;
        tx.commit().map_err(db)?;
        Ok(Job {
            id,
            spec: j.clone(),
            state: JobState::Waiting,
            created_ms: at,
            updated_ms: at,
        })
    }

    fn job(&self, id: i64) -> Result<Job> {
        let row = self
            .lock()
            .query_opt(
                "SELECT id, spec, state, created_ms, updated_ms FROM jobs WHERE id = $1",
                &[&id],
            )
            .map_err(db)?
            .ok_or(Error::NoJob(id))?;
        to_job(job_row(&row))
    }

    fn jobs_newest(&self, owner: Option<&str>, limit: u64) -> Result<Vec<Job>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = match owner {
            Some(o) => self.lock().query(
                "SELECT id, spec, state, created_ms, updated_ms FROM jobs WHERE owner = $1 ORDER BY id DESC LIMIT $2",
                &[&o, &limit],
            ),
            None => self.lock().query(
                "SELECT id, spec, state, created_ms, updated_ms FROM jobs ORDER BY id DESC LIMIT $1",
                &[&limit],
            ),
        }
        .map_err(db)?;
        rows.iter().map(|r| to_job(job_row(r))).collect()
    }

    fn jobs_in(&self, states: &[JobState]) -> Result<Vec<Job>> {
        let names: Vec<&str> = states.iter().map(|s| s.as_str()).collect();
        let rows = self
            .lock()
            .query(
                "SELECT id, spec, state, created_ms, updated_ms FROM jobs WHERE state = ANY($1) ORDER BY id",
                &[&names],
            )
            .map_err(db)?;
        rows.iter().map(|r| to_job(job_row(r))).collect()
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
        let mut tx = c.transaction().map_err(db)?;
        let mut job = to_job(lock_job(&mut tx, id)?)?;
        if !job.state.can_become(to) {
            return Err(Error::Transition {
                job: id,
                from: job.state,
                to,
            });
        }
        let at = now_ms();
        for (kind, d) in notes {
            append(&mut tx, id, at, kind, None, d)?;
        }
        tx.execute(
            "UPDATE jobs SET state = $1, updated_ms = $2 WHERE id = $3",
            &[&to.as_str(), &at, &id],
        )
        .map_err(db)?;
        append(&mut tx, id, at, "state", Some(to), detail)?;
        tx.commit().map_err(db)?;
        job.state = to;
        job.updated_ms = at;
        Ok(job)
    }

    fn note(&self, id: i64, kind: &str, detail: &str) -> Result<Event> {
        crate::check_note_kind(kind)?;
        let mut c = self.lock();
        let mut tx = c.transaction().map_err(db)?;
        lock_job(&mut tx, id)?;
        let e = append(&mut tx, id, now_ms(), kind, None, detail)?;
        tx.commit().map_err(db)?;
        Ok(e)
    }

    fn events(&self, id: i64) -> Result<Vec<Event>> {
        let rows = self
            .lock()
            .query(
                "SELECT job, seq, at_ms, kind, to_state, detail FROM events WHERE job = $1 ORDER BY seq",
                &[&id],
            )
            .map_err(db)?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let (job, seq): (i64, i64) = (r.get(0), r.get(1));
            let to: Option<String> = r.get(4);
            let to = match to {
                Some(s) => Some(JobState::parse(&s).ok_or_else(|| {
                    Error::Db(format!("job {job} event {seq}: unknown state {s:?}"))
                })?),
                None => None,
            };
            out.push(Event {
                job,
                seq,
                at_ms: r.get(2),
                kind: r.get(3),
                to,
                detail: r.get(5),
            });
        }
        if out.is_empty() {
            return Err(Error::NoJob(id));
        }
        Ok(out)
    }

    fn report_host(&self, r: &HostReport) -> Result<Host> {
        r.validate().map_err(Error::Invalid)?;
        let at = now_ms();
        let text = serde_json::to_string(r).map_err(|e| Error::Invalid(e.to_string()))?;
        self.lock()
            .execute(
                "INSERT INTO hosts (name, report, last_seen_ms) VALUES ($1, $2, $3)
                 ON CONFLICT (name) DO UPDATE SET report = excluded.report, last_seen_ms = excluded.last_seen_ms",
                &[&r.name, &text, &at],
            )
            .map_err(db)?;
        Ok(Host {
            report: r.clone(),
            last_seen_ms: at,
        })
    }

    fn heartbeat_host(&self, r: &HostReport) -> Result<Option<Host>> {
        r.validate().map_err(Error::Invalid)?;
        let at = now_ms();
        let text = serde_json::to_string(r).map_err(|e| Error::Invalid(e.to_string()))?;
        let mut soft = self.soft.lock().unwrap_or_else(|p| p.into_inner());
        let (client, st) = &mut *soft;
        let n = client.execute(&*st, &[&r.name, &text, &at]).map_err(db)?;
        Ok((n > 0).then(|| Host {
            report: r.clone(),
            last_seen_ms: at,
        }))
    }

    fn hosts(&self) -> Result<Vec<Host>> {
        let rows = self
            .lock()
            .query(
                "SELECT name, report, last_seen_ms FROM hosts ORDER BY name",
                &[],
            )
            .map_err(db)?;
        rows.iter()
            .map(|r| to_host(r.get(0), r.get(1), r.get(2)))
            .collect()
    }

    fn host(&self, name: &str) -> Result<Option<Host>> {
        let row = self
            .lock()
            .query_opt(
                "SELECT report, last_seen_ms FROM hosts WHERE name = $1",
                &[&name],
            )
            .map_err(db)?;
        row.map(|r| to_host(name, r.get(0), r.get(1))).transpose()
    }

    fn append_log_capped(&self, id: i64, data: &[u8], cap: u64) -> Result<Appended> {
        let mut c = self.lock();
        let mut tx = c.transaction().map_err(db)?;
        lock_job(&mut tx, id)?;
        let len = log_len(&mut tx, id)?.max(0) as u64;
        let (stored, truncated) = crate::cap_output(len, data, cap);
        let mut at = len;
        for row in stored.chunks(crate::LOG_ROW) {
            tx.execute(
                "INSERT INTO logs (job, start, data) VALUES ($1, $2, $3)",
                &[&id, &(at as i64), &row],
            )
            .map_err(db)?;
            at += row.len() as u64;
        }
        if !stored.is_empty() {
            tx.commit().map_err(db)?;
        }
        Ok(crate::appended(len, data, &stored, truncated, cap))
    }

    fn read_log(&self, id: i64, offset: u64, max: usize) -> Result<LogChunk> {
        let mut c = self.lock();
        let mut tx = c.transaction().map_err(db)?;
        let exists = tx
            .query_opt("SELECT 1 FROM jobs WHERE id = $1", &[&id])
            .map_err(db)?
            .is_some();
        if !exists {
            return Err(Error::NoJob(id));
        }
        let length = log_len(&mut tx, id)?;
        let off = i64::try_from(offset).unwrap_or(i64::MAX);
        let rows = tx
            .query(
                "SELECT start, data FROM logs WHERE job = $1 AND start + octet_length(data) > $2 ORDER BY start",
                &[&id, &off],
            )
            .map_err(db)?;
        let mut data = Vec::new();
        for r in rows {
            if data.len() >= max {
                break;
            }
            let chunk: &[u8] = r.get(1);
            crate::gather(&mut data, r.get(0), chunk, offset, max);
        }
        tx.commit().map_err(db)?;
        Ok(LogChunk {
            data,
            length: length as u64,
        })
    }

    fn add_blob(&self, owner: &str, digest: &str, size: u64, quota: u64) -> Result<BlobAdd> {
        let mut c = self.lock();
        let mut tx = c.transaction().map_err(db)?;
        // One owner's uploads are recorded one at a time (their quota is checked against a
        // sum no other upload of theirs is changing).
        tx.execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[&owner])
            .map_err(db)?;
        if has_blob(&mut tx, owner, digest)? {
            return Ok(BlobAdd::Already);
        }
        let used = blob_usage(&mut tx, owner)?;
        if used.saturating_add(size) > quota {
            return Ok(BlobAdd::OverQuota { used });
        }
        tx.execute(
            "INSERT INTO blobs (owner, digest, size, at_ms) VALUES ($1, $2, $3, $4)",
            &[
                &owner,
                &digest,
                &i64::try_from(size).unwrap_or(i64::MAX),
                &now_ms(),
            ],
        )
        .map_err(db)?;
        tx.commit().map_err(db)?;
        Ok(BlobAdd::Added)
    }

    fn blob_usage(&self, owner: &str) -> Result<u64> {
        blob_usage(&mut *self.lock(), owner)
    }

    fn has_blob(&self, owner: &str, digest: &str) -> Result<bool> {
        has_blob(&mut *self.lock(), owner, digest)
    }
}
