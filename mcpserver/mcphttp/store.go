package mcphttp

import (
	"context"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// trackingStore is the stateful handler's event store. It stores the
// result of a cancelled call as an empty event (replay skips those, and
// event indices stay aligned), and forgets a session's bookkeeping (its
// calls, its slot, its rate bucket) when the session ends.
type trackingStore struct {
	mcp.EventStore
	f *Front
}

func (s *trackingStore) Append(ctx context.Context, sessionID, streamID string, data []byte) error {
	if s.f.tracker.dropStored(sessionID, data) {
		data = nil
	}
	return s.EventStore.Append(ctx, sessionID, streamID, data)
}

func (s *trackingStore) SessionClosed(ctx context.Context, sessionID string) error {
	s.f.tracker.closed(sessionID)
	s.f.limits.closed(sessionID)
	if s.f.rates != nil {
		s.f.rates.sessions.Forget(sessionID)
	}
	return s.EventStore.SessionClosed(ctx, sessionID)
}
