package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/frontdoor"
	"github.com/devicebridge/devicebridge/internal/argcheck"
	"github.com/devicebridge/devicebridge/policy"
)

func TestClassify(t *testing.T) {
	tests := []struct {
		err    error
		status int
		code   string
	}{
		{fmt.Errorf("%w: x", device.ErrUnknownDevice), http.StatusNotFound, "unknown_device"},
		{fmt.Errorf("%w: still initializing", device.ErrNotReady), http.StatusConflict, "device_not_ready"},
		{device.ErrNoMCP, http.StatusConflict, "device_without_mcp"},
		{fmt.Errorf("tools/call: %w", device.ErrTimeout), http.StatusGatewayTimeout, "device_timeout"},
		{device.ErrBusy, http.StatusServiceUnavailable, "device_busy"},
		{fmt.Errorf("tools/call: %w", device.ErrQueueTimeout), http.StatusServiceUnavailable, "device_queue_timeout"},
		{&device.DeviceError{Method: "tools/call", Message: "Unknown tool: x"}, http.StatusBadGateway, "device_error"},
		{fmt.Errorf("%w: %w", device.ErrOffline, device.ErrDisconnected), http.StatusBadGateway, "device_disconnected"},
		{context.Canceled, 499, "client_closed_request"},
		{&device.UnknownToolError{Tool: "x", Known: []string{"a"}}, http.StatusNotFound, "unknown_tool"},
		{&device.ArgumentsError{Tool: "x", Invalid: &argcheck.Invalid{}}, http.StatusUnprocessableEntity, "invalid_arguments"},
		{fmt.Errorf("%w: x", device.ErrShutdown), http.StatusServiceUnavailable, "shutting_down"},
		{errors.New("something else"), http.StatusBadGateway, "device_failure"},
	}
	for _, tt := range tests {
		status, code := classify(tt.err)
		assert.Equal(t, tt.status, status, tt.err.Error())
		assert.Equal(t, tt.code, code, tt.err.Error())
	}
}

func TestParseCall(t *testing.T) {
	req, err := parseCall([]byte(`{"name":"self.reboot","arguments":null}`))
	require.NoError(t, err)
	assert.Nil(t, req.Arguments)
	req, err = parseCall([]byte(`{"name":"a","arguments":{"x":1}}`))
	require.NoError(t, err)
	assert.JSONEq(t, `{"x":1}`, string(req.Arguments))
	for _, bad := range []string{``, `{}`, `{"name":"a"} {"name":"b"}`, `{"name":"a","arguments":"x"}`, `{"name":1}`, `{"tool":"a"}`} {
		_, err := parseCall([]byte(bad))
		assert.Error(t, err, bad)
	}
}

// TestJSONErrorsForUnknownRoutes: ServeMux answers unknown paths and
// methods in plain text; the control listener answers the documented JSON.
func TestJSONErrorsForUnknownRoutes(t *testing.T) {
	mux := newMux(t)
	New(device.NewHub(device.HubConfig{}, nil), Options{}, nil).Register(mux)
	srv := httptest.NewServer(JSONErrors(mux))
	defer srv.Close()

	for _, tc := range []struct {
		method, path string
		status       int
		code         string
	}{
		{http.MethodGet, "/api/nope", http.StatusNotFound, "not_found"},
		{http.MethodGet, "/", http.StatusNotFound, "not_found"},
		{http.MethodDelete, "/api/devices", http.StatusMethodNotAllowed, "method_not_allowed"},
		{http.MethodGet, "/api/devices/x/call", http.StatusMethodNotAllowed, "method_not_allowed"},
	} {
		req, err := http.NewRequest(tc.method, srv.URL+tc.path, nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		var body ErrorBody
		assert.Equal(t, "application/json", resp.Header.Get("Content-Type"), tc.path)
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body), tc.path)
		resp.Body.Close()
		assert.Equal(t, tc.status, resp.StatusCode, tc.path)
		assert.Equal(t, tc.code, body.Error.Code, tc.path)
		if tc.status == http.StatusMethodNotAllowed {
			assert.NotEmpty(t, resp.Header.Get("Allow"))
		}
	}
	resp, err := http.Get(srv.URL + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, "matched routes are served as they are")
}

// newMux is the control listener's front door with no credentials, as the
// app builds it by default.
func newMux(t *testing.T) *frontdoor.Mux {
	t.Helper()
	m, err := frontdoor.NewMux(frontdoor.Config{AllowedOrigins: frontdoor.DefaultAllowedOrigins, Refuse: Refuse})
	require.NoError(t, err)
	return m
}

// TestAnswersAreNotHTMLEscaped: a JSON API writes "<tool>" as it is, not
// as "\u003ctool\u003e" (encoding/json's default, meant for HTML pages).
func TestAnswersAreNotHTMLEscaped(t *testing.T) {
	mux := newMux(t)
	New(device.NewHub(device.HubConfig{}, nil), Options{}, nil).Register(mux)
	srv := httptest.NewServer(JSONErrors(mux))
	defer srv.Close()

	resp, err := http.Post(srv.URL+"/api/devices/x/call", "application/json", strings.NewReader(`{"name":`))
	require.NoError(t, err)
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, string(raw), `{\"name\": \"<tool>\"`)
	assert.NotContains(t, string(raw), `\u003c`)
}

func TestEventDataIsNotHTMLEscaped(t *testing.T) {
	var buf bytes.Buffer
	writeEvent(&buf, "e", device.Event{Type: device.EventCall, DeviceID: "aa", Call: device.CallOutcome{Tool: "a<b>&c"}}, "", nil)
	assert.Contains(t, buf.String(), `"tool":"a<b>&c"`)
	assert.Equal(t, 4, strings.Count(buf.String(), "\n"), "one data line: %q", buf.String())
}

// TestRefusalKeepsToolName: a policy refusal names the tool exactly as
// called (tool names are case-sensitive), never "Self.lamp.turn_on".
func TestRefusalKeepsToolName(t *testing.T) {
	p, err := policy.Parse([]byte("identities:\n  office:\n    boards: [\"*\"]\n    tools: [\"self.audio_speaker.*\"]\n"))
	require.NoError(t, err)
	mux := newMux(t)
	New(device.NewHub(device.HubConfig{}, nil), Options{Access: Access{Policy: policy.New(p)}}, nil).Register(mux)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mux.ServeHTTP(w, r.WithContext(policy.WithIdentity(r.Context(), policy.Identity{Name: "office"})))
	}))
	defer srv.Close()

	resp, err := http.Post(srv.URL+"/api/devices/02:00:00:00:00:02/call", "application/json", strings.NewReader(`{"name":"self.lamp.turn_on"}`))
	require.NoError(t, err)
	var body ErrorBody
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	resp.Body.Close()
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	assert.Equal(t, "not_allowed", body.Error.Code)
	assert.Equal(t, "not allowed for office (policy): self.lamp.turn_on on board 02:00:00:00:00:02; nothing was sent to the board", body.Error.Message)
}
