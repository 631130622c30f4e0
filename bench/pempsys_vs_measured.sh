#!/usr/bin/env bash
# PeMPSys against reality (issue 11, item 7; digest 001 checks 10 and 14): Monte Carlo π in
# master/worker form on an emulated heterogeneous grid, predicted as an interval and measured.
#
#   mutirao testbed up SPEC --name N            a coordinator and 8 workers of unequal CPU
#   mutirao predict machine --testbed N         CRES: op × type costs, W, send costs per host,
#                                               once; two models from the same samples: as
#                                               measured (the thesis's CRES) and with
#                                               --calibrate-ops (op costs scaled per host by
#                                               a reference kernel's measured ÷ modelled time)
#   mutirao predict generate pi_tasks.pasl      the π model from the example's own source
#       --source crates/mutirao/examples/pi_tasks.rs
#   mutirao predict -p P --json                 [t_min; t_max], the P fastest workers by W,
#                                               and their static shares of the tasks
#   mutirao run --hostfile (coordinator + those P workers) pi_tasks TASKS SHARES   RUNS times
#   mutirao predict error                       Eq. 5.2/5.3 (the harness) per P
#
# for P = 1, 2, 4, 8, and prints one markdown table per machine model: interval, centre,
# measured mean, the centre's error, mean |E| (Eq. 5.3) and runs inside; then the overall mean
# of the Ē_P values and share inside against the thesis's targets (≤ 2.3 %, ≥ 65 %); and the
# speedups, predicted (centres) and measured (means), against P = 1 (check 14). The measured time is the
# program's own `elapsed_s` (coordinator, from a barrier after start-up to the last result:
# the application the model describes, without the launcher's start-up).
#
# Usage: flock /tmp/mutirao-measure.lock sudo bench/pempsys_vs_measured.sh [RUNS]   (default 10)
# Env:   TASKS=100         tasks of the π batch
#        SPEC=FILE.toml    another grid (first host = coordinator; needs ≥ 9 hosts for P = 8)
#        PS="1 2 4 8"      worker counts
#        MUTIRAO=path      the mutirao binary (default target/release/mutirao, built if missing)
#        KEEP=dir          keep the machine model, the π model, predictions and runs in dir
# The testbed is always taken down on exit.
set -euo pipefail

RUNS=${1:-10}
TASKS=${TASKS:-100}
PS=${PS:-"1 2 4 8"}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${MUTIRAO:-$ROOT/target/release/mutirao}
PI=$ROOT/target/release/examples/pi_tasks
[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces, tc, cgroups): sudo $0" >&2; exit 2; }
if [[ ! -x $B || ! -x $PI ]]; then
    (cd "$ROOT" && cargo build --release -q -p mutirao-cli --bins && cargo build --release -q -p mutirao --example pi_tasks)
fi
if ! command -v jq >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq jq >/dev/null 2>&1 ||
        { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq jq >/dev/null; }
fi
if [[ -n ${KEEP:-} ]]; then
    W=$KEEP
    mkdir -p "$W"
else
    W=$(mktemp -d)
fi
NAME=pem$$
UP=""
cleanup() {
    if [[ -n $UP ]]; then "$B" testbed down "$NAME" >&2 || true; fi
    if [[ -z ${KEEP:-} ]]; then rm -rf "$W"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [[ -n ${SPEC:-} ]]; then
    cp "$SPEC" "$W/spec.toml"
else
    # One switched site; the coordinator and 8 workers from 0.3 down to 0.1 of a core
    # (1.6 cores in all, under this 2-core machine's, so every host gets its quota).
    cat >"$W/spec.toml" <<'EOF'
[[site]]
name = "lab"
nic_mbit = 1000
hosts = [
  { name = "coord", cpu = 0.15 },
  { name = "w1", cpu = 0.3 }, { name = "w2", cpu = 0.25 },
  { name = "w3", cpu = 0.2 }, { name = "w4", cpu = 0.2 },
  { name = "w5", cpu = 0.15 }, { name = "w6", cpu = 0.15 },
  { name = "w7", cpu = 0.1 }, { name = "w8", cpu = 0.1 },
]
EOF
fi

"$B" testbed up "$W/spec.toml" --name "$NAME" >"$W/up.log" 2>&1 || { cat "$W/up.log" >&2; exit 1; }
UP=1
HOSTS=/run/mutirao-testbed/$NAME.hosts
TOKEN=/run/mutirao-testbed/$NAME.token

echo "measuring the machine model (predict machine --testbed)…" >&2
"$B" predict machine --testbed "$NAME" -o "$W/machines_raw.txt" --save-raw "$W/cres.json" 2>"$W/machine.log" ||
    { cat "$W/machine.log" >&2; exit 1; }
cat "$W/machine.log" >&2
"$B" predict machine --from-raw "$W/cres.json" --calibrate-ops -o "$W/machines_cal.txt" 2>/dev/null
"$B" predict generate "$ROOT/crates/mutirao/examples/pi_tasks.pasl" \
    --source "$ROOT/crates/mutirao/examples/pi_tasks.rs" --card "tasks=$TASKS" \
    --task T1=distribute --task T2=task:in=8:out=16:code=0 --task T3=gather \
    -o "$W/pi.pamela" 2>/dev/null

# Runs: the P fastest workers by W with their static shares (W and shares do not depend on
# the op costs, so both models predict the same placement).
for P in $PS; do
    "$B" predict --app "$W/pi.pamela" --machines "$W/machines_raw.txt" -p "$P" --json >"$W/pred_raw_$P.json"
    "$B" predict --app "$W/pi.pamela" --machines "$W/machines_cal.txt" -p "$P" --json >"$W/pred_cal_$P.json"
    mapfile -t WORKERS < <(jq -r '.prediction.workers[]' "$W/pred_raw_$P.json")
    SHARES=$(jq -r "[.prediction.shares[\"$TASKS\"][]] | map(tostring) | join(\",\")" "$W/pred_raw_$P.json")
    echo "$SHARES" >"$W/shares_$P"
    for i in "${WORKERS[@]}"; do
        awk -v i="$i" -F= '$1 == "W[" i "]" { printf "%.2f ", $2 }' "$W/machines_raw.txt"
    done >"$W/ws_$P"
    # Machine index i is line i+1 of the testbed's hostfile (predict machine ran rank i there).
    {
        sed -n 1p "$HOSTS"
        for i in "${WORKERS[@]}"; do sed -n "$((i + 1))p" "$HOSTS"; done
    } >"$W/hosts_$P"
    echo "running P=$P ($RUNS runs)…" >&2
    : >"$W/runs_$P"
    for r in $(seq "$RUNS"); do
        "$B" run --hostfile "$W/hosts_$P" --token-file "$TOKEN" -n $((P + 1)) --timeout 120 \
            "$PI" "$TASKS" "$SHARES" >"$W/run_${P}_$r.out" 2>&1 ||
            { cat "$W/run_${P}_$r.out" >&2; exit 1; }
        sed -n 's/.*elapsed_s=\([0-9.]*\).*/\1/p' "$W/run_${P}_$r.out" >>"$W/runs_$P"
    done
done

for M in raw cal; do
    case $M in
    raw) echo; echo "### Op costs as measured (the thesis's CRES)" ;;
    cal) echo; echo "### Op costs calibrated by the reference kernel (--calibrate-ops)" ;;
    esac
    echo
    echo "| P | workers (W) | shares | interval [t_min; t_max] s | centre s | measured mean s (min–max) | centre error | Ē_P (Eq. 5.3) | inside |"
    echo "|---|---|---|---|---|---|---|---|---|"
    SUM_E=0
    NP=0
    HITS=0
    ALL=0
    SPEED=""
    for P in $PS; do
        LO=$(jq -r .t_min_s "$W/pred_${M}_$P.json")
        HI=$(jq -r .t_max_s "$W/pred_${M}_$P.json")
        mapfile -t T <"$W/runs_$P"
        "$B" predict error --interval "$LO,$HI" "${T[@]}" --json >"$W/score_${M}_$P.json"
        read -r MEAN MIN MAX CE EP IN N C < <(jq -r '[.mean_run_s, (.runs_s|min), (.runs_s|max),
            .centre_error*100, .mean_abs_error*100, .inside, .runs, .centre_s] | @tsv' "$W/score_${M}_$P.json")
        printf '| %s | %s| %s | [%.3f; %.3f] | %.3f | %.3f (%.3f–%.3f) | %+.1f %% | %.2f %% | %s/%s |\n' \
            "$P" "$(cat "$W/ws_$P")" "$(cat "$W/shares_$P")" "$LO" "$HI" "$C" \
            "$MEAN" "$MIN" "$MAX" "$CE" "$EP" "$IN" "$N"
        if [[ -z ${C1:-} || $NP = 0 ]]; then C1=$C; M1=$MEAN; fi
        SPEED+=$(awk -v p="$P" -v c1="$C1" -v c="$C" -v m1="$M1" -v m="$MEAN" \
            'BEGIN { printf "P=%s: %.2f / %.2f; ", p, c1 / c, m1 / m }')
        SUM_E=$(awk -v a="$SUM_E" -v b="$EP" 'BEGIN { print a + b }')
        NP=$((NP + 1))
        HITS=$((HITS + IN))
        ALL=$((ALL + N))
    done
    awk -v s="$SUM_E" -v n="$NP" -v h="$HITS" -v a="$ALL" 'BEGIN {
        e = s / n; f = 100 * h / a
        printf "\nmean of the Ē_P: %.2f %% (target ≤ 2.3 %%: %s); runs inside: %d/%d = %.0f %% (target ≥ 65 %%: %s)\n",
            e, (e <= 2.3 ? "met" : "MISSED"), h, a, f, (f >= 65 ? "met" : "MISSED")
    }'
    echo "speedup against the first P, predicted / measured: $SPEED"
done
