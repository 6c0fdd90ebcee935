package mcphttp

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/authn"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The step tests below run one step over a tiny next handler, with a Front
// holding only what that step uses.

// reached is a next handler that records the requests it is given.
type reached struct{ reqs []*http.Request }

func (n *reached) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n.reqs = append(n.reqs, r)
	w.WriteHeader(http.StatusNoContent)
}

func request(method, body string, header ...string) *http.Request {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	r := httptest.NewRequest(method, "/mcp", rd)
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	return r
}

// classified is r as bodyLimit hands it on: its body read and classified
// in its context.
func classified(r *http.Request) *http.Request {
	var body []byte
	if r.Body != nil {
		body, _ = io.ReadAll(r.Body)
	}
	return r.WithContext(context.WithValue(r.Context(), messageKey{}, message{body: body, info: classify(body)}))
}

func serve(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// behindGuard puts h behind the front door's authentication with one
// static tokens, "kitchen=k-secret" and "hall=h-secret", as the bridge
// mounts /mcp.
func behindGuard(h http.Handler) http.Handler {
	g := &authn.Guard{Verifier: authn.NewVerifier([]string{"kitchen=k-secret", "hall=h-secret"}, nil), Via: "mcp", Log: zap.NewNop()}
	return g.Middleware()(h)
}

// TestChain: the first step is the outermost, so a request meets the
// steps in the order New lists them.
func TestChain(t *testing.T) {
	var order []string
	step := func(name string) func(http.Handler) http.Handler {
		return func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				order = append(order, name)
				next.ServeHTTP(w, r)
			})
		}
	}
	next := &reached{}
	serve(chain(step("a"), step("b"), step("c"))(next), request(http.MethodGet, ""))
	assert.Equal(t, []string{"a", "b", "c"}, order)
	assert.Len(t, next.reqs, 1)
}

// TestBindLifetime: a request's context ends when the server's lifetime
// does, and once the request is over; once it has ended, requests are
// refused.
func TestBindLifetime(t *testing.T) {
	lifetime, stop := context.WithCancel(context.Background())
	var seen context.Context
	h := bindLifetime(lifetime)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = r.Context()
		assert.NoError(t, seen.Err(), "alive while the server is")
		stop()
		<-seen.Done() // a hanging stream ends when the server closes
	}))
	serve(h, request(http.MethodGet, ""))
	assert.ErrorIs(t, seen.Err(), context.Canceled)

	next := &reached{}
	w := serve(bindLifetime(lifetime)(next), classified(request(http.MethodPost, `{"jsonrpc":"2.0","id":7,"method":"initialize"}`)))
	assert.Equal(t, http.StatusServiceUnavailable, w.Code, "refused once the server has closed")
	assert.Contains(t, w.Body.String(), `"id":7`)
	assert.Empty(t, next.reqs, "the go-sdk opens no session of a closed server")

	h = bindLifetime(context.Background())(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { seen = r.Context() }))
	serve(h, request(http.MethodGet, ""))
	assert.ErrorIs(t, seen.Err(), context.Canceled, "released with the request")
}
