//! The agent's side of the owner policy ([`crate::policy`]): measure what the policy looks at
//! (load, the local clock, keyboard and mouse interrupts, the owner-active file), decide with
//! the pure [`crate::policy::step`], and tell the caller when the decision changes (the agent
//! stops or continues its grid processes). The heartbeat reads the current [`OwnerStatus`].
//!
//! The owner's load is the CPU time used on this host by processes that are not the grid's,
//! over each period, in cores ([`owner_load`]): the host's CPU time — its cgroup-v1 `cpuacct`
//! group's `cpuacct.usage` when the agent runs in one other than the root; else, when it runs in
//! a cgroup-v1 `cpu` group other than the root (a testbed host where `cpu` and `cpuacct` are
//! separate hierarchies, or where the `cpuacct` hierarchy is not mounted in the agent's mount
//! namespace, as under `ip netns exec`), the CPU time of the processes in the same group
//! (`/proc/PID/cgroup`); else the machine's busy time
//! from `/proc/stat` — minus that of the agent and its descendants (the ranks it started and
//! what they start), from `/proc/PID/stat`. [`HostCpu`] says which source a host uses.
//!
//! Keyboard and mouse: Linux counts the interrupts of the PS/2 controller (`i8042`) and of
//! devices named keyboard or mouse in `/proc/interrupts`; a change means someone used them.
//! USB keyboards share their controller's interrupt with other devices and cannot be told
//! apart there, and containers and virtual machines often have none: then the condition
//! `input_idle_s` is not applied and [`input_measurable`] says so.

use crate::policy::{owner_reasons, step, Observation, OwnerState, Policy, Tracker};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
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

/// CPU time and wall time at one moment, for the owner's load. Times are cumulative, in
/// nanoseconds; only differences between two samples mean anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuSample {
    /// A monotonic clock.
    pub wall_ns: u64,
    /// CPU time used by everything on the host (its cgroup, or the whole machine).
    pub host_ns: u64,
    /// CPU time used by the agent and the grid's processes (the agent's descendants).
    pub grid_ns: u64,
}

/// The owner's load between two samples, in cores: the host's CPU time not used by the grid,
/// over the wall time between them. `None` when no wall time passed. The grid's time can
/// shrink when one of its processes leaves the agent's tree (reparented before its parent
/// reaped it); then its delta counts as 0.
pub fn owner_load(prev: &CpuSample, cur: &CpuSample) -> Option<f64> {
    let wall = cur.wall_ns.checked_sub(prev.wall_ns).filter(|w| *w > 0)?;
    let host = cur.host_ns.saturating_sub(prev.host_ns);
    let grid = cur.grid_ns.saturating_sub(prev.grid_ns);
    Some(host.saturating_sub(grid) as f64 / wall as f64)
}

/// The machine's busy time, in clock ticks, from `/proc/stat`'s text: user + nice + system +
/// irq + softirq + steal of the `cpu` line (guest time is already in user and nice; idle and
/// iowait are not busy).
pub fn parse_proc_stat_busy(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|w| w.parse::<u64>().ok())
        .collect::<Option<_>>()?;
    if f.len() < 4 {
        return None;
    }
    let at = |i: usize| f.get(i).copied().unwrap_or(0);
    // user nice system idle iowait irq softirq steal guest guest_nice
    Some(
        [at(0), at(1), at(2), at(5), at(6), at(7)]
            .into_iter()
            .fold(0u64, u64::saturating_add),
    )
}

/// What the owner watch needs of `/proc/PID/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PidStat {
    /// The parent's pid.
    pub ppid: u32,
    /// utime + stime + cutime + cstime, in clock ticks: the process's own CPU time and that of
    /// the children it reaped (so a rank that ended still counts, in its parent's).
    pub ticks: u64,
}

/// Parse `/proc/PID/stat`'s text. The command name (field 2) is in parentheses and may hold
/// spaces and parentheses itself, so the fields are counted from the last `)`.
pub fn parse_pid_stat(text: &str) -> Option<PidStat> {
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // f[0] is field 3 (state): ppid is field 4, utime..cstime fields 14..17.
    let ppid = f.get(1)?.parse::<u32>().ok()?;
    let mut ticks = 0u64;
    for i in 11..=14 {
        // cutime and cstime are signed in the kernel's format.
        let v = f.get(i)?.parse::<i64>().ok()?;
        ticks = ticks.saturating_add(v.max(0) as u64);
    }
    Some(PidStat { ppid, ticks })
}

/// `pid` and every process under it, given every process's (pid, parent).
pub fn descendants(procs: &[(u32, u32)], pid: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for &(p, pp) in procs {
        if p != pp {
            children.entry(pp).or_default().push(p);
        }
    }
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        if let Some(c) = children.get(&out[i]) {
            for &p in c {
                if !out.contains(&p) {
                    out.push(p);
                }
            }
        }
        i += 1;
    }
    out
}

/// The path of this process's group in the cgroup-v1 hierarchy with `controller`, from
/// `/proc/self/cgroup`'s text (`ID:CONTROLLERS:PATH` lines).
pub fn cgroup_v1_path(proc_cgroup: &str, controller: &str) -> Option<String> {
    proc_cgroup.lines().find_map(|l| {
        let mut it = l.splitn(3, ':');
        let (_, ctrls, path) = (it.next()?, it.next()?, it.next()?);
        ctrls
            .split(',')
            .any(|c| c == controller)
            .then(|| path.to_string())
    })
}

/// Where the cgroup-v1 hierarchy with `controller` is mounted, from `/proc/self/mountinfo`'s
/// text: (the hierarchy's directory shown there, the mount point).
pub fn cgroup_v1_mount(mountinfo: &str, controller: &str) -> Option<(String, String)> {
    mountinfo.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        let mut post = post.split_whitespace();
        if post.next()? != "cgroup" {
            return None;
        }
        let opts = post.nth(1)?;
        if !opts.split(',').any(|o| o == controller) {
            return None;
        }
        let pre: Vec<&str> = pre.split_whitespace().collect();
        Some((unescape_mount(pre.get(3)?), unescape_mount(pre.get(4)?)))
    })
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The directory of a cgroup-v1 group: `path` (from `/proc/self/cgroup`) under the hierarchy
/// mounted at `mountpoint` showing the hierarchy's directory `root`. `None` for the root group
/// (it holds the whole machine) or a group outside what the mount shows.
pub fn cgroup_dir(root: &str, mountpoint: &str, path: &str) -> Option<PathBuf> {
    let rel = if root == "/" {
        path
    } else {
        let r = path.strip_prefix(root)?;
        if !(r.is_empty() || r.starts_with('/')) {
            return None;
        }
        r
    };
    let rel = rel.trim_matches('/');
    (!rel.is_empty()).then(|| Path::new(mountpoint).join(rel))
}

/// Where an agent reads its host's CPU time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostCpu {
    /// The `cpuacct.usage` file of the agent's cgroup-v1 `cpuacct` group.
    Cpuacct(PathBuf),
    /// The processes in the agent's group (`path`) of the cgroup-v1 hierarchy with
    /// `controller`, found by their `/proc/PID/cgroup`: the host's CPU time is the sum of
    /// theirs (a process that ends counts in its parent's, if the parent is in the group).
    Group {
        /// `cpuacct` or `cpu`.
        controller: String,
        /// The group's path in that hierarchy.
        path: String,
    },
    /// The machine's busy time in `/proc/stat`.
    Machine,
}

impl HostCpu {
    /// Pick the source from `/proc/self/cgroup`'s and `/proc/self/mountinfo`'s texts: the
    /// `cpuacct` group if it is not the root (its `cpuacct.usage` if the hierarchy is mounted
    /// here, else its processes), else the `cpu` group's processes if it is not the root, else
    /// the machine.
    pub fn choose(proc_cgroup: &str, mountinfo: &str) -> HostCpu {
        let group =
            |c: &str| cgroup_v1_path(proc_cgroup, c).filter(|p| !p.trim_matches('/').is_empty());
        if let Some(path) = group("cpuacct") {
            let dir = cgroup_v1_mount(mountinfo, "cpuacct")
                .and_then(|(root, mnt)| cgroup_dir(&root, &mnt, &path));
            return match dir {
                Some(d) => HostCpu::Cpuacct(d.join("cpuacct.usage")),
                None => HostCpu::Group {
                    controller: "cpuacct".into(),
                    path,
                },
            };
        }
        match group("cpu") {
            Some(path) => HostCpu::Group {
                controller: "cpu".into(),
                path,
            },
            None => HostCpu::Machine,
        }
    }

    /// The source this process would use.
    pub fn detect() -> HostCpu {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        HostCpu::choose(&read("/proc/self/cgroup"), &read("/proc/self/mountinfo"))
    }
}

impl std::fmt::Display for HostCpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostCpu::Cpuacct(p) => write!(f, "the cgroup's {}", p.display()),
            HostCpu::Group { controller, path } => {
                write!(f, "the processes of its {controller} cgroup {path}")
            }
            HostCpu::Machine => f.write_str("the machine's /proc/stat"),
        }
    }
}

/// Nanoseconds per clock tick of `/proc/stat` and `/proc/PID/stat`: the kernel reports them
/// in USER_HZ, 100 on every architecture but Alpha (what `getconf CLK_TCK` prints).
const NS_PER_TICK: u64 = 10_000_000;

/// Every process's pid and `/proc/PID/stat`.
fn all_pid_stats() -> HashMap<u32, PidStat> {
    let mut out = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        // A process may end between the listing and the read: it is left out.
        if let Some(s) = std::fs::read_to_string(e.path().join("stat"))
            .ok()
            .and_then(|t| parse_pid_stat(&t))
        {
            out.insert(pid, s);
        }
    }
    out
}

/// Sample this host's CPU time from `source`, the grid's being the process `agent` and its
/// descendants. `None` when the host's CPU time cannot be read.
pub fn sample_cpu(source: &HostCpu, agent: u32, clock: Instant) -> Option<CpuSample> {
    let tick = NS_PER_TICK;
    let stats = all_pid_stats();
    let tree: Vec<(u32, u32)> = stats.iter().map(|(p, s)| (*p, s.ppid)).collect();
    let sum = |pids: &mut dyn Iterator<Item = u32>| {
        pids.filter_map(|p| stats.get(&p))
            .fold(0u64, |a, s| a.saturating_add(s.ticks))
            .saturating_mul(tick)
    };
    let grid_ns = sum(&mut descendants(&tree, agent).into_iter());
    let host_ns = match source {
        HostCpu::Cpuacct(f) => std::fs::read_to_string(f)
            .ok()?
            .trim()
            .parse::<u64>()
            .ok()?,
        HostCpu::Group { controller, path } => sum(&mut stats.keys().copied().filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/cgroup"))
                .ok()
                .and_then(|t| cgroup_v1_path(&t, controller))
                .is_some_and(|g| g == *path)
        })),
        HostCpu::Machine => {
            parse_proc_stat_busy(&std::fs::read_to_string("/proc/stat").ok()?)?.saturating_mul(tick)
        }
    };
    Some(CpuSample {
        wall_ns: clock.elapsed().as_nanos() as u64,
        host_ns,
        grid_ns,
    })
}

/// A sampler for [`spawn_owner_watch`]: this host's CPU time from [`HostCpu::detect`], the
/// grid's being this process's and its descendants'. Returns the source too (to log it).
pub fn host_sampler() -> (Sampler, HostCpu) {
    let source = HostCpu::detect();
    let (s, agent, clock) = (source.clone(), std::process::id(), Instant::now());
    (Box::new(move || sample_cpu(&s, agent, clock)), source)
}

/// Gives a [`CpuSample`] each time it is called (`None`: nothing could be read).
pub type Sampler = Box<dyn FnMut() -> Option<CpuSample> + Send>;

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

/// Watch the owner every `period`: `sample` reads the host's and the grid's CPU time (see
/// [`host_sampler`]), the owner's load being the difference over the period ([`owner_load`]);
/// `on_change` is called on every change of decision. The first decision is made before this
/// returns, over a first period of at most 200 ms. A period whose sample cannot be read keeps
/// the last load.
pub fn spawn_owner_watch(
    policy: Policy,
    period: Duration,
    mut sample: Sampler,
    mut on_change: OnChange,
) -> OwnerWatch {
    let status = Arc::new(Mutex::new(OwnerStatus::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1) as f64;
    let mut tracker = Tracker::default();
    let mut last_input: Option<(u64, Option<Instant>)> = None;
    let mut last_sample = sample();
    let mut owner_load_now = 0.0;
    std::thread::sleep(period.min(Duration::from_millis(200)));
    let mut tick = move |status: &Mutex<OwnerStatus>| {
        if let Some(cur) = sample() {
            if let Some(l) = last_sample.and_then(|prev| owner_load(&prev, &cur)) {
                owner_load_now = l;
            }
            last_sample = Some(cur);
        }
        let owner_load = owner_load_now;
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
            Box::new(|| None),
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

    #[test]
    fn the_owner_s_load_is_the_host_s_cpu_time_minus_the_grid_s_over_the_wall_time() {
        let s = |wall_ns, host_ns, grid_ns| CpuSample {
            wall_ns,
            host_ns,
            grid_ns,
        };
        // 2 s: the host used 3 core-seconds, the grid 1: the owner 1 core.
        let l = owner_load(
            &s(1_000_000_000, 5_000_000_000, 4_000_000_000),
            &s(3_000_000_000, 8_000_000_000, 5_000_000_000),
        );
        assert!((l.unwrap() - 1.0).abs() < 1e-9, "{l:?}");
        // The grid used everything: no owner.
        assert_eq!(
            owner_load(&s(0, 0, 0), &s(1_000_000_000, 2_000_000_000, 2_000_000_000)),
            Some(0.0)
        );
        // The grid's time shrank (a process left its tree): counts as 0, the host's all the owner's.
        assert_eq!(
            owner_load(&s(0, 0, 9_000_000_000), &s(1_000_000_000, 500_000_000, 0)),
            Some(0.5)
        );
        // The grid's delta larger than the host's (sampled a moment apart): never negative.
        assert_eq!(
            owner_load(&s(0, 0, 0), &s(1_000_000_000, 100, 200)),
            Some(0.0)
        );
        // No wall time, or the clock went back: nothing to say.
        assert_eq!(owner_load(&s(5, 0, 0), &s(5, 10, 0)), None);
        assert_eq!(owner_load(&s(6, 0, 0), &s(5, 10, 0)), None);
    }

    #[test]
    fn proc_stat_busy_time_leaves_out_idle_iowait_and_guest() {
        let text = "cpu  100 20 30 1000 50 4 6 2 70 9\ncpu0 50 10 15 500 25 2 3 1 35 4\nintr 1 2\n";
        assert_eq!(parse_proc_stat_busy(text), Some(100 + 20 + 30 + 4 + 6 + 2));
        // An old kernel with four fields.
        assert_eq!(parse_proc_stat_busy("cpu 1 2 3 4\n"), Some(6));
        assert_eq!(parse_proc_stat_busy("cpu0 1 2 3 4\n"), None);
        assert_eq!(parse_proc_stat_busy("cpu 1 x 3 4\n"), None);
        assert_eq!(parse_proc_stat_busy("cpu 1 2\n"), None);
    }

    #[test]
    fn pid_stat_counts_own_and_reaped_children_s_time_past_an_awkward_name() {
        let t = "4242 (my (odd) prog) S 17 4242 4242 0 -1 4194560 500 0 0 0 150 25 7 3 20 0 1 0 100 1000 50 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n";
        assert_eq!(
            parse_pid_stat(t),
            Some(PidStat {
                ppid: 17,
                ticks: 150 + 25 + 7 + 3
            })
        );
        // Negative child times (signed in the kernel's format) count as 0.
        let t = "9 (x) R 1 9 9 0 -1 0 0 0 0 0 10 5 -1 -1 20 0 1 0\n";
        assert_eq!(parse_pid_stat(t), Some(PidStat { ppid: 1, ticks: 15 }));
        assert_eq!(parse_pid_stat("9 (x) R 1 9"), None);
        assert_eq!(parse_pid_stat("9 x R 1 9 9 0 -1 0 0 0 0 0 10 5 1 1"), None);
        assert_eq!(parse_pid_stat(""), None);
    }

    #[test]
    fn the_grid_is_the_agent_and_every_process_under_it() {
        // 1 init; 10 agent; 11, 12 its ranks; 13 a rank's child; 14 its child; 20 the owner's.
        let procs = [
            (1, 0),
            (10, 1),
            (11, 10),
            (12, 10),
            (13, 11),
            (14, 13),
            (20, 1),
            (21, 20),
        ];
        let mut d = descendants(&procs, 10);
        d.sort();
        assert_eq!(d, [10, 11, 12, 13, 14]);
        assert_eq!(descendants(&procs, 12), [12]);
        // A pid that is its own parent (pid 0's entry) does not loop.
        assert_eq!(descendants(&[(0, 0)], 0), [0]);
    }

    // This machine's /proc/self/mountinfo: cpu and cpuacct mounted as separate hierarchies.
    const MOUNTS_SEPARATE: &str = "\
25 24 0:22 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
26 25 0:23 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
27 25 0:24 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
28 25 0:25 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    // A distribution's: cpu and cpuacct together, the mount point with an escaped space.
    const MOUNTS_TOGETHER: &str = "\
30 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:11 - cgroup cgroup rw,cpu,cpuacct
31 25 0:28 /docker/abc /sys/fs/my\\040cgroups rw shared:12 - cgroup cgroup rw,cpuset
";

    #[test]
    fn cgroup_paths_and_mounts_are_found_by_controller() {
        let cg = "9:name=systemd:/\n2:cpuacct:/\n1:cpu:/mtb3fa09c/h1\n0::/\n";
        assert_eq!(cgroup_v1_path(cg, "cpu").as_deref(), Some("/mtb3fa09c/h1"));
        assert_eq!(cgroup_v1_path(cg, "cpuacct").as_deref(), Some("/"));
        assert_eq!(cgroup_v1_path(cg, "memory"), None);
        assert_eq!(
            cgroup_v1_path("4:cpu,cpuacct:/a/b:c\n", "cpuacct").as_deref(),
            Some("/a/b:c")
        );
        assert_eq!(
            cgroup_v1_mount(MOUNTS_SEPARATE, "cpu"),
            Some(("/".into(), "/sys/fs/cgroup/cpu".into()))
        );
        assert_eq!(
            cgroup_v1_mount(MOUNTS_SEPARATE, "cpuacct"),
            Some(("/".into(), "/sys/fs/cgroup/cpuacct".into()))
        );
        assert_eq!(
            cgroup_v1_mount(MOUNTS_TOGETHER, "cpuacct"),
            Some(("/".into(), "/sys/fs/cgroup/cpu,cpuacct".into()))
        );
        assert_eq!(
            cgroup_v1_mount(MOUNTS_TOGETHER, "cpuset"),
            Some(("/docker/abc".into(), "/sys/fs/my cgroups".into()))
        );
        // cgroup2 is not a v1 hierarchy.
        assert_eq!(cgroup_v1_mount(MOUNTS_SEPARATE, "memory"), None);
        assert_eq!(
            cgroup_dir("/", "/sys/fs/cgroup/cpu", "/mtb1/h2"),
            Some(PathBuf::from("/sys/fs/cgroup/cpu/mtb1/h2"))
        );
        assert_eq!(cgroup_dir("/", "/sys/fs/cgroup/cpu", "/"), None);
        assert_eq!(
            cgroup_dir("/docker/abc", "/sys/fs/cgroup/cpu", "/docker/abc/x"),
            Some(PathBuf::from("/sys/fs/cgroup/cpu/x"))
        );
        assert_eq!(cgroup_dir("/docker/abc", "/m", "/docker/abc"), None);
        assert_eq!(cgroup_dir("/docker/abc", "/m", "/docker/abcd/x"), None);
    }

    #[test]
    fn the_host_s_cpu_time_comes_from_cpuacct_then_the_cpu_group_then_the_machine() {
        // A testbed host here: its cpu group, cpuacct at the root.
        let group = |c: &str, p: &str| HostCpu::Group {
            controller: c.into(),
            path: p.into(),
        };
        assert_eq!(
            HostCpu::choose("2:cpuacct:/\n1:cpu:/mtb1/h1\n", MOUNTS_SEPARATE),
            group("cpu", "/mtb1/h1")
        );
        // Under `ip netns exec` (/sys remounted: no cgroup hierarchy mounted).
        assert_eq!(
            HostCpu::choose("2:cpuacct:/\n1:cpu:/mtb1/h1\n", ""),
            group("cpu", "/mtb1/h1")
        );
        assert_eq!(
            HostCpu::choose("2:cpuacct:/mtb1/h1\n1:cpu:/mtb1/h1\n", ""),
            group("cpuacct", "/mtb1/h1")
        );
        // Its processes in both.
        assert_eq!(
            HostCpu::choose("2:cpuacct:/mtb1/h1\n1:cpu:/mtb1/h1\n", MOUNTS_SEPARATE),
            HostCpu::Cpuacct("/sys/fs/cgroup/cpuacct/mtb1/h1/cpuacct.usage".into())
        );
        assert_eq!(
            HostCpu::choose("4:cpu,cpuacct:/mtb1/h1\n", MOUNTS_TOGETHER),
            HostCpu::Cpuacct("/sys/fs/cgroup/cpu,cpuacct/mtb1/h1/cpuacct.usage".into())
        );
        assert_eq!(
            HostCpu::choose("2:cpuacct:/\n1:cpu:/\n0::/\n", MOUNTS_SEPARATE),
            HostCpu::Machine
        );
        // cgroup v2 only, or nothing readable.
        assert_eq!(HostCpu::choose("0::/user.slice\n", ""), HostCpu::Machine);
        assert_eq!(HostCpu::choose("", ""), HostCpu::Machine);
    }

    #[test]
    fn this_process_s_cpu_time_is_seen_in_its_own_sample() {
        let (source, me) = (HostCpu::detect(), std::process::id());
        let clock = Instant::now();
        let a = sample_cpu(&source, me, clock).expect("a sample of this machine");
        // Spin about 300 ms of CPU time on this thread.
        let t0 = Instant::now();
        let mut x = 0u64;
        while t0.elapsed() < Duration::from_millis(300) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let b = sample_cpu(&source, me, clock).expect("a sample of this machine");
        assert!(b.wall_ns > a.wall_ns);
        // Counted as the grid's (this process is the "agent"), at least a tick's worth.
        assert!(b.grid_ns - a.grid_ns >= 10_000_000, "{a:?} {b:?}");
        assert!(b.host_ns >= a.host_ns, "{a:?} {b:?}");
    }

    #[test]
    fn the_watch_suspends_on_the_owner_s_cpu_time_and_not_on_the_grid_s() {
        // Fake readings, one second of wall time per sample: the grid uses a core while the
        // owner is away (phase 0); then the owner's program uses a core (phase 1); then it ends.
        let phase = Arc::new(Mutex::new(0u8));
        let ph = phase.clone();
        let mut now = CpuSample::default();
        let sampler: Sampler = Box::new(move || {
            let sec = 1_000_000_000;
            now.wall_ns += sec;
            now.grid_ns += sec;
            now.host_ns += match *ph.lock().unwrap() {
                1 => 2 * sec,
                _ => sec,
            };
            Some(now)
        });
        let p = Policy::parse("max_load = 0.5\ngrace_s = 3600").unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = seen.clone();
        let w = spawn_owner_watch(
            p,
            Duration::from_millis(20),
            sampler,
            Box::new(move |a, b, why: &str| s2.lock().unwrap().push((a, b, why.to_string()))),
        );
        let wait_for = |want: OwnerState| {
            let t0 = Instant::now();
            while w.status().state != want && t0.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(10));
            }
            w.status()
        };
        // The grid's own core is not the owner's load, whatever the machine's load average.
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(w.status().state, OwnerState::Available, "{:?}", w.status());
        *phase.lock().unwrap() = 1;
        let st = wait_for(OwnerState::Suspend);
        assert_eq!(st.state, OwnerState::Suspend, "{st:?}");
        assert_eq!(st.why, "the owner's load is 1.00 > 0.5");
        *phase.lock().unwrap() = 2;
        let st = wait_for(OwnerState::Available);
        assert_eq!(st.state, OwnerState::Available, "{st:?}");
        drop(w);
        use OwnerState::*;
        let seen: Vec<_> = seen
            .lock()
            .unwrap()
            .iter()
            .map(|(a, b, _)| (*a, *b))
            .collect();
        assert_eq!(seen, [(Available, Suspend), (Suspend, Available)]);
    }
}
