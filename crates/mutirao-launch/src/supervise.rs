//! Supervision of one incarnation: wait for every rank, and when one fails (abnormal exit, its
//! host lost, a channel failure a rank reports, the time limit, an interruption) end the others
//! — SIGTERM, then SIGKILL after a grace period — ULFM-style. What happened is handed to the
//! caller as [`Report`]s and the returned [`Ended`]; nothing is printed here.

use crate::job::{Event, Job};
use crate::proto::Stream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How an incarnation is watched.
#[derive(Clone, Debug)]
pub struct Watch {
    /// End the job (status 124) after this long.
    pub timeout: Option<Duration>,
    /// Set by the caller (e.g. on Ctrl-C): end the job (status 130).
    pub interrupted: Arc<AtomicBool>,
    /// Between SIGTERM and SIGKILL when ending ranks (zero: SIGKILL at once, as recovery does).
    pub grace: Duration,
    /// Take a channel failure a rank reports through the bootstrap server as the job's failure
    /// (recovery does; without it, ranks decide themselves what a lost peer means).
    pub act_on_reports: bool,
    /// A rank other than 0 that fails, or whose host is lost, is reported and the job goes on
    /// (master/worker programs, where losing a worker is normal). Rank 0's failure still ends
    /// the job, and the job's status is rank 0's.
    pub keep_going: bool,
}

impl Default for Watch {
    fn default() -> Self {
        Watch {
            timeout: None,
            interrupted: Arc::new(AtomicBool::new(false)),
            grace: Duration::from_secs(2),
            act_on_reports: false,
            keep_going: false,
        }
    }
}

/// What the supervisor tells its caller while the job runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// A line of a rank's output.
    Output {
        rank: usize,
        stream: Stream,
        line: String,
    },
    /// Something the user should know (a failure, ranks being ended).
    Notice(String),
    /// Every rank has started and connected: how long its start-up phases took.
    Init(InitReport),
    /// A restart within the run (with checkpoints, [`crate::recovery`]): the state a
    /// coordinator shows for the job (`recovering`, then `running` again).
    Recovery(RecoveryStep),
}

/// A step of a restart within the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoveryStep {
    /// An incarnation failed (the notice before says how) and restart `incarnation` of `max`
    /// follows.
    Failed {
        /// The restart to come (1 for the first).
        incarnation: u32,
        /// Restarts allowed.
        max: u32,
    },
    /// Every rank of restart `incarnation` was started again, from committed epoch `epoch`
    /// (`None`: from the beginning).
    Restarted {
        /// The restart (1 for the first).
        incarnation: u32,
        /// The epoch the ranks resume from.
        epoch: Option<u64>,
    },
}

/// The ranks' start-up, once every rank of an incarnation has reached the connection barrier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitReport {
    /// Ranks that reported (all of the incarnation's).
    pub ranks: usize,
    /// Each phase's maximum over the ranks (registering with the bootstrap server, the
    /// address exchange, the mesh connect).
    pub max: mutirao::pmi::InitPhases,
    /// From the start of the incarnation (before its first rank was started) until the
    /// launcher saw the last rank's report (it looks at least every 50 ms).
    pub after: Duration,
}

impl std::fmt::Display for InitReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        write!(
            f,
            "init of {} ranks, max over ranks: register {:.1} ms, address exchange {:.1} ms, \
             connect {:.1} ms; all connected {:.0} ms after the launch began",
            self.ranks,
            ms(self.max.register),
            ms(self.max.exchange),
            ms(self.max.connect),
            ms(self.after)
        )
    }
}

/// The report of `phases` (one per rank), once every rank has reported.
pub fn init_report(
    phases: &[Option<mutirao::pmi::InitPhases>],
    after: Duration,
) -> Option<InitReport> {
    if phases.is_empty() {
        return None;
    }
    let mut max = mutirao::pmi::InitPhases::default();
    for p in phases {
        max = max.max(p.as_ref()?);
    }
    Some(InitReport {
        ranks: phases.len(),
        max,
        after,
    })
}

/// Why a job ended early.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cause {
    /// A rank exited with a non-zero code or was killed.
    RankFailed {
        rank: usize,
        host: usize,
    },
    /// An agent went away or silent while its ranks ran.
    HostLost {
        host: usize,
        ranks: Vec<usize>,
    },
    /// Ranks never reached a start-up fence: the bootstrap server gave up waiting for them and
    /// the ranks that had come exited with its timeout (those are not the cause).
    NeverArrived {
        ranks: Vec<usize>,
        hosts: Vec<usize>,
    },
    /// An agent refused the launch (or could not start it): its host is alive, its ranks did
    /// not run.
    Refused {
        host: usize,
        ranks: Vec<usize>,
    },
    /// A rank reported that it lost its channel to `peer`.
    Reported {
        rank: usize,
        peer: usize,
    },
    Timeout,
    Interrupted,
}

/// How an incarnation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    /// The job's exit status: 0, or the first failure's (a rank's code, 128 + signal, 124 for
    /// the time limit, 130 for an interruption, 1 for a lost host or reported channel failure).
    pub code: u8,
    /// The first failure, if any.
    pub cause: Option<Cause>,
    /// Hosts (hostfile indices) lost or whose rank failed: recovery avoids them.
    pub suspect_hosts: Vec<usize>,
    /// When the first failure was seen.
    pub failed_at: Option<Instant>,
}

/// Describe an exit: words and the status it stands for.
pub fn describe(code: Option<i32>, sig: Option<i32>) -> (String, u8) {
    match (code, sig) {
        (Some(c), _) => (format!("exited with code {c}"), c.clamp(0, 255) as u8),
        (None, Some(s)) => (
            format!("was killed by signal {s} ({})", signal_name(s)),
            (128 + s).clamp(0, 255) as u8,
        ),
        (None, None) => ("ended in an unknown way".into(), 1),
    }
}

fn signal_name(s: i32) -> &'static str {
    match s {
        1 => "SIGHUP",
        2 => "SIGINT",
        6 => "SIGABRT",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        15 => "SIGTERM",
        _ => "signal",
    }
}

/// A rank's failed exit: (rank, code, signal).
type FailedExit = (usize, Option<i32>, Option<i32>);

struct State {
    n: usize,
    exited: Vec<bool>,
    remaining: usize,
    ended: Ended,
    ending_since: Option<Instant>,
}

impl State {
    fn end_all(
        &mut self,
        job: &Job,
        watch: &Watch,
        why: String,
        code: u8,
        cause: Cause,
        on: &mut dyn FnMut(Report),
    ) {
        if self.ended.cause.is_none() {
            self.ended.code = code;
            self.ended.cause = Some(cause);
            self.ended.failed_at = Some(Instant::now());
            on(Report::Notice(why.clone()));
        }
        if self.ending_since.is_none() {
            self.ending_since = Some(Instant::now());
            job.fail(&why);
            job.signal(if watch.grace.is_zero() {
                libc::SIGKILL
            } else {
                libc::SIGTERM
            });
        }
    }

    fn suspect(&mut self, host: usize) {
        if !self.ended.suspect_hosts.contains(&host) {
            self.ended.suspect_hosts.push(host);
        }
    }
}

/// Watch `job` until every rank has ended (or was given up on), forwarding output and notices
/// to `on`.
pub fn supervise(job: &Job, n: usize, watch: &Watch, on: &mut dyn FnMut(Report)) -> Ended {
    let start = job.started();
    let mut st = State {
        n,
        exited: vec![false; n],
        remaining: n,
        ended: Ended {
            code: 0,
            cause: None,
            suspect_hosts: Vec::new(),
            failed_at: None,
        },
        ending_since: None,
    };
    let mut killed_hard = false;
    // A reported channel failure waits a moment for the peer's own exit, the likelier cause.
    let mut reported: Option<(mutirao::pmi::FailureReport, Instant)> = None;
    // Failed exits seen in the last moments, before the job is ended.
    let mut failing: Option<(Instant, Vec<FailedExit>)> = None;
    let host_name = |r: usize| {
        job.hosts_of()
            .get(r)
            .cloned()
            .unwrap_or_else(|| "?".to_string())
    };
    // Until every rank has told the bootstrap server its start-up phases (looked at every
    // turn of the loop meanwhile: a copy of one small record per rank).
    let mut init_pending = true;
    let mut look_init = |on: &mut dyn FnMut(Report)| {
        if init_pending {
            if let Some(r) = init_report(&job.init_phases(), start.elapsed()) {
                init_pending = false;
                on(Report::Init(r));
            }
        }
    };
    while st.remaining > 0 {
        look_init(on);
        // A refused launch ends the job as a lost host does, with its own cause.
        let mut refused = false;
        let ev = match job.recv_timeout(Duration::from_millis(50)) {
            Ok(Event::Refused { host, why }) => {
                refused = true;
                Ok(Event::HostLost { host, why })
            }
            ev => ev,
        };
        match ev {
            Ok(Event::Output { rank, stream, line }) => on(Report::Output { rank, stream, line }),
            Ok(Event::Started { .. }) => {}
            Ok(Event::Exit { rank, code, signal }) if rank >= st.n => {
                // A spawned rank: its end is the spawning rank's business, not the job's.
                let (what, _) = describe(code, signal);
                if code.is_none() && signal.is_none() {
                    // Its agent's session ended without its exit (the host vanished): the
                    // ranks that talk to it must not wait for it.
                    job.peers_lost(&[rank]);
                }
                let host = job.spawned_exited(rank, &format!("it {what}"));
                if code != Some(0) {
                    on(Report::Notice(format!(
                        "spawned rank {rank} on {host} {what}; the job goes on"
                    )));
                }
            }
            Ok(Event::Exit { rank, code, signal }) => {
                if rank < st.n && !st.exited[rank] {
                    st.exited[rank] = true;
                    st.remaining -= 1;
                    if code != Some(0) && st.ending_since.is_none() {
                        let host = job.placement().get(rank).copied().unwrap_or(0);
                        if watch.keep_going && rank != 0 {
                            st.suspect(host);
                            let (what, _) = describe(code, signal);
                            on(Report::Notice(format!(
                                "rank {rank} on {} {what}; the other ranks go on (--continue-on-failure)",
                                host_name(rank)
                            )));
                            continue;
                        }
                        // Wait a moment for a likelier cause: a rank killed by a signal, whose
                        // peers then fail on their broken channels, may be reaped later.
                        match &mut failing {
                            None => failing = Some((Instant::now(), vec![(rank, code, signal)])),
                            Some((_, v)) => v.push((rank, code, signal)),
                        }
                    }
                }
            }
            Ok(Event::HostLost { host, why }) => {
                // An agent closes its session once all its ranks have ended: that is no failure.
                let lost: Vec<usize> = (0..st.n)
                    .filter(|r| job.placement().get(*r).copied() == Some(host) && !st.exited[*r])
                    .collect();
                if !lost.is_empty() {
                    st.suspect(host);
                    if watch.keep_going && !lost.contains(&0) && st.ending_since.is_none() {
                        // The survivors fail their operations on these ranks when they next
                        // wait (their sockets may never close: a host cut off says nothing).
                        job.peers_lost(&lost);
                        on(Report::Notice(format!(
                            "{why} while ranks {lost:?} were running; the other ranks go on (--continue-on-failure)"
                        )));
                    } else if st.ending_since.is_none() {
                        st.end_all(
                            job,
                            watch,
                            format!(
                                "{why} while ranks {lost:?} were running; ending the other ranks"
                            ),
                            1,
                            if refused {
                                Cause::Refused {
                                    host,
                                    ranks: lost.clone(),
                                }
                            } else {
                                Cause::HostLost {
                                    host,
                                    ranks: lost.clone(),
                                }
                            },
                            on,
                        );
                    }
                    // Those ranks will report no exit: count them as ended.
                    for r in lost {
                        st.exited[r] = true;
                        st.remaining -= 1;
                    }
                }
            }
            // Taken as a lost host with `refused` set, above.
            Ok(Event::Refused { .. }) => {}
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        if st.ending_since.is_some() {
            failing = None;
        }
        let settle = failing.as_ref().is_some_and(|(t, v)| {
            t.elapsed() > Duration::from_millis(300)
                || v.iter().any(|(_, _, sig)| sig.is_some())
                || st.remaining == 0
        });
        if settle {
            if let Some((_, v)) = failing.take() {
                // A signal death is the cause if there is one; else the first failed exit.
                let &(rank, code, signal) =
                    v.iter().find(|(_, _, sig)| sig.is_some()).unwrap_or(&v[0]);
                let (what, c) = describe(code, signal);
                // Ranks that exit because a start-up fence timed out are not the cause: the
                // ranks that never reached it are (hung, or never started), and their hosts
                // are the ones to avoid.
                let never = job
                    .fence_missing()
                    .map(|m| m.into_iter().filter(|r| *r < st.n).collect::<Vec<_>>())
                    .filter(|m| !m.is_empty() && signal.is_none());
                if let Some(missing) = never {
                    let mut hosts = Vec::new();
                    for &r in &missing {
                        let h = job.placement().get(r).copied().unwrap_or(0);
                        st.suspect(h);
                        if !hosts.contains(&h) {
                            hosts.push(h);
                        }
                    }
                    let named: Vec<String> = missing
                        .iter()
                        .map(|&r| format!("rank {r} on {}", host_name(r)))
                        .collect();
                    let gave_up: Vec<usize> = v.iter().map(|(r, _, _)| *r).collect();
                    st.end_all(
                        job,
                        watch,
                        format!(
                            "{} never reached the start-up barrier (ranks {gave_up:?} gave up \
                             waiting and {what}); ending the other ranks",
                            named.join(", ")
                        ),
                        c,
                        Cause::NeverArrived {
                            ranks: missing,
                            hosts,
                        },
                        on,
                    );
                } else {
                    let host = job.placement().get(rank).copied().unwrap_or(0);
                    st.suspect(host);
                    st.end_all(
                        job,
                        watch,
                        format!(
                            "rank {rank} on {} {what}; ending the other ranks",
                            host_name(rank)
                        ),
                        c,
                        Cause::RankFailed { rank, host },
                        on,
                    );
                }
            }
        }
        if watch.act_on_reports && st.ending_since.is_none() && reported.is_none() {
            reported = job
                .take_failures()
                .into_iter()
                .next()
                .map(|f| (f, Instant::now()));
        }
        if st.ending_since.is_none()
            && reported
                .as_ref()
                .is_some_and(|(_, t)| t.elapsed() > Duration::from_millis(250))
        {
            if let Some((f, _)) = reported.take() {
                let (rank, peer) = (f.rank as usize, f.peer as usize);
                if let Some(&h) = job.placement().get(peer) {
                    st.suspect(h);
                }
                st.end_all(
                    job,
                    watch,
                    format!(
                        "rank {rank} lost its channel to rank {peer} on {}: {}; ending all ranks",
                        host_name(peer),
                        f.reason
                    ),
                    1,
                    Cause::Reported { rank, peer },
                    on,
                );
            }
        }
        if watch.interrupted.load(Ordering::SeqCst) && st.ending_since.is_none() {
            st.end_all(
                job,
                watch,
                "interrupted; ending all ranks".into(),
                130,
                Cause::Interrupted,
                on,
            );
        }
        if let Some(t) = watch.timeout {
            if start.elapsed() > t && st.ending_since.is_none() {
                st.end_all(
                    job,
                    watch,
                    format!(
                        "the job ran longer than --timeout {} s; ending all ranks",
                        t.as_secs_f64()
                    ),
                    124,
                    Cause::Timeout,
                    on,
                );
            }
        }
        if let Some(since) = st.ending_since {
            if !killed_hard && since.elapsed() > watch.grace {
                killed_hard = true;
                job.signal(libc::SIGKILL);
            }
            if since.elapsed() > watch.grace + Duration::from_secs(8) {
                on(Report::Notice(format!(
                    "{} rank(s) did not report their end; giving up on them",
                    st.remaining
                )));
                break;
            }
        }
    }
    look_init(on);
    // No spawns once the job's own ranks have ended; then drain output still on its way
    // (bounded: a grandchild may hold a pipe open).
    job.stop_spawning();
    let drain_until = Instant::now() + Duration::from_secs(2);
    while let Ok(ev) = job.recv_timeout(drain_until.saturating_duration_since(Instant::now())) {
        if let Event::Output { rank, stream, line } = ev {
            on(Report::Output { rank, stream, line });
        }
    }
    st.ended
}

#[cfg(test)]
mod tests {
    use super::init_report;
    use mutirao::pmi::InitPhases;
    use std::time::Duration;

    #[test]
    fn the_init_report_waits_for_every_rank_and_takes_each_phase_max() {
        let us = Duration::from_micros;
        let a = InitPhases {
            register: us(5),
            exchange: us(900),
            connect: us(40),
        };
        let b = InitPhases {
            register: us(7),
            exchange: us(100),
            connect: us(60),
        };
        assert_eq!(init_report(&[Some(a), None], us(1)), None);
        assert_eq!(init_report(&[], us(1)), None);
        let r = init_report(&[Some(a), Some(b)], us(2000)).unwrap();
        assert_eq!(r.ranks, 2);
        assert_eq!(
            (r.max.register, r.max.exchange, r.max.connect),
            (us(7), us(900), us(60))
        );
        let text = r.to_string();
        assert!(
            text.starts_with("init of 2 ranks")
                && text.contains("register 0.0 ms")
                && text.contains("address exchange 0.9 ms")
                && text.contains("connect 0.1 ms")
                && text.contains("all connected 2 ms"),
            "{text}"
        );
    }
}
