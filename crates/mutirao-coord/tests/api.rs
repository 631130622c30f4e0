//! The coordinator's HTTP API, driven in process with `tower::ServiceExt::oneshot` (no
//! sockets): submission and its journal, cancel, logs with long-poll, agents and hosts, the
//! application repository, 401/403 refusals that are logged and change nothing, an OpenAPI
//! document that lists every route, and arbitrary bodies that never get a 5xx.

use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use mutirao_coord::api::{self, Coordinator, JobView, Registered, Uploaded};
use mutirao_coord::auth::{Kind, Tokens};
use mutirao_coord::{HostReport, Job, JobState, Repo, SqliteStore};
use proptest::prelude::*;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower::ServiceExt;

mod common;

const ANA: &str = "ana-token-0123456789";
const BIA: &str = "bia-token-0123456789";
const N1: &str = "n1-agent-token-012345";

struct T {
    c: Arc<Coordinator>,
    rt: tokio::runtime::Runtime,
    dir: std::path::PathBuf,
}

impl Drop for T {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn setup(tag: &str) -> T {
    setup_with(tag, Arc::new(SqliteStore::open_in_memory().unwrap()))
}

fn setup_with(tag: &str, store: Arc<dyn mutirao_coord::Store>) -> T {
    let dir = std::env::temp_dir().join(format!("mutirao-api-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut tokens = Tokens::new();
    tokens.add(Kind::User, "ana", ANA).unwrap();
    tokens.add(Kind::User, "bia", BIA).unwrap();
    tokens.add(Kind::Agent, "n1", N1).unwrap();
    let repo = Repo::open(&dir.join("repo"), 4096).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    T {
        c: Coordinator::new(store, tokens, repo),
        rt,
        dir,
    }
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Answer {
    fn json<V: serde::de::DeserializeOwned>(&self) -> V {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl T {
    fn call(
        &self,
        method: &str,
        uri: &str,
        token: Option<&str>,
        body: impl Into<Vec<u8>>,
    ) -> Answer {
        let mut b = Request::builder().method(method).uri(uri);
        if let Some(t) = token {
            b = b.header("authorization", format!("Bearer {t}"));
        }
        let req = b.body(Body::from(body.into())).unwrap();
        let app = api::router(self.c.clone());
        self.rt.block_on(async move {
            let r = tokio::time::timeout(Duration::from_secs(20), app.oneshot(req))
                .await
                .expect("answered within 20 s")
                .unwrap();
            let status = r.status();
            let headers = r.headers().clone();
            let body = r.into_body().collect().await.unwrap().to_bytes().to_vec();
            Answer {
                status,
                headers,
                body,
            }
        })
    }

    fn upload(&self, bytes: &[u8]) -> String {
        self.upload_as(ANA, bytes)
    }

    fn upload_as(&self, token: &str, bytes: &[u8]) -> String {
        let a = self.call("POST", "/blobs", Some(token), bytes.to_vec());
        assert_eq!(a.status, StatusCode::CREATED, "{}", a.text());
        a.json::<Uploaded>().digest
    }

    fn submit(&self, token: &str, program: &str) -> Answer {
        let body = serde_json::json!({ "ranks": 4, "program": program, "args": ["--n", "300"],
            "require": "cpu>=2", "checkpoint_interval_s": 30.0 });
        self.call("POST", "/jobs", Some(token), body.to_string())
    }
}

fn report(name: &str) -> String {
    serde_json::to_string(&HostReport {
        name: name.into(),
        addr: "127.0.0.1:7207".into(),
        idle_cpu: 1.5,
        free_mem_mib: 2048,
        load: 0.5,
        owner_active: false,
        ..Default::default()
    })
    .unwrap()
}

#[test]
fn a_user_submits_lists_reads_and_cancels_a_job_and_the_journal_tells_it() {
    let t = setup("submit");
    let prog = t.upload(b"#!/bin/sh\necho hi\n");
    let a = t.submit(ANA, &prog);
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.text());
    let job: Job = a.json();
    assert_eq!(job.state, JobState::Waiting);
    assert_eq!(job.spec.owner, "ana");
    assert_eq!(job.spec.ranks, 4);
    // bia's job is not in ana's list.
    assert_eq!(t.upload_as(BIA, b"#!/bin/sh\necho hi\n"), prog);
    assert_eq!(t.submit(BIA, &prog).status, StatusCode::CREATED);
    let mine: Vec<Job> = t.call("GET", "/jobs", Some(ANA), "").json();
    assert_eq!(mine.iter().map(|j| j.id).collect::<Vec<_>>(), [job.id]);
    let newer: Job = t.submit(ANA, &prog).json();
    let one: Vec<Job> = t.call("GET", "/jobs?limit=1", Some(ANA), "").json();
    assert_eq!(one.iter().map(|j| j.id).collect::<Vec<_>>(), [newer.id]);
    assert_eq!(
        t.call("GET", "/jobs?limit=0", Some(ANA), "").status,
        StatusCode::BAD_REQUEST
    );

    let a = t.call("POST", &format!("/jobs/{}/cancel", job.id), Some(ANA), "");
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    assert_eq!(a.json::<Job>().state, JobState::Cancelled);
    let again = t.call("POST", &format!("/jobs/{}/cancel", job.id), Some(ANA), "");
    assert_eq!(again.status, StatusCode::CONFLICT, "{}", again.text());
    assert!(
        again.text().contains("cannot become cancelled"),
        "{}",
        again.text()
    );

    let v: JobView = t
        .call("GET", &format!("/jobs/{}", job.id), Some(ANA), "")
        .json();
    let story: Vec<&str> = v.events.iter().map(|e| e.detail.as_str()).collect();
    assert_eq!(story, ["submitted", "cancelled by ana"]);
    assert_eq!(
        t.call("GET", "/jobs/999", Some(ANA), "").status,
        StatusCode::NOT_FOUND
    );
}

#[test]
fn the_api_works_the_same_over_postgresql() {
    let server = match common::pg::PgServer::start("api") {
        Ok(s) => s,
        Err(why) => {
            println!("skipped: cannot start a PostgreSQL server: {why}");
            return;
        }
    };
    let store = Arc::new(mutirao_coord::PgStore::connect(&server.fresh_db()).unwrap());
    let t = setup_with("pg", store);
    let prog = t.upload(b"prog");
    let job: Job = t.submit(ANA, &prog).json();
    assert_eq!(t.upload_as(BIA, b"prog"), prog);
    assert_eq!(t.submit(BIA, &prog).status, StatusCode::CREATED);
    let mine: Vec<Job> = t.call("GET", "/jobs", Some(ANA), "").json();
    assert_eq!(mine.iter().map(|j| j.id).collect::<Vec<_>>(), [job.id]);
    let logs = format!("/jobs/{}/logs", job.id);
    t.c.set_hook(Arc::new(RunsOnN1(job.id)));
    t.call("POST", &logs, Some(N1), "out\n");
    assert_eq!(t.call("GET", &logs, Some(ANA), "").text(), "out\n");
    assert_eq!(
        t.call("POST", "/agents/register", Some(N1), report("n1"))
            .status,
        StatusCode::OK
    );
    let a = t.call("POST", &format!("/jobs/{}/cancel", job.id), Some(ANA), "");
    assert_eq!(a.json::<Job>().state, JobState::Cancelled);
    let v: JobView = t
        .call("GET", &format!("/jobs/{}", job.id), Some(ANA), "")
        .json();
    assert_eq!(v.events.len(), 2);
    assert_eq!(
        t.call(
            "POST",
            "/jobs",
            Some(ANA),
            r#"{"ranks":1,"program":"x\u0000"}"#
        )
        .status,
        StatusCode::BAD_REQUEST
    );
}

#[test]
fn submissions_naming_no_uploaded_program_or_nonsense_are_refused_with_a_reason() {
    let t = setup("badsubmit");
    let prog = t.upload(b"prog");
    let absent = mutirao_coord::repo::digest_of(b"never uploaded");
    let a = t.submit(ANA, &absent);
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert!(
        a.text().contains("upload it to POST /blobs first"),
        "{}",
        a.text()
    );
    let a = t.submit(ANA, "./matmul");
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert!(a.text().contains("not a content digest"), "{}", a.text());
    for body in [
        serde_json::json!({ "ranks": 0, "program": prog }).to_string(),
        serde_json::json!({ "ranks": 2, "program": prog, "checkpoint_interval_s": -1 }).to_string(),
        serde_json::json!({ "ranks": 2, "program": prog, "args": ["a\u{0}b"] }).to_string(),
        serde_json::json!({ "ranks": 2, "program": prog, "owner": "bia" }).to_string(),
        serde_json::json!({ "ranks": 2, "program": prog, "env": { "MUTIRAO_RANK": "3" } })
            .to_string(),
        serde_json::json!({ "ranks": 2, "program": prog, "env": { "1X": "a" } }).to_string(),
        serde_json::json!({ "ranks": 2, "program": prog, "env": { "X": 1 } }).to_string(),
        "{\"ranks\": 2".to_string(),
    ] {
        let a = t.call("POST", "/jobs", Some(ANA), body.clone());
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{body}: {}", a.text());
        assert!(a.json::<serde_json::Value>()["error"].is_string());
    }
    assert!(t.c.store().jobs(None).unwrap().is_empty());
    // A reserved name is named in the refusal, with what to do.
    let body = serde_json::json!({ "ranks": 1, "program": prog, "env": { "MUTIRAO_X": "1" } });
    let a = t.call("POST", "/jobs", Some(ANA), body.to_string());
    assert!(
        a.text().contains("MUTIRAO_X") && a.text().contains("reserved"),
        "{}",
        a.text()
    );
    // A good environment is stored with the job and given back.
    let body =
        serde_json::json!({ "ranks": 1, "program": prog, "env": { "GREETING": "olá", "_X1": "" } });
    let a = t.call("POST", "/jobs", Some(ANA), body.to_string());
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.text());
    let j: mutirao_coord::Job = a.json();
    let stored = t.c.store().job(j.id).unwrap();
    assert_eq!(
        stored.spec.env.get("GREETING").map(String::as_str),
        Some("olá")
    );
    assert_eq!(stored.spec.env.len(), 2);
}

#[test]
fn task_graph_submissions_are_checked_by_the_coordinator_too() {
    let t = setup("dagsubmit");
    let good = r#"{ "format": "mutirao-taskgraph/1",
        "tasks": [ { "id": "a", "work": 1, "cmd": ["sh", "-c", "echo 1 > x"], "outputs": ["x"] },
                   { "id": "b", "work": 1, "cmd": ["cat", "x"] } ],
        "edges": [ { "from": "a", "to": "b", "bytes": 2, "files": ["x"] } ] }"#;
    let bad = good.replace(r#""files": ["x"]"#, r#""files": ["y"]"#);
    let sub = |program: &str, ranks: u32, args: &[&str]| {
        let body =
            serde_json::json!({ "ranks": ranks, "program": program, "args": args, "dag": true });
        t.call("POST", "/jobs", Some(ANA), body.to_string())
    };
    let bad = t.upload(bad.as_bytes());
    let a = sub(&bad, 2, &[]);
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert!(
        a.text()
            .contains("edge 1 (a -> b): file \\\"y\\\" is not among task"),
        "{}",
        a.text()
    );
    let not_json = t.upload(b"#!/bin/sh\n");
    assert_eq!(sub(&not_json, 1, &[]).status, StatusCode::BAD_REQUEST);
    let good = t.upload(good.as_bytes());
    let a = sub(&good, 3, &[]);
    assert!(
        a.text().contains("has 2 tasks but the submission says 3"),
        "{}",
        a.text()
    );
    let absent = mutirao_coord::repo::digest_of(b"never uploaded");
    let with_file = t.upload(
        String::from_utf8(t.c.repo().get(&good).unwrap())
            .unwrap()
            .replace(
                r#""cmd": ["cat", "x"]"#,
                &format!(r#""cmd": ["./tool"], "files": {{ "tool": "{absent}" }}"#),
            )
            .as_bytes(),
    );
    let a = sub(&with_file, 2, &[]);
    assert!(
        a.text().contains("task \\\"b\\\": file \\\"tool\\\"")
            && a.text().contains("upload it to POST /blobs first"),
        "{}",
        a.text()
    );
    let a = sub(&good, 2, &["peft"]);
    assert!(
        a.text().contains("use hlogp-heft, heft or round-robin"),
        "{}",
        a.text()
    );
    assert!(t.c.store().jobs(None).unwrap().is_empty());
    let a = sub(&good, 2, &["heft"]);
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.text());
    let j: mutirao_coord::Job = a.json();
    assert!(j.spec.dag && j.spec.ranks == 2 && j.spec.args == ["heft"]);
}

#[test]
fn unauthenticated_and_wrong_principal_requests_are_refused_logged_and_change_nothing() {
    let t = setup("auth");
    let prog = t.upload(b"prog");
    let job: Job = t.submit(ANA, &prog).json();
    let before = t.c.store().events(job.id).unwrap();

    let a = t.call("GET", "/jobs", None, "");
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    assert!(a.text().contains("Authorization: Bearer"), "{}", a.text());
    let a = t.call(
        "POST",
        &format!("/jobs/{}/cancel", job.id),
        Some("not-a-known-token-at-all"),
        "",
    );
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    // Another user's job: not seen, not cancelled, not its logs — and answered exactly as
    // a job that does not exist, so its id tells bia nothing.
    for (m, p) in [
        ("GET", format!("/jobs/{}", job.id)),
        ("POST", format!("/jobs/{}/cancel", job.id)),
        ("GET", format!("/jobs/{}/logs", job.id)),
    ] {
        let a = t.call(m, &p, Some(BIA), "");
        let none = t.call(m, &p.replace(&job.id.to_string(), "424242"), Some(BIA), "");
        assert_eq!(a.status, StatusCode::NOT_FOUND, "{m} {p}");
        assert_eq!(none.status, StatusCode::NOT_FOUND, "{m} {p}");
        assert_eq!(
            a.text(),
            none.text().replace("424242", &job.id.to_string()),
            "{m} {p}"
        );
    }
    // An agent may not submit or cancel; a user may not heartbeat or append logs.
    assert_eq!(t.submit(N1, &prog).status, StatusCode::FORBIDDEN);
    assert_eq!(
        t.call("POST", &format!("/jobs/{}/cancel", job.id), Some(N1), "")
            .status,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        t.call("POST", "/agents/register", Some(ANA), report("n1"))
            .status,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        t.call(
            "POST",
            &format!("/jobs/{}/logs", job.id),
            Some(ANA),
            "forged"
        )
        .status,
        StatusCode::FORBIDDEN
    );
    // An agent reports only its own host.
    let a = t.call("POST", "/agents/register", Some(N1), report("n2"));
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    assert!(a.text().contains("only host n1"), "{}", a.text());

    assert_eq!(t.c.store().job(job.id).unwrap().state, JobState::Waiting);
    assert_eq!(t.c.store().events(job.id).unwrap(), before);
    assert!(t.c.store().hosts().unwrap().is_empty());
    assert_eq!(t.c.store().read_log(job.id, 0, 100).unwrap().length, 0);
    let audit = t.c.audit();
    assert_eq!(audit.len(), 10, "{audit:#?}");
    assert!(audit[0].starts_with("401 GET /jobs"), "{audit:#?}");
    assert!(
        audit
            .iter()
            .any(|l| l.contains("user bia may not touch job") && l.contains("(ana's)")),
        "{audit:#?}"
    );
}

/// What the dispatcher would say: `job` runs on host n1, nothing else runs anywhere.
struct RunsOnN1(i64);

impl mutirao_coord::api::JobHook for RunsOnN1 {
    fn submitted(&self, _: &Arc<Coordinator>, _: &Job) {}
    fn cancelled(&self, _: &Arc<Coordinator>, _: &Job) {}
    fn runs_on(&self, job: i64, host: &str) -> bool {
        job == self.0 && host == "n1"
    }
}

#[test]
fn logs_are_appended_by_agents_and_read_from_an_offset_with_long_poll() {
    let t = setup("logs");
    let prog = t.upload(b"prog");
    let job: Job = t.submit(ANA, &prog).json();
    let logs = format!("/jobs/{}/logs", job.id);
    // Not running on n1 (nothing runs without a dispatcher): n1's agent may not write.
    let a = t.call("POST", &logs, Some(N1), "forged\n");
    assert_eq!(a.status, StatusCode::FORBIDDEN, "{}", a.text());
    assert!(
        a.text().contains("is not running on host n1"),
        "{}",
        a.text()
    );
    assert_eq!(t.c.store().read_log(job.id, 0, 100).unwrap().length, 0);
    assert!(
        t.c.audit()
            .iter()
            .any(|l| l.starts_with("403 POST /jobs/{id}/logs") && l.contains("may not append")),
        "{:#?}",
        t.c.audit()
    );
    t.c.set_hook(Arc::new(RunsOnN1(job.id)));
    // Another job, not placed on n1: refused too.
    let other: Job = t.submit(ANA, &prog).json();
    let a = t.call("POST", &format!("/jobs/{}/logs", other.id), Some(N1), "x");
    assert_eq!(a.status, StatusCode::FORBIDDEN, "{}", a.text());
    let a = t.call("POST", &logs, Some(N1), "rank 0: hello\n");
    assert_eq!(a.json::<serde_json::Value>()["length"], 14);
    t.call("POST", &logs, Some(N1), "rank 1: hello\n");
    let a = t.call("GET", &format!("{logs}?offset=8"), Some(ANA), "");
    assert_eq!(a.text(), "hello\nrank 1: hello\n");
    assert_eq!(a.headers["x-mutirao-log-length"], "28");
    assert_eq!(a.headers["x-mutirao-job-state"], "waiting");
    let a = t.call("GET", &format!("{logs}?offset=0&max=5"), Some(ANA), "");
    assert_eq!(a.text(), "rank ");

    // Nothing new: a long-poll waits its full time, then answers empty.
    let t0 = Instant::now();
    let a = t.call(
        "GET",
        &format!("{logs}?offset=28&wait_ms=300"),
        Some(ANA),
        "",
    );
    assert!(a.body.is_empty());
    assert!(
        t0.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t0.elapsed()
    );

    // Output that comes during the wait ends it at once.
    let c = t.c.clone();
    let id = job.id;
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        c.append_log(id, b"rank 2: late\n").unwrap();
    });
    let t0 = Instant::now();
    let a = t.call(
        "GET",
        &format!("{logs}?offset=28&wait_ms=10000"),
        Some(ANA),
        "",
    );
    writer.join().unwrap();
    assert_eq!(a.text(), "rank 2: late\n");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());

    // A job that ended: a follower is answered at once.
    t.c.transition(job.id, JobState::Cancelled, "test").unwrap();
    let t0 = Instant::now();
    let a = t.call(
        "GET",
        &format!("{logs}?offset=41&wait_ms=10000"),
        Some(ANA),
        "",
    );
    assert!(a.body.is_empty());
    assert_eq!(a.headers["x-mutirao-job-state"], "cancelled");
    assert!(t0.elapsed() < Duration::from_secs(5));

    for bad in ["?offset=-1", "?wait_ms=x", "?nonsense=1"] {
        let a = t.call("GET", &format!("{logs}{bad}"), Some(ANA), "");
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{bad}: {}", a.text());
    }
}

#[test]
fn an_agent_s_usage_history_reaches_the_coordinator_s_mirror_not_the_stored_report() {
    use mutirao_coord::usage::Keeper;
    let t = setup("usage");
    let mut k = Keeper::default();
    for _ in 0..9 {
        k.sample(7, true);
    }
    let mut r: serde_json::Value = serde_json::from_str(&report("n1")).unwrap();
    // The first report of an hour carries the whole history.
    r["usage"] = serde_json::to_value(k.sample(8, false)).unwrap();
    let a = t.call("POST", "/agents/register", Some(N1), r.to_string());
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    // Then this hour's bucket only.
    r["usage"] = serde_json::to_value(k.sample(8, false)).unwrap();
    assert!(r["usage"].get("history").is_none());
    let a = t.call("POST", "/agents/heartbeat", Some(N1), r.to_string());
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    let h = t.c.usage().snapshot();
    assert_eq!(h.hosts["n1"].buckets[7].samples, 9.0);
    assert_eq!(h.hosts["n1"].buckets[8].samples, 2.0);
    assert_eq!(h.hour["n1"], 8);
    let stored = t.c.store().host("n1").unwrap().unwrap();
    assert!(stored.report.usage.is_none(), "kept out of the database");
    // A history that no agent could have kept is refused.
    r["usage"]["hour"] = serde_json::json!(400);
    let a = t.call("POST", "/agents/heartbeat", Some(N1), r.to_string());
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert!(a.text().contains("hour of the week"), "{}", a.text());
}

#[test]
fn agents_register_then_heartbeat_and_hosts_are_listed_alive() {
    let t = setup("agents");
    let a = t.call("POST", "/agents/heartbeat", Some(N1), report("n1"));
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    assert!(a.text().contains("register first"), "{}", a.text());
    let a = t.call("POST", "/agents/register", Some(N1), report("n1"));
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    let r: Registered = a.json();
    assert_eq!(r.heartbeat_interval_s, 5.0);
    let a = t.call("POST", "/agents/heartbeat", Some(N1), report("n1"));
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    let hosts: serde_json::Value = t.call("GET", "/hosts", Some(ANA), "").json();
    assert_eq!(hosts[0]["report"]["name"], "n1");
    assert_eq!(hosts[0]["alive"], true);
    let mut bad: serde_json::Value = serde_json::from_str(&report("n1")).unwrap();
    bad["load"] = serde_json::json!(-3.0);
    let a = t.call("POST", "/agents/heartbeat", Some(N1), bad.to_string());
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert!(a.text().contains("non-negative"), "{}", a.text());
}

#[test]
fn the_repository_serves_content_by_digest_and_refuses_tampered_or_oversized_content() {
    let t = setup("repo");
    let d = t.upload(b"the program");
    let a = t.call("GET", &format!("/blobs/{d}"), Some(N1), "");
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.body, b"the program");
    mutirao_coord::verify(&d, &a.body).unwrap();
    // The client names the digest it computed: a transfer that altered the bytes is refused.
    let a = t.call(
        "POST",
        &format!("/blobs?digest={d}"),
        Some(ANA),
        "the pr0gram",
    );
    assert_eq!(a.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(a.text().contains("altered or corrupted"), "{}", a.text());
    let a = t.call("POST", "/blobs", Some(ANA), vec![0u8; 5000]);
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", a.text());
    assert_eq!(
        t.call("GET", "/blobs/sha256:nothex", Some(ANA), "").status,
        StatusCode::BAD_REQUEST
    );
    let absent = mutirao_coord::repo::digest_of(b"x");
    assert_eq!(
        t.call("GET", &format!("/blobs/{absent}"), Some(ANA), "")
            .status,
        StatusCode::NOT_FOUND
    );
    // Someone alters the stored file: the coordinator will not hand it out.
    std::fs::write(t.dir.join("repo").join(&d["sha256:".len()..]), b"evil").unwrap();
    let a = t.call("GET", &format!("/blobs/{d}"), Some(N1), "");
    assert!(a.text().contains("altered or corrupted"), "{}", a.text());
    assert_ne!(a.status, StatusCode::OK);
}

#[test]
fn uploads_larger_than_a_json_body_are_taken_up_to_the_repository_limit() {
    let dir = std::env::temp_dir().join(format!("mutirao-api-{}-big", std::process::id()));
    let mut t = setup("big");
    t.c = Coordinator::new(
        Arc::new(SqliteStore::open_in_memory().unwrap()),
        {
            let mut k = Tokens::new();
            k.add(Kind::User, "ana", ANA).unwrap();
            k
        },
        Repo::open(&dir.join("repo"), 4 << 20).unwrap(),
    );
    let big = vec![7u8; 3 << 20]; // more than api::MAX_BODY, less than the repository's limit
    assert!(big.len() > api::MAX_BODY);
    let a = t.call("POST", "/blobs", Some(ANA), big.clone());
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.text());
    let d = a.json::<Uploaded>().digest;
    assert_eq!(
        t.call("GET", &format!("/blobs/{d}"), Some(ANA), "").body,
        big
    );
    let a = t.call("POST", "/blobs", Some(ANA), vec![0u8; 5 << 20]);
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_openapi_document_describes_every_route_and_only_those() {
    let t = setup("openapi");
    let a = t.call("GET", "/openapi.json", None, "");
    assert_eq!(a.status, StatusCode::OK);
    let doc: serde_json::Value = a.json();
    assert_eq!(doc, api::openapi());
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let paths = doc["paths"].as_object().unwrap();
    let mut documented = Vec::new();
    for (p, ops) in paths {
        for m in ops.as_object().unwrap().keys() {
            documented.push((m.to_uppercase(), p.clone()));
        }
    }
    let mut routes: Vec<(String, String)> = api::ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    documented.sort();
    routes.sort();
    assert_eq!(documented, routes);
    // Every listed route is served (a path the router lacks gets "no route ...").
    for (m, p) in api::ROUTES {
        let uri = p
            .replace("{id}", "1")
            .replace("{digest}", &mutirao_coord::repo::digest_of(b"x"));
        let a = t.call(m, &uri, Some(ANA), "");
        assert!(!a.text().contains("no route"), "{m} {p}: {}", a.text());
        assert_ne!(a.status, StatusCode::METHOD_NOT_ALLOWED, "{m} {p}");
    }
    let a = t.call("GET", "/nowhere", Some(ANA), "");
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    assert!(a.text().contains("no route GET /nowhere"), "{}", a.text());
}

#[test]
fn malformed_paths_and_queries_get_json_errors_found_by_schemathesis() {
    let t = setup("rejections");
    for (m, uri) in [
        ("GET", "/jobs?limit=null&limit=null"),
        ("GET", "/jobs/abc"),
        ("GET", "/jobs/1/logs?offset=-1"),
        ("POST", "/blobs?name=%ZZ"),
        ("DELETE", "/jobs"),
    ] {
        let a = t.call(m, uri, Some(ANA), Vec::new());
        assert!(a.status.is_client_error(), "{m} {uri}: {}", a.status);
        let ct = a.headers["content-type"].to_str().unwrap().to_string();
        assert!(
            ct.starts_with("application/json"),
            "{m} {uri}: {ct}: {}",
            a.text()
        );
        let v: serde_json::Value = a.json();
        assert!(
            v["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{m} {uri}: {v}"
        );
    }
    // A method a route does not take keeps its Allow header.
    let a = t.call("DELETE", "/jobs", Some(ANA), Vec::new());
    assert_eq!(a.status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(a.headers.contains_key("allow"), "{:?}", a.headers);
}

fn token_for(method: &str, path: &str) -> &'static str {
    match (method, path) {
        ("POST", "/jobs/{id}/logs")
        | ("POST", "/agents/register")
        | ("POST", "/agents/heartbeat") => N1,
        _ => ANA,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn arbitrary_requests_to_every_route_get_no_5xx(
        body in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..300),
            "\\PC{0,200}".prop_map(String::into_bytes),
            Just(br#"{"ranks": 4294967296, "program": "sha256:00"}"#.to_vec()),
            Just(br#"{"name":"n1","addr":"a","idle_cpu":1e309,"free_mem_mib":-1,"load":0,"owner_active":false}"#.to_vec()),
            Just(br#"{"name":"n1","addr":"\u0000","idle_cpu":1,"free_mem_mib":18446744073709551615,"load":0,"owner_active":false}"#.to_vec()),
        ],
        id in prop_oneof![Just("1".to_string()), Just("-1".to_string()), Just("99999999999999999999".to_string()), "[a-z%0-9]{0,12}"],
        query in prop_oneof![Just(String::new()), "\\?[a-z_=&%0-9-]{0,30}"],
    ) {
        let t = setup("fuzz");
        let prog = t.upload(b"prog");
        let _ = t.submit(ANA, &prog);
        for (m, p) in api::ROUTES {
            let uri = format!("{}{}", p.replace("{id}", &id).replace("{digest}", &id), query.replace("wait_ms", "w"));
            if uri.parse::<axum::http::Uri>().is_err() {
                continue;
            }
            let a = t.call(m, &uri, Some(token_for(m, p)), body.clone());
            prop_assert!(!a.status.is_server_error(), "{} {} -> {}: {}", m, uri, a.status, a.text());
            if a.status.is_client_error() {
                // Every error answer is the documented `{"error": "..."}`.
                let v: Result<serde_json::Value, _> = serde_json::from_slice(&a.body);
                prop_assert!(
                    v.as_ref().is_ok_and(|v| v["error"].is_string())
                        && a.headers.get("content-type").is_some_and(|c| c.to_str().unwrap_or("").starts_with("application/json")),
                    "{} {} -> {}: not a JSON error: {}", m, uri, a.status, a.text()
                );
            }
        }
    }
}

#[test]
fn a_user_downloads_and_submits_only_content_of_theirs_and_another_s_looks_absent() {
    let t = setup("ownblobs");
    let prog = t.upload(b"ana's program");
    let absent = mutirao_coord::repo::digest_of(b"never uploaded");
    // Ana reads what she uploaded; the agent fetches any program.
    assert_eq!(
        t.call("GET", &format!("/blobs/{prog}"), Some(ANA), "").body,
        b"ana's program"
    );
    assert_eq!(
        t.call("GET", &format!("/blobs/{prog}"), Some(N1), "")
            .status,
        StatusCode::OK
    );
    // Bia gets for ana's content exactly what she gets for content nobody uploaded.
    let theirs = t.call("GET", &format!("/blobs/{prog}"), Some(BIA), "");
    let none = t.call("GET", &format!("/blobs/{absent}"), Some(BIA), "");
    assert_eq!(
        (theirs.status, none.status),
        (StatusCode::NOT_FOUND, StatusCode::NOT_FOUND)
    );
    assert_eq!(theirs.text(), none.text().replace(&absent, &prog));
    // Nor can she run it by naming its digest.
    let a = t.submit(BIA, &prog);
    let b = t.submit(BIA, &absent);
    assert_eq!(
        (a.status, b.status),
        (StatusCode::BAD_REQUEST, StatusCode::BAD_REQUEST)
    );
    assert_eq!(a.text(), b.text().replace(&absent, &prog));
    assert!(t.c.store().jobs(Some("bia")).unwrap().is_empty());
    assert!(
        t.c.audit()
            .iter()
            .any(|l| l.starts_with("404 GET /blobs/{digest}: user bia may not read")),
        "{:#?}",
        t.c.audit()
    );
    // Once she uploads the same content herself, it is hers too.
    assert_eq!(t.upload_as(BIA, b"ana's program"), prog);
    assert_eq!(
        t.call("GET", &format!("/blobs/{prog}"), Some(BIA), "")
            .status,
        StatusCode::OK
    );
    assert_eq!(t.submit(BIA, &prog).status, StatusCode::CREATED);
}

#[test]
fn each_user_s_uploads_are_bounded_by_their_quota_with_507_and_a_reason() {
    let mut t = setup("quota");
    t.c = Coordinator::with_limits(
        Arc::new(SqliteStore::open_in_memory().unwrap()),
        {
            let mut k = Tokens::new();
            k.add(Kind::User, "ana", ANA).unwrap();
            k.add(Kind::User, "bia", BIA).unwrap();
            k
        },
        Repo::open(&t.dir.join("repo"), 4096).unwrap(),
        Duration::from_secs(5),
        api::Limits {
            upload_quota: 3000,
            ..api::Limits::default()
        },
    );
    let first = t.upload(&[1u8; 2000]);
    let a = t.call("POST", "/blobs", Some(ANA), vec![2u8; 2000]);
    assert_eq!(a.status, StatusCode::INSUFFICIENT_STORAGE, "{}", a.text());
    assert!(
        a.text()
            .contains("ana's uploads take 2000 bytes of their 3000-byte quota")
            && a.text().contains("--upload-quota-mib"),
        "{}",
        a.text()
    );
    // Refused from its declared length alone, before its body is read.
    let req = Request::builder()
        .method("POST")
        .uri("/blobs")
        .header("authorization", format!("Bearer {ANA}"))
        .header("content-length", "2000")
        .body(Body::from(vec![3u8; 2000]))
        .unwrap();
    let status =
        t.rt.block_on(api::router(t.c.clone()).oneshot(req))
            .unwrap()
            .status();
    assert_eq!(status, StatusCode::INSUFFICIENT_STORAGE);
    // Content she has already (named by its digest, as the client does) is not counted
    // again; what fits still goes in.
    let a = t.call(
        "POST",
        &format!("/blobs?digest={first}"),
        Some(ANA),
        vec![1u8; 2000],
    );
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.text());
    assert_eq!(a.json::<Uploaded>().digest, first);
    t.upload(&[4u8; 1000]);
    assert_eq!(t.c.store().blob_usage("ana").unwrap(), 3000);
    // Bia's quota is her own.
    t.upload_as(BIA, &[2u8; 2000]);
    assert_eq!(t.c.store().blob_usage("bia").unwrap(), 2000);
}
