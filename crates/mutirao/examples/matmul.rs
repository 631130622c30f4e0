//! Square matrix product C = A·B with cyclic row distribution (MPICH-IG's benchmark, its bugs
//! fixed): rank 0 makes A and B, broadcasts B, deals row i of A to rank i mod N, every rank
//! multiplies its rows, rank 0 gathers C and checks it bit for bit against the serial product.
//!
//!     mutirao run -n 4 target/release/examples/matmul [N]     # default N = 300
//!
//! Prints `matmul n=… ranks=… elapsed_s=… ok`; exits 1 if any element differs.
//!
//! Restartable (issue 12): every rank reaches one checkpoint point per round of the row loop
//! (the same number on every rank); a restart skips the distribution and resumes at the saved
//! row. Without checkpoint settings nothing changes.

use serde::{Deserialize, Serialize};
use std::time::Instant;

#[derive(Serialize, Deserialize)]
struct State {
    /// Rows of this rank done so far.
    done: usize,
    b: Vec<f64>,
    my_rows: Vec<f64>,
    my_c: Vec<f64>,
}

fn a_elem(i: usize, j: usize) -> f64 {
    ((i * 7 + j * 3) % 17) as f64 * 0.25 - 2.0
}
fn b_elem(i: usize, j: usize) -> f64 {
    ((i * 5 + j * 11) % 13) as f64 * 0.5 - 3.0
}

fn row_times(a_row: &[f64], b: &[f64], n: usize, out: &mut [f64]) {
    out.iter_mut().for_each(|x| *x = 0.0);
    for (k, &aik) in a_row.iter().enumerate() {
        let brow = &b[k * n..(k + 1) * n];
        for (o, &bkj) in out.iter_mut().zip(brow) {
            *o += aik * bkj;
        }
    }
}

fn main() -> Result<(), mutirao::Error> {
    let world = mutirao::init()?;
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(300);
    let (rank, size) = (world.rank(), world.size());
    let mine: Vec<usize> = (rank..n).step_by(size).collect();
    let mut a = Vec::new();
    if rank == 0 {
        a = (0..n * n).map(|x| a_elem(x / n, x % n)).collect();
    }
    let restored = world.restored::<State>()?;
    world.barrier()?;
    let t = Instant::now();
    let mut st = match restored {
        Some(st) => st,
        None => {
            let mut b = vec![0.0f64; n * n];
            if rank == 0 {
                b = (0..n * n).map(|x| b_elem(x / n, x % n)).collect();
            }
            world.bcast(&mut b, 0)?;
            // Deal rows cyclically.
            let mut my_rows = vec![0.0f64; mine.len() * n];
            if rank == 0 {
                for i in 0..n {
                    let dest = i % size;
                    if dest == 0 {
                        let k = i / size;
                        my_rows[k * n..(k + 1) * n].copy_from_slice(&a[i * n..(i + 1) * n]);
                    } else {
                        world.send(&a[i * n..(i + 1) * n], dest, 1)?;
                    }
                }
            } else {
                for k in 0..mine.len() {
                    world.recv(&mut my_rows[k * n..(k + 1) * n], 0, 1)?;
                }
            }
            State {
                done: 0,
                b,
                my_rows,
                my_c: vec![0.0f64; mine.len() * n],
            }
        }
    };
    // As many rounds (and checkpoint points) on every rank, whatever its row count.
    let rounds = n.div_ceil(size);
    for round in st.done..rounds {
        if round < mine.len() {
            let k = round;
            row_times(
                &st.my_rows[k * n..(k + 1) * n],
                &st.b,
                n,
                &mut st.my_c[k * n..(k + 1) * n],
            );
        }
        st.done = round + 1;
        // Rounds do not communicate: keep the ranks in step, so that a checkpoint wave finds
        // every rank before the round it is cut at (one cheap barrier per round).
        world.barrier()?;
        world.checkpoint_point(&st)?;
    }
    let (b, my_c) = (&st.b, &st.my_c);
    // Collect C at rank 0 in row order.
    if rank == 0 {
        let mut c = vec![0.0f64; n * n];
        for i in 0..n {
            let src = i % size;
            let k = i / size;
            if src == 0 {
                c[i * n..(i + 1) * n].copy_from_slice(&my_c[k * n..(k + 1) * n]);
            } else {
                world.recv(&mut c[i * n..(i + 1) * n], src, 2)?;
            }
        }
        let elapsed = t.elapsed().as_secs_f64();
        let mut row = vec![0.0f64; n];
        for i in 0..n {
            row_times(&a[i * n..(i + 1) * n], b, n, &mut row);
            if row
                .iter()
                .zip(&c[i * n..(i + 1) * n])
                .any(|(x, y)| x.to_bits() != y.to_bits())
            {
                eprintln!("matmul: row {i} differs from the serial product");
                std::process::exit(1);
            }
        }
        println!("matmul n={n} ranks={size} elapsed_s={elapsed:.6} ok");
    } else {
        for k in 0..mine.len() {
            world.send(&my_c[k * n..(k + 1) * n], 0, 2)?;
        }
    }
    world.finalize()
}
