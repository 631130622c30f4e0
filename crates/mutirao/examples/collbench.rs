//! Collective latency per message size on all ranks, the mutirão side of
//! `bench/compare_mpi.sh` (its MPI twin is `bench/c/mpi_bench.c`): one line `BYTES LATENCY_US`
//! per size, the slowest rank's median over 21 batches, after 0.5 s of untimed 8-byte
//! allreduces (`BENCH_WARM_S`) that let the kernel settle where the ranks run.
//!
//!     mutirao run -n 4 target/release/examples/collbench -- allreduce 8,65536,4194304
//!     mutirao run -n 4 target/release/examples/collbench -- bcast 1048576
//!     mutirao run -n 4 target/release/examples/collbench -- alltoall 4096
//!
//! allreduce: u64 sum of BYTES; bcast: BYTES from rank 0; alltoall: BYTES to every rank.
//! A batch is at most 20000 / (1 + BYTES/1024) operations, fewer if one batch would take more
//! than 20 ms (measured on 5 operations) — the same rule as mpi_bench.c, so a slow
//! configuration (busy-polling ranks on too few cores) still finishes in seconds.
//! Every allreduce result and every received block is checked once; a wrong value exits 1.

use mutirao::op;
use std::time::Instant;

#[derive(Clone, Copy, PartialEq)]
enum Coll {
    Allreduce,
    Bcast,
    Alltoall,
}

fn one(w: &mutirao::Comm, c: Coll, a: &mut [u64], b: &mut [u64]) -> Result<(), mutirao::Error> {
    match c {
        Coll::Allreduce => w.allreduce(a, b, &op::Sum),
        Coll::Bcast => w.bcast(a, 0),
        Coll::Alltoall => w.alltoall(a, b),
    }
}

/// Settle: 8-byte allreduces for `BENCH_WARM_S` seconds (default 0.5, rank 0's clock), untimed,
/// before anything is measured. With more ranks than cores the kernel needs about a second to
/// settle where the ranks run; until then the same operation took 1.3–1.6× its steady time, for
/// Open MPI as for mutirão. `mpi_bench.c` does exactly the same.
fn settle(w: &mutirao::Comm) -> Result<(), mutirao::Error> {
    let warm: f64 = match std::env::var("BENCH_WARM_S") {
        Err(_) => 0.5,
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(s) if s >= 0.0 => s,
            _ => {
                eprintln!("collbench: BENCH_WARM_S={v:?} is not a number of seconds (e.g. 0.5)");
                std::process::exit(2);
            }
        },
    };
    let t0 = Instant::now();
    let (x, mut y) = ([1u64], [0u64]);
    for k in 1u64.. {
        w.allreduce(&x, &mut y, &op::Sum)?;
        if k % 16 == 0 {
            let mut more = [u8::from(t0.elapsed().as_secs_f64() < warm)];
            w.bcast(&mut more, 0)?;
            if more[0] == 0 {
                break;
            }
        }
    }
    Ok(())
}

fn main() -> Result<(), mutirao::Error> {
    let world = mutirao::init()?;
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--").collect();
    let coll = match args.first().map(String::as_str) {
        Some("allreduce") | None => Coll::Allreduce,
        Some("bcast") => Coll::Bcast,
        Some("alltoall") => Coll::Alltoall,
        Some(other) => {
            eprintln!("collbench: unknown collective {other:?} (allreduce, bcast, alltoall)");
            std::process::exit(2);
        }
    };
    let sizes: Vec<usize> = args
        .get(1)
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![8]);
    let (rank, n) = (world.rank(), world.size());
    if rank == 0 {
        println!("# ranks={n} BYTES LATENCY_US");
    }
    settle(&world)?;
    for &bytes in &sizes {
        let count = (bytes / 8).max(1);
        let elems = if coll == Coll::Alltoall {
            count * n
        } else {
            count
        };
        let mut a: Vec<u64> = (0..elems).map(|i| (rank * 1000 + i) as u64).collect();
        let mut b = vec![0u64; elems];
        one(&world, coll, &mut a, &mut b)?;
        let bad = match coll {
            Coll::Allreduce => {
                (0..count).find(|&i| b[i] != (n * (n - 1) / 2 * 1000 + n * i) as u64)
            }
            Coll::Bcast => (0..count).find(|&i| a[i] != i as u64),
            Coll::Alltoall => (0..elems).find(|&i| {
                let (from, k) = (i / count, i % count);
                b[i] != (from * 1000 + rank * count + k) as u64
            }),
        };
        if let Some(i) = bad {
            eprintln!(
                "collbench: rank {rank}: wrong element {i} after one operation of {bytes} bytes"
            );
            std::process::exit(1);
        }
        let mut per = (20000 / (1 + bytes / 1024)).max(3);
        world.barrier()?;
        let t = Instant::now();
        for _ in 0..5 {
            one(&world, coll, &mut a, &mut b)?;
        }
        let mut worst1 = [0.0f64];
        world.allreduce(&[t.elapsed().as_secs_f64() / 5.0], &mut worst1, &op::Max)?;
        if worst1[0] > 0.0 && per as f64 * worst1[0] > 0.020 {
            per = ((0.020 / worst1[0]) as usize).max(1);
        }
        let mut times = Vec::with_capacity(21);
        for _ in 0..21 {
            world.barrier()?;
            let t = Instant::now();
            for _ in 0..per {
                one(&world, coll, &mut a, &mut b)?;
            }
            times.push(t.elapsed().as_secs_f64() / per as f64);
        }
        times.sort_by(|x, y| x.total_cmp(y));
        let mut worst = [0.0f64];
        world.allreduce(&[times[times.len() / 2]], &mut worst, &op::Max)?;
        if rank == 0 {
            println!("{bytes} {:.3}", worst[0] * 1e6);
        }
    }
    world.finalize()
}
