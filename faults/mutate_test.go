//go:build faults

package faults

import (
	"bytes"
	"math/rand/v2"
	"strings"
)

// mutator derives malformed inputs from valid ones, deterministically
// (a fixed seed per batch), so a rerun tries the same inputs.
type mutator struct{ r *rand.Rand }

func newMutator(seed uint64) *mutator {
	return &mutator{r: rand.New(rand.NewPCG(seed, 0x6661756c7473))}
}

// oversized is a frame past the device read limit (64 KiB).
func oversized(n int) []byte {
	return append(append([]byte(`{"type":"mcp","payload":{"jsonrpc":"2.0","id":1,"result":{"x":"`),
		bytes.Repeat([]byte("A"), n)...), `"}}}`...)
}

// mutate returns one malformed variant of seed.
func (m *mutator) mutate(seed []byte) []byte {
	b := append([]byte(nil), seed...)
	if len(b) == 0 {
		b = []byte("{}")
	}
	switch m.r.IntN(12) {
	case 0: // flip bytes
		for range 1 + m.r.IntN(4) {
			b[m.r.IntN(len(b))] ^= byte(1 + m.r.IntN(255))
		}
	case 1: // truncate
		b = b[:m.r.IntN(len(b))]
	case 2: // delete a range
		i := m.r.IntN(len(b))
		j := i + m.r.IntN(len(b)-i+1)
		b = append(b[:i], b[j:]...)
	case 3: // insert JSON punctuation
		i := m.r.IntN(len(b) + 1)
		p := []string{`"`, `{`, `}`, `[`, `]`, `,`, `:`, `\`, `null`, `-1e999`, `\u0000`, "\x00", "\xff\xfe"}[m.r.IntN(13)]
		b = append(b[:i], append([]byte(p), b[i:]...)...)
	case 4: // duplicate a range
		i := m.r.IntN(len(b))
		j := i + m.r.IntN(len(b)-i+1)
		b = append(b[:j], append(append([]byte(nil), b[i:j]...), b[j:]...)...)
	case 5: // random bytes
		b = make([]byte, 1+m.r.IntN(256))
		for i := range b {
			b[i] = byte(m.r.UintN(256))
		}
	case 6: // invalid UTF-8 inside strings
		b = bytes.ReplaceAll(b, []byte(`"`), []byte("\"\xc3\x28"))
	case 7: // deep nesting
		d := 1000 + m.r.IntN(20000)
		b = []byte(strings.Repeat("[", d) + strings.Repeat("]", d))
	case 8: // wrong types for every string value
		b = bytes.ReplaceAll(b, []byte(`":"`), []byte(`":[`))
	case 9: // huge numbers
		b = bytes.ReplaceAll(b, []byte(`":1`), []byte(`":1e308000000`))
	case 10: // swap the outer object for an array
		b = append(append([]byte("["), b...), ']')
	case 11: // unescaped quotes and control characters in a string
		b = bytes.Replace(b, []byte(`":"`), []byte("\":\"a\"b\"\n\t"), 1)
	}
	return b
}
