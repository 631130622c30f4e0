//! Co-located ranks must not steal each other's CPU while they wait (the HLogP thesis measured
//! MPICH-G2's polling turn three 5 s tasks sharing a processor into 31 s instead of 15 s).
//!
//! A chain: rank 0 computes, then passes a token to rank 1, which computes, and so on. With all
//! ranks pinned to one core, the ideal elapsed time is the sum of the computations; waiting
//! ranks that poll make it several times longer.
//!
//!     target/release/examples/colocate --calibrate 1000          # iterations for 1000 ms alone
//!     taskset -c 0 mutirao run -n 3 target/release/examples/colocate --iters N
//!     bash bench/colocate.sh                                       # both, and the polling contrast
//!
//! Prints `colocate ranks=… iters=… task_s=[…] elapsed_s=…`: each rank's task time as it ran
//! (while the others waited next to it) and the chain's elapsed time. `bench/colocate.sh`
//! compares that with the ideal, three times one task run alone.

use std::time::Instant;

fn work(iters: u64) -> u64 {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for i in 0..iters {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
    }
    x
}

fn main() -> Result<(), mutirao::Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(i) = args.iter().position(|a| a == "--calibrate") {
        let ms: f64 = args
            .get(i + 1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(1000.0);
        let probe = 50_000_000u64;
        let t = Instant::now();
        std::hint::black_box(work(probe));
        let per_ms = probe as f64 / (t.elapsed().as_secs_f64() * 1e3);
        println!("{}", (per_ms * ms) as u64);
        return Ok(());
    }
    let iters: u64 = args
        .iter()
        .position(|a| a == "--iters")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(300_000_000);
    let world = mutirao::init()?;
    let (r, n) = (world.rank(), world.size());
    world.barrier()?;
    let t = Instant::now();
    let mut token = [0u64];
    if r > 0 {
        world.recv(&mut token, r - 1, 0)?;
    }
    let t_task = Instant::now();
    std::hint::black_box(work(iters));
    let task = t_task.elapsed().as_secs_f64();
    token[0] += 1;
    if r + 1 < n {
        world.send(&token, r + 1, 0)?;
    }
    let mut times = vec![0.0f64; n];
    world.gather(&[task], &mut times, n - 1)?;
    if r == n - 1 {
        let elapsed = t.elapsed().as_secs_f64();
        if token[0] != n as u64 {
            eprintln!("colocate: token {} after {n} ranks", token[0]);
            std::process::exit(1);
        }
        let per: Vec<String> = times.iter().map(|x| format!("{x:.3}")).collect();
        println!(
            "colocate ranks={n} iters={iters} task_s=[{}] elapsed_s={elapsed:.3}",
            per.join(",")
        );
    }
    world.finalize()
}
