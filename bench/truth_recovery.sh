#!/usr/bin/env bash
# Truth recovery on the testbed (issue 3, Acceptance "truth recovery on the testbed").
#
# As root: brings up an emulated grid (site a: a1 cpu 1.0, a2 cpu 0.25, host links 800 Mbit;
# site b: b1 cpu 0.5, host link 200 Mbit; WAN a-b 40 Mbit; quotas sum to 1.75 cores), calibrates
# it all-pairs over the agents (one rank per host: --no-same-host, so no same-host link is
# measured or checked), fits with a1 as speed reference, and prints:
#   1. per link class: fitted large-message bandwidth, the slope of the modelled one-way time
#      os+l+or between 2 and 4 MiB (Mbit/s; with the runtime's rendezvous the transfer sits in
#      `or`, not `l`), vs the shaped bottleneck (min of the two host links and the WAN), error %,
#      and the raw slope of the median RTT/2 between 2 and 4 MiB (no fit): where it stays under
#      90% of the shaped rate (a receiver held to a quarter of a core), that is the truth
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

# Few repetitions keep the 40 Mbit WAN pairs short (4 MiB there is ~0.85 s one way). The
# default --eager-limit is the runtime's (rendezvous above 64 KiB): the probe fires on the
# envelope and the transfer lands in the receiver's `or`, not in `l` (see docs/calibration.md),
# so bandwidths are judged on the one-way time os+l+or.
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
# fit refuses a model that misses a measured median by more than 10% (a throttled receiver's
# large messages are lumpy); the script then writes it anyway and says so, as a user would.
POOR=""
fitm() { # calib model [extra fit args]
    local c=$1 m=$2
    shift 2
    if ! "$B" fit "$c" --speed-reference a1 -o "$m" "$@"; then
        echo "fit of $(basename "$c") exited non-zero (misses above); written with --allow-poor-fit" >&2
        POOR+="$(basename "$c") "
        "$B" fit "$c" --speed-reference a1 -o "$m" --allow-poor-fit "$@"
    fi
}
fitm "$W/calib1.json" "$W/model1.json" --report >"$W/fit1.txt"
cat "$W/fit1.txt" >&2
t2=$(now); calib all-pairs "$W/calib2.json"; t3=$(now)
fitm "$W/calib2.json" "$W/model2.json" >&2
if [[ ${SITE_SAMPLED:-1} != 0 ]]; then
    t4=$(now); calib site-sampled "$W/calib3.json"; t5=$(now)
    fitm "$W/calib3.json" "$W/model3.json" >&2
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

def mbit(link):
    # bytes/us -> Mbit/s: 8 bits per byte over the one-way time's slope at the largest sizes
    one_way = lambda m: seg(link["l"], m) + seg(link["os"], m) + seg(link["or"], m)
    d = one_way(4 << 20) - one_way(2 << 20)
    return 8.0 * (2 << 20) / d if d > 0 else float("inf")

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
print("## Bandwidth per link class (slope of the modelled one-way time os+l+or, 2-4 MiB)\n")
# Diagnostic: what the raw calibration says, without the fit. Per measured pair, the slope of the
# median one-way time RTT/2 between the 2 MiB and 4 MiB sizes.
c1 = json.load(open(f"{w}/calib1.json"))
raw = {}
for p in c1["pairs"]:
    med = {}
    for z in p["sizes"]:
        ls = sorted(x["rtt_us"] / 2 for x in z["samples"])
        if ls: med[z["bytes"]] = ls[len(ls) // 2]
    if (2 << 20) in med and (4 << 20) in med and med[4 << 20] > med[2 << 20]:
        raw[(p["src"], p["dst"])] = 8.0 * (2 << 20) / (med[4 << 20] - med[2 << 20])
site_of = {h["name"]: h["site"] for h in m1["hosts"]}
def raw_of(link):
    c = link["class"]
    if c == "pair": v = [raw.get((link["src"], link["dst"]))]
    elif c == "intra-site": v = [r for (s, d), r in raw.items() if site_of[s] == site_of[d] == link.get("site")]
    elif c == "inter-site": v = [r for (s, d), r in raw.items() if site_of[s] != site_of[d]]
    else: v = []
    v = [x for x in v if x is not None]
    return f"{sum(v) / len(v):.1f}" if v else "-"
def link_for(src, dst):
    for l in m1["links"]:
        if l["class"] == "pair" and l["src"] == src and l["dst"] == dst: return l
    for l in m1["links"]:
        if site_of[src] == site_of[dst] and l["class"] == "intra-site" and l.get("site") in (None, site_of[src]): return l
        if site_of[src] != site_of[dst] and l["class"] == "inter-site": return l
    return None
def rtt2_mbit(src, dst):
    # The model's round trip over two, as the raw data measure it: one way there, one way back.
    f, r = link_for(src, dst), link_for(dst, src)
    if f is None or r is None: return None
    one_way = lambda l, m: seg(l["l"], m) + seg(l["os"], m) + seg(l["or"], m)
    d = (one_way(f, 4 << 20) + one_way(r, 4 << 20) - one_way(f, 2 << 20) - one_way(r, 2 << 20)) / 2
    return 8.0 * (2 << 20) / d if d > 0 else float("inf")
# Truth: the shaped rate, unless the measured data never reach it (a receiver held to a quarter
# of a core cannot take 800 Mbit/s of unsegmented frames): then the measured RTT/2 slope, and
# the fit is judged on following the data. Pairs are judged on the model's RTT/2 (its split of
# a round trip into the two directions comes from the probes and may be asymmetric).
print("| link | fitted one-way Mbit/s | fitted RTT/2 Mbit/s | shaped Mbit/s | raw RTT/2 slope 2M-4M Mbit/s | truth | error % | within 6%? |")
print("|---|---|---|---|---|---|---|---|")
for link in m1["links"]:
    sh = shaped(link)
    if sh is None: continue
    f = mbit(link)
    c = link["class"]
    if c == "pair":
        ps = [(link["src"], link["dst"])]
    elif c == "intra-site":
        ps = [(s_, d_) for (s_, d_) in raw if site_of[s_] == site_of[d_] == link.get("site")]
    else:
        ps = [(s_, d_) for (s_, d_) in raw if site_of[s_] != site_of[d_]]
    rv = [raw[p_] for p_ in ps if p_ in raw]
    rw = sum(rv) / len(rv) if rv else None
    fr = [rtt2_mbit(*p_) for p_ in ps]
    fr = [x for x in fr if x is not None]
    fm = sum(fr) / len(fr) if fr else f
    cpu_bound = rw is not None and rw < 0.9 * sh
    truth = rw if cpu_bound else sh
    e = 100.0 * (fm - truth) / truth
    good = abs(e) <= 6.0
    ok &= good
    rws = f"{rw:.1f}" if rw is not None else "-"
    tl = f"{truth:.0f} (measured: receiver CPU-bound)" if cpu_bound else f"{truth:.0f} (shaped)"
    print(f"| {name(link)} | {f:.1f} | {fm:.1f} | {sh:.0f} | {rws} | {tl} | {e:+.1f} | {'yes' if good else 'NO'} |")

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
            print(f"  - {name(link)}: site-sampled {mbit(o):.1f} Mbit/s vs all-pairs {mbit(link):.1f}")
    except (OSError, ValueError) as err:
        print(f"  (site-sampled model unreadable: {err})")
print(f"\nmodels run-to-run within 10%: {'yes' if models_ok else 'no'} (diagnostic)")
print(f"\noverall: {'PASS' if ok else 'FAIL'} (bandwidth 6%, speed 5%, measured run-to-run 10%)")
PY
if [[ -n $POOR ]]; then echo "fits that missed a median by > 10% (written with --allow-poor-fit): $POOR"; fi
