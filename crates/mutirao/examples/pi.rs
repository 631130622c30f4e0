//! Monte Carlo estimate of π (a PeMPSys application): every rank throws its share of darts with
//! its own seeded generator; a reduction adds the hits.
//!
//!     mutirao run -n 4 target/release/examples/pi [SAMPLES]    # default 20 000 000
//!
//! Prints `pi samples=… ranks=… estimate=… error=… elapsed_s=…`; exits 1 if the estimate is
//! further than 6 standard deviations from π.

use mutirao::op;
use std::time::Instant;

fn main() -> Result<(), mutirao::Error> {
    let world = mutirao::init()?;
    let total: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20_000_000);
    let (rank, size) = (world.rank() as u64, world.size() as u64);
    let t = Instant::now();
    let mine = total / size + u64::from(rank < total % size);
    // xorshift64*, one stream per rank.
    let mut s = 0x2545_F491_4F6C_DD1Du64 ^ (rank + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut next = || {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        (s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut hits = 0u64;
    for _ in 0..mine {
        let (x, y) = (next(), next());
        if x * x + y * y <= 1.0 {
            hits += 1;
        }
    }
    let mut sum = [0u64; 2];
    world.reduce(&[hits, mine], &mut sum, &op::Sum, 0)?;
    if rank == 0 {
        let (hits, n) = (sum[0] as f64, sum[1]);
        if n != total {
            eprintln!("pi: {n} samples thrown, {total} asked");
            std::process::exit(1);
        }
        let est = 4.0 * hits / n as f64;
        let sigma = 4.0
            * ((std::f64::consts::PI / 4.0) * (1.0 - std::f64::consts::PI / 4.0) / n as f64).sqrt();
        let err = (est - std::f64::consts::PI).abs();
        println!(
            "pi samples={n} ranks={size} estimate={est:.8} error={err:.2e} elapsed_s={:.6}",
            t.elapsed().as_secs_f64()
        );
        if err > 6.0 * sigma {
            eprintln!("pi: estimate is {:.1} standard deviations off", err / sigma);
            std::process::exit(1);
        }
    }
    world.finalize()
}
