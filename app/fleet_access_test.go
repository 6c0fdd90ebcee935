package app_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/audit"
)

// fleetAuditOf lists the routed calls a node's audit log recorded.
func fleetAuditOf(t *testing.T, path string) []audit.Record {
	t.Helper()
	var out []audit.Record
	for _, r := range readAudit(t, path) {
		if r.Via == "fleet" {
			out = append(out, r)
		}
	}
	return out
}

// TestRoutedCallsMeetTheHoldersPolicy (issue 24, defect 15): a call made
// on node a to a board node b holds carries the identity a authenticated;
// b applies its own policy to it (here stricter than a's) and audits it
// with that identity and the calling node. Interactions answered through
// another node keep the caller's identity down to the board's holder.
// Confirmation is asked where the caller is, on the routed path as on the
// local one.
func TestRoutedCallsMeetTheHoldersPolicy(t *testing.T) {
	noLeaks(t)
	url := startNATS(t)
	dir := t.TempDir()
	node := func(id, policy string) (string, string) {
		cfg := fleetConfig(url, id)
		cfg.Control.Tokens = []string{"kitchen=" + kitchenSecret, "stranger=" + strangerSecret}
		cfg.MCP.Tokens = cfg.Control.Tokens
		cfg.MCP.Aliases = map[string]string{kitchenMAC: "kitchen"}
		cfg.Auth.PolicyFile = filepath.Join(dir, id+".policy.yaml")
		require.NoError(t, os.WriteFile(cfg.Auth.PolicyFile, []byte(policy), 0o600))
		cfg.Auth.AuditLog = filepath.Join(dir, id+".audit.log")
		if id == "b" {
			b, base := startApp(t, cfg)
			connectBoard(t, b, kitchenMAC)
			return base, cfg.Auth.AuditLog
		}
		_, base := startApp(t, cfg)
		return base, cfg.Auth.AuditLog
	}
	// a lets kitchen do anything and asks to confirm the lamp; b, which
	// holds the board (named by its alias there), allows less.
	baseA, auditA := node("a", `identities:
  kitchen:
    boards: ["*"]
    confirm: ["self.lamp.turn_on"]
`)
	baseB, auditB := node("b", `identities:
  kitchen:
    boards: ["kitchen"]
    tools: ["self.get_device_status", "self.audio_speaker.*", "self.lamp.*"]
`)
	require.Eventually(t, func() bool {
		var list deviceList
		return doJSON(t, "GET", baseA+"/api/devices", kitchenSecret, "", &list) == http.StatusOK && len(list.Devices) == 1 &&
			list.Devices[0].State == "ready"
	}, 10*time.Second, 20*time.Millisecond)
	call := func(base, token, body string) (int, string) {
		var out struct {
			Error struct{ Message string }
		}
		code := doJSON(t, "POST", base+"/api/devices/"+kitchenMAC+"/call", token, body, &out)
		return code, out.Error.Message
	}

	code, _ := call(baseA, kitchenSecret, `{"name":"self.get_device_status"}`)
	require.Equal(t, http.StatusOK, code)
	// a's policy allows it; b's does not: refused by b, nothing ran.
	code, msg := call(baseA, kitchenSecret, `{"name":"self.screen.set_theme","arguments":{"theme":"dark"}}`)
	require.NotEqual(t, http.StatusOK, code)
	require.Contains(t, msg, "node b, which holds the board, refused the call")
	require.Contains(t, msg, "not allowed for kitchen (policy): self.screen.set_theme on board")
	// Refused by a already: b never hears of it.
	code, _ = call(baseA, strangerSecret, `{"name":"self.get_device_status"}`)
	require.Equal(t, http.StatusForbidden, code)

	// An interaction started on a, answered through b: b forwards the
	// answer to a with the caller's identity, and a's call to the board
	// on b carries it.
	var step struct {
		SessionID string `json:"sessionId"`
		State     string `json:"state"`
	}
	require.Equal(t, http.StatusOK, doJSON(t, "POST", baseA+"/api/devices/"+kitchenMAC+"/interactions", kitchenSecret,
		`{"name":"self.audio_speaker.set_volume","arguments":{}}`, &step))
	require.Equal(t, "waiting_user", step.State)
	require.Equal(t, http.StatusOK, doJSON(t, "POST", baseB+"/api/interactions/"+step.SessionID, kitchenSecret, `{"value":42}`, &step))
	require.Equal(t, "completed", step.State)

	// /mcp on a asks a's confirmation before routing the call.
	cs := mcpSession(t, baseA, tokenClient(t, kitchenSecret), "2025-11-25")
	var lamp string
	for _, name := range mcpTools(t, cs) {
		if strings.HasSuffix(name, "lamp_turn_on") {
			lamp = name
		}
	}
	require.NotEmpty(t, lamp)
	text, isErr := mcpCall(t, cs, lamp, map[string]any{})
	require.True(t, isErr)
	require.Contains(t, text, "needs the user's confirmation")
	text, isErr = mcpCall(t, cs, lamp, map[string]any{"confirm": true})
	require.False(t, isErr, text)

	type line struct{ Identity, Node, Tool, Outcome string }
	var got []line
	for _, r := range fleetAuditOf(t, auditB) {
		got = append(got, line{r.Identity, r.Node, r.Tool, r.Outcome})
	}
	require.Equal(t, []line{
		{"kitchen", "a", "self.get_device_status", "ok"},
		{"kitchen", "a", "self.screen.set_theme", "denied"},
		{"kitchen", "a", "self.audio_speaker.set_volume", "ok"},
		{"kitchen", "a", "self.lamp.turn_on", "ok"},
	}, got, "b audits every routed call with the caller a authenticated")
	require.Empty(t, fleetAuditOf(t, auditA), "a held no board")
	for _, r := range readAudit(t, auditB) {
		require.NotEqual(t, "stranger", r.Identity)
	}
}
