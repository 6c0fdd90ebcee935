package mcphttp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"go.uber.org/zap"
)

// bodyLimit reads a POST body whole, up to mcp.max_body_bytes, and hands
// it on re-buffered, with what classify makes of it in the request's
// context (messageOf): the steps after it read the body there, never from
// the request again. A body past the limit gets 413, with a JSON-RPC error
// when the request's id came before the cut.
func (f *Front) bodyLimit(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Body == nil {
			next.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, f.opts.MaxBodyBytes))
		if err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				f.lines.tooBig.Info(f.log, "mcp request refused: body too large", zap.String("remote", r.RemoteAddr), zap.Int64("limit", tooBig.Limit))
				writeRejection(w, http.StatusRequestEntityTooLarge, leadingID(body), -32600,
					fmt.Sprintf("request body exceeds %d bytes (see mcp.max_body_bytes); send less data", tooBig.Limit))
				return
			}
			http.Error(w, "Bad Request: could not read the body", http.StatusBadRequest)
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), messageKey{}, message{body: body, info: classify(body)}))
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r)
	})
}

// message is a POST body as bodyLimit read it.
type message struct {
	body []byte
	info bodyInfo
}

type messageKey struct{}

// messageOf returns what bodyLimit read of r's body; zero for a request
// without one (GET, DELETE).
func messageOf(r *http.Request) message {
	m, _ := r.Context().Value(messageKey{}).(message)
	return m
}

// writeRejection refuses a request with an HTTP status and, when the
// request's id is known, a JSON-RPC error for that id: clients then fail
// the one call instead of treating the session as broken.
func writeRejection(w http.ResponseWriter, status int, id json.RawMessage, code int, msg string) {
	if len(id) == 0 {
		http.Error(w, http.StatusText(status)+": "+msg, status)
		return
	}
	body, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}{JSONRPC: "2.0", ID: id, Error: struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{code, msg}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// leadingID finds the id of a (possibly truncated) JSON-RPC request by
// reading its top-level keys until "id" appears.
func leadingID(body []byte) json.RawMessage {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil
		}
		if key, _ := tok.(string); key == "id" {
			if k := idKey(v); k != "" {
				return v
			}
			return nil
		}
	}
	return nil
}
