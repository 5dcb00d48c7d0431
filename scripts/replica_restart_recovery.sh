#!/usr/bin/env bash
# A replica restart seen by one server (RELIABILITY.md, "TigerBeetle"): starts a
# one-replica cluster of its own (port RR_TB_PORT, default 3970) and a server on it
# (port RR_PORT, default 18750, request_timeout_ms 2000) whose clients reserve and
# complete a concurrency limit from 4 loops; SIGKILLs the replica, restarts it on the
# same data file after OUTAGE seconds, and prints how long after its port accepts
# again the server grants (and /healthz answers 200), with the answers counted.
#
# Usage: scripts/replica_restart_recovery.sh RATELIMITERD_BIN [OUTAGE_S]
set -uo pipefail
BIN_SERVER="${1:?usage: scripts/replica_restart_recovery.sh RATELIMITERD_BIN [OUTAGE_S]}"; OUT=${2:-12}
REPO="$(cd "$(dirname "$0")/.." && pwd)"
TBP="${RR_TB_PORT:-3970}"
SP="${RR_PORT:-18750}"
W=$(mktemp -d /tmp/replica-restart-XXXXXX)
export TB_PORT=$TBP TB_DATA=$W/cluster
$REPO/scripts/tigerbeetle.sh start 1 >/dev/null 2>&1
TB=$($REPO/scripts/tigerbeetle.sh path)
RPID=$(head -1 $TB_DATA/pids)
cat > $W/config.yaml <<EOC
server:
  listen_addr: "127.0.0.1:$SP"
  admin_token: rr-admin-token-0123456789abcdef
  client_tokens: [rr-client-token-0123456789abcdef]
  backend: tigerbeetle
registry:
  path: $W/limits.json
tigerbeetle:
  cluster_id: "0"
  addresses: ["127.0.0.1:$TBP"]
  request_timeout_ms: 2000
EOC
$BIN_SERVER --config $W/config.yaml > $W/server.log 2>&1 &
SPID=$!
until curl -sf http://127.0.0.1:$SP/healthz >/dev/null; do sleep 0.2; done
curl -sf -X PUT http://127.0.0.1:$SP/v1/admin/limits -H 'authorization: Bearer rr-admin-token-0123456789abcdef' -H 'content-type: application/json' -d '{"key":"rr:inflight","kind":"concurrency","capacity":16,"timeout_seconds":30}' >/dev/null
STOP=$W/stop
client() {
  while [ ! -e $STOP ]; do
    lease=$(python3 -c 'import random,string;print("01J"+"".join(random.choice("0123456789ABCDEFGHJKMNPQRSTVWXYZ") for _ in range(23)))')
    out=$(curl -s -m 10 -w ' %{http_code}' -X POST http://127.0.0.1:$SP/v1/reserve -H 'authorization: Bearer rr-client-token-0123456789abcdef' -H 'content-type: application/json' -d "{\"lease_id\":\"$lease\",\"requirements\":[{\"key\":\"rr:inflight\",\"amount\":1}]}")
    echo "$(date +%s%3N) $out" >> $W/client.log
    curl -s -m 10 -o /dev/null -X POST http://127.0.0.1:$SP/v1/complete -H 'authorization: Bearer rr-client-token-0123456789abcdef' -H 'content-type: application/json' -d "{\"lease_id\":\"$lease\"}"
  done
}
for i in 1 2 3 4; do client & done
sleep 1
FILE=$TB_DATA/0_0.tigerbeetle
kill -9 $RPID
sleep $OUT
nohup $TB start --addresses=127.0.0.1:$TBP --development --cache-grid=256MiB --experimental --limit-request=1MiB --limit-pipeline-requests=24 $FILE >> $W/replica2.log 2>&1 &
NPID=$!
echo $NPID > $TB_DATA/pids
until (exec 3<>/dev/tcp/127.0.0.1/$TBP) 2>/dev/null; do sleep 0.01; done
T_OPEN=$(date +%s%3N)
H=""
while true; do
  now=$(date +%s%3N)
  if [ -z "$H" ] && curl -sf -m 3 http://127.0.0.1:$SP/healthz >/dev/null; then H=$((now - T_OPEN)); fi
  first=$(awk -v t=$T_OPEN '$1 >= t && /"allowed":true/ {print $1 - t; exit}' $W/client.log)
  if [ -n "$first" ] && [ -n "$H" ]; then break; fi
  [ $((now - T_OPEN)) -gt 20000 ] && break
  sleep 0.05
done
touch $STOP
sleep 3
echo "$BIN_SERVER, replica down ${OUT}s:"; echo "  outage ${OUT}s: port open -> first grant ${first:-none} ms, healthz 200 ${H:-none} ms; answers: $(awk '{print $NF}' $W/client.log | sort | uniq -c | tr '\n' ' ')"
kill $SPID 2>/dev/null; wait $SPID 2>/dev/null
$REPO/scripts/tigerbeetle.sh stop >/dev/null 2>&1
rm -rf $W
