#!/usr/bin/env bash
# Every command and configuration README.md shows is run here, so that none can
# go stale (a build line that does not build what the next line runs, a sentence
# pointing at the wrong block, a configuration the server refuses). Called by
# scripts/test.sh after the cargo tests; docs/testing.md, "The README's commands".
#
# Each fenced block of README.md is handled by its language:
# - ```sh, ```bash, ```console: run whole by `bash -euo pipefail` in a fresh
#   temporary directory, in a session of its own, with the mappings below. Every
#   process the block leaves running is stopped when it ends. The run fails if a
#   command fails, if the block does not end within BLOCK_TIMEOUT_S, or if its
#   output holds a WARN line (a server logging a warning at start means the
#   example is not one to copy).
# - ```yaml: written to a file and checked by `ratelimiterd check-config`, with
#   every variable an `*_env:` field names set.
# - ```rust: an excerpt of the library's crate example, which `cargo test --doc`
#   compiles and runs: every line of the block must be a line of that example
#   (crates/ratelimiter/src/lib.rs), indentation included.
# - any other language, or none: a failure. So is an exception below that no
#   block matches any more.
#
# Mappings, which leave the README's text as it is:
# - `cargo build --release ...` and `cargo run --release ...` run without
#   `--release`, against this repository's manifest: the debug build is the
#   same code and the one the other tests have built; a release build would
#   double the test's time. What a block's `cargo build` builds is linked into
#   the block's own `target/release/`, so the block runs only what its build
#   line really built (a `--bin` that drops a package fails here).
# - `curl` fails on an HTTP error (`--fail-with-body`, unless it says `-f`
#   itself), so an answer the README shows cannot silently become a 4xx.
# - The foreground servers listed in SERVERS run in the background instead,
#   probed until they answer, and are stopped at the block's end.
# - `scripts/` is the repository's; `scripts/fleet.sh` runs the debug server
#   built with `--features tigerbeetle` (RATELIMITERD_BIN) instead of building a
#   release one, and keeps its cluster and servers in the block's directory
#   (FLEET_DATA).
#
# A server the block starts in the background that exits while the block waits
# for it fails the block at once (the prelude's `sleep`).
#
# Usage: scripts/readme-test.sh [README]    (default README.md)
# README_TEST_KEEP=1 keeps the blocks' scripts, directories and output.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
README="${1:-README.md}"

# A block that builds the server and the simulator in debug takes minutes on a
# cold target; a probe loop waiting for a server that never starts ends here.
readonly BLOCK_TIMEOUT_S=600
# How long a stopped block's processes get to exit after SIGTERM (a server's
# shutdown grace is 10 s by default) before SIGKILL.
readonly STOP_TIMEOUT_S=15
# The ports the README's examples listen on: taken ones would make a block
# talk to another process.
readonly PORTS=(8080 8081 8090)

# Shell lines not run, each with its reason: `line|TEXT|REASON` drops the lines
# that start with TEXT, `block|TEXT|REASON` the whole block holding such a line.
readonly EXCEPTIONS=(
    "line|scripts/test.sh|the script that runs this test: it would run itself"
)
# Foreground commands that serve until stopped: `COMMAND|URL`, URL answering
# 2xx once the server is up.
readonly SERVERS=(
    "cargo run --release -p ratelimiterd|http://127.0.0.1:8080/healthz"
)

WORK="$(mktemp -d "${TMPDIR:-/tmp}/readme-test.XXXXXX")"
# README_TEST_KEEP=1 keeps each block's script, directory and output.
if [ "${README_TEST_KEEP:-}" = 1 ]; then
    echo "readme-test: the blocks' files are kept in $WORK" >&2
else
    trap 'rm -rf "$WORK"' EXIT
fi
declare -A EXCEPTION_USED=()
RUN=0
CHECKED=0
SKIPPED=0

fail() {
    echo "readme-test: FAILED: $*" >&2
    exit 1
}

# The fleet's server: the debug build with the TigerBeetle backend, kept aside
# before the plain build below takes its place in target/debug.
DEBUG_DIR="${CARGO_TARGET_DIR:-$ROOT/target}/debug"
case "$DEBUG_DIR" in /*) ;; *) DEBUG_DIR="$ROOT/$DEBUG_DIR" ;; esac
cargo build -q -p ratelimiterd --features tigerbeetle --bin ratelimiterd
cp "$DEBUG_DIR/ratelimiterd" "$WORK/ratelimiterd-tigerbeetle"
# The configuration checker: the debug server, built once.
cargo build -q -p ratelimiterd --bin ratelimiterd
RATELIMITERD="$DEBUG_DIR/ratelimiterd"

# What every shell block runs first: strict mode, the mappings, its directory.
prelude() {
    cat <<EOF
set -euo pipefail
README_TEST_ROOT='$ROOT'
cargo() {
    local sub="\$1" a
    shift
    local args=()
    for a in "\$@"; do [ "\$a" = --release ] || args+=("\$a"); done
    case "\$sub" in
        build)
            command cargo build -q --manifest-path "\$README_TEST_ROOT/Cargo.toml" --message-format=json-render-diagnostics "\${args[@]}" \\
                | sed -n 's/.*"executable":"\\([^"]*\\)".*/\\1/p' \\
                | while read -r exe; do ln -sf "\$exe" "target/release/\$(basename "\$exe")"; done ;;
        run) command cargo run -q --manifest-path "\$README_TEST_ROOT/Cargo.toml" "\${args[@]}" ;;
        *) command cargo "\$sub" "\$@" ;;
    esac
}
# --fail-with-body, unless the command says --fail (-f) itself: curl takes one of the two.
curl() {
    local a
    for a in "\$@"; do
        case "\$a" in --fail | --fail-with-body | -[a-zA-Z]*f*) command curl "\$@"; return ;; esac
    done
    command curl --fail-with-body "\$@"
}
# A block waits for its servers in \`until ...; do sleep ...; done\` loops: a server
# that exits instead (not built, a refused configuration) fails the block at once.
sleep() {
    local ended
    ended="\$(jobs -l | grep -E '(Exit [0-9]+|Done) ' || true)"
    if [ -n "\$ended" ]; then
        echo "readme-test: a background command of the block ended: \$ended" >&2
        exit 1
    fi
    command sleep "\$@"
}
mkdir -p target/release
# The repository's scripts as the README calls them; the fleet's on the debug
# server with the TigerBeetle backend, its cluster and servers in the block's
# directory.
ln -s "\$README_TEST_ROOT/scripts" scripts
export RATELIMITERD_BIN='$WORK/ratelimiterd-tigerbeetle' FLEET_DATA="\$PWD/fleet"
EOF
}

# Whether a line of $2 starts with $1.
starts_a_line() {
    local line
    while IFS= read -r line; do
        [[ "$line" == "$1"* ]] && return 0
    done <<<"$2"
    return 1
}

# The block's text with the exceptions' lines dropped and the servers moved to
# the background; empty when the whole block is an exception.
rewrite() {
    local block="$1" line entry scope text reason command url out=""
    for entry in "${EXCEPTIONS[@]}"; do
        IFS='|' read -r scope text reason <<<"$entry"
        if starts_a_line "$text" "$block"; then
            EXCEPTION_USED[$text]=1
            echo "readme-test: not run: $text ($reason)" >&2
            if [ "$scope" = block ]; then
                return
            fi
        fi
    done
    while IFS= read -r line; do
        for entry in "${EXCEPTIONS[@]}"; do
            IFS='|' read -r scope text reason <<<"$entry"
            if [ "$scope" = line ] && [[ "$line" == "$text"* ]]; then
                continue 2
            fi
        done
        for entry in "${SERVERS[@]}"; do
            IFS='|' read -r command url <<<"$entry"
            if [[ "$line" =~ ^"$command"([[:space:]]+#.*)?$ ]]; then
                line="$command &
until curl -sf -o /dev/null $url; do sleep 0.2; done"
            fi
        done
        out+="$line"$'\n'
    done <<<"$block"
    printf '%s' "$out"
}

port_free() {
    ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Runs one shell block in a session of its own and stops whatever it left.
run_shell() {
    local start="$1" block="$2" dir="$WORK/block-$1" script pid status=0 waited=0 port
    # Not in a subshell: the exceptions it uses are recorded.
    rewrite "$block" >"$dir.body"
    script="$(cat "$dir.body")"
    if [ -z "$script" ]; then
        SKIPPED=$((SKIPPED + 1))
        return
    fi
    for port in "${PORTS[@]}"; do
        port_free "$port" || fail "$README:$start: port $port is taken by another process"
    done
    mkdir -p "$dir"
    { prelude; printf '%s\n' "$script"; } >"$dir.sh"
    echo "readme-test: running the block at $README:$start" >&2
    (cd "$dir" && exec setsid timeout "$BLOCK_TIMEOUT_S" bash "$dir.sh" >"$dir.log" 2>&1) &
    pid=$!
    wait "$pid" || status=$?
    # The session's processes: servers the block left, or stopped too late.
    kill -TERM -- "-$pid" 2>/dev/null || true
    while kill -0 -- "-$pid" 2>/dev/null && [ "$waited" -lt "$((STOP_TIMEOUT_S * 5))" ]; do
        sleep 0.2
        waited=$((waited + 1))
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
    # A fleet the block started but did not stop (it failed halfway): its
    # replicas and servers run in sessions of their own.
    if [ -d "$dir/fleet" ]; then
        FLEET_DATA="$dir/fleet" scripts/fleet.sh stop >>"$dir.log" 2>&1 || true
    fi
    if [ "$status" -ne 0 ]; then
        cat "$dir.log" >&2
        fail "$README:$start: the block exited with $status (its output is above)"
    fi
    if grep -n -w WARN "$dir.log" >&2; then
        fail "$README:$start: the block's run logged the warnings above"
    fi
    RUN=$((RUN + 1))
}

check_yaml() {
    local start="$1" block="$2" file="$WORK/config-$1.yaml" variable
    printf '%s\n' "$block" >"$file"
    for variable in $(sed -n 's/.*_env: *\([A-Z_][A-Z0-9_]*\).*/\1/p' "$file"); do
        export "$variable=readme-test-key-0123456789abcdef"
    done
    (cd "$WORK" && "$RATELIMITERD" check-config --config "$file" >/dev/null) ||
        fail "$README:$start: ratelimiterd check-config refuses the block"
    CHECKED=$((CHECKED + 1))
}

# The crate example's lines: lib.rs's `//!` lines, the marker stripped.
EXAMPLE="$(sed -n 's#^//! \{0,1\}##p' crates/ratelimiter/src/lib.rs)"

check_rust() {
    local start="$1" block="$2" line
    while IFS= read -r line; do
        [ -z "$line" ] && continue
        grep -qxF -- "$line" <<<"$EXAMPLE" ||
            fail "$README:$start: not a line of the crate example in crates/ratelimiter/src/lib.rs: $line"
    done <<<"$block"
    CHECKED=$((CHECKED + 1))
}

handle() {
    local lang="$1" start="$2" block="$3"
    case "$lang" in
        sh | bash | console) run_shell "$start" "$block" ;;
        yaml) check_yaml "$start" "$block" ;;
        rust) check_rust "$start" "$block" ;;
        *) fail "$README:$start: a \`\`\`$lang block, which this test neither runs nor checks" ;;
    esac
}

number=0
inside=""
while IFS= read -r line || [ -n "$line" ]; do
    number=$((number + 1))
    if [ -z "$inside" ] && [[ "$line" =~ ^\`\`\`(.*)$ ]]; then
        inside=1
        lang="${BASH_REMATCH[1]}"
        lang="${lang:-none}"
        start=$number
        block=""
    elif [ -n "$inside" ] && [ "$line" = '```' ]; then
        inside=""
        handle "$lang" "$start" "${block%$'\n'}"
    elif [ -n "$inside" ]; then
        block+="$line"$'\n'
    fi
done <"$README"
[ -z "$inside" ] || fail "$README:$start: a block that never closes"

for entry in "${EXCEPTIONS[@]}"; do
    IFS='|' read -r _ text _ <<<"$entry"
    [ -n "${EXCEPTION_USED[$text]:-}" ] || fail "the exception '$text' matches no block: remove it"
done
echo "readme-test: passed: $RUN shell blocks run, $CHECKED blocks checked, $SKIPPED not run (listed)"
