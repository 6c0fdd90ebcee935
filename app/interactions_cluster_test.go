package app_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// rawJSON sends a request and returns the status and the body as sent.
func rawJSON(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(data)
}

// TestInteractionsAnswerOnAnyNode: a guided call started through node a's
// control API (as the console and `devicebridge interact` do) is read,
// answered and cancelled through node b, as a client behind a load
// balancer would; the board really changes; every error has the status
// and body it has on the node that holds the interaction.
func TestInteractionsAnswerOnAnyNode(t *testing.T) {
	noLeaks(t)
	url := startNATS(t)
	a, baseA := startNode(t, url, "a")
	b, baseB := startNode(t, url, "b")
	connectBoard(t, b, "0b:00:00:00:00:08")
	connectBoard(t, a, "0a:00:00:00:00:08")
	for _, base := range []string{baseA, baseB} {
		require.Eventually(t, func() bool { return len(readyBoards(t, base)) == 2 }, 10*time.Second, 20*time.Millisecond)
	}

	type step struct {
		SessionID string `json:"sessionId"`
		State     string `json:"state"`
	}
	for _, mac := range []string{"0b:00:00:00:00:08", "0a:00:00:00:00:08"} {
		var s step
		require.Equal(t, http.StatusOK, doJSON(t, "POST", baseA+"/api/devices/"+mac+"/interactions", "",
			`{"name":"self.audio_speaker.set_volume","arguments":{}}`, &s))
		require.Equal(t, "waiting_user", s.State)
		require.True(t, strings.HasPrefix(s.SessionID, "a."), "the id names the node that holds it: %s", s.SessionID)

		var snap struct {
			SessionID string `json:"sessionId"`
			State     string `json:"state"`
		}
		require.Equal(t, http.StatusOK, doJSON(t, "GET", baseB+"/api/interactions/"+s.SessionID, "", "", &snap))
		require.Equal(t, s.SessionID, snap.SessionID)
		require.Equal(t, "waiting_user", snap.State)

		// A refused answer through b: the same 200 with a validation, as local.
		var refused struct {
			Accepted   *bool `json:"accepted"`
			Validation struct {
				Error string `json:"error"`
			} `json:"validation"`
		}
		require.Equal(t, http.StatusOK, doJSON(t, "POST", baseB+"/api/interactions/"+s.SessionID, "", `{"value":"loud"}`, &refused))
		require.NotNil(t, refused.Accepted)
		require.False(t, *refused.Accepted)

		require.Equal(t, http.StatusOK, doJSON(t, "POST", baseB+"/api/interactions/"+s.SessionID, "", `{"value":37}`, &s))
		require.Equal(t, "completed", s.State)
		require.True(t, strings.HasPrefix(s.SessionID, "a."))
		var res struct{ Content []struct{ Text string } }
		require.Equal(t, http.StatusOK, doJSON(t, "POST", baseB+"/api/devices/"+mac+"/call", "", `{"name":"self.get_device_status"}`, &res))
		require.Contains(t, res.Content[0].Text, `"volume":37`, "the board changed")

		// Answering a finished interaction: the same 409 body from either node.
		codeA, bodyA := rawJSON(t, "POST", baseA+"/api/interactions/"+s.SessionID, `{"value":1}`)
		codeB, bodyB := rawJSON(t, "POST", baseB+"/api/interactions/"+s.SessionID, `{"value":1}`)
		require.Equal(t, http.StatusConflict, codeA)
		require.Equal(t, codeA, codeB)
		require.Equal(t, bodyA, bodyB)
		require.Contains(t, bodyB, `"interaction_state"`)
		require.Contains(t, bodyB, s.SessionID, "messages name the id the client knows")
	}

	// Cancel through b, then the same ALREADY_CANCELLED answer from both.
	var s step
	require.Equal(t, http.StatusOK, doJSON(t, "POST", baseA+"/api/devices/0b:00:00:00:00:08/interactions", "",
		`{"name":"self.audio_speaker.set_volume","arguments":{}}`, &s))
	var cancelled struct {
		Cancelled bool   `json:"cancelled"`
		SessionID string `json:"sessionId"`
	}
	require.Equal(t, http.StatusOK, doJSON(t, "DELETE", baseB+"/api/interactions/"+s.SessionID, "", "", &cancelled))
	require.True(t, cancelled.Cancelled)
	require.Equal(t, s.SessionID, cancelled.SessionID)
	codeA, bodyA := rawJSON(t, "DELETE", baseA+"/api/interactions/"+s.SessionID, "")
	codeB, bodyB := rawJSON(t, "DELETE", baseB+"/api/interactions/"+s.SessionID, "")
	require.Equal(t, http.StatusConflict, codeB)
	require.Equal(t, codeA, codeB)
	require.Equal(t, bodyA, bodyB)
	require.Contains(t, bodyB, `"interaction_cancelled"`)

	// Unknown ids: 404 unknown_interaction, the same body from the holder's
	// peer as from the holder.
	unknown := "a.flw_00000000000000000000000000000000"
	codeA, bodyA = rawJSON(t, "GET", baseA+"/api/interactions/"+unknown, "")
	codeB, bodyB = rawJSON(t, "GET", baseB+"/api/interactions/"+unknown, "")
	require.Equal(t, http.StatusNotFound, codeA)
	require.Equal(t, codeA, codeB)
	require.Equal(t, bodyA, bodyB)
	require.Contains(t, bodyB, `"unknown_interaction"`)
	code, body := rawJSON(t, "GET", baseB+"/api/interactions/nope", "")
	require.Equal(t, http.StatusNotFound, code)
	require.Contains(t, body, `"unknown_interaction"`)

	// Another caller (another bearer identity) cannot use the id elsewhere
	// either: owners travel with the forwarded request.
	require.Equal(t, http.StatusOK, doJSON(t, "POST", baseA+"/api/devices/0b:00:00:00:00:08/interactions", "",
		`{"name":"self.audio_speaker.set_volume","arguments":{}}`, &s))
	code, body = rawJSON(t, "GET", baseB+"/api/interactions/"+s.SessionID, "")
	require.Equal(t, http.StatusOK, code, body)
	req, err := http.NewRequest("GET", baseB+"/api/interactions/"+s.SessionID, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer someone-else")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)

	// The holder leaves the fleet: its interactions are gone with it.
	require.NoError(t, a.Shutdown(t.Context()))
	code, body = rawJSON(t, "POST", baseB+"/api/interactions/"+s.SessionID, `{"value":5}`)
	require.Equal(t, http.StatusNotFound, code)
	require.Contains(t, body, `"unknown_interaction"`)
	require.Contains(t, body, "node a")
}
