package drainer

import (
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestConcurrentKicks: many producers queue and kick at once. Every item is
// taken, never by two workers at a time, and no worker is left once the
// producers are done.
func TestConcurrentKicks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const producers, each = 8, 2000
		queue := make(chan int, producers*each)
		var taken, active atomic.Int64
		var overlaps atomic.Int64
		d := New(func() bool {
			if active.Add(1) > 1 {
				overlaps.Add(1)
			}
			defer active.Add(-1)
			for {
				select {
				case <-queue:
					taken.Add(1)
				default:
					return true
				}
			}
		}, func() bool { return len(queue) > 0 })

		var wg sync.WaitGroup
		for range producers {
			wg.Go(func() {
				for i := range each {
					queue <- i
					d.Kick()
				}
			})
		}
		wg.Wait()
		// Workers never block: once every goroutine of the bubble is
		// blocked or gone, the last worker has ended.
		synctest.Wait()
		assert.EqualValues(t, producers*each, taken.Load(), "no queued item is left behind")
		assert.Empty(t, queue)
		assert.Zero(t, overlaps.Load(), "two workers ran at once")
		assert.False(t, d.running.Load(), "a worker is still marked running")
		d.Close()
	})
}

// TestKickWhileWindingDown: work queued after the worker's last look, whose
// Kick finds the worker still running, is taken by that worker before it
// ends. This is the interleaving the concurrent test can only hope to hit.
func TestKickWhileWindingDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		queue := make(chan int, 4)
		var taken atomic.Int64
		late := true
		var d *Drainer
		d = New(func() bool {
			for {
				select {
				case <-queue:
					taken.Add(1)
				default:
					if late {
						// A producer that queues now sees a worker
						// running and starts none.
						late = false
						queue <- 2
						d.Kick()
					}
					return true
				}
			}
		}, func() bool { return len(queue) > 0 })
		queue <- 1
		d.Kick()
		synctest.Wait()
		assert.EqualValues(t, 2, taken.Load(), "the late item was left in the queue")
		assert.False(t, d.running.Load())
		d.Close()
	})
}

// TestCloseWaits: Close waits for the worker in progress, and a Kick after
// Close starts none.
func TestCloseWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		queue := make(chan int, 4)
		release := make(chan struct{})
		var taken atomic.Int64
		d := New(func() bool {
			for {
				select {
				case <-queue:
					<-release // the owner's output, stuck for now
					taken.Add(1)
				default:
					return true
				}
			}
		}, func() bool { return len(queue) > 0 })

		queue <- 1
		d.Kick()
		synctest.Wait() // the worker is stuck in release

		var closed atomic.Bool
		go func() {
			d.Close()
			closed.Store(true)
		}()
		synctest.Wait()
		require.False(t, closed.Load(), "Close returned while the worker ran")

		close(release)
		synctest.Wait()
		require.True(t, closed.Load())
		assert.EqualValues(t, 1, taken.Load())

		queue <- 2
		d.Kick()
		synctest.Wait()
		assert.Len(t, queue, 1, "a Kick after Close started a worker")
	})
}

// TestDrainStops: a drain that returns false ends its worker without a
// second look; the next Kick starts a fresh one.
func TestDrainStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		queue := make(chan int, 4)
		var calls atomic.Int64
		d := New(func() bool {
			calls.Add(1)
			return false
		}, func() bool { return len(queue) > 0 })
		queue <- 1
		d.Kick()
		synctest.Wait()
		assert.EqualValues(t, 1, calls.Load(), "the worker looked again after a stop")
		d.Kick()
		synctest.Wait()
		assert.EqualValues(t, 2, calls.Load())
		d.Close()
	})
}
