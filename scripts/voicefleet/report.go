package main

import (
	"bytes"
	"context"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/devicebridge/devicebridge/simulator"
	"github.com/devicebridge/devicebridge/voice/voicestub"
)

// result is the JSON line voicefleet prints.
type result struct {
	Transport  string  `json:"transport"`
	Boards     int     `json:"boards"`
	FramesEach int     `json:"frames_each"`
	FrameBytes int     `json:"frame_bytes"`
	PaceMS     float64 `json:"pace_ms"`

	Connected      int            `json:"connected"`
	ConnectRetries map[string]int `json:"connect_retries,omitempty"`
	ConnectS       float64        `json:"connect_s"`
	Ready          int            `json:"ready"`
	ReadyS         float64        `json:"ready_s"`

	ConversationsOK     int            `json:"conversations_ok"`
	ConversationsFailed int            `json:"conversations_failed"`
	Failures            map[string]int `json:"failures,omitempty"`
	ConverseS           float64        `json:"converse_s"`
	// What the upstream saw of the failed conversations' boards: no
	// connection, no listen start, a turn never stopped, or answered.
	FailedUpstreamView map[string]int `json:"failed_upstream_view,omitempty"`

	// Uplink: frames the boards sent, the upstream heard.
	UplinkSent     int `json:"uplink_sent"`
	UplinkHeard    int `json:"uplink_heard"`
	UplinkLost     int `json:"uplink_lost"`
	UplinkMismatch int `json:"uplink_mismatch"` // heard out of order or not as sent

	// Downlink: frames the upstream wrote, the boards received (played,
	// or dropped by the board itself).
	DownlinkSent     int `json:"downlink_sent"`
	DownlinkReceived int `json:"downlink_received"`
	DownlinkLost     int `json:"downlink_lost"`
	// Of the received: dropped from the full decode queue, arrived while
	// not speaking (before tts start, after tts stop), failed the board's
	// checks (UDP); played out of order or not as sent.
	DownlinkQueueDropped int `json:"downlink_dropped_board_queue"`
	DownlinkNotSpeaking  int `json:"downlink_dropped_not_speaking"`
	DownlinkRejected     int `json:"downlink_rejected"`
	DownlinkMismatch     int `json:"downlink_mismatch"`
	DownlinkUnstamped    int `json:"downlink_unstamped,omitempty"`
	// The not-speaking drops by where the frames sat in the answer: before
	// the first frame played (they beat tts start; MQTT: the message goes
	// through the broker, the audio straight over UDP) or after the last
	// (tts stop overtook them).
	DownlinkBeforeStart    int `json:"downlink_before_tts_start"`
	DownlinkAfterStop      int `json:"downlink_after_tts_stop"`
	DownlinkPlayed         int `json:"downlink_played"`
	AnswersWrittenUpstream int `json:"answers_written_upstream"`

	// Relay latency of each played downlink frame: stub write to board
	// arrival, one clock.
	LatP50  float64 `json:"lat_p50_ms"`
	LatP90  float64 `json:"lat_p90_ms"`
	LatP99  float64 `json:"lat_p99_ms"`
	LatMax  float64 `json:"lat_max_ms"`
	LatMean float64 `json:"lat_mean_ms"`
	// Of the first frame of each answer only (MQTT holds it 40 ms behind
	// tts start), and of the others.
	FirstP50 float64 `json:"first_frame_p50_ms"`
	RestP99  float64 `json:"later_frames_p99_ms"`

	// The bridge's own counters (/metrics).
	RelayFramesUp     int64 `json:"relay_frames_up"`
	RelayFramesDown   int64 `json:"relay_frames_down"`
	RelayDroppedUp    int64 `json:"relay_dropped_up"`
	RelayDroppedDown  int64 `json:"relay_dropped_down"`
	RelayOpened       int64 `json:"relay_conversations_opened"`
	RelayRefused      int64 `json:"relay_conversations_refused"`
	RelayUpstreamErrs int64 `json:"relay_upstream_errors"`
	MQTTDropped       int64 `json:"mqtt_messages_dropped,omitempty"`
	// Kernel drops on full UDP receive buffers (mqtt): the bridge's audio
	// socket, the boards' sockets.
	UDPDropsBridge int64 `json:"udp_drops_bridge"`
	UDPDropsBoards int64 `json:"udp_drops_boards"`

	BridgeRSSMiB     float64 `json:"bridge_rss_mib"`
	BridgeRSSMaxMiB  float64 `json:"bridge_rss_max_during_mib"`
	BridgeRSSPeakMiB float64 `json:"bridge_rss_peak_mib"`
	BridgeCPUCores   float64 `json:"bridge_cpu_cores"`
	// This process (the boards and the stub) over the conversations.
	HarnessCPUCores float64 `json:"harness_cpu_cores"`
	// The whole machine over the conversations, and what other processes
	// (other work on a shared machine) took of it.
	Cores            int            `json:"cores"`
	MachineBusyCores float64        `json:"machine_busy_cores"`
	OthersCPUCores   float64        `json:"others_cpu_cores"`
	BridgeLog        map[string]int `json:"bridge_log,omitempty"`
}

// relayMetrics copies the bridge's voice counters.
func (r *result) relayMetrics(m map[string]float64) {
	g := func(k string) int64 { return int64(m[k]) }
	r.RelayFramesUp = g(`devicebridge_voice_frames_total{direction="up"}`)
	r.RelayFramesDown = g(`devicebridge_voice_frames_total{direction="down"}`)
	r.RelayDroppedUp = g(`devicebridge_voice_frames_dropped_total{direction="up"}`)
	r.RelayDroppedDown = g(`devicebridge_voice_frames_dropped_total{direction="down"}`)
	r.RelayOpened = g(`devicebridge_voice_conversations_total{outcome="opened"}`)
	r.RelayRefused = g(`devicebridge_voice_conversations_total{outcome="refused"}`)
	r.RelayUpstreamErrs = g(`devicebridge_voice_upstream_errors_total`)
	for k, v := range m {
		if strings.HasPrefix(k, "devicebridge_mqtt_messages_dropped_total") {
			r.MQTTDropped += int64(v)
		}
	}
}

// tally fills the counts and latencies from the boards' conversations and
// the stub's records.
func (r *result) tally(boards []*board, conns []voicestub.Connection, o options) {
	// The first payload each board's turn was heard with, which the
	// stub's answer repeats (not the board's first when that was lost).
	firstHeard := map[string][]byte{}
	for _, c := range conns {
		mac := strings.ToLower(c.DeviceID)
		for _, cv := range c.Conversations {
			if _, ok := firstHeard[mac]; !ok && len(cv.Payloads) > 0 {
				firstHeard[mac] = cv.Payloads[0]
			}
		}
	}
	var fails, view counts
	var all, first, rest []time.Duration
	for _, b := range boards {
		if !b.up {
			why := "run ended"
			if inner := errors.Unwrap(b.err); inner != nil {
				why = connectReason(inner)
			}
			fails.add("not connected: " + why)
			continue
		}
		if b.err != nil {
			fails.add(convReason(b.err))
			view.add(upstreamView(conns, b.sim.MAC()))
		} else {
			r.ConversationsOK++
		}
		c := b.conv
		if c == nil {
			continue
		}
		r.UplinkSent += c.UplinkSent
		r.DownlinkQueueDropped += c.QueueDropped
		r.DownlinkNotSpeaking += c.Dropped
		r.DownlinkRejected += c.Rejected
		r.DownlinkPlayed += len(c.Audio)
		inConv := len(c.Audio) + c.QueueDropped + c.Dropped + c.Rejected
		total := int(b.sim.Stats().BinaryReceived)
		if b.mqtt != nil {
			total += int(b.mqtt.Stats().AudioRejected)
		}
		// Frames that came after Converse returned are not in c: they
		// came after tts stop, when the board does not play.
		late := max(total-inConv, 0)
		r.DownlinkNotSpeaking += late
		r.DownlinkReceived += inConv + late
		// The stub answers with "tts-<k>-" and the turn's first heard
		// payload, after the stamp.
		var heard [][]byte
		if p, ok := firstHeard[b.sim.MAC()]; ok {
			heard = [][]byte{p}
		}
		last, firstPlayed := -1, 0
		for _, a := range c.Audio {
			at, ok := voicestub.ReadStamp(a.Payload)
			if !ok {
				r.DownlinkUnstamped++
				continue
			}
			d := a.At.Sub(at)
			all = append(all, d)
			k, ok := replyIndex(a.Payload[voicestub.StampSize:])
			if !ok || k <= last || !bytes.Equal(a.Payload[voicestub.StampSize:], voicestub.ExpectedReply(heard, k)) {
				r.DownlinkMismatch++
			}
			if ok && k > last {
				if last < 0 {
					firstPlayed = k
				}
				last = k
			}
			if k == 0 {
				first = append(first, d)
			} else {
				rest = append(rest, d)
			}
		}
		// Frames 0..firstPlayed-1 were not played: those the board got
		// while not speaking came before tts start; the rest of its
		// not-speaking drops came after tts stop.
		notSpeaking := c.Dropped + late
		before := min(firstPlayed, notSpeaking)
		r.DownlinkBeforeStart += before
		r.DownlinkAfterStop += notSpeaking - before
	}
	r.ConversationsFailed = r.Boards - r.ConversationsOK
	r.Failures = fails.snapshot()
	r.FailedUpstreamView = view.snapshot()

	// The upstream's side: every connection of each board.
	for _, c := range conns {
		if c.Status != 101 {
			continue
		}
		r.UplinkHeard += c.FramesHeard
		r.DownlinkSent += c.FramesSent
		r.AnswersWrittenUpstream += c.Answers
		// Each heard payload must be one the board sent, in order (a
		// lost frame leaves a gap, not a mismatch).
		mac, last := strings.ToLower(c.DeviceID), -1
		for _, p := range c.Payloads {
			k, ok := uplinkIndex(p, mac)
			if !ok || k <= last || !bytes.Equal(p, simulator.DefaultPayload(mac, k, o.frameBytes)) {
				r.UplinkMismatch++
			}
			last = max(last, k)
		}
	}
	r.UplinkLost = r.UplinkSent - r.UplinkHeard
	r.DownlinkLost = r.DownlinkSent - r.DownlinkReceived

	slices.Sort(all)
	slices.Sort(first)
	slices.Sort(rest)
	r.LatP50, r.LatP90, r.LatP99, r.LatMax = pct(all, 0.5), pct(all, 0.9), pct(all, 0.99), pct(all, 1)
	r.FirstP50, r.RestP99 = pct(first, 0.5), pct(rest, 0.99)
	if len(all) > 0 {
		var sum time.Duration
		for _, d := range all {
			sum += d
		}
		r.LatMean = ms(sum / time.Duration(len(all)))
	}
}

// replyIndex reads k from a reply payload "tts-<k>-...".
func replyIndex(p []byte) (int, bool) {
	rest, ok := bytes.CutPrefix(p, []byte("tts-"))
	if !ok {
		return 0, false
	}
	i := bytes.IndexByte(rest, '-')
	if i < 1 {
		return 0, false
	}
	k, err := strconv.Atoi(string(rest[:i]))
	return k, err == nil && k >= 0
}

// upstreamView says how far the upstream got with a board's conversation.
func upstreamView(conns []voicestub.Connection, mac string) string {
	view := "no upstream connection"
	for _, c := range conns {
		if !strings.EqualFold(c.DeviceID, mac) || c.Status != 101 {
			continue
		}
		view = "no listen start"
		for _, cv := range c.Conversations {
			switch {
			case cv.Answered:
				return "answered"
			case cv.EndedBy == "" || cv.EndedBy == "close":
				view = "turn never stopped (no listen stop)"
			default:
				view = "turn ended by " + cv.EndedBy
			}
		}
	}
	return view
}

// uplinkIndex reads k from a default uplink payload "opus <mac> #<k> ...".
func uplinkIndex(p []byte, mac string) (int, bool) {
	rest, ok := bytes.CutPrefix(p, []byte("opus "+mac+" #"))
	if !ok {
		return 0, false
	}
	i := bytes.IndexByte(rest, ' ')
	if i < 1 {
		return 0, false
	}
	k, err := strconv.Atoi(string(rest[:i]))
	return k, err == nil && k >= 0
}

// convReason names a failed conversation.
func convReason(err error) string {
	switch {
	case errors.Is(err, simulator.ErrReplyTimeout):
		return "reply timeout"
	case errors.Is(err, simulator.ErrServerGoodbye):
		return "server goodbye"
	case errors.Is(err, context.DeadlineExceeded):
		return "run timeout"
	}
	return short(err.Error())
}

// pct is the q-quantile of sorted ds in milliseconds (nearest rank below).
func pct(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	return ms(ds[int(float64(len(ds)-1)*q)])
}

func ms(d time.Duration) float64 { return round2(float64(d) / float64(time.Millisecond)) }

func round2(v float64) float64 { return math.Round(v*100) / 100 }
