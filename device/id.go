package device

import (
	"errors"
	"fmt"
	"strconv"
)

// A board's identity is its MAC, written one way everywhere: lowercase hex
// pairs joined by ':' ("aa:bb:cc:dd:ee:ff"), as the firmware sends it in
// Device-Id. Every entry point (WebSocket Device-Id, MQTT client ids and
// topics, OTA headers and bodies, API paths, configuration, the fleet
// directory) turns what it was given into that form once, so that
// "AA-BB-CC-DD-EE-FF", "aabbccddeeff" or "aa_bb_cc_dd_ee_ff" is the same
// board and never a second one beside it.

// MACDigits returns the 12 lowercase hex digits of a MAC written with ':',
// '-', '_' or '.' separators (or none), in any case.
func MACDigits(id string) (string, bool) {
	var out [12]byte
	n, ok := macDigits(id, &out)
	if !ok || n != len(out) {
		return "", false
	}
	return string(out[:]), true
}

// macDigits collects the hex digits of id into out; false when id holds
// anything but hex digits and separators, or more than 12 digits.
// Hand-rolled: it runs for every board on every lookup, listing and
// directory write, so it must not allocate.
func macDigits(id string, out *[12]byte) (int, bool) {
	n := 0
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case c == ':' || c == '-' || c == '_' || c == '.':
			continue
		case c >= 'A' && c <= 'F':
			c += 'a' - 'A'
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f':
		default:
			return 0, false
		}
		if n == len(out) {
			return 0, false
		}
		out[n] = c
		n++
	}
	return n, true
}

// CanonicalMAC returns the canonical form of a MAC written in any of the
// spellings MACDigits accepts; false when s is not a MAC. A MAC already in
// canonical form is returned as is, without allocating.
func CanonicalMAC(s string) (string, bool) {
	if isCanonicalMAC(s) {
		return s, true
	}
	var d [12]byte
	if n, ok := macDigits(s, &d); !ok || n != len(d) {
		return "", false
	}
	var b [17]byte
	for i := range 6 {
		if i > 0 {
			b[3*i-1] = ':'
		}
		b[3*i], b[3*i+1] = d[2*i], d[2*i+1]
	}
	return string(b[:]), true
}

func isCanonicalMAC(s string) bool {
	if len(s) != 17 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if i%3 == 2 {
			if c != ':' {
				return false
			}
			continue
		}
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// NormalizeID writes a MAC in its canonical form, whatever separators and
// case it was given with, so that "AA-BB-CC-DD-EE-FF" in a config file or
// "aa_bb_cc_dd_ee_ff" in a URL or MQTT topic finds the board. Other ids are
// returned unchanged.
func NormalizeID(id string) string {
	if m, ok := CanonicalMAC(id); ok {
		return m
	}
	return id
}

// MaxPlainIDLen bounds a device id that is not a MAC (see BoardID).
const MaxPlainIDLen = 64

// ErrNotMAC: a board named itself with something other than a MAC while
// only MACs are accepted.
var ErrNotMAC = errors.New("not a MAC address (want aa:bb:cc:dd:ee:ff)")

// BoardID is the intake rule for the id a board names itself with, applied
// by each transport before anything else sees it. A MAC in any spelling
// becomes its canonical form. Anything else is refused with ErrNotMAC,
// unless allowAny: then a plain identifier (1 to MaxPlainIDLen letters,
// digits, '.', '_' or '-': nothing that can break a topic level, a URL or a
// log line) is the device id as given.
//
// Firmware always sends its MAC; non-MAC ids come from test rigs and
// custom clients. Refusing them by default keeps a board from choosing a
// name ("kitchen", "dev_ddeeff") that an operator gave another board.
func BoardID(raw string, allowAny bool) (string, error) {
	if m, ok := CanonicalMAC(raw); ok {
		return m, nil
	}
	if !allowAny {
		return "", fmt.Errorf("%s: %w", quoteID(raw), ErrNotMAC)
	}
	if !plainID(raw) {
		return "", fmt.Errorf("%s: not a MAC, nor a plain id of 1 to %d letters, digits, '.', '_' or '-'", quoteID(raw), MaxPlainIDLen)
	}
	return raw, nil
}

func plainID(s string) bool {
	if s == "" || len(s) > MaxPlainIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// quoteID quotes an outsider's id for an error message, cut short.
func quoteID(s string) string {
	if len(s) > 40 {
		s = s[:40] + "..."
	}
	return strconv.Quote(s)
}
