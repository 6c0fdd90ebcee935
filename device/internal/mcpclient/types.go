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
	// Code is the error's code, 0 when the board sent none (mainline
	// firmware never does); Data is its data, nil when absent. Neither
	// shows in Error: they are kept for a peer that gets the board's
	// error as the board sent it (Client.Forward).
	Code int64
	Data json.RawMessage
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

// Content is one item of a tool result. The stock firmware sends exactly
// one text item; other boards (custom firmware, py-xiaozhi) may send any
// of MCP's tool result content: image, audio, resource_link and resource
// (an embedded resource). Every field MCP defines for them is kept, so
// that the item reaches a host as the board sent it; whether it is well
// formed is for the layer that re-exports it to decide.
type Content struct {
	Type     string `json:"type"`
	Text     string `json:"text,omitempty"`
	Data     string `json:"data,omitempty"`
	MimeType string `json:"mimeType,omitempty"`
	// Image is the firmware's non-standard image item: a JSON string that
	// itself holds {"type":"image","mimeType":..,"data":..}.
	Image string `json:"image,omitempty"`
	// URI, Name, Title, Description and Size describe a resource_link.
	URI         string `json:"uri,omitempty"`
	Name        string `json:"name,omitempty"`
	Title       string `json:"title,omitempty"`
	Description string `json:"description,omitempty"`
	Size        *int64 `json:"size,omitempty"`
	// Resource is an embedded resource's contents ({uri, mimeType?, text}
	// or {uri, mimeType?, blob}), as the board sent them.
	Resource json.RawMessage `json:"resource,omitempty"`
	// Annotations and Meta are the item's annotations and _meta objects.
	Annotations json.RawMessage `json:"annotations,omitempty"`
	Meta        json.RawMessage `json:"_meta,omitempty"`
}

// contentWire is Content as decoded: the fields every board has always
// been held to (type, text, data, mimeType, image) are strict, so a reply
// with a number where text belongs is still malformed; the fields added
// for other content kinds are lenient, and one of the wrong JSON type is
// dropped rather than failing the whole reply.
type contentWire struct {
	Type        string          `json:"type"`
	Text        string          `json:"text"`
	Data        string          `json:"data"`
	MimeType    string          `json:"mimeType"`
	Image       string          `json:"image"`
	URI         json.RawMessage `json:"uri"`
	Name        json.RawMessage `json:"name"`
	Title       json.RawMessage `json:"title"`
	Description json.RawMessage `json:"description"`
	Size        json.RawMessage `json:"size"`
	Resource    json.RawMessage `json:"resource"`
	Annotations json.RawMessage `json:"annotations"`
	Meta        json.RawMessage `json:"_meta"`
}

// UnmarshalJSON decodes one content item (see contentWire).
func (c *Content) UnmarshalJSON(b []byte) error {
	var w contentWire
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*c = Content{Type: w.Type, Text: w.Text, Data: w.Data, MimeType: w.MimeType, Image: w.Image,
		URI: jsonString(w.URI), Name: jsonString(w.Name), Title: jsonString(w.Title),
		Description: jsonString(w.Description), Resource: jsonObject(w.Resource),
		Annotations: jsonObject(w.Annotations), Meta: jsonObject(w.Meta)}
	var size int64
	if json.Unmarshal(w.Size, &size) == nil && size >= 0 {
		c.Size = &size
	}
	return nil
}

// jsonString is raw if it is a JSON string, else "".
func jsonString(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}

// jsonObject is raw if it is a JSON object, else nil. raw comes from the
// decoder, so it is valid JSON with no leading space.
func jsonObject(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 || raw[0] != '{' {
		return nil
	}
	return raw
}

// CallResult is a tools/call result. StructuredContent is the board's
// structuredContent when it is a JSON object, else nil.
type CallResult struct {
	Content           []Content       `json:"content"`
	IsError           bool            `json:"isError"`
	StructuredContent json.RawMessage `json:"structuredContent,omitempty"`
}

// UnmarshalJSON decodes a result, keeping structuredContent only when it is
// an object (as MCP requires).
func (r *CallResult) UnmarshalJSON(b []byte) error {
	type plain CallResult
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	p.StructuredContent = jsonObject(p.StructuredContent)
	*r = CallResult(p)
	return nil
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
