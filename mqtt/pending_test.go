package mqtt

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPendingKeepsABurst: thousands of boards saying hello at once all
// wait (the old queue held 256 messages and dropped the rest, so those
// boards were never found), each board's messages stay in order, and the
// supervisor takes them a batch at a time.
func TestPendingKeepsABurst(t *testing.T) {
	p := newPending(DefaultDiscoveryBoards, DefaultDiscoveryBytes)
	const boards = 10000
	for i := range boards {
		id := fmt.Sprintf("02:00:00:%02x:%02x:%02x", i>>16, (i>>8)&0xff, i&0xff)
		require.True(t, p.add(discovery{deviceID: id, payload: []byte("hello")}))
		require.True(t, p.add(discovery{deviceID: id, payload: []byte("second")}))
	}
	seen := map[string][]string{}
	var batches int
	for {
		select {
		case <-p.ready:
		default:
			assert.Equal(t, boards, len(seen), "every board's messages were taken")
			assert.Equal(t, boards/discoveryBatch+1, batches)
			for id, msgs := range seen {
				require.Equal(t, []string{"hello", "second"}, msgs, id)
			}
			assert.Zero(t, p.bytes)
			return
		}
		batch := p.take(discoveryBatch)
		batches++
		for _, d := range batch {
			seen[d.deviceID] = append(seen[d.deviceID], string(d.payload))
		}
	}
}

// TestPendingBounds: an outsider flooding unknown ids or one id costs at
// most the bounds; past them messages are refused, and taking frees room.
func TestPendingBounds(t *testing.T) {
	p := newPending(3, 100)
	for i := range discoveryPerBoard {
		require.True(t, p.add(discovery{deviceID: "a", payload: []byte{byte(i)}}))
	}
	assert.False(t, p.add(discovery{deviceID: "a", payload: []byte{1}}), "per board")
	require.True(t, p.add(discovery{deviceID: "b", payload: []byte{1}}))
	require.True(t, p.add(discovery{deviceID: "c", payload: []byte{1}}))
	assert.False(t, p.add(discovery{deviceID: "d", payload: []byte{1}}), "boards")
	assert.False(t, p.add(discovery{deviceID: "b", payload: make([]byte, 100)}), "bytes")

	assert.Len(t, p.take(2), discoveryPerBoard+1)
	assert.Len(t, p.boards, 1)
	require.True(t, p.add(discovery{deviceID: "d", payload: []byte{1}}), "room again")
	assert.Len(t, p.take(10), 2)
	assert.Zero(t, p.bytes)
	assert.Empty(t, p.order)
}
