#!/usr/bin/env bash
# compare_mpi.sh - mutirão against Open MPI 4.1 and MPICH 4.0 on this machine, side by side,
# interleaved, as ratios (the machine is noisy: never compare numbers from different runs).
#
#   bash bench/compare_mpi.sh            # REPS=5 rounds
#   REPS=3 bash bench/compare_mpi.sh
#   REPS=3 LOAD=1 bash bench/compare_mpi.sh     # with a background load the script starts itself
#   REPS=3 LOAD=both bash bench/compare_mpi.sh  # each round quiet then loaded: loaded/quiet ratios
#   REPS=1 SCALE=0.1 bash bench/compare_mpi.sh  # a quick check that every row has its numbers
#   BIND=core REPS=3 LOAD=both bash bench/compare_mpi.sh  # mutirão ranks pinned (--bind-to core),
#                                                         # as Open MPI pins 2 ranks by default
#   ONLY="tcp shm" REPS=3 bash bench/compare_mpi.sh       # only these rows (shm tcp allreduce bcast
#                                                         # alltoall; no launch row): a quick check
#
# Each round runs every configuration once, in turn:
#   ping-pong  mutirao shared memory | Open MPI vader | MPICH (UCX shm)
#              mutirao TCP           | Open MPI tcp   | MPICH tcp (UCX tcp on lo)
#   collectives on 4 ranks (allreduce 8 B, 64 KiB, 4 MiB; bcast 1 MiB; alltoall 4 KiB per rank):
#              mutirao | Open MPI | MPICH
#   launch + init + finalize of 2 ranks (hyperfine, after the rounds): mutirao | Open MPI | MPICH
# and the report gives, per size, the median over rounds, the ratio to Open MPI and the ratio to
# the better of the two MPIs (below 1: mutirão is faster).
#
# LOAD=1 starts LOAD_PROCS (default 1) busy-loop processes for the whole run and always stops
# them (trap), so a "busy machine" is one extra runnable process per LOAD_PROCS on top of
# whatever else runs. LOAD=both alternates a quiet and a loaded pass inside every round.
# SCALE multiplies the ping-pong iteration counts (pingpong --scale, BENCH_SCALE for the C side).
# Collective batches size themselves (at most 20 ms each, see bench/c/mpi_bench.c): MPICH 4.0's
# ch4:ucx busy-polls without yielding, and 4 of its ranks on 2 cores take ~10 ms per operation.
# Installs openmpi-bin, mpich and hyperfine from Debian when missing (needs root).
set -euo pipefail
cd "$(dirname "$0")/.."
REPS="${REPS:-5}"
LOAD="${LOAD:-0}"
LOAD_PROCS="${LOAD_PROCS:-1}"
SCALE="${SCALE:-1}"
BIND="${BIND:-none}"
FAMS="${ONLY:-shm tcp allreduce bcast alltoall}"
for f in $FAMS; do
    case "$f" in shm | tcp | allreduce | bcast | alltoall) ;; *) echo "ONLY=$ONLY: $f is not one of shm tcp allreduce bcast alltoall" >&2; exit 2 ;; esac
done
case "$BIND" in none | core) ;; *) echo "BIND=$BIND: expected none or core" >&2; exit 2 ;; esac
TGT="${CARGO_TARGET_DIR:-target}"
OUT="${OUT:-$TGT/bench-compare}"
mkdir -p "$OUT"
rm -f "$OUT"/*.txt "$OUT"/*.log

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

M="$TGT/release/mutirao"
MRUN=("$M" run --bind-to "$BIND")
E=$TGT/release/examples
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 BENCH_SCALE="$SCALE"
OMPI=(mpirun.openmpi --allow-run-as-root --oversubscribe --mca oob_tcp_if_include lo)
MPICH=(mpirun.mpich)
AR_SIZES=8,65536,4194304
BC_SIZES=1048576
A2A_SIZES=4096

# ---------------------------------------------------------------- background load
LOAD_PIDS=()
load_start() {
    for _ in $(seq 1 "$LOAD_PROCS"); do
        bash -c 'while :; do :; done' &
        LOAD_PIDS+=($!)
    done
}
load_stop() {
    [ "${#LOAD_PIDS[@]}" -gt 0 ] || return 0
    kill "${LOAD_PIDS[@]}" 2>/dev/null || true
    wait "${LOAD_PIDS[@]}" 2>/dev/null || true
    LOAD_PIDS=()
}
trap load_stop EXIT
trap 'load_stop; exit 130' INT TERM

run_cfg() {
    case "$1" in
    mutirao-shm) "${MRUN[@]}" -n 2 $E/pingpong --scale "$BENCH_SCALE" ;;
    mutirao-tcp) MUTIRAO_TRANSPORT=tcp "${MRUN[@]}" -n 2 $E/pingpong --scale "$BENCH_SCALE" ;;
    ompi-shm) "${OMPI[@]}" -np 2 "$OUT/bench_ompi" pingpong ;;
    ompi-tcp) "${OMPI[@]}" -np 2 --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo "$OUT/bench_ompi" pingpong ;;
    mpich-shm) "${MPICH[@]}" -np 2 "$OUT/bench_mpich" pingpong ;;
    mpich-tcp) MPIR_CVAR_NOLOCAL=1 UCX_TLS=tcp UCX_NET_DEVICES=lo "${MPICH[@]}" -np 2 "$OUT/bench_mpich" pingpong ;;
    mutirao-allreduce) "${MRUN[@]}" -n 4 $E/collbench -- allreduce "$AR_SIZES" ;;
    ompi-allreduce) "${OMPI[@]}" -np 4 "$OUT/bench_ompi" allreduce "$AR_SIZES" ;;
    mpich-allreduce) "${MPICH[@]}" -np 4 "$OUT/bench_mpich" allreduce "$AR_SIZES" ;;
    mutirao-bcast) "${MRUN[@]}" -n 4 $E/collbench -- bcast "$BC_SIZES" ;;
    ompi-bcast) "${OMPI[@]}" -np 4 "$OUT/bench_ompi" bcast "$BC_SIZES" ;;
    mpich-bcast) "${MPICH[@]}" -np 4 "$OUT/bench_mpich" bcast "$BC_SIZES" ;;
    mutirao-alltoall) "${MRUN[@]}" -n 4 $E/collbench -- alltoall "$A2A_SIZES" ;;
    ompi-alltoall) "${OMPI[@]}" -np 4 "$OUT/bench_ompi" alltoall "$A2A_SIZES" ;;
    mpich-alltoall) "${MPICH[@]}" -np 4 "$OUT/bench_mpich" alltoall "$A2A_SIZES" ;;
    esac
}
CFGS=()
for c in $FAMS; do CFGS+=("mutirao-$c" "ompi-$c" "mpich-$c"); done
case "$LOAD" in
0) PASSES=(0) ;;
1) PASSES=(1) ;;
both) PASSES=(0 1) ;;
*) echo "LOAD=$LOAD: expected 0, 1 or both" >&2; exit 2 ;;
esac

T0=$(date +%s)
FAILED=0
for rep in $(seq 1 "$REPS"); do
    for pass in "${PASSES[@]}"; do
        [ "$pass" = 1 ] && load_start
        for cfg in "${CFGS[@]}"; do
            if ! timeout "${LIMIT:-180}" bash -c "$(declare -f run_cfg); $(declare -p OMPI MPICH OUT M MRUN E AR_SIZES BC_SIZES A2A_SIZES); run_cfg $cfg" >"$OUT/$cfg.$pass.$rep.log" 2>&1; then
                echo "# WARNING: $cfg (load $pass) round $rep failed or exceeded ${LIMIT:-180}s; see $OUT/$cfg.$pass.$rep.log" >&2
                FAILED=$((FAILED + 1))
            fi
            grep -E '^[0-9]+ [0-9.]+' "$OUT/$cfg.$pass.$rep.log" >"$OUT/$cfg.$pass.$rep.txt" || true
        done
        [ "$pass" = 1 ] && load_stop
    done
    echo "# round $rep/$REPS done ($(($(date +%s) - T0)) s)" >&2
done

# table PASS TITLE UNIT FAMILY: rows = sizes, columns = mutirao | ompi | mpich, ratios.
table() {
    python3 - "$OUT" "$REPS" "$@" <<'PY'
import sys, statistics, os
out, reps, pas, title, unit, fam = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
cfgs = [f"mutirao-{fam}", f"ompi-{fam}", f"mpich-{fam}"]
vals, sizes = {}, []
for c in cfgs:
    for r in range(1, reps + 1):
        p = os.path.join(out, f"{c}.{pas}.{r}.txt")
        if not os.path.exists(p):
            continue
        for line in open(p):
            f = line.split()
            s = int(f[0]); vals.setdefault((c, s), []).append(float(f[1]))
            if s not in sizes: sizes.append(s)
load = {"0": "quiet", "1": "with background load"}[pas]
print(f"\n## {title} ({load}): {unit} (median of {reps} rounds); ratio = mutirao / other, below 1 is better")
print("| bytes | mutirao | Open MPI | MPICH | ratio vs Open MPI | ratio vs best MPI |")
print("|---:|---:|---:|---:|---:|---:|")
for s in sorted(sizes):
    med = {c: statistics.median(vals[(c, s)]) if (c, s) in vals else None for c in cfgs}
    cell = lambda v: f"{v:.3f}" if v is not None else "n/a"
    m, o, p = (med[c] for c in cfgs)
    r_o = f"{m / o:.2f}" if m and o else "n/a"
    best = min([v for v in (o, p) if v], default=None)
    r_b = f"{m / best:.2f}" if m and best else "n/a"
    print(f"| {s} | {cell(m)} | {cell(o)} | {cell(p)} | {r_o} | {r_b} |")
PY
}

# steadiness FAMILY: loaded / quiet per size and implementation (LOAD=both).
steadiness() {
    python3 - "$OUT" "$REPS" "$@" <<'PY'
import sys, statistics, os
out, reps, fam = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cfgs = [f"mutirao-{fam}", f"ompi-{fam}", f"mpich-{fam}"]
def med(c, pas):
    v = {}
    for r in range(1, reps + 1):
        p = os.path.join(out, f"{c}.{pas}.{r}.txt")
        if os.path.exists(p):
            for line in open(p):
                f = line.split(); v.setdefault(int(f[0]), []).append(float(f[1]))
    return {s: statistics.median(x) for s, x in v.items()}
q = {c: med(c, 0) for c in cfgs}
l = {c: med(c, 1) for c in cfgs}
sizes = sorted(set().union(*[set(q[c]) for c in cfgs]))
print(f"\n## {fam}: loaded / quiet latency (same rounds, interleaved); 1.00 = unaffected by the load")
print("| bytes | mutirao | Open MPI | MPICH |")
print("|---:|---:|---:|---:|")
for s in sizes:
    cells = [f"{l[c][s] / q[c][s]:.2f}" if s in q[c] and s in l[c] and q[c][s] else "n/a" for c in cfgs]
    print(f"| {s} | " + " | ".join(cells) + " |")
PY
}

declare -A TITLE=(
    [shm]="ping-pong, shared memory|one-way latency in µs"
    [tcp]="ping-pong, TCP|one-way latency in µs"
    [allreduce]="allreduce (u64 sum), 4 ranks|latency in µs, slowest rank"
    [bcast]="bcast from rank 0, 4 ranks|latency in µs, slowest rank"
    [alltoall]="alltoall, bytes per rank pair, 4 ranks|latency in µs, slowest rank"
)
for pass in "${PASSES[@]}"; do
    for fam in $FAMS; do table "$pass" "${TITLE[$fam]%%|*}" "${TITLE[$fam]#*|}" "$fam"; done
done
if [ "$LOAD" = both ]; then
    for fam in $FAMS; do steadiness "$fam"; done
fi

if [ -z "${ONLY:-}" ] && command -v hyperfine >/dev/null; then
    [ "$LOAD" = 1 ] && load_start
    echo
    echo "## launch + init + finalize, 2 ranks (hyperfine, 20 runs each, interleaved by hyperfine's order)"
    hyperfine -N --warmup 2 --runs 20 --style none --export-markdown "$OUT/launch.md" \
        -n mutirao "$M run -n 2 $E/pingpong --init-only" \
        -n mpich "mpirun.mpich -np 2 $OUT/bench_mpich init" \
        -n ompi "mpirun.openmpi --allow-run-as-root --oversubscribe -np 2 $OUT/bench_ompi init" >/dev/null 2>&1 &&
        cat "$OUT/launch.md" || echo "(hyperfine failed)"
    load_stop
fi
echo
echo "# $(nproc) CPUs, kernel $(uname -r), load $LOAD (LOAD_PROCS=$LOAD_PROCS busy loops), SCALE=$SCALE;" \
    "Open MPI $(mpirun.openmpi --version 2>&1 | head -1 | awk '{print $NF}'), MPICH $(mpichversion 2>/dev/null | awk '/Version/{print $NF}');" \
    "mutirão --bind-to $BIND; total $(($(date +%s) - T0)) s; $FAILED failed runs; raw logs in $OUT"
