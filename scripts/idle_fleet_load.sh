#!/usr/bin/env bash
# The cluster's load from N idle `ratelimiterd` servers (BENCHMARKS.md, "Idle fleet";
# docs/tigerbeetle-backend.md, "Periodic reads"): starts a one-replica cluster of its
# own and N servers on it with no traffic, lets their periodic reads settle, then
# counts for SECONDS what the servers send the replica by themselves:
#   - requests: the TCP data segments the servers' connections to the replica sent (on
#     loopback every request fits one segment), the same count for any server binary;
#   - the servers' own count, `ratelimiterd_tigerbeetle_requests_total`, when they
#     export it;
#   - the replica's CPU time (user + system, from /proc).
# One key is defined first, so that the log the servers read is not empty.
#
# Usage: scripts/idle_fleet_load.sh N [SECONDS]
#
# Environment: RATELIMITERD_BIN (default $CARGO_TARGET_DIR/debug/ratelimiterd, built
# with --features tigerbeetle), TB_PORT (the replica's port, default 3960),
# IDLE_PORT (first server port, default 18700).
set -euo pipefail

readonly SERVERS_MAX=32
# How long the servers run idle before counting: the log's reads back off within 1.4 s.
readonly SETTLE_S=5
readonly HEALTH_TIMEOUT_S=60
readonly ADMIN_TOKEN=idle-fleet-admin-token-0123456789

N="${1:?usage: scripts/idle_fleet_load.sh N [SECONDS]}"
MEASURE_S="${2:-20}"
[[ "$N" =~ ^[0-9]+$ && "$N" -ge 1 && "$N" -le "$SERVERS_MAX" ]] || {
    echo "N must be 1..$SERVERS_MAX" >&2
    exit 2
}
REPO_ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${RATELIMITERD_BIN:-${CARGO_TARGET_DIR:-$REPO_ROOT/target}/debug/ratelimiterd}"
PORT0="${IDLE_PORT:-18700}"
WORK="$(mktemp -d /tmp/idle-fleet-XXXXXX)"
export TB_PORT="${TB_PORT:-3960}" TB_DATA="$WORK/cluster"
PIDS=()

cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    "$REPO_ROOT/scripts/tigerbeetle.sh" stop >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

"$REPO_ROOT/scripts/tigerbeetle.sh" start 1 >/dev/null
REPLICA_PID="$(head -1 "$TB_DATA/pids")"

for i in $(seq 0 $((N - 1))); do
    dir="$WORK/server$i"
    mkdir -p "$dir"
    cat >"$dir/config.yaml" <<EOF
server:
  listen_addr: "127.0.0.1:$((PORT0 + i))"
  admin_token: $ADMIN_TOKEN
  client_tokens: [idle-fleet-client-token-0123456789]
  backend: tigerbeetle
registry:
  path: $dir/limits.json
tigerbeetle:
  cluster_id: "0"
  addresses: ["127.0.0.1:$TB_PORT"]
EOF
    "$BIN" --config "$dir/config.yaml" >"$dir/log" 2>&1 &
    PIDS+=("$!")
done
for i in $(seq 0 $((N - 1))); do
    deadline=$((SECONDS + HEALTH_TIMEOUT_S))
    until curl -sf "http://127.0.0.1:$((PORT0 + i))/healthz" >/dev/null; do
        [[ $SECONDS -lt $deadline ]] || {
            echo "server $i not healthy; log:" >&2
            cat "$WORK/server$i/log" >&2
            exit 1
        }
        sleep 0.2
    done
done
curl -sf -X PUT "http://127.0.0.1:$PORT0/v1/admin/limits" -H "authorization: Bearer $ADMIN_TOKEN" \
    -H 'content-type: application/json' \
    -d '{"key":"idle:demo:rpm","kind":"rolling","capacity":100,"window_seconds":60}' >/dev/null
sleep "$SETTLE_S"

# Data segments sent on every connection to the replica's port (only the servers connect).
segments() {
    ss -tinH dst "127.0.0.1:$TB_PORT" | grep -o 'data_segs_out:[0-9]*' | cut -d: -f2 |
        awk '{ s += $1 } END { print s + 0 }'
}
# The servers' own count of requests sent (0 when they do not export it).
requests() {
    local total=0 value
    for i in $(seq 0 $((N - 1))); do
        value="$(curl -sf "http://127.0.0.1:$((PORT0 + i))/metrics" |
            awk '$1 == "ratelimiterd_tigerbeetle_requests_total" { print $2 }')"
        total=$((total + ${value:-0}))
    done
    echo "$total"
}
# The replica's CPU time in clock ticks.
replica_ticks() { awk '{ print $14 + $15 }' "/proc/$REPLICA_PID/stat"; }

seg0="$(segments)" req0="$(requests)" cpu0="$(replica_ticks)" t0="$(date +%s.%N)"
sleep "$MEASURE_S"
seg1="$(segments)" req1="$(requests)" cpu1="$(replica_ticks)" t1="$(date +%s.%N)"
awk -v n="$N" -v s="$((seg1 - seg0))" -v r="$((req1 - req0))" -v c="$((cpu1 - cpu0))" \
    -v hz="$(getconf CLK_TCK)" -v t0="$t0" -v t1="$t1" 'BEGIN {
    d = t1 - t0
    printf "servers %d: %.2f requests/s to the cluster (segments), %.2f by the servers'"'"' metrics, ", n, s / d, r / d
    printf "%.2f per server; replica CPU %.1f ms/s over %.1f s\n", s / d / n, 1000 * c / hz / d, d
}'
