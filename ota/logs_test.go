package ota

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/internal/logthrottle"
)

// TestAnswerLinesAreThrottled: a board waiting for approval asks again
// and again, and anyone can ask as if it were a board; in approval mode
// or open mode, a flood of asks is one line per interval, the rest
// counted in the next.
func TestAnswerLinesAreThrottled(t *testing.T) {
	const n = 20
	for _, tc := range []struct {
		name, msg string
		cfg       Config
		th        func(*Server) *logthrottle.Throttle
	}{
		{"approval", "board waits for approval: approve it with POST /api/ota/devices/{id}/approve on the control listener",
			Config{Approval: true}, func(s *Server) *logthrottle.Throttle { return &s.infoWaiting }},
		{"open", "OTA answered", Config{}, func(s *Server) *logthrottle.Throttle { return &s.infoAnswered }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Secret, tc.cfg.RequestsPerSecond, tc.cfg.RequestBurst = "0123456789abcdef0123", 1e6, 1e6
			f := newFixture(t, tc.cfg, embedded())
			th := tc.th(f.srv)
			th.SetInterval(time.Hour)
			boot := func() {
				code, _, body := f.boot(t, boardHeaders())
				require.Equal(t, http.StatusOK, code, body)
			}
			for range n {
				boot()
			}
			require.Equal(t, 1, f.logs.FilterMessage(tc.msg).Len(), "one line for a flood of %d", n)
			th.SetInterval(time.Nanosecond)
			boot()
			lines := f.logs.FilterMessage(tc.msg).All()
			require.Len(t, lines, 2)
			assert.EqualValues(t, n-1, lines[1].ContextMap()["suppressed"])
		})
	}
}
