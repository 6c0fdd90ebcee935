package device

import (
	"encoding/json"
	"time"

	"github.com/devicebridge/devicebridge/internal/argcheck"
)

// State is where a session is in its lifecycle.
type State int

// Session states. A board without MCP stays in StateConnected.
const (
	StateConnected State = iota
	StateInitializing
	StateReady
	StateClosed
)

var stateNames = [...]string{"connected", "initializing", "ready", "closed"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "unknown"
}

// MarshalText renders the state by name in JSON and logs.
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Info is a snapshot of one session, safe to hand out.
type Info struct {
	Identity
	State State `json:"state"`
	// CloseReason says why the session ended (empty while open).
	CloseReason string `json:"close_reason,omitempty"`
	// CloseCause classifies CloseReason (empty while open).
	CloseCause CloseCause `json:"close_cause,omitempty"`
	// InitError says why initialization failed, if it did.
	InitError string `json:"init_error,omitempty"`
	// Board and FirmwareVersion come from the board's initialize reply.
	Board           string `json:"board,omitempty"`
	FirmwareVersion string `json:"firmware_version,omitempty"`
	Tools           []Tool `json:"-"`
	// RefusedTools are the tools the board listed past the bounds of
	// HubConfig.ToolLimits (the first 32 of them): the bridge does not
	// offer them (Tools leaves them out).
	RefusedTools []RefusedTool `json:"refused_tools,omitempty"`
	ConnectedAt  time.Time     `json:"connected_at"`
	ReadyAt      time.Time     `json:"ready_at,omitzero"`
	ClosedAt     time.Time     `json:"closed_at,omitzero"`
	// Node names the bridge node that holds the board; it is set only for
	// boards another node holds (see Hub.SetRemote), empty for local ones.
	Node string `json:"node,omitempty"`
	// HolderAlias is the alias the node that holds the board shows it
	// under (its fleet directory record says), so that every node can show
	// the board by one name; set only with Node. The control API shows the
	// alias in use on the node answering, not this.
	HolderAlias string `json:"-"`
	// Generation increases with every session the Hub creates, so a
	// subscriber can tell a reconnected board from the one it knew.
	Generation uint64 `json:"generation"`
}

// ToolInfo is how the control API shows one tool.
type ToolInfo struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"inputSchema,omitempty"`
	UserOnly    bool            `json:"user_only"`
	// ProseDefaults names the arguments whose schema "default" is prose
	// about the argument, not a value (argcheck.ProseDefault): the bridge
	// does not use it, and a client should neither show nor prefill it.
	ProseDefaults []string `json:"prose_defaults,omitempty"`
}

// ToolInfos lists the tools in device order with user-only tools marked.
func (i Info) ToolInfos() []ToolInfo {
	out := make([]ToolInfo, 0, len(i.Tools))
	for _, t := range i.Tools {
		ti := ToolInfo{Name: t.Name, Description: t.Description, InputSchema: t.InputSchema, UserOnly: t.UserOnly()}
		if len(t.InputSchema) > 0 {
			for _, p := range argcheck.Shared(t.InputSchema).Props() {
				if len(p.IgnoredDefault) > 0 {
					ti.ProseDefaults = append(ti.ProseDefaults, p.Name)
				}
			}
		}
		out = append(out, ti)
	}
	return out
}

// EventType says what changed.
type EventType int

// Event types. EventResync means the subscriber fell too far behind and
// must re-read Hub.Devices() instead of relying on the events it missed.
// EventCall reports a finished tool call; only subscriptions that asked
// for calls (SubscribeOptions.Calls) receive it.
const (
	EventOnline EventType = iota
	EventToolsChanged
	EventOffline
	EventResync
	EventCall
	// EventVoice reports a relayed conversation opening, closing or
	// failing to reach the voice upstream (Voice is set).
	EventVoice
)

var eventNames = [...]string{"online", "tools_changed", "offline", "resync", "call", "voice"}

func (t EventType) String() string {
	if int(t) < len(eventNames) {
		return eventNames[t]
	}
	return "unknown"
}

// Event is one change in the Hub. Info is the session snapshot at the time
// (zero for EventResync and EventCall); Call is set for EventCall only.
// Seq numbers the Hub's events from 1, in the order it publishes them; an
// EventResync carries the Seq of the last event it stands for. At is when
// this Hub published it.
type Event struct {
	Seq      uint64
	At       time.Time
	Type     EventType
	DeviceID string
	Info     Info
	Call     CallOutcome
	Voice    VoiceNote
}

// activity reports events that are not board state (calls, voice): only
// subscriptions that ask for them get them.
func (ev Event) activity() bool { return ev.Type == EventCall || ev.Type == EventVoice }

// VoiceNote is a relayed conversation's change: Kind is "opened",
// "closed" or "failed". It carries no audio and no message text.
type VoiceNote struct {
	Kind      string
	Transport string
	SessionID string
	// Upstream is the voice server's URL without credentials.
	Upstream string
	// Reason says why a conversation closed or failed.
	Reason string
}

// CallOutcome is how one tool call through Hub.CallTool ended. It carries
// no arguments and no results.
type CallOutcome struct {
	// Transport is the board's transport, or "" when the call never found
	// a session (unknown device, shutting down).
	Transport string
	Tool      string
	// Code is "" on success.
	Code     Code
	Duration time.Duration
}
