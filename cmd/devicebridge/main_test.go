package main

// End-to-end tests: a real bridge (app, in-process) with simulated boards
// over real WebSocket, and the CLI run against its control listener, both
// in-process and, for what a person does at a terminal (interact, the
// progress indicator), as a process on a pseudo-terminal typed into.

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/internal/bridgetest"
	"github.com/devicebridge/devicebridge/simulator"
)

// TestMain lets the test binary stand in for the devicebridge command, so
// that the pty tests run the real main without a separate build.
func TestMain(m *testing.M) {
	if os.Getenv("DEVICEBRIDGE_CLI_UNDER_TEST") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// bridge is a real bridge (internal/bridgetest) with the CLI's helpers.
type bridge struct{ *bridgetest.Bridge }

// startBridge runs a bridge with boards 02:00:00:00:00:01..03; board 03's
// self.lamp.turn_on takes 1.5 s (the progress indicator).
func startBridge(t *testing.T, tokens ...string) *bridge {
	t.Helper()
	return startBridgeWith(t, func(c *app.Config) { c.Control.Tokens = tokens })
}

// startBridgeWith is startBridge with the configuration adjusted first.
func startBridgeWith(t *testing.T, configure func(*app.Config)) *bridge {
	t.Helper()
	return startBridgeBoards(t, configure, "02:00:00:00:00:01", "02:00:00:00:00:02", "02:00:00:00:00:03")
}

// startBridgeBoards is startBridgeWith with these boards, each ready and
// published before it returns; the third (if any) has the slow lamp.
func startBridgeBoards(t *testing.T, configure func(*app.Config), macs ...string) *bridge {
	t.Helper()
	br := &bridge{bridgetest.Start(t, configure, bridgetest.WithLogger(zap.NewNop()))}
	for i, mac := range macs {
		var c simulator.Config
		if i == 2 {
			c.ToolDelay = map[string]time.Duration{"self.lamp.turn_on": 1500 * time.Millisecond}
		}
		br.Board(mac, "breadboard", c)
	}
	return br
}

func (b *bridge) get(t *testing.T, path string, out any, token ...string) bool {
	req, _ := http.NewRequest("GET", b.Base+path, nil)
	if len(token) > 0 {
		req.Header.Set("Authorization", "Bearer "+token[0])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	return resp.StatusCode == 200 && json.NewDecoder(resp.Body).Decode(out) == nil
}

// volume asks a board for its speaker volume through the control API.
func (b *bridge) volume(t *testing.T, mac string) int {
	t.Helper()
	resp, err := http.Post(b.Base+"/api/devices/"+mac+"/call", "application/json", strings.NewReader(`{"name":"self.get_device_status"}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	var res callResult
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&res))
	var st struct {
		AudioSpeaker struct {
			Volume int `json:"volume"`
		} `json:"audio_speaker"`
	}
	require.NoError(t, json.Unmarshal([]byte(res.Content[0].Text), &st))
	return st.AudioSpeaker.Volume
}

// runCLI runs the command in-process; it returns the exit code, stdout and
// stderr.
func runCLI(t *testing.T, ctx context.Context, env map[string]string, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bridgetest.SyncBuffer
	c := &cli{stdin: strings.NewReader(stdin), stdout: newScreen(&out), stderr: newScreen(&errOut)}
	code := c.run(ctx, args, func(k string) string { return env[k] })
	return code, out.String(), errOut.String()
}

func TestCommands(t *testing.T) {
	br := startBridge(t)
	env := map[string]string{"DEVICEBRIDGE_URL": br.Base}
	ctx := context.Background()
	run := func(stdin string, args ...string) (int, string, string) { return runCLI(t, ctx, env, stdin, args...) }

	t.Run("devices", func(t *testing.T) {
		code, out, _ := run("", "devices")
		require.Equal(t, exitOK, code)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.Len(t, lines, 4, out)
		assert.Regexp(t, `^DEVICE +ALIAS +TRANSPORT +STATE +BOARD +FIRMWARE +TOOLS +CONNECTED$`, lines[0])
		assert.Regexp(t, `^02:00:00:00:00:01 +dev_000001 +websocket +ready +bread-compact-wifi +2\.4\.2 +13 +\d+s ago$`, lines[1])

		code, out, _ = run("", "--json", "devices")
		require.Equal(t, exitOK, code)
		var list struct {
			Devices []board `json:"devices"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &list))
		assert.Len(t, list.Devices, 3)
	})

	t.Run("show and tools name boards by MAC, digits or alias", func(t *testing.T) {
		for _, name := range []string{"02:00:00:00:00:02", "02-00-00-00-00-02", "02", "00:02", "dev_000002", "DEV_000002"} {
			code, out, errOut := run("", "show", name)
			require.Equal(t, exitOK, code, "%s: %s", name, errOut)
			assert.Contains(t, out, "device     02:00:00:00:00:02\n", name)
			assert.Contains(t, out, "self.audio_speaker.set_volume  volume:int(0..100)", name)
		}
		code, out, _ := run("", "tools", "01")
		require.Equal(t, exitOK, code)
		assert.Regexp(t, `(?m)^self\.reboot +- +user-only +Restart the board\.$`, out)
		code, out, _ = run("", "tools", "01", "--json")
		require.Equal(t, exitOK, code)
		var tools []tool
		require.NoError(t, json.Unmarshal([]byte(out), &tools))
		assert.Equal(t, "self.get_device_status", tools[0].Name, "device order")
	})

	t.Run("unknown boards and tools say what was meant", func(t *testing.T) {
		code, _, errOut := run("", "show", "00:0x")
		assert.Equal(t, exitNotFound, code)
		assert.Equal(t, "devicebridge: no board 00:0x; did you mean 02:00:00:00:00:01 or 02:00:00:00:00:02 or 02:00:00:00:00:03?\n", errOut)
		code, _, errOut = run("", "show", "dev_00003")
		assert.Equal(t, exitNotFound, code)
		assert.Contains(t, errOut, "no board dev_00003; did you mean dev_000003?")
		code, _, errOut = run("", "call", "01", "set_volum", "volume=3")
		assert.Equal(t, exitNotFound, code)
		assert.Contains(t, errOut, "has no tool set_volum; did you mean self.audio_speaker.set_volume?")
		code, _, errOut = run("", "call", "01", "set_volume", "vol=3")
		assert.Equal(t, exitInvalidArgs, code)
		assert.Contains(t, errOut, "has no argument vol; did you mean volume?")
		code, _, errOut = run("", "frobnicate")
		assert.Equal(t, exitUsage, code)
		assert.Contains(t, errOut, "unknown command")
		code, _, errOut = run("", "call", "0", "get_device_status")
		assert.Equal(t, exitNotFound, code)
		assert.Equal(t, "devicebridge: no board 0; did you mean 02:00:00:00:00:01 or 02:00:00:00:00:02 or 02:00:00:00:00:03?\n", errOut,
			"each board once, not by MAC and again by alias")
	})

	t.Run("extra arguments are refused", func(t *testing.T) {
		for _, args := range [][]string{{"devices", "extra-arg"}, {"show", "01", "02"}, {"tools", "01", "x"}, {"watch", "now"}, {"approvals", "x"}, {"approve", "1", "2"}} {
			code, out, errOut := run("", args...)
			assert.Equal(t, exitUsage, code, "%v", args)
			assert.Empty(t, out, "%v", args)
			assert.Contains(t, errOut, "unexpected argument", "%v", args)
		}
		_, _, errOut := run("", "devices", "extra-arg")
		assert.Equal(t, "devicebridge: devices: unexpected argument \"extra-arg\" (usage: devicebridge devices)\n", errOut)
	})

	t.Run("a tool is named by a unique ending", func(t *testing.T) {
		code, out, errOut := run("", "call", "01", "theme", "theme=dark")
		require.Equal(t, exitOK, code, errOut)
		assert.Equal(t, "true\n", out, "theme is self.screen.set_theme")
		code, _, errOut = run("", "call", "01", "volume", "volume=33")
		require.Equal(t, exitOK, code, errOut)
		assert.Equal(t, 33, br.volume(t, "02:00:00:00:00:01"))
		code, _, errOut = run("", "call", "01", "info")
		assert.Equal(t, exitNotFound, code, "info ends several tools")
		assert.Contains(t, errOut, `"info" matches 2 tools`)
	})

	t.Run("a default that is prose is no default", func(t *testing.T) {
		code, out, _ := run("", "tools", "01")
		require.Equal(t, exitOK, code)
		assert.Regexp(t, `(?m)^self\.upgrade_firmware +\[url:string\] `, out)
		assert.NotContains(t, out, "The URL of")
		assert.Regexp(t, `(?m)^self\.screen\.snapshot +url:string \[quality:int\(1\.\.100\)=80\] `, out, "a real default stays")

		code, _, errOut := run("", "interact", "01", "snapshot")
		assert.Equal(t, exitNotRun, code)
		assert.Contains(t, errOut, "url: a URL.")
		assert.Contains(t, errOut, "url (e.g. http://example.com/file)> ")
	})

	t.Run("call types arguments from the schema", func(t *testing.T) {
		code, out, errOut := run("", "call", "01", "set_volume", "volume=35")
		require.Equal(t, exitOK, code, errOut)
		assert.Equal(t, "true\n", out)
		assert.Equal(t, 35, br.volume(t, "02:00:00:00:00:01"))

		code, _, errOut = run("", "call", "01", "set_volume", "volume=loud")
		assert.Equal(t, exitInvalidArgs, code)
		assert.Contains(t, errOut, "volume is a whole number from 0 to 100")
		code, _, errOut = run("", "call", "01", "set_volume", "volume=300")
		assert.Equal(t, exitInvalidArgs, code, "refused by the bridge before the board")
		assert.Contains(t, errOut, "above the maximum of 100")
		assert.Equal(t, `devicebridge: Invalid arguments for self.audio_speaker.set_volume; nothing was sent to the board.
  - argument "volume" is 300, above the maximum of 100 (an integer from 0 to 100)
  Call it again with arguments like volume=100.
`, errOut, "one problem a line; the example as the command line takes it")
		code, _, errOut = run("", "call", "01", "get_device_status", "x:=1")
		assert.Equal(t, exitInvalidArgs, code)
		assert.Contains(t, errOut, "self.get_device_status takes no arguments")
		code, out, _ = run("", "call", "01", "self.audio_speaker.set_volume", "volume:=36", "--json")
		require.Equal(t, exitOK, code)
		assert.JSONEq(t, `{"content":[{"type":"text","text":"true"}],"isError":false}`, out)
		assert.Equal(t, 36, br.volume(t, "02:00:00:00:00:01"))
		code, out, _ = run("", "call", "01", "get_device_status")
		require.Equal(t, exitOK, code)
		assert.Contains(t, out, `"volume":36`)
	})

	t.Run("interact from piped answers", func(t *testing.T) {
		code, out, errOut := run("150\n41\n", "interact", "02", "set_volume")
		require.Equal(t, exitOK, code, errOut)
		assert.Equal(t, "true\n", out)
		assert.Contains(t, errOut, "above the maximum of 100")
		assert.Equal(t, 41, br.volume(t, "02:00:00:00:00:02"))

		code, _, errOut = run("", "interact", "02", "set_volume")
		assert.Equal(t, exitNotRun, code, "input ended before the answer")
		assert.Contains(t, errOut, "nothing was sent to the board")
	})

	t.Run("unreachable bridge", func(t *testing.T) {
		for _, cmd := range []string{"devices", "watch"} {
			code, _, errOut := run("", "--bridge", "http://127.0.0.1:1", cmd)
			assert.Equal(t, exitUnreachable, code, cmd)
			assert.Contains(t, errOut, "cannot reach the bridge at http://127.0.0.1:1", cmd)
			assert.Contains(t, errOut, "start it with `go run ./cmd/bridge`", cmd)
		}
	})

	t.Run("a listener that is not the control API", func(t *testing.T) {
		device := "http://" + br.App.DeviceAddr().String()
		for _, cmd := range []string{"devices", "watch", "approvals"} {
			code, _, errOut := run("", "--bridge", device, cmd)
			assert.Equal(t, exitUnreachable, code, cmd)
			assert.Contains(t, errOut, device+" does not look like a devicebridge control API (404 on /api/", cmd)
			assert.Contains(t, errOut, "the control listener is on 127.0.0.1:8080 by default: set --bridge or DEVICEBRIDGE_URL", cmd)
		}
	})

	t.Run("watch", func(t *testing.T) {
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var out, errOut bridgetest.SyncBuffer
		c := &cli{stdout: newScreen(&out), stderr: newScreen(&errOut)}
		done := make(chan int, 1)
		go func() { done <- c.run(wctx, []string{"watch"}, func(k string) string { return env[k] }) }()
		require.Eventually(t, func() bool { return strings.Contains(errOut.String(), "watching") }, 5*time.Second, 10*time.Millisecond)
		code, _, _ := run("", "call", "03", "lamp.get_state")
		require.Equal(t, exitOK, code)
		require.Eventually(t, func() bool {
			return strings.Contains(out.String(), "call          02:00:00:00:00:03 self.lamp.get_state → ok in ")
		}, 5*time.Second, 10*time.Millisecond, out.String())
		cancel()
		select {
		case code := <-done:
			assert.Equal(t, exitOK, code)
		case <-time.After(5 * time.Second):
			t.Fatal("watch did not stop")
		}
	})
}

func TestToken(t *testing.T) {
	br := startBridge(t, "s3cret")
	code, _, errOut := runCLI(t, context.Background(), map[string]string{"DEVICEBRIDGE_URL": br.Base}, "", "devices")
	assert.Equal(t, exitUnreachable, code)
	assert.Contains(t, errOut, "set DEVICEBRIDGE_TOKEN")
	code, out, _ := runCLI(t, context.Background(), map[string]string{"DEVICEBRIDGE_URL": br.Base, "DEVICEBRIDGE_TOKEN": "s3cret"}, "", "devices")
	assert.Equal(t, exitOK, code)
	assert.Contains(t, out, "02:00:00:00:00:03")
}

// TestPolicyAppliesToTheCLI: with a policy, each named token sees and
// drives only its own board through the CLI, like /mcp and the control API.
func TestPolicyAppliesToTheCLI(t *testing.T) {
	policyFile := filepath.Join(t.TempDir(), "policy.yaml")
	require.NoError(t, os.WriteFile(policyFile, []byte(`identities:
  kitchen:
    boards: ["02:00:00:00:00:01"]
  office:
    boards: ["02:00:00:00:00:02"]
    tools: ["self.get_device_status"]
`), 0o600))
	br := startBridgeWith(t, func(c *app.Config) {
		c.Control.Tokens = []string{"kitchen=k-secret", "office=o-secret"}
		c.Auth.PolicyFile = policyFile
	})
	as := func(token string, args ...string) (int, string, string) {
		return runCLI(t, context.Background(), map[string]string{"DEVICEBRIDGE_URL": br.Base, "DEVICEBRIDGE_TOKEN": token}, "", args...)
	}
	code, out, _ := as("k-secret", "devices")
	require.Equal(t, exitOK, code)
	assert.Contains(t, out, "02:00:00:00:00:01")
	assert.NotContains(t, out, "02:00:00:00:00:02", "kitchen does not see the office board")

	code, _, errOut := as("k-secret", "call", "02:00:00:00:00:02", "self.get_device_status")
	assert.NotEqual(t, exitOK, code, "kitchen cannot call the office board: %s", errOut)

	// A tool the policy withholds is absent from office's view of the board.
	code, _, errOut = as("o-secret", "call", "02:00:00:00:00:02", "self.lamp.turn_on")
	assert.NotEqual(t, exitOK, code)
	assert.Contains(t, errOut, "has no tool self.lamp.turn_on")
	code, out, errOut = as("o-secret", "call", "02:00:00:00:00:02", "self.get_device_status")
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "audio_speaker")
}

// term is the CLI as a process on a pseudo-terminal.
type term struct {
	t    *testing.T
	f    *os.File
	cmd  *exec.Cmd
	out  bridgetest.SyncBuffer
	seen int
	done chan struct{}
}

func startTerm(t *testing.T, base string, args ...string) *term {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "DEVICEBRIDGE_CLI_UNDER_TEST=1", "DEVICEBRIDGE_URL="+base)
	f, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 40, Cols: 200})
	require.NoError(t, err)
	tm := &term{t: t, f: f, cmd: cmd, done: make(chan struct{})}
	go func() { _, _ = io.Copy(&tm.out, f); close(tm.done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = f.Close() })
	return tm
}

// expect waits for s to appear after what earlier expects consumed.
func (tm *term) expect(s string) {
	tm.t.Helper()
	shown := func() bool { return strings.Contains(tm.out.String()[tm.seen:], s) }
	if !assert.Eventually(tm.t, shown, 10*time.Second, 10*time.Millisecond, "terminal never showed %q", s) {
		tm.t.Fatalf("the terminal shows:\n%s", tm.out.String())
	}
	// The output only grows: the first match after seen is still there.
	tm.seen += strings.Index(tm.out.String()[tm.seen:], s) + len(s)
}

// typeLine types a line and Enter, a key at a time.
func (tm *term) typeLine(s string) {
	for _, r := range s + "\r" {
		_, err := tm.f.Write([]byte(string(r)))
		require.NoError(tm.t, err)
		time.Sleep(5 * time.Millisecond)
	}
}

func (tm *term) exitCode() int {
	tm.t.Helper()
	err := tm.cmd.Wait()
	<-tm.done
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	require.NoError(tm.t, err)
	return 0
}

func TestInteractOnATerminal(t *testing.T) {
	br := startBridge(t)

	t.Run("a missing argument is asked, a bad answer asked again", func(t *testing.T) {
		tm := startTerm(t, br.Base, "interact", "dev_000003", "set_volume")
		tm.expect("self.audio_speaker.set_volume on 02:00:00:00:00:03")
		tm.expect("volume: a whole number from 0 to 100.")
		tm.expect("volume (0..100)> ")
		tm.typeLine("150")
		tm.expect("✗ argument \"volume\" is 150, above the maximum of 100")
		tm.expect("volume (0..100)> ")
		tm.typeLine("42")
		tm.expect("true")
		assert.Equal(t, exitOK, tm.exitCode())
		assert.Equal(t, 42, br.volume(t, "02:00:00:00:00:03"))
	})

	t.Run("a dangerous tool is confirmed; no sends nothing", func(t *testing.T) {
		tm := startTerm(t, br.Base, "interact", "01", "reboot")
		tm.expect("Run self.reboot on dev_000001? The board restarts: it is offline until it reconnects.\r\n")
		tm.expect("yes/no> ")
		tm.typeLine("maybe")
		tm.expect("answer yes or no")
		tm.typeLine("no")
		tm.expect("Declined: self.reboot was not run.")
		assert.Equal(t, exitNotRun, tm.exitCode())
		var d board
		require.True(t, br.get(t, "/api/devices/02:00:00:00:00:01", &d))
		assert.Equal(t, "ready", d.State)
	})

	t.Run("a call over a second shows progress", func(t *testing.T) {
		tm := startTerm(t, br.Base, "call", "03", "lamp.turn_on")
		tm.expect("calling self.lamp.turn_on on 02:00:00:00:00:03… 1.")
		tm.expect("true")
		assert.Equal(t, exitOK, tm.exitCode())
	})
}

// TestApprovals: with --ota-approval, a board that calls the OTA endpoint
// waits with a code on its screen; approvals lists it, approve admits it by
// that code (or its MAC), through the control API's credentials.
func TestApprovals(t *testing.T) {
	br := startBridgeBoards(t, func(c *app.Config) {
		c.OTA.Approval = true
		c.Control.Tokens = []string{"s3cret"}
	})
	env := map[string]string{"DEVICEBRIDGE_URL": br.Base, "DEVICEBRIDGE_TOKEN": "s3cret"}
	run := func(args ...string) (int, string, string) { return runCLI(t, context.Background(), env, "", args...) }

	code, out, errOut := run("approvals")
	require.Equal(t, exitOK, code, errOut)
	assert.Regexp(t, `^approval is on: 0 boards wait \(at most \d+\)\nno board has called the OTA endpoint yet\n$`, out)

	const mac = "02:00:00:00:0a:01"
	req, err := http.NewRequest("POST", br.App.OTAURL(), strings.NewReader(`{"application":{"version":"2.4.2"},"board":{"type":"bread-compact-wifi"},"mac_address":"`+mac+`"}`))
	require.NoError(t, err)
	req.Header.Set("Device-Id", mac)
	req.Header.Set("Client-Id", "1f0a0b0c-0000-4000-8000-0000000000a1")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	var answer struct {
		Activation struct {
			Code string `json:"code"`
		} `json:"activation"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&answer))
	resp.Body.Close()
	require.NotEmpty(t, answer.Activation.Code, "the board waits with a code")

	code, out, errOut = run("approvals")
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "approval is on: 1 board waits")
	assert.Regexp(t, `(?m)^ADMISSION +CODE +DEVICE +BOARD +FIRMWARE +TRANSPORT +FIRST SEEN +LAST SEEN$`, out)
	assert.Regexp(t, `(?m)^pending +`+answer.Activation.Code+` +`+mac+` `, out)
	assert.Contains(t, out, "\n\nadmit one with: devicebridge approve <code or MAC>\n")

	code, _, errOut = run("approve", "000000")
	assert.Equal(t, exitNotFound, code)
	assert.Contains(t, errOut, "no board with the activation code or MAC 000000 is waiting")

	code, out, errOut = run("approve", answer.Activation.Code)
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "approved "+mac)
	code, out, _ = run("approvals")
	require.Equal(t, exitOK, code)
	assert.Regexp(t, `(?m)^approved +- +`+mac+` `, out)

	code, out, _ = run("--json", "approvals")
	require.Equal(t, exitOK, code)
	var list struct {
		Devices []struct {
			DeviceID  string `json:"device_id"`
			Admission string `json:"admission"`
		} `json:"devices"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &list))
	require.Len(t, list.Devices, 1)
	assert.Equal(t, "approved", list.Devices[0].Admission)

	// The control API's credentials guard approvals as the rest of /api.
	code, _, errOut = runCLI(t, context.Background(), map[string]string{"DEVICEBRIDGE_URL": br.Base}, "", "approve", mac)
	assert.Equal(t, exitUnreachable, code)
	assert.Contains(t, errOut, "set DEVICEBRIDGE_TOKEN")
}

// TestApprovalsWithoutOTA: a bridge without the OTA endpoint says so.
func TestApprovalsWithoutOTA(t *testing.T) {
	br := startBridgeBoards(t, func(c *app.Config) { c.OTA.Enabled = false })
	code, _, errOut := runCLI(t, context.Background(), map[string]string{"DEVICEBRIDGE_URL": br.Base}, "", "approvals")
	assert.Equal(t, exitFailed, code)
	assert.Contains(t, errOut, "the bridge serves no OTA endpoint")
}
