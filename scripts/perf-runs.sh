#!/usr/bin/env bash
# perf-runs.sh: the runs behind docs/performance.md. Writes docs/perf/:
#   scale.csv  scripts/scale.sh for each transport and N (memory, ready, idle)
#   hop.txt    BenchmarkHop (bridge vs bare go-sdk peer, both eras, 1/8/64 callers)
#   fanout.txt BenchmarkFanout (1,000 boards)
# then regenerates the tables and plots (go run ./internal/perfplot), in
# docs/performance.md and the README's load table.
# Takes about 15 minutes on 2 cores; every run is bounded and on loopback.
#   scripts/perf-runs.sh            # everything
#   NS="1000 10000" scripts/perf-runs.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=docs/perf
mkdir -p "$out"
bin=$(mktemp -d /tmp/dbperf.XXXXXX)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/bridge" ./cmd/bridge
go build -o "$bin/sim" ./cmd/simulator
ns=${NS:-"1000 2500 5000 10000"}
echo "transport,n,rss0_kib,rssN_kib,kib_per_board,ready_s,idle_cpu_pct,goroutines,rss_burst_kib,recovery_s" > "$out/scale.csv"
for t in ws mqtt; do
  for n in $ns; do
    rec=""
    if [[ $t == mqtt && $n == 10000 ]]; then rec=1; fi
    RECOVERY=$rec BIN=$bin timeout 600 scripts/scale.sh "$t" "$n" | tee -a "$out/scale.csv"
  done
done
go test -run '^$' -bench BenchmarkHop -benchtime 2000x -count 3 ./mcpserver/ | tee "$out/hop.txt"
go test -run '^$' -bench BenchmarkFanout -benchtime 5x ./mcpserver/ | tee "$out/fanout.txt"
{ echo "# machine"; nproc; grep -m1 'model name' /proc/cpuinfo; free -g | sed -n 2p; go version; uptime; } > "$out/machine.txt"
go run ./internal/perfplot -dir "$out"
