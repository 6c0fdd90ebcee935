package mcpserver

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/internal/clip"
)

// Outcomes of a successful call, as logged in the "outcome" field; a failed
// call logs its device.Code.
const (
	outcomeOK        = "ok"
	outcomeToolError = "tool_error" // the board answered with isError
)

// errorResult is a tool result the model can read and act on.
func errorResult(format string, args ...any) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(format, args...)}}}
}

// callFailure turns an error from the Hub into a tool result and its code.
// The messages tell apart the cases that matter to whoever retries: the
// call never reached the board (offline, busy, still starting, invalid
// arguments) versus it may have run (timeout, board left mid-call).
func callFailure(e *entry, label string, err error, took time.Duration) (*mcp.CallToolResult, device.Code) {
	tool := e.tool.Name
	code := device.CodeOf(err)
	switch code {
	case device.CodeInvalidArguments, device.CodeUnknownTool:
		// The device layer's wording already says what to change.
		return errorResult("%v", err), code
	case device.CodeDeviceError:
		var devErr *device.DeviceError
		errors.As(err, &devErr)
		return errorResult("Board %s refused %s: %s", label, tool, devErr.Message), code
	case device.CodeUnknownDevice:
		return offlineResult(label, tool), code
	case device.CodeOffline:
		return errorResult("Board %s disconnected while running %s, before it replied. The outcome is unknown: "+
			"the action may or may not have happened. When the board is back, check its state (for example with its "+
			"get_device_status tool) before trying again.", label, tool), code
	case device.CodeNotReady:
		return errorResult("Board %s is connected but still starting up, so %s was not run. Try again in a few seconds.",
			label, tool), code
	case device.CodeNoMCP:
		return errorResult("Board %s does not offer tools (its firmware announced no MCP support), so %s cannot run.",
			label, tool), code
	case device.CodeBusy:
		return errorResult("Board %s is busy: it runs one tool at a time and too many requests are already waiting. "+
			"%s was not sent. Wait a moment and try again, one call at a time.", label, tool), code
	case device.CodeQueueTimeout:
		return errorResult("Board %s was still busy with earlier calls when the time for %s ran out (%s), so %s was "+
			"never sent: nothing happened. Try again when the board is free, one call at a time.",
			label, tool, roundDuration(took), tool), code
	case device.CodeTimeout:
		return errorResult("Board %s did not answer %s within %s. The outcome is unknown: the board may still carry it out. "+
			"Check the board's state before repeating the call rather than retrying blindly.",
			label, tool, roundDuration(took)), code
	case device.CodeShuttingDown:
		return errorResult("The bridge is shutting down, so the call to %s on board %s was abandoned (%v). "+
			"Try again once the bridge is back.", tool, label, err), code
	case device.CodeCanceled:
		return errorResult("The call to %s on board %s was cancelled before the board replied; the outcome is unknown.",
			tool, label), code
	}
	return errorResult("Calling %s on board %s failed: %v", tool, label, err), code
}

func offlineResult(label, tool string) *mcp.CallToolResult {
	return errorResult("Board %s is offline: it is not connected to the bridge, so %s was not run. "+
		"Its tools are withdrawn until it reconnects; refresh the tool list and try again once it is back "+
		"(ask the user to check that the board is powered and on the network).", label, tool)
}

// convertResult turns a board's tool result into an MCP result, keeping
// every kind of content MCP allows in a tool result as the board sent it:
// text, image, audio, resource_link and resource (an embedded resource,
// text or blob), with each item's annotations and _meta. The board's
// structuredContent (an object) is passed on; without one, a result whose
// only text is a JSON object gives that object as structuredContent. The
// firmware's non-standard image item (a JSON string nested under "image")
// becomes a standard image content. An item that is malformed (data that
// is not base64, a link without a uri) or of a kind a tool result cannot
// carry is replaced by a text saying so, so that the others still arrive.
func convertResult(res *device.CallResult) *mcp.CallToolResult {
	out := &mcp.CallToolResult{IsError: res.IsError, Content: make([]mcp.Content, 0, len(res.Content))}
	var texts []string
	for i := range res.Content {
		c := &res.Content[i]
		item := convertContent(c)
		if item == nil {
			item = &mcp.TextContent{Text: fmt.Sprintf("[the board returned %s content the bridge could not decode]", clip.String(c.Type))}
			if !relayedContent[c.Type] {
				item = &mcp.TextContent{Text: fmt.Sprintf("[the board returned content of type %q, which the bridge does not relay]", clip.String(c.Type))}
			}
		}
		if t, ok := item.(*mcp.TextContent); ok && c.Type == "text" {
			texts = append(texts, t.Text)
		}
		out.Content = append(out.Content, item)
	}
	switch {
	case len(res.StructuredContent) > 0:
		out.StructuredContent = res.StructuredContent
	case len(texts) == 1 && !res.IsError:
		if obj := jsonObject(texts[0]); obj != nil {
			out.StructuredContent = obj
		}
	}
	return out
}

// relayedContent are the content types of a tool result (MCP
// ContentBlock).
var relayedContent = map[string]bool{"text": true, "image": true, "audio": true, "resource_link": true, "resource": true}

// convertContent converts one item, or returns nil when it cannot.
func convertContent(c *device.Content) mcp.Content {
	ann, meta := contentAnnotations(c.Annotations), contentMeta(c.Meta)
	switch c.Type {
	case "text":
		return &mcp.TextContent{Text: c.Text, Annotations: ann, Meta: meta}
	case "image", "audio":
		data, mime := c.Data, c.MimeType
		if data == "" && c.Image != "" {
			var nested struct {
				MimeType string `json:"mimeType"`
				Data     string `json:"data"`
			}
			if json.Unmarshal([]byte(c.Image), &nested) == nil {
				data, mime = nested.Data, nested.MimeType
			}
		}
		raw, err := base64.StdEncoding.DecodeString(data)
		if err != nil || mime == "" {
			return nil
		}
		if c.Type == "audio" {
			return &mcp.AudioContent{Data: raw, MIMEType: mime, Annotations: ann, Meta: meta}
		}
		return &mcp.ImageContent{Data: raw, MIMEType: mime, Annotations: ann, Meta: meta}
	case "resource_link":
		if c.URI == "" || c.Name == "" {
			return nil
		}
		return &mcp.ResourceLink{URI: c.URI, Name: c.Name, Title: c.Title, Description: c.Description,
			MIMEType: c.MimeType, Size: c.Size, Annotations: ann, Meta: meta}
	case "resource":
		var r struct {
			URI      string          `json:"uri"`
			MimeType string          `json:"mimeType"`
			Text     *string         `json:"text"`
			Blob     *string         `json:"blob"`
			Meta     json.RawMessage `json:"_meta"`
		}
		if json.Unmarshal(c.Resource, &r) != nil || r.URI == "" || (r.Text == nil) == (r.Blob == nil) {
			return nil
		}
		rc := &mcp.ResourceContents{URI: r.URI, MIMEType: r.MimeType, Meta: contentMeta(r.Meta)}
		if r.Text != nil {
			rc.Text = *r.Text
		} else {
			blob, err := base64.StdEncoding.DecodeString(*r.Blob)
			if err != nil {
				return nil
			}
			rc.Blob = blob
		}
		return &mcp.EmbeddedResource{Resource: rc, Annotations: ann, Meta: meta}
	}
	return nil
}

// contentAnnotations decodes an item's annotations; ones that do not fit
// MCP's shape are dropped (the content itself still arrives).
func contentAnnotations(raw json.RawMessage) *mcp.Annotations {
	if len(raw) == 0 {
		return nil
	}
	var a mcp.Annotations
	if json.Unmarshal(raw, &a) != nil {
		return nil
	}
	return &a
}

// contentMeta decodes an item's _meta object.
func contentMeta(raw json.RawMessage) mcp.Meta {
	if len(raw) == 0 {
		return nil
	}
	var m mcp.Meta
	if json.Unmarshal(raw, &m) != nil {
		return nil
	}
	return m
}

// jsonObject returns s as raw JSON if it is a JSON object, else nil.
func jsonObject(s string) json.RawMessage {
	t := bytes.TrimSpace([]byte(s))
	if len(t) < 2 || t[0] != '{' || !json.Valid(t) {
		return nil
	}
	return json.RawMessage(t)
}

// roundDuration renders a wait for people: 300ms, 2.5s, 30s.
func roundDuration(d time.Duration) time.Duration {
	switch {
	case d >= 10*time.Second:
		return d.Round(time.Second)
	case d >= time.Second:
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(10 * time.Millisecond)
}
