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
func (e *apiError) shown() shown {
	var b strings.Builder
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
		return errf(exitUnreachable, "cannot reach the bridge at %s: %v (start it with `go run ./cmd/bridge`, or set --bridge / DEVICEBRIDGE_URL)", c.bridge, unwrapURL(err))
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return errf(exitUnreachable, "reading the bridge's answer: %v", err)
	}
	if resp.StatusCode >= 300 {
		return c.apiErr(resp.StatusCode, data)
	}
	if out == nil {
		return nil
	}
	if raw, ok := out.(*json.RawMessage); ok {
		*raw = append((*raw)[:0], data...)
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
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

func (c *cli) apiErr(status int, data []byte) error {
	var body struct {
		Error apiError `json:"error"`
	}
	if json.Unmarshal(data, &body) != nil || body.Error.Code == "" {
		return errf(exitFailed, "the bridge answered %d: %.200s", status, data)
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
