package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/devicebridge/devicebridge/simulator"
	"github.com/devicebridge/devicebridge/voice/voicestub"
)

// board is one simulated board and what happened to it.
type board struct {
	sim  *simulator.Board
	mqtt *simulator.MQTTConn // mqtt transport only
	conv *simulator.Conversation
	err  error // the conversation's error, or why the board never connected
	up   bool  // connected
}

// counts is a set of reasons with their counts, safe for concurrent use.
type counts struct {
	mu sync.Mutex
	m  map[string]int
}

func (c *counts) add(reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]int{}
	}
	c.m[reason]++
}

func (c *counts) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.m)
}

// connectWindow bounds the time boards keep retrying to connect.
const connectWindow = 60 * time.Second

// run starts the stub and the bridge, connects the boards, holds the
// conversations and measures. It returns what it measured even with an
// error, when it got that far.
func run(ctx context.Context, o options, logw io.Writer) (*result, error) {
	dir := o.logDir
	if dir == "" {
		tmp, err := os.MkdirTemp("", "voicefleet-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	bin := o.bridgeBin
	if bin == "" {
		logf(logw, "building ./cmd/bridge")
		var err error
		if bin, err = buildBridge(ctx, dir); err != nil {
			return nil, err
		}
	}

	stub, err := voicestub.New(voicestub.Config{
		TTSFrames: o.frames,
		Pace:      o.pace,
		Stamp:     true,
		MaxConns:  2*o.boards + 16,
		// Uplink frames are checked byte for byte; keep them all.
		MaxRecords: max(voicestub.DefaultMaxRecords, 4*o.frames),
	})
	if err != nil {
		return nil, err
	}
	if err := stub.Start("127.0.0.1:0"); err != nil {
		return nil, err
	}
	defer stub.Close()

	br, err := startBridge(ctx, o, bin, stub.URL(), dir)
	if err != nil {
		return nil, err
	}
	defer br.stop()
	pid := br.cmd.Process.Pid
	logf(logw, "bridge pid %d: device %s, control %s; stub %s", pid, br.device, br.control, stub.URL())

	profile, err := simulator.LoadProfile("breadboard")
	if err != nil {
		return nil, err
	}
	boards := make([]*board, o.boards)
	for i := range boards {
		n := i + 1
		sb, err := simulator.NewBoard(simulator.Config{
			MAC:             fmt.Sprintf("02:00:00:%02x:%02x:%02x", n>>16&0xff, n>>8&0xff, n&0xff),
			Profile:         profile,
			ProtocolVersion: o.proto,
		})
		if err != nil {
			return nil, err
		}
		boards[i] = &board{sim: sb}
	}
	defer closeBoards(boards)

	res := &result{Transport: o.transport, Boards: o.boards, FramesEach: o.frames, FrameBytes: o.frameBytes,
		PaceMS: float64(o.pace) / float64(time.Millisecond)}

	// Connect, a bounded number at a time, retrying refusals.
	t0 := time.Now()
	var retries counts
	connectAll(ctx, o, br, boards, &retries)
	res.ConnectRetries = retries.snapshot()
	for _, b := range boards {
		if b.up {
			res.Connected++
		}
	}
	res.ConnectS = since(t0)
	logf(logw, "%d/%d boards connected in %.1f s (retries: %v)", res.Connected, o.boards, res.ConnectS, res.ConnectRetries)
	if res.Connected == 0 {
		return res, errors.New("no board connected: " + br.logTail())
	}

	// Wait until the bridge holds every connected board ready (its own
	// MCP initialization done), and for WebSocket until the upstream has
	// listed each board's tools through the relay, so the conversations
	// are measured alone.
	t1 := time.Now()
	res.Ready = waitReady(ctx, br, res.Connected, 60*time.Second)
	if o.transport == "ws" {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_ = stub.Wait(wctx, func(cs []voicestub.Connection) bool {
			n := 0
			for _, c := range cs {
				if c.ToolsListed && !c.Closed {
					n++
				}
			}
			return n >= res.Connected
		})
		cancel()
	}
	res.ReadyS = since(t1)
	logf(logw, "%d boards ready in %.1f s; conversing", res.Ready, res.ReadyS)

	// Converse, all at once, starts spread evenly over o.spread.
	cpu0, self0, all0, t2 := cpuSeconds(pid), cpuSeconds(os.Getpid()), machineBusySeconds(), time.Now()
	stopRSS := sampleRSS(pid, &res.BridgeRSSMaxMiB)
	converseAll(ctx, o, boards)
	stopRSS()
	res.ConverseS = since(t2)
	if res.ConverseS > 0 {
		res.BridgeCPUCores = round2((cpuSeconds(pid) - cpu0) / res.ConverseS)
		res.HarnessCPUCores = round2((cpuSeconds(os.Getpid()) - self0) / res.ConverseS)
		res.MachineBusyCores = round2((machineBusySeconds() - all0) / res.ConverseS)
		res.OthersCPUCores = round2(max(res.MachineBusyCores-res.BridgeCPUCores-res.HarnessCPUCores, 0))
		res.Cores = runtime.NumCPU()
	}
	res.BridgeRSSMiB, res.BridgeRSSPeakMiB = procStatus(pid)
	// VmHWM can trail the sampled VmRSS by a page-count sync.
	res.BridgeRSSMiB, res.BridgeRSSPeakMiB = round2(res.BridgeRSSMiB), round2(max(res.BridgeRSSPeakMiB, res.BridgeRSSMaxMiB))
	if br.udpPort != 0 {
		res.UDPDropsBridge, res.UDPDropsBoards = udpDrops(br.udpPort)
	}
	if m, err := br.metrics(); err == nil {
		res.relayMetrics(m)
	} else {
		logf(logw, "scraping /metrics: %v", err)
	}

	res.tally(boards, stub.Connections(), o)
	res.BridgeLog = br.logLines()
	logf(logw, "conversations: %d ok, %d failed in %.1f s", res.ConversationsOK, res.ConversationsFailed, res.ConverseS)
	return res, nil
}

func since(t time.Time) float64 { return round2(time.Since(t).Seconds()) }

// connectAll connects every board: WebSocket straight to the bridge, MQTT
// through the bridge's OTA (credentials, endpoint) and its embedded broker.
func connectAll(ctx context.Context, o options, br *bridge, boards []*board, retries *counts) {
	ctx, cancel := context.WithTimeout(ctx, connectWindow)
	defer cancel()
	sem := make(chan struct{}, o.parallel)
	var wg sync.WaitGroup
	for _, b := range boards {
		wg.Add(1)
		go func() {
			defer wg.Done()
			backoff := 200 * time.Millisecond
			for {
				sem <- struct{}{}
				err := connectOne(ctx, o, br, b)
				<-sem
				if err == nil {
					b.up = true
					return
				}
				if ctx.Err() != nil {
					b.err = fmt.Errorf("not connected within %v: %w", connectWindow, err)
					return
				}
				retries.add(connectReason(err))
				// Jittered, as boards rebooting after a refusal are.
				d := backoff/2 + rand.N(backoff)
				backoff = min(2*backoff, 3*time.Second)
				select {
				case <-time.After(d):
				case <-ctx.Done():
					b.err = fmt.Errorf("not connected within %v: %w", connectWindow, err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func connectOne(ctx context.Context, o options, br *bridge, b *board) error {
	if o.transport == "ws" {
		return b.sim.ConnectWebSocket(ctx, "ws://"+br.device+"/xiaozhi/v1/")
	}
	res, mc, err := b.sim.BootOTA(ctx, simulator.OTAConfig{URL: "http://" + br.device + "/xiaozhi/ota/"})
	if err != nil {
		return err
	}
	if res.Transport != "mqtt" {
		_ = b.sim.Close()
		return fmt.Errorf("OTA named transport %q", res.Transport)
	}
	b.mqtt = mc
	return nil
}

// connectReason names a failed connect for the retry counts.
func connectReason(err error) string {
	var he *simulator.HandshakeError
	switch {
	case errors.As(err, &he):
		return fmt.Sprintf("websocket HTTP %d", he.StatusCode)
	case errors.Is(err, simulator.ErrOTAStatus):
		if _, rest, ok := strings.Cut(err.Error(), "HTTP "); ok && len(rest) >= 3 {
			return "OTA HTTP " + rest[:3]
		}
		return "OTA status"
	case errors.Is(err, simulator.ErrMQTTRefused):
		return "MQTT CONNACK refused"
	case errors.Is(err, simulator.ErrHelloTimeout):
		return "hello timeout"
	}
	return short(err.Error())
}

func short(s string) string {
	if len(s) > 120 {
		return s[:120] + "…"
	}
	return s
}

// waitReady polls the bridge's devicebridge_boards gauge until want boards
// are ready or the wait ends; it returns the last count.
func waitReady(ctx context.Context, br *bridge, want int, wait time.Duration) int {
	deadline := time.Now().Add(wait)
	ready := 0
	for {
		if m, err := br.metrics(); err == nil {
			ready = 0
			for k, v := range m {
				if strings.HasPrefix(k, "devicebridge_boards{") && strings.Contains(k, `state="ready"`) {
					ready += int(v)
				}
			}
			if ready >= want {
				return ready
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return ready
		}
		select {
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
		}
	}
}

// converseAll holds one conversation on every connected board at once,
// their starts spread evenly over o.spread.
func converseAll(ctx context.Context, o options, boards []*board) {
	var up []*board
	for _, b := range boards {
		if b.up {
			up = append(up, b)
		}
	}
	start := time.Now()
	var wg sync.WaitGroup
	for i, b := range up {
		wg.Add(1)
		go func() {
			defer wg.Done()
			at := start.Add(time.Duration(i) * o.spread / time.Duration(len(up)))
			select {
			case <-time.After(time.Until(at)):
			case <-ctx.Done():
				b.err = ctx.Err()
				return
			}
			b.conv, b.err = b.sim.Converse(ctx, simulator.ConverseOptions{
				Frames:       o.frames,
				FrameBytes:   o.frameBytes,
				Mode:         simulator.ModeManual, // the stub answers after listen stop: every frame is heard
				Pace:         o.pace,
				ReplyTimeout: 30 * time.Second,
				// DecodeQueue 0: the firmware's 40 packets.
			})
		}()
	}
	wg.Wait()
}

// closeBoards disconnects every board, a few at a time.
func closeBoards(boards []*board) {
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	for _, b := range boards {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if b.mqtt != nil {
				_ = b.mqtt.Close()
			}
			_ = b.sim.Close()
		}()
	}
	wg.Wait()
}

// sampleRSS records the largest VmRSS of pid into *maxMiB every 250 ms
// until the returned stop is called.
func sampleRSS(pid int, maxMiB *float64) (stop func()) {
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			if rss, _ := procStatus(pid); rss > *maxMiB {
				*maxMiB = round2(rss)
			}
			select {
			case <-t.C:
			case <-done:
				return
			}
		}
	}()
	return func() { close(done); <-exited }
}
