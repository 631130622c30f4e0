//! The system side: running `ip`/`tc`, the cgroup-v1 cpu hierarchy, finding and removing
//! everything a testbed made (by its prefix), killing its processes.

use crate::plan::prefix_of;
use crate::Error;
use rustix::process::{kill_process, Pid, Signal};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where `ip netns` keeps its named network namespaces.
pub const NETNS_DIR: &str = "/run/netns";

/// Is the effective user root?
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Fail with [`Error::NotRoot`] unless running as root.
pub fn require_root() -> Result<(), Error> {
    if is_root() {
        Ok(())
    } else {
        Err(Error::NotRoot)
    }
}

/// Mount point of the cgroup-v1 hierarchy that has the `cpu` controller (from /proc/self/mounts).
pub fn cpu_cgroup_root() -> Result<PathBuf, Error> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").map_err(|source| Error::Io {
        what: "cannot read".into(),
        path: "/proc/self/mounts".into(),
        source,
    })?;
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 4 && f[2] == "cgroup" && f[3].split(',').any(|o| o == "cpu"))
                .then(|| PathBuf::from(f[1]))
        })
        .next()
        .ok_or(Error::NoCpuCgroup)
}

/// `n` random bytes from the kernel.
pub fn random_bytes(n: usize) -> Result<Vec<u8>, Error> {
    let mut buf = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|source| Error::Io {
            what: "cannot read".into(),
            path: "/dev/urandom".into(),
            source,
        })?;
    Ok(buf)
}

/// A fresh random testbed prefix (`mtb` + 6 hex digits).
pub fn random_prefix() -> Result<String, Error> {
    let b = random_bytes(3)?;
    Ok(format!("mtb{:02x}{:02x}{:02x}", b[0], b[1], b[2]))
}

/// Process ids of the kernel's threaded-NAPI workers of devices named `dev` (`napi/<dev>-<id>`,
/// children of kthreadd) now running. Unreadable entries (a process that just exited) are
/// skipped.
pub fn napi_threads(dev: &str) -> std::collections::BTreeSet<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Default::default();
    };
    dir.filter_map(|e| {
        let e = e.ok()?;
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
        is_napi_thread(&stat, dev).then_some(pid)
    })
    .collect()
}

/// Is this `/proc/PID/stat` line a threaded-NAPI kernel thread's of a device named `dev` (name
/// `napi/<dev>-<napi id>`, parent 2)?
pub fn is_napi_thread(stat: &str, dev: &str) -> bool {
    // "pid (comm) state ppid …"; comm may hold spaces and parentheses, so split at the last ')'.
    let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
        return false;
    };
    let comm = &stat[open + 1..close];
    let ppid = stat[close + 1..].split_whitespace().nth(1);
    let id = comm
        .strip_prefix("napi/")
        .and_then(|c| c.strip_prefix(dev))
        .and_then(|c| c.strip_prefix('-'));
    id.is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit())) && ppid == Some("2")
}

/// Runs setup commands, counting them so a test can inject a failure after a given step.
#[derive(Debug, Default)]
pub struct Runner {
    /// Commands run so far.
    pub steps: usize,
    /// Fail (as if the command had failed) once this many commands have run.
    pub fail_after: Option<usize>,
}

impl Runner {
    /// Run `program args…`, returning its stdout, or an error with its stderr.
    pub fn run(&mut self, program: &str, args: &[&str]) -> Result<String, Error> {
        self.step(program, args, None)
    }

    /// Run `program args…` with `input` on its standard input (e.g. `tc -batch -`).
    pub fn run_input(
        &mut self,
        program: &str,
        args: &[&str],
        input: &str,
    ) -> Result<String, Error> {
        self.step(program, args, Some(input))
    }

    fn step(&mut self, program: &str, args: &[&str], input: Option<&str>) -> Result<String, Error> {
        if self.fail_after == Some(self.steps) {
            return Err(Error::Injected(self.steps));
        }
        self.steps += 1;
        run_with(program, args, input)
    }
}

/// Run `program args…` once, returning stdout or [`Error::Command`] with stderr.
pub fn run(program: &str, args: &[&str]) -> Result<String, Error> {
    run_with(program, args, None)
}

fn run_with(program: &str, args: &[&str], input: Option<&str>) -> Result<String, Error> {
    let spawn_err = |source| Error::Spawn {
        program: program.to_string(),
        source,
    };
    let out = match input {
        None => Command::new(program)
            .args(args)
            .output()
            .map_err(spawn_err)?,
        Some(text) => {
            let mut child = Command::new(program)
                .args(args)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(spawn_err)?;
            // Write on a thread: a long batch must not block on a full pipe while the child
            // blocks on its full stdout.
            let mut stdin = child
                .stdin
                .take()
                .ok_or_else(|| spawn_err(std::io::Error::other("no standard input pipe")))?;
            let text = text.to_string();
            let writer = std::thread::spawn(move || stdin.write_all(text.as_bytes()));
            let out = child.wait_with_output().map_err(spawn_err)?;
            writer
                .join()
                .map_err(|_| spawn_err(std::io::Error::other("stdin writer panicked")))?
                .map_err(spawn_err)?;
            out
        }
    };
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(Error::Command {
            cmd: format!("{program} {}", args.join(" ")),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

fn names_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Network namespaces (in [`NETNS_DIR`]) made by the testbed with this prefix.
pub fn namespaces_of(prefix: &str) -> Vec<String> {
    let mut v: Vec<String> = names_in(Path::new(NETNS_DIR))
        .into_iter()
        .filter(|n| prefix_of(n) == Some(prefix))
        .collect();
    v.sort();
    v
}

/// Links in the root network namespace made by the testbed with this prefix.
pub fn root_links_of(prefix: &str) -> Vec<String> {
    let mut v: Vec<String> = names_in(Path::new("/sys/class/net"))
        .into_iter()
        .filter(|n| prefix_of(n) == Some(prefix))
        .collect();
    v.sort();
    v
}

/// Every prefix that still has a namespace, root link or cgroup on this machine.
pub fn live_prefixes() -> Vec<String> {
    let mut names = names_in(Path::new(NETNS_DIR));
    names.extend(names_in(Path::new("/sys/class/net")));
    if let Ok(root) = cpu_cgroup_root() {
        names.extend(names_in(&root));
    }
    let mut v: Vec<String> = names
        .iter()
        .filter_map(|n| prefix_of(n).map(str::to_string))
        .collect();
    v.sort();
    v.dedup();
    v
}

fn pids_in_file(path: &Path) -> Vec<i32> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|t| t.parse().ok())
        .collect()
}

/// Send SIGKILL to `pid` unless it is this process or init; a process already gone is fine.
pub fn kill(pid: i32) {
    if pid <= 1 || pid as u32 == std::process::id() {
        return;
    }
    if let Some(p) = Pid::from_raw(pid) {
        // ESRCH (already gone) is the only expected error; nothing to do about others here.
        let _ = kill_process(p, Signal::KILL);
    }
}

/// What [`teardown`] removed.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Teardown {
    /// Processes killed.
    pub killed: usize,
    /// Network namespaces deleted.
    pub namespaces: Vec<String>,
    /// Root-namespace links deleted.
    pub links: Vec<String>,
    /// Cgroup directories removed.
    pub cgroups: Vec<PathBuf>,
}

impl Teardown {
    /// Did it remove nothing at all?
    pub fn is_empty(&self) -> bool {
        self.killed == 0
            && self.namespaces.is_empty()
            && self.links.is_empty()
            && self.cgroups.is_empty()
    }
}

/// Remove everything the testbed with `prefix` made, found by name: kill every process in its
/// cgroups and namespaces, delete its root-namespace links (and with them its routes), its
/// namespaces (and with them every link and qdisc inside) and its cgroups. Idempotent; bounded
/// in time (a few seconds at most). Fails with [`Error::Leftovers`] if something survived.
pub fn teardown(prefix: &str) -> Result<Teardown, Error> {
    if !crate::plan::is_prefix(prefix) {
        return Err(Error::BadPrefix(prefix.to_string()));
    }
    let mut report = Teardown::default();
    let cg = cpu_cgroup_root().ok().map(|r| r.join(prefix));
    let cg_children: Vec<PathBuf> = cg
        .as_ref()
        .map(|d| {
            names_in(d)
                .into_iter()
                .map(|n| d.join(n))
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default();
    let namespaces = namespaces_of(prefix);

    // 1. Kill every process: those in the cgroups and those in the namespaces.
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let mut pids: Vec<i32> = Vec::new();
        for c in &cg_children {
            pids.extend(pids_in_file(&c.join("cgroup.procs")));
        }
        for ns in &namespaces {
            if let Ok(out) = run("ip", &["netns", "pids", ns]) {
                pids.extend(out.split_whitespace().filter_map(|t| t.parse::<i32>().ok()));
            }
        }
        pids.retain(|&p| p > 1 && p as u32 != std::process::id());
        pids.sort_unstable();
        pids.dedup();
        if pids.is_empty() || Instant::now() > deadline {
            break;
        }
        for &p in &pids {
            kill(p);
        }
        report.killed += pids.len();
        std::thread::sleep(Duration::from_millis(20));
    }

    // 2. Root-namespace links (their routes go with them), then the namespaces.
    for link in root_links_of(prefix) {
        if run("ip", &["link", "del", &link]).is_ok() {
            report.links.push(link);
        }
    }
    for ns in &namespaces {
        if run("ip", &["netns", "del", ns]).is_ok() {
            report.namespaces.push(ns.clone());
        }
    }

    // 3. Cgroups: children first; rmdir may briefly see EBUSY while killed tasks exit.
    if let Some(dir) = &cg {
        for d in cg_children.iter().chain(std::iter::once(dir)) {
            if !d.exists() {
                continue;
            }
            let until = Instant::now() + Duration::from_secs(2);
            loop {
                match std::fs::remove_dir(d) {
                    Ok(()) => {
                        report.cgroups.push(d.clone());
                        break;
                    }
                    Err(_) if Instant::now() < until => {
                        for p in pids_in_file(&d.join("cgroup.procs")) {
                            kill(p);
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(_) => break,
                }
            }
        }
    }

    let left = leftovers(prefix);
    if left.is_empty() {
        Ok(report)
    } else {
        Err(Error::Leftovers {
            prefix: prefix.to_string(),
            left,
        })
    }
}

/// Everything of the testbed `prefix` still present: namespaces, root links, cgroup directory.
pub fn leftovers(prefix: &str) -> Vec<String> {
    let mut left: Vec<String> = namespaces_of(prefix)
        .into_iter()
        .map(|n| format!("network namespace {n}"))
        .collect();
    left.extend(
        root_links_of(prefix)
            .into_iter()
            .map(|l| format!("link {l}")),
    );
    if let Ok(root) = cpu_cgroup_root() {
        let d = root.join(prefix);
        if d.exists() {
            left.push(format!("cgroup {}", d.display()));
        }
    }
    left
}

#[cfg(test)]
mod tests {
    use super::is_napi_thread;

    #[test]
    fn a_napi_worker_is_a_kernel_thread_named_napi() {
        assert!(is_napi_thread(
            "4242 (napi/eth0-258) S 2 0 0 0 -1 2129984",
            "eth0"
        ));
        assert!(is_napi_thread("4243 (napi/w0-9) R 2 0 0 0", "w0"));
        // Another device's, or a device whose name only starts the same.
        assert!(!is_napi_thread("4243 (napi/w0-9) R 2 0 0 0", "eth0"));
        assert!(!is_napi_thread("4245 (napi/eth01-7) S 2 0 0 0", "eth0"));
        // A user process that calls itself napi/… is not one.
        assert!(!is_napi_thread("4244 (napi/eth0-1) S 1234 4244 0", "eth0"));
        assert!(!is_napi_thread("17 (ksoftirqd/1) S 2 0 0 0", "eth0"));
        // A comm with spaces and a parenthesis does not confuse the parent's field.
        assert!(!is_napi_thread("9 (napi/eth0-1) x (c) S 2 0", "eth0"));
        assert!(!is_napi_thread("garbage", "eth0"));
    }
}
