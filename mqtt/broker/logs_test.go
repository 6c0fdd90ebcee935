package broker

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/devicebridge/devicebridge/internal/clip"
	"github.com/devicebridge/devicebridge/mqtt/floodtest"
)

// TestClientStringsAreCut: a client id and a topic are the client's own,
// up to 64 KiB each; every line quoting them cuts them, whether the
// client is refused, admitted or denied a topic.
func TestClientStringsAreCut(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	b := startBrokerWith(t, Config{}, zap.New(core))
	long := strings.Repeat("g", 20_000)

	_, code := floodtest.Connect(t, b.Addr().String(), long)
	require.EqualValues(t, 2, code, "identifier rejected")

	c, code := floodtest.Connect(t, b.Addr().String(), "GID_"+long+"@@@02_00_00_00_0f_01@@@uuid")
	require.Zero(t, code, "a board's client id may carry a long group")
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, floodtest.Publish(c, "elsewhere/"+long, []byte("{}")))
	require.NoError(t, floodtest.Ping(c)) // the publish was handled

	for _, msg := range []string{"refused mqtt client: client id does not name a board", "board connected", "denied a board's publish"} {
		require.NotZero(t, logs.FilterMessageSnippet(msg).Len(), msg)
	}
	for _, e := range logs.All() {
		for k, v := range e.ContextMap() {
			if s, ok := v.(string); ok {
				assert.LessOrEqual(t, len(s), clip.Max+40, "%s: %s is not cut", e.Message, k)
			}
		}
	}
}
