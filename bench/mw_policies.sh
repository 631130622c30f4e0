#!/usr/bin/env bash
# Master/worker policies on the testbed (issue 13 acceptance; seed 003 §9.3 check 8).
#
# A coordinator host and five workers whose CPU quotas are seed 003's Table 3 speeds scaled to
# this machine (1, 0.98, 0.98, 0.35, 0.26 × SCALE of a core; SCALE=0.4 keeps the sum under 2
# cores), the `mw` example's matmul (a task is one row of C) under every policy, RUNS runs
# each; prints makespan (median, min–max), speedup against one worker on the fastest host
# (static split, same size), speedup / Σnorm (Σnorm from Table 3), and the balance efficiency:
# the ideal makespan with each worker's rate as measured in that run (its log) over the
# makespan — the quotas are not the hosts' true relative speeds, the logs are. Then the
# makespans with the fastest worker's share cut to a third 2 s into the run.
#
# Usage: flock /tmp/mutirao-measure.lock sudo bench/mw_policies.sh [RUNS]   (default 3)
# Env:   N=2000 (matrix order; the issue's size, ~30 min with RUNS=3 SLOW_RUNS=1), TAM=10 (TAM_BLOCO), SCALE=0.4, POLICIES="static hnow …",
#        SLOW_RUNS=RUNS (runs per policy with worker02 slowed mid-run; 0 skips that part),
#        MUTIRAO=path (default target/release/mutirao), KEEP=dir (keep runs and logs)
set -euo pipefail
RUNS=${1:-3}
N=${N:-2000}
TAM=${TAM:-10}
SCALE=${SCALE:-0.4}
POLICIES=${POLICIES:-"static hnow hnow-improved join gss awf steal"}
SLOW_RUNS=${SLOW_RUNS:-$RUNS}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${MUTIRAO:-$ROOT/target/release/mutirao}
MW=$ROOT/target/release/examples/mw
[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces, cgroups): sudo $0" >&2; exit 2; }
if [[ ! -x $B || ! -x $MW ]]; then
    (cd "$ROOT" && cargo build --release -q -p mutirao-cli --bins && cargo build --release -q -p mutirao-mw --example mw)
fi
if [[ -n ${KEEP:-} ]]; then W=$KEEP; mkdir -p "$W"; else W=$(mktemp -d); fi
NAME=mw$$
UP=""
cleanup() {
    if [[ -n $UP ]]; then "$B" testbed down "$NAME" >&2 || true; fi
    if [[ -z ${KEEP:-} ]]; then rm -rf "$W"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

NORMS=(0.983564 1.0 0.983497 0.345583 0.260023)   # worker01 02 03 05 04 (Table 3)
q() { awk -v a="$1" -v s="$SCALE" 'BEGIN { printf "%.3f", a * s }'; }
cat >"$W/spec.toml" <<EOF
[[site]]
name = "lab"
nic_mbit = 1000
hosts = [
  { name = "master", cpu = 0.15 },
  { name = "worker01", cpu = $(q 0.983564) }, { name = "worker02", cpu = $(q 1.0) },
  { name = "worker03", cpu = $(q 0.983497) }, { name = "worker05", cpu = $(q 0.345583) },
  { name = "worker04", cpu = $(q 0.260023) },
]
EOF
"$B" testbed up "$W/spec.toml" --name "$NAME" >"$W/up.log" 2>&1 || { cat "$W/up.log" >&2; exit 1; }
UP=1
HOSTS=/run/mutirao-testbed/$NAME.hosts
TOKEN=/run/mutirao-testbed/$NAME.token
# Hostfile lines are in spec order: master, worker01, 02, 03, 05, 04.
cp "$HOSTS" "$W/hosts"
{ sed -n 1p "$HOSTS"; sed -n 3p "$HOSTS"; } >"$W/hosts_1"   # master + worker02 (the fastest)

run() { # hostfile ranks policy out
    "$B" run --hostfile "$1" --token-file "$TOKEN" -n "$2" --timeout 600 \
        "$MW" matmul --n "$N" --tam "$TAM" --policy "$3" --log "$4.jsonl" >"$4.out" 2>&1 ||
        { cat "$4.out" >&2; return 1; }
    grep -q "result correct" "$4.out" || { echo "wrong result:" >&2; cat "$4.out" >&2; return 1; }
    sed -n 's/^elapsed_s=//p' "$4.out"
}
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
# Balance efficiency of one run: the ideal makespan with every worker's measured rate in that
# run (Σ tasks / Σ compute time, from the repository log) over the measured makespan.
balance() { # log elapsed
    jq -s --argjson t "$2" '[.[] | select(.event == "block")] | group_by(.worker)
        | map((map(.len) | add) / (map(.t_comp_s) | add)) | add as $r | ('"$N"' / $r) / $t' "$1"
}

echo "serial reference: one worker on worker02…" >&2
for r in $(seq "$RUNS"); do run "$W/hosts_1" 2 static "$W/serial_$r"; done >"$W/serial"
T1=$(median <"$W/serial")
SUM=$(printf '%s\n' "${NORMS[@]}" | awk '{ s += $1 } END { printf "%.6f", s }')

echo
echo "matmul n=$N, TAM_BLOCO=$TAM, quotas = Table 3 × $SCALE of a core, $RUNS runs each;"
echo "one worker on worker02: $T1 s (median); Σnorm = $SUM"
echo
echo "| policy | makespan s, median (min–max) | speedup | speedup / Σnorm | balance efficiency |"
echo "|---|---|---|---|---|"
for p in $POLICIES; do
    echo "running $p…" >&2
    for r in $(seq "$RUNS"); do run "$W/hosts" 6 "$p" "$W/${p}_$r"; done >"$W/$p"
    for r in $(seq "$RUNS"); do
        balance "$W/${p}_$r.jsonl" "$(sed -n "${r}p" "$W/$p")"
    done >"$W/bal_$p"
    BE=$(median <"$W/bal_$p")
    M=$(median <"$W/$p")
    read -r MIN MAX < <(sort -g "$W/$p" | awk 'NR == 1 { a = $1 } { b = $1 } END { print a, b }')
    awk -v p="$p" -v m="$M" -v lo="$MIN" -v hi="$MAX" -v t1="$T1" -v s="$SUM" -v be="$BE" 'BEGIN {
        printf "| %s | %.3f (%.3f–%.3f) | %.2f | %.1f %% | %.1f %% |\n", p, m, lo, hi, t1 / m, 100 * t1 / m / s, 100 * be }'
done

# The fastest worker's owner comes back: its quota cut to a third 2 s into the run.
echo
echo "worker02's quota cut to a third 2 s into the run:"
echo
echo "| policy | makespan s, median (min–max) |"
echo "|---|---|"
PREFIX=$(sed -n 's/.*(prefix \([a-z0-9]*\),.*/\1/p' "$W/up.log" | head -1)
CG=$(find /sys/fs/cgroup -maxdepth 4 -type d -path "*/$PREFIX/h2" 2>/dev/null | head -1 || true)
for p in $POLICIES; do
    [[ $SLOW_RUNS -gt 0 ]] || { echo "(SLOW_RUNS=0: skipped)"; break; }
    [[ -n $CG && -w $CG/cpu.cfs_quota_us ]] || { echo "(cannot find worker02's cgroup: skipped)"; break; }
    # A third of the share: the same quota per three times the period (a quota under 1 ms is
    # refused by the kernel).
    PER=$(cat "$CG/cpu.cfs_period_us")
    for r in $(seq "$SLOW_RUNS"); do
        ( sleep 2; echo $((PER * 3)) >"$CG/cpu.cfs_period_us" ) &
        SLOW=$!
        run "$W/hosts" 6 "$p" "$W/slow_${p}_$r" || { wait $SLOW; echo "$PER" >"$CG/cpu.cfs_period_us"; exit 1; }
        wait $SLOW
        echo "$PER" >"$CG/cpu.cfs_period_us"
    done >"$W/slow_$p"
    M=$(median <"$W/slow_$p")
    read -r MIN MAX < <(sort -g "$W/slow_$p" | awk 'NR == 1 { a = $1 } { b = $1 } END { print a, b }')
    printf '| %s | %.3f (%.3f–%.3f) |\n' "$p" "$M" "$MIN" "$MAX"
done
