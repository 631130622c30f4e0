//! The agent's side: what a host reports (measured from Linux's /proc) and a heartbeat thread
//! that registers the host with the coordinator and reports again every interval the
//! coordinator asks for. The owner's state comes from the caller (its owner policy, see
//! [`crate::owner`]).

use crate::client::Client;
use crate::owner::OwnerStatus;
use crate::policy::OwnerState;
use crate::{Error, HostReport, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The 1-minute load of `/proc/loadavg`'s text.
pub fn parse_loadavg(text: &str) -> Option<f64> {
    text.split_whitespace()
        .next()?
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v >= 0.0)
}

/// `MemAvailable` of `/proc/meminfo`'s text, in MiB.
pub fn parse_mem_available_mib(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

/// Idle cores: the cores this process may use minus the 1-minute load, never below 0.
pub fn idle_cores(cores: usize, load: f64) -> f64 {
    (cores as f64 - load).max(0.0)
}

/// Measure this host now; `owner` is the owner policy's decision (default: available).
pub fn measure(name: &str, addr: &str, owner: &OwnerStatus) -> Result<HostReport> {
    measure_with(name, addr, owner, &Default::default())
}

/// [`measure`], with the properties the agent declares (`site`, …) in the report.
pub fn measure_with(
    name: &str,
    addr: &str,
    owner: &OwnerStatus,
    props: &std::collections::BTreeMap<String, String>,
) -> Result<HostReport> {
    let read = |p: &str| {
        std::fs::read_to_string(p).map_err(|e| Error::Io(format!("cannot read {p}: {e}")))
    };
    let load = parse_loadavg(&read("/proc/loadavg")?)
        .ok_or_else(|| Error::Io("/proc/loadavg: no 1-minute load".into()))?;
    let free_mem_mib = parse_mem_available_mib(&read("/proc/meminfo")?)
        .ok_or_else(|| Error::Io("/proc/meminfo: no MemAvailable line".into()))?;
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    Ok(HostReport {
        name: name.to_string(),
        addr: addr.to_string(),
        idle_cpu: idle_cores(cores, load),
        free_mem_mib,
        load,
        owner_active: owner.state != OwnerState::Available,
        owner: owner.state,
        owner_why: owner.why.clone(),
        props: props.clone(),
        // The agent adds its rank journal's report and its usage history (see `mutirao agent`).
        jobs: Vec::new(),
        usage: None,
    })
}

/// A running heartbeat; stops (and joins its thread) when dropped.
pub struct Heartbeat {
    stop: Arc<AtomicBool>,
    th: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.th.take() {
            let _ = t.join();
        }
    }
}

/// How the heartbeat thread learns its host's report each time.
pub type Measure = Box<dyn FnMut() -> Result<HostReport> + Send>;

/// Register with `client`'s coordinator, then heartbeat with a fresh `measure()` every
/// interval the coordinator answers. A failed beat is reported on stderr and retried next
/// interval; a coordinator that forgot the host (404, e.g. a new database) is registered with
/// again. The first registration happens before this returns, so a wrong token or address is
/// an error here.
pub fn spawn_heartbeat(client: Client, measure: Measure) -> Result<Heartbeat> {
    spawn_heartbeat_nudged(client, measure, Arc::new(AtomicBool::new(false)))
}

/// [`spawn_heartbeat`], beating at once whenever `nudge` is set (and clearing it): the owner
/// watch sets it when its decision changes, so that the coordinator learns of it at once.
pub fn spawn_heartbeat_nudged(
    client: Client,
    mut measure: Measure,
    nudge: Arc<AtomicBool>,
) -> Result<Heartbeat> {
    let first = client.register(&measure()?)?;
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let mut interval = Duration::from_secs_f64(first.heartbeat_interval_s.clamp(0.05, 3600.0));
    let th = std::thread::spawn(move || loop {
        let t0 = Instant::now();
        while t0.elapsed() < interval {
            if s.load(Ordering::SeqCst) {
                return;
            }
            if nudge.swap(false, Ordering::SeqCst) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20).min(interval));
        }
        let r = measure().and_then(|r| match client.heartbeat(&r) {
            Err(Error::Remote { status: 404, .. }) => client.register(&r),
            other => other,
        });
        match r {
            Ok(reg) => {
                interval = Duration::from_secs_f64(reg.heartbeat_interval_s.clamp(0.05, 3600.0))
            }
            Err(e) => eprintln!("mutirao agent: heartbeat to the coordinator failed: {e}"),
        }
    });
    Ok(Heartbeat { stop, th: Some(th) })
}

/// What a retrying heartbeat says when its state changes (for the agent's log).
pub type OnChange = Box<dyn Fn(&str) + Send>;

/// First wait between two registration attempts; doubled after each failure up to
/// [`RETRY_MAX`].
pub const RETRY_FIRST: Duration = Duration::from_secs(1);
/// Longest wait between two registration attempts.
pub const RETRY_MAX: Duration = Duration::from_secs(30);

/// Like [`spawn_heartbeat_nudged`], but never gives up on the coordinator: a coordinator not
/// up yet, gone, or refusing is tried again with backoff ([`RETRY_FIRST`] doubling to
/// [`RETRY_MAX`]), and every change of state (registered, lost, refused) is told once through
/// `on_change`. Machines boot in any order; an agent does not exit for it. Only a report
/// that cannot be measured at all is an error.
pub fn spawn_heartbeat_retrying(
    client: Client,
    mut measure: Measure,
    nudge: Arc<AtomicBool>,
    on_change: OnChange,
) -> Result<Heartbeat> {
    // Measuring is local: its failure is a real error of this host, said at once.
    measure()?;
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let th = std::thread::spawn(move || {
        let mut registered = false;
        let mut said: Option<String> = None;
        let mut backoff = RETRY_FIRST;
        let mut wait = Duration::ZERO;
        loop {
            let t0 = Instant::now();
            while t0.elapsed() < wait {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                if registered && nudge.swap(false, Ordering::SeqCst) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20).min(wait));
            }
            if s.load(Ordering::SeqCst) {
                return;
            }
            let r = measure().and_then(|r| {
                if registered {
                    match client.heartbeat(&r) {
                        Err(Error::Remote { status: 404, .. }) => client.register(&r),
                        other => other,
                    }
                } else {
                    client.register(&r)
                }
            });
            match r {
                Ok(reg) => {
                    if !registered {
                        on_change(&format!(
                            "registered with the coordinator at {}",
                            client.base()
                        ));
                    }
                    registered = true;
                    said = None;
                    backoff = RETRY_FIRST;
                    wait = Duration::from_secs_f64(reg.heartbeat_interval_s.clamp(0.05, 3600.0));
                }
                Err(e) => {
                    let what = match &e {
                        Error::Remote { status: 401 | 403, .. } => format!(
                            "the coordinator at {} refuses this agent's token ({e}): check the agent's --coord-token-file against the coordinator's token file; trying again every {} s",
                            client.base(),
                            RETRY_MAX.as_secs()
                        ),
                        _ if registered => format!(
                            "lost the coordinator at {} ({e}); trying again with backoff up to {} s",
                            client.base(),
                            RETRY_MAX.as_secs()
                        ),
                        _ => format!(
                            "the coordinator at {} is not reachable yet ({e}); trying again with backoff up to {} s",
                            client.base(),
                            RETRY_MAX.as_secs()
                        ),
                    };
                    // Once per state, not once per attempt.
                    let kind = what.split(" (").next().unwrap_or("").to_string();
                    if said.as_deref() != Some(kind.as_str()) {
                        on_change(&what);
                        said = Some(kind);
                    }
                    if matches!(
                        e,
                        Error::Remote {
                            status: 401 | 403,
                            ..
                        }
                    ) {
                        backoff = RETRY_MAX;
                    }
                    registered = false;
                    wait = backoff;
                    backoff = (backoff * 2).min(RETRY_MAX);
                }
            }
        }
    });
    Ok(Heartbeat { stop, th: Some(th) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_files_are_read_and_nonsense_is_none() {
        assert_eq!(parse_loadavg("0.52 0.58 0.59 1/467 12345\n"), Some(0.52));
        assert_eq!(parse_loadavg(""), None);
        assert_eq!(parse_loadavg("-1 0 0"), None);
        let mi = "MemTotal:       16384000 kB\nMemFree:  100 kB\nMemAvailable:    8192000 kB\n";
        assert_eq!(parse_mem_available_mib(mi), Some(8000));
        assert_eq!(parse_mem_available_mib("MemTotal: 1 kB\n"), None);
        assert_eq!(idle_cores(4, 1.5), 2.5);
        assert_eq!(idle_cores(2, 3.0), 0.0);
        let r = measure("me", "127.0.0.1:7207", &OwnerStatus::default()).unwrap();
        assert!(
            r.idle_cpu >= 0.0 && r.load >= 0.0 && r.free_mem_mib > 0,
            "{r:?}"
        );
        assert!(r.validate().is_ok());
    }
}
