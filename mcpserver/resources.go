package mcpserver

// Board state as MCP resources. Each board the catalogue shows is one
// resource, devicebridge://boards/<device id>, whose JSON says who the board
// is (alias, MAC, board type, firmware), how it is connected (transport,
// state, node), what it offers (its tools, with their input schemas and the
// names they are published under) and the last result of its status tool
// (self.get_device_status), remembered from whoever called it last. The
// template devicebridge://boards/{board} also takes an alias, or the MAC
// percent-encoded.
//
// The resources follow the catalogue: sync adds and removes them as boards
// come and go (go-sdk then sends resources/list_changed, debounced, to the
// clients that listen). Subscriptions (resources/subscribe, or
// subscriptions/listen in the 2026-07-28 era) are kept here too, bounded per
// session and in all, so that a change reaches only the URIs someone
// subscribed to: sync and the status hook mark those URIs, and a goroutine
// of Run's sends each marked URI one notifications/resources/updated, after
// the sync that marked it, whatever number of boards changed meanwhile.
//
// Policy applies: a caller lists, reads and subscribes to the boards it may
// see, and reads only the tools it may call; any other board is "not
// found", like one that does not exist.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/internal/logthrottle"
	"github.com/devicebridge/devicebridge/policy"
)

const (
	// boardURIPrefix starts every board resource's URI; the rest is the
	// board: its device id in resources/list, or anything the template
	// takes.
	boardURIPrefix = "devicebridge://boards/"
	// boardTemplate is the one resource template, and its one variable.
	boardTemplate    = boardURIPrefix + "{board}"
	boardTemplateVar = "board"
	boardMIME        = "application/json"

	// StatusTool is the board tool whose last result a board's resource
	// shows: the firmware's own status tool, always present.
	StatusTool = "self.get_device_status"
	// maxStatusBytes bounds the status result kept for each board (a real
	// one is a few hundred bytes); a longer one is not kept, and the
	// resource says so.
	maxStatusBytes = 4096
	// maxRefLen bounds the board part of a URI we look at.
	maxRefLen = 128

	// DefaultMaxSubscriptions is Options.MaxSubscriptions' default.
	DefaultMaxSubscriptions = 256
	// maxSubscriptionsTotal bounds subscriptions of all sessions together.
	maxSubscriptionsTotal = 1 << 16
	// codeResourceNotFound is what a session of the 2025-11-25 era and
	// before gets for an unknown resource; later ones get -32602
	// (jsonrpc.CodeInvalidParams, go-sdk's default).
	codeResourceNotFound = -32002
)

// boardURI is the URI board deviceID is listed under.
func boardURI(deviceID string) string { return boardURIPrefix + deviceID }

// boardRef returns the board a URI of ours names (percent-decoded), or false
// for anything else.
func boardRef(uri string) (string, bool) {
	rest, ok := strings.CutPrefix(uri, boardURIPrefix)
	if !ok || rest == "" || len(rest) > maxRefLen {
		return "", false
	}
	ref, err := url.PathUnescape(rest)
	if err != nil || ref == "" || strings.ContainsAny(ref, "/?#") ||
		strings.IndexFunc(ref, func(r rune) bool { return unicode.IsControl(r) || unicode.IsSpace(r) }) >= 0 {
		return "", false
	}
	return ref, true
}

// refKey is what a board reference is filed under for notifications: a MAC
// by its canonical form, anything else (an alias, an id a board chose) by
// its lower case. keysOf gives the keys that may name a board.
func refKey(ref string) string {
	if mac, ok := device.CanonicalMAC(ref); ok {
		return "id:" + mac
	}
	return "name:" + strings.ToLower(ref)
}

// keysOf lists the keys a subscription naming board v can be filed under.
func (s *Server) keysOf(v *deviceView) []string {
	id := v.info.DeviceID
	keys := []string{refKey(id)}
	if v.alias != "" {
		keys = append(keys, "name:"+strings.ToLower(v.alias))
	}
	if a, ok := s.aliases.Of(id); ok && !strings.EqualFold(a, v.alias) {
		keys = append(keys, "name:"+strings.ToLower(a))
	}
	return keys
}

// boardResources is the resources' state: subscriptions, the marked URIs
// and each board's last status. mu is a leaf.
type boardResources struct {
	mu sync.Mutex
	// bySession: each session's subscribed URIs and their keys.
	bySession map[*mcp.ServerSession]map[string]string
	// byKey: the URIs filed under each key, with how many sessions
	// subscribed to each.
	byKey map[string]map[string]int
	total int // subscriptions in bySession
	// pruneAt: when bySession holds this many sessions, the ones that
	// ended are dropped (go-sdk forgets a closed session's subscriptions
	// without telling us).
	pruneAt int
	// pending: URIs to notify, taken by Run.
	pending map[string]struct{}
	wake    chan struct{} // one token: pending is not empty
	// status: each board's last status result, by device id.
	status map[string]*boardStatus
	// refusedLog throttles the warning about the bridge-wide cap.
	refusedLog logthrottle.Throttle
}

// boardStatus is the last result of a board's status tool.
type boardStatus struct {
	// result is the result's text: its JSON when it is JSON, else a JSON
	// string; nil when omitted says why.
	result  json.RawMessage
	omitted string
	at      time.Time
}

func newBoardResources() *boardResources {
	return &boardResources{bySession: map[*mcp.ServerSession]map[string]string{}, byKey: map[string]map[string]int{},
		pending: map[string]struct{}{}, wake: make(chan struct{}, 1), status: map[string]*boardStatus{}, pruneAt: 64}
}

// markLocked marks every URI filed under the keys for notification.
func (r *boardResources) markLocked(keys ...string) {
	marked := false
	for _, k := range keys {
		for uri := range r.byKey[k] {
			r.pending[uri] = struct{}{}
			marked = true
		}
	}
	if marked {
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
}

// take returns the marked URIs, sorted, and forgets them.
func (r *boardResources) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.pending))
	for uri := range r.pending {
		out = append(out, uri)
	}
	clear(r.pending)
	sort.Strings(out)
	return out
}

// addResources registers the fixed parts: the template (the per-board
// resources follow the Hub, in syncResources).
func (s *Server) addResources() {
	s.mcp.AddResourceTemplate(&mcp.ResourceTemplate{
		URITemplate: boardTemplate,
		Name:        "board",
		Title:       "A board's state",
		Description: "One board's state as JSON: alias, MAC, board type, firmware, transport, connection state, its tools " +
			"(with input schemas and the names they are published under) and the last result of its status tool " +
			"(" + StatusTool + "). {board} is the board's alias or its MAC (percent-encoded, or as resources/list shows it).",
		MIMEType: boardMIME,
	}, s.readBoard)
}

// boardResource is how resources/list shows board v. It changes only with
// the board's alias and type, so that list_changed follows boards coming
// and going, not their state (subscribe for that).
func boardResource(v *deviceView) *mcp.Resource {
	return &mcp.Resource{
		URI:   boardURI(v.info.DeviceID),
		Name:  v.alias,
		Title: "Board " + v.alias,
		Description: fmt.Sprintf("State of board %s: identity, transport, state, firmware, its tools and the last result "+
			"of its status tool.", boardLabel(v)),
		MIMEType: boardMIME,
	}
}

// syncResources follows a new catalogue: it adds and removes board
// resources, forgets the status of boards that left, and marks the
// subscribed URIs of boards that changed. It runs under syncMu, after cur
// was stored; it costs one pass over the boards, plus one comparison of
// each board's tools while anyone subscribes.
func (s *Server) syncResources(old, cur *catalog) {
	var added []*deviceView
	var removed []string
	for _, v := range cur.devices {
		o := old.byDevice[v.info.DeviceID]
		if o == nil || o.alias != v.alias || o.info.Board != v.info.Board {
			added = append(added, v)
		}
	}
	var gone []*deviceView
	for _, o := range old.devices {
		if _, ok := cur.byDevice[o.info.DeviceID]; !ok {
			gone = append(gone, o)
			removed = append(removed, boardURI(o.info.DeviceID))
		}
	}

	r := s.res
	r.mu.Lock()
	for _, o := range gone {
		delete(r.status, o.info.DeviceID)
	}
	if len(r.byKey) > 0 {
		for _, o := range gone {
			r.markLocked(s.keysOf(o)...)
		}
		for _, v := range cur.devices {
			o := old.byDevice[v.info.DeviceID]
			if o == nil || boardChanged(o, v) {
				r.markLocked(s.keysOf(v)...)
				if o != nil && o.alias != v.alias {
					r.markLocked(s.keysOf(o)...)
				}
			}
		}
	}
	r.mu.Unlock()

	if len(removed) > 0 {
		s.mcp.RemoveResources(removed...)
	}
	for _, v := range added {
		s.mcp.AddResource(boardResource(v), s.readBoard)
	}
}

// boardChanged reports whether what a board's resource shows changed
// between two catalogues (entries are shared while a tool is unchanged).
func boardChanged(o, v *deviceView) bool {
	a, b := &o.info, &v.info
	if o.alias != v.alias || o.stale != v.stale || o.hidden != v.hidden || len(o.tools) != len(v.tools) ||
		a.State != b.State || a.Generation != b.Generation || a.Board != b.Board || a.FirmwareVersion != b.FirmwareVersion ||
		a.Transport != b.Transport || a.Node != b.Node || a.HasMCP != b.HasMCP {
		return true
	}
	for i := range o.tools {
		if o.tools[i] != v.tools[i] && o.tools[i].fingerprint != v.tools[i].fingerprint {
			return true
		}
	}
	return false
}

// noteResult is the Hub's OnResult observer: it keeps the last result of
// each board's status tool and marks the board's subscribed URIs when the
// result changed.
func (s *Server) noteResult(deviceID, tool string, res *device.CallResult) {
	if tool != StatusTool || res.IsError {
		return
	}
	st := &boardStatus{at: time.Now()}
	n := 0
	for _, c := range res.Content {
		n += len(c.Text)
	}
	if n > maxStatusBytes {
		st.omitted = fmt.Sprintf("the result was %d bytes, more than the %d the bridge keeps", n, maxStatusBytes)
	} else {
		text := strings.TrimSpace(res.Text())
		if (strings.HasPrefix(text, "{") || strings.HasPrefix(text, "[")) && json.Valid([]byte(text)) {
			var buf bytes.Buffer
			if json.Compact(&buf, []byte(text)) == nil {
				st.result = buf.Bytes()
			}
		}
		if st.result == nil {
			st.result, _ = json.Marshal(text)
		}
	}
	r := s.res
	r.mu.Lock()
	defer r.mu.Unlock()
	// Only for a board in the catalogue: sync forgets a board's status
	// after it stored the catalogue without it, so none is left behind.
	v, ok := s.cat.Load().byDevice[deviceID]
	if !ok {
		return
	}
	prev := r.status[deviceID]
	r.status[deviceID] = st
	if prev == nil || !bytes.Equal(prev.result, st.result) || prev.omitted != st.omitted {
		r.markLocked(s.keysOf(v)...)
	}
}

// runResourceUpdates sends the marked updates until ctx ends. Run starts
// it and waits for it.
func (s *Server) runResourceUpdates(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.res.wake:
			s.flushResourceUpdates(ctx)
		}
	}
}

// flushResourceUpdates sends notifications/resources/updated for every
// marked URI (go-sdk sends it to the sessions subscribed to that URI). A
// write to a slow client's stream may take up to the control listener's
// write timeout; marks made meanwhile wait, one per URI, for the next
// round.
func (s *Server) flushResourceUpdates(ctx context.Context) {
	for _, uri := range s.res.take() {
		if err := s.mcp.ResourceUpdated(ctx, &mcp.ResourceUpdatedNotificationParams{URI: uri}); err != nil {
			s.log.Debug("resource update not sent", zap.String("uri", uri), zap.Error(err))
		}
	}
}

// statusView is a board's last status as its resource shows it.
type statusView struct {
	Tool    string          `json:"tool"`
	Result  json.RawMessage `json:"result,omitempty"`
	Omitted string          `json:"omitted,omitempty"`
	At      time.Time       `json:"at"`
}

// boardToolView is one tool as a board's resource shows it.
type boardToolView struct {
	Name string `json:"name"`
	// MCPName is the name the tool is published under on /mcp (not in
	// compact mode, where call_device_tool takes Name).
	MCPName     string          `json:"mcp_name,omitempty"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"inputSchema"`
	UserOnly    bool            `json:"user_only,omitempty"`
}

// boardState is a board's resource.
type boardState struct {
	URI string `json:"uri"`
	deviceSummary
	Node        string          `json:"node,omitempty"`
	Generation  uint64          `json:"generation"`
	ConnectedAt time.Time       `json:"connected_at"`
	ReadyAt     time.Time       `json:"ready_at,omitzero"`
	Tools       []boardToolView `json:"tools"`
	// Status is null until someone calls the board's status tool.
	Status *statusView `json:"status"`
}

// errResourceNotFound is go-sdk's "Resource not found" (-32602, data.uri),
// which resourcesMiddleware turns into -32002 for older sessions.
func errResourceNotFound(uri string) error { return mcp.ResourceNotFoundError(uri) }

// lookupBoard finds the board a URI names, as the caller in ctx may see it
// (its tools cut down to those it may call), or says it is not found.
func (s *Server) lookupBoard(ctx context.Context, uri string) (*deviceView, error) {
	ref, ok := boardRef(uri)
	if !ok {
		return nil, errResourceNotFound(uri)
	}
	v, _ := s.cat.Load().findDevice(ref)
	if v == nil || !s.mayView(ctx, v) {
		return nil, errResourceNotFound(uri)
	}
	return s.callersView(ctx, v), nil
}

// callersView is v with only the tools the caller in ctx may call.
func (s *Server) callersView(ctx context.Context, v *deviceView) *deviceView {
	if !s.opts.Access.Policy.Enabled() {
		return v
	}
	id := policy.IdentityFrom(ctx)
	cp := *v
	cp.tools = nil
	for _, e := range v.tools {
		if s.mayUse(id, e) {
			cp.tools = append(cp.tools, e)
		}
	}
	return &cp
}

// readBoard answers resources/read of a board resource.
func (s *Server) readBoard(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	v, err := s.lookupBoard(ctx, uri)
	if err != nil {
		return nil, err
	}
	data, err := json.Marshal(s.boardState(v))
	if err != nil {
		return nil, fmt.Errorf("board %s: %w", v.info.DeviceID, err)
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, MIMEType: boardMIME, Text: string(data)}}}, nil
}

// boardState is board v's resource (v as the caller may see it).
func (s *Server) boardState(v *deviceView) boardState {
	st := boardState{URI: boardURI(v.info.DeviceID), deviceSummary: summarize(v), Node: v.info.Node,
		Generation: v.info.Generation, ConnectedAt: v.info.ConnectedAt, ReadyAt: v.info.ReadyAt, Tools: []boardToolView{}}
	for _, e := range v.tools {
		t := boardToolView{Name: e.tool.Name, Description: boardText(e.tool.Description), InputSchema: e.published,
			UserOnly: e.userOnly}
		if !s.opts.Compact {
			t.MCPName = e.name
		}
		st.Tools = append(st.Tools, t)
	}
	if v.findTool(StatusTool) == nil {
		return st // the caller may not call it (policy), or the board has none
	}
	s.res.mu.Lock()
	if b := s.res.status[v.info.DeviceID]; b != nil {
		st.Status = &statusView{Tool: StatusTool, Result: b.result, Omitted: b.omitted, At: b.at}
	}
	s.res.mu.Unlock()
	return st
}

// subscribe is go-sdk's SubscribeHandler, for resources/subscribe and for
// each URI of a subscriptions/listen: it checks the URI and the bounds,
// and files the subscription. A board that is not connected may be
// subscribed to (by MAC or alias), so that its coming is seen, if the
// policy would let the caller see it.
func (s *Server) subscribe(ctx context.Context, req *mcp.SubscribeRequest) error {
	uri := req.Params.URI
	ref, ok := boardRef(uri)
	if !ok {
		return errResourceNotFound(uri)
	}
	if v, _ := s.cat.Load().findDevice(ref); v != nil {
		if !s.mayView(ctx, v) {
			return errResourceNotFound(uri)
		}
	} else if !plausibleBoard(ref) || !s.mayFollow(ctx, ref) {
		return errResourceNotFound(uri)
	}
	key := refKey(ref)
	r := s.res
	r.mu.Lock()
	defer r.mu.Unlock()
	subs := r.bySession[req.Session]
	if _, ok := subs[uri]; ok {
		return nil
	}
	if limit := s.opts.MaxSubscriptions; len(subs) >= limit {
		return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf(
			"This session already holds %d resource subscriptions, the most the bridge allows (mcp.max_subscriptions); "+
				"unsubscribe from some first.", limit)}
	}
	if len(r.bySession) >= r.pruneAt || r.total >= maxSubscriptionsTotal {
		s.pruneSubscriptionsLocked()
	}
	if r.total >= maxSubscriptionsTotal {
		r.refusedLog.Warn(s.log, "resource subscription refused: the bridge holds the most it allows",
			zap.Int("subscriptions", r.total))
		return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf(
			"The bridge already holds %d resource subscriptions, the most it allows; try again later.", r.total)}
	}
	if subs == nil {
		subs = map[string]string{}
		r.bySession[req.Session] = subs
	}
	subs[uri] = key
	if r.byKey[key] == nil {
		r.byKey[key] = map[string]int{}
	}
	r.byKey[key][uri]++
	r.total++
	return nil
}

// plausibleBoard reports whether ref could name a board that is not
// connected: a MAC, an alias, or an id a board may choose.
func plausibleBoard(ref string) bool {
	if _, ok := device.CanonicalMAC(ref); ok {
		return true
	}
	if ValidAlias(ref) {
		return true
	}
	return len(ref) <= device.MaxPlainIDLen && strings.IndexFunc(ref, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-')
	}) < 0
}

// mayFollow reports whether the caller in ctx may subscribe to a board that
// is not connected, named ref: whether the policy would let it see the
// board ref most likely names (an alias alone matches only exact alias
// patterns, never globs: see policy).
func (s *Server) mayFollow(ctx context.Context, ref string) bool {
	pol := s.opts.Access.Policy
	if !pol.Enabled() {
		return true
	}
	b := policy.Board{Alias: ref}
	if mac, ok := device.CanonicalMAC(ref); ok {
		b = policy.Board{ID: mac, Alias: s.aliases.Alias(mac)}
	} else if id, ok := s.aliases.Named(ref); ok {
		b = policy.Board{ID: id, Alias: ref}
	}
	return pol.BoardVisible(policy.IdentityFrom(ctx), b)
}

// unsubscribe is go-sdk's UnsubscribeHandler. It never fails: go-sdk
// calls it as a subscriptions/listen stream ends, and unsubscribing from
// what one did not subscribe to is no error.
func (s *Server) unsubscribe(_ context.Context, req *mcp.UnsubscribeRequest) error {
	r := s.res
	r.mu.Lock()
	defer r.mu.Unlock()
	s.dropLocked(req.Session, req.Params.URI)
	return nil
}

func (s *Server) dropLocked(ss *mcp.ServerSession, uri string) {
	r := s.res
	subs := r.bySession[ss]
	key, ok := subs[uri]
	if !ok {
		return
	}
	delete(subs, uri)
	if len(subs) == 0 {
		delete(r.bySession, ss)
	}
	r.total--
	if r.byKey[key][uri]--; r.byKey[key][uri] <= 0 {
		delete(r.byKey[key], uri)
		if len(r.byKey[key]) == 0 {
			delete(r.byKey, key)
		}
	}
}

// pruneSubscriptionsLocked drops the subscriptions of sessions that ended,
// and sets the next prune for when the sessions kept have doubled.
func (s *Server) pruneSubscriptionsLocked() {
	r := s.res
	live := map[*mcp.ServerSession]bool{}
	for ss := range s.mcp.Sessions() {
		live[ss] = true
	}
	for ss, subs := range r.bySession {
		if live[ss] {
			continue
		}
		for uri := range subs {
			s.dropLocked(ss, uri)
		}
	}
	r.pruneAt = max(64, 2*len(r.bySession))
}

// resourcesMiddleware filters resources/list down to the boards the caller
// may see, and gives sessions of the 2025-11-25 era and before the
// resource-not-found code of their era (-32002).
func (s *Server) resourcesMiddleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		switch method {
		case "resources/list", "resources/read", "resources/subscribe":
		default:
			return next(ctx, method, req)
		}
		res, err := next(ctx, method, req)
		if err != nil {
			var rpcErr *jsonrpc.Error
			if errors.As(err, &rpcErr) && rpcErr.Code == jsonrpc.CodeInvalidParams && rpcErr.Message == "Resource not found" &&
				legacySession(req) {
				cp := *rpcErr
				cp.Code = codeResourceNotFound
				return res, &cp
			}
			return res, err
		}
		if lr, ok := res.(*mcp.ListResourcesResult); ok && lr != nil && s.opts.Access.Policy.Enabled() {
			cat := s.cat.Load()
			kept := lr.Resources[:0:0]
			for _, r := range lr.Resources {
				if ref, ok := boardRef(r.URI); ok {
					if v, present := cat.byDevice[ref]; !present || !s.mayView(ctx, v) {
						continue
					}
				}
				kept = append(kept, r)
			}
			cp := *lr
			cp.Resources = kept
			res = &cp
		}
		return res, err
	}
}

// legacySession reports whether req comes from a session of the
// 2025-11-25 era or before (go-sdk's own test: a session without
// initialize parameters speaks the newest protocol).
func legacySession(req mcp.Request) bool {
	ss, ok := req.GetSession().(*mcp.ServerSession)
	if !ok || ss == nil {
		return false
	}
	ip := ss.InitializeParams()
	return ip != nil && ip.ProtocolVersion < modernVersion
}
