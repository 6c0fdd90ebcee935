package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// copyRuns copies the committed runs (docs/perf) and the two documents
// into a temporary tree, so that run can rewrite them there.
func copyRuns(t *testing.T) (dir, doc, readme string) {
	t.Helper()
	root := t.TempDir()
	dir = filepath.Join(root, "perf")
	require.NoError(t, os.Mkdir(dir, 0o755))
	for _, name := range []string{"scale.csv", "hop.txt", "fanout.txt", "machine.txt", "mosquitto.csv"} {
		b, err := os.ReadFile(filepath.Join("../../docs/perf", name))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), b, 0o644))
	}
	doc, readme = filepath.Join(root, "performance.md"), filepath.Join(root, "README.md")
	for src, dst := range map[string]string{"../../docs/performance.md": doc, "../../README.md": readme} {
		b, err := os.ReadFile(src)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(dst, b, 0o644))
	}
	return dir, doc, readme
}

// TestCommittedFiguresAreGenerated: the README's load figures and the
// performance page's tables are exactly what perfplot writes from the
// committed runs: nobody typed them, and they agree with each other.
func TestCommittedFiguresAreGenerated(t *testing.T) {
	dir, doc, readme := copyRuns(t)
	require.NoError(t, run(dir, doc, readme))
	for committed, regenerated := range map[string]string{"../../docs/performance.md": doc, "../../README.md": readme} {
		want, err := os.ReadFile(committed)
		require.NoError(t, err)
		got, err := os.ReadFile(regenerated)
		require.NoError(t, err)
		assert.Equal(t, string(got), string(want), "%s differs from what go run ./internal/perfplot writes", committed)
	}
}

// TestReadmeSectionRewritten: typed figures between the README's markers
// are replaced by the ones of scale.csv, and nothing outside them changes.
func TestReadmeSectionRewritten(t *testing.T) {
	dir, doc, readme := copyRuns(t)
	stale := "intro\n\n<!-- BEGIN GENERATED perf-summary -->\n2000 boards in about 1.2 s, 235 MiB RSS\n<!-- END GENERATED perf-summary -->\n\nafter\n"
	require.NoError(t, os.WriteFile(readme, []byte(stale), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "scale.csv"), []byte(
		"transport,n,rss0_kib,rssN_kib,kib_per_board,ready_s,idle_cpu_pct,goroutines,rss_burst_kib,recovery_s\n"+
			"ws,2000,20480,102400,40.0,2.25,1.0,6027,204800,\n"+
			"ws,3000,20480,153600,40.0,x,1.0,9027,307200,\n"+
			"mqtt,2000,20480,204800,90.0,3.5,0.5,8027,409600,\n"), 0o644))
	require.NoError(t, run(dir, doc, readme))
	got, err := os.ReadFile(readme)
	require.NoError(t, err)
	assert.Equal(t, "intro\n\n"+
		"<!-- BEGIN GENERATED perf-summary by go run ./internal/perfplot from docs/perf/scale.csv: do not edit -->\n"+
		"| WebSocket boards | all ready after | bridge RSS right after the burst | bridge RSS once idle |\n"+
		"|---:|---:|---:|---:|\n"+
		"| 2,000 | 2.2 s | 200 MiB | 100 MiB |\n"+
		"| 3,000 | not all in time | 300 MiB | 150 MiB |\n"+
		"<!-- END GENERATED perf-summary -->\n\nafter\n", string(got))

	require.NoError(t, os.WriteFile(readme, []byte("no markers\n"), 0o644))
	assert.ErrorContains(t, run(dir, doc, readme), "no generated section")
	assert.NoError(t, run(dir, doc, ""), "no README to rewrite")
}

// TestMosquittoTable: the plugin comparison is one row per broker and N,
// latencies in ms, RSS in MiB, and a run that missed its deadline or a
// figure that is missing says so instead of showing a number.
func TestMosquittoTable(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "mosquitto.csv")
	rows, err := readMosquitto(path)
	require.NoError(t, err)
	assert.Empty(t, rows, "no file, no runs")
	assert.Empty(t, mosquittoTable(rows), "and no table")
	require.NoError(t, os.WriteFile(path, []byte(
		"broker,n,ready_s,calls,call_errors,p50_us,p99_us,broker_rss_kib,bridge_rss_kib,bridge_rss_burst_kib,ready_n\n"+
			"mosquitto,1000,1.57,1000,0,1645,7316,9664,70540,100020,1000\n"+
			"embedded,1000,1.63,1000,0,1800,8673,,104816,153640,1000\n"+
			"mosquitto,10000,timeout,10000,2,1628,11723,18952,392184,561476,9000\n"+
			"embedded,10000,18.4,,,,,,747284,1035220\n"), 0o644))
	rows, err = readMosquitto(path)
	require.NoError(t, err)
	assert.Equal(t, "\n### Mosquitto with the plugin against the embedded broker (`scripts/mosquitto-plugin-runs.sh`)\n\n"+
		"| broker | boards | ready (s) | calls (errors) | call p50 / p99 (ms) | broker RSS (MiB) | bridge RSS (MiB) | bridge RSS right after the burst (MiB) |\n"+
		"|---|---:|---:|---:|---:|---:|---:|---:|\n"+
		"| Mosquitto + plugin | 1,000 | 1.6 | 1000 (0) | 1.6 / 7.3 | 9 | 69 | 98 |\n"+
		"| embedded | 1,000 | 1.6 | 1000 (0) | 1.8 / 8.7 | in the bridge | 102 | 150 |\n"+
		"| Mosquitto + plugin | 10,000 | not all in time (9000 ready) | 10000 (2) | 1.6 / 11.7 | 19 | 383 | 548 |\n"+
		"| embedded | 10,000 | 18.4 | not measured | – / – | in the bridge | 730 | 1011 |\n", mosquittoTable(rows))
}
