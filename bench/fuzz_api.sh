#!/usr/bin/env bash
# The coordinator's HTTP API fuzzed from its own OpenAPI document with schemathesis (issue 14:
# malformed requests get 4xx, never a 5xx or a crash). Starts a coordinator on a free loopback
# port with a throw-away database, token file and repository, runs schemathesis once as a user
# and once as an agent (each principal reaches different routes), and stops the coordinator
# (always, trap). Exit status: schemathesis's (0 = no check failed).
#
# Usage: bench/fuzz_api.sh [MAX_EXAMPLES]        (default 50 per operation)
# Env:   MUTIRAO=path (default $CARGO_TARGET_DIR or target, /release/mutirao, built if missing),
#        CHECKS=not_a_server_error,… (default: not_a_server_error,status_code_conformance,
#        content_type_conformance,response_schema_conformance), KEEP=dir (keep the scratch dir)
# Needs: schemathesis (`python3 -m pip install schemathesis`; installed here when missing).
set -euo pipefail
MAX=${1:-50}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${MUTIRAO:-${CARGO_TARGET_DIR:-$ROOT/target}/release/mutirao}
CHECKS=${CHECKS:-not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance}
if [[ ! -x $B ]]; then
    (cd "$ROOT" && cargo build --release -q -p mutirao-cli --bins)
fi
if ! command -v schemathesis >/dev/null; then
    python3 -m pip install -q schemathesis >&2
fi
if [[ -n ${KEEP:-} ]]; then W=$KEEP; mkdir -p "$W"; else W=$(mktemp -d); fi
PID=""
cleanup() {
    if [[ -n $PID ]]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
    if [[ -z ${KEEP:-} ]]; then rm -rf "$W"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

USER_TOKEN=$(head -c 24 /dev/urandom | base64 | tr -d '/+=')
AGENT_TOKEN=$(head -c 24 /dev/urandom | base64 | tr -d '/+=')
printf 'user fuzzer %s\nagent fuzzhost %s\n' "$USER_TOKEN" "$AGENT_TOKEN" >"$W/tokens"
chmod 600 "$W/tokens"
"$B" agent --gen-token "$W/agent.token" >/dev/null
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$B" coordinator --listen "127.0.0.1:$PORT" --db "$W/coord.sqlite" --tokens "$W/tokens" \
    --agent-token-file "$W/agent.token" >"$W/coord.log" 2>&1 &
PID=$!
for _ in $(seq 100); do
    if curl -sf "http://127.0.0.1:$PORT/openapi.json" >/dev/null 2>&1; then break; fi
    kill -0 "$PID" 2>/dev/null || { cat "$W/coord.log" >&2; exit 1; }
    sleep 0.1
done
# A job and a host for the generated requests to meet.
curl -sf -X POST -H "Authorization: Bearer $AGENT_TOKEN" -H 'content-type: application/json' \
    -d '{"name":"fuzzhost","addr":"127.0.0.1:7207","idle_cpu":1,"free_mem_mib":100,"load":0,"owner_active":false}' \
    "http://127.0.0.1:$PORT/agents/register" >/dev/null || true

STATUS=0
for who in user agent; do
    TOKEN=$USER_TOKEN
    [[ $who == agent ]] && TOKEN=$AGENT_TOKEN
    echo "== schemathesis as the $who principal ($MAX examples per operation)"
    schemathesis run "http://127.0.0.1:$PORT/openapi.json" \
        -H "Authorization: Bearer $TOKEN" --checks "$CHECKS" -n "$MAX" \
        --request-timeout 90 --report-dir "$W/report-$who" || STATUS=$?
done
if grep -q "panicked" "$W/coord.log"; then
    echo "the coordinator panicked:" >&2
    grep -A5 panicked "$W/coord.log" >&2
    STATUS=1
fi
kill -0 "$PID" 2>/dev/null || { echo "the coordinator died" >&2; STATUS=1; }
exit $STATUS
