#!/usr/bin/env bash
# compare_mpi.sh - mutirão against Open MPI 4.1 and MPICH 4.0 on this machine, side by side,
# interleaved, as ratios (the machine is noisy: never compare numbers from different runs).
#
#   bash bench/compare_mpi.sh            # REPS=5 rounds (about 5 minutes on 2 cores)
#   REPS=3 bash bench/compare_mpi.sh
#
# Each round runs every configuration once, in turn:
#   ping-pong  mutirao shared memory | Open MPI vader | MPICH (UCX shm)
#              mutirao TCP           | Open MPI tcp   | MPICH tcp
#   allreduce of 8 bytes on 4 ranks: mutirao | Open MPI | MPICH
#   launch + init + finalize of 2 ranks (hyperfine): mutirao | Open MPI | MPICH
# and the report gives, per size, the median over rounds and the ratio to Open MPI.
# Installs openmpi-bin, mpich and hyperfine from Debian when missing (needs root).
set -euo pipefail
cd "$(dirname "$0")/.."
REPS="${REPS:-5}"
OUT="${OUT:-target/bench-compare}"
mkdir -p "$OUT"
rm -f "$OUT"/*.txt

if ! command -v mpicc.openmpi >/dev/null || ! command -v mpicc.mpich >/dev/null || ! command -v hyperfine >/dev/null; then
    [ "$(id -u)" = 0 ] || { echo "install openmpi-bin libopenmpi-dev mpich libmpich-dev hyperfine first (needs root)" >&2; exit 1; }
    echo "# installing Open MPI, MPICH and hyperfine from Debian ..." >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null && apt-get install -y -qq openmpi-bin libopenmpi-dev mpich libmpich-dev hyperfine >/dev/null
fi
echo "# building ..." >&2
cargo build --release -q -p mutirao -p mutirao-cli --bins --examples
mpicc.openmpi -O2 -o "$OUT/bench_ompi" bench/c/mpi_bench.c
mpicc.mpich -O2 -o "$OUT/bench_mpich" bench/c/mpi_bench.c

M=target/release/mutirao
E=target/release/examples
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OMPI=(mpirun.openmpi --allow-run-as-root --oversubscribe --mca oob_tcp_if_include lo)
MPICH=(mpirun.mpich)

run_cfg() {
    case "$1" in
    mutirao-shm) $M run -n 2 $E/pingpong ;;
    mutirao-tcp) MUTIRAO_TRANSPORT=tcp $M run -n 2 $E/pingpong ;;
    ompi-shm) "${OMPI[@]}" -np 2 "$OUT/bench_ompi" pingpong ;;
    ompi-tcp) "${OMPI[@]}" -np 2 --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo "$OUT/bench_ompi" pingpong ;;
    mpich-shm) "${MPICH[@]}" -np 2 "$OUT/bench_mpich" pingpong ;;
    mpich-tcp) MPIR_CVAR_NOLOCAL=1 UCX_TLS=tcp UCX_NET_DEVICES=lo "${MPICH[@]}" -np 2 "$OUT/bench_mpich" pingpong ;;
    mutirao-allreduce) $M run -n 4 $E/allreduce --sizes 8 ;;
    ompi-allreduce) "${OMPI[@]}" -np 4 "$OUT/bench_ompi" allreduce ;;
    mpich-allreduce) "${MPICH[@]}" -np 4 "$OUT/bench_mpich" allreduce ;;
    esac
}
PP=(mutirao-shm ompi-shm mpich-shm mutirao-tcp ompi-tcp mpich-tcp)
AR=(mutirao-allreduce ompi-allreduce mpich-allreduce)
T0=$(date +%s)
for rep in $(seq 1 "$REPS"); do
    for cfg in "${PP[@]}" "${AR[@]}"; do
        # MPICH's ranks busy-poll: 4 of them on 2 cores can take minutes; cap every run.
        limit=120
        case "$cfg" in *allreduce) limit="${AR_LIMIT:-60}" ;; esac
        if ! timeout "$limit" bash -c "$(declare -f run_cfg); $(declare -p OMPI MPICH OUT M E); run_cfg $cfg" >"$OUT/$cfg.$rep.log" 2>&1; then
            echo "# WARNING: $cfg round $rep failed or exceeded ${limit}s; see $OUT/$cfg.$rep.log" >&2
        fi
        grep -E '^[0-9]+ [0-9.]+' "$OUT/$cfg.$rep.log" >"$OUT/$cfg.$rep.txt" || true
    done
    echo "# round $rep/$REPS done ($(($(date +%s) - T0)) s)" >&2
done

table() { # title base cfgs...
    local title=$1 base=$2
    shift 2
    echo
    echo "## $title: one-way latency in µs (median of $REPS rounds); ratio = mutirao / $base"
    python3 - "$OUT" "$REPS" "$base" "$@" <<'PY'
import sys, statistics, os
out, reps, base, cfgs = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
vals = {}
sizes = []
for c in cfgs:
    for r in range(1, reps + 1):
        p = os.path.join(out, f"{c}.{r}.txt")
        if not os.path.exists(p):
            continue
        for line in open(p):
            f = line.split()
            s = int(f[0]); vals.setdefault((c, s), []).append(float(f[1]))
            if s not in sizes: sizes.append(s)
mut = [c for c in cfgs if c.startswith("mutirao")][0]
print("| bytes | " + " | ".join(cfgs) + f" | ratio vs {base} | MB/s " + " | ".join(cfgs) + " |")
print("|---" * (2 * len(cfgs) + 2) + "|")
for s in sizes:
    med = {c: statistics.median(vals[(c, s)]) if (c, s) in vals else None for c in cfgs}
    cells = [f"{med[c]:.3f}" if med[c] is not None else "n/a" for c in cfgs]
    ratio = f"{med[mut] / med[base]:.2f}" if med.get(mut) and med.get(base) else "n/a"
    bw = [f"{s / med[c]:.0f}" if med[c] else "-" for c in cfgs]
    print(f"| {s} | " + " | ".join(cells) + f" | {ratio} | " + " | ".join(bw) + " |")
PY
}
table "ping-pong, shared memory" ompi-shm mutirao-shm ompi-shm mpich-shm
table "ping-pong, TCP" ompi-tcp mutirao-tcp ompi-tcp mpich-tcp
table "allreduce of 8 bytes, 4 ranks" ompi-allreduce "${AR[@]}"

if command -v hyperfine >/dev/null; then
    echo
    echo "## launch + init + finalize, 2 ranks (hyperfine, 20 runs each, interleaved by hyperfine's order)"
    hyperfine -N --warmup 2 --runs 20 --style none --export-markdown "$OUT/launch.md" \
        -n mutirao "$M run -n 2 $E/pingpong --init-only" \
        -n mpich "mpirun.mpich -np 2 $OUT/bench_mpich init" \
        -n ompi "mpirun.openmpi --allow-run-as-root --oversubscribe -np 2 $OUT/bench_ompi init" >/dev/null 2>&1 &&
        cat "$OUT/launch.md" || echo "(hyperfine failed)"
fi
echo
echo "# $(nproc) CPUs, kernel $(uname -r); total $(($(date +%s) - T0)) s; raw logs in $OUT"
