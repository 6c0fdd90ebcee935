package voicestub

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFrameDeframe(t *testing.T) {
	p := []byte("opus")
	for _, tc := range []struct {
		version int
		ts      uint32
		wire    []byte
	}{
		{1, 7, []byte("opus")},
		{2, 60, append([]byte{0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 60, 0, 0, 0, 4}, p...)},
		{3, 7, append([]byte{0, 0, 0, 4}, p...)},
	} {
		f, err := Frame(tc.version, tc.ts, p)
		require.NoError(t, err)
		assert.Equal(t, tc.wire, f, "v%d", tc.version)
		got, err := Deframe(tc.version, tc.wire)
		require.NoError(t, err)
		assert.Equal(t, p, got)
	}
	// Extra bytes after the declared payload are ignored, as by boards.
	got, err := Deframe(3, []byte{0, 0, 0, 1, 'x', 'y'})
	require.NoError(t, err)
	assert.Equal(t, []byte("x"), got)
	for _, bad := range []struct {
		v int
		f []byte
	}{{2, []byte{0, 2}}, {2, append(make([]byte, 15), 9)}, {3, []byte{0, 0}}, {3, []byte{0, 0, 0, 5, 'x'}}} {
		_, err := Deframe(bad.v, bad.f)
		assert.ErrorIs(t, err, ErrBadFrame, "v%d %v", bad.v, bad.f)
	}
	_, err = Frame(3, 0, make([]byte, 70000))
	assert.Error(t, err)
	_, err = Frame(4, 0, p)
	assert.Error(t, err)
}

func TestExpectedReply(t *testing.T) {
	assert.Equal(t, []byte("tts-2-abc"), ExpectedReply([][]byte{[]byte("abc"), []byte("z")}, 2))
	assert.Equal(t, []byte("tts-0-"), ExpectedReply(nil, 0))
	assert.Len(t, ExpectedReply([][]byte{make([]byte, 5000)}, 1), MaxReplyPayload)
	f := ExpectedFrame(2, [][]byte{[]byte("a")}, 3)
	assert.Equal(t, uint32(180), binary.BigEndian.Uint32(f[8:]), "v2 timestamp is k*60 ms")
}

func TestToken(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	tok := Token("s3cret", "cid", "aa:bb:cc:dd:ee:ff", now)
	assert.Regexp(t, `^[A-Za-z0-9_-]{43}\.1800000000$`, tok)
	assert.True(t, checkToken("s3cret", tok, "cid", "aa:bb:cc:dd:ee:ff", now))
	assert.False(t, checkToken("s3cret", tok, "cid", "aa:bb:cc:dd:ee:00", now), "other device")
	assert.False(t, checkToken("other", tok, "cid", "aa:bb:cc:dd:ee:ff", now), "other secret")
	assert.True(t, checkToken("s3cret", tok, "cid", "aa:bb:cc:dd:ee:ff", now.Add(TokenMaxAge)))
	assert.False(t, checkToken("s3cret", tok, "cid", "aa:bb:cc:dd:ee:ff", now.Add(TokenMaxAge+time.Second)), "expired")
	assert.True(t, checkToken("s3cret", tok, "cid", "aa:bb:cc:dd:ee:ff", now.Add(-TokenMaxFuture)))
	assert.False(t, checkToken("s3cret", tok, "cid", "aa:bb:cc:dd:ee:ff", now.Add(-TokenMaxFuture-time.Second)), "from the future")
	for _, bad := range []string{"", "abc", "abc.", ".1800000000", strings.Replace(tok, ".", ".x", 1)} {
		assert.False(t, checkToken("s3cret", bad, "cid", "aa:bb:cc:dd:ee:ff", now), bad)
	}
}

func TestAuth(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	s := startStub(t, Config{Tokens: []string{"static-tok"}, Secret: "s3cret", Now: func() time.Time { return now }})
	const mac = "aa:bb:cc:dd:ee:01"
	cid := boardHeader(mac, 1, "").Get("Client-Id")
	for _, tc := range []struct {
		name   string
		auth   string
		status int
		by     string
	}{
		{"static", "Bearer static-tok", 101, "static"},
		{"hmac", "Bearer " + Token("s3cret", cid, mac, now.Add(-time.Hour)), 101, "hmac"},
		{"hmac wrong secret", "Bearer " + Token("nope", cid, mac, now), 401, ""},
		{"hmac other device", "Bearer " + Token("s3cret", cid, "aa:bb:cc:dd:ee:02", now), 401, ""},
		{"hmac expired", "Bearer " + Token("s3cret", cid, mac, now.Add(-31*24*time.Hour)), 401, ""},
		{"hmac future", "Bearer " + Token("s3cret", cid, mac, now.Add(10*time.Minute)), 401, ""},
		{"wrong static", "Bearer static-tok2", 401, ""},
		{"no bearer", "static-tok", 401, ""},
		{"missing", "", 401, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := boardHeader(mac, 1, "")
			if tc.auth != "" {
				h.Set("Authorization", tc.auth)
			}
			b, resp, err := dial(t, s, h)
			if tc.status != 101 {
				require.Error(t, err)
				require.NotNil(t, resp)
				assert.Equal(t, tc.status, resp.StatusCode)
			} else {
				require.NoError(t, err)
				b.sendText(boardHello(1, false))
				b.readText()
			}
			c := last(t, s, mac)
			assert.Equal(t, tc.status, c.Status)
			assert.Equal(t, tc.by, c.AuthBy)
			assert.Equal(t, tc.auth != "", c.HasAuthorization)
			assert.Equal(t, cid, c.ClientID)
			assert.Equal(t, "1", c.ProtocolVersionHeader)
			assert.Empty(t, c.Header.Get("Authorization"), "the token is not kept")
		})
	}
}

func TestHelloAndHeaders(t *testing.T) {
	s := startStub(t, Config{})
	const mac = "aa:bb:cc:dd:ee:02"
	b := connect(t, s, mac, 3, false)
	require.NoError(t, s.WaitConnections(testCtx(t), mac, 1))
	c := last(t, s, mac)
	assert.Equal(t, 101, c.Status)
	assert.Equal(t, mac, c.DeviceID)
	assert.Equal(t, 3, c.ProtocolVersion)
	assert.Equal(t, boardHello(3, false), string(c.Hello))
	assert.False(t, c.HelloMCP)
	assert.True(t, c.HelloSent)
	assert.Equal(t, [][]byte{[]byte(boardHello(3, false))}, c.Texts)
	assert.Len(t, c.Sent, 1)

	// No MCP feature: no initialize; the next thing sent answers a turn.
	b.sendText(b.msg(`"type":"listen","state":"detect","text":"hi there"`))
	b.sendText(b.msg(`"type":"weird"`))
	b.sendText(`not json`)
	b.sendText(b.msg(`"type":"listen","state":"start","mode":"manual"`))
	b.sendText(b.msg(`"type":"listen","state":"stop"`))
	b.expectAnswer(3, DefaultTTSFrames, nil)
	require.NoError(t, s.WaitConversations(testCtx(t), mac, 1))
	c = last(t, s, mac)
	assert.Equal(t, []string{"hi there"}, c.WakeWords)
	assert.Equal(t, 2, c.Ignored)
	assert.Equal(t, 1, c.Answers)

	_, resp, err := dial(t, s, boardHeader(mac, 4, ""))
	require.Error(t, err)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
}

func TestFraming(t *testing.T) {
	for version := 1; version <= 3; version++ {
		t.Run(fmt.Sprintf("v%d", version), func(t *testing.T) {
			s := startStub(t, Config{TTSFrames: 4, AutoFrames: 3})
			mac := fmt.Sprintf("aa:bb:cc:dd:ee:1%d", version)
			b := connect(t, s, mac, version, false)
			var raw, heard [][]byte
			for turn := range 2 {
				mode := []string{"auto", "realtime"}[turn]
				b.sendText(b.msg(`"type":"listen","state":"start","mode":"` + mode + `"`))
				heard = heard[:0]
				for i := range 3 {
					p := []byte(fmt.Sprintf("opus-%d-%d", turn, i))
					f, err := Frame(version, 0, p)
					require.NoError(t, err)
					b.sendBinary(f)
					raw, heard = append(raw, f), append(heard, p)
				}
				b.expectAnswer(version, 4, heard)
			}
			require.NoError(t, s.WaitConversations(testCtx(t), mac, 2))
			require.NoError(t, s.WaitFrames(testCtx(t), mac, 6))
			c := last(t, s, mac)
			assert.Equal(t, raw, c.Frames, "raw frames as received")
			require.Len(t, c.Payloads, 6)
			assert.Equal(t, []byte("opus-1-2"), c.Payloads[5])
			require.Len(t, c.Conversations, 2)
			cv := c.Conversations[1]
			assert.Equal(t, "realtime", cv.Mode)
			assert.Equal(t, "frames", cv.EndedBy)
			assert.Equal(t, 3, cv.Heard)
			assert.Equal(t, raw[3:], cv.Frames)
			assert.True(t, cv.Answered)
			assert.Equal(t, 4, cv.FramesSent)
			assert.Equal(t, 2, c.Answers)
			assert.Equal(t, 8, c.FramesSent)
		})
	}
}

func TestManualTurn(t *testing.T) {
	s := startStub(t, Config{AutoFrames: 2, TTSFrames: 1})
	const mac = "aa:bb:cc:dd:ee:03"
	b := connect(t, s, mac, 2, false)
	b.sendBinary([]byte{1}) // malformed v2 frame outside a turn: recorded, counted
	b.sendText(b.msg(`"type":"listen","state":"start","mode":"manual"`))
	var heard [][]byte
	for i := range 5 { // more than AutoFrames: manual turns wait for stop
		p := []byte{byte(i)}
		f, _ := Frame(2, 0, p)
		b.sendBinary(f)
		heard = append(heard, p)
	}
	b.sendText(b.msg(`"type":"listen","state":"stop"`))
	b.expectAnswer(2, 1, heard)
	require.NoError(t, s.WaitConversations(testCtx(t), mac, 1))
	c := last(t, s, mac)
	assert.Equal(t, 1, c.BadFrames)
	assert.Nil(t, c.Payloads[0])
	assert.Equal(t, "stop", c.Conversations[0].EndedBy)
}

func TestStamp(t *testing.T) {
	for version := 1; version <= 3; version++ {
		t.Run(fmt.Sprintf("v%d", version), func(t *testing.T) {
			s := startStub(t, Config{TTSFrames: 3, Pace: time.Millisecond, Stamp: true})
			mac := fmt.Sprintf("aa:bb:cc:dd:ee:2%d", version)
			b := connect(t, s, mac, version, false)
			heard := [][]byte{[]byte("opus-0")}
			f, err := Frame(version, 0, heard[0])
			require.NoError(t, err)
			b.sendText(b.msg(`"type":"listen","state":"start","mode":"manual"`))
			b.sendBinary(f)
			before := time.Now()
			b.sendText(b.msg(`"type":"listen","state":"stop"`))
			for range 4 {
				b.readText() // stt, llm, tts start, sentence_start
			}
			var prev time.Time
			for k := range 3 {
				frame := b.readBinary()
				after := time.Now()
				if version == 2 {
					assert.Equal(t, uint32(k*ReplyFrameDuration), binary.BigEndian.Uint32(frame[8:]), "v2 timestamp")
				}
				p, err := Deframe(version, frame)
				require.NoError(t, err)
				at, ok := ReadStamp(p)
				require.True(t, ok)
				assert.False(t, at.Before(before) || at.After(after), "frame %d stamped %v, outside [%v, %v]", k, at, before, after)
				assert.False(t, at.Before(prev), "stamps in order")
				prev = at
				assert.Equal(t, ExpectedReply(heard, k), p[StampSize:], "the rest as unstamped")
				assert.Equal(t, StampedReply(heard, k, at), p)
			}
			assert.Equal(t, b.msg(`"type":"tts","state":"stop"`), b.readText())
		})
	}
	_, ok := ReadStamp(make([]byte, StampSize-1))
	assert.False(t, ok)
}

func TestAbort(t *testing.T) {
	// An hour between frames: the answer is certainly still going when
	// the abort arrives.
	s := startStub(t, Config{AutoFrames: 1, TTSFrames: 10, Pace: time.Hour})
	const mac = "aa:bb:cc:dd:ee:04"
	b := connect(t, s, mac, 1, false)
	b.sendText(b.msg(`"type":"listen","state":"start","mode":"auto"`))
	b.sendBinary([]byte("x"))
	for range 4 {
		b.readText() // stt, llm, tts start, sentence_start
	}
	assert.Equal(t, ExpectedFrame(1, [][]byte{[]byte("x")}, 0), b.readBinary())
	b.sendText(b.msg(`"type":"abort","reason":"wake_word_detected"`))
	assert.Equal(t, b.msg(`"type":"tts","state":"stop"`), b.readText())
	require.NoError(t, s.WaitConversations(testCtx(t), mac, 1))

	// An abort with nothing playing still gets its tts stop.
	b.sendText(b.msg(`"type":"abort"`))
	assert.Equal(t, b.msg(`"type":"tts","state":"stop"`), b.readText())
	require.NoError(t, s.Wait(testCtx(t), func(cs []Connection) bool { return len(cs[0].Sent) == 7 }))
	c := last(t, s, mac)
	assert.Equal(t, 2, c.Aborts)
	assert.Equal(t, 0, c.Answers)
	cv := c.Conversations[0]
	assert.True(t, cv.Aborted)
	assert.False(t, cv.Answered)
	assert.Equal(t, 1, cv.FramesSent)
}

// mcpBoard answers the stub's MCP opening: initialize, the notification,
// and two tools/list pages.
func mcpOpening(t *testing.T, b *board) (page1, page2 string) {
	t.Helper()
	env := func(p string) string { return b.msg(`"type":"mcp","payload":` + p) }
	require.Equal(t, env(InitializePayload), b.readText())
	b.sendText(env(`{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":{"name":"b","version":"2.4.2"}}}`))
	require.Equal(t, env(InitializedPayload), b.readText())
	require.Equal(t, env(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`), b.readText())
	page1 = `{"tools":[{"name":"self.a","description":"A","inputSchema":{"type":"object","properties":{}}}],"nextCursor":"self.b"}`
	b.sendText(env(`{"jsonrpc":"2.0","id":2,"result":` + page1 + `}`))
	require.Equal(t, env(`{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"cursor":"self.b"}}`), b.readText())
	page2 = `{"tools":[{"name":"self.b","description":"B","inputSchema":{"type":"object","properties":{"v":{"type":"integer"}},"required":["v"]}}]}`
	b.sendText(env(`{"jsonrpc":"2.0","id":2,"result":` + page2 + `}`))
	return page1, page2
}

func TestMCP(t *testing.T) {
	s := startStub(t, Config{})
	const mac = "aa:bb:cc:dd:ee:05"
	b := connect(t, s, mac, 1, true)
	page1, page2 := mcpOpening(t, b)
	require.NoError(t, s.WaitTools(testCtx(t), mac))
	c := last(t, s, mac)
	assert.True(t, c.ToolsListed)
	assert.Empty(t, c.MCPError)
	assert.JSONEq(t, `{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":{"name":"b","version":"2.4.2"}}`, string(c.InitializeResult))
	require.Len(t, c.ToolPages, 2)
	assert.Equal(t, page1, string(c.ToolPages[0]))
	assert.Equal(t, page2, string(c.ToolPages[1]))
	require.Len(t, c.Tools, 2)
	assert.Contains(t, string(c.Tools[1]), `"name":"self.b"`)
	assert.Len(t, c.MCPReplies, 3)

	type res struct {
		raw json.RawMessage
		err error
	}
	call := func(ctx context.Context, name string, args any) <-chan res {
		ch := make(chan res, 1)
		go func() {
			raw, err := s.CallTool(ctx, mac, name, args)
			ch <- res{raw, err}
		}()
		return ch
	}
	env := func(p string) string { return b.msg(`"type":"mcp","payload":` + p) }

	// Ids count up from 3; the result comes back as the board sent it.
	got := call(testCtx(t), "self.b", map[string]int{"v": 1})
	require.Equal(t, env(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"self.b","arguments":{"v":1}}}`), b.readText())
	b.sendText(env(`{"jsonrpc":"2.0","id":99,"result":{}}`)) // an id nobody asked for is ignored
	b.sendText(env(`{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"true"}],"isError":false}}`))
	r := <-got
	require.NoError(t, r.err)
	assert.Equal(t, `{"content":[{"type":"text","text":"true"}],"isError":false}`, string(r.raw))

	got = call(testCtx(t), "self.nope", nil)
	require.Equal(t, env(`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"self.nope","arguments":{}}}`), b.readText())
	b.sendText(env(`{"jsonrpc":"2.0","id":4,"error":{"message":"Unknown tool: self.nope"}}`))
	r = <-got
	var te *ToolError
	require.ErrorAs(t, r.err, &te)
	assert.Equal(t, "Unknown tool: self.nope", te.Message)

	// The firmware does not escape error text: the reply is invalid JSON,
	// and still ends the call.
	got = call(testCtx(t), `a"b`, nil)
	require.Equal(t, env(`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"a\"b","arguments":{}}}`), b.readText())
	broken := env(`{"jsonrpc":"2.0","id":5,"error":{"message":"Unknown tool: a"b"}}`)
	b.sendText(broken)
	r = <-got
	require.ErrorAs(t, r.err, &te)
	assert.Equal(t, broken, string(te.Raw))

	// The caller's context bounds the wait.
	ctx, cancel := context.WithCancel(context.Background())
	got = call(ctx, "self.a", nil)
	require.Contains(t, b.readText(), `"id":6`)
	cancel()
	assert.ErrorIs(t, (<-got).err, context.Canceled)

	_, err := s.CallTool(testCtx(t), "aa:bb:cc:dd:ee:99", "self.a", nil)
	assert.ErrorIs(t, err, ErrNoDevice)

	// A connection that ends fails the calls waiting on it.
	got = call(testCtx(t), "self.a", nil)
	require.Contains(t, b.readText(), `"id":7`)
	assert.Equal(t, 1, s.Disconnect(mac))
	assert.ErrorIs(t, (<-got).err, ErrConnectionClosed)
	b.expectClosed()
	require.NoError(t, s.Wait(testCtx(t), func(cs []Connection) bool { return cs[0].Closed }))
	assert.Equal(t, "disconnected by test", last(t, s, mac).CloseReason)
}

func TestMCPErrors(t *testing.T) {
	s := startStub(t, Config{MaxToolPages: 1})
	const mac = "aa:bb:cc:dd:ee:06"
	b := connect(t, s, mac, 1, true)
	env := func(p string) string { return b.msg(`"type":"mcp","payload":` + p) }
	b.readText() // initialize
	b.sendText(env(`{"jsonrpc":"2.0","id":1,"result":{}}`))
	b.readText() // notifications/initialized
	b.readText() // tools/list
	b.sendText(env(`{"jsonrpc":"2.0","id":2,"result":{"tools":[],"nextCursor":"x"}}`))
	require.NoError(t, s.WaitTools(testCtx(t), mac))
	c := last(t, s, mac)
	assert.False(t, c.ToolsListed)
	assert.Equal(t, "tools/list: more than 1 pages", c.MCPError)
}

func TestOTA(t *testing.T) {
	s := startStub(t, Config{Tokens: []string{"tok-a", "tok-b"}, ActivationCode: "123456"})
	post := func(path, mac, body string) (*http.Response, map[string]any) {
		t.Helper()
		req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, strings.TrimSuffix(s.OTAURL(), OTAPath)+path, strings.NewReader(body))
		require.NoError(t, err)
		if mac != "" {
			req.Header.Set("Device-Id", mac)
		}
		req.Header.Set("Client-Id", "cid")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var m map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&m)
		return resp, m
	}
	const mac, body = "aa:bb:cc:dd:ee:07", `{"version":2,"application":{"name":"xiaozhi","version":"2.4.2"}}`
	resp, m := post(OTAPath, mac, body)
	require.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, map[string]any{"version": "2.4.2", "url": ""}, m["firmware"])
	assert.Equal(t, map[string]any{"url": s.URL(), "token": "tok-a"}, m["websocket"])
	assert.NotZero(t, m["server_time"].(map[string]any)["timestamp"])
	act := m["activation"].(map[string]any)
	assert.Equal(t, "123456", act["code"])
	assert.NotEmpty(t, act["challenge"])

	resp, _ = post(ActivatePath, mac, `{}`)
	assert.Equal(t, http.StatusAccepted, resp.StatusCode)
	_, m = post(OTAPath, mac, body)
	assert.Contains(t, m, "activation", "still pending after 202")
	resp, _ = post(ActivatePath, mac, `{}`)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	resp, _ = post(ActivatePath, mac, `{}`)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	_, m = post(OTAPath, mac, body)
	assert.NotContains(t, m, "activation", "activated")
	_, m = post(OTAPath, "aa:bb:cc:dd:ee:08", `{"application":{"version":"v2"}}`)
	assert.Contains(t, m, "activation", "another device is not activated")
	assert.NotContains(t, m, "firmware", "a version boards cannot parse is not echoed")

	resp, _ = post(OTAPath, mac, strings.Repeat(" ", MaxOTABody+1))
	assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
	resp, _ = post(OTAPath, "", body)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	get, err := http.Get(s.OTAURL())
	require.NoError(t, err)
	get.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, get.StatusCode)

	reqs := s.OTARequests()
	require.Len(t, reqs, 10)
	assert.Equal(t, OTARequest{Path: ActivatePath, DeviceID: mac, ClientID: "cid", Body: []byte(`{}`), Status: 202}, reqs[1])
}

func TestOTAHMACToken(t *testing.T) {
	s := startStub(t, Config{Secret: "s3cret"})
	req, err := http.NewRequest(http.MethodPost, s.OTAURL(), strings.NewReader(`{}`))
	require.NoError(t, err)
	req.Header.Set("Device-Id", "aa:bb:cc:dd:ee:09")
	req.Header.Set("Client-Id", "cid")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var m struct {
		WebSocket struct{ Token string } `json:"websocket"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&m))
	assert.True(t, checkToken("s3cret", m.WebSocket.Token, "cid", "aa:bb:cc:dd:ee:09", time.Now()))
}

func TestFaults(t *testing.T) {
	t.Run("refuse upgrade", func(t *testing.T) {
		s := startStub(t, Config{Faults: Faults{RefuseUpgrade: true}})
		_, resp, err := dial(t, s, boardHeader("aa:bb:cc:dd:ee:20", 1, ""))
		require.Error(t, err)
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		s.SetFaults(Faults{})
		connect(t, s, "aa:bb:cc:dd:ee:20", 1, false)
	})
	t.Run("no hello", func(t *testing.T) {
		s := startStub(t, Config{AutoFrames: 1, TTSFrames: 1, Faults: Faults{NoHello: true}})
		b, _, err := dial(t, s, boardHeader("aa:bb:cc:dd:ee:21", 1, ""))
		require.NoError(t, err)
		b.sendText(boardHello(1, true))
		b.sendText(`{"session_id":"","type":"listen","state":"start","mode":"auto"}`)
		b.sendBinary([]byte("x"))
		assert.Contains(t, b.readText(), `"type":"stt"`, "the first message is the answer, not a hello")
		c := last(t, s, "aa:bb:cc:dd:ee:21")
		assert.False(t, c.HelloSent)
		assert.NotEmpty(t, c.Hello)
	})
	t.Run("hello delay", func(t *testing.T) {
		s := startStub(t, Config{Faults: Faults{HelloDelay: time.Millisecond}})
		connect(t, s, "aa:bb:cc:dd:ee:22", 1, false)
	})
	t.Run("close on hello", func(t *testing.T) {
		s := startStub(t, Config{Faults: Faults{CloseOnHello: true}})
		b, _, err := dial(t, s, boardHeader("aa:bb:cc:dd:ee:23", 1, ""))
		require.NoError(t, err)
		b.sendText(boardHello(1, true))
		b.expectClosed()
		require.NoError(t, s.Wait(testCtx(t), func(cs []Connection) bool { return cs[0].Closed }))
		assert.Equal(t, "closed on hello (fault)", s.Connections()[0].CloseReason)
	})
	t.Run("close after frames", func(t *testing.T) {
		s := startStub(t, Config{Faults: Faults{CloseAfterFrames: 2}})
		const mac = "aa:bb:cc:dd:ee:24"
		b := connect(t, s, mac, 1, false)
		b.sendBinary([]byte("1"))
		b.sendBinary([]byte("2"))
		b.expectClosed()
		require.NoError(t, s.Wait(testCtx(t), func(cs []Connection) bool { return cs[0].Closed }))
		c := last(t, s, mac)
		assert.Len(t, c.Frames, 2)
		assert.Equal(t, "closed after 2 frames (fault)", c.CloseReason)
	})
	t.Run("slow reader", func(t *testing.T) {
		// The reader stalls for an hour after the hello; Close must still
		// end the connection and its goroutines.
		s, err := New(Config{Faults: Faults{StallAfter: 1, StallFor: time.Hour}})
		require.NoError(t, err)
		require.NoError(t, s.Start("127.0.0.1:0"))
		const mac = "aa:bb:cc:dd:ee:25"
		b := connect(t, s, mac, 1, false)
		b.sendText(b.msg(`"type":"listen","state":"detect","text":"w"`))
		require.NoError(t, s.Close())
		c := last(t, s, mac)
		assert.True(t, c.Closed)
		assert.Equal(t, "server closed", c.CloseReason)
		assert.Len(t, c.Texts, 1, "the stalled reader took nothing more")
		_, _, err = dial(t, s, boardHeader(mac, 1, ""))
		assert.Error(t, err)
	})
}

func TestLimits(t *testing.T) {
	s := startStub(t, Config{MaxConns: 1, MaxRecords: 2})
	const mac = "aa:bb:cc:dd:ee:30"
	b := connect(t, s, mac, 1, false)
	_, resp, err := dial(t, s, boardHeader("aa:bb:cc:dd:ee:31", 1, ""))
	require.Error(t, err)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)

	for range 3 {
		b.sendText(b.msg(`"type":"listen","state":"detect","text":"w"`))
	}
	b.sendBinary(make([]byte, ReadLimit+1))
	b.expectClosed()
	require.NoError(t, s.Wait(testCtx(t), func(cs []Connection) bool { return cs[0].Closed }))
	c := last(t, s, mac)
	assert.Len(t, c.Texts, 2)
	assert.Len(t, c.WakeWords, 2)
	assert.True(t, c.Truncated)
	assert.Contains(t, c.CloseReason, "read limit")
	assert.Zero(t, c.FramesHeard)

	// The slot is free again.
	connect(t, s, "aa:bb:cc:dd:ee:31", 1, false)
}

func TestConfigErrors(t *testing.T) {
	for _, cfg := range []Config{
		{Tokens: []string{""}},
		{Tokens: []string{"a b"}},
		{ActivationCode: "12a"},
		{WebSocketURL: "http://x/"},
		{TTSFrames: -1},
		{MaxConns: -1},
		{Pace: -1},
	} {
		_, err := New(cfg)
		assert.Error(t, err, "%+v", cfg)
	}
	s, err := New(Config{})
	require.NoError(t, err)
	assert.Empty(t, s.URL())
	require.NoError(t, s.Close())
	assert.True(t, errors.Is(s.Start("127.0.0.1:0"), ErrClosed))
}
