// Package mcpera keeps each MCP protocol era's result shapes to itself.
// go-sdk v1.8.0 serves both eras from one server and writes some fields of
// the 2026-07-28 era into every result of the types that carry them:
// ttlMs and cacheScope (Cacheable, on the list results and resources/read,
// with no omitempty) reach 2025-era sessions, and an input_required result
// (MRTR) of the 2026 era carries the "content": null of the
// CallToolResult it is built from. Middleware, added last to a server so
// that it is the outermost receiving middleware, takes them out: a result
// of a legacy session (one that began with initialize below 2026-07-28)
// loses ttlMs, cacheScope and resultType, and an input_required result has
// only the fields of InputRequiredResult.
//
// It wraps the results it changes in a type of its own, so it must stay
// outside every middleware that looks at a result's type.
package mcpera

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Modern is the first protocol version of the stateless era.
const Modern = "2026-07-28"

// IsModern reports whether a session speaks the stateless era: it did not
// begin with an initialize below Modern (a stateless request's session has
// no initialize parameters; go-sdk takes it for the newest version).
func IsModern(ss *mcp.ServerSession) bool {
	if ss == nil {
		return true
	}
	ip := ss.InitializeParams()
	return ip == nil || ip.ProtocolVersion >= Modern
}

// legacyOnly are the result fields no 2025-era result has.
var legacyDrop = map[string]bool{"ttlMs": true, "cacheScope": true, "resultType": true}

// inputRequired are the fields of an InputRequiredResult (2026-07-28).
var inputRequired = map[string]bool{"_meta": true, "resultType": true, "inputRequests": true, "requestState": true}

// Middleware shapes results for the era of the session that asked (see the
// package doc). Add it last.
func Middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		if err != nil || res == nil {
			return res, err
		}
		ss, _ := req.GetSession().(*mcp.ServerSession)
		if !IsModern(ss) {
			if _, ok := res.(mcp.CacheableResult); ok {
				return &shaped{Result: res, keep: func(k string) bool { return !legacyDrop[k] }}, nil
			}
			return res, nil
		}
		if ir, ok := res.(interface{ NeedsInput() bool }); ok && ir.NeedsInput() {
			return &shaped{Result: res, keep: func(k string) bool { return inputRequired[k] }}, nil
		}
		return res, nil
	}
}

// shaped is a result written with only the top-level fields keep allows,
// in their order. Its metadata is the wrapped result's.
type shaped struct {
	mcp.Result
	keep func(key string) bool
}

func (s *shaped) MarshalJSON() ([]byte, error) {
	raw, err := json.Marshal(s.Result)
	if err != nil {
		return nil, err
	}
	return Filter(raw, s.keep)
}

// Unwrap returns the result as the handlers made it.
func (s *shaped) Unwrap() mcp.Result { return s.Result }

// Filter rewrites a JSON object with only the members whose key keep
// allows, in their order, their values byte for byte.
func Filter(raw []byte, keep func(key string) bool) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New("mcpera: a result is not a JSON object")
	}
	var out bytes.Buffer
	out.Grow(len(raw))
	out.WriteByte('{')
	first := true
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, _ := tok.(string)
		var val json.RawMessage
		if err := dec.Decode(&val); err != nil {
			return nil, err
		}
		if !keep(key) {
			continue
		}
		if !first {
			out.WriteByte(',')
		}
		first = false
		k, _ := json.Marshal(key)
		out.Write(k)
		out.WriteByte(':')
		out.Write(val)
	}
	out.WriteByte('}')
	return out.Bytes(), nil
}
