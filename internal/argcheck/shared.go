package argcheck

import (
	"bytes"
	"encoding/json"
	"sync"
)

// sharedCache maps schema bytes to their parsed form, so that each
// distinct schema is parsed once in the process however many boards (of
// one model, sending byte-identical tool lists) and interactions use it.
// It is bounded: when full it starts over.
var sharedCache = struct {
	sync.Mutex
	m map[string]*Schema
}{m: map[string]*Schema{}}

const sharedCacheMax = 2048

// Shared is Parse through a process-wide cache: callers with the same
// schema (surrounding space aside) get the same *Schema, which they must
// treat as read-only, as every user of a Schema does. A schema Parse could
// not understand has Err set.
func Shared(raw json.RawMessage) *Schema {
	raw = bytes.TrimSpace(raw)
	sharedCache.Lock()
	s, ok := sharedCache.m[string(raw)]
	sharedCache.Unlock()
	if ok {
		return s
	}
	key := string(raw)
	s, _ = Parse(json.RawMessage(key))
	sharedCache.Lock()
	if len(sharedCache.m) >= sharedCacheMax {
		sharedCache.m = map[string]*Schema{}
	}
	sharedCache.m[key] = s
	sharedCache.Unlock()
	return s
}
