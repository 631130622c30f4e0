//! The HLogP validation application: a message travels around the ring of ranks, and every stop
//! computes for a fixed amount of work before passing it on.
//!
//!     mutirao run -n 4 target/release/examples/ring [LAPS] [BYTES] [WORK_US]
//!
//! Defaults: 10 laps, 1024 bytes, 1000 µs of work per stop, measured on rank 0's host: rank 0
//! times the kernel and broadcasts the iteration count, so every stop does the same amount of
//! work and slower hosts take longer. Each rank adds its rank to the message's counter; rank 0
//! checks the total at the end (exit 1 if wrong) and prints
//! `ring laps=… bytes=… work_us=… ranks=… elapsed_s=…`.

use std::time::Instant;

/// A fixed amount of computation: `iters` dependent multiply-adds.
fn work(iters: u64) -> u64 {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for i in 0..iters {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
    }
    x
}

fn main() -> Result<(), mutirao::Error> {
    let world = mutirao::init()?;
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let laps = args.first().copied().unwrap_or(10);
    let bytes = args.get(1).copied().unwrap_or(1024).max(8) as usize;
    let work_us = args.get(2).copied().unwrap_or(1000);
    let (rank, n) = (world.rank(), world.size());
    let right = (rank + 1) % n;
    let left = (rank + n - 1) % n;
    let mut msg = vec![0u64; bytes / 8];
    // Rank 0 measures how many iterations make `work_us` on its host; everyone does that many.
    let mut iters = [0u64];
    if rank == 0 {
        let probe = 5_000_000u64;
        let t = Instant::now();
        std::hint::black_box(work(probe));
        let per_us = probe as f64 / (t.elapsed().as_secs_f64() * 1e6);
        iters[0] = (per_us * work_us as f64) as u64;
    }
    world.bcast(&mut iters, 0)?;
    let iters = iters[0];
    world.barrier()?;
    let t = Instant::now();
    for lap in 0..laps {
        if rank == 0 {
            if lap == 0 {
                msg[0] = 0;
            } else {
                world.recv(&mut msg, left, 0)?;
            }
            std::hint::black_box(work(iters));
            world.send(&msg, right, 0)?;
        } else {
            world.recv(&mut msg, left, 0)?;
            std::hint::black_box(work(iters));
            msg[0] += rank as u64;
            world.send(&msg, right, 0)?;
        }
    }
    if rank == 0 {
        world.recv(&mut msg, left, 0)?;
        let elapsed = t.elapsed().as_secs_f64();
        let want = laps * (n as u64 * (n as u64 - 1) / 2);
        if msg[0] != want {
            eprintln!(
                "ring: counter is {} after {laps} laps, expected {want}",
                msg[0]
            );
            std::process::exit(1);
        }
        println!(
            "ring laps={laps} bytes={bytes} work_us={work_us} ranks={n} elapsed_s={elapsed:.6}"
        );
    }
    world.finalize()
}
