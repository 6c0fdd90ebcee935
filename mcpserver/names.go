package mcpserver

import (
	"crypto/sha256"
	"encoding/hex"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

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

// namingDevice is one board as the naming sees it.
type namingDevice struct {
	DeviceID string
	// Alias is the operator's alias, or "" for the default.
	Alias string
	// Bare: the operator gave the board an empty alias, so its tools are
	// named without a prefix (the board still gets an alias, its default,
	// for everything else).
	Bare bool
	// Holder is the alias the fleet node that holds the board publishes
	// it under (its directory record); "" for this node's own boards.
	Holder string
	// ConnectedAt orders boards that join in the same sync: the one that
	// connected first chooses first.
	ConnectedAt time.Time
	Tools       []string
}

// naming is the outcome of a naming: every board's alias and every board
// tool's upstream name.
type naming struct {
	// Aliases maps a device id to its alias, unique (ignoring case) among
	// the boards named together.
	Aliases map[string]string
	// Names maps each board tool to its upstream name, unique (ignoring
	// case).
	Names map[toolRef]string
}

// assignNames names boards with no history: as if they all joined
// together, in the order of their ConnectedAt (then device id).
// reserved (lower-case alias → device id) holds the operator's aliases of
// every board, connected or not.
func assignNames(devices []namingDevice, reserved map[string]string) naming {
	b := newAliasBook()
	return b.name(devices, reserved, nil, b.mark(), time.Time{})
}

// Bounds of an aliasBook's memory of boards that left.
const (
	// recentAliasTTL is how long the alias of a board that left is kept
	// for it: it gets it back when it returns within that time (unless a
	// board that was there meanwhile took it first), and no newcomer takes
	// it meanwhile. As long as a withdrawn tool is remembered
	// (tombstoneTTL), so that a host's call by an old name is answered
	// "board offline", never run on another board.
	recentAliasTTL = tombstoneTTL
	// maxRecentAliases bounds how many boards that left are remembered;
	// past it the oldest are forgotten (they come back as newcomers).
	maxRecentAliases = 1 << 16
)

// aliasBook remembers who holds which alias, so that a board's names
// never change while it is connected: a board keeps the alias it was
// given until it leaves, and a newcomer whose alias would clash with one
// held (or, for a while, with that of a board that left) gets the
// disambiguated one. Its mutex is a leaf.
type aliasBook struct {
	mu  sync.Mutex
	gen uint64 // counts the holds made outside a sync (hold)
	// held: the boards present, and the aliases they hold.
	held   map[string]heldAlias // device id →
	holder map[string]string    // lower-case alias → device id, of held
	// recent: boards that left, and the alias each had.
	recent      map[string]pastAlias // device id →
	recentOwner map[string]string    // lower-case alias → device id, of recent
	ttl         time.Duration
	max         int
}

type heldAlias struct {
	alias string
	gen   uint64 // b.gen when hold took it; 0 when a sync did
}

type pastAlias struct {
	alias string
	left  time.Time
}

func newAliasBook() *aliasBook {
	return &aliasBook{held: map[string]heldAlias{}, holder: map[string]string{}, recent: map[string]pastAlias{},
		recentOwner: map[string]string{}, ttl: recentAliasTTL, max: maxRecentAliases}
}

// mark is taken before a sync reads the boards present: a board held
// after it (hold, for a board that connected meanwhile) is not released
// by that sync for being absent from what it read.
func (b *aliasBook) mark() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.gen
}

// name names the boards present (devices), everything the book holds for
// boards not among them (and held before mark) being released. Boards
// keep the aliases they hold; newcomers are named in the order of
// newcomerLess. A tool keeps the name kept says it has (its name in the
// catalogue so far) while its board keeps its alias; other tools get
// <alias>_<tool part>, disambiguated with a hash when that would clash
// (toolNames).
func (b *aliasBook) name(devices []namingDevice, reserved map[string]string, kept keptNames, mark uint64, now time.Time) naming {
	b.mu.Lock()
	defer b.mu.Unlock()
	present := make(map[string]bool, len(devices))
	for _, d := range devices {
		present[d.DeviceID] = true
	}
	for id, h := range b.held {
		if !present[id] && h.gen <= mark {
			b.release(id, now)
		}
	}
	b.expire(now)
	var newcomers []namingDevice
	for _, d := range devices {
		if _, ok := b.held[d.DeviceID]; !ok {
			newcomers = append(newcomers, d)
		}
	}
	sort.Slice(newcomers, func(i, j int) bool { return newcomerLess(newcomers[i], newcomers[j]) })
	for _, d := range newcomers {
		b.take(d.DeviceID, b.pick(d, reserved, now), 0)
	}
	out := naming{Aliases: make(map[string]string, len(devices))}
	for _, d := range devices {
		out.Aliases[d.DeviceID] = b.held[d.DeviceID].alias
	}
	out.Names = toolNames(devices, out.Aliases, kept)
	return out
}

// hold gives board d its alias now, if it holds none yet: for a board
// that a sync has not named yet (it connected a moment ago), so that what
// is shown of it before the catalogue has it (the control API, the
// fleet's record of it) is the alias it will keep.
func (b *aliasBook) hold(d namingDevice, reserved map[string]string, now time.Time) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if h, ok := b.held[d.DeviceID]; ok {
		return h.alias
	}
	b.gen++
	a := b.pick(d, reserved, now)
	b.take(d.DeviceID, a, b.gen)
	return a
}

// lookup returns the alias board id holds or, when it left less than the
// book's TTL ago, held.
func (b *aliasBook) lookup(id string, now time.Time) (string, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if h, ok := b.held[id]; ok {
		return h.alias, true
	}
	if p, ok := b.recent[id]; ok && now.Sub(p.left) <= b.ttl {
		return p.alias, true
	}
	return "", false
}

// newcomerLess orders the boards that join in one sync: first those whose
// holding node named them already (their alias is the fleet's), then by
// the time they connected, then by id.
func newcomerLess(a, b namingDevice) bool {
	if (a.Holder != "") != (b.Holder != "") {
		return a.Holder != ""
	}
	if !a.ConnectedAt.Equal(b.ConnectedAt) {
		return a.ConnectedAt.Before(b.ConnectedAt)
	}
	return a.DeviceID < b.DeviceID
}

// maxHashTries bounds the hashes pick tries before numbering.
const maxHashTries = 16

// pick chooses a newcomer's alias, the first of these that is free:
//
//  1. the alias its holding node publishes it under (a board another
//     fleet node holds), so that the fleet shows one name;
//  2. the alias it had when it left, if that was less than the TTL ago;
//  3. its own: the operator's alias, else DefaultAlias, moved aside with
//     a hash of its id when it would take an operator's alias of another
//     board or, for an id a board chose, look like a MAC's default alias;
//  4. that alias with "_<hash of its id>" (then other hashes, then
//     numbers, should those be taken too).
//
// An alias is free when no other board holds it (ignoring case) and it is
// no other board's operator alias; a default alias must also not be one
// that another board held until less than the TTL ago.
func (b *aliasBook) pick(d namingDevice, reserved map[string]string, now time.Time) string {
	if a := truncate(sanitize(d.Holder), maxAliasLen); a != "" && b.free(a, d.DeviceID, reserved, now, false) {
		return a
	}
	if p, ok := b.recent[d.DeviceID]; ok && now.Sub(p.left) <= b.ttl && b.free(p.alias, d.DeviceID, reserved, now, true) {
		return p.alias
	}
	own, forced := ownAlias(d, reserved)
	if !forced && b.free(own, d.DeviceID, reserved, now, d.Alias == "") {
		return own
	}
	for i := range maxHashTries {
		h := shortHash(d.DeviceID)
		if i > 0 {
			h = shortHash(d.DeviceID, strconv.Itoa(i))
		}
		if a := withSuffix(own, h, maxAliasLen); b.free(a, d.DeviceID, reserved, now, true) {
			return a
		}
	}
	for n := 2; ; n++ { // ends: each try that fails is another board's alias
		if a := withSuffix(own, strconv.Itoa(n), maxAliasLen); b.free(a, d.DeviceID, reserved, now, true) {
			return a
		}
	}
}

// ownAlias is what board d is called when nothing else is known: the
// operator's alias (sanitized), else its DefaultAlias. forced says that a
// default alias must not be used as it is (it is another board's operator
// alias or, for an id a board chose, has the form of a MAC's default
// alias): pick moves it aside.
func ownAlias(d namingDevice, reserved map[string]string) (alias string, forced bool) {
	if a := truncate(sanitize(d.Alias), maxAliasLen); a != "" {
		return a, false
	}
	a := DefaultAlias(d.DeviceID)
	owner, taken := reserved[strings.ToLower(a)]
	return a, (taken && owner != d.DeviceID) || (!isMAC(d.DeviceID) && macDefaultAlias.MatchString(a))
}

// free reports whether board id may take alias a. withRecent: not if
// another board held it until less than the TTL ago either.
func (b *aliasBook) free(a, id string, reserved map[string]string, now time.Time, withRecent bool) bool {
	k := strings.ToLower(a)
	if owner, ok := b.holder[k]; ok && owner != id {
		return false
	}
	if owner, ok := reserved[k]; ok && owner != id {
		return false
	}
	if !withRecent {
		return true
	}
	owner, ok := b.recentOwner[k]
	return !ok || owner == id || now.Sub(b.recent[owner].left) > b.ttl
}

// take records that board id holds alias a.
func (b *aliasBook) take(id, a string, gen uint64) {
	b.held[id] = heldAlias{alias: a, gen: gen}
	b.holder[strings.ToLower(a)] = id
	if p, ok := b.recent[id]; ok {
		delete(b.recent, id)
		if b.recentOwner[strings.ToLower(p.alias)] == id {
			delete(b.recentOwner, strings.ToLower(p.alias))
		}
	}
}

// release records that board id left.
func (b *aliasBook) release(id string, now time.Time) {
	h := b.held[id]
	delete(b.held, id)
	k := strings.ToLower(h.alias)
	if b.holder[k] == id {
		delete(b.holder, k)
	}
	b.recent[id] = pastAlias{alias: h.alias, left: now}
	b.recentOwner[k] = id
}

// expire forgets the boards that left more than the TTL ago and, past the
// bound on their number, the oldest of the others (an eighth more, so that
// the sort is not repeated for every board that leaves).
func (b *aliasBook) expire(now time.Time) {
	if len(b.recent) <= b.max {
		return
	}
	var ids []string
	for id, p := range b.recent {
		if now.Sub(p.left) > b.ttl {
			b.forget(id)
		} else {
			ids = append(ids, id)
		}
	}
	if len(b.recent) <= b.max {
		return
	}
	sort.Slice(ids, func(i, j int) bool { return b.recent[ids[i]].left.Before(b.recent[ids[j]].left) })
	for _, id := range ids[:len(b.recent)-b.max+b.max/8] {
		b.forget(id)
	}
}

func (b *aliasBook) forget(id string) {
	p := b.recent[id]
	delete(b.recent, id)
	if k := strings.ToLower(p.alias); b.recentOwner[k] == id {
		delete(b.recentOwner, k)
	}
}

// keptNames says which name a board tool has had so far, if any; base is
// the name toolNames would give it afresh (the name it most likely has).
type keptNames func(ref toolRef, base string) (string, bool)

// keptIn is keptNames over a map.
func keptIn(m map[toolRef]string) keptNames {
	return func(ref toolRef, _ string) (string, bool) { n, ok := m[ref]; return n, ok }
}

// baseName is a tool's name before any clash: <prefix>_<tool part> (the
// tool part alone when prefix is "", for a bare board), cut to 64
// characters with "_<hash of the full name>" when longer.
func baseName(prefix, tool string) string {
	n := toolPart(tool)
	if prefix != "" {
		n = prefix + "_" + n
	}
	if len(n) > MaxNameLen {
		n = withSuffix(n, shortHash(n), MaxNameLen)
	}
	return n
}

// keptUnder reports whether n, a name a tool had, is one given under
// prefix: it starts with "<prefix>_" or, for a bare board (prefix ""),
// is base or base disambiguated (cut, then "_<hash or number>"). A board
// whose prefix changed gets fresh names.
func keptUnder(n, prefix, base string) bool {
	if prefix != "" {
		return len(n) > len(prefix) && n[len(prefix)] == '_' && strings.HasPrefix(n, prefix)
	}
	if n == base {
		return true
	}
	stem := truncate(base, MaxNameLen-1-hashLen)
	return len(n) > len(stem) && n[len(stem)] == '_' && strings.HasPrefix(n, stem)
}

// toolNames names every board tool: its baseName, unless it has a name
// already (kept) under its board's prefix (its alias, or nothing for a
// bare board), which it keeps. A new name that
// would clash (ignoring case, since some hosts fold case) with a kept one,
// or with another new one, gets "_<hash of device id and tool>" (all the
// new ones of a clash do); numbers settle what still clashes after that
// (a 24-bit hash collision).
func toolNames(devices []namingDevice, aliases map[string]string, kept keptNames) map[toolRef]string {
	total := 0
	for _, d := range devices {
		total += len(d.Tools)
	}
	names := make(map[toolRef]string, total)
	taken := make(map[string]struct{}, total) // lower-case names given
	var fresh []toolRef
	for _, d := range devices {
		prefix := aliases[d.DeviceID]
		if d.Bare {
			prefix = ""
		}
		for _, t := range d.Tools {
			ref := toolRef{d.DeviceID, t}
			if _, dup := names[ref]; dup {
				continue
			}
			base := baseName(prefix, t)
			if kept != nil {
				if n, ok := kept(ref, base); ok && keptUnder(n, prefix, base) {
					k := strings.ToLower(n)
					if _, clash := taken[k]; !clash {
						names[ref], taken[k] = n, struct{}{}
						continue
					}
				}
			}
			names[ref] = base
			fresh = append(fresh, ref)
		}
	}
	if len(fresh) == 0 {
		return names
	}
	byName := map[string][]toolRef{}
	for _, ref := range fresh {
		k := strings.ToLower(names[ref])
		byName[k] = append(byName[k], ref)
	}
	for k, refs := range byName {
		if _, clash := taken[k]; len(refs) > 1 || clash {
			for _, ref := range refs {
				names[ref] = withSuffix(names[ref], shortHash(ref.DeviceID, ref.Tool), MaxNameLen)
			}
		}
	}
	// What still clashes is numbered, in a fixed order.
	sort.Slice(fresh, func(i, j int) bool {
		if fresh[i].DeviceID != fresh[j].DeviceID {
			return fresh[i].DeviceID < fresh[j].DeviceID
		}
		return fresh[i].Tool < fresh[j].Tool
	})
	for _, ref := range fresh {
		n := names[ref]
		for i := 2; ; i++ {
			if _, clash := taken[strings.ToLower(n)]; !clash {
				break
			}
			n = withSuffix(names[ref], strconv.Itoa(i), MaxNameLen)
		}
		names[ref], taken[strings.ToLower(n)] = n, struct{}{}
	}
	return names
}
