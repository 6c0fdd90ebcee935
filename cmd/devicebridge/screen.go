package main

// What the CLI prints for people goes through a screen, which escapes what
// a terminal would act on in every value it prints. Boards choose their
// names, tool names, descriptions, results and close reasons; printed raw,
// an escape sequence in them could set the window title, write the
// clipboard (OSC 52), plant a hyperlink or clear the screen, and a CR or LF
// could forge whole lines of output. --json output is left as it is: JSON
// escapes what matters, and scripts need the exact bytes.

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"
	"unicode/utf8"
)

// screen writes human-readable output to one stream. It has no Write
// method on purpose: fmt.Fprint* cannot be pointed at it, so every print
// path goes through printf, println or table, which escape their values.
// Only the format strings, the CLI's own, reach the stream as they are.
type screen struct{ w io.Writer }

func newScreen(w io.Writer) *screen { return &screen{w: w} }

// printf prints format with each argument made safe by shownArg.
func (s *screen) printf(format string, args ...any) {
	fmt.Fprintf(s.w, format, shownArgs(args)...)
}

// println prints its arguments made safe, separated by spaces, and a
// newline.
func (s *screen) println(args ...any) {
	fmt.Fprintln(s.w, shownArgs(args)...)
}

// raw is the stream itself, for --json output and nothing else.
func (s *screen) raw() io.Writer { return s.w }

// table starts aligned columns on the screen; cells are made safe (a tab
// inside one would break the columns too).
func (s *screen) table() *table {
	return &table{tw: tabwriter.NewWriter(s.w, 0, 0, 2, ' ', 0)}
}

type table struct{ tw *tabwriter.Writer }

// row adds one line of cells.
func (t *table) row(cells ...any) {
	parts := make([]string, len(cells))
	for i, c := range cells {
		parts[i] = fmt.Sprint(shownArg(c))
	}
	fmt.Fprintln(t.tw, strings.Join(parts, "\t"))
}

func (t *table) flush() error { return t.tw.Flush() }

// shown is text already fit for a terminal: made by safe, or the CLI's own
// layout joining such parts. A screen prints it as it is.
type shown string

// show makes s safe and marks it so.
func show(s string) shown { return shown(safe(s)) }

// shower is an error that knows its terminal form (its parts escaped, its
// own line breaks kept).
type shower interface{ shown() shown }

func shownArgs(args []any) []any {
	out := make([]any, len(args))
	for i, a := range args {
		out[i] = shownArg(a)
	}
	return out
}

// shownArg returns a printable form of a: numbers and booleans as they
// are (so %d and %.1f still work), text of every other kind through safe.
func shownArg(a any) any {
	switch v := a.(type) {
	case nil:
		return nil
	case shown:
		return string(v)
	case shower:
		return string(v.shown())
	case string:
		return safe(v)
	case error:
		return safe(v.Error())
	case json.RawMessage:
		return safe(string(v))
	case []byte:
		return safe(string(v))
	case fmt.Stringer:
		return safe(v.String())
	case bool, int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64, float32, float64:
		return v
	}
	return safe(fmt.Sprint(a))
}

// safe returns s with every character a terminal would act on, or that
// would change how the text around it reads, written as an escape, as ls
// quotes file names: C0 and C1 controls and DEL (\x1b, \r, \n, \u009b…),
// Unicode format characters (bidi overrides and isolates, zero-width
// characters: \u202e…), line and paragraph separators, and bytes that are
// not UTF-8 (\xNN: some terminals take a lone 0x9b as CSI). Everything
// else, spaces of every script included, is left as it is.
func safe(s string) string {
	i := strings.IndexFunc(s, needsEscape)
	if i < 0 && utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for len(s) > 0 {
		r, size := utf8.DecodeRuneInString(s)
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[0])
		case needsEscape(r):
			q := strconv.QuoteRuneToASCII(r) // '\x1b', '\n', '\u202e': Go's escapes
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[:size])
		}
		s = s[size:]
	}
	return b.String()
}

func needsEscape(r rune) bool {
	return unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp)
}
