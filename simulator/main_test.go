package simulator

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitTimeout bounds every wait in the tests; nothing should come close.
const waitTimeout = 5 * time.Second

// fakeLink is an in-memory transport: what the board sends lands in out,
// and a device-side close is reported on closed.
type fakeLink struct {
	out    chan string
	closed chan error
	ctx    context.Context
	cancel context.CancelFunc
	once   sync.Once
}

func (f *fakeLink) send(msg string) error {
	select {
	case f.out <- msg:
		return nil
	case <-f.ctx.Done():
		return errLinkClosed
	}
}

func (f *fakeLink) closeChannel(cause error) {
	f.once.Do(func() {
		f.closed <- cause
		f.cancel()
	})
}

func (f *fakeLink) handleTransportMessage(string, *jsonValue) bool { return false }

// harness drives a board's core (receive path + main task) without a
// socket, so MCP behaviour can be checked byte for byte.
type harness struct {
	t    *testing.T
	b    *Board
	sess *session
	link *fakeLink
	wg   sync.WaitGroup
}

func newHarness(t *testing.T, cfg Config) *harness {
	t.Helper()
	if cfg.Profile == nil {
		cfg.Profile = mustProfile(t, "breadboard")
	}
	b, err := NewBoard(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{t: t, b: b, link: &fakeLink{out: make(chan string, 256), closed: make(chan error, 1), ctx: ctx, cancel: cancel}}
	h.sess = newSession(b, h.link, zap.NewNop())
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		h.sess.runMainTask(ctx)
	}()
	t.Cleanup(h.stop)
	return h
}

// stop ends the main task and waits for it.
func (h *harness) stop() {
	h.link.cancel()
	h.wg.Wait()
}

// deliver hands one raw text message to the board's receive path.
func (h *harness) deliver(text string) { h.sess.handleText([]byte(text)) }

// request wraps an MCP payload in the server's envelope and delivers it.
func (h *harness) request(payload string) { h.deliver(`{"type":"mcp","payload":` + payload + `}`) }

// next returns the next message the board sent.
func (h *harness) next() string {
	h.t.Helper()
	select {
	case m := <-h.link.out:
		return m
	case <-time.After(waitTimeout):
		h.t.Fatal("timed out waiting for a message from the board")
		return ""
	}
}

const envelopePrefix = `{"session_id":"","type":"mcp","payload":`

// nextPayload returns the MCP payload of the next message, checking the
// envelope around it byte for byte.
func (h *harness) nextPayload() string {
	h.t.Helper()
	m := h.next()
	require.True(h.t, strings.HasPrefix(m, envelopePrefix) && strings.HasSuffix(m, "}"), "unexpected envelope: %s", m)
	return m[len(envelopePrefix) : len(m)-1]
}

// call sends payload and returns the reply payload.
func (h *harness) call(payload string) string {
	h.t.Helper()
	h.request(payload)
	return h.nextPayload()
}

// markerID is used to prove that no reply came before the marker's.
const markerID = 424242

// requireNoReply sends payload, then a marker request; the marker's reply
// must be the next message, which shows payload was answered with nothing.
func (h *harness) requireNoReply(payload string) {
	h.t.Helper()
	h.request(payload)
	h.request(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"ping"}`, markerID))
	require.Equal(h.t, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"error":{"message":"Method not implemented: ping"}}`, markerID), h.nextPayload(),
		"payload %s must not be answered", payload)
}

// waitClosed returns the cause of the next device-side close.
func (h *harness) waitClosed() error {
	h.t.Helper()
	select {
	case err := <-h.link.closed:
		return err
	case <-time.After(waitTimeout):
		h.t.Fatal("timed out waiting for the board to close its channel")
		return nil
	}
}

func mustProfile(t *testing.T, name string) *Profile {
	t.Helper()
	p, err := LoadProfile(name)
	require.NoError(t, err)
	return p
}

func mustParseProfile(t *testing.T, yamlText string) *Profile {
	t.Helper()
	p, err := ParseProfile([]byte(yamlText), "test")
	require.NoError(t, err)
	return p
}
