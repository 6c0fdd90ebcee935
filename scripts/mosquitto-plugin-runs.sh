#!/usr/bin/env bash
# mosquitto-plugin-runs.sh: current-firmware MQTT boards through a real
# Mosquitto with the devicebridge plugin against the bridge's embedded
# broker, in one run, on loopback (docs/performance.md, issue 19).
#
#   scripts/mosquitto-plugin-runs.sh [N...]     # default: 1000
#
# For each N, first "mosquitto": Mosquitto (deploy/mosquitto/devicebridge.so
# loaded, the bridge's secret, allow_anonymous false) on a free port, the
# bridge with --mqtt-broker and --mqtt-downlink mosquitto-plugin; then
# "embedded": the bridge's own broker. In both, N simulated boards
# (cmd/simulator, current firmware: no SUBSCRIBE) boot through the bridge's
# OTA endpoint, which sends them to the broker with issued credentials, and
# open the audio channel (--mqtt-hello: a bridge behind an external broker
# learns of a board when it speaks; done in both runs so they match).
#
# Measured, one CSV line per broker and N (appended to OUT, default
# docs/perf/mosquitto.csv, header written when the file is new):
#   broker,n,ready_s,calls,call_errors,p50_us,p99_us,broker_rss_kib,bridge_rss_kib,bridge_rss_burst_kib,ready_n
# ready_s: from starting the simulator until the bridge's /metrics shows N
# boards ready ("timeout" past READY_TIMEOUT; ready_n: how many were ready
# then). Then, 3 s later,
# bridge_rss_burst (VmRSS). Calls: CALLS (default N) calls of
# self.get_device_status spread over every ready board by WORKERS (default
# 8) concurrent callers through the control API (internal/callload
# -local-only): latency of POST /api/devices/{id}/call. Then three
# collections are forced in the bridge over 6 s (pprof) and the RSS of
# both processes is read: broker_rss is Mosquitto's VmRSS (empty for the
# embedded broker, which lives in the bridge's RSS).
#
# Environment: OUT, READY_TIMEOUT (s, default 120), CALLS, WORKERS. Needs
# mosquitto (Debian: /usr/sbin/mosquitto), make, cc and Mosquitto's headers
# (make -C deploy/mosquitto). Every wait is bounded; the script stops only
# the processes it started.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
ns=("$@"); [[ ${#ns[@]} -gt 0 ]] || ns=(1000)
out=${OUT:-docs/perf/mosquitto.csv}
ready_timeout=${READY_TIMEOUT:-120}
workers=${WORKERS:-8}
mosq=$(command -v mosquitto || echo /usr/sbin/mosquitto)
[[ -x $mosq ]] || { echo "mosquitto not found (apt-get install -y mosquitto)" >&2; exit 1; }
dir=$(mktemp -d /tmp/dbmosq.XXXXXX)
make -s -C deploy/mosquitto
plugin=$root/deploy/mosquitto/devicebridge.so
go build -o "$dir/bridge" ./cmd/bridge
go build -o "$dir/sim" ./cmd/simulator
go build -o "$dir/callload" ./internal/callload
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

mpid=""; bpid=""; spid=""; result=""
stop() { # stop the processes of one run, politely then not
  set +e
  for p in $spid $bpid $mpid; do kill "$p" 2>/dev/null; done
  for _ in $(seq 50); do
    alive=0; for p in $spid $bpid $mpid; do kill -0 "$p" 2>/dev/null && alive=1; done
    (( alive )) || break; sleep 0.1
  done
  for p in $spid $bpid $mpid; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  mpid=""; bpid=""; spid=""
  set -e
}
trap 'stop; rm -rf "$dir"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
rss() { awk '/VmRSS/{print $2}' "/proc/$1/status"; }
ready() { curl -sf "http://127.0.0.1:$cport/metrics" | awk '/^devicebridge_boards\{.*state="ready"/{s+=$2} END{print s+0}' || echo 0; }
wait_ready() { # prints seconds since $1, or "timeout"
  local deadline=$(( $(date +%s) + ready_timeout ))
  while (( $(date +%s) < deadline )); do
    if (( $(ready) >= n )); then echo "$(date +%s.%N) - $1" | bc; return; fi
    sleep 0.5
  done
  echo timeout
}

one() { # one run: $1 = mosquitto or embedded, n set
  local kind=$1 run=$dir/$1-$n
  mkdir -p "$run/data"
  dport=$(free_port); cport=$(free_port); pport=$(free_port); mqport=$(free_port)
  local broker=()
  if [[ $kind == mosquitto ]]; then
    # The bridge's secret, which the plugin reads too (ota-secret, hex).
    head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$run/data/ota-secret"; echo >> "$run/data/ota-secret"
    chmod 600 "$run/data/ota-secret"
    {
      echo "listener $mqport 127.0.0.1"
      echo "allow_anonymous false"
      echo "persistence false"
      echo "log_dest file $run/mosquitto.log"
      echo "log_type error"; echo "log_type warning"
      (( EUID == 0 )) && echo "user root" # else it drops to the mosquitto user, who cannot read $run
      echo "plugin $plugin"
      echo "plugin_opt_secret_file $run/data/ota-secret"
      echo "plugin_opt_bridge_username devicebridge"
    } > "$run/mosquitto.conf"
    "$mosq" -c "$run/mosquitto.conf" 2>>"$run/mosquitto.log" &
    mpid=$!
    for _ in $(seq 100); do (echo > "/dev/tcp/127.0.0.1/$mqport") 2>/dev/null && break; sleep 0.1; done
    broker=(--mqtt-broker "tcp://127.0.0.1:$mqport" --mqtt-downlink mosquitto-plugin --mqtt-username devicebridge)
  else
    broker=(--mqtt-listen "127.0.0.1:$mqport")
  fi
  "$dir/bridge" --device-listen "127.0.0.1:$dport" --control-listen "127.0.0.1:$cport" --debug-listen "127.0.0.1:$pport" \
    --data-dir "$run/data" --mqtt-udp-listen 127.0.0.1:0 --ota-transport mqtt --ota-mqtt-endpoint "127.0.0.1:$mqport" \
    --ota-burst 1000000 --ota-rate 1000000 --log-level warn "${broker[@]}" 2>>"$run/bridge.log" &
  bpid=$!
  # /readyz: for the plugin, the bridge's probe came back through Mosquitto.
  for _ in $(seq 300); do curl -sf "http://127.0.0.1:$cport/readyz" >/dev/null && break; sleep 0.1; done
  if ! curl -sf "http://127.0.0.1:$cport/readyz" >/dev/null; then
    echo "$kind: the bridge is not ready after 30 s:" >&2; curl -s "http://127.0.0.1:$cport/readyz" >&2 || true
    tail -5 "$run/bridge.log" "$run/mosquitto.log" >&2 2>/dev/null || true
  fi
  local start ready_s burst calls p50="" p99="" errs="" ncalls="" brss mrss=""
  start=$(date +%s.%N)
  "$dir/sim" --ota "http://127.0.0.1:$dport/xiaozhi/ota/" --mqtt-hello --count "$n" --log-level error --stats-interval 0 2>"$run/sim.log" &
  spid=$!
  ready_s=$(wait_ready "$start")
  local ready_n; ready_n=$(ready)
  if [[ $ready_s == timeout ]]; then
    echo "$kind: $ready_n of $n ready after ${ready_timeout} s; bridge log:" >&2; tail -5 "$run/bridge.log" >&2
    echo "simulator log:" >&2; tail -5 "$run/sim.log" >&2
  fi
  sleep 3
  burst=$(rss "$bpid")
  calls=${CALLS:-$n}
  if timeout 300 "$dir/callload" -api "http://127.0.0.1:$cport" -local-only -calls "$calls" -workers "$workers" -boards "$n" \
      > "$run/callload.txt" 2>>"$run/callload.err"; then
    IFS=, read -r _ ncalls errs p50 _ p99 _ < <(grep '^local,' "$run/callload.txt")
  else
    echo "$kind: callload failed:" >&2; cat "$run/callload.err" >&2
  fi
  for _ in 1 2 3; do curl -sf "http://127.0.0.1:$pport/debug/pprof/heap?gc=1" -o /dev/null || true; sleep 2; done
  brss=$(rss "$bpid")
  [[ -n $mpid ]] && mrss=$(rss "$mpid")
  [[ -s $run/mosquitto.log ]] && { echo "$kind: mosquitto log (last lines):" >&2; tail -3 "$run/mosquitto.log" >&2; }
  stop
  result="$kind,$n,$ready_s,$ncalls,$errs,$p50,$p99,$mrss,$brss,$burst,$ready_n"
}

[[ -s $out ]] || echo "broker,n,ready_s,calls,call_errors,p50_us,p99_us,broker_rss_kib,bridge_rss_kib,bridge_rss_burst_kib,ready_n" > "$out"
for n in "${ns[@]}"; do
  for kind in mosquitto embedded; do
    one "$kind"
    echo "$result" | tee -a "$out"
  done
done
