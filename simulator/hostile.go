package simulator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Hostile makes a board misbehave on purpose, the way an attacker's board
// would, so that the fault campaign and a user testing a deployment can
// check the server's defences with the real protocols. No firmware does
// any of this; a Board without Hostile stays firmware-faithful.
type Hostile struct {
	// DeviceID is sent verbatim in place of the MAC: as the WebSocket
	// Device-Id header, and as the MAC part of the MQTT client id and the
	// {mac} of the board's topics. Use it for spellings of a MAC the
	// firmware never sends (02-00-00-00-00-01, 020000000001, upper case) or
	// for ids that are no MAC at all (kitchen).
	DeviceID string
	// ExtraTools are raw tool objects (JSON) the board lists after its
	// profile's tools: deep or huge schemas, long names, odd types. A tool
	// larger than the firmware's page budget gets a page of its own
	// instead of the firmware's "payload size limit" error. Calling one
	// answers "Unknown tool", as the firmware would for a tool it lacks.
	ExtraTools []string
	// MACSpelling rewrites the board's MAC before it goes on the wire, when
	// DeviceID is empty: "upper" (02:AB:…), "dash" (02-ab-…), "bare"
	// (02ab…), "underscore" (02_ab_…). One board of a fleet can then claim
	// another's MAC in a spelling the firmware never uses.
	MACSpelling string
	// FloodOnConnect publishes this many messages on the board's publish
	// topic right after its first MQTT connect, as fast as the broker takes
	// them (FloodPayload, or a small JSON message of an unknown type).
	FloodOnConnect int
	FloodPayload   string
}

// MACSpellings are the values Hostile.MACSpelling accepts.
var MACSpellings = []string{"upper", "dash", "bare", "underscore"}

// spell writes mac the way MACSpelling says.
func (h *Hostile) spell(mac string) string {
	switch h.MACSpelling {
	case "upper":
		return strings.ToUpper(mac)
	case "dash":
		return strings.ReplaceAll(mac, ":", "-")
	case "bare":
		return strings.ReplaceAll(mac, ":", "")
	case "underscore":
		return strings.ReplaceAll(mac, ":", "_")
	}
	return mac
}

func (h *Hostile) floodPayload() string {
	if h.FloodPayload != "" {
		return h.FloodPayload
	}
	return `{"type":"flood","payload":"x"}`
}

// validate checks what the transports must be able to carry.
func (h *Hostile) validate() error {
	if strings.ContainsAny(h.DeviceID, "\r\n\x00") {
		return errors.New("simulator: hostile device id contains a line break or NUL")
	}
	if h.MACSpelling != "" && !slices.Contains(MACSpellings, h.MACSpelling) {
		return fmt.Errorf("simulator: hostile MAC spelling %q: want one of %s", h.MACSpelling, strings.Join(MACSpellings, ", "))
	}
	if h.FloodOnConnect < 0 {
		return errors.New("simulator: hostile flood count must not be negative")
	}
	for i, raw := range h.ExtraTools {
		var t struct {
			Name string `json:"name"`
		}
		if err := json.Unmarshal([]byte(raw), &t); err != nil {
			return fmt.Errorf("simulator: hostile extra tool %d is not a JSON object: %w", i, err)
		}
	}
	return nil
}

// listedTool is one entry of the board's tools/list: a profile tool or a
// hostile extra.
type listedTool struct {
	name     string
	userOnly bool
	json     string
	// unpaged: may exceed the page budget, alone on its page.
	unpaged bool
}

// listing builds the board's tools/list entries.
func (b *Board) listing() []listedTool {
	p := b.profile
	out := make([]listedTool, 0, len(p.Tools))
	for i := range p.Tools {
		out = append(out, listedTool{name: p.Tools[i].Name, userOnly: p.Tools[i].UserOnly, json: renderTool(&p.Tools[i])})
	}
	if h := b.cfg.Hostile; h != nil {
		for _, raw := range h.ExtraTools {
			var t struct {
				Name string `json:"name"`
			}
			_ = json.Unmarshal([]byte(raw), &t) // checked by validate
			out = append(out, listedTool{name: t.Name, json: raw, unpaged: true})
		}
	}
	return out
}

// deviceID is what the board calls itself on the wire: its MAC, unless a
// hostile board pretends otherwise.
func (b *Board) deviceID() string {
	if h := b.cfg.Hostile; h != nil {
		if h.DeviceID != "" {
			return h.DeviceID
		}
		return h.spell(b.mac)
	}
	return b.mac
}

// DeepSchemaTool is a tool whose inputSchema nests depth objects, each
// the only property of the one around it: a few bytes per level, so it
// fits far under any frame limit while reaching depths that overflow
// recursive schema code.
func DeepSchemaTool(name string, depth int) string {
	var sb strings.Builder
	sb.WriteString(`{"name":` + strconv.Quote(name) + `,"description":"deep schema","inputSchema":`)
	for range depth {
		sb.WriteString(`{"type":"object","properties":{"a":`)
	}
	sb.WriteString(`{"type":"string"}`)
	for range depth {
		sb.WriteString(`}}`)
	}
	sb.WriteString(`}`)
	return sb.String()
}

// WideSchemaTool is a tool whose inputSchema has n properties, each an
// integer with a range and a description of descLen bytes.
func WideSchemaTool(name string, n, descLen int) string {
	desc := strconv.Quote(strings.Repeat("d", descLen))
	var sb strings.Builder
	sb.WriteString(`{"name":` + strconv.Quote(name) + `,"description":"wide schema","inputSchema":{"type":"object","properties":{`)
	for i := range n {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `"p%d":{"type":"integer","minimum":0,"maximum":%d,"description":%s}`, i, i+1, desc)
	}
	sb.WriteString(`}}}`)
	return sb.String()
}

// Flood publishes payload n times on the board's publish topic (QoS 0), as
// fast as the broker takes them: a board that never stops talking. It
// returns how many were published before the first failure.
func (c *MQTTConn) Flood(ctx context.Context, n int, payload []byte) (int, error) {
	for i := range n {
		tok := c.client.Publish(c.cfg.PublishTopic, 0, false, payload)
		select {
		case <-tok.Done():
			if err := tok.Error(); err != nil {
				return i, err
			}
		case <-ctx.Done():
			return i, ctx.Err()
		}
	}
	return n, nil
}

// SilenceMCP makes the board drop every MCP request without a word while
// on, as a board too busy to answer does, and answer again once off. The
// connection stays up. No firmware does this on purpose; it exists to test
// how a server retries a board that failed to initialize.
func (b *Board) SilenceMCP(on bool) { b.mcpSilent.Store(on) }
