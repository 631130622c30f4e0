//! `mutirao testbed up` as a user runs it (needs root; without it each test prints `skipped: …`
//! and returns): the links' packet work goes to kernel threads by default, and a machine
//! without ethtool still gets a working testbed, with a warning, the work left in softirq.

mod common;
use common::{root_skip_reason, Scratch, MUTIRAO};

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const SPEC: &str = r#"
[[site]]
name = "a"
nic_mbit = 200
hosts = [ { name = "a1", cpu = 0.5 } ]

[[site]]
name = "b"
nic_mbit = 200
hosts = [ { name = "b1", cpu = 0.5 } ]

[[wan]]
sites = ["a", "b"]
mbit = 30
"#;

/// Print why the test is skipped (`skipped: …`, as the other testbed tests do) and say so.
fn skipped(why: Option<&str>) -> bool {
    if let Some(why) = why {
        println!("skipped: {why}");
        eprintln!("skipped: {why}");
    }
    why.is_some()
}

/// A testbed named after the test, brought up by the CLI with its state in a scratch
/// directory; taken down on drop (also when an assertion fails), then the directory removed.
struct Bed {
    dir: Scratch,
    name: String,
}

impl Bed {
    fn new(name: &str) -> Bed {
        let dir = Scratch::new(&format!("tbcli-{name}"));
        std::fs::create_dir_all(dir.join("state")).expect("state dir");
        std::fs::write(dir.join("spec.toml"), SPEC).expect("spec");
        Bed {
            dir,
            name: format!("{name}{}", std::process::id() % 100_000),
        }
    }

    fn testbed(&self, args: &[&str], path: Option<&Path>) -> Output {
        let mut c = Command::new(MUTIRAO);
        c.arg("testbed").args(args);
        c.arg("--state-dir").arg(self.dir.join("state"));
        if let Some(p) = path {
            c.env("PATH", p);
        }
        c.output().expect("run mutirao testbed")
    }

    fn up(&self, path: Option<&Path>) -> Output {
        let spec = self.dir.join("spec.toml");
        let spec = spec.to_str().expect("utf-8 path");
        self.testbed(&["up", spec, "--name", &self.name, "--no-agents"], path)
    }

    fn status(&self) -> String {
        let out = self.testbed(&["status", &self.name], None);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        let _ = self.testbed(&["down", &self.name], None);
        let _ = std::fs::remove_dir_all(&self.dir.0);
    }
}

/// Where `program` is on this process's PATH.
fn on_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(program))
            .find(|f| f.is_file())
    })
}

#[test]
fn testbed_up_moves_the_packet_work_into_kernel_threads_by_default() {
    let no_ethtool = on_path("ethtool")
        .is_none()
        .then_some("needs ethtool (apt-get install ethtool)");
    if skipped(root_skip_reason().or(no_ethtool)) {
        return;
    }
    let s = Bed::new("pt");
    let out = s.up(None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("cannot move"), "no warning expected: {err}");
    // Two hosts' eth0, their two site ports and the WAN's two ends.
    let status = s.status();
    assert!(
        status.contains("packet work: 6 of 6 kernel threads running"),
        "{status}"
    );
}

#[test]
fn without_ethtool_testbed_up_warns_and_leaves_the_packet_work_on_the_hosts() {
    if skipped(root_skip_reason()) {
        return;
    }
    // A PATH with what `up` runs (ip, tc, sh) but no ethtool.
    let s = Bed::new("noeth");
    let bin = s.dir.join("bin");
    std::fs::create_dir_all(&bin).expect("bin dir");
    for p in ["ip", "tc", "sh"] {
        let target = on_path(p).expect("ip, tc and sh installed");
        std::os::unix::fs::symlink(target, bin.join(p)).expect("symlink");
    }
    let out = s.up(Some(&bin));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "up must still work: {err}");
    assert!(
        err.contains("cannot move the emulated network's packet work into kernel threads")
            && err.contains("apt install ethtool"),
        "{err}"
    );
    assert_eq!(
        err.matches("cannot move").count(),
        1,
        "one warning, not one per interface: {err}"
    );
    let status = s.status();
    assert!(
        status.contains("packet work: on the hosts' CPU quotas"),
        "{status}"
    );
}
