package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/internal/bridgetest"
	"github.com/devicebridge/devicebridge/simulator"
)

// What a hostile board puts in the strings the CLI prints: a window title,
// an OSC 52 clipboard write, a hyperlink, a screen clear, CR/LF that forge
// a line, a C1 CSI, a right-to-left override and a zero-width space.
const (
	hostileBoard  = "bread\x1b]0;owned\x07\r\ndevicebridge: forged line"
	hostileTool   = "self.evil\x1b[2J\u202egnp.exe"
	hostileDesc   = "Looks harmless.\x1b]52;c;Y3VybCBldmlsfHNo\x07 Second\u200b sentence."
	hostileResult = "ok\x1b]8;;http://evil.example/\x07click\x1b]8;;\x07\r\nforged \u009b31m line"
)

// TestHostileBoardStringsAreEscaped: a board whose name, tool name,
// description and result carry terminal escapes and line breaks, through
// the real CLI against a real bridge: devices, show, tools, call and watch
// print every one of them escaped, on the lines they belong to, while
// --json passes them on exactly.
func TestHostileBoardStringsAreEscaped(t *testing.T) {
	br := startBridgeBoards(t, func(*app.Config) {}, "02:00:00:00:00:01")
	env := map[string]string{"DEVICEBRIDGE_URL": br.Base}
	ctx := context.Background()
	// run checks that human output is inert; --json output is the
	// bridge's JSON as it is (JSON leaves bidi and C1 characters raw).
	run := func(args ...string) (int, string, string) {
		t.Helper()
		code, out, errOut := runCLI(t, ctx, env, "", args...)
		if args[0] != "--json" {
			requireInert(t, out)
		}
		requireInert(t, errOut)
		return code, out, errOut
	}

	// watch sees the board arrive and its tool called.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wOut, wErr bridgetest.SyncBuffer
	w := &cli{stdout: newScreen(&wOut), stderr: newScreen(&wErr)}
	done := make(chan int, 1)
	go func() { done <- w.run(wctx, []string{"watch"}, func(k string) string { return env[k] }) }()
	require.Eventually(t, func() bool { return strings.Contains(wErr.String(), "watching") }, 5*time.Second, 10*time.Millisecond)

	profile, err := simulator.LoadProfile("breadboard")
	require.NoError(t, err)
	// The simulator, like the firmware, pastes BOARD_NAME into its JSON
	// unescaped: give it the name as a hostile board would send it.
	name, err := json.Marshal(hostileBoard)
	require.NoError(t, err)
	profile.Board = string(name[1 : len(name)-1])
	profile.Tools = append(profile.Tools, simulator.Tool{Name: hostileTool, Description: hostileDesc,
		Behavior: simulator.BehaviorConst, Text: hostileResult})
	b, err := simulator.NewBoard(simulator.Config{MAC: "02:00:00:00:00:66", Profile: profile})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
	defer ccancel()
	require.NoError(t, b.ConnectWebSocket(cctx, br.App.DeviceURL()))
	require.Eventually(t, func() bool {
		var d board
		return br.get(t, "/api/devices/02:00:00:00:00:66", &d) && d.State == "ready"
	}, 10*time.Second, 20*time.Millisecond, "%s", devSummary(br))

	code, out, _ := run("devices")
	require.Equal(t, exitOK, code)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3, "a header and two boards, no forged line:\n%s", out)
	assert.Contains(t, lines[2], `bread\x1b]0;owned\a\r\ndevicebridge: forged line`)

	code, out, _ = run("show", "66")
	require.Equal(t, exitOK, code)
	assert.Contains(t, out, `board      bread\x1b]0;owned\a\r\ndevicebridge: forged line`+"\n")
	assert.NotContains(t, out, "\ndevicebridge: forged line")

	// The bridge may refuse a tool named like this one; if it lists it,
	// the CLI shows it escaped.
	code, raw, _ := run("--json", "tools", "66")
	require.Equal(t, exitOK, code)
	var tools []tool
	require.NoError(t, json.Unmarshal([]byte(raw), &tools))
	listed := false
	for _, tl := range tools {
		listed = listed || tl.Name == hostileTool
		if tl.Name == hostileTool {
			assert.Equal(t, hostileDesc, tl.Description, "--json passes the board's text on exactly")
		}
	}
	if !listed {
		t.Log("the bridge did not list the tool with the hostile name; only its board and errors are checked")
	}
	code, out, _ = run("tools", "66")
	require.Equal(t, exitOK, code)
	if listed {
		assert.Regexp(t, `(?m)^self\.evil\\x1b\[2J\\u202egnp\.exe +- +Looks harmless\.\\x1b\]52;c;Y3VybCBldmlsfHNo\\a Second\\u200b sentence\.$`, out)
	}

	// An error that quotes the name the user typed, and a board-made one.
	code, _, errOut := run("call", "66", "nope\x1b]0;x\x07")
	assert.Equal(t, exitNotFound, code)
	assert.Contains(t, errOut, `no tool nope\x1b]0;x\a`)

	if listed {
		code, out, _ = run("call", "66", hostileTool)
		require.Equal(t, exitOK, code)
		assert.Equal(t, `ok\x1b]8;;http://evil.example/\aclick\x1b]8;;\a\r\nforged \u009b31m line`+"\n", out)
		code, out, _ = run("--json", "call", "66", hostileTool)
		require.Equal(t, exitOK, code)
		var res callResult
		require.NoError(t, json.Unmarshal([]byte(out), &res))
		assert.Equal(t, hostileResult, res.Content[0].Text)
	}

	require.Eventually(t, func() bool {
		return strings.Contains(wOut.String(), `bread\x1b]0;owned\a\r\ndevicebridge: forged line, `)
	}, 5*time.Second, 10*time.Millisecond, wOut.String())
	if listed {
		require.Eventually(t, func() bool {
			return strings.Contains(wOut.String(), `02:00:00:00:00:66 self.evil\x1b[2J\u202egnp.exe → ok in `)
		}, 5*time.Second, 10*time.Millisecond, wOut.String())
	}
	cancel()
	select {
	case code := <-done:
		assert.Equal(t, exitOK, code)
	case <-time.After(5 * time.Second):
		t.Fatal("watch did not stop")
	}
	requireInert(t, wOut.String())
	requireInert(t, wErr.String())
	for _, l := range strings.Split(strings.TrimSpace(wOut.String()), "\n") {
		assert.Regexp(t, `^\d\d:\d\d:\d\d `, l, "every line of watch is an event of its own")
	}
}

// requireInert fails if s holds anything a terminal would act on other
// than the CLI's own line breaks.
func requireInert(t *testing.T, s string) {
	t.Helper()
	require.True(t, utf8.ValidString(s), "output is UTF-8: %q", s)
	for _, r := range s {
		if r == '\n' {
			continue
		}
		require.False(t, unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp),
			"%U printed raw in %q", r, s)
	}
}

func TestSafe(t *testing.T) {
	for in, want := range map[string]string{
		"plain text, 中文　全角":     "plain text, 中文　全角",
		"a\tb\r\nc":             `a\tb\r\nc`,
		"\x1b]0;t\x07":          `\x1b]0;t\a`,
		"\x7f\u0085\u009b":      `\x7f\u0085\u009b`,
		"\u202eabc\u2066\u200d": `\u202eabc\u2066\u200d`,
		"line\u2028sep":         `line\u2028sep`,
		"bad \x9b byte \xff":    `bad \x9b byte \xff`,
		"tag\U000e0041":         `tag\U000e0041`,
		`back\slash "quoted"`:   `back\slash "quoted"`,
		"é (combining e\u0301)": "é (combining e\u0301)",
	} {
		assert.Equal(t, want, safe(in), "%q", in)
	}
}

func devSummary(br *bridge) string {
	var s []string
	for _, d := range br.App.Hub.Devices() {
		s = append(s, d.DeviceID+" "+d.State.String()+" "+d.InitError+" "+d.CloseReason)
	}
	return strings.Join(s, "; ")
}
