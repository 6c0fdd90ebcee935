package mcpserver_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/tools/txtar"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/simulator"
)

var update = flag.Bool("update", false, "rewrite the expected sections of testdata/wire/*.txtar")

// TestWireTranscripts replays each testdata/wire/*.txtar against a real
// bridge and compares what /mcp answers with the file's "bridge" sections.
// testdata/wire/README.md describes the format. With -update the bridge
// sections are rewritten from what the bridge answered.
func TestWireTranscripts(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "wire", "*.txtar"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, file := range files {
		name := strings.TrimSuffix(filepath.Base(file), ".txtar")
		t.Run(name, func(t *testing.T) { runTranscript(t, file, wireChecks[name]) })
	}
}

// wireChecks holds, per transcript, what the wire cannot show: the
// boards' side of the story. Each is called with the transcript's boards
// before the first exchange and returns the check to run after the last.
var wireChecks = map[string]func(t *testing.T, boards map[string]*simulator.Board) func(){
	// The MRTR rounds ran set_volume on the board exactly once, with the
	// answer of the one round that was accepted; the refused, forged and
	// replayed rounds reached nothing.
	"mrtr": func(t *testing.T, boards map[string]*simulator.Board) func() {
		robot := boards[macC]
		ran := robot.Stats().CallsRun
		return func() {
			assert.EqualValues(t, 33, robot.State()["audio_speaker.volume"])
			assert.Equal(t, ran+1, robot.Stats().CallsRun, "the board ran set_volume once")
		}
	},
}

// An exchange is one HTTP request and the answer expected for it.
type exchange struct {
	client string // the "client" section, as written
	bridge int    // index of its "bridge" section in the archive
}

func runTranscript(t *testing.T, file string, check func(*testing.T, map[string]*simulator.Board) func()) {
	data, err := os.ReadFile(file)
	require.NoError(t, err)
	ar := txtar.Parse(data)
	require.NotEmpty(t, strings.TrimSpace(string(ar.Comment)), "%s: say what the transcript shows before its sections", file)

	b := startBridge(t, nil)
	boards := map[string]*simulator.Board{}
	var exchanges []exchange
	for i, f := range ar.Files {
		switch f.Name {
		case "boards":
			for _, line := range lines(string(f.Data)) {
				mac, profile, ok := strings.Cut(line, " ")
				require.True(t, ok, "%s: a board is \"MAC profile\", not %q", file, line)
				boards[mac] = b.Board(mac, profile, simulator.Config{})
			}
		case "client":
			exchanges = append(exchanges, exchange{client: string(f.Data), bridge: -1})
		case "bridge":
			require.True(t, len(exchanges) > 0 && exchanges[len(exchanges)-1].bridge < 0,
				"%s: a bridge section follows its client section", file)
			exchanges[len(exchanges)-1].bridge = i
		default:
			t.Fatalf("%s: unknown section %q (boards, client, bridge)", file, f.Name)
		}
	}
	after := func() {}
	if check != nil {
		after = check(t, boards)
	}

	v := newPlaceholders()
	for n, ex := range exchanges {
		require.GreaterOrEqual(t, ex.bridge, 0, "%s: exchange %d has no bridge section (write an empty one and run with -update)", file, n+1)
		got := v.normalise(roundTrip(t, b, v, ex.client))
		if *update {
			ar.Files[ex.bridge].Data = []byte(got)
			continue
		}
		assert.Equal(t, string(ar.Files[ex.bridge].Data), got, "%s: exchange %d:\n%s", file, n+1, ex.client)
	}
	if *update {
		require.NoError(t, os.WriteFile(file, txtar.Format(ar), 0o644))
	}
	after()
}

// lines are a section's lines without blanks and # comments.
func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

// roundTrip sends a client section and renders the answer.
func roundTrip(t *testing.T, b *bridge, v *placeholders, section string) string {
	t.Helper()
	// Comments first, then the request line, headers, a blank line, the body.
	var body []string
	head := true
	var reqLine string
	headers := map[string]string{}
	for _, l := range strings.Split(v.expand(t, section), "\n") {
		switch {
		case head && strings.HasPrefix(l, "#"):
		case head && reqLine == "":
			if strings.TrimSpace(l) != "" {
				reqLine = l
			}
		case head && strings.TrimSpace(l) == "":
			head = false
		case head:
			k, val, ok := strings.Cut(l, ":")
			require.True(t, ok, "a header line is \"Name: value\", not %q", l)
			headers[strings.TrimSpace(k)] = strings.TrimSpace(val)
		default:
			body = append(body, l)
		}
	}
	method, path, _ := strings.Cut(reqLine, " ")
	require.Equal(t, "/mcp", path, "a request line is \"METHOD /mcp\", not %q", reqLine)
	ctx, cancel := withTimeout(20e9)
	defer cancel()
	text := strings.TrimSpace(strings.Join(body, "\n"))
	resp := do(b, rawRequest(b, method, text, headers).WithContext(ctx))
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return renderResponse(resp, raw, strings.HasPrefix(text, "["))
}

// shownHeaders are the response headers a transcript shows, in this order;
// the others (Date, Content-Length, ...) say nothing about the protocol.
var shownHeaders = []string{"Content-Type", "Mcp-Session-Id", "WWW-Authenticate", "Retry-After", "Allow"}

// renderResponse writes an answer as a transcript shows it: the status,
// the headers that matter, for an SSE answer the retry field it announces
// (milliseconds), a blank line, then each JSON-RPC message indented (the
// data of each SSE event, or the JSON body), or the body as text when it
// is not JSON.
// The answers to a batch may come in any order (JSON-RPC 2.0, section
// 6), so they are shown by id.
func renderResponse(resp *http.Response, body []byte, batch bool) string {
	var messages []string
	retry := ""
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		events := make(chan sseEvent, 16)
		go readSSE(bytes.NewReader(body), events)
		for ev := range events {
			if ev.Retry != "" && retry == "" {
				retry = ev.Retry
			}
			if ev.Data != "" {
				messages = append(messages, ev.Data)
			}
		}
	} else if len(bytes.TrimSpace(body)) > 0 {
		messages = append(messages, string(body))
	}
	var out strings.Builder
	fmt.Fprintf(&out, "%d %s\n", resp.StatusCode, http.StatusText(resp.StatusCode))
	for _, h := range shownHeaders {
		if val := resp.Header.Get(h); val != "" {
			fmt.Fprintf(&out, "%s: %s\n", h, val)
		}
	}
	if retry != "" {
		fmt.Fprintf(&out, "retry: %s\n", retry)
	}
	out.WriteString("\n")
	if batch {
		slices.SortStableFunc(messages, func(a, b string) int { return strings.Compare(messageID(a), messageID(b)) })
	}
	for _, m := range messages {
		var pretty bytes.Buffer
		if json.Indent(&pretty, []byte(m), "", "  ") == nil {
			out.Write(pretty.Bytes())
		} else {
			out.WriteString(strings.TrimSpace(m))
		}
		out.WriteString("\n")
	}
	return out.String()
}

// messageID is a message's id as JSON text, padded so that numbers sort
// as numbers.
func messageID(m string) string {
	var v struct{ ID json.RawMessage }
	_ = json.Unmarshal([]byte(m), &v)
	return fmt.Sprintf("%20s", v.ID)
}

// placeholders stand for the values that change from run to run: the
// bridge's session ids, interaction ids and request states. Each value
// gets a numbered name when the bridge first shows it (<session-1>,
// <state-2>); client sections use the names to send it back, and
// <tampered state-1> sends state 1 with its last two characters changed.
type placeholders struct {
	byValue map[string]string
	byName  map[string]string
	count   map[string]int
}

func newPlaceholders() *placeholders {
	return &placeholders{byValue: map[string]string{}, byName: map[string]string{}, count: map[string]int{}}
}

// varying finds the values to name, by kind.
var varying = []struct {
	kind string
	re   *regexp.Regexp // the value is the first group
}{
	{"session", regexp.MustCompile(`(?m)^Mcp-Session-Id: (\S+)$`)},
	{"flow", regexp.MustCompile(`\b(flw_[0-9a-f]{32})\b`)},
	{"state", regexp.MustCompile(`"requestState": "([^"]+)"`)},
	{"task", regexp.MustCompile(`"taskId": "([0-9a-f]{32})"`)},
}

// fixed are values that change from run to run but are never sent back:
// they are replaced without a number.
var fixed = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`"expiresAt": [0-9]+`), `"expiresAt": <time>`},
	{regexp.MustCompile(`"(createdAt|lastUpdatedAt)": "[0-9T:.Z-]+"`), `"$1": "<time>"`},
	// The release version, so that a release does not rewrite transcripts.
	{regexp.MustCompile(`"version": "` + regexp.QuoteMeta(app.Version) + `"`), `"version": "<version>"`},
}

func (p *placeholders) normalise(s string) string {
	for _, f := range fixed {
		s = f.re.ReplaceAllString(s, f.with)
	}
	for _, v := range varying {
		for _, m := range v.re.FindAllStringSubmatch(s, -1) {
			if _, ok := p.byValue[m[1]]; !ok {
				p.count[v.kind]++
				p.bind(fmt.Sprintf("<%s-%d>", v.kind, p.count[v.kind]), m[1])
			}
		}
	}
	// Longest first, so that no value is replaced inside a longer one.
	values := make([]string, 0, len(p.byValue))
	for val := range p.byValue {
		values = append(values, val)
	}
	slices.SortFunc(values, func(a, b string) int { return len(b) - len(a) })
	for _, val := range values {
		s = strings.ReplaceAll(s, val, p.byValue[val])
	}
	return s
}

func (p *placeholders) bind(name, value string) {
	p.byName[name], p.byValue[value] = value, name
}

var placeholderRE = regexp.MustCompile(`<(tampered )?([a-z]+-[0-9]+)>`)

// expand replaces the names in a client section by their values.
func (p *placeholders) expand(t *testing.T, s string) string {
	t.Helper()
	return placeholderRE.ReplaceAllStringFunc(s, func(m string) string {
		sub := placeholderRE.FindStringSubmatch(m)
		val, ok := p.byName["<"+sub[2]+">"]
		require.True(t, ok, "%s is used before the bridge showed it", m)
		if sub[1] != "" {
			require.Greater(t, len(val), 2)
			val = val[:len(val)-2] + "AA"
			if val == p.byName["<"+sub[2]+">"] {
				val = val[:len(val)-2] + "BB"
			}
			p.bind(m, val)
		}
		return val
	})
}
