package cluster

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/internal/natstest"
)

// TestSpentOneWinnerAcrossNodes: nodes spending the same keys at once get
// exactly one first per key; the others see the winner's use.
func TestSpentOneWinnerAcrossNodes(t *testing.T) {
	url := startNATS(t)
	stores := []*Spent{startNode(t, url, "a").node.Spent(), startNode(t, url, "b").node.Spent(), startNode(t, url, "c").node.Spent()}
	until := time.Now().Add(time.Minute)
	for k := range 10 {
		key := fmt.Sprintf("flt.%032x.1", k)
		type result struct {
			first bool
			prior string
			use   string
		}
		results := make(chan result, 2*len(stores))
		var wg sync.WaitGroup
		for i := range 2 * len(stores) {
			wg.Go(func() {
				use := fmt.Sprint("use", i)
				first, prior, err := stores[i%len(stores)].Spend(context.Background(), key, use, until)
				assert.NoError(t, err)
				results <- result{first, prior, use}
			})
		}
		wg.Wait()
		close(results)
		var winners []string
		var priors []string
		for r := range results {
			if r.first {
				winners = append(winners, r.use)
			} else {
				priors = append(priors, r.prior)
			}
		}
		require.Len(t, winners, 1, "exactly one first spend of %s", key)
		for _, p := range priors {
			assert.Equal(t, winners[0], p)
		}
		for _, s := range stores {
			use, err := s.Spent(context.Background(), key)
			require.NoError(t, err)
			assert.Equal(t, winners[0], use)
		}
	}
	use, err := stores[0].Spent(context.Background(), "flt.never.1")
	require.NoError(t, err)
	assert.Empty(t, use)
}

// TestSpentFailsClosedWithoutNATS: with NATS gone, spending and reading
// fail with ErrSpentUnavailable instead of guessing.
func TestSpentFailsClosedWithoutNATS(t *testing.T) {
	s := natstest.Start(t)
	a := startNode(t, s.ClientURL(), "a")
	store := a.node.Spent()
	first, _, err := store.Spend(context.Background(), "mrtr.1", "answered", time.Now().Add(time.Minute))
	require.NoError(t, err)
	require.True(t, first)

	s.Shutdown()
	s.WaitForShutdown()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, _, err = store.Spend(ctx, "mrtr.2", "answered", time.Now().Add(time.Minute))
	require.ErrorIs(t, err, ErrSpentUnavailable)
	_, err = store.Spent(ctx, "mrtr.1")
	require.ErrorIs(t, err, ErrSpentUnavailable)
}
