package mqtt_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/devicebridge/devicebridge/internal/clip"
	"github.com/devicebridge/devicebridge/mqtt/mosquittotest"
)

// TestUnknownTopicIsCut: behind an external broker anyone may publish on
// the uplink filter; a topic that names no board is the publisher's, up to
// 64 KiB, and the line that drops it quotes it cut.
func TestUnknownTopicIsCut(t *testing.T) {
	mq := mosquittotest.Start(t)
	core, logs := observer.New(zapcore.InfoLevel)
	br := startExternal(t, mq.URL(), options{log: zap.New(core)})
	br.waitSubscribed()
	c := rawBoard(t, mq.URL(), "intruder")
	topic := "devices/up/" + strings.Repeat("k", 20_000)
	tok := c.Publish(topic, 0, false, `{"type":"hello"}`)
	require.True(t, tok.WaitTimeout(wait))
	require.NoError(t, tok.Error())
	require.Eventually(t, func() bool { return br.gw.Stats().UnknownTopic == 1 }, wait, tick)
	lines := logs.FilterMessageSnippet("dropped uplink message on a topic that names no board").All()
	require.Len(t, lines, 1)
	assert.Equal(t, clip.String(topic), lines[0].ContextMap()["topic"])
}
