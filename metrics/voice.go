package metrics

import "github.com/prometheus/client_golang/prometheus"

// VoiceStats is what the metrics read from the voice relay (the app fills
// it from voice.Relay.Stats).
type VoiceStats struct {
	Opened, Closed, Active, Refused, UpstreamErrors int64
	FramesUp, FramesDown, BytesUp, BytesDown        int64
	DroppedUp, DroppedDown                          int64
	TextUp, TextDown, MCPRequests, MCPRefused       int64
	// UpstreamUp is 1 when the last attempt reached the upstream, 0 when
	// it failed, -1 before any attempt.
	UpstreamUp int
}

// WatchVoice adds the devicebridge_voice_* series, read at scrape time.
func (m *Metrics) WatchVoice(stats func() VoiceStats) {
	if m.once("voice") {
		m.reg.MustRegister(&voiceCollector{stats: stats})
	}
}

var (
	voiceConversationsDesc = prometheus.NewDesc(Namespace+"_voice_conversations_total",
		`Relayed conversations by outcome: "opened", "closed", "refused" (voice.max_conversations).`, []string{"outcome"}, nil)
	voiceActiveDesc = prometheus.NewDesc(Namespace+"_voice_conversations_active",
		"Conversations relayed to the voice upstream now.", nil, nil)
	voiceErrorsDesc = prometheus.NewDesc(Namespace+"_voice_upstream_errors_total",
		"Conversations that could not start: the voice upstream was unreachable, refused, or sent no usable hello.", nil, nil)
	voiceUpDesc = prometheus.NewDesc(Namespace+"_voice_upstream_up",
		"1 when the last conversation reached the voice upstream, 0 when it failed, -1 before any.", nil, nil)
	voiceFramesDesc = prometheus.NewDesc(Namespace+"_voice_frames_total",
		`Audio frames relayed, by direction ("up": board to upstream, "down").`, []string{"direction"}, nil)
	voiceBytesDesc = prometheus.NewDesc(Namespace+"_voice_bytes_total",
		"Audio bytes relayed, by direction.", []string{"direction"}, nil)
	voiceDroppedDesc = prometheus.NewDesc(Namespace+"_voice_frames_dropped_total",
		"Audio frames dropped on a full queue, by direction.", []string{"direction"}, nil)
	voiceMessagesDesc = prometheus.NewDesc(Namespace+"_voice_messages_total",
		"Conversation messages (listen, stt, tts, ...) relayed, by direction.", []string{"direction"}, nil)
	voiceMCPDesc = prometheus.NewDesc(Namespace+"_voice_mcp_requests_total",
		`MCP messages from voice upstreams served through the board's queue ("served"), or refused past voice.mcp_queue ("refused").`,
		[]string{"outcome"}, nil)
)

type voiceCollector struct {
	stats func() VoiceStats
}

func (c *voiceCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{voiceConversationsDesc, voiceActiveDesc, voiceErrorsDesc, voiceUpDesc,
		voiceFramesDesc, voiceBytesDesc, voiceDroppedDesc, voiceMessagesDesc, voiceMCPDesc} {
		ch <- d
	}
}

func (c *voiceCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.stats()
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	counter(voiceConversationsDesc, st.Opened, "opened")
	counter(voiceConversationsDesc, st.Closed, "closed")
	counter(voiceConversationsDesc, st.Refused, "refused")
	ch <- prometheus.MustNewConstMetric(voiceActiveDesc, prometheus.GaugeValue, float64(st.Active))
	counter(voiceErrorsDesc, st.UpstreamErrors)
	ch <- prometheus.MustNewConstMetric(voiceUpDesc, prometheus.GaugeValue, float64(st.UpstreamUp))
	counter(voiceFramesDesc, st.FramesUp, "up")
	counter(voiceFramesDesc, st.FramesDown, "down")
	counter(voiceBytesDesc, st.BytesUp, "up")
	counter(voiceBytesDesc, st.BytesDown, "down")
	counter(voiceDroppedDesc, st.DroppedUp, "up")
	counter(voiceDroppedDesc, st.DroppedDown, "down")
	counter(voiceMessagesDesc, st.TextUp, "up")
	counter(voiceMessagesDesc, st.TextDown, "down")
	counter(voiceMCPDesc, st.MCPRequests, "served")
	counter(voiceMCPDesc, st.MCPRefused, "refused")
}
