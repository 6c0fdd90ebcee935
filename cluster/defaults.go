package cluster

import (
	"cmp"
	"time"

	"github.com/devicebridge/devicebridge/device"
)

// withDefaults returns c with unset fields set to their defaults. NodeID is
// not among them: Start gives a node its generated id before checking it.
func (c Config) withDefaults() Config {
	c.Prefix = cmp.Or(c.Prefix, DefaultPrefix)
	// max(x, 0): a negative value here has always meant the default too.
	c.OfflineAfter = cmp.Or(max(c.OfflineAfter, 0), DefaultOfflineAfter)
	// Past the longest per-tool timeout, so that the holder's own timeout
	// answers a slow tool's call, not this limit.
	c.RemoteCallLimit = cmp.Or(max(c.RemoteCallLimit, 0), device.MaxToolTimeout+time.Minute)
	c.SpentTTL = cmp.Or(max(c.SpentTTL, 0), DefaultSpentTTL)
	c.CatalogGCInterval = cmp.Or(max(c.CatalogGCInterval, 0), 10*time.Minute)
	c.CatalogGrace = cmp.Or(max(c.CatalogGrace, 0), 30*time.Minute)
	return c
}
