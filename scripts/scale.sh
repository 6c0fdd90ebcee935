#!/usr/bin/env bash
# scale.sh: memory, time-to-ready and idle CPU of the bridge with N simulated
# boards on one transport, on loopback. One CSV line on stdout:
#   transport,n,rss0_kib,rssN_kib,kib_per_board,ready_s,idle_cpu_pct,goroutines,rss_burst_kib
# rssN is measured after the burst has settled, one GC and IDLE_SECS idle;
# rss_burst right after the last board became ready (3 s settle).
# Usage: scripts/scale.sh ws|mqtt N [extra bridge flags...]
# Every step is bounded in time; the script kills only the processes it started.
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
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
bpid=""; spid=""
cleanup() { [[ -n $spid ]] && kill "$spid" 2>/dev/null; [[ -n $bpid ]] && kill "$bpid" 2>/dev/null; sleep 2; [[ -n $bpid ]] && kill -9 "$bpid" 2>/dev/null; [[ -n $spid ]] && kill -9 "$spid" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"; return 0; }
trap cleanup EXIT
"$bin/bridge" --device-listen 127.0.0.1:$dport --control-listen 127.0.0.1:$cport --mqtt-listen 127.0.0.1:$mport \
  --mqtt-udp-listen "" --debug-listen 127.0.0.1:$pport --log-level warn "$@" 2>"$dir/bridge.log" &
bpid=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$cport/healthz" >/dev/null && break; sleep 0.1; done
rss() { awk '/VmRSS/{print $2}' /proc/$bpid/status; }
cpu_ticks() { awk '{print $14+$15}' /proc/$bpid/stat; }
ready() { curl -sf "http://127.0.0.1:$cport/metrics" | awk '/^devicebridge_boards\{.*state="ready"/{s+=$2} END{print s+0}'; }
sleep 1; rss0=$(rss)
if [[ $transport == mqtt ]]; then target=(--mqtt tcp://127.0.0.1:$mport); else target=(--url ws://127.0.0.1:$dport/xiaozhi/v1/); fi
start=$(date +%s.%N)
"$bin/sim" "${target[@]}" --count "$n" --log-level error --stats-interval 0 ${SIM_FLAGS:-} 2>"$dir/sim.log" &
spid=$!
ready_s=timeout
deadline=$(( $(date +%s) + ready_timeout ))
while (( $(date +%s) < deadline )); do
  if (( $(ready) >= n )); then ready_s=$(echo "$(date +%s.%N) - $start" | bc); break; fi
  sleep 0.5
done
sleep 3 # let the catalogue settle
rss_burst=$(rss)
# One collection now, as the runtime's periodic forced GC (every 2 min)
# would do on an idle bridge; then idle_secs of idle, measuring CPU, while
# the background scavenger returns freed pages.
curl -sf "http://127.0.0.1:$pport/debug/pprof/heap?gc=1" -o /dev/null || true
t0=$(cpu_ticks); sleep "$idle_secs"; t1=$(cpu_ticks)
hz=$(getconf CLK_TCK)
idle=$(echo "scale=2; ($t1 - $t0) * 100 / $hz / $idle_secs" | bc)
rssN=$(rss)
gor=$(curl -sf "http://127.0.0.1:$pport/debug/pprof/goroutine?debug=1" | awk 'NR==1{print $4}' || true)
if [[ -n ${MEMSTATS_OUT:-} ]]; then curl -sf "http://127.0.0.1:$pport/debug/pprof/heap?debug=1" | grep "^# " > "$MEMSTATS_OUT" || true; fi
if [[ -n ${HEAP_OUT:-} ]]; then curl -sf "http://127.0.0.1:$pport/debug/pprof/heap" -o "$HEAP_OUT"; fi
if [[ -n ${GOROUTINE_OUT:-} ]]; then curl -sf "http://127.0.0.1:$pport/debug/pprof/goroutine?debug=1" -o "$GOROUTINE_OUT"; fi
per=$(echo "scale=1; ($rssN - $rss0) / $n" | bc)
echo "$transport,$n,$rss0,$rssN,$per,$ready_s,$idle,$gor,$rss_burst"
