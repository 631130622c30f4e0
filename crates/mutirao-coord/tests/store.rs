//! The coordinator's store: nothing is lost across a close and reopen (a coordinator
//! restart), the schema migrates and refuses a newer one, the state machine is enforced and
//! every accepted move is journalled exactly once, bad input changes nothing, logs read back
//! from any offset. One generic suite runs against SQLite and against a real PostgreSQL server
//! the test starts itself (skipped, saying why, where it cannot start).

mod common;

use mutirao_coord::{BlobAdd, Error, HostReport, JobState, NewJob, PgStore, SqliteStore, Store};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

fn job(owner: &str) -> NewJob {
    NewJob {
        owner: owner.into(),
        ranks: 4,
        program: "sha256:ab12".into(),
        args: vec!["--n".into(), "300".into()],
        require: Some("cpu>=2 & site=north".into()),
        checkpoint_interval_s: Some(30.0),
        dag: false,
        env: [("GREETING".to_string(), "olá".to_string())].into(),
    }
}

fn report(name: &str, idle: f64) -> HostReport {
    HostReport {
        name: name.into(),
        addr: "10.0.0.1:7207".into(),
        idle_cpu: idle,
        free_mem_mib: 2048,
        load: 0.4,
        owner_active: false,
        ..Default::default()
    }
}

fn scratch(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("mutirao-coord-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

type Open<'a> = &'a dyn Fn() -> Box<dyn Store>;

fn restart_loses_nothing(open: Open) {
    let (a, b) = {
        let s = open();
        let a = s.create_job(&job("ana")).unwrap();
        let b = s.create_job(&job("bia")).unwrap();
        s.transition(a.id, JobState::Running, "placed on n1, n2")
            .unwrap();
        s.note(a.id, "placement", "hlogp-heft, predicted 12.3 s")
            .unwrap();
        s.report_host(&report("n1", 1.5)).unwrap();
        s.append_log(a.id, b"rank 0 ok\n").unwrap();
        (a.id, b.id)
        // dropped here without any shutdown step: what a crash leaves
    };
    let s = open();
    assert_eq!(s.schema_version().unwrap(), 5);
    assert_eq!(s.job(a).unwrap().state, JobState::Running);
    // Its environment (`submit --env`) too.
    assert_eq!(s.job(b).unwrap().spec, job("bia"));
    assert_eq!(s.job(b).unwrap().spec.env["GREETING"], "olá");
    assert_eq!(s.job(b).unwrap().state, JobState::Waiting);
    let story: Vec<(String, String)> = s
        .events(a)
        .unwrap()
        .into_iter()
        .map(|e| (e.kind, e.detail))
        .collect();
    assert_eq!(
        story,
        [
            ("state".to_string(), "submitted".to_string()),
            ("state".into(), "placed on n1, n2".into()),
            ("placement".into(), "hlogp-heft, predicted 12.3 s".into())
        ]
    );
    assert_eq!(s.hosts().unwrap()[0].report.idle_cpu, 1.5);
    assert_eq!(s.jobs(Some("ana")).unwrap().len(), 1);
    assert_eq!(s.jobs(None).unwrap().len(), 2);
    let newest = |o: Option<&str>, n| -> Vec<i64> {
        s.jobs_newest(o, n).unwrap().iter().map(|j| j.id).collect()
    };
    assert_eq!(newest(None, 1), [b]);
    assert_eq!(newest(Some("ana"), 1), [a]);
    assert_eq!(newest(None, u64::MAX), [b, a]);
    assert_eq!(
        s.jobs(None)
            .unwrap()
            .iter()
            .map(|j| j.id)
            .collect::<Vec<_>>(),
        [b, a],
        "newest first"
    );
    assert_eq!(s.read_log(a, 0, 100).unwrap().data, b"rank 0 ok\n");
    let ids =
        |st: &[JobState]| -> Vec<i64> { s.jobs_in(st).unwrap().iter().map(|j| j.id).collect() };
    assert_eq!(ids(&[JobState::Waiting]), [b]);
    assert_eq!(
        ids(&[JobState::Running, JobState::Waiting]),
        [a, b],
        "oldest first"
    );
    assert!(ids(&[JobState::Failed]).is_empty());
}

fn bad_input_changes_nothing(s: &dyn Store) {
    let mut j = job("ana");
    j.ranks = 0;
    assert!(matches!(s.create_job(&j), Err(Error::Invalid(_))));
    let mut j = job("ana");
    j.checkpoint_interval_s = Some(-1.0);
    assert!(s.create_job(&j).is_err());
    let mut j = job("ana");
    j.args.push("nul\0inside".into());
    assert!(matches!(s.create_job(&j), Err(Error::Invalid(_))));
    // The runtime's own variables, a malformed name, a NUL in a value.
    for (k, v) in [
        ("MUTIRAO_RANK", "0"),
        ("mutirao_x", "1"),
        ("A-B", "1"),
        ("A", "x\0y"),
    ] {
        let mut j = job("ana");
        j.env.insert(k.into(), v.into());
        assert!(
            matches!(s.create_job(&j), Err(Error::Invalid(_))),
            "{k}={v:?} accepted"
        );
    }
    assert!(s.jobs(None).unwrap().is_empty());
    assert!(matches!(s.job(7), Err(Error::NoJob(7))));
    assert!(matches!(s.events(7), Err(Error::NoJob(7))));
    assert!(matches!(s.note(7, "x", "y"), Err(Error::NoJob(7))));
    assert!(matches!(s.append_log(7, b"x"), Err(Error::NoJob(7))));
    assert!(matches!(s.read_log(7, 0, 10), Err(Error::NoJob(7))));
    let a = s.create_job(&job("ana")).unwrap();
    assert!(s.note(a.id, "state", "sneaky").is_err());
    let e = s
        .transition(a.id, JobState::Finished, "skip running")
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("job {} is waiting; it cannot become finished", a.id)
    );
    assert_eq!(s.events(a.id).unwrap().len(), 1);
    let mut r = report("n1", 1.0);
    r.load = f64::NAN;
    assert!(matches!(s.report_host(&r), Err(Error::Invalid(_))));
    assert!(s.hosts().unwrap().is_empty());
    assert!(s.host("n1").unwrap().is_none());
}

fn hosts_are_upserted(s: &dyn Store) {
    assert_eq!(s.heartbeat_host(&report("n2", 1.0)).unwrap(), None);
    assert!(
        s.hosts().unwrap().is_empty(),
        "a heartbeat does not register"
    );
    s.report_host(&report("n2", 1.0)).unwrap();
    s.report_host(&report("n1", 1.0)).unwrap();
    s.report_host(&report("n1", 0.25)).unwrap();
    let names: Vec<String> = s
        .hosts()
        .unwrap()
        .into_iter()
        .map(|h| h.report.name)
        .collect();
    assert_eq!(names, ["n1", "n2"]);
    assert_eq!(s.host("n1").unwrap().unwrap().report.idle_cpu, 0.25);
    let h = s.heartbeat_host(&report("n2", 3.0)).unwrap().unwrap();
    assert_eq!(s.host("n2").unwrap().unwrap(), h);
    assert_eq!(h.report.idle_cpu, 3.0);
}

fn logs_read_back_from_any_offset(s: &dyn Store) {
    let a = s.create_job(&job("ana")).unwrap();
    let b = s.create_job(&job("ana")).unwrap();
    assert_eq!(s.append_log(a.id, b"hello ").unwrap(), 6);
    assert_eq!(s.append_log(b.id, b"other").unwrap(), 5);
    assert_eq!(s.append_log(a.id, b"").unwrap(), 6);
    assert_eq!(s.append_log(a.id, b"world\n").unwrap(), 12);
    let whole = b"hello world\n";
    for off in 0..=14u64 {
        for max in [1usize, 3, 6, 100] {
            let c = s.read_log(a.id, off, max).unwrap();
            let from = (off as usize).min(whole.len());
            let want = &whole[from..(from + max).min(whole.len())];
            assert_eq!(c.data, want, "offset {off} max {max}");
            assert_eq!(c.length, 12);
        }
    }
    assert_eq!(s.read_log(b.id, 0, 100).unwrap().data, b"other");
}

fn legal_moves(open: Open) {
    let s = open();
    let mut runner = TestRunner::new(Config {
        cases: 24,
        ..Config::default()
    });
    runner
        .run(&prop::collection::vec(0usize..8, 1..40), |moves| {
            let j = s.create_job(&job("ana")).unwrap();
            let mut state = JobState::Waiting;
            let mut accepted = 1; // "submitted"
            for m in moves {
                let to = JobState::ALL[m];
                let r = s.transition(j.id, to, &format!("to {to}"));
                prop_assert_eq!(r.is_ok(), state.can_become(to));
                if r.is_ok() {
                    state = to;
                    accepted += 1;
                }
                prop_assert_eq!(s.job(j.id).unwrap().state, state);
            }
            let ev = s.events(j.id).unwrap();
            prop_assert_eq!(ev.len(), accepted);
            prop_assert!(ev.iter().enumerate().all(|(i, e)| e.seq == i as i64 + 1));
            prop_assert_eq!(ev.last().unwrap().to, Some(state));
            Ok(())
        })
        .unwrap();
}

/// Notes and a move journalled together: in order, the move last; a refused move or a note
/// of kind `state` leaves the journal and the state as they were.
fn notes_and_a_move_are_one_change(s: &dyn Store) {
    let j = s.create_job(&job("ana")).unwrap();
    let moved = s
        .transition_noting(
            j.id,
            &[("placement", "4 ranks on n1"), ("refused", "n2: busy")],
            JobState::Running,
            "started on n1",
        )
        .unwrap();
    assert_eq!(moved.state, JobState::Running);
    let story: Vec<(String, String)> = s
        .events(j.id)
        .unwrap()
        .into_iter()
        .map(|e| (e.kind, e.detail))
        .collect();
    let want: Vec<(String, String)> = [
        ("state", "submitted"),
        ("placement", "4 ranks on n1"),
        ("refused", "n2: busy"),
        ("state", "started on n1"),
    ]
    .iter()
    .map(|(k, d)| (k.to_string(), d.to_string()))
    .collect();
    assert_eq!(story[1..], want[1..], "{story:?}");
    for (notes, to) in [
        (vec![("placement", "again")], JobState::Waiting),
        (vec![("state", "sneaked in")], JobState::Finished),
    ] {
        assert!(s.transition_noting(j.id, &notes, to, "no").is_err());
        assert_eq!(s.events(j.id).unwrap().len(), 4);
        assert_eq!(s.job(j.id).unwrap().state, JobState::Running);
    }
}

fn uploads_are_recorded_per_owner_within_their_quota(s: &dyn Store) {
    let (a, b) = ("sha256:aa", "sha256:bb");
    assert_eq!(s.add_blob("ana", a, 600, 1000).unwrap(), BlobAdd::Added);
    // The same content again is not counted twice, even when the quota is full.
    assert_eq!(s.add_blob("ana", a, 600, 600).unwrap(), BlobAdd::Already);
    assert_eq!(
        s.add_blob("ana", b, 600, 1000).unwrap(),
        BlobAdd::OverQuota { used: 600 }
    );
    assert_eq!(s.blob_usage("ana").unwrap(), 600);
    assert!(s.has_blob("ana", a).unwrap());
    assert!(!s.has_blob("ana", b).unwrap());
    // Another user's quota is their own, and ana's content is not theirs.
    assert!(!s.has_blob("bia", a).unwrap());
    assert_eq!(s.add_blob("bia", b, 600, 1000).unwrap(), BlobAdd::Added);
    assert_eq!(s.add_blob("bia", a, 400, 1000).unwrap(), BlobAdd::Added);
    assert_eq!(s.blob_usage("bia").unwrap(), 1000);
    assert_eq!(s.blob_usage("nobody").unwrap(), 0);
}

fn a_log_keeps_its_cap_then_one_notice_and_long_output_is_split_not_lost(s: &dyn Store) {
    let j = s.create_job(&job("ana")).unwrap();
    // 200 KiB without a newline: stored whole (in rows of at most 64 KiB), read back whole.
    let long = vec![b'y'; 200 << 10];
    let a = s.append_log_capped(j.id, &long, 1 << 20).unwrap();
    assert_eq!(
        (a.length, a.stored, a.dropped, a.truncated),
        (200 << 10, 200 << 10, 0, false)
    );
    assert_eq!(s.read_log(j.id, 0, 1 << 20).unwrap().data, long);
    // Past the cap: the part within it, then the notice once, then nothing.
    let cap = (200 << 10) + 10;
    let a = s.append_log_capped(j.id, b"0123456789abcdef", cap).unwrap();
    assert_eq!((a.stored, a.dropped, a.truncated), (10, 6, true));
    let notice = mutirao_coord::cap_notice(cap);
    let all = s.read_log(j.id, 200 << 10, 1 << 20).unwrap();
    assert_eq!(all.data, format!("0123456789\n{notice}").into_bytes());
    let a = s.append_log_capped(j.id, b"more\n", cap).unwrap();
    assert_eq!((a.stored, a.dropped, a.truncated), (0, 5, false));
    assert_eq!(a.length, all.length);
    assert_eq!(s.read_log(j.id, 0, 1 << 20).unwrap().length, all.length);
    assert!(matches!(
        s.append_log_capped(999, b"x", cap),
        Err(Error::NoJob(999))
    ));
}

/// Everything but the newer-schema check, each part on a fresh database from `fresh`.
fn suite(fresh: &dyn Fn() -> Box<dyn Fn() -> Box<dyn Store>>) {
    uploads_are_recorded_per_owner_within_their_quota(&*fresh()());
    a_log_keeps_its_cap_then_one_notice_and_long_output_is_split_not_lost(&*fresh()());
    restart_loses_nothing(&*fresh());
    notes_and_a_move_are_one_change(&*fresh()());
    bad_input_changes_nothing(&*fresh()());
    hosts_are_upserted(&*fresh()());
    logs_read_back_from_any_offset(&*fresh()());
    legal_moves(&*fresh());
}

#[test]
fn sqlite_passes_the_store_suite() {
    let d = scratch("suite");
    let n = std::cell::Cell::new(0);
    suite(&|| {
        n.set(n.get() + 1);
        let db = d.join(format!("coord{}.sqlite", n.get()));
        Box::new(move || Box::new(SqliteStore::open(&db).unwrap()) as Box<dyn Store>)
    });
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn the_database_and_repository_are_private_to_the_coordinator_s_user() {
    use std::os::unix::fs::PermissionsExt;
    let d = scratch("modes");
    let db = d.join("coord.sqlite");
    // An existing database others could read is made private too.
    std::fs::write(&db, b"").unwrap();
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
    let store = SqliteStore::open(&db).unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&db), 0o600);
    drop(store);
    let repo = d.join("repo");
    mutirao_coord::repo::Repo::open(&repo, 1 << 20).unwrap();
    assert_eq!(mode(&repo), 0o700);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn sqlite_refuses_a_database_from_a_newer_version() {
    let d = scratch("newer");
    let db = d.join("coord.sqlite");
    drop(SqliteStore::open(&db).unwrap());
    let c = rusqlite::Connection::open(&db).unwrap();
    c.pragma_update(None, "user_version", 99).unwrap();
    drop(c);
    let e = SqliteStore::open(&db).err().expect("refused").to_string();
    assert!(e.contains("schema version 99 is newer"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

/// A job of a database from before upload records, with its program `sha256:…`.
fn job_with_program(owner: &str) -> NewJob {
    NewJob {
        program: format!("sha256:{}", "c".repeat(64)),
        ..job(owner)
    }
}

#[test]
fn sqlite_migrating_to_upload_records_gives_each_job_s_program_to_its_owner() {
    let d = scratch("blobsmig");
    let db = d.join("coord.sqlite");
    let j = SqliteStore::open(&db)
        .unwrap()
        .create_job(&job_with_program("ana"))
        .unwrap();
    // Back to schema 4, as a coordinator from before quotas left it.
    let c = rusqlite::Connection::open(&db).unwrap();
    c.execute_batch("DROP TABLE blobs; PRAGMA user_version = 4;")
        .unwrap();
    drop(c);
    let s = SqliteStore::open(&db).unwrap();
    assert_eq!(s.schema_version().unwrap(), 5);
    assert!(s.has_blob("ana", &j.spec.program).unwrap());
    assert!(!s.has_blob("bia", &j.spec.program).unwrap());
    assert_eq!(s.blob_usage("ana").unwrap(), 0);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn postgres_passes_the_same_suite_and_refuses_a_newer_schema() {
    let server = match common::pg::PgServer::start("suite") {
        Ok(s) => s,
        Err(why) => {
            println!("skipped: cannot start a PostgreSQL server: {why}");
            return;
        }
    };
    suite(&|| {
        let url = server.fresh_db();
        Box::new(move || Box::new(PgStore::connect(&url).unwrap()) as Box<dyn Store>)
    });
    // Two coordinators connecting at once both find the schema migrated once.
    let url = server.fresh_db();
    let th: Vec<_> = (0..2)
        .map(|_| {
            let u = url.clone();
            std::thread::spawn(move || PgStore::connect(&u).map(|s| s.schema_version().unwrap()))
        })
        .collect();
    for t in th {
        assert_eq!(t.join().unwrap().unwrap(), 5);
    }
    // Migrating to upload records gives each job's program to its owner.
    let j = PgStore::connect(&url)
        .unwrap()
        .create_job(&job_with_program("ana"))
        .unwrap();
    let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    c.batch_execute("DROP TABLE blobs; UPDATE mutirao_schema SET version = 4")
        .unwrap();
    let s = PgStore::connect(&url).unwrap();
    assert_eq!(s.schema_version().unwrap(), 5);
    assert!(s.has_blob("ana", &j.spec.program).unwrap());
    assert!(!s.has_blob("bia", &j.spec.program).unwrap());
    c.execute("UPDATE mutirao_schema SET version = 99", &[])
        .unwrap();
    let e = PgStore::connect(&url).err().expect("refused").to_string();
    assert!(e.contains("schema version 99 is newer"), "{e}");
    assert!(PgStore::connect(&server.url("no_such_db"))
        .err()
        .expect("refused")
        .to_string()
        .contains("cannot connect to PostgreSQL"));
}

#[test]
fn final_states_are_final_and_cancel_works_from_every_other() {
    for from in JobState::ALL {
        assert_eq!(
            from.can_become(JobState::Cancelled),
            !from.is_final(),
            "{from}"
        );
        if from.is_final() {
            assert!(JobState::ALL.iter().all(|to| !from.can_become(*to)));
        }
    }
}
