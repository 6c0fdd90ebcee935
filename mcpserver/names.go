package mcpserver

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"

	"github.com/devicebridge/devicebridge/device"
)

// Limits of upstream tool names. The strictest common hosts accept
// ^[a-zA-Z0-9_-]{1,64}$, so every name the bridge publishes fits that.
const (
	// MaxNameLen is the longest upstream tool name.
	MaxNameLen = 64
	// maxAliasLen bounds an alias so that a tool name keeps room for the
	// tool part.
	maxAliasLen = 24
	// hashLen is the length of a disambiguating hash suffix (hex digits).
	hashLen = 6
)

// ValidToolName reports whether name is accepted by the strictest common
// hosts: 1 to 64 characters from [A-Za-z0-9_-].
func ValidToolName(name string) bool {
	if len(name) == 0 || len(name) > MaxNameLen {
		return false
	}
	for i := 0; i < len(name); i++ {
		if !nameByte(name[i]) {
			return false
		}
	}
	return true
}

func nameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// sanitize keeps [A-Za-z0-9_-] and turns every other character (dots,
// spaces, non-ASCII letters, ...) into '_', then collapses runs of '_' and
// trims '_' and '-' from both ends. The result may be empty.
func sanitize(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	lastUnderscore := false
	for _, r := range s {
		c := byte('_')
		if r < 0x80 && nameByte(byte(r)) {
			c = byte(r)
		}
		if c == '_' {
			if lastUnderscore {
				continue
			}
			lastUnderscore = true
		} else {
			lastUnderscore = false
		}
		b.WriteByte(c)
	}
	return strings.Trim(b.String(), "_-")
}

// shortHash is a stable hex digest of parts, used to tell apart names that
// would otherwise be equal.
func shortHash(parts ...string) string {
	h := sha256.New()
	for i, p := range parts {
		if i > 0 {
			h.Write([]byte{0})
		}
		h.Write([]byte(p))
	}
	return hex.EncodeToString(h.Sum(nil))[:hashLen]
}

// truncate cuts s to at most n bytes (s is ASCII here) and trims a
// dangling separator.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.TrimRight(s[:n], "_-")
}

// withSuffix appends "_<hash>" to s, shortening s so the result fits max.
func withSuffix(s, hash string, max int) string {
	return truncate(s, max-1-len(hash)) + "_" + hash
}

// DefaultAlias is the alias a board gets when the configuration names none:
// "dev_" and the last three bytes of its MAC in hex (aa:bb:cc:dd:ee:ff gives
// dev_ddeeff). A device id that is not a MAC is sanitized instead.
func DefaultAlias(deviceID string) string {
	if hexDigits, ok := device.MACDigits(deviceID); ok {
		return "dev_" + hexDigits[len(hexDigits)-6:]
	}
	if a := truncate(sanitize(deviceID), maxAliasLen); a != "" {
		return a
	}
	return "dev_" + shortHash(deviceID)
}

// toolPart is the device tool's contribution to an upstream name: the
// firmware's "self." prefix dropped, dots and any other character outside
// [A-Za-z0-9_-] turned into '_'.
func toolPart(deviceTool string) string {
	t := sanitize(strings.TrimPrefix(deviceTool, "self."))
	if t == "" {
		return "tool"
	}
	return t
}

// toolRef identifies one board tool: the device id and the tool's name as
// the board declares it.
type toolRef struct {
	DeviceID string
	Tool     string
}

// namingDevice is the input of assignNames for one board.
type namingDevice struct {
	DeviceID string
	// Alias is the configured alias, or "" for the default.
	Alias string
	Tools []string
}

// naming is the outcome of assignNames.
type naming struct {
	// Aliases maps a device id to its effective alias (unique among the
	// devices named together).
	Aliases map[string]string
	// Names maps each board tool to its upstream name.
	Names map[toolRef]string
}

// assignNames gives every board and tool a host-safe, unique name. The
// result depends only on its input (not on the order boards connected):
//
//   - an alias is the configured one, sanitized, or DefaultAlias; when
//     aliases clash (ignoring case), the board whose name ranks first
//     keeps it (an operator's alias, then a MAC's default alias, then the
//     default alias of an id a board chose: see aliasTier) and the others
//     get "_<hash of device id>" appended; equals all get the hash;
//   - a tool is named <alias>_<tool part>; a name longer than 64
//     characters is shortened and gets "_<hash of the full name>";
//   - tools whose names still clash (ignoring case, since some hosts fold
//     case) all get "_<hash of device id and tool>".
func assignNames(devices []namingDevice) naming { return assignNamesReserving(devices, nil) }

// assignNamesReserving is assignNames where reserved (lower-case alias →
// device id) holds the operator's aliases of every board, connected or
// not: a default alias never takes one of them, so a board that chose its
// id cannot take the name of a board that is away.
func assignNamesReserving(devices []namingDevice, reserved map[string]string) naming {
	out := naming{Aliases: make(map[string]string, len(devices)), Names: map[toolRef]string{}}

	// Aliases.
	byAlias := map[string][]namingDevice{}
	for _, d := range devices {
		a := truncate(sanitize(d.Alias), maxAliasLen)
		tier := aliasTier(d)
		if a == "" {
			a = DefaultAlias(d.DeviceID)
			owner, taken := reserved[strings.ToLower(a)]
			if (taken && owner != d.DeviceID) || (tier == 2 && macDefaultAlias.MatchString(a)) {
				a = withSuffix(a, shortHash(d.DeviceID), maxAliasLen)
			}
		}
		out.Aliases[d.DeviceID] = a
		k := strings.ToLower(a)
		byAlias[k] = append(byAlias[k], d)
	}
	for _, group := range byAlias {
		if len(group) < 2 {
			continue
		}
		first, equals := 3, 0
		for _, d := range group {
			switch t := aliasTier(d); {
			case t < first:
				first, equals = t, 1
			case t == first:
				equals++
			}
		}
		for _, d := range group {
			if aliasTier(d) > first || equals > 1 {
				out.Aliases[d.DeviceID] = withSuffix(out.Aliases[d.DeviceID], shortHash(d.DeviceID), maxAliasLen)
			}
		}
	}

	// Tool names.
	byName := map[string][]toolRef{}
	for _, d := range devices {
		alias := out.Aliases[d.DeviceID]
		for _, t := range d.Tools {
			ref := toolRef{d.DeviceID, t}
			name := alias + "_" + toolPart(t)
			if len(name) > MaxNameLen {
				name = withSuffix(name, shortHash(name), MaxNameLen)
			}
			out.Names[ref] = name
			k := strings.ToLower(name)
			byName[k] = append(byName[k], ref)
		}
	}
	var clashes []toolRef
	for _, refs := range byName {
		if len(refs) > 1 {
			clashes = append(clashes, refs...)
		}
	}
	for _, ref := range clashes {
		out.Names[ref] = withSuffix(out.Names[ref], shortHash(ref.DeviceID, ref.Tool), MaxNameLen)
	}
	if len(clashes) > 0 {
		dedupe(out.Names)
	}
	return out
}

// dedupe is the last resort for names that still clash after hashing (it
// takes a 24-bit hash collision): the clashing names are numbered in a
// deterministic order.
func dedupe(names map[toolRef]string) {
	groups := map[string][]toolRef{}
	for ref, n := range names {
		k := strings.ToLower(n)
		groups[k] = append(groups[k], ref)
	}
	for _, refs := range groups {
		if len(refs) < 2 {
			continue
		}
		sort.Slice(refs, func(i, j int) bool {
			if refs[i].DeviceID != refs[j].DeviceID {
				return refs[i].DeviceID < refs[j].DeviceID
			}
			return refs[i].Tool < refs[j].Tool
		})
		for i, ref := range refs[1:] {
			names[ref] = withSuffix(names[ref], fmt.Sprint(i+2), MaxNameLen)
		}
	}
}
