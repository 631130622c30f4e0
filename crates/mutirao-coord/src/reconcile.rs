//! A restarted coordinator reconciles the jobs its predecessor left running with what the
//! agents report of their ranks (each agent journals the grid ranks it runs, labelled with the
//! job's id and run: [`mutirao_launch::journal`], and reports them in its heartbeats).
//!
//! For each job left `running`, `checkpointing`, `recovering` or `suspended`, the coordinator
//! waits for the agents of the job's last run to report ([`bound`]: two heartbeat intervals
//! and the agents' patience with a silent launcher); then, in [`decide`] (pure):
//!
//! - ranks of the job still alive on a host → it waits until their agents report them gone
//!   (no two copies of a job at once; agents end ranks whose launcher went silent);
//! - every rank of the last run's last incarnation exited 0 → `finished`, not run again;
//! - else (a rank failed or was killed, or no agent remembers the run) → re-queued, from the
//!   last committed epoch with checkpoints;
//! - an agent that never reports within the bound → re-queued, saying so.
//!
//! Every step is journalled (`reconcile` events), so `mutirao job ID` tells the story.

use super::Dispatcher;
use crate::place::Slot;
use crate::{JobState, Result};
use mutirao_launch::journal::{JobRanks, RankExit};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

/// The coordinator's run of a job as its `run` event says: number, ranks, hosts × ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOf {
    /// The run's number (1 for the job's first placement).
    pub run: u32,
    /// Its ranks.
    pub ranks: u32,
    /// The hosts it was placed on, with their ranks.
    pub hosts: Vec<(String, u32)>,
}

/// The detail of a job's `run` event: `run 2: 4 ranks on n1×2, n2×2`.
pub fn run_detail(run: u32, ranks: u32, chosen: &[Slot]) -> String {
    let on: Vec<String> = chosen
        .iter()
        .map(|s| format!("{}×{}", s.name, s.ranks))
        .collect();
    format!("run {run}: {ranks} ranks on {}", on.join(", "))
}

/// The run a `run` event's detail describes ([`run_detail`]'s text), if it is one.
pub fn parse_run(detail: &str) -> Option<RunOf> {
    let rest = detail.strip_prefix("run ")?;
    let (run, rest) = rest.split_once(": ")?;
    let (ranks, rest) = rest.split_once(" ranks on ")?;
    let hosts = rest
        .split(", ")
        .map(|h| {
            let (name, n) = h.rsplit_once('×')?;
            Some((name.to_string(), n.parse().ok()?))
        })
        .collect::<Option<Vec<_>>>()?;
    Some(RunOf {
        run: run.parse().ok()?,
        ranks: ranks.parse().ok()?,
        hosts,
    })
}

/// A job a previous coordinator left started.
#[derive(Debug, Clone, PartialEq)]
pub struct Orphan {
    /// Its id.
    pub job: i64,
    /// Its last run, when its journal names one (task graphs' tasks are not runs).
    pub run: Option<RunOf>,
    /// The hosts whose agents must report (the run's, or for a task graph every host alive
    /// when the previous coordinator last heard of it).
    pub hosts: Vec<String>,
}

/// A host's last report, as the reconciliation reads it.
#[derive(Debug, Clone, Copy)]
pub struct Seen<'a> {
    /// When it came, ms since the epoch.
    pub last_seen_ms: i64,
    /// Its agent's grid jobs.
    pub jobs: &'a [JobRanks],
}

/// What to do with an orphan now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Not yet: agents have still to report, or its ranks are alive (the reason, to journal).
    Wait(Option<String>),
    /// Every rank of its last run exited 0: the job is finished (the journal's reason).
    Finished(String),
    /// Run it again (the reason).
    Requeue(String),
}

/// How long a restarted coordinator waits for the agents of a run to report: two heartbeat
/// intervals, plus the agents' patience with a silent launcher (its heartbeat period times
/// [`mutirao_launch::proto::HEARTBEAT_MISSES`]: by then they have ended its ranks), plus a
/// second.
pub fn bound(heartbeat_interval: Duration) -> Duration {
    let launcher = mutirao_launch::job::JobSpec::local(1, "", Vec::new())
        .heartbeat
        .unwrap_or(Duration::from_secs(1));
    2 * heartbeat_interval
        + launcher * mutirao_launch::proto::HEARTBEAT_MISSES
        + Duration::from_secs(1)
}

fn ranks_list(r: &[u32]) -> String {
    let shown: Vec<String> = r.iter().take(16).map(u32::to_string).collect();
    format!(
        "[{}{}]",
        shown.join(", "),
        if r.len() > 16 { ", …" } else { "" }
    )
}

/// Decide for `o` from the hosts' last reports (`seen`, by host name): reports count only if
/// they came at or after `since_ms` (the restart); a host silent for more than `lost_after_ms`
/// is lost (its alive ranks no longer hold the job back); agents that have not reported by
/// `deadline_ms` are given up on.
pub fn decide(
    o: &Orphan,
    seen: &HashMap<String, Seen<'_>>,
    since_ms: i64,
    now_ms: i64,
    deadline_ms: i64,
    lost_after_ms: i64,
) -> Verdict {
    let fresh =
        |s: &Seen<'_>| s.last_seen_ms >= since_ms && now_ms - s.last_seen_ms <= lost_after_ms;
    // Ranks of the job alive anywhere (any run): the job waits until they are gone.
    let mut alive: Vec<String> = Vec::new();
    let mut names: Vec<&String> = seen.keys().collect();
    names.sort();
    for h in names {
        let s = &seen[h];
        if !fresh(s) {
            continue;
        }
        for j in s
            .jobs
            .iter()
            .filter(|j| j.job == o.job && !j.alive.is_empty())
        {
            alive.push(format!(
                "{h} ranks {} of run {}",
                ranks_list(&j.alive),
                j.run
            ));
        }
    }
    if !alive.is_empty() {
        return Verdict::Wait(Some(format!(
            "its ranks are still alive ({}); waiting until their agents report them gone before deciding (no two copies of a job at once)",
            alive.join("; ")
        )));
    }
    let missing: Vec<&str> = o
        .hosts
        .iter()
        .filter(|h| !seen.get(*h).is_some_and(fresh))
        .map(String::as_str)
        .collect();
    let which = match &o.run {
        Some(r) => format!("run {}", r.run),
        None => "its tasks".to_string(),
    };
    if !missing.is_empty() {
        if now_ms < deadline_ms {
            return Verdict::Wait(None);
        }
        return Verdict::Requeue(format!(
            "{} did not report within {:.1} s of the coordinator's restart (or went silent since): whether its ranks of {which} ended, and how, is unknown",
            missing.join(", "),
            (deadline_ms - since_ms) as f64 / 1e3
        ));
    }
    let Some(run) = &o.run else {
        return Verdict::Requeue(format!(
            "no rank of {which} is alive on {}",
            o.hosts.join(", ")
        ));
    };
    // The run's exits, by host; the last incarnation decides (earlier ones failed and were
    // restarted within the run).
    let mut exits: BTreeMap<&str, Vec<&RankExit>> = BTreeMap::new();
    for (h, _) in &run.hosts {
        if let Some(s) = seen.get(h) {
            for j in s.jobs.iter().filter(|j| j.job == o.job && j.run == run.run) {
                exits.entry(h.as_str()).or_default().extend(j.exits.iter());
            }
        }
    }
    let Some(last) = exits.values().flatten().map(|e| e.incarnation).max() else {
        return Verdict::Requeue(format!(
            "no agent of {} remembers a rank of {which} (they keep exits for an hour)",
            o.hosts.join(", ")
        ));
    };
    let mut ok = vec![false; run.ranks as usize];
    let mut bad: Vec<String> = Vec::new();
    for (h, es) in &exits {
        for e in es.iter().filter(|e| e.incarnation == last) {
            if e.code == Some(0) {
                if let Some(slot) = ok.get_mut(e.rank as usize) {
                    *slot = true;
                }
            } else {
                bad.push(format!("rank {} on {h}: {}", e.rank, e.how()));
            }
        }
    }
    let inc = if last > 0 {
        format!(" (incarnation {last})")
    } else {
        String::new()
    };
    if bad.is_empty() && ok.iter().all(|&b| b) {
        let by: Vec<String> = exits
            .iter()
            .map(|(h, es)| {
                let mut r: Vec<u32> = es
                    .iter()
                    .filter(|e| e.incarnation == last)
                    .map(|e| e.rank)
                    .collect();
                r.sort_unstable();
                format!("{h} ranks {}", ranks_list(&r))
            })
            .collect();
        return Verdict::Finished(format!(
            "the agents report that every rank of {which}{inc} exited 0 ({}): the job ended while no coordinator followed it; finished without running it again (its output after the previous coordinator stopped is not in the log)",
            by.join("; ")
        ));
    }
    let never: Vec<u32> = ok
        .iter()
        .enumerate()
        .filter(|(_, &b)| !b)
        .map(|(r, _)| r as u32)
        .collect();
    bad.truncate(16);
    let mut why = format!("the agents report that {which}{inc} did not succeed");
    if !bad.is_empty() {
        why.push_str(&format!(": {}", bad.join("; ")));
    }
    if bad.is_empty() && !never.is_empty() {
        why.push_str(&format!(
            ": no agent reports ranks {} of it exiting 0",
            ranks_list(&never)
        ));
    }
    Verdict::Requeue(why)
}

impl Dispatcher {
    /// Jobs a previous coordinator left started: journal that each is being reconciled, then
    /// decide each, in a thread of its own, from the agents' reports ([`decide`]): finished,
    /// re-queued, or (its ranks alive) held until they are gone. Returns how many jobs. Call
    /// once, at start, before or while serving (the agents report through the API).
    pub fn reconcile_orphans(self: &Arc<Self>) -> Result<usize> {
        let store = self.c.store();
        let since = now_ms();
        let wait = bound(self.c.heartbeat_interval);
        let deadline = since + wait.as_millis() as i64;
        let lost_after = 3 * self.c.heartbeat_interval.as_millis() as i64;
        let hosts = store.hosts()?;
        let mut pending = Vec::new();
        for j in store.jobs_in(&[
            JobState::Running,
            JobState::Checkpointing,
            JobState::Recovering,
            JobState::Suspended,
        ])? {
            let run = store
                .events(j.id)?
                .iter()
                .rev()
                .find(|e| e.kind == "run")
                .and_then(|e| parse_run(&e.detail));
            let run = if j.spec.dag { None } else { run };
            let o = Orphan {
                job: j.id,
                hosts: match &run {
                    Some(r) => r.hosts.iter().map(|(h, _)| h.clone()).collect(),
                    // Every host alive when the previous coordinator last heard of it.
                    None => hosts
                        .iter()
                        .filter(|h| since - h.last_seen_ms <= lost_after)
                        .map(|h| h.report.name.clone())
                        .collect(),
                },
                run,
            };
            let what = match &o.run {
                Some(r) => format!(
                    "run {} was started on {}",
                    r.run,
                    r.hosts
                        .iter()
                        .map(|(h, n)| format!("{h}×{n}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                None => format!("its ranks ran on some of {}", o.hosts.join(", ")),
            };
            store.note(
                j.id,
                "reconcile",
                &format!(
                    "the coordinator restarted while the job was {}; {what}: waiting up to {:.1} s for their agents to report its ranks",
                    j.state,
                    wait.as_secs_f64()
                ),
            )?;
            pending.push(o);
        }
        let n = pending.len();
        if n == 0 {
            return Ok(0);
        }
        let me = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("reconcile".into())
            .spawn(move || {
                let mut said: HashMap<i64, String> = HashMap::new();
                while !pending.is_empty() {
                    let Some(d) = me.upgrade() else { return };
                    if let Err(e) =
                        d.reconcile_step(&mut pending, &mut said, since, deadline, lost_after)
                    {
                        eprintln!("mutirao coordinator: reconciling with the agents: {e}");
                    }
                    drop(d);
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
            .map_err(|e| crate::Error::Io(format!("cannot start the reconciliation: {e}")))?;
        Ok(n)
    }

    /// One look at the agents' reports for every orphan still pending; acts on those decided.
    fn reconcile_step(
        &self,
        pending: &mut Vec<Orphan>,
        said: &mut HashMap<i64, String>,
        since: i64,
        deadline: i64,
        lost_after: i64,
    ) -> Result<()> {
        let store = self.c.store();
        let hosts = store.hosts()?;
        let seen: HashMap<String, Seen<'_>> = hosts
            .iter()
            .map(|h| {
                (
                    h.report.name.clone(),
                    Seen {
                        last_seen_ms: h.last_seen_ms,
                        jobs: &h.report.jobs,
                    },
                )
            })
            .collect();
        let now = now_ms();
        let mut still = Vec::new();
        for o in pending.drain(..) {
            if store.job(o.job)?.state.is_final() {
                continue; // cancelled meanwhile
            }
            match decide(&o, &seen, since, now, deadline, lost_after) {
                Verdict::Wait(why) => {
                    if let Some(why) = why {
                        if said.get(&o.job) != Some(&why) {
                            store.note(o.job, "reconcile", &why)?;
                            said.insert(o.job, why);
                        }
                    }
                    still.push(o);
                }
                Verdict::Finished(why) => {
                    if store.job(o.job)?.state == JobState::Suspended {
                        self.c.transition(
                            o.job,
                            JobState::Running,
                            "its run ended while suspended",
                        )?;
                    }
                    self.c.transition(o.job, JobState::Finished, &why)?;
                }
                Verdict::Requeue(why) => self.requeue_after_restart(o.job, &why)?,
            }
        }
        *pending = still;
        Ok(())
    }

    /// Re-queue job `id` after the coordinator's restart (through `recovering`, journalled
    /// with `why` and where it resumes from).
    fn requeue_after_restart(&self, id: i64, why: &str) -> Result<()> {
        let job = self.c.store().job(id)?;
        let ckpt = self.work.join(id.to_string()).join("ckpt");
        let from = match (
            job.spec.checkpoint_interval_s,
            super::committed_epoch(&ckpt),
        ) {
            (Some(_), Some(e)) => format!("it resumes from committed epoch {e}"),
            (Some(_), None) => {
                "no epoch was committed: it starts again from the beginning".to_string()
            }
            (None, _) if job.spec.dag => "its unfinished tasks run again".to_string(),
            (None, _) => "no checkpoints: it runs again from the beginning".to_string(),
        };
        match job.state {
            JobState::Running | JobState::Checkpointing | JobState::Suspended => {
                self.c.transition(id, JobState::Recovering, why)?;
            }
            JobState::Recovering => {
                self.c.store().note(id, "reconcile", why)?;
            }
            _ => return Ok(()),
        }
        self.c.transition(
            id,
            JobState::Waiting,
            &format!("re-queued after the coordinator's restart: {from}"),
        )?;
        Ok(())
    }
}

fn now_ms() -> i64 {
    mutirao_launch::journal::now_ms()
}

#[cfg(test)]
mod tests {
    use super::*;
    use mutirao_launch::journal::{JobRanks, RankExit};

    fn exit(rank: u32, incarnation: u32, code: Option<i32>, signal: Option<i32>) -> RankExit {
        RankExit {
            rank,
            incarnation,
            code,
            signal,
            ended_ms: 0,
        }
    }

    fn orphan() -> Orphan {
        Orphan {
            job: 7,
            run: Some(RunOf {
                run: 2,
                ranks: 3,
                hosts: vec![("n1".into(), 2), ("n2".into(), 1)],
            }),
            hosts: vec!["n1".into(), "n2".into()],
        }
    }

    #[test]
    fn the_run_event_round_trips() {
        let slots = [
            Slot {
                name: "n1".into(),
                addr: "a:1".into(),
                ranks: 2,
            },
            Slot {
                name: "x×y".into(),
                addr: "a:2".into(),
                ranks: 1,
            },
        ];
        let d = run_detail(4, 3, &slots);
        assert_eq!(d, "run 4: 3 ranks on n1×2, x×y×1");
        assert_eq!(
            parse_run(&d),
            Some(RunOf {
                run: 4,
                ranks: 3,
                hosts: vec![("n1".into(), 2), ("x×y".into(), 1)]
            })
        );
        assert_eq!(parse_run("started on n1"), None);
        assert_eq!(parse_run("run x: 3 ranks on n1×2"), None);
    }

    #[test]
    fn the_decision_waits_finishes_or_requeues() {
        let o = orphan();
        let (since, deadline, lost) = (1_000, 8_000, 10_000);
        let ok = |r: u32| exit(r, 0, Some(0), None);
        let n1_done = [JobRanks {
            job: 7,
            run: 2,
            alive: vec![],
            exits: vec![ok(0), ok(1)],
        }];
        let n2_done = [JobRanks {
            job: 7,
            run: 2,
            alive: vec![],
            exits: vec![ok(2)],
        }];
        let seen = |a: i64, ja: &'static [JobRanks], b: i64, jb: &'static [JobRanks]| {
            HashMap::from([
                (
                    "n1".to_string(),
                    Seen {
                        last_seen_ms: a,
                        jobs: ja,
                    },
                ),
                (
                    "n2".to_string(),
                    Seen {
                        last_seen_ms: b,
                        jobs: jb,
                    },
                ),
            ])
        };
        let n1: &'static [JobRanks] = Box::leak(Box::new(n1_done));
        let n2: &'static [JobRanks] = Box::leak(Box::new(n2_done));
        // n2 has not reported since the restart: wait, then give up on it at the deadline.
        let s = seen(2_000, n1, 500, n2);
        assert_eq!(
            decide(&o, &s, since, 2_000, deadline, lost),
            Verdict::Wait(None)
        );
        match decide(&o, &s, since, 8_000, deadline, lost) {
            Verdict::Requeue(w) => assert!(w.starts_with("n2 did not report within 7.0 s"), "{w}"),
            v => panic!("{v:?}"),
        }
        // Both reported, every rank exited 0: finished.
        let s = seen(2_000, n1, 2_100, n2);
        match decide(&o, &s, since, 2_200, deadline, lost) {
            Verdict::Finished(w) => {
                assert!(w.contains("every rank of run 2 exited 0"), "{w}");
                assert!(w.contains("n1 ranks [0, 1]; n2 ranks [2]"), "{w}");
            }
            v => panic!("{v:?}"),
        }
        // A rank alive on n1 (of any run): wait, whatever the deadline says.
        let alive: &'static [JobRanks] = Box::leak(Box::new([JobRanks {
            job: 7,
            run: 2,
            alive: vec![1],
            exits: vec![ok(0)],
        }]));
        let s = seen(9_000, alive, 9_000, n2);
        match decide(&o, &s, since, 9_100, deadline, lost) {
            Verdict::Wait(Some(w)) => assert!(w.contains("n1 ranks [1] of run 2"), "{w}"),
            v => panic!("{v:?}"),
        }
        // ... unless n1 has gone silent since: then it no longer holds the job.
        let s = seen(9_000, alive, 19_000, n2);
        match decide(&o, &s, since, 20_000, deadline, lost) {
            Verdict::Requeue(w) => assert!(w.starts_with("n1 did not report"), "{w}"),
            v => panic!("{v:?}"),
        }
        // A rank killed: re-queued, naming it.
        let killed: &'static [JobRanks] = Box::leak(Box::new([JobRanks {
            job: 7,
            run: 2,
            alive: vec![],
            exits: vec![ok(0), exit(1, 0, None, Some(9))],
        }]));
        let s = seen(2_000, killed, 2_000, n2);
        match decide(&o, &s, since, 2_100, deadline, lost) {
            Verdict::Requeue(w) => assert!(w.contains("rank 1 on n1: signal 9"), "{w}"),
            v => panic!("{v:?}"),
        }
        // Restarted within the run: incarnation 1 succeeded everywhere, 0 had failed.
        let n1_inc: &'static [JobRanks] = Box::leak(Box::new([JobRanks {
            job: 7,
            run: 2,
            alive: vec![],
            exits: vec![
                exit(0, 0, None, Some(9)),
                exit(0, 1, Some(0), None),
                exit(1, 1, Some(0), None),
            ],
        }]));
        let n2_inc: &'static [JobRanks] = Box::leak(Box::new([JobRanks {
            job: 7,
            run: 2,
            alive: vec![],
            exits: vec![exit(2, 1, Some(0), None)],
        }]));
        let s = seen(2_000, n1_inc, 2_000, n2_inc);
        assert!(matches!(
            decide(&o, &s, since, 2_100, deadline, lost),
            Verdict::Finished(w) if w.contains("(incarnation 1)")
        ));
        // An earlier run's success does not finish the job; nor does nothing remembered.
        let old: &'static [JobRanks] = Box::leak(Box::new([JobRanks {
            job: 7,
            run: 1,
            alive: vec![],
            exits: vec![ok(0), ok(1), ok(2)],
        }]));
        let s = seen(2_000, old, 2_000, &[]);
        match decide(&o, &s, since, 2_100, deadline, lost) {
            Verdict::Requeue(w) => assert!(w.contains("remembers a rank of run 2"), "{w}"),
            v => panic!("{v:?}"),
        }
        // Ranks missing from the report (rank 2 never reported on n2).
        let s = seen(2_000, n1, 2_000, &[]);
        match decide(&o, &s, since, 2_100, deadline, lost) {
            Verdict::Requeue(w) => assert!(w.contains("ranks [2]"), "{w}"),
            v => panic!("{v:?}"),
        }
    }
}
