package mcpclient

import (
	"encoding/json"
	"errors"
	"fmt"
	"unique"
	"unsafe"
)

// ProtocolVersion is what the bridge asks for; boards ignore it and answer
// 2024-11-05.
const ProtocolVersion = "2024-11-05"

// Errors a caller branches on. Test with errors.Is.
var (
	// ErrBusy means the board's request queue is full.
	ErrBusy = errors.New("device busy: too many requests queued")
	// ErrTimeout means no reply came in time. The board may still carry the
	// request out: the outcome is unknown and the request is not retried.
	ErrTimeout = errors.New("device did not reply in time (outcome unknown)")
	// ErrQueueTimeout means the request's time ran out while it waited
	// behind earlier ones: it was never sent, so nothing happened.
	ErrQueueTimeout = errors.New("device still busy with earlier requests when the time ran out: not sent, nothing happened")
	// ErrDisconnected means the board's link went away before the reply.
	ErrDisconnected = errors.New("device disconnected")
	// ErrCursorLoop means tools/list returned a cursor already seen.
	ErrCursorLoop = errors.New("tools/list cursor loop")
	// ErrTooManyPages means tools/list exceeded the page cap.
	ErrTooManyPages = errors.New("tools/list exceeded the page limit")
	// ErrTooManyTools means tools/list exceeded the tool cap.
	ErrTooManyTools = errors.New("tools/list exceeded the tool limit")
	// ErrListTooLarge means tools/list replies exceeded the size cap.
	ErrListTooLarge = errors.New("tools/list exceeded the size limit")
	// ErrBadReply means the board replied with something that is not the
	// expected result shape.
	ErrBadReply = errors.New("malformed reply from device")
)

// DeviceError is an error reply from the board. Boards send only a message
// (no code), e.g. "Missing valid argument: volume".
type DeviceError struct {
	Method  string
	Message string
}

func (e *DeviceError) Error() string {
	return fmt.Sprintf("device error on %s: %s", e.Method, e.Message)
}

// ServerInfo is what initialize reports: the board name and firmware version.
type ServerInfo struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

// InitializeResult is the board's initialize reply.
type InitializeResult struct {
	ProtocolVersion string          `json:"protocolVersion"`
	Capabilities    json.RawMessage `json:"capabilities,omitempty"`
	ServerInfo      ServerInfo      `json:"serverInfo"`
}

// Tool is one board tool, as the board declares it.
type Tool struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"inputSchema,omitempty"`
	Annotations json.RawMessage `json:"annotations,omitempty"`
}

// UserOnly reports whether the board marks the tool as meant for the user,
// not the model (annotations.audience == ["user"]).
func (t Tool) UserOnly() bool {
	if len(t.Annotations) == 0 {
		return false
	}
	var a struct {
		Audience []string `json:"audience"`
	}
	if json.Unmarshal(t.Annotations, &a) != nil || len(a.Audience) == 0 {
		return false
	}
	for _, who := range a.Audience {
		if who != "user" {
			return false
		}
	}
	return true
}

// Content is one item of a tool result. Boards send exactly one text item;
// other kinds are passed through.
type Content struct {
	Type     string `json:"type"`
	Text     string `json:"text,omitempty"`
	Data     string `json:"data,omitempty"`
	MimeType string `json:"mimeType,omitempty"`
	// Image is the firmware's non-standard image item: a JSON string that
	// itself holds {"type":"image","mimeType":..,"data":..}.
	Image string `json:"image,omitempty"`
}

// CallResult is a tools/call result.
type CallResult struct {
	Content []Content `json:"content"`
	IsError bool      `json:"isError"`
}

// Text joins the text items of the result.
func (r *CallResult) Text() string {
	var s string
	for i, c := range r.Content {
		if c.Type == "text" {
			if i > 0 && s != "" {
				s += "\n"
			}
			s += c.Text
		}
	}
	return s
}

type listToolsParams struct {
	Cursor        string `json:"cursor,omitempty"`
	WithUserTools bool   `json:"withUserTools,omitempty"`
}

type listToolsResult struct {
	Tools      []Tool  `json:"tools"`
	NextCursor *string `json:"nextCursor,omitempty"`
}

type callParams struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

// toolKey is a tool as a comparable value, for interning.
type toolKey struct{ name, description, inputSchema, annotations string }

// intern returns t with its strings and raw JSON replaced by canonical
// copies shared by every board that lists a byte-identical tool: boards of
// one model send the same tool list, and a fleet of thousands would
// otherwise keep thousands of copies of it. The canonical copies live as
// long as some tool refers to them. The raw JSON slices alias immutable
// memory: treat them as read-only, as every user of a Tool already does.
func intern(t Tool) Tool {
	k := unique.Make(toolKey{t.Name, t.Description, string(t.InputSchema), string(t.Annotations)}).Value()
	return Tool{Name: k.name, Description: k.description, InputSchema: rawOf(k.inputSchema, t.InputSchema),
		Annotations: rawOf(k.annotations, t.Annotations)}
}

// rawOf views the canonical string s as raw JSON, keeping nil as nil.
func rawOf(s string, orig json.RawMessage) json.RawMessage {
	if orig == nil {
		return nil
	}
	if s == "" {
		return json.RawMessage{}
	}
	return unsafe.Slice(unsafe.StringData(s), len(s))
}
