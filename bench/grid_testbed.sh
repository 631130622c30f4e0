#!/usr/bin/env bash
# The grid's acceptance on the testbed (issue 14; digest 004 §15.1, §15.3, §15.6 check 3): a
# coordinator in the root namespace on the testbed's control address, five agents on two sites
# (a1-a4 in site a, b1 in site b), each inside its host's network namespace and CPU cgroup,
# registered with `--site`, with an owner policy and a program cache of its own. The
# coordinator's directory (database, repository, jobs) is hidden from every agent (a tmpfs
# over it in the agent's mount namespace), so agents can only run what they fetch from the
# repository by digest: no shared file system.
#
# Scenarios, each PASS or FAIL with its journal:
#   1 place   submit matmul -n 8 --require site=a: 8 ranks on the 4 hosts of site a (b1 refused,
#             why), the result correct (matmul checks C bit for bit)
#   2 kill    a host dies mid-job (every process of its cgroup SIGKILLed): with checkpoints the
#             run recovers from the last committed epoch on the other hosts; without, the job is
#             re-queued and runs again without that host
#   3 coord   the coordinator is killed (SIGKILL) mid-job and restarted on its database: it asks
#             the agents (their rank journals, in their heartbeats) what became of the run — its
#             ranks were killed with the launcher — and re-queues the job, which completes
#   3b coorddone  the coordinator is frozen (SIGSTOP) once a short job's ranks have connected; they
#             end (exit 0) while it cannot record it; it is killed and restarted: the agents
#             report every rank exited 0 and the job is finished without running again
#             (not in the default list: ask for it by name)
#   4 owner   the owner of a host running the job becomes active: a busy loop started inside the
#             host (its namespace and cgroup) loads it past the policy's max_load; the job is
#             suspended, then (past the grace period) vacated and resumed on other hosts
#   5 tamper  a1's cached copy of matmul is altered: a1 refuses the launch (journalled as a
#             refusal, not a lost host), the job is re-queued and finishes
#   6 spawn   rank 0 of the spawn example spawns copies of itself: they name the agent's cached
#             copy (…/sha256-<hex>), which every agent resolves by digest from its own cache
# Figures: submit → all 8 ranks started on 4 agents; the agents' repository downloads; grid
# time minus bare `mutirao run` time (same hosts, same agents) for 2, 4, 8 ranks, split into the
# upload, the agents' download (or cached-copy check), the ranks' barrier and connect.
#
# Usage: flock /tmp/mutirao-measure.lock sudo bench/grid_testbed.sh [SCENARIO…]   (default: all)
# Env:   N=1200 (matmul order for place and tamper), NL=1800 (kill, coord, owner), NF=200 (for the figures), RUNS=5 (figures),
#        MUTIRAO=path (default $CARGO_TARGET_DIR or target, /release/mutirao),
#        MATMUL=path (…/release/examples/matmul), SPAWN=path (…/release/examples/spawn),
#        KEEP=dir (keep the logs there)
set -euo pipefail
N=${N:-1200}
# Scenarios whose event (a host killed, the coordinator killed, an owner back) must land while
# the job still runs take a longer matmul: with 1200 a loaded machine let the job end first.
NL=${NL:-1800}
NF=${NF:-200}
RUNS=${RUNS:-5}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
T=${CARGO_TARGET_DIR:-$ROOT/target}
B=${MUTIRAO:-$T/release/mutirao}
MM=${MATMUL:-$T/release/examples/matmul}
SP=${SPAWN:-$T/release/examples/spawn}
SCENARIOS=("$@")
[ ${#SCENARIOS[@]} -gt 0 ] || SCENARIOS=(place kill coord owner tamper spawn figures)
[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces, cgroups, mounts): sudo $0" >&2; exit 2; }
for t in jq curl unshare ip; do
    command -v $t >/dev/null || { echo "needs $t" >&2; exit 2; }
done
if [[ ! -x $B || ! -x $MM ]]; then
    (cd "$ROOT" && cargo build --release -q -p mutirao-cli --bins && cargo build --release -q -p mutirao --example matmul)
fi
if [[ -n ${KEEP:-} ]]; then W=$KEEP; mkdir -p "$W"; else W=$(mktemp -d /tmp/mutirao-gridtb.XXXXXX); fi
NAME=gt$$
UP=""
COORD_PID=""
OWNER_PID=""
declare -A AGENT_PID
cleanup() {
    set +e
    [[ -n $OWNER_PID ]] && kill -9 "$OWNER_PID" 2>/dev/null
    [[ -n $COORD_PID ]] && kill -9 "$COORD_PID" 2>/dev/null && wait "$COORD_PID" 2>/dev/null
    for h in "${!AGENT_PID[@]}"; do kill -9 "${AGENT_PID[$h]}" 2>/dev/null; done
    # `down` kills whatever is left in the hosts' cgroups and namespaces (ranks included).
    [[ -n $UP ]] && "$B" testbed down "$NAME" --state-dir "$W/tb" >&2
    if [[ -z ${KEEP:-} ]]; then rm -rf "$W"; else echo "logs kept in $W" >&2; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now_ms() { date +%s%3N; }
say() { echo "== $*" >&2; }

cat >"$W/spec.toml" <<EOF
[[site]]
name = "a"
nic_mbit = 800
hosts = [ { name = "a1", cpu = 0.5 }, { name = "a2", cpu = 0.5 }, { name = "a3", cpu = 0.5 }, { name = "a4", cpu = 0.5 } ]

[[site]]
name = "b"
nic_mbit = 400
hosts = [ { name = "b1", cpu = 0.5 } ]

[[wan]]
sites = ["a", "b"]
mbit = 100
EOF
mkdir -p "$W/tb"
"$B" testbed up "$W/spec.toml" --name "$NAME" --state-dir "$W/tb" --no-agents >"$W/up.log" 2>&1 ||
    { cat "$W/up.log" >&2; exit 1; }
UP=1
STATE=$W/tb/$NAME.json
PREFIX=$(jq -r .prefix "$STATE")
HOSTS=(a1 a2 a3 a4 b1)
declare -A ADDR NS CG SITE
for h in "${HOSTS[@]}"; do
    ADDR[$h]=$(jq -r ".testbed.hosts[] | select(.name == \"$h\") | .addr" "$STATE")
    NS[$h]=$(jq -r ".testbed.hosts[] | select(.name == \"$h\") | .netns" "$STATE")
    CG[$h]=$(jq -r ".testbed.hosts[] | select(.name == \"$h\") | .cgroup" "$STATE")
    SITE[$h]=$(jq -r ".testbed.hosts[] | select(.name == \"$h\") | .site" "$STATE")
done
# The root end of site a's control link: every site's hosts route the control /26 to it.
CTL=$(ip -4 -o addr show dev "${PREFIX}c0" | awk '{ split($4, a, "/"); print a[1] }')
[[ -n $CTL ]] || { echo "no address on ${PREFIX}c0" >&2; exit 1; }
URL=http://$CTL:7210

# Principals: a user, and one agent token per host.
tok() { head -c 18 /dev/urandom | base64 | tr -d '/+='; }
ANA=$(tok)
declare -A ATOK
{
    echo "user ana $ANA"
    for h in "${HOSTS[@]}"; do ATOK[$h]=$(tok); echo "agent $h ${ATOK[$h]}"; done
} >"$W/grid.tokens"
"$B" agent --gen-token "$W/agent.token" >/dev/null
mkdir -p "$W/coord"

start_coord() {
    "$B" coordinator --listen "$CTL:7210" --db "$W/coord/coord.sqlite" --tokens "$W/grid.tokens" \
        --agent-token-file "$W/agent.token" --heartbeat-interval 1 >>"$W/coord.log" 2>&1 &
    COORD_PID=$!
    local t0=$SECONDS
    until curl -sf -o /dev/null "$URL/openapi.json"; do
        (( SECONDS - t0 < 20 )) || { cat "$W/coord.log" >&2; echo "the coordinator did not start" >&2; return 1; }
        sleep 0.1
    done
}

start_agent() { # host
    local h=$1
    mkdir -p "$W/agent-$h"
    # The owner's load is the CPU time of the host's processes that are not the grid's (the
    # agent's cgroup here): a host's 0.5 core busy with an owner's loop is well over 0.2.
    cat >"$W/agent-$h/owner.toml" <<EOF
max_load = 0.2
grace_s = 4
EOF
    # In the host's cgroup and network namespace, in a mount namespace of its own where the
    # coordinator's directory is an empty tmpfs.
    (
        echo "$BASHPID" >"${CG[$h]}/cgroup.procs"
        export MUTIRAO_COORD_TOKEN=${ATOK[$h]}
        exec ip netns exec "${NS[$h]}" unshare -m sh -c 'mount -t tmpfs hidden "$0" && exec "$@"' \
            "$W/coord" "$B" agent --listen "${ADDR[$h]}:7207" --token-file "$W/agent.token" --no-dir \
            --coordinator "$URL" --name "$h" --site "${SITE[$h]}" --resources "$W/tb/$NAME.meu" \
            --owner-policy "$W/agent-$h/owner.toml" \
            --program-cache "$W/agent-$h/programs" --store-dir "$W/agent-$h/store"
    ) >>"$W/agent-$h.log" 2>&1 &
    AGENT_PID[$h]=$!
    disown "$!"
}

# An owner: a busy loop inside the host, started the way its agent was (its cgroup, its network
# namespace). One at a time; stopped by stop_owner, and by the exit trap whatever happens.
start_owner() { # host
    local h=$1
    (
        echo "$BASHPID" >"${CG[$h]}/cgroup.procs"
        exec ip netns exec "${NS[$h]}" sh -c 'while :; do :; done'
    ) &
    OWNER_PID=$!
    disown "$!"
}
stop_owner() {
    [[ -n $OWNER_PID ]] && { kill -9 "$OWNER_PID" 2>/dev/null || true; }
    OWNER_PID=""
}

api() { curl -sf -H "Authorization: Bearer $ANA" "$URL$1"; }
alive_hosts() { api /hosts | jq -r '[.[] | select(.alive) | .report.name] | sort | join(" ")'; }
# Until every host named reports its owner away (owner "available").
wait_available() { # "names" seconds
    local t0=$SECONDS
    until [[ $(api /hosts | jq -r '[.[] | select(.alive and .report.owner == "available") | .report.name] | sort | join(" ")') == *"$1"* ]]; do
        (( SECONDS - t0 < $2 )) || { echo "not every one of $1 is available" >&2; return 1; }
        sleep 0.2
    done
}
wait_hosts() { # "names" seconds
    local t0=$SECONDS
    until [[ $(alive_hosts 2>/dev/null) == "$1" ]]; do
        (( SECONDS - t0 < $2 )) || { echo "hosts alive: $(alive_hosts), wanted $1" >&2; return 1; }
        sleep 0.2
    done
}
m() { MUTIRAO_COORD=$URL MUTIRAO_COORD_TOKEN=$ANA "$B" "$@"; }
state() { api "/jobs/$1" | jq -r .job.state; }
wait_state() { # id "states…" seconds
    local t0=$SECONDS s
    while :; do
        s=$(state "$1" 2>/dev/null || echo unreachable)
        [[ " $2 " == *" $s "* ]] && { echo "$s"; return 0; }
        (( SECONDS - t0 < $3 )) || { echo "$s"; return 1; }
        sleep 0.2
    done
}
journal() { m job "$1" | sed 's/^/    /'; }
# Where the job's ranks run now: the hosts named by the last "started on" of its journal.
job_hosts() { api "/jobs/$1" | jq -r '[.events[] | select(.kind == "state" and (.detail | startswith("started on ")))] | last | .detail | sub("started on "; "") | gsub(","; "")'; }
ok_result() { m logs "$1" | grep -q "matmul n=${3:-$N} ranks=$2 .* ok"; } # id ranks [order]
kill_host() { # every process of the host's cgroup (its agent and ranks): the host dies
    local h=$1 p
    for p in $(cat "${CG[$h]}/cgroup.procs"); do kill -9 "$p" 2>/dev/null || true; done
}
first_commit() { # id seconds: until the job's checkpoint directory has a committed epoch
    local t0=$SECONDS
    until [[ -s $W/coord/coord.sqlite.jobs/$1/ckpt/COMMITTED ]]; do
        (( SECONDS - t0 < $2 )) || return 1
        sleep 0.2
    done
}

declare -A RESULT
ORDER=()
verdict() { # name PASS|FAIL why
    RESULT[$1]="$2 $3"
    ORDER+=("$1")
    echo "$1: $2 $3"
}

start_coord
for h in "${HOSTS[@]}"; do start_agent "$h"; done
wait_hosts "a1 a2 a3 a4 b1" 30
say "testbed $NAME ($PREFIX): coordinator $URL, agents on ${ADDR[a1]} ${ADDR[a2]} ${ADDR[a3]} ${ADDR[a4]} (site a) ${ADDR[b1]} (site b)"

scenario_place() {
    # nic_mbit comes from the testbed's resource hierarchy (agent --resources), site from --site.
    say "1 place: matmul $N -n 8 --require 'site=a & nic_mbit>=800'"
    local id
    id=$(m submit -n 8 --require 'site=a & nic_mbit>=800' "$MM" "$N")
    local s
    s=$(wait_state "$id" "finished failed cancelled" 600) || true
    local hosts why
    hosts=$(job_hosts "$id")
    why=$(m job --why "$id")
    journal "$id"
    echo "$why" | sed 's/^/    /'
    if [[ $s == finished ]] && ok_result "$id" 8 && [[ $(echo "$hosts" | tr ' ' '\n' | sort | tr '\n' ' ') == "a1 a2 a3 a4 " ]] &&
        echo "$why" | grep -q 'b1: site is "b"'; then
        verdict place PASS "(8 ranks on $hosts; b1 refused: site b; result checked bit for bit)"
    else
        verdict place FAIL "(state $s, hosts $hosts)"
        m logs "$id" | tail -5 | sed 's/^/    /'
    fi
}

scenario_kill() {
    local mode id victim s
    for mode in ckpt rerun; do
        say "2 kill ($mode): matmul $NL -n 8, a host dies mid-job"
        if [[ $mode == ckpt ]]; then
            id=$(m submit -n 8 --checkpoint-interval 1 "$MM" "$NL")
        else
            id=$(m submit -n 8 "$MM" "$NL")
        fi
        wait_state "$id" "running checkpointing" 60 >/dev/null || true
        if [[ $mode == ckpt ]]; then
            first_commit "$id" 120 || say "no commit seen in the log; killing anyway"
        else
            sleep 2
        fi
        victim=$(job_hosts "$id" | awk '{ print $NF }')
        say "killing host $victim (agent and ranks)"
        kill_host "$victim"
        s=$(wait_state "$id" "finished failed cancelled" 600) || true
        journal "$id"
        local after
        if [[ $mode == ckpt ]]; then
            # The launcher restarted the ranks itself: its last "ranks on" note says where.
            after=$(api "/jobs/$id" | jq -r '[.events[] | select(.kind == "launcher" and (.detail | test("ranks on")))] | last | .detail | sub("^restart [0-9]+: ranks on "; "")')
        else
            after=$(job_hosts "$id")
        fi
        local how
        if [[ $mode == ckpt ]]; then
            how=$(m logs "$id" | grep -o "restart [0-9]* of [0-9]*: every rank from [^,;]*" | head -1)
        else
            how=$(api "/jobs/$id" | jq -r '[.events[] | select(.detail | startswith("re-queued"))] | last | .detail')
        fi
        # With checkpoints the journal shows the waves: checkpointing until each commit.
        local waves=ok
        if [[ $mode == ckpt ]] && ! api "/jobs/$id" | jq -e 'any(.events[]; .to == "checkpointing") and any(.events[]; .kind == "state" and (.detail | test("^epoch [0-9]+ committed$")))' >/dev/null; then
            waves="no checkpointing state in the journal"
        fi
        if [[ $s == finished ]] && ok_result "$id" 8 "$NL" && [[ -n $how && $how != null && $waves == ok ]]; then
            verdict "kill-$mode" PASS "(killed $victim; $how; last run on $after)"
        else
            verdict "kill-$mode" FAIL "(killed $victim; state $s; ${how:-no restart seen}; waves: $waves)"
            m logs "$id" | tail -8 | sed 's/^/    /'
        fi
        # The host comes back for the next scenarios.
        start_agent "$victim"
        wait_hosts "a1 a2 a3 a4 b1" 30 || true
    done
}

scenario_coord() {
    say "3 coord: matmul $NL -n 4, the coordinator is killed mid-job and restarted"
    local id s
    id=$(m submit -n 4 "$MM" "$NL")
    wait_state "$id" "running" 60 >/dev/null || true
    sleep 2
    kill -9 "$COORD_PID"; wait "$COORD_PID" 2>/dev/null || true
    say "coordinator killed; restarting it on its database"
    start_coord
    s=$(wait_state "$id" "finished failed cancelled" 600) || true
    journal "$id"
    local why
    why=$(api "/jobs/$id" | jq -r '[.events[] | select(.to == "recovering" and (.detail | startswith("the agents report")))] | first | .detail // ""')
    if [[ $s == finished ]] && ok_result "$id" 4 "$NL" &&
        api "/jobs/$id" | jq -e '[.events[] | select(.kind == "reconcile" and (.detail | contains("coordinator restarted")))] | length > 0' >/dev/null &&
        [[ -n $why ]]; then
        verdict coord PASS "(reconciled with the agents at the restart: $why; re-queued, finished with a correct result)"
    else
        verdict coord FAIL "(state $s)"
        m logs "$id" | tail -5 | sed 's/^/    /'
    fi
}

# Every rank of job $1 journalled by the agents (their state directories) has exited 0, and
# there are $2 of them.
ranks_exited_0() {
    local n
    n=$(cat "$W"/agent-*/programs/ranks.json 2>/dev/null |
        jq -s --argjson id "$1" '[.[].entries[] | select(.label.job == $id)] | if all(.code == 0) then length else -1 end')
    [[ $n == "$2" ]]
}

scenario_coorddone() {
    say "3b coorddone: matmul $N -n 4; the coordinator is frozen once the ranks have connected, killed after they exited 0, restarted"
    local id s t0
    id=$(m submit -n 4 "$MM" "$N")
    t0=$SECONDS
    until api "/jobs/$id" | jq -e 'any(.events[]; .kind == "init")' >/dev/null; do
        (( SECONDS - t0 < 60 )) || break
        sleep 0.05
    done
    kill -STOP "$COORD_PID"
    say "coordinator frozen; waiting for the agents to journal the ranks' exits"
    t0=$SECONDS
    until ranks_exited_0 "$id" 4; do
        (( SECONDS - t0 < 120 )) || break
        sleep 0.2
    done
    local exited=no
    ranks_exited_0 "$id" 4 && exited=yes
    kill -9 "$COORD_PID"; wait "$COORD_PID" 2>/dev/null || true
    say "coordinator killed (ranks exited 0: $exited); restarting it on its database"
    start_coord
    s=$(wait_state "$id" "finished failed cancelled" 120) || true
    journal "$id"
    local runs fin
    runs=$(api "/jobs/$id" | jq -r '[.events[] | select(.kind == "run")] | length')
    fin=$(api "/jobs/$id" | jq -r '[.events[] | select(.to == "finished")] | last | .detail // ""')
    if [[ $exited == yes && $s == finished && $runs == 1 && $fin == *"exited 0"* ]]; then
        verdict coorddone PASS "(the agents reported every rank exited 0: finished without a second run)"
    else
        verdict coorddone FAIL "(ranks exited 0 before the kill: $exited; state $s; runs $runs; $fin)"
    fi
}

scenario_owner() {
    say "4 owner: matmul $NL -n 2 --require site=a; the owner of its first host comes back and stays"
    local id s h before after t_owner
    id=$(m submit -n 2 --require 'site=a' "$MM" "$NL")
    wait_state "$id" "running" 60 >/dev/null || true
    sleep 1
    before=$(job_hosts "$id")
    h=${before%% *}
    t_owner=$(now_ms)
    start_owner "$h"
    local sus vac
    sus=$(wait_state "$id" "suspended" 30) || true
    local t_sus
    t_sus=$(now_ms)
    s=$(wait_state "$id" "finished failed cancelled" 600) || true
    stop_owner
    local why
    why=$(api "/jobs/$id" | jq -r '[.events[] | select(.detail | startswith("owner active on"))] | first | .detail // "" | sub("^owner active on [^ ]+ [(]"; "") | sub("[)]: its agent.*"; "")')
    after=$(job_hosts "$id")
    vac=$(api "/jobs/$id" | jq -r '[.events[] | select(.detail | startswith("re-queued after vacating"))] | length')
    journal "$id"
    if [[ $sus == suspended && $vac -ge 1 && $s == finished ]] && ok_result "$id" 2 "$NL" && [[ " $after " != *" $h "* ]]; then
        verdict owner PASS "(owner's loop on $h: suspended $(( t_sus - t_owner )) ms after ($why), vacated; ran on $before, resumed on $after)"
    else
        verdict owner FAIL "(owner's loop on $h; suspended? $sus ($why); vacated $vac; state $s; ran on $before, then $after)"
    fi
}

scenario_tamper() {
    say "5 tamper: the cached matmul on a1 is altered; matmul $N -n 4 --require site=a"
    local digest f id s
    digest=$(sha256sum "$MM" | awk '{ print $1 }')
    f=$W/agent-a1/programs/sha256-$digest
    [[ -f $f ]] || m submit -n 1 --require 'name=a1' "$MM" 10 >/dev/null
    local t0=$SECONDS
    until [[ -f $f ]] || (( SECONDS - t0 > 60 )); do sleep 0.2; done
    printf '#!/bin/sh\necho tampered\n' >"$f"
    wait_available "a1 a2 a3 a4" 30 || true
    id=$(m submit -n 4 --require 'site=a' "$MM" "$N")
    s=$(wait_state "$id" "finished failed cancelled" 600) || true
    journal "$id"
    # A refusal is not a lost host: a1 stays eligible (it removed the altered copy and fetches a
    # fresh one if the job is placed there again).
    if [[ $s == finished ]] && ok_result "$id" 4 && ! m logs "$id" | grep -q tampered &&
        api "/jobs/$id" | jq -e '[.events[] | select(.detail | contains("altered on this host"))] | length > 0' >/dev/null &&
        api "/jobs/$id" | jq -e '[.events[] | select(.kind == "refused" and (.detail | startswith("a1 refused the launch")))] | length > 0' >/dev/null &&
        api "/jobs/$id" | jq -e '[.events[] | select(.kind == "host-lost")] | length == 0' >/dev/null; then
        verdict tamper PASS "(a1 refused its altered copy, journalled as a refusal, not a lost host; the job ran on $(job_hosts "$id"))"
    else
        verdict tamper FAIL "(state $s; last run on $(job_hosts "$id"))"
    fi
}

scenario_spawn() {
    say "6 spawn: $SP -n 2 --add 4 --rounds 2 (rank 0 spawns itself: the children name the agent's cached copy)"
    [[ -x $SP ]] || { verdict spawn FAIL "(no spawn example at $SP)"; return; }
    wait_available "a1 a2 a3 a4" 30 || true
    local id s
    id=$(m submit -n 2 --require 'site=a' "$SP" --add 4 --rounds 2)
    s=$(wait_state "$id" "finished failed cancelled" 300) || true
    journal "$id"
    m logs "$id" | sed 's/^/    /' | head -8
    # Every agent that ran a child resolved the parent's cache path by its digest.
    local resolved
    resolved=$(grep -l "programs/sha256-[0-9a-f]*\" is sha256:" "$W"/agent-*.log 2>/dev/null | wc -l)
    if [[ $s == finished ]] && m logs "$id" | grep -q "request -> first message"; then
        verdict spawn PASS "(children started from the agents' caches; $resolved agent(s) resolved a cached path by digest)"
    else
        verdict spawn FAIL "(state $s)"
    fi
}

# Figures (digest 004 §15.6 check 3): grid time (submit → finished, as a user sees it) against a
# bare `mutirao run` on the same agents, matmul NF, 2/4/8 ranks, RUNS interleaved runs, the
# difference split into its parts: the agents' repository download (or check of their cached
# copy), the ranks' address-exchange barrier and their connect (registration with the launcher
# and the mesh), each the maximum over the ranks as the runtime reports it (`mutirao run
# --init-timings`; the coordinator journals the same as an `init` event); and submit → all 8
# ranks running on 4 agents, from the ranks' own clock (a probe program that prints the time it
# starts), first run (each agent downloads the probe) and later ones.
INIT_RE='s/.*init of [0-9]* ranks, max over ranks: register \([0-9.]*\) ms, address exchange \([0-9.]*\) ms, connect \([0-9.]*\) ms; all connected \([0-9.]*\) ms.*/\1 \2 \3 \4/p'
scenario_figures() {
    say "figures: matmul $NF, grid against bare mutirao run on a1-a4, 2 4 8 ranks, $RUNS runs"
    local hf=$W/hosts.a
    for h in a1 a2 a3 a4; do echo "${ADDR[$h]} slots=2 port=7207"; done >"$hf"
    printf '#!/bin/sh\necho "up $(date +%%s%%3N)"\n' >"$W/probe.sh"
    wait_available "a1 a2 a3 a4" 30 || true
    : >"$W/bare.t"; : >"$W/grid.t"; : >"$W/probe.t"
    local n r t0 t1 t2 id up init dl h
    declare -A LC
    for r in $(seq "$RUNS"); do
        t0=$(now_ms)
        id=$(m submit -n 8 --require 'site=a' "$W/probe.sh" 2>/dev/null)
        m logs --follow "$id" >"$W/probe.out" 2>&1 || true
        up=$(grep -c '^\[[0-9]*\] up ' "$W/probe.out" || true)
        t1=$(sed -n 's/^\[[0-9]*\] up //p' "$W/probe.out" | sort -n | tail -1)
        echo "$r $(( ${t1:-0} - t0 )) $up $(job_hosts "$id")" >>"$W/probe.t"
        for n in 2 4 8; do
            t0=$(now_ms)
            "$B" run --init-timings --hostfile "$hf" --token-file "$W/agent.token" -n "$n" "$MM" "$NF" >"$W/bare.out" 2>&1 ||
                cat "$W/bare.out" >&2
            t1=$(now_ms)
            grep -q " ok" "$W/bare.out" || echo "bare run of $n ranks: no ok" >&2
            init=$(sed -n "$INIT_RE" "$W/bare.out" | tail -1)
            echo "$n $(( t1 - t0 )) ${init:-nan nan nan nan}" >>"$W/bare.t"
            for h in a1 a2 a3 a4; do LC[$h]=$(wc -l <"$W/agent-$h.log"); done
            t0=$(now_ms)
            id=$(m submit -n "$n" --require 'site=a' "$MM" "$NF" 2>/dev/null)
            t1=$(now_ms)
            m logs --follow "$id" >"$W/grid.out" 2>&1 || true
            t2=$(now_ms)
            grep -q " ok" "$W/grid.out" || echo "grid run of $n ranks: no ok" >&2
            api "/jobs/$id" >"$W/grid.json"
            init=$(jq -r '[.events[] | select(.kind == "init")] | last | .detail // ""' "$W/grid.json" | sed -n "$INIT_RE")
            # The rest's timeline, from the journal's timestamps (the coordinator runs on this
            # machine's clock): stored → started (placement, the program's read and check, its
            # copy: the `start` event's own timings), started → the launch began (the init
            # event's time minus its "all connected … after the launch began"), all connected →
            # finished, finished → `mutirao logs --follow` returned.
            tl=$(jq -r --argjson t2 "$t2" '
                def at(f): [.events[] | select(f)] | last | .at_ms;
                (.job.created_ms) as $c
                | at(.kind == "state" and (.detail | startswith("started on "))) as $s
                | at(.kind == "init") as $i
                | ([.events[] | select(.kind == "init")] | last | .detail | capture("all connected (?<a>[0-9.]+) ms") | .a | tonumber) as $a
                | at(.kind == "state" and .to == "finished") as $f
                | ([.events[] | select(.kind == "start")] | last | .detail | [scan("[0-9.]+ ms") | sub(" ms"; "")] | join(" ")) as $st
                | "\($s - $c) \($st) \(($i - $a) - $s) \($f - $i) \($t2 - $f)"' "$W/grid.json" 2>/dev/null)
            # The agents' time to have the program ready (download, or check of the cached copy).
            dl=$(for h in a1 a2 a3 a4; do
                tail -n +"$(( ${LC[$h]} + 1 ))" "$W/agent-$h.log" |
                    grep -E '(fetched|checked the cached) sha256:' | sed -n 's/.* in \([0-9.]*\) ms$/\1/p'
            done | sort -g | tail -1)
            echo "$n $(( t2 - t0 )) $(( t1 - t0 )) ${init:-nan nan nan nan} ${dl:-0} ${tl:-nan nan nan nan nan nan nan}" >>"$W/grid.t"
        done
    done
    med() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
    col() { awk -v n="$2" -v c="$3" '$1 == n { print $c }' "$1" | med; }
    echo
    echo "submit → all 8 ranks running on 4 agents (probe; run, ms, ranks up, hosts):"
    sed 's/^/    /' "$W/probe.t"
    echo
    echo "| ranks | bare mutirao run | grid submit → finished | grid − bare | of which submit (upload) | download / cached check (agents' max) | barrier: address exchange, grid − bare | connect: register + mesh, grid − bare | rest |"
    echo "|---|---|---|---|---|---|---|---|---|"
    for n in 2 4 8; do
        local b g u d br xb bc gr ge gc dx dc rest
        b=$(col "$W/bare.t" $n 2); g=$(col "$W/grid.t" $n 2); u=$(col "$W/grid.t" $n 3)
        br=$(col "$W/bare.t" $n 3); xb=$(col "$W/bare.t" $n 4); bc=$(col "$W/bare.t" $n 5)
        gr=$(col "$W/grid.t" $n 4); ge=$(col "$W/grid.t" $n 5); gc=$(col "$W/grid.t" $n 6)
        d=$(col "$W/grid.t" $n 8)
        read -r dx dc rest < <(awk -v b="$b" -v g="$g" -v u="$u" -v d="$d" -v br="$br" -v xb="$xb" -v bc="$bc" \
            -v gr="$gr" -v ge="$ge" -v gc="$gc" 'BEGIN {
                x = ge - xb; c = (gr + gc) - (br + bc)
                printf "%.1f %.1f %.0f\n", x, c, (g - b) - u - d - x - c }')
        echo "| $n | $b ms | $g ms | $(( g - b )) ms | $u ms | $d ms | $dx ms | $dc ms | $rest ms |"
    done
    echo
    echo "the runtime's phases, medians, ms (max over ranks; grid / bare):"
    echo "| ranks | register | address exchange | connect | launch → all connected |"
    echo "|---|---|---|---|---|"
    for n in 2 4 8; do
        echo "| $n | $(col "$W/grid.t" $n 4) / $(col "$W/bare.t" $n 3) | $(col "$W/grid.t" $n 5) / $(col "$W/bare.t" $n 4) | $(col "$W/grid.t" $n 6) / $(col "$W/bare.t" $n 5) | $(col "$W/grid.t" $n 7) / $(col "$W/bare.t" $n 6) |"
    done
    echo
    echo "the rest's timeline, medians, ms (from the job's journal; the coordinator's own timings in its start event):"
    echo "| ranks | stored → started | of which placement / program read + check / copy | started → launch began | launch → all connected (grid / bare) | all connected → finished (grid) | bare: all of the run but launch → all connected | finished → logs --follow returned |"
    echo "|---|---|---|---|---|---|---|---|"
    for n in 2 4 8; do
        echo "| $n | $(col "$W/grid.t" $n 9) | $(col "$W/grid.t" $n 10) / $(col "$W/grid.t" $n 11) / $(col "$W/grid.t" $n 12) | $(col "$W/grid.t" $n 13) | $(col "$W/grid.t" $n 7) / $(col "$W/bare.t" $n 6) | $(col "$W/grid.t" $n 14) | $(awk -v n=$n '$1 == n { print $2 - $6 }' "$W/bare.t" | med) | $(col "$W/grid.t" $n 15) |"
    done
    echo "(medians of $RUNS, each column separately, so the parts need not add up; matmul $NF on a1-a4, 2 slots each."
    echo " rest = grid − bare − upload − download − Δbarrier − Δconnect: placement, the program's copy in the job's"
    echo " directory, the launch through the agents, the log's long poll. The agents check their copies in parallel,"
    echo " and an agent's slower check also delays its ranks' arrival at the barrier, so the parts can overlap.)"
    echo "repository downloads by the agents (first use of each program on each host):"
    grep -h "fetched sha256" "$W"/agent-*.log | sed 's/^mutirao agent: /    /' || true
}

for s in "${SCENARIOS[@]}"; do
    "scenario_$s" || verdict "$s" FAIL "(the scenario itself failed)"
done
echo
echo "summary:"
for s in "${ORDER[@]}"; do echo "  $s: ${RESULT[$s]}"; done
fails=0
for s in "${ORDER[@]}"; do [[ ${RESULT[$s]} == PASS* ]] || fails=$((fails + 1)); done
exit $(( fails > 0 ))
