//! 2-D heat diffusion by Jacobi iteration, rows split across ranks, a halo exchange per
//! iteration and a checkpoint point at the end of each one: restartable from any committed
//! checkpoint (issue 12, `docs/checkpoints.md`).
//!
//!     mutirao run -n 4 target/release/examples/jacobi -- --n 256 --iters 500
//!
//! The plate is `n`×`n`, its top edge held at 100 and the other edges at 0. Prints
//! `jacobi n=… iters=… ranks=… checksum=… elapsed_s=…`; for n ≤ 128 rank 0 also gathers the
//! plate and checks it bit for bit against a serial computation (exit 1 if it differs).
//! Without checkpoint settings it runs as a plain program. The halo exchange has its own
//! communicator ("halo", a `dup` of the world): a restart takes it back from the checkpoint with
//! `restored_comm` instead of making it again.

use serde::{Deserialize, Serialize};
use std::time::Instant;

#[derive(Serialize, Deserialize)]
struct State {
    iter: u64,
    /// This rank's rows, row-major, without halos.
    rows: Vec<f64>,
}

/// Rows `[lo, hi)` of the plate for `rank` of `size`.
fn my_range(n: usize, rank: usize, size: usize) -> (usize, usize) {
    (n * rank / size, n * (rank + 1) / size)
}

fn boundary(i: isize, j: isize, n: usize) -> Option<f64> {
    let n = n as isize;
    if i < 0 {
        Some(100.0)
    } else if i >= n || j < 0 || j >= n {
        Some(0.0)
    } else {
        None
    }
}

/// One Jacobi sweep over `rows` (global rows `lo..lo + rows.len()/n`), with the row above
/// (`up`) and below (`down`), `None` at the plate's edges.
fn sweep(rows: &[f64], up: Option<&[f64]>, down: Option<&[f64]>, lo: usize, n: usize) -> Vec<f64> {
    let m = rows.len() / n;
    let mut out = vec![0.0; rows.len()];
    let at = |k: isize, j: isize| -> f64 {
        let gi = lo as isize + k;
        if let Some(b) = boundary(gi, j, n) {
            return b;
        }
        let j = j as usize;
        if k < 0 {
            up.map_or(0.0, |u| u[j])
        } else if k as usize >= m {
            down.map_or(0.0, |d| d[j])
        } else {
            rows[k as usize * n + j]
        }
    };
    for k in 0..m as isize {
        for j in 0..n as isize {
            out[k as usize * n + j as usize] =
                0.25 * (at(k - 1, j) + at(k + 1, j) + at(k, j - 1) + at(k, j + 1));
        }
    }
    out
}

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> Result<(), mutirao::Error> {
    let world = mutirao::init()?;
    let n = arg("--n", 128).max(2);
    let iters = arg("--iters", 200) as u64;
    let (rank, size) = (world.rank(), world.size());
    if size > n {
        return Err(mutirao::Error::Invalid(format!(
            "{size} ranks for a {n}-row plate: use at most {n} ranks"
        )));
    }
    let (lo, hi) = my_range(n, rank, size);
    let mut st = match world.restored::<State>()? {
        Some(s) => {
            if let Some(r) = world.recovery() {
                eprintln!(
                    "jacobi: rank {rank} resumes at iteration {} (epoch {})",
                    s.iter, r.epoch
                );
            }
            s
        }
        None => State {
            iter: 0,
            rows: vec![0.0; (hi - lo) * n],
        },
    };
    if st.rows.len() != (hi - lo) * n {
        return Err(mutirao::Error::Invalid(
            "the restored state is for another plate size or rank count".into(),
        ));
    }
    // The halo traffic's own message space. On a restart it comes back from the checkpoint (its
    // context id unchanged); making it again with `dup` at the same place would work too.
    let halo = match world.restored_comm("halo") {
        Some(c) => c,
        None => {
            let c = world.dup()?;
            c.set_name("halo")?;
            c
        }
    };
    let t = Instant::now();
    let mut up = vec![0.0; n];
    let mut down = vec![0.0; n];
    while st.iter < iters {
        let m = hi - lo;
        // Halo exchange: first row up, last row down.
        if rank > 0 {
            halo.sendrecv(&st.rows[..n], rank - 1, 1, &mut up, rank - 1, 2)?;
        }
        if rank + 1 < size {
            halo.sendrecv(&st.rows[(m - 1) * n..], rank + 1, 2, &mut down, rank + 1, 1)?;
        }
        st.rows = sweep(
            &st.rows,
            (rank > 0).then_some(&up[..]),
            (rank + 1 < size).then_some(&down[..]),
            lo,
            n,
        );
        st.iter += 1;
        world.checkpoint_point(&st)?;
    }
    let mut sum = [0.0f64];
    world.allreduce(&[st.rows.iter().sum::<f64>()], &mut sum, &mutirao::op::Sum)?;
    let elapsed = t.elapsed().as_secs_f64();
    if n <= 128 {
        // Gather the plate and check it against a serial run.
        if rank == 0 {
            let mut plate = st.rows.clone();
            for r in 1..size {
                let (l, h) = my_range(n, r, size);
                let mut part = vec![0.0; (h - l) * n];
                world.recv(&mut part, r, 3)?;
                plate.extend_from_slice(&part);
            }
            let mut serial = vec![0.0; n * n];
            for _ in 0..iters {
                serial = sweep(&serial, None, None, 0, n);
            }
            if let Some(i) = (0..n * n).find(|&i| serial[i].to_bits() != plate[i].to_bits()) {
                eprintln!(
                    "jacobi: element ({}, {}) is {} in parallel, {} serially",
                    i / n,
                    i % n,
                    plate[i],
                    serial[i]
                );
                std::process::exit(1);
            }
        } else {
            world.send(&st.rows, 0, 3)?;
        }
    }
    if rank == 0 {
        println!(
            "jacobi n={n} iters={iters} ranks={size} checksum={:.9e} elapsed_s={elapsed:.6}",
            sum[0]
        );
    }
    world.finalize()
}
