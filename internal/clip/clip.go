// Package clip cuts strings an outsider chose (a header, a client id, a
// topic, a board's name, a tool name in a request) before they go into a
// log line: a request may carry a megabyte in one header, and a log line
// must not. A cut string keeps its first Max bytes, ends at a rune
// boundary, and says that it was cut and how long it was, so an operator
// never mistakes it for the whole value.
package clip

import (
	"strconv"
	"unicode/utf8"

	"go.uber.org/zap"
)

// Max is the most bytes of an outsider's string a log line quotes.
const Max = 200

// String returns s when it is at most Max bytes long; otherwise its first
// bytes (at most Max, ending at a rune boundary) and a mark saying it was
// cut from len(s) bytes.
func String(s string) string {
	if len(s) <= Max {
		return s
	}
	n := Max
	// Step back over continuation bytes to the start of the rune that
	// does not fit; a string that is not UTF-8 is cut where it is after
	// at most three steps.
	for i := 0; i < utf8.UTFMax-1 && n > 0 && !utf8.RuneStart(s[n]); i++ {
		n--
	}
	return s[:n] + "… (cut from " + strconv.Itoa(len(s)) + " bytes)"
}

// Field is zap.String with the value cut by String.
func Field(key, s string) zap.Field { return zap.String(key, String(s)) }

// Error is zap.Error for an error whose text may quote an outsider: the
// text is cut by String. A nil error adds no field.
func Error(err error) zap.Field { return NamedError("error", err) }

// NamedError is Error under another key.
func NamedError(key string, err error) zap.Field {
	if err == nil {
		return zap.Skip()
	}
	return zap.String(key, String(err.Error()))
}
