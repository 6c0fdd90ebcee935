package mcpserver

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/internal/argcheck"
)

// entry is one board tool as published upstream.
type entry struct {
	name     string // upstream name
	deviceID string
	alias    string
	board    string
	tool     device.Tool
	userOnly bool
	// confirm: the tool needs the user's explicit yes before it runs
	// (FlowOptions.Confirm, or annotated destructive).
	confirm bool
	schema  *argcheck.Schema
	// published is the input schema served upstream (parsedSchema).
	published json.RawMessage
	// schemaErr says why the board's schema was not understood (nil when
	// it was).
	schemaErr error
	mcpTool   *mcp.Tool
	// fingerprint changes whenever what a client sees of the tool changes
	// (a digest of the published tool).
	fingerprint [sha256.Size]byte
}

// deviceView is one board as the catalogue shows it.
type deviceView struct {
	info  device.Info
	alias string
	// tools are the visible tools in the board's order.
	tools []*entry
	// hidden counts user-only tools left out by the configuration.
	hidden int
	// stale is set while a reconnected board re-initializes and the
	// catalogue keeps showing the tools it had.
	stale bool
}

// catalog is an immutable snapshot of the upstream view of the fleet.
type catalog struct {
	devices  []*deviceView // sorted by device id, as the Hub lists them
	byDevice map[string]*deviceView
	byName   map[string]*entry
	// named are the operator's aliases, which findDevice resolves first.
	named Aliases
	// schemas holds one parsed schema per distinct raw input schema:
	// boards of one model send byte-identical tool lists, so their tools
	// share one parse and one published copy.
	schemas map[string]parsedSchema
}

type parsedSchema struct {
	schema *argcheck.Schema
	err    error
	// published is the schema as served upstream: the board's, with the
	// words it wrote inside (descriptions, titles) made boardText.
	published json.RawMessage
}

func emptyCatalog() *catalog {
	return &catalog{byDevice: map[string]*deviceView{}, byName: map[string]*entry{}, schemas: map[string]parsedSchema{}}
}

// parse returns the parsed form of raw, shared with every tool of this
// catalogue (and of prev) that has the same schema.
func (c *catalog) parse(raw json.RawMessage, prev *catalog) parsedSchema {
	if p, ok := c.schemas[string(raw)]; ok {
		return p
	}
	p, ok := parsedSchema{}, false
	if prev != nil {
		p, ok = prev.schemas[string(raw)]
	}
	if !ok {
		p.schema, p.err = argcheck.Parse(raw)
		p.published = quoteSchemaText(p.schema.Published())
	}
	c.schemas[string(raw)] = p
	return p
}

// schemaTextKeys are the schema keywords whose string values are prose a
// host shows a model: what a board wrote there is quoted like its
// description, so it cannot pass for the bridge's notes either.
var schemaTextKeys = map[string]bool{"description": true, "title": true}

// quoteSchemaText returns schema with every description and title made
// boardText (schema is bounded at intake: small and shallow).
func quoteSchemaText(schema json.RawMessage) json.RawMessage {
	if !bytes.Contains(schema, []byte(`"description"`)) && !bytes.Contains(schema, []byte(`"title"`)) {
		return schema
	}
	dec := json.NewDecoder(bytes.NewReader(schema))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return schema
	}
	changed := false
	var walk func(v any) any
	walk = func(v any) any {
		switch x := v.(type) {
		case map[string]any:
			for k, val := range x {
				if s, ok := val.(string); ok && schemaTextKeys[k] {
					if q := boardText(s); q != s {
						x[k], changed = q, true
					}
				} else {
					x[k] = walk(val)
				}
			}
		case []any:
			for i := range x {
				x[i] = walk(x[i])
			}
		}
		return v
	}
	v = walk(v)
	if !changed {
		return schema // the board's own bytes, in its own key order
	}
	out, err := json.Marshal(v)
	if err != nil {
		return schema
	}
	return out
}

// catalogOptions are the parts of Options the catalogue depends on.
type catalogOptions struct {
	aliases      Aliases // the operator's names for boards
	showUserOnly bool
	// flow: interactions are on, so tools advertise them in _meta.
	flow bool
	// confirm decides which board tools need confirmation; nil: none.
	confirm func(device.Tool) bool
	// prev, when set, is the catalogue this one replaces: entries whose
	// board and tool did not change are carried over rather than rebuilt,
	// parsed schemas are shared, and tools keep their names.
	prev *catalog
	// names remembers the aliases boards hold (nil: a book of its own, as
	// if every board joined now); mark is names.mark() from before the
	// Hub was read, now the time of the sync.
	names *aliasBook
	mark  uint64
	now   time.Time
}

// buildCatalog computes the upstream view from the Hub's devices. Boards
// that are ready contribute their tools; a board that is re-initializing
// after a reconnect keeps the tools in remembered meanwhile, so that a
// short reconnect does not make its tools flicker.
func buildCatalog(infos []device.Info, remembered map[string][]device.Tool, opts catalogOptions) *catalog {
	c := emptyCatalog()
	var naming []namingDevice
	toolsOf := make(map[string][]device.Tool, len(infos))
	for _, info := range infos {
		v := &deviceView{info: info}
		c.devices = append(c.devices, v)
		c.byDevice[info.DeviceID] = v
		var list []device.Tool
		switch {
		case info.State == device.StateReady:
			list = info.Tools
		case info.State != device.StateClosed && info.HasMCP && remembered[info.DeviceID] != nil:
			list, v.stale = remembered[info.DeviceID], true
		}
		var visible []device.Tool
		for _, t := range list {
			if t.UserOnly() && !opts.showUserOnly {
				v.hidden++
				continue
			}
			visible = append(visible, t)
		}
		toolsOf[info.DeviceID] = visible
		nd := namingOf(info, opts.aliases)
		for _, t := range visible {
			nd.Tools = append(nd.Tools, t.Name)
		}
		naming = append(naming, nd)
	}
	var kept keptNames
	if opts.prev != nil {
		kept = opts.prev.keptNames()
	}
	book := opts.names
	if book == nil {
		book = newAliasBook()
		opts.mark = book.mark()
	}
	names := book.name(naming, opts.aliases.byName, kept, opts.mark, opts.now)
	c.named = opts.aliases
	for _, v := range c.devices {
		id := v.info.DeviceID
		v.alias = names.Aliases[id]
		seen := map[string]bool{}
		for _, t := range toolsOf[id] {
			if seen[t.Name] {
				continue // a board listing a tool twice: keep the first
			}
			seen[t.Name] = true
			name := names.Names[toolRef{id, t.Name}]
			confirm := opts.flow && opts.confirm != nil && opts.confirm(t)
			e := reuseEntry(c, opts.prev, name, v, t, confirm)
			if e == nil {
				e = newEntry(c, name, v, t, confirm, opts)
			}
			v.tools = append(v.tools, e)
			c.byName[e.name] = e
		}
	}
	return c
}

// keptNames looks up the names c gave board tools: first by the name the
// tool would get afresh (what almost every tool has), else in a table of
// the board's tools, made the first time it is needed.
func (c *catalog) keptNames() keptNames {
	var tables map[string]map[string]string // device id → tool → name
	return func(ref toolRef, base string) (string, bool) {
		if e, ok := c.byName[base]; ok && e.deviceID == ref.DeviceID && e.tool.Name == ref.Tool {
			return base, true
		}
		v, ok := c.byDevice[ref.DeviceID]
		if !ok || len(v.tools) == 0 {
			return "", false
		}
		t, ok := tables[ref.DeviceID]
		if !ok {
			t = make(map[string]string, len(v.tools))
			for _, e := range v.tools {
				t[e.tool.Name] = e.name
			}
			if tables == nil {
				tables = map[string]map[string]string{}
			}
			tables[ref.DeviceID] = t
		}
		n, ok := t[ref.Tool]
		return n, ok
	}
}

// namingOf is what the naming needs of a board, without its tools.
func namingOf(info device.Info, aliases Aliases) namingDevice {
	nd := namingDevice{DeviceID: info.DeviceID, Alias: aliases.byID[info.DeviceID], Bare: aliases.bare[info.DeviceID],
		ConnectedAt: info.ConnectedAt}
	if info.Node != "" {
		nd.Holder = info.HolderAlias
	}
	return nd
}

// reuseEntry returns prev's entry for name when it describes the same
// board tool in the same words (so it publishes the same tool), else nil.
// A reused entry's parsed schema joins c's, for the catalogues after it.
func reuseEntry(c, prev *catalog, name string, v *deviceView, t device.Tool, confirm bool) *entry {
	if prev == nil {
		return nil
	}
	o, ok := prev.byName[name]
	if !ok || o.deviceID != v.info.DeviceID || o.alias != v.alias || o.board != v.info.Board || !sameTool(o.tool, t) {
		return nil
	}
	if o.confirm != confirm {
		return nil
	}
	c.schemas[string(t.InputSchema)] = parsedSchema{schema: o.schema, err: o.schemaErr, published: o.published}
	return o
}

func sameTool(a, b device.Tool) bool {
	return a.Name == b.Name && a.Description == b.Description &&
		string(a.InputSchema) == string(b.InputSchema) && string(a.Annotations) == string(b.Annotations)
}

func newEntry(c *catalog, name string, v *deviceView, t device.Tool, confirm bool, opts catalogOptions) *entry {
	e := &entry{name: name, deviceID: v.info.DeviceID, alias: v.alias, board: v.info.Board, tool: t, userOnly: t.UserOnly(), confirm: confirm}
	p := c.parse(t.InputSchema, opts.prev)
	e.schema, e.schemaErr, e.published = p.schema, p.err, p.published
	e.mcpTool = &mcp.Tool{
		Name:        name,
		Title:       fmt.Sprintf("%s on %s", boardText(strings.TrimPrefix(t.Name, "self.")), v.alias),
		Description: toolDescription(v, t, e.confirm),
		InputSchema: e.published,
	}
	e.mcpTool.Meta = toolMeta(e.userOnly, opts.flow, e.confirm)
	fp, _ := json.Marshal(e.mcpTool)
	e.fingerprint = sha256.Sum256(fp)
	return e
}

// sharedMeta holds the few distinct _meta objects tools carry, built once:
// every tool of every board shares one of them. They are never modified.
var sharedMeta = func() (m [2][2][2]mcp.Meta) {
	for _, userOnly := range []bool{false, true} {
		for _, flow := range []bool{false, true} {
			for _, confirm := range []bool{false, true} {
				meta := mcp.Meta{}
				if userOnly {
					// The board marks it as the user's; hosts that show tools to
					// people can tell from the description, and the model is told
					// to wait for an explicit request.
					meta["devicebridge/audience"] = []string{"user"}
				}
				if flow {
					// Flow-aware clients learn from the listing that
					// interaction.start takes this tool, and whether it will end
					// with a confirmation.
					meta[metaFlow] = map[string]any{"interactive": true, "confirm": confirm}
				}
				if len(meta) > 0 {
					m[b2i(userOnly)][b2i(flow)][b2i(confirm)] = meta
				}
			}
		}
	}
	return m
}()

func toolMeta(userOnly, flow, confirm bool) mcp.Meta {
	return sharedMeta[b2i(userOnly)][b2i(flow)][b2i(confirm)]
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// boardLabel names a board for people and models: its alias, board type
// and MAC.
func boardLabel(v *deviceView) string {
	return labelOf(v.alias, v.info.Board, v.info.DeviceID)
}

// labelOf is boardLabel from its parts; board is what the board calls
// itself, quoted as board text.
func labelOf(alias, board, deviceID string) string {
	board = boardText(board)
	if board == "" {
		board = "board"
	}
	return fmt.Sprintf("%q (%s, %s)", alias, board, deviceID)
}

// What a tool description says, in a fixed order: the bridge's header
// naming the board, then the bridge's notes, each in square brackets, then
// the board's own description, last and in « ». Board text never contains
// those brackets or quotes (boardText), so a board cannot write a line that
// reads as the bridge's, such as a note that a tool needs no confirmation,
// nor end its quotation early: a host or a model can tell the bridge's
// words from the board's.
const (
	noteUserOnly = "[User-only tool: the board reserves it for people; call it only when the user explicitly asks for it.]"
	// Said up front so that a model whose host cannot show the question
	// asks the user itself instead of learning it from a refusal.
	noteConfirm = "[Needs the user's confirmation: the bridge asks the user before running it; a client that cannot show " +
		"questions must pass \"confirm\": true, and only after the user agreed.]"
	boardWordsIntro = "The board's own description of it, quoted: "
)

func toolDescription(v *deviceView, t device.Tool, confirm bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Acts on board %s through its tool %s.", boardLabel(v), boardText(t.Name))
	if t.UserOnly() {
		b.WriteString(" " + noteUserOnly)
	}
	if confirm {
		b.WriteString(" " + noteConfirm)
	}
	if d := boardText(t.Description); d != "" {
		b.WriteString(" " + boardWordsIntro + "«" + d + "»")
	}
	return b.String()
}

// boardMarks are the characters the bridge frames its own words and the
// board's with; in board text they become look-alikes that frame nothing.
var boardMarks = strings.NewReplacer("[", "(", "]", ")", "«", "\"", "»", "\"")

// boardText makes text a board wrote safe to quote in what the bridge
// publishes: its framing characters replaced (see toolDescription), and
// line breaks, other control characters and runs of spaces made one space,
// so that it cannot start a line of its own either.
func boardText(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	return strings.Join(strings.Fields(boardMarks.Replace(s)), " ")
}

// diff lists what changed between two catalogues: names to remove and
// entries to add or replace.
func diff(old, cur *catalog) (removed []string, added []*entry) {
	for name := range old.byName {
		if _, ok := cur.byName[name]; !ok {
			removed = append(removed, name)
		}
	}
	for name, e := range cur.byName {
		if o, ok := old.byName[name]; !ok || (o != e && (o.fingerprint != e.fingerprint || o.deviceID != e.deviceID || o.tool.Name != e.tool.Name)) {
			added = append(added, e)
		}
	}
	return removed, added
}

// findDevice resolves what a user or model calls a board. Names win over
// ids, so that a board cannot take a name by choosing it as its id: first
// an alias an operator gave a board (even one that is away: then nothing
// is found), then the alias the catalogue shows (ignoring case), then the
// device id (a MAC in any spelling).
func (c *catalog) findDevice(ref string) (*deviceView, []*deviceView) {
	ref = strings.TrimSpace(ref)
	if id, ok := c.named.Named(ref); ok {
		return c.byDevice[id], nil
	}
	var matches []*deviceView
	for _, v := range c.devices {
		if strings.EqualFold(v.alias, ref) {
			matches = append(matches, v)
		}
	}
	if len(matches) == 1 {
		return matches[0], nil
	}
	if v, ok := c.byDevice[device.NormalizeID(ref)]; ok {
		return v, nil
	}
	return nil, matches
}

// findTool resolves a board tool by the board's own name
// ("self.audio_speaker.set_volume"), the name without "self.", the
// underscored form ("audio_speaker_set_volume") or the upstream name.
func (v *deviceView) findTool(ref string) *entry {
	ref = strings.TrimSpace(ref)
	for _, e := range v.tools {
		if e.tool.Name == ref || e.name == ref {
			return e
		}
	}
	for _, e := range v.tools {
		if strings.TrimPrefix(e.tool.Name, "self.") == ref || toolPart(e.tool.Name) == toolPart(ref) {
			return e
		}
	}
	return nil
}
