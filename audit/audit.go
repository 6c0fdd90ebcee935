// Package audit writes the bridge's audit log: one JSON line per board
// tool call, interaction step and authorization decision, with who, which
// board and tool, a keyed digest of the arguments, the outcome and the
// duration. It never holds a token, an argument value or a result.
package audit

import (
	"bytes"
	"cmp"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"time"
)

// Defaults of Open.
const (
	DefaultMaxBytes = 50 << 20
	DefaultKeep     = 5
)

// Kinds of records.
const (
	KindToolCall    = "tool_call"
	KindInteraction = "interaction"
	KindAdmission   = "admission"
)

// Record is one line of the log.
type Record struct {
	Time time.Time `json:"time"`
	Kind string    `json:"kind"`
	// Via is the surface: "mcp" or "api"; "fleet" for a call another
	// node routed to a board this node holds.
	Via string `json:"via,omitempty"`
	// Node, on a routed call, is the fleet node it came from.
	Node     string `json:"node,omitempty"`
	Identity string `json:"identity"`
	Board    string `json:"board,omitempty"`
	Tool     string `json:"tool,omitempty"`
	// ArgsDigest is an HMAC-SHA256 of the compacted arguments under a key
	// drawn at start: equal arguments compare equal within one run, and a
	// digest cannot be tested against guessed values (a Wi-Fi password).
	ArgsDigest string `json:"args_digest,omitempty"`
	// Step is the interaction step (start, respond, cancel).
	Step        string  `json:"step,omitempty"`
	Interaction string  `json:"interaction,omitempty"`
	Outcome     string  `json:"outcome"`
	Reason      string  `json:"reason,omitempty"`
	DurationMS  float64 `json:"duration_ms"`
}

// Log is an audit log. A nil *Log discards, so callers need not test.
type Log struct {
	mu   sync.Mutex
	w    io.Writer
	f    *os.File // nil for stdout
	path string
	size int64
	max  int64
	keep int
	key  []byte
	buf  bytes.Buffer
}

// Open opens the audit log at path ("-" is standard output), appending.
// A file is rotated when it would pass maxBytes: path.1 is the newest old
// file, up to path.<keep>. Zero values take the defaults.
func Open(path string, maxBytes int64, keep int) (*Log, error) {
	maxBytes = cmp.Or(max(maxBytes, 0), DefaultMaxBytes)
	keep = cmp.Or(max(keep, 0), DefaultKeep)
	l := &Log{path: path, max: maxBytes, keep: keep, key: make([]byte, 32)}
	_, _ = rand.Read(l.key)
	if path == "-" {
		l.w = os.Stdout
		return l, nil
	}
	if err := l.open(); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *Log) open() error {
	f, err := os.OpenFile(l.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return fmt.Errorf("audit log: %w", err)
	}
	l.f, l.w, l.size = f, f, st.Size()
	return nil
}

// Digest is the keyed digest of a call's arguments ("" for none).
func (l *Log) Digest(args []byte) string {
	if l == nil {
		return ""
	}
	var c bytes.Buffer
	if len(bytes.TrimSpace(args)) == 0 {
		args = []byte("{}")
	} else if json.Compact(&c, args) == nil {
		args = c.Bytes()
	}
	m := hmac.New(sha256.New, l.key)
	m.Write(args)
	return "hmac-sha256:" + hex.EncodeToString(m.Sum(nil)[:16])
}

// Write appends one record. Failures to write are returned for the caller
// to log; the call it records is not affected.
func (l *Log) Write(r Record) error {
	if l == nil {
		return nil
	}
	if r.Time.IsZero() {
		r.Time = time.Now()
	}
	r.Time = r.Time.UTC()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Reset()
	enc := json.NewEncoder(&l.buf) // one line: newlines in strings are escaped
	if err := enc.Encode(r); err != nil {
		return err
	}
	var rotErr error
	if l.f != nil && l.size > 0 && l.size+int64(l.buf.Len()) > l.max {
		var open bool
		if open, rotErr = l.rotate(); !open {
			return rotErr
		}
	}
	n, err := l.w.Write(l.buf.Bytes())
	l.size += int64(n)
	return errors.Join(rotErr, err)
}

// rotate renames path → path.1 → … → path.<keep> (the oldest dropped)
// and opens a fresh file. open reports whether a file is open for the
// next write: when the rename fails, the current file is opened again, so
// records keep being written (past the size limit) instead of lost.
func (l *Log) rotate() (open bool, err error) {
	_ = l.f.Close()
	for i := l.keep - 1; i >= 1; i-- {
		_ = os.Rename(l.path+"."+strconv.Itoa(i), l.path+"."+strconv.Itoa(i+1))
	}
	if err := os.Rename(l.path, l.path+".1"); err != nil {
		err = fmt.Errorf("audit log rotation: %w", err)
		if reopen := l.open(); reopen != nil {
			return false, errors.Join(err, reopen)
		}
		return true, err
	}
	if err := l.open(); err != nil {
		return false, err
	}
	return true, nil
}

// Close closes the file (not standard output).
func (l *Log) Close() error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f, l.w = nil, io.Discard
	return err
}
