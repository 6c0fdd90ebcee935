package simulator

import (
	"cmp"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	pahopackets "github.com/eclipse/paho.mqtt.golang/packets"
	"go.uber.org/zap"
)

// The MQTT transport of the simulator, following the firmware's
// MqttProtocol: MQTT 3.1.1, clean session, no will, every publish QoS 0 to
// one publish topic, and no SUBSCRIBE (current firmware processes whatever
// the broker delivers, whatever the topic). The connection opens at "boot"
// and stays; a hello is sent only when a conversation opens the audio
// channel, while MCP is answered at any time. Legacy mode reproduces
// firmware from before January 2025, which subscribed to its
// subscribe_topic with QoS 2.

// Defaults for MQTTConfig.
const (
	// DefaultMQTTKeepAlive is the firmware's keepalive when the OTA gives
	// none.
	DefaultMQTTKeepAlive = 240 * time.Second
	// DefaultMQTTPublishTopic is what xiaozhi backends hand out.
	DefaultMQTTPublishTopic = "device-server"
	// DefaultMQTTClientGroup is the group part of the backends' client ids.
	DefaultMQTTClientGroup = "GID_test"
	// DefaultMQTTReconnect is how soon the MQTT client reconnects after a
	// lost connection (esp-mqtt's own automatic reconnect).
	DefaultMQTTReconnect = 10 * time.Second
	// mqttConnectTimeout is the firmware's connect timeout.
	mqttConnectTimeout = 10 * time.Second
	// mqttOutboundQueue bounds messages waiting for the writer.
	mqttOutboundQueue = 16
	// udpRecvBuffer is the board's UDP receive buffer.
	udpRecvBuffer = 1500
	udpHeaderSize = 16
)

// Errors of the MQTT transport.
var (
	// ErrMQTTRefused: the broker refused the CONNECT (bad credentials,
	// rejected client id). The wrapped error carries the return code text.
	ErrMQTTRefused = errors.New("simulator: mqtt connection refused")
	// ErrNoAudioChannel: the audio channel is not open.
	ErrNoAudioChannel = errors.New("simulator: audio channel not open")
	// errMQTTUnreachable marks a connect that failed without a CONNACK
	// (nothing listening, a network error).
	errMQTTUnreachable = errors.New("no answer from the broker")
)

// MQTTConfig is the "mqtt" object a board stores from its OTA response, plus
// the simulator's choice of firmware generation.
type MQTTConfig struct {
	// Endpoint is the broker: a URL (tcp://host:1883, ssl://host:8883) or,
	// as the OTA gives it, "host" or "host:port", where the port defaults
	// to 8883 and 8883 means TLS.
	Endpoint string
	// ClientID defaults to GID_test@@@<mac with _>@@@<uuid>, the form the
	// xiaozhi backends hand out.
	ClientID string
	Username string
	Password string
	// HMACSecret, when set and Password is empty, derives the password as
	// the backends' OTA does: base64(HMAC-SHA256(secret, client_id|username)).
	HMACSecret string
	// PublishTopic receives everything the board sends (default
	// device-server). "{mac}" in it becomes the board's MAC with "_", so
	// one setting serves a whole fleet (devices/up/{mac}).
	PublishTopic string
	// Legacy subscribes to SubscribeTopic with QoS 2 after every connect,
	// as firmware before v1.0 did. Current firmware never subscribes.
	Legacy bool
	// SubscribeTopic defaults to devices/p2p/{mac} ({mac} as above).
	SubscribeTopic string
	// KeepAlive defaults to 240 s.
	KeepAlive time.Duration
	// ReconnectInterval is the pause before reconnecting a lost connection
	// (default 10 s).
	ReconnectInterval time.Duration
	// TLS is used for ssl:// endpoints (and port 8883); nil verifies against
	// the system roots, as boards do against their CA bundle.
	TLS *tls.Config
	// HelloOnConnect makes Fleet.RunMQTT open the audio channel after each
	// connect, as if a conversation started. A server behind a plain broker
	// only learns of a board when it speaks; this makes it speak.
	HelloOnConnect bool
}

// LegacyMQTTConfig is an old, subscribing board pointed at a plain
// broker (no OTA telling it where): it publishes to its own uplink topic,
// devices/up/{mac}, and subscribes to its downlink topic,
// devices/p2p/{mac}, the topics a bridge behind an external broker uses by
// default. It reconnects after 200 ms, so that tests restarting a broker
// do not wait the firmware's 10 s.
func LegacyMQTTConfig(brokerURL string) MQTTConfig {
	return MQTTConfig{
		Endpoint:          brokerURL,
		Legacy:            true,
		PublishTopic:      "devices/up/{mac}",
		SubscribeTopic:    "devices/p2p/{mac}",
		ReconnectInterval: 200 * time.Millisecond,
	}
}

// MQTTStats are one MQTT connection's transport counters.
type MQTTStats struct {
	Connects      uint64 // successful MQTT connects, reconnects included
	Hellos        uint64 // server hellos accepted
	HellosIgnored uint64 // server hellos that failed validation
	GoodbyesSent  uint64
	GoodbyesIn    uint64 // server goodbyes honoured
	GoodbyesStale uint64 // server goodbyes ignored (session id mismatch)
	AudioSent     uint64 // UDP datagrams sent
	AudioReceived uint64 // UDP datagrams accepted (decrypted and handed on)
	// AudioRejected counts UDP datagrams that failed the board's checks:
	// shorter than a header, type not 0x01, length not 16+payload_len, or
	// a sequence not above the last accepted one.
	AudioRejected uint64
}

// MQTTConn is a board's MQTT connection. It survives broker restarts
// (paho reconnects as esp-mqtt does); it ends with Close, a reboot or an
// injected fault.
type MQTTConn struct {
	b        *Board
	cfg      MQTTConfig
	clientID string
	client   paho.Client
	sess     *session
	log      *zap.Logger

	ctx    context.Context // ends when the connection ends
	cancel context.CancelFunc
	out    chan mqttOut
	done   chan struct{}
	once   sync.Once
	cause  error
	wg     sync.WaitGroup

	chMu    sync.Mutex
	channel *udpChannel

	connects, hellos, hellosIgnored, goodbyesSent, goodbyesIn, goodbyesStale atomic.Uint64
	audioSent, audioReceived, audioRejected                                  atomic.Uint64
}

// mqttOut is one message for the writer; sent, when not nil, is closed
// once the publish is done (or lost), for a sender that must know its
// message left before it goes on (a listen start before UDP audio).
type mqttOut struct {
	msg  string
	sent chan struct{}
}

var _ link = (*MQTTConn)(nil)

// udpChannel is an open audio channel: a connected UDP socket to the
// server hello's address, with its key and nonce.
type udpChannel struct {
	conn      *net.UDPConn
	block     cipher.Block
	nonce     [16]byte
	localSeq  uint32
	remoteSeq uint32
	sessionID string
}

// ConnectMQTT connects the board to its broker the way the firmware does
// at boot, and returns once the broker accepted it (a refusal wraps
// ErrMQTTRefused). Legacy boards then subscribe. Nothing else is sent: the
// board waits for MCP requests or a conversation (OpenAudioChannel).
// A WebSocket connection the board had is closed first.
func (b *Board) ConnectMQTT(ctx context.Context, mc MQTTConfig) (*MQTTConn, error) {
	b.connectMu.Lock()
	defer b.connectMu.Unlock()
	_ = b.Close()

	broker, err := mqttBrokerURL(mc.Endpoint)
	if err != nil {
		return nil, err
	}
	key := strings.ReplaceAll(b.mac, ":", "_")
	if b.deviceID() != b.mac {
		key = b.deviceID() // a hostile board's spelling, verbatim
	}
	mc.ClientID = cmp.Or(mc.ClientID, DefaultMQTTClientGroup+"@@@"+key+"@@@"+b.clientID)
	mc.PublishTopic = strings.ReplaceAll(cmp.Or(mc.PublishTopic, DefaultMQTTPublishTopic), "{mac}", key)
	mc.SubscribeTopic = strings.ReplaceAll(cmp.Or(mc.SubscribeTopic, "devices/p2p/{mac}"), "{mac}", key)
	mc.KeepAlive = cmp.Or(mc.KeepAlive, DefaultMQTTKeepAlive)
	mc.ReconnectInterval = cmp.Or(mc.ReconnectInterval, DefaultMQTTReconnect)
	if mc.Password == "" && mc.HMACSecret != "" {
		m := hmac.New(sha256.New, []byte(mc.HMACSecret))
		m.Write([]byte(mc.ClientID + "|" + mc.Username))
		mc.Password = base64.StdEncoding.EncodeToString(m.Sum(nil))
	}

	cctx, cancel := context.WithCancel(context.Background())
	c := &MQTTConn{
		b:        b,
		cfg:      mc,
		clientID: mc.ClientID,
		ctx:      cctx,
		cancel:   cancel,
		out:      make(chan mqttOut, mqttOutboundQueue),
		done:     make(chan struct{}),
		log:      b.log.Named("mqtt").With(zap.String("broker", broker)),
	}
	c.sess = newSession(b, c, c.log)

	opts := paho.NewClientOptions().
		AddBroker(broker).
		SetClientID(mc.ClientID).
		SetUsername(mc.Username).
		SetPassword(mc.Password).
		SetProtocolVersion(4). // MQTT 3.1.1, esp-mqtt's default
		SetCleanSession(true).
		SetOrderMatters(true).
		SetKeepAlive(mc.KeepAlive).
		SetConnectTimeout(mqttConnectTimeout).
		SetAutoReconnect(true).
		SetConnectRetry(false).
		SetMaxReconnectInterval(mc.ReconnectInterval).
		SetWriteTimeout(b.cfg.WriteTimeout).
		SetDefaultPublishHandler(c.onMessage).
		SetOnConnectHandler(c.onConnect).
		SetConnectionLostHandler(func(_ paho.Client, err error) {
			if c.ctx.Err() == nil {
				c.log.Info("mqtt connection lost; reconnecting", zap.Error(err))
			}
		})
	if mc.TLS != nil {
		opts.SetTLSConfig(mc.TLS)
	}
	c.client = paho.NewClient(opts)
	tok := c.client.Connect()
	select {
	case <-tok.Done():
	case <-ctx.Done():
		c.client.Disconnect(0)
		return nil, ctx.Err()
	}
	if err := tok.Error(); err != nil {
		c.client.Disconnect(0)
		if isConnackRefusal(err) {
			return nil, fmt.Errorf("%w: %v", ErrMQTTRefused, err)
		}
		return nil, fmt.Errorf("simulator: mqtt connect %s: %w: %w", broker, errMQTTUnreachable, err)
	}
	c.wg.Add(2)
	go c.writeLoop()
	go func() {
		defer c.wg.Done()
		c.sess.runMainTask(c.ctx)
	}()
	if h := b.cfg.Hostile; h != nil && h.FloodOnConnect > 0 {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			n, err := c.Flood(c.ctx, h.FloodOnConnect, []byte(h.floodPayload()))
			c.log.Info("hostile flood done", zap.Int("published", n), zap.Error(err))
		}()
	}
	b.linkMu.Lock()
	b.mqtt = c
	b.linkMu.Unlock()
	c.log.Info("connected over mqtt", zap.String("mqtt_client_id", mc.ClientID), zap.Bool("legacy", mc.Legacy))
	return c, nil
}

// mqttBrokerURL turns an OTA endpoint into a URL paho can dial.
func mqttBrokerURL(endpoint string) (string, error) {
	if endpoint == "" {
		return "", errors.New("simulator: empty mqtt endpoint (the firmware reports SERVER_NOT_FOUND)")
	}
	if strings.Contains(endpoint, "://") {
		if _, err := url.Parse(endpoint); err != nil {
			return "", fmt.Errorf("simulator: mqtt endpoint: %w", err)
		}
		return endpoint, nil
	}
	host, port := endpoint, "8883"
	if h, p, err := net.SplitHostPort(endpoint); err == nil {
		host, port = h, p
	}
	if _, err := strconv.Atoi(port); err != nil {
		// The firmware runs std::stoi on the port and aborts here.
		return "", fmt.Errorf("simulator: mqtt endpoint %q: port is not a number", endpoint)
	}
	scheme := "tcp"
	if port == "8883" {
		scheme = "ssl"
	}
	return scheme + "://" + net.JoinHostPort(host, port), nil
}

func isConnackRefusal(err error) bool {
	for code := byte(pahopackets.ErrRefusedBadProtocolVersion); code <= pahopackets.ErrRefusedNotAuthorised; code++ {
		if errors.Is(err, pahopackets.ConnErrors[code]) {
			return true
		}
	}
	return false
}

// ClientID is the MQTT client id the board connected with.
func (c *MQTTConn) ClientID() string { return c.clientID }

// Connected reports whether the MQTT connection is up right now.
func (c *MQTTConn) Connected() bool {
	select {
	case <-c.done:
		return false
	default:
		return c.client.IsConnectionOpen()
	}
}

// Stats returns the transport counters.
func (c *MQTTConn) Stats() MQTTStats {
	return MQTTStats{
		Connects: c.connects.Load(), Hellos: c.hellos.Load(), HellosIgnored: c.hellosIgnored.Load(),
		GoodbyesSent: c.goodbyesSent.Load(), GoodbyesIn: c.goodbyesIn.Load(), GoodbyesStale: c.goodbyesStale.Load(),
		AudioSent: c.audioSent.Load(), AudioReceived: c.audioReceived.Load(), AudioRejected: c.audioRejected.Load(),
	}
}

func (c *MQTTConn) onConnect(cl paho.Client) {
	// On MQTT the connection, not a hello, is what makes a board reachable,
	// so it is what the board's connect counter counts. The board's counter
	// goes first: Board.Connected trusts a connection once its own counter
	// moved.
	c.b.stats.connects.Add(1)
	c.connects.Add(1)
	if !c.cfg.Legacy {
		return
	}
	// Old firmware subscribed after every connect (clean sessions forget
	// subscriptions). The token is not waited for: this runs on paho's
	// goroutine, and a board does not check the SUBACK either.
	cl.Subscribe(c.cfg.SubscribeTopic, 2, nil)
}

// onMessage handles every PUBLISH the broker delivers, whatever its topic.
// It runs on paho's router goroutine and, like the firmware's network
// task, validates and schedules without blocking.
func (c *MQTTConn) onMessage(_ paho.Client, m paho.Message) {
	select {
	case <-c.done:
		return
	default:
	}
	c.sess.handleText(m.Payload())
}

// send queues one message for the writer.
func (c *MQTTConn) send(msg string) error {
	select {
	case c.out <- mqttOut{msg: msg}:
		return nil
	case <-c.ctx.Done():
		return errLinkClosed
	}
}

// sendWait queues msg and waits until the writer has published it (or
// lost it: a publish while disconnected is dropped, as esp-mqtt does).
func (c *MQTTConn) sendWait(ctx context.Context, msg string) error {
	sent := make(chan struct{})
	select {
	case c.out <- mqttOut{msg: msg, sent: sent}:
	case <-c.ctx.Done():
		return errLinkClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-sent:
		return nil
	case <-c.ctx.Done():
		return errLinkClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

// writeLoop is the only publisher: QoS 0, retain off, to the publish topic.
func (c *MQTTConn) writeLoop() {
	defer c.wg.Done()
	for {
		select {
		case <-c.ctx.Done():
			return
		case m := <-c.out:
			c.publish(m.msg)
			if m.sent != nil {
				close(m.sent)
			}
		}
	}
}

// publish is one QoS 0 publish to the publish topic, counted.
func (c *MQTTConn) publish(msg string) {
	if !c.client.IsConnectionOpen() {
		// esp-mqtt drops publishes while disconnected.
		c.b.stats.repliesLost.Add(1)
		return
	}
	tok := c.client.Publish(c.cfg.PublishTopic, 0, false, msg)
	if !tok.WaitTimeout(c.b.cfg.WriteTimeout) || tok.Error() != nil {
		c.b.stats.repliesLost.Add(1)
		return
	}
	c.b.stats.messagesSent.Add(1)
}

// PublishRaw publishes payload to any topic, QoS 0. No firmware does this;
// it exists to test how a broker and a server cope with boards that
// misbehave (garbage, impersonation).
func (c *MQTTConn) PublishRaw(ctx context.Context, topic string, payload []byte) error {
	tok := c.client.Publish(topic, 0, false, payload)
	select {
	case <-tok.Done():
		return tok.Error()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// SubscribeRaw subscribes to filter with QoS 0 and reports whether the
// broker granted it. Current firmware never subscribes; this exists to
// test broker isolation.
func (c *MQTTConn) SubscribeRaw(ctx context.Context, filter string) (bool, error) {
	tok := c.client.Subscribe(filter, 0, nil)
	select {
	case <-tok.Done():
	case <-ctx.Done():
		return false, ctx.Err()
	}
	if err := tok.Error(); err != nil {
		return false, err
	}
	st, ok := tok.(*paho.SubscribeToken)
	if !ok {
		return false, errors.New("simulator: unexpected subscribe token")
	}
	return st.Result()[filter] < 0x80, nil
}

// ---- the audio channel ----

// OpenAudioChannel starts a conversation the way the firmware does: the
// session id is reset to "", the MQTT hello is published, and the board
// waits up to Config.HelloTimeout for a server hello that passes the
// firmware's checks. Invalid hellos are ignored (they still change the
// session id, as on the firmware), so they end in ErrHelloTimeout.
func (c *MQTTConn) OpenAudioChannel(ctx context.Context) error {
	b := c.b
	b.mu.Lock()
	b.sessionID = ""
	b.mu.Unlock()
	// A hello event left over from an earlier exchange must not satisfy
	// this wait.
	select {
	case <-b.helloEvent:
	default:
	}
	if err := c.send(c.helloJSON()); err != nil {
		return fmt.Errorf("simulator: mqtt hello: %w", err)
	}
	timer := time.NewTimer(b.cfg.HelloTimeout)
	defer timer.Stop()
	select {
	case <-b.helloEvent:
		c.log.Info("audio channel opened", zap.String("session_id", b.SessionID()))
		return nil
	case <-timer.C:
		return fmt.Errorf("simulator: mqtt hello: %w", ErrHelloTimeout)
	case <-c.done:
		return fmt.Errorf("simulator: mqtt hello: %w", c.cause)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// helloJSON is the MQTT device hello of §5.4, byte for byte: version 3,
// transport udp, then features, text_font and audio_params.
func (c *MQTTConn) helloJSON() string {
	p := c.b.profile
	var sb strings.Builder
	sb.WriteString(`{"type":"hello","version":3,"transport":"udp","features":{`)
	if !c.b.cfg.OmitMCPFeature {
		sb.WriteString(`"mcp":true,`)
	}
	sb.WriteString(`"glyph_push":` + strconv.FormatBool(p.GlyphPush) + `}`)
	if p.GlyphPush {
		sb.WriteString(`,"text_font":{"bundle":"noto-v1","charset":"` + p.Font.Charset + `","size":` +
			strconv.Itoa(p.Font.Size) + `,"bpp":` + strconv.Itoa(p.Font.BPP) + `}`)
	}
	sb.WriteString(`,"audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}`)
	return sb.String()
}

// CloseAudioChannel is the board ending a conversation: it closes UDP and
// publishes {"session_id":"S","type":"goodbye"}. MQTT stays connected.
func (c *MQTTConn) CloseAudioChannel() error {
	if !c.closeUDP() {
		return ErrNoAudioChannel
	}
	c.goodbyesSent.Add(1)
	return c.send(`{"session_id":"` + c.b.SessionID() + `","type":"goodbye"}`)
}

// AudioChannelOpen reports whether a server hello opened a channel that is
// still open.
func (c *MQTTConn) AudioChannelOpen() bool {
	c.chMu.Lock()
	defer c.chMu.Unlock()
	return c.channel != nil
}

// closeUDP drops the channel; it reports whether one was open.
func (c *MQTTConn) closeUDP() bool {
	c.chMu.Lock()
	ch := c.channel
	c.channel = nil
	c.chMu.Unlock()
	if ch == nil {
		return false
	}
	_ = ch.conn.Close()
	return true
}

// SendAudio sends one Opus packet over the open channel: the header is the
// server's nonce with length, timestamp (0) and sequence (from 1) filled
// in, and the payload is AES-128-CTR encrypted with the header as counter
// block.
func (c *MQTTConn) SendAudio(opus []byte) error {
	c.chMu.Lock()
	ch := c.channel
	if ch == nil {
		c.chMu.Unlock()
		return ErrNoAudioChannel
	}
	ch.localSeq++
	pkt := make([]byte, udpHeaderSize+len(opus))
	copy(pkt, ch.nonce[:])
	binary.BigEndian.PutUint16(pkt[2:4], uint16(len(opus)))
	binary.BigEndian.PutUint32(pkt[8:12], 0)
	binary.BigEndian.PutUint32(pkt[12:16], ch.localSeq)
	cipher.NewCTR(ch.block, pkt[:udpHeaderSize]).XORKeyStream(pkt[udpHeaderSize:], opus)
	conn := ch.conn
	c.chMu.Unlock()
	if _, err := conn.Write(pkt); err != nil {
		return fmt.Errorf("simulator: udp send: %w", err)
	}
	c.audioSent.Add(1)
	c.b.stats.audioSent.Add(1)
	return nil
}

// handleTransportMessage gives the MQTT transport hello and goodbye.
func (c *MQTTConn) handleTransportMessage(typ string, root *jsonValue) bool {
	switch typ {
	case "hello":
		c.parseServerHello(root)
		return true
	case "goodbye":
		c.handleServerGoodbye(root)
		return true
	}
	return false
}

// parseServerHello is MqttProtocol::ParseServerHello (v2.4): transport must
// be "udp"; session_id is taken before the udp block is checked, so even a
// rejected hello changes it; udp needs server, port 1..65535, and key and
// nonce of exactly 16 bytes in hex. A rejected hello is ignored.
func (c *MQTTConn) parseServerHello(root *jsonValue) {
	b := c.b
	if tr := root.get("transport"); !tr.isString() || tr.str != "udp" {
		c.rejectHello("transport is not udp")
		return
	}
	if sid := root.get("session_id"); sid.isString() {
		b.mu.Lock()
		b.sessionID = sid.str
		b.mu.Unlock()
	}
	if ap := root.get("audio_params"); ap.isObject() {
		b.mu.Lock()
		if v := ap.get("sample_rate"); v.isNumber() {
			b.sampleRate = v.valueInt()
		}
		if v := ap.get("frame_duration"); v.isNumber() {
			b.frameDuration = v.valueInt()
		}
		b.mu.Unlock()
	}
	udp := root.get("udp")
	if !udp.isObject() {
		c.rejectHello("no udp object")
		return
	}
	server, port, key, nonce := udp.get("server"), udp.get("port"), udp.get("key"), udp.get("nonce")
	if !server.isString() || !port.isNumber() || !key.isString() || !nonce.isString() {
		c.rejectHello("udp needs string server, number port, string key and nonce")
		return
	}
	p := port.valueInt()
	if p < 1 || p > 65535 {
		c.rejectHello("udp port out of range")
		return
	}
	k, err1 := hex.DecodeString(key.str)
	n, err2 := hex.DecodeString(nonce.str)
	if err1 != nil || err2 != nil || len(k) != 16 || len(n) != 16 {
		c.rejectHello("udp key and nonce must be 16 bytes of hex")
		return
	}
	// gethostbyname: IPv4 only.
	lctx, cancel := context.WithTimeout(c.ctx, 2*time.Second)
	ips, err := net.DefaultResolver.LookupIP(lctx, "ip4", server.str)
	cancel()
	if err != nil || len(ips) == 0 {
		c.rejectHello("cannot resolve udp server " + server.str)
		return
	}
	conn, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: ips[0], Port: p})
	if err != nil {
		c.rejectHello("udp connect: " + err.Error())
		return
	}
	block, _ := aes.NewCipher(k) // 16 bytes: cannot fail
	ch := &udpChannel{conn: conn, block: block, sessionID: b.SessionID()}
	copy(ch.nonce[:], n)
	c.chMu.Lock()
	if c.ctx.Err() != nil {
		// The connection is closing; shutdown may already have dropped the
		// channel, so a new one would outlive it.
		c.chMu.Unlock()
		_ = conn.Close()
		return
	}
	old := c.channel
	c.channel = ch
	// Added under chMu: shutdown cancels ctx before it takes chMu, so this
	// cannot race with the final Wait.
	c.wg.Add(1)
	c.chMu.Unlock()
	if old != nil {
		_ = old.conn.Close()
	}
	go c.udpReadLoop(ch)
	c.hellos.Add(1)
	b.signalHello()
}

func (c *MQTTConn) rejectHello(why string) {
	c.hellosIgnored.Add(1)
	c.b.stats.ignored.Add(1)
	c.log.Warn("server hello rejected; a real board keeps waiting and then times out", zap.String("reason", why))
}

// handleServerGoodbye closes the channel only for a goodbye whose
// session_id is a string equal to the board's own (v2.3.0+). The board
// does not answer with its own goodbye.
func (c *MQTTConn) handleServerGoodbye(root *jsonValue) {
	sid := root.get("session_id")
	if !sid.isString() || sid.str != c.b.SessionID() {
		c.goodbyesStale.Add(1)
		c.b.stats.ignored.Add(1)
		c.log.Debug("server goodbye for another session ignored")
		return
	}
	if c.closeUDP() {
		c.goodbyesIn.Add(1)
		c.log.Info("server closed the audio channel", zap.String("session_id", sid.str))
	}
	// The board goes back to idle, and a conversation in progress ends.
	c.sess.serverGoodbye()
}

// udpReadLoop takes the downlink datagrams that pass the board's checks
// (at least a header, type 0x01, exact length, a sequence above the last
// accepted one), decrypts them with the header as counter block and hands
// the Opus payload on, which plays it only while speaking. The socket is
// connected, so datagrams from anywhere but the hello's server:port never
// arrive. There is no authentication tag: a datagram encrypted with
// another key passes and decrypts to noise, as on the firmware.
func (c *MQTTConn) udpReadLoop(ch *udpChannel) {
	defer c.wg.Done()
	buf := make([]byte, udpRecvBuffer)
	for {
		n, err := ch.conn.Read(buf)
		if err != nil {
			return
		}
		d := buf[:n]
		if n < udpHeaderSize || d[0] != 0x01 || n != udpHeaderSize+int(binary.BigEndian.Uint16(d[2:4])) {
			c.rejectAudio()
			continue
		}
		seq := binary.BigEndian.Uint32(d[12:16])
		c.chMu.Lock()
		ok := seq > ch.remoteSeq
		if ok {
			ch.remoteSeq = seq
		}
		c.chMu.Unlock()
		if !ok {
			c.rejectAudio()
			continue
		}
		c.audioReceived.Add(1)
		c.b.stats.binaryReceived.Add(1)
		payload := make([]byte, n-udpHeaderSize)
		cipher.NewCTR(ch.block, d[:udpHeaderSize]).XORKeyStream(payload, d[udpHeaderSize:])
		c.sess.handleAudio(AudioFrame{
			Payload:   payload,
			Timestamp: binary.BigEndian.Uint32(d[8:12]),
			Sequence:  seq,
		}, false)
	}
}

// rejectAudio counts a datagram that failed the board's checks.
func (c *MQTTConn) rejectAudio() {
	c.audioRejected.Add(1)
	c.sess.rejectAudio()
}

// ---- lifecycle ----

// closeChannel is the core asking the transport to close. On MQTT a
// firmware upgrade only closes the audio channel (the call's reply still
// goes out, late); a reboot or an injected fault drops the connection.
func (c *MQTTConn) closeChannel(cause error) {
	if errors.Is(cause, ErrFirmwareUpgrade) {
		_ = c.CloseAudioChannel()
		return
	}
	c.shutdown(cause)
}

// shutdown ends the connection with cause and drops it at the broker at
// once: a rebooting board vanishes, which is how the server learns that
// self.reboot "succeeded". It waits for nothing but paho's short
// disconnect, so the main task may call it; it must not run on paho's own
// goroutines.
func (c *MQTTConn) shutdown(cause error) {
	c.once.Do(func() {
		c.cause = cause
		c.cancel()
		close(c.done)
		c.closeUDP()
		c.client.Disconnect(50)
		c.log.Info("mqtt connection closed", zap.NamedError("reason", cause))
	})
}

// Serve waits until the connection ends and returns why, or until ctx
// ends, in which case it closes the connection and returns nil.
func (c *MQTTConn) Serve(ctx context.Context) error {
	select {
	case <-ctx.Done():
		_ = c.Close()
		return nil
	case <-c.done:
		_ = c.Close()
		return c.cause
	}
}

// Done is closed when the connection has ended.
func (c *MQTTConn) Done() <-chan struct{} { return c.done }

// Close disconnects from the broker and waits for the connection's
// goroutines. It may be called any number of times.
func (c *MQTTConn) Close() error {
	c.shutdown(ErrClosed)
	c.wg.Wait()
	return nil
}

// RunMQTT connects every board of the fleet over MQTT with mc (the client
// id and the HMAC password are derived per board) and keeps them
// connected, reconnecting with back-off after a reboot or a refused
// connect, until ctx ends. Connection losses in between are handled by the
// MQTT client's own reconnect, as on the firmware. FleetConfig.URL is not
// used.
func (f *Fleet) RunMQTT(ctx context.Context, mc MQTTConfig) error {
	return f.runAll(ctx, func(ctx context.Context, b *Board) error { return f.runBoardMQTT(ctx, b, mc) })
}

func (f *Fleet) runBoardMQTT(ctx context.Context, b *Board, mc MQTTConfig) error {
	return f.keepConnected(ctx, b, func(ctx context.Context) error {
		c, err := b.ConnectMQTT(ctx, mc)
		if err != nil {
			return err
		}
		if mc.HelloOnConnect {
			if herr := c.OpenAudioChannel(ctx); herr != nil {
				b.log.Warn("opening the audio channel failed", zap.Error(herr))
			}
		}
		return f.serveConversing(ctx, b, c.Serve)
	})
}
