package mqtt

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/devicebridge/devicebridge/device"
)

// TestCloseCauses: every way the gateway closes a link carries a cause the
// device layer (metrics, logs) can branch on, and the goodbye-on-close rule
// follows the cause rather than comparing error values.
func TestCloseCauses(t *testing.T) {
	for _, tc := range []struct {
		reason  error
		cause   device.CloseCause
		goodbye bool
	}{
		{device.Closing(device.CauseBrokerLost, ErrBrokerConnectionLost), device.CauseBrokerLost, false},
		{device.Closing(device.CauseDisconnected, ErrBoardDisconnected), device.CauseDisconnected, false},
		{device.Closing(device.CauseReplaced, ErrBoardReconnected), device.CauseReplaced, true},
		{device.Closing(device.CauseShutdown, device.ErrShutdown), device.CauseShutdown, true},
		{device.Closing(device.CauseUnresponsive, ErrUnresponsive), device.CauseUnresponsive, true},
	} {
		assert.Equal(t, tc.cause, device.CauseOf(tc.reason), tc.reason.Error())
		assert.Equal(t, tc.goodbye, sayGoodbyeOnClose(tc.reason), tc.reason.Error())
		var ce *device.CloseError
		assert.True(t, errors.As(tc.reason, &ce))
	}
	// The sentinels stay testable with errors.Is through the wrapping.
	assert.ErrorIs(t, device.Closing(device.CauseBrokerLost, ErrBrokerConnectionLost), ErrBrokerConnectionLost)
}
