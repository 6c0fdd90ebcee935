package mcpserver

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestValidAlias(t *testing.T) {
	for _, ok := range []string{"kitchen", "Kitchen-2", "a", "dev_ddeeff", "x_y-z", "abcdefghijklmnopqrstuvwx"} {
		assert.True(t, ValidAlias(ok), ok)
	}
	for _, bad := range []string{"", "bad alias!", "büro", "_x", "x_", "-x", "x-", "a__b", "a.b",
		"abcdefghijklmnopqrstuvwxy", "aabbccddeeff", "AA-BB-CC-DD-EE-FF"} {
		assert.False(t, ValidAlias(bad), bad)
	}
}

func TestParseAliases(t *testing.T) {
	a, err := ParseAliases(map[string]string{"AA-BB-CC-DD-EE-01": "kitchen", "aabbccddee02": "Office"})
	require.NoError(t, err)
	alias, ok := a.Of("aa:bb:cc:dd:ee:01")
	assert.True(t, ok)
	assert.Equal(t, "kitchen", alias)
	id, ok := a.Named("OFFICE")
	assert.True(t, ok)
	assert.Equal(t, "aa:bb:cc:dd:ee:02", id)
	assert.Equal(t, "dev_ddee03", a.Alias("aa:bb:cc:dd:ee:03"))

	for _, tc := range []struct {
		m    map[string]string
		want string
	}{
		{map[string]string{"kitchen": "lamp"}, `mcp.aliases: key "kitchen" is not a MAC`},
		{map[string]string{"aa:bb:cc:dd:ee:01": "bad alias!"}, `mcp.aliases[aa:bb:cc:dd:ee:01]: alias "bad alias!" is not a valid name: use 1 to 24`},
		{map[string]string{"aa:bb:cc:dd:ee:01": "aabbccddee02"}, "not a MAC"},
		{map[string]string{"aa:bb:cc:dd:ee:01": "a", "AA-BB-CC-DD-EE-01": "b"}, `are the same board (aa:bb:cc:dd:ee:01)`},
		{map[string]string{"aa:bb:cc:dd:ee:01": "hall", "aa:bb:cc:dd:ee:02": "HALL"}, `names two boards`},
	} {
		_, err := ParseAliases(tc.m)
		require.Error(t, err, tc.m)
		assert.ErrorContains(t, err, tc.want)
	}
}

// TestAliasTiers: the operator's alias is reserved for its board, even
// while it is away: no default alias takes it; a chosen id never takes
// the form of a MAC's default alias, moved aside or not.
func TestAliasTiers(t *testing.T) {
	const real, mac = "02:00:00:00:00:01", "02:00:00:00:00:02"
	n := assignNames([]namingDevice{
		{DeviceID: "kitchen"}, // connected first, the operator's name of another board
		{DeviceID: real, Alias: "kitchen"},
		{DeviceID: "dev_000002"},
		{DeviceID: mac},
		{DeviceID: "office"}, // an operator's name of a board not connected
		{DeviceID: "dev_abcdef"},
		{DeviceID: "dev_abcdef_123456"},
		{DeviceID: "dev_abcdef_2"},
	}, map[string]string{"kitchen": real, "office": "02:00:00:00:00:03"})
	assert.Equal(t, "kitchen", n.Aliases[real])
	assert.Equal(t, "kitchen_"+shortHash("kitchen"), n.Aliases["kitchen"])
	assert.Equal(t, "dev_000002", n.Aliases[mac])
	assert.Equal(t, "dev_000002_"+shortHash("dev_000002"), n.Aliases["dev_000002"])
	assert.Equal(t, "office_"+shortHash("office"), n.Aliases["office"])
	assert.Equal(t, "dev_abcdef_"+shortHash("dev_abcdef"), n.Aliases["dev_abcdef"], "looks like a MAC's default alias")
	assert.Equal(t, withSuffix("dev_abcdef_123456", shortHash("dev_abcdef_123456"), maxAliasLen), n.Aliases["dev_abcdef_123456"],
		"looks like a MAC's default alias moved aside")
	assert.Equal(t, "dev_abcdef_2_"+shortHash("dev_abcdef_2"), n.Aliases["dev_abcdef_2"])

	// Two MACs whose default aliases clash, joining together: the first
	// to connect keeps it, the other moves aside.
	early, late := time.Unix(100, 0), time.Unix(200, 0)
	n = assignNames([]namingDevice{{DeviceID: "aa:00:00:dd:ee:ff", ConnectedAt: late}, {DeviceID: "bb:00:00:dd:ee:ff", ConnectedAt: early}}, nil)
	assert.Equal(t, "dev_ddeeff_"+shortHash("aa:00:00:dd:ee:ff"), n.Aliases["aa:00:00:dd:ee:ff"])
	assert.Equal(t, "dev_ddeeff", n.Aliases["bb:00:00:dd:ee:ff"])
}
