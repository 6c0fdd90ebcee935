package flow

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var secret = []byte("0123456789abcdef0123456789abcdef")

func TestTokenRoundTripAcrossReplicas(t *testing.T) {
	f := newFixture(t, Options{Secret: secret})
	require.True(t, f.eng.Stateless())
	ctx := context.Background()
	f.reg.set(recordingTool("wizard", `{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0,"maximum":150}},"required":["name","age"]}`, f.calls))

	st := start(t, f, "alice", "wizard", `{}`)
	require.Equal(t, StateWaitingUser, st.State)
	assert.True(t, strings.HasPrefix(st.SessionID, tokenPrefix))
	tok1 := st.SessionID

	// A second engine with the same secret and no shared memory (another
	// replica, or this one after a restart) continues the interaction.
	other, err := NewEngine(Options{Lookup: f.reg.lookup, Now: f.clock.Now, Secret: secret})
	require.NoError(t, err)
	defer other.Close()
	st, err = other.Respond(ctx, "alice", tok1, raw(`"Ann"`))
	require.NoError(t, err)
	assert.Equal(t, "age", st.NextPrompt.Property)
	assert.NotEqual(t, tok1, st.SessionID, "each step has a new token")

	snap, err := f.eng.GetState(t.Context(), "alice", st.SessionID)
	require.NoError(t, err)
	assert.Equal(t, StateWaitingUser, snap.State)
	assert.Equal(t, st.SessionID, snap.SessionID)
	assert.JSONEq(t, `"Ann"`, string(snap.AccumulatedData["name"]))
	assert.Equal(t, "age", snap.CurrentPrompt.Property)
	assert.Len(t, snap.History, 1)

	st, err = f.eng.Respond(ctx, "alice", st.SessionID, raw(`200`))
	require.NoError(t, err)
	assert.False(t, *st.Accepted)
	st, err = other.Respond(ctx, "alice", st.SessionID, raw(`42`))
	require.NoError(t, err)
	assert.Equal(t, StateCompleted, st.State)
	assert.Equal(t, []string{`{"age":42,"name":"Ann"}`}, f.calls.list())

	// No server-side memory for waiting interactions: the token store
	// counts nothing per owner and holds no waiting interaction.
	assert.Zero(t, f.eng.Counts()[StateWaitingUser])

	// The final token reads as completed and takes no more answers.
	snap, err = other.GetState(t.Context(), "alice", st.SessionID)
	require.NoError(t, err)
	assert.Equal(t, StateCompleted, snap.State)
	_, err = f.eng.Respond(ctx, "alice", st.SessionID, raw(`1`))
	requireCode(t, err, CodeInvalidStateTransition)
	requireCode(t, f.eng.Cancel(t.Context(), "alice", st.SessionID, ""), CodeInvalidStateTransition)
}

func tamper(tok string) []string {
	dot := strings.LastIndexByte(tok, '.')
	payload, _ := base64.RawURLEncoding.DecodeString(tok[len(tokenPrefix):dot])
	var m map[string]any
	_ = json.Unmarshal(payload, &m)
	m["d"] = map[string]any{"volume": 100}
	forged, _ := json.Marshal(m)
	flipped := []byte(tok)
	flipped[len(flipped)-3] ^= 1
	return []string{
		tokenPrefix + base64.RawURLEncoding.EncodeToString(forged) + tok[dot:], // changed payload, old MAC
		string(flipped), // changed MAC
		tok[:dot],       // no MAC
		tok + "x",
		strings.Replace(tok, tokenPrefix, "flt2.", 1),
		"flw_" + strings.Repeat("0", 32), // a stateful id
		"",
		"flt1..",
	}
}

func TestTokenTampering(t *testing.T) {
	f := newFixture(t, Options{Secret: secret})
	ctx := context.Background()
	st := start(t, f, "alice", "self.audio_speaker.set_volume", `{}`)
	for _, bad := range tamper(st.SessionID) {
		_, err := f.eng.Respond(ctx, "alice", bad, raw(`40`))
		requireCode(t, err, CodeSessionNotFound)
		_, err = f.eng.GetState(t.Context(), "alice", bad)
		requireCode(t, err, CodeSessionNotFound)
		requireCode(t, f.eng.Cancel(t.Context(), "alice", bad, ""), CodeSessionNotFound)
	}
	// Another owner's token, or another secret: not found either.
	_, err := f.eng.Respond(ctx, "bob", st.SessionID, raw(`40`))
	requireCode(t, err, CodeSessionNotFound)
	other, err := NewEngine(Options{Lookup: f.reg.lookup, Now: f.clock.Now, Secret: []byte(strings.Repeat("z", 32))})
	require.NoError(t, err)
	defer other.Close()
	_, err = other.GetState(t.Context(), "alice", st.SessionID)
	requireCode(t, err, CodeSessionNotFound)
	assert.Empty(t, f.calls.list())

	// The genuine token still works.
	st, err = f.eng.Respond(ctx, "alice", st.SessionID, raw(`40`))
	require.NoError(t, err)
	assert.Equal(t, StateCompleted, st.State)
}

func TestTokenExpiry(t *testing.T) {
	f := newFixture(t, Options{Secret: secret, Timeout: time.Minute, MaxDuration: 5 * time.Minute})
	ctx := context.Background()
	st := start(t, f, "alice", "self.audio_speaker.set_volume", `{}`)
	f.clock.Advance(61 * time.Second)
	_, err := f.eng.Respond(ctx, "alice", st.SessionID, raw(`40`))
	fe := requireCode(t, err, CodeSessionExpired)
	assert.Equal(t, reasonInactive, fe.Data.(map[string]any)["reason"])
	_, err = f.eng.GetState(t.Context(), "alice", st.SessionID)
	requireCode(t, err, CodeSessionExpired)
	// Expired and someone else's: not found, which says less.
	_, err = f.eng.GetState(t.Context(), "bob", st.SessionID)
	requireCode(t, err, CodeSessionNotFound)

	// The hard limit travels in the token too.
	st = start(t, f, "alice", "self.audio_speaker.set_volume", `{}`)
	err = nil
	for i := 0; i < 6; i++ {
		f.clock.Advance(55 * time.Second)
		st, err = f.eng.Respond(ctx, "alice", st.SessionID, raw(`-5`))
		if err != nil {
			break
		}
	}
	fe = requireCode(t, err, CodeSessionExpired)
	assert.Equal(t, reasonMaxDuration, fe.Data.(map[string]any)["reason"])
	assert.Contains(t, fe.Message, "5m0s")
	assert.Empty(t, f.calls.list())
}

func TestTokenCancelAndReplay(t *testing.T) {
	f := newFixture(t, Options{Secret: secret})
	ctx := context.Background()
	st := start(t, f, "alice", "self.audio_speaker.set_volume", `{}`)
	require.NoError(t, f.eng.Cancel(t.Context(), "alice", st.SessionID, "no"))
	requireCode(t, f.eng.Cancel(t.Context(), "alice", st.SessionID, "no"), CodeAlreadyCancelled)
	_, err := f.eng.Respond(ctx, "alice", st.SessionID, raw(`40`))
	requireCode(t, err, CodeInvalidStateTransition)
	snap, err := f.eng.GetState(t.Context(), "alice", st.SessionID)
	require.NoError(t, err)
	assert.Equal(t, StateCancelled, snap.State)

	// Replaying an earlier token of a finished interaction on the same
	// replica runs nothing again.
	st = start(t, f, "alice", "self.audio_speaker.set_volume", `{}`)
	first := st.SessionID
	st, err = f.eng.Respond(ctx, "alice", first, raw(`40`))
	require.NoError(t, err)
	require.Equal(t, StateCompleted, st.State)
	_, err = f.eng.Respond(ctx, "alice", first, raw(`41`))
	requireCode(t, err, CodeInvalidStateTransition)
	assert.Len(t, f.calls.list(), 1)

	// Markers are short-lived: swept once the interaction would expire.
	f.clock.Advance(DefaultTimeout + time.Second)
	start(t, f, "alice", "self.get_device_status", `{}`)
	ts := f.eng.store.(*tokenStore)
	ts.mu.Lock()
	n := len(ts.entries)
	ts.mu.Unlock()
	assert.Equal(t, 0, n)
}

func TestTokenConcurrentRespond(t *testing.T) {
	f := newFixture(t, Options{Secret: secret})
	b := newBlockingTool(f, "slow", volumeSchema)
	ctx := context.Background()
	st := start(t, f, "alice", "slow", `{}`)
	done := make(chan *Step, 1)
	go func() {
		st, err := f.eng.Respond(ctx, "alice", st.SessionID, raw(`40`))
		assert.NoError(t, err)
		done <- st
	}()
	<-b.started
	_, err := f.eng.Respond(ctx, "alice", st.SessionID, raw(`41`))
	requireCode(t, err, CodeInvalidStateTransition)
	snap, err := f.eng.GetState(t.Context(), "alice", st.SessionID)
	require.NoError(t, err)
	assert.Equal(t, StateProcessing, snap.State)
	require.NoError(t, f.eng.Cancel(t.Context(), "alice", st.SessionID, "stop"))
	require.ErrorIs(t, <-b.ctxErr, context.Canceled)
	got := <-done
	assert.Equal(t, StateCancelled, got.State)
	snap, err = f.eng.GetState(t.Context(), "alice", got.SessionID)
	require.NoError(t, err)
	assert.Equal(t, StateCancelled, snap.State)
}

func TestTokenDoesNotCarryOwner(t *testing.T) {
	f := newFixture(t, Options{Secret: secret})
	st := start(t, f, "owner-credential-hash-123", "self.audio_speaker.set_volume", `{}`)
	dot := strings.LastIndexByte(st.SessionID, '.')
	payload, err := base64.RawURLEncoding.DecodeString(st.SessionID[len(tokenPrefix):dot])
	require.NoError(t, err)
	assert.NotContains(t, string(payload), "owner-credential-hash-123")
}
