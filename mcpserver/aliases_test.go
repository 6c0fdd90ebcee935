package mcpserver

import (
	"testing"

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

// TestAliasTiers: in a clash the operator's alias wins over any default,
// and a MAC's default over that of an id a board chose; a chosen id never
// takes an operator's name, even one of a board that is away, nor the
// form of a MAC's default alias.
func TestAliasTiers(t *testing.T) {
	const real, mac = "02:00:00:00:00:01", "02:00:00:00:00:02"
	n := assignNamesReserving([]namingDevice{
		{DeviceID: real, Alias: "kitchen"},
		{DeviceID: "kitchen"},
		{DeviceID: mac},
		{DeviceID: "dev_000002"},
		{DeviceID: "office"}, // an operator's name of a board not connected
		{DeviceID: "dev_abcdef"},
	}, map[string]string{"kitchen": real, "office": "02:00:00:00:00:03"})
	assert.Equal(t, "kitchen", n.Aliases[real])
	assert.Equal(t, "kitchen_"+shortHash("kitchen"), n.Aliases["kitchen"])
	assert.Equal(t, "dev_000002", n.Aliases[mac])
	assert.Equal(t, "dev_000002_"+shortHash("dev_000002"), n.Aliases["dev_000002"])
	assert.Equal(t, "office_"+shortHash("office"), n.Aliases["office"])
	assert.Equal(t, "dev_abcdef_"+shortHash("dev_abcdef"), n.Aliases["dev_abcdef"], "looks like a MAC's default alias")

	// Two MACs whose default aliases clash are equals: both move aside.
	n = assignNames([]namingDevice{{DeviceID: "aa:00:00:dd:ee:ff"}, {DeviceID: "bb:00:00:dd:ee:ff"}})
	assert.Equal(t, "dev_ddeeff_"+shortHash("aa:00:00:dd:ee:ff"), n.Aliases["aa:00:00:dd:ee:ff"])
	assert.Equal(t, "dev_ddeeff_"+shortHash("bb:00:00:dd:ee:ff"), n.Aliases["bb:00:00:dd:ee:ff"])
}
