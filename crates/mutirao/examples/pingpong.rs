//! Ping-pong between ranks 0 and 1: one line per message size,
//! `BYTES ONE_WAY_LATENCY_US MB_PER_S` (median over batches of round trips, after warm-up).
//!
//!     mutirao run -n 2 target/release/examples/pingpong            # shared memory
//!     MUTIRAO_TRANSPORT=tcp mutirao run -n 2 target/release/examples/pingpong
//!     mutirao run -n 2 target/release/examples/pingpong -- --quick   # a fast smoke run
//!
//! Options: `--init-only` (start and finish only: launch-cost benchmarks), `--quick` (few iterations), `--sizes 0,64,1048576`, `--scale F` (iteration multiplier), `--probe` (probe before every receive, as code that learns a message's size first does), `--gap-us N` (rank 0 sleeps N µs between its send and its receive, so the reply is already there: rank 0's instruction count under callgrind is then one send plus one receive per round trip, without idle polling; the latency printed is meaningless).
//! Every received message is checked; a wrong byte exits non-zero.

use std::time::Instant;

const SIZES: [usize; 11] = [
    0,
    1,
    8,
    64,
    512,
    4096,
    32768,
    65536,
    262144,
    1 << 20,
    4 << 20,
];

fn main() -> Result<(), mutirao::Error> {
    let world = mutirao::init()?;
    let mut sizes: Vec<usize> = SIZES.to_vec();
    let mut scale = 1.0f64;
    let mut probe = false;
    let mut gap = std::time::Duration::ZERO;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--quick" => scale = 0.02,
            "--probe" => probe = true,
            "--init-only" => return world.finalize(),
            "--gap-us" => {
                i += 1;
                let us = args.get(i).and_then(|s| s.parse().ok()).unwrap_or(0);
                gap = std::time::Duration::from_micros(us);
            }
            "--scale" => {
                i += 1;
                scale = args.get(i).and_then(|s| s.parse().ok()).unwrap_or(1.0);
            }
            "--sizes" => {
                i += 1;
                sizes = args
                    .get(i)
                    .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
                    .unwrap_or_default();
            }
            "--" => {}
            other => {
                eprintln!(
                    "pingpong: unknown argument {other:?} (use --quick, --scale F, --sizes a,b,c, --probe, --gap-us N)"
                );
                std::process::exit(2);
            }
        }
        i += 1;
    }
    if world.size() < 2 {
        eprintln!("pingpong needs at least 2 ranks: mutirao run -n 2 …");
        std::process::exit(2);
    }
    let rank = world.rank();
    if rank > 1 {
        return world.finalize();
    }
    let peer = 1 - rank;
    if rank == 0 {
        println!("# BYTES ONE_WAY_LATENCY_US MB_PER_S");
    }
    for &size in &sizes {
        let pattern: Vec<u8> = (0..size).map(|i| (i * 131 + size) as u8).collect();
        let mut buf = vec![0u8; size];
        // Round trips per batch and number of batches: ~2 ms batches for small messages.
        let per_batch = ((2000.0 / (1.0 + size as f64 / 4096.0)) * scale).max(1.0) as usize;
        let batches = ((40.0 * scale.sqrt()) as usize).max(5);
        let warmup = (per_batch / 4).max(2);
        // Check the payload once.
        if rank == 0 {
            world.send(&pattern, peer, 1)?;
            world.recv(&mut buf, peer, 1)?;
            if buf != pattern {
                eprintln!("pingpong: corrupted echo at {size} bytes");
                std::process::exit(1);
            }
        } else {
            let st = world.recv(&mut buf, peer, 1)?;
            if st.bytes != size || buf != pattern {
                eprintln!("pingpong: corrupted message at {size} bytes");
                std::process::exit(1);
            }
            world.send(&buf, peer, 1)?;
        }
        for _ in 0..warmup {
            round(&world, rank, peer, &pattern, &mut buf, probe, gap)?;
        }
        let mut times = Vec::with_capacity(batches);
        for _ in 0..batches {
            let t = Instant::now();
            for _ in 0..per_batch {
                round(&world, rank, peer, &pattern, &mut buf, probe, gap)?;
            }
            times.push(t.elapsed().as_secs_f64() / (2 * per_batch) as f64);
        }
        times.sort_by(|a, b| a.total_cmp(b));
        let one_way = times[times.len() / 2];
        if rank == 0 {
            let mbps = if one_way > 0.0 {
                size as f64 / one_way / 1e6
            } else {
                0.0
            };
            println!("{size} {:.3} {:.1}", one_way * 1e6, mbps);
        }
    }
    world.finalize()
}

fn round(
    world: &mutirao::Comm,
    rank: usize,
    peer: usize,
    data: &[u8],
    buf: &mut [u8],
    probe: bool,
    gap: std::time::Duration,
) -> Result<(), mutirao::Error> {
    if rank == 0 {
        world.send(data, peer, 0)?;
        if !gap.is_zero() {
            std::thread::sleep(gap);
        }
        if probe {
            world.probe(peer, 0)?;
        }
        world.recv(buf, peer, 0)?;
    } else {
        if probe {
            world.probe(peer, 0)?;
        }
        world.recv(buf, peer, 0)?;
        world.send(buf, peer, 0)?;
    }
    Ok(())
}
