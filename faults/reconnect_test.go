//go:build faults

package faults

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/mqtt/mosquittotest"
	"github.com/devicebridge/devicebridge/simulator"
)

// TestSameMACReconnects: one board reconnecting again and again keeps
// exactly one session, ready each time. Two live connections claiming one
// MAC replace each other a few times, then the newcomer is refused with a
// reason while the kept connection keeps working (device.FlapPolicy).
func TestSameMACReconnects(t *testing.T) {
	s := scenario(t, "same MAC reconnecting")
	b := startBridge(t, baseConfig(), nil)
	ref := b.board(simulator.Config{MAC: mac(5, 0)}).MAC()
	sb := b.board(simulator.Config{MAC: mac(5, 1)})
	base := b.baseline()

	for round := range 25 {
		require.NoError(t, sb.Close())
		b.connect(sb)
		code, body := b.call(sb.MAC(), "self.get_device_status", nil)
		switch n := len(b.App.Hub.Devices()); {
		case code != http.StatusOK:
			s.lose(answerLoss(code, body), "clean reconnect %d: %d %s", round, code, body)
		case n != 2:
			s.growth("clean reconnect %d: %d sessions, want 2", round, n)
		default:
			s.ok()
		}
	}

	// Live connections under one MAC, each newcomer arriving while the
	// previous one is still connected (a cloned MAC, or a board whose old
	// socket the bridge has not yet seen die).
	id := mac(5, 2)
	var replaced, refused int
	for round := range 6 {
		fake, err := startFake(t, b.App.DeviceURL(), id, "", wellBehaved)
		if err != nil {
			s.fail("live newcomer %d: %v", round, err)
			continue
		}
		local := fake.conn.LocalAddr().String()
		var outcome string
		ok := assertEventually(func() bool {
			if sess, ok := b.App.Hub.Session(id); ok && sess.Info().RemoteAddr == local && b.ready(id) {
				outcome = "replaced"
				return true
			}
			if text := fake.closeText(); text != "" {
				outcome = text
				return true
			}
			return false
		})
		switch {
		case !ok:
			s.hang("live newcomer %d: neither attached nor refused", round)
		case outcome == "replaced":
			replaced++
			code, body := b.call(id, "self.ping", nil)
			s.check(fmt.Sprintf("newcomer %d attached", round), statusErr(code, body, http.StatusOK))
		case strings.Contains(outcome, "retry"):
			refused++
			code, body := b.call(id, "self.ping", nil)
			s.check(fmt.Sprintf("newcomer %d refused (%s); kept connection", round, outcome),
				statusErr(code, body, http.StatusOK))
		default:
			s.fail("live newcomer %d: closed without a reason to retry: %q", round, outcome)
		}
	}
	t.Logf("live newcomers: %d replaced the previous connection, %d refused as flapping", replaced, refused)
	require.Positive(t, refused, "flapping connections are stopped")
	b.requireHealthy(t, s, ref)
	b.settled(t, s, base, "reconnects")
}

// TestBridgeRestart: the bridge is shut down and a new one started on the
// same ports, three times, while 20 WebSocket boards and 10 MQTT boards
// (embedded broker) keep reconnecting. Each time every board comes back
// ready and answers a call.
func TestBridgeRestart(t *testing.T) {
	s := scenario(t, "bridge restarted under 30 boards")
	cfg := baseConfig()
	cfg.MQTT.Listen = "127.0.0.1:0"
	b := startBridge(t, cfg, nil)
	// The next bridges reuse the ports the first one got.
	cfg.DeviceListen = b.App.DeviceAddr().String()
	cfg.ControlListen = b.App.ControlAddr().String()
	cfg.MQTT.Listen = b.App.MQTTAddr().String()
	deviceURL := b.App.DeviceURL()

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	p := profile(t, "breadboard")
	wsFleet, err := simulator.NewFleet(simulator.FleetConfig{URL: deviceURL, Profile: p, Count: 20, MACPrefix: "06:fb:00",
		Reconnect: true, ReconnectMin: 50 * time.Millisecond, ReconnectMax: 300 * time.Millisecond})
	require.NoError(t, err)
	mqttFleet, err := simulator.NewFleet(simulator.FleetConfig{URL: deviceURL, Profile: p, Count: 10, MACPrefix: "06:fb:01",
		Reconnect: true, ReconnectMin: 50 * time.Millisecond, ReconnectMax: 300 * time.Millisecond})
	require.NoError(t, err)
	wg.Add(2)
	go func() { defer wg.Done(); _ = wsFleet.Run(ctx) }()
	go func() {
		defer wg.Done()
		_ = mqttFleet.RunMQTT(ctx, simulator.MQTTConfig{Endpoint: "tcp://" + cfg.MQTT.Listen,
			ReconnectInterval: 100 * time.Millisecond})
	}()
	boards := append(wsFleet.Boards(), mqttFleet.Boards()...)

	for round := range 4 {
		for _, sb := range boards {
			if !assertEventually(func() bool { return b.ready(sb.MAC()) }) {
				s.hang("round %d: %s not ready", round, sb.MAC())
				continue
			}
			var last string
			ok := assertEventually(func() bool {
				code, body := b.call(sb.MAC(), "self.get_device_status", nil)
				last = fmt.Sprintf("%d %s", code, body)
				return code == http.StatusOK
			})
			if ok {
				s.ok()
			} else {
				s.hang("round %d: %s: %s", round, sb.MAC(), last)
			}
		}
		if round == 3 {
			break
		}
		b.shutdown()
		if t.Failed() {
			// The bridge did not stop (its shutdown hung): a new one beside
			// it on the same ports would only wait out every poll.
			t.FailNow()
		}
		b = startBridge(t, cfg, nil)
	}
}

// TestMosquittoRestart: 100 MQTT boards behind a real Mosquitto (old,
// subscribing firmware, which a plain broker can reach). The broker is
// killed and restarted twice; each time the bridge reconnects, brings
// every board back and every board answers a call.
func TestMosquittoRestart(t *testing.T) {
	s := scenario(t, "Mosquitto restarted under 100 boards")
	mq := mosquittotest.Start(t)
	cfg := baseConfig()
	cfg.MQTT.Broker = mq.URL()
	cfg.MQTT.MaxReconnectInterval = 200 * time.Millisecond
	cfg.MQTT.KeepAlive = 2 * time.Second
	b := startBridge(t, cfg, nil)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	fleet, err := simulator.NewFleet(simulator.FleetConfig{URL: b.App.DeviceURL(), Profile: profile(t, "breadboard"),
		Count: 100, MACPrefix: "06:fc:00", StartInterval: 5 * time.Millisecond,
		Reconnect: true, ReconnectMin: 100 * time.Millisecond, ReconnectMax: 500 * time.Millisecond})
	require.NoError(t, err)
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = fleet.RunMQTT(ctx, simulator.MQTTConfig{Endpoint: mq.URL(), Legacy: true,
			PublishTopic: "devices/up/{mac}", ReconnectInterval: 200 * time.Millisecond, HelloOnConnect: true})
	}()

	for round := range 3 {
		var mu sync.Mutex
		lost := 0
		parallel(t, s, len(fleet.Boards()), 8, func(i int) {
			sb := fleet.Boards()[i]
			var last string
			ok := assertEventually(func() bool {
				if !b.ready(sb.MAC()) {
					last = "not ready"
					return false
				}
				code, body := b.call(sb.MAC(), "self.get_device_status", nil)
				last = fmt.Sprintf("%d %s", code, body)
				return code == http.StatusOK
			})
			if ok {
				s.ok()
			} else {
				mu.Lock()
				lost++
				mu.Unlock()
				s.hang("round %d: %s: %s", round, sb.MAC(), last)
			}
		})
		t.Logf("round %d: %d boards answered, %d lost", round, len(fleet.Boards())-lost, lost)
		if round == 2 {
			break
		}
		mq.Kill()
		require.Eventually(t, func() bool { return len(b.App.Hub.Devices()) == 0 }, wait, 10*time.Millisecond,
			"boards lost with the broker are marked offline")
		mq.Restart()
	}
}
