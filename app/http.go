package app

// This file bounds what a client can make an HTTP listener hold (device,
// control and debug listeners): how many connections are open at once
// (internal/connlimit), how long a request's headers and body may take to
// arrive, how long a keep-alive connection may idle, and how long one write
// of a response may block.
//
// net/http's WriteTimeout is not used: it runs from the start of a request,
// so it would cut off the long-lived streams (/mcp, /api/events) and any
// answer that waits for a board. withDeadlines sets a write deadline before
// each write instead. ReadTimeout bounds headers and body only: net/http
// lifts the read deadline once the body is read, so a handler may run on.
// A hijacked connection (the boards' WebSocket) starts without deadlines
// and sets its own (ws/conn.go).

import (
	"bufio"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/internal/connlimit"
	"github.com/devicebridge/devicebridge/metrics"
)

// HTTPConfig bounds the HTTP listeners.
type HTTPConfig struct {
	// ReadHeaderTimeout bounds the arrival of a request's headers.
	ReadHeaderTimeout time.Duration `yaml:"read_header_timeout"`
	// ReadTimeout bounds the arrival of a whole request, headers and body:
	// a client dribbling its body is dropped.
	ReadTimeout time.Duration `yaml:"read_timeout"`
	// WriteTimeout bounds each write of a response (each event of a
	// stream): a client that stops reading is dropped.
	WriteTimeout time.Duration `yaml:"write_timeout"`
	// IdleTimeout closes a keep-alive connection idle between requests.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// DeviceMaxConnections bounds the device listener's open connections
	// (board WebSockets, OTA requests, idle keep-alives, TLS handshakes);
	// it must leave room for websocket.max_connections.
	DeviceMaxConnections int `yaml:"device_max_connections"`
	// ControlMaxConnections bounds the control listener's (and the debug
	// listener's) open connections.
	ControlMaxConnections int `yaml:"control_max_connections"`
	// MaxHeaderBytes bounds a request's header block on every listener
	// (net/http answers 431 past it). Boards send a few hundred bytes;
	// browsers and OAuth bearer tokens a few KiB.
	MaxHeaderBytes int `yaml:"max_header_bytes"`
}

// Defaults of HTTPConfig.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultWriteTimeout      = 30 * time.Second
	DefaultIdleTimeout       = 60 * time.Second
	// DefaultDeviceMaxConnections leaves 4096 connections (OTA calls,
	// boards between OTA and WebSocket) beside the default
	// websocket.max_connections.
	DefaultDeviceMaxConnections  = 20480
	DefaultControlMaxConnections = 1024
)

func defaultHTTPConfig() HTTPConfig {
	return HTTPConfig{
		ReadHeaderTimeout:     DefaultReadHeaderTimeout,
		ReadTimeout:           DefaultReadTimeout,
		WriteTimeout:          DefaultWriteTimeout,
		IdleTimeout:           DefaultIdleTimeout,
		DeviceMaxConnections:  DefaultDeviceMaxConnections,
		ControlMaxConnections: DefaultControlMaxConnections,
		MaxHeaderBytes:        DefaultMaxHeaderBytes,
	}
}

// DefaultMaxHeaderBytes is http.max_header_bytes's default: net/http's own
// (1 MiB) is far more than any client of the bridge sends.
const DefaultMaxHeaderBytes = 64 << 10

// validate checks what the table of ranges (configcheck.go) cannot: how
// the device listener's cap relates to the WebSocket cap.
func (c HTTPConfig) validate(wsMax int) error {
	var errs []error
	if c.DeviceMaxConnections >= 1 && wsMax > 0 && c.DeviceMaxConnections < wsMax {
		errs = append(errs, fmt.Errorf("http.device_max_connections %d is below websocket.max_connections %d: "+
			"every board socket is a device listener connection too, so raise the first or lower the second",
			c.DeviceMaxConnections, wsMax))
	}
	return errors.Join(errs...)
}

func registerHTTPFlags(fs *flag.FlagSet, c *HTTPConfig) {
	fs.DurationVar(&c.ReadTimeout, "http-read-timeout", c.ReadTimeout, "most time a request's headers and body may take to arrive (every HTTP listener)")
	fs.DurationVar(&c.WriteTimeout, "http-write-timeout", c.WriteTimeout, "most time one write of a response may block (every HTTP listener)")
	fs.DurationVar(&c.IdleTimeout, "http-idle-timeout", c.IdleTimeout, "close keep-alive connections idle this long (every HTTP listener)")
	fs.IntVar(&c.DeviceMaxConnections, "device-max-connections", c.DeviceMaxConnections, "most connections open at once on the device listener")
	fs.IntVar(&c.ControlMaxConnections, "control-max-connections", c.ControlMaxConnections, "most connections open at once on the control listener (and the debug listener)")
}

// listen binds addr for the listener name, capped at max connections
// (beneath TLS, so handshakes count), with TLS when tlsCfg is set.
func (a *App) listen(name, addr string, max int, setting string, tlsCfg *tls.Config) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, listenError(name, addr, err)
	}
	opts := connlimit.Options{Max: max, Name: name, Setting: setting, Logger: a.log.Named("http")}
	if tlsCfg == nil {
		opts.Refusal = connlimit.HTTPRefusal(setting)
	}
	capped := connlimit.New(ln, opts)
	a.mu.Lock()
	a.listeners = append(a.listeners, capped)
	a.mu.Unlock()
	if tlsCfg != nil {
		return tls.NewListener(capped, tlsCfg), nil
	}
	return capped, nil
}

// listenError says why the listener name could not bind addr, naming the
// flag and the config key that move it (--device-listen, device_listen).
func listenError(name, addr string, err error) error {
	flagName, key := "--"+name+"-listen", name+"_listen"
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("%s listener: %s is already in use (by another bridge or program); choose another address with %s (%s in the config file)",
			name, addr, flagName, key)
	}
	return fmt.Errorf("%s listener on %s (%s, %s): %w", name, addr, flagName, key, err)
}

// listenerStats reads the connection counters of every listener (metrics).
func (a *App) listenerStats() []metrics.ListenerStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]metrics.ListenerStats, 0, len(a.listeners))
	for _, l := range a.listeners {
		st := l.Stats()
		out = append(out, metrics.ListenerStats{Name: st.Name, Max: st.Max, Active: st.Active, Refused: st.Refused})
	}
	return out
}

// httpServer builds an http.Server with the configured bounds.
func (a *App) httpServer(h http.Handler, log *zap.Logger) *http.Server {
	c := a.cfg.HTTP
	return &http.Server{
		Handler:           withDeadlines(h, c.WriteTimeout),
		ReadHeaderTimeout: min(c.ReadHeaderTimeout, c.ReadTimeout),
		ReadTimeout:       c.ReadTimeout,
		IdleTimeout:       c.IdleTimeout,
		MaxHeaderBytes:    c.MaxHeaderBytes,
		ErrorLog:          httpErrorLog(log),
		// What net/http writes before a handler runs (400, 431, 100
		// Continue) gets a deadline too; it clears the deadline after each
		// answer.
		ConnState: func(conn net.Conn, state http.ConnState) {
			if state == http.StateActive {
				_ = conn.SetWriteDeadline(time.Now().Add(c.WriteTimeout))
			}
		},
	}
}

// withDeadlines gives every write of a response its own deadline (see the
// top of this file).
func withDeadlines(next http.Handler, write time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dw := &deadlineWriter{ResponseWriter: w, rc: http.NewResponseController(w), timeout: write}
		next.ServeHTTP(dw, r)
		// net/http flushes what is buffered after the handler returns.
		dw.extend()
	})
}

// deadlineWriter sets the write deadline before each write and flush,
// unless the handler sets its own.
type deadlineWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	// hijacked: the connection's new owner sets deadlines; own: the
	// handler does (SetWriteDeadline).
	hijacked, own bool
}

func (w *deadlineWriter) extend() {
	if !w.hijacked && !w.own {
		_ = w.rc.SetWriteDeadline(time.Now().Add(w.timeout))
	}
}

// SetWriteDeadline is how a handler that paces its own writes (the
// /api/events stream) takes the write deadline over, through
// http.ResponseController, which finds this method before unwrapping.
func (w *deadlineWriter) SetWriteDeadline(t time.Time) error {
	w.own = true
	return w.rc.SetWriteDeadline(t)
}

func (w *deadlineWriter) WriteHeader(code int) {
	w.extend()
	w.ResponseWriter.WriteHeader(code)
}

func (w *deadlineWriter) Write(p []byte) (int, error) {
	w.extend()
	return w.ResponseWriter.Write(p)
}

// Flush keeps streams flowing through the wrapper.
func (w *deadlineWriter) Flush() {
	w.extend()
	_ = w.rc.Flush()
}

// Hijack hands the connection over (gorilla/websocket asserts
// http.Hijacker); from then on its owner sets the deadlines.
func (w *deadlineWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	w.hijacked = true
	return w.rc.Hijack()
}

// Unwrap lets http.ResponseController reach the real writer.
func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
