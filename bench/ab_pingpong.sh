#!/usr/bin/env bash
# ab_pingpong.sh - two or more builds' pingpong, interleaved (each round runs every build once,
# in turn, under its own launcher), medians per size and the ratio last/first. A build is a
# directory holding `mutirao` and `pingpong` (copy target/release/mutirao and
# target/release/examples/pingpong there, e.g. main's and a branch's).
#
#   bash bench/ab_pingpong.sh /tmp/main-bin /tmp/new-bin
#   ROUNDS=8 LOAD=1 SIZES=0,64,262144 SCALE=0.3 bash bench/ab_pingpong.sh A B   # beside a busy loop
#   ENVX="MUTIRAO_TRANSPORT=tcp" bash bench/ab_pingpong.sh A B                  # over TCP
#
# LOAD=1 starts one busy loop for the whole run and always stops it. The per-round figures
# follow each median (the machine is noisy: read them, not only the medians).
set -euo pipefail
[ "$#" -ge 2 ] || { echo "usage: $0 BUILD_DIR_A BUILD_DIR_B [more]" >&2; exit 2; }
ROUNDS="${ROUNDS:-5}"
SIZES="${SIZES:-0,8,64,512,4096,32768,65536,262144,1048576,4194304}"
SCALE="${SCALE:-0.3}"
for d in "$@"; do
    [ -x "$d/mutirao" ] && [ -x "$d/pingpong" ] || { echo "$d: needs mutirao and pingpong" >&2; exit 2; }
done
out=$(mktemp -d)
L=""
stop() {
    if [ -n "$L" ]; then kill "$L" 2>/dev/null || true; wait "$L" 2>/dev/null || true; fi
    rm -rf "$out"
}
trap stop EXIT
if [ "${LOAD:-0}" = 1 ]; then
    bash -c 'while :; do :; done' &
    L=$!
fi
for r in $(seq 1 "$ROUNDS"); do
    i=0
    for d in "$@"; do
        # shellcheck disable=SC2086 # ENVX is a list of VAR=value words
        env ${ENVX:-} "$d/mutirao" run -n 2 "$d/pingpong" --sizes "$SIZES" --scale "$SCALE" |
            grep -v '^#' | sed "s|^|$i |" >>"$out/all"
        i=$((i + 1))
    done
done
python3 - "$out/all" "$@" <<'PY'
import sys, statistics
rows = {}
for line in open(sys.argv[1]):
    b, s, v, _ = line.split()
    rows.setdefault((int(b), int(s)), []).append(float(v))
builds = sys.argv[2:]
sizes = sorted({s for (_, s) in rows})
print("# one-way µs, median of rounds; builds: " + "  ".join(f"[{i}] {b}" for i, b in enumerate(builds)))
print("bytes " + " ".join(f"[{i}]" for i in range(len(builds))) + " last/first  per round")
for s in sizes:
    m = [statistics.median(rows[(i, s)]) for i in range(len(builds))]
    per = " | ".join(",".join(f"{v:.3g}" for v in rows[(i, s)]) for i in range(len(builds)))
    print(s, " ".join(f"{x:.3f}" for x in m), f"{m[-1] / m[0]:.2f}", " ", per)
PY
