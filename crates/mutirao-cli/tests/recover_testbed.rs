//! Recovery on an emulated grid (needs root; without it the test prints `skipped: …` and
//! returns): three testbed hosts, an agent in each, jacobi with checkpoints on all three; once
//! an epoch is committed one host's network goes down (its link set down: no socket is closed,
//! nothing exits). The launcher must notice the missing heartbeats, end the job, and restart
//! every rank from the committed epoch on the two hosts left, with the failure-free result.

use mutirao_testbed::{sys, AgentLaunch, Spec, Testbed, UpOptions};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SPEC: &str = r#"
[[site]]
name = "lab"
nic_mbit = 1000
hosts = [ { name = "h1", cpu = 1.0 }, { name = "h2", cpu = 1.0 }, { name = "h3", cpu = 1.0 } ]
"#;

fn jacobi() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_BIN_EXE_mutirao"))
        .parent()?
        .join("examples")
        .join("jacobi");
    p.is_file().then_some(p)
}

fn checksum(out: &str) -> Option<String> {
    out.split_whitespace()
        .find(|w| w.starts_with("checksum="))
        .map(str::to_string)
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
