package cluster

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// sharing starts three nodes that hold "mqtt" boards by claim and records
// which board each was told to adopt.
func sharing(t *testing.T) (nodes []*node, claims []*Claims, adopted []chan string) {
	t.Helper()
	url := startNATS(t)
	for _, id := range []string{"a", "b", "c"} {
		n := startNode(t, url, id)
		ch := make(chan string, 16)
		nodes = append(nodes, n)
		adopted = append(adopted, ch)
		claims = append(claims, n.node.ShareBoards("mqtt", func(id string) { ch <- id }))
	}
	require.Eventually(t, func() bool {
		for _, n := range nodes {
			n.node.dir.mu.Lock()
			k := len(n.node.dir.alive)
			n.node.dir.mu.Unlock()
			if k != 2 {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "every node sees the others")
	return nodes, claims, adopted
}

// TestClaimsOneHolder: three nodes claim one board at once; exactly one
// wins, the others then know without asking NATS, and a claimed board's
// session write on a node that lost does not take the record.
func TestClaimsOneHolder(t *testing.T) {
	_, claims, _ := sharing(t)
	const mac = "cc:00:00:00:00:01"
	won := make([]bool, len(claims))
	errs := make([]error, len(claims))
	var wg sync.WaitGroup
	for i, c := range claims {
		wg.Add(1)
		go func() {
			defer wg.Done()
			won[i], errs[i] = c.Claim(context.Background(), mac)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	holder := -1
	for i, ok := range won {
		if ok {
			require.Equal(t, -1, holder, "two nodes won the claim: %v", won)
			holder = i
		}
	}
	require.NotEqual(t, -1, holder, "nobody won the claim")
	require.Eventually(t, func() bool {
		for i, c := range claims {
			if c.HeldElsewhere(mac) != (i != holder) {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "every other node knows who holds the board")
	ok, err := claims[holder].Claim(context.Background(), mac)
	require.NoError(t, err)
	require.True(t, ok, "the holder claims again at once")
}

// TestClaimsAdoption: the holder dies without a word; exactly one survivor
// is told to adopt the board, and holds it. A clean stop hands the board
// on at once.
func TestClaimsAdoption(t *testing.T) {
	nodes, claims, adopted := sharing(t)
	const mac = "cc:00:00:00:00:02"
	ok, err := claims[0].Claim(context.Background(), mac)
	require.NoError(t, err)
	require.True(t, ok)
	require.Eventually(t, func() bool { return claims[1].HeldElsewhere(mac) && claims[2].HeldElsewhere(mac) },
		10*time.Second, 10*time.Millisecond)

	nodes[0].node.Abandon()
	var next int
	select {
	case id := <-adopted[1]:
		require.Equal(t, mac, id)
		next = 1
	case id := <-adopted[2]:
		require.Equal(t, mac, id)
		next = 2
	case <-time.After(10 * time.Second):
		t.Fatal("no survivor adopted the board")
	}
	other := 3 - next
	require.Eventually(t, func() bool { return claims[other].HeldElsewhere(mac) }, 10*time.Second, 10*time.Millisecond)
	ok, err = claims[other].Claim(context.Background(), mac)
	require.NoError(t, err)
	require.False(t, ok, "the board has one holder")
	require.Empty(t, adopted[other], "only one survivor adopts")

	// The new holder stops cleanly: the last node adopts at once.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	nodes[next].node.Stop(ctx)
	select {
	case id := <-adopted[other]:
		require.Equal(t, mac, id)
	case <-time.After(10 * time.Second):
		t.Fatal("the board was not handed over")
	}
	ok, err = claims[other].Claim(context.Background(), mac)
	require.NoError(t, err)
	require.True(t, ok)
}
