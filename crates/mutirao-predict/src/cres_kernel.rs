// The reference kernel of `predict machine --calibrate-ops` (see `cres`): compiled into the
// library and, from this same text, counted by the source analyser, so that its op counts
// × a host's op costs can be set against its measured time. A generic scalar loop (integer
// multiply-add, mask and shift, a conversion, a floating-point recurrence, a comparison and a
// conditional update), in the subset `analyse` accepts; it is not any application's kernel.

/// Trips of the reference loop.
pub const REF_ITERS: u64 = 200_000;
/// 2^-31.
const REF_SCALE: f64 = 1.0 / 2147483648.0;

/// One run of the reference kernel from `seed` (any value).
pub fn reference(seed: u64) -> u64 {
    let mut a: u64 = seed & 2147483647;
    let mut x: f64 = 0.5;
    let mut acc: u64 = 0;
    for _i in 0..REF_ITERS {
        a = (a * 1103515245 + 12345) & 2147483647;
        let f: f64 = a as f64 * REF_SCALE;
        x = x * 0.5 + f;
        if x > 1.0 {
            acc += 1;
        }
        acc ^= a >> 3;
    }
    acc
}
