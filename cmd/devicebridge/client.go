package main

// HTTP to the control API, and its errors as exit codes.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// board is a row of GET /api/devices (and GET /api/devices/{id}).
type board struct {
	DeviceID        string    `json:"device_id"`
	ClientID        string    `json:"client_id"`
	Alias           string    `json:"alias"`
	Transport       string    `json:"transport"`
	RemoteAddr      string    `json:"remote_addr"`
	State           string    `json:"state"`
	Board           string    `json:"board"`
	FirmwareVersion string    `json:"firmware_version"`
	HasMCP          bool      `json:"has_mcp"`
	ToolCount       int       `json:"tool_count"`
	ConnectedAt     time.Time `json:"connected_at"`
	ReadyAt         time.Time `json:"ready_at"`
	CloseReason     string    `json:"close_reason"`
	Node            string    `json:"node"` // the fleet node holding it; "" for this bridge
	Tools           []tool    `json:"tools"`
}

type tool struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"inputSchema"`
	UserOnly    bool            `json:"user_only"`
}

// apiError is the control API's error body.
type apiError struct {
	Status int
	Code   string          `json:"code"`
	Msg    string          `json:"message"`
	Probs  []string        `json:"problems"`
	Ex     json.RawMessage `json:"example"`
	Tools  []string        `json:"tools"`
}

func (e *apiError) Error() string { return string(e.shown()) }

// shown lays the error out on lines of its own, each part made safe: the
// message and problems quote what the board declared.
//
// The bridge words its example for any caller, as JSON ("Call it again
// with arguments like {"volume": 100}."); on the command line it becomes
// what the user types: volume=100.
func (e *apiError) shown() shown {
	var b strings.Builder
	if list, ok := cliArgs(e.Ex); ok && e.Code == "invalid_arguments" {
		// What is wrong, one problem a line, and arguments that would
		// pass in the command line's terms.
		first, _, _ := strings.Cut(e.Msg, "\n")
		b.WriteString(safe(first))
		for _, p := range e.Probs {
			b.WriteString("\n  - " + safe(p))
		}
		if list == "" {
			b.WriteString("\n  Call it again with no arguments.")
		} else {
			b.WriteString("\n  Call it again with arguments like " + safe(list) + ".")
		}
		return shown(b.String())
	}
	b.WriteString(safe(e.Msg))
	for _, p := range e.Probs {
		if !strings.Contains(e.Msg, p) {
			b.WriteString("\n  - " + safe(p))
		}
	}
	var ex bytes.Buffer
	if len(e.Ex) > 0 && json.Compact(&ex, e.Ex) == nil && !strings.Contains(e.Msg, "again") {
		b.WriteString("\n  arguments that would pass: " + safe(ex.String()))
	}
	return shown(b.String())
}

// cliArgs writes an arguments object as the command line takes it:
// "volume=100 theme=dark", key:=JSON for lists, objects and null, values
// quoted for the shell where they need it; "" for {}. ok is false when
// raw is not a JSON object.
func cliArgs(raw json.RawMessage) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return "", false
	}
	var parts []string
	for dec.More() {
		tok, err := dec.Token()
		key, isKey := tok.(string)
		if err != nil || !isKey {
			return "", false
		}
		var v any
		if err := dec.Decode(&v); err != nil {
			return "", false
		}
		switch x := v.(type) {
		case string:
			parts = append(parts, shellWord(key+"="+x))
		case json.Number, bool:
			parts = append(parts, shellWord(fmt.Sprintf("%s=%v", key, x)))
		default:
			var b bytes.Buffer
			enc := json.NewEncoder(&b)
			enc.SetEscapeHTML(false)
			if enc.Encode(x) != nil {
				return "", false
			}
			parts = append(parts, shellWord(key+":="+strings.TrimSuffix(b.String(), "\n")))
		}
	}
	return strings.Join(parts, " "), true
}

// shellWord quotes s for a POSIX shell unless it needs no quotes.
func shellWord(s string) string {
	plain := s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_-.,:/@%+=", r))
	}) < 0
	if plain {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// exitCode maps an API error onto the CLI's exit codes.
func (e *apiError) exitCode() int {
	switch {
	case e.Status == http.StatusUnauthorized:
		return exitUnreachable
	case e.Code == "unknown_device" || e.Code == "unknown_tool":
		return exitNotFound
	case e.Code == "invalid_arguments" || e.Code == "bad_request":
		return exitInvalidArgs
	}
	return exitFailed
}

func (c *cli) do(ctx context.Context, method, path string, body any, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := c.request(ctx, method, path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return &exitError{code: exitInterrupted, msg: "interrupted"}
		}
		return c.unreachable(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return errf(exitUnreachable, "reading the bridge's answer: %v", err)
	}
	if resp.StatusCode >= 300 {
		return c.apiErr(resp.StatusCode, path, data)
	}
	if out == nil {
		return nil
	}
	if raw, ok := out.(*json.RawMessage); ok {
		*raw = append((*raw)[:0], data...)
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		if !json.Valid(data) {
			return c.notControlAPI(fmt.Sprintf("%d but not JSON", resp.StatusCode), path)
		}
		return errf(exitFailed, "the bridge answered something unexpected (%v): %.200s", err, data)
	}
	return nil
}

// request builds a request to the bridge with the control token.
func (c *cli) request(ctx context.Context, method, path string, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.bridge+path, body)
	if err != nil {
		return nil, errf(exitUsage, "bad bridge URL %q: %v", c.bridge, err)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	return req, nil
}

// apiErr is the error for an answer with status (to a request for path):
// the control API's error body, or, for anything else, an unreachable
// bridge (the URL names another server, or another of the bridge's
// listeners).
func (c *cli) apiErr(status int, path string, data []byte) error {
	var body struct {
		Error apiError `json:"error"`
	}
	if json.Unmarshal(data, &body) != nil || body.Error.Code == "" {
		return c.notControlAPI(fmt.Sprint(status), path)
	}
	e := body.Error
	e.Status = status
	if status == http.StatusUnauthorized {
		if c.token == "" {
			e.Msg += " (set DEVICEBRIDGE_TOKEN to one of the bridge's control tokens)"
		} else {
			e.Msg += " (DEVICEBRIDGE_TOKEN is not one of the bridge's control tokens)"
		}
	}
	return &e
}

// unreachable is the error for a request that reached no server.
func (c *cli) unreachable(err error) error {
	return errf(exitUnreachable, "cannot reach the bridge at %s: %v (start it with `go run ./cmd/bridge`, or set --bridge / DEVICEBRIDGE_URL)", c.bridge, unwrapURL(err))
}

// defaultBridge is where the CLI looks without --bridge or
// DEVICEBRIDGE_URL: the control listener's default address.
const defaultBridge = "http://127.0.0.1:8080"

// notControlAPI is the error for an answer that is not the control API's
// (got: the status, and what was wrong with it): the URL reaches a server,
// but not a bridge's control listener. The bridge is as unreachable as
// with nothing listening there.
func (c *cli) notControlAPI(got, path string) error {
	path, _, _ = strings.Cut(path, "?")
	return errf(exitUnreachable, "%s does not look like a devicebridge control API (%s on %s); "+
		"the control listener is on %s by default: set --bridge or DEVICEBRIDGE_URL to its address",
		c.bridge, got, path, strings.TrimPrefix(defaultBridge, "http://"))
}

func unwrapURL(err error) error {
	for {
		u := errors.Unwrap(err)
		if u == nil {
			return err
		}
		err = u
	}
}

// codeOf gives an error's exit code.
func codeOf(err error) int {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.exitCode()
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	if _, ok := err.(usageError); ok {
		return exitUsage
	}
	return exitFailed
}

func (c *cli) printJSON(v any) error {
	enc := json.NewEncoder(c.stdout.raw())
	enc.SetIndent("", "  ")
	if raw, ok := v.(json.RawMessage); ok {
		var buf bytes.Buffer
		if json.Indent(&buf, raw, "", "  ") == nil {
			buf.WriteByte('\n')
			_, err := c.stdout.raw().Write(buf.Bytes())
			return err
		}
	}
	return enc.Encode(v)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
}
