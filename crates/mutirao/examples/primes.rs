//! Prime search (a PeMPSys application): count the primes below N by trial division, candidates
//! dealt cyclically in blocks so every rank gets a similar mix of small and large numbers.
//!
//!     mutirao run -n 4 target/release/examples/primes [N]    # default 2 000 000
//!
//! Rank 0 checks the count against a serial sieve; prints `primes n=… count=… ranks=… elapsed_s=…`.

use mutirao::op;
use std::time::Instant;

fn is_prime(x: u64) -> bool {
    if x < 2 {
        return false;
    }
    if x % 2 == 0 {
        return x == 2;
    }
    let mut d = 3;
    while d * d <= x {
        if x % d == 0 {
            return false;
        }
        d += 2;
    }
    true
}

fn sieve_count(n: u64) -> u64 {
    let n = n as usize;
    let mut comp = vec![false; n.max(2)];
    let mut count = 0;
    for i in 2..n {
        if !comp[i] {
            count += 1;
            let mut j = i * i;
            while j < n {
                comp[j] = true;
                j += i;
            }
        }
    }
    count
}

fn main() -> Result<(), mutirao::Error> {
    let world = mutirao::init()?;
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2_000_000);
    let (rank, size) = (world.rank() as u64, world.size() as u64);
    let t = Instant::now();
    const BLOCK: u64 = 1000;
    let mut count = 0u64;
    let mut start = rank * BLOCK;
    while start < n {
        for x in start..(start + BLOCK).min(n) {
            if is_prime(x) {
                count += 1;
            }
        }
        start += size * BLOCK;
    }
    let mut total = [0u64];
    world.reduce(&[count], &mut total, &op::Sum, 0)?;
    if rank == 0 {
        let elapsed = t.elapsed().as_secs_f64();
        let want = sieve_count(n);
        println!(
            "primes n={n} count={} ranks={size} elapsed_s={elapsed:.6}",
            total[0]
        );
        if total[0] != want {
            eprintln!("primes: counted {}, the sieve says {want}", total[0]);
            std::process::exit(1);
        }
    }
    world.finalize()
}
