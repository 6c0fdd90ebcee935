package broker

import (
	"bytes"
	"crypto/subtle"
	"slices"
	"sync"
	"sync/atomic"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/internal/clip"
	"github.com/devicebridge/devicebridge/internal/logthrottle"
	"github.com/devicebridge/devicebridge/mqtt"
)

// role is what a connected client is to the broker.
type role int

const (
	roleBoard role = iota
	roleGateway
)

// clientState is what the policy remembers about an admitted client.
type clientState struct {
	role     role
	ident    mqtt.ClientIdentity
	uplink   string // the board's own uplink topic
	downlink string // the board's own downlink topic
	guard    *mqtt.PublishGuard
	cut      atomic.Bool // disconnected for flooding
}

// policy is the mochi hook that enforces what boards may do. mochi calls it
// on the client's own goroutines; nothing here blocks.
type policy struct {
	mochi.HookBase
	b       *Broker
	clients sync.Map                     // *mochi.Client → *clientState, from session start to disconnect
	gwq     atomic.Pointer[gatewayQueue] // the gateway's queue, while it is connected (flood.go)
}

func (h *policy) ID() string { return "devicebridge-policy" }

func (h *policy) Provides(b byte) bool {
	return bytes.Contains([]byte{
		mochi.OnConnect,
		mochi.OnConnectAuthenticate,
		mochi.OnSessionEstablished,
		mochi.OnDisconnect,
		mochi.OnACLCheck,
		mochi.OnPublish,
		mochi.OnPublishDropped,
		mochi.OnPacketSent,
	}, []byte{b})
}

// identify decides who a CONNECT claims to be, from its listener and
// client id alone.
func (h *policy) identify(cl *mochi.Client) (*clientState, bool) {
	gw := h.b.gateway
	if cl.Net.Listener == bridgeListener {
		if cl.ID != gw.ClientID {
			return nil, false
		}
		return &clientState{role: roleGateway}, true
	}
	if cl.ID == gw.ClientID {
		return nil, false // the gateway's identity is only valid on loopback
	}
	ci, err := mqtt.ParseClientID(cl.ID, h.b.cfg.Auth.AllowAnyClientID)
	if err != nil {
		return nil, false
	}
	return &clientState{
		role:     roleBoard,
		ident:    ci,
		uplink:   h.b.up.Topic(ci.Key),
		downlink: h.b.down.Topic(ci.Key),
	}, true
}

// OnConnect refuses client ids that name no board with CONNACK "identifier
// rejected" (mochi would otherwise just drop the connection), and a board
// cut off for flooding with "server unavailable".
func (h *policy) OnConnect(cl *mochi.Client, pk packets.Packet) error {
	if st, ok := h.identify(cl); ok {
		return h.refuseCutOff(cl, st)
	}
	h.b.refusedID.Add(1)
	h.b.warns.refusedID.Warn(h.b.log, "refused mqtt client: client id does not name a board (expected GID_xxx@@@aa_bb_cc_dd_ee_ff@@@uuid; "+
		"mqtt.auth.allow_any_client_id admits other ids)",
		clip.Field("client_id", cl.ID), zap.String("remote", cl.Net.Remote), zap.String("listener", cl.Net.Listener))
	_ = h.b.srv.SendConnack(cl, packets.ErrClientIdentifierNotValid, false, nil)
	return packets.ErrClientIdentifierNotValid
}

// OnConnectAuthenticate checks credentials. A false return makes mochi send
// CONNACK "not authorized" and close the connection.
func (h *policy) OnConnectAuthenticate(cl *mochi.Client, pk packets.Packet) (ok bool) {
	defer func() {
		if tc, tracked := cl.Net.Conn.(*trackedConn); ok && tracked {
			tc.admitted() // before the CONNACK: no longer a pending socket
		}
	}()
	st, ok := h.identify(cl)
	if !ok {
		return false
	}
	user, pass := string(pk.Connect.Username), string(pk.Connect.Password)
	if st.role == roleGateway {
		gw := h.b.gateway
		// Both compared in full, so timing does not say which was wrong.
		u := subtle.ConstantTimeCompare([]byte(user), []byte(gw.Username))
		p := subtle.ConstantTimeCompare([]byte(pass), []byte(gw.Password))
		return u&p == 1
	}
	if h.boardAuthorized(cl.ID, st.ident, user, pass, pk.Connect.UsernameFlag || pk.Connect.PasswordFlag) {
		return true
	}
	h.b.refusedAuth.Add(1)
	h.b.warns.refusedAuth.Warn(h.b.log, "refused board: bad or missing credentials", zap.String("device_id", st.ident.DeviceID),
		zap.String("transport", mqtt.TransportName), clip.Field("client_id", cl.ID),
		zap.String("remote", cl.Net.Remote), zap.Bool("sent_credentials", user != "" || pass != ""))
	return false
}

func (h *policy) boardAuthorized(clientID string, ident mqtt.ClientIdentity, user, pass string, sent bool) bool {
	a := h.b.cfg.Auth
	required := h.b.cfg.RequireCredentials
	configured := len(a.Users) > 0 || a.HMACSecret != "" || required
	if !sent || (user == "" && pass == "") {
		return a.anonymous() && !required
	}
	issued, foreign := false, false
	if v := h.b.cfg.Issued; v != nil {
		issued, foreign = v.CheckMQTT(ident.DeviceID, ident.UUID, user, pass)
	}
	if foreign {
		return false // another board's login, even where anonymous boards are let in
	}
	if !configured {
		// Nothing to check against: boards always send whatever their OTA
		// response gave them, so with anonymous access on they are let in.
		return a.anonymous()
	}
	ok := 0
	for _, u := range a.Users {
		ok |= subtle.ConstantTimeCompare([]byte(user), []byte(u.Username)) &
			subtle.ConstantTimeCompare([]byte(pass), []byte(u.Password))
	}
	if a.HMACSecret != "" {
		want := mqtt.HMACPassword(a.HMACSecret, clientID, user)
		ok |= subtle.ConstantTimeCompare([]byte(pass), []byte(want))
	}
	if issued {
		ok = 1
	}
	return ok == 1
}

// OnSessionEstablished runs after the CONNACK, before the client's first
// packet is read: the board is subscribed to its downlink topic and
// announced before it can publish anything.
func (h *policy) OnSessionEstablished(cl *mochi.Client, pk packets.Packet) {
	st, ok := h.identify(cl)
	if !ok {
		return
	}
	if st.role == roleGateway {
		h.clients.Store(cl, st)
		h.gatewayConnected(cl)
		h.b.log.Debug("bridge gateway connected to the embedded broker")
		return
	}
	st.guard = h.b.cfg.BoardLimits.NewGuard()
	h.clients.Store(cl, st)
	// Current firmware never subscribes; this subscription, made on its
	// behalf, is what lets the bridge's downlink reach it.
	sub := packets.Subscription{Filter: st.downlink, Qos: 0}
	h.b.srv.Topics.Subscribe(cl.ID, sub)
	cl.State.Subscriptions.Add(st.downlink, sub)
	h.b.boardConnected(cl, st.ident)
}

func (h *policy) OnDisconnect(cl *mochi.Client, err error, expire bool) {
	v, ok := h.clients.LoadAndDelete(cl)
	if !ok {
		return
	}
	st := v.(*clientState)
	if st.role == roleGateway {
		h.gatewayDisconnected(cl)
		h.b.log.Debug("bridge gateway disconnected from the embedded broker", zap.Error(err))
		return
	}
	if q := h.gwq.Load(); q != nil {
		q.forget(st.uplink)
	}
	h.b.boardDisconnected(cl, st.ident, err)
}

func (h *policy) state(cl *mochi.Client) *clientState {
	v, ok := h.clients.Load(cl)
	if !ok {
		return nil
	}
	return v.(*clientState)
}

// OnACLCheck enforces isolation. Boards may publish to the shared topics
// and their own uplink topic, and read only their own downlink topic; the
// gateway may do anything. Denied QoS 0 publishes are dropped by mochi.
func (h *policy) OnACLCheck(cl *mochi.Client, topic string, write bool) bool {
	st := h.state(cl)
	if st == nil {
		return false
	}
	if st.role == roleGateway {
		if q := h.toGateway(cl); q != nil && !write {
			q.queued(topic) // mochi is about to queue a message for the gateway
		}
		return true
	}
	if write {
		if topic == st.uplink || slices.Contains(h.b.cfg.Topics.Shared, topic) {
			return true
		}
		h.b.deniedPub.Add(1)
		h.warn(st, cl, &h.b.warns.deniedPub, "denied a board's publish outside its own topics", topic)
		h.deniedOverRate(cl, st)
		return false
	}
	if topic == st.downlink {
		return true
	}
	h.b.deniedRead.Add(1)
	h.warn(st, cl, &h.b.warns.deniedRead, "denied a board's subscription to topics that are not its own", topic)
	return false
}

// warn writes a policy warning a board can repeat at will through its
// throttle: the first at once, then one per interval with a count.
func (h *policy) warn(st *clientState, cl *mochi.Client, t *logthrottle.Throttle, msg, topic string) {
	t.Warn(h.b.log, msg, h.boardFields(cl, st, clip.Field("topic", topic))...)
}

// OnPublish attributes a board's publish: whatever allowed topic it used,
// it continues on the board's own uplink topic, where the gateway reads
// the sender from the topic. Retain is cleared (boards never retain).
func (h *policy) OnPublish(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	st := h.state(cl)
	if st == nil || st.role != roleBoard {
		return pk, nil
	}
	if !h.admit(cl, st) {
		return pk, packets.ErrRejectPacket
	}
	if pk.TopicName != st.uplink {
		h.b.attributed.Add(1)
		pk.TopicName = st.uplink
	}
	pk.FixedHeader.Retain = false
	return pk, nil
}

// OnPublishDropped: a client's outbound queue was full. For a board this
// means it stopped reading; the message is lost, the caller's request will
// time out.
func (h *policy) OnPublishDropped(cl *mochi.Client, pk packets.Packet) {
	h.b.dropped.Add(1)
	st := h.state(cl)
	if st == nil {
		return
	}
	if st.role == roleGateway {
		if q := h.toGateway(cl); q != nil {
			q.left(pk.TopicName)
		}
		h.b.warns.gatewayBehind.Warn(h.b.log, "bridge gateway is not keeping up; dropped an uplink message", clip.Field("topic", pk.TopicName))
		return
	}
	h.warn(st, cl, &h.b.warns.notReading, "board is not reading; dropped a downlink message", pk.TopicName)
}
