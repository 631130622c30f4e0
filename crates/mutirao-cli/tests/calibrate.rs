//! End-to-end tests of `mutirao calibrate` on loopback (no root): a small local calibration is a
//! valid `mutirao-calib/1` file that `mutirao fit` turns into a valid model; bad input is refused
//! with a clear message and writes nothing; a host dying mid-calibration leaves a partial file
//! that names it.

use mutirao_model::calib::{Calibration, Method, PairRef, SendMode};
use mutirao_model::Model;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const MUTIRAO: &str = env!("CARGO_BIN_EXE_mutirao");

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mutirao-calib-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Run `mutirao ARGS`, failing the test if it takes longer than `limit`.
fn mutirao(args: &[&str], limit: Duration) -> Output {
    let t = Instant::now();
    let out = Command::new(MUTIRAO).args(args).output().unwrap();
    assert!(
        t.elapsed() < limit,
        "mutirao {args:?} took {:?} (limit {limit:?})",
        t.elapsed()
    );
    out
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

const FAST: &[&str] = &[
    "--reps",
    "6",
    "--min-reps",
    "3",
    "--warmup",
    "1",
    "--time-per-size",
    "0.05",
    "--speed-reps",
    "2",
    "--speed-runs",
    "3",
];

#[test]
fn local_calibration_is_valid_and_fits() {
    let d = tmpdir("ok");
    let calib = d.join("calib.json");
    let model = d.join("model.json");
    let mut args = vec![
        "calibrate",
        "-n",
        "2",
        "--sizes",
        "0,1K,64K",
        "--mode",
        "send,isend",
        "-o",
        calib.to_str().unwrap(),
    ];
    args.extend_from_slice(FAST);
    let out = mutirao(&args, Duration::from_secs(60));
    assert!(out.status.success(), "{}", text(&out));
    let c = Calibration::from_json(&std::fs::read_to_string(&calib).unwrap()).unwrap();
    assert!(c.partial.is_none(), "{:?}", c.partial);
    assert_eq!(
        c.hosts.iter().map(|h| h.name.as_str()).collect::<Vec<_>>(),
        ["local0", "local1"]
    );
    for h in &c.hosts {
        let s = h.speed.as_ref().expect("every host has H");
        assert_eq!(s.samples.len(), 3);
        assert!(s.h_us().unwrap() > 0.0);
        assert!(h.load.is_some(), "load from /proc/loadavg");
    }
    // all-pairs with same-host pairs: 4 ordered pairs, in both modes, three sizes each.
    assert_eq!(c.pairs.len(), 8);
    for mode in [SendMode::Send, SendMode::Isend] {
        for (a, b) in [
            ("local0", "local0"),
            ("local0", "local1"),
            ("local1", "local0"),
            ("local1", "local1"),
        ] {
            let s = c.sweep(a, b, mode).expect("sweep measured");
            assert_eq!(
                s.sizes.iter().map(|z| z.bytes).collect::<Vec<_>>(),
                [0, 1024, 65536]
            );
            for (k, z) in s.sizes.iter().enumerate() {
                assert!((3..=6).contains(&z.samples.len()), "{}", z.samples.len());
                // One warm-up before the first size; later sizes skip it once the previous
                // round trip exceeded a tenth of --time-per-size (a loaded machine can do that).
                if k == 0 {
                    assert_eq!(z.warmup, 1);
                } else {
                    assert!(z.warmup <= 1, "{}", z.warmup);
                }
                let st = z.stats.as_ref().expect("finalized");
                assert!(st.rtt.median > 0.0);
                let echo = c.provenance.echoed.contains(&PairRef {
                    src: a.into(),
                    dst: b.into(),
                });
                for smp in &z.samples {
                    // The round trip contains both sides' calls.
                    assert!(smp.rtt_us >= smp.os_src_us + smp.or_src_us);
                    // Probe and wait are timed by the measuring side only.
                    assert_eq!(smp.probe_us.is_some(), !echo);
                    assert_eq!(smp.wait_src_us.is_some(), !echo && mode == SendMode::Isend);
                }
            }
        }
    }
    // Each unordered pair was measured once; its reverse is the echo, overheads swapped.
    assert_eq!(c.provenance.echoed.len(), 1, "{:?}", c.provenance.echoed);
    let e = &c.provenance.echoed[0];
    for mode in [SendMode::Send, SendMode::Isend] {
        let echo = c.sweep(&e.src, &e.dst, mode).unwrap();
        let measured = c.sweep(&e.dst, &e.src, mode).unwrap();
        for (ze, zm) in echo.sizes.iter().zip(&measured.sizes) {
            assert_eq!(ze.bytes, zm.bytes);
            for (x, y) in ze.samples.iter().zip(&zm.samples) {
                assert_eq!(x.rtt_us, y.rtt_us);
                assert_eq!((x.os_src_us, x.or_dst_us), (y.os_dst_us, y.or_src_us));
                assert_eq!((x.os_dst_us, x.or_src_us), (y.os_src_us, y.or_dst_us));
                assert!((x.latency_us() - y.latency_us()).abs() < 1e-9);
            }
        }
    }
    assert!(c.provenance.finished_unix_ms >= c.provenance.started_unix_ms);
    // Every host's push cost was probed: 1 MiB (a rendezvous above the 64 KiB default eager
    // limit) to the other host, five repetitions of a computation (0.1 s nominal; its wall time
    // on a busy machine is anyone's guess, so only that it was timed is checked) alone and
    // while sending.
    let mut probed: Vec<&str> = c.push.iter().map(|p| p.host.as_str()).collect();
    probed.sort_unstable();
    assert_eq!(probed, ["local0", "local1"], "{:?}", c.push);
    for p in &c.push {
        assert_ne!(p.host, p.peer);
        assert_eq!(p.bytes, 1 << 20);
        assert_eq!(p.samples.len(), 5);
        for s in &p.samples {
            assert!(s.alone_s > 0.0 && s.sending_s > 0.0, "{s:?}");
        }
        assert!(p.us_per_byte().is_some());
    }
    // The modeller accepts it. (A few samples on a loaded CI machine can leave a median the
    // fit misses by just over 10%; the poor-fit guard has its own tests, this one checks that
    // the file is usable.)
    let out = mutirao(
        &[
            "fit",
            calib.to_str().unwrap(),
            "-o",
            model.to_str().unwrap(),
            "--allow-poor-fit",
        ],
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "{}", text(&out));
    let m = Model::from_json(&std::fs::read_to_string(&model).unwrap()).unwrap();
    assert_eq!(m.hosts.len(), 2);
    assert!(m.link_params("local0", "local1").is_ok());
    // A model compared with itself differs nowhere; a slower copy fails a tolerance.
    let same = mutirao(
        &[
            "model",
            "compare",
            model.to_str().unwrap(),
            model.to_str().unwrap(),
            "--tolerance",
            "0",
        ],
        Duration::from_secs(30),
    );
    assert!(same.status.success(), "{}", text(&same));
    assert!(
        text(&same).contains("median |diff| 0.0%"),
        "{}",
        text(&same)
    );
    let mut slow = m.clone();
    for l in &mut slow.links {
        for s in &mut l.l.0 {
            s.base_us = s.base_us * 1.5 + 1.0;
        }
    }
    let slow_file = d.join("slow.json");
    std::fs::write(&slow_file, serde_json::to_string(&slow).unwrap()).unwrap();
    let diff = mutirao(
        &[
            "model",
            "compare",
            model.to_str().unwrap(),
            slow_file.to_str().unwrap(),
            "--min-size",
            "0",
            "--tolerance",
            "0.01",
        ],
        Duration::from_secs(30),
    );
    assert_eq!(diff.status.code(), Some(1), "{}", text(&diff));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn site_sampled_with_sites_inherits() {
    let d = tmpdir("sites");
    let calib = d.join("c.json");
    let mut args = vec![
        "calibrate",
        "-n",
        "3",
        "--sites",
        "local0=a,local1=a,local2=b",
        "--strategy",
        "site-sampled",
        "--no-same-host",
        "--sizes",
        "0,64,4K",
        "--no-push",
        "-o",
        calib.to_str().unwrap(),
    ];
    args.extend_from_slice(FAST);
    let out = mutirao(&args, Duration::from_secs(60));
    assert!(out.status.success(), "{}", text(&out));
    let c = Calibration::from_json(&std::fs::read_to_string(&calib).unwrap()).unwrap();
    assert!(c.push.is_empty(), "--no-push probed: {:?}", c.push);
    assert_eq!(c.host("local2").unwrap().site, "b");
    // measured: a1<->a2 both ways, a1->b1, b1->a1
    assert_eq!(c.pairs.len(), 4);
    assert!(c.sweep("local1", "local2", SendMode::Isend).is_none());
    assert!(c.source_of("local1", "local2", SendMode::Isend).is_some());
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_host_dying_leaves_a_partial_file_naming_it() {
    let d = tmpdir("die");
    let calib = d.join("c.json");
    let mut args = vec![
        "calibrate",
        "-n",
        "2",
        "--no-same-host",
        "--sizes",
        "0,64,1K",
        "--both-directions",
        "--fault-kill",
        "local1:1",
        "-o",
        calib.to_str().unwrap(),
    ];
    args.extend_from_slice(FAST);
    let out = mutirao(&args, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("host local1 failed"), "{err}");
    let c = Calibration::from_json(&std::fs::read_to_string(&calib).unwrap()).unwrap();
    let p = c.partial.as_ref().expect("marked partial");
    assert_eq!(p.failed_hosts[0].name, "local1");
    // The first sweep (local0 -> local1) was finished before the host died and is kept.
    assert!(c.sweep("local0", "local1", SendMode::Isend).is_some());
    assert!(c.sweep("local1", "local0", SendMode::Isend).is_none());
    assert!(c.hosts.iter().all(|h| h.speed.is_some()));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn the_leader_host_dying_is_named_too() {
    let d = tmpdir("die0");
    let calib = d.join("c.json");
    let mut args = vec![
        "calibrate",
        "-n",
        "3",
        "--sizes",
        "0,64,256",
        "--both-directions",
        "--fault-kill",
        "local0:2",
        "-o",
        calib.to_str().unwrap(),
    ];
    args.extend_from_slice(FAST);
    let out = mutirao(&args, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let c = Calibration::from_json(&std::fs::read_to_string(&calib).unwrap()).unwrap();
    let p = c.partial.as_ref().expect("marked partial");
    assert_eq!(p.failed_hosts.len(), 1);
    assert_eq!(p.failed_hosts[0].name, "local0", "{p:?}");
    // Rank 0's host took part in two finished sweeps (local0 -> local0, local0 -> local1).
    assert_eq!(c.pairs.len(), 2, "{:?}", c.pairs);
    let _ = std::fs::remove_dir_all(&d);
}

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `mutirao agent` on loopback address `ip` with a free port; returns it and its port.
fn agent(token: &Path, ip: &str) -> (Agent, String) {
    let sock = token.with_extension(format!("{ip}.sock"));
    let mut child = Command::new(MUTIRAO)
        .args([
            "agent",
            "--listen",
            &format!("{ip}:0"),
            "--print-addr",
            "--token-file",
        ])
        .arg(token)
        .arg("--dir-socket")
        .arg(sock)
        // The agent's default store and caches go in the test's directory, not /tmp.
        .env("TMPDIR", token.parent().unwrap_or(Path::new(".")))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .trim()
        .rsplit_once(':')
        .expect("agent address")
        .1
        .to_string();
    (Agent(child), port)
}

fn gen_token(d: &Path) -> PathBuf {
    let t = d.join("agent.token");
    let st = Command::new(MUTIRAO)
        .args(["agent", "--gen-token"])
        .arg(&t)
        .status()
        .unwrap();
    assert!(st.success());
    t
}

#[test]
fn hostfile_calibration_goes_through_the_agents() {
    let d = tmpdir("agents");
    let tok = gen_token(&d);
    let (_a1, p1) = agent(&tok, "127.0.0.1");
    let (_a2, p2) = agent(&tok, "127.0.0.2");
    // Two loopback addresses of this machine, so the two agents are two hosts.
    let hf = d.join("hosts");
    std::fs::write(
        &hf,
        format!("127.0.0.1 slots=1 port={p1}\n127.0.0.2:1 port={p2}\n"),
    )
    .unwrap();
    let calib = d.join("c.json");
    let mut args = vec![
        "calibrate",
        "--hostfile",
        hf.to_str().unwrap(),
        "--token-file",
        tok.to_str().unwrap(),
        "--sites",
        "127.0.0.2=b",
        "--sizes",
        "0,64,2K",
        "-o",
        calib.to_str().unwrap(),
    ];
    args.extend_from_slice(FAST);
    let out = mutirao(&args, Duration::from_secs(60));
    assert!(out.status.success(), "{}", text(&out));
    let c = Calibration::from_json(&std::fs::read_to_string(&calib).unwrap()).unwrap();
    assert_eq!(
        c.hosts
            .iter()
            .map(|h| (h.name.as_str(), h.site.as_str(), h.address.clone()))
            .collect::<Vec<_>>(),
        [
            ("127.0.0.1", "127.0.0", format!("127.0.0.1:{p1}")),
            ("127.0.0.2", "b", format!("127.0.0.2:{p2}"))
        ]
    );
    assert_eq!(c.pairs.len(), 4);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn an_unreachable_agent_is_named() {
    let d = tmpdir("unreach");
    let tok = gen_token(&d);
    // A port nobody listens on: bind one, note it, close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let hf = d.join("hosts");
    std::fs::write(&hf, format!("127.0.0.1 port={port}\n")).unwrap();
    let calib = d.join("c.json");
    let out = mutirao(
        &[
            "calibrate",
            "--hostfile",
            hf.to_str().unwrap(),
            "--token-file",
            tok.to_str().unwrap(),
            "-o",
            calib.to_str().unwrap(),
        ],
        Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("host 127.0.0.1 failed") && err.contains("cannot reach the agent"),
        "{err}"
    );
    let c = Calibration::from_json(&std::fs::read_to_string(&calib).unwrap()).unwrap();
    assert_eq!(
        c.partial.as_ref().unwrap().failed_hosts[0].name,
        "127.0.0.1"
    );
    assert!(c.pairs.is_empty());
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn type_sampled_records_clusters() {
    let d = tmpdir("type");
    let calib = d.join("c.json");
    let mut args = vec![
        "calibrate",
        "-n",
        "2",
        "--strategy",
        "type-sampled",
        "--tolerance",
        "10",
        "--no-same-host",
        "--plogp",
        "--sizes",
        "0,64,16K",
        "-o",
        calib.to_str().unwrap(),
    ];
    args.extend_from_slice(FAST);
    let out = mutirao(&args, Duration::from_secs(60));
    assert!(out.status.success(), "{}", text(&out));
    let c = Calibration::from_json(&std::fs::read_to_string(&calib).unwrap()).unwrap();
    // The two hosts of the site were probed once for a preliminary link speed.
    assert_eq!(c.provenance.link_probes.len(), 1, "{:?}", c.provenance);
    let pr = &c.provenance.link_probes[0];
    assert_eq!((pr.src.as_str(), pr.dst.as_str()), ("local0", "local1"));
    assert!(pr.bytes == 1 << 20 && pr.rtt_us > 0.0, "{pr:?}");
    // A tolerance of 1000% puts both hosts in one cluster led by local0.
    assert_eq!(c.provenance.clusters.len(), 1);
    assert_eq!(c.provenance.clusters[0].members, ["local0", "local1"]);
    // Both measured pairs, by ping-pong (isend) and by PLogP (blocking sends).
    assert_eq!(c.pairs.len(), 4);
    let plogp: Vec<_> = c
        .pairs
        .iter()
        .filter(|p| p.method == Method::Plogp)
        .collect();
    assert_eq!(plogp.len(), 2);
    for sw in plogp {
        assert_eq!(sw.mode, SendMode::Send);
        assert_eq!(
            sw.sizes.iter().map(|z| z.bytes).collect::<Vec<_>>(),
            [0, 64, 16384]
        );
        for z in &sw.sizes {
            assert!(z.samples.is_empty() && (3..=6).contains(&z.plogp.len()));
            for x in &z.plogp {
                assert!(x.rtt0_us > 0.0 && x.g0_us >= 0.0 && x.rtt_us > 0.0);
                // One RTT(0) and one g(0) per sweep.
                assert_eq!((x.rtt0_us, x.g0_us), (z.plogp[0].rtt0_us, z.plogp[0].g0_us));
            }
            assert!(z.stats.as_ref().unwrap().g.is_some());
        }
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn the_timeout_ends_it_with_a_partial_file() {
    let d = tmpdir("timeout");
    let calib = d.join("c.json");
    // The default sizes and repetitions take several seconds; the timeout is under one.
    let out = mutirao(
        &[
            "calibrate",
            "-n",
            "2",
            "--timeout",
            "0.8",
            "-o",
            calib.to_str().unwrap(),
        ],
        Duration::from_secs(20),
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ended early") && err.contains("--timeout"),
        "{err}"
    );
    let c = Calibration::from_json(&std::fs::read_to_string(&calib).unwrap()).unwrap();
    assert!(c.partial.unwrap().reason.contains("--timeout"));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn bad_input_is_refused_and_writes_nothing() {
    let d = tmpdir("bad");
    let o = d.join("c.json");
    let os = o.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["--strategy", "random"], "random"),
        (&["--sizes", "0,abc"], "abc"),
        (&["--sizes", "0,4G"], "not a byte count"),
        (&["--sizes", "0,1K"], "at least 3"),
        (&["--mode", "rdma"], "rdma"),
        (&["--sites", "nohost=a"], "unknown host \"nohost\""),
        (&["--reps", "2", "--min-reps", "5"], "--min-reps"),
        (
            &["--hostfile", "/nonexistent/hosts"],
            "cannot read hostfile",
        ),
        (&["-n", "0"], "-n must be at least 1"),
    ];
    for (extra, want) in cases {
        let mut args = vec!["calibrate", "-o", os];
        args.extend_from_slice(extra);
        let out = mutirao(&args, Duration::from_secs(10));
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{extra:?}: want {want:?} in {err}");
        assert!(!o.exists(), "{extra:?} wrote a file");
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// A testbed brought up with `--state-dir DIR` is found by `calibrate --testbed` through
/// `MUTIRAO_TESTBED_DIR=DIR`: the files are looked for there (and a missing one is named with
/// that directory), and nothing is written.
#[test]
fn the_testbed_state_directory_comes_from_the_environment() {
    let d = tmpdir("tbdir");
    let o = d.join("c.json");
    let out = Command::new(MUTIRAO)
        .args(["calibrate", "--testbed", "tb9", "-o", o.to_str().unwrap()])
        .env("MUTIRAO_TESTBED_DIR", &d)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let want = d.join("tb9.hosts");
    assert!(
        err.contains("\"tb9\" is not up") && err.contains(want.to_str().unwrap()),
        "want {} named in: {err}",
        want.display()
    );
    assert!(err.contains("MUTIRAO_TESTBED_DIR"), "{err}");
    assert!(!o.exists());
    let _ = std::fs::remove_dir_all(&d);
}
