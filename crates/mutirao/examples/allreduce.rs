//! Allreduce latency per message size on all ranks: `BYTES LATENCY_US` (median over batches).
//!
//!     mutirao run -n 4 target/release/examples/allreduce [--quick] [--sizes 8,1024]
//!
//! Every result is checked against the closed-form sum; a wrong value exits 1.

use mutirao::op;
use std::time::Instant;

fn main() -> Result<(), mutirao::Error> {
    let world = mutirao::init()?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let mut sizes: Vec<usize> = vec![8, 64, 512, 4096, 32768, 262144, 1 << 20];
    if let Some(i) = args.iter().position(|a| a == "--sizes") {
        sizes = args
            .get(i + 1)
            .map(|s| s.split(',').filter_map(|x| x.parse().ok()).collect())
            .unwrap_or_default();
    }
    let (rank, n) = (world.rank(), world.size());
    if rank == 0 {
        println!("# ranks={n} BYTES LATENCY_US");
    }
    for &bytes in &sizes {
        let count = (bytes / 8).max(1);
        let send: Vec<u64> = (0..count).map(|i| (rank * 1000 + i) as u64).collect();
        let mut recv = vec![0u64; count];
        world.allreduce(&send, &mut recv, &op::Sum)?;
        for (i, v) in recv.iter().enumerate() {
            let want = (n * (n - 1) / 2 * 1000 + n * i) as u64;
            if *v != want {
                eprintln!("allreduce: element {i} is {v}, expected {want} ({bytes} bytes)");
                std::process::exit(1);
            }
        }
        let per_batch = if quick {
            5
        } else {
            (20000 / (1 + bytes / 1024)).max(3)
        };
        let batches = if quick { 3 } else { 21 };
        let mut times = Vec::new();
        for _ in 0..batches {
            world.barrier()?;
            let t = Instant::now();
            for _ in 0..per_batch {
                world.allreduce(&send, &mut recv, &op::Sum)?;
            }
            times.push(t.elapsed().as_secs_f64() / per_batch as f64);
        }
        let mut all = vec![0.0f64; n];
        let mut tmed = times.clone();
        tmed.sort_by(|a, b| a.total_cmp(b));
        // Report the slowest rank's median: a collective ends when its last rank ends.
        world.allgather(&[tmed[tmed.len() / 2]], &mut all)?;
        if rank == 0 {
            let worst = all.iter().cloned().fold(0.0, f64::max);
            println!("{} {:.3}", count * 8, worst * 1e6);
        }
    }
    world.finalize()
}
