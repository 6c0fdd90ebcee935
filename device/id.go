package device

import "strings"

// MACDigits returns the 12 lowercase hex digits of a MAC written with ':',
// '-' or '_' separators (or none), in any case.
func MACDigits(id string) (string, bool) {
	// Hand-rolled: it runs for every board on every listing and directory
	// write, so it must not build a strings.Replacer per call.
	var out [12]byte
	n := 0
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case c == ':' || c == '-' || c == '_':
			continue
		case c >= 'A' && c <= 'F':
			c += 'a' - 'A'
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f':
		default:
			return "", false
		}
		if n == len(out) {
			return "", false
		}
		out[n] = c
		n++
	}
	if n != len(out) {
		return "", false
	}
	return string(out[:]), true
}

// NormalizeID writes a MAC the way boards send it in Device-Id (lowercase,
// ':' separators), whatever separators and case it was given with, so that
// "AA-BB-CC-DD-EE-FF" in a config file or "aa_bb_cc_dd_ee_ff" in a URL or
// MQTT topic finds the board. Other ids are returned unchanged.
func NormalizeID(id string) string {
	h, ok := MACDigits(id)
	if !ok {
		return id
	}
	var b strings.Builder
	for i := 0; i < 12; i += 2 {
		if i > 0 {
			b.WriteByte(':')
		}
		b.WriteString(h[i : i+2])
	}
	return b.String()
}
