package device

import (
	"context"
	"encoding/json"
)

// Remote is the part of the fleet that other bridge nodes hold, as this
// node sees it. cluster/ implements it over NATS; the device layer only
// knows this interface, so it imports no clustering library. With a Remote
// set (SetRemote), the Hub lists remote boards beside its own and routes
// calls to them, so mcpserver/ and api/ see one fleet without knowing where a
// board is connected.
type Remote interface {
	// Devices lists the boards other nodes hold; Info.Node names the node.
	Devices() []Info
	// Device finds one board another node holds.
	Device(deviceID string) (Info, bool)
	// CallTool calls a tool on a board another node holds, through that
	// node. Errors carry the same Code as a local call would. It must not
	// retry on another node.
	CallTool(ctx context.Context, info Info, tool string, args json.RawMessage) (*CallResult, error)
}

type remoteBox struct{ r Remote }

// SetRemote makes the Hub list and call the boards r holds beside its own
// sessions (a local session wins over a remote board with the same id).
// nil removes it. Events about remote boards reach subscribers through
// PublishRemote.
func (h *Hub) SetRemote(r Remote) {
	if r == nil {
		h.remote.Store(nil)
		return
	}
	h.remote.Store(&remoteBox{r})
}

func (h *Hub) remoteOf() Remote {
	if b := h.remote.Load(); b != nil {
		return b.r
	}
	return nil
}

// PublishRemote hands an event about a board another node holds to every
// subscriber, in order with the Hub's own events. ev.Info.Node must name
// the holder, which is how subscribers (cluster/ among them) tell remote
// events from local ones.
func (h *Hub) PublishRemote(ev Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	h.publishLocked(ev)
}

// CallLocal calls a tool on a board this node holds, never on a remote one:
// it is how a node answers calls other nodes route to it.
func (h *Hub) CallLocal(ctx context.Context, deviceID, tool string, args json.RawMessage) (*CallResult, error) {
	return h.call(ctx, deviceID, tool, args, false)
}

// Device returns a snapshot of one board: this node's session if it has
// one, else the remote board of that id.
func (h *Hub) Device(deviceID string) (Info, bool) {
	deviceID = NormalizeID(deviceID)
	if s, ok := h.Session(deviceID); ok {
		return s.Info(), true
	}
	if r := h.remoteOf(); r != nil {
		return r.Device(deviceID)
	}
	return Info{}, false
}

// remoteDevice finds a board to call through the Remote: only when remote
// calls are allowed and this node has no session of that id.
func (h *Hub) remoteDevice(deviceID string, allowed bool) (Info, bool) {
	r := h.remoteOf()
	if !allowed || r == nil {
		return Info{}, false
	}
	if _, local := h.Session(deviceID); local {
		return Info{}, false
	}
	return r.Device(deviceID)
}

// withRemote appends the remote boards whose ids no local session has.
func (h *Hub) withRemote(local []Info) []Info {
	r := h.remoteOf()
	if r == nil {
		return local
	}
	remote := r.Devices()
	if len(remote) == 0 {
		return local
	}
	seen := make(map[string]bool, len(local))
	for _, i := range local {
		seen[i.DeviceID] = true
	}
	for _, i := range remote {
		if !seen[i.DeviceID] {
			local = append(local, i)
		}
	}
	return local
}
