package policy

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const example = `identities:
  kitchen:                        # a static token's name
    boards: ["AA-BB-CC-DD-00-01"]
  office:
    boards: ["aa:bb:cc:ee:00:01", "lab*"]
    tools: ["self.audio_speaker.*", "self.get_device_status"]
    confirm: ["self.reboot"]
  admins:
    boards: ["*"]
`

var (
	kitchenBoard = Board{ID: "aa:bb:cc:dd:00:01", Alias: "fridge"}
	officeBoard  = Board{ID: "aa:bb:cc:ee:00:01", Alias: "desk"}
	labBoard     = Board{ID: "aa:bb:cc:ff:00:01", Alias: "Lab2"}
)

func TestDecisions(t *testing.T) {
	p, err := Parse([]byte(example))
	require.NoError(t, err)
	kitchen, office := Identity{Name: "kitchen"}, Identity{Name: "office"}

	require.True(t, p.BoardVisible(kitchen, kitchenBoard))
	require.False(t, p.BoardVisible(kitchen, officeBoard))
	require.True(t, p.ToolAllowed(kitchen, kitchenBoard, "self.reboot"), "no tools: means every tool")
	require.False(t, p.ToolAllowed(kitchen, officeBoard, "self.get_device_status"))

	require.True(t, p.BoardVisible(office, officeBoard))
	require.True(t, p.BoardVisible(office, labBoard), "alias globs match case-insensitively")
	require.True(t, p.ToolAllowed(office, officeBoard, "self.audio_speaker.set_volume"))
	require.True(t, p.ToolAllowed(office, officeBoard, "self.get_device_status"))
	require.False(t, p.ToolAllowed(office, officeBoard, "self.reboot"))
	require.False(t, p.ToolAllowed(office, kitchenBoard, "self.get_device_status"))

	require.False(t, p.BoardVisible(Identity{Name: "stranger"}, kitchenBoard), "an identity not in the file sees nothing")
	require.False(t, p.BoardVisible(Identity{Name: Anonymous}, kitchenBoard))

	viaGroup := Identity{Name: "alice@example.com", Groups: []string{"admins"}}
	require.True(t, p.ToolAllowed(viaGroup, officeBoard, "self.reboot"), "a group grants what its entry lists")

	require.True(t, p.NeedsConfirm("self.reboot"), "confirm applies whoever calls")
	require.False(t, p.NeedsConfirm("self.get_device_status"))

	var g *Gate
	require.True(t, g.ToolAllowed(kitchen, officeBoard, "self.reboot"), "no policy: everything allowed")
	require.NoError(t, g.Check(kitchen, officeBoard, "x"))
	err = New(p).Check(kitchen, officeBoard, "self.reboot")
	require.EqualError(t, err, "not allowed for kitchen (policy): self.reboot on board desk; nothing was sent to the board")

	var labels []string
	gate := New(p)
	gate.OnDeny(func(l string) { labels = append(labels, l) })
	_ = gate.Check(kitchen, officeBoard, "self.reboot")
	_ = gate.Check(Identity{Name: "carol", Groups: []string{"x", "office"}}, kitchenBoard, "self.reboot")
	_ = gate.Check(Identity{Name: "mallory-1234"}, kitchenBoard, "self.reboot")
	require.Equal(t, []string{"kitchen", "office", "unlisted"}, labels, "metric labels stay within the policy's names")
}

func TestParseErrorsNameTheLine(t *testing.T) {
	for _, c := range []struct{ doc, want string }{
		{"identities:\n  a:\n    boards: [\"*\"]\n    tool: [\"x\"]\n", `line 4: identity "a": unknown key "tool"`},
		{"identities:\n  a:\n    boards: \"*\"\n", `line 3: identity "a": boards: must be a list`},
		{"identities:\n  a:\n    boards: [\"*\"]\n    tools:\n      - \"[bad\"\n", `line 5: identity "a": tools:`},
		{"identity:\n  a: {}\n", `line 1: unknown key "identity"`},
		{"identities:\n  a: {boards: [\"*\"]\n", "yaml: line "},
		{"", "line 1"},
	} {
		_, err := Parse([]byte(c.doc))
		require.Error(t, err, c.doc)
		require.Contains(t, err.Error(), c.want, c.doc)
	}
}

func TestReloadKeepsOldPolicyOnBadFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "policy.yaml")
	require.NoError(t, os.WriteFile(file, []byte(example), 0o600))
	g, err := Open(file, nil)
	require.NoError(t, err)
	changed := make(chan struct{}, 4)
	g.OnChange(func() { changed <- struct{}{} })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); g.Watch(ctx, 5*time.Millisecond) }()
	defer func() { cancel(); <-done }()

	kitchen := Identity{Name: "kitchen"}
	require.NoError(t, os.WriteFile(file, []byte("identities:\n  kitchen:\n    boards: [\"*\"\n"), 0o600))
	require.Eventually(t, func() bool { return g.LastError() != nil }, 5*time.Second, 5*time.Millisecond)
	require.Contains(t, g.LastError().Error(), "line ")
	require.False(t, g.BoardVisible(kitchen, officeBoard), "the old policy stays in force")
	require.True(t, g.BoardVisible(kitchen, kitchenBoard))

	require.NoError(t, os.WriteFile(file, []byte("identities:\n  kitchen:\n    boards: [\"*\"]\n"), 0o600))
	<-changed
	require.True(t, g.BoardVisible(kitchen, officeBoard), "a good file replaces the policy")
	require.NoError(t, g.LastError())
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(example))
	f.Add([]byte("identities:\n  a: ~\n"))
	f.Add([]byte("identities: [1, 2]\n"))
	f.Add([]byte("identities:\n  a:\n    boards: [[\"x\"]]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse(data)
		if err != nil {
			return
		}
		id := Identity{Name: "a", Groups: []string{"b"}}
		_ = p.BoardVisible(id, kitchenBoard)
		_ = p.ToolAllowed(id, kitchenBoard, "self.reboot")
		_ = p.NeedsConfirm("self.reboot")
		if p.BoardVisible(Identity{Name: "\x00nobody"}, kitchenBoard) {
			t.Fatal("an identity not in the file must see nothing")
		}
	})
}
