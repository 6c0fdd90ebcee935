#!/usr/bin/env bash
# cluster-load.sh: three bridge nodes on one NATS (JetStream), N simulated
# WebSocket boards on each, all on this machine (docs/scaling.md), against a
# baseline measured in the same run: one bridge alone holding all 3N boards.
#
#   scripts/cluster-load.sh [N]        # default N=3000 boards per node
#
# Prints key=value lines:
#   boards                 3N
#   solo_ready_s           baseline: one bridge without NATS, the same three
#                          simulators pointed at it; from their start until
#                          its /api/devices lists 3N boards ready
#   solo_rss_mib           its RSS once ready
#   ready_s                the fleet: from starting the simulators until node
#                          a's /api/devices lists all 3N boards ready (its
#                          own and the two other nodes' boards)
#   ready_ratio            ready_s / solo_ready_s
#   rss_<node>_mib         bridge RSS per node once ready
#   rss_nats_mib           nats-server RSS
# then, from each node, internal/callload's CSV: latency of calls to boards
# that node holds vs boards the other two hold, interleaved by the same
# workers, and their ratio.
#
# Needs nats-server and jq on PATH (Debian: nats-server, jq). The script's
# NATS runs configs/nats-fleet.conf (loopback, credentials required) on
# NATS_PORT (default 14222) with a temp store and a password drawn for the
# run; it never
# touches a NATS or bridge it did not start. Environment: CALLS (per group,
# default 1000), WORKERS (default 4), READY_TIMEOUT (s, default 300), BIN
# (prebuilt bridge, sim and callload binaries), SOLO=0 (skip the baseline),
# DEBUG=1 (pprof on 1806x), PROFILE=file (CPU profile of node a while the
# boards connect, PROFILE_SECS long; needs DEBUG=1).
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
want=$((3 * n))
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
pids=(); sims=()
stop() { # stop the given pids: TERM, then KILL after 2 s
  set +e
  for p in "$@"; do kill "$p" 2>/dev/null; done
  for _ in $(seq 20); do
    local alive=0
    for p in "$@"; do kill -0 "$p" 2>/dev/null && alive=1; done
    (( alive )) || break
    sleep 0.1
  done
  for p in "$@"; do kill -9 "$p" 2>/dev/null; done
  set -e
}
cleanup() { stop "${pids[@]}"; wait 2>/dev/null; rm -rf "$dir"; return 0; }
trap cleanup EXIT
trap 'exit 1' INT TERM

rss_mib() { echo $(( $(awk '/VmRSS/{print $2}' "/proc/$1/status") / 1024 )); }

# start_bridge NAME INDEX [flags...]: a bridge on 1800<i> (devices), 1808<i>
# (control) and, with DEBUG, 1806<i> (pprof); sets bpid[NAME].
declare -A bpid
start_bridge() {
  local id=$1 i=$2; shift 2
  "$bin/bridge" --device-listen "127.0.0.1:1800$i" --control-listen "127.0.0.1:1808$i" --mqtt-listen "" --data-dir "" \
    --mqtt-udp-listen "" --log-level warn ${DEBUG:+--debug-listen 127.0.0.1:1806$i} "$@" 2>>"$dir/bridge-$id.log" &
  bpid[$id]=$!; pids+=("$!")
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:1808$i/healthz" >/dev/null && break; sleep 0.1; done
  kill -0 "${bpid[$id]}" 2>/dev/null || { echo "bridge $id did not start:" >&2; tail -5 "$dir/bridge-$id.log" >&2; exit 1; }
}

# start_sims PORT...: one simulator of N boards per device port, each with
# its own MAC prefix (a duplicate MAC would replace a board).
start_sims() {
  sims=()
  local k=0
  for port in "$@"; do
    "$bin/sim" --url "ws://127.0.0.1:$port/xiaozhi/v1/" --count "$n" --mac-prefix "0$k:0a:00" \
      --stats-interval 0 --log-level warn 2>>"$dir/sim-$k.log" &
    sims+=("$!"); pids+=("$!")
    k=$((k + 1))
  done
}

# wait_ready CONTROL_PORT: until that bridge lists 3N boards ready; prints
# the seconds since $start.
wait_ready() {
  local got=0 deadline=$(( $(date +%s) + ready_timeout ))
  while (( $(date +%s) < deadline )); do
    got=$({ curl -sf "http://127.0.0.1:$1/api/devices" || echo '{}'; } | jq '[.devices[]? | select(.state == "ready")] | length')
    (( got >= want )) && break
    sleep 1
  done
  if (( got < want )); then
    echo "only $got of $want boards ready after ${ready_timeout}s" >&2
    tail -5 "$dir"/bridge-*.log >&2
    exit 1
  fi
  echo "$(date +%s.%N) - $start" | bc
}

echo "boards=$want"
solo=""
if [[ ${SOLO:-1} != 0 ]]; then
  start_bridge solo 9
  start=$(date +%s.%N)
  start_sims 18009 18009 18009
  solo=$(wait_ready 18089)
  echo "solo_ready_s=$solo"
  sleep 5
  echo "solo_rss_mib=$(rss_mib "${bpid[solo]}")"
  stop "${sims[@]}" "${bpid[solo]}"
fi

# The fleet's password, for nats-server and the nodes alike (never argv).
DEVICEBRIDGE_NATS_PASSWORD=$(head -c 18 /dev/urandom | base64)
export DEVICEBRIDGE_NATS_PASSWORD
nats-server -c "$root/configs/nats-fleet.conf" -p "$nport" -sd "$dir/js" >"$dir/nats.log" 2>&1 &
natspid=$!; pids+=("$natspid")
for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$nport) 2>/dev/null && break; sleep 0.1; done

nodes=(a b c)
for i in 0 1 2; do
  start_bridge "${nodes[$i]}" "$i" --nats "nats://127.0.0.1:$nport" --nats-user devicebridge --node-id "${nodes[$i]}"
done
start=$(date +%s.%N)
start_sims 18000 18001 18002
if [[ -n ${PROFILE:-} ]]; then
  curl -sf -o "$PROFILE" "http://127.0.0.1:18060/debug/pprof/profile?seconds=${PROFILE_SECS:-20}" &
fi
ready=$(wait_ready 18080)
echo "ready_s=$ready"
[[ -n $solo ]] && echo "ready_ratio=$(echo "scale=2; $ready / $solo" | bc)"
sleep 5
for id in "${nodes[@]}"; do
  echo "rss_${id}_mib=$(rss_mib "${bpid[$id]}")"
done
echo "rss_nats_mib=$(rss_mib "$natspid")"
for i in 0 1 2; do
  echo "# calls from node ${nodes[$i]} (local vs held by the other nodes)"
  "$bin/callload" -api "http://127.0.0.1:1808$i" -calls "$calls" -workers "$workers"
done
