//! Recovery on an emulated grid (needs root; without it each test prints `skipped: …` and
//! returns): three testbed hosts, an agent in each, jacobi with checkpoints on all three.
//! - once an epoch is committed one host's network goes down (its link set down: no socket is
//!   closed, nothing exits). The launcher must notice the missing heartbeats, end the job, and
//!   restart every rank from the committed epoch on the two hosts left;
//! - with the default store (replicas on two agents other than each rank's host), a rank is
//!   killed (SIGKILL) on its host once an epoch is committed, or the agent of a host holding
//!   replicas is killed with everything it started: every rank restarts from the committed
//!   epoch, read from the replicas on the other hosts.
//!
//! Each ends with the failure-free run's checksum.

mod common;
use common::{checksum, ckpt_files, jacobi, rank_pid};

use mutirao_testbed::{sys, AgentLaunch, Spec, Testbed, UpOptions};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SPEC: &str = r#"
[[site]]
name = "lab"
nic_mbit = 1000
hosts = [ { name = "h1", cpu = 1.0 }, { name = "h2", cpu = 1.0 }, { name = "h3", cpu = 1.0 } ]
"#;

/// The agent store directory `mutirao agent` uses by default for `addr:port`.
fn agent_store(addr: std::net::Ipv4Addr, port: u16) -> PathBuf {
    std::env::temp_dir().join(format!("mutirao-agent-store-{addr}-{port}"))
}

#[test]
fn a_rank_killed_on_a_testbed_host_restarts_from_replicas_on_the_other_hosts() {
    replicas_on_testbed_agents(false);
}

#[test]
fn a_testbed_agent_killed_with_its_replicas_restores_from_the_other_hosts() {
    replicas_on_testbed_agents(true);
}

/// Jacobi on three testbed hosts with the default checkpoint store (no `--checkpoint-store`:
/// with three agents, two replicas per blob on agents other than the rank's). Once epoch 2's
/// blobs are on the agents, either rank 1 is killed on its host, or the third host's agent is
/// killed (taking its replicas and rank 2 with it).
fn replicas_on_testbed_agents(kill_agent: bool) {
    if !sys::is_root() {
        println!(
            "skipped: needs root (the testbed creates network namespaces, veth links and cgroups)"
        );
        return;
    }
    let Some(j) = jacobi() else {
        println!("skipped: the jacobi example is not built (cargo build -p mutirao --examples)");
        return;
    };
    let bin = env!("CARGO_BIN_EXE_mutirao");
    let tag = if kill_agent { "agent" } else { "rank" };
    let d = std::env::temp_dir().join(format!("mutirao-recover-tb-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let token = d.join("agent.token");
    assert!(Command::new(bin)
        .args(["agent", "--gen-token"])
        .arg(&token)
        .output()
        .unwrap()
        .status
        .success());
    let args = ["--n", "96", "--iters", "4000"];
    let plain = Command::new(bin)
        .args(["run", "-n", "3", "--timeout", "120"])
        .arg(&j)
        .arg("--")
        .args(args)
        .output()
        .unwrap();
    assert!(plain.status.success());
    let want = checksum(&String::from_utf8_lossy(&plain.stdout)).expect("a checksum");

    let spec = Spec::parse(SPEC, 2).expect("valid spec");
    let tb = Testbed::up(
        &spec,
        UpOptions {
            agent: Some(AgentLaunch {
                program: bin.into(),
                args: vec![
                    "agent".into(),
                    "--listen".into(),
                    "{addr}".into(),
                    "--no-dir".into(),
                    "--token-file".into(),
                    token.display().to_string(),
                ],
                port: 7207,
                log_dir: None,
                ready_timeout: Duration::from_secs(10),
            }),
            ..UpOptions::default()
        },
    )
    .expect("testbed up");
    let stores: Vec<PathBuf> = tb
        .hosts()
        .iter()
        .map(|h| agent_store(h.addr, 7207))
        .collect();
    for s in &stores {
        let _ = std::fs::remove_dir_all(s);
    }
    let agent_pids: Vec<u32> = tb.state().agents.iter().map(|a| a.pid).collect();
    assert_eq!(agent_pids.len(), 3, "one agent per host");
    let hostfile = d.join("hosts");
    std::fs::write(&hostfile, tb.hostfile()).unwrap();
    let child = Command::new(bin)
        .args(["run", "-n", "3", "--timeout", "120", "--heartbeat", "0.2"])
        .arg("--hostfile")
        .arg(&hostfile)
        .arg("--token-file")
        .arg(&token)
        .args(["--checkpoint-interval", "0.3"])
        .arg(&j)
        .arg("--")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let mut killed = false;
    while t0.elapsed() < Duration::from_secs(60) {
        let epoch2 = stores.iter().any(|s| {
            ckpt_files(s)
                .iter()
                .any(|f| f.split('/').nth(2) == Some("2"))
        });
        if epoch2 {
            let pid = if kill_agent {
                Some(agent_pids[2] as i32)
            } else {
                rank_pid(agent_pids[1], 1)
            };
            if let Some(pid) = pid {
                // SAFETY: kill(2) with a pid this test started or read from /proc; no memory
                // is involved.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
                killed = true;
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = child.wait_with_output().unwrap();
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    let dead = tb.hosts()[2].addr;
    drop(tb);
    for s in &stores {
        let _ = std::fs::remove_dir_all(s);
    }
    let _ = std::fs::remove_dir_all(&d);
    assert!(
        killed,
        "no epoch reached the agents before the job ended:\n{se}"
    );
    assert!(out.status.success(), "{so}\n{se}");
    assert!(
        se.contains("go to 2 agent(s) other than each rank's host"),
        "the default store on three agents is not the replicated one:\n{se}"
    );
    assert!(
        se.contains("restart 1 of 3: every rank from committed epoch"),
        "no restart from a committed epoch reported:\n{se}"
    );
    if kill_agent {
        assert!(
            se.contains(&format!("not on {dead}")),
            "the dead agent's host was used again:\n{se}"
        );
        // Two hosts are left: each blob can have one replica off its producer's host, and the
        // job keeps checkpointing with that rather than running unprotected.
        let after = se.split_once("restart 1: ranks on").map_or("", |(_, a)| a);
        assert!(
            !after.contains("will not commit"),
            "waves after the restart did not commit:\n{se}"
        );
    }
    assert_eq!(checksum(&so).as_deref(), Some(want.as_str()), "{so}\n{se}");
    eprintln!("{se}");
}

#[test]
fn a_host_whose_network_goes_down_is_detected_and_its_ranks_restart_elsewhere() {
    if !sys::is_root() {
        println!(
            "skipped: needs root (the testbed creates network namespaces, veth links and cgroups)"
        );
        return;
    }
    let Some(j) = jacobi() else {
        println!("skipped: the jacobi example is not built (cargo build -p mutirao --examples)");
        return;
    };
    let bin = env!("CARGO_BIN_EXE_mutirao");
    let d = std::env::temp_dir().join(format!("mutirao-recover-tb-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let token = d.join("agent.token");
    assert!(Command::new(bin)
        .args(["agent", "--gen-token"])
        .arg(&token)
        .output()
        .unwrap()
        .status
        .success());
    let args = ["--n", "96", "--iters", "4000"];
    let plain = Command::new(bin)
        .args(["run", "-n", "3", "--timeout", "120"])
        .arg(&j)
        .arg("--")
        .args(args)
        .output()
        .unwrap();
    assert!(plain.status.success());
    let want = checksum(&String::from_utf8_lossy(&plain.stdout)).expect("a checksum");

    let spec = Spec::parse(SPEC, 2).expect("valid spec");
    let tb = Testbed::up(
        &spec,
        UpOptions {
            agent: Some(AgentLaunch {
                program: bin.into(),
                args: vec![
                    "agent".into(),
                    "--listen".into(),
                    "{addr}".into(),
                    "--no-dir".into(),
                    "--token-file".into(),
                    token.display().to_string(),
                ],
                port: 7207,
                log_dir: None,
                ready_timeout: Duration::from_secs(10),
            }),
            ..UpOptions::default()
        },
    )
    .expect("testbed up");
    let hostfile = d.join("hosts");
    std::fs::write(&hostfile, tb.hostfile()).unwrap();
    let victim = tb.hosts()[2].clone();
    let child = Command::new(bin)
        .args(["run", "-n", "3", "--timeout", "120", "--heartbeat", "0.2"])
        .arg("--hostfile")
        .arg(&hostfile)
        .arg("--token-file")
        .arg(&token)
        .args(["--checkpoint-interval", "0.3", "--checkpoint-store", "dir"])
        .arg("--checkpoint-dir")
        .arg(d.join("ckpt"))
        .arg(&j)
        .arg("--")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let mut cut = false;
    while t0.elapsed() < Duration::from_secs(60) {
        let e = std::fs::read_to_string(d.join("ckpt").join("COMMITTED"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok());
        if e.is_some_and(|e| e >= 2) {
            let st = Command::new("ip")
                .args(["-n", &victim.netns, "link", "set", "eth0", "down"])
                .status()
                .unwrap();
            assert!(st.success(), "ip link set down failed");
            cut = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = child.wait_with_output().unwrap();
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    drop(tb);
    let _ = std::fs::remove_dir_all(&d);
    assert!(cut, "the job ended before the link could be cut:\n{se}");
    assert!(out.status.success(), "{so}\n{se}");
    assert!(
        se.contains(&format!("agent of {} sent no heartbeat", victim.addr)),
        "the cut host was not detected by heartbeat:\n{se}"
    );
    assert!(
        se.contains("restart 1 of 3: every rank from committed epoch"),
        "no restart reported:\n{se}"
    );
    assert!(
        se.contains(&format!("not on {}", victim.addr)),
        "the cut host was used again:\n{se}"
    );
    assert_eq!(checksum(&so).as_deref(), Some(want.as_str()), "{so}\n{se}");
    // The launcher's story, for `--no-capture` readers.
    eprintln!("{se}");
}
