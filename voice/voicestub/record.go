package voicestub

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
)

// Connection is what the stub saw of one WebSocket upgrade attempt, as of
// the snapshot. Byte slices are shared with the stub's records and must
// be treated as read-only.
type Connection struct {
	// ID numbers attempts in arrival order, from 1.
	ID         uint64
	RemoteAddr string
	// Status is 101 for an accepted upgrade, else the refusal's status
	// (400, 401, 503).
	Status int
	// Header holds the upgrade request's headers, Authorization removed.
	Header http.Header
	// DeviceID, ClientID and ProtocolVersionHeader are those headers as
	// sent; HasAuthorization tells whether Authorization was sent and
	// AuthBy how it passed: "static", "hmac" or "" (auth off or refused).
	DeviceID              string
	ClientID              string
	ProtocolVersionHeader string
	HasAuthorization      bool
	AuthBy                string
	// ProtocolVersion is the binary framing in use (1, 2 or 3).
	ProtocolVersion int
	SessionID       string

	// Hello is the board's hello, raw; HelloMCP is its features.mcp.
	Hello    []byte
	HelloMCP bool
	// HelloSent is set once the server hello has been written.
	HelloSent bool

	// Texts are the board's text messages, raw, in order (hello included).
	Texts [][]byte
	// Frames are the binary frames as received; Payloads[i] is Frames[i]
	// de-framed (nil if malformed, counted in BadFrames).
	Frames      [][]byte
	Payloads    [][]byte
	BadFrames   int
	FramesHeard int // all binary frames, kept or not

	// Sent are the text messages written to the board, in order;
	// FramesSent counts binary frames written.
	Sent       [][]byte
	FramesSent int

	WakeWords     []string
	Aborts        int
	Conversations []Conversation
	// Answers counts answers written in full (through tts stop).
	Answers int
	// Ignored counts texts that were not JSON with a string type, or had
	// a type the stub does not handle.
	Ignored int

	// MCPReplies are the payloads of the board's mcp messages, raw.
	MCPReplies []json.RawMessage
	// InitializeResult is the result of initialize; ToolPages the raw
	// result of each tools/list page; Tools every listed tool, raw.
	InitializeResult json.RawMessage
	ToolPages        []json.RawMessage
	Tools            []json.RawMessage
	// ToolsListed is set once the last page has arrived; MCPError says
	// why listing stopped short.
	ToolsListed bool
	MCPError    string

	// Truncated is set when a cap kept something from being recorded.
	Truncated   bool
	Closed      bool
	CloseReason string
}

// Conversation is one listening turn: from listen start to its end, and
// the answer to it.
type Conversation struct {
	Mode string // auto, manual or realtime, as the board sent it
	// Heard counts the turn's frames; Frames and Payloads keep them
	// (within the connection's caps).
	Heard    int
	Frames   [][]byte
	Payloads [][]byte
	// EndedBy is "stop" (listen stop), "frames" (AutoFrames reached),
	// "restart" (a new listen start; not answered) or "close"; empty
	// while the turn is open.
	EndedBy string
	// Answered is set once tts stop followed the answer's last frame;
	// Aborted when an abort cut the answer; Skipped when the answer queue
	// was full. FramesSent counts its TTS frames written.
	Answered   bool
	Aborted    bool
	Skipped    bool
	FramesSent int
}

// OTARequest is one request to the OTA or activate endpoint.
type OTARequest struct {
	Path     string
	DeviceID string
	ClientID string
	Body     []byte
	Status   int
	Response []byte
}

// connRec is a Connection under construction, guarded by Server.mu.
type connRec struct {
	Connection
	bytes int // bytes kept in records, against MaxRecordBytes
}

// keep reports whether n more bytes fit the record caps for a list that
// already holds have entries, and charges them.
func (s *Server) keep(r *connRec, have, n int) bool {
	if have >= s.cfg.MaxRecords || r.bytes+n > s.cfg.MaxRecordBytes {
		r.Truncated = true
		return false
	}
	r.bytes += n
	return true
}

// changedLocked wakes every waiter. Callers hold s.mu.
func (s *Server) changedLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// update runs f on r under s.mu and wakes waiters.
func (s *Server) update(r *connRec, f func(r *connRec)) {
	s.mu.Lock()
	f(r)
	s.changedLocked()
	s.mu.Unlock()
}

func (r *connRec) snapshot() Connection {
	c := r.Connection
	c.Header = r.Header.Clone()
	c.Texts = slices.Clone(r.Texts)
	c.Frames = slices.Clone(r.Frames)
	c.Payloads = slices.Clone(r.Payloads)
	c.Sent = slices.Clone(r.Sent)
	c.WakeWords = slices.Clone(r.WakeWords)
	c.MCPReplies = slices.Clone(r.MCPReplies)
	c.ToolPages = slices.Clone(r.ToolPages)
	c.Tools = slices.Clone(r.Tools)
	c.Conversations = slices.Clone(r.Conversations)
	for i := range c.Conversations {
		c.Conversations[i].Frames = slices.Clone(c.Conversations[i].Frames)
		c.Conversations[i].Payloads = slices.Clone(c.Conversations[i].Payloads)
	}
	return c
}

// Connections returns every recorded connection attempt, oldest first.
func (s *Server) Connections() []Connection {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snapshotLocked(nil)
}

// Device returns the recorded attempts whose Device-Id matches deviceID
// (ignoring case), oldest first.
func (s *Server) Device(deviceID string) []Connection {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snapshotLocked(&deviceID)
}

// snapshotLocked copies the records of deviceID, or all with nil.
func (s *Server) snapshotLocked(deviceID *string) []Connection {
	out := []Connection{}
	for _, r := range s.history {
		if deviceID == nil || strings.EqualFold(r.DeviceID, *deviceID) {
			out = append(out, r.snapshot())
		}
	}
	return out
}

// OTARequests returns the recorded OTA and activate requests, oldest first.
func (s *Server) OTARequests() []OTARequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.ota)
}

// Wait blocks until cond, called with a fresh snapshot of Connections
// after every change, returns true, or ctx ends (returning ctx's error).
// cond must not call back into the Server.
func (s *Server) Wait(ctx context.Context, cond func([]Connection) bool) error {
	for {
		s.mu.Lock()
		snap := s.snapshotLocked(nil)
		ch := s.changed
		s.mu.Unlock()
		if cond(snap) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// waitCount waits until count, computed under s.mu over deviceID's
// records, reaches n. It copies nothing, so it stays cheap under traffic.
func (s *Server) waitCount(ctx context.Context, deviceID string, n int, count func(r *connRec) int) error {
	for {
		s.mu.Lock()
		total := 0
		for _, r := range s.history {
			if strings.EqualFold(r.DeviceID, deviceID) {
				total += count(r)
			}
		}
		ch := s.changed
		s.mu.Unlock()
		if total >= n {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// WaitConnections waits until deviceID has n connections whose server
// hello has been written.
func (s *Server) WaitConnections(ctx context.Context, deviceID string, n int) error {
	return s.waitCount(ctx, deviceID, n, func(r *connRec) int { return b2i(r.HelloSent) })
}

// WaitFrames waits until deviceID's connections have heard n binary frames
// in all.
func (s *Server) WaitFrames(ctx context.Context, deviceID string, n int) error {
	return s.waitCount(ctx, deviceID, n, func(r *connRec) int { return r.FramesHeard })
}

// WaitConversations waits until deviceID's connections have finished n
// conversations: answered in full, aborted or skipped.
func (s *Server) WaitConversations(ctx context.Context, deviceID string, n int) error {
	return s.waitCount(ctx, deviceID, n, func(r *connRec) int {
		done := 0
		for _, c := range r.Conversations {
			done += b2i(c.Answered || c.Aborted || c.Skipped)
		}
		return done
	})
}

// WaitTools waits until a connection of deviceID has listed all its tools
// (or stopped listing with an MCPError).
func (s *Server) WaitTools(ctx context.Context, deviceID string) error {
	return s.waitCount(ctx, deviceID, 1, func(r *connRec) int { return b2i(r.ToolsListed || r.MCPError != "") })
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
