package connlimit

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// served accepts from l until it closes, holding each connection open
// until the test ends it.
type served struct {
	l     *Listener
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func serve(t *testing.T, opts Options) *served {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &served{l: New(ln, opts)}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := s.l.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = s.l.Close()
		s.wg.Wait()
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, c := range s.conns {
			_ = c.Close()
		}
	})
	return s
}

func (s *served) closeFirst() {
	s.mu.Lock()
	defer s.mu.Unlock()
	_ = s.conns[0].Close()
	_ = s.conns[0].Close() // a second Close gives back nothing more
	s.conns = s.conns[1:]
}

func dial(t *testing.T, addr net.Addr) net.Conn {
	c, err := net.Dial("tcp", addr.String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// refused reports whether the server ended c at once: it reads the canned
// answer, if any, up to the close.
func refused(t *testing.T, c net.Conn) string {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	data, err := io.ReadAll(c)
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the server held the connection")
	return string(data)
}

// TestCap: connections past the cap are closed as soon as they are
// accepted, counted and logged once per interval; closing one frees a
// slot.
func TestCap(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	s := serve(t, Options{Max: 3, Name: "device", Setting: "http.device_max_connections", Logger: zap.New(core)})
	for range 3 {
		dial(t, s.l.Addr())
	}
	require.Eventually(t, func() bool { return s.l.Stats().Active == 3 }, 10*time.Second, time.Millisecond)
	for range 5 {
		assert.Empty(t, refused(t, dial(t, s.l.Addr())))
	}
	st := s.l.Stats()
	assert.Equal(t, Stats{Name: "device", Max: 3, Active: 3, Refused: 5}, st)
	lines := logs.FilterMessage("connection refused: listener at its connection limit").All()
	require.Len(t, lines, 1, "the log is throttled")
	assert.Equal(t, "http.device_max_connections", lines[0].ContextMap()["setting"])

	s.closeFirst()
	require.Eventually(t, func() bool { return s.l.Stats().Active == 2 }, 10*time.Second, time.Millisecond)
	c := dial(t, s.l.Addr())
	require.Eventually(t, func() bool { return s.l.Stats().Active == 3 }, 10*time.Second, time.Millisecond)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(50*time.Millisecond)))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	require.True(t, errors.As(err, &ne) && ne.Timeout(), "a connection under the cap stays open: %v", err)
}

// TestHTTPRefusal: on a plain-text listener a refused client reads a 503
// that names the setting (or, if the reset wins, nothing).
func TestHTTPRefusal(t *testing.T) {
	s := serve(t, Options{Max: 1, Name: "control", Refusal: HTTPRefusal("http.control_max_connections")})
	dial(t, s.l.Addr())
	require.Eventually(t, func() bool { return s.l.Stats().Active == 1 }, 10*time.Second, time.Millisecond)
	c := dial(t, s.l.Addr())
	// The server may have answered and closed already: a failed write is
	// part of the refusal.
	_, _ = c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	answer := refused(t, c)
	if answer == "" {
		t.Log("the reset arrived before the answer")
		return
	}
	resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(answer)), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Equal(t, "1", resp.Header.Get("Retry-After"))
	assert.Contains(t, string(body), "http.control_max_connections")
}
