//go:build faults

package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/simulator"
)

// TestBoardDropsMidCall: a board whose connection drops while it runs a
// tool. The call in flight and the calls queued behind it all get an
// answer at once (200 if they ran first, 502 device_disconnected
// otherwise), and once the board is back its next call works.
func TestBoardDropsMidCall(t *testing.T) {
	s := scenario(t, "board drops mid-call")
	b := startBridge(t, baseConfig(), nil)
	ref := b.board(simulator.Config{MAC: mac(1, 0)}).MAC()
	sb := b.board(simulator.Config{MAC: mac(1, 1),
		ToolDelay:    map[string]time.Duration{"self.lamp.turn_off": 20 * time.Millisecond},
		DisconnectOn: map[string]bool{"self.lamp.turn_off": true}})

	for round := range 10 {
		var wg sync.WaitGroup
		for i := range 5 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tool := "self.get_device_status"
				if i == 0 {
					tool = "self.lamp.turn_off"
				}
				code, body := b.call(sb.MAC(), tool, nil)
				switch {
				case code == http.StatusOK && i > 0:
					s.ok()
				case code == http.StatusBadGateway && errorCode(body) == "device_disconnected":
					s.ok()
				default:
					s.lose(answerLoss(code, body), "round %d %s: %d %s", round, tool, code, body)
				}
			}()
		}
		wg.Wait()
		b.connect(sb)
		code, body := b.call(sb.MAC(), "self.get_device_status", nil)
		s.checkAs(answerLoss(code, body), fmt.Sprintf("round %d: call after reconnect", round), statusErr(code, body, http.StatusOK))
	}
	b.requireHealthy(t, s, ref)
}

// statusErr is nil when code is want.
func statusErr(code int, body []byte, want int) error {
	if code != want {
		return fmt.Errorf("status %d, want %d: %s", code, want, body)
	}
	return nil
}

// TestSilentBoard: a board that stops answering. Every call ends within
// its own timeout: the one sent with 504 device_timeout, the queued ones
// with 503 device_queue_timeout (never sent) or, if their turn came while
// time was left, device_timeout; when the board answers again (first with
// the replies it held back, to ids long given up), the next call works.
func TestSilentBoard(t *testing.T) {
	s := scenario(t, "silent board")
	cfg := baseConfig()
	cfg.Devices.CallTimeout = 300 * time.Millisecond
	b := startBridge(t, cfg, nil)
	ref := b.board(simulator.Config{MAC: mac(2, 0)}).MAC()

	var (
		silent atomic.Bool
		mu     sync.Mutex
		held   []json.RawMessage
	)
	fake, err := startFake(t, b.App.DeviceURL(), mac(2, 1), "", func(req rpcRequest) ([]string, []string) {
		if req.Method != "tools/call" {
			return wellBehaved(req)
		}
		mu.Lock()
		defer mu.Unlock()
		if silent.Load() {
			held = append(held, req.ID)
			return nil, nil
		}
		var late []string
		for _, id := range held {
			late = append(late, result(id, `{"content":[{"type":"text","text":"late"}],"isError":false}`))
		}
		held = nil
		return append(late, result(req.ID, callResult)), nil
	})
	require.NoError(t, err)
	id := mac(2, 1)
	b.waitReady(id)
	_ = fake

	for round := range 5 {
		silent.Store(true)
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				code, body := b.call(id, "self.ping", nil)
				if code == http.StatusGatewayTimeout && errorCode(body) == "device_timeout" ||
					code == http.StatusServiceUnavailable && errorCode(body) == "device_queue_timeout" {
					s.ok()
					return
				}
				s.lose(answerLoss(code, body), "round %d silent: %d %s", round, code, body)
			}()
		}
		wg.Wait()
		silent.Store(false)
		code, body := b.call(id, "self.ping", nil)
		s.checkAs(answerLoss(code, body), fmt.Sprintf("round %d: call once the board answers", round), statusErr(code, body, http.StatusOK))
	}
	b.requireHealthy(t, s, ref)
}

// TestSlowTool: a tool slower than the call timeout. The call ends with
// 504 device_timeout (outcome unknown), and the board's queue does not
// stay stuck: once the board has finished the slow tool, calls work.
func TestSlowTool(t *testing.T) {
	s := scenario(t, "tool slower than the timeout")
	cfg := baseConfig()
	cfg.Devices.CallTimeout = 300 * time.Millisecond
	b := startBridge(t, cfg, nil)
	ref := b.board(simulator.Config{MAC: mac(3, 0)}).MAC()
	sb := b.board(simulator.Config{MAC: mac(3, 1),
		ToolDelay: map[string]time.Duration{"self.lamp.turn_on": time.Second}})

	for round := range 3 {
		code, body := b.call(sb.MAC(), "self.lamp.turn_on", nil)
		if code == http.StatusGatewayTimeout && errorCode(body) == "device_timeout" {
			s.ok()
		} else {
			s.lose(answerLoss(code, body), "round %d slow call: %d %s", round, code, body)
		}
		// The board answers again once its main task is free.
		var last string
		if assertEventually(func() bool {
			code, body := b.call(sb.MAC(), "self.get_device_status", nil)
			last = fmt.Sprintf("%d %s", code, body)
			return code == http.StatusOK
		}) {
			s.ok()
		} else {
			s.hang("round %d: queue stuck after a timeout: %s", round, last)
		}
	}
	b.requireHealthy(t, s, ref)
}

// TestCallFlood: 200 concurrent calls to one board, twice: through the
// Hub and through the control API. The queue is bounded (some calls are
// refused busy: device.CodeBusy, HTTP 503 device_busy with Retry-After),
// nothing hangs, every call gets an answer, and the board works after.
func TestCallFlood(t *testing.T) {
	s := scenario(t, "200 concurrent calls to one board")
	cfg := baseConfig()
	cfg.Devices.CallTimeout = 10 * time.Second
	b := startBridge(t, cfg, nil)
	ref := b.board(simulator.Config{MAC: mac(4, 0)}).MAC()
	sb := b.board(simulator.Config{MAC: mac(4, 1),
		ToolDelay: map[string]time.Duration{"self.lamp.get_state": 20 * time.Millisecond}})
	base := b.baseline()

	const n = 200
	for _, via := range []string{"hub", "http"} {
		var okCalls, busy atomic.Int64
		start := make(chan struct{})
		var wg sync.WaitGroup
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if via == "hub" {
					ctx, cancel := context.WithTimeout(context.Background(), wait)
					defer cancel()
					_, err := b.App.Hub.CallTool(ctx, sb.MAC(), "self.lamp.get_state", nil)
					switch device.CodeOf(err) {
					case "":
						okCalls.Add(1)
						s.ok()
					case device.CodeBusy:
						busy.Add(1)
						s.ok()
					case device.CodeTimeout:
						s.hang("hub call: %v", err)
					default:
						s.fail("hub call: %v", err)
					}
					return
				}
				req, _ := http.NewRequest(http.MethodPost, b.Base+"/api/devices/"+sb.MAC()+"/call",
					stringsReader(`{"name":"self.lamp.get_state"}`))
				resp, err := b.HTTP.Do(req)
				if err != nil {
					s.lose(answerLoss(0, []byte(err.Error())), "http call: %v", err)
					return
				}
				body := readAll(resp)
				switch {
				case resp.StatusCode == http.StatusOK:
					okCalls.Add(1)
					s.ok()
				case resp.StatusCode == http.StatusServiceUnavailable && errorCode(body) == "device_busy" &&
					resp.Header.Get("Retry-After") != "":
					busy.Add(1)
					s.ok()
				default:
					s.fail("http call: %d %s", resp.StatusCode, body)
				}
			}()
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		close(start)
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Fatalf("%s: calls still unanswered after a minute", via)
		}
		t.Logf("%s flood: %d ok, %d busy", via, okCalls.Load(), busy.Load())
		require.Positive(t, busy.Load(), "%s: the queue is bounded", via)
		require.Positive(t, okCalls.Load(), "%s: admitted calls ran", via)
		code, body := b.call(sb.MAC(), "self.lamp.get_state", nil)
		require.Equal(t, http.StatusOK, code, "%s: the board works after the flood: %s", via, body)
	}
	b.requireHealthy(t, s, ref)
	b.settled(t, s, base, "the floods")
}
