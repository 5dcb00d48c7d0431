#!/usr/bin/env bash
# A local fleet for development: a three-replica TigerBeetle cluster and N
# `ratelimiterd` servers on it (the TigerBeetle backend), all on loopback, that
# behave as one limiter (docs/fleet.md).
#
# Usage:
#   scripts/fleet.sh start [N]    starts the cluster and N servers (default 2) on
#                                 consecutive ports from FLEET_PORT (default 8080)
#   scripts/fleet.sh stop         stops the servers, then the cluster
#   scripts/fleet.sh status       says what runs, and whether each server is healthy
#   scripts/fleet.sh env          prints `export RATELIMITERD_URL=URL,URL,...` (eval it)
#
# Each server has its own data directory (configuration, registry path, log)
# under $FLEET_DATA (default $CACHE/fleet); the cluster's files are in
# $FLEET_DATA/cluster. `start` builds target/release/ratelimiterd with
# `--features tigerbeetle` when it is missing or built without the feature
# (RATELIMITERD_BIN names another binary). Everything is idempotent: `start`
# on a running fleet starts only what is missing; `stop` on a stopped one does
# nothing.
#
# Environment: FLEET_PORT (first server port, default 8080), FLEET_DATA,
# TB_PORT (first replica port, default 3000), RATELIMITERD_BIN,
# CARGO_TARGET_DIR (where cargo builds, default target/).
set -euo pipefail

# The servers a fleet may have: ports are consecutive, and clients list at most
# 16 servers (HttpClientConfig::fleet).
readonly SERVERS_MAX=16
readonly SERVERS_DEFAULT=2
# Three replicas: the smallest cluster that survives the loss of one.
readonly REPLICAS=3
# How long `start` waits for a server to answer /healthz with 200.
readonly HEALTH_TIMEOUT_S=60
# How long `stop` waits for a server to exit after SIGTERM (its shutdown grace
# is 10 s by default) before it sends SIGKILL.
readonly STOP_TIMEOUT_S=15
# Timeout of one /healthz probe.
readonly PROBE_TIMEOUT_S=1

REPO_ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${RATELIMITER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ratelimiter}"
FLEET_DATA="${FLEET_DATA:-$CACHE/fleet}"
FLEET_PORT="${FLEET_PORT:-8080}"
TB_PORT="${TB_PORT:-3000}"
# scripts/tigerbeetle.sh reads TB_PORT and TB_DATA: the fleet's cluster lives
# apart from the one `scripts/tigerbeetle.sh start` makes on its own.
export TB_PORT TB_DATA="$FLEET_DATA/cluster"
TB_SCRIPT="$REPO_ROOT/scripts/tigerbeetle.sh"
TARGET_DIR="${CARGO_TARGET_DIR:-$REPO_ROOT/target}"
BIN="${RATELIMITERD_BIN:-$TARGET_DIR/release/ratelimiterd}"
# What `start` recorded: the number of servers and the first port.
STATE="$FLEET_DATA/fleet"

log() { echo "fleet.sh: $*" >&2; }
die() {
    log "error: $*"
    exit 1
}

usage() {
    sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

# Whether something listens on a loopback port.
listening() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Whether a server answers /healthz with 200 (the cluster reachable too).
healthy() {
    curl -fsS --max-time "$PROBE_TIMEOUT_S" "http://127.0.0.1:$1/healthz" >/dev/null 2>&1
}

server_dir() { echo "$FLEET_DATA/server-$1"; }

# The pid of server i when it runs, nothing otherwise.
server_pid() {
    local file
    file="$(server_dir "$1")/pid"
    [ -f "$file" ] || return 0
    local pid
    pid="$(cat "$file")"
    # A zombie (dead, not yet reaped by whoever adopted it) does not run.
    if kill -0 "$pid" 2>/dev/null && [ "$(ps -o stat= -p "$pid" | cut -c1)" != "Z" ]; then
        echo "$pid"
    fi
}

# The replica addresses as a YAML list.
replica_yaml() {
    local i list=""
    for ((i = 0; i < REPLICAS; i++)); do
        list="${list:+$list, }\"127.0.0.1:$((TB_PORT + i))\""
    done
    echo "[$list]"
}

# A release ratelimiterd with the TigerBeetle backend; built when missing or
# built without the feature (its check-config refuses backend: tigerbeetle).
ensure_binary() {
    local probe="$FLEET_DATA/probe.yaml"
    mkdir -p "$FLEET_DATA"
    printf 'server:\n  backend: tigerbeetle\n' >"$probe"
    if [ -x "$BIN" ] && "$BIN" --config "$probe" check-config >/dev/null 2>&1; then
        return 0
    fi
    [ -z "${RATELIMITERD_BIN:-}" ] || die "$BIN is missing or lacks --features tigerbeetle"
    log "building $BIN (release, --features tigerbeetle)"
    eval "$("$TB_SCRIPT" env)"
    (cd "$REPO_ROOT" && cargo build --release -p ratelimiterd --features tigerbeetle --bin ratelimiterd >&2)
    "$BIN" --config "$probe" check-config >/dev/null || die "$BIN does not accept backend: tigerbeetle"
}

ensure_cluster() {
    if [ -f "$TB_DATA/pids" ]; then
        local pid
        while read -r pid; do
            kill -0 "$pid" 2>/dev/null || die "the fleet's cluster lost replica pid $pid; run: $0 stop"
        done <"$TB_DATA/pids"
        log "cluster already running on $(cat "$TB_DATA/addresses")"
        return 0
    fi
    local i
    for ((i = 0; i < REPLICAS; i++)); do
        listening "$((TB_PORT + i))" && die "port $((TB_PORT + i)) is taken; set TB_PORT to a free range"
    done
    "$TB_SCRIPT" start "$REPLICAS" >/dev/null
}

start_server() {
    local i="$1" port="$2" dir pid
    dir="$(server_dir "$i")"
    if [ -n "$(server_pid "$i")" ]; then
        log "server $i already running on 127.0.0.1:$port"
        return 0
    fi
    listening "$port" && die "port $port is taken; set FLEET_PORT to a free range"
    mkdir -p "$dir"
    # Loopback only, like the replicas: no tokens are set in development.
    cat >"$dir/config.yaml" <<EOF
server:
  listen_addr: "127.0.0.1:$port"
  backend: tigerbeetle
registry:
  path: $dir/limits.json   # not used on TigerBeetle: the cluster keeps the definitions
tigerbeetle:
  cluster_id: "0"
  addresses: $(replica_yaml)
log:
  level: info
EOF
    nohup "$BIN" --config "$dir/config.yaml" >>"$dir/server.log" 2>&1 &
    pid=$!
    echo "$pid" >"$dir/pid"
    local tries
    for ((tries = 0; tries < HEALTH_TIMEOUT_S * 10; tries++)); do
        kill -0 "$pid" 2>/dev/null || die "server $i exited; see $dir/server.log"
        healthy "$port" && {
            log "server $i on http://127.0.0.1:$port (pid $pid, log $dir/server.log)"
            return 0
        }
        sleep 0.1
    done
    die "server $i did not become healthy in ${HEALTH_TIMEOUT_S}s; see $dir/server.log"
}

fleet_start() {
    local count="${1:-$SERVERS_DEFAULT}" i
    [[ "$count" =~ ^[0-9]+$ ]] && [ "$count" -ge 1 ] && [ "$count" -le "$SERVERS_MAX" ] ||
        die "start takes 1..$SERVERS_MAX servers, not $count"
    if [ -f "$STATE" ]; then
        local recorded port
        read -r recorded port <"$STATE"
        [ "$recorded" = "$count" ] && [ "$port" = "$FLEET_PORT" ] ||
            die "a fleet of $recorded server(s) from port $port is running; stop it first"
    fi
    command -v curl >/dev/null || die "curl is needed for the health checks"
    # The binary is looked for (and built) only when a server has to start.
    local missing=0
    for ((i = 0; i < count; i++)); do
        [ -n "$(server_pid "$i")" ] || missing=$((missing + 1))
    done
    [ "$missing" -eq 0 ] || ensure_binary
    ensure_cluster
    echo "$count $FLEET_PORT" >"$STATE"
    for ((i = 0; i < count; i++)); do
        start_server "$i" "$((FLEET_PORT + i))"
    done
    log "fleet of $count server(s) on one cluster of $REPLICAS replicas; stop with: $0 stop"
    fleet_env
}

fleet_stop() {
    local dir pid i tries
    for dir in "$FLEET_DATA"/server-*; do
        [ -f "$dir/pid" ] || continue
        pid="$(cat "$dir/pid")"
        if kill "$pid" 2>/dev/null; then
            for ((tries = 0; tries < STOP_TIMEOUT_S * 10; tries++)); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.1
            done
            kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
        fi
        rm -f "$dir/pid"
    done
    "$TB_SCRIPT" stop 2>/dev/null || true
    rm -f "$STATE"
    log "stopped"
}

fleet_status() {
    if [ ! -f "$STATE" ]; then
        echo "fleet: not running"
        return 0
    fi
    local count port i pid
    read -r count port <"$STATE"
    echo "cluster: $("$TB_SCRIPT" status)"
    for ((i = 0; i < count; i++)); do
        pid="$(server_pid "$i")"
        if [ -z "$pid" ]; then
            echo "server $i: http://127.0.0.1:$((port + i)) not running"
        elif healthy "$((port + i))"; then
            echo "server $i: http://127.0.0.1:$((port + i)) healthy (pid $pid)"
        else
            echo "server $i: http://127.0.0.1:$((port + i)) unhealthy (pid $pid; /healthz is not 200)"
        fi
    done
}

fleet_env() {
    [ -f "$STATE" ] || die "no fleet is running (start one: $0 start)"
    local count port i urls=""
    read -r count port <"$STATE"
    for ((i = 0; i < count; i++)); do
        urls="${urls:+$urls,}http://127.0.0.1:$((port + i))"
    done
    echo "export RATELIMITERD_URL=$urls"
}

case "${1:-}" in
start) fleet_start "${2:-$SERVERS_DEFAULT}" ;;
stop) fleet_stop ;;
status) fleet_status ;;
env) fleet_env ;;
*) usage ;;
esac
