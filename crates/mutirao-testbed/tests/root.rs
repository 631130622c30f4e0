//! Tests that build real testbeds. They need root; without it each prints
//! `SKIPPED: needs root …` and returns (nextest has no runtime skip, so look for that line:
//! `cargo nextest run -p mutirao-testbed --no-capture` or `cargo test -p mutirao-testbed -- --nocapture`).
//! Every testbed is torn down by its `Drop`, also when an assertion fails.

use mutirao_testbed::{sys, AgentLaunch, Error, Spec, Testbed, UpOptions};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const PROBE: &str = env!("CARGO_BIN_EXE_mutirao-testbed-probe");

const TWO_SITES: &str = r#"
[[site]]
name = "a"
nic_mbit = 200
hosts = [ { name = "a1", cpu = 1.0 }, { name = "a2", cpu = 0.5 } ]

[[site]]
name = "b"
nic_mbit = 200
hosts = [ { name = "b1", cpu = 0.25 } ]

[[wan]]
sites = ["a", "b"]
mbit = 40
"#;

/// True when the root tests can run; otherwise prints why they are skipped.
fn require_root() -> bool {
    if sys::is_root() {
        return true;
    }
    let msg = "SKIPPED: needs root (the testbed creates network namespaces, veth links, tc qdiscs and cgroups)";
    println!("{msg}");
    eprintln!("{msg}");
    false
}

fn spec(text: &str) -> Spec {
    Spec::parse(text, 2).expect("test spec is valid")
}

fn probe(args: &[&str]) -> Command {
    let mut c = Command::new(PROBE);
    c.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

fn finish(child: std::process::Child, what: &str) -> String {
    let out: Output = child.wait_with_output().expect("wait for probe");
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Two sites of 200 Mbit/s NICs joined by a 30 Mbit/s WAN: host a1 (a core) in site a, the
/// `b_hosts` (TOML inline tables) in site b.
fn across_a_30_mbit_wan(b_hosts: &str) -> String {
    format!(
        r#"
[[site]]
name = "a"
nic_mbit = 200
hosts = [ {{ name = "a1", cpu = 1.0 }} ]

[[site]]
name = "b"
nic_mbit = 200
hosts = [ {b_hosts} ]

[[wan]]
sites = ["a", "b"]
mbit = 30
"#
    )
}

/// `recv BYTES SECONDS` lines of a `serve` output.
fn recvs(out: &str) -> Vec<(u64, f64)> {
    out.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some("recv")).then_some(())?;
            Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
        })
        .collect()
}

/// Mbit/s of `bytes` sent from host `src` to host `dst`, measured by the receiver.
fn throughput(tb: &Testbed, src: &str, dst: &str, bytes: u64, port: u16) -> f64 {
    let to = SocketAddr::from((tb.host(dst).expect("dst").addr, port)).to_string();
    let server = tb
        .spawn(dst, probe(&["serve", &to, "1", "10000"]))
        .expect("spawn serve");
    let sender = tb
        .spawn(src, probe(&["send", &to, &bytes.to_string(), "10000"]))
        .expect("spawn send");
    finish(sender, "send");
    let r = recvs(&finish(server, "serve"));
    assert_eq!(r.len(), 1, "one connection");
    assert_eq!(r[0].0, bytes, "all bytes arrived");
    bytes as f64 * 8.0 / r[0].1 / 1e6
}

fn assert_gone(prefix: &str) {
    let left = sys::leftovers(prefix);
    assert!(left.is_empty(), "left behind: {left:?}");
    assert!(!sys::live_prefixes().iter().any(|p| p == prefix));
}

#[test]
fn two_site_testbed_has_the_spec_rates_and_cpu_shares() {
    if !require_root() {
        return;
    }
    let tb = Testbed::up(&spec(TWO_SITES), UpOptions::default()).expect("testbed up");
    let prefix = tb.prefix().to_string();
    let names: Vec<&str> = tb.hosts().iter().map(|h| h.name.as_str()).collect();
    assert_eq!(names, ["a1", "a2", "b1"]);
    assert_eq!(tb.host("b1").map(|h| h.site.as_str()), Some("b"));
    assert_eq!(tb.host("a2").map(|h| h.cpu), Some(0.5));
    assert_eq!(tb.hostfile().lines().count(), 3);

    // Every host reaches every other, and the root namespace reaches every host.
    let port = 5000;
    let servers: Vec<_> = tb
        .hosts()
        .iter()
        .map(|h| {
            let a = SocketAddr::from((h.addr, port)).to_string();
            (
                h.name.clone(),
                tb.spawn(&h.name, probe(&["serve", &a, "3", "8000"]))
                    .expect("serve"),
            )
        })
        .collect();
    let mut senders = Vec::new();
    for src in tb.hosts() {
        for dst in tb.hosts().iter().filter(|d| d.name != src.name) {
            let a = SocketAddr::from((dst.addr, port)).to_string();
            senders.push(
                tb.spawn(&src.name, probe(&["send", &a, "1000", "8000"]))
                    .expect("send"),
            );
        }
    }
    for h in tb.hosts() {
        let a = SocketAddr::from((h.addr, port));
        let mut s = (0..100)
            .find_map(|_| {
                TcpStream::connect_timeout(&a, Duration::from_millis(200))
                    .inspect_err(|_| std::thread::sleep(Duration::from_millis(20)))
                    .ok()
            })
            .unwrap_or_else(|| panic!("root namespace cannot reach {} at {a}", h.name));
        s.write_all(&[7u8; 1000]).expect("write from root");
        s.shutdown(std::net::Shutdown::Write).expect("shutdown");
        let _ = s.read(&mut [0u8; 1]);
    }
    for s in senders {
        finish(s, "send");
    }
    for (name, s) in servers {
        let r = recvs(&finish(s, "serve"));
        assert_eq!(
            r.len(),
            3,
            "{name} got a connection from both peers and root"
        );
        assert!(r.iter().all(|&(b, _)| b == 1000), "{name}: {r:?}");
    }

    // The WAN (40 Mbit) is the bottleneck between sites, in both directions.
    let ab = throughput(&tb, "a1", "b1", 6 << 20, 5001);
    let ba = throughput(&tb, "b1", "a1", 6 << 20, 5002);
    println!("a1->b1 {ab:.1} Mbit/s, b1->a1 {ba:.1} Mbit/s (shaped 40)");
    // Inside site a (200 Mbit): shaped too (an unshaped veth carries several Gbit/s). Frames
    // without GSO super-packets cost both ends CPU (on a veth the receiving stack runs in the
    // sender's context too): a half-core host moved 247–335 Mbit/s depending on the day's VM
    // (CI failed at 400 Mbit/s with 247 and 272), so the site is shaped well below that and
    // the rate is checked within 10%. Load on the machine only lowers it: a low figure is
    // measured again, twice at most, and the fastest kept.
    let mut aa = throughput(&tb, "a1", "a2", 16 << 20, 5003);
    for port in [5004, 5005] {
        if aa >= 180.0 {
            break;
        }
        println!("a1->a2 {aa:.1} Mbit/s: measuring again");
        aa = aa.max(throughput(&tb, "a1", "a2", 16 << 20, port));
    }
    println!("a1->a2 {aa:.1} Mbit/s (shaped 200)");
    // The shapers count whole frames: 1514 B carry 1448 B of TCP payload, so a link shaped at
    // R moves R × 1448/1514 of payload (200 → 191.3, 40 → 38.3 Mbit/s).
    let goodput = |mbit: f64| mbit * 1448.0 / 1514.0;
    let within = |r: f64, mbit: f64| (0.9 * goodput(mbit)..=1.1 * goodput(mbit)).contains(&r);
    assert!(
        within(aa, 200.0),
        "site rate {aa:.1} Mbit/s not within 10% of the shaped 200's payload rate {:.1}",
        goodput(200.0)
    );
    for r in [ab, ba] {
        assert!(
            within(r, 40.0),
            "WAN rate {r:.1} Mbit/s not within 10% of the shaped 40's payload rate {:.1}",
            goodput(40.0)
        );
    }

    // Every host's cgroup: period, quota and (where the kernel has it) a burst of one quota.
    for h in tb.hosts() {
        let q = mutirao_testbed::plan::CpuQuota::for_cpu(h.cpu);
        let read = |f: &str| -> String {
            std::fs::read_to_string(h.cgroup.join(f))
                .unwrap_or_else(|e| panic!("{}: {f}: {e}", h.name))
                .trim()
                .to_string()
        };
        assert_eq!(
            read("cpu.cfs_period_us"),
            q.period_us.to_string(),
            "{}",
            h.name
        );
        assert_eq!(
            read("cpu.cfs_quota_us"),
            q.quota_us.to_string(),
            "{}",
            h.name
        );
        if h.cgroup.join("cpu.cfs_burst_us").exists() {
            assert_eq!(
                read("cpu.cfs_burst_us"),
                q.burst_us.to_string(),
                "{}",
                h.name
            );
        }
    }

    // CPU shares: spin in a1 (1.0) and b1 (0.25) at the same time.
    let iters = "60000000";
    let fast = tb.spawn("a1", probe(&["spin", iters])).expect("spin a1");
    let slow = tb.spawn("b1", probe(&["spin", iters])).expect("spin b1");
    let parse = |out: String| -> (f64, f64) {
        let w: Vec<f64> = out
            .split_whitespace()
            .skip(1)
            .take(2)
            .filter_map(|t| t.parse().ok())
            .collect();
        assert_eq!(w.len(), 2, "spin output {out:?}");
        (w[0], w[1])
    };
    let (fw, fc) = parse(finish(fast, "spin a1"));
    let (sw, sc) = parse(finish(slow, "spin b1"));
    println!(
        "spin a1: wall {fw:.3}s cpu {fc:.3}s; b1: wall {sw:.3}s cpu {sc:.3}s; ratio {:.2}",
        sw / fw
    );
    assert!(
        sc / sw <= 0.25 * 1.2,
        "b1 used {:.2} of a core, quota 0.25",
        sc / sw
    );
    assert!(sc / sw >= 0.15, "b1 got only {:.2} of a core", sc / sw);
    assert!(fc / fw >= 0.5, "a1 got only {:.2} of a core", fc / fw);
    assert!(
        (2.5..=6.0).contains(&(sw / fw)),
        "slowdown {:.2}, expected about 4",
        sw / fw
    );

    tb.down().expect("clean teardown");
    assert_gone(&prefix);
}

#[test]
fn a_failure_in_the_middle_of_up_removes_everything() {
    if !require_root() {
        return;
    }
    for steps in [3, 17, 40] {
        let prefix = sys::random_prefix().expect("prefix");
        let opts = UpOptions {
            prefix: Some(prefix.clone()),
            fail_after_steps: Some(steps),
            ..UpOptions::default()
        };
        match Testbed::up(&spec(TWO_SITES), opts) {
            Err(Error::Injected(n)) => assert_eq!(n, steps),
            other => panic!("expected the injected failure, got {other:?}"),
        }
        assert_gone(&prefix);
    }
}

#[test]
fn two_testbeds_coexist_and_go_down_independently() {
    if !require_root() {
        return;
    }
    let one = "[[site]]\nname = \"x\"\nnic_mbit = 100\nhosts = [ { name = \"x1\", cpu = 0.5 } ]\n";
    let t1 = Testbed::up(&spec(one), UpOptions::default()).expect("first");
    let t2 = Testbed::up(&spec(one), UpOptions::default()).expect("second");
    assert_ne!(t1.prefix(), t2.prefix());
    assert_ne!(t1.state().block, t2.state().block);
    let (p1, p2) = (t1.prefix().to_string(), t2.prefix().to_string());
    // A process spawned in a host is killed when its testbed goes.
    let mut spinner = t1
        .spawn("x1", probe(&["spin", "1000000000000"]))
        .expect("spin");
    drop(t1);
    assert_gone(&p1);
    let exited = (0..100).find_map(|_| {
        let s = spinner.try_wait().expect("try_wait");
        if s.is_none() {
            std::thread::sleep(Duration::from_millis(20));
        }
        s
    });
    let _ = spinner.kill();
    assert!(
        exited.is_some_and(|s| !s.success()),
        "spawned process survived teardown"
    );
    // The second still works: its host serves, the root namespace reaches it.
    let a = SocketAddr::from((t2.hosts()[0].addr, 6000));
    let server = t2
        .spawn("x1", probe(&["serve", &a.to_string(), "1", "5000"]))
        .expect("serve");
    let sender = Command::new(PROBE)
        .args(["send", &a.to_string(), "4096", "5000"])
        .output()
        .expect("send from root");
    assert!(
        sender.status.success(),
        "{}",
        String::from_utf8_lossy(&sender.stderr)
    );
    assert_eq!(recvs(&finish(server, "serve"))[0].0, 4096);
    drop(t2);
    assert_gone(&p2);
}

#[test]
fn agents_start_in_every_host_and_a_failing_agent_cleans_up() {
    if !require_root() {
        return;
    }
    // A stand-in agent: serves its {addr} until the readiness probe has connected.
    let good = AgentLaunch {
        program: PROBE.into(),
        args: vec!["serve".into(), "{addr}".into(), "2".into(), "20000".into()],
        port: 7207,
        log_dir: None,
        ready_timeout: Duration::from_secs(5),
    };
    let tb = Testbed::up(
        &spec(TWO_SITES),
        UpOptions {
            agent: Some(good.clone()),
            ..UpOptions::default()
        },
    )
    .expect("up with agents");
    let lines: Vec<String> = tb
        .hosts()
        .iter()
        .map(|h| format!("{} slots=1 port=7207", h.addr))
        .collect();
    assert_eq!(tb.hostfile(), format!("{}\n", lines.join("\n")));
    assert_eq!(tb.state().agents.len(), 3);
    for a in &tb.state().agents {
        assert!(
            std::path::Path::new(&format!("/proc/{}", a.pid)).exists(),
            "agent of {} runs",
            a.host
        );
        let cg = std::fs::read_to_string(format!("/proc/{}/cgroup", a.pid)).unwrap_or_default();
        assert!(
            cg.contains(tb.prefix()),
            "agent of {} is in the testbed cgroup: {cg}",
            a.host
        );
    }
    let pids: Vec<u32> = tb.state().agents.iter().map(|a| a.pid).collect();
    let prefix = tb.prefix().to_string();
    drop(tb);
    assert_gone(&prefix);
    for p in pids {
        let state = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
        assert!(
            state.is_empty() || state.contains(") Z"),
            "agent {p} still runs"
        );
    }

    let prefix = sys::random_prefix().expect("prefix");
    let bad = AgentLaunch {
        program: "/bin/false".into(),
        ..good
    };
    let r = Testbed::up(
        &spec(TWO_SITES),
        UpOptions {
            prefix: Some(prefix.clone()),
            agent: Some(bad),
            ..UpOptions::default()
        },
    );
    match r {
        Err(Error::Agent { host, problem, .. }) => {
            assert_eq!(host, "a1");
            assert!(problem.contains("exited"), "{problem}");
        }
        other => panic!("expected an agent error, got {other:?}"),
    }
    assert_gone(&prefix);
}

/// Median round trip (seconds) of a message of each size from `src` to `dst` and a one-byte
/// echo, `idle_ms` after the previous one (0: back to back, the link's bucket drained).
fn pingpong(
    tb: &Testbed,
    src: &str,
    dst: &str,
    sizes: &[u64],
    idle_ms: u64,
    port: u16,
) -> Vec<(u64, f64)> {
    pingpong_reps(tb, src, dst, sizes, idle_ms, port, 3)
}

/// [`pingpong`] with `reps` round trips per size.
fn pingpong_reps(
    tb: &Testbed,
    src: &str,
    dst: &str,
    sizes: &[u64],
    idle_ms: u64,
    port: u16,
    reps: u32,
) -> Vec<(u64, f64)> {
    let to = SocketAddr::from((tb.host(dst).expect("dst").addr, port)).to_string();
    let server = tb
        .spawn(dst, probe(&["echo", &to, "60000"]))
        .expect("spawn echo");
    let list = sizes
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let client = tb
        .spawn(
            src,
            probe(&[
                "pingpong",
                &to,
                &list,
                &reps.to_string(),
                &idle_ms.to_string(),
                "60000",
            ]),
        )
        .expect("spawn pingpong");
    let out = finish(client, "pingpong");
    finish(server, "echo");
    out.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some("pingpong")).then_some(())?;
            Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
        })
        .collect()
}

/// Issue 11, item 4: a shaped link behaves like a link — a message's time is latency +
/// size / rate at every size from 16 KiB to 4 MiB, after an idle spell (the token bucket full)
/// and back to back (the bucket drained), no faster than 5% (slower than 25%) + 0.1 ms + what the shaper passes at once
/// after a pause (the token bucket: one frame and 60 µs of rate on slow links, see `plan::Tbf`).
#[test]
fn shaped_links_take_latency_plus_size_over_rate() {
    if !require_root() {
        return;
    }
    // Hosts of a whole core each, so that the CPU does not pace the transfer.
    let links = r#"
[[site]]
name = "a"
nic_mbit = 200
hosts = [ { name = "a1", cpu = 1.0 }, { name = "a2", cpu = 1.0 } ]

[[site]]
name = "b"
nic_mbit = 200
hosts = [ { name = "b1", cpu = 1.0 } ]

[[wan]]
sites = ["a", "b"]
mbit = 30
"#;
    let tb = Testbed::up(&spec(links), UpOptions::default()).expect("testbed up");
    let sizes = [1u64, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20];
    let mut worst = Vec::new();
    // Ports for re-measurements, each used once.
    let mut retry_port = 6000u16;
    // Across the WAN (30 Mbit/s, the bottleneck), and inside site a (200 Mbit/s).
    for (src, dst, mbit, port) in [("a1", "b1", 30.0, 5101u16), ("a1", "a2", 200.0, 5111)] {
        for (idle, p) in [(150u64, port), (0, port + 1)] {
            let r = pingpong(&tb, src, dst, &sizes, idle, p);
            assert_eq!(r.len(), sizes.len(), "{src}->{dst}: {r:?}");
            // The latency from 15 one-byte round trips: a median of 3 was sometimes one
            // scheduler hiccup (0.7 ms for a 0.3 ms link on a loaded CI machine).
            let lat = pingpong_reps(&tb, src, dst, &[1], idle, p + 100, 15);
            let base = lat.first().map_or(r[0].1, |x| x.1);
            for &(m, t0) in &r[1..] {
                // The rate shapes whole frames (1514 B carry 1448 B of TCP payload).
                let want = base + m as f64 * 8.0 / (mbit * 1e6 * 1448.0 / 1514.0);
                // A loaded machine only ever adds time (a preempted sender or receiver), never
                // removes it: when a median comes out slow, measure that size again (twice at
                // most) and keep the fastest median. Too fast is never retried.
                let mut t = t0;
                for _ in 0..2 {
                    if t - want <= 0.05 * want + 1e-4 {
                        // (5% here: a slow median is measured again either way.)
                        break;
                    }
                    retry_port += 1;
                    let again = pingpong(&tb, src, dst, &[m], idle, retry_port);
                    if let Some(&(_, t2)) = again.first() {
                        t = t.min(t2);
                    }
                }
                let err = t / want - 1.0;
                println!(
                    "{src}->{dst} ({mbit} Mbit/s) idle {idle} ms: {m} B {:.3} ms, latency + size/rate {:.3} ms ({:+.1}%)",
                    t * 1e3,
                    want * 1e3,
                    100.0 * err
                );
                // 5%, plus 0.1 ms of timer slack, plus what the shaper lets through at once
                // after a pause: the token bucket, one frame and 60 µs of rate on slow links,
                // 0.2 ms of rate on fast ones (measured at 16 KiB after 150 ms idle: −8% across
                // 30 Mbit/s, −21…−25% at 200 Mbit/s; from 64 KiB within 5%).
                let tbf = mutirao_testbed::plan::Tbf::for_mbit(mbit);
                let bucket_s = tbf.burst_bytes as f64 * 8.0 / (mbit * 1e6);
                // Across the WAN the messages ran +4.4…+7.3% until 2026-11-27: the peak-rate
                // bucket was 2% above the rate and the kernel's timer released each frame
                // ~26 µs late, and that bucket cannot keep the tokens of a late release (see
                // `plan::TIMER_LATE_US`); 5% on every link since.
                // Too fast means the shaper lets more through than its rate: 5%. Too slow is
                // what a loaded 2-core CI machine adds even to the fastest of three medians
                // (+9…+15% once under the full suite, 2026-12-07), so slow is held to 25%:
                // still far inside what a wrong rate or a missing latency would cost.
                let tol = if t < want { 0.05 } else { 0.25 };
                if (t - want).abs() > tol * want + 1e-4 + bucket_s {
                    worst.push(format!(
                        "{src}->{dst} idle {idle} ms {m} B: {:+.1}%",
                        100.0 * err
                    ));
                }
            }
        }
    }
    assert!(
        worst.is_empty(),
        "messages off latency + size/rate by more than 5% fast or 25% slow: {worst:?}"
    );
}

/// Small packets cross a link ahead of the data queued on it: a rendezvous handshake
/// (request, clear-to-send) or a TCP acknowledgement does not wait behind the other direction's
/// bulk data (`Tbf::ack_first_args`). With one FIFO per direction they waited for up to a
/// second of queued data, and a 265 KB message across a 30 Mbit/s WAN took 286 ms instead of
/// 74 while traffic flowed the other way.
#[test]
fn small_messages_go_ahead_of_bulk_data_on_a_busy_link() {
    if !require_root() {
        return;
    }
    let tb = Testbed::up(
        &spec(&across_a_30_mbit_wan(r#"{ name = "b1", cpu = 1.0 }"#)),
        UpOptions::default(),
    )
    .expect("testbed up");
    // Bulk data from b1 to a1: three connections of 2 MB, over 1.5 s at 30 Mbit/s.
    let to_a = SocketAddr::from((tb.host("a1").expect("a1").addr, 5201)).to_string();
    let server = tb
        .spawn("a1", probe(&["serve", &to_a, "3", "10000"]))
        .expect("spawn serve");
    let bulk: Vec<_> = (0..3)
        .map(|_| {
            tb.spawn("b1", probe(&["send", &to_a, "2000000", "10000"]))
                .expect("spawn send")
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    // Meanwhile, small messages a1 -> b1 and their echoes b1 -> a1, behind the bulk data.
    let r = pingpong(&tb, "a1", "b1", &[1, 64], 0, 5211);
    let got = recvs(&finish(server, "serve"));
    for b in bulk {
        finish(b, "send");
    }
    assert_eq!(got.len(), 3);
    for (bytes, secs) in &got {
        assert_eq!(*bytes, 2_000_000, "all the bulk data arrived");
        assert!(
            *secs > 0.3 + 0.05,
            "a bulk transfer ended before the small messages: {got:?}"
        );
    }
    assert_eq!(r.len(), 2, "{r:?}");
    for (m, t) in r {
        println!("{m} B one-way while b1->a1 is full: {:.3} ms", t * 1e3);
        assert!(
            t < 0.0015,
            "a {m} B message took {:.1} ms one way behind bulk data (alone: well under 1 ms)",
            t * 1e3
        );
    }
}

/// Concurrent flows share a link max–min fair, as the simulator's flow model assumes
/// (`plan::flow_queue_batch`): two 2 MB transfers from a1 across a 30 Mbit/s WAN to b1 and b2,
/// the second started 150 ms after the first, end together, so each takes 2·S/rate − 150 ms
/// from its first byte. Over one FIFO the connection holding more of the queue took most of the
/// link: of two such transfers the second ended 0.48 s before the first.
#[test]
fn concurrent_flows_share_a_link_max_min_fair() {
    if !require_root() {
        return;
    }
    let tb = Testbed::up(
        &spec(&across_a_30_mbit_wan(
            r#"{ name = "b1", cpu = 0.5 }, { name = "b2", cpu = 0.5 }"#,
        )),
        UpOptions::default(),
    )
    .expect("testbed up");
    let bytes = 2_000_000u64;
    let to = |h: &str| SocketAddr::from((tb.host(h).expect("host").addr, 5301)).to_string();
    let servers: Vec<_> = ["b1", "b2"]
        .iter()
        .map(|h| {
            tb.spawn(h, probe(&["serve", &to(h), "1", "15000"]))
                .expect("spawn serve")
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let first = tb
        .spawn(
            "a1",
            probe(&["send", &to("b1"), &bytes.to_string(), "15000"]),
        )
        .expect("spawn send");
    std::thread::sleep(Duration::from_millis(150));
    let second = tb
        .spawn(
            "a1",
            probe(&["send", &to("b2"), &bytes.to_string(), "15000"]),
        )
        .expect("spawn send");
    finish(first, "send");
    finish(second, "send");
    let secs: Vec<f64> = servers
        .into_iter()
        .map(|s| {
            let r = recvs(&finish(s, "serve"));
            assert_eq!(r.len(), 1, "{r:?}");
            assert_eq!(r[0].0, bytes, "all bytes arrived");
            r[0].1
        })
        .collect();
    // Alone, one transfer takes S/rate (payload ~95.6% of the line rate): ~0.56 s.
    let alone = bytes as f64 * 8.0 / (30e6 * 1448.0 / 1514.0);
    println!("durations {secs:?} (alone {alone:.3} s)");
    let (d1, d2) = (secs[0], secs[1]);
    assert!(
        (d1 - d2).abs() <= 0.1 * d1.max(d2),
        "the two transfers should end together and so take as long as each other: {d1:.3} s \
         and {d2:.3} s"
    );
    assert!(
        d1.min(d2) > 1.3 * alone,
        "a transfer took {:.3} s, close to the {alone:.3} s of one alone: the link was not \
         shared",
        d1.min(d2)
    );
}

/// Scheduling policy and nice value of a thread (fields 41 and 19 of /proc/PID/stat).
fn policy_and_nice(pid: i32) -> (u32, i32) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("thread alive");
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // `after` starts at field 3 (state): field N is f[N - 3].
    (f[41 - 3].parse().unwrap(), f[19 - 3].parse().unwrap())
}

/// Nanoseconds a thread has run (first field of /proc/PID/schedstat).
fn ran_ns(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .expect("thread alive")
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .expect("schedstat")
}

#[test]
fn with_packet_threads_the_links_work_runs_in_kernel_threads_not_on_the_hosts() {
    if !require_root() {
        return;
    }
    if Command::new("ethtool").arg("--version").output().is_err() {
        let msg =
            "SKIPPED: needs ethtool (apt-get install ethtool) to switch the veths to threaded NAPI";
        println!("{msg}");
        eprintln!("{msg}");
        return;
    }
    let tb = Testbed::up(
        &spec(&across_a_30_mbit_wan(r#"{ name = "b1", cpu = 0.5 }"#)),
        UpOptions {
            packet_threads: true,
            ..UpOptions::default()
        },
    )
    .expect("testbed up");
    let threads = tb.state().packet_threads.clone();
    // Every shaped interface: two hosts' eth0, their two site ports, the WAN's two ends.
    assert_eq!(
        threads.len(),
        6,
        "one packet thread per shaped interface (is ethtool installed?): {threads:?}"
    );
    for &pid in &threads {
        assert_eq!(
            policy_and_nice(pid),
            (0, mutirao_testbed::PACKET_NICE),
            "packet thread {pid} should run SCHED_OTHER at nice {}",
            mutirao_testbed::PACKET_NICE
        );
    }
    let before: u64 = threads.iter().map(|&p| ran_ns(p)).sum();
    let mbit = throughput(&tb, "a1", "b1", 2_000_000, 5401);
    let ran_ms = (threads.iter().map(|&p| ran_ns(p)).sum::<u64>() - before) as f64 / 1e6;
    println!("2 MB across the WAN at {mbit:.1} Mbit/s; packet threads ran {ran_ms:.2} ms");
    // ~1400 frames, each handled by a thread at the site port, the WAN's far end and b1's
    // eth0, and its acknowledgement on the way back: far more than a millisecond. Frames
    // handled in softirq context (on whatever host's quota) would leave the threads idle.
    assert!(
        ran_ms > 1.0,
        "the packet threads ran {ran_ms:.3} ms while 2 MB crossed: the frames were not handled \
         by them"
    );
    let prefix = tb.prefix().to_string();
    tb.down().expect("down");
    assert_gone(&prefix);
}
