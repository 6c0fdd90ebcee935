package mcpserver

// Aliases are the names an operator gives boards (mcp.aliases, --mcp-alias).
// They are the one naming rule of the bridge: /mcp tool names start with
// them, /api and the console show them, the policy matches them, and the
// CLI, compact /mcp and /api/devices/{id} resolve them. A name an operator
// gave a board always wins over an id or a default alias a board could
// choose for itself.

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/devicebridge/devicebridge/device"
)

// AliasRule says in words what ValidAlias accepts.
const AliasRule = "1 to 24 letters, digits, '_' or '-', starting and ending with a letter or digit, without '__', and not a MAC"

// ValidAlias reports whether a is usable as an alias exactly as written:
// what /mcp puts in front of tool names is then what /api shows, with no
// character replaced or dropped (see sanitize).
func ValidAlias(a string) bool {
	if a == "" || len(a) > maxAliasLen || sanitize(a) != a {
		return false
	}
	_, mac := device.CanonicalMAC(a)
	return !mac // a MAC as a name would shadow that board
}

// Aliases is a checked mcp.aliases: keyed by canonical MAC, unique names.
// The zero value has none.
type Aliases struct {
	byID   map[string]string // canonical MAC → alias
	byName map[string]string // lower-case alias → canonical MAC
	// bare: the boards configured with an empty alias, whose tools are
	// published without a prefix (the board itself keeps its default
	// alias for everything else).
	bare map[string]bool
}

// ParseAliases checks mcp.aliases: every key a MAC (any spelling, each board
// once), every alias ValidAlias or empty, no alias on two boards (ignoring
// case, as hosts may fold case in tool names). An empty alias publishes
// the board's tools without a prefix (see Bare). Errors name the key and
// what is allowed.
func ParseAliases(m map[string]string) (Aliases, error) {
	a := Aliases{byID: make(map[string]string, len(m)), byName: make(map[string]string, len(m)), bare: map[string]bool{}}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys) // errors in a stable order
	spelled := map[string]string{}
	var errs []error
	for _, k := range keys {
		alias := strings.TrimSpace(m[k])
		id, ok := device.CanonicalMAC(strings.TrimSpace(k))
		if !ok {
			errs = append(errs, fmt.Errorf("mcp.aliases: key %q is not a MAC (aliases name boards by their MAC, e.g. aa:bb:cc:dd:ee:ff)", k))
			continue
		}
		if alias != "" && !ValidAlias(alias) {
			errs = append(errs, fmt.Errorf("mcp.aliases[%s]: alias %q is not a valid name: use %s, or \"\" for no prefix", k, alias, AliasRule))
			continue
		}
		if other, dup := spelled[id]; dup {
			errs = append(errs, fmt.Errorf("mcp.aliases: keys %q and %q are the same board (%s); keep one", other, k, id))
			continue
		}
		spelled[id] = k
		if alias == "" {
			a.bare[id] = true
			continue
		}
		lower := strings.ToLower(alias)
		if other, dup := a.byName[lower]; dup {
			errs = append(errs, fmt.Errorf("mcp.aliases: %q names two boards (%s and %s); aliases must differ, ignoring case", alias, other, id))
			continue
		}
		a.byID[id], a.byName[lower] = alias, id
	}
	if err := errors.Join(errs...); err != nil {
		return Aliases{}, err
	}
	return a, nil
}

// MustAliases is ParseAliases for aliases already checked.
func MustAliases(m map[string]string) Aliases {
	a, err := ParseAliases(m)
	if err != nil {
		panic(err)
	}
	return a
}

// Of returns the alias an operator gave board id (a MAC in any spelling).
func (a Aliases) Of(id string) (string, bool) {
	alias, ok := a.byID[device.NormalizeID(id)]
	return alias, ok
}

// Bare reports whether board id (a MAC in any spelling) is configured
// with an empty alias: its tools are published under their own names,
// without "<alias>_". The board is still shown, matched and referred to
// by its default alias (and its MAC).
func (a Aliases) Bare(id string) bool {
	return a.bare[device.NormalizeID(id)]
}

// Named returns the board an operator named name (ignoring case).
func (a Aliases) Named(name string) (string, bool) {
	id, ok := a.byName[strings.ToLower(strings.TrimSpace(name))]
	return id, ok
}

// Alias is the alias board id is shown under when nothing else is known
// about the fleet: the operator's, else its default alias, moved aside
// (with a hash of its id) if it would take an operator's name or, for an
// id a board chose, the form of a MAC's default alias. A board whose
// default alias another board already holds gets another one (see
// aliasBook.pick): prefer Server.Alias, which knows.
func (a Aliases) Alias(id string) string {
	id = device.NormalizeID(id)
	return assignNames([]namingDevice{{DeviceID: id, Alias: a.byID[id]}}, a.byName).Aliases[id]
}

// macDefaultAlias matches the aliases a MAC's board may get by default:
// DefaultAlias, and the same moved aside (aliasBook.pick). A board that
// chose its id never takes one of them.
var macDefaultAlias = regexp.MustCompile(`^(?i)dev_[0-9a-f]{6}(_[0-9a-f]{6}|_[0-9]+)?$`)

func isMAC(id string) bool {
	_, ok := device.CanonicalMAC(id)
	return ok
}
