//! The agent's side of the owner policy ([`crate::policy`]): measure what the policy looks at
//! (load, the local clock, keyboard and mouse interrupts, the owner-active file), decide with
//! the pure [`crate::policy::step`], and tell the caller when the decision changes (the agent
//! stops or continues its grid processes). The heartbeat reads the current [`OwnerStatus`].
//!
//! Keyboard and mouse: Linux counts the interrupts of the PS/2 controller (`i8042`) and of
//! devices named keyboard or mouse in `/proc/interrupts`; a change means someone used them.
//! USB keyboards share their controller's interrupt with other devices and cannot be told
//! apart there, and containers and virtual machines often have none: then the condition
//! `input_idle_s` is not applied and [`input_measurable`] says so.

use crate::policy::{owner_reasons, step, Observation, OwnerState, Policy, Tracker};
use crate::report::parse_loadavg;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The sum of the keyboard and mouse interrupt counts in `/proc/interrupts`' text (`None`: no
/// such line).
pub fn parse_input_interrupts(text: &str) -> Option<u64> {
    let mut found = false;
    let mut sum = 0u64;
    for line in text.lines().skip(1) {
        let l = line.to_ascii_lowercase();
        if !(l.contains("i8042") || l.contains("keyboard") || l.contains("mouse")) {
            continue;
        }
        found = true;
        // "  1:   9   0   IO-APIC   1-edge   i8042": the counts follow the label.
        let counts = line.split_once(':').map(|(_, r)| r).unwrap_or("");
        sum = counts
            .split_whitespace()
            .map_while(|w| w.parse::<u64>().ok())
            .fold(sum, u64::saturating_add);
    }
    found.then_some(sum)
}

/// Can keyboard and mouse use be measured on this host?
pub fn input_measurable() -> bool {
    std::fs::read_to_string("/proc/interrupts")
        .ok()
        .and_then(|t| parse_input_interrupts(&t))
        .is_some()
}

/// The owner policy's decision now, and why.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OwnerStatus {
    /// The decision.
    pub state: OwnerState,
    /// The reasons, `; `-joined (empty when available).
    pub why: String,
}

/// Called when the decision changes: (from, to, why).
pub type OnChange = Box<dyn FnMut(OwnerState, OwnerState, &str) + Send>;

/// A running owner watch; stops when dropped.
pub struct OwnerWatch {
    status: Arc<Mutex<OwnerStatus>>,
    stop: Arc<AtomicBool>,
    th: Option<std::thread::JoinHandle<()>>,
}

impl OwnerWatch {
    /// The current decision.
    pub fn status(&self) -> OwnerStatus {
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// A handle the heartbeat can read the decision through.
    pub fn shared(&self) -> Arc<Mutex<OwnerStatus>> {
        self.status.clone()
    }
}

impl Drop for OwnerWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.th.take() {
            let _ = t.join();
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Watch the owner every `period`: `grid_running()` says how many grid processes run here
/// (not stopped), subtracted from the load to get the owner's own; `on_change` is called on
/// every change of decision. The first decision is made before this returns.
pub fn spawn_owner_watch(
    policy: Policy,
    period: Duration,
    grid_running: Box<dyn Fn() -> usize + Send>,
    mut on_change: OnChange,
) -> OwnerWatch {
    let status = Arc::new(Mutex::new(OwnerStatus::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1) as f64;
    let mut tracker = Tracker::default();
    let mut last_input: Option<(u64, Option<Instant>)> = None;
    let mut tick = move |status: &Mutex<OwnerStatus>| {
        let load = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|t| parse_loadavg(&t))
            .unwrap_or(0.0);
        let owner_load = (load - grid_running() as f64).max(0.0);
        // The count, and when it last changed (`None`: not since the agent started).
        let input_idle_s = std::fs::read_to_string("/proc/interrupts")
            .ok()
            .and_then(|t| parse_input_interrupts(&t))
            .map(|n| {
                let changed = match last_input {
                    Some((m, at)) if m == n => at,
                    Some(_) => Some(Instant::now()),
                    None => None,
                };
                last_input = Some((n, changed));
                changed.map_or(f64::INFINITY, |at| at.elapsed().as_secs_f64())
            });
        use chrono::{Datelike, Timelike};
        let t = chrono::Local::now();
        let o = Observation {
            weekday: t.weekday().num_days_from_monday() as u8,
            minute: (t.hour() * 60 + t.minute()) as u16,
            owner_load,
            idle_cpu: (cores - owner_load).max(0.0),
            input_idle_s,
            active_file: policy
                .active_file
                .as_deref()
                .is_some_and(|f| std::path::Path::new(f).exists()),
        };
        let why = owner_reasons(&policy, &o);
        let before = tracker.state;
        tracker = step(&policy, tracker, !why.is_empty(), now_ms());
        let why = why.join("; ");
        // The status first: a heartbeat `on_change` sends at once reports the new one.
        *status.lock().unwrap_or_else(|p| p.into_inner()) = OwnerStatus {
            state: tracker.state,
            why: why.clone(),
        };
        if tracker.state != before {
            on_change(before, tracker.state, &why);
        }
    };
    tick(&status);
    let (st, s) = (status.clone(), stop.clone());
    let th = std::thread::Builder::new()
        .name("owner-watch".into())
        .spawn(move || {
            while !s.load(Ordering::SeqCst) {
                let t0 = Instant::now();
                while t0.elapsed() < period && !s.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(20).min(period));
                }
                tick(&st);
            }
        })
        .ok();
    OwnerWatch { status, stop, th }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyboard_and_mouse_interrupts_are_summed_and_absent_is_none() {
        let text = "           CPU0       CPU1\n  0:         44          0   IO-APIC   2-edge      timer\n  1:          9          3   IO-APIC   1-edge      i8042\n 12:        100          1   IO-APIC  12-edge      i8042\n 24:        500          0   PCI-MSI 1-edge      xhci_hcd\n";
        assert_eq!(parse_input_interrupts(text), Some(113));
        assert_eq!(
            parse_input_interrupts("  CPU0\n 0: 44 IO-APIC timer\n"),
            None
        );
        assert_eq!(parse_input_interrupts(""), None);
    }

    #[test]
    fn the_watch_follows_the_owner_active_file() {
        let f = std::env::temp_dir().join(format!("mutirao-owner-{}", std::process::id()));
        let _ = std::fs::remove_file(&f);
        let p = Policy::parse(&format!(
            "active_file = {:?}\ngrace_s = 0.2",
            f.display().to_string()
        ))
        .unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = seen.clone();
        let w = spawn_owner_watch(
            p,
            Duration::from_millis(30),
            Box::new(|| 0),
            Box::new(move |a, b, _| s2.lock().unwrap().push((a, b))),
        );
        assert_eq!(w.status().state, OwnerState::Available);
        std::fs::write(&f, "").unwrap();
        let t0 = Instant::now();
        while w.status().state != OwnerState::Vacate && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(w.status().why.contains("exists"), "{:?}", w.status());
        std::fs::remove_file(&f).unwrap();
        while w.status().state != OwnerState::Available && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(w);
        use OwnerState::*;
        assert_eq!(
            *seen.lock().unwrap(),
            [(Available, Suspend), (Suspend, Vacate), (Vacate, Available)]
        );
    }
}
