package mcpserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/mcpserver"
	"github.com/devicebridge/devicebridge/simulator"
)

const (
	macRes1 = "02:00:00:00:1e:01"
	macRes2 = "02:00:00:00:1e:02"
)

func boardURI(ref string) string { return "devicebridge://boards/" + ref }

// notes records the resource notifications a client receives.
type notes struct {
	mu          sync.Mutex
	updated     []string
	listChanged int
}

func (n *notes) options() *mcp.ClientOptions {
	return &mcp.ClientOptions{
		ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
			n.mu.Lock()
			defer n.mu.Unlock()
			n.updated = append(n.updated, req.Params.URI)
		},
		ResourceListChangedHandler: func(context.Context, *mcp.ResourceListChangedRequest) {
			n.mu.Lock()
			defer n.mu.Unlock()
			n.listChanged++
		},
	}
}

// updates counts the updated notifications for uri.
func (n *notes) updates(uri string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := 0
	for _, u := range n.updated {
		if u == uri {
			c++
		}
	}
	return c
}

func (n *notes) lists() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.listChanged
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, 10*time.Second, 5*time.Millisecond, what)
}

// boardJSON is the part of a board resource the tests look at.
type boardJSON struct {
	URI      string `json:"uri"`
	Device   string `json:"device"`
	DeviceID string `json:"device_id"`
	State    string `json:"state"`
	Tools    []struct {
		Name    string `json:"name"`
		MCPName string `json:"mcp_name"`
	} `json:"tools"`
	Status *struct {
		Tool   string          `json:"tool"`
		Result json.RawMessage `json:"result"`
	} `json:"status"`
}

func readBoard(t *testing.T, cs *mcp.ClientSession, uri string) (boardJSON, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
	if err != nil {
		return boardJSON{}, err
	}
	require.Len(t, res.Contents, 1)
	assert.Equal(t, "application/json", res.Contents[0].MIMEType)
	assert.Equal(t, uri, res.Contents[0].URI)
	var b boardJSON
	require.NoError(t, json.Unmarshal([]byte(res.Contents[0].Text), &b))
	return b, nil
}

func listURIs(t *testing.T, cs *mcp.ClientSession) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []string
	for r, err := range cs.Resources(ctx, nil) {
		require.NoError(t, err)
		out = append(out, r.URI)
	}
	return out
}

func rpcCode(err error) int64 {
	var e *jsonrpc.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

// notFoundCode is the resource-not-found code of each era.
func notFoundCode(era string) int64 {
	if era == legacy {
		return -32002
	}
	return jsonrpc.CodeInvalidParams
}

// subscribe subscribes and waits until the bridge holds the subscription
// (a modern client's subscriptions/listen runs in the background).
func subscribe(t *testing.T, b *bridge, cs *mcp.ClientSession, uri string) {
	t.Helper()
	before := mcpserver.SubscriptionCount(b.App.MCP())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, cs.Subscribe(ctx, &mcp.SubscribeParams{URI: uri}))
	waitFor(t, "the subscription to "+uri+" is held", func() bool { return mcpserver.SubscriptionCount(b.App.MCP()) > before })
}

// TestBoardResources: in both eras a board is a resource that lists,
// reads (by MAC, alias or percent-encoded MAC) and tells its subscribers
// when its status changes, when it leaves and when it comes back; a board
// not connected yet may be subscribed to; unknown resources get the
// not-found code of the client's era.
func TestBoardResources(t *testing.T) {
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			b := startBridge(t, nil)
			board := b.Board(macRes1, "breadboard", simulator.Config{})
			var n notes
			cs := b.Client(era, n.options())

			caps := cs.InitializeResult().Capabilities
			require.NotNil(t, caps.Resources)
			assert.True(t, caps.Resources.Subscribe)
			assert.True(t, caps.Resources.ListChanged)
			assert.NotNil(t, caps.Prompts)
			assert.NotNil(t, caps.Completions)

			uri1 := boardURI(macRes1)
			assert.Equal(t, []string{uri1}, listURIs(t, cs))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			tl, err := cs.ListResourceTemplates(ctx, nil)
			require.NoError(t, err)
			require.Len(t, tl.ResourceTemplates, 1)
			assert.Equal(t, "devicebridge://boards/{board}", tl.ResourceTemplates[0].URITemplate)

			st, err := readBoard(t, cs, uri1)
			require.NoError(t, err)
			assert.Equal(t, macRes1, st.DeviceID)
			assert.Equal(t, "dev_001e01", st.Device)
			assert.Equal(t, "ready", st.State)
			assert.Nil(t, st.Status, "nobody read the status yet")
			var names []string
			for _, tool := range st.Tools {
				names = append(names, tool.Name)
				assert.Equal(t, bridgetestToolName(macRes1, tool.Name), tool.MCPName)
			}
			assert.Contains(t, names, mcpserver.StatusTool)
			for _, other := range []string{boardURI("dev_001e01"), boardURI("DEV_001E01"), boardURI(url.PathEscape(macRes1))} {
				st, err := readBoard(t, cs, other)
				require.NoError(t, err, other)
				assert.Equal(t, macRes1, st.DeviceID, other)
			}
			for _, unknown := range []string{boardURI("nope"), boardURI("02:00:00:00:1e:09"), "test://static-text", boardURI("")} {
				_, err := readBoard(t, cs, unknown)
				require.Error(t, err, unknown)
				assert.Equal(t, notFoundCode(era), rpcCode(err), "%s: %v", unknown, err)
			}

			// A status read by anyone (here the control API) is remembered
			// and tells subscribers; the same result again does not.
			subscribe(t, b, cs, uri1)
			uri2 := boardURI("dev_001e02") // not connected yet: by alias
			subscribe(t, b, cs, uri2)
			callAPI(t, b, macRes1, mcpserver.StatusTool, `{}`)
			waitFor(t, "an update after the first status", func() bool { return n.updates(uri1) == 1 })
			st, err = readBoard(t, cs, uri1)
			require.NoError(t, err)
			require.NotNil(t, st.Status)
			assert.JSONEq(t, `70`, string(jsonAt(t, st.Status.Result, "audio_speaker", "volume")))
			callTool(t, cs, bridgetestToolName(macRes1, mcpserver.StatusTool), nil) // unchanged
			callTool(t, cs, bridgetestToolName(macRes1, "self.audio_speaker.set_volume"), map[string]any{"volume": 30})
			assert.Equal(t, 1, n.updates(uri1), "a call that is not the status tool changes no resource")
			callTool(t, cs, bridgetestToolName(macRes1, mcpserver.StatusTool), nil)
			waitFor(t, "an update after the status changed", func() bool { return n.updates(uri1) >= 2 })
			assert.Equal(t, 2, n.updates(uri1), "the unchanged status sent nothing (updates go out in order)")
			st, err = readBoard(t, cs, uri1)
			require.NoError(t, err)
			assert.JSONEq(t, `30`, string(jsonAt(t, st.Status.Result, "audio_speaker", "volume")))

			// A board comes: its subscribers hear it, every listener gets
			// list_changed.
			lists := n.lists()
			b.Board(macRes2, "breadboard", simulator.Config{})
			waitFor(t, "an update when the board subscribed to by alias came", func() bool { return n.updates(uri2) >= 1 })
			waitFor(t, "list_changed when a board came", func() bool { return n.lists() > lists })
			assert.ElementsMatch(t, []string{uri1, boardURI(macRes2)}, listURIs(t, cs))

			// A board goes.
			lists = n.lists()
			require.NoError(t, board.Close())
			b.WaitState(macRes1, device.StateClosed)
			waitFor(t, "an update when the board left", func() bool { return n.updates(uri1) >= 3 })
			waitFor(t, "list_changed when a board left", func() bool { return n.lists() > lists })
			_, err = readBoard(t, cs, uri1)
			assert.Equal(t, notFoundCode(era), rpcCode(err), "a board that left is not found: %v", err)
			assert.Equal(t, []string{boardURI(macRes2)}, listURIs(t, cs))

			// Unsubscribed, nothing more; the bridge forgets the subscription.
			ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel2()
			require.NoError(t, cs.Unsubscribe(ctx2, &mcp.UnsubscribeParams{URI: uri2}))
			require.NoError(t, cs.Unsubscribe(ctx2, &mcp.UnsubscribeParams{URI: uri1}))
			waitFor(t, "subscriptions dropped", func() bool { return mcpserver.SubscriptionCount(b.App.MCP()) == 0 })
		})
	}
}

func bridgetestToolName(mac, tool string) string {
	return mcpserver.DefaultAlias(mac) + "_" + strings.ReplaceAll(strings.TrimPrefix(tool, "self."), ".", "_")
}

// jsonAt digs a value out of a JSON object.
func jsonAt(t *testing.T, raw json.RawMessage, path ...string) json.RawMessage {
	t.Helper()
	for _, k := range path {
		var m map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(raw, &m), "%s", raw)
		raw = m[k]
	}
	return raw
}

// callAPI calls a board tool through the control API.
func callAPI(t *testing.T, b *bridge, mac, tool, args string) {
	t.Helper()
	body := `{"name":"` + tool + `","arguments":` + args + `}`
	req, err := http.NewRequest("POST", b.Base+"/api/devices/"+mac+"/call", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := b.HTTP.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// TestSubscriptionBounds: a session holds at most mcp.max_subscriptions
// subscriptions (legacy resources/subscribe; a modern listen with more
// URIs is refused whole); a URI that is not a board's is refused.
func TestSubscriptionBounds(t *testing.T) {
	b := startBridge(t, func(c *app.Config) {
		c.MCP.MaxSubscriptions = 2
		c.MCP.RateLimit = -1 // 70 sessions below, from one address
	})
	cs := b.Client(legacy, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sub := func(uri string) error { return cs.Subscribe(ctx, &mcp.SubscribeParams{URI: uri}) }
	require.NoError(t, sub(boardURI("a")))
	require.NoError(t, sub(boardURI("a")), "the same URI again is no new subscription")
	require.NoError(t, sub(boardURI("02:00:00:00:1e:0b")))
	err := sub(boardURI("c"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "mcp.max_subscriptions")
	require.NoError(t, cs.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: boardURI("a")}))
	require.NoError(t, sub(boardURI("c")))
	for _, bad := range []string{"test://watched-resource", boardURI("a/b"), boardURI("a%20b")} {
		assert.Equal(t, int64(-32002), rpcCode(sub(bad)), bad)
	}
	assert.Equal(t, 2, mcpserver.SubscriptionCount(b.App.MCP()))

	// Modern: one listen naming three URIs is refused, and holds nothing.
	body := `{"jsonrpc":"2.0","id":7,"method":"subscriptions/listen","params":{"notifications":{"resourceSubscriptions":[` +
		`"devicebridge://boards/x","devicebridge://boards/y","devicebridge://boards/z"]},"_meta":{` +
		`"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`
	resp := do(b, rawRequest(b, "POST", body, map[string]string{"MCP-Protocol-Version": modern, "Mcp-Method": "subscriptions/listen"}))
	msg := rawMessage(t, resp)
	require.Contains(t, msg, "error", "%v", msg)
	assert.Contains(t, msg["error"].(map[string]any)["message"], "mcp.max_subscriptions")
	assert.Equal(t, 2, mcpserver.SubscriptionCount(b.App.MCP()), "the refused listen left nothing behind")

	// A session that ends leaves nothing behind once the bridge looks.
	require.NoError(t, cs.Close())
	for i := range 70 { // past the first prune point
		c := b.Client(legacy, nil)
		require.NoError(t, c.Subscribe(ctx, &mcp.SubscribeParams{URI: boardURI("a")}), "session %d", i)
		require.NoError(t, c.Close())
	}
	assert.Less(t, mcpserver.SubscriptionCount(b.App.MCP()), 70, "ended sessions' subscriptions are dropped")
}

const resourcePolicy = `identities:
  kitchen:
    boards: ["kitchen"]
    tools: ["self.audio_speaker.*"]
`

// TestResourcesFollowThePolicy: a caller lists, reads, subscribes to and
// completes only the boards it may see, and reads only the tools (and the
// status) it may call.
func TestResourcesFollowThePolicy(t *testing.T) {
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	require.NoError(t, os.WriteFile(pol, []byte(resourcePolicy), 0o600))
	b := startBridge(t, func(c *app.Config) {
		c.MCP.Tokens = []string{"kitchen=kitchen-secret-0123456789", "stranger=stranger-secret-0123456789"}
		c.MCP.Aliases = map[string]string{macRes1: "kitchen"}
		c.Auth.PolicyFile = pol
	})
	b.Board(macRes1, "breadboard", simulator.Config{})
	b.Board(macRes2, "breadboard", simulator.Config{})
	for _, era := range eras {
		kitchen := b.ClientWith(era, nil, &http.Client{Transport: bearer{"kitchen-secret-0123456789", http.DefaultTransport}})
		stranger := b.ClientWith(era, nil, &http.Client{Transport: bearer{"stranger-secret-0123456789", http.DefaultTransport}})
		assert.Equal(t, []string{boardURI(macRes1)}, listURIs(t, kitchen), era)
		assert.Empty(t, listURIs(t, stranger), era)

		st, err := readBoard(t, kitchen, boardURI("kitchen"))
		require.NoError(t, err)
		var names []string
		for _, tool := range st.Tools {
			names = append(names, tool.Name)
		}
		assert.Equal(t, []string{"self.audio_speaker.set_volume"}, names, era)
		assert.Nil(t, st.Status, "kitchen may not call the status tool, so it does not see its result")
		for _, uri := range []string{boardURI(macRes2), boardURI("dev_001e02")} {
			_, err = readBoard(t, kitchen, uri)
			assert.Equal(t, notFoundCode(era), rpcCode(err), "%s %s: %v", era, uri, err)
		}
		_, err = readBoard(t, stranger, boardURI("kitchen"))
		assert.Equal(t, notFoundCode(era), rpcCode(err), era)

		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		res, err := kitchen.Complete(ctx, &mcp.CompleteParams{Ref: &mcp.CompleteReference{Type: "ref/resource", URI: "devicebridge://boards/{board}"},
			Argument: mcp.CompleteParamsArgument{Name: "board", Value: ""}})
		cancel()
		require.NoError(t, err)
		assert.Equal(t, []string{"kitchen"}, res.Completion.Values, era)
	}
	// Subscribing to a board one may not see fails as if it did not exist,
	// whether it is connected or not.
	kitchen := b.ClientWith(legacy, nil, &http.Client{Transport: bearer{"kitchen-secret-0123456789", http.DefaultTransport}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, uri := range []string{boardURI(macRes2), boardURI("02:00:00:00:1e:0c"), boardURI("office")} {
		assert.Equal(t, int64(-32002), rpcCode(kitchen.Subscribe(ctx, &mcp.SubscribeParams{URI: uri})), uri)
	}
	require.NoError(t, kitchen.Subscribe(ctx, &mcp.SubscribeParams{URI: boardURI("kitchen")}))
}

func complete(t *testing.T, cs *mcp.ClientSession, ref *mcp.CompleteReference, arg, value string, ctxArgs map[string]string) (*mcp.CompleteResult, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p := &mcp.CompleteParams{Ref: ref, Argument: mcp.CompleteParamsArgument{Name: arg, Value: value}}
	if ctxArgs != nil {
		p.Context = &mcp.CompleteContext{Arguments: ctxArgs}
	}
	return cs.Complete(ctx, p)
}

// TestCompletionAndPrompts: completion/complete offers boards, tools and a
// tool's argument names and values; the two prompts describe a board and
// ask for one of its tools; unknown prompts are -32602 as the spec asks.
func TestCompletionAndPrompts(t *testing.T) {
	b := startBridge(t, func(c *app.Config) { c.MCP.Aliases = map[string]string{macRes2: "robot"} })
	b.Board(macRes1, "breadboard", simulator.Config{})
	b.Board(macRes2, "robot", simulator.Config{})
	for _, era := range eras {
		cs := b.Client(era, nil)
		tmpl := &mcp.CompleteReference{Type: "ref/resource", URI: "devicebridge://boards/{board}"}
		res, err := complete(t, cs, tmpl, "board", "", nil)
		require.NoError(t, err)
		assert.Equal(t, []string{"dev_001e01", "robot"}, res.Completion.Values, era)
		assert.Equal(t, 2, res.Completion.Total)
		assert.False(t, res.Completion.HasMore)
		res, err = complete(t, cs, tmpl, "board", "RO", nil)
		require.NoError(t, err)
		assert.Equal(t, []string{"robot"}, res.Completion.Values)
		res, err = complete(t, cs, tmpl, "board", "02:00:00:00:1e:0", nil)
		require.NoError(t, err)
		assert.Equal(t, []string{macRes1, macRes2}, res.Completion.Values, "by MAC")
		res, err = complete(t, cs, &mcp.CompleteReference{Type: "ref/resource", URI: "test://template/{id}"}, "id", "", nil)
		require.NoError(t, err)
		assert.Empty(t, res.Completion.Values, "another template completes nothing")

		boardTool := &mcp.CompleteReference{Type: "ref/prompt", Name: "board_tool"}
		res, err = complete(t, cs, boardTool, "tool", "otto.w", map[string]string{"board": "robot"})
		require.NoError(t, err)
		assert.Equal(t, []string{"self.otto.walk"}, res.Completion.Values)
		res, err = complete(t, cs, boardTool, "arguments", "st", map[string]string{"board": "robot", "tool": "self.otto.walk"})
		require.NoError(t, err)
		assert.Equal(t, []string{"steps="}, res.Completion.Values)
		res, err = complete(t, cs, boardTool, "arguments", "steps=3 direction=", map[string]string{"board": "robot", "tool": "self.otto.walk"})
		require.NoError(t, err)
		assert.Equal(t, []string{"steps=3 direction=1", "steps=3 direction=-1", "steps=3 direction=0"}, res.Completion.Values,
			"the default first, then the range")
		res, err = complete(t, cs, boardTool, "arguments", "steps=", map[string]string{"board": "robot", "tool": "self.otto.walk"})
		require.NoError(t, err)
		assert.Len(t, res.Completion.Values, 100, "steps 1..100")
		assert.False(t, res.Completion.HasMore)
		res, err = complete(t, cs, boardTool, "arguments", "both=", map[string]string{"board": "robot", "tool": "self.otto.hands_up"})
		require.NoError(t, err)
		assert.Equal(t, []string{"both=true", "both=false"}, res.Completion.Values)
		res, err = complete(t, cs, boardTool, "arguments", "", map[string]string{"board": "nope", "tool": "self.otto.walk"})
		require.NoError(t, err)
		assert.Empty(t, res.Completion.Values, "no board, nothing to offer")

		_, err = complete(t, cs, &mcp.CompleteReference{Type: "ref/prompt", Name: "test_prompt_with_arguments"}, "arg1", "x", nil)
		assert.Equal(t, int64(jsonrpc.CodeInvalidParams), rpcCode(err), "%v", err)

		// Prompts.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		pl, err := cs.ListPrompts(ctx, nil)
		require.NoError(t, err)
		var pnames []string
		for _, p := range pl.Prompts {
			pnames = append(pnames, p.Name)
		}
		assert.Equal(t, []string{"board", "board_tool"}, pnames)
		pr, err := cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "board", Arguments: map[string]string{"board": "robot"}})
		require.NoError(t, err)
		require.Len(t, pr.Messages, 2)
		text := pr.Messages[0].Content.(*mcp.TextContent).Text
		assert.Contains(t, text, "robot_otto_walk (the board's self.otto.walk)")
		assert.Contains(t, text, "robot_get_device_status reads it", "no status yet")
		er := pr.Messages[1].Content.(*mcp.EmbeddedResource)
		assert.Equal(t, boardURI(macRes2), er.Resource.URI)
		assert.Contains(t, er.Resource.Text, `"device":"robot"`)

		pr, err = cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "board_tool",
			Arguments: map[string]string{"board": "robot", "tool": "otto.walk", "arguments": "steps=5, direction=-1"}})
		require.NoError(t, err)
		text = pr.Messages[0].Content.(*mcp.TextContent).Text
		assert.Contains(t, text, "Run robot_otto_walk")
		assert.Contains(t, text, `{"direction":-1,"steps":5}`)
		_, err = cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "board_tool",
			Arguments: map[string]string{"board": "robot", "tool": "self.otto.walk", "arguments": "steps=500"}})
		assert.Equal(t, int64(jsonrpc.CodeInvalidParams), rpcCode(err))
		assert.ErrorContains(t, err, "steps")
		_, err = cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "board", Arguments: map[string]string{"board": "nope"}})
		assert.Equal(t, int64(jsonrpc.CodeInvalidParams), rpcCode(err))
		cancel()
	}
}

// TestResourcesInCompactMode: compact mode serves the same resources;
// tools carry no published name (call_device_tool takes the board's).
func TestResourcesInCompactMode(t *testing.T) {
	b := startBridge(t, func(c *app.Config) { c.MCP.Compact = true })
	b.Board(macRes1, "breadboard", simulator.Config{})
	cs := b.Client(modern, nil)
	st, err := readBoard(t, cs, boardURI(macRes1))
	require.NoError(t, err)
	require.NotEmpty(t, st.Tools)
	assert.True(t, slices.ContainsFunc(st.Tools, func(x struct {
		Name    string `json:"name"`
		MCPName string `json:"mcp_name"`
	}) bool {
		return x.Name == mcpserver.StatusTool && x.MCPName == ""
	}))
}
