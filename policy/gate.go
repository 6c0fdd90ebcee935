package policy

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// DefaultWatchInterval is how often Watch looks at the policy file.
const DefaultWatchInterval = 2 * time.Second

// DeniedError is the answer to a call the policy does not allow. Its text
// is what callers see; it names the identity, not its credentials. It
// never starts with the tool's name, so that a caller (or a client) that
// capitalises a message's first letter does not change the name: tool
// names are case-sensitive.
type DeniedError struct {
	Identity string
	Board    Board
	Tool     string
}

func (e *DeniedError) Error() string {
	board := e.Board.Alias
	if board == "" {
		board = e.Board.ID
	}
	if e.Tool == "" {
		return fmt.Sprintf("board %s is not allowed for %s (policy); nothing was sent to it", board, e.Identity)
	}
	return fmt.Sprintf("not allowed for %s (policy): %s on board %s; nothing was sent to the board", e.Identity, e.Tool, board)
}

// Gate holds the policy in force and makes every decision. A nil *Gate
// (no --policy) allows everything and asks for no extra confirmation, so
// callers need not test for it.
type Gate struct {
	path string
	log  *zap.Logger
	cur  atomic.Pointer[Policy]

	mu       sync.Mutex // serialises reloads; guards data, lastErr, onChange
	data     []byte
	lastErr  error
	onChange []func()
	onDeny   atomic.Pointer[func(label string)]
}

// OnDeny registers f to learn of every refusal Check makes (metrics). Its
// label is bounded by the policy file: the entry the identity matched by
// name or group, or "unlisted".
func (g *Gate) OnDeny(f func(label string)) { g.onDeny.Store(&f) }

// Open loads the policy file at path. A bad file is an error: the bridge
// does not start on a policy it cannot read.
func Open(path string, log *zap.Logger) (*Gate, error) {
	if log == nil {
		log = zap.NewNop()
	}
	g := &Gate{path: path, log: log}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	p, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", path, err)
	}
	g.cur.Store(p)
	g.data = data
	return g, nil
}

// New returns a gate over a policy already parsed (tests, embedding).
func New(p *Policy) *Gate {
	g := &Gate{log: zap.NewNop()}
	g.cur.Store(p)
	return g
}

// OnChange registers f to run after each successful reload that changed
// the policy (e.g. to recompute what clients see).
func (g *Gate) OnChange(f func()) {
	g.mu.Lock()
	g.onChange = append(g.onChange, f)
	g.mu.Unlock()
}

// Reload reads the file again. A file that does not parse is rejected
// (the error names the line) and the policy in force stays.
func (g *Gate) Reload() error {
	if g == nil || g.path == "" {
		return nil
	}
	g.mu.Lock()
	data, err := os.ReadFile(g.path)
	var p *Policy
	if err == nil {
		if bytes.Equal(data, g.data) {
			g.lastErr = nil
			g.mu.Unlock()
			return nil
		}
		p, err = Parse(data)
	}
	if err != nil {
		err = fmt.Errorf("policy %s: %w", g.path, err)
		if g.lastErr == nil || g.lastErr.Error() != err.Error() {
			g.log.Error("policy file rejected; the previous policy stays in force", zap.Error(err))
		}
		g.lastErr = err
		g.mu.Unlock()
		return err
	}
	g.cur.Store(p)
	g.data, g.lastErr = data, nil
	hooks := append([]func(){}, g.onChange...)
	g.mu.Unlock()
	g.log.Info("policy reloaded", zap.String("file", g.path), zap.Int("identities", p.Identities()))
	for _, f := range hooks {
		f()
	}
	return nil
}

// LastError is why the last reload was rejected; nil when the file in
// force is the file on disk.
func (g *Gate) LastError() error {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lastErr
}

// Watch reloads the file whenever its content changes, checking every
// interval (DefaultWatchInterval when zero), until ctx ends.
func (g *Gate) Watch(ctx context.Context, interval time.Duration) {
	if g == nil || g.path == "" {
		return
	}
	interval = cmp.Or(max(interval, 0), DefaultWatchInterval)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			// A rejected file is logged by Reload; a missing one is being
			// replaced, and the next tick sees the new file.
			_ = g.Reload()
		}
	}
}

// Policy returns the policy in force (nil for a nil gate).
func (g *Gate) Policy() *Policy {
	if g == nil {
		return nil
	}
	return g.cur.Load()
}

// Enabled reports whether a policy is in force.
func (g *Gate) Enabled() bool { return g != nil }

// BoardVisible reports whether id may see board b.
func (g *Gate) BoardVisible(id Identity, b Board) bool {
	if g == nil {
		return true
	}
	return g.cur.Load().BoardVisible(id, b)
}

// ToolAllowed reports whether id may see and call tool on board b.
func (g *Gate) ToolAllowed(id Identity, b Board, tool string) bool {
	if g == nil {
		return true
	}
	return g.cur.Load().ToolAllowed(id, b, tool)
}

// Check returns a *DeniedError when id may not call tool on board b.
func (g *Gate) Check(id Identity, b Board, tool string) error {
	if g.ToolAllowed(id, b, tool) {
		return nil
	}
	if f := g.onDeny.Load(); f != nil {
		(*f)(g.cur.Load().Label(id))
	}
	return &DeniedError{Identity: id.Name, Board: b, Tool: tool}
}

// NeedsConfirm reports whether the policy wants tool always confirmed.
func (g *Gate) NeedsConfirm(tool string) bool {
	if g == nil {
		return false
	}
	return g.cur.Load().NeedsConfirm(tool)
}
