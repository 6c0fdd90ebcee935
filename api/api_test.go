package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/mcpclient"
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
		{fmt.Errorf("tools/call: %w", mcpclient.ErrTimeout), http.StatusGatewayTimeout, "device_timeout"},
		{mcpclient.ErrBusy, http.StatusServiceUnavailable, "device_busy"},
		{&mcpclient.DeviceError{Method: "tools/call", Message: "Unknown tool: x"}, http.StatusBadGateway, "device_error"},
		{fmt.Errorf("%w: %w", device.ErrOffline, mcpclient.ErrDisconnected), http.StatusBadGateway, "device_disconnected"},
		{context.Canceled, 499, "client_closed_request"},
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
