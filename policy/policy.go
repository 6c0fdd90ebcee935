// Package policy is the bridge's one authorization decision point: which
// boards and board tools each identity may see and call, and which tools
// always need the user's confirmation. The MCP server (tools), the control
// API (api) and interactions (flow) all ask it; nothing else decides.
//
// A policy file is YAML:
//
//	identities:
//	  kitchen:                        # a JWT subject, a group, or a static token's name
//	    boards: ["aa:bb:cc:dd:00:01"] # MACs, aliases (globs) or "*"
//	  office:
//	    boards: ["aa:bb:cc:ee:00:01"]
//	    tools: ["self.audio_speaker.*", "self.get_device_status"]  # default: all
//	    confirm: ["self.reboot"]      # always confirmed, whoever calls
//
// An identity matches an entry named after it or after one of its groups;
// it may act on a board tool when one matching entry lists both the board
// and the tool. An identity that matches no entry sees nothing.
package policy

import (
	"errors"
	"fmt"
	"path"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/devicebridge/devicebridge/device"
)

// Policy is one parsed policy file. It is immutable.
type Policy struct {
	entries map[string]*entry
	confirm []string // lower-case globs
}

type entry struct {
	boards []string // "*", normalized MACs, or lower-case alias globs
	tools  []string // lower-case globs; nil means every tool
}

// Board names a board as the decisions see it: its device id (MAC) and the
// alias its tools are published under.
type Board struct {
	ID, Alias string
}

// Parse reads a policy file. Errors name the line at fault.
func Parse(data []byte) (*Policy, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, err // yaml.v3 errors say "yaml: line N: ..."
	}
	p := &Policy{entries: map[string]*entry{}}
	if len(root.Content) == 0 {
		return nil, errors.New("line 1: the policy is empty; it needs an identities: section")
	}
	doc := root.Content[0]
	if doc.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("line %d: the policy must be a mapping with an identities: section", doc.Line)
	}
	seen := false
	for i := 0; i+1 < len(doc.Content); i += 2 {
		k, v := doc.Content[i], doc.Content[i+1]
		switch k.Value {
		case "identities":
			seen = true
			if err := p.parseIdentities(v); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("line %d: unknown key %q (the top level has identities:)", k.Line, k.Value)
		}
	}
	if !seen {
		return nil, fmt.Errorf("line %d: no identities: section", doc.Line)
	}
	return p, nil
}

func (p *Policy) parseIdentities(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil // "identities:" with nothing: nobody sees anything
	}
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: identities: must map identity names to their rules", n.Line)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		name := strings.TrimSpace(k.Value)
		if k.Kind != yaml.ScalarNode || name == "" {
			return fmt.Errorf("line %d: an identity name must be a non-empty string", k.Line)
		}
		if _, dup := p.entries[name]; dup {
			return fmt.Errorf("line %d: identity %q is listed twice", k.Line, name)
		}
		e := &entry{}
		if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
			p.entries[name] = e // listed with no boards: sees nothing
			continue
		}
		if v.Kind != yaml.MappingNode {
			return fmt.Errorf("line %d: identity %q: want boards:, tools: and confirm: lists", v.Line, name)
		}
		for j := 0; j+1 < len(v.Content); j += 2 {
			fk, fv := v.Content[j], v.Content[j+1]
			// An unknown key has no compiler: its list is checked, then
			// the key is refused below.
			pats, err := patterns(fv, name, fk.Value, fieldPattern[fk.Value])
			if err != nil {
				return err
			}
			switch fk.Value {
			case "boards":
				e.boards = append(e.boards, pats...)
			case "tools":
				e.tools = pats // an empty list allows no tool
			case "confirm":
				p.confirm = append(p.confirm, pats...)
			default:
				return fmt.Errorf("line %d: identity %q: unknown key %q (use boards, tools, confirm)", fk.Line, name, fk.Value)
			}
		}
		p.entries[name] = e
	}
	return nil
}

func stringList(n *yaml.Node, identity, key string) ([]string, error) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil, nil
	}
	if n.Kind != yaml.SequenceNode {
		return nil, fmt.Errorf("line %d: identity %q: %s: must be a list, e.g. [\"*\"]", n.Line, identity, key)
	}
	out := make([]string, 0, len(n.Content))
	for _, c := range n.Content {
		if c.Kind != yaml.ScalarNode || strings.TrimSpace(c.Value) == "" {
			return nil, fmt.Errorf("line %d: identity %q: %s: entries must be non-empty strings", c.Line, identity, key)
		}
		out = append(out, strings.TrimSpace(c.Value))
	}
	return out, nil
}

// fieldPattern compiles the entries of each list an identity may have.
var fieldPattern = map[string]func(string) (string, error){
	"boards": boardPattern, "tools": glob, "confirm": glob,
}

// patterns reads the list n under key and compiles its entries with
// compile (when not nil). The result is never nil, so an empty tools:
// list stays distinct from an absent one.
func patterns(n *yaml.Node, identity, key string, compile func(string) (string, error)) ([]string, error) {
	list, err := stringList(n, identity, key)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(list))
	if compile == nil {
		return list, nil
	}
	for idx, s := range list {
		pat, err := compile(s)
		if err != nil {
			return nil, fmt.Errorf("line %d: identity %q: %s: %w", n.Content[idx].Line, identity, key, err)
		}
		out = append(out, pat)
	}
	return out, nil
}

func glob(s string) (string, error) {
	s = strings.ToLower(s)
	if _, err := path.Match(s, ""); err != nil {
		return "", fmt.Errorf("%q is not a valid pattern (use * and ? as wildcards)", s)
	}
	return s, nil
}

func boardPattern(s string) (string, error) {
	if s == "*" {
		return s, nil
	}
	if _, ok := device.MACDigits(s); ok {
		return device.NormalizeID(s), nil
	}
	return glob(s)
}

// matching returns the entries that apply to id.
func (p *Policy) matching(id Identity) []*entry {
	var out []*entry
	if e, ok := p.entries[id.Name]; ok {
		out = append(out, e)
	}
	for _, g := range id.Groups {
		if g == id.Name {
			continue
		}
		if e, ok := p.entries[g]; ok {
			out = append(out, e)
		}
	}
	return out
}

// hasBoard: a MAC pattern matches the board with that MAC, any other
// pattern matches aliases only. A board that chose a non-MAC id
// ("kitchen", with allow_any_device_id) is never matched by it: an id a
// board picks must not earn it the rights given to a name. Its alias
// derives from that id, so a glob ("kitchen*") does not match it either:
// only the exact alias does.
func (e *entry) hasBoard(b Board) bool {
	id := device.NormalizeID(b.ID)
	alias := strings.ToLower(b.Alias)
	_, macID := device.CanonicalMAC(id)
	for _, pat := range e.boards {
		if pat == "*" {
			return true
		}
		if _, mac := device.CanonicalMAC(pat); mac {
			if pat == id {
				return true
			}
			continue
		}
		if alias == "" {
			continue
		}
		if !macID {
			if pat == alias {
				return true
			}
			continue
		}
		if ok, _ := path.Match(pat, alias); ok {
			return true
		}
	}
	return false
}

func (e *entry) hasTool(tool string) bool {
	if e.tools == nil {
		return true
	}
	return matchTool(e.tools, tool)
}

func matchTool(pats []string, tool string) bool {
	tool = strings.ToLower(tool)
	short := strings.TrimPrefix(tool, "self.")
	for _, pat := range pats {
		if ok, _ := path.Match(pat, tool); ok {
			return true
		}
		if ok, _ := path.Match(pat, short); ok && !strings.HasPrefix(pat, "self.") {
			return true
		}
	}
	return false
}

// BoardVisible reports whether id may see board b at all.
func (p *Policy) BoardVisible(id Identity, b Board) bool {
	for _, e := range p.matching(id) {
		if e.hasBoard(b) {
			return true
		}
	}
	return false
}

// ToolAllowed reports whether id may see and call the board tool named
// tool (the board's own name, e.g. "self.reboot") on board b.
func (p *Policy) ToolAllowed(id Identity, b Board, tool string) bool {
	for _, e := range p.matching(id) {
		if e.hasBoard(b) && e.hasTool(tool) {
			return true
		}
	}
	return false
}

// NeedsConfirm reports whether the board tool must always be confirmed.
func (p *Policy) NeedsConfirm(tool string) bool { return matchTool(p.confirm, tool) }

// Label names id by a bounded vocabulary (metrics): the entry it matches by
// name, else the first of its groups that is an entry, else "unlisted".
func (p *Policy) Label(id Identity) string {
	if _, ok := p.entries[id.Name]; ok {
		return id.Name
	}
	for _, g := range id.Groups {
		if _, ok := p.entries[g]; ok {
			return g
		}
	}
	return "unlisted"
}

// Identities counts the entries (for logs).
func (p *Policy) Identities() int { return len(p.entries) }
