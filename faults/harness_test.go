//go:build faults

package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/internal/bridgetest"
	"github.com/devicebridge/devicebridge/simulator"
)

// wait bounds every poll of the campaign; nothing should come close.
const wait = 20 * time.Second

// Loss is the kind of a lost try.
type loss int

// Kinds of loss, the columns of the summary.
const (
	// lossCrash: the bridge stopped answering /healthz, or a reference
	// board stopped answering. (A panic kills the test binary: the campaign
	// finishing is itself the proof that nothing panicked.)
	lossCrash loss = iota
	// lossHang: no answer within the poll deadline.
	lossHang
	// lossGrowth: a resource past its documented bound (sessions, pending
	// entries, connections, goroutines, heap, log lines).
	lossGrowth
	// lossBypass: something refused by design got through.
	lossBypass
	// lossWrong: any other wrong answer.
	lossWrong
	lossKinds
)

var lossNames = [lossKinds]string{"crash", "hang", "growth", "bypass", "wrong"}

// tally counts one scenario: what was tried, what survived (a clear
// answer, the bridge still healthy) and what was lost, by kind.
type tally struct {
	name           string
	tried, survive atomic.Int64
	lost           [lossKinds]atomic.Int64
	mu             sync.Mutex
	losses         []string // the first few, for the failure message
}

var (
	tallyMu sync.Mutex
	tallies []*tally
)

// scenario registers a tally; at the end of the test it prints the
// summary line and fails the test if anything was lost.
func scenario(t *testing.T, name string) *tally {
	t.Helper()
	s := &tally{name: name}
	tallyMu.Lock()
	tallies = append(tallies, s)
	tallyMu.Unlock()
	t.Cleanup(func() {
		t.Log(s.line())
		s.mu.Lock()
		defer s.mu.Unlock()
		assert.Zero(t, s.lostTotal(), "%s lost inputs; first ones: %s", s.name, strings.Join(s.losses, "; "))
		assert.Equal(t, s.tried.Load(), s.survive.Load()+s.lostTotal(), "%s: every try is counted once", s.name)
	})
	return s
}

// line is the scenario's FAULTS summary line.
func (s *tally) line() string {
	return fmt.Sprintf("FAULTS %-44s tried=%d survived=%d crash=%d hang=%d growth=%d bypass=%d wrong=%d", s.name,
		s.tried.Load(), s.survive.Load(), s.lost[lossCrash].Load(), s.lost[lossHang].Load(),
		s.lost[lossGrowth].Load(), s.lost[lossBypass].Load(), s.lost[lossWrong].Load())
}

func (s *tally) lostTotal() int64 {
	var n int64
	for i := range s.lost {
		n += s.lost[i].Load()
	}
	return n
}

// ok counts one try that survived.
func (s *tally) ok() { s.tried.Add(1); s.survive.Add(1) }

// okN counts n tries that survived.
func (s *tally) okN(n int64) { s.tried.Add(n); s.survive.Add(n) }

// lose counts one lost try of kind k and remembers why.
func (s *tally) lose(k loss, format string, args ...any) {
	s.tried.Add(1)
	s.lost[k].Add(1)
	s.mu.Lock()
	if len(s.losses) < 8 {
		s.losses = append(s.losses, lossNames[k]+": "+fmt.Sprintf(format, args...))
	}
	s.mu.Unlock()
}

// fail counts one wrong answer; hang, growth, bypass and crash the other
// kinds of loss.
func (s *tally) fail(format string, args ...any)   { s.lose(lossWrong, format, args...) }
func (s *tally) hang(format string, args ...any)   { s.lose(lossHang, format, args...) }
func (s *tally) growth(format string, args ...any) { s.lose(lossGrowth, format, args...) }
func (s *tally) bypass(format string, args ...any) { s.lose(lossBypass, format, args...) }
func (s *tally) crash(format string, args ...any)  { s.lose(lossCrash, format, args...) }

// check counts a try as survived when err is nil, as lost (kind k)
// otherwise.
func (s *tally) check(what string, err error) { s.checkAs(lossWrong, what, err) }

func (s *tally) checkAs(k loss, what string, err error) {
	if err != nil {
		s.lose(k, "%s: %v", what, err)
		return
	}
	s.ok()
}

// answerLoss classifies a request whose answer was not the one wanted: a
// transport error that is a timeout is a hang (status 0 from bridge.do),
// anything else a wrong answer.
func answerLoss(code int, body []byte) loss {
	if code == 0 && isTimeout(string(body)) {
		return lossHang
	}
	return lossWrong
}

func isTimeout(text string) bool {
	return strings.Contains(text, "Timeout") || strings.Contains(text, "timeout") || strings.Contains(text, "deadline exceeded")
}

// bridge is a real bridge running in the test process
// (internal/bridgetest), with the campaign's helpers.
type bridge struct {
	*bridgetest.Bridge
	counted sync.Once // shutdowns counts the bridge once
}

// baseConfig is the default configuration on loopback port 0 with
// timings short enough for a campaign: embedded MQTT off unless a test
// turns it on, no /mcp rate limit (floods are the point here).
func baseConfig() app.Config {
	cfg := app.Default()
	cfg.DeviceListen = "127.0.0.1:0"
	cfg.ControlListen = "127.0.0.1:0"
	cfg.MQTT.Listen = ""
	cfg.MQTT.UDP.Listen = "127.0.0.1:0"
	cfg.OTA.DataDir = "" // in memory: never the user's state directory
	cfg.WebSocket.HelloTimeout = 500 * time.Millisecond
	cfg.Devices.RequestTimeout = time.Second
	cfg.Devices.InitTimeout = 3 * time.Second
	cfg.Devices.CallTimeout = 3 * time.Second
	cfg.Devices.ReadyWait = 2 * time.Second
	cfg.MCP.RateLimit = -1
	return cfg
}

// startBridge starts a bridge and shuts it down at the end of the test.
// logger may be nil (errors go to the test log). Its HTTP client gives up
// after wait (a hang, not a test stuck) and keeps connections for floods.
func startBridge(t *testing.T, cfg app.Config, logger *zap.Logger) *bridge {
	t.Helper()
	if logger == nil {
		logger = zaptest.NewLogger(t, zaptest.Level(zapcore.ErrorLevel))
	}
	b := &bridge{Bridge: bridgetest.Start(t, func(c *app.Config) { *c = cfg }, bridgetest.WithLogger(logger))}
	b.HTTP = &http.Client{Timeout: wait, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	// Before bridgetest's own cleanup, so that the campaign counts it.
	t.Cleanup(b.shutdown)
	return b
}

// shutdowns counts every bridge the campaign shuts down. A shutdown that
// does not end in time is a hang: rather than hold the campaign until the
// test binary's timeout (and lose every scenario after it), the test that
// owns the bridge fails at once with what the shutdown waits on, and the
// campaign goes on. TestZZSummary lists it with the scenarios.
var shutdowns = &tally{name: "bridge shutdowns"}

// shutdown stops the bridge (once; the test's cleanup calls it too) and
// counts it in shutdowns.
func (b *bridge) shutdown() {
	b.counted.Do(func() {
		err := b.Shutdown()
		if errors.Is(err, bridgetest.ErrShutdownHung) {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			shutdowns.hang("%s: the bridge's shutdown did not end", b.T.Name())
			b.T.Errorf("the bridge's shutdown did not end within %v; goroutines by top frame:\n%s", bridgetest.HangAfter, summarizeStacks(buf[:n]))
			return
		}
		shutdowns.check(b.T.Name(), err)
		assert.NoError(b.T, err)
	})
}

// do sends one request to the control listener and returns the status
// and body. A transport error is returned as status 0 and the error text.
func (b *bridge) do(method, path string, body []byte, header http.Header) (int, []byte) {
	req, err := http.NewRequest(method, b.Base+path, bytes.NewReader(body))
	if err != nil {
		return 0, []byte(err.Error())
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if body != nil && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := b.HTTP.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// call runs a tool through the control API.
func (b *bridge) call(mac, tool string, args any) (int, []byte) {
	body, _ := json.Marshal(map[string]any{"name": tool, "arguments": args})
	return b.do(http.MethodPost, "/api/devices/"+mac+"/call", body, nil)
}

// errorCode extracts error.code from a control API error body.
func errorCode(body []byte) string {
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	_ = json.Unmarshal(body, &e)
	return e.Error.Code
}

// healthy checks /healthz and that ref (an unrelated ready board) still
// answers a call.
func (b *bridge) healthy(ref string) error {
	if code, body := b.do(http.MethodGet, "/healthz", nil, nil); code != http.StatusOK {
		return fmt.Errorf("healthz: %d %s", code, body)
	}
	if ref == "" {
		return nil
	}
	if code, body := b.call(ref, "self.get_device_status", nil); code != http.StatusOK {
		return fmt.Errorf("reference board %s: %d %s", ref, code, body)
	}
	return nil
}

// requireHealthy counts one try in s: survived when the bridge is
// healthy, a crash otherwise, which also ends the test (nothing after it
// would mean anything).
func (b *bridge) requireHealthy(t *testing.T, s *tally, ref string) {
	t.Helper()
	if err := b.healthy(ref); err != nil {
		s.crash("%v", err)
		t.FailNow()
	}
	s.ok()
}

// waitReady waits until the Hub holds a ready session for mac.
func (b *bridge) waitReady(mac string) {
	b.T.Helper()
	require.Eventually(b.T, func() bool { return b.ready(mac) }, wait, 5*time.Millisecond, "%s ready", mac)
}

func (b *bridge) ready(mac string) bool {
	s, ok := b.App.Hub.Session(mac)
	return ok && s.Info().State == device.StateReady
}

// profile loads an embedded simulator profile.
func profile(t testing.TB, name string) *simulator.Profile {
	t.Helper()
	p, err := simulator.LoadProfile(name)
	require.NoError(t, err)
	return p
}

// board connects a simulated board over WebSocket, closes it at the end
// of the test, and waits until the bridge has it ready.
func (b *bridge) board(cfg simulator.Config) *simulator.Board {
	b.T.Helper()
	if cfg.Profile == nil {
		cfg.Profile = profile(b.T, "breadboard")
	}
	if cfg.Token == "" && len(b.App.Config().WebSocket.Tokens) > 0 {
		cfg.Token = b.App.Config().WebSocket.Tokens[0]
	}
	sb, err := simulator.NewBoard(cfg)
	require.NoError(b.T, err)
	b.T.Cleanup(func() { _ = sb.Close() })
	b.connect(sb)
	return sb
}

// connect (re)connects a simulated board and waits until it is ready.
func (b *bridge) connect(sb *simulator.Board) {
	b.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	require.NoError(b.T, sb.ConnectWebSocket(ctx, b.App.DeviceURL()))
	b.waitReady(sb.MAC())
}

// usage is a process-wide resource snapshot.
type usage struct {
	goroutines int
	heap       uint64
}

func (u usage) String() string {
	return fmt.Sprintf("%d goroutines, %.1f MiB heap in use", u.goroutines, float64(u.heap)/(1<<20))
}

func measure() usage {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return usage{goroutines: runtime.NumGoroutine(), heap: m.HeapInuse}
}

// Slack allowed over a baseline: goroutines of connections still closing
// and of idle HTTP connections, and heap the runtime keeps between GCs.
const (
	goroutineSlack = 25
	heapSlack      = 48 << 20
)

// baseline measures resource use once the bridge and its reference
// boards are settled.
func (b *bridge) baseline() usage {
	b.HTTP.CloseIdleConnections()
	u := measure()
	b.T.Logf("baseline: %s", u)
	return u
}

// settled polls until goroutines and heap are back near base, and counts
// one try in s: growth when they are not.
func (b *bridge) settled(t *testing.T, s *tally, base usage, after string) {
	t.Helper()
	var u usage
	ok := assertEventually(func() bool {
		b.HTTP.CloseIdleConnections()
		u = measure()
		return u.goroutines <= base.goroutines+goroutineSlack && u.heap <= base.heap+heapSlack
	})
	if !ok {
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		s.growth("after %s: %s, baseline %s", after, u, base)
		t.Logf("after %s: %s, baseline %s\n%s", after, u, base, summarizeStacks(buf[:n]))
		return
	}
	s.ok()
	t.Logf("after %s: %s (baseline %s)", after, u, base)
}

// assertEventually polls f until it is true or wait passes, and says
// which. Unlike assert.Eventually it does not fail the test by itself: the
// caller counts the outcome in its scenario (a loss fails the test when
// the scenario ends, with the others).
func assertEventually(f func() bool) bool {
	return assert.Eventually(uncounted{}, f, wait, 20*time.Millisecond)
}

// uncounted takes assert's report of a poll that never succeeded, which
// the scenario's tally reports instead.
type uncounted struct{}

func (uncounted) Errorf(string, ...any) {}

// summarizeStacks counts goroutines by their top frame, to say what leaked.
func summarizeStacks(dump []byte) string {
	counts := map[string]int{}
	for _, g := range strings.Split(string(dump), "\n\n") {
		lines := strings.Split(g, "\n")
		if len(lines) > 1 {
			counts[strings.TrimSpace(lines[1])]++
		}
	}
	type kv struct {
		k string
		v int
	}
	var list []kv
	for k, v := range counts {
		list = append(list, kv{k, v})
	}
	sort.Slice(list, func(i, j int) bool { return list[i].v > list[j].v })
	var sb strings.Builder
	for i, e := range list {
		if i == 15 {
			break
		}
		fmt.Fprintf(&sb, "%5d %s\n", e.v, e.k)
	}
	return sb.String()
}

// parallel runs f(i) for i in [0,n) on at most workers goroutines and
// waits for all of them. Tries that have not finished after two minutes
// are counted in s as hangs, and the test ends.
func parallel(t *testing.T, s *tally, n, workers int, f func(i int)) {
	t.Helper()
	next := make(chan int)
	var wg sync.WaitGroup
	var finished atomic.Int64
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				f(i)
				finished.Add(1)
			}
		}()
	}
	done := make(chan struct{})
	go func() {
		for i := range n {
			next <- i
		}
		close(next)
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		left := int64(n) - finished.Load()
		for range left {
			s.hang("a try did not finish within 2 minutes")
		}
		t.Fatalf("%d of %d tries did not finish within 2 minutes: something hangs", left, n)
	}
}

// mac returns a locally administered MAC for the campaign: group g,
// index i.
func mac(g, i int) string {
	return fmt.Sprintf("06:fa:%02x:%02x:%02x:%02x", g&0xff, (i>>16)&0xff, (i>>8)&0xff, i&0xff)
}

func stringsReader(s string) io.Reader { return strings.NewReader(s) }

// readAll reads and closes a response body.
func readAll(resp *http.Response) []byte {
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return b
}
