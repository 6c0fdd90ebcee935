package simulator

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type convResult struct {
	c   *Conversation
	err error
}

// converseAsync runs Converse in the background; the test collects the
// result with waitConv.
func converseAsync(b *Board, opts ConverseOptions) <-chan convResult {
	res := make(chan convResult, 1)
	go func() {
		c, err := b.Converse(context.Background(), opts)
		res <- convResult{c, err}
	}()
	return res
}

func waitConv(t *testing.T, res <-chan convResult) convResult {
	t.Helper()
	select {
	case r := <-res:
		return r
	case <-time.After(waitTimeout):
		t.Fatal("Converse did not return")
		return convResult{}
	}
}

func (sc *serverConn) writeBinary(t *testing.T, data []byte) {
	t.Helper()
	require.NoError(t, sc.c.SetWriteDeadline(time.Now().Add(waitTimeout)))
	require.NoError(t, sc.c.WriteMessage(websocket.BinaryMessage, data))
}

func (sc *serverConn) readBinary(t *testing.T) []byte {
	t.Helper()
	typ, data := sc.read(t)
	require.Equal(t, websocket.BinaryMessage, typ, "want audio, got %q", data)
	return []byte(data)
}

// wsFrame frames payload for binary protocol version v as §3.7 lays it
// out, written independently of the simulator's own framing.
func wsFrame(v int, payload []byte, ts uint32) []byte {
	switch v {
	case 2:
		h := []byte{0, 2, 0, 0, 0, 0, 0, 0}
		h = binary.BigEndian.AppendUint32(h, ts)
		h = binary.BigEndian.AppendUint32(h, uint32(len(payload)))
		return append(h, payload...)
	case 3:
		h := []byte{0, 0}
		h = binary.BigEndian.AppendUint16(h, uint16(len(payload)))
		return append(h, payload...)
	}
	return append([]byte{}, payload...)
}

// requireQuiet proves the board sent nothing more: the next message it
// sends is the answer to a marker request.
func (sc *serverConn) requireQuiet(t *testing.T) {
	t.Helper()
	sc.write(t, fmt.Sprintf(`{"type":"mcp","payload":{"jsonrpc":"2.0","id":%d,"method":"ping"}}`, markerID))
	assert.Contains(t, sc.readText(t), fmt.Sprintf(`"id":%d,"error"`, markerID))
}

// TestConverseWS holds a conversation over each binary protocol version:
// wake word, listen start, the uplink framed byte for byte, then the
// server's answer, whose audio is played only between tts start and stop
// and recorded without its header.
func TestConverseWS(t *testing.T) {
	for _, v := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("v%d", v), func(t *testing.T) {
			ts := newTestServer(t, nil)
			b := newTestBoard(t, Config{MAC: "02:00:00:00:c0:01", ProtocolVersion: v})
			sc, _, err := connect(t, b, ts, serverHello)
			require.NoError(t, err)

			res := converseAsync(b, ConverseOptions{Frames: 3, FrameBytes: 40, WakeWord: "你好小智"})
			assert.Equal(t, `{"session_id":"sess-1","type":"listen","state":"detect","text":"你好小智"}`, sc.readText(t))
			assert.Equal(t, `{"session_id":"sess-1","type":"listen","state":"start","mode":"auto"}`, sc.readText(t))
			for k := range 3 {
				want := DefaultPayload("02:00:00:00:c0:01", k, 40)
				require.Len(t, want, 40)
				assert.Equal(t, wsFrame(v, want, 0), sc.readBinary(t), "uplink packet %d", k)
			}

			sc.writeBinary(t, wsFrame(v, []byte("too early"), 0)) // not speaking yet: dropped
			sc.write(t, `{"session_id":"sess-1","type":"stt","text":"what time is it"}`)
			sc.write(t, `{"type":"llm","text":"😀","emotion":"happy"}`)
			sc.write(t, `{"type":"tts","state":"start"}`)
			sc.write(t, `{"type":"tts","state":"sentence_start","text":"It is noon."}`)
			down := [][]byte{{0x00, 0x01, 0x02}, bytes.Repeat([]byte{0xab}, 300), []byte("last")}
			for i, p := range down {
				sc.writeBinary(t, wsFrame(v, p, uint32(100*i)))
			}
			if v > 1 {
				// A payload_size shorter than the frame: the firmware
				// believes it; a frame shorter than its header is rejected.
				f := wsFrame(v, []byte("abcdef"), 0)
				if v == 2 {
					binary.BigEndian.PutUint32(f[12:16], 3)
				} else {
					binary.BigEndian.PutUint16(f[2:4], 3)
				}
				sc.writeBinary(t, f)
				down = append(down, []byte("abc"))
				sc.writeBinary(t, []byte{0, 2})
			}
			sc.write(t, `{"type":"alert","status":"Warning","message":"low battery","emotion":"sad"}`)
			sc.write(t, `{"type":"alert","status":"incomplete"}`)
			sc.write(t, `{"type":"tts","state":"stop"}`)

			r := waitConv(t, res)
			require.NoError(t, r.err)
			c := r.c
			assert.Equal(t, "websocket", c.Transport)
			assert.Equal(t, "sess-1", c.SessionID)
			assert.Equal(t, 3, c.UplinkSent)
			assert.Equal(t, 1, c.Turns)
			assert.Equal(t, []string{"what time is it"}, c.STT)
			assert.Equal(t, []string{"happy"}, c.Emotions)
			assert.Equal(t, []string{"It is noon."}, c.Sentences)
			assert.Equal(t, []Alert{{Status: "Warning", Message: "low battery", Emotion: "sad"}}, c.Alerts)
			assert.Equal(t, down, c.Payloads())
			assert.Equal(t, 1, c.Dropped)
			assert.Zero(t, c.QueueDropped)
			if v > 1 {
				assert.Equal(t, 1, c.Malformed)
				assert.Equal(t, 1, c.Rejected)
			}
			if v == 2 {
				assert.Equal(t, []uint32{0, 100, 200, 0}, []uint32{c.Audio[0].Timestamp, c.Audio[1].Timestamp, c.Audio[2].Timestamp, c.Audio[3].Timestamp})
			}
			assert.Len(t, c.Messages, 7)
			assert.Equal(t, `{"type":"tts","state":"stop"}`, c.Messages[6])
			for i := 1; i < len(c.Audio); i++ {
				assert.False(t, c.Audio[i].At.Before(c.Audio[i-1].At), "arrival times in order")
			}
			assert.False(t, c.TTSStart.Before(c.UplinkDone))
			assert.False(t, c.TTSStop.Before(c.TTSStart))
			assert.Equal(t, "idle", b.AudioState())
			// The writer counts a frame after its write returns, which may be
			// after the server read it.
			require.Eventually(t, func() bool { return b.Stats().AudioSent == 3 }, waitTimeout, time.Millisecond)
			assert.EqualValues(t, 1, b.Stats().Conversations)

			// By default the board does not listen again after tts stop.
			sc.requireQuiet(t)
		})
	}
}

// TestConverseManualTurns: push to talk sends listen stop after its
// packets; a second turn is a second press, and packet numbers go on.
func TestConverseManualTurns(t *testing.T) {
	ts := newTestServer(t, nil)
	b := newTestBoard(t, Config{MAC: "02:00:00:00:c0:02"})
	sc, _, err := connect(t, b, ts, serverHello)
	require.NoError(t, err)

	res := converseAsync(b, ConverseOptions{Frames: 2, Mode: ModeManual, Turns: 2, Pace: time.Millisecond})
	for turn := range 2 {
		assert.Equal(t, `{"session_id":"sess-1","type":"listen","state":"start","mode":"manual"}`, sc.readText(t))
		for k := 2 * turn; k < 2*turn+2; k++ {
			assert.Equal(t, DefaultPayload("02:00:00:00:c0:02", k, 0), sc.readBinary(t))
		}
		assert.Equal(t, `{"session_id":"sess-1","type":"listen","state":"stop"}`, sc.readText(t))
		// Idle after listen stop; tts start is allowed from idle.
		sc.write(t, `{"type":"tts","state":"start"}`)
		sc.writeBinary(t, []byte{byte(turn)})
		sc.write(t, `{"type":"tts","state":"stop"}`)
	}
	r := waitConv(t, res)
	require.NoError(t, r.err)
	assert.Equal(t, 2, r.c.Turns)
	assert.Equal(t, 4, r.c.UplinkSent)
	assert.Equal(t, [][]byte{{0}, {1}}, r.c.Payloads())
	assert.Equal(t, "idle", b.AudioState())
	sc.requireQuiet(t)
}

// TestConverseListenAfter: with ListenAfter the board sends listen start
// again after tts stop, as the firmware does in auto mode, and stays
// listening.
func TestConverseListenAfter(t *testing.T) {
	ts := newTestServer(t, nil)
	b := newTestBoard(t, Config{})
	sc, _, err := connect(t, b, ts, serverHello)
	require.NoError(t, err)
	res := converseAsync(b, ConverseOptions{Frames: 1, ListenAfter: true})
	listen := `{"session_id":"sess-1","type":"listen","state":"start","mode":"auto"}`
	assert.Equal(t, listen, sc.readText(t))
	sc.readBinary(t)
	sc.write(t, `{"type":"tts","state":"start"}`)
	sc.write(t, `{"type":"tts","state":"stop"}`)
	assert.Equal(t, listen, sc.readText(t))
	require.NoError(t, waitConv(t, res).err)
	assert.Equal(t, "listening", b.AudioState())
}

// TestConverseStopsUplinkWhenSpeaking: in auto mode the board sends audio
// only while listening, so a server that answers early cuts the uplink.
func TestConverseStopsUplinkWhenSpeaking(t *testing.T) {
	ts := newTestServer(t, nil)
	b := newTestBoard(t, Config{})
	sc, _, err := connect(t, b, ts, serverHello)
	require.NoError(t, err)
	const frames = 1000
	res := converseAsync(b, ConverseOptions{Frames: frames, Pace: 2 * time.Millisecond})
	sc.readText(t)
	sc.readBinary(t)
	sc.write(t, `{"type":"tts","state":"start"}`)
	sc.write(t, `{"type":"tts","state":"stop"}`)
	r := waitConv(t, res)
	require.NoError(t, r.err)
	require.Less(t, r.c.UplinkSent, frames)
	// What the board counted is what went on the wire.
	sc.write(t, fmt.Sprintf(`{"type":"mcp","payload":{"jsonrpc":"2.0","id":%d,"method":"ping"}}`, markerID))
	n := 1
	for {
		typ, _ := sc.read(t)
		if typ == websocket.TextMessage {
			break
		}
		n++
	}
	assert.Equal(t, r.c.UplinkSent, n)
}

// TestConverseDecodeQueue: the board queues at most 40 packets besides
// the one playing and drops the rest; DecodeQueue -1 lifts the bound.
func TestConverseDecodeQueue(t *testing.T) {
	ts := newTestServer(t, nil)
	b := newTestBoard(t, Config{})
	// Ten-minute frames: nothing plays out during the test.
	sc, _, err := connect(t, b, ts, `{"type":"hello","transport":"websocket","session_id":"q","audio_params":{"frame_duration":600000}}`)
	require.NoError(t, err)
	for _, tc := range []struct {
		queue, played int
	}{{0, 41}, {-1, 45}} {
		res := converseAsync(b, ConverseOptions{DecodeQueue: tc.queue})
		sc.readText(t)
		sc.write(t, `{"type":"tts","state":"start"}`)
		for i := range 45 {
			sc.writeBinary(t, []byte{byte(i)})
		}
		sc.write(t, `{"type":"tts","state":"stop"}`)
		r := waitConv(t, res)
		require.NoError(t, r.err)
		assert.Len(t, r.c.Audio, tc.played, "queue %d", tc.queue)
		assert.Equal(t, 45-tc.played, r.c.QueueDropped)
		assert.Equal(t, byte(tc.played-1), r.c.Audio[tc.played-1].Payload[0], "the first packets play, the late ones drop")
	}
}

// TestConverseEnds: a closed socket, a silent server and a cancelled
// context each end the conversation with an error that says so.
func TestConverseEnds(t *testing.T) {
	t.Run("socket closed", func(t *testing.T) {
		ts := newTestServer(t, nil)
		b := newTestBoard(t, Config{})
		sc, _, err := connect(t, b, ts, serverHello)
		require.NoError(t, err)
		res := converseAsync(b, ConverseOptions{Frames: 1})
		sc.readText(t)
		sc.readBinary(t)
		sc.write(t, `{"type":"stt","text":"heard"}`)
		require.NoError(t, sc.c.Close())
		r := waitConv(t, res)
		require.ErrorIs(t, r.err, ErrConnectionLost)
		assert.Contains(t, r.err.Error(), "conversation ended with the connection")
		assert.Equal(t, []string{"heard"}, r.c.STT, "what came before is kept")
		assert.EqualValues(t, 1, b.Stats().ConversationErrors)
	})
	t.Run("reply timeout", func(t *testing.T) {
		ts := newTestServer(t, nil)
		b := newTestBoard(t, Config{})
		sc, _, err := connect(t, b, ts, serverHello)
		require.NoError(t, err)
		res := converseAsync(b, ConverseOptions{ReplyTimeout: 20 * time.Millisecond})
		sc.readText(t)
		r := waitConv(t, res)
		require.ErrorIs(t, r.err, ErrReplyTimeout)
		assert.Equal(t, "idle", b.AudioState())
	})
	t.Run("context", func(t *testing.T) {
		ts := newTestServer(t, nil)
		b := newTestBoard(t, Config{})
		sc, _, err := connect(t, b, ts, serverHello)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		res := make(chan error, 1)
		go func() {
			_, err := b.Converse(ctx, ConverseOptions{})
			res <- err
		}()
		sc.readText(t)
		cancel()
		require.ErrorIs(t, waitErr(t, res), context.Canceled)
	})
}

func TestConverseRefusals(t *testing.T) {
	b := newTestBoard(t, Config{})
	_, err := b.Converse(context.Background(), ConverseOptions{})
	require.ErrorIs(t, err, ErrNotConnected)
	for _, bad := range []ConverseOptions{
		{Frames: -1}, {FrameBytes: MaxAudioPayload + 1}, {Mode: "push"}, {Pace: -1}, {Turns: -1},
		{ListenAfter: true, Goodbye: true},
	} {
		_, err := b.Converse(context.Background(), bad)
		assert.Error(t, err, "%+v", bad)
		assert.NotErrorIs(t, err, ErrNotConnected, "%+v", bad)
	}

	ts := newTestServer(t, nil)
	sc, _, err := connect(t, b, ts, serverHello)
	require.NoError(t, err)
	_, err = b.Converse(context.Background(), ConverseOptions{Frames: 1, Payload: func(int) []byte { return make([]byte, MaxAudioPayload+1) }})
	require.ErrorContains(t, err, "at most 1484")
	sc.readText(t) // its listen start

	res := converseAsync(b, ConverseOptions{ReplyTimeout: waitTimeout})
	sc.readText(t)
	_, err = b.Converse(context.Background(), ConverseOptions{})
	require.ErrorIs(t, err, ErrConversationBusy)
	sc.write(t, `{"type":"tts","state":"stop"}`)
	require.NoError(t, waitConv(t, res).err)
}

func TestDefaultPayload(t *testing.T) {
	assert.Equal(t, "opus 02:00:00:00:00:01 #7 ", string(DefaultPayload("02:00:00:00:00:01", 7, 0)))
	assert.Equal(t, "opus 02:00:00:00:00:01 #7 hijk", string(DefaultPayload("02:00:00:00:00:01", 7, 30)))
	assert.Equal(t, "opus 02", string(DefaultPayload("02:00:00:00:00:01", 7, 7)))
	assert.Len(t, DefaultPayload("02:00:00:00:00:01", 1, MaxAudioPayload), MaxAudioPayload)
}

// udpServer is the test's side of the audio channel: a UDP socket on
// loopback with the key and nonce its hello hands out.
type udpServer struct {
	t     *testing.T
	conn  *net.UDPConn
	port  int
	key   []byte
	nonce []byte
	board *net.UDPAddr // learnt from the first datagram
}

const (
	convKey   = "00112233445566778899aabbccddeeff"
	convNonce = "0100000012345678000000000000000a"
)

func newUDPServer(t *testing.T) *udpServer {
	t.Helper()
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	k, _ := hex.DecodeString(convKey)
	n, _ := hex.DecodeString(convNonce)
	return &udpServer{t: t, conn: conn, port: conn.LocalAddr().(*net.UDPAddr).Port, key: k, nonce: n}
}

func (u *udpServer) hello(sessionID string) string {
	return udpHello(sessionID, "127.0.0.1", u.port, convKey, convNonce)
}

// read returns the next datagram's header and decrypted payload.
func (u *udpServer) read() (header, payload []byte) {
	u.t.Helper()
	buf := make([]byte, 2048)
	require.NoError(u.t, u.conn.SetReadDeadline(time.Now().Add(waitTimeout)))
	n, from, err := u.conn.ReadFromUDP(buf)
	require.NoError(u.t, err)
	u.board = from
	require.GreaterOrEqual(u.t, n, 16)
	block, _ := aes.NewCipher(u.key)
	payload = make([]byte, n-16)
	cipher.NewCTR(block, buf[:16]).XORKeyStream(payload, buf[16:n])
	return buf[:16], payload
}

// packet builds a server→device datagram: type 0x01, the nonce's ssrc,
// sequence seq, encrypted with key.
func (u *udpServer) packet(key []byte, seq, ts uint32, payload []byte) []byte {
	pkt := make([]byte, 16+len(payload))
	copy(pkt, u.nonce)
	binary.BigEndian.PutUint16(pkt[2:4], uint16(len(payload)))
	binary.BigEndian.PutUint32(pkt[8:12], ts)
	binary.BigEndian.PutUint32(pkt[12:16], seq)
	block, _ := aes.NewCipher(key)
	cipher.NewCTR(block, pkt[:16]).XORKeyStream(pkt[16:], payload)
	return pkt
}

func (u *udpServer) send(pkt []byte) {
	u.t.Helper()
	_, err := u.conn.WriteToUDP(pkt, u.board)
	require.NoError(u.t, err)
}

// TestConverseMQTT holds a push-to-talk conversation over MQTT and UDP:
// hello, listen start and stop, encrypted uplink byte for byte; downlink
// decrypted and played only while speaking; datagrams failing the
// firmware's checks, or from another address, dropped; a wrong key passes
// (there is no tag) and plays noise; Goodbye ends the channel.
func TestConverseMQTT(t *testing.T) {
	srv, url := startMQTTServer(t)
	udp := newUDPServer(t)
	b := mqttBoard(t, Config{MAC: "02:00:00:00:c0:03"})
	conn := connectTestMQTT(t, b, MQTTConfig{Endpoint: url})

	res := converseAsync(b, ConverseOptions{Frames: 3, Mode: ModeManual, Goodbye: true})
	assert.Contains(t, string(srv.waitUplink(1).Payload), `"type":"hello","version":3,"transport":"udp"`)
	srv.down(udp.hello("s-conv"))
	assert.Equal(t, `{"session_id":"s-conv","type":"listen","state":"start","mode":"manual"}`, string(srv.waitUplink(2).Payload))
	for k := range 3 {
		header, payload := udp.read()
		want := make([]byte, 16)
		copy(want, udp.nonce)
		binary.BigEndian.PutUint16(want[2:4], uint16(len(payload)))
		binary.BigEndian.PutUint32(want[12:16], uint32(k+1)) // from 1
		assert.Equal(t, want, header, "header of packet %d", k)
		assert.Equal(t, DefaultPayload("02:00:00:00:c0:03", k, 0), payload)
	}
	assert.Equal(t, `{"session_id":"s-conv","type":"listen","state":"stop"}`, string(srv.waitUplink(3).Payload))

	// Idle: a valid datagram is accepted by the transport but not played.
	udp.send(udp.packet(udp.key, 1, 0, []byte("not yet")))
	require.Eventually(t, func() bool { return conn.Stats().AudioReceived == 1 }, waitTimeout, time.Millisecond)

	srv.down(`{"session_id":"s-conv","type":"stt","text":"turn on the lamp"}`)
	srv.down(`{"session_id":"s-conv","type":"tts","state":"start"}`)
	require.Eventually(t, func() bool { return b.AudioState() == "speaking" }, waitTimeout, time.Millisecond)

	// From another port: the board's socket is connected, so it never
	// sees this one (it would otherwise raise the sequence to 10).
	other, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer other.Close()
	_, err = other.WriteToUDP(udp.packet(udp.key, 10, 0, []byte("foreign")), udp.board)
	require.NoError(t, err)

	wrongKey := bytes.Repeat([]byte{0x42}, 16)
	badType := udp.packet(udp.key, 3, 0, []byte("type"))
	badType[0] = 0x02
	badLen := udp.packet(udp.key, 3, 0, []byte("length"))
	badLen = badLen[:len(badLen)-1]
	udp.send(udp.packet(udp.key, 2, 960, []byte("hello-1")))
	udp.send(udp.packet(udp.key, 2, 0, []byte("duplicate")))
	udp.send(udp.packet(udp.key, 1, 0, []byte("older")))
	udp.send(badType)
	udp.send(badLen)
	udp.send(udp.packet(wrongKey, 3, 0, []byte("secret")))
	udp.send(udp.packet(udp.key, 5, 0, []byte("hello-2"))) // a gap is fine
	require.Eventually(t, func() bool {
		s := conn.Stats()
		return s.AudioReceived == 4 && s.AudioRejected == 4
	}, waitTimeout, time.Millisecond, "datagrams handled: %+v", conn.Stats())
	srv.down(`{"session_id":"s-conv","type":"tts","state":"stop"}`)

	r := waitConv(t, res)
	require.NoError(t, r.err)
	c := r.c
	assert.Equal(t, "mqtt", c.Transport)
	assert.Equal(t, "s-conv", c.SessionID)
	assert.Equal(t, []string{"turn on the lamp"}, c.STT)
	require.Len(t, c.Audio, 3)
	assert.Equal(t, "hello-1", string(c.Audio[0].Payload))
	assert.Equal(t, uint32(960), c.Audio[0].Timestamp)
	assert.Len(t, c.Audio[1].Payload, len("secret"))
	assert.NotEqual(t, "secret", string(c.Audio[1].Payload), "a wrong key decrypts to noise")
	assert.Equal(t, "hello-2", string(c.Audio[2].Payload))
	assert.Equal(t, []uint32{2, 3, 5}, []uint32{c.Audio[0].Sequence, c.Audio[1].Sequence, c.Audio[2].Sequence})
	assert.Equal(t, 1, c.Dropped)
	assert.Equal(t, 4, c.Rejected)
	assert.Equal(t, 3, c.UplinkSent)

	assert.Equal(t, `{"session_id":"s-conv","type":"goodbye"}`, string(srv.waitUplink(4).Payload))
	assert.False(t, conn.AudioChannelOpen())
	assert.Equal(t, "idle", b.AudioState())
	assert.EqualValues(t, 5, b.Stats().AudioDropped, "one not speaking, four rejected")
}

// TestConverseMQTTServerGoodbye: a server goodbye with the board's
// session id ends the conversation; the board does not answer it with a
// goodbye of its own, Goodbye option or not. A conversation on an open
// channel sends no second hello, and its sequence goes on.
func TestConverseMQTTServerGoodbye(t *testing.T) {
	srv, url := startMQTTServer(t)
	udp := newUDPServer(t)
	b := mqttBoard(t, Config{MAC: "02:00:00:00:c0:04"})
	conn := connectTestMQTT(t, b, MQTTConfig{Endpoint: url})
	opened := make(chan error, 1)
	go func() { opened <- conn.OpenAudioChannel(context.Background()) }()
	srv.waitUplink(1)
	srv.down(udp.hello("s-bye"))
	require.NoError(t, waitErr(t, opened))
	require.NoError(t, conn.SendAudio([]byte("before")))
	udp.read()

	res := converseAsync(b, ConverseOptions{Frames: 1, Goodbye: true})
	assert.Equal(t, `{"session_id":"s-bye","type":"listen","state":"start","mode":"auto"}`, string(srv.waitUplink(2).Payload))
	header, _ := udp.read()
	assert.EqualValues(t, 2, binary.BigEndian.Uint32(header[12:16]))
	srv.down(`{"type":"goodbye","session_id":"someone-else"}`)
	srv.down(`{"type":"goodbye","session_id":"s-bye"}`)
	r := waitConv(t, res)
	require.ErrorIs(t, r.err, ErrServerGoodbye)
	assert.False(t, conn.AudioChannelOpen())
	assert.Equal(t, "idle", b.AudioState())

	srv.down(fmt.Sprintf(`{"type":"mcp","payload":{"jsonrpc":"2.0","id":%d,"method":"ping"}}`, markerID))
	assert.True(t, strings.Contains(string(srv.waitUplink(3).Payload), fmt.Sprintf(`"id":%d,"error"`, markerID)),
		"no goodbye from the board: %s", srv.waitUplink(3).Payload)
}
