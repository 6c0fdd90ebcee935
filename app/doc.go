// Package app assembles a bridge from its configuration: the device Hub,
// the device listener (WebSocket), the MQTT side, the control listener
// (control API and upstream MCP), optional in-process simulated boards,
// and the ordered shutdown of all of it. cmd/bridge only parses flags and
// calls Run.
package app
