#!/usr/bin/env bash
# cluster-load.sh: three bridge nodes on one NATS (JetStream), N simulated
# WebSocket boards on each, all on this machine (docs/scaling.md).
#
#   scripts/cluster-load.sh [N]        # default N=3000 boards per node
#
# Prints, as key=value lines:
#   ready_s        from starting the simulators until node a's /api/devices
#                  lists all 3N boards ready
#   rss_<node>_mib bridge RSS per node once ready (after a forced settle)
#   rss_nats_mib   nats-server RSS
# then, from each node, internal/callload's CSV: latency of calls to boards
# that node holds vs boards the other two hold, interleaved by the same
# workers, and their ratio.
#
# Needs nats-server and jq on PATH (Debian: nats-server, jq). Its own NATS listens on
# NATS_PORT (default 14222) with a temp store; the script never touches a
# NATS or bridge it did not start. Environment: CALLS (per group, default
# 1000), WORKERS (default 4), READY_TIMEOUT (s, default 300), BIN (prebuilt
# bridge and sim binaries).
set -euo pipefail
n=${1:-3000}
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$(mktemp -d /tmp/dbcluster.XXXXXX)
bin=${BIN:-$dir}
if [[ -z ${BIN:-} ]]; then
  (cd "$root" && go build -o "$bin/bridge" ./cmd/bridge && go build -o "$bin/sim" ./cmd/simulator \
    && go build -o "$bin/callload" ./internal/callload)
fi
nport=${NATS_PORT:-14222}
calls=${CALLS:-1000}; workers=${WORKERS:-4}; ready_timeout=${READY_TIMEOUT:-300}
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
pids=()
cleanup() {
  set +e
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  sleep 2
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null; rm -rf "$dir"; return 0
}
trap cleanup EXIT
trap 'exit 1' INT TERM

nats-server -js -a 127.0.0.1 -p "$nport" -sd "$dir/js" >"$dir/nats.log" 2>&1 &
natspid=$!; pids+=("$natspid")
for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$nport) 2>/dev/null && break; sleep 0.1; done

declare -A bpid
nodes=(a b c)
for i in 0 1 2; do
  id=${nodes[$i]}
  "$bin/bridge" --nats "nats://127.0.0.1:$nport" --node-id "$id" --device-listen "127.0.0.1:1800$i" \
    --control-listen "127.0.0.1:1808$i" --mqtt-listen "" --mqtt-udp-listen "" --log-level warn 2>>"$dir/bridge-$id.log" &
  bpid[$id]=$!; pids+=("$!")
done
for i in 0 1 2; do
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:1808$i/healthz" >/dev/null && break; sleep 0.1; done
done
for id in "${nodes[@]}"; do
  kill -0 "${bpid[$id]}" 2>/dev/null || { echo "bridge $id did not start:" >&2; tail -5 "$dir/bridge-$id.log" >&2; exit 1; }
done

ready() { { curl -sf "http://127.0.0.1:18080/api/devices" || echo '{}'; } | jq '[.devices[]? | select(.state == "ready")] | length'; }
start=$(date +%s.%N)
for i in 0 1 2; do
  "$bin/sim" --url "ws://127.0.0.1:1800$i/xiaozhi/v1/" --count "$n" --mac-prefix "0$i:0a:00" \
    --stats-interval 0 --log-level warn 2>>"$dir/sim-$i.log" &
  pids+=("$!")
done
want=$((3 * n)); got=0
deadline=$(( $(date +%s) + ready_timeout ))
while (( $(date +%s) < deadline )); do
  got=$(ready)
  (( got >= want )) && break
  sleep 0.5
done
end=$(date +%s.%N)
if (( got < want )); then
  echo "only $got of $want boards ready after ${ready_timeout}s" >&2
  tail -5 "$dir"/bridge-*.log >&2
  exit 1
fi
echo "boards=$want"
echo "ready_s=$(echo "$end - $start" | bc)"
sleep 5
for id in "${nodes[@]}"; do
  echo "rss_${id}_mib=$(( $(awk '/VmRSS/{print $2}' /proc/${bpid[$id]}/status) / 1024 ))"
done
echo "rss_nats_mib=$(( $(awk '/VmRSS/{print $2}' /proc/$natspid/status) / 1024 ))"
for i in 0 1 2; do
  echo "# calls from node ${nodes[$i]} (local vs held by the other nodes)"
  "$bin/callload" -api "http://127.0.0.1:1808$i" -calls "$calls" -workers "$workers"
done
