package voice

import "sync/atomic"

type counters struct {
	opened, closed, refused, upstreamErrors  atomic.Int64
	framesUp, framesDown, bytesUp, bytesDown atomic.Int64
	droppedUp, droppedDown                   atomic.Int64
	textUp, textDown, mcpIn, mcpRefused      atomic.Int64
	malformed                                atomic.Int64
}

// Stats counts the relay's work since start.
type Stats struct {
	// Opened conversations, Closed ones, and Active now.
	Opened, Closed, Active int64
	// Refused: past voice.max_conversations.
	Refused int64
	// UpstreamErrors: dial, refusal or hello failures.
	UpstreamErrors int64
	// FramesUp/BytesUp: audio toward the upstream; Down: toward boards.
	FramesUp, FramesDown, BytesUp, BytesDown int64
	// DroppedUp/DroppedDown: audio dropped on a full queue.
	DroppedUp, DroppedDown int64
	// TextUp/TextDown: conversation messages relayed.
	TextUp, TextDown int64
	// MCPRequests from upstreams, and MCPRefused past voice.mcp_queue.
	MCPRequests, MCPRefused int64
	// Malformed upstream messages, dropped.
	Malformed int64
}

// Stats returns a snapshot.
func (r *Relay) Stats() Stats {
	r.mu.Lock()
	active := int64(len(r.open))
	r.mu.Unlock()
	s := &r.stats
	return Stats{
		Opened: s.opened.Load(), Closed: s.closed.Load(), Active: active, Refused: s.refused.Load(),
		UpstreamErrors: s.upstreamErrors.Load(),
		FramesUp:       s.framesUp.Load(), FramesDown: s.framesDown.Load(), BytesUp: s.bytesUp.Load(), BytesDown: s.bytesDown.Load(),
		DroppedUp: s.droppedUp.Load(), DroppedDown: s.droppedDown.Load(),
		TextUp: s.textUp.Load(), TextDown: s.textDown.Load(),
		MCPRequests: s.mcpIn.Load(), MCPRefused: s.mcpRefused.Load(), Malformed: s.malformed.Load(),
	}
}

// DroppedUp counts one audio frame a transport dropped before it reached
// a conversation (none open, or its held messages full).
func (r *Relay) DroppedUp() { r.stats.droppedUp.Add(1) }
