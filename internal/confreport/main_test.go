package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCommittedTableIsGenerated: the conformance table of docs/mcp.md is
// exactly what confreport writes from the committed baseline and reasons:
// nobody typed a result, and every failing scenario has its reason.
func TestCommittedTableIsGenerated(t *testing.T) {
	root := t.TempDir()
	doc := filepath.Join(root, "mcp.md")
	committed, err := os.ReadFile("../../docs/mcp.md")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(doc, committed, 0o644))
	var out bytes.Buffer
	code, err := run(&out, "", false, "../../scripts/conformance/expected.txt", "../../scripts/conformance/reasons.txt", doc)
	require.NoError(t, err)
	assert.Equal(t, 0, code)
	got, err := os.ReadFile(doc)
	require.NoError(t, err)
	assert.Equal(t, string(committed), string(got), "docs/mcp.md differs from what go run ./internal/confreport writes")
}

// writeRun writes one scenario's checks.json as the suite does.
func writeRun(t *testing.T, dir, version, scenario, checks string) {
	t.Helper()
	d := filepath.Join(dir, version, "server-"+scenario+"-2026-01-02T03-04-05-678Z")
	require.NoError(t, os.MkdirAll(d, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(d, "checks.json"), []byte(checks), 0o644))
}

const (
	passing = `[{"status":"SUCCESS"},{"status":"WARNING"},{"status":"SKIPPED"}]`
	failing = `[{"status":"SUCCESS"},{"status":"FAILURE"}]`
)

// TestCompare: a scenario that passes in the baseline and fails (or does
// not run) fails the comparison; one that newly passes is reported with
// the hint; -update makes the run the baseline (keeping versions not
// run) and rewrites the table.
func TestCompare(t *testing.T) {
	root := t.TempDir()
	expected := filepath.Join(root, "expected.txt")
	reasons := filepath.Join(root, "reasons.txt")
	doc := filepath.Join(root, "doc.md")
	require.NoError(t, os.WriteFile(expected, []byte(expectedHeader+
		"0.1.16 a pass 1 0\n0.1.16 b fail 0 1\n0.1.16 c pass 1 0\n0.2.0-alpha.1 a pass 3 0\n"), 0o644))
	require.NoError(t, os.WriteFile(reasons, []byte("# comment\nb: cannot,\n  because | reasons\nd: never runs\n"), 0o644))
	require.NoError(t, os.WriteFile(doc, []byte("before\n<!-- BEGIN GENERATED conformance -->\nstale\n<!-- END GENERATED conformance -->\nafter\n"), 0o644))

	runs := filepath.Join(root, "runs")
	writeRun(t, runs, "0.1.16", "a", failing)
	writeRun(t, runs, "0.1.16", "b", passing)
	writeRun(t, runs, "0.1.16", "e", failing)
	// An older run of b, in the same directory, does not count.
	d := filepath.Join(runs, "0.1.16", "server-b-2025-01-02T03-04-05-678Z")
	require.NoError(t, os.MkdirAll(d, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(d, "checks.json"), []byte(failing), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(runs, "bridge.log"), []byte("not a run"), 0o644))

	var out bytes.Buffer
	code, err := run(&out, runs, false, expected, reasons, doc)
	require.NoError(t, err)
	assert.Equal(t, 1, code)
	report := out.String()
	assert.Contains(t, report, "REGRESSION 0.1.16 a: passes in the baseline, fails now (1 checks failed)")
	assert.Contains(t, report, "REGRESSION 0.1.16 c: passes in the baseline, did not run")
	assert.Contains(t, report, "NEWLY PASSING 0.1.16 b")
	assert.Contains(t, report, "NEW SCENARIO 0.1.16 e: fails (not in the baseline)")
	assert.Contains(t, report, "0.1.16: 1 of 3 scenarios pass (3 checks passed, 2 failed); baseline 2 of 3")
	assert.Contains(t, report, "scripts/conformance.sh --update")
	assert.NotContains(t, report, "0.2.0-alpha.1:", "a version not run is not compared")
	written, err := os.ReadFile(doc)
	require.NoError(t, err)
	assert.Contains(t, string(written), "stale", "only -update rewrites the table")

	// e fails and has no reason: the table cannot be written.
	out.Reset()
	_, err = run(&out, runs, true, expected, reasons, doc)
	require.ErrorContains(t, err, "no reason in reasons.txt for failing scenario(s): a, e")
	base, err := os.ReadFile(expected)
	require.NoError(t, err)
	assert.Contains(t, string(base), "0.1.16 a pass 1 0", "nothing is written when the table cannot be")
	require.NoError(t, os.WriteFile(reasons, []byte("a: broke\ne: new\n"), 0o644))
	out.Reset()
	code, err = run(&out, runs, true, expected, reasons, doc)
	require.NoError(t, err)
	assert.Equal(t, 0, code)
	base, err = os.ReadFile(expected)
	require.NoError(t, err)
	assert.Equal(t, expectedHeader+"0.1.16 a fail 1 1\n0.1.16 b pass 1 0\n0.1.16 e fail 1 1\n0.2.0-alpha.1 a pass 3 0\n", string(base))
	written, err = os.ReadFile(doc)
	require.NoError(t, err)
	doc2 := string(written)
	assert.True(t, strings.HasPrefix(doc2, "before\n<!-- BEGIN GENERATED conformance by "), doc2)
	assert.True(t, strings.HasSuffix(doc2, "<!-- END GENERATED conformance -->\nafter\n"), doc2)
	assert.Contains(t, doc2, "**0.1.16**: 1 of 3 scenarios pass (3 of 5 checks); **0.2.0-alpha.1**: 1 of 1 scenarios pass (3 of 3 checks).")
	assert.Contains(t, doc2, "| scenario | 0.1.16 | 0.2.0-alpha.1 | why it fails |")
	assert.Contains(t, doc2, "| a | fail (1 of 2 checks) | pass | broke |")
	assert.Contains(t, doc2, "| b | pass | — |  |")
}

func TestReasonsFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "reasons.txt")
	for text, want := range map[string]string{
		"  orphan continuation\n": "continuation line without a scenario",
		"no colon here\n":         "want: scenario: why it fails",
		"two words: x\n":          "want: scenario: why it fails",
		"a: x\na: y\n":            "a is listed twice",
	} {
		require.NoError(t, os.WriteFile(path, []byte(text), 0o644))
		_, err := readReasons(path)
		assert.ErrorContains(t, err, want, text)
	}
}

func TestCompareVersions(t *testing.T) {
	assert.Negative(t, compareVersions("0.1.16", "0.2.0-alpha.12"))
	assert.Negative(t, compareVersions("0.1.9", "0.1.16"))
	assert.Negative(t, compareVersions("0.2.0-alpha.9", "0.2.0-alpha.12"))
	assert.Zero(t, compareVersions("1.0.0", "1.0.0"))
}
