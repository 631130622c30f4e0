#!/usr/bin/env bash
# Checkpoint cost and recovery on the local default (issue 12), with the jacobi example.
#
#   bash bench/checkpoints.sh                 # cost, overhead, recovery (a few minutes)
#   PARTS=overhead REPS=5 INTERVAL=30 ITERS=… bash bench/checkpoints.sh
#   PARTS=ab bash bench/checkpoints.sh        # the issue's 30 s figure: ~22 min, quiet machine
#   PARTS=ab SCALE=0.05 bash bench/checkpoints.sh   # same protocol, ~6 s runs (~2 min): a check
#
# 1. cost: one wave's cost (first blob to commit, median, as `mutirao run` reports it) against
#    the state size (jacobi's plate n×n doubles over RANKS ranks);
# 2. overhead: wall time of jacobi without checkpoints and with --checkpoint-interval INTERVAL,
#    interleaved REPS times; the ratio of medians (with ≥ 2 waves per run for the ratio to mean
#    anything: ITERS is chosen so that a run lasts about 2.5 × INTERVAL unless given);
# 3. recovery: SIGKILL rank 1 at a random moment (uniform over 0 to 0.6 s, more than one
#    0.5 s interval and its wave) after epoch 2 is committed; report the time from the kill to
#    the first and to the last rank printing that it resumed (restored, past init: with the
#    last, every rank runs again), and the work redone: the kill's time minus the time the
#    epoch the restart resumes from was committed (the launcher names it), against the
#    interval.
# 4. ab: the acceptance figure of issue 12 — jacobi (plate AB_N, default 2048: 10.7 MiB of state
#    per rank on 3 ranks) for about RUN_S seconds (default 120 × SCALE) without checkpoints (A)
#    and with --checkpoint-interval AB_INTERVAL (default 30 × SCALE) (B), interleaved A B A B …
#    PAIRS times (default 5); each pair's B/A wall-time ratio, the waves B committed and their
#    median cost as `mutirao run` reports it (waves × cost / A: the overhead those waves account
#    for, a cross-check of the ratio), and the median ratio. Both runs of a pair must print the
#    same checksum. SCALE (default 1) shrinks run and interval together.
# Output: a markdown table per part. Numbers are noisy on a shared machine: compare ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
PARTS=${PARTS:-"cost overhead recovery"}
RANKS=${RANKS:-3}
REPS=${REPS:-3}
INTERVAL=${INTERVAL:-2}
N=${N:-512}
cargo build --release -q -p mutirao-cli -p mutirao --examples --bins
TGT=${CARGO_TARGET_DIR:-target}
BIN=$TGT/release/mutirao
J=$TGT/release/examples/jacobi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

now() { date +%s.%N; }

# "min–max" of its arguments (numbers).
minmax() { printf '%s\n' "$@" | sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%s–%s", lo, hi }'; }

# Iterations of jacobi at plate size $2 (default N) that take about $1 seconds, from one run
# of $3 (default 200) iterations.
calibrate_iters() {
  local out n=${2:-$N} it=${3:-200}
  out=$("$BIN" run -n "$RANKS" "$J" -- --n "$n" --iters "$it" 2>/dev/null)
  awk -v want="$1" -v it="$it" '{ for (i = 1; i <= NF; i++) if ($i ~ /^elapsed_s=/) { split($i, a, "="); printf "%d\n", want / (a[2] / it) } }' <<<"$out"
}

if [[ " $PARTS " == *" cost "* ]]; then
  echo "## One wave's cost against the state size ($RANKS ranks, interval 0.2 s)"
  echo
  echo "| plate n | state per rank (MiB) | waves | median cost (s) |"
  echo "|---|---|---|---|"
  for spec in 128:20000 512:1500 1024:400 2048:100; do
    n=${spec%%:*}
    it=${spec##*:}
    err=$("$BIN" run -n "$RANKS" --checkpoint-interval 0.2 --checkpoint-dir "$TMP/c$n" "$J" -- --n "$n" --iters "$it" 2>&1 >/dev/null || true)
    line=$(grep -o '[0-9]* checkpoint(s) committed, median cost [0-9.]* s' <<<"$err" || true)
    waves=$(awk '{print $1}' <<<"$line")
    cost=$(awk '{print $6}' <<<"$line")
    mib=$(awk -v n="$n" -v r="$RANKS" 'BEGIN { printf "%.2f", n * n * 8 / r / 1048576 }')
    echo "| $n | $mib | ${waves:-0} | ${cost:-none} |"
  done
  echo
fi

if [[ " $PARTS " == *" overhead "* ]]; then
  ITERS=${ITERS:-$(calibrate_iters "$(awk -v i="$INTERVAL" 'BEGIN { print 2.5 * i }')")}
  echo "## Overhead of checkpoints every $INTERVAL s (jacobi n=$N, $ITERS iterations, $RANKS ranks, $REPS interleaved pairs)"
  echo
  echo "| pair | without (s) | with (s) | with / without | waves |"
  echo "|---|---|---|---|---|"
  ratios=()
  for r in $(seq 1 "$REPS"); do
    t0=$(now)
    "$BIN" run -n "$RANKS" "$J" -- --n "$N" --iters "$ITERS" >/dev/null 2>&1
    t1=$(now)
    err=$("$BIN" run -n "$RANKS" --checkpoint-interval "$INTERVAL" --checkpoint-dir "$TMP/o$r" "$J" -- --n "$N" --iters "$ITERS" 2>&1 >/dev/null)
    t2=$(now)
    waves=$(grep -o '[0-9]* checkpoint(s) committed' <<<"$err" | awk '{print $1}')
    a=$(awk -v x="$t0" -v y="$t1" 'BEGIN { printf "%.3f", y - x }')
    b=$(awk -v x="$t1" -v y="$t2" 'BEGIN { printf "%.3f", y - x }')
    q=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", b / a }')
    ratios+=("$q")
    echo "| $r | $a | $b | $q | ${waves:-0} |"
  done
  med=$(printf '%s\n' "${ratios[@]}" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
  echo
  echo "median ratio: $med (overhead $(awk -v m="$med" 'BEGIN { printf "%.1f", (m - 1) * 100 }') %), pairs $(minmax "${ratios[@]}")"
  echo
fi

if [[ " $PARTS " == *" recovery "* ]]; then
  ITERS_R=${ITERS_R:-$(calibrate_iters 6)}
  echo "## Recovery after SIGKILL of rank 1 (jacobi n=$N, $ITERS_R iterations, interval 0.5 s, $REPS runs)"
  echo
  echo "| run | kill → first rank resumed (s) | kill → all $RANKS resumed (s) | launcher: failure → all started (s) | work redone (s) | redone ≤ interval 0.5 s | same checksum |"
  echo "|---|---|---|---|---|---|---|"
  alls=()
  redos=()
  want=$("$BIN" run -n "$RANKS" "$J" -- --n "$N" --iters "$ITERS_R" 2>/dev/null | grep -o 'checksum=[^ ]*')
  for r in $(seq 1 "$REPS"); do
    d="$TMP/r$r"
    log="$TMP/r$r.log"
    : >"$log"
    "$BIN" run -n "$RANKS" --checkpoint-interval 0.5 --checkpoint-dir "$d" "$J" -- --n "$N" --iters "$ITERS_R" \
      > >(while IFS= read -r l; do echo "$(now) out $l"; done >>"$log") \
      2> >(while IFS= read -r l; do echo "$(now) err $l"; done >>"$log") &
    run=$!
    kill_t=""
    for _ in $(seq 1 6000); do
      e=$(cat "$d/COMMITTED" 2>/dev/null || echo 0)
      if [ "${e:-0}" -ge 2 ]; then
        pid=$(pgrep -f "examples/jacobi" | while read -r p; do
          if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx 'MUTIRAO_RANK=1'; then echo "$p"; fi
        done | head -1)
        if [ -n "$pid" ]; then
          sleep "$(awk -v s="$r$RANDOM" 'BEGIN { srand(s); printf "%.3f", rand() * 0.6 }')"
          # The commit record and its time just before the kill (a commit may land between
          # the two reads: then the restart names the later epoch, checked below).
          commit_e=$(cat "$d/COMMITTED" 2>/dev/null || echo 0)
          commit_t=$(stat -c %.9Y "$d/COMMITTED")
          kill_t=$(now)
          kill -9 "$pid"
          break
        fi
      fi
      sleep 0.005
    done
    wait "$run" || true
    sleep 0.2
    if [ -z "$kill_t" ]; then
      echo "| $r | (the job ended before the kill) | | | | | |"
      continue
    fi
    resumed=$(grep -m1 ' resumes at iteration' "$log" | awk '{print $1}')
    # The restart that finished: the last RANKS "resumes" lines (an earlier restart may have
    # failed too); its last line is the last rank back.
    last=$(grep ' resumes at iteration' "$log" | tail -n "$RANKS" | awk '{print $1}' | sort -g | tail -1)
    back=$(grep -o 'all started again [0-9.]* s' "$log" | awk '{print $4}' | head -1)
    got=$(grep -o 'checksum=[^ ]*' "$log" | tail -1)
    dt=$(awk -v a="$kill_t" -v b="${resumed:-0}" 'BEGIN { if (b == 0) print "none"; else printf "%.3f", b - a }')
    dall=$(awk -v a="$kill_t" -v b="${last:-0}" 'BEGIN { if (b == 0) print "none"; else printf "%.3f", b - a }')
    n_res=$(grep -c ' resumes at iteration' "$log" || true)
    [ "$n_res" -ge "$RANKS" ] || dall="none ($n_res of $RANKS resumed)"
    from=$(grep -o 'every rank from committed epoch [0-9]*' "$log" | head -1 | awk '{print $NF}')
    redo=$(awk -v a="$commit_t" -v b="$kill_t" 'BEGIN { printf "%.3f", b - a }')
    [ "${from:-x}" = "${commit_e:-y}" ] || redo="? (restart from epoch ${from:-none}, $commit_e read at the kill)"
    within=$(awk -v x="$redo" 'BEGIN { if (x !~ /^[0-9.]+$/) print "-"; else print (x <= 0.5 ? "yes" : "NO") }')
    [ "$redo" = "${redo#\?}" ] && redos+=("$redo")
    same=$([ "$got" = "$want" ] && echo yes || echo "NO ($got vs $want)")
    [ "$dall" = "${dall#none}" ] && alls+=("$dall")
    echo "| $r | $dt | $dall | ${back:-?} | $redo | $within | $same |"
  done
  echo
  [ "${#alls[@]}" -gt 0 ] && echo "kill → all ranks resumed: $(minmax "${alls[@]}") s over ${#alls[@]} runs (the issue asks ≤ 2 s + restart)"
  [ "${#redos[@]}" -gt 0 ] && echo "work redone: $(minmax "${redos[@]}") s over ${#redos[@]} runs (interval 0.5 s; the issue asks ≤ one interval)"
  echo
fi

if [[ " $PARTS " == *" ab "* ]]; then
  SCALE=${SCALE:-1}
  AB_N=${AB_N:-2048}
  PAIRS=${PAIRS:-5}
  RUN_S=${RUN_S:-$(awk -v s="$SCALE" 'BEGIN { print 120 * s }')}
  AB_INTERVAL=${AB_INTERVAL:-$(awk -v s="$SCALE" 'BEGIN { print 30 * s }')}
  # Size the runs from a calibration of about 2 % of a run (at least 20 iterations).
  cal=$(calibrate_iters 1 "$AB_N" 20)
  cal=$(awk -v c="$cal" -v r="$RUN_S" 'BEGIN { i = int(c * r / 50); print (i < 20 ? 20 : i) }')
  AB_ITERS=${AB_ITERS:-$(calibrate_iters "$RUN_S" "$AB_N" "$cal")}
  echo "## Checkpoint overhead at a ${AB_INTERVAL} s interval (jacobi n=$AB_N, $AB_ITERS iterations ≈ ${RUN_S} s, $RANKS ranks, $PAIRS interleaved pairs A B)"
  echo
  echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores (noise grows with it)"
  echo
  echo "| pair | A: without (s) | B: every ${AB_INTERVAL} s (s) | B / A | waves | median wave cost (s) | waves × cost / A |"
  echo "|---|---|---|---|---|---|---|"
  ratios=()
  for r in $(seq 1 "$PAIRS"); do
    t0=$(now)
    outa=$("$BIN" run -n "$RANKS" "$J" -- --n "$AB_N" --iters "$AB_ITERS" 2>/dev/null)
    t1=$(now)
    outb=$("$BIN" run -n "$RANKS" --checkpoint-interval "$AB_INTERVAL" --checkpoint-dir "$TMP/ab$r" "$J" -- --n "$AB_N" --iters "$AB_ITERS" 2>"$TMP/ab$r.err")
    t2=$(now)
    rm -rf "$TMP/ab$r"
    line=$(grep -o '[0-9]* checkpoint(s) committed, median cost [0-9.]* s' "$TMP/ab$r.err" || true)
    waves=$(awk '{print $1}' <<<"$line")
    cost=$(awk '{print $6}' <<<"$line")
    ca=$(grep -o 'checksum=[^ ]*' <<<"$outa" || echo "none")
    cb=$(grep -o 'checksum=[^ ]*' <<<"$outb" || echo "none")
    if [ "$ca" != "$cb" ]; then
      echo "pair $r: the checksums differ ($ca without, $cb with checkpoints)" >&2
      exit 1
    fi
    a=$(awk -v x="$t0" -v y="$t1" 'BEGIN { printf "%.3f", y - x }')
    b=$(awk -v x="$t1" -v y="$t2" 'BEGIN { printf "%.3f", y - x }')
    q=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.4f", b / a }')
    ratios+=("$q")
    est=$(awk -v w="${waves:-0}" -v c="${cost:-0}" -v a="$a" 'BEGIN { printf "%.2f %%", w * c / a * 100 }')
    echo "| $r | $a | $b | $q | ${waves:-0} | ${cost:-none} | $est |"
  done
  med=$(printf '%s\n' "${ratios[@]}" | sort -g | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else printf "%.4f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }')
  echo
  echo "median B / A: $med (overhead $(awk -v m="$med" 'BEGIN { printf "%.2f", (m - 1) * 100 }') %; the issue asks ≤ 5 %), pairs $(minmax "${ratios[@]}")"
  echo
fi
