package mcphttp

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// bodyInfo is what the front needs to know about a POST body: the era it
// speaks (route) and the calls it starts or cancels (trackCalls).
type bodyInfo struct {
	calls      []string // ids of tools/call requests
	cancels    []string // request ids named by notifications/cancelled
	discover   bool
	modernMeta bool
	// task is set when the body is one tools/call whose params ask for a
	// task (2025-11-25): its ttl in milliseconds, "0" when none was given.
	task string
	// initVersion is the protocolVersion an initialize asks for.
	initVersion string
}

type rpcMessage struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
}

// classify reads the JSON-RPC message or batch in a body. A body it cannot
// parse is left to the go-sdk to reject.
func classify(body []byte) bodyInfo {
	var info bodyInfo
	body = bytes.TrimSpace(body)
	var msgs []rpcMessage
	if len(body) > 0 && body[0] == '[' {
		if json.Unmarshal(body, &msgs) != nil {
			return info
		}
	} else {
		var m rpcMessage
		if json.Unmarshal(body, &m) != nil {
			return info
		}
		msgs = []rpcMessage{m}
		if m.Method == "tools/call" {
			info.task = taskTTL(m.Params)
		}
	}
	for _, m := range msgs {
		switch m.Method {
		case "tools/call":
			if k := idKey(m.ID); k != "" {
				info.calls = append(info.calls, k)
			}
		case "notifications/cancelled":
			var p struct {
				RequestID json.RawMessage `json:"requestId"`
			}
			if json.Unmarshal(m.Params, &p) == nil {
				if k := idKey(p.RequestID); k != "" {
					info.cancels = append(info.cancels, k)
				}
			}
		case "server/discover":
			info.discover = true
		case "initialize":
			var p struct {
				ProtocolVersion string `json:"protocolVersion"`
			}
			if json.Unmarshal(m.Params, &p) == nil && len(p.ProtocolVersion) <= len("2006-01-02") {
				info.initVersion = p.ProtocolVersion
			}
		}
		if bytes.Contains(m.Params, []byte(metaVersion)) {
			var p struct {
				Meta map[string]any `json:"_meta"`
			}
			if json.Unmarshal(m.Params, &p) == nil {
				if v, _ := p.Meta[metaVersion].(string); v >= ModernVersion {
					info.modernMeta = true
				}
			}
		}
	}
	return info
}

// taskTTL reads params.task of a tools/call: "" when there is none (or
// it is not an object), else its ttl in whole milliseconds ("0" when it
// gives none).
func taskTTL(params json.RawMessage) string {
	if !bytes.Contains(params, []byte(`"task"`)) {
		return ""
	}
	var p struct {
		Task *struct {
			TTL *float64 `json:"ttl"`
		} `json:"task"`
	}
	if json.Unmarshal(params, &p) != nil || p.Task == nil {
		return ""
	}
	if t := p.Task.TTL; t != nil && *t >= 1 && *t < 1<<53 {
		return strconv.FormatInt(int64(*t), 10)
	}
	return "0"
}

// idKey normalizes a JSON-RPC id so that 7, 7.0 and "7" compare as the
// JSON-RPC layer does (numbers by value, strings as strings).
func idKey(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	if raw[0] == '"' {
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return ""
		}
		return "s:" + s
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil {
		return ""
	}
	return "n:" + strconv.FormatFloat(f, 'f', -1, 64)
}
