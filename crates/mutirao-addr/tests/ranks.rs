//! Multi-process tests named after digest 002 §7.8's checks. Every trial starts its own
//! directory server (on a Unix socket in a fresh temporary directory) and bootstrap server,
//! then N copies of this binary as the ranks of one job.
//!
//! A process started with `MUTIRAO_SCENARIO` set is a rank: it runs that scenario and exits 0
//! (pass) or 1 (fail, message on stderr).

use libtest_mimic::{Arguments, Failed, Trial};
use mutirao::local_job::LocalJob;
use mutirao::Comm;
use mutirao_addr::{
    Acl, Addr, AddrError, AttrList, Block, Config, Gid, Kind, Mailbox, Match, Reason, Rel, Scope,
    Target, TicketStatus, Timeout,
};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

type R = Result<(), String>;

macro_rules! check {
    ($cond:expr, $($fmt:tt)*) => {
        if !$cond {
            return Err(format!($($fmt)*));
        }
    };
}

fn e(err: impl std::fmt::Display) -> String {
    err.to_string()
}

const T: Duration = Duration::from_secs(10);

fn props(pairs: &[(&str, &str)]) -> AttrList {
    AttrList::from_pairs(pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())))
        .expect("literal attributes")
}

fn one(addr: &Addr, q: &AttrList) -> Result<Target, String> {
    let v = addr.find(q, Scope::Local).map_err(e)?;
    check!(
        v.len() == 1,
        "expected one mailbox for {q:?}, found {}",
        v.len()
    );
    Ok(v.into_iter().next().expect("length checked"))
}

fn recv_data(mb: &Mailbox<'_>, m: Match, t: Timeout) -> Result<Option<Vec<u8>>, String> {
    Ok(mb.recv(m, t).map_err(e)?.map(|m| m.data))
}

// ------------------------------------------------------------------ scenarios (run as ranks)

/// Check 11: matching on (mailbox, source|any, tag|any); Block, Poll, After; the received
/// buffer is the caller's and can be sent on.
fn check_11(w: &Comm, addr: &Addr) -> R {
    let r = w.rank();
    let inbox = props(&[("test", "c11"), ("role", "inbox")]);
    let srcq = props(&[("test", "c11"), ("role", "src")]);
    if r == 1 {
        let mb = Mailbox::register(addr, &inbox, Acl::Public).map_err(e)?;
        addr.barrier(T).map_err(e)?; // 1: registered
        addr.barrier(T).map_err(e)?; // 2: everything sent and acknowledged
        let src = one(addr, &srcq)?;
        check!(
            mb.pending() == 4,
            "4 messages waiting, found {}",
            mb.pending()
        );
        let got = recv_data(&mb, Match::tag(7), Timeout::Poll)?;
        check!(got.as_deref() == Some(&b"a7"[..]), "tag 7 gave {got:?}");
        let m = mb
            .recv(Match::src(src.gid), Timeout::Poll)
            .map_err(e)?
            .ok_or("nothing from the source mailbox")?;
        check!(
            m.tag == 8 && m.data == b"as-mailbox" && m.src_rank == 0,
            "by source: {m:?}"
        );
        let m = mb
            .recv(Match::any(), Timeout::Poll)
            .map_err(e)?
            .ok_or("no message")?;
        check!(
            m.data == b"a5" && m.tag == 5,
            "first in arrival order should be a5: {m:?}"
        );
        check!(m.src != src.gid, "plain sends carry the context as source");
        let got = recv_data(&mb, Match::tag(6), Timeout::Block)?;
        check!(got.as_deref() == Some(&b"a6"[..]), "tag 6 gave {got:?}");
        let t0 = Instant::now();
        let none = mb.recv(Match::any(), Timeout::Poll).map_err(e)?;
        check!(none.is_none(), "empty mailbox gave {none:?}");
        check!(
            t0.elapsed() < Duration::from_millis(100),
            "Poll waited {:?}",
            t0.elapsed()
        );
        let t0 = Instant::now();
        let none = mb
            .recv(Match::any(), Timeout::After(Duration::from_millis(150)))
            .map_err(e)?;
        check!(none.is_none(), "empty mailbox gave {none:?}");
        let el = t0.elapsed();
        check!(
            el >= Duration::from_millis(150) && el < Duration::from_secs(2),
            "After(150 ms) took {el:?}"
        );
        // The received buffer is ours: send it on.
        let t = addr.send(&src, 9, m.data).map_err(e)?;
        addr.wait(&t, T).map_err(e)?;
        addr.barrier(T).map_err(e)?; // 3
    } else if r == 0 {
        let me = Mailbox::register(addr, &srcq, Acl::Public).map_err(e)?;
        addr.barrier(T).map_err(e)?;
        let to = one(addr, &inbox)?;
        check!(to.kind == Kind::Mailbox && to.rank == 1, "found {to:?}");
        let mut ts = vec![];
        for tag in [5, 6, 7] {
            ts.push(
                addr.send(&to, tag, format!("a{tag}").into_bytes())
                    .map_err(e)?,
            );
        }
        ts.push(
            addr.send_as(&me, &to, 8, b"as-mailbox".to_vec())
                .map_err(e)?,
        );
        for t in &ts {
            addr.wait(t, T).map_err(e)?;
            check!(t.status() == TicketStatus::Delivered, "{:?}", t.status());
        }
        addr.barrier(T).map_err(e)?;
        let got = recv_data(&me, Match::tag(9), Timeout::After(T))?;
        check!(
            got.as_deref() == Some(&b"a5"[..]),
            "buffer sent on: {got:?}"
        );
        addr.barrier(T).map_err(e)?;
    } else {
        for _ in 0..3 {
            addr.barrier(T).map_err(e)?;
        }
    }
    Ok(())
}

/// Check 13 + §6.2.1: a send to a deleted mailbox reports a delivery error; a re-query finds
/// the replacement registered with the same properties on another rank; the resend arrives.
fn check_13(w: &Comm, addr: &Addr) -> R {
    let r = w.rank();
    let service = props(&[("service", "analyser"), ("test", "c13")]);
    match r {
        1 => {
            let a = Mailbox::register(addr, &service, Acl::Public).map_err(e)?;
            addr.barrier(T).map_err(e)?; // 1
            addr.barrier(T).map_err(e)?; // 1b: rank 0 found A
            let got = recv_data(&a, Match::any(), Timeout::After(T))?;
            check!(got.as_deref() == Some(&b"one"[..]), "A got {got:?}");
            a.delete().map_err(e)?;
            addr.barrier(T).map_err(e)?; // 2: A deleted, B registered
            addr.barrier(T).map_err(e)?; // 3 (serves rank 0's failing send meanwhile)
        }
        2 => {
            addr.barrier(T).map_err(e)?; // 1
            addr.barrier(T).map_err(e)?; // 1b: rank 0 found A

            // The replacement, registered while A still exists: same properties, other rank.
            let b = Mailbox::register(addr, &service, Acl::Public).map_err(e)?;
            addr.barrier(T).map_err(e)?; // 2
            let got = recv_data(&b, Match::any(), Timeout::After(T))?;
            check!(got.as_deref() == Some(&b"three"[..]), "B got {got:?}");
            let got = recv_data(&b, Match::any(), Timeout::After(T))?;
            check!(got.as_deref() == Some(&b"four"[..]), "B got {got:?}");
            addr.barrier(T).map_err(e)?; // 3
        }
        _ => {
            addr.barrier(T).map_err(e)?; // 1
            let a = one(addr, &service)?;
            check!(a.rank == 1, "A should live on rank 1: {a:?}");
            addr.barrier(T).map_err(e)?; // 1b
            let t = addr.send(&a, 0, b"one".to_vec()).map_err(e)?;
            addr.wait(&t, T).map_err(e)?;
            addr.barrier(T).map_err(e)?; // 2

            // The stale target: the ticket reports the failure.
            let t = addr.send(&a, 0, b"two".to_vec()).map_err(e)?;
            match addr.wait(&t, T) {
                Err(AddrError::Delivery {
                    gid,
                    reason: Reason::NoSuchResource,
                }) if gid == a.gid => {}
                other => return Err(format!("send to deleted A gave {other:?}")),
            }
            check!(
                matches!(t.status(), TicketStatus::Failed(Reason::NoSuchResource)),
                "ticket says {:?}",
                t.status()
            );
            // Re-query: only the replacement is there.
            let b = one(addr, &service)?;
            check!(b.rank == 2 && b.gid != a.gid, "replacement {b:?}");
            let t = addr.send(&b, 0, b"three".to_vec()).map_err(e)?;
            addr.wait(&t, T).map_err(e)?;
            // The helper with a stale cache: requery and resend once.
            let mut cache = Some(a.clone());
            let to = addr
                .send_by_properties(&mut cache, &service, Scope::Local, 0, b"four", T)
                .map_err(e)?;
            check!(to.gid == b.gid, "helper delivered to {to:?}");
            check!(
                cache.as_ref().map(|c| c.gid) == Some(b.gid),
                "cache {cache:?}"
            );
            addr.barrier(T).map_err(e)?; // 3
        }
    }
    Ok(())
}

/// Check 13, "the process is gone": rank 1 dies (SIGKILL) holding a mailbox; a send to it
/// reports a delivery error, not a hang.
fn check_13_gone(w: &Comm, addr: &Addr) -> R {
    let q = props(&[("test", "c13-gone")]);
    if w.rank() == 1 {
        let _m = Mailbox::register(addr, &q, Acl::Public).map_err(e)?;
        addr.barrier(T).map_err(e)?;
        // SAFETY: kill(2) on our own pid has no memory-safety preconditions.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
        return Err("still alive after SIGKILL".into());
    }
    addr.barrier(T).map_err(e)?;
    let to = one(addr, &q)?;
    // Give the death time to be noticed by the runtime, then send.
    let t0 = Instant::now();
    let t = addr.send(&to, 0, b"hello?".to_vec()).map_err(e)?;
    match addr.wait(&t, Duration::from_secs(5)) {
        Err(AddrError::Delivery {
            reason: Reason::ProcessGone(_),
            ..
        }) => {}
        other => return Err(format!("send to a dead process gave {other:?}")),
    }
    check!(
        t0.elapsed() < Duration::from_secs(5),
        "noticed after {:?}",
        t0.elapsed()
    );
    // No finalize: the world has a dead member.
    std::process::exit(0);
}

/// Check 10: `send` never blocks even with zero credits; beyond the window messages are queued
/// and all delivered, in order, once credits return; a slow receiver loses nothing and never
/// holds more than the window.
fn check_10(w: &Comm, addr: &Addr) -> R {
    let q = props(&[("test", "c10")]);
    let n = 100usize;
    let credits = addr.credits() as usize;
    check!(
        credits == 4,
        "the trial sets MUTIRAO_ADDR_CREDITS=4, got {credits}"
    );
    if w.rank() == 1 {
        let mb = Mailbox::register(addr, &q, Acl::Public).map_err(e)?;
        addr.barrier(T).map_err(e)?;
        // Slow receiver: away from the runtime while the sender sends everything.
        std::thread::sleep(Duration::from_millis(300));
        for i in 0..n {
            let m = mb
                .recv(Match::any(), Timeout::After(T))
                .map_err(e)?
                .ok_or(format!("message {i} never came"))?;
            check!(
                mb.pending() < credits,
                "mailbox holds {} > window",
                mb.pending() + 1
            );
            let want: Vec<u8> = (0..1000).map(|k| (k + i) as u8).collect();
            check!(
                m.data == want && m.tag == i as i32,
                "message {i} wrong (tag {})",
                m.tag
            );
            if i % 10 == 0 {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        check!(
            mb.recv(Match::any(), Timeout::After(Duration::from_millis(50)))
                .map_err(e)?
                .is_none(),
            "an extra message"
        );
        addr.barrier(T).map_err(e)?;
    } else {
        addr.barrier(T).map_err(e)?;
        let to = one(addr, &q)?;
        let t0 = Instant::now();
        let mut ts = vec![];
        for i in 0..n {
            let data: Vec<u8> = (0..1000).map(|k| (k + i) as u8).collect();
            ts.push(addr.send(&to, i as i32, data).map_err(e)?);
        }
        let took = t0.elapsed();
        let s = addr.stats();
        check!(
            s.queued == n - credits && s.data_frames_to[1] == credits as u64,
            "after the sends: {s:?} (expected {} queued, {credits} on the wire)",
            n - credits
        );
        check!(
            took < Duration::from_millis(250),
            "100 sends took {took:?} while the receiver slept 300 ms: send blocked"
        );
        for (i, t) in ts.iter().enumerate() {
            addr.wait(t, T).map_err(|x| format!("ticket {i}: {x}"))?;
        }
        check!(addr.stats().queued == 0, "still queued: {:?}", addr.stats());
        addr.barrier(T).map_err(e)?;
    }
    Ok(())
}

/// Check 12: frames use power-of-two buffer classes (2^(y−1) < x + ctrl ≤ 2^y); sizes on
/// both sides of every class boundary and far above the largest class (4 KiB here) arrive
/// whole and byte-identical; a second round of the same sizes allocates no new buffers.
fn check_12(w: &Comm, addr: &Addr) -> R {
    const CTRL: usize = 37; // header of a data frame
    let mut sizes = vec![0usize, 1];
    for y in 6..=12 {
        sizes.push((1usize << y) - CTRL);
        sizes.push((1usize << y) - CTRL + 1);
    }
    let pooled = sizes.len();
    sizes.extend([100_000, 3 << 20]);
    let q = props(&[("test", "c12")]);
    let pattern = |len: usize, salt: usize| -> Vec<u8> {
        (0..len).map(|i| ((i * 31 + salt) % 253) as u8).collect()
    };
    if w.rank() == 1 {
        let mb = Mailbox::register(addr, &q, Acl::Public).map_err(e)?;
        addr.barrier(T).map_err(e)?;
        for round in 0..2 {
            let n = if round == 0 { sizes.len() } else { pooled };
            for (i, &len) in sizes.iter().take(n).enumerate() {
                let m = mb
                    .recv(Match::any(), Timeout::After(T))
                    .map_err(e)?
                    .ok_or(format!(
                        "round {round}: message {i} ({len} bytes) never came"
                    ))?;
                check!(
                    m.tag == i as i32,
                    "round {round}: message {i} came as tag {}",
                    m.tag
                );
                check!(
                    m.data.len() == len,
                    "message {i}: {} bytes, sent {len}",
                    m.data.len()
                );
                check!(
                    m.data == pattern(len, i),
                    "message {i} ({len} bytes): bytes differ"
                );
            }
        }
        addr.barrier(T).map_err(e)?;
    } else if w.rank() == 0 {
        addr.barrier(T).map_err(e)?;
        let to = one(addr, &q)?;
        let (mut allocated_before_round_2, mut reused_before_round_2) = (0, 0);
        for round in 0..2 {
            let n = if round == 0 { sizes.len() } else { pooled };
            let ts: Vec<_> = sizes
                .iter()
                .take(n)
                .enumerate()
                .map(|(i, &len)| addr.send(&to, i as i32, pattern(len, i)))
                .collect::<Result<_, _>>()
                .map_err(e)?;
            for t in &ts {
                addr.wait(t, T).map_err(e)?;
            }
            // Let every finished send give its buffer back.
            for _ in 0..1000 {
                if addr.stats().in_flight == 0 {
                    break;
                }
                addr.progress().map_err(e)?;
                std::thread::sleep(Duration::from_millis(1));
            }
            if round == 0 {
                allocated_before_round_2 = addr.stats().buffers_allocated;
                reused_before_round_2 = addr.stats().buffers_reused;
            }
        }
        let s = addr.stats();
        // (An acknowledgement may arrive while every small buffer is still on the wire, so
        // allow a spare or two; without pooling this round would allocate one per frame.)
        let (allocated, reused) = (
            s.buffers_allocated - allocated_before_round_2,
            s.buffers_reused - reused_before_round_2,
        );
        check!(
            allocated <= 2 && reused >= pooled as u64,
            "the second round allocated {allocated} buffers and reused {reused}: {s:?}"
        );
        addr.barrier(T).map_err(e)?;
    } else {
        addr.barrier(T).map_err(e)?;
        addr.barrier(T).map_err(e)?;
    }
    Ok(())
}

/// Check 14: A (technology 0) → B (0 and 1, bridge) → C (technology 1). Every frame between A
/// and C goes through B, which hands on the buffer it received: B's layer copies no payload
/// byte (instrumented count) while it forwards a megabyte; C gets every byte intact and A's
/// tickets report delivery (the acknowledgements come back through B).
fn check_14(w: &Comm, addr: &Addr) -> R {
    let r = w.rank();
    let q = props(&[("test", "c14")]);
    let mb = if r == 2 {
        Some(Mailbox::register(addr, &q, Acl::Public).map_err(e)?)
    } else {
        None
    };
    addr.barrier(T).map_err(e)?; // 1 (its frames between 0 and 2 already cross the bridge)
    let before = addr.stats();
    let n = 64usize;
    let chunk = 16 * 1024;
    let pattern =
        |i: usize| -> Vec<u8> { (0..chunk).map(|k| ((k * 13 + i) % 256) as u8).collect() };
    match r {
        0 => {
            let to = one(addr, &q)?;
            let ts: Vec<_> = (0..n)
                .map(|i| addr.send(&to, i as i32, pattern(i)))
                .collect::<Result<_, _>>()
                .map_err(e)?;
            for t in &ts {
                addr.wait(t, T).map_err(e)?;
            }
            let s = addr.stats();
            check!(
                s.data_frames_to[2] == before.data_frames_to[2]
                    && s.data_frames_to[1] - before.data_frames_to[1] == n as u64,
                "A should hand every data frame to the bridge: {s:?}"
            );
        }
        2 => {
            let mb = mb.as_ref().ok_or("no mailbox")?;
            for i in 0..n {
                let m = mb
                    .recv(Match::any(), Timeout::After(T))
                    .map_err(e)?
                    .ok_or(format!("message {i} never came"))?;
                check!(m.src_rank == 0 && m.tag == i as i32, "message {i}: {m:?}");
                check!(m.data == pattern(i), "message {i}: bytes differ");
            }
        }
        _ => {}
    }
    addr.barrier(T).map_err(e)?; // 2 (the bridge serves while it waits)
    if r == 1 {
        let s = addr.stats();
        let fwd_bytes = s.forwarded_bytes - before.forwarded_bytes;
        let copied = s.bytes_copied - before.bytes_copied;
        check!(
            s.forwarded - before.forwarded >= 2 * n as u64 && fwd_bytes >= (n * chunk) as u64,
            "the bridge forwarded {} frames, {fwd_bytes} bytes",
            s.forwarded - before.forwarded
        );
        // Only its own barrier frames (a few dozen bytes) were encoded or decoded.
        check!(
            copied < 256,
            "the bridge copied {copied} bytes while forwarding {fwd_bytes}"
        );
    }
    addr.barrier(T).map_err(e)?;
    Ok(())
}

/// Check 14, no bridge: processes on different technologies with no bridge between them get
/// `NoRoute` at once (ticket and get), and the addressing barrier does not wait for each other.
fn check_14_no_route(w: &Comm, addr: &Addr) -> R {
    let q = props(&[("test", "c14-noroute")]);
    let b = props(&[("test", "c14-noroute-block")]);
    let _mine = if w.rank() == 1 {
        Some((
            Mailbox::register(addr, &q, Acl::Public).map_err(e)?,
            Block::register(addr, &b, 16, Acl::Public).map_err(e)?,
        ))
    } else {
        None
    };
    w.barrier().map_err(e)?; // the runtime's own barrier: its mesh is complete
    if w.rank() == 0 {
        let to = one(addr, &q)?;
        let t = addr.send(&to, 0, b"x".to_vec()).map_err(e)?;
        check!(
            t.status() == TicketStatus::Failed(Reason::NoRoute(1)),
            "ticket says {:?}",
            t.status()
        );
        let blk = addr.find_blocks(&b, Scope::Local).map_err(e)?;
        check!(blk.len() == 1, "block {blk:?}");
        match addr.get(&blk[0], 0, 4, T) {
            Err(AddrError::Delivery {
                reason: Reason::NoRoute(1),
                ..
            }) => {}
            other => return Err(format!("get without a route gave {other:?}")),
        }
        let t0 = Instant::now();
        addr.barrier(T).map_err(e)?;
        check!(
            t0.elapsed() < Duration::from_secs(1),
            "barrier waited {:?}",
            t0.elapsed()
        );
    } else {
        addr.barrier(T).map_err(e)?;
    }
    w.barrier().map_err(e)?;
    Ok(())
}

/// Check 20 (runtime half): multicast over relations with cycles; each member gets exactly one
/// copy; one wire message per destination process.
fn check_20(w: &Comm, addr: &Addr) -> R {
    let r = w.rank();
    let mine: &[usize] = match r {
        0 => &[0],
        1 => &[1, 2],
        _ => &[3],
    };
    let mut boxes = vec![];
    for &i in mine {
        let p = props(&[("test", "c20"), ("member", &i.to_string())]);
        boxes.push(Mailbox::register(addr, &p, Acl::Public).map_err(e)?);
    }
    addr.barrier(T).map_err(e)?; // 1: all registered
    if r == 0 {
        let m: Vec<Gid> = (0..4)
            .map(|i| {
                one(addr, &props(&[("test", "c20"), ("member", &i.to_string())])).map(|t| t.gid)
            })
            .collect::<Result<_, _>>()?;
        // m1, m2 below m0; m1 ↔ m2 both ways (cycle); m3 paired with m0 and m0 below m3 (cycle).
        for (o, d, rel) in [
            (m[1], m[0], Rel::Filiation),
            (m[2], m[1], Rel::Filiation),
            (m[1], m[2], Rel::Filiation),
            (m[3], m[0], Rel::Pairing),
            (m[0], m[3], Rel::Filiation),
        ] {
            addr.relate(o, d, rel).map_err(e)?;
        }
        let before = addr.stats().data_frames_to;
        let mc = addr
            .multicast(m[0], 3, b"to the group", Scope::Local)
            .map_err(e)?;
        let after = addr.stats().data_frames_to;
        let mut members = mc.members.clone();
        members.sort();
        let mut want = m.clone();
        want.sort();
        check!(
            members == want && mc.unreachable.is_empty(),
            "members {mc:?}"
        );
        let sent: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
        check!(
            sent == [0, 1, 1],
            "wire messages per destination rank: {sent:?} (want [0, 1, 1])"
        );
        check!(
            mc.tickets.len() == 3,
            "one ticket per process: {}",
            mc.tickets.len()
        );
        for t in &mc.tickets {
            addr.wait(t, T).map_err(e)?;
        }
    }
    addr.barrier(T).map_err(e)?; // 2: delivered everywhere
    for b in &boxes {
        let got = recv_data(b, Match::any(), Timeout::After(T))?;
        check!(
            got.as_deref() == Some(&b"to the group"[..]),
            "member {} got {got:?}",
            b.gid()
        );
        let again = recv_data(b, Match::any(), Timeout::After(Duration::from_millis(50)))?;
        check!(again.is_none(), "member {} got a second copy", b.gid());
    }
    addr.barrier(T).map_err(e)?;
    Ok(())
}

/// Check 7 (put/get half and receiver-side refusal) and the software put/get path: another
/// rank writes and reads registered blocks byte-identically; out-of-range accesses are
/// errors; a process outside the ACL cannot find private resources, and its send, put and
/// get to them are refused by the receiver.
fn check_07(w: &Comm, addr: &Addr) -> R {
    let r = w.rank();
    let shared = props(&[("store", "shared"), ("test", "c07")]);
    let large = props(&[("store", "large"), ("test", "c07")]);
    let private_block = props(&[("store", "private"), ("test", "c07")]);
    let private_box = props(&[("inbox", "private"), ("test", "c07")]);
    let refused_in_time = |res: Result<(), AddrError>, what: &str| -> R {
        match res {
            Err(AddrError::Delivery {
                reason: Reason::AclRefused,
                ..
            }) => Ok(()),
            other => Err(format!("{what} by an outsider gave {other:?}")),
        }
    };
    match r {
        1 => {
            let b = Block::register(addr, &shared, 4096, Acl::Public).map_err(e)?;
            let _l = Block::register(addr, &large, 1 << 20, Acl::Public).map_err(e)?;
            let p = Block::register(addr, &private_block, 64, Acl::private()).map_err(e)?;
            let mb = Mailbox::register(addr, &private_box, Acl::private()).map_err(e)?;
            p.write(0, b"secret").map_err(e)?;
            addr.barrier(T).map_err(e)?; // 1
            addr.barrier(T).map_err(e)?; // 2: rank 0 done
            let got = b.read(100, 1000).map_err(e)?;
            let want: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
            check!(got == want, "rank 0's put is not in the block");
            b.write(0, b"local").map_err(e)?;
            addr.barrier(T).map_err(e)?; // 3: rank 2 done
            check!(
                p.read(0, 6).map_err(e)? == b"secret",
                "the private block changed"
            );
            let none = recv_data(&mb, Match::any(), Timeout::Poll)?;
            check!(
                none.is_none(),
                "a refused message reached the private mailbox"
            );
            check!(
                b.read(2000, 3).map_err(e)? == b"out",
                "outsider's put to the public block"
            );
            addr.barrier(T).map_err(e)?; // 4
        }
        0 => {
            addr.barrier(T).map_err(e)?; // 1
            let bs = addr.find_blocks(&shared, Scope::Local).map_err(e)?;
            check!(bs.len() == 1 && bs[0].size == Some(4096), "blocks {bs:?}");
            let b = &bs[0];
            let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
            addr.wait(&addr.put(b, 100, data.clone()).map_err(e)?, T)
                .map_err(e)?;
            let back = addr.get(b, 100, 1000, T).map_err(e)?;
            check!(back == data, "get after put differs");
            // Out of range: errors, not panics.
            let t = addr.put(b, 4000, vec![1; 200]).map_err(e)?;
            match addr.wait(&t, T) {
                Err(AddrError::Delivery {
                    reason:
                        Reason::OutOfRange {
                            offset: 4000,
                            len: 200,
                            size: 4096,
                        },
                    ..
                }) => {}
                other => return Err(format!("out-of-range put gave {other:?}")),
            }
            match addr.get(b, 4090, 10, T) {
                Err(AddrError::Delivery {
                    reason: Reason::OutOfRange { .. },
                    ..
                }) => {}
                other => return Err(format!("out-of-range get gave {other:?}")),
            }
            match addr.get(b, u64::MAX, 2, T) {
                Err(AddrError::Delivery {
                    reason: Reason::OutOfRange { .. },
                    ..
                }) => {}
                other => return Err(format!("overflowing get gave {other:?}")),
            }
            // Wrong kind.
            let as_box = Target {
                kind: Kind::Mailbox,
                ..b.clone()
            };
            let t = addr.send(&as_box, 0, vec![1]).map_err(e)?;
            check!(
                matches!(
                    addr.wait(&t, T),
                    Err(AddrError::Delivery {
                        reason: Reason::WrongKind,
                        ..
                    })
                ),
                "a send to a block was not refused"
            );
            // A large block, byte-identical both ways.
            let l = addr.find_blocks(&large, Scope::Local).map_err(e)?;
            check!(l.len() == 1, "large block {l:?}");
            let big: Vec<u8> = (0..(1u32 << 20)).map(|i| (i ^ (i >> 8)) as u8).collect();
            addr.wait(&addr.put(&l[0], 0, big.clone()).map_err(e)?, T)
                .map_err(e)?;
            let back = addr.get(&l[0], 0, 1 << 20, T).map_err(e)?;
            check!(back == big, "1 MiB get after put differs");
            // Tell the outsider where the private resources are (as if it guessed the gids).
            let p = addr.find_blocks(&private_block, Scope::Local).map_err(e)?;
            let mb = one(addr, &private_box)?;
            check!(
                p.len() == 1,
                "the owner's uid sees the private block: {p:?}"
            );
            w.send(&[p[0].gid.0, p[0].ctx.0, mb.gid.0, mb.ctx.0], 2, 77)
                .map_err(e)?;
            addr.barrier(T).map_err(e)?; // 2
            addr.barrier(T).map_err(e)?; // 3
            addr.barrier(T).map_err(e)?; // 4
        }
        _ => {
            // This rank runs as another user (see the driver): an outsider to private ACLs.
            check!(
                unsafe { libc::geteuid() } == 65534,
                "rank 2 should run as uid 65534"
            );
            addr.barrier(T).map_err(e)?; // 1
            addr.barrier(T).map_err(e)?; // 2
            let p = addr.find_blocks(&private_block, Scope::Local).map_err(e)?;
            check!(p.is_empty(), "an outsider found the private block: {p:?}");
            let mbs = addr.find(&private_box, Scope::Local).map_err(e)?;
            check!(
                mbs.is_empty(),
                "an outsider found the private mailbox: {mbs:?}"
            );
            let mut ids = [0u64; 4];
            w.recv(&mut ids, 0, 77).map_err(e)?;
            let mk = |gid: u64, ctx: u64, kind: Kind| Target {
                gid: Gid(gid),
                kind,
                job: addr.job().to_string(),
                rank: 1,
                ctx: Gid(ctx),
                size: Some(64),
                attrs: AttrList::new(),
            };
            let pb = mk(ids[0], ids[1], Kind::Block);
            let pm = mk(ids[2], ids[3], Kind::Mailbox);
            let t = addr.put(&pb, 0, b"hacked".to_vec()).map_err(e)?;
            refused_in_time(addr.wait(&t, T), "put")?;
            refused_in_time(addr.get(&pb, 0, 6, T).map(|_| ()), "get")?;
            let t = addr.send(&pm, 0, b"hi".to_vec()).map_err(e)?;
            refused_in_time(addr.wait(&t, T), "send")?;
            // Public resources stay usable for the outsider.
            let b = addr.find_blocks(&shared, Scope::Local).map_err(e)?;
            check!(b.len() == 1, "public block for the outsider: {b:?}");
            addr.wait(&addr.put(&b[0], 2000, b"out".to_vec()).map_err(e)?, T)
                .map_err(e)?;
            addr.barrier(T).map_err(e)?; // 3
            addr.barrier(T).map_err(e)?; // 4
        }
    }
    Ok(())
}

fn run_scenario(name: &str) -> ! {
    if name == "no_directory" {
        // Without MUTIRAO_DIR_SOCKET: a clear error, before any collective step.
        let code = match mutirao::init() {
            Ok(w) => {
                let cfg = Config {
                    credits: 4,
                    socket: None,
                    max_class_bytes: 1 << 16,
                    techs: 1,
                    bridge: false,
                };
                match Addr::connect_with(&w, cfg) {
                    Err(AddrError::NoDirectory) => {
                        let msg = AddrError::NoDirectory.to_string();
                        if msg.contains("MUTIRAO_DIR_SOCKET") && msg.contains("mutirao run") {
                            0
                        } else {
                            eprintln!("unhelpful message: {msg}");
                            1
                        }
                    }
                    other => {
                        eprintln!("connect without a directory gave {other:?}");
                        1
                    }
                }
            }
            Err(err) => {
                eprintln!("init failed: {err}");
                1
            }
        };
        std::process::exit(code);
    }
    let w = match mutirao::init() {
        Ok(w) => w,
        Err(err) => {
            eprintln!("init failed: {err}");
            std::process::exit(1);
        }
    };
    if name == "check_07" && w.rank() == 2 {
        // Become an outsider (uid/gid 65534) before talking to the directory: the directory
        // identifies us by SO_PEERCRED and the receiver by the credentials we send.
        // SAFETY: plain system calls on our own process; failure is checked.
        let ok = unsafe {
            libc::setresgid(65534, 65534, 65534) == 0 && libc::setresuid(65534, 65534, 65534) == 0
        };
        if !ok {
            eprintln!("cannot switch to uid 65534");
            std::process::exit(1);
        }
    }
    let cfg = match Config::from_env() {
        Ok(mut c) => {
            if name == "check_14_no_route" {
                c.techs = 1 << w.rank();
            }
            if name == "check_14" {
                // A: technology 0; B: 0 and 1, bridge; C: technology 1.
                (c.techs, c.bridge) = match w.rank() {
                    0 => (0b01, false),
                    1 => (0b11, true),
                    _ => (0b10, false),
                };
            }
            c
        }
        Err(err) => {
            eprintln!("bad settings: {err}");
            std::process::exit(1);
        }
    };
    let addr = match Addr::connect_with(&w, cfg) {
        Ok(a) => a,
        Err(err) => {
            eprintln!("connect failed on rank {}: {err}", w.rank());
            std::process::exit(1);
        }
    };
    let res = match name {
        "check_07" => check_07(&w, &addr),
        "check_10" => check_10(&w, &addr),
        "check_11" => check_11(&w, &addr),
        "check_12" => check_12(&w, &addr),
        "check_13" => check_13(&w, &addr),
        "check_13_gone" => check_13_gone(&w, &addr),
        "check_14" => check_14(&w, &addr),
        "check_14_no_route" => check_14_no_route(&w, &addr),
        "check_20" => check_20(&w, &addr),
        other => Err(format!("unknown scenario {other}")),
    };
    drop(addr);
    let fin = w.finalize().map_err(e);
    match res.and(fin) {
        Ok(()) => std::process::exit(0),
        Err(msg) => {
            eprintln!("scenario {name} failed: {msg}");
            std::process::exit(1);
        }
    }
}

// ------------------------------------------------------------------ the driver

struct Outcome {
    codes: Vec<Option<i32>>,
    stderr: Vec<String>,
}

struct TempDir(PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Starts a directory server on a socket in a fresh directory; it lives until the test
/// process ends.
fn directory(tag: &str) -> Result<(TempDir, PathBuf), Failed> {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("mutirao-addr-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(e)?;
    // World-searchable so that a rank running as another user reaches the socket.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).map_err(e)?;
    let sock = dir.join("dir.sock");
    let (tx, rx) = std::sync::mpsc::channel();
    let s2 = sock.clone();
    std::thread::spawn(move || {
        let tx2 = tx.clone();
        let res =
            mutirao_dir::server::run_blocking(Default::default(), Some(s2), None, move |_| {
                let _ = tx2.send(Ok(()));
            });
        if let Err(err) = res {
            let _ = tx.send(Err(err.to_string()));
        }
    });
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(Ok(())) => Ok((TempDir(dir), sock)),
        Ok(Err(m)) => Err(m.into()),
        Err(_) => Err("the directory server did not start within 10 s".into()),
    }
}

fn launch(
    scenario: &str,
    n: usize,
    env: &[(&str, &str)],
    limit: Duration,
) -> Result<Outcome, Failed> {
    let (_dir, sock) = directory(scenario)?;
    let exe = std::env::current_exe().map_err(e)?;
    let mut job = LocalJob::new(exe, n)
        .env("MUTIRAO_SCENARIO", scenario)
        .env("MUTIRAO_DIR_SOCKET", sock.to_string_lossy())
        .env_remove("MUTIRAO_ADDR_CREDITS")
        .env_remove("MUTIRAO_ADDR_MAX_CLASS")
        .limit(limit);
    for (k, v) in env {
        job = job.env(*k, *v);
    }
    let o = job.run()?;
    Ok(Outcome {
        codes: o.codes,
        stderr: o.stderr,
    })
}

fn all_ok(
    name: &'static str,
    scenario: &'static str,
    n: usize,
    env: &'static [(&'static str, &'static str)],
) -> Trial {
    Trial::test(name, move || {
        let o = launch(scenario, n, env, Duration::from_secs(30))?;
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
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let trials = vec![
        all_ok(
            "check_10_send_never_blocks_credit_window_slow_receiver",
            "check_10",
            2,
            &[("MUTIRAO_ADDR_CREDITS", "4")],
        ),
        all_ok(
            "check_12_size_classes_and_messages_above_the_largest_class_arrive_whole",
            "check_12",
            2,
            &[("MUTIRAO_ADDR_MAX_CLASS", "4096")],
        ),
        all_ok(
            "check_14_bridged_path_forwards_without_copying_the_payload",
            "check_14",
            3,
            &[],
        ),
        all_ok(
            "check_14_no_bridge_means_no_route",
            "check_14_no_route",
            2,
            &[],
        ),
        all_ok(
            "check_11_recv_matching_block_poll_after",
            "check_11",
            3,
            &[],
        ),
        all_ok(
            "check_13_deleted_mailbox_delivery_error_and_replacement",
            "check_13",
            3,
            &[],
        ),
        all_ok(
            "check_20_multicast_cycle_one_copy_per_member_one_wire_message_per_process",
            "check_20",
            3,
            &[],
        ),
        // Rank 2 switches to uid 65534 to be an ACL outsider: needs root.
        all_ok(
            "check_07_put_get_byte_identical_range_and_acl_refusal",
            "check_07",
            3,
            &[],
        )
        .with_ignored_flag(!root),
        Trial::test("check_13_send_to_dead_process_reports_process_gone", || {
            let o = launch("check_13_gone", 2, &[], Duration::from_secs(30))?;
            if o.codes[0] == Some(0) && o.codes[1].is_none() {
                Ok(())
            } else {
                Err(format!("exit codes {:?}\n{}", o.codes, o.stderr.join("\n")).into())
            }
        }),
        Trial::test("connect_without_directory_says_how_to_get_one", || {
            let o = launch_solo_without_directory()?;
            if o == Some(0) {
                Ok(())
            } else {
                Err(format!("exit code {o:?}").into())
            }
        }),
    ];
    libtest_mimic::run(&args, trials).exit();
}

fn launch_solo_without_directory() -> Result<Option<i32>, Failed> {
    let exe = std::env::current_exe().map_err(e)?;
    let st = Command::new(exe)
        .env("MUTIRAO_SCENARIO", "no_directory")
        .env_remove("MUTIRAO_RANK")
        .env_remove("MUTIRAO_DIR_SOCKET")
        .stdout(Stdio::null())
        .status()
        .map_err(e)?;
    Ok(st.code())
}
