// Package envelope owns the wire shape that every xiaozhi board speaks on both
// transports: one JSON object per message, {"session_id", "type", ...}, with
// MCP traffic carried as a JSON-RPC object under "payload".
//
// It is pure: it never touches a socket. [Decode] and [Encode] check and build
// single messages; [Stream] adapts a device link (anything that can send and
// receive one text message) to a sourcegraph/jsonrpc2 ObjectStream, so the
// MCP client above it speaks plain JSON-RPC.
//
// The firmware's JSON-RPC dialect is repaired here, at this one boundary:
// errors arrive without a "code", and error messages are pasted into the JSON
// unescaped, so a message containing a quote is not valid JSON at all
// (see docs/firmware.md, "Other protocol facts"). Nothing above this package
// sees either quirk.
package envelope
