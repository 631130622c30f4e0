//! The coordinator's store: nothing is lost across a close and reopen (a coordinator
//! restart), the schema migrates and refuses a newer one, the state machine is enforced and
//! every accepted move is journalled exactly once, bad input changes nothing.

use mutirao_coord::{Error, HostReport, JobState, NewJob, SqliteStore, Store};
use proptest::prelude::*;

fn job(owner: &str) -> NewJob {
    NewJob {
        owner: owner.into(),
        ranks: 4,
        program: "sha256:ab12".into(),
        args: vec!["--n".into(), "300".into()],
        require: Some("cpu>=2 & site=north".into()),
        checkpoint_interval_s: Some(30.0),
    }
}

fn scratch(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("mutirao-coord-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn a_restarted_coordinator_finds_every_job_event_and_host() {
    let d = scratch("restart");
    let db = d.join("coord.sqlite");
    let (a, b) = {
        let s = SqliteStore::open(&db).unwrap();
        let a = s.create_job(&job("ana")).unwrap();
        let b = s.create_job(&job("bia")).unwrap();
        s.transition(a.id, JobState::Running, "placed on n1, n2")
            .unwrap();
        s.note(a.id, "placement", "hlogp-heft, predicted 12.3 s")
            .unwrap();
        s.report_host(&HostReport {
            name: "n1".into(),
            addr: "10.0.0.1:7207".into(),
            idle_cpu: 1.5,
            free_mem_mib: 2048,
            load: 0.4,
            owner_active: false,
        })
        .unwrap();
        (a.id, b.id)
        // dropped here without any shutdown step: what a crash leaves
    };
    let s = SqliteStore::open(&db).unwrap();
    assert_eq!(s.schema_version().unwrap(), 3);
    assert_eq!(s.job(a).unwrap().state, JobState::Running);
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
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_database_from_a_newer_version_is_refused() {
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

#[test]
fn bad_input_changes_nothing() {
    let s = SqliteStore::open_in_memory().unwrap();
    let mut j = job("ana");
    j.ranks = 0;
    assert!(matches!(s.create_job(&j), Err(Error::Invalid(_))));
    let mut j = job("ana");
    j.checkpoint_interval_s = Some(-1.0);
    assert!(s.create_job(&j).is_err());
    assert!(s.jobs(None).unwrap().is_empty());
    assert!(matches!(s.job(7), Err(Error::NoJob(7))));
    assert!(matches!(s.events(7), Err(Error::NoJob(7))));
    assert!(matches!(s.note(7, "x", "y"), Err(Error::NoJob(7))));
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
}

proptest! {
    #[test]
    fn only_legal_moves_happen_and_each_is_journalled_once(moves in prop::collection::vec(0usize..8, 1..40)) {
        let s = SqliteStore::open_in_memory().unwrap();
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
    }
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
