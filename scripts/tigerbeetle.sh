#!/usr/bin/env bash
# The TigerBeetle toolchain of this project: the Zig compiler the Rust client
# needs, the server binary of the exact version the client speaks, and a local
# cluster on loopback for development.
#
# Usage:
#   scripts/tigerbeetle.sh path            prints the server binary, building it when missing
#   scripts/tigerbeetle.sh zig-path        prints the Zig binary, installing it when missing
#   scripts/tigerbeetle.sh env             prints `export` lines for the client build (eval them)
#   scripts/tigerbeetle.sh start [1|3]     starts a local cluster of 1 (default) or 3 replicas
#   scripts/tigerbeetle.sh stop            stops the local cluster started by `start`
#   scripts/tigerbeetle.sh status          says whether the local cluster runs, and where
#   scripts/tigerbeetle.sh faketime-lib    prints libfaketime's library, installing it when missing
#                                          (the clock-step tests preload it into ratelimiterd)
#
# Everything is cached outside the repository, in
# ${RATELIMITER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ratelimiter}, so a machine
# builds the server once. Every step is idempotent and fast when cached.
#
# Environment: TB_PORT (first port of `start`, default 3000), TB_DATA (data
# directory of `start`, default $CACHE/cluster).
set -euo pipefail

# The client crate pins TigerBeetle 0.16.78; client and cluster versions must
# match exactly, so the server is built from the same vendored tree.
readonly TB_RELEASE="0.16.78"
readonly TB_COMMIT="c3d9b09dc88e94dde9ac915c6e94a4c650332080"
readonly TB_CLIENT_CRATE="tigerbeetle-unofficial-sys"
readonly TB_CLIENT_CRATE_VERSION="0.14.28+${TB_RELEASE}"
# The vendored build scripts are written for this Zig release exactly.
readonly ZIG_VERSION="0.14.1"
# The cluster id of the local development cluster (decisions: cluster 0 for dev).
readonly TB_CLUSTER="0"
# The start flags of development replicas (see cluster_start).
readonly TB_START_FLAGS="--development --cache-grid=256MiB --experimental --limit-request=1MiB --limit-pipeline-requests=24"
# How long `start` waits for a replica to listen before giving up.
readonly START_TIMEOUT_S=60

REPO_ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${RATELIMITER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ratelimiter}"
TB_DIR="$CACHE/tigerbeetle-$TB_RELEASE"
TB_BIN="$TB_DIR/bin/tigerbeetle"
ZIG_VENV="$CACHE/zig-$ZIG_VERSION"
DATA_DIR="${TB_DATA:-$CACHE/cluster}"
PORT_BASE="${TB_PORT:-3000}"

log() { echo "tigerbeetle.sh: $*" >&2; }
die() {
    log "error: $*"
    exit 1
}

# Runs a command as root: directly when we are root, through sudo otherwise.
as_root() {
    if [ "$(id -u)" = "0" ]; then "$@"; else sudo "$@"; fi
}

# Holds the cache's install lock until this script exits: builds and installs
# into the shared cache are not safe to run twice at once (parallel test runs or
# worktrees would delete each other's half-built tree), so the second waits and
# then finds the first one's result.
install_lock() {
    mkdir -p "$CACHE"
    exec 9>"$CACHE/.install.lock"
    flock 9
}

# Installs Debian packages that are missing; one `apt-get update` at most.
apt_ensure() {
    local missing=()
    local pkg
    for pkg in "$@"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    [ "${#missing[@]}" -eq 0 ] && return 0
    command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them"
    log "installing ${missing[*]} with apt-get"
    # Another test run may be installing at the same moment: wait for dpkg's
    # lock rather than fail on it.
    as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
    as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}" >&2
}

# The Zig compiler from PyPI's `ziglang` wheel, in a venv of our cache.
zig_path() {
    local zig
    zig="$(ls "$ZIG_VENV"/lib/python3*/site-packages/ziglang/zig 2>/dev/null | head -n1 || true)"
    if [ -n "$zig" ] && [ -x "$zig" ] && [ "$("$zig" version)" = "$ZIG_VERSION" ]; then
        echo "$zig"
        return 0
    fi
    install_lock
    zig="$(ls "$ZIG_VENV"/lib/python3*/site-packages/ziglang/zig 2>/dev/null | head -n1 || true)"
    if [ -n "$zig" ] && [ -x "$zig" ] && [ "$("$zig" version)" = "$ZIG_VERSION" ]; then
        echo "$zig"
        return 0
    fi
    if ! command -v python3 >/dev/null || ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
        apt_ensure python3 python3-venv
    fi
    log "installing ziglang==$ZIG_VERSION into $ZIG_VENV"
    rm -rf "$ZIG_VENV"
    mkdir -p "$CACHE"
    python3 -m venv "$ZIG_VENV" >&2
    "$ZIG_VENV/bin/pip" install --quiet --disable-pip-version-check "ziglang==$ZIG_VERSION" >&2
    zig="$(ls "$ZIG_VENV"/lib/python3*/site-packages/ziglang/zig | head -n1)"
    [ "$("$zig" version)" = "$ZIG_VERSION" ] || die "zig at $zig is not $ZIG_VERSION"
    echo "$zig"
}

# What the client crate's build script needs: Zig, and libclang for bindgen.
client_env() {
    apt_ensure libclang-dev
    echo "export ZIG_PATH=$(printf '%q' "$(zig_path)")"
}

# The vendored TigerBeetle tree inside the client crate's source, which cargo
# downloads on demand. It is read-only in spirit: builds use a copy.
vendored_tree() {
    local dir
    dir="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"$TB_CLIENT_CRATE-$TB_CLIENT_CRATE_VERSION" \
        2>/dev/null | head -n1 || true)"
    if [ -z "$dir" ]; then
        (cd "$REPO_ROOT" && cargo fetch --quiet >&2)
        dir="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"$TB_CLIENT_CRATE-$TB_CLIENT_CRATE_VERSION" \
            2>/dev/null | head -n1 || true)"
    fi
    [ -n "$dir" ] && [ -f "$dir/tigerbeetle/build.zig" ] || die "cannot find the vendored tree of $TB_CLIENT_CRATE"
    echo "$dir/tigerbeetle"
}

# The server binary, built from the vendored tree when not cached yet.
server_path() {
    if [ -x "$TB_BIN" ] && "$TB_BIN" version 2>/dev/null | grep -q "$TB_RELEASE"; then
        echo "$TB_BIN"
        return 0
    fi
    local zig src build
    zig="$(zig_path)"
    install_lock
    if [ -x "$TB_BIN" ] && "$TB_BIN" version 2>/dev/null | grep -q "$TB_RELEASE"; then
        echo "$TB_BIN"
        return 0
    fi
    src="$(vendored_tree)"
    build="$TB_DIR/build"
    log "building the TigerBeetle $TB_RELEASE server (a few minutes, once per machine)"
    rm -rf "$build"
    mkdir -p "$build" "$TB_DIR/bin"
    cp -R "$src/." "$build/"
    chmod -R u+w "$build"
    (
        cd "$build"
        # The build script treats CI=true as a request for extra CI checks.
        env -u CI "$zig" build -Drelease "-Dconfig-release=$TB_RELEASE" \
            "-Dconfig-release-client-min=$TB_RELEASE" "-Dgit-commit=$TB_COMMIT" >&2
    )
    install -m 0755 "$build/tigerbeetle" "$TB_BIN.tmp"
    mv "$TB_BIN.tmp" "$TB_BIN"
    rm -rf "$build"
    "$TB_BIN" version | grep -q "$TB_RELEASE" || die "built binary does not report $TB_RELEASE"
    echo "$TB_BIN"
}

addresses_of() {
    local count="$1" i list=""
    for ((i = 0; i < count; i++)); do
        list="${list:+$list,}127.0.0.1:$((PORT_BASE + i))"
    done
    echo "$list"
}

# Waits until something listens on a loopback port, bounded by START_TIMEOUT_S.
wait_port() {
    local port="$1" pid="$2" i
    for ((i = 0; i < START_TIMEOUT_S * 10; i++)); do
        kill -0 "$pid" 2>/dev/null || return 1
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

cluster_start() {
    local count="${1:-1}" bin addresses i file pid
    [ "$count" = "1" ] || [ "$count" = "3" ] || die "start takes 1 or 3 replicas, not $count"
    if [ -f "$DATA_DIR/pids" ]; then
        log "a cluster is already running (see: $0 status); stop it first"
        exit 1
    fi
    bin="$(server_path)"
    addresses="$(addresses_of "$count")"
    mkdir -p "$DATA_DIR"
    : >"$DATA_DIR/pids.tmp"
    for ((i = 0; i < count; i++)); do
        file="$DATA_DIR/0_$i.tigerbeetle"
        rm -f "$file"
        "$bin" format "--cluster=$TB_CLUSTER" "--replica=$i" "--replica-count=$count" --development \
            "$file" >"$DATA_DIR/replica-$i.log" 2>&1
        # Loopback only: TigerBeetle has no authentication. A smaller grid cache
        # saves a gigabyte; --development would also cap requests at 32 KiB and
        # queue no request beyond the 8 in the pipeline (a 9th client session
        # then never gets an answer), so both limits are set to production's.
        nohup "$bin" start "--addresses=$addresses" $TB_START_FLAGS "$file" \
            >>"$DATA_DIR/replica-$i.log" 2>&1 &
        pid=$!
        echo "$pid" >>"$DATA_DIR/pids.tmp"
    done
    mv "$DATA_DIR/pids.tmp" "$DATA_DIR/pids"
    echo "$addresses" >"$DATA_DIR/addresses"
    i=0
    while read -r pid; do
        wait_port "$((PORT_BASE + i))" "$pid" || {
            cluster_stop
            die "replica $i did not start; see $DATA_DIR/replica-$i.log"
        }
        i=$((i + 1))
    done <"$DATA_DIR/pids"
    log "cluster $TB_CLUSTER of $count replica(s) on $addresses; stop with: $0 stop"
    echo "TB_ADDRESSES=$addresses"
}

cluster_stop() {
    local pid
    if [ ! -f "$DATA_DIR/pids" ]; then
        log "no cluster is running"
        return 0
    fi
    while read -r pid; do
        kill "$pid" 2>/dev/null || true
    done <"$DATA_DIR/pids"
    # `start` formats anew, so the data files (a gigabyte each) go now.
    local i
    for ((i = 0; i < START_TIMEOUT_S * 10; i++)); do
        pgrep -F "$DATA_DIR/pids" >/dev/null 2>&1 || break
        sleep 0.1
    done
    rm -f "$DATA_DIR/pids" "$DATA_DIR/addresses" "$DATA_DIR"/*.tigerbeetle
    log "stopped"
}

cluster_status() {
    if [ -f "$DATA_DIR/pids" ]; then
        echo "running on $(cat "$DATA_DIR/addresses") (pids: $(tr '\n' ' ' <"$DATA_DIR/pids"))"
    else
        echo "not running"
    fi
}

case "${1:-}" in
path) server_path ;;
zig-path) zig_path ;;
env) client_env ;;
start) cluster_start "${2:-1}" ;;
stop) cluster_stop ;;
status) cluster_status ;;
faketime-lib)
    apt_ensure libfaketime
    dpkg -L libfaketime | grep '/libfaketime\.so\.1$' | head -n1
    ;;
*)
    sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
