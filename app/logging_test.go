package app

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/devicebridge/devicebridge/device"
)

// loggedApp starts an App on loopback whose log is observed.
func loggedApp(t *testing.T, mutate func(*Config)) (*App, *observer.ObservedLogs) {
	t.Helper()
	cfg := Default()
	cfg.DeviceListen = "127.0.0.1:0"
	cfg.ControlListen = "127.0.0.1:0"
	cfg.MQTT.Listen = ""
	mutate(&cfg)
	core, logs := observer.New(zapcore.InfoLevel)
	return runApp(t, cfg, zap.New(core)), logs
}

// TestTLSHandshakeFloodIsOneLine: net/http logs each failed TLS handshake,
// and anyone who reaches the device listener can fail one per connection:
// a flood of them is one line, the rest counted for the next.
func TestTLSHandshakeFloodIsOneLine(t *testing.T) {
	leakCheck(t)
	certFile, keyFile, _ := selfSigned(t)
	a, logs := loggedApp(t, func(c *Config) { c.TLS.Device = CertConfig{CertFile: certFile, KeyFile: keyFile} })
	const flood = 50
	for range flood {
		conn, err := net.Dial("tcp", a.DeviceAddr().String())
		require.NoError(t, err)
		_, err = io.WriteString(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n") // not a TLS hello
		require.NoError(t, err)
		_ = conn.SetReadDeadline(time.Now().Add(mqttWait))
		_, _ = io.Copy(io.Discard, conn) // until the bridge closes it, after logging
		require.NoError(t, conn.Close())
	}
	errs := a.deviceSrv.ErrorLog.Writer().(*httpErrors)
	require.Eventually(t, func() bool { return errs.handshake.Suppressed() == flood-1 }, mqttWait, 10*time.Millisecond)
	lines := logs.FilterMessage("http: TLS handshake failed").All()
	require.Len(t, lines, 1, "one line for the whole flood")
	assert.Contains(t, lines[0].ContextMap()["detail"], "TLS handshake error from 127.0.0.1")
	assert.Zero(t, logs.FilterMessageSnippet("TLS handshake error").Len(), "no line of net/http's own wording")

	// A TLS client still gets through.
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // a test certificate
	defer client.CloseIdleConnections()
	resp, err := client.Get("https://" + a.DeviceAddr().String() + "/")
	require.NoError(t, err)
	resp.Body.Close()
}

// TestConnectionLinesAreSampled: a line written once per connection
// ("device connected") is multiplied by whoever cycles connections; past
// log.sampling's first lines of a tick the log keeps one in thereafter,
// and /metrics counts what it dropped.
func TestConnectionLinesAreSampled(t *testing.T) {
	leakCheck(t)
	const boards, initial = 12, 3
	a, logs := loggedApp(t, func(c *Config) {
		c.Simulate.Count = boards
		// A tick as long as the test, so the count does not depend on how
		// fast the machine connects the boards.
		c.Log.Sampling = LogSampling{Initial: initial, Thereafter: 1 << 20, Tick: time.Hour}
	})
	require.Eventually(t, func() bool {
		n := 0
		for _, d := range a.Hub.Devices() {
			if d.State == device.StateReady {
				n++
			}
		}
		return n == boards
	}, mqttWait, 10*time.Millisecond)
	// zap's sampler starts its count with a reset that goroutines logging
	// at the same instant can each make (its counters are not one atomic
	// step), so a line or two past initial may pass at the very start.
	connected, ready := logs.FilterMessage("device connected").Len(), logs.FilterMessage("device ready").Len()
	assert.GreaterOrEqual(t, connected, initial)
	assert.LessOrEqual(t, connected, initial+2, "past the first lines of a tick, connection lines are sampled")
	assert.GreaterOrEqual(t, ready, initial)
	assert.LessOrEqual(t, ready, initial+2)
	dropped := scrape(t, "http://"+a.ControlAddr().String()+"/metrics", `devicebridge_log_lines_dropped_total{level="info"}`)
	assert.GreaterOrEqual(t, dropped, float64(2*boards-connected-ready), "the connected and ready lines left out are counted")
	assert.Zero(t, scrape(t, "http://"+a.ControlAddr().String()+"/metrics", `devicebridge_log_lines_dropped_total{level="error"}`))
}

// scrape reads one series' value from a Prometheus text page.
func scrape(t *testing.T, url, series string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err)
			return f
		}
	}
	require.NoError(t, sc.Err())
	t.Fatalf("no series %s at %s", series, url)
	return 0
}

// TestLogSamplingConfig: log.sampling has zap's production defaults, is
// set from the file, may be turned off, and a bad value stops the start
// naming the key.
func TestLogSamplingConfig(t *testing.T) {
	assert.Equal(t, LogSampling{Initial: 100, Thereafter: 100, Tick: time.Second}, Default().Log.Sampling)
	path := filepath.Join(t.TempDir(), "bridge.yaml")
	require.NoError(t, os.WriteFile(path, []byte("log:\n  sampling:\n    initial: -1\n"), 0o600))
	cfg, err := ParseArgs("bridge", []string{"--config", path})
	require.NoError(t, err)
	assert.Equal(t, -1, cfg.Log.Sampling.Initial, "a negative initial turns sampling off")
	for _, bad := range []struct{ file, want string }{
		{"log:\n  sampling:\n    initial: 0\n", "log.sampling.initial 0: use a whole number from 1 to 1048576"},
		{"log:\n  sampling:\n    thereafter: 0\n", "log.sampling.thereafter 0: use a whole number from 1 to 1048576"},
		{"log:\n  sampling:\n    tick: 0s\n", "log.sampling.tick 0s: use a duration from 10ms to 1h"},
	} {
		require.NoError(t, os.WriteFile(path, []byte(bad.file), 0o600))
		_, err := ParseArgs("bridge", []string{"--config", path})
		require.ErrorContains(t, err, bad.want, bad.file)
	}

	core, logs := observer.New(zapcore.InfoLevel)
	var dropped int
	log := sampled(zap.New(core), LogSampling{Initial: -1}, func(zapcore.Entry, zapcore.SamplingDecision) { dropped++ })
	for range 500 {
		log.Info("all of them")
	}
	assert.Equal(t, 500, logs.Len(), "sampling off writes every line")
	assert.Zero(t, dropped)
}

// TestConsoleLogToFileHasNoColour: a console log redirected to a file or a
// pipe is plain text; colour codes are for terminals only.
func TestConsoleLogToFileHasNoColour(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "bridge.log"))
	require.NoError(t, err)
	defer f.Close()
	logger, err := newLoggerTo(defaultLogConfig(), f)
	require.NoError(t, err)
	logger.Info("hello")
	logger.Warn("careful", zap.String("key", "value"))
	require.NoError(t, logger.Sync())
	data, err := os.ReadFile(f.Name())
	require.NoError(t, err)
	assert.NotContains(t, string(data), "\x1b[", "no ANSI escape codes in a file")
	assert.Contains(t, string(data), "INFO\t")
	assert.Contains(t, string(data), "WARN\t")
	assert.Contains(t, string(data), `{"key": "value"}`)

	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	defer w.Close()
	assert.False(t, colourFor(w), "a pipe gets no colour")
	devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	require.NoError(t, err)
	defer devNull.Close()
	assert.False(t, colourFor(devNull), "/dev/null is a character device, not a terminal")
}
