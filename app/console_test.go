package app_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/simulator"
)

func doJSON(t *testing.T, method, url, token, body string, out any) int {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	if out != nil {
		require.NoError(t, json.Unmarshal(data, out), "body: %s", data)
	}
	return resp.StatusCode
}

// TestConsoleIsServed: the page and its assets on the control listener,
// with a strict content policy; no directory listing; unknown paths keep
// the JSON error.
func TestConsoleIsServed(t *testing.T) {
	noLeaks(t)
	cfg := testConfig()
	cfg.Control.Tokens = []string{"tok"}
	_, base := startApp(t, cfg)

	resp, err := http.Get(base + "/")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode, "the page is public: it holds no fleet data")
	assert.Contains(t, resp.Header.Get("Content-Type"), "text/html")
	assert.Contains(t, resp.Header.Get("Content-Security-Policy"), "default-src 'self'")
	assert.Contains(t, string(body), `<script src="/console/app.js" defer></script>`)
	assert.NotContains(t, string(body), "http://", "no CDN or other origin")
	assert.NotContains(t, string(body), "https://", "no CDN or other origin")

	for path, ctype := range map[string]string{"/console/app.js": "javascript", "/console/app.css": "text/css"} {
		resp, err := http.Get(base + path)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, 200, resp.StatusCode, path)
		assert.Contains(t, resp.Header.Get("Content-Type"), ctype, path)
	}
	resp, err = http.Get(base + "/console/")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 404, resp.StatusCode, "no directory listing")

	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	assert.Equal(t, 404, doJSON(t, "GET", base+"/nope", "", "", &e))
	assert.Equal(t, "not_found", e.Error.Code)
	assert.Equal(t, 401, doJSON(t, "GET", base+"/api/devices", "", "", &e), "the data stays behind the tokens")
	assert.Equal(t, 401, doJSON(t, "POST", base+"/api/devices/aa:00:00:00:00:31/interactions", "", `{"name":"self.reboot"}`, &e))
}

type step struct {
	SessionID     string `json:"sessionId"`
	State         string `json:"state"`
	Accepted      *bool  `json:"accepted"`
	InitialPrompt *struct {
		Type, Property string
	} `json:"initialPrompt"`
	NextPrompt *struct {
		Type, Property, Error string
	} `json:"nextPrompt"`
	Validation *struct {
		Valid bool
		Error string
	} `json:"validation"`
	Result *struct {
		Success bool `json:"success"`
		Data    struct {
			Content []struct{ Text string } `json:"content"`
		} `json:"data"`
	} `json:"result"`
}

// TestControlInteractions: a guided call on the control API asks for the
// missing argument, refuses a bad answer with the reason, runs with a good
// one; a dangerous user-only tool asks for confirmation and declining sends
// nothing; interactions belong to their caller; boards carry their alias.
func TestControlInteractions(t *testing.T) {
	noLeaks(t)
	cfg := testConfig()
	cfg.Control.Tokens = []string{"alice", "bob"}
	cfg.MCP.Aliases = map[string]string{"AA:00:00:00:00:32": "kitchen"}
	a, base := startApp(t, cfg)
	obsBoard(t, a, simulator.Config{MAC: "aa:00:00:00:00:31"})
	obsBoard(t, a, simulator.Config{MAC: "aa:00:00:00:00:32"})
	dev := base + "/api/devices/aa:00:00:00:00:31"
	require.Eventually(t, func() bool {
		var d struct{ State string }
		return doJSON(t, "GET", dev, "alice", "", &d) == 200 && d.State == "ready"
	}, obsWait, 10*time.Millisecond)

	var list struct {
		Devices []struct {
			DeviceID string `json:"device_id"`
			Alias    string `json:"alias"`
		} `json:"devices"`
	}
	require.Equal(t, 200, doJSON(t, "GET", base+"/api/devices", "alice", "", &list))
	aliases := map[string]string{}
	for _, d := range list.Devices {
		aliases[d.DeviceID] = d.Alias
	}
	assert.Equal(t, map[string]string{"aa:00:00:00:00:31": "dev_000031", "aa:00:00:00:00:32": "kitchen"}, aliases)

	var s step
	require.Equal(t, 200, doJSON(t, "POST", dev+"/interactions", "alice", `{"name":"self.audio_speaker.set_volume","arguments":{}}`, &s))
	require.Equal(t, "waiting_user", s.State)
	require.NotNil(t, s.InitialPrompt)
	assert.Equal(t, "volume", s.InitialPrompt.Property)
	assert.Equal(t, "number", s.InitialPrompt.Type)

	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	assert.Equal(t, 404, doJSON(t, "POST", base+"/api/interactions/"+s.SessionID, "bob", `{"value":40}`, &e), "another caller's interaction")
	assert.Equal(t, "unknown_interaction", e.Error.Code)

	sid := s.SessionID
	s = step{}
	require.Equal(t, 200, doJSON(t, "POST", base+"/api/interactions/"+sid, "alice", `{"value":150}`, &s))
	assert.False(t, *s.Accepted)
	assert.Contains(t, s.Validation.Error, "above the maximum of 100")
	require.NotNil(t, s.NextPrompt, "asked again")
	s = step{}
	require.Equal(t, 200, doJSON(t, "POST", base+"/api/interactions/"+sid, "alice", `{"value":40}`, &s))
	assert.Equal(t, "completed", s.State)
	require.NotNil(t, s.Result)
	assert.True(t, s.Result.Success)
	assert.Equal(t, "true", s.Result.Data.Content[0].Text, "the board's whole answer is the result's data")
	var res struct{ Content []struct{ Text string } }
	require.Equal(t, 200, doJSON(t, "POST", dev+"/call", "alice", `{"name":"self.get_device_status"}`, &res))
	assert.Contains(t, res.Content[0].Text, `"volume":40`)
	assert.Equal(t, 409, doJSON(t, "POST", base+"/api/interactions/"+sid, "alice", `{"value":41}`, &e), "finished")

	// A user-only, dangerous tool: confirmation, and no runs nothing.
	s = step{}
	require.Equal(t, 200, doJSON(t, "POST", dev+"/interactions", "alice", `{"name":"self.reboot"}`, &s))
	require.NotNil(t, s.InitialPrompt)
	assert.Equal(t, "confirm", s.InitialPrompt.Type)
	sid = s.SessionID
	s = step{}
	require.Equal(t, 200, doJSON(t, "POST", base+"/api/interactions/"+sid, "alice", `{"value":false}`, &s))
	assert.Equal(t, "cancelled", s.State)
	var d struct{ State string }
	require.Equal(t, 200, doJSON(t, "GET", dev, "alice", "", &d))
	assert.Equal(t, "ready", d.State)

	// Cancel, state, and the errors of a call.
	s = step{}
	require.Equal(t, 200, doJSON(t, "POST", dev+"/interactions", "alice", `{"name":"self.screen.set_theme"}`, &s))
	var snap struct {
		State    string
		Metadata struct{ ToolName string } `json:"metadata"`
	}
	require.Equal(t, 200, doJSON(t, "GET", base+"/api/interactions/"+s.SessionID, "alice", "", &snap))
	assert.Equal(t, "waiting_user", snap.State)
	assert.Equal(t, 200, doJSON(t, "DELETE", base+"/api/interactions/"+s.SessionID, "alice", "", nil))
	assert.Equal(t, 409, doJSON(t, "DELETE", base+"/api/interactions/"+s.SessionID, "alice", "", &e))
	assert.Equal(t, "interaction_cancelled", e.Error.Code)

	for _, tc := range []struct {
		url, body string
		status    int
		code      string
	}{
		{base + "/api/devices/ff:ff:ff:ff:ff:ff/interactions", `{"name":"self.reboot"}`, 404, "unknown_device"},
		{dev + "/interactions", `{"name":"self.nope"}`, 404, "unknown_tool"},
		{dev + "/interactions", `{"name":"self.audio_speaker.set_volume","arguments":{"loudness":3}}`, 422, "invalid_arguments"},
		{dev + "/interactions", `{"arguments":{}}`, 400, "bad_request"},
		{dev + "/interactions", `{"name":"x","extra":1}`, 400, "bad_request"},
	} {
		assert.Equal(t, tc.status, doJSON(t, "POST", tc.url, "alice", tc.body, &e), tc.body)
		assert.Equal(t, tc.code, e.Error.Code, tc.body)
	}
}
