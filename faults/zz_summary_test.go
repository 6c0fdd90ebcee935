//go:build faults

package faults

import (
	"fmt"
	"strings"
	"testing"
)

// TestZZSummary runs last (files and tests run in order) and logs the
// table of every scenario that ran. It writes nothing: copy the table from
// the -v output into docs/reliability.md when the figures change.
func TestZZSummary(t *testing.T) {
	tallyMu.Lock()
	defer tallyMu.Unlock()
	if len(tallies) == 0 {
		t.Skip("no scenario ran")
	}
	var sb strings.Builder
	sb.WriteString("\n| scenario | tried | survived | lost |\n|---|---:|---:|---:|\n")
	var tried, survived, lost int64
	for _, s := range tallies {
		fmt.Fprintf(&sb, "| %s | %d | %d | %d |\n", s.name, s.tried.Load(), s.survived.Load(), s.lost.Load())
		tried += s.tried.Load()
		survived += s.survived.Load()
		lost += s.lost.Load()
	}
	fmt.Fprintf(&sb, "| **total** | **%d** | **%d** | **%d** |\n", tried, survived, lost)
	t.Log(sb.String())
}
