// Package faults is the bridge's fault campaign: tests that start a real
// bridge in-process (real listeners on 127.0.0.1 port 0, the embedded MQTT
// broker, a real Mosquitto where one is installed, the real simulator) and
// inject the faults boards, brokers and clients produce in the field —
// boards dropping or going silent mid-call, floods of calls, reconnect
// storms, broker and bridge restarts, malformed and oversized input on
// every listener, and attempts to get past each listener's checks; and
// what an attacker does: hostile boards (the simulator's hostile mode:
// deep and huge schemas, MAC spellings, floods), floods of MCP sessions,
// OTA calls and idle connections, outsiders on the fleet bus.
//
// Every scenario counts what it tried, what survived (the bridge gave a
// clear answer and stayed healthy) and what was lost, by kind: a crash
// (the bridge or a reference board stopped answering; a panic ends the
// test binary, so the campaign finishing proves there was none), a hang
// (no answer in time), growth (a resource past its documented bound), a
// bypass (something refused by design got through), or a wrong answer.
// It prints a summary line and fails on any loss. The last test logs the
// table of all scenarios. Every loop is bounded in count and time: the
// whole campaign takes a few minutes at most.
//
// The tests sit behind the build tag faults, so the ordinary test run
// does not pay for them. Run them with
//
//	go test -tags faults -race -count=1 ./faults/
//
// and add -v to see each scenario's summary line and the table.
// docs/reliability.md describes each scenario and the figures of the last
// recorded run. Tests that need Mosquitto skip without it, unless
// DEVICEBRIDGE_REQUIRE_MOSQUITTO=1.
package faults
