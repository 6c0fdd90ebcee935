package app_test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/simulator"
)

// waitDevice waits until the Hub has id ready (the MCP catalogue too).
func waitDevice(t *testing.T, a *app.App, id string) {
	t.Helper()
	require.Eventually(t, func() bool {
		info, ok := a.Hub.Device(id)
		return ok && info.State == device.StateReady && (a.MCP() == nil || a.MCP().Published(id))
	}, obsWait, 5*time.Millisecond, "%s ready", id)
}

type apiDevice struct {
	DeviceID string `json:"device_id"`
	Alias    string `json:"alias"`
}

// TestAPINamesWinOverChosenIDs: /api/devices/{id} resolves a name the
// operator configured before a device id a board chose (with
// websocket.allow_any_device_id), also while the named board is away.
func TestAPINamesWinOverChosenIDs(t *testing.T) {
	noLeaks(t)
	const real = "02:00:00:00:0e:01"
	cfg := testConfig()
	cfg.WebSocket.AllowAnyDeviceID = true
	cfg.MCP.Aliases = map[string]string{"02-00-00-00-0E-01": "kitchen"}
	a, base := startApp(t, cfg)
	board := obsBoard(t, a, simulator.Config{MAC: real})
	fake := obsBoard(t, a, simulator.Config{Hostile: &simulator.Hostile{DeviceID: "kitchen"}})
	waitDevice(t, a, real)
	waitDevice(t, a, "kitchen")

	for _, ref := range []string{"kitchen", "KITCHEN", "02-00-00-00-0E-01", "020000000e01"} {
		var d apiDevice
		require.Equal(t, http.StatusOK, getJSON(t, base+"/api/devices/"+ref, &d), ref)
		assert.Equal(t, real, d.DeviceID, ref)
		assert.Equal(t, "kitchen", d.Alias, ref)
	}
	require.Equal(t, http.StatusOK, obsPost(t, http.DefaultClient, base+"/api/devices/kitchen/call", `{"name":"self.lamp.turn_on"}`))
	assert.Equal(t, true, board.State()["lamp.power"])
	assert.Equal(t, false, fake.State()["lamp.power"], "the board that chose the name got nothing")

	var list struct{ Devices []apiDevice }
	require.Equal(t, http.StatusOK, getJSON(t, base+"/api/devices", &list))
	for _, d := range list.Devices {
		if d.DeviceID == "kitchen" {
			assert.True(t, strings.HasPrefix(d.Alias, "kitchen_"), "the impostor is shown under another alias: %s", d.Alias)
		}
	}

	// The named board leaves: its name finds nothing.
	require.NoError(t, board.Close())
	require.Eventually(t, func() bool { _, ok := a.Hub.Device(real); return !ok }, obsWait, 5*time.Millisecond)
	var d apiDevice
	require.Equal(t, http.StatusNotFound, getJSON(t, base+"/api/devices/kitchen", &d))
	require.Equal(t, http.StatusNotFound, obsPost(t, http.DefaultClient, base+"/api/devices/kitchen/call", `{"name":"self.lamp.turn_on"}`))
	assert.Equal(t, false, fake.State()["lamp.power"])
}

// TestPolicyNamesAreNotIDs: a policy entry naming a board by alias
// ("office") gives no rights to a board that chose "office" as its id.
func TestPolicyNamesAreNotIDs(t *testing.T) {
	noLeaks(t)
	ab := startAccessBridge(t, func(c *app.Config) { c.WebSocket.AllowAnyDeviceID = true })
	fake := obsBoard(t, ab.app, simulator.Config{Hostile: &simulator.Hostile{DeviceID: "office"}})
	waitDevice(t, ab.app, "office")
	officeHC := tokenClient(t, ab.officeToken(t))

	office := mcpSession(t, ab.base, officeHC, "2026-07-28")
	require.Equal(t, []string{"office_audio_speaker_set_volume", "office_get_device_status"}, mcpTools(t, office),
		"the office sees its board only")
	req, err := http.NewRequest(http.MethodGet, ab.base+"/api/devices", nil)
	require.NoError(t, err)
	resp, err := officeHC.Do(req)
	require.NoError(t, err)
	var list struct{ Devices []apiDevice }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&list))
	resp.Body.Close()
	require.Len(t, list.Devices, 1)
	assert.Equal(t, officeMAC, list.Devices[0].DeviceID)
	// By that name the office reaches its own board, never the impostor.
	resp, err = officeHC.Get(ab.base + "/api/devices/office")
	require.NoError(t, err)
	var d apiDevice
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&d))
	resp.Body.Close()
	assert.Equal(t, officeMAC, d.DeviceID)
	assert.Equal(t, uint64(0), fake.Stats().CallsRun)
}

// TestAliasConfigChecks: mcp.aliases (and --mcp-alias) take MACs as keys,
// each board once, and valid names (the rule /mcp tool names use), each
// on one board; anything else stops the start with an error naming the key.
func TestAliasConfigChecks(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bridge.yaml")
	for _, tc := range []struct{ yaml, want string }{
		{"mcp:\n  aliases: {kitchen: lamp}\n", `mcp.aliases: key "kitchen" is not a MAC`},
		{"mcp:\n  aliases: {\"aa:bb:cc:dd:ee:01\": \"bad alias!\"}\n", `mcp.aliases[aa:bb:cc:dd:ee:01]: alias "bad alias!" is not a valid name`},
		{"mcp:\n  aliases: {\"aa:bb:cc:dd:ee:01\": a, \"AA-BB-CC-DD-EE-01\": b}\n", "are the same board"},
		{"mcp:\n  aliases: {\"aa:bb:cc:dd:ee:01\": hall, \"aa:bb:cc:dd:ee:02\": Hall}\n", `"Hall" names two boards`},
		{"mcp:\n  enabled: false\n  aliases: {\"aa:bb:cc:dd:ee:01\": \"a b\"}\n", `alias "a b" is not a valid name`},
	} {
		require.NoError(t, os.WriteFile(path, []byte(tc.yaml), 0o600))
		_, err := app.ParseArgs("bridge", []string{"--config", path})
		require.ErrorContains(t, err, tc.want, tc.yaml)
	}
	_, err := app.ParseArgs("bridge", []string{"--mcp-alias", "aa:bb:cc:dd:ee:01=bad alias!"})
	require.ErrorContains(t, err, "is not a valid name")
	_, err = app.ParseArgs("bridge", []string{"--mcp-alias", "kitchen=lamp"})
	require.ErrorContains(t, err, "is not a MAC")
	cfg, err := app.ParseArgs("bridge", []string{"--mcp-alias", "AA-BB-CC-DD-EE-01=kitchen", "--data-dir", ""})
	require.NoError(t, err)
	_, err = app.New(cfg, nil)
	require.NoError(t, err)
	// An empty alias (no prefix), by flag or in the file.
	cfg, err = app.ParseArgs("bridge", []string{"--mcp-alias", "AA-BB-CC-DD-EE-02=", "--data-dir", ""})
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"AA-BB-CC-DD-EE-02": ""}, cfg.MCP.Aliases)
	require.NoError(t, os.WriteFile(path, []byte("mcp:\n  aliases: {\"aa:bb:cc:dd:ee:02\": \"\"}\n"), 0o600))
	_, err = app.ParseArgs("bridge", []string{"--config", path, "--data-dir", ""})
	require.NoError(t, err)
}
