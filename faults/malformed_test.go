//go:build faults

package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/mqtt"
	"github.com/devicebridge/devicebridge/simulator"
)

// malformedTotal counts every malformed input the campaign sent.
var malformedTotal atomic.Int64

// TestMalformedInputs sends well over a thousand malformed inputs, in
// batches, to one bridge: device WebSocket frames before and after the
// hello, invalid hellos, garbage JSON-RPC replies from scripted boards,
// malformed MQTT publishes, and malformed bodies on /mcp and /api. After
// each batch the bridge is healthy, an unrelated board (one per
// transport) still answers, and goroutines and heap are back near their
// baseline.
func TestMalformedInputs(t *testing.T) {
	cfg := baseConfig()
	cfg.MQTT.Listen = "127.0.0.1:0"
	b := startBridge(t, cfg, nil)
	ref := b.board(simulator.Config{MAC: mac(6, 0)}).MAC()

	mqttRef, err := simulator.NewBoard(simulator.Config{MAC: mac(6, 1), Profile: profile(t, "breadboard")})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	refConn, err := mqttRef.ConnectMQTT(ctx, simulator.MQTTConfig{Endpoint: "tcp://" + b.App.MQTTAddr().String()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = refConn.Close() })
	b.waitReady(mqttRef.MAC())

	base := b.baseline()
	batch := func(name string, f func(t *testing.T, s *tally)) {
		t.Run(name, func(t *testing.T) {
			s := scenario(t, "malformed: "+name)
			f(t, s)
			malformedTotal.Add(s.tried.Load())
			b.requireHealthy(t, s, ref)
			b.requireHealthy(t, s, mqttRef.MAC())
			b.settled(t, s, base, name)
		})
	}

	batch("ws frames before hello", func(t *testing.T, s *tally) { wsBeforeHello(t, b, s) })
	batch("ws frames after hello", func(t *testing.T, s *tally) { wsAfterHello(t, b, s) })
	batch("invalid hellos and handshakes", func(t *testing.T, s *tally) { invalidHellos(t, b, s) })
	batch("garbage JSON-RPC from boards", func(t *testing.T, s *tally) { garbageReplies(t, b, s) })
	batch("mqtt publishes", func(t *testing.T, s *tally) { mqttPublishes(t, b, s) })
	batch("/mcp bodies", func(t *testing.T, s *tally) { mcpBodies(t, b, s, ref) })
	batch("/api bodies", func(t *testing.T, s *tally) { apiBodies(t, b, s, ref) })

	t.Logf("malformed inputs sent: %d", malformedTotal.Load())
	require.GreaterOrEqual(t, malformedTotal.Load(), int64(1000))
}

// outcome reads from a raw device socket until the server answers (a
// text message) or ends the connection, and says which.
func outcome(c *websocket.Conn) (kind string, detail string) {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		typ, msg, err := c.ReadMessage()
		if err == nil {
			if typ == websocket.TextMessage {
				return "message", string(msg)
			}
			continue
		}
		var ce *websocket.CloseError
		var ne interface{ Timeout() bool }
		switch {
		case errors.As(err, &ce):
			return "closed", closeReason(err)
		case errors.As(err, &ne) && ne.Timeout():
			return "hang", err.Error()
		default:
			return "dropped", err.Error()
		}
	}
}

// wsBeforeHello: 300 sockets, each sending one malformed first frame
// (mutated hellos, random bytes, binary frames, frames past the 64 KiB
// limit). Each gets a server hello (the mutation left a valid hello) or a
// close frame with a reason, promptly.
func wsBeforeHello(t *testing.T, b *bridge, s *tally) {
	m := newMutator(1)
	url := b.App.DeviceURL()
	frames := make([][]byte, 300)
	binary := make([]bool, 300)
	for i := range frames {
		switch {
		case i%50 == 0:
			frames[i] = oversized(70 << 10)
		case i%50 == 1:
			frames[i] = oversized(1 << 20)
		case i%25 == 2:
			frames[i], binary[i] = m.mutate([]byte(deviceHello)), true
		default:
			frames[i] = m.mutate([]byte(deviceHello))
		}
	}
	parallel(t, s, len(frames), 16, func(i int) {
		c, _, err := dialDevice(url, mac(7, i), "", nil)
		if err != nil {
			s.fail("frame %d: dial: %v", i, err)
			return
		}
		defer c.Close()
		typ := websocket.TextMessage
		if binary[i] {
			typ = websocket.BinaryMessage
		}
		if err := c.WriteMessage(typ, frames[i]); err != nil {
			if len(frames[i]) > 64<<10 {
				s.ok() // refused while it was still being sent
				return
			}
			s.fail("frame %d: write: %v", i, err)
			return
		}
		kind, detail := outcome(c)
		switch {
		case kind == "message" && strings.Contains(detail, `"type":"hello"`):
			s.ok() // still a valid hello
		case kind == "closed" && detail != "":
			s.ok()
		case kind == "hang":
			s.hang("frame %d (%q...): %s", i, clip(frames[i]), detail)
		default:
			s.fail("frame %d (%q...): %s %s", i, clip(frames[i]), kind, detail)
		}
	})
}

func clip(b []byte) string {
	if len(b) > 60 {
		return string(b[:60])
	}
	return string(b)
}

// afterHelloSeeds are valid messages a board sends after its hello.
var afterHelloSeeds = []string{
	`{"session_id":"S","type":"mcp","payload":{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2024-11-05","capabilities":{},"serverInfo":{"name":"x","version":"1"}}}}`,
	`{"session_id":"S","type":"listen","state":"start","mode":"auto"}`,
	`{"session_id":"S","type":"abort","reason":"wake_word_detected"}`,
	`{"session_id":"S","type":"mcp","payload":{"jsonrpc":"2.0","id":7,"error":{"message":"Unknown tool: a"b"}}}`,
	`{"session_id":"S","type":"mcp","payload":{"jsonrpc":"2.0","method":"notifications/x","params":{}}}`,
}

// wsAfterHello: 30 boards each send ten malformed frames between their
// hello and their initialize reply, then behave. Garbage is dropped and
// the board still becomes ready; a frame past the size limit closes the
// socket (close 1009).
func wsAfterHello(t *testing.T, b *bridge, s *tally) {
	m := newMutator(2)
	url := b.App.DeviceURL()
	const boards, perBoard = 30, 10
	var readyCount atomic.Int64
	all := make([][]string, boards)
	for i := range all {
		all[i] = make([]string, perBoard)
		for j := range all[i] {
			all[i][j] = string(m.mutate([]byte(afterHelloSeeds[(i+j)%len(afterHelloSeeds)])))
		}
		if i%10 == 9 {
			all[i][perBoard-1] = string(oversized(70 << 10))
		}
	}
	parallel(t, s, boards, 8, func(i int) {
		id := mac(8, i)
		tooBig := i%10 == 9
		count := func(ok bool, format string, args ...any) {
			for range perBoard {
				if ok {
					s.ok()
				} else {
					s.fail("board %d: "+format, append([]any{i}, args...)...)
				}
			}
		}
		hung := func(what string) {
			for range perBoard {
				s.hang("board %d: %s", i, what)
			}
		}
		fake, err := startFake(t, url, id, "", func(req rpcRequest) ([]string, []string) {
			p, _ := wellBehaved(req)
			if req.Method == "initialize" {
				return p, all[i]
			}
			return p, nil
		})
		if err != nil {
			count(false, "%v", err)
			return
		}
		defer fake.close()
		var reason string
		if !assertEventually(func() bool {
			reason = fake.closeText()
			return b.ready(id) || reason != ""
		}) {
			hung("neither ready nor closed")
			return
		}
		switch {
		case tooBig:
			count(reason == "close 1009", "oversized frame: closed with %q, want close 1009", reason)
		case reason == "":
			readyCount.Add(1)
			count(true, "")
		default:
			// Garbage that happened to be a valid error reply to
			// initialize: a clear end, not a loss.
			count(true, "")
			t.Logf("board %d closed: %s", i, reason)
		}
	})
	t.Logf("%d of %d boards ready after their garbage", readyCount.Load(), boards)
	require.GreaterOrEqual(t, readyCount.Load(), int64(boards*9/10*8/10), "garbage after the hello is dropped, not fatal")
}

// invalidHellos: hellos that are not acceptable, and handshakes that are
// refused before the upgrade.
func invalidHellos(t *testing.T, b *bridge, s *tally) {
	url := b.App.DeviceURL()
	hellos := []string{
		``, ` `, `null`, `true`, `1`, `"hello"`, `[]`, `{}`, `{"type":null}`, `{"type":1}`, `{"type":"Hello"}`,
		`{"type":"hello"`, `{"type":"hello","features":"mcp"}`, `{"type":"hello","features":[]}`,
		`{"type":"hello","features":{"mcp":"yes"}}`, `{"type":"hello","version":"1"}`, `{"type":"hello","version":-1}`,
		`{"type":"hello","version":1e999}`, `{"type":"hello","transport":5}`, `{"type":"hello","audio_params":"opus"}`,
		`{"type":"hello","audio_params":{"sample_rate":"x"}}`, `{"type":"hello","type":"listen"}`,
		`{"type":"listen","state":"start"}`, `{"type":"mcp","payload":{"jsonrpc":"2.0","id":1,"result":{}}}`,
		`{"type":"goodbye"}`, `{"type":"hello","features":{"mcp":true},"transport":"udp"}`,
		"{\"type\":\"hello\x00\"}", "{\"type\":\"hel\xfflo\"}", `{"type":"hello","session_id":{"a":1}}`,
		`{"type":"hello","features":{"mcp":true}}` + strings.Repeat(" ", 70<<10),
		`{"type":"hello","x":` + strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + `}`,
		`{"type":"hello","x":"` + strings.Repeat(`\u00e9`, 10000) + `"}`,
	}
	m := newMutator(3)
	for range 60 {
		hellos = append(hellos, string(m.mutate([]byte(`{"type":"hello","version":1,"features":{"mcp":true},"transport":"websocket"}`))))
	}
	parallel(t, s, len(hellos), 16, func(i int) {
		c, _, err := dialDevice(url, mac(9, i), "", nil)
		if err != nil {
			s.fail("hello %d: dial: %v", i, err)
			return
		}
		defer c.Close()
		if err := c.WriteMessage(websocket.TextMessage, []byte(hellos[i])); err != nil {
			s.fail("hello %d: write: %v", i, err)
			return
		}
		kind, detail := outcome(c)
		switch {
		case kind == "message" && strings.Contains(detail, `"type":"hello"`):
			s.ok() // acceptable after all (the bridge is lenient on fields it does not use)
		case kind == "closed" && detail != "":
			s.ok()
		case kind == "hang":
			s.hang("hello %d %q: %s", i, clip([]byte(hellos[i])), detail)
		default:
			s.fail("hello %d %q: %s %s", i, clip([]byte(hellos[i])), kind, detail)
		}
	})

	// Handshakes refused before the upgrade.
	badIDs := []string{"", " ", "a b", strings.Repeat("a", 65), "<script>", "aa:bb;drop", "ü:ü", "../../etc", "a\tb"}
	for _, id := range badIDs {
		h := http.Header{}
		if id != "" {
			h.Set("Device-Id", id)
		}
		c, resp, err := dialDevice(url, "", "", h)
		if c != nil {
			_ = c.Close()
			s.bypass("Device-Id %q accepted", id)
			continue
		}
		switch {
		case resp != nil && resp.StatusCode == http.StatusBadRequest:
			s.ok()
		case resp == nil && err != nil && strings.Contains(err.Error(), "invalid"):
			s.ok() // the client library refused to send it
		default:
			s.fail("Device-Id %q: %v %v", id, resp, err)
		}
		if resp != nil {
			resp.Body.Close()
		}
	}
	// Plain HTTP to the WebSocket path, and bad upgrade requests.
	for _, req := range []func() (*http.Request, error){
		func() (*http.Request, error) { return http.NewRequest(http.MethodGet, httpURL(url), nil) },
		func() (*http.Request, error) {
			return http.NewRequest(http.MethodPost, httpURL(url), strings.NewReader("x"))
		},
		func() (*http.Request, error) {
			r, err := http.NewRequest(http.MethodGet, httpURL(url), nil)
			if err == nil {
				r.Header.Set("Device-Id", mac(9, 999))
				r.Header.Set("Upgrade", "websocket")
				r.Header.Set("Connection", "Upgrade")
				r.Header.Set("Sec-WebSocket-Version", "99")
			}
			return r, err
		},
	} {
		r, err := req()
		require.NoError(t, err)
		resp, err := b.HTTP.Do(r)
		if err != nil {
			s.fail("plain request: %v", err)
			continue
		}
		readAll(resp)
		if resp.StatusCode >= 400 && resp.StatusCode < 500 {
			s.ok()
		} else {
			s.fail("plain request to the device path: %d", resp.StatusCode)
		}
	}
}

func httpURL(ws string) string { return "http" + strings.TrimPrefix(ws, "ws") }

// garbageCase is a scripted board: how it answers, and what the bridge
// must make of it.
type garbageCase struct {
	name string
	h    handler
	// ready: the board must become ready (then calls must be answered);
	// otherwise it must be closed with a reason containing want.
	ready bool
	want  string
	// calls are made once ready; each must be answered with one of the
	// codes listed (HTTP status).
	calls []int
}

func replyTo(method string, f func(req rpcRequest) []string) handler {
	return func(req rpcRequest) ([]string, []string) {
		if req.Method == method {
			return f(req), nil
		}
		return wellBehaved(req)
	}
}

func garbageCases() []garbageCase {
	withID := func(res string) func(rpcRequest) []string {
		return func(req rpcRequest) []string { return []string{result(req.ID, res)} }
	}
	raw := func(p string) func(rpcRequest) []string {
		return func(req rpcRequest) []string {
			return []string{strings.ReplaceAll(p, "$ID", string(req.ID))}
		}
	}
	tools := func(n, from int) string {
		var sb strings.Builder
		sb.WriteString(`{"tools":[`)
		for i := range n {
			if i > 0 {
				sb.WriteByte(',')
			}
			fmt.Fprintf(&sb, `{"name":"self.t%d","description":"","inputSchema":{"type":"object","properties":{}}}`, from+i)
		}
		sb.WriteString(`]`)
		return sb.String()
	}
	bigSchema := func(props int) string {
		var sb strings.Builder
		sb.WriteString(`{"tools":[{"name":"self.big","description":"big","inputSchema":{"type":"object","properties":{`)
		for i := range props {
			if i > 0 {
				sb.WriteByte(',')
			}
			fmt.Fprintf(&sb, `"p%d":{"type":"integer","minimum":0,"maximum":%d}`, i, i)
		}
		sb.WriteString(`},"required":["p0"]}}]}`)
		return sb.String()
	}
	schemaTool := func(schema string) func(rpcRequest) []string {
		return withID(`{"tools":[{"name":"self.ping","inputSchema":` + schema + `}]}`)
	}
	const (
		ok   = http.StatusOK
		bad  = http.StatusBadGateway
		slow = http.StatusGatewayTimeout
		inv  = http.StatusUnprocessableEntity
	)
	return []garbageCase{
		// initialize
		{name: "init: wrong id", h: replyTo("initialize", raw(`{"jsonrpc":"2.0","id":424242,"result":`+initResult+`}`)), want: "initializ"},
		{name: "init: string id", h: replyTo("initialize", raw(`{"jsonrpc":"2.0","id":"$ID","result":`+initResult+`}`)), want: "initializ"},
		{name: "init: null id", h: replyTo("initialize", raw(`{"jsonrpc":"2.0","id":null,"result":`+initResult+`}`)), want: "initializ"},
		{name: "init: fractional id", h: replyTo("initialize", raw(`{"jsonrpc":"2.0","id":1.5,"result":`+initResult+`}`)), want: "initializ"},
		{name: "init: negative id", h: replyTo("initialize", raw(`{"jsonrpc":"2.0","id":-1,"result":`+initResult+`}`)), want: "initializ"},
		{name: "init: result a number", h: replyTo("initialize", withID(`5`)), want: "initializ"},
		{name: "init: result an array", h: replyTo("initialize", withID(`[1,2]`)), want: "initializ"},
		{name: "init: error without code", h: replyTo("initialize", raw(`{"jsonrpc":"2.0","id":$ID,"error":{"message":"no"}}`)), want: "no"},
		{name: "init: error a string", h: replyTo("initialize", raw(`{"jsonrpc":"2.0","id":$ID,"error":"boom"}`)), want: "initializ"},
		{name: "init: neither result nor error", h: replyTo("initialize", raw(`{"jsonrpc":"2.0","id":$ID}`)), want: "initializ"},
		{name: "init: batch array", h: replyTo("initialize", raw(`[{"jsonrpc":"2.0","id":$ID,"result":`+initResult+`}]`)), want: "initializ"},
		{name: "init: payload a string", h: replyTo("initialize", raw(`"{\"jsonrpc\":\"2.0\",\"id\":$ID}"`)), want: "initializ"},
		{name: "init: 60 KB server name", h: replyTo("initialize", withID(`{"serverInfo":{"name":"`+strings.Repeat("n", 60<<10)+`","version":"1"}}`)), ready: true, calls: []int{ok}},
		{name: "init: reply sent 50 times", h: replyTo("initialize", func(req rpcRequest) []string {
			out := make([]string, 50)
			for i := range out {
				out[i] = result(req.ID, initResult)
			}
			return out
		}), ready: true, calls: []int{ok}},
		{name: "init: deep nesting", h: replyTo("initialize", withID(`{"capabilities":`+strings.Repeat(`{"a":`, 3000)+`1`+strings.Repeat(`}`, 3000)+`}`)), ready: true, calls: []int{ok}},
		// tools/list
		{name: "list: cursor loop", h: replyTo("tools/list", withID(`{"tools":[],"nextCursor":"same"}`)), want: "cursor"},
		{name: "list: endless cursors", h: replyTo("tools/list", func() func(rpcRequest) []string {
			var n atomic.Int64
			return func(req rpcRequest) []string {
				return []string{result(req.ID, fmt.Sprintf(`{"tools":[],"nextCursor":"c%d"}`, n.Add(1)))}
			}
		}()), want: "page"},
		{name: "list: 10,000 tools over pages", h: replyTo("tools/list", func() func(rpcRequest) []string {
			var page atomic.Int64
			return func(req rpcRequest) []string {
				p := int(page.Add(1)) - 1
				res := tools(500, p*500)
				if p < 19 {
					res += fmt.Sprintf(`,"nextCursor":"self.t%d"}`, (p+1)*500)
				} else {
					res += `}`
				}
				return []string{result(req.ID, res)}
			}
		}()), want: "tool limit"},
		{name: "list: 10,000 tools in one page", h: replyTo("tools/list", withID(tools(10000, 0)+`}`)), want: "close 1009"},
		{name: "list: 1 MB schema", h: replyTo("tools/list", withID(`{"tools":[{"name":"self.ping","inputSchema":{"type":"object","description":"`+strings.Repeat("s", 1<<20)+`"}}]}`)), want: "close 1009"},
		{name: "list: 1,000-property schema (50 KB)", h: replyTo("tools/list", withID(bigSchema(1000))), want: "refused every tool"},
		{name: "list: tools an object", h: replyTo("tools/list", withID(`{"tools":{}}`)), want: "initializ"},
		{name: "list: tool name a number", h: replyTo("tools/list", withID(`{"tools":[{"name":5}]}`)), want: "initializ"},
		{name: "list: tool without name", h: replyTo("tools/list", withID(`{"tools":[{"description":"x"}]}`)), want: "name"},
		{name: "list: cursor a number", h: replyTo("tools/list", withID(`{"tools":[],"nextCursor":5}`)), want: "initializ"},
		{name: "list: duplicate tools", h: replyTo("tools/list", withID(`{"tools":[{"name":"self.ping"},{"name":"self.ping"}]}`)), ready: true, calls: []int{ok}},
		{name: "list: schema a string", h: replyTo("tools/list", schemaTool(`"object"`)), ready: true, calls: []int{ok, inv}},
		{name: "list: schema an array", h: replyTo("tools/list", schemaTool(`[1,2]`)), ready: true, calls: []int{ok, inv}},
		{name: "list: properties a number", h: replyTo("tools/list", schemaTool(`{"type":"object","properties":5}`)), ready: true, calls: []int{ok, inv}},
		{name: "list: bounds of the wrong type", h: replyTo("tools/list", schemaTool(`{"type":"object","properties":{"a":{"type":["integer","string"],"minimum":"x","maximum":[]}},"required":"a"}`)), ready: true, calls: []int{ok, inv}},
		{name: "list: required names a missing property", h: replyTo("tools/list", schemaTool(`{"type":"object","properties":{},"required":["ghost",5,null]}`)), ready: true, calls: []int{ok, inv}},
		{name: "list: minimum above maximum", h: replyTo("tools/list", schemaTool(`{"type":"object","properties":{"a":{"type":"integer","minimum":10,"maximum":-10}},"required":["a"]}`)), ready: true, calls: []int{ok, inv}},
		{name: "list: huge bounds", h: replyTo("tools/list", schemaTool(`{"type":"object","properties":{"a":{"type":"integer","minimum":-1e308,"maximum":1e308}},"required":["a"]}`)), ready: true, calls: []int{ok, inv}},
		// tools/call
		{name: "call: wrong id", h: replyTo("tools/call", raw(`{"jsonrpc":"2.0","id":999999,"result":`+callResult+`}`)), ready: true, calls: []int{slow}},
		{name: "call: string id", h: replyTo("tools/call", raw(`{"jsonrpc":"2.0","id":"$ID","result":`+callResult+`}`)), ready: true, calls: []int{slow}},
		{name: "call: content not an array", h: replyTo("tools/call", withID(`{"content":"pong"}`)), ready: true, calls: []int{bad}},
		{name: "call: isError a string", h: replyTo("tools/call", withID(`{"content":[],"isError":"yes"}`)), ready: true, calls: []int{bad}},
		{name: "call: result null", h: replyTo("tools/call", withID(`null`)), ready: true, calls: []int{ok, bad}},
		{name: "call: error without message", h: replyTo("tools/call", raw(`{"jsonrpc":"2.0","id":$ID,"error":{}}`)), ready: true, calls: []int{bad}},
		{name: "call: error code a string", h: replyTo("tools/call", raw(`{"jsonrpc":"2.0","id":$ID,"error":{"code":"x","message":"m"}}`)), ready: true, calls: []int{bad, slow}},
		{name: "call: unescaped quotes in the error", h: replyTo("tools/call", raw(`{"jsonrpc":"2.0","id":$ID,"error":{"message":"bad "value" here"}}`)), ready: true, calls: []int{bad}},
		{name: "call: 60 KB text", h: replyTo("tools/call", withID(`{"content":[{"type":"text","text":"`+strings.Repeat("t", 60<<10)+`"}]}`)), ready: true, calls: []int{ok}},
		{name: "call: two replies, then one for a future id", h: replyTo("tools/call", func(req rpcRequest) []string {
			var next int
			_ = json.Unmarshal(req.ID, &next)
			return []string{result(req.ID, callResult), result(req.ID, `{"content":[{"type":"text","text":"dup"}]}`),
				result(json.RawMessage(fmt.Sprint(next+1)), `{"content":[{"type":"text","text":"from the future"}]}`)}
		}), ready: true, calls: []int{ok}},
		{name: "call: unknown content kinds", h: replyTo("tools/call", withID(`{"content":[{"type":"video","data":5},{"type":"image"},{}]}`)), ready: true, calls: []int{ok, bad}},
	}
}

// garbageReplies: scripted boards answer the bridge's initialize,
// tools/list and tools/call with garbage. Each ends clearly: ready (and
// every call answered) or closed with a reason that says what went wrong.
func garbageReplies(t *testing.T, b *bridge, s *tally) {
	url := b.App.DeviceURL()
	cases := garbageCases()
	parallel(t, s, len(cases), 6, func(i int) {
		c := cases[i]
		id := mac(10, i)
		fake, err := startFake(t, url, id, "", c.h)
		if err != nil {
			s.fail("%s: %v", c.name, err)
			return
		}
		defer fake.close()
		var reason string
		ended := assertEventually(func() bool {
			if b.ready(id) {
				return true
			}
			if text := fake.closeText(); text != "" {
				reason = text
				return true
			}
			return false
		})
		switch {
		case !ended:
			s.hang("%s: neither ready nor closed", c.name)
			return
		case c.ready && reason != "":
			s.fail("%s: closed (%q), want ready", c.name, reason)
			return
		case !c.ready && reason == "":
			s.fail("%s: ready, want closed with %q", c.name, c.want)
			return
		case !c.ready && !strings.Contains(strings.ToLower(reason), c.want):
			s.fail("%s: closed with %q, want %q", c.name, reason, c.want)
			return
		}
		tool := "self.ping"
		argSets := []any{nil, map[string]any{"a": 1, "p0": 0}}
		for n, args := range argSets {
			if len(c.calls) == 0 {
				break
			}
			code, body := b.call(id, tool, args)
			if containsInt(c.calls, code) || n == 1 && code == http.StatusUnprocessableEntity {
				continue
			}
			s.lose(answerLoss(code, body), "%s: call with %v: %d %s, want one of %v", c.name, args, code, clip(body), c.calls)
			return
		}
		s.ok()
	})
}

func containsInt(list []int, v int) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

// mqttPublishes: a board on the embedded broker publishes 250 malformed
// messages on the shared topic and its own uplink topic, and 20 onto
// another board's topics. Every one is accounted for by the gateway
// (dropped as malformed or oversized, or taken as a message) or by the
// broker (denied, or dropped over the board's rate: 250 at once is more
// than a board's burst).
func mqttPublishes(t *testing.T, b *bridge, s *tally) {
	m := newMutator(4)
	sb, err := simulator.NewBoard(simulator.Config{MAC: mac(11, 1), Profile: profile(t, "breadboard")})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	conn, err := sb.ConnectMQTT(ctx, simulator.MQTTConfig{Endpoint: "tcp://" + b.App.MQTTAddr().String()})
	require.NoError(t, err)
	defer conn.Close()
	b.waitReady(sb.MAC())
	gw, br := b.App.MQTTGateway(), b.App.MQTTBroker()
	seen := func() int64 {
		st, bs := gw.Stats(), br.Stats()
		return st.MessagesIn + st.Oversized + st.Malformed + st.InboxFull + st.UnknownTopic + st.Unattributed +
			bs.RateLimited + bs.QueueFull
	}
	before, deniedBefore := seen(), br.Stats().DeniedPublish

	seeds := []string{
		`{"session_id":"","type":"hello","version":3,"transport":"udp","features":{"mcp":true},"audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}`,
		`{"session_id":"","type":"mcp","payload":{"jsonrpc":"2.0","id":1,"result":{}}}`,
		`{"session_id":"","type":"goodbye"}`,
		`{"session_id":"","type":"listen","state":"detect","text":"hi"}`,
	}
	own := "devices/up/" + mqtt.TopicKey(sb.MAC())
	const n = 250
	sent := 0
	for i := range n {
		p := m.mutate([]byte(seeds[i%len(seeds)]))
		if i%50 == 0 {
			p = oversized(100 << 10)
		}
		topic := "device-server"
		if i%2 == 1 {
			topic = own
		}
		if err := conn.PublishRaw(ctx, topic, p); err != nil {
			s.fail("publish %d: %v", i, err)
			continue
		}
		sent++
	}
	victim := mqtt.TopicKey(mac(6, 1))
	for i := range 20 {
		topic := []string{"devices/up/" + victim, "devices/p2p/" + victim}[i%2]
		_ = conn.PublishRaw(ctx, topic, m.mutate([]byte(seeds[1])))
	}
	ok := assertEventually(func() bool {
		return seen()-before >= int64(sent) && br.Stats().DeniedPublish-deniedBefore >= 20
	})
	got, denied := seen()-before, br.Stats().DeniedPublish-deniedBefore
	t.Logf("mqtt: %d published, %d accounted for by the gateway, %d of 20 foreign publishes denied", sent, got, denied)
	for range sent {
		if ok {
			s.ok()
		} else {
			s.fail("publishes unaccounted for: %d published, %d seen", sent, got)
		}
	}
	for range 20 {
		if denied >= 20 {
			s.ok()
		} else {
			s.bypass("foreign publishes: %d of 20 denied", denied)
		}
	}
	// The publishing board itself still works, once it has worked through
	// what its garbage provoked (a server hello for every forged hello,
	// which a loaded machine can take seconds to process).
	var last string
	if !assertEventually(func() bool {
		code, body := b.call(sb.MAC(), "self.get_device_status", nil)
		last = fmt.Sprintf("%d %s", code, body)
		return code == http.StatusOK
	}) {
		s.fail("the publishing board no longer answers: %s", last)
	}
}

// mcpPost sends one JSON-RPC body to /mcp.
func (b *bridge) mcpPost(body []byte, h http.Header) (int, http.Header, []byte) {
	req, _ := http.NewRequest(http.MethodPost, b.Base+"/mcp", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := b.HTTP.Do(req)
	if err != nil {
		return 0, nil, []byte(err.Error())
	}
	out := readAll(resp)
	return resp.StatusCode, resp.Header, out
}

// mcpSession opens a 2025-06-18 session and returns the headers that use
// it.
func (b *bridge) mcpSession(t *testing.T, h http.Header) http.Header {
	t.Helper()
	code, hdr, body := b.mcpPost([]byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"faults","version":"1"}}}`), h)
	require.Equal(t, http.StatusOK, code, "%s", body)
	sid := hdr.Get("Mcp-Session-Id")
	require.NotEmpty(t, sid)
	out := http.Header{"Mcp-Session-Id": {sid}, "Mcp-Protocol-Version": {"2025-06-18"}}
	for k, v := range h {
		out[k] = v
	}
	code, _, body = b.mcpPost([]byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`), out)
	require.Equal(t, http.StatusAccepted, code, "%s", body)
	return out
}

// mcpBodies: 200 malformed bodies on /mcp: mutated JSON-RPC inside a
// session, outside one, in the stateless era, and past the body limit.
// Each gets a 2xx or 4xx answer, never a 5xx or a hang.
func mcpBodies(t *testing.T, b *bridge, s *tally, ref string) {
	m := newMutator(5)
	sess := b.mcpSession(t, nil)
	tool := "dev_" + strings.ReplaceAll(ref[9:], ":", "") + "_audio_speaker_set_volume"
	seeds := []string{
		`{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}}`,
		`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"` + tool + `","arguments":{"volume":10}}}`,
		`{"jsonrpc":"2.0","id":4,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":3}}`,
		`{"jsonrpc":"2.0","id":5,"method":"server/discover","params":{}}`,
	}
	modern := http.Header{"Mcp-Protocol-Version": {"2026-07-28"}}
	const n = 200
	bodies := make([][]byte, n)
	for i := range bodies {
		bodies[i] = m.mutate([]byte(seeds[i%len(seeds)]))
	}
	parallel(t, s, n, 8, func(i int) {
		body := bodies[i]
		h := sess
		switch i % 4 {
		case 1:
			h = nil
		case 2:
			h = modern
		}
		if i%50 == 0 {
			body = bytes.Repeat([]byte(" "), 5<<20)
		}
		code, _, out := b.mcpPost(body, h)
		if code >= 200 && code < 500 {
			s.ok()
			return
		}
		s.lose(answerLoss(code, out), "body %d %q: %d %s", i, clip(body), code, clip(out))
	})
	// Arguments of every wrong kind for a real tool, inside the session.
	for i, args := range []string{`5`, `"x"`, `[]`, `null`, `{"volume":"loud"}`, `{"volume":1e999}`, `{"volume":-1}`,
		`{"volume":101}`, `{"volume":1.5}`, `{"volume":null}`, `{"volume":{}}`, `{"volume":10,"extra":` + strings.Repeat("[", 3000) + strings.Repeat("]", 3000) + `}`} {
		body := `{"jsonrpc":"2.0","id":` + fmt.Sprint(100+i) + `,"method":"tools/call","params":{"name":"` + tool + `","arguments":` + args + `}}`
		code, _, out := b.mcpPost([]byte(body), sess)
		if code >= 200 && code < 500 {
			s.ok()
			continue
		}
		s.lose(answerLoss(code, out), "arguments %s: %d %s", clip([]byte(args)), code, clip(out))
	}
}

// apiBodies: 200 malformed requests on /api: mutated call bodies, odd
// paths, methods and content types, and a body past the limit. Each gets
// a documented JSON error (or a result, when the mutation left a valid
// call), never a 500 or a hang.
func apiBodies(t *testing.T, b *bridge, s *tally, ref string) {
	m := newMutator(6)
	seeds := []string{
		`{"name":"self.audio_speaker.set_volume","arguments":{"volume":35}}`,
		`{"name":"self.screen.set_theme","arguments":{"theme":"dark"}}`,
		`{"name":"self.get_device_status"}`,
	}
	paths := []string{"/api/devices/" + ref + "/call", "/api/devices/" + strings.ReplaceAll(ref, ":", "_") + "/call",
		"/api/devices/%00/call", "/api/devices/" + strings.Repeat("a", 5000) + "/call", "/api/devices//call",
		"/api/devices/../../healthz", "/api/devices/" + ref + "/call/x"}
	methods := []string{http.MethodPost, http.MethodPost, http.MethodPost, http.MethodPut, http.MethodGet, http.MethodDelete}
	const n = 200
	bodies := make([][]byte, n)
	for i := range bodies {
		bodies[i] = m.mutate([]byte(seeds[i%len(seeds)]))
	}
	parallel(t, s, n, 8, func(i int) {
		body := bodies[i]
		path := paths[0]
		if i%5 == 4 {
			path = paths[(i/5)%len(paths)]
		}
		method := methods[0]
		if i%7 == 6 {
			method = methods[(i/7)%len(methods)]
		}
		h := http.Header{}
		if i%11 == 10 {
			h.Set("Content-Type", "text/plain")
		}
		if i%50 == 0 {
			body = append([]byte(`{"name":"self.get_device_status","arguments":{"x":"`), bytes.Repeat([]byte("x"), 2<<20)...)
		}
		code, out := b.do(method, path, body, h)
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		jsonErr := json.Unmarshal(out, &e) == nil && e.Error.Code != "" && e.Error.Message != ""
		switch {
		case code == http.StatusOK:
			s.ok()
		case code >= 400 && code < 500 && jsonErr:
			s.ok()
		case code == http.StatusBadGateway && e.Error.Code == "device_error":
			s.ok() // the board refused arguments the schema allowed
		default:
			s.lose(answerLoss(code, out), "%s %s %q: %d %s", method, clip([]byte(path)), clip(body), code, clip(out))
		}
	})
}
