package mqtt

import (
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"encoding/hex"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// fakeConv records the Opus packets a relayed session hands on.
type fakeConv struct {
	mu    sync.Mutex
	heard [][]byte
}

func (f *fakeConv) Audio(p []byte) {
	f.mu.Lock()
	f.heard = append(f.heard, p)
	f.mu.Unlock()
}
func (f *fakeConv) Text([]byte) {}
func (f *fakeConv) Close(error) {}
func (f *fakeConv) got() [][]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][]byte(nil), f.heard...)
}

// boardDatagram builds what a board sends: the nonce with length,
// timestamp and sequence written in, the payload AES-CTR encrypted with
// that header as the counter block.
func boardDatagram(t *testing.T, key, nonce string, seq uint32, opus []byte) []byte {
	t.Helper()
	k, _ := hex.DecodeString(key)
	n, _ := hex.DecodeString(nonce)
	block, err := aes.NewCipher(k)
	require.NoError(t, err)
	d := make([]byte, udpHeaderLen+len(opus))
	copy(d, n)
	binary.BigEndian.PutUint16(d[2:4], uint16(len(opus)))
	binary.BigEndian.PutUint32(d[12:16], seq)
	cipher.NewCTR(block, d[:udpHeaderLen]).XORKeyStream(d[udpHeaderLen:], opus)
	return d
}

// The bridge's side of a relayed UDP session, on real sockets: uplink
// datagrams are decrypted in order, repeats and older sequences and
// datagrams from a second address are dropped; downlink packets are
// encrypted the way boards decrypt them, with sequences from 1.
func TestUDPRelayRules(t *testing.T) {
	u, err := listenUDP("127.0.0.1:0", false, zap.NewNop())
	require.NoError(t, err)
	done := make(chan struct{})
	go func() { defer close(done); u.run() }()
	defer func() { _ = u.conn.Close(); <-done }()

	a := u.open("sess")
	conv := &fakeConv{}
	va, err := newVoiceAudio(a, conv)
	require.NoError(t, err)
	a.voice.Store(va)

	board, err := net.DialUDP("udp", nil, u.conn.LocalAddr().(*net.UDPAddr))
	require.NoError(t, err)
	defer board.Close()
	other, err := net.DialUDP("udp", nil, u.conn.LocalAddr().(*net.UDPAddr))
	require.NoError(t, err)
	defer other.Close()

	send := func(c *net.UDPConn, seq uint32, p string) {
		_, err := c.Write(boardDatagram(t, a.key, a.nonce, seq, []byte(p)))
		require.NoError(t, err)
	}
	send(board, 1, "one")
	require.Eventually(t, func() bool { return len(conv.got()) == 1 }, 5*time.Second, 5*time.Millisecond)
	send(board, 1, "repeat") // same sequence: dropped
	send(other, 5, "hijack") // another address: dropped
	send(board, 3, "three")
	send(board, 2, "older") // below the last: dropped
	send(board, 4, "four")
	require.Eventually(t, func() bool { return len(conv.got()) == 3 }, 5*time.Second, 5*time.Millisecond)
	require.Eventually(t, func() bool { st := u.stats(); return st.Stale == 2 && st.Foreign == 1 }, 5*time.Second, 5*time.Millisecond)
	assert.Equal(t, [][]byte{[]byte("one"), []byte("three"), []byte("four")}, conv.got())

	// Downlink: to the board's address, decryptable with the header as the
	// counter block, sequences counting from 1.
	require.True(t, u.sendDown(a, []byte("tts-0")))
	require.True(t, u.sendDown(a, []byte("tts-1")))
	assert.False(t, u.sendDown(a, make([]byte, maxDownPayload+1)), "larger than a board's buffer")
	k, _ := hex.DecodeString(a.key)
	block, _ := aes.NewCipher(k)
	buf := make([]byte, 2048)
	for i, want := range []string{"tts-0", "tts-1"} {
		require.NoError(t, board.SetReadDeadline(time.Now().Add(5*time.Second)))
		n, err := board.Read(buf)
		require.NoError(t, err)
		d := buf[:n]
		require.Equal(t, byte(udpPacketType), d[0])
		require.Equal(t, n, udpHeaderLen+int(binary.BigEndian.Uint16(d[2:4])))
		assert.Equal(t, uint32(i+1), binary.BigEndian.Uint32(d[12:16]))
		assert.Equal(t, a.ssrc, binary.BigEndian.Uint32(d[4:8]))
		plain := make([]byte, n-udpHeaderLen)
		cipher.NewCTR(block, d[:udpHeaderLen]).XORKeyStream(plain, d[udpHeaderLen:])
		assert.Equal(t, want, string(plain))
	}
	assert.EqualValues(t, 2, u.stats().Sent)
}
