//! Multi-process tests: every trial starts N copies of this binary as ranks of one job (with an
//! in-test bootstrap server), on shared memory and on TCP, and checks how they ended.
//!
//! A process started with `MUTIRAO_SCENARIO` set is a rank: it runs that scenario and exits
//! 0 (pass), 1 (fail, message on stderr) or 3 (it saw the error the scenario expects).

use libtest_mimic::{Arguments, Failed, Trial};
use mutirao::local_job::LocalJob;
use mutirao::op::{self, Op, UserOp};
use mutirao::{Comm, Error, ANY_SOURCE, ANY_TAG};
use std::time::{Duration, Instant};

// ------------------------------------------------------------------ a tiny seeded generator

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

type R = Result<(), String>;

fn e(err: Error) -> String {
    err.to_string()
}

macro_rules! check {
    ($cond:expr, $($fmt:tt)*) => {
        if !$cond {
            return Err(format!($($fmt)*));
        }
    };
}

// ------------------------------------------------------------------ scenarios (run as ranks)

fn p2p(w: &Comm) -> R {
    let dbg = |s: &str| {
        if std::env::var("P2P_DEBUG").is_ok() {
            eprintln!("[{}] {s}", w.rank())
        }
    };
    let (r, n) = (w.rank(), w.size());
    // Non-overtaking: rank 1 sends 200 messages with tags 0/1/2, rank 0 takes tag 2 first, then any.
    if r == 1 {
        for i in 0..200u32 {
            w.send(&[i], 0, (i % 3) as i32).map_err(e)?;
        }
    } else if r == 0 {
        let mut b = [0u32];
        let st = w.recv(&mut b, 1, 2).map_err(e)?;
        check!(
            b[0] == 2 && st.tag == 2 && st.source == 1 && st.bytes == 4,
            "first tag-2 message is {b:?} {st:?}"
        );
        let mut last = [None::<u32>; 3];
        for _ in 0..199 {
            let st = w.recv(&mut b, ANY_SOURCE, ANY_TAG).map_err(e)?;
            let t = st.tag as usize;
            check!(b[0] % 3 == t as u32, "tag {t} carried {}", b[0]);
            if let Some(prev) = last[t] {
                check!(b[0] > prev, "tag {t}: {} arrived after {prev}", b[0]);
            }
            last[t] = Some(b[0]);
        }
    }
    dbg("order done");
    w.barrier().map_err(e)?;
    // Every size across eager/rendezvous, both directions at once, checked content.
    for &size in &[0usize, 1, 100, 65536, 65537, 300_000, 4 << 20] {
        let to = (r + 1) % n;
        let from = (r + n - 1) % n;
        let out: Vec<u8> = (0..size).map(|i| (i * 7 + r) as u8).collect();
        let mut inb = vec![0u8; size];
        let st = w.sendrecv(&out, to, 5, &mut inb, from, 5).map_err(e)?;
        check!(
            st.bytes == size && st.source == from,
            "sendrecv {size}: {st:?}"
        );
        check!(
            inb.iter()
                .enumerate()
                .all(|(i, b)| *b == (i * 7 + from) as u8),
            "sendrecv {size}: wrong bytes"
        );
        dbg(&format!("sendrecv {size} ok"));
    }
    // Unexpected large message: sent before the receive is posted.
    if n >= 2 {
        // (A blocking send of a large message may wait for its receive, as in MPI: use isend.)
        let pending = if r == 0 {
            let big: Vec<u64> = (0..200_000).collect();
            Some(w.isend(big, 1, 9).map_err(e)?)
        } else {
            None
        };
        w.barrier().map_err(e)?;
        if r == 1 {
            let (v, st) = w.recv_vec::<u64>(0, 9).map_err(e)?;
            check!(
                st.bytes == 1_600_000 && v.len() == 200_000 && v[199_999] == 199_999,
                "unexpected large: {st:?}"
            );
        }
        if let Some(p) = pending {
            p.wait().map_err(e)?;
        }
    }
    dbg("unexpected large done");
    // Truncation is an error, not a crash.
    if n >= 2 {
        if r == 0 {
            w.send(&[1u8; 10], 1, 11).map_err(e)?;
        } else if r == 1 {
            let mut small = [0u8; 4];
            match w.recv(&mut small, 0, 11) {
                Err(Error::Truncated { got: 10, cap: 4 }) => {}
                other => return Err(format!("truncation gave {other:?}")),
            }
        }
    }
    // Serde objects and self-sends.
    w.send_obj(&vec![format!("to myself {r}")], r, 3)
        .map_err(e)?;
    let (v, _): (Vec<String>, _) = w.recv_obj(r, 3).map_err(e)?;
    check!(v == [format!("to myself {r}")], "self send gave {v:?}");
    Ok(())
}

fn nonblocking(w: &Comm) -> R {
    let (r, n) = (w.rank(), w.size());
    let mut reqs = Vec::new();
    for p in 0..n {
        reqs.push(w.irecv::<u32>(p, 4).map_err(e)?);
    }
    let mut sends = Vec::new();
    for p in 0..n {
        let len = 1 + p * 20_000; // some eager, some rendezvous
        sends.push(w.isend(vec![r as u32; len], p, 4).map_err(e)?);
    }
    let mut seen = vec![false; n];
    while !reqs.is_empty() {
        let (_, v, st) = mutirao::wait_any(&mut reqs).map_err(e)?;
        let st = st.ok_or("no status")?;
        check!(
            v.len() == 1 + r * 20_000 && v.iter().all(|x| *x as usize == st.source),
            "irecv from {}: len {}",
            st.source,
            v.len()
        );
        seen[st.source] = true;
    }
    check!(seen.iter().all(|s| *s), "missing sources {seen:?}");
    for (i, (buf, _)) in mutirao::wait_all(sends).map_err(e)?.into_iter().enumerate() {
        check!(
            buf.len() == 1 + i * 20_000,
            "isend buffer not returned whole"
        );
    }
    // test() and probe.
    if n >= 2 {
        if r == 1 {
            w.send(&[7u16, 8, 9], 0, 6).map_err(e)?;
        }
        if r == 0 {
            let st = w.probe(1, 6).map_err(e)?;
            check!(st.bytes == 6 && st.count::<u16>() == 3, "probe {st:?}");
            let mut q = w.irecv::<u16>(1, 6).map_err(e)?;
            let t0 = Instant::now();
            while !q.test().map_err(e)? {
                check!(
                    t0.elapsed() < Duration::from_secs(10),
                    "test never completed"
                );
            }
            let (v, _) = q.wait().map_err(e)?;
            check!(v == [7, 8, 9], "got {v:?}");
            check!(
                w.iprobe(1, 6).map_err(e)?.is_none(),
                "message received twice"
            );
        }
    }
    Ok(())
}

/// Affine maps x ↦ a·x + b under composition: associative, not commutative.
fn compose() -> impl Op<[u64; 2]> {
    UserOp::new(|input: &[[u64; 2]], inout: &mut [[u64; 2]]| {
        for (f, g) in input.iter().zip(inout.iter_mut()) {
            // (input then inout): x ↦ g(f(x)) = ga·(fa·x + fb) + gb
            *g = [
                g[0].wrapping_mul(f[0]),
                g[0].wrapping_mul(f[1]).wrapping_add(g[1]),
            ];
        }
    })
    .non_commutative()
}

fn collectives(w: &Comm) -> R {
    let (r, n) = (w.rank(), w.size());
    let mut rng = Rng(12345 + n as u64);
    let val = |rank: usize, i: usize, salt: u64| -> u64 {
        (rank as u64 + 1)
            .wrapping_mul(1_000_003)
            .wrapping_add(i as u64 * 31)
            .wrapping_add(salt)
    };
    for case in 0..60u64 {
        // Sizes span the small and large algorithm paths.
        let count = match rng.below(4) {
            0 => rng.below(4) as usize,
            1 => 1 + rng.below(100) as usize,
            2 => 1 + rng.below(20_000) as usize,
            _ => 70_000 + rng.below(10_000) as usize,
        };
        let root = rng.below(n as u64) as usize;
        let salt = rng.next();
        let mine: Vec<u64> = (0..count).map(|i| val(r, i, salt)).collect();
        let serial_sum: Vec<u64> = (0..count)
            .map(|i| (0..n).fold(0u64, |a, k| a.wrapping_add(val(k, i, salt))))
            .collect();
        match case % 9 {
            0 => {
                let mut b = if r == root {
                    mine.clone()
                } else {
                    vec![0u64; count]
                };
                w.bcast(&mut b, root).map_err(e)?;
                let want: Vec<u64> = (0..count).map(|i| val(root, i, salt)).collect();
                check!(b == want, "case {case}: bcast of {count} from {root}");
            }
            1 => {
                let mut out = vec![0u64; count];
                w.reduce(&mine, &mut out, &op::Sum, root).map_err(e)?;
                check!(
                    r != root || out == serial_sum,
                    "case {case}: reduce of {count} to {root}"
                );
            }
            2 => {
                let mut out = vec![0u64; count];
                w.allreduce(&mine, &mut out, &op::Sum).map_err(e)?;
                check!(out == serial_sum, "case {case}: allreduce of {count}");
                let mut mx = vec![0u64; count];
                w.allreduce(&mine, &mut mx, &op::Max).map_err(e)?;
                let want: Vec<u64> = (0..count)
                    .map(|i| (0..n).map(|k| val(k, i, salt)).max().unwrap_or(0))
                    .collect();
                check!(mx == want, "case {case}: allreduce max of {count}");
            }
            3 => {
                let c = count.min(5000);
                let mut out = vec![0u64; if r == root { n * c } else { 0 }];
                w.gather(&mine[..c], &mut out, root).map_err(e)?;
                if r == root {
                    for k in 0..n {
                        check!(
                            (0..c).all(|i| out[k * c + i] == val(k, i, salt)),
                            "case {case}: gather block {k}"
                        );
                    }
                }
            }
            4 => {
                let c = count.min(5000);
                let all: Vec<u64> = (0..n * c)
                    .map(|x| val(x / c.max(1), x % c.max(1), salt))
                    .collect();
                let mut out = vec![0u64; c];
                w.scatter(if r == root { &all } else { &[] }, &mut out, root)
                    .map_err(e)?;
                check!(
                    (0..c).all(|i| out[i] == val(r, i, salt)),
                    "case {case}: scatter of {c}"
                );
            }
            5 => {
                let c = count.min(5000);
                let mut out = vec![0u64; n * c];
                w.allgather(&mine[..c], &mut out).map_err(e)?;
                for k in 0..n {
                    check!(
                        (0..c).all(|i| out[k * c + i] == val(k, i, salt)),
                        "case {case}: allgather block {k}"
                    );
                }
            }
            6 => {
                let c = count.min(2000);
                let send: Vec<u64> = (0..n * c).map(|x| val(r, x, salt)).collect();
                let mut out = vec![0u64; n * c];
                w.alltoall(&send, &mut out).map_err(e)?;
                for k in 0..n {
                    check!(
                        (0..c).all(|i| out[k * c + i] == val(k, r * c + i, salt)),
                        "case {case}: alltoall from {k}"
                    );
                }
            }
            7 => {
                // Variable counts: rank k contributes k + case % 3 elements.
                let counts: Vec<usize> = (0..n).map(|k| k + (case % 3) as usize).collect();
                let total: usize = counts.iter().sum();
                let my: Vec<u64> = (0..counts[r]).map(|i| val(r, i, salt)).collect();
                let mut out = vec![0u64; if r == root { total } else { 0 }];
                w.gatherv(&my, &mut out, &counts, root).map_err(e)?;
                if r == root {
                    let want: Vec<u64> = (0..n)
                        .flat_map(|k| (0..counts[k]).map(move |i| val(k, i, salt)))
                        .collect();
                    check!(out == want, "case {case}: gatherv");
                }
                let mut back = vec![0u64; counts[r]];
                w.scatterv(if r == root { &out } else { &[] }, &counts, &mut back, root)
                    .map_err(e)?;
                check!(back == my, "case {case}: scatterv");
            }
            _ => {
                // Non-commutative user operator: the result is the composition in rank order.
                let c = count.min(3000);
                let f = |k: usize, i: usize| [val(k, i, salt) | 1, val(k, i, salt ^ 7)];
                let my: Vec<[u64; 2]> = (0..c).map(|i| f(r, i)).collect();
                let mut out = vec![[0u64; 2]; c];
                w.allreduce(&my, &mut out, &compose()).map_err(e)?;
                let mut red = vec![[0u64; 2]; c];
                w.reduce(&my, &mut red, &compose(), root).map_err(e)?;
                for i in 0..c {
                    let mut acc = f(0, i);
                    for k in 1..n {
                        let g = f(k, i);
                        acc = [
                            g[0].wrapping_mul(acc[0]),
                            g[0].wrapping_mul(acc[1]).wrapping_add(g[1]),
                        ];
                    }
                    check!(
                        out[i] == acc,
                        "case {case}: non-commutative allreduce element {i}"
                    );
                    check!(
                        r != root || red[i] == acc,
                        "case {case}: non-commutative reduce element {i}"
                    );
                }
            }
        }
    }
    // Allreduce on each side of every size where the algorithm changes: recursive doubling
    // below 64 KiB, recursive halving from it (up to 128 KiB over TCP, 1 MiB on shared
    // memory), the ring above.
    for (k, count) in [8191usize, 8192, 12_500, 16_384, 16_385, 131_071, 131_072]
        .into_iter()
        .enumerate()
    {
        let salt = k as u64 * 977;
        let mine: Vec<u64> = (0..count).map(|i| val(r, i, salt)).collect();
        let mut out = vec![0u64; count];
        w.allreduce(&mine, &mut out, &op::Sum).map_err(e)?;
        check!(
            (0..count).all(|i| out[i] == (0..n).fold(0u64, |a, q| a.wrapping_add(val(q, i, salt)))),
            "allreduce of {count} elements"
        );
    }
    // Bcast on each side of 512 KiB from a rank other than 0: from 8 ranks spanning hosts,
    // scatter + allgather.
    for (k, count) in [65_535usize, 65_536, 70_001].into_iter().enumerate() {
        let salt = 77 + k as u64;
        let from = (k + 1) % n;
        let mut b: Vec<u64> = if r == from {
            (0..count).map(|i| val(from, i, salt)).collect()
        } else {
            vec![0u64; count]
        };
        w.bcast(&mut b, from).map_err(e)?;
        check!(
            (0..count).all(|i| b[i] == val(from, i, salt)),
            "bcast of {count} elements from {from}"
        );
    }
    // Alltoall on each side of 32 KiB per block: above it, with ranks outnumbering the cores,
    // every block goes at once by single copy.
    for (k, c) in [4096usize, 4097, 9000].into_iter().enumerate() {
        let salt = 31 + k as u64;
        let send: Vec<u64> = (0..n * c).map(|x| val(r, x, salt)).collect();
        let mut out = vec![0u64; n * c];
        w.alltoall(&send, &mut out).map_err(e)?;
        for q in 0..n {
            check!(
                (0..c).all(|i| out[q * c + i] == val(q, r * c + i, salt)),
                "alltoall of {c} elements per block, block from {q}"
            );
        }
    }
    w.barrier().map_err(e)?;
    // split and dup: parity groups reduce separately, keys reverse the order.
    let sub = w
        .split(Some((r % 2) as u32), -(r as i32))
        .map_err(e)?
        .ok_or("split returned None")?;
    let members: Vec<usize> = (0..n).filter(|k| k % 2 == r % 2).collect();
    check!(sub.size() == members.len(), "split size {}", sub.size());
    check!(
        sub.rank() == members.len() - 1 - members.iter().position(|k| *k == r).unwrap_or(0),
        "split rank order"
    );
    let mut s = [0u64];
    sub.allreduce(&[r as u64], &mut s, &op::Sum).map_err(e)?;
    check!(
        s[0] == members.iter().map(|k| *k as u64).sum::<u64>(),
        "split allreduce {}",
        s[0]
    );
    let d = w.dup().map_err(e)?;
    // A message on the dup does not match a receive on the original.
    if n >= 2 {
        if r == 0 {
            d.send(&[1u8], 1, 0).map_err(e)?;
            w.send(&[2u8], 1, 0).map_err(e)?;
        } else if r == 1 {
            let mut b = [0u8];
            w.recv(&mut b, 0, 0).map_err(e)?;
            check!(b[0] == 2, "dup leaked into the original communicator");
            d.recv(&mut b, 0, 0).map_err(e)?;
            check!(b[0] == 1, "dup lost its message");
        }
    }
    check!(
        w.split(None, 0).map_err(e)?.is_none(),
        "split(None) gave a communicator"
    );
    Ok(())
}

/// The last rank kills itself with SIGKILL in the middle of a series of allreduces; the others
/// must get an error (exit 3) well within 5 s.
fn kill_mid_collective(w: &Comm) -> R {
    let (r, n) = (w.rank(), w.size());
    let mut out = vec![0u64; 1000];
    for i in 0..1_000_000u64 {
        if r == n - 1 && i == 50 {
            // SAFETY: kill(2) on our own pid has no memory-safety preconditions.
            unsafe {
                libc_kill_self();
            }
        }
        match w.allreduce(&vec![i; 1000], &mut out, &op::Sum) {
            Ok(()) => {}
            Err(Error::PeerFailed { .. }) | Err(Error::PeerFinalized(_)) => std::process::exit(3),
            Err(other) => return Err(format!("unexpected error kind: {other}")),
        }
    }
    Err("the collective never failed".into())
}

/// Rank 0 passes 2 elements to an allreduce, the others 1: every rank must get an error that
/// says so (exit 3, the message on stderr), none may hang or return a wrong sum.
fn mismatch(w: &Comm) -> R {
    let count = if w.rank() == 0 { 2 } else { 1 };
    let mut out = vec![0u64; count];
    match w.allreduce(&vec![1u64; count], &mut out, &op::Sum) {
        Ok(()) => Err(format!("allreduce of mismatched counts returned {out:?}")),
        Err(err) => {
            eprintln!("rank {} error: {err}", w.rank());
            std::process::exit(3)
        }
    }
}

/// Allreduces of 100 000 and 120 000 bytes, sizes where the algorithm depends on the eager
/// limit towards TCP peers; the test gives one rank a lower limit than the others.
fn uneven_eager(w: &Comm) -> R {
    let (r, n) = (w.rank() as u64, w.size() as u64);
    for count in [12_500usize, 15_000, 12_500] {
        let mine: Vec<u64> = (0..count as u64).map(|i| i * 7 + r).collect();
        let mut out = vec![0u64; count];
        w.allreduce(&mine, &mut out, &op::Sum).map_err(e)?;
        let want = |i: u64| i * 7 * n + n * (n - 1) / 2;
        check!(
            (0..count).all(|i| out[i] == want(i as u64)),
            "allreduce of {count} with uneven eager limits"
        );
    }
    Ok(())
}

/// The last rank stops itself (SIGSTOP: its sockets stay open and it says nothing, as a host
/// cut off from the network), and the launcher declares it lost. The others' receives from it
/// fail with `PeerFailed` instead of waiting forever, they go on among themselves, and their
/// finalize (after the scenario) succeeds.
fn lost_peer(w: &Comm) -> R {
    let (r, n) = (w.rank(), w.size());
    w.barrier().map_err(e)?;
    if r == n - 1 {
        // SAFETY: kill(2) on our own pid has no memory-safety preconditions.
        unsafe {
            libc_stop_self();
        }
        return Err("the stopped rank was continued".into());
    }
    let t = Instant::now();
    let mut b = [0u8];
    match w.recv(&mut b, n - 1, 0) {
        Err(Error::PeerFailed { rank, .. }) if rank == n - 1 => {}
        other => return Err(format!("a receive from the lost rank gave {other:?}")),
    }
    let took = t.elapsed();
    check!(
        took < Duration::from_secs(10),
        "the lost rank was failed only after {took:?}"
    );
    // A collective of the whole communicator cannot complete either, and says so.
    match w.barrier() {
        Err(Error::PeerFailed { .. }) => {}
        other => return Err(format!("a barrier with the lost rank gave {other:?}")),
    }
    // The survivors go on among themselves.
    let peer = if r == 0 { 1 } else { 0 };
    w.send(&[r as u8], peer, 1).map_err(e)?;
    w.recv(&mut b, peer, 1).map_err(e)?;
    check!(b[0] as usize == peer, "got {} from rank {peer}", b[0]);
    println!("lost after {} ms", took.as_millis());
    Ok(())
}

unsafe fn libc_stop_self() {
    extern "C" {
        fn kill(pid: i32, sig: i32) -> i32;
    }
    // SIGSTOP is 19 on Linux.
    kill(std::process::id() as i32, 19);
}

unsafe fn libc_kill_self() {
    extern "C" {
        fn kill(pid: i32, sig: i32) -> i32;
    }
    kill(std::process::id() as i32, 9);
}

/// Ranks 0 and 2 ping-pong over TCP while each also has a shared-memory peer (1 and 3).
fn mixed_pingpong(w: &Comm) -> Result<(), String> {
    let peer = match w.rank() {
        0 => 2,
        2 => 0,
        _ => return Ok(()),
    };
    let mut buf = [0u8; 8];
    for i in 0..20u8 {
        if w.rank() == 0 {
            w.send(&[i; 8], peer, 1).map_err(e)?;
            w.recv(&mut buf, peer, 1).map_err(e)?;
        } else {
            w.recv(&mut buf, peer, 1).map_err(e)?;
            w.send(&buf, peer, 1).map_err(e)?;
        }
        if buf != [i; 8] {
            return Err(format!("round {i}: got {buf:?}"));
        }
    }
    Ok(())
}

/// Every rank's start-up phases are there, each within the total, their sum too; each rank
/// prints them (`init R register_us exchange_us connect_us barrier_us total_us`) for the driver
/// to compare with what the bootstrap server was told.
fn init_timings(w: &Comm) -> R {
    let t = w
        .init_timings()
        .ok_or("init_timings() is None under a launcher")?;
    let sum = t.register + t.exchange + t.connect + t.barrier;
    check!(
        sum <= t.total && !t.total.is_zero(),
        "phases {t:?} add up to {sum:?}, more than the total (or the total is zero)"
    );
    // Every communicator of the process answers the same.
    let d = w.dup().map_err(e)?;
    check!(
        d.init_timings() == Some(t),
        "a dup answers {:?}",
        d.init_timings()
    );
    println!(
        "init {} {} {} {} {} {}",
        w.rank(),
        t.register.as_micros(),
        t.exchange.as_micros(),
        t.connect.as_micros(),
        t.barrier.as_micros(),
        t.total.as_micros()
    );
    Ok(())
}

fn run_scenario(name: &str) -> ! {
    let w = match mutirao::init() {
        Ok(w) => w,
        Err(err) => {
            eprintln!("init failed: {err}");
            std::process::exit(1);
        }
    };
    let res = match name {
        "p2p" => p2p(&w),
        "nonblocking" => nonblocking(&w),
        "collectives" => collectives(&w),
        "kill" => kill_mid_collective(&w),
        "mismatch" => mismatch(&w),
        "uneven_eager" => uneven_eager(&w),
        "mixed_pingpong" => mixed_pingpong(&w),
        "init_timings" => init_timings(&w),
        "lost_peer" => lost_peer(&w),
        other => Err(format!("unknown scenario {other}")),
    };
    let fin = w.finalize().map_err(e);
    match res.and(fin) {
        Ok(()) => std::process::exit(0),
        Err(msg) => {
            eprintln!("scenario {name} failed on rank: {msg}");
            std::process::exit(1);
        }
    }
}

// ------------------------------------------------------------------ the driver

struct Outcome {
    codes: Vec<Option<i32>>,
    stderr: Vec<String>,
    elapsed: Duration,
}

fn launch(scenario: &str, n: usize, transport: &str, limit: Duration) -> Result<Outcome, Failed> {
    launch_env(scenario, n, transport, limit, &|_| Vec::new())
}

/// [`launch`] with extra environment variables per rank.
fn launch_env(
    scenario: &str,
    n: usize,
    transport: &str,
    limit: Duration,
    extra: &dyn Fn(usize) -> Vec<(&'static str, String)>,
) -> Result<Outcome, Failed> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let per_rank: Vec<Vec<(String, String)>> = (0..n)
        .map(|r| {
            extra(r)
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect()
        })
        .collect();
    let out = LocalJob::new(exe, n)
        .env("MUTIRAO_SCENARIO", scenario)
        .env("MUTIRAO_TRANSPORT", transport)
        .per_rank_env(move |r| per_rank[r].clone())
        .limit(limit)
        .run()
        .map_err(|e| {
            e.replace(
                "did not finish",
                &format!("({scenario}, {transport}) did not finish"),
            )
        })?;
    Ok(Outcome {
        codes: out.codes,
        stderr: out.stderr,
        elapsed: out.elapsed,
    })
}

fn expect_all_ok(scenario: &'static str, n: usize, transport: &'static str) -> Trial {
    Trial::test(format!("{scenario}_{n}ranks_{transport}"), move || {
        let o = launch(scenario, n, transport, Duration::from_secs(60))?;
        if o.codes.iter().all(|c| *c == Some(0)) {
            Ok(())
        } else {
            Err(format!("exit codes {:?}\n{}", o.codes, o.stderr.join("\n")).into())
        }
    })
}

fn main() {
    // Started as a rank without a scenario: never run the suite recursively.
    if std::env::var_os("MUTIRAO_RANK").is_some() && std::env::var_os("MUTIRAO_SCENARIO").is_none()
    {
        eprintln!("started as a rank without MUTIRAO_SCENARIO: refusing to run the test suite");
        std::process::exit(1);
    }
    if let Ok(s) = std::env::var("MUTIRAO_SCENARIO") {
        run_scenario(&s);
    }
    let args = Arguments::from_args();
    let mut trials = Vec::new();
    for transport in ["auto", "tcp"] {
        trials.push(expect_all_ok("p2p", 3, transport));
        trials.push(expect_all_ok("nonblocking", 4, transport));
        for n in [1, 2, 3, 5] {
            trials.push(expect_all_ok("collectives", n, transport));
        }
    }
    // 6 ranks: two folded pairs before recursive halving; 8: a power of two above 4.
    trials.push(expect_all_ok("collectives", 6, "auto"));
    trials.push(expect_all_ok("collectives", 8, "auto"));
    // 8 ranks on two "hosts" (MUTIRAO_HOST_ID splits this machine): a large bcast takes
    // scatter + allgather, and the ranks of one host talk through shared memory, across TCP.
    trials.push(Trial::test("collectives_8ranks_on_two_hosts", || {
        let o = launch_env("collectives", 8, "auto", Duration::from_secs(60), &|r| {
            vec![("MUTIRAO_HOST_ID", format!("h{}", r % 2))]
        })?;
        if o.codes.iter().all(|c| *c == Some(0)) {
            Ok(())
        } else {
            Err(format!("exit codes {:?}\n{}", o.codes, o.stderr.join("\n")).into())
        }
    }));
    for transport in ["auto", "tcp"] {
        trials.push(Trial::test(
            format!("kill9_mid_collective_others_get_errors_{transport}"),
            move || {
                let o = launch("kill", 4, transport, Duration::from_secs(30))?;
                let survivors = &o.codes[..3];
                if o.codes[3].is_some() {
                    return Err(format!("the killed rank exited normally: {:?}", o.codes).into());
                }
                if !survivors.iter().all(|c| *c == Some(3)) {
                    return Err(format!(
                        "survivors should report the failure (exit 3): {:?}\n{}",
                        o.codes,
                        o.stderr.join("\n")
                    )
                    .into());
                }
                if o.elapsed > Duration::from_secs(5) {
                    return Err(format!("survivors took {:?} to notice", o.elapsed).into());
                }
                Ok(())
            },
        ));
    }
    for transport in ["auto", "tcp"] {
        trials.push(Trial::test(
            format!("an_allreduce_of_mismatched_counts_fails_on_every_rank_{transport}"),
            move || {
                let o = launch("mismatch", 2, transport, Duration::from_secs(30))?;
                if !o.codes.iter().all(|c| *c == Some(3)) {
                    return Err(format!(
                        "every rank should report the mismatch (exit 3): {:?}\n{}",
                        o.codes,
                        o.stderr.join("\n")
                    )
                    .into());
                }
                if !o.stderr[0].contains("collective mismatch: rank 1 sent 8 bytes where 16") {
                    return Err(format!("rank 0 said: {}", o.stderr[0]).into());
                }
                Ok(())
            },
        ));
    }
    trials.push(Trial::test(
        "ranks_with_different_eager_limits_agree_on_the_allreduce_algorithm",
        || {
            // Rank 0 alone would take the ring for these sizes, the others recursive halving.
            let o = launch_env("uneven_eager", 4, "tcp", Duration::from_secs(20), &|r| {
                if r == 0 {
                    vec![("MUTIRAO_EAGER_LIMIT", "16384".to_string())]
                } else {
                    Vec::new()
                }
            })?;
            if o.codes.iter().all(|c| *c == Some(0)) {
                Ok(())
            } else {
                Err(format!("exit codes {:?}\n{}", o.codes, o.stderr.join("\n")).into())
            }
        },
    ));
    for transport in ["auto", "tcp"] {
        trials.push(Trial::test(
            format!("init_timings_are_reported_by_every_rank_and_reach_the_launcher_{transport}"),
            move || {
                let exe = std::env::current_exe().map_err(|e| e.to_string())?;
                let out = LocalJob::new(exe, 3)
                    .env("MUTIRAO_SCENARIO", "init_timings")
                    .env("MUTIRAO_TRANSPORT", transport)
                    .limit(Duration::from_secs(60))
                    .run()?;
                if !out.codes.iter().all(|c| *c == Some(0)) {
                    return Err(
                        format!("exit codes {:?}\n{}", out.codes, out.stderr.join("\n")).into(),
                    );
                }
                for (r, o) in out.stdout.iter().enumerate() {
                    let v: Vec<u128> = o
                        .lines()
                        .find_map(|l| l.strip_prefix("init "))
                        .ok_or(format!("rank {r} printed no timings: {o:?}"))?
                        .split(' ')
                        .map(|x| x.parse().map_err(|_| format!("rank {r}: {o:?}")))
                        .collect::<Result<_, _>>()?;
                    let p = out.init[r].ok_or(format!(
                        "the bootstrap server has no phases of rank {r}: {:?}",
                        out.init
                    ))?;
                    // What the server was told is what the rank measured.
                    let told = [p.register, p.exchange, p.connect].map(|d| d.as_micros());
                    if v[0] != r as u128 || told[..] != v[1..4] {
                        return Err(format!("rank {r} printed {v:?}, the server has {p:?}").into());
                    }
                }
                Ok(())
            },
        ));
    }
    for transport in ["auto", "tcp"] {
        trials.push(Trial::test(
            format!(
                "a_rank_declared_lost_fails_the_others_operations_and_they_finalize_{transport}"
            ),
            move || {
                let exe = std::env::current_exe().map_err(|e| e.to_string())?;
                let out = LocalJob::new(exe, 3)
                    .env("MUTIRAO_SCENARIO", "lost_peer")
                    .env("MUTIRAO_TRANSPORT", transport)
                    .env("MUTIRAO_LOST_POLL_MS", "50")
                    .stopped_ranks_are_lost()
                    .limit(Duration::from_secs(30))
                    .run()?;
                if out.codes[..2] != [Some(0), Some(0)] || out.codes[2].is_some() {
                    return Err(format!(
                        "survivors must finish (0) and the lost rank be killed: {:?}\n{}",
                        out.codes,
                        out.stderr.join("\n")
                    )
                    .into());
                }
                eprintln!("{}", out.stdout[..2].join(""));
                Ok(())
            },
        ));
    }
    // Regression: with TCP and shared-memory peers mixed, the yield phase of an oversubscribed
    // host never polled the sockets, so every TCP message waited out the whole phase (1 ms by
    // default; 10 s here, so a regression cannot pass by luck).
    trials.push(Trial::test(
        "tcp_messages_are_seen_while_yielding_with_shm_peers",
        || {
            let o = launch_env("mixed_pingpong", 4, "auto", Duration::from_secs(8), &|r| {
                vec![
                    ("MUTIRAO_HOST_ID", if r < 2 { "a" } else { "b" }.to_string()),
                    ("MUTIRAO_SPIN_US", "0".to_string()),
                    ("MUTIRAO_YIELD_US", "10000000".to_string()),
                ]
            })?;
            if o.codes.iter().all(|c| *c == Some(0)) {
                Ok(())
            } else {
                Err(format!("exit codes {:?}\n{}", o.codes, o.stderr.join("\n")).into())
            }
        },
    ));
    libtest_mimic::run(&args, trials).exit();
}
