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
//!
//! Restartable (issue 12): a checkpoint point ends every lap; under `mutirao run` with
//! checkpoints a restart resumes at the saved lap (the message in flight across the cut is kept
//! in the receiver's checkpoint). Without checkpoint settings nothing changes.

use serde::{Deserialize, Serialize};
use std::time::Instant;

#[derive(Serialize, Deserialize)]
struct State {
    lap: u64,
    iters: u64,
    msg: Vec<u64>,
}

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
    let restored = world.restored::<State>()?;
    let resumed = restored.is_some();
    // Rank 0 measures how many iterations make `work_us` on its host; everyone does that many.
    let mut iters = [restored.as_ref().map_or(0, |s| s.iters)];
    if rank == 0 && !resumed {
        let probe = 5_000_000u64;
        let t = Instant::now();
        std::hint::black_box(work(probe));
        let per_us = probe as f64 / (t.elapsed().as_secs_f64() * 1e6);
        iters[0] = (per_us * work_us as f64) as u64;
    }
    if !resumed {
        world.bcast(&mut iters, 0)?;
    }
    let mut st = restored.unwrap_or(State {
        lap: 0,
        iters: iters[0],
        msg: vec![0u64; bytes / 8],
    });
    let iters = st.iters;
    world.barrier()?;
    let t = Instant::now();
    while st.lap < laps {
        let (lap, msg) = (st.lap, &mut st.msg);
        if rank == 0 {
            if lap == 0 {
                msg[0] = 0;
            } else {
                world.recv(msg, left, 0)?;
            }
            std::hint::black_box(work(iters));
            world.send(msg, right, 0)?;
        } else {
            world.recv(msg, left, 0)?;
            std::hint::black_box(work(iters));
            msg[0] += rank as u64;
            world.send(msg, right, 0)?;
        }
        st.lap += 1;
        world.checkpoint_point(&st)?;
    }
    let msg = &mut st.msg;
    if rank == 0 {
        world.recv(msg, left, 0)?;
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
