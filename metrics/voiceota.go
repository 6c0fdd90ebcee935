package metrics

import "github.com/prometheus/client_golang/prometheus"

// VoiceOTAStats is what the metrics read from the OTA pass-through to a
// voice upstream (the app fills it from ota.Server.UpstreamStats).
type VoiceOTAStats struct {
	// Requests counts the calls sent to the upstream's OTA endpoint (boot
	// calls and activation polls).
	Requests int64
	// Errors counts failed calls and dropped answer pieces by reason.
	Errors map[string]int64
}

// WatchVoiceOTA adds devicebridge_voice_ota_upstream_requests_total and
// devicebridge_voice_ota_upstream_errors_total{reason}, read at scrape
// time from stats. stats reports false while no voice upstream is
// configured; the series are then absent.
func (m *Metrics) WatchVoiceOTA(stats func() (VoiceOTAStats, bool)) {
	if m.once("voice_ota") {
		m.reg.MustRegister(&voiceOTACollector{stats: stats})
	}
}

var (
	voiceOTARequestsDesc = prometheus.NewDesc(Namespace+"_voice_ota_upstream_requests_total",
		"Calls the bridge sent to the voice upstream's OTA endpoint: boot calls and activation polls of admitted boards.", nil, nil)
	voiceOTAErrorsDesc = prometheus.NewDesc(Namespace+"_voice_ota_upstream_errors_total",
		`Calls to the voice upstream's OTA endpoint that failed, and pieces of its answers dropped, by reason: `+
			`"timeout", "unreachable", "status", "invalid", "oversized", "busy" (voice.ota_max_in_flight reached; not sent), `+
			`"unsafe" (a piece that would break or flash the board). A failed boot call leaves the board the bridge's own answer.`,
		[]string{"reason"}, nil)
)

type voiceOTACollector struct {
	stats func() (VoiceOTAStats, bool)
}

func (c *voiceOTACollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- voiceOTARequestsDesc
	ch <- voiceOTAErrorsDesc
}

func (c *voiceOTACollector) Collect(ch chan<- prometheus.Metric) {
	st, ok := c.stats()
	if !ok {
		return
	}
	ch <- prometheus.MustNewConstMetric(voiceOTARequestsDesc, prometheus.CounterValue, float64(st.Requests))
	byReason(ch, voiceOTAErrorsDesc, st.Errors)
}
