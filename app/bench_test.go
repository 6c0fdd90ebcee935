package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/internal/bridgetest"
)

// BenchmarkCallPath measures one tool call round trip to a simulated board
// over loopback WebSocket, two ways in the same run:
//
//   - hub: the device layer alone (hub.CallTool → envelope → WebSocket →
//     board → back), the baseline;
//   - control_api: the same call through POST /api/devices/{id}/call.
//
// Compare the two as a ratio; absolute figures depend on the machine.
//
//	go test -run '^$' -bench BenchmarkCallPath -benchtime 2000x ./app/
func BenchmarkCallPath(b *testing.B) {
	a := bridgetest.Start(b, func(c *app.Config) { c.Simulate.Count = 1 }).App
	const id = "02:00:00:00:00:01"
	require.Eventually(b, func() bool {
		s, ok := a.Hub.Session(id)
		return ok && s.Info().State == device.StateReady
	}, 10*time.Second, 5*time.Millisecond, "simulated board never became ready")
	args := json.RawMessage(`{"volume":40}`)
	const tool = "self.audio_speaker.set_volume"

	b.Run("hub", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := a.Hub.CallTool(context.Background(), id, tool, args); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("control_api", func(b *testing.B) {
		b.ReportAllocs()
		url := "http://" + a.ControlAddr().String() + "/api/devices/" + id + "/call"
		body := []byte(`{"name":"` + tool + `","arguments":{"volume":40}}`)
		for b.Loop() {
			resp, err := http.Post(url, "application/json", bytes.NewReader(body))
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Fatalf("status %d", resp.StatusCode)
			}
		}
		http.DefaultClient.CloseIdleConnections()
	})
}
