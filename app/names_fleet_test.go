package app_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/mcpserver"
)

// fleetAliases reads a node's GET /api/devices: device id → alias, for the
// boards it lists ready.
func fleetAliases(t *testing.T, base string) map[string]string {
	t.Helper()
	var list struct {
		Devices []struct {
			DeviceID string `json:"device_id"`
			Alias    string `json:"alias"`
			State    string `json:"state"`
		} `json:"devices"`
	}
	getJSON(t, base+"/api/devices", &list)
	out := map[string]string{}
	for _, d := range list.Devices {
		if d.State == "ready" {
			out[d.DeviceID] = d.Alias
		}
	}
	return out
}

// TestFleetNamesAgree: two boards whose default aliases clash, on two
// nodes: every node names them as their holders do, including a node
// that starts after the first board left (where naming from scratch
// would give the second board the short alias), and the first board
// back on a third node.
func TestFleetNamesAgree(t *testing.T) {
	noLeaks(t)
	const first, second = "0a:00:00:00:00:01", "0b:00:00:00:00:01"
	short := mcpserver.DefaultAlias(first)
	require.Equal(t, short, mcpserver.DefaultAlias(second))
	long := func(id string) string { // the alias moved aside: a hash of the MAC
		sum := sha256.Sum256([]byte(id))
		return short + "_" + hex.EncodeToString(sum[:])[:6]
	}

	url := startNATS(t)
	a, baseA := startNode(t, url, "a")
	b, baseB := startNode(t, url, "b")
	agree := func(bases []string, want map[string]string, why string) {
		t.Helper()
		for _, base := range bases {
			if !assert.Eventually(t, func() bool { return fmt.Sprint(fleetAliases(t, base)) == fmt.Sprint(want) },
				15*time.Second, 20*time.Millisecond) {
				t.Fatalf("%s: %s shows %v, want %v", why, base, fleetAliases(t, base), want)
			}
		}
	}

	boardA := connectBoard(t, a, first)
	agree([]string{baseA, baseB}, map[string]string{first: short}, "the first board")
	connectBoard(t, b, second)
	agree([]string{baseA, baseB}, map[string]string{first: short, second: long(second)},
		"the second board joins: the first keeps its alias")

	require.NoError(t, boardA.Close())
	agree([]string{baseA, baseB}, map[string]string{second: long(second)}, "the first board left: the second keeps its alias")

	c, baseC := startNode(t, url, "c")
	agree([]string{baseC}, map[string]string{second: long(second)}, "a node that starts now names the second board as its holder does")
	// Its /mcp follows (the catalogue syncs on its own goroutine).
	host := mcpHost(t, baseC)
	require.Eventually(t, func() bool { n, err := mcpToolNames(host); return err == nil && len(n) > 0 },
		15*time.Second, 100*time.Millisecond)
	names, err := mcpToolNames(host)
	require.NoError(t, err)
	for _, n := range names {
		assert.True(t, strings.HasPrefix(n, long(second)+"_"), n)
	}

	connectBoard(t, c, first)
	agree([]string{baseA, baseB, baseC}, map[string]string{first: short, second: long(second)}, "the first board is back, on node c")
}
