//! `mutirao testbed up|status|down`: an emulated grid on this machine (see docs/testbed.md).
//!
//! A thin shell over `mutirao-testbed`: it reads the spec, keeps one state file per testbed in the
//! state directory (`NAME.json`, written atomically, first as `starting` so that a crashed `up`
//! can still be found), the hostfile (`NAME.hosts`), a sites file naming each host's site and
//! name for `mutirao calibrate --sites-file` (`NAME.sites`), the same sites and hosts as a mεμ
//! resource hierarchy (`NAME.meu`, for `mutirao resources` and `mutirao calibrate
//! --resources`), the agents' token (`NAME.token`) and logs.

use crate::fsutil::write_atomic;
use anyhow::{bail, Context};
use clap::Subcommand;
use mutirao_testbed::{self as tb, AgentLaunch, Spec, Testbed, TestbedState, UpOptions};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

const DEFAULT_STATE_DIR: &str = "/run/mutirao-testbed";
/// Overrides the default state directory for every testbed command and for the `--testbed` of
/// `calibrate`, `exec-dag` and `predict machine`.
const STATE_DIR_ENV: &str = "MUTIRAO_TESTBED_DIR";
const DEFAULT_AGENT_PORT: u16 = 7207;

#[derive(Subcommand)]
pub enum TestbedCommand {
    /// Bring up an emulated grid from a TOML spec (needs root) and leave it running: one network
    /// namespace per host with shaped links and a CPU quota, and a mutirao agent in each host.
    /// Prints the hostfile for `mutirao run --hostfile`.
    Up {
        /// The testbed spec (TOML: [[site]] name, nic_mbit, hosts = [{name, cpu}]; [[wan]] sites, mbit).
        spec: PathBuf,
        /// Name of the testbed (default: its generated prefix, e.g. mtb3fa09c).
        #[arg(long)]
        name: Option<String>,
        /// Where state files, hostfiles, tokens and agent logs are kept.
        #[arg(long, env = STATE_DIR_ENV, default_value = DEFAULT_STATE_DIR)]
        state_dir: PathBuf,
        /// Start no agents (network and CPU quotas only).
        #[arg(long)]
        no_agents: bool,
        /// TCP port every agent listens on (each host has its own address).
        #[arg(long, default_value_t = DEFAULT_AGENT_PORT)]
        agent_port: u16,
        /// Handle the links' packets in softirq context, where the kernel charges that work to
        /// whichever host's CPU quota it interrupts, instead of the default: kernel threads
        /// (threaded NAPI at nice -20; needs ethtool, else this is what you get, with a
        /// warning), so that hosts pay for their own send and receive calls only, as real ones
        /// do, not for their neighbours' traffic. The threads add a few µs per hop, more when
        /// other work keeps the machine busy (docs/testbed.md, "Packet work off the hosts").
        #[arg(long)]
        no_packet_threads: bool,
    },
    /// Show the testbeds that are up (or one), and leftovers of crashed ones.
    Status {
        /// Show only this testbed.
        name: Option<String>,
        /// Where state files are kept.
        #[arg(long, env = STATE_DIR_ENV, default_value = DEFAULT_STATE_DIR)]
        state_dir: PathBuf,
    },
    /// Tear a testbed down: kill its processes, remove its namespaces, links and cgroups.
    /// Idempotent. NAME may also be a prefix (mtb + 6 hex digits) left by a crashed `up`.
    Down {
        /// The testbed's name or prefix.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        name: Option<String>,
        /// Tear down every testbed on this machine, and every leftover of one.
        #[arg(long)]
        all: bool,
        /// Where state files are kept.
        #[arg(long, env = STATE_DIR_ENV, default_value = DEFAULT_STATE_DIR)]
        state_dir: PathBuf,
    },
}

/// The files a running testbed's users need: its hostfile, its agents' token and its resource
/// spec (`mutirao calibrate --testbed`, `mutirao exec-dag --testbed`).
pub struct TestbedFiles {
    pub hosts: PathBuf,
    pub token: PathBuf,
    pub meu: PathBuf,
}

/// The files of testbed `name` in the state directory (`MUTIRAO_TESTBED_DIR`, else the
/// default); an error says how to bring it up when it is not.
pub fn testbed_files(name: &str) -> anyhow::Result<TestbedFiles> {
    let from_env = std::env::var_os(STATE_DIR_ENV).filter(|v| !v.is_empty());
    let dir = from_env
        .as_deref()
        .map_or(Path::new(DEFAULT_STATE_DIR), Path::new);
    let f = TestbedFiles {
        hosts: dir.join(format!("{name}.hosts")),
        token: dir.join(format!("{name}.token")),
        meu: dir.join(format!("{name}.meu")),
    };
    for (what, p) in [
        ("hostfile", &f.hosts),
        ("agent token", &f.token),
        ("resource spec", &f.meu),
    ] {
        if !p.exists() {
            anyhow::bail!(
                "testbed {name:?} is not up (no {what} {}): bring it up with `mutirao testbed up SPEC.toml --name {name}`; `mutirao testbed status` lists the running ones (a testbed brought up with --state-dir DIR is found with {STATE_DIR_ENV}=DIR)",
                p.display()
            );
        }
    }
    Ok(f)
}

/// What `up` keeps in `STATE_DIR/NAME.json`.
#[derive(Serialize, Deserialize)]
struct StateFile {
    name: String,
    prefix: String,
    /// `starting` until `up` has finished, then `up`.
    status: String,
    /// Files `up` made besides this one (hostfile, token, agent logs).
    files: Vec<PathBuf>,
    testbed: Option<TestbedState>,
}

pub fn run(cmd: TestbedCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        TestbedCommand::Up {
            spec,
            name,
            state_dir,
            no_agents,
            agent_port,
            no_packet_threads,
        } => up(
            &spec,
            name,
            &state_dir,
            no_agents,
            agent_port,
            !no_packet_threads,
        ),
        TestbedCommand::Status { name, state_dir } => status(name.as_deref(), &state_dir),
        TestbedCommand::Down {
            name,
            all,
            state_dir,
        } => down(name.as_deref(), all, &state_dir),
    }
}

fn check_name(name: &str) -> anyhow::Result<()> {
    if name.is_empty()
        || name.len() > 64
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        || name.starts_with('.')
    {
        bail!("testbed name `{name}`: use 1 to 64 letters, digits, `-`, `_` or `.` (not starting with `.`)");
    }
    Ok(())
}

fn save(path: &Path, st: &StateFile) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(st).context("cannot encode testbed state")?;
    write_atomic(path, text.as_bytes())
}

fn load(path: &Path) -> anyhow::Result<StateFile> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not a testbed state file", path.display()))
}

fn state_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "json"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn need_root(what: &str) -> anyhow::Result<()> {
    tb::require_root().with_context(|| format!("cannot {what}"))
}

fn up(
    spec_path: &Path,
    name: Option<String>,
    dir: &Path,
    no_agents: bool,
    port: u16,
    packet_threads: bool,
) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(spec_path)
        .with_context(|| format!("cannot read testbed spec {}", spec_path.display()))?;
    let ncores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let spec = Spec::parse(&text, ncores).with_context(|| format!("in {}", spec_path.display()))?;
    need_root("bring a testbed up")?;
    let cpu: f64 = spec
        .sites
        .iter()
        .flat_map(|s| &s.hosts)
        .map(|h| h.cpu)
        .sum();
    if cpu > ncores as f64 {
        eprintln!(
            "mutirao testbed: warning: the hosts' cpu add up to {cpu:.2} cores on a machine of \
             {ncores}: when all are busy, each gets less than its quota and runs slower than its \
             `cpu` says (measurements and predictions disagree); keep the sum under {ncores}"
        );
    }
    let prefix = tb::sys::random_prefix()?;
    let name = name.unwrap_or_else(|| prefix.clone());
    check_name(&name)?;
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create state directory {}", dir.display()))?;
    let state_path = dir.join(format!("{name}.json"));
    if state_path.exists() {
        bail!(
            "testbed `{name}` already exists ({}); take it down first: mutirao testbed down {name}",
            state_path.display()
        );
    }
    // Every file `up` may make is listed before it is made, so `down` removes them even after a crash.
    let token = dir.join(format!("{name}.token"));
    let hostfile = dir.join(format!("{name}.hosts"));
    let sitesfile = dir.join(format!("{name}.sites"));
    let meufile = dir.join(format!("{name}.meu"));
    let mut files = vec![hostfile.clone(), sitesfile.clone(), meufile.clone()];
    if !no_agents {
        files.push(token.clone());
        files.extend(
            spec.hosts()
                .iter()
                .map(|h| dir.join(format!("{prefix}-{}.log", h.spec.name))),
        );
    }
    let mut st = StateFile {
        name: name.clone(),
        prefix: prefix.clone(),
        status: "starting".into(),
        files,
        testbed: None,
    };
    save(&state_path, &st)?;

    let result = (|| -> anyhow::Result<Testbed> {
        let agent = if no_agents {
            None
        } else {
            let exe = std::env::current_exe().context("cannot find the mutirao executable")?;
            let out = std::process::Command::new(&exe)
                .arg("agent")
                .arg("--gen-token")
                .arg(&token)
                .output()
                .with_context(|| format!("cannot run {} agent --gen-token", exe.display()))?;
            if !out.status.success() {
                bail!(
                    "`{} agent --gen-token` failed: {}; use --no-agents to bring the testbed up without agents",
                    exe.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            Some(AgentLaunch {
                program: exe,
                args: vec![
                    "agent".into(),
                    "--listen".into(),
                    "{addr}".into(),
                    "--token-file".into(),
                    token.display().to_string(),
                    // The testbed emulates one developer's hosts on their own machine: its
                    // agents run jobs as the user who brought it up (root), as `mutirao run`
                    // does locally, so programs and files under that user's directories work.
                    // A grid agent started by hand as root gives each job a uid of its own.
                    "--run-as".into(),
                    "root".into(),
                ],
                port,
                log_dir: Some(dir.to_path_buf()),
                ready_timeout: Duration::from_secs(10),
            })
        };
        let opts = UpOptions {
            prefix: Some(prefix.clone()),
            agent,
            fail_after_steps: None,
            packet_threads,
        };
        Ok(Testbed::up(&spec, opts)?)
    })();
    let testbed = match result {
        Ok(t) => t,
        Err(e) => {
            // `Testbed::up` has removed what it made; remove our files too.
            for f in &st.files {
                let _ = std::fs::remove_file(f);
            }
            let _ = std::fs::remove_file(&state_path);
            return Err(e.context(format!("testbed `{name}` did not come up; nothing is left")));
        }
    };
    let write_all = (|| -> anyhow::Result<()> {
        write_atomic(&hostfile, testbed.hostfile().as_bytes())?;
        // `ADDR SITE NAME` per host: `mutirao calibrate --sites-file` names hosts and sites
        // as the spec does.
        let sites: String = testbed
            .state()
            .hosts
            .iter()
            .map(|h| format!("{} {} {}\n", h.addr, h.site, h.name))
            .collect();
        write_atomic(&sitesfile, sites.as_bytes())?;
        // The same sites and hosts as a resource hierarchy (`mutirao resources`,
        // `mutirao calibrate --resources`).
        let meu = mutirao_testbed::resource_spec(&name, testbed.state());
        write_atomic(&meufile, meu.as_bytes())?;
        st.status = "up".into();
        st.testbed = Some(testbed.state().clone());
        save(&state_path, &st)
    })();
    if let Err(e) = write_all {
        drop(testbed);
        for f in &st.files {
            let _ = std::fs::remove_file(f);
        }
        let _ = std::fs::remove_file(&state_path);
        return Err(e.context("testbed removed again"));
    }
    let state = testbed.detach();
    println!(
        "testbed {name} is up (prefix {}, addresses {})",
        state.prefix, state.block
    );
    print_hosts(&state);
    println!("hostfile: {}", hostfile.display());
    println!(
        "resources: {} (mutirao resources show {0}; mutirao calibrate --resources {0})",
        meufile.display()
    );
    print!("{}", state.hostfile);
    println!(
        "sites file (for mutirao calibrate --sites-file): {}",
        sitesfile.display()
    );
    if !no_agents {
        println!("agent token: {}", token.display());
    }
    println!("take it down with: mutirao testbed down {name}");
    Ok(ExitCode::SUCCESS)
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z") && !s.contains(") X"))
        .unwrap_or(false)
}

fn print_hosts(state: &TestbedState) {
    for h in &state.hosts {
        let agent =
            state
                .agents
                .iter()
                .find(|a| a.host == h.name)
                .map_or("no agent".to_string(), |a| {
                    format!(
                        "agent {} pid {} {}",
                        a.listen,
                        a.pid,
                        if alive(a.pid) {
                            "running"
                        } else {
                            "NOT RUNNING"
                        }
                    )
                });
        println!(
            "  {:<12} site {:<8} {:<15} cpu {:<5} nic {:>6} Mbit/s  netns {}  {agent}",
            h.name, h.site, h.addr, h.cpu, h.nic_mbit, h.netns
        );
    }
    for w in &state.wans {
        println!("  wan {} <-> {}: {} Mbit/s", w.sites[0], w.sites[1], w.mbit);
    }
    if state.packet_threads.is_empty() {
        println!(
            "  packet work: on the hosts' CPU quotas (no threaded NAPI; see docs/testbed.md, \
             \"Packet work off the hosts\")"
        );
    } else {
        let alive = state
            .packet_threads
            .iter()
            .filter(|p| alive(**p as u32))
            .count();
        println!(
            "  packet work: {alive} of {} kernel threads running (threaded NAPI, nice -20)",
            state.packet_threads.len()
        );
    }
}

fn status(only: Option<&str>, dir: &Path) -> anyhow::Result<ExitCode> {
    let mut known = Vec::new();
    let mut shown = 0;
    for path in state_files(dir) {
        let st = match load(&path) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("mutirao: warning: {e:#}");
                continue;
            }
        };
        known.push(st.prefix.clone());
        if only.is_some_and(|n| n != st.name && n != st.prefix) {
            continue;
        }
        shown += 1;
        let namespaces = tb::sys::namespaces_of(&st.prefix).len();
        match &st.testbed {
            Some(t) => {
                let health = if namespaces == t.namespaces.len() {
                    "up".to_string()
                } else {
                    format!(
                        "BROKEN: {namespaces} of {} namespaces present",
                        t.namespaces.len()
                    )
                };
                println!("{} (prefix {}, {}): {health}", st.name, st.prefix, t.block);
                print_hosts(t);
                if let Some(f) = st
                    .files
                    .iter()
                    .find(|f| f.extension().is_some_and(|x| x == "hosts"))
                {
                    println!("  hostfile: {}", f.display());
                }
            }
            None => println!(
                "{} (prefix {}): {} — `up` did not finish; remove with: mutirao testbed down {}",
                st.name, st.prefix, st.status, st.name
            ),
        }
    }
    for p in tb::live_prefixes() {
        if !known.contains(&p) && only.is_none_or(|n| n == p) {
            shown += 1;
            println!("{p}: leftovers without a state file; remove with: mutirao testbed down {p}");
        }
    }
    if shown == 0 {
        match only {
            Some(n) => println!("no testbed named {n} (state directory {})", dir.display()),
            None => println!("no testbeds (state directory {})", dir.display()),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Tear down `prefix` and remove the state file and the files it lists.
fn down_one(prefix: &str, state: Option<(&Path, &StateFile)>) -> anyhow::Result<()> {
    let report = tb::teardown(prefix)?;
    if let Some((path, st)) = state {
        for f in &st.files {
            let _ = std::fs::remove_file(f);
        }
        std::fs::remove_file(path).with_context(|| format!("cannot remove {}", path.display()))?;
    }
    let label = state.map_or(prefix.to_string(), |(_, s)| {
        format!("{} ({prefix})", s.name)
    });
    if report.is_empty() {
        println!("{label}: nothing was running; state removed");
    } else {
        println!(
            "{label}: removed {} namespaces, {} links, {} cgroups; killed {} processes",
            report.namespaces.len(),
            report.links.len(),
            report.cgroups.len(),
            report.killed
        );
    }
    Ok(())
}

fn down(name: Option<&str>, all: bool, dir: &Path) -> anyhow::Result<ExitCode> {
    let mut targets: Vec<(String, Option<(PathBuf, StateFile)>)> = Vec::new();
    for path in state_files(dir) {
        let Ok(st) = load(&path) else { continue };
        if all || name.is_some_and(|n| n == st.name || n == st.prefix) {
            targets.push((st.prefix.clone(), Some((path, st))));
        }
    }
    for p in tb::live_prefixes() {
        let wanted = all || name == Some(p.as_str());
        if wanted && !targets.iter().any(|(q, _)| *q == p) {
            targets.push((p, None));
        }
    }
    if targets.is_empty() {
        match name {
            Some(n) => println!(
                "no testbed named {n} (state directory {}); nothing to do",
                dir.display()
            ),
            None => println!("no testbeds; nothing to do"),
        }
        return Ok(ExitCode::SUCCESS);
    }
    need_root("take a testbed down")?;
    let mut failed = 0;
    for (prefix, state) in &targets {
        if let Err(e) = down_one(prefix, state.as_ref().map(|(p, s)| (p.as_path(), s))) {
            eprintln!("mutirao: error: {e:#}");
            failed += 1;
        }
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "mutirao-testbed-cli-{tag}-{}-{}",
            std::process::id(),
            tb::sys::random_prefix().unwrap_or_default()
        ));
        std::fs::create_dir_all(&d).expect("temp dir");
        d
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("grid-1_a.b").is_ok());
        for bad in ["", ".hidden", "a/b", "a b", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp_file() {
        let d = temp_dir("atomic");
        let p = d.join("s.json");
        write_atomic(&p, b"one").expect("write");
        write_atomic(&p, b"two").expect("rewrite");
        assert_eq!(std::fs::read_to_string(&p).ok().as_deref(), Some("two"));
        let names: Vec<_> = std::fs::read_dir(&d)
            .expect("list")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn bad_spec_writes_nothing() {
        let d = temp_dir("badspec");
        let spec = d.join("bad.toml");
        std::fs::write(&spec, "[[site]]\nname = \"a\"\nnic_mbit = -1\nhosts = []\n").expect("spec");
        let state = d.join("state");
        let e = up(&spec, Some("t".into()), &state, true, 7207, false).expect_err("invalid spec");
        assert!(format!("{e:#}").contains("site[0].nic_mbit"), "{e:#}");
        assert!(!state.exists(), "no state directory for a bad spec");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Needs root; prints `SKIPPED: needs root` and returns otherwise.
    #[test]
    fn up_status_down_cycle_removes_everything() {
        if !tb::is_root() {
            println!("SKIPPED: needs root (the testbed creates network namespaces, veth links, tc qdiscs and cgroups)");
            return;
        }
        let d = temp_dir("cycle");
        let spec = d.join("grid.toml");
        std::fs::write(
            &spec,
            "[[site]]\nname = \"a\"\nnic_mbit = 100\nhosts = [ { name = \"a1\", cpu = 0.5 } ]\n",
        )
        .expect("spec");
        let state = d.join("state");
        // Tear down whatever the test made, even if an assertion fails.
        struct Guard(PathBuf);
        impl Drop for Guard {
            fn drop(&mut self) {
                let _ = down(Some("cyc"), false, &self.0);
            }
        }
        let _guard = Guard(state.clone());
        up(&spec, Some("cyc".into()), &state, true, 7207, false).expect("up");
        let st = load(&state.join("cyc.json")).expect("state file");
        assert_eq!(st.status, "up");
        let t = st.testbed.as_ref().expect("testbed recorded");
        assert_eq!(t.hosts.len(), 1);
        let hosts = std::fs::read_to_string(state.join("cyc.hosts")).expect("hostfile");
        assert_eq!(hosts, format!("{} slots=1\n", t.hosts[0].addr));
        let sites = std::fs::read_to_string(state.join("cyc.sites")).expect("sites file");
        let h = &t.hosts[0];
        assert_eq!(sites, format!("{} {} {}\n", h.addr, h.site, h.name));
        let meu = std::fs::read_to_string(state.join("cyc.meu")).expect("resource spec");
        assert_eq!(meu, tb::resource_spec("cyc", t));
        assert_eq!(tb::sys::namespaces_of(&st.prefix).len(), 2);
        assert!(
            up(&spec, Some("cyc".into()), &state, true, 7207, false).is_err(),
            "a second testbed with the same name is refused"
        );
        status(Some("cyc"), &state).expect("status");
        down(Some("cyc"), false, &state).expect("down");
        assert!(tb::sys::leftovers(&st.prefix).is_empty());
        assert!(!state.join("cyc.json").exists() && !state.join("cyc.hosts").exists());
        assert!(!state.join("cyc.sites").exists() && !state.join("cyc.meu").exists());
        down(Some("cyc"), false, &state).expect("down again is harmless");
        let _ = std::fs::remove_dir_all(&d);
    }
}
