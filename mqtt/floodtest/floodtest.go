// Package floodtest floods an MQTT broker for tests the way an attacker
// would: a raw MQTT 3.1.1 connection that writes PUBLISH packets back to
// back, as fast as the socket takes them, and answers nothing.
package floodtest

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

// timeout bounds connecting and the CONNACK.
const timeout = 10 * time.Second

// batch is how many PUBLISH packets go out in one write.
const batch = 256

// Connect opens a raw connection as clientID (anonymous) and returns it
// with the CONNACK return code: 0 is accepted, 3 server unavailable, 5
// not authorized. A refused connection is closed.
func Connect(t testing.TB, addr, clientID string) (net.Conn, byte) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		t.Fatalf("floodtest: dial %s: %v", addr, err)
	}
	var buf bytes.Buffer
	connect := packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Connect},
		ProtocolVersion: 4,
		Connect: packets.ConnectParams{
			ProtocolName: []byte("MQTT"), Clean: true, Keepalive: 240, ClientIdentifier: clientID,
		},
	}
	if err := connect.ConnectEncode(&buf); err != nil {
		t.Fatalf("floodtest: encode CONNECT: %v", err)
	}
	ack := make([]byte, 4)
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write(buf.Bytes()); err != nil {
		_ = c.Close()
		t.Fatalf("floodtest: write CONNECT: %v", err)
	}
	if _, err := io.ReadFull(c, ack); err != nil {
		_ = c.Close()
		t.Fatalf("floodtest: read CONNACK: %v", err)
	}
	_ = c.SetDeadline(time.Time{})
	if ack[0] != 0x20 || ack[1] != 0x02 {
		_ = c.Close()
		t.Fatalf("floodtest: not a CONNACK: % x", ack)
	}
	if ack[3] != 0 {
		_ = c.Close()
	}
	return c, ack[3]
}

// Flooder is one connection publishing the same message until stopped or
// disconnected by the broker.
type Flooder struct {
	conn net.Conn
	sent atomic.Int64
	wg   sync.WaitGroup
	done chan struct{}
}

// Start connects as clientID and floods topic with payload. The broker
// must accept the connection. The flood ends at Stop (also run at the
// test's end) or when the broker closes the connection.
func Start(t testing.TB, addr, clientID, topic string, payload []byte) *Flooder {
	t.Helper()
	return StartN(t, addr, clientID, topic, payload, 0)
}

// StartN is Start that stops writing after n messages (rounded up to a
// whole batch of 256; 0 is no limit) and keeps the connection open.
func StartN(t testing.TB, addr, clientID, topic string, payload []byte, n int64) *Flooder {
	t.Helper()
	c, code := Connect(t, addr, clientID)
	if code != 0 {
		t.Fatalf("floodtest: %s refused with CONNACK code %d", clientID, code)
	}
	var one, buf bytes.Buffer
	pub := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish}, ProtocolVersion: 4,
		TopicName: topic, Payload: payload}
	if err := pub.PublishEncode(&one); err != nil {
		t.Fatalf("floodtest: encode PUBLISH: %v", err)
	}
	for range batch {
		buf.Write(one.Bytes())
	}
	burst := buf.Bytes()

	f := &Flooder{conn: c, done: make(chan struct{})}
	f.wg.Add(2)
	// Whatever the broker sends (requests to the board) is read and
	// ignored, so the broker sees a board that floods, not one that stalls.
	go func() {
		defer f.wg.Done()
		_, _ = io.Copy(io.Discard, c)
	}()
	go func() {
		defer f.wg.Done()
		defer close(f.done)
		for n == 0 || f.sent.Load() < n {
			if _, err := c.Write(burst); err != nil {
				return
			}
			f.sent.Add(batch)
		}
	}()
	t.Cleanup(f.Stop)
	return f
}

// Sent is how many messages the flooder has written so far.
func (f *Flooder) Sent() int64 { return f.sent.Load() }

// Done is closed once the flood has ended (all written, Stop, or the
// broker hung up).
func (f *Flooder) Done() <-chan struct{} { return f.done }

// Stop ends the flood and waits for its goroutines.
func (f *Flooder) Stop() {
	_ = f.conn.Close()
	f.wg.Wait()
}

// Publish writes one QoS 0 PUBLISH on a raw connection.
func Publish(c net.Conn, topic string, payload []byte) error {
	var buf bytes.Buffer
	pub := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish}, ProtocolVersion: 4,
		TopicName: topic, Payload: payload}
	if err := pub.PublishEncode(&buf); err != nil {
		return err
	}
	_, err := c.Write(buf.Bytes())
	return err
}

// Ping sends PINGREQ and waits for PINGRESP. A broker handles one
// client's packets in order, so once Ping returns everything written
// before it has been processed. The connection must receive nothing else
// meanwhile.
func Ping(c net.Conn) error {
	_ = c.SetDeadline(time.Now().Add(timeout))
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	if _, err := c.Write([]byte{0xc0, 0x00}); err != nil {
		return err
	}
	resp := make([]byte, 2)
	if _, err := io.ReadFull(c, resp); err != nil {
		return err
	}
	if resp[0] != 0xd0 || resp[1] != 0 {
		return fmt.Errorf("floodtest: expected PINGRESP, got % x", resp)
	}
	return nil
}
