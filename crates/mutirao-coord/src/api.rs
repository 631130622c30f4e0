//! The coordinator's HTTP + JSON API (axum), over any [`Store`].
//!
//! Every route but `/openapi.json` needs `Authorization: Bearer <token>` of a known principal
//! ([`Tokens`]): none or an unknown one is 401; a user calling an agent's route, an agent
//! calling a user's or an agent reporting another host is 403. The token and the principal's
//! kind are checked by a middleware before any handler runs, so a refused request's body is
//! never read (an unauthenticated 150 MiB upload costs the headers). Another user's job or blob
//! is answered exactly as one that does not exist (404), so ids and digests reveal nothing.
//! Every refusal is logged (stderr and [`Coordinator::audit`]) and changes nothing.
//!
//! [`serve`] closes a connection whose request header is not complete within
//! [`Limits::header_read_timeout`], and serves at most [`Limits::max_connections`] at once
//! (more are answered 503 and closed at once); each user's stored uploads are bounded by
//! [`Limits::upload_quota`] and each job's log by [`Limits::log_cap`].
//! Malformed requests are 4xx with a message; 5xx means the coordinator itself failed
//! (its database or disk). The routes are [`ROUTES`]; [`openapi`] describes each.
//!
//! Store calls are blocking (SQLite fsyncs, the synchronous PostgreSQL client): handlers run
//! them on tokio's blocking pool.

use crate::auth::{Kind, Principal, Tokens};
use crate::repo::{check_digest, Repo};
use crate::{BlobAdd, Error, Event, Host, HostReport, Job, JobState, NewJob, Store};
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Extension, MatchedPath, Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Every route: method and path (axum's `{param}` syntax, as in the OpenAPI document).
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/openapi.json"),
    ("POST", "/jobs"),
    ("GET", "/jobs"),
    ("GET", "/jobs/{id}"),
    ("POST", "/jobs/{id}/cancel"),
    ("GET", "/jobs/{id}/logs"),
    ("POST", "/jobs/{id}/logs"),
    ("POST", "/agents/register"),
    ("POST", "/agents/heartbeat"),
    ("GET", "/hosts"),
    ("POST", "/blobs"),
    ("GET", "/blobs/{digest}"),
];

/// Longest wait of a log long-poll (`wait_ms`).
pub const MAX_WAIT_MS: u64 = 60_000;
/// Largest log read (`max`).
pub const MAX_LOG_READ: usize = 1 << 20;
/// Largest JSON body or log append accepted.
pub const MAX_BODY: usize = 1 << 20;
/// Audit lines kept in memory.
const AUDIT_KEPT: usize = 1000;

/// What a client may cost the coordinator (issue 29): every limit has a default and a flag of
/// `mutirao coordinator`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// A request's whole header must arrive within this after the connection starts waiting
    /// for it (an idle kept-alive connection too), else the connection is closed.
    pub header_read_timeout: Duration,
    /// Connections served at once; one more is answered 503 and closed at once.
    pub max_connections: usize,
    /// Bytes of uploaded content each user may have in the repository (507 past it).
    pub upload_quota: u64,
    /// Bytes of output a job's log keeps; past it the log gets one notice and further output
    /// is dropped (and counted in the job's journal).
    pub log_cap: u64,
}

/// Default [`Limits::header_read_timeout`].
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default [`Limits::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
/// Default [`Limits::upload_quota`]: 4 GiB.
pub const DEFAULT_UPLOAD_QUOTA: u64 = 4 << 30;
/// Default [`Limits::log_cap`]: 64 MiB.
pub const DEFAULT_LOG_CAP: u64 = 64 << 20;

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            upload_quota: DEFAULT_UPLOAD_QUOTA,
            log_cap: DEFAULT_LOG_CAP,
        }
    }
}

/// Something the coordinator is told when a job is submitted or cancelled (the executor that
/// places and runs jobs). Called on tokio's blocking pool; must not block for long.
pub trait JobHook: Send + Sync {
    /// A job was stored, state `waiting`.
    fn submitted(&self, c: &Arc<Coordinator>, job: &Job);
    /// A job's owner cancelled it (its state is already `cancelled`).
    fn cancelled(&self, c: &Arc<Coordinator>, job: &Job);
    /// Whether `job` is running now with ranks (or tasks) placed on `host`: only then may
    /// that host's agent append to its log.
    fn runs_on(&self, job: i64, host: &str) -> bool;
}

/// The coordinator's shared state: the store, the principals, the repository.
pub struct Coordinator {
    store: Arc<dyn Store>,
    tokens: Tokens,
    repo: Repo,
    changed: tokio::sync::Notify,
    /// Held by [`Coordinator::transition_if`] between its look and its move.
    moves: Mutex<()>,
    audit: Mutex<VecDeque<String>>,
    hook: Mutex<Option<Arc<dyn JobHook>>>,
    usage: crate::usage::Usage,
    limits: Limits,
    /// Each host's agent address as it registered (a heartbeat naming another is refused).
    pinned: Mutex<HashMap<String, String>>,
    /// How often agents are asked to heartbeat.
    pub heartbeat_interval: Duration,
}

impl Coordinator {
    /// A coordinator over `store`, knowing `tokens`, keeping content in `repo`.
    pub fn new(store: Arc<dyn Store>, tokens: Tokens, repo: Repo) -> Arc<Coordinator> {
        Self::with_heartbeat(store, tokens, repo, Duration::from_secs(5))
    }

    /// The same, asking agents to heartbeat every `heartbeat_interval` (a host is lost after
    /// three).
    pub fn with_heartbeat(
        store: Arc<dyn Store>,
        tokens: Tokens,
        repo: Repo,
        heartbeat_interval: Duration,
    ) -> Arc<Coordinator> {
        Self::with_limits(store, tokens, repo, heartbeat_interval, Limits::default())
    }

    /// The same, with `limits` instead of the defaults.
    pub fn with_limits(
        store: Arc<dyn Store>,
        tokens: Tokens,
        repo: Repo,
        heartbeat_interval: Duration,
        limits: Limits,
    ) -> Arc<Coordinator> {
        Arc::new(Coordinator {
            store,
            tokens,
            repo,
            changed: tokio::sync::Notify::new(),
            moves: Mutex::new(()),
            audit: Mutex::new(VecDeque::new()),
            hook: Mutex::new(None),
            usage: crate::usage::Usage::default(),
            limits,
            pinned: Mutex::new(HashMap::new()),
            heartbeat_interval,
        })
    }

    /// Its limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Install what is told of submissions and cancellations (replaces any earlier one).
    pub fn set_hook(&self, h: Arc<dyn JobHook>) {
        *self.hook.lock().unwrap_or_else(|p| p.into_inner()) = Some(h);
    }

    fn hook(&self) -> Option<Arc<dyn JobHook>> {
        self.hook.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The hosts' usage histories, as their agents send them.
    pub fn usage(&self) -> &crate::usage::Usage {
        &self.usage
    }

    /// The application repository.
    pub fn repo(&self) -> &Repo {
        &self.repo
    }

    /// The refusals logged, oldest first (the last 1000).
    pub fn audit(&self) -> Vec<String> {
        self.audit
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    fn log_refusal(&self, line: String) {
        eprintln!("mutirao coordinator: {line}");
        let mut a = self.audit.lock().unwrap_or_else(|p| p.into_inner());
        if a.len() >= AUDIT_KEPT {
            a.pop_front();
        }
        a.push_back(line);
    }

    /// Append a job's output, within the log's cap ([`Limits::log_cap`]), and wake the log
    /// followers (for executors in this process).
    pub fn append_log(&self, id: i64, data: &[u8]) -> crate::Result<crate::Appended> {
        let a = self
            .store
            .append_log_capped(id, data, self.limits.log_cap)?;
        self.changed.notify_waiters();
        Ok(a)
    }

    /// Record that `owner` has `digest` (`size` bytes) in the repository, e.g. a task graph's
    /// output kept for its job (counted in the owner's quota, never refused).
    pub fn own_blob(&self, owner: &str, digest: &str, size: u64) -> crate::Result<()> {
        self.store.add_blob(owner, digest, size, u64::MAX).map(drop)
    }

    /// Move a job through the state machine and wake the log followers.
    pub fn transition(&self, id: i64, to: JobState, detail: &str) -> crate::Result<Job> {
        self.transition_noting(id, &[], to, detail)
    }

    /// Move the job to `to` only if it is in one of `from`; `Ok(None)` (nothing done) when it
    /// is not. The look and the move are one step against every other `transition_if`, so
    /// two followers of the same run (its checkpoint waves, its hosts' owners) cannot undo
    /// each other's move (a commit landing while an owner suspends the job leaves it
    /// `suspended`).
    pub fn transition_if(
        &self,
        id: i64,
        from: &[JobState],
        to: JobState,
        detail: &str,
    ) -> crate::Result<Option<Job>> {
        let _one = self.moves.lock().unwrap_or_else(|p| p.into_inner());
        if !from.contains(&self.store.job(id)?.state) {
            return Ok(None);
        }
        self.transition(id, to, detail).map(Some)
    }

    /// Journal `notes` and move the job to `to` in one change ([`Store::transition_noting`]),
    /// and wake the log followers.
    pub fn transition_noting(
        &self,
        id: i64,
        notes: &[(&str, &str)],
        to: JobState,
        detail: &str,
    ) -> crate::Result<Job> {
        let j = self.store.transition_noting(id, notes, to, detail)?;
        self.changed.notify_waiters();
        Ok(j)
    }

    fn authenticate(&self, h: &HeaderMap, what: &str) -> Result<Principal, ApiError> {
        let token = h
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        let Some(token) = token else {
            self.log_refusal(format!("401 {what}: no bearer token"));
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "no token: send `Authorization: Bearer <token>` (mutirao's client commands take --token or MUTIRAO_COORD_TOKEN)",
            ));
        };
        match self.tokens.authenticate(token) {
            Some(p) => Ok(p),
            None => {
                self.log_refusal(format!("401 {what}: unknown token"));
                Err(ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "unknown token: it is not in the coordinator's token file",
                ))
            }
        }
    }

    fn require(&self, p: &Principal, kind: Kind, what: &str) -> Result<(), ApiError> {
        if p.kind == kind {
            return Ok(());
        }
        self.log_refusal(format!("403 {what}: {p} is not a {}", kind.as_str()));
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "{what} is for {} principals; this token is {p}'s",
                kind.as_str()
            ),
        ))
    }

    /// Load a job of user `p`'s. Another user's job is answered as one that does not exist
    /// (the same 404 and message), so a job id tells nothing of other users' jobs.
    async fn owned_job(
        self: &Arc<Self>,
        p: &Principal,
        id: i64,
        what: &str,
    ) -> Result<Job, ApiError> {
        let store = self.store.clone();
        let job = blocking(move || store.job(id)).await?;
        if p.kind != Kind::User || job.spec.owner != p.name {
            self.log_refusal(format!(
                "404 {what}: {p} may not touch job {id} ({}'s)",
                job.spec.owner
            ));
            return Err(Error::NoJob(id).into());
        }
        Ok(job)
    }
}

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    User,
    Agent,
    Anyone,
}

/// Authenticate a request and check its principal's kind for the route before the handler
/// runs: a refused request's body is never read (hyper closes the connection instead of
/// reading the rest of it). The principal goes to the handler as an extension.
async fn gate(
    c: Arc<Coordinator>,
    who: Who,
    mut req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let path = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string())
        .unwrap_or_else(|| req.uri().path().to_string());
    let what = format!("{} {path}", req.method());
    let p = c.authenticate(req.headers(), &what)?;
    match who {
        Who::User => c.require(&p, Kind::User, &what)?,
        Who::Agent => c.require(&p, Kind::Agent, &what)?,
        Who::Anyone => {}
    }
    req.extensions_mut().insert(p);
    Ok(next.run(req).await)
}

async fn users_only(State(c): C, req: Request, next: Next) -> Result<Response, ApiError> {
    gate(c, Who::User, req, next).await
}

async fn agents_only(State(c): C, req: Request, next: Next) -> Result<Response, ApiError> {
    gate(c, Who::Agent, req, next).await
}

async fn anyone(State(c): C, req: Request, next: Next) -> Result<Response, ApiError> {
    gate(c, Who::Anyone, req, next).await
}

type P = Extension<Principal>;

/// An error answer: a status and a message, sent as `{"error": "..."}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }
    fn bad(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> ApiError {
        let status = match &e {
            Error::NoJob(_) | Error::NoBlob(_) => StatusCode::NOT_FOUND,
            Error::Transition { .. } => StatusCode::CONFLICT,
            Error::Invalid(_) => StatusCode::BAD_REQUEST,
            Error::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Error::Quota { .. } => StatusCode::INSUFFICIENT_STORAGE,
            Error::Moved { .. } => StatusCode::CONFLICT,
            Error::Tampered { .. } | Error::Db(_) | Error::Io(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
            Error::Remote { .. } | Error::Unreachable(_) => StatusCode::BAD_GATEWAY,
        };
        ApiError::new(status, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            eprintln!("mutirao coordinator: {}: {}", self.status, self.message);
        }
        (
            self.status,
            Json(serde_json::json!({ "error": self.message })),
        )
            .into_response()
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> crate::Result<T> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("a store task failed: {e}"),
            )
        })?
        .map_err(ApiError::from)
}

fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8], what: &str) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad(format!("{what}: {e}")))
}

/// A submission as sent (the owner is the authenticated user).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    /// Ranks.
    pub ranks: u32,
    /// The program's digest in the application repository (`sha256:…`).
    pub program: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// A requirement on hosts (`cpu>=2 & site=north`).
    #[serde(default)]
    pub require: Option<String>,
    /// Seconds between checkpoint waves.
    #[serde(default)]
    pub checkpoint_interval_s: Option<f64>,
    /// `program` names a task graph (`mutirao-taskgraph/1`) in the repository; `ranks` must be
    /// its number of tasks and `args` at most the scheduling algorithm.
    #[serde(default)]
    pub dag: bool,
    /// Environment variables for every rank (names: a letter or `_`, then letters, digits
    /// and `_`; `MUTIRAO_*` is reserved).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub env: std::collections::BTreeMap<String, String>,
}

/// A job with its journal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobView {
    /// The job.
    pub job: Job,
    /// Its journal, oldest first.
    pub events: Vec<Event>,
}

/// A host as listed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostView {
    /// The host and its last report.
    #[serde(flatten)]
    pub host: Host,
    /// It reported within three heartbeat intervals.
    pub alive: bool,
}

/// The answer to a registration or heartbeat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Registered {
    /// The host as stored.
    pub host: Host,
    /// Report again within this many seconds.
    pub heartbeat_interval_s: f64,
}

/// The answer to an upload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Uploaded {
    /// Its name in the repository.
    pub digest: String,
    /// Bytes.
    pub size: u64,
}

/// Headers of a log read.
pub const LOG_LENGTH_HEADER: &str = "x-mutirao-log-length";
/// The job's state when the log was read.
pub const JOB_STATE_HEADER: &str = "x-mutirao-job-state";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LogQuery {
    #[serde(default)]
    offset: u64,
    max: Option<usize>,
    #[serde(default)]
    wait_ms: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UploadQuery {
    digest: Option<String>,
}

type C = State<Arc<Coordinator>>;

/// Whether `user` may use `digest`: content they uploaded (or their jobs' kept outputs).
/// Content of other users' is answered as absent.
async fn has_blob(c: &Coordinator, user: &str, digest: &str) -> Result<bool, ApiError> {
    let (store, user, digest) = (c.store.clone(), user.to_string(), digest.to_string());
    blocking(move || store.has_blob(&user, &digest)).await
}

async fn submit(State(c): C, Extension(p): P, body: Bytes) -> Result<Response, ApiError> {
    let r: SubmitRequest = parse_json(&body, "submission")?;
    check_digest(&r.program).map_err(|e| {
        ApiError::bad(format!(
            "{e}; upload the program to POST /blobs first and submit its digest"
        ))
    })?;
    let nj = NewJob {
        owner: p.name.clone(),
        ranks: r.ranks,
        program: r.program,
        args: r.args,
        require: r.require,
        checkpoint_interval_s: r.checkpoint_interval_s,
        dag: r.dag,
        env: r.env,
    };
    nj.validate().map_err(ApiError::bad)?;
    if let Some(r) = &nj.require {
        crate::place::Requirement::parse(r)
            .map_err(|e| ApiError::bad(format!("requirement: {e}")))?;
    }
    if !c.repo.contains(&nj.program)? || !has_blob(&c, &p.name, &nj.program).await? {
        return Err(ApiError::bad(format!(
            "program {} is not in the application repository; upload it to POST /blobs first",
            nj.program
        )));
    }
    if nj.dag {
        let (repo, digest) = (c.repo.clone(), nj.program.clone());
        let text = blocking(move || repo.get(&digest)).await?;
        let text = String::from_utf8(text)
            .map_err(|_| ApiError::bad("the task graph is not UTF-8 text"))?;
        let (g, _) = crate::taskgraph::TaskGraph::parse(&text)
            .map_err(|e| ApiError::bad(format!("task graph {}: {e}", nj.program)))?;
        if g.tasks.len() != nj.ranks as usize {
            return Err(ApiError::bad(format!(
                "the task graph has {} tasks but the submission says {}",
                g.tasks.len(),
                nj.ranks
            )));
        }
        crate::taskgraph::algorithm(&nj.args).map_err(ApiError::bad)?;
        for t in &g.tasks {
            for (f, d) in &t.files {
                if !c.repo.contains(d)? || !has_blob(&c, &p.name, d).await? {
                    return Err(ApiError::bad(format!(
                        "task {:?}: file {f:?} ({d}) is not in the application repository; upload it to POST /blobs first",
                        t.id
                    )));
                }
            }
        }
        if nj.checkpoint_interval_s.is_some() {
            return Err(ApiError::bad(
                "a task graph takes no checkpoint interval (finished tasks' outputs are kept instead)",
            ));
        }
    }
    let store = c.store.clone();
    let job = blocking(move || store.create_job(&nj)).await?;
    if let Some(hook) = c.hook() {
        let (c2, j2) = (c.clone(), job.clone());
        tokio::task::spawn_blocking(move || hook.submitted(&c2, &j2));
    }
    Ok((StatusCode::CREATED, Json(job)).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    limit: Option<u64>,
}

async fn list_jobs(
    State(c): C,
    Extension(p): P,
    Query(q): Query<ListQuery>,
) -> Result<Json<Vec<Job>>, ApiError> {
    if q.limit == Some(0) {
        return Err(ApiError::bad("limit must be at least 1"));
    }
    let store = c.store.clone();
    let limit = q.limit.unwrap_or(u64::MAX);
    Ok(Json(
        blocking(move || store.jobs_newest(Some(&p.name), limit)).await?,
    ))
}

async fn one_job(
    State(c): C,
    Extension(p): P,
    Path(id): Path<i64>,
) -> Result<Json<JobView>, ApiError> {
    let job = c.owned_job(&p, id, "GET /jobs/{id}").await?;
    let store = c.store.clone();
    let events = blocking(move || store.events(id)).await?;
    Ok(Json(JobView { job, events }))
}

async fn cancel(State(c): C, Extension(p): P, Path(id): Path<i64>) -> Result<Json<Job>, ApiError> {
    c.owned_job(&p, id, "POST /jobs/{id}/cancel").await?;
    let c2 = c.clone();
    let detail = format!("cancelled by {}", p.name);
    let job = blocking(move || c2.transition(id, JobState::Cancelled, &detail)).await?;
    if let Some(hook) = c.hook() {
        let (c2, j2) = (c.clone(), job.clone());
        tokio::task::spawn_blocking(move || hook.cancelled(&c2, &j2));
    }
    Ok(Json(job))
}

async fn read_logs(
    State(c): C,
    Extension(p): P,
    Path(id): Path<i64>,
    Query(q): Query<LogQuery>,
) -> Result<Response, ApiError> {
    c.owned_job(&p, id, "GET /jobs/{id}/logs").await?;
    let max = q.max.unwrap_or(MAX_LOG_READ).clamp(1, MAX_LOG_READ);
    let wait = Duration::from_millis(q.wait_ms.min(MAX_WAIT_MS));
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        // Registered before reading, so an append between the read and the wait wakes us.
        let notified = c.changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let store = c.store.clone();
        let offset = q.offset;
        // The state first: output is stored before the end it precedes, so a final state read
        // here means the log read next is complete.
        let (job, chunk) = blocking(move || {
            let job = store.job(id)?;
            Ok((job, store.read_log(id, offset, max)?))
        })
        .await?;
        if !chunk.data.is_empty()
            || job.state.is_final()
            || offset > chunk.length
            || tokio::time::Instant::now() >= deadline
        {
            let mut r = Response::new(Body::from(chunk.data));
            let hd = r.headers_mut();
            hd.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            hd.insert(LOG_LENGTH_HEADER, HeaderValue::from(chunk.length));
            hd.insert(
                JOB_STATE_HEADER,
                HeaderValue::from_static(job.state.as_str()),
            );
            return Ok(r);
        }
        let _ = tokio::time::timeout_at(deadline, notified).await;
    }
}

async fn append_logs(
    State(c): C,
    Extension(p): P,
    Path(id): Path<i64>,
    body: Bytes,
) -> Result<Json<serde_json::Value>, ApiError> {
    const WHAT: &str = "POST /jobs/{id}/logs";
    // An agent writes only the output of a job running on its own host.
    let store = c.store.clone();
    blocking(move || store.job(id)).await?;
    if !c.hook().is_some_and(|k| k.runs_on(id, &p.name)) {
        c.log_refusal(format!(
            "403 {WHAT}: {p} may not append to job {id}: it is not running on host {}",
            p.name
        ));
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "job {id} is not running on host {}: an agent appends only the output of jobs placed on its host",
                p.name
            ),
        ));
    }
    let c2 = c.clone();
    let n = blocking(move || c2.append_log(id, &body)).await?;
    Ok(Json(serde_json::json!({ "length": n.length })))
}

async fn report(
    c: Arc<Coordinator>,
    p: Principal,
    body: Bytes,
    register: bool,
) -> Result<Json<Registered>, ApiError> {
    let what = if register {
        "POST /agents/register"
    } else {
        "POST /agents/heartbeat"
    };
    let r: HostReport = parse_json(&body, "host report")?;
    if r.name != p.name {
        c.log_refusal(format!("403 {what}: {p} reported for host {:?}", r.name));
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "this token is agent {}'s; it may report only host {}",
                p.name, p.name
            ),
        ));
    }
    r.validate().map_err(ApiError::bad)?;
    let mut r = r;
    // The usage history goes to the coordinator's mirror, not into the stored report.
    let (name, usage) = (r.name.clone(), r.usage.take());
    let addr = r.addr.clone();
    let pinned = c
        .pinned
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&name)
        .cloned();
    let store = c.store.clone();
    // The address the host registered at: pinned in memory, else (a restarted coordinator)
    // the stored report's.
    let (before, host) = blocking(move || {
        let before = match pinned {
            Some(a) => Some(a),
            None => store.host(&r.name)?.map(|h| h.report.addr),
        };
        if register {
            return Ok((before, store.report_host(&r).map(Some)?));
        }
        if before.as_deref().is_some_and(|b| b != r.addr) {
            // Refused before anything is stored.
            return Ok((before, None));
        }
        Ok((before, store.heartbeat_host(&r)?))
    })
    .await?;
    if register {
        if let Some(b) = before.as_deref().filter(|b| *b != addr) {
            c.log_refusal(format!(
                "{what}: {p} registered again, at {addr:?} (was {b:?}): its address is now pinned there"
            ));
        }
    } else if let Some(b) = before.as_deref().filter(|b| *b != addr) {
        c.log_refusal(format!(
            "409 {what}: {p} reported address {addr:?} but registered at {b:?}: refused until it registers again"
        ));
        c.pinned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.clone(), b.to_string());
        return Err(Error::Moved {
            host: name,
            registered: b.to_string(),
            reported: addr,
        }
        .into());
    }
    let Some(host) = host else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "host {} is not registered; POST /agents/register first",
                p.name
            ),
        ));
    };
    c.pinned
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(name.clone(), addr);
    if let Some(u) = &usage {
        c.usage.reported(&name, u);
    }
    Ok(Json(Registered {
        host,
        heartbeat_interval_s: c.heartbeat_interval.as_secs_f64(),
    }))
}

async fn register(State(c): C, Extension(p): P, body: Bytes) -> Result<Json<Registered>, ApiError> {
    report(c, p, body, true).await
}

async fn heartbeat(
    State(c): C,
    Extension(p): P,
    body: Bytes,
) -> Result<Json<Registered>, ApiError> {
    report(c, p, body, false).await
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

async fn hosts(State(c): C) -> Result<Json<Vec<HostView>>, ApiError> {
    let store = c.store.clone();
    let hosts = blocking(move || store.hosts()).await?;
    let lost_after = 3 * c.heartbeat_interval.as_millis() as i64;
    let now = now_ms();
    Ok(Json(
        hosts
            .into_iter()
            .map(|host| HostView {
                alive: now - host.last_seen_ms <= lost_after,
                host,
            })
            .collect(),
    ))
}

/// The `Content-Length` a request declares, if any.
fn content_length(h: &HeaderMap) -> Option<u64> {
    h.get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

async fn upload(
    State(c): C,
    Extension(p): P,
    h: HeaderMap,
    Query(q): Query<UploadQuery>,
    body: Body,
) -> Result<Response, ApiError> {
    let max = c.repo.max_bytes();
    let quota = c.limits.upload_quota;
    let (store, user) = (c.store.clone(), p.name.clone());
    let used = blocking(move || store.blob_usage(&user)).await?;
    let room = quota.saturating_sub(used);
    let over_quota = |size: u64| Error::Quota {
        user: p.name.clone(),
        used,
        size,
        quota,
    };
    // Content the user has already (the client names its digest): not counted again, not
    // stored again; its body is checked against the digest as it comes, and dropped.
    if let Some(d) = q.digest.as_deref().filter(|d| check_digest(d).is_ok()) {
        if c.repo.contains(d)? && has_blob(&c, &p.name, d).await? {
            let size = check_stream(body, d, max).await?;
            let digest = d.to_string();
            return Ok((StatusCode::CREATED, Json(Uploaded { digest, size })).into_response());
        }
    }
    // A declared length over a limit is refused before a byte of the body is read.
    if let Some(n) = content_length(&h) {
        if n > max {
            return Err(Error::TooLarge { size: n, max }.into());
        }
        if n > room {
            return Err(over_quota(n).into());
        }
    }
    let limit = max.min(room);
    let body = axum::body::to_bytes(body, usize::try_from(limit).unwrap_or(usize::MAX))
        .await
        .map_err(|e| {
            let over = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            match () {
                _ if !over => ApiError::bad(format!("cannot read the upload: {e}")),
                _ if limit == max => ApiError::from(Error::TooLarge {
                    size: max.saturating_add(1),
                    max,
                }),
                _ => ApiError::from(over_quota(room.saturating_add(1))),
            }
        })?;
    let repo = c.repo.clone();
    let store = c.store.clone();
    let size = body.len() as u64;
    let owner = p.name.clone();
    // Hashing up to the repository's limit is CPU work: off the async workers.
    let stored = blocking(move || {
        if let Some(d) = &q.digest {
            if let Err(e) = crate::repo::verify(d, &body) {
                return Ok(Err(e));
            }
        }
        let digest = match repo.put(&body) {
            Ok(d) => d,
            Err(e) => return Ok(Err(e)),
        };
        // The quota is checked again with the upload's record, in one store change.
        Ok(Ok((store.add_blob(&owner, &digest, size, quota)?, digest)))
    })
    .await?
    .map_err(|e| {
        let status = match e {
            Error::Invalid(_) => StatusCode::BAD_REQUEST,
            Error::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            _ => StatusCode::UNPROCESSABLE_ENTITY,
        };
        ApiError::new(status, format!("upload refused: {e}"))
    })?;
    let digest = match stored {
        (BlobAdd::OverQuota { used }, _) => {
            return Err(Error::Quota {
                user: p.name,
                used,
                size,
                quota,
            }
            .into())
        }
        (_, d) => d,
    };
    Ok((StatusCode::CREATED, Json(Uploaded { digest, size })).into_response())
}

/// Read `body` to its end, keeping nothing, and check it is the content named `digest`;
/// its length (at most `max` bytes, else 413; another content is 422).
async fn check_stream(body: Body, digest: &str, max: u64) -> Result<u64, ApiError> {
    use http_body_util::BodyExt;
    use sha2::Digest;
    let mut body = body;
    let mut n = 0u64;
    let mut h = sha2::Sha256::new();
    while let Some(f) = body.frame().await {
        let f = f.map_err(|e| ApiError::bad(format!("cannot read the upload: {e}")))?;
        if let Some(b) = f.data_ref() {
            n += b.len() as u64;
            if n > max {
                return Err(Error::TooLarge { size: n, max }.into());
            }
            h.update(b);
        }
    }
    let actual = crate::repo::hex_digest(&h.finalize());
    if actual != digest {
        let e = Error::Tampered {
            expected: digest.to_string(),
            actual,
        };
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("upload refused: {e}"),
        ));
    }
    Ok(n)
}

async fn download(
    State(c): C,
    Extension(p): P,
    Path(digest): Path<String>,
) -> Result<Response, ApiError> {
    check_digest(&digest)?;
    // Agents fetch programs of any job; a user reads only content of theirs, and another
    // user's is answered as absent.
    if p.kind == Kind::User && !has_blob(&c, &p.name, &digest).await? {
        c.log_refusal(format!(
            "404 GET /blobs/{{digest}}: {p} may not read {digest}: not uploaded by them nor kept for their jobs"
        ));
        return Err(Error::NoBlob(digest).into());
    }
    let repo = c.repo.clone();
    let bytes = blocking(move || repo.get(&digest)).await?;
    let mut r = Response::new(Body::from(bytes));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    Ok(r)
}

async fn openapi_doc() -> Json<serde_json::Value> {
    Json(openapi())
}

async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!(
            "no route {method} {}; the API is described at GET /openapi.json",
            uri.path()
        ),
    )
}

/// The API's routes over `c`. Each route's principals are checked by a middleware before
/// its handler (and so before its body is read).
pub fn router(c: Arc<Coordinator>) -> Router {
    use axum::middleware::from_fn_with_state;
    let users = |m: MethodRouter<Arc<Coordinator>>| {
        m.route_layer(from_fn_with_state(c.clone(), users_only))
    };
    let agents = |m: MethodRouter<Arc<Coordinator>>| {
        m.route_layer(from_fn_with_state(c.clone(), agents_only))
    };
    let all =
        |m: MethodRouter<Arc<Coordinator>>| m.route_layer(from_fn_with_state(c.clone(), anyone));
    Router::new()
        .route("/openapi.json", get(openapi_doc))
        .route("/jobs", users(post(submit).get(list_jobs)))
        .route("/jobs/{id}", users(get(one_job)))
        .route("/jobs/{id}/cancel", users(post(cancel)))
        .route(
            "/jobs/{id}/logs",
            users(get(read_logs)).merge(agents(post(append_logs))),
        )
        .route("/agents/register", agents(post(register)))
        .route("/agents/heartbeat", agents(post(heartbeat)))
        .route("/hosts", all(get(hosts)))
        .route("/blobs", users(post(upload)))
        .route("/blobs/{digest}", all(get(download)))
        .fallback(no_route)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::map_response(json_errors))
        .with_state(c)
}

/// Every error answer is `{"error": "..."}`: the rejections of axum's extractors (a malformed
/// path or query, a body over the limit, a method the route does not take) come as text/plain
/// and are rewrapped, keeping their status and other headers (e.g. `Allow`).
async fn json_errors(resp: Response) -> Response {
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, 64 * 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let message = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_string()
    } else {
        text
    };
    let mut out = ApiError::new(status, message).into_response();
    for (k, v) in &parts.headers {
        if k != header::CONTENT_TYPE && k != header::CONTENT_LENGTH {
            out.headers_mut().insert(k.clone(), v.clone());
        }
    }
    out
}

/// The answer to a connection over [`Limits::max_connections`], written without waiting.
fn busy_answer() -> Vec<u8> {
    let body = r#"{"error":"the coordinator serves its maximum of connections; try again later"}"#;
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Serve the API on `listener` until `shutdown` completes, within `c`'s [`Limits`]: a
/// connection whose request header is incomplete after [`Limits::header_read_timeout`] is
/// closed; past [`Limits::max_connections`] a new connection is answered 503 and closed at
/// once. At shutdown no connection is accepted and those open finish their requests.
pub async fn serve(
    listener: tokio::net::TcpListener,
    c: Arc<Coordinator>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let limits = c.limits.clone();
    let app = router(c.clone());
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let busy = busy_answer();
    let mut busy_logged = false;
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    // Out of file descriptors and the like: pass, do not spin.
                    eprintln!("mutirao coordinator: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            // No reading, no waiting: what fits in the socket's buffer, then closed.
            let _ = stream.try_write(&busy);
            if !busy_logged {
                c.log_refusal(format!(
                    "503: {} connections open (--max-connections); refusing new ones until some close",
                    limits.max_connections
                ));
            }
            busy_logged = true;
            continue;
        };
        busy_logged = false;
        let _ = stream.set_nodelay(true);
        let svc = hyper_util::service::TowerToHyperService::new(app.clone());
        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), svc));
        tokio::spawn(async move {
            // A client that goes away or sends nonsense ends its own connection only.
            let _ = conn.await;
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// The OpenAPI 3 document of [`ROUTES`].
pub fn openapi() -> serde_json::Value {
    use serde_json::json;
    let err = |d: &str| json!({ "description": d, "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } });
    let ok_json = |d: &str, schema: serde_json::Value| json!({ "description": d, "content": { "application/json": { "schema": schema } } });
    let id_param = json!({ "name": "id", "in": "path", "required": true, "schema": { "type": "integer", "format": "int64" } });
    let common = |mut responses: serde_json::Value| {
        responses["401"] = err("No token or an unknown one");
        responses["403"] = err("The wrong kind of principal for the route (checked before the body is read), or an agent reporting another host or appending to a job not running on its host");
        responses["400"] = err("Malformed request");
        responses
    };
    let report_body = json!({ "required": true, "content": { "application/json": { "schema": { "$ref": "#/components/schemas/HostReport" } } } });
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "mutirão grid coordinator",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Jobs, their journals and logs, hosts and their agents, and the content-addressed application repository. Every route but /openapi.json needs `Authorization: Bearer <token>`, checked before the request's body is read; users and agents are distinct principals. Another user's job or content is answered 404, as if it did not exist. A request header must be complete within the coordinator's header timeout (10 s by default) and connections past its cap (512 by default) are answered 503."
        },
        "components": {
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
            "schemas": {
                "Error": { "type": "object", "required": ["error"], "properties": { "error": { "type": "string" } } },
                "SubmitRequest": { "type": "object", "required": ["ranks", "program"], "additionalProperties": false, "properties": {
                    "ranks": { "type": "integer", "minimum": 1, "maximum": crate::MAX_RANKS },
                    "program": { "type": "string", "pattern": "^sha256:[0-9a-f]{64}$", "description": "digest of an uploaded program" },
                    "args": { "type": "array", "items": { "type": "string" } },
                    "require": { "type": "string", "nullable": true, "description": "requirement on hosts, e.g. cpu>=2 & site=north" },
                    "checkpoint_interval_s": { "type": "number", "nullable": true, "exclusiveMinimum": true, "minimum": 0 },
                    "dag": { "type": "boolean", "description": "program is the digest of a mutirao-taskgraph/1 document; ranks its number of tasks; args at most the algorithm (hlogp-heft, heft, round-robin)" },
                    "env": { "type": "object", "additionalProperties": { "type": "string" }, "description": "environment variables for every rank (or task); names are a letter or _ followed by letters, digits and _; MUTIRAO_* names are reserved (400)" } } },
                "NewJob": { "type": "object", "properties": {
                    "owner": { "type": "string" }, "ranks": { "type": "integer" }, "program": { "type": "string" },
                    "args": { "type": "array", "items": { "type": "string" } },
                    "require": { "type": "string", "nullable": true }, "checkpoint_interval_s": { "type": "number", "nullable": true },
                    "dag": { "type": "boolean", "description": "a task graph: program is its document's digest, ranks its number of tasks" },
                    "env": { "type": "object", "additionalProperties": { "type": "string" }, "description": "environment variables of every rank" } } },
                "JobState": { "type": "string", "enum": JobState::ALL.iter().map(|s| s.as_str()).collect::<Vec<_>>() },
                "Job": { "type": "object", "properties": {
                    "id": { "type": "integer", "format": "int64" }, "spec": { "$ref": "#/components/schemas/NewJob" },
                    "state": { "$ref": "#/components/schemas/JobState" },
                    "created_ms": { "type": "integer" }, "updated_ms": { "type": "integer" } } },
                "Event": { "type": "object", "properties": {
                    "job": { "type": "integer" }, "seq": { "type": "integer" }, "at_ms": { "type": "integer" },
                    "kind": { "type": "string" }, "to": { "allOf": [{ "$ref": "#/components/schemas/JobState" }], "nullable": true },
                    "detail": { "type": "string" } } },
                "JobView": { "type": "object", "properties": {
                    "job": { "$ref": "#/components/schemas/Job" },
                    "events": { "type": "array", "items": { "$ref": "#/components/schemas/Event" } } } },
                "HostReport": { "type": "object", "required": ["name", "addr", "idle_cpu", "free_mem_mib", "load", "owner_active"], "properties": {
                    "name": { "type": "string" }, "addr": { "type": "string" },
                    "idle_cpu": { "type": "number", "minimum": 0 }, "free_mem_mib": { "type": "integer", "minimum": 0 },
                    "load": { "type": "number", "minimum": 0 }, "owner_active": { "type": "boolean" },
                    "owner": { "type": "string", "enum": ["available", "suspend", "vacate"], "description": "The owner policy's decision (default available)" },
                    "owner_why": { "type": "string", "description": "Why, when not available" },
                    "props": { "type": "object", "additionalProperties": { "type": "string" }, "description": "Properties the agent declares (site, arch, …)" },
                    "jobs": { "type": "array", "maxItems": crate::model::MAX_REPORTED_JOBS, "description": "Optional. The grid jobs whose ranks the agent runs or ran within the last hour, per job and run (its rank journal): a restarted coordinator reconciles its jobs with them",
                        "items": { "$ref": "#/components/schemas/JobRanks" } },
                    "usage": { "$ref": "#/components/schemas/UsageReport" } } },
                "JobRanks": { "type": "object", "required": ["job", "run"], "properties": {
                    "job": { "type": "integer", "format": "int64" }, "run": { "type": "integer", "minimum": 0 },
                    "alive": { "type": "array", "items": { "type": "integer", "minimum": 0 }, "description": "ranks alive on the host" },
                    "exits": { "type": "array", "items": { "$ref": "#/components/schemas/RankExit" }, "description": "ranks that ended within the last hour" } } },
                "RankExit": { "type": "object", "required": ["rank"], "properties": {
                    "rank": { "type": "integer", "minimum": 0 }, "incarnation": { "type": "integer", "minimum": 0 },
                    "code": { "type": "integer", "nullable": true }, "signal": { "type": "integer", "nullable": true },
                    "ended_ms": { "type": "integer" } } },
                "UsageBucket": { "type": "object", "required": ["samples", "idle"], "properties": {
                    "samples": { "type": "number", "minimum": 0 }, "idle": { "type": "number", "minimum": 0 } } },
                "UsageReport": { "type": "object", "required": ["hour", "now"], "description": "Optional. The agent's usage history: the hour of the week in its local time (0 = Monday 00:00), that hour's bucket, and at registration and the first report of each hour all 168 buckets",
                    "properties": {
                        "hour": { "type": "integer", "minimum": 0, "maximum": crate::usage::HOURS - 1 },
                        "now": { "$ref": "#/components/schemas/UsageBucket" },
                        "history": { "type": "array", "minItems": crate::usage::HOURS, "maxItems": crate::usage::HOURS, "items": { "$ref": "#/components/schemas/UsageBucket" } } } },
                "Host": { "type": "object", "properties": {
                    "report": { "$ref": "#/components/schemas/HostReport" }, "last_seen_ms": { "type": "integer" } } },
                "HostView": { "type": "object", "properties": {
                    "report": { "$ref": "#/components/schemas/HostReport" }, "last_seen_ms": { "type": "integer" }, "alive": { "type": "boolean" } } },
                "Registered": { "type": "object", "properties": {
                    "host": { "$ref": "#/components/schemas/Host" }, "heartbeat_interval_s": { "type": "number" } } },
                "Uploaded": { "type": "object", "properties": { "digest": { "type": "string" }, "size": { "type": "integer" } } }
            }
        },
        "security": [ { "bearer": [] } ],
        "paths": {
            "/openapi.json": { "get": { "summary": "This document", "security": [], "responses": { "200": { "description": "OpenAPI 3 document", "content": { "application/json": {} } } } } },
            "/jobs": {
                "post": { "summary": "Submit a job (users)", "requestBody": { "required": true, "content": { "application/json": { "schema": { "$ref": "#/components/schemas/SubmitRequest" } } } },
                    "responses": common(json!({ "201": ok_json("The job, waiting", json!({ "$ref": "#/components/schemas/Job" })) })) },
                "get": { "summary": "My jobs, newest first (users); the newest `limit` if given",
                    "parameters": [{ "name": "limit", "in": "query", "required": false, "schema": { "type": "integer", "minimum": 1 } }],
                    "responses": common(json!({ "200": ok_json("Jobs", json!({ "type": "array", "items": { "$ref": "#/components/schemas/Job" } })) })) }
            },
            "/jobs/{id}": { "get": { "summary": "One of my jobs with its journal", "parameters": [id_param.clone()],
                "responses": common(json!({ "200": ok_json("The job and its events", json!({ "$ref": "#/components/schemas/JobView" })), "404": err("No such job (another user's job is answered the same)") })) } },
            "/jobs/{id}/cancel": { "post": { "summary": "Cancel one of my jobs", "parameters": [id_param.clone()],
                "responses": common(json!({ "200": ok_json("The job, cancelled", json!({ "$ref": "#/components/schemas/Job" })), "404": err("No such job"), "409": err("Already finished, failed or cancelled") })) } },
            "/jobs/{id}/logs": {
                "get": { "summary": "Read one of my job's output from a byte offset; long-polls up to wait_ms for new output",
                    "parameters": [id_param.clone(),
                        { "name": "offset", "in": "query", "schema": { "type": "integer", "minimum": 0 } },
                        { "name": "max", "in": "query", "schema": { "type": "integer", "minimum": 1, "maximum": MAX_LOG_READ } },
                        { "name": "wait_ms", "in": "query", "schema": { "type": "integer", "minimum": 0, "maximum": MAX_WAIT_MS } }],
                    "responses": common(json!({ "200": { "description": "Output bytes from offset; headers give the log's length and the job's state",
                        "headers": { "x-mutirao-log-length": { "schema": { "type": "integer" } }, "x-mutirao-job-state": { "schema": { "$ref": "#/components/schemas/JobState" } } },
                        "content": { "application/octet-stream": { "schema": { "type": "string", "format": "binary" } } } }, "404": err("No such job") })) },
                "post": { "summary": "Append output to a job's log (agents)", "parameters": [id_param],
                    "requestBody": { "required": true, "content": { "application/octet-stream": { "schema": { "type": "string", "format": "binary" } } } },
                    "responses": common(json!({ "200": ok_json("The log's new length", json!({ "type": "object", "properties": { "length": { "type": "integer" } } })), "404": err("No such job"), "413": err("Too large") })) }
            },
            "/agents/register": { "post": { "summary": "An agent registers its host with a resource report (agents; the host name is the agent's)", "requestBody": report_body.clone(),
                "responses": common(json!({ "200": ok_json("Registered", json!({ "$ref": "#/components/schemas/Registered" })) })) } },
            "/agents/heartbeat": { "post": { "summary": "An agent's heartbeat with a resource report", "requestBody": report_body,
                "responses": common(json!({ "200": ok_json("Recorded", json!({ "$ref": "#/components/schemas/Registered" })), "404": err("Not registered"), "409": err("The report's address is not the one the host registered at (register again to move)") })) } },
            "/hosts": { "get": { "summary": "Hosts known, with their last report and whether they are alive",
                "responses": common(json!({ "200": ok_json("Hosts", json!({ "type": "array", "items": { "$ref": "#/components/schemas/HostView" } })) })) } },
            "/blobs": { "post": { "summary": "Upload a program or input to the application repository (users); named by its SHA-256 digest",
                "parameters": [{ "name": "digest", "in": "query", "required": false, "description": "the digest the client computed; a mismatch refuses the upload", "schema": { "type": "string" } }],
                "requestBody": { "required": true, "content": { "application/octet-stream": { "schema": { "type": "string", "format": "binary" } } } },
                "responses": common(json!({ "201": ok_json("Stored", json!({ "$ref": "#/components/schemas/Uploaded" })), "413": err("Too large"), "422": err("Content does not match the digest given"), "507": err("The user's uploads would exceed their quota") })) } },
            "/blobs/{digest}": { "get": { "summary": "Download content by digest (verify it before use): agents any, users their own",
                "parameters": [{ "name": "digest", "in": "path", "required": true, "schema": { "type": "string", "pattern": "^sha256:[0-9a-f]{64}$" } }],
                "responses": common(json!({ "200": { "description": "The content", "content": { "application/octet-stream": { "schema": { "type": "string", "format": "binary" } } } }, "404": err("Not in the repository, or (a user) neither uploaded by them nor kept for their jobs") })) } }
        }
    })
}

/// Bind `listen`, call `ready` with the address bound (port 0 picks a free one), and serve
/// until SIGINT or SIGTERM, on a runtime of its own. Blocks.
pub fn serve_blocking(
    listen: std::net::SocketAddr,
    c: Arc<Coordinator>,
    ready: impl FnOnce(std::net::SocketAddr),
) -> std::io::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen).await.map_err(|e| {
            std::io::Error::new(e.kind(), format!("cannot listen on {listen}: {e}"))
        })?;
        ready(listener.local_addr()?);
        let stop = async {
            let term = async {
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(mut s) => {
                        s.recv().await;
                    }
                    Err(_) => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {},
                _ = term => {},
            }
        };
        serve(listener, c, stop).await
    })
}
