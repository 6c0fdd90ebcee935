package simulator

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"
)

// This file reproduces the parts of cJSON that decide what a board accepts
// and how it prints. encoding/json is stricter (trailing bytes, invalid
// escapes) and looks up keys differently, so decoding device-bound messages
// with it would make the simulator accept or reject other messages than a
// real board does.

// jsonKind is the type tag of a parsed value, mirroring cJSON's item types.
type jsonKind uint8

const (
	jsonNull jsonKind = iota
	jsonFalse
	jsonTrue
	jsonNumber
	jsonString
	jsonArray
	jsonObject
)

// cjsonNestingLimit is cJSON's CJSON_NESTING_LIMIT: deeper documents fail
// to parse.
const cjsonNestingLimit = 1000

// jsonValue is one parsed JSON value. Object members keep their order and
// duplicates, because lookups return the first match, as cJSON does.
type jsonValue struct {
	kind  jsonKind
	num   float64
	str   string
	keys  []string     // object member names, parallel to items
	items []*jsonValue // array elements or object member values
}

// parseCJSON parses data the way cJSON_Parse does on the firmware: leading
// bytes up to 0x20 and a UTF-8 BOM are skipped, anything after the first
// complete value is ignored, and the input ends at the first NUL byte
// because the firmware hands cJSON a C string.
func parseCJSON(data []byte) (*jsonValue, bool) {
	if i := bytes.IndexByte(data, 0); i >= 0 {
		data = data[:i]
	}
	p := &cjsonParser{buf: data}
	if bytes.HasPrefix(p.buf, []byte("\xEF\xBB\xBF")) {
		p.pos = 3
	}
	p.skipSpace()
	v, ok := p.value(0)
	if !ok {
		return nil, false
	}
	return v, true
}

type cjsonParser struct {
	buf []byte
	pos int
}

// skipSpace skips every byte up to and including 0x20, which is what cJSON
// treats as whitespace (control characters included).
func (p *cjsonParser) skipSpace() {
	for p.pos < len(p.buf) && p.buf[p.pos] <= 0x20 {
		p.pos++
	}
}

func (p *cjsonParser) hasPrefix(s string) bool {
	return bytes.HasPrefix(p.buf[p.pos:], []byte(s))
}

func (p *cjsonParser) value(depth int) (*jsonValue, bool) {
	if p.pos >= len(p.buf) {
		return nil, false
	}
	switch c := p.buf[p.pos]; {
	case p.hasPrefix("null"):
		p.pos += 4
		return &jsonValue{kind: jsonNull}, true
	case p.hasPrefix("false"):
		p.pos += 5
		return &jsonValue{kind: jsonFalse}, true
	case p.hasPrefix("true"):
		p.pos += 4
		return &jsonValue{kind: jsonTrue}, true
	case c == '"':
		s, ok := p.string()
		if !ok {
			return nil, false
		}
		return &jsonValue{kind: jsonString, str: s}, true
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	case c == '[':
		return p.array(depth + 1)
	case c == '{':
		return p.object(depth + 1)
	}
	return nil, false
}

// number copies the run of bytes cJSON considers numeric and lets a
// strtod-like scan decide how much of it is consumed; whatever follows is
// judged by the caller, exactly like cJSON's parse_number.
func (p *cjsonParser) number() (*jsonValue, bool) {
	end := p.pos
	for end < len(p.buf) && bytes.IndexByte([]byte("0123456789+-eE."), p.buf[end]) >= 0 {
		end++
	}
	n := strtodPrefix(p.buf[p.pos:end])
	if n == 0 {
		return nil, false
	}
	// Out-of-range values behave like strtod: overflow gives an infinity
	// (which valueint clamps), underflow gives zero; only syntax errors fail.
	f, err := strconv.ParseFloat(string(p.buf[p.pos:p.pos+n]), 64)
	if ne := (*strconv.NumError)(nil); errors.As(err, &ne) && ne.Err == strconv.ErrSyntax {
		return nil, false
	}
	p.pos += n
	return &jsonValue{kind: jsonNumber, num: f}, true
}

// strtodPrefix returns the length of the longest prefix of b that C strtod
// would read as a decimal number, or 0 if there is none. b only holds the
// bytes [0-9+-eE.], so hex, inf and nan forms cannot occur.
func strtodPrefix(b []byte) int {
	i := 0
	if i < len(b) && (b[i] == '+' || b[i] == '-') {
		i++
	}
	digits := 0
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
		digits++
	}
	if i < len(b) && b[i] == '.' {
		i++
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
			digits++
		}
	}
	if digits == 0 {
		return 0
	}
	// An exponent counts only when it has at least one digit.
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		j := i + 1
		if j < len(b) && (b[j] == '+' || b[j] == '-') {
			j++
		}
		k := j
		for k < len(b) && b[k] >= '0' && b[k] <= '9' {
			k++
		}
		if k > j {
			i = k
		}
	}
	return i
}

// string parses a quoted string with cJSON's escape rules: raw control
// bytes and invalid UTF-8 pass through, unknown escapes and broken
// surrogate pairs fail. The result is cut at the first NUL, because the
// firmware only ever reads it as a C string.
func (p *cjsonParser) string() (string, bool) {
	if p.pos >= len(p.buf) || p.buf[p.pos] != '"' {
		return "", false
	}
	i := p.pos + 1
	var out []byte
	for {
		if i >= len(p.buf) {
			return "", false
		}
		c := p.buf[i]
		if c == '"' {
			break
		}
		if c != '\\' {
			out = append(out, c)
			i++
			continue
		}
		if i+1 >= len(p.buf) {
			return "", false
		}
		switch e := p.buf[i+1]; e {
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case '"', '\\', '/':
			out = append(out, e)
		case 'u':
			r, n, ok := utf16Literal(p.buf[i:])
			if !ok {
				return "", false
			}
			out = utf8.AppendRune(out, r)
			i += n
			continue
		default:
			return "", false
		}
		i += 2
	}
	p.pos = i + 1
	if j := bytes.IndexByte(out, 0); j >= 0 {
		out = out[:j]
	}
	return string(out), true
}

// utf16Literal decodes a \uXXXX escape (and its low surrogate when the first
// half is a high surrogate) at the start of b. It returns the code point and
// the number of bytes consumed.
func utf16Literal(b []byte) (rune, int, bool) {
	first, ok := hex4(b)
	if !ok {
		return 0, 0, false
	}
	if first >= 0xDC00 && first <= 0xDFFF {
		return 0, 0, false
	}
	if first < 0xD800 || first > 0xDBFF {
		return rune(first), 6, true
	}
	if len(b) < 12 || b[6] != '\\' || b[7] != 'u' {
		return 0, 0, false
	}
	second, ok := hex4(b[6:])
	if !ok || second < 0xDC00 || second > 0xDFFF {
		return 0, 0, false
	}
	return 0x10000 + ((rune(first)&0x3FF)<<10 | rune(second)&0x3FF), 12, true
}

// hex4 reads the four hex digits of a \uXXXX escape that starts b.
func hex4(b []byte) (uint16, bool) {
	if len(b) < 6 {
		return 0, false
	}
	v, err := strconv.ParseUint(string(b[2:6]), 16, 16)
	if err != nil {
		return 0, false
	}
	return uint16(v), true
}

func (p *cjsonParser) array(depth int) (*jsonValue, bool) {
	if depth > cjsonNestingLimit {
		return nil, false
	}
	p.pos++ // '['
	v := &jsonValue{kind: jsonArray}
	p.skipSpace()
	if p.pos < len(p.buf) && p.buf[p.pos] == ']' {
		p.pos++
		return v, true
	}
	for {
		p.skipSpace()
		item, ok := p.value(depth)
		if !ok {
			return nil, false
		}
		v.items = append(v.items, item)
		p.skipSpace()
		if p.pos >= len(p.buf) {
			return nil, false
		}
		switch p.buf[p.pos] {
		case ',':
			p.pos++
		case ']':
			p.pos++
			return v, true
		default:
			return nil, false
		}
	}
}

func (p *cjsonParser) object(depth int) (*jsonValue, bool) {
	if depth > cjsonNestingLimit {
		return nil, false
	}
	p.pos++ // '{'
	v := &jsonValue{kind: jsonObject}
	p.skipSpace()
	if p.pos < len(p.buf) && p.buf[p.pos] == '}' {
		p.pos++
		return v, true
	}
	for {
		p.skipSpace()
		key, ok := p.string()
		if !ok {
			return nil, false
		}
		p.skipSpace()
		if p.pos >= len(p.buf) || p.buf[p.pos] != ':' {
			return nil, false
		}
		p.pos++
		p.skipSpace()
		item, ok := p.value(depth)
		if !ok {
			return nil, false
		}
		v.keys = append(v.keys, key)
		v.items = append(v.items, item)
		p.skipSpace()
		if p.pos >= len(p.buf) {
			return nil, false
		}
		switch p.buf[p.pos] {
		case ',':
			p.pos++
		case '}':
			p.pos++
			return v, true
		default:
			return nil, false
		}
	}
}

// get returns the first member whose name matches key ignoring ASCII case,
// which is how cJSON_GetObjectItem behaves. It is nil-safe and returns nil
// for non-objects, so chains like v.get("a").get("b") need no checks.
func (v *jsonValue) get(key string) *jsonValue {
	if v == nil || v.kind != jsonObject {
		return nil
	}
	for i, k := range v.keys {
		if asciiEqualFold(k, key) {
			return v.items[i]
		}
	}
	return nil
}

func asciiEqualFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		ca, cb := a[i], b[i]
		if 'A' <= ca && ca <= 'Z' {
			ca += 'a' - 'A'
		}
		if 'A' <= cb && cb <= 'Z' {
			cb += 'a' - 'A'
		}
		if ca != cb {
			return false
		}
	}
	return true
}

func (v *jsonValue) isString() bool { return v != nil && v.kind == jsonString }
func (v *jsonValue) isNumber() bool { return v != nil && v.kind == jsonNumber }
func (v *jsonValue) isObject() bool { return v != nil && v.kind == jsonObject }
func (v *jsonValue) isBool() bool {
	return v != nil && (v.kind == jsonTrue || v.kind == jsonFalse)
}

// valueInt is cJSON's valueint for a number: truncated toward zero and
// clamped to the int32 range, which is what the firmware's (int) reads see.
func (v *jsonValue) valueInt() int {
	switch f := v.num; {
	case f >= math.MaxInt32:
		return math.MaxInt32
	case f <= math.MinInt32:
		return math.MinInt32
	case math.IsNaN(f):
		return 0
	default:
		return int(f)
	}
}

// appendCJSONString appends s as cJSON_Print writes a string: only '"', '\\'
// and bytes below 0x20 are escaped (short forms where they exist, \u00xx in
// lower-case hex otherwise); '/', HTML characters, DEL and non-ASCII bytes
// are written raw. The string ends at its first NUL, like the C string cJSON
// would have received.
func appendCJSONString(buf []byte, s string) []byte {
	if i := indexNUL(s); i >= 0 {
		s = s[:i]
	}
	buf = append(buf, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '"':
			buf = append(buf, '\\', '"')
		case '\\':
			buf = append(buf, '\\', '\\')
		case '\b':
			buf = append(buf, '\\', 'b')
		case '\f':
			buf = append(buf, '\\', 'f')
		case '\n':
			buf = append(buf, '\\', 'n')
		case '\r':
			buf = append(buf, '\\', 'r')
		case '\t':
			buf = append(buf, '\\', 't')
		default:
			if c < 0x20 {
				buf = fmt.Appendf(buf, "\\u%04x", c)
			} else {
				buf = append(buf, c)
			}
		}
	}
	return append(buf, '"')
}

func indexNUL(s string) int {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return i
		}
	}
	return -1
}

// appendCJSONNumber appends f the way cJSON prints a number: integral values
// that fit an int as %d, everything else with 15 significant digits, or 17
// when 15 do not round-trip. NaN and infinities print as null.
func appendCJSONNumber(buf []byte, f float64) []byte {
	switch {
	case math.IsNaN(f) || math.IsInf(f, 0):
		return append(buf, "null"...)
	case f == math.Trunc(f) && f >= math.MinInt32 && f <= math.MaxInt32:
		return strconv.AppendInt(buf, int64(f), 10)
	}
	s := fmt.Sprintf("%1.15g", f)
	if back, err := strconv.ParseFloat(s, 64); err != nil || back != f {
		s = fmt.Sprintf("%1.17g", f)
	}
	return append(buf, s...)
}
