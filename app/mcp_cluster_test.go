package app_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/flow"
	"github.com/devicebridge/devicebridge/mcpserver"
)

const (
	modernMCP   = "2026-07-28"
	fleetSecret = "fleet-flow-secret-0123456789abcdef-test"
)

// roundRobin is a load balancer without affinity in front of the nodes'
// /mcp: each request goes to the next node. served counts, per node,
// the requests it forwarded there.
type roundRobin struct {
	mu     sync.Mutex
	next   int
	nodes  []string // control base URLs
	served map[string]int
}

func startRoundRobin(t *testing.T, bases ...string) (*roundRobin, string) {
	rr := &roundRobin{nodes: bases, served: map[string]int{}}
	proxy := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		rr.mu.Lock()
		base := rr.nodes[rr.next%len(rr.nodes)]
		rr.next++
		rr.served[base]++
		rr.mu.Unlock()
		u, _ := url.Parse(base)
		r.SetURL(u)
	}}
	srv := httptest.NewServer(proxy)
	t.Cleanup(srv.Close)
	return rr, srv.URL + "/mcp"
}

func (rr *roundRobin) counts() map[string]int {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	out := map[string]int{}
	for k, v := range rr.served {
		out[k] = v
	}
	return out
}

// modernClient is a go-sdk client in the stateless era (no session) on
// endpoint; opts may turn off its automatic MRTR rounds.
func modernClient(t *testing.T, endpoint string, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "fleet-host", Version: "1"}, opts).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: endpoint, MaxRetries: -1}, &mcp.ClientSessionOptions{ProtocolVersion: modernMCP})
	require.NoError(t, err)
	require.Empty(t, cs.ID(), "stateless: no session")
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func upstream(mac, tool string) string {
	return mcpserver.DefaultAlias(mac) + "_" + strings.ReplaceAll(strings.TrimPrefix(tool, "self."), ".", "_")
}

// flowNodes starts two nodes with boards on each, both listing the whole
// fleet; secret is the flow secret of both ("" none).
func flowNodes(t *testing.T, secret string) (baseA, baseB string) {
	t.Helper()
	url := startNATS(t)
	start := func(id string) (*app.App, string) {
		cfg := fleetConfig(url, id)
		cfg.Flow.Secret = secret
		return startApp(t, cfg)
	}
	a, baseA := start("a")
	b, baseB := start("b")
	connectBoard(t, a, "0a:00:00:00:00:05")
	connectBoard(t, b, "0b:00:00:00:00:06")
	want := []string{upstream("0a:00:00:00:00:05", "self.audio_speaker.set_volume"), upstream("0b:00:00:00:00:06", "self.audio_speaker.set_volume")}
	for _, base := range []string{baseA, baseB} {
		cs := modernClient(t, base+"/mcp", nil)
		require.Eventually(t, func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			list, err := cs.ListTools(ctx, nil)
			require.NoError(t, err)
			n := 0
			for _, tool := range list.Tools {
				if tool.Name == want[0] || tool.Name == want[1] {
					n++
				}
			}
			return n == 2
		}, 10*time.Second, 20*time.Millisecond, "each node's /mcp lists both boards")
	}
	return baseA, baseB
}

// volume reads a board's volume through a node's control API.
func volume(t *testing.T, base, mac string) float64 {
	t.Helper()
	var res struct{ Content []struct{ Text string } }
	require.Equal(t, http.StatusOK, doJSON(t, "POST", base+"/api/devices/"+mac+"/call", "", `{"name":"self.get_device_status"}`, &res))
	var status struct {
		AudioSpeaker struct {
			Volume float64 `json:"volume"`
		} `json:"audio_speaker"`
	}
	require.NoError(t, json.Unmarshal([]byte(res.Content[0].Text), &status), res.Content[0].Text)
	return status.AudioSpeaker.Volume
}

// TestStatelessMCPBehindRoundRobin: 2026-07-28 requests through a load
// balancer without affinity land on alternating nodes; every tools/list
// shows the whole fleet under the same names and every tools/call reaches
// its board, wherever it is connected.
func TestStatelessMCPBehindRoundRobin(t *testing.T) {
	noLeaks(t)
	baseA, baseB := flowNodes(t, "")
	rr, endpoint := startRoundRobin(t, baseA, baseB)
	cs := modernClient(t, endpoint, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	want := []string{upstream("0a:00:00:00:00:05", "self.get_device_status"), upstream("0b:00:00:00:00:06", "self.get_device_status")}
	var lists [][]string
	for range 4 {
		list, err := cs.ListTools(ctx, nil)
		require.NoError(t, err)
		var names []string
		for _, tool := range list.Tools {
			names = append(names, tool.Name)
		}
		require.Subset(t, names, want)
		lists = append(lists, names)
	}
	for _, l := range lists[1:] {
		require.ElementsMatch(t, lists[0], l, "every node lists the fleet under the same names")
	}
	for range 3 {
		for _, name := range want {
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name})
			require.NoError(t, err)
			require.False(t, res.IsError, "%s: %+v", name, res.Content)
		}
	}
	served := rr.counts()
	require.GreaterOrEqual(t, served[baseA], 5, "%v", served)
	require.GreaterOrEqual(t, served[baseB], 5, "%v", served)
}

// mrtrCall is a tools/call of set_volume without its argument, or a retry
// carrying the state and the user's answer.
func mrtrCall(t *testing.T, cs *mcp.ClientSession, name, state string, vol any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p := &mcp.CallToolParams{Name: name, Arguments: map[string]any{}}
	if state != "" {
		p.RequestState = state
		p.InputResponses = mcp.InputResponseMap{"flow": &mcp.ElicitResult{Action: "accept", Content: map[string]any{"volume": vol}}}
	}
	res, err := cs.CallTool(ctx, p)
	require.NoError(t, err)
	return res
}

// manualMRTR is a client that declares elicitation but runs MRTR rounds
// itself, so that each round can go to another node.
func manualMRTR(t *testing.T, endpoint string) *mcp.ClientSession {
	return modernClient(t, endpoint, &mcp.ClientOptions{
		ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return nil, fmt.Errorf("not used: rounds are driven by the test")
		},
		MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true},
	})
}

// flowRPC sends one stateless Flow method to a node's /mcp, as curl
// would, and returns the JSON-RPC result or error object.
func flowRPC(t *testing.T, base, method, params string) (result, rpcErr map[string]any) {
	t.Helper()
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":%q,"params":{"_meta":{"io.modelcontextprotocol/protocolVersion":%q,`+
		`"io.modelcontextprotocol/clientInfo":{"name":"curl","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}},%s}}`,
		method, modernMCP, params)
	req, err := http.NewRequest("POST", base+"/mcp", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", modernMCP)
	req.Header.Set("Mcp-Method", method)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		require.Failf(t, "unexpected status", "%s: %d %s", method, resp.StatusCode, b)
	}
	data := readRPC(t, resp)
	var msg struct {
		Result map[string]any `json:"result"`
		Error  map[string]any `json:"error"`
	}
	require.NoError(t, json.Unmarshal([]byte(data), &msg), data)
	return msg.Result, msg.Error
}

// readRPC returns the JSON-RPC message of a response, plain or SSE.
func readRPC(t *testing.T, resp *http.Response) string {
	t.Helper()
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return string(raw)
	}
	var last string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data:"); ok && strings.TrimSpace(d) != "" {
			last = strings.TrimSpace(d)
		}
	}
	return last
}

// TestFlowsContinueOnAnotherNode: with one --flow-secret on every node, an
// MRTR round (input_required + requestState) started on node a is
// completed by the retry on node b, and an interaction.* interaction
// started on a is answered on b; the boards really change, whichever node
// holds them.
func TestFlowsContinueOnAnotherNode(t *testing.T) {
	noLeaks(t)
	baseA, baseB := flowNodes(t, fleetSecret)
	onA, onB := manualMRTR(t, baseA+"/mcp"), manualMRTR(t, baseB+"/mcp")
	for i, mac := range []string{"0a:00:00:00:00:05", "0b:00:00:00:00:06"} {
		name := upstream(mac, "self.audio_speaker.set_volume")
		first := mrtrCall(t, onA, name, "", nil)
		require.True(t, first.NeedsInput(), "a missing argument asks the user")
		require.NotEmpty(t, first.RequestState)
		want := 21 + i
		res := mrtrCall(t, onB, name, first.RequestState, want)
		require.False(t, res.NeedsInput(), "node b takes node a's requestState")
		require.False(t, res.IsError, "%+v", res.Content)
		require.EqualValues(t, want, volume(t, baseA, mac))

		// interaction.start on a, interaction.respond on b.
		started, rpcErr := flowRPC(t, baseA, "interaction.start", `"toolName":"`+name+`","initialParams":{}`)
		require.Nil(t, rpcErr)
		require.Equal(t, "waiting_user", started["state"])
		token := started["sessionId"].(string)
		state, rpcErr := flowRPC(t, baseB, "interaction.getState", `"sessionId":"`+token+`"`)
		require.Nil(t, rpcErr)
		require.Equal(t, "waiting_user", state["state"])
		want += 10
		done, rpcErr := flowRPC(t, baseB, "interaction.respond", fmt.Sprintf(`"sessionId":%q,"response":{"value":%d}`, token, want))
		require.Nil(t, rpcErr)
		require.Equal(t, "completed", done["state"])
		require.EqualValues(t, want, volume(t, baseB, mac))
	}
}

// TestFlowsWithoutSharedSecretStayOnTheirNode: without a common
// --flow-secret a node cannot read another's state. An interaction id from
// node a is SESSION_NOT_FOUND on node b, with a message that names the
// cause; a requestState from a fails its signature on b, which refuses it
// with a JSON-RPC error naming the flow secret and runs nothing.
func TestFlowsWithoutSharedSecretStayOnTheirNode(t *testing.T) {
	noLeaks(t)
	baseA, baseB := flowNodes(t, "")
	mac := "0b:00:00:00:00:06"
	name := upstream(mac, "self.audio_speaker.set_volume")
	before := volume(t, baseA, mac)

	started, rpcErr := flowRPC(t, baseA, "interaction.start", `"toolName":"`+name+`","initialParams":{}`)
	require.Nil(t, rpcErr)
	id := started["sessionId"].(string)
	_, rpcErr = flowRPC(t, baseB, "interaction.respond", `"sessionId":"`+id+`","response":{"value":9}`)
	require.NotNil(t, rpcErr)
	require.EqualValues(t, flow.CodeSessionNotFound, rpcErr["code"])
	require.Equal(t, "SESSION_NOT_FOUND", rpcErr["data"].(map[string]any)["flowCode"])
	require.Contains(t, rpcErr["message"], "flow secret", "the message names the likely cause")

	onA, onB := manualMRTR(t, baseA+"/mcp"), manualMRTR(t, baseB+"/mcp")
	first := mrtrCall(t, onA, name, "", nil)
	require.True(t, first.NeedsInput())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := onB.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: map[string]any{}, RequestState: first.RequestState,
		InputResponses: mcp.InputResponseMap{"flow": &mcp.ElicitResult{Action: "accept", Content: map[string]any{"volume": 9}}}})
	var werr *jsonrpc.Error
	require.ErrorAs(t, err, &werr, "b does not trust a's requestState")
	require.EqualValues(t, jsonrpc.CodeInvalidParams, werr.Code)
	require.Contains(t, werr.Message, "flow secret", "the error names the likely cause")
	require.Equal(t, before, volume(t, baseA, mac), "nothing ran")
}
