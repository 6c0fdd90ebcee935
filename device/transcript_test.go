package device

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/tools/txtar"

	"github.com/devicebridge/devicebridge/envelope"
	"github.com/devicebridge/devicebridge/internal/testlink"
)

var update = flag.Bool("update", false, "rewrite the expected sections of testdata/*.txtar")

// transcriptBoard is the device id of the board in every transcript.
const transcriptBoard = "aa:bb:cc:dd:ee:01"

// TestTranscripts replays each testdata/*.txtar between a scripted board
// and a Hub over testlink: the board's lines are sent as written, and what
// the bridge sends, what a caller of the Hub gets and the session's state
// are compared with the file. testdata/README.md describes the format;
// -update rewrites the expected sections.
//
// Each file runs in a synctest bubble: after each step the test waits
// until the Hub has nothing left to do but wait for the board, so "what
// the bridge sent" is everything, with no timeout to tune, and no timer
// fires unless a transcript is still waiting when the bubble idles.
func TestTranscripts(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.txtar"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".txtar"), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { runTranscript(t, file) })
		})
	}
}

// transcript is one file being replayed.
type transcript struct {
	t     *testing.T
	hub   *Hub
	link  *testlink.Link // the bridge's end, as a transport hands it over
	board *testlink.Link // the board's end

	session *Session // once the hello is answered

	mu   sync.Mutex
	sent []string // what the bridge sent that no section showed yet

	calls sync.WaitGroup
	call  chan string // the outcome of the call in flight, rendered
}

func runTranscript(t *testing.T, file string) {
	data, err := os.ReadFile(file)
	require.NoError(t, err)
	ar := txtar.Parse(data)
	require.NotEmpty(t, strings.TrimSpace(string(ar.Comment)), "%s: say what the transcript shows before its sections", file)

	tr := &transcript{t: t, hub: newHub(t)}
	tr.link, tr.board = testlink.Pair(32)
	reader := make(chan struct{})
	go func() { // the board's radio: everything the bridge sends
		defer close(reader)
		for {
			msg, err := tr.board.Receive(context.Background())
			if err != nil {
				return
			}
			tr.mu.Lock()
			tr.sent = append(tr.sent, string(msg))
			tr.mu.Unlock()
		}
	}()

	for i := range ar.Files {
		f := &ar.Files[i]
		got, expected := tr.step(f.Name, string(f.Data))
		if !expected {
			continue
		}
		if *update {
			f.Data = []byte(got)
			continue
		}
		assert.Equal(t, string(f.Data), got, "%s: section %d (%s)", file, i+1, f.Name)
	}
	synctest.Wait()
	tr.mu.Lock()
	assert.Empty(t, tr.sent, "%s: the bridge sent more than the last bridge section shows", file)
	tr.mu.Unlock()
	if *update {
		require.NoError(t, os.WriteFile(file, txtar.Format(ar), 0o644))
	}

	tr.board.Close(errors.New("transcript over"))
	<-reader
	tr.calls.Wait()
}

// step plays one section. For a section that shows what happened
// (bridge, returns, session) it returns the rendering and true.
func (tr *transcript) step(name, data string) (string, bool) {
	t := tr.t
	switch name {
	case "board":
		for _, line := range transcriptLines(data) {
			require.NoError(t, tr.board.Send(context.Background(), []byte(line)))
			if tr.session == nil {
				tr.hello()
			}
		}
		return "", false
	case "bridge":
		synctest.Wait()
		tr.mu.Lock()
		defer tr.mu.Unlock()
		got := strings.Join(tr.sent, "\n")
		tr.sent = nil
		if got != "" {
			got += "\n"
		}
		return got, true
	case "call":
		lines := transcriptLines(data)
		require.Len(t, lines, 1, "a call is one line: tool arguments")
		tool, args, _ := strings.Cut(lines[0], " ")
		require.Nil(t, tr.call, "one call at a time; show its outcome in a returns section first")
		tr.call = make(chan string, 1)
		tr.calls.Add(1)
		go func(out chan<- string) {
			defer tr.calls.Done()
			res, err := tr.hub.CallTool(context.Background(), transcriptBoard, tool, json.RawMessage(args))
			if err != nil {
				out <- "error: " + err.Error() + "\n"
				return
			}
			raw, _ := json.Marshal(res) // plain data: it cannot fail
			out <- "result: " + string(raw) + "\n"
		}(tr.call)
		return "", false
	case "returns":
		require.NotNil(t, tr.call, "a returns section follows a call")
		synctest.Wait()
		select {
		case got := <-tr.call:
			tr.call = nil
			return got, true
		default:
			return "(still waiting)\n", true
		}
	case "drop":
		tr.board.Close(errors.New(strings.TrimSpace(data)))
		return "", false
	case "session":
		synctest.Wait()
		require.NotNil(t, tr.session, "a session section follows the hello")
		return renderSession(tr.session), true
	}
	t.Fatalf("unknown section %q (board, bridge, call, returns, drop, session)", name)
	return "", false
}

// hello does what a transport does with a board's first message: it
// answers a hello with the server hello and hands the link to the Hub (a
// board whose hello does not announce MCP gets no MCP session). The
// transports own the real handshake (ws/server.go awaitHello, mqtt); it is
// played here so that a transcript reads as the whole conversation.
func (tr *transcript) hello() {
	t := tr.t
	msg, err := tr.link.Receive(context.Background())
	require.NoError(t, err)
	env, err := envelope.Decode(msg, 64<<10)
	require.NoError(t, err)
	hello, err := envelope.ParseDeviceHello(env)
	require.NoError(t, err, "a transcript's board speaks first, with a hello")
	audio := envelope.DownlinkAudio
	reply := envelope.ServerHello{Transport: "websocket", SessionID: tr.link.SessionID(), AudioParams: &audio}.Marshal()
	require.NoError(t, tr.link.Send(context.Background(), reply))
	tr.session, err = tr.hub.Attach(tr.link, Identity{DeviceID: transcriptBoard, Transport: "websocket", HasMCP: hello.Features.MCP})
	require.NoError(t, err)
}

// renderSession shows what the Hub knows of the board.
func renderSession(s *Session) string {
	info := s.Info()
	var b strings.Builder
	fmt.Fprintf(&b, "state: %s\n", info.State)
	if info.Board != "" || info.FirmwareVersion != "" {
		fmt.Fprintf(&b, "board: %s %s\n", info.Board, info.FirmwareVersion)
	}
	for _, tool := range info.ToolInfos() {
		fmt.Fprintf(&b, "tool: %s", tool.Name)
		if tool.UserOnly {
			b.WriteString(" (user only)")
		}
		b.WriteString("\n")
	}
	for _, r := range info.RefusedTools {
		fmt.Fprintf(&b, "refused tool: %s: %s\n", r.Name, r.Reason)
	}
	if info.InitError != "" {
		fmt.Fprintf(&b, "init error: %s\n", info.InitError)
	}
	if info.CloseReason != "" {
		fmt.Fprintf(&b, "closed: %s (%s)\n", info.CloseReason, info.CloseCause)
	}
	st := s.Stats()
	fmt.Fprintf(&b, "envelopes: %d mcp in, %d mcp out, %d other, %d dropped, %d repaired\n",
		st.MCPIn, st.MCPOut, st.Other, st.Dropped, st.Repaired)
	return b.String()
}

// transcriptLines are a section's lines without blanks and # comments.
func transcriptLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}
