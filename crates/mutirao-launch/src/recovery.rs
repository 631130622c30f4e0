//! Recovery from the last committed checkpoint (digest 004 §15.4, with its fixes): when an
//! incarnation fails — a rank's abnormal exit, a host lost or silent, a channel failure a rank
//! reports — every rank is ended, the incarnation number goes up, and every rank is started
//! again from the newest committed epoch (from scratch when none is committed), the failed
//! hosts' ranks on the other hosts of the hostfile, with a fresh bootstrap server and barrier.
//! A failure during recovery is one more failure; at most `max_restarts` restarts.

use crate::job::{Job, JobSpec};
use crate::supervise::{supervise, Cause, Ended, RecoveryStep, Report, Watch};
use mutirao::pmi::CheckpointSink;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Checkpoint mode (`MUTIRAO_CKPT_MODE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CkptMode {
    /// Wait at the safe point for every peer.
    #[default]
    Blocking,
    /// Record messages in flight and go on.
    Nonblocking,
}

impl CkptMode {
    fn env(self) -> &'static str {
        match self {
            CkptMode::Blocking => "blocking",
            CkptMode::Nonblocking => "nonblocking",
        }
    }
}

/// Checkpointing and recovery settings.
#[derive(Clone)]
pub struct Recovery {
    /// Where the ranks' checkpoints go.
    pub sink: Arc<dyn CheckpointSink>,
    /// Seconds between checkpoint waves.
    pub interval: f64,
    pub mode: CkptMode,
    /// Restarts before giving up.
    pub max_restarts: u32,
    /// Updated with each incarnation's rank → host names (a replicated store keeps a rank's
    /// replicas off its own host with it).
    pub rank_hosts: Option<crate::store::RankHosts>,
}

/// One restart, as it happened.
#[derive(Debug, Clone, PartialEq)]
pub struct Restart {
    /// 1 for the first restart.
    pub incarnation: u32,
    /// What failed.
    pub cause: Cause,
    /// The epoch every rank restarted from (`None`: from the beginning).
    pub epoch: Option<u64>,
    /// Hosts (hostfile indices) no longer used.
    pub excluded: Vec<usize>,
    /// From the failure being seen to every rank of the next incarnation started.
    pub recovery_time: Duration,
}

/// How a job with recovery ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The program's exit status (the last incarnation's).
    pub code: u8,
    pub restarts: Vec<Restart>,
}

/// The environment every rank of incarnation `incarnation` gets.
pub fn ckpt_env(rec: &Recovery, incarnation: u32, epoch: Option<u64>) -> Vec<(String, String)> {
    let mut env = vec![
        (
            "MUTIRAO_CKPT_INTERVAL".to_string(),
            rec.interval.to_string(),
        ),
        ("MUTIRAO_CKPT_MODE".to_string(), rec.mode.env().to_string()),
        ("MUTIRAO_INCARNATION".to_string(), incarnation.to_string()),
    ];
    if let Some(e) = epoch {
        env.push(("MUTIRAO_RESTART_EPOCH".to_string(), e.to_string()));
    }
    env
}

/// Hosts to avoid after `ended`, given those already avoided; never all of them (a job on one
/// host restarts there).
fn next_exclusion(spec: &JobSpec, already: &[usize], ended: &Ended) -> Vec<usize> {
    let Some(hosts) = &spec.hosts else {
        return Vec::new();
    };
    let mut out = already.to_vec();
    for &h in &ended.suspect_hosts {
        if !out.contains(&h) {
            out.push(h);
        }
    }
    if out.len() >= hosts.len() {
        // Nowhere else to go: keep only the hosts lost outright out, if any other remains.
        let lost: Vec<usize> = match &ended.cause {
            Some(Cause::HostLost { host, .. }) => vec![*host],
            // The hosts of ranks that never reached the start-up barrier.
            Some(Cause::NeverArrived { hosts, .. }) => hosts.clone(),
            _ => Vec::new(),
        };
        if lost.len() < hosts.len() {
            return lost;
        }
        return Vec::new();
    }
    out
}

/// Run `base` with checkpoints and recovery. Every incarnation gets [`ckpt_env`] in its
/// environment and `rec.sink` as its store. Returns once the job succeeded, was interrupted or
/// timed out, or failed with no restart left.
pub fn run_with_recovery(
    base: &JobSpec,
    rec: &Recovery,
    watch: &Watch,
    on: &mut dyn FnMut(Report),
) -> anyhow::Result<Outcome> {
    let mut restarts: Vec<Restart> = Vec::new();
    let mut incarnation = 0u32;
    let mut exclude: Vec<usize> = base.exclude.clone();
    let mut pending: Option<(Cause, Instant)> = None;
    let mut watch = watch.clone();
    watch.act_on_reports = true;
    watch.grace = Duration::ZERO;
    let t0 = Instant::now();
    let total = watch.timeout;
    loop {
        let epoch = rec.sink.last_committed().map_err(anyhow::Error::msg)?;
        let mut spec = base.clone();
        spec.checkpoints = Some(rec.sink.clone());
        spec.exclude = exclude.clone();
        spec.env.extend(ckpt_env(rec, incarnation, epoch));
        if let (Some(rh), Some(hosts)) = (&rec.rank_hosts, &spec.hosts) {
            if let (Ok(p), Ok(mut w)) = (spec.placement(), rh.write()) {
                *w = p
                    .iter()
                    .map(|&i| crate::store::agent_name(hosts, i))
                    .collect();
            }
        }
        watch.timeout = total.map(|t| t.saturating_sub(t0.elapsed()).max(Duration::from_millis(1)));
        let started = Job::start(&spec);
        let job = match started {
            Ok(j) => j,
            Err(e) => {
                // Could not even start (e.g. an agent unreachable): one more failure.
                on(Report::Notice(format!(
                    "incarnation {incarnation} could not start: {e:#}"
                )));
                if incarnation >= rec.max_restarts {
                    return Err(e.context(format!(
                        "giving up after {} restart(s) (--max-restarts)",
                        rec.max_restarts
                    )));
                }
                incarnation += 1;
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
        };
        if let Some((cause, failed_at)) = pending.take() {
            // `epoch` is what the ranks were just given: read after the failure, so it counts
            // a commit that landed while the failed incarnation was being ended.
            let r = Restart {
                incarnation,
                cause,
                epoch,
                excluded: exclude.clone(),
                recovery_time: failed_at.elapsed(),
            };
            on(Report::Notice(format!(
                "restart {incarnation} of {}: every rank from {}, all started again {:.3} s after the failure{}",
                rec.max_restarts,
                match epoch {
                    Some(e) => format!("committed epoch {e}"),
                    None => "the beginning (no checkpoint committed yet)".to_string(),
                },
                r.recovery_time.as_secs_f64(),
                if exclude.is_empty() {
                    String::new()
                } else {
                    let names: Vec<String> = exclude
                        .iter()
                        .filter_map(|&h| {
                            spec.hosts
                                .as_ref()
                                .filter(|hs| h < hs.len())
                                .map(|hs| crate::hostfile::agent_name(hs, h))
                        })
                        .collect();
                    format!("; not on {}", names.join(", "))
                }
            )));
            if let Some(hosts) = &spec.hosts {
                let shown: Vec<String> = job
                    .placement()
                    .iter()
                    .take(32)
                    .enumerate()
                    .map(|(r, &h)| format!("{r}: {}", crate::store::agent_name(hosts, h)))
                    .collect();
                on(Report::Notice(format!(
                    "restart {incarnation}: ranks on [{}{}]",
                    shown.join(", "),
                    if spec.n > 32 { ", …" } else { "" }
                )));
            }
            restarts.push(r);
            on(Report::Recovery(RecoveryStep::Restarted {
                incarnation,
                epoch,
            }));
        }
        let ended = supervise(&job, spec.n, &watch, on);
        // Before the next incarnation reads the last committed epoch: no commit of this one
        // may land after that read (it would name an epoch the new ranks did not start from).
        job.fence_checkpoints();
        drop(job);
        let stop = ended.code == 0
            || watch.interrupted.load(Ordering::SeqCst)
            || matches!(ended.cause, Some(Cause::Timeout | Cause::Interrupted));
        if stop {
            return Ok(Outcome {
                code: ended.code,
                restarts,
            });
        }
        if incarnation >= rec.max_restarts {
            on(Report::Notice(format!(
                "the job failed (exit status {}) and {} restart(s) were used up (--max-restarts); giving up",
                ended.code, rec.max_restarts
            )));
            return Ok(Outcome {
                code: ended.code,
                restarts,
            });
        }
        exclude = next_exclusion(&spec, &exclude, &ended);
        incarnation += 1;
        on(Report::Recovery(RecoveryStep::Failed {
            incarnation,
            max: rec.max_restarts,
        }));
        let cause = ended.cause.clone().unwrap_or(Cause::Interrupted);
        pending = Some((cause, ended.failed_at.unwrap_or_else(Instant::now)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hostfile;

    fn ended(cause: Cause, suspects: Vec<usize>) -> Ended {
        Ended {
            code: 1,
            cause: Some(cause),
            suspect_hosts: suspects,
            failed_at: None,
        }
    }

    #[test]
    fn failed_hosts_are_avoided_but_never_all() {
        let mut spec = JobSpec::local(4, "p", vec![]);
        spec.hosts = Some(hostfile::parse("a\nb\nc").unwrap());
        let e = ended(Cause::RankFailed { rank: 0, host: 0 }, vec![0]);
        assert_eq!(next_exclusion(&spec, &[], &e), vec![0]);
        let e = ended(
            Cause::HostLost {
                host: 1,
                ranks: vec![1],
            },
            vec![1],
        );
        assert_eq!(next_exclusion(&spec, &[0], &e), vec![0, 1]);
        // All three suspect: only the host lost outright stays out.
        let e = ended(
            Cause::HostLost {
                host: 2,
                ranks: vec![2],
            },
            vec![2],
        );
        assert_eq!(next_exclusion(&spec, &[0, 1], &e), vec![2]);
        // A rank that never reached the barrier: its host, not the waiting ranks' hosts.
        let e = ended(
            Cause::NeverArrived {
                ranks: vec![1],
                hosts: vec![1],
            },
            vec![1],
        );
        assert_eq!(next_exclusion(&spec, &[], &e), vec![1]);
        assert_eq!(next_exclusion(&spec, &[0, 2], &e), vec![1]);
        // Locally there is nothing to exclude.
        let local = JobSpec::local(2, "p", vec![]);
        assert!(next_exclusion(&local, &[], &e).is_empty());
    }

    #[test]
    fn the_environment_names_the_epoch_only_when_one_is_committed() {
        let sink = Arc::new(
            crate::ckpt_dir::DirSink::new(
                &std::env::temp_dir().join(format!("mutirao-rec-env-{}", std::process::id())),
                1,
            )
            .unwrap(),
        );
        let rec = Recovery {
            sink: sink.clone(),
            interval: 2.5,
            mode: CkptMode::Nonblocking,
            max_restarts: 3,
            rank_hosts: None,
        };
        let env = ckpt_env(&rec, 0, None);
        assert!(env.iter().all(|(k, _)| k != "MUTIRAO_RESTART_EPOCH"));
        assert!(env.contains(&("MUTIRAO_CKPT_MODE".into(), "nonblocking".into())));
        let env = ckpt_env(&rec, 2, Some(7));
        assert!(env.contains(&("MUTIRAO_RESTART_EPOCH".into(), "7".into())));
        assert!(env.contains(&("MUTIRAO_INCARNATION".into(), "2".into())));
        let _ = std::fs::remove_dir_all(
            std::env::temp_dir().join(format!("mutirao-rec-env-{}", std::process::id())),
        );
    }
}
