package main

// Naming boards and tools the way people do: a MAC in any spelling, its
// last digits, an alias; a tool with or without "self.", or its last
// parts. A name that matches nothing gets the closest candidates.

import (
	"context"
	"fmt"
	"net/url"
	"sort"
	"strings"

	"github.com/devicebridge/devicebridge/internal/editdist"
)

// hexOf keeps the hex digits of s, lower-cased ("02:00:0A" → "02000a").
func hexOf(s string) string {
	return keepRunes(s, func(r rune) bool { return (r >= '0' && r <= '9') || (r >= 'a' && r <= 'f') })
}

// alnumOf keeps the letters and digits of s, lower-cased.
func alnumOf(s string) string {
	return keepRunes(s, func(r rune) bool { return (r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') })
}

// keepRunes keeps the runes of lower-cased s that keep accepts.
func keepRunes(s string, keep func(rune) bool) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if keep(r) {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// isMACish says whether s is written like (part of) a MAC: hex digits,
// optionally separated by ':', '-', '_' or '.'.
func isMACish(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range strings.ToLower(s) {
		if !((r >= '0' && r <= '9') || (r >= 'a' && r <= 'f') || strings.ContainsRune(":-_.", r)) {
			return false
		}
	}
	return hexOf(s) != ""
}

// findBoard resolves a board name against the fleet.
func (c *cli) findBoard(ctx context.Context, name string) (board, error) {
	var list struct {
		Devices []board `json:"devices"`
	}
	if err := c.do(ctx, "GET", "/api/devices", nil, &list); err != nil {
		return board{}, err
	}
	return matchBoard(list.Devices, name)
}

func matchBoard(boards []board, name string) (board, error) {
	n := strings.ToLower(strings.TrimSpace(name))
	if n == "" {
		return board{}, errf(exitUsage, "name a board: a MAC, its last digits or an alias (devicebridge devices lists them)")
	}
	// An alias first: names win over ids, so that a board cannot take an
	// operator's name by choosing it as its id (the bridge also resolves
	// a configured name first when the CLI asks for the board by id).
	var hits []board
	for _, b := range boards {
		if b.Alias != "" && strings.ToLower(b.Alias) == n {
			hits = append(hits, b)
		}
	}
	if len(hits) == 1 {
		return hits[0], nil
	}
	for _, b := range boards { // exact id, any case
		if strings.ToLower(b.DeviceID) == n {
			return b, nil
		}
	}
	if h := hexOf(n); isMACish(n) && len(h) == 12 {
		for _, b := range boards { // the same MAC in another spelling
			if hexOf(b.DeviceID) == h {
				return b, nil
			}
		}
	}
	if len(hits) == 0 && isMACish(n) { // last digits
		digits := hexOf(n)
		for _, b := range boards {
			if id := hexOf(b.DeviceID); len(id) == 12 && strings.HasSuffix(id, digits) {
				hits = append(hits, b)
			}
		}
	}
	switch {
	case len(hits) == 1:
		return hits[0], nil
	case len(hits) > 1:
		var ids []string
		for _, b := range hits {
			ids = append(ids, b.DeviceID)
		}
		return board{}, errf(exitNotFound, "%q names %d boards: %s; give more digits or the whole MAC", name, len(hits), strings.Join(ids, ", "))
	}
	// One suggestion per board, by the name (MAC or alias) that is
	// closest.
	var cands [][]string
	for _, b := range boards {
		names := []string{b.DeviceID}
		if b.Alias != "" {
			names = append(names, b.Alias)
		}
		cands = append(cands, names)
	}
	if len(boards) == 0 {
		return board{}, errf(exitNotFound, "no board %s: the bridge has no boards connected", name)
	}
	return board{}, errf(exitNotFound, "no board %s%s", name, didYouMeanOne(name, cands))
}

// resolveCall names what call and interact act on: the board, its tool,
// and the key=value pairs typed from the tool's schema.
func (c *cli) resolveCall(ctx context.Context, boardName, toolName string, pairs []string) (board, tool, map[string]any, error) {
	d, err := c.boardDetail(ctx, boardName)
	if err != nil {
		return board{}, tool{}, nil, err
	}
	t, err := findTool(d, toolName)
	if err != nil {
		return board{}, tool{}, nil, err
	}
	args, err := parseArgs(t, pairs)
	if err != nil {
		return board{}, tool{}, nil, err
	}
	return d, t, args, nil
}

// findTool resolves a tool name on a board: exact, without "self.", or a
// unique ending: whole parts ("set_volume", "lamp.turn_on"), else whole
// words ("volume", "theme" for self.screen.set_theme).
func findTool(b board, name string) (tool, error) {
	for _, t := range b.Tools {
		if t.Name == name {
			return t, nil
		}
	}
	for _, t := range b.Tools {
		if t.Name == "self."+name || strings.EqualFold(t.Name, name) {
			return t, nil
		}
	}
	var hits []tool
	for _, sep := range []string{".", "_"} {
		hits = hits[:0]
		for _, t := range b.Tools {
			if strings.HasSuffix(t.Name, sep+name) {
				hits = append(hits, t)
			}
		}
		if len(hits) > 0 {
			break
		}
	}
	if len(hits) == 1 {
		return hits[0], nil
	}
	var names []string
	for _, t := range b.Tools {
		names = append(names, t.Name)
	}
	if len(hits) > 1 {
		var hn []string
		for _, t := range hits {
			hn = append(hn, t.Name)
		}
		return tool{}, errf(exitNotFound, "%q matches %d tools of %s: %s", name, len(hits), b.DeviceID, strings.Join(hn, ", "))
	}
	return tool{}, errf(exitNotFound, "board %s has no tool %s%s (devicebridge tools %s lists them)", b.DeviceID, name, didYouMean(name, names), b.DeviceID)
}

// boardDetail fetches a board with its tools.
func (c *cli) boardDetail(ctx context.Context, name string) (board, error) {
	b, err := c.findBoard(ctx, name)
	if err != nil {
		return b, err
	}
	var d board
	if err := c.do(ctx, "GET", "/api/devices/"+url.PathEscape(b.DeviceID), nil, &d); err != nil {
		return d, err
	}
	return d, nil
}

// didYouMean suggests the candidates closest to name: "; did you mean X?"
// or "; did you mean X or Y?", or "" when none is close.
func didYouMean(name string, cands []string) string {
	groups := make([][]string, len(cands))
	for i, c := range cands {
		groups[i] = []string{c}
	}
	return didYouMeanOne(name, groups)
}

// distance is how far name is from the candidate c, by edit distance,
// digits of a MAC, or containment.
func distance(name, c string) int {
	n, lc := strings.ToLower(name), strings.ToLower(c)
	d := editdist.Distance(n, lc)
	if isMACish(lc) && len(hexOf(lc)) == 12 {
		// A MAC: compare digits with digits, against its end when only
		// some were given ("00:0x" is one off "00:01").
		h, hn := hexOf(lc), alnumOf(n)
		if len(hn) > 0 && len(hn) < len(h) {
			d = min(d, editdist.Distance(hn, h[len(h)-len(hn):]))
		} else {
			d = min(d, editdist.Distance(hn, h))
		}
	}
	if strings.Contains(lc, n) || strings.Contains(n, lc) {
		d = min(d, 1)
	}
	return d
}

// didYouMeanOne is didYouMean over things with several names (a board's
// MAC and alias): each is suggested once, by its closest name (the first
// of equals).
func didYouMeanOne(name string, cands [][]string) string {
	type scored struct {
		s string
		d int
	}
	var best []scored
	limit := max(2, len(name)/2)
	for _, names := range cands {
		pick := scored{d: limit + 1}
		for _, c := range names {
			if d := distance(name, c); d < pick.d {
				pick = scored{c, d}
			}
		}
		if pick.d <= limit {
			best = append(best, pick)
		}
	}
	if len(best) == 0 {
		return ""
	}
	sort.SliceStable(best, func(i, j int) bool { return best[i].d < best[j].d })
	var out []string
	for _, b := range best {
		if b.d == best[0].d && len(out) < 3 {
			out = append(out, b.s)
		}
	}
	return fmt.Sprintf("; did you mean %s?", strings.Join(out, " or "))
}
