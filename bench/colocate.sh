#!/usr/bin/env bash
# colocate.sh - waiting ranks must not slow a co-located computing rank.
# Three ranks pinned to ONE core pass a token along a chain; each computes TASK_MS when it has
# the token. Ideal elapsed = 3 × (one task alone). Compared: mutirão's default (spin briefly,
# then sleep in the kernel) and forced polling (MUTIRAO_SPIN_US huge, like MPICH-G2), interleaved.
#   bash bench/colocate.sh            # TASK_MS=1000, REPS=3
set -euo pipefail
cd "$(dirname "$0")/.."
TASK_MS="${TASK_MS:-1000}"
REPS="${REPS:-3}"
cargo build --release -q -p mutirao -p mutirao-cli --bins --examples
TGT="${CARGO_TARGET_DIR:-target}"
M=$TGT/release/mutirao
E=$TGT/release/examples/colocate
for rep in $(seq 1 "$REPS"); do
    iters=$(taskset -c 0 "$E" --calibrate "$TASK_MS")
    alone=$(taskset -c 0 $M run -n 1 "$E" --iters "$iters" | sed -E 's/.*elapsed_s=([0-9.]+).*/\1/')
    def=$(taskset -c 0 $M run -n 3 "$E" --iters "$iters" | sed -E 's/.*elapsed_s=([0-9.]+).*/\1/')
    poll=$(MUTIRAO_SPIN_US=1000000000 taskset -c 0 timeout 300 $M run -n 3 "$E" --iters "$iters" | sed -E 's/.*elapsed_s=([0-9.]+).*/\1/')
    python3 -c "a=$alone; d=$def; p=$poll; print(f'round $rep: one task alone {a:.2f} s; 3 co-located tasks: mutirao default {d:.2f} s ({d/(3*a):.2f} x ideal), forced polling {p:.2f} s ({p/(3*a):.2f} x ideal)')"
done
