package broker

import (
	"bytes"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// TestCloseWhileBoardsChurn: the broker shuts down while boards keep
// connecting and leaving. mochi's own Close could wait for good on its
// client list's lock (mochi-mqtt/server#488, about one Close in a hundred
// under this churn) and race a socket accepted at that moment against its
// wait group (which -race reports); Close must end every time.
func TestCloseWhileBoardsChurn(t *testing.T) {
	rounds := 60
	if testing.Short() {
		rounds = 10
	}
	for round := range rounds {
		b, err := New(Config{Listen: "127.0.0.1:0"}, zap.NewNop())
		require.NoError(t, err)
		require.NoError(t, b.Start())
		addr := b.Addr().String()
		var stop atomic.Bool
		var wg sync.WaitGroup
		var connected atomic.Int64
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; !stop.Load(); i++ {
					if churnOnce(addr, fmt.Sprintf("GID_test@@@02_00_00_00_%02x_%02x@@@c", w, i%200)) {
						connected.Add(1)
					}
				}
			}()
		}
		require.Eventually(t, func() bool { return connected.Load() >= 8 }, wait, time.Millisecond, "boards churn before Close")
		done := make(chan struct{})
		go func() { _ = b.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(wait):
			stop.Store(true)
			t.Fatalf("round %d: Close did not return while boards connected and left", round)
		}
		stop.Store(true)
		wg.Wait()
	}
}

// churnOnce connects a board, waits for its CONNACK and leaves; false
// when the broker did not take it (it is stopping).
func churnOnce(addr, clientID string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	var buf bytes.Buffer
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect}, ProtocolVersion: 4,
		Connect: packets.ConnectParams{ProtocolName: []byte("MQTT"), Clean: true, Keepalive: 60, ClientIdentifier: clientID}}
	if pk.ConnectEncode(&buf) != nil {
		return false
	}
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write(buf.Bytes()); err != nil {
		return false
	}
	ack := make([]byte, 4)
	n, _ := c.Read(ack)
	return n == 4 && ack[3] == 0
}
