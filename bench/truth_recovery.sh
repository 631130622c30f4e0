#!/usr/bin/env bash
# Truth recovery on the testbed (issue 3, Acceptance "truth recovery on the testbed").
#
# As root: brings up an emulated grid (site a: a1 cpu 1.0, a2 cpu 0.25, host links 800 Mbit;
# site b: b1 cpu 0.5, host link 200 Mbit; WAN a-b 40 Mbit; quotas sum to 1.75 cores), calibrates
# it all-pairs over the agents (one rank per host: --no-same-host, so no same-host link is
# measured or checked), fits with a1 as speed reference, and prints:
#   1. per link class: fitted large-message bandwidth 1/per_byte_us of the LAST `l` segment
#      (Mbit/s) vs the shaped bottleneck (min of the two host links and the WAN), error %,
#      and, as a diagnostic, the raw slope of the median L between 1 and 4 MiB (no fit)
#      (note: tbf shapes whole frames, so TCP payload tops out at ~96-98% of the nominal rate);
#   2. per host: fitted speed vs quota ratio (cpu / 1.0), error %;
#   3. run-to-run: a second all-pairs calibration, fitted again; per link and size >= 64 KiB the
#      relative difference of the modelled one-way time os+l+or between the two models, and
#      per ordered pair and size >= 64 KiB that of the measured median RTT/2 (the data);
#   4. wall time of all-pairs vs site-sampled calibration (unless SITE_SAMPLED=0).
# Tolerances from the issue: bandwidth 6%, speed 5%, run-to-run 10% ("two calibrations in a row
# agree": judged on the measured data; the models' agreement is printed as a diagnostic).
#
# Usage: sudo bench/truth_recovery.sh            (about 3-4 min)
# Env:   MUTIRAO=path/to/mutirao (default target/release/mutirao, built if missing)
#        KEEP=dir   keep spec, calibrations, models and fit reports in dir
#        SITE_SAMPLED=0  skip the site-sampled timing run
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${MUTIRAO:-$ROOT/target/release/mutirao}
[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces, cgroups)" >&2; exit 2; }
command -v python3 >/dev/null || { echo "needs python3" >&2; exit 2; }
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

cat >"$W/testbed.toml" <<'SPEC'
[[site]]
name = "a"
nic_mbit = 800
hosts = [ { name = "a1", cpu = 1.0 }, { name = "a2", cpu = 0.25 } ]

[[site]]
name = "b"
nic_mbit = 200
hosts = [ { name = "b1", cpu = 0.5 } ]

[[wan]]
sites = ["a", "b"]
mbit = 40
SPEC
TBNAME=tr$$
"$B" testbed up "$W/testbed.toml" --name "$TBNAME" >&2
HOSTS=/run/mutirao-testbed/$TBNAME.hosts
TOKEN=/run/mutirao-testbed/$TBNAME.token
# Hostfile lines are in spec order: a1, a2, b1. Name them in the calibration with a sites file.
mapfile -t ADDR < <(awk 'NF {print $1}' "$HOSTS")
[[ ${#ADDR[@]} == 3 ]] || { echo "expected 3 hosts in $HOSTS" >&2; exit 1; }
printf '%s a a1\n%s a a2\n%s b b1\n' "${ADDR[0]}" "${ADDR[1]}" "${ADDR[2]}" >"$W/sites.txt"

# Large sizes dominate the last `l` segment; few repetitions keep the 40 Mbit WAN pairs short
# (4 MiB there is ~0.85 s one way). The default --eager-limit (= the largest size) keeps every
# message eager, so the wire time lands in `l`; with `--eager-limit runtime` (rendezvous above
# 64 KiB) the probe fires on the envelope and the transfer lands in the mirror's `or` instead
# (measured: `l` slopes of ~0, `or` slopes of 38 Mbit/s inter-site), see docs/calibration.md.
# Sizes are dense from 16 KiB to 1 MiB: tbf's bucket (128 KiB, or 2 ms of traffic) lets a
# message under it leave at once and shapes the rest, so L bends there; with only 64K, 256K and
# 512K in that range a 3-size segment cannot follow the bend and two runs' fits placed their
# breakpoints differently (19-23% apart at 512 KiB on data that agreed within 0.3%).
SIZES=${SIZES:-0,1K,4K,16K,32K,64K,128K,256K,384K,512K,768K,1M,2M,4M}
# H: a fixed repetition count (~0.23 s on a1, ~0.95 s on a2 at cpu 0.25: ~95 CFS periods of
# 10 ms) and 7 runs in interleaved rounds; H takes the least CPU time of a host's runs, so more
# short runs beat fewer long ones against the VM's slow spells.
SPEED_REPS=${SPEED_REPS:-1000}
calib() { # strategy out
    "$B" calibrate --hostfile "$HOSTS" --token-file "$TOKEN" --sites-file "$W/sites.txt" \
        --strategy "$1" --no-same-host --sizes "$SIZES" --warmup 1 --min-reps 3 \
        --time-per-size 0.3 --speed-reps "$SPEED_REPS" --speed-runs "${SPEED_RUNS:-7}" -o "$2" >&2
}
now() { date +%s.%N; }

t0=$(now); calib all-pairs "$W/calib1.json"; t1=$(now)
"$B" fit "$W/calib1.json" --speed-reference a1 --report -o "$W/model1.json" >"$W/fit1.txt"
cat "$W/fit1.txt" >&2
t2=$(now); calib all-pairs "$W/calib2.json"; t3=$(now)
"$B" fit "$W/calib2.json" --speed-reference a1 -o "$W/model2.json" >&2
if [[ ${SITE_SAMPLED:-1} != 0 ]]; then
    t4=$(now); calib site-sampled "$W/calib3.json"; t5=$(now)
    "$B" fit "$W/calib3.json" --speed-reference a1 -o "$W/model3.json" >&2
else
    t4=0; t5=0
fi

python3 - "$W" "$t0" "$t1" "$t2" "$t3" "$t4" "$t5" <<'PY'
import json, sys
w = sys.argv[1]
t = [float(x) for x in sys.argv[2:]]
nic = {"a": 800.0, "b": 200.0}
wan = 40.0
cpu = {"a1": 1.0, "a2": 0.25, "b1": 0.5}
m1 = json.load(open(f"{w}/model1.json"))
m2 = json.load(open(f"{w}/model2.json"))

def seg(pw, m):
    # mutirao-model/1: value(m) = base_us + per_byte_us·(m − from), last segment with from ≤ m
    s = [x for x in pw if x["from"] <= m]
    x = s[-1] if s else pw[0]
    return x["base_us"] + x["per_byte_us"] * (m - x["from"])

def mbit(pw):
    pb = pw[-1]["per_byte_us"]
    return 8.0 / pb if pb > 0 else float("inf")  # bytes/us -> Mbit/s: 8 bits / (per_byte_us)

def shaped(link):
    c = link["class"]
    if c == "intra-site":
        return nic[link["site"]] if link.get("site") else None
    if c == "inter-site":
        s = link.get("sites") or ["a", "b"]
        return min(nic[s[0]], nic[s[1]], wan)
    if c == "pair":
        hs = {h["name"]: h["site"] for h in m1["hosts"]}
        a, b = hs[link["src"]], hs[link["dst"]]
        return nic[a] if a == b else min(nic[a], nic[b], wan)
    return None

def name(link):
    c = link["class"]
    if c == "intra-site": return f"intra-site {link.get('site') or '*'}"
    if c == "inter-site": return f"inter-site {'-'.join(link.get('sites') or ['*'])}"
    if c == "pair": return f"pair {link['src']}->{link['dst']}"
    return c

ok = True
print("## Bandwidth per link class (1/per_byte_us of the last l segment)\n")
# Diagnostic: what the raw calibration says, without the fit. Per measured pair, the slope of the
# median L = (rtt - os_src - or_dst - os_dst - or_src)/2 between the 1 MiB and 4 MiB sizes.
c1 = json.load(open(f"{w}/calib1.json"))
raw = {}
for p in c1["pairs"]:
    med = {}
    for z in p["sizes"]:
        ls = sorted((x["rtt_us"] - x["os_src_us"] - x["or_dst_us"] - x["os_dst_us"] - x["or_src_us"]) / 2
                    for x in z["samples"])
        if ls: med[z["bytes"]] = ls[len(ls) // 2]
    if (1 << 20) in med and (4 << 20) in med and med[4 << 20] > med[1 << 20]:
        raw[(p["src"], p["dst"])] = 8.0 * (3 << 20) / (med[4 << 20] - med[1 << 20])
site_of = {h["name"]: h["site"] for h in m1["hosts"]}
def raw_of(link):
    c = link["class"]
    if c == "pair": v = [raw.get((link["src"], link["dst"]))]
    elif c == "intra-site": v = [r for (s, d), r in raw.items() if site_of[s] == site_of[d] == link.get("site")]
    elif c == "inter-site": v = [r for (s, d), r in raw.items() if site_of[s] != site_of[d]]
    else: v = []
    v = [x for x in v if x is not None]
    return f"{sum(v) / len(v):.1f}" if v else "-"
print("| link | l segments | fitted Mbit/s | shaped Mbit/s | error % | within 6%? | raw L slope 1M-4M Mbit/s |")
print("|---|---|---|---|---|---|---|")
for link in m1["links"]:
    sh = shaped(link)
    if sh is None: continue
    f = mbit(link["l"])
    e = 100.0 * (f - sh) / sh
    good = abs(e) <= 6.0
    ok &= good
    print(f"| {name(link)} | {len(link['l'])} | {f:.1f} | {sh:.0f} | {e:+.1f} | {'yes' if good else 'NO'} | {raw_of(link)} |")

print("\n## Relative speed per host (reference a1)\n")
print("| host | fitted speed | quota ratio | error % | within 5%? |")
print("|---|---|---|---|---|")
for h in m1["hosts"]:
    q = cpu.get(h["name"])
    if q is None: continue
    e = 100.0 * (h["speed"] - q) / q
    good = abs(e) <= 5.0
    ok &= good
    print(f"| {h['name']} | {h['speed']:.3f} | {q:.2f} | {e:+.1f} | {'yes' if good else 'NO'} |")

# Diagnostic, not a criterion: two fits of data that agree can still choose different
# breakpoints where L is jagged (tbf drops around 384 KiB on the WAN), and differ between sizes.
models_ok = True
print("\n## Run-to-run of the fitted models (diagnostic: modelled one-way os+l+or, sizes >= 64 KiB)\n")
print("| link | worst |diff| % | at size | within 10%? |")
print("|---|---|---|---|")
def key(l): return (l["class"], l.get("site"), tuple(l.get("sites") or []), l.get("src"), l.get("dst"))
l2 = {key(l): l for l in m2["links"]}
sizes = [k << 10 for k in (64, 128, 256, 384, 512, 768, 1024, 2048, 4096)]
for link in m1["links"]:
    o = l2.get(key(link))
    if o is None:
        print(f"| {name(link)} | missing in run 2 | | NO |"); models_ok = False; continue
    worst, at = 0.0, 0
    for m in sizes:
        a = seg(link["os"], m) + seg(link["l"], m) + seg(link["or"], m)
        b = seg(o["os"], m) + seg(o["l"], m) + seg(o["or"], m)
        d = 100.0 * abs(b - a) / a if a > 0 else 0.0
        if d >= worst: worst, at = d, m
    good = worst <= 10.0
    models_ok &= good
    print(f"| {name(link)} | {worst:.1f} | {at >> 10} KiB | {'yes' if good else 'NO'} |")

# The issue's words: "two calibrations in a row agree" — the measured data themselves: per
# ordered pair and size >= 64 KiB, the median one-way time RTT/2 of run 1 vs run 2.
print("\n## Run-to-run, measured (median RTT/2 per ordered pair and size >= 64 KiB)\n")
print("| pair | worst |diff| % | at size | within 10%? |")
print("|---|---|---|---|")
def medians(path):
    out = {}
    for p in json.load(open(path))["pairs"]:
        for sz in p["sizes"]:
            r = sorted(x["rtt_us"] for x in sz["samples"])
            if sz["bytes"] >= 65536 and r:
                out[(p["src"], p["dst"], sz["bytes"])] = r[len(r) // 2] / 2
    return out
d1, d2 = medians(f"{w}/calib1.json"), medians(f"{w}/calib2.json")
worst = {}
for k, a in d1.items():
    b = d2.get(k)
    if b is None or a <= 0: continue
    d = 100.0 * abs(b - a) / a
    pk = (k[0], k[1])
    if d >= worst.get(pk, (-1, 0))[0]: worst[pk] = (d, k[2])
for (s_, d_), (d, at) in sorted(worst.items()):
    good = d <= 10.0
    ok &= good
    print(f"| {s_}->{d_} | {d:.1f} | {at >> 10} KiB | {'yes' if good else 'NO'} |")

hs2 = {h["name"]: h["speed"] for h in m2["hosts"]}
print("\nspeeds run 2: " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(hs2.items())))

print("\n## Calibration wall time\n")
print(f"- all-pairs run 1: {t[1]-t[0]:.1f} s; run 2: {t[3]-t[2]:.1f} s")
if t[4] > 0:
    print(f"- site-sampled: {t[5]-t[4]:.1f} s")
    try:
        m3 = json.load(open(f"{w}/model3.json"))
        l3 = {key(l): l for l in m3["links"]}
        for link in m1["links"]:
            o = l3.get(key(link))
            if o is None: continue
            print(f"  - {name(link)}: site-sampled {mbit(o['l']):.1f} Mbit/s vs all-pairs {mbit(link['l']):.1f}")
    except (OSError, ValueError) as err:
        print(f"  (site-sampled model unreadable: {err})")
print(f"\nmodels run-to-run within 10%: {'yes' if models_ok else 'no'} (diagnostic)")
print(f"\noverall: {'PASS' if ok else 'FAIL'} (bandwidth 6%, speed 5%, measured run-to-run 10%)")
PY
