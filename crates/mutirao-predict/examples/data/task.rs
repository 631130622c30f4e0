// The pi task of thesis Appendix A.2 (ProcessData), in the Rust subset `mutirao predict
// analyse` understands. `rand01` stands in for Math.random() (its body is costed: the thesis
// did not cost the call at all).
const ITERATIONS: i32 = 10_000_000;

fn rand01(state: i64) -> f64 {
    ((state * 1103515245 + 12345) % 2147483648) as f64 / 2147483648.0
}

fn process_data(limit: i32) -> i32 {
    let mut total: i32 = 0;
    let mut seed: i64 = 1;
    for _i in 0..limit {
        let x: f64 = rand01(seed);
        seed += 1;
        let y: f64 = rand01(seed);
        seed += 1;
        if x * x + y * y < 1.0 {
            total += 1;
        }
    }
    total
}

fn task() -> i32 {
    process_data(ITERATIONS)
}
