#!/usr/bin/env bash
# Calibration strategies on an 8-host testbed (issue 3: speed, site-sampled vs all-pairs,
# type-sampled on a mixed site).
#
# As root. Two specs, each two sites of four hosts (site a: 800 Mbit/s host links, site b:
# 200 Mbit/s, WAN 40 Mbit/s — the rates of the truth-recovery spec):
#   homogeneous: a1..a4 cpu 1.0, b1..b4 cpu 0.5
#   mixed:       a1 a2 cpu 1.0; a3 a4 cpu 0.5 behind 100 Mbit/s links (site a mixes old and new
#                machines on one switch); b1..b4 cpu 0.5
# For each spec: calibrate all-pairs (the reference), site-sampled and, on the mixed spec,
# type-sampled, with the default 12 sizes (0 B … 1 MiB), same-host pairs included; time each;
# on the homogeneous spec all-pairs runs twice (run-to-run: the noise floor of any comparison).
# Each calibration is fitted with a1 as the speed reference and compared with the first
# all-pairs model (`mutirao model compare`: per ordered pair and size, the modelled one-way
# time Os + L + Or), grouped by kind of pair, worst |difference| at 64 KiB and above and at
# small sizes (0 B … 16 KiB).
#
# Usage: sudo bench/calib_strategies.sh      (about 4 minutes)
# Env:   MUTIRAO=path (default target/release/mutirao, built if missing)
#        KEEP=dir   keep specs, calibrations, models and comparisons in dir
#        SPECS="homogeneous mixed"  which specs to run
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${MUTIRAO:-$ROOT/target/release/mutirao}
[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces, cgroups)" >&2; exit 2; }
if [[ ! -x $B ]]; then
    (cd "$ROOT" && cargo build --release -q -p mutirao-cli --bins)
fi
if [[ -n ${KEEP:-} ]]; then W=$KEEP; mkdir -p "$W"; else W=$(mktemp -d); fi
TBNAME=""
cleanup() {
    if [[ -n $TBNAME ]]; then "$B" testbed down "$TBNAME" >&2 || true; fi
    if [[ -z ${KEEP:-} ]]; then rm -rf "$W"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

spec() { # name -> toml
    local a3="cpu = 1.0"
    [[ $1 == mixed ]] && a3="cpu = 0.5, nic_mbit = 100"
    cat <<SPEC
[[site]]
name = "a"
nic_mbit = 800
hosts = [ { name = "a1", cpu = 1.0 }, { name = "a2", cpu = 1.0 },
          { name = "a3", $a3 }, { name = "a4", $a3 } ]

[[site]]
name = "b"
nic_mbit = 200
hosts = [ { name = "b1", cpu = 0.5 }, { name = "b2", cpu = 0.5 },
          { name = "b3", cpu = 0.5 }, { name = "b4", cpu = 0.5 } ]

[[wan]]
sites = ["a", "b"]
mbit = 40
SPEC
}
now() { date +%s.%N; }

declare -A SECS
for s in ${SPECS:-homogeneous mixed}; do
    spec "$s" >"$W/$s.toml"
    TBNAME=cs$$$s
    TBNAME=${TBNAME:0:12}
    "$B" testbed up "$W/$s.toml" --name "$TBNAME" >&2
    run=/run/mutirao-testbed/$TBNAME
    strategies="all-pairs all-pairs-again site-sampled"
    [[ $s == mixed ]] && strategies="all-pairs site-sampled type-sampled"
    for st in $strategies; do
        t0=$(now)
        "$B" calibrate --hostfile "$run.hosts" --token-file "$run.token" \
            --sites-file "$run.sites" --strategy "${st%-again}" -o "$W/$s-$st.calib.json" >&2
        t1=$(now)
        SECS[$s-$st]=$(python3 -c "print(f'{$t1-$t0:.1f}')")
        "$B" fit "$W/$s-$st.calib.json" --speed-reference a1 -o "$W/$s-$st.model.json" >&2
    done
    "$B" testbed down "$TBNAME" >&2
    TBNAME=""
done

echo "## Calibration wall time (8 hosts, 12 sizes 0 B … 1 MiB, same-host pairs included)"
echo
echo "| spec | strategy | sweeps measured | seconds |"
echo "|---|---|---|---|"
for k in "${!SECS[@]}"; do
    n=$(python3 -c "import json,sys; c=json.load(open(sys.argv[1])); print(len(c['pairs']) - len(c['provenance'].get('echoed', [])))" "$W/$k.calib.json")
    echo "| ${k%%-*} | ${k#*-} | $n | ${SECS[$k]} |"
done | sort
echo
echo "## Against the first all-pairs model: worst |difference| of the modelled one-way time"
echo
echo "slow = a pair with a3 or a4 on the mixed spec (cpu 0.5, 100 Mbit/s links)"
echo
echo "| spec | model | kind of pair | >= 64 KiB | 0 B … 16 KiB |"
echo "|---|---|---|---|---|"
for s in ${SPECS:-homogeneous mixed}; do
    for st in all-pairs-again site-sampled type-sampled; do
        [[ -f $W/$s-$st.model.json ]] || continue
        "$B" model compare "$W/$s-all-pairs.model.json" "$W/$s-$st.model.json" \
            --sizes 0,64,1K,16K,64K,256K,1M --json >"$W/$s-$st.compare.json"
        python3 - "$s" "$st" "$W/$s-$st.compare.json" <<'PY'
import json, sys
spec, st, f = sys.argv[1:4]
c = json.load(open(f))
slow = {"a3", "a4"} if spec == "mixed" else set()
def kind(p):
    s, d = p["src"], p["dst"]
    k = "same-host" if s == d else ("inter-site" if s[0] != d[0] else "intra-site " + s[0])
    return k + (" slow" if s in slow or d in slow else "")
g = {}
for p in c["pairs"]:
    big = p["bytes"] >= 65536
    g.setdefault(kind(p), [0.0, 0.0])
    i = 0 if big else 1
    if abs(p["rel"]) > abs(g[kind(p)][i]):
        g[kind(p)][i] = p["rel"]
for k in sorted(g):
    print(f"| {spec} | {st} | {k} | {100*g[k][0]:+.1f}% | {100*g[k][1]:+.1f}% |")
w = max((abs(h["rel"]) for h in c["speeds"]), default=0.0)
print(f"| {spec} | {st} | host speeds | {100*w:.1f}% | |")
PY
    done
done
