package flow

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCounts: the metrics accessor counts interactions by state, forgets
// expired ones, and in stateless mode counts only what this replica holds.
func TestCounts(t *testing.T) {
	f := newFixture(t, Options{Timeout: time.Minute})
	assert.Empty(t, f.eng.Counts())
	a := start(t, f, "alice", "self.audio_speaker.set_volume", `{}`)
	start(t, f, "bob", "self.audio_speaker.set_volume", `{}`)
	assert.Equal(t, map[State]int{StateWaitingUser: 2}, f.eng.Counts())

	_, err := f.eng.Respond(context.Background(), "alice", a.SessionID, raw(`40`))
	require.NoError(t, err)
	assert.Equal(t, map[State]int{StateWaitingUser: 1, StateCompleted: 1}, f.eng.Counts())

	f.clock.Advance(2 * time.Minute)
	assert.Empty(t, f.eng.Counts(), "expired interactions are not counted, swept or not")

	s := newFixture(t, Options{Secret: []byte("0123456789abcdef0123456789abcdef")})
	st := start(t, s, "alice", "self.audio_speaker.set_volume", `{}`)
	assert.Empty(t, s.eng.Counts(), "a waiting stateless interaction lives in its token")
	require.NoError(t, s.eng.Cancel(t.Context(), "alice", st.SessionID, ""))
	assert.Equal(t, map[State]int{StateCancelled: 1}, s.eng.Counts())
}
