#!/usr/bin/env bash
# voice-fleet.sh: the voice relay end to end through the real transports
# (docs/performance.md, "Voice relay end to end"). N simulated boards (default 1000) each hold
# one conversation at the same time: F uplink frames (default 50) of 60 ms
# audio in real time, then F downlink frames from the stand-in voice
# server, through a bridge process; first over WebSocket, then over OTA +
# the embedded MQTT broker + UDP.
#
#   scripts/voice-fleet.sh [N] [F] [extra scripts/voicefleet flags...]
#
# Prints one JSON line per transport (scripts/voicefleet/report.go names
# every field): boards, conversations ok/failed, uplink sent/heard/lost,
# downlink sent/received/lost and dropped by the board, relay latency per
# downlink frame (p50/p90/p99/max, ms: stub write to board arrival), bridge
# RSS and CPU. Progress goes to stderr. Each run is bounded by 2 minutes.
# Environment: BRIDGE (a prebuilt cmd/bridge binary; default: build one),
# TRANSPORTS (default "ws mqtt").
set -euo pipefail
n=${1:-1000}; frames=${2:-50}; shift $(( $# < 2 ? $# : 2 ))
cd "$(dirname "$0")/.."
# Each board holds a socket here and in the bridge, and each conversation
# one more on both sides of the upstream link (MQTT: a UDP socket too).
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt $((3 * n + 256)) ]; then
  echo "voice-fleet.sh: ulimit -n is $(ulimit -n); $n boards need about $((3 * n + 256))" >&2
  exit 1
fi
dir=$(mktemp -d /tmp/voicefleet.XXXXXX)
trap 'rm -rf "$dir"' EXIT
bridge=${BRIDGE:-}
if [ -z "$bridge" ]; then
  go build -o "$dir/bridge" ./cmd/bridge
  bridge=$dir/bridge
fi
go build -o "$dir/voicefleet" ./scripts/voicefleet
for t in ${TRANSPORTS:-ws mqtt}; do
  "$dir/voicefleet" -transport "$t" -boards "$n" -frames "$frames" -bridge "$bridge" -timeout 2m "$@"
done
