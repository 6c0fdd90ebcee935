// Package ctxtime holds the one context-aware sleep the bridge, the stdio
// proxy and the simulator share.
package ctxtime

import (
	"context"
	"time"
)

// Sleep waits for d and reports false if ctx ended first.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
