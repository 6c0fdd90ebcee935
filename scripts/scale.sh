#!/usr/bin/env bash
# scale.sh: memory, time to ready and idle CPU of the bridge with N
# simulated boards on one transport, on loopback (docs/performance.md).
#
#   scripts/scale.sh ws|mqtt N [extra bridge flags...]
#
# Prints one CSV line:
#   transport,n,rss0_kib,rssN_kib,kib_per_board,ready_s,idle_cpu_pct,goroutines,rss_burst_kib,recovery_s
# rss0: the bridge with no board. ready_s: from starting the simulator
# until the bridge's /metrics shows N boards ready. rss_burst: right after
# that (3 s settle). Then GCS collections (default 3) spread over IDLE_SECS
# (default 20) of idle, as the runtime's periodic forced GC (every 2 min)
# does on an idle bridge within ~6 minutes: each frees the burst's garbage
# and halves stacks grown during it, while the background scavenger returns
# freed pages. rssN is measured after that, and idle_cpu_pct over the next
# CPU_SECS (default 10) with nothing forced: percent of one core.
# kib_per_board = (rssN - rss0) / N.
# With RECOVERY=1 the bridge is then restarted (SIGTERM, wait, start) while
# the boards keep running, and recovery_s is the time from the new start
# until N boards are ready again.
#
# Environment: BIN (prebuilt bridge and sim binaries; default: build),
# SIM_FLAGS, READY_TIMEOUT (s, default 120), HEAP_OUT, GOROUTINE_OUT,
# MEMSTATS_OUT (profiles to save), DEVICE_PORT, CONTROL_PORT, MQTT_PORT,
# DEBUG_PORT. Every wait is bounded; the script stops only the processes it
# started.
set -euo pipefail
transport=${1:?ws or mqtt}; n=${2:?count}; shift 2
dir=$(mktemp -d /tmp/dbscale.XXXXXX)
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${BIN:-$dir}
if [[ -z ${BIN:-} ]]; then
  (cd "$root" && go build -o "$bin/bridge" ./cmd/bridge && go build -o "$bin/sim" ./cmd/simulator)
fi
dport=${DEVICE_PORT:-18000}; cport=${CONTROL_PORT:-18080}; mport=${MQTT_PORT:-11883}; pport=${DEBUG_PORT:-16060}
ready_timeout=${READY_TIMEOUT:-120}
idle_secs=${IDLE_SECS:-20}
gcs=${GCS:-3}
cpu_secs=${CPU_SECS:-10}
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
bpid=""; spid=""
cleanup() {
  set +e
  [[ -n $spid ]] && kill "$spid" 2>/dev/null
  [[ -n $bpid ]] && kill "$bpid" 2>/dev/null
  sleep 2
  [[ -n $bpid ]] && kill -9 "$bpid" 2>/dev/null
  [[ -n $spid ]] && kill -9 "$spid" 2>/dev/null
  wait 2>/dev/null; rm -rf "$dir"; return 0
}
trap cleanup EXIT
start_bridge() {
  "$bin/bridge" --device-listen 127.0.0.1:$dport --control-listen 127.0.0.1:$cport --mqtt-listen 127.0.0.1:$mport --data-dir "" \
    --mqtt-udp-listen "" --debug-listen 127.0.0.1:$pport --log-level warn "$@" 2>>"$dir/bridge.log" &
  bpid=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$cport/healthz" >/dev/null && break; sleep 0.1; done
}
rss() { awk '/VmRSS/{print $2}' /proc/$bpid/status; }
cpu_ticks() { awk '{print $14+$15}' /proc/$bpid/stat; }
ready() { curl -sf "http://127.0.0.1:$cport/metrics" | awk '/^devicebridge_boards\{.*state="ready"/{s+=$2} END{print s+0}' || echo 0; }
wait_ready() { # prints seconds since $1, or "timeout"
  local deadline=$(( $(date +%s) + ready_timeout ))
  while (( $(date +%s) < deadline )); do
    if (( $(ready) >= n )); then echo "$(date +%s.%N) - $1" | bc; return; fi
    sleep 0.5
  done
  echo timeout
}

start_bridge "$@"
sleep 1; rss0=$(rss)
if [[ $transport == mqtt ]]; then target=(--mqtt tcp://127.0.0.1:$mport); else target=(--url ws://127.0.0.1:$dport/xiaozhi/v1/); fi
start=$(date +%s.%N)
# shellcheck disable=SC2086
"$bin/sim" "${target[@]}" --count "$n" --log-level error --stats-interval 0 ${SIM_FLAGS:-} 2>"$dir/sim.log" &
spid=$!
ready_s=$(wait_ready "$start")
sleep 3 # let the catalogue settle
rss_burst=$(rss)
for _ in $(seq "$gcs"); do
  curl -sf "http://127.0.0.1:$pport/debug/pprof/heap?gc=1" -o /dev/null || true
  sleep "$(echo "scale=2; $idle_secs / $gcs" | bc)"
done
rssN=$(rss)
t0=$(cpu_ticks); sleep "$cpu_secs"; t1=$(cpu_ticks)
idle=$(echo "scale=2; ($t1 - $t0) * 100 / $(getconf CLK_TCK) / $cpu_secs" | bc)
gor=$(curl -sf "http://127.0.0.1:$pport/debug/pprof/goroutine?debug=1" | awk 'NR==1{print $4}' || true)
if [[ -n ${MEMSTATS_OUT:-} ]]; then curl -sf "http://127.0.0.1:$pport/debug/pprof/heap?debug=1" | grep "^# " > "$MEMSTATS_OUT" || true; fi
if [[ -n ${HEAP_OUT:-} ]]; then curl -sf "http://127.0.0.1:$pport/debug/pprof/heap" -o "$HEAP_OUT" || true; fi
if [[ -n ${GOROUTINE_OUT:-} ]]; then curl -sf "http://127.0.0.1:$pport/debug/pprof/goroutine?debug=1" -o "$GOROUTINE_OUT" || true; fi
per=$(echo "scale=1; ($rssN - $rss0) / $n" | bc)
recovery_s=""
if [[ -n ${RECOVERY:-} ]]; then
  kill "$bpid"
  for _ in $(seq 300); do kill -0 "$bpid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$bpid" 2>/dev/null || true
  wait "$bpid" 2>/dev/null || true
  restart=$(date +%s.%N)
  start_bridge "$@"
  recovery_s=$(wait_ready "$restart")
fi
echo "$transport,$n,$rss0,$rssN,$per,$ready_s,$idle,$gor,$rss_burst,$recovery_s"
