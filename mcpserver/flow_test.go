package mcpserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/flow"
	"github.com/devicebridge/devicebridge/simulator"
)

// MCP Flow methods as a client sends them (go-sdk custom methods).

type startParams struct {
	mcp.ParamsBase
	ToolName      string `json:"toolName"`
	InitialParams any    `json:"initialParams,omitempty"`
}

type respondParams struct {
	mcp.ParamsBase
	SessionID string `json:"sessionId"`
	Response  struct {
		Value any `json:"value"`
	} `json:"response"`
}

type idParams struct {
	mcp.ParamsBase
	SessionID string `json:"sessionId"`
	Reason    string `json:"reason,omitempty"`
}

type stepResult struct {
	mcp.ResultBase
	flow.Step
}

type stateResult struct {
	mcp.ResultBase
	flow.Snapshot
}

type cancelResult struct {
	mcp.ResultBase
	Cancelled bool `json:"cancelled"`
}

type capsResult struct {
	mcp.ResultBase
	Interactive bool            `json:"interactive"`
	Version     string          `json:"version"`
	Features    map[string]bool `json:"features"`
}

// flowClient registers the Flow methods on a client's options.
func flowClient(opts *mcp.ClientOptions) *mcp.ClientOptions {
	if opts == nil {
		opts = &mcp.ClientOptions{}
	}
	return opts
}

// flowSession connects a client of era that can call interaction.*.
func flowSession(b *bridge, era string, opts *mcp.ClientOptions, hc *http.Client) *mcp.ClientSession {
	b.T.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "flow-host", Version: "1"}, flowClient(opts))
	require.NoError(b.T, mcp.AddSendingCustomMethod[*capsParams, *capsResult](c, "capabilities"))
	require.NoError(b.T, mcp.AddSendingCustomMethod[*startParams, *stepResult](c, "interaction.start"))
	require.NoError(b.T, mcp.AddSendingCustomMethod[*respondParams, *stepResult](c, "interaction.respond"))
	require.NoError(b.T, mcp.AddSendingCustomMethod[*idParams, *stateResult](c, "interaction.getState"))
	require.NoError(b.T, mcp.AddSendingCustomMethod[*idParams, *cancelResult](c, "interaction.cancel"))
	ctx, cancel := withTimeout(10 * time.Second)
	defer cancel()
	if hc == nil {
		hc = b.HTTP
	}
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: b.URL, HTTPClient: hc, MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: era})
	require.NoError(b.T, err)
	b.T.Cleanup(func() { _ = cs.Close() })
	return cs
}

type capsParams struct{ mcp.ParamsBase }

func flowStart(t *testing.T, cs *mcp.ClientSession, tool string, initial any) (*stepResult, error) {
	t.Helper()
	ctx, cancel := withTimeout(20 * time.Second)
	defer cancel()
	return mcp.CallCustomMethod[*startParams, *stepResult](ctx, cs, "interaction.start", &startParams{ToolName: tool, InitialParams: initial})
}

func flowRespond(t *testing.T, cs *mcp.ClientSession, id string, value any) (*stepResult, error) {
	t.Helper()
	ctx, cancel := withTimeout(20 * time.Second)
	defer cancel()
	p := &respondParams{SessionID: id}
	p.Response.Value = value
	return mcp.CallCustomMethod[*respondParams, *stepResult](ctx, cs, "interaction.respond", p)
}

func flowGetState(t *testing.T, cs *mcp.ClientSession, id string) (*stateResult, error) {
	t.Helper()
	ctx, cancel := withTimeout(10 * time.Second)
	defer cancel()
	return mcp.CallCustomMethod[*idParams, *stateResult](ctx, cs, "interaction.getState", &idParams{SessionID: id})
}

func flowCancel(t *testing.T, cs *mcp.ClientSession, id string) (*cancelResult, error) {
	t.Helper()
	ctx, cancel := withTimeout(10 * time.Second)
	defer cancel()
	return mcp.CallCustomMethod[*idParams, *cancelResult](ctx, cs, "interaction.cancel", &idParams{SessionID: id, Reason: "test"})
}

// requireRPCCode checks that err is a JSON-RPC error with code.
//
// go-sdk's client reads -32003 and -32004 as its own "client/server is
// closing" codes and reports them as mcp.ErrConnectionClosed with the
// server's message as text (the code itself is lost; the session stays
// usable). The raw HTTP test pins those codes on the wire.
func requireRPCCode(t *testing.T, err error, code int64) *jsonrpc.Error {
	t.Helper()
	require.Error(t, err)
	if code == flow.CodeInvalidStateTransition || code == flow.CodeValidationFailed {
		require.ErrorIs(t, err, mcp.ErrConnectionClosed, "go-sdk's reading of code %d", code)
		return &jsonrpc.Error{Code: code, Message: err.Error()}
	}
	var je *jsonrpc.Error
	require.True(t, errors.As(err, &je), "not a JSON-RPC error: %v", err)
	require.Equal(t, code, je.Code, je.Message)
	return je
}

// TestFlowSetVolume is the walk-through, in both eras:
// interaction.start on set_volume with no arguments → a number prompt
// 0..100 → 150 refused with a suggestion → 40 accepted → completed with
// the board's result, and the board's volume is 40.
func TestFlowSetVolume(t *testing.T) {
	b := startBridge(t, nil)
	robot := b.Board(macC, "robot", simulator.Config{})
	tool := upstreamName(macC, "self.audio_speaker.set_volume")

	for i, era := range eras {
		t.Run(era, func(t *testing.T) {
			cs := flowSession(b, era, nil, nil)
			ctx, cancel := withTimeout(10 * time.Second)
			defer cancel()
			caps, err := mcp.CallCustomMethod[*capsParams, *capsResult](ctx, cs, "capabilities", &capsParams{})
			require.NoError(t, err)
			assert.True(t, caps.Interactive)
			assert.Equal(t, "0.1.0", caps.Version)
			assert.True(t, caps.Features["statefulSessions"])
			assert.False(t, caps.Features["sessionPersistence"])

			st, err := flowStart(t, cs, tool, nil)
			require.NoError(t, err)
			require.Equal(t, flow.StateWaitingUser, st.State)
			p := st.InitialPrompt
			require.NotNil(t, p)
			assert.Equal(t, flow.PromptNumber, p.Type)
			assert.Equal(t, "volume", p.Property)
			require.NotNil(t, p.Validation)
			require.NotNil(t, p.Validation.Min)
			require.NotNil(t, p.Validation.Max)
			assert.EqualValues(t, 0, *p.Validation.Min)
			assert.EqualValues(t, 100, *p.Validation.Max)
			require.NotNil(t, st.Progress)
			assert.Equal(t, 1, st.Progress.Total)
			id := st.SessionID

			st, err = flowRespond(t, cs, id, 150)
			require.NoError(t, err)
			require.NotNil(t, st.Accepted)
			assert.False(t, *st.Accepted)
			require.NotNil(t, st.Validation)
			assert.False(t, st.Validation.Valid)
			assert.Contains(t, st.Validation.Error, "above the maximum of 100")
			assert.Contains(t, st.Validation.Suggestion, "from 0 to 100")
			require.NotNil(t, st.NextPrompt, "the same prompt is offered again")
			assert.Equal(t, "volume", st.NextPrompt.Property)
			assert.Equal(t, flow.StateWaitingUser, st.State)

			want := 40 + i // a different volume per era, so each run is seen on the board
			st, err = flowRespond(t, cs, id, want)
			require.NoError(t, err)
			assert.True(t, *st.Accepted)
			assert.Equal(t, flow.StateCompleted, st.State)
			require.NotNil(t, st.Result)
			assert.True(t, st.Result.Success)
			assert.Equal(t, "true", st.Result.Text, "the board's own answer")
			assert.NotEmpty(t, st.Summary)
			assert.EqualValues(t, want, robot.State()["audio_speaker.volume"])

			snap, err := flowGetState(t, cs, id)
			require.NoError(t, err)
			assert.Equal(t, flow.StateCompleted, snap.State)
			assert.Equal(t, tool, snap.Metadata.ToolName)
			require.Len(t, snap.History, 2)
			assert.False(t, snap.History[0].Response.Accepted)

			// Finished: no more answers, and it cannot be cancelled.
			_, err = flowRespond(t, cs, id, 50)
			je := requireRPCCode(t, err, flow.CodeInvalidStateTransition)
			assert.Contains(t, je.Message, "is not waiting for an answer")
			_, err = flowCancel(t, cs, id)
			requireRPCCode(t, err, flow.CodeInvalidStateTransition)
			_, err = flowGetState(t, cs, id)
			require.NoError(t, err, "the session is still usable")
		})
	}
}

// TestFlowInteractionsAreTheCallers: a second client can neither read,
// answer nor cancel the first client's interaction (-32001, as for an id
// that does not exist): another session in the session-based era,
// another token in the stateless era.
func TestFlowInteractionsAreTheCallers(t *testing.T) {
	b := startBridge(t, func(c *app.Config) { c.MCP.Tokens = []string{"token-alice", "token-bob"} })
	robot := b.Board(macC, "robot", simulator.Config{})
	tool := upstreamName(macC, "self.audio_speaker.set_volume")
	alice, bob := tokenHTTP(t, "token-alice"), tokenHTTP(t, "token-bob")

	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			first := flowSession(b, era, nil, alice)
			second := flowSession(b, era, nil, bob)
			st, err := flowStart(t, first, tool, map[string]any{})
			require.NoError(t, err)
			id := st.SessionID

			_, err = flowGetState(t, second, id)
			je := requireRPCCode(t, err, flow.CodeSessionNotFound)
			assert.Contains(t, je.Message, "interaction.start", "the error says what to do instead")
			_, err = flowRespond(t, second, id, 10)
			requireRPCCode(t, err, flow.CodeSessionNotFound)
			_, err = flowCancel(t, second, id)
			requireRPCCode(t, err, flow.CodeSessionNotFound)

			// The owner is unaffected and can still cancel it; twice is -32006.
			snap, err := flowGetState(t, first, id)
			require.NoError(t, err)
			assert.Equal(t, flow.StateWaitingUser, snap.State)
			res, err := flowCancel(t, first, id)
			require.NoError(t, err)
			assert.True(t, res.Cancelled)
			_, err = flowCancel(t, first, id)
			requireRPCCode(t, err, flow.CodeAlreadyCancelled)
			assert.NotEqualValues(t, 10, robot.State()["audio_speaker.volume"])
		})
	}
	// Another session of the same token is another caller too.
	other := flowSession(b, legacy, nil, alice)
	mine := flowSession(b, legacy, nil, alice)
	st, err := flowStart(t, mine, tool, nil)
	require.NoError(t, err)
	_, err = flowGetState(t, other, st.SessionID)
	requireRPCCode(t, err, flow.CodeSessionNotFound)
}

func tokenHTTP(t *testing.T, token string) *http.Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: bearerTransport{token: token, next: tr}}
}

type bearerTransport struct {
	token string
	next  http.RoundTripper
}

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// elicitor is a scripted user behind a client's ElicitationHandler.
type elicitor struct {
	mu      sync.Mutex
	asked   []*mcp.ElicitParams
	answers []*mcp.ElicitResult
}

func (e *elicitor) handle(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.asked = append(e.asked, req.Params)
	if len(e.answers) == 0 {
		return &mcp.ElicitResult{Action: "cancel"}, nil
	}
	a := e.answers[0]
	e.answers = e.answers[1:]
	return a, nil
}

func (e *elicitor) questions() []*mcp.ElicitParams {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]*mcp.ElicitParams(nil), e.asked...)
}

// schemaOf renders a requested schema as a map.
func schemaOf(t *testing.T, p *mcp.ElicitParams) map[string]any {
	t.Helper()
	raw, err := json.Marshal(p.RequestedSchema)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(raw, &m))
	return m
}

// TestElicitMissingArgumentBothEras: the same tools/call without its
// required argument is completed through elicitation: an
// elicitation/create request in the session-based era, an MRTR
// input_required round in the stateless one (both fulfilled by the go-sdk
// client's ElicitationHandler).
func TestElicitMissingArgumentBothEras(t *testing.T) {
	b := startBridge(t, nil)
	robot := b.Board(macC, "robot", simulator.Config{})
	tool := upstreamName(macC, "self.audio_speaker.set_volume")
	for i, era := range eras {
		t.Run(era, func(t *testing.T) {
			want := 60 + i
			user := &elicitor{answers: []*mcp.ElicitResult{{Action: "accept", Content: map[string]any{"volume": want}}}}
			cs := b.Client(era, &mcp.ClientOptions{ElicitationHandler: user.handle})
			res := callTool(t, cs, tool, map[string]any{})
			require.False(t, res.IsError, text(res))
			assert.Equal(t, "true", text(res))
			assert.EqualValues(t, want, robot.State()["audio_speaker.volume"])

			asked := user.questions()
			require.Len(t, asked, 1)
			assert.Contains(t, asked[0].Message, "volume")
			s := schemaOf(t, asked[0])
			vol := s["properties"].(map[string]any)["volume"].(map[string]any)
			assert.Equal(t, "integer", vol["type"])
			assert.EqualValues(t, 0, vol["minimum"])
			assert.EqualValues(t, 100, vol["maximum"])
			assert.Equal(t, []any{"volume"}, s["required"])

			// A user who dismisses the form: nothing reaches the board.
			user.answers = []*mcp.ElicitResult{{Action: "cancel"}}
			res = callTool(t, cs, tool, map[string]any{"volume": "loud"})
			assert.Contains(t, text(res), "Not run")
			assert.EqualValues(t, want, robot.State()["audio_speaker.volume"])
			asked = user.questions()
			assert.Contains(t, asked[len(asked)-1].Message, "Not accepted", "the form says why the value given was refused")
		})
	}
}

// TestNoElicitationGetsTheHelpfulError: a client that declared no
// elicitation is never asked; it gets today's teaching isError, and a
// dangerous tool is refused until the call says "confirm": true.
func TestNoElicitationGetsTheHelpfulError(t *testing.T) {
	b := startBridge(t, func(c *app.Config) { c.MCP.ShowUserOnlyTools = true })
	robot := b.Board(macC, "robot", simulator.Config{})
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			cs := b.Client(era, nil)
			res := callTool(t, cs, upstreamName(macC, "self.audio_speaker.set_volume"), map[string]any{"volume": "loud"})
			require.True(t, res.IsError)
			assert.Contains(t, text(res), `argument "volume" must be an integer from 0 to 100, but got the string "loud"`)

			res = callTool(t, cs, upstreamName(macC, "self.reboot"), map[string]any{})
			require.True(t, res.IsError)
			assert.Contains(t, text(res), "needs the user's confirmation")
			assert.Contains(t, text(res), `"confirm":true`, "with an example call")
			assert.Zero(t, robot.Stats().Reboots, "nothing reached the board")
		})
	}
	// With the user's yes asserted, it runs.
	cs := b.Client(legacy, nil)
	callTool(t, cs, upstreamName(macC, "self.reboot"), map[string]any{"confirm": true})
	require.Eventually(t, func() bool { return robot.Stats().Reboots == 1 }, 10*time.Second, 5*time.Millisecond)
}

// TestRebootAsksAndDeclineLeavesBoardRunning: reboot via tools/call asks
// for confirmation (a boolean form), in both eras; declining leaves the
// board running.
func TestRebootAsksAndDeclineLeavesBoardRunning(t *testing.T) {
	b := startBridge(t, func(c *app.Config) { c.MCP.ShowUserOnlyTools = true })
	robot := b.Board(macC, "robot", simulator.Config{})
	tool := upstreamName(macC, "self.reboot")
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			user := &elicitor{answers: []*mcp.ElicitResult{{Action: "accept", Content: map[string]any{"confirm": false}}}}
			cs := b.Client(era, &mcp.ClientOptions{ElicitationHandler: user.handle})

			var meta map[string]any
			for _, tl := range listTools(t, cs) {
				if tl.Name == tool {
					meta, _ = tl.Meta["devicebridge/flow"].(map[string]any)
				}
			}
			assert.Equal(t, map[string]any{"interactive": true, "confirm": true}, meta)

			res := callTool(t, cs, tool, map[string]any{})
			assert.False(t, res.IsError, text(res))
			assert.Contains(t, text(res), "Not run: the user declined self.reboot")
			asked := user.questions()
			require.Len(t, asked, 1)
			c := schemaOf(t, asked[0])["properties"].(map[string]any)["confirm"].(map[string]any)
			assert.Equal(t, "boolean", c["type"])
			question := `Run self.reboot on "dev_000003" (otto-robot, 02:00:00:00:00:03)? The board restarts: it is offline until it reconnects.`
			assert.Equal(t, question, asked[0].Message, "plain words, for the user and the model alike")
			assert.Equal(t, question, c["description"])

			// "decline" in the form's own terms is a no as well.
			user.answers = []*mcp.ElicitResult{{Action: "decline"}}
			res = callTool(t, cs, tool, map[string]any{})
			assert.Contains(t, text(res), "Not run")
			assert.Zero(t, robot.Stats().Reboots)
			assert.True(t, robot.Connected(), "the board is still running")
		})
	}
}

// TestStatelessTokensSurviveRestart: with a flow secret, an interaction
// started on one bridge is answered on another one (a restart, or another
// replica) sharing the secret, by the same caller (the same token).
func TestStatelessTokensSurviveRestart(t *testing.T) {
	secret := "0123456789abcdef0123456789abcdef-test"
	cfg := func(c *app.Config) {
		c.Flow.Secret = secret
		c.MCP.Tokens = []string{"token-alice"}
	}
	first := startBridge(t, cfg)
	first.Board(macC, "robot", simulator.Config{})
	second := startBridge(t, cfg)
	robot := second.Board(macC, "robot", simulator.Config{})
	tool := upstreamName(macC, "self.audio_speaker.set_volume")
	alice := tokenHTTP(t, "token-alice")

	cs := flowSession(first, modern, nil, alice)
	ctx, cancel := withTimeout(10 * time.Second)
	defer cancel()
	caps, err := mcp.CallCustomMethod[*capsParams, *capsResult](ctx, cs, "capabilities", &capsParams{})
	require.NoError(t, err)
	assert.True(t, caps.Features["sessionPersistence"])
	st, err := flowStart(t, cs, tool, nil)
	require.NoError(t, err)
	require.Equal(t, flow.StateWaitingUser, st.State)
	sctx, scancel := withTimeout(10 * time.Second)
	defer scancel()
	require.NoError(t, first.App.Shutdown(sctx), "the first bridge is gone")

	other := flowSession(second, modern, nil, alice)
	done, err := flowRespond(t, other, st.SessionID, 44)
	require.NoError(t, err)
	assert.Equal(t, flow.StateCompleted, done.State)
	assert.EqualValues(t, 44, robot.State()["audio_speaker.volume"])

	// A changed token is refused as unknown.
	bad := []byte(st.SessionID)
	bad[len(bad)/2] ^= 1
	_, err = flowGetState(t, other, string(bad))
	requireRPCCode(t, err, flow.CodeSessionNotFound)
}

// TestInteractionMetrics: open interactions show in
// devicebridge_interactions{state}.
func TestInteractionMetrics(t *testing.T) {
	b := startBridge(t, nil)
	b.Board(macC, "robot", simulator.Config{})
	cs := flowSession(b, legacy, nil, nil)
	_, err := flowStart(t, cs, upstreamName(macC, "self.audio_speaker.set_volume"), nil)
	require.NoError(t, err)
	metrics := "http://" + b.App.ControlAddr().String() + "/metrics"
	require.Eventually(t, func() bool {
		resp, err := b.HTTP.Get(metrics)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(body), `devicebridge_interactions{state="waiting_user"} 1`)
	}, 10*time.Second, 10*time.Millisecond)
}

// TestFlowCompactMode: in compact mode call_device_tool is flow-capable
// too: interaction.start resolves it to the board tool it names, and a
// dangerous tool behind it still needs confirmation.
func TestFlowCompactMode(t *testing.T) {
	b := startBridge(t, func(c *app.Config) {
		c.MCP.Compact = true
		c.MCP.ShowUserOnlyTools = true
	})
	robot := b.Board(macC, "robot", simulator.Config{})
	cs := flowSession(b, legacy, nil, nil)
	st, err := flowStart(t, cs, "call_device_tool",
		map[string]any{"device": macC, "tool": "self.audio_speaker.set_volume", "arguments": map[string]any{}})
	require.NoError(t, err)
	require.NotNil(t, st.InitialPrompt)
	assert.Equal(t, "volume", st.InitialPrompt.Property)
	st, err = flowRespond(t, cs, st.SessionID, 12)
	require.NoError(t, err)
	assert.Equal(t, flow.StateCompleted, st.State)
	assert.EqualValues(t, 12, robot.State()["audio_speaker.volume"])

	_, err = flowStart(t, cs, "call_device_tool", map[string]any{"device": macC, "tool": "self.nope"})
	je := requireRPCCode(t, err, flow.CodeValidationFailed)
	assert.Contains(t, je.Message, "describe_device")

	res := callTool(t, cs, "call_device_tool", map[string]any{"device": macC, "tool": "self.reboot"})
	require.True(t, res.IsError)
	assert.Contains(t, text(res), "needs the user's confirmation")
	assert.Zero(t, robot.Stats().Reboots)
}

// TestMRTRStateChecks: a requestState that fails its checks on a retry —
// altered, or issued by another bridge (another key: without a flow
// secret, also the same bridge before a restart) — is a JSON-RPC error
// (invalid params) that says why, and nothing runs; one that is authentic
// but expired (flow.timeout) brings the form again, saying so.
func TestMRTRStateChecks(t *testing.T) {
	b := startBridge(t, func(c *app.Config) { c.Flow.Timeout = time.Second })
	robot := b.Board(macC, "robot", simulator.Config{})
	other := startBridge(t, nil)
	other.Board(macC, "robot", simulator.Config{})
	tool := upstreamName(macC, "self.audio_speaker.set_volume")
	manual := &mcp.ClientOptions{ElicitationHandler: (&elicitor{}).handle, MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true}}
	cs, onOther := b.Client(modern, manual), other.Client(modern, manual)
	call := func(cs *mcp.ClientSession, state string, volume any) (*mcp.CallToolResult, error) {
		ctx, cancel := withTimeout(20 * time.Second)
		defer cancel()
		p := &mcp.CallToolParams{Name: tool, Arguments: map[string]any{}, RequestState: state}
		if state != "" {
			p.InputResponses = mcp.InputResponseMap{"flow": &mcp.ElicitResult{Action: "accept", Content: map[string]any{"volume": volume}}}
		}
		return cs.CallTool(ctx, p)
	}
	first, err := call(cs, "", nil)
	require.NoError(t, err)
	require.True(t, first.NeedsInput())
	require.NotEmpty(t, first.RequestState)
	_, err = call(onOther, "", nil) // the other bridge is up and asking
	require.NoError(t, err)
	ran := robot.Stats().CallsRun

	for name, c := range map[string]struct {
		cs    *mcp.ClientSession
		state string
		why   string
	}{
		"altered":           {cs, first.RequestState + "-TAMPERED", "requestState rejected"},
		"another signature": {cs, first.RequestState[:len(first.RequestState)-2] + "AA", "signature does not match"},
		"another bridge":    {onOther, first.RequestState, "--flow-secret"},
		"not a state":       {cs, "hello", "not a requestState this bridge issued"},
	} {
		_, err := call(c.cs, c.state, 33)
		rpcErr := requireRPCCode(t, err, jsonrpc.CodeInvalidParams)
		assert.Contains(t, rpcErr.Message, c.why, name)
		assert.Contains(t, rpcErr.Message, "without requestState", name)
	}
	assert.Equal(t, ran, robot.Stats().CallsRun, "nothing ran")

	// Authentic but expired: asked again. Until it expires, the refused
	// answer (150) brings the form back with why it was refused.
	require.Eventually(t, func() bool {
		res, err := call(cs, first.RequestState, 150)
		require.NoError(t, err)
		require.True(t, res.NeedsInput())
		return strings.Contains(res.InputRequests["flow"].(*mcp.ElicitParams).Message, "after the question expired")
	}, 10*time.Second, 50*time.Millisecond)
}
