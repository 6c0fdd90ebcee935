//go:build faults

package faults

import (
	"fmt"
	"strings"
	"testing"
)

// TestZZSummary runs last (files and tests run in order) and logs the
// table of every scenario that ran, each lost try in its column, the
// bridges' shutdowns, and the campaign's figures in one line. It writes
// nothing: copy the table from the -v output into docs/reliability.md when
// the figures change.
func TestZZSummary(t *testing.T) {
	tallyMu.Lock()
	defer tallyMu.Unlock()
	if len(tallies) == 0 {
		t.Skip("no scenario ran")
	}
	t.Log(shutdowns.line())
	all := append(tallies[:len(tallies):len(tallies)], shutdowns)
	var sb strings.Builder
	sb.WriteString("\n| scenario | tried | survived | crash | hang | growth | bypass | wrong |\n")
	sb.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|\n")
	var tried, survived int64
	var lost [lossKinds]int64
	for _, s := range all {
		fmt.Fprintf(&sb, "| %s | %d | %d |", s.name, s.tried.Load(), s.survive.Load())
		for k := range lost {
			n := s.lost[k].Load()
			lost[k] += n
			fmt.Fprintf(&sb, " %d |", n)
		}
		sb.WriteByte('\n')
		tried += s.tried.Load()
		survived += s.survive.Load()
	}
	fmt.Fprintf(&sb, "| **total** | **%d** | **%d** |", tried, survived)
	for _, n := range lost {
		fmt.Fprintf(&sb, " **%d** |", n)
	}
	fmt.Fprintf(&sb, "\n\ninputs tried %d, crashes %d, hangs %d, unbounded growth %d, bypasses %d, wrong answers %d\n",
		tried, lost[lossCrash], lost[lossHang], lost[lossGrowth], lost[lossBypass], lost[lossWrong])
	t.Log(sb.String())
}
