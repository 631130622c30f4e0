#!/usr/bin/env bash
# Calibration strategies on an 8-host testbed (issue 3: speed, site-sampled vs all-pairs,
# type-sampled on a mixed site).
#
# As root. Two specs, each two sites of four hosts (site a: 800 Mbit/s host links, site b:
# 200 Mbit/s, WAN 40 Mbit/s — the rates of the truth-recovery spec):
#   homogeneous: a1..a4 cpu 1.0, b1..b4 cpu 0.5
#   mixed:       a1 a2 cpu 1.0, a3 a4 cpu 0.25 (site a mixes speeds), b1..b4 cpu 0.5
# For each spec: calibrate all-pairs (the reference), site-sampled and, on the mixed spec,
# type-sampled, with the default 12 sizes (0 B … 1 MiB), same-host pairs included; time each;
# fit each with a1 as the speed reference; and compare every strategy's model with all-pairs'
# (`mutirao model compare`: per ordered pair and size, the modelled one-way time Os + L + Or).
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
    local a3=1.0
    [[ $1 == mixed ]] && a3=0.25
    cat <<SPEC
[[site]]
name = "a"
nic_mbit = 800
hosts = [ { name = "a1", cpu = 1.0 }, { name = "a2", cpu = 1.0 },
          { name = "a3", cpu = $a3 }, { name = "a4", cpu = $a3 } ]

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
    strategies="all-pairs site-sampled"
    [[ $s == mixed ]] && strategies="all-pairs site-sampled type-sampled"
    for st in $strategies; do
        t0=$(now)
        "$B" calibrate --hostfile "$run.hosts" --token-file "$run.token" \
            --sites-file "$run.sites" --strategy "$st" -o "$W/$s-$st.calib.json" >&2
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
for s in ${SPECS:-homogeneous mixed}; do
    for st in site-sampled type-sampled; do
        [[ -f $W/$s-$st.model.json ]] || continue
        echo "## $s: $st against all-pairs"
        echo
        echo '```'
        "$B" model compare "$W/$s-all-pairs.model.json" "$W/$s-$st.model.json" \
            --sizes 0,64,1K,16K,64K,256K,1M --min-size 64K | tee "$W/$s-$st.compare.txt" || true
        echo '```'
        echo
    done
done
