// Command confreport reads the runs of the official MCP conformance suite
// that scripts/conformance.sh makes, compares them with the committed
// baseline, and writes the conformance table of docs/mcp.md (between the
// BEGIN/END GENERATED conformance markers) from the baseline and the
// committed reasons, so that no result in the table is typed by hand.
//
//	go run ./internal/confreport -runs DIR          compare DIR's runs with the baseline
//	go run ./internal/confreport -runs DIR -update  make them the baseline, and rewrite the table
//	go run ./internal/confreport                    rewrite the table from the baseline
//
// DIR holds one directory per suite version (named by the version, e.g.
// 0.1.16), each the suite's -o output: one directory per scenario,
// server-<scenario>-<time>, with its checks.json. A scenario passes when
// none of its checks is a FAILURE (as the suite's own summary counts).
//
// Without -update it exits 1 when a scenario that passes in the baseline
// fails (or did not run), and reports scenarios that newly pass, with the
// hint to update the baseline.
package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

func main() {
	runs := flag.String("runs", "", "directory of the suite runs, one subdirectory per suite version (empty: only rewrite the table)")
	update := flag.Bool("update", false, "make the runs the new baseline")
	expected := flag.String("expected", "scripts/conformance/expected.txt", "the committed baseline")
	reasons := flag.String("reasons", "scripts/conformance/reasons.txt", "why each failing scenario fails")
	doc := flag.String("doc", "docs/mcp.md", "document whose generated conformance section to rewrite")
	flag.Parse()
	code, err := run(os.Stdout, *runs, *update, *expected, *reasons, *doc)
	if err != nil {
		fmt.Fprintln(os.Stderr, "confreport:", err)
		os.Exit(2)
	}
	os.Exit(code)
}

// result is one scenario of one suite version.
type result struct {
	version, scenario string
	pass              bool
	// passed and failed count the scenario's checks with status SUCCESS
	// and FAILURE (warnings, skips and infos are neither).
	passed, failed int
}

// key identifies a result.
func (r result) key() string { return r.version + " " + r.scenario }

func run(w io.Writer, runs string, update bool, expectedPath, reasonsPath, doc string) (int, error) {
	baseline, err := readExpected(expectedPath)
	if err != nil {
		return 0, err
	}
	reasons, err := readReasons(reasonsPath)
	if err != nil {
		return 0, err
	}
	if runs == "" {
		return 0, writeDoc(doc, baseline, reasons)
	}
	got, err := readRuns(runs)
	if err != nil {
		return 0, err
	}
	regressions := compare(w, baseline, got)
	if !update {
		if regressions > 0 {
			fmt.Fprintf(w, "%d scenario(s) that pass in the baseline fail now\n", regressions)
			return 1, nil
		}
		return 0, nil
	}
	// The table first: it refuses a failing scenario without a reason,
	// and then nothing is written.
	baseline = merge(baseline, got)
	if _, err := renderTable(baseline, reasons); err != nil {
		return 0, err
	}
	if err := writeExpected(expectedPath, baseline); err != nil {
		return 0, err
	}
	fmt.Fprintf(w, "baseline %s updated\n", expectedPath)
	return 0, writeDoc(doc, baseline, reasons)
}

// scenarioDir is how the suite names a scenario's output directory:
// server-<scenario>-<ISO time with dashes>.
var scenarioDir = regexp.MustCompile(`^server-(.+)-\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d(-\d+)?Z$`)

// readRuns reads every version directory under dir.
func readRuns(dir string) ([]result, error) {
	versions, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []result
	// A scenario run twice into one directory (an --out reused) counts
	// once, as its latest run: ReadDir sorts by name, and names end with
	// the time.
	latest := map[string]int{}
	for _, v := range versions {
		if !v.IsDir() {
			continue
		}
		scenarios, err := os.ReadDir(filepath.Join(dir, v.Name()))
		if err != nil {
			return nil, err
		}
		for _, s := range scenarios {
			m := scenarioDir.FindStringSubmatch(s.Name())
			if m == nil || !s.IsDir() {
				continue
			}
			r, err := readChecks(filepath.Join(dir, v.Name(), s.Name(), "checks.json"))
			if err != nil {
				return nil, err
			}
			r.version, r.scenario = v.Name(), m[1]
			if i, seen := latest[r.key()]; seen {
				out[i] = r
				continue
			}
			latest[r.key()] = len(out)
			out = append(out, r)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no scenario results under %s", dir)
	}
	return out, nil
}

func readChecks(path string) (result, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return result{}, err
	}
	var checks []struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(data, &checks); err != nil {
		return result{}, fmt.Errorf("%s: %w", path, err)
	}
	var r result
	for _, c := range checks {
		switch c.Status {
		case "SUCCESS":
			r.passed++
		case "FAILURE":
			r.failed++
		}
	}
	r.pass = r.failed == 0
	return r, nil
}

// compare reports the runs against the baseline, for the versions run,
// and returns how many scenarios regressed.
func compare(w io.Writer, baseline, got []result) int {
	now := map[string]result{}
	versions := map[string]bool{}
	for _, r := range got {
		now[r.key()] = r
		versions[r.version] = true
	}
	was := map[string]result{}
	for _, r := range baseline {
		was[r.key()] = r
	}
	regressions := 0
	for _, b := range baseline {
		if !versions[b.version] || !b.pass {
			continue
		}
		if r, ok := now[b.key()]; !ok {
			fmt.Fprintf(w, "REGRESSION %s %s: passes in the baseline, did not run\n", b.version, b.scenario)
			regressions++
		} else if !r.pass {
			fmt.Fprintf(w, "REGRESSION %s %s: passes in the baseline, fails now (%d checks failed)\n", b.version, b.scenario, r.failed)
			regressions++
		}
	}
	improved := 0
	for _, r := range sorted(got) {
		b, known := was[r.key()]
		switch {
		case r.pass && (!known || !b.pass):
			fmt.Fprintf(w, "NEWLY PASSING %s %s\n", r.version, r.scenario)
			improved++
		case !known:
			fmt.Fprintf(w, "NEW SCENARIO %s %s: fails (not in the baseline)\n", r.version, r.scenario)
		}
	}
	for _, v := range sortedKeys(versions) {
		p, n, cp, cn := totals(got, v)
		bp, bn, _, _ := totals(baseline, v)
		fmt.Fprintf(w, "%s: %d of %d scenarios pass (%d checks passed, %d failed); baseline %d of %d\n", v, p, n, cp, cn, bp, bn)
	}
	if improved > 0 {
		fmt.Fprintln(w, "scenarios pass that the baseline does not expect: run scripts/conformance.sh --update to make this run the baseline (and regenerate docs/mcp.md), then commit it")
	}
	return regressions
}

// totals counts a version's passing scenarios, scenarios, passed and
// failed checks.
func totals(rs []result, version string) (pass, n, passed, failed int) {
	for _, r := range rs {
		if r.version != version {
			continue
		}
		n++
		if r.pass {
			pass++
		}
		passed += r.passed
		failed += r.failed
	}
	return
}

// merge replaces the baseline's versions that were run by the runs.
func merge(baseline, got []result) []result {
	run := map[string]bool{}
	for _, r := range got {
		run[r.version] = true
	}
	out := slices.Clone(got)
	for _, b := range baseline {
		if !run[b.version] {
			out = append(out, b)
		}
	}
	return sorted(out)
}

func sorted(rs []result) []result {
	out := slices.Clone(rs)
	slices.SortFunc(out, func(a, b result) int {
		return cmp.Or(compareVersions(a.version, b.version), strings.Compare(a.scenario, b.scenario))
	})
	return out
}

func sortedKeys(m map[string]bool) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, compareVersions)
	return keys
}

// compareVersions orders 0.1.16 before 0.2.0-alpha.12 (numerically by
// part, the rest as text).
func compareVersions(a, b string) int {
	pa, pb := strings.FieldsFunc(a, isSep), strings.FieldsFunc(b, isSep)
	for i := 0; i < len(pa) && i < len(pb); i++ {
		na, ea := strconv.Atoi(pa[i])
		nb, eb := strconv.Atoi(pb[i])
		if ea == nil && eb == nil {
			if c := cmp.Compare(na, nb); c != 0 {
				return c
			}
			continue
		}
		if c := strings.Compare(pa[i], pb[i]); c != 0 {
			return c
		}
	}
	return cmp.Compare(len(pa), len(pb))
}

func isSep(r rune) bool { return r == '.' || r == '-' }

const expectedHeader = `# The baseline of scripts/conformance.sh: each scenario of the official MCP
# conformance suite, per suite version, as the bridge with
# configs/profiles/conformance.yaml last ran it. A scenario that passes here
# and fails in a run fails the script. Written by
# scripts/conformance.sh --update (internal/confreport); do not edit.
#
# version scenario result checks-passed checks-failed
`

func readExpected(path string) ([]result, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []result
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		f := strings.Fields(text)
		if len(f) != 5 || (f[2] != "pass" && f[2] != "fail") {
			return nil, fmt.Errorf("%s:%d: want: version scenario pass|fail passed failed", path, line)
		}
		p, err1 := strconv.Atoi(f[3])
		n, err2 := strconv.Atoi(f[4])
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%s:%d: check counts must be numbers", path, line)
		}
		out = append(out, result{version: f[0], scenario: f[1], pass: f[2] == "pass", passed: p, failed: n})
	}
	return out, sc.Err()
}

func writeExpected(path string, rs []result) error {
	var b strings.Builder
	b.WriteString(expectedHeader)
	for _, r := range sorted(rs) {
		res := "fail"
		if r.pass {
			res = "pass"
		}
		fmt.Fprintf(&b, "%s %s %s %d %d\n", r.version, r.scenario, res, r.passed, r.failed)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// readReasons reads "scenario: why it fails" lines; # starts a comment
// line, and an indented line continues the one before.
func readReasons(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	last := ""
	for i, line := range strings.Split(string(data), "\n") {
		switch {
		case strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#"):
			last = ""
		case line[0] == ' ' || line[0] == '\t':
			if last == "" {
				return nil, fmt.Errorf("%s:%d: continuation line without a scenario", path, i+1)
			}
			out[last] += " " + strings.TrimSpace(line)
		default:
			name, why, ok := strings.Cut(line, ":")
			name, why = strings.TrimSpace(name), strings.TrimSpace(why)
			if !ok || name == "" || why == "" || strings.ContainsAny(name, " \t") {
				return nil, fmt.Errorf("%s:%d: want: scenario: why it fails", path, i+1)
			}
			if _, dup := out[name]; dup {
				return nil, fmt.Errorf("%s:%d: %s is listed twice", path, i+1, name)
			}
			out[name], last = why, name
		}
	}
	return out, nil
}

// docSection is the generated part of the document.
var docSection = regexp.MustCompile(`(?s)<!-- BEGIN GENERATED conformance.*?<!-- END GENERATED conformance -->`)

// writeDoc rewrites the document's generated section with the table.
func writeDoc(path string, rs []result, reasons map[string]string) error {
	table, err := renderTable(rs, reasons)
	if err != nil {
		return err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if !docSection.Match(data) {
		return fmt.Errorf("%s has no <!-- BEGIN GENERATED conformance --> ... <!-- END GENERATED conformance --> section", path)
	}
	out := docSection.ReplaceAllLiteral(data, []byte(table))
	return os.WriteFile(path, out, 0o644)
}

// renderTable is the generated section: one row per scenario, a column
// per suite version, and why the scenario fails where it does.
func renderTable(rs []result, reasons map[string]string) (string, error) {
	versions := map[string]bool{}
	byKey := map[string]result{}
	var scenarios []string
	for _, r := range rs {
		versions[r.version] = true
		byKey[r.key()] = r
		if !slices.Contains(scenarios, r.scenario) {
			scenarios = append(scenarios, r.scenario)
		}
	}
	vs := sortedKeys(versions)
	slices.Sort(scenarios) // by name, so that the table is stable

	var b strings.Builder
	b.WriteString("<!-- BEGIN GENERATED conformance by scripts/conformance.sh --update (internal/confreport) from scripts/conformance/expected.txt and reasons.txt: do not edit -->\n")
	var sums []string
	for _, v := range vs {
		p, n, cp, cn := totals(rs, v)
		sums = append(sums, fmt.Sprintf("**%s**: %d of %d scenarios pass (%d of %d checks)", v, p, n, cp, cp+cn))
	}
	b.WriteString(strings.Join(sums, "; ") + ".\n\n")
	b.WriteString("| scenario | " + strings.Join(vs, " | ") + " | why it fails |\n")
	b.WriteString("|---|" + strings.Repeat("---|", len(vs)) + "---|\n")
	var missing []string
	for _, s := range scenarios {
		row := "| " + s + " |"
		failing := false
		for _, v := range vs {
			r, ok := byKey[v+" "+s]
			switch {
			case !ok:
				row += " — |"
			case r.pass && r.passed+r.failed == 0:
				row += " skipped by the suite (no checks) |"
			case r.pass:
				row += " pass |"
			default:
				failing = true
				row += fmt.Sprintf(" fail (%d of %d checks) |", r.passed, r.passed+r.failed)
			}
		}
		why := ""
		if failing {
			why = reasons[s]
			if why == "" {
				missing = append(missing, s)
			}
		}
		b.WriteString(row + " " + strings.ReplaceAll(why, "|", `\|`) + " |\n")
	}
	if len(missing) > 0 {
		return "", fmt.Errorf("no reason in reasons.txt for failing scenario(s): %s", strings.Join(missing, ", "))
	}
	b.WriteString("<!-- END GENERATED conformance -->")
	return b.String(), nil
}
