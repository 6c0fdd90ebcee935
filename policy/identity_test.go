package policy

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBoardNamesAreNotIDs: a pattern that is not a MAC names aliases only,
// so a board that chose "kitchen" as its id gets none of kitchen's rights;
// a MAC pattern matches the board in any spelling.
func TestBoardNamesAreNotIDs(t *testing.T) {
	p, err := Parse([]byte("identities:\n  cook:\n    boards: [\"kitchen\", \"lab*\", \"AA-BB-CC-DD-00-09\"]\n"))
	require.NoError(t, err)
	cook := Identity{Name: "cook"}
	require.True(t, p.BoardVisible(cook, Board{ID: "02:00:00:00:00:01", Alias: "kitchen"}))
	require.False(t, p.BoardVisible(cook, Board{ID: "kitchen", Alias: "kitchen_3171d8"}), "an id a board chose is not a name")
	require.False(t, p.BoardVisible(cook, Board{ID: "kitchen"}))
	require.False(t, p.BoardVisible(cook, Board{ID: "lab3"}), "globs match aliases, not ids")
	require.False(t, p.BoardVisible(cook, Board{ID: "lab-evil", Alias: "lab-evil"}), "nor do globs match the alias of an id a board chose")
	require.True(t, p.BoardVisible(cook, Board{ID: "02:00:00:00:00:02", Alias: "lab2"}))
	require.True(t, p.BoardVisible(cook, Board{ID: "aabbccdd0009"}))
	require.True(t, p.BoardVisible(cook, Board{ID: "aa:bb:cc:dd:00:09", Alias: "dev_dd0009"}))

	rig, err := Parse([]byte("identities:\n  rig:\n    boards: [\"sensor-17\"]\n"))
	require.NoError(t, err)
	require.True(t, rig.BoardVisible(Identity{Name: "rig"}, Board{ID: "sensor-17", Alias: "sensor-17"}), "its exact alias does")
}
