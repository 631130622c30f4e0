#!/usr/bin/env bash
# Dynamic inclusion on the testbed (issue 13; seed 003 §9.3 checks 6-8): fixed clusters of 3-6
# machines against clusters of 3 that take in 1 or 3 workers while they run, and the spawn-cost
# finding ("4 machines + worker05" against "5 machines + worker04" when worker04's spawn is dear),
# with per-host spawn delays injected in the order of the thesis (worker03 < worker05 < worker04).
#
# Hosts: a master and five workers whose CPU quotas are seed 003's Table 3 speeds × SCALE of a
# core. Machines count the master, as in the thesis: "3 machines" = master, worker01, worker02.
# The delays are injected by a wrapper the spawned workers start through (`mw --spawn-via`): a
# child (MUTIRAO_SPAWN_GROUP set) sleeps D03/D05/D04 s on those hosts before it starts up, so the
# spawn latency the master measures includes it.
#
# Each inclusion is run twice: with the master spawning without pausing (mutirão's default,
# `spawn_nonblocking`) and the thesis's way (`--blocking-spawn`: the master waits for the new
# worker, as MPI_Comm_spawn did). Last, `--choose` (issue 13 item 5) picks between worker05 and
# worker04 for a 4-machine cluster from the spawn costs measured in the runs before
# (`--spawn-history`) and the hosts' speeds (Table 3 × SCALE, `--speeds`).
#
# Speedup is against one worker alone on worker02 (static split, same size, median of RUNS);
# efficiency is speedup / Σnorm of the workers the configuration ends with (seed 003 check 8).
#
# Usage: flock /tmp/mutirao-measure.lock sudo bench/mw_inclusion.sh [RUNS]   (default 3)
# Env:   N=1200 (matrix order), TAM=10 (TAM_BLOCO), SCALE=0.4, AT=10 (PERC_CONS_ADD),
#        D03=0.3 D05=1 D04=4 (spawn delays, s), POLICY=hnow,
#        MUTIRAO=path (default target/release/mutirao), KEEP=dir (keep runs and logs)
set -euo pipefail
RUNS=${1:-3}
N=${N:-1200}
TAM=${TAM:-10}
SCALE=${SCALE:-0.4}
AT=${AT:-10}
D03=${D03:-0.3}
D05=${D05:-1}
D04=${D04:-4}
POLICY=${POLICY:-hnow}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${MUTIRAO:-$ROOT/target/release/mutirao}
MW=$ROOT/target/release/examples/mw
[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces, cgroups): sudo $0" >&2; exit 2; }
if [[ ! -x $B || ! -x $MW ]]; then
    (cd "$ROOT" && cargo build --release -q -p mutirao-cli --bins && cargo build --release -q -p mutirao-mw --example mw)
fi
if [[ -n ${KEEP:-} ]]; then W=$KEEP; mkdir -p "$W"; else W=$(mktemp -d); fi
NAME=mi$$
UP=""
cleanup() {
    if [[ -n $UP ]]; then "$B" testbed down "$NAME" >&2 || true; fi
    if [[ -z ${KEEP:-} ]]; then rm -rf "$W"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

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
line() { sed -n "$1p" "$HOSTS"; }
addr() { line "$1" | awk '{ print $1 }'; }
A03=$(addr 4); A05=$(addr 5); A04=$(addr 6)
# Every run's hostfile lists all six hosts: the first K take the job's ranks (one slot each),
# the others are free slots a spawn may use.
cp "$HOSTS" "$W/hosts"
SPEEDS="$A03=$(q 0.983497),$A05=$(q 0.345583),$A04=$(q 0.260023),$(addr 2)=$(q 0.983564),$(addr 3)=$(q 1.0)"

cat >"$W/mw-delay" <<EOF
#!/bin/sh
# A spawned worker (MUTIRAO_SPAWN_GROUP set) waits as long as its host's spawn is dear.
if [ -n "\${MUTIRAO_SPAWN_GROUP:-}" ]; then
    case "\${MUTIRAO_BIND:-}" in
        $A03) sleep $D03 ;;
        $A05) sleep $D05 ;;
        $A04) sleep $D04 ;;
    esac
fi
exec $MW "\$@"
EOF
chmod +x "$W/mw-delay"

run() { # ranks out [mw options…]
    local k=$1 out=$2
    shift 2
    "$B" run --hostfile "$W/hosts" --token-file "$TOKEN" -n "$k" --timeout 900 \
        "$W/mw-delay" matmul --n "$N" --tam "$TAM" --policy "$POLICY" --log "$out.jsonl" \
        --spawn-via "$W/mw-delay" --spawn-history "$W/history.json" "$@" >"$out.out" 2>&1 ||
        { cat "$out.out" >&2; return 1; }
    grep -q "result correct" "$out.out" || { echo "wrong result:" >&2; cat "$out.out" >&2; return 1; }
    sed -n 's/^elapsed_s=//p' "$out.out"
}
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# name|ranks|options|Σnorm of the workers the configuration ends with (Table 3: worker01
# 0.983564, worker02 1, worker03 0.983497, worker05 0.345583, worker04 0.260023). RUNS runs
# each, interleaved by the loop below.
S3=1.983564 S4=2.967061 S5=3.312644 S6=3.572667
CONFIGS=(
    "3-machines|3||$S3"
    "4-machines|4||$S4"
    "5-machines|5||$S5"
    "6-machines|6||$S6"
    "3+1(w03)|3|--add 1 --add-at $AT --add-hosts $A03|$S4"
    "3+1(w03)-blocking|3|--add 1 --add-at $AT --add-hosts $A03 --blocking-spawn|$S4"
    "3+3(w03,w05,w04)|3|--add 3 --add-at $AT --add-hosts $A03,$A05,$A04|$S6"
    "3+3(w03,w05,w04)-blocking|3|--add 3 --add-at $AT --add-hosts $A03,$A05,$A04 --blocking-spawn|$S6"
    "4+1(w05)|4|--add 1 --add-at $AT --add-hosts $A05|$S5"
    "4+1(w05)-blocking|4|--add 1 --add-at $AT --add-hosts $A05 --blocking-spawn|$S5"
    "5+1(w04)|5|--add 1 --add-at $AT --add-hosts $A04|$S6"
    "5+1(w04)-blocking|5|--add 1 --add-at $AT --add-hosts $A04 --blocking-spawn|$S6"
)
# The speedup's reference: one worker alone on worker02 (master + worker02, static split).
{ line 1; line 3; } >"$W/hosts_1"
echo "serial reference: one worker on worker02…" >&2
for r in $(seq "$RUNS"); do
    "$B" run --hostfile "$W/hosts_1" --token-file "$TOKEN" -n 2 --timeout 900 \
        "$MW" matmul --n "$N" --tam "$TAM" --policy static >"$W/serial_$r.out" 2>&1 ||
        { cat "$W/serial_$r.out" >&2; exit 1; }
    grep -q "result correct" "$W/serial_$r.out" || { cat "$W/serial_$r.out" >&2; exit 1; }
    sed -n 's/^elapsed_s=//p' "$W/serial_$r.out"
done >"$W/serial"
T1=$(median <"$W/serial")
for r in $(seq "$RUNS"); do
    for c in "${CONFIGS[@]}"; do
        IFS='|' read -r name k opts _ <<<"$c"
        echo "run $r: $name…" >&2
        # shellcheck disable=SC2086
        run "$k" "$W/${name}_$r" $opts >>"$W/t_$name"
    done
    # Whom to add to 4 machines, worker05 or worker04, from the spawn costs measured so far.
    echo "run $r: 4+choose…" >&2
    run 4 "$W/choose_$r" --add 1 --add-at "$AT" --add-hosts "$A05,$A04" --choose \
        --speeds "$SPEEDS" >>"$W/t_4+choose"
    grep -h "adding \[" "$W/choose_$r.out" | sed "s/^/  run $r: /" >>"$W/choices"
done

echo
echo "matmul n=$N, policy $POLICY, TAM_BLOCO=$TAM, quotas = Table 3 × $SCALE of a core, added at $AT %;"
echo "injected spawn delays: worker03 ${D03} s, worker05 ${D05} s, worker04 ${D04} s; $RUNS runs each (interleaved)"
echo "one worker alone on worker02: $T1 s (median)"
echo
echo "| configuration | makespan s, median (min–max) | vs 3 machines | speedup | speedup / Σnorm |"
echo "|---|---|---|---|---|"
T3=$(median <"$W/t_3-machines")
# 4+choose ends with worker01-03 and the host it chose in its first run (worker05 or worker04).
if grep -q "adding \[$A04\]" "$W/choose_1.out"; then SCH=$(awk -v a=$S4 'BEGIN { print a + 0.260023 }')
elif grep -q "adding \[$A05\]" "$W/choose_1.out"; then SCH=$S5
else SCH=$S4; fi
for c in "${CONFIGS[@]}" "4+choose|||$SCH"; do
    IFS='|' read -r name _ _ norm <<<"$c"
    M=$(median <"$W/t_$name")
    read -r MIN MAX < <(sort -g "$W/t_$name" | awk 'NR == 1 { a = $1 } { b = $1 } END { print a, b }')
    awk -v n="$name" -v m="$M" -v lo="$MIN" -v hi="$MAX" -v t3="$T3" -v t1="$T1" -v s="$norm" 'BEGIN {
        printf "| %s | %.3f (%.3f–%.3f) | %.2f× | %.2f | %.1f %% |\n", n, m, lo, hi, t3 / m, t1 / m, 100 * t1 / m / s }'
done
echo
echo "spawn latencies measured (host → s, last run): $(tr -d '\n ' <"$W/history.json")"
echo "(worker03 $A03, worker05 $A05, worker04 $A04)"
echo "--choose for 4 machines:"
cat "$W/choices"
