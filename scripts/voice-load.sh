#!/usr/bin/env bash
# The voice relay's audio path under load: N conversations (default 1000)
# each send F frames (default 100) of 60 ms audio in real time through the
# relay to an echoing upstream; prints one JSON line with the per-frame
# round trip (board -> relay -> upstream -> relay -> board) p50/p90/p99 and
# the frames lost. Usage: scripts/voice-load.sh [conversations] [frames]
set -euo pipefail
cd "$(dirname "$0")/.."
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
VOICE_LOAD="${1:-1000}" VOICE_FRAMES="${2:-100}" go test ./voice -run '^TestRelayLoad$' -count=1 -v -timeout 300s | grep '^{"conversations"'
