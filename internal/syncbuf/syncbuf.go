// Package syncbuf is a bytes.Buffer that one goroutine may write (a
// process's output, a logger, a command) while another reads it: the
// tests' one copy, small enough to import from any package without
// dragging in a whole bridge.
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer is safe for one writer and concurrent readers. The zero value is
// ready to use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String is everything written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
