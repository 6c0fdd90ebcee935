package mcphttp

import (
	"bytes"
	"encoding/json"
	"net/http"
	"sync"
	"time"
)

// Cancellation, legacy era. A client cancels a call with
// notifications/cancelled; the spec says the server should then not answer
// it. The go-sdk cancels the handler but still sends a result ("context
// canceled" or whatever the handler returned). The tracker remembers, per
// session, which tools/call requests are in flight and which of them the
// client cancelled; the result of a cancelled one is then stored as an
// empty event (so a resumed stream does not replay it) and not written to
// the live stream. A result that was already on its way when the
// cancellation arrived may still reach the client, which the spec allows.
//
// In the modern era closing the response stream is the cancellation, so
// there is nothing to withhold.
//
// This works around an SDK gap tracked upstream as go-sdk issues #1235 and
// #1259 (pull request #1267 adds the fix: no response for a request the
// peer cancelled). Once a release we use has it, the tracker can go.

// trackCalls is the legacy route's bookkeeping of cancellations: it
// learns the session ids the stateful handler issues, records the calls a
// POST of such a session starts and cancels (the tracker ignores ids it
// did not see issued), and withholds from the live stream
// the result of a call the client cancelled (trackingStore keeps it out of
// replays).
func (f *Front) trackCalls(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sid := r.Header.Get(headerSessionID)
		hw := &hookWriter{ResponseWriter: w}
		if sid == "" {
			hw.onHeader = func(h http.Header, code int) {
				if id := issuedSession(h, code); id != "" {
					f.tracker.add(id)
				}
			}
		} else {
			if r.Method == http.MethodPost {
				info := messageOf(r).info
				f.tracker.started(sid, info.calls)
				f.tracker.cancelled(sid, info.cancels)
			}
			hw.skip = func(p []byte) bool { return f.tracker.dropWritten(sid, p) }
		}
		next.ServeHTTP(hw, r)
	})
}

const (
	// suppressTTL bounds how long a cancelled call's result is waited for.
	suppressTTL = 10 * time.Minute
	// maxInflight bounds the bookkeeping of one session.
	maxInflight = 4096
)

type sessionTracker struct {
	mu       sync.Mutex
	sessions map[string]*sessionCalls // legacy sessions the handler issued
}

type sessionCalls struct {
	inflight   map[string]struct{}  // id keys of calls awaiting a result
	suppressed map[string]time.Time // id keys of cancelled calls → when
}

func newSessionTracker() *sessionTracker {
	return &sessionTracker{sessions: map[string]*sessionCalls{}}
}

// add records a session id the stateful handler issued.
func (t *sessionTracker) add(sid string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.sessions[sid]; !ok {
		t.sessions[sid] = &sessionCalls{inflight: map[string]struct{}{}, suppressed: map[string]time.Time{}}
	}
}

func (t *sessionTracker) known(sid string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.sessions[sid]
	return ok
}

func (t *sessionTracker) closed(sid string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.sessions, sid)
}

// started records tools/call requests about to be handed to the session.
// A reused id clears any stale cancellation of the same id.
func (t *sessionTracker) started(sid string, ids []string) {
	if len(ids) == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	sc := t.sessions[sid]
	if sc == nil {
		return
	}
	for _, id := range ids {
		if len(sc.inflight) >= maxInflight {
			break
		}
		sc.inflight[id] = struct{}{}
		delete(sc.suppressed, id)
	}
}

// cancelled marks in-flight calls whose result must be withheld.
func (t *sessionTracker) cancelled(sid string, ids []string) {
	if len(ids) == 0 {
		return
	}
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	sc := t.sessions[sid]
	if sc == nil {
		return
	}
	for id, at := range sc.suppressed {
		if now.Sub(at) > suppressTTL {
			delete(sc.suppressed, id)
		}
	}
	for _, id := range ids {
		if _, ok := sc.inflight[id]; ok {
			sc.suppressed[id] = now
		}
	}
}

// dropStored is called for every event the stateful handler stores. It
// retires the call a response answers and reports whether that response
// belongs to a cancelled call.
func (t *sessionTracker) dropStored(sid string, data []byte) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	sc := t.sessions[sid]
	if sc == nil || (len(sc.inflight) == 0 && len(sc.suppressed) == 0) {
		return false
	}
	id, ok := responseID(data)
	if !ok {
		return false
	}
	delete(sc.inflight, id)
	_, drop := sc.suppressed[id]
	return drop
}

// dropWritten is called for every write to a legacy response stream; it
// reports whether the write is the SSE event carrying the response of a
// cancelled call (and forgets that call).
func (t *sessionTracker) dropWritten(sid string, p []byte) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	sc := t.sessions[sid]
	if sc == nil || len(sc.suppressed) == 0 {
		return false
	}
	data, ok := sseData(p)
	if !ok {
		return false
	}
	id, ok := responseID(data)
	if !ok {
		return false
	}
	if _, drop := sc.suppressed[id]; drop {
		delete(sc.suppressed, id)
		return true
	}
	return false
}

// responseID returns the id key of a JSON-RPC response (not of a request
// or notification).
func responseID(data []byte) (string, bool) {
	if len(data) == 0 {
		return "", false
	}
	var m struct {
		ID     json.RawMessage `json:"id"`
		Method *string         `json:"method"`
	}
	if json.Unmarshal(data, &m) != nil || m.Method != nil {
		return "", false
	}
	k := idKey(m.ID)
	return k, k != ""
}

// sseData extracts the data of one SSE event as the go-sdk writes it (one
// "data: " line per event).
func sseData(p []byte) ([]byte, bool) {
	i := bytes.Index(p, []byte("data: "))
	if i < 0 || (i > 0 && p[i-1] != '\n') {
		return nil, false
	}
	rest := p[i+len("data: "):]
	if j := bytes.IndexByte(rest, '\n'); j >= 0 {
		rest = rest[:j]
	}
	return rest, true
}
