package mqtt

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/envelope"
	"github.com/devicebridge/devicebridge/internal/randid"
)

// udpHeaderLen is the fixed header of every audio datagram.
const udpHeaderLen = 16

// udpPacketType is byte 0 of the header; boards copy it from the nonce and
// only accept this value themselves.
const udpPacketType = 0x01

// udpReadBuffer is the audio socket's receive buffer.
const udpReadBuffer = 4 << 20

// maxDatagram is the largest datagram a board can receive (its buffer is
// 1500 bytes); uplink datagrams are no larger in practice.
const maxDatagram = 1500

// audioSession is one hello's worth of UDP parameters. The ssrc sits in
// nonce bytes 4..7, which boards copy into every datagram header, so it
// routes datagrams to their session the way the existing gateways do.
type audioSession struct {
	id    string
	ssrc  uint32
	key   string // 32 hex digits
	nonce string // 32 hex digits

	packets, bytes atomic.Int64
	lastSeq        atomic.Uint32
	// voice is set when the session's conversation is relayed upstream.
	voice atomic.Pointer[voiceAudio]
}

// newNonce lays the nonce out as boards expect it: type 0x01, flags 0,
// payload length 0, the ssrc, then timestamp and sequence 0. Boards
// overwrite length, timestamp and sequence per packet and keep the rest.
func newNonce(ssrc uint32) string {
	var n [16]byte
	n[0] = udpPacketType
	binary.BigEndian.PutUint32(n[4:8], ssrc)
	return hex.EncodeToString(n[:])
}

// serverHello is the reply boards accept: transport udp, a session id, and
// all four udp fields (boards up to v2.3 crash if any is missing).
func serverHello(a *audioSession, host string, port int) []byte {
	return serverHelloWith(a, host, port, envelope.DownlinkAudio)
}

// serverHelloWith is serverHello declaring the given downlink audio.
func serverHelloWith(a *audioSession, host string, port int, audio envelope.AudioParams) []byte {
	return envelope.ServerHello{
		Version:     3,
		Transport:   "udp",
		SessionID:   a.id,
		AudioParams: &audio,
		UDP: &envelope.UDPParams{
			Server:     host,
			Port:       port,
			Encryption: "aes-128-ctr",
			Key:        a.key,
			Nonce:      a.nonce,
		},
	}.Marshal()
}

// UDPStats counts audio datagrams. None is played: the bridge serves
// tools, not conversations.
type UDPStats struct {
	Packets, Bytes int64
	// Malformed datagrams fail the header checks boards apply themselves.
	Malformed int64
	// Unknown datagrams carry an ssrc no open audio session has.
	Unknown int64
	// Stale datagrams of a relayed session repeat or precede its last
	// sequence; Foreign ones come from another address than its first.
	Stale, Foreign int64
	// Sent counts downlink datagrams of relayed conversations.
	Sent int64
}

// udpServer accepts audio datagrams on one socket with a single reader.
type udpServer struct {
	conn *net.UDPConn
	log  *zap.Logger

	mu       sync.Mutex
	sessions map[uint32]*audioSession

	packets, bytes, malformed, unknown atomic.Int64
	stale, foreign, sent               atomic.Int64
}

// listenUDP binds the audio socket. When fallback is true and the address
// is taken, it binds an ephemeral port on the same host instead: the port
// is handed out per hello, so boards follow whatever was bound.
func listenUDP(addr string, fallback bool, log *zap.Logger) (*udpServer, error) {
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("mqtt udp listen %q: %w", addr, err)
	}
	conn, err := net.ListenUDP("udp", ua)
	if err != nil && fallback && errors.Is(err, syscall.EADDRINUSE) {
		log.Warn("udp audio port in use; using an ephemeral port instead (set mqtt.udp.listen to choose one)",
			zap.String("listen", addr))
		ua.Port = 0
		conn, err = net.ListenUDP("udp", ua)
	}
	if err != nil {
		return nil, fmt.Errorf("mqtt udp listen %q: %w", addr, err)
	}
	// One socket takes every board's audio: at a thousand relayed
	// conversations the kernel's default buffer (about 200 KiB) overflows
	// in bursts and drops datagrams. Linux caps the request at rmem_max.
	if err := conn.SetReadBuffer(udpReadBuffer); err != nil {
		log.Debug("udp audio socket: could not enlarge the receive buffer", zap.Error(err))
	}
	return &udpServer{conn: conn, log: log, sessions: map[uint32]*audioSession{}}, nil
}

func (u *udpServer) port() int { return u.conn.LocalAddr().(*net.UDPAddr).Port }

// open registers a new audio session with a fresh ssrc, key and nonce.
func (u *udpServer) open(id string) *audioSession {
	u.mu.Lock()
	defer u.mu.Unlock()
	var ssrc uint32
	for ssrc == 0 || u.sessions[ssrc] != nil {
		ssrc = randid.Uint32()
	}
	a := &audioSession{id: id, ssrc: ssrc, key: randid.Hex16(), nonce: newNonce(ssrc)}
	u.sessions[ssrc] = a
	return a
}

func (u *udpServer) close(a *audioSession) {
	if a == nil {
		return
	}
	u.mu.Lock()
	if u.sessions[a.ssrc] == a {
		delete(u.sessions, a.ssrc)
	}
	u.mu.Unlock()
}

// run is the socket's only reader; it returns when the socket closes.
func (u *udpServer) run() {
	buf := make([]byte, maxDatagram+1)
	for {
		n, from, err := u.conn.ReadFromUDP(buf)
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				u.log.Warn("udp audio socket failed", zap.Error(err))
			}
			return
		}
		u.count(buf[:n], from)
	}
}

// count applies the checks a board applies to datagrams it receives: a
// full header, type 0x01, and a length that matches the header exactly.
func (u *udpServer) count(d []byte, from *net.UDPAddr) {
	if len(d) < udpHeaderLen || d[0] != udpPacketType ||
		len(d) != udpHeaderLen+int(binary.BigEndian.Uint16(d[2:4])) {
		u.malformed.Add(1)
		return
	}
	ssrc := binary.BigEndian.Uint32(d[4:8])
	u.mu.Lock()
	a := u.sessions[ssrc]
	u.mu.Unlock()
	if a == nil {
		u.unknown.Add(1)
		return
	}
	a.packets.Add(1)
	a.bytes.Add(int64(len(d) - udpHeaderLen))
	u.packets.Add(1)
	u.bytes.Add(int64(len(d) - udpHeaderLen))
	if v := a.voice.Load(); v != nil {
		u.relayUp(a, v, d, from)
		return
	}
	a.lastSeq.Store(binary.BigEndian.Uint32(d[12:16]))
}

func (u *udpServer) stats() UDPStats {
	return UDPStats{Packets: u.packets.Load(), Bytes: u.bytes.Load(), Malformed: u.malformed.Load(), Unknown: u.unknown.Load(),
		Stale: u.stale.Load(), Foreign: u.foreign.Load(), Sent: u.sent.Load()}
}
