//! Costs of addressing by properties over the runtime, on two ranks.
//!
//! ```text
//! cargo build --release -p mutirao-addr --example addr_bench && cargo build -p mutirao-cli
//! target/debug/mutirao run -n 2 target/release/examples/addr_bench [ITERS]
//! ```
//!
//! Prints, for 64-byte messages: the round trip of the raw runtime (`Comm::send`/`recv`) and
//! of mailbox-to-mailbox sends (each acknowledged); one-way throughput of 1 KiB sends with the
//! credit window; and the latency of 4 KiB `get`s from a remote block.
//!
//! With 3 ranks (`mutirao run -n 3 …`) it measures the bridged path of check 14 instead: rank 0
//! on technology X, rank 2 on Y, rank 1 on both as the bridge; mailbox round trips 0↔1 (X),
//! 1↔2 (Y) and 0↔2 (through the bridge), which should be about the sum of the first two.
//!
//! With an even number of ranks ≥ 4 (`mutirao run -n 8 …`) it measures check 18: the mailbox
//! round trip of pair 0↔1 alone, then of all pairs (0↔1, 2↔3, …) at once; the thesis's target
//! is concurrent pairs within 2× the single pair.

use mutirao_addr::{Acl, Addr, AttrList, Block, Config, Mailbox, Match, Scope, Timeout};
use std::process::ExitCode;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(30);

fn run(world: &mutirao::Comm, addr: &Addr, iters: usize) -> Result<(), String> {
    let s = |e: mutirao_addr::AddrError| e.to_string();
    let me = addr.rank();
    let mb = Mailbox::register(
        addr,
        &AttrList::from_pairs([("bench", format!("inbox-{me}"))]).map_err(|e| e.to_string())?,
        Acl::Public,
    )
    .map_err(s)?;
    let block = Block::register(
        addr,
        &AttrList::from_pairs([("bench", format!("block-{me}"))]).map_err(|e| e.to_string())?,
        1 << 16,
        Acl::Public,
    )
    .map_err(s)?;
    addr.barrier(T).map_err(s)?;
    let other = 1 - me;
    let find = |what: &str| {
        AttrList::from_pairs([("bench", format!("{what}-{other}"))])
            .map_err(|e| e.to_string())
            .and_then(|q| addr.find(&q, Scope::Local).map_err(|e| e.to_string()))
    };
    let peer = find("inbox")?.pop().ok_or("peer inbox not found")?;
    let peer_block = AttrList::from_pairs([("bench", format!("block-{other}"))])
        .map_err(|e| e.to_string())
        .and_then(|q| {
            addr.find_blocks(&q, Scope::Local)
                .map_err(|e| e.to_string())
        })?
        .pop()
        .ok_or("peer block not found")?;

    // 1. Raw runtime round trip.
    let msg = [7u8; 64];
    let mut buf = [0u8; 64];
    world.barrier().map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    for _ in 0..iters {
        if me == 0 {
            world.send(&msg, 1, 1).map_err(|e| e.to_string())?;
            world.recv(&mut buf, 1, 1).map_err(|e| e.to_string())?;
        } else {
            world.recv(&mut buf, 0, 1).map_err(|e| e.to_string())?;
            world.send(&msg, 0, 1).map_err(|e| e.to_string())?;
        }
    }
    let raw_rtt = t0.elapsed() / iters as u32;

    // 2. Mailbox round trip (the acknowledgements travel too; tickets are waited at the end).
    addr.barrier(T).map_err(s)?;
    let t0 = Instant::now();
    let mut tickets = Vec::with_capacity(iters);
    for i in 0..iters {
        if me == 0 {
            tickets.push(addr.send(&peer, 1, msg.to_vec()).map_err(s)?);
            mb.recv(Match::any(), Timeout::After(T))
                .map_err(s)?
                .ok_or(format!("round trip {i}: no answer"))?;
        } else {
            let m = mb
                .recv(Match::any(), Timeout::After(T))
                .map_err(s)?
                .ok_or(format!("round trip {i}: nothing came"))?;
            tickets.push(addr.send(&peer, 1, m.data).map_err(s)?);
        }
        if tickets.len() >= 64 {
            for t in tickets.drain(..) {
                addr.wait(&t, T).map_err(s)?;
            }
        }
    }
    for t in tickets.drain(..) {
        addr.wait(&t, T).map_err(s)?;
    }
    let box_rtt = t0.elapsed() / iters as u32;

    // 3. One-way throughput, 1 KiB, credit window.
    addr.barrier(T).map_err(s)?;
    let n = iters * 10;
    let t0 = Instant::now();
    if me == 0 {
        let mut ts = Vec::with_capacity(n);
        for _ in 0..n {
            ts.push(addr.send(&peer, 2, vec![1u8; 1024]).map_err(s)?);
            if ts.len() % 256 == 0 {
                addr.progress().map_err(s)?;
            }
        }
        for t in &ts {
            addr.wait(t, T).map_err(s)?;
        }
    } else {
        for i in 0..n {
            mb.recv(Match::tag(2), Timeout::After(T))
                .map_err(s)?
                .ok_or(format!("stream message {i} never came"))?;
        }
    }
    let stream = t0.elapsed();
    addr.barrier(T).map_err(s)?;

    // 4. Remote get latency, 4 KiB.
    let t0 = Instant::now();
    if me == 0 {
        for _ in 0..iters {
            let v = addr.get(&peer_block, 0, 4096, T).map_err(s)?;
            if v.len() != 4096 {
                return Err("short get".into());
            }
        }
    }
    let get_lat = t0.elapsed() / iters as u32;
    addr.barrier(T).map_err(s)?;
    drop(block);
    if me == 0 {
        println!("iterations                      {iters}");
        println!(
            "raw runtime RTT, 64 B           {:.1} us",
            raw_rtt.as_secs_f64() * 1e6
        );
        println!(
            "mailbox RTT (acked), 64 B       {:.1} us",
            box_rtt.as_secs_f64() * 1e6
        );
        println!(
            "one-way 1 KiB sends, credits {}  {:.0} msg/s",
            addr.credits(),
            n as f64 / stream.as_secs_f64()
        );
        println!(
            "remote get, 4 KiB               {:.1} us",
            get_lat.as_secs_f64() * 1e6
        );
    }
    Ok(())
}

/// Mailbox round trips between ranks `a` and `b` (64 B, acknowledged); others serve.
/// `iters` 64-byte mailbox round trips with `peer`, started by the `first` side; tickets are
/// waited in batches of 64.
fn ping_pong(
    addr: &Addr,
    mb: &Mailbox<'_>,
    peer: &mutirao_addr::Target,
    first: bool,
    iters: usize,
) -> Result<(), String> {
    let s = |e: mutirao_addr::AddrError| e.to_string();
    let mut tickets = Vec::new();
    for i in 0..iters {
        if first {
            tickets.push(addr.send(peer, 1, vec![7u8; 64]).map_err(s)?);
        }
        let m = mb
            .recv(Match::any(), Timeout::After(T))
            .map_err(s)?
            .ok_or(format!("round trip {i}: nothing came"))?;
        if !first {
            tickets.push(addr.send(peer, 1, m.data).map_err(s)?);
        }
        if tickets.len() >= 64 {
            for t in tickets.drain(..) {
                addr.wait(&t, T).map_err(s)?;
            }
        }
    }
    for t in tickets.drain(..) {
        addr.wait(&t, T).map_err(s)?;
    }
    Ok(())
}

fn rtt(
    world: &mutirao::Comm,
    addr: &Addr,
    mb: &Mailbox<'_>,
    a: usize,
    b: usize,
    iters: usize,
) -> Result<Duration, String> {
    let s = |e: mutirao_addr::AddrError| e.to_string();
    let me = addr.rank();
    addr.barrier(T).map_err(s)?;
    let t0 = Instant::now();
    if me == a || me == b {
        let other = if me == a { b } else { a };
        let q = AttrList::from_pairs([("bench", format!("inbox-{other}"))])
            .map_err(|e| e.to_string())?;
        let peer = addr
            .find(&q, Scope::Local)
            .map_err(s)?
            .pop()
            .ok_or("peer inbox not found")?;
        ping_pong(addr, mb, &peer, me == a, iters)?;
    }
    // Rank `a`'s measurement, for everyone.
    let mut nanos = [(t0.elapsed() / iters as u32).as_nanos() as u64];
    addr.barrier(T).map_err(s)?;
    world.bcast(&mut nanos, a).map_err(|e| e.to_string())?;
    Ok(Duration::from_nanos(nanos[0]))
}

/// Check 18: one pair alone, then every pair (2k ↔ 2k+1) at once.
fn pairs(world: &mutirao::Comm, addr: &Addr, iters: usize) -> Result<(), String> {
    let s = |e: mutirao_addr::AddrError| e.to_string();
    let me = addr.rank();
    let q = AttrList::from_pairs([("bench", format!("inbox-{me}"))]).map_err(|e| e.to_string())?;
    let mb = Mailbox::register(addr, &q, Acl::Public).map_err(s)?;
    let single = rtt(world, addr, &mb, 0, 1, iters)?;
    // Every pair at once: the even rank of each pair sends and times.
    let (a, b) = (me & !1, me | 1);
    let other = if me == a { b } else { a };
    let q =
        AttrList::from_pairs([("bench", format!("inbox-{other}"))]).map_err(|e| e.to_string())?;
    let peer = addr
        .find(&q, Scope::Local)
        .map_err(s)?
        .pop()
        .ok_or("peer inbox not found")?;
    addr.barrier(T).map_err(s)?;
    let t0 = Instant::now();
    ping_pong(addr, &mb, &peer, me == a, iters)?;
    let mine = [(t0.elapsed() / iters as u32).as_nanos() as u64];
    addr.barrier(T).map_err(s)?;
    let mut all = vec![0u64; world.size()];
    world
        .gather(&mine, &mut all, 0)
        .map_err(|e| e.to_string())?;
    if me == 0 {
        let us = |n: u64| n as f64 / 1e3;
        let each: Vec<u64> = all.iter().step_by(2).copied().collect();
        let worst = each.iter().copied().max().unwrap_or(0);
        let mean = each.iter().sum::<u64>() as f64 / each.len().max(1) as f64;
        println!("iterations                      {iters}");
        println!(
            "mailbox RTT, pair 0<->1 alone   {:.1} us",
            single.as_secs_f64() * 1e6
        );
        println!(
            "mailbox RTT, {} pairs at once    mean {:.1} us, worst {:.1} us ({:.2}x alone; target <= 2x)",
            each.len(),
            mean / 1e3,
            us(worst),
            worst as f64 / (single.as_nanos().max(1) as f64)
        );
    }
    Ok(())
}

fn bridged(world: &mutirao::Comm, addr: &Addr, iters: usize) -> Result<(), String> {
    let me = addr.rank();
    let q = AttrList::from_pairs([("bench", format!("inbox-{me}"))]).map_err(|e| e.to_string())?;
    let mb = Mailbox::register(addr, &q, Acl::Public).map_err(|e| e.to_string())?;
    let x = rtt(world, addr, &mb, 0, 1, iters)?;
    let y = rtt(world, addr, &mb, 1, 2, iters)?;
    let xy = rtt(world, addr, &mb, 0, 2, iters)?;
    if me == 0 {
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        println!("iterations                      {iters}");
        println!("mailbox RTT 0<->1 (tech X)      {:.1} us", us(x));
        println!("mailbox RTT 1<->2 (tech Y)      {:.1} us", us(y));
        println!(
            "mailbox RTT 0<->2 via bridge 1  {:.1} us  (X + Y = {:.1} us)",
            us(xy),
            us(x + y)
        );
        let st = addr.stats();
        if st.data_frames_to[2] != 0 {
            return Err(format!(
                "rank 0 sent {} frames straight to rank 2",
                st.data_frames_to[2]
            ));
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let iters: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let world = match mutirao::init() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("addr_bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let res = match world.size() {
        2 => Addr::connect(&world)
            .map_err(|e| e.to_string())
            .and_then(|addr| run(&world, &addr, iters.max(1))),
        3 => Config::from_env()
            .map(|mut c| {
                (c.techs, c.bridge) = match world.rank() {
                    0 => (0b01, false),
                    1 => (0b11, true),
                    _ => (0b10, false),
                };
                c
            })
            .and_then(|c| Addr::connect_with(&world, c))
            .map_err(|e| e.to_string())
            .and_then(|addr| bridged(&world, &addr, iters.max(1))),
        n if n >= 4 && n % 2 == 0 => Addr::connect(&world)
            .map_err(|e| e.to_string())
            .and_then(|addr| pairs(&world, &addr, iters.max(1))),
        _ => Err(
            "run on 2 ranks (costs), 3 ranks (bridged path) or an even number ≥ 4 (concurrent pairs)"
                .into(),
        ),
    };
    let fin = world.finalize();
    match (res, fin) {
        (Ok(()), Ok(())) => ExitCode::SUCCESS,
        (Err(e), _) => {
            eprintln!("addr_bench: {e}");
            ExitCode::FAILURE
        }
        (_, Err(e)) => {
            eprintln!("addr_bench: finalize: {e}");
            ExitCode::FAILURE
        }
    }
}
