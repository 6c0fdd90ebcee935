package app_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/flow"
	"github.com/devicebridge/devicebridge/internal/natstest"
	"github.com/devicebridge/devicebridge/simulator"
)

// replayFleet is two nodes sharing one --flow-secret (user-only tools
// shown, so that self.reboot is on /mcp) with one board, on node a.
func replayFleet(t *testing.T) (baseA, baseB string, a *app.App, robot *simulator.Board) {
	t.Helper()
	url := startNATS(t)
	start := func(id string) (*app.App, string) {
		cfg := fleetConfig(url, id)
		cfg.Flow.Secret = fleetSecret
		cfg.MCP.ShowUserOnlyTools = true
		return startApp(t, cfg)
	}
	a, baseA = start("a")
	_, baseB = start("b")
	robot = connectBoard(t, a, replayMAC)
	waitListed(t, baseA, baseB)
	return baseA, baseB, a, robot
}

const replayMAC = "0a:00:00:00:00:07"

// waitListed waits until every node's /mcp lists the board's reboot.
func waitListed(t *testing.T, bases ...string) {
	t.Helper()
	want := upstream(replayMAC, "self.reboot")
	for _, base := range bases {
		cs := modernClient(t, base+"/mcp", nil)
		require.Eventually(t, func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			list, err := cs.ListTools(ctx, nil)
			require.NoError(t, err)
			return slices.ContainsFunc(list.Tools, func(tool *mcp.Tool) bool { return tool.Name == want })
		}, 10*time.Second, 20*time.Millisecond, "%s lists the board", base)
	}
}

func flowCode(t *testing.T, rpcErr map[string]any) string {
	t.Helper()
	require.NotNil(t, rpcErr, "an error")
	data, _ := rpcErr["data"].(map[string]any)
	code, _ := data["flowCode"].(string)
	return code
}

// TestFlowTokenReplayOnAnotherNode: behind a load balancer, a stateless
// token used on node a is refused on node b. A reboot confirmed once on a
// is not triggered again by replaying the same answer on b; a cancel on a
// makes a second cancel on b ALREADY_CANCELLED and an answer on b run
// nothing.
func TestFlowTokenReplayOnAnotherNode(t *testing.T) {
	noLeaks(t)
	baseA, baseB, a, robot := replayFleet(t)
	reboot := upstream(replayMAC, "self.reboot")

	started, rpcErr := flowRPC(t, baseA, "interaction.start", `"toolName":"`+reboot+`","initialParams":{}`)
	require.Nil(t, rpcErr)
	require.Equal(t, "waiting_user", started["state"], "a reboot asks for confirmation")
	token := started["sessionId"].(string)
	done, rpcErr := flowRPC(t, baseA, "interaction.respond", fmt.Sprintf(`"sessionId":%q,"response":{"value":true}`, token))
	require.Nil(t, rpcErr)
	require.Equal(t, "completed", done["state"])
	require.Eventually(t, func() bool { return robot.Stats().Reboots == 1 }, 10*time.Second, 5*time.Millisecond)

	// The board comes back, so that node b could reach it again.
	require.Eventually(t, func() bool { return !robot.Connected() }, 10*time.Second, 5*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, robot.ConnectWebSocket(ctx, a.DeviceURL()))
	waitListed(t, baseA, baseB)
	ran := robot.Stats().CallsRun

	_, rpcErr = flowRPC(t, baseB, "interaction.respond", fmt.Sprintf(`"sessionId":%q,"response":{"value":true}`, token))
	require.Equal(t, "INVALID_STATE_TRANSITION", flowCode(t, rpcErr))
	require.EqualValues(t, flow.CodeInvalidStateTransition, rpcErr["code"])
	assert.Contains(t, rpcErr["message"], "completed")
	_, rpcErr = flowRPC(t, baseB, "interaction.cancel", fmt.Sprintf(`"sessionId":%q`, token))
	require.Equal(t, "INVALID_STATE_TRANSITION", flowCode(t, rpcErr), "what ran cannot be cancelled")
	state, rpcErr := flowRPC(t, baseB, "interaction.getState", fmt.Sprintf(`"sessionId":%q`, token))
	require.Nil(t, rpcErr)
	assert.Equal(t, "completed", state["state"], "node b knows how it ended")
	assert.Equal(t, uint64(1), robot.Stats().Reboots, "the reboot ran once")
	assert.Equal(t, ran, robot.Stats().CallsRun, "nothing reached the board")

	// Cancelled on a: a second cancel on b is ALREADY_CANCELLED, and an
	// answer on b runs nothing.
	volume := upstream(replayMAC, "self.audio_speaker.set_volume")
	started, rpcErr = flowRPC(t, baseA, "interaction.start", `"toolName":"`+volume+`","initialParams":{}`)
	require.Nil(t, rpcErr)
	token = started["sessionId"].(string)
	_, rpcErr = flowRPC(t, baseA, "interaction.cancel", fmt.Sprintf(`"sessionId":%q`, token))
	require.Nil(t, rpcErr)
	_, rpcErr = flowRPC(t, baseB, "interaction.cancel", fmt.Sprintf(`"sessionId":%q`, token))
	require.Equal(t, "ALREADY_CANCELLED", flowCode(t, rpcErr))
	require.EqualValues(t, flow.CodeAlreadyCancelled, rpcErr["code"])
	_, rpcErr = flowRPC(t, baseB, "interaction.respond", fmt.Sprintf(`"sessionId":%q,"response":{"value":12}`, token))
	require.Equal(t, "INVALID_STATE_TRANSITION", flowCode(t, rpcErr))
	assert.Contains(t, rpcErr["message"], "cancelled")
	assert.Equal(t, ran, robot.Stats().CallsRun, "nothing reached the board")
}

// TestMRTRReplayOnAnotherNode: an MRTR retry whose answer ran the tool on
// node b is refused when the same requestState comes again, on either node,
// and the board ran the call once.
func TestMRTRReplayOnAnotherNode(t *testing.T) {
	noLeaks(t)
	baseA, baseB, _, robot := replayFleet(t)
	onA, onB := manualMRTR(t, baseA+"/mcp"), manualMRTR(t, baseB+"/mcp")
	name := upstream(replayMAC, "self.audio_speaker.set_volume")

	first := mrtrCall(t, onA, name, "", nil)
	require.True(t, first.NeedsInput())
	// A round that only asks may be retried, on any node: the form again.
	again := mrtrCall(t, onB, name, first.RequestState, 150)
	require.True(t, again.NeedsInput(), "out of range: asked again")
	retried := mrtrCall(t, onA, name, first.RequestState, 150)
	require.True(t, retried.NeedsInput(), "a retried round gets its form back")

	ran := robot.Stats().CallsRun
	res := mrtrCall(t, onB, name, again.RequestState, 27)
	require.False(t, res.NeedsInput())
	require.False(t, res.IsError, "%+v", res.Content)
	require.EqualValues(t, 27, robot.State()["audio_speaker.volume"])
	require.Equal(t, ran+1, robot.Stats().CallsRun)

	for _, replay := range []struct {
		cs    *mcp.ClientSession
		state string
	}{{onA, again.RequestState}, {onB, again.RequestState}, {onA, first.RequestState}, {onB, retried.RequestState}} {
		res := mrtrCall(t, replay.cs, name, replay.state, 28)
		require.False(t, res.NeedsInput())
		require.True(t, res.IsError)
		text := res.Content[0].(*mcp.TextContent).Text
		assert.Contains(t, text, "was not run again")
		assert.Contains(t, text, "already answered")
	}
	assert.EqualValues(t, 27, robot.State()["audio_speaker.volume"])
	assert.Equal(t, ran+1, robot.Stats().CallsRun, "the board ran set_volume once")
}

// TestFlowReplayCheckFailsClosedWithoutNATS: with a flow secret in a
// fleet, a node that cannot reach NATS cannot tell whether a token was
// used elsewhere: it runs nothing and says to retry; the token is still
// good once NATS is back.
func TestFlowReplayCheckFailsClosedWithoutNATS(t *testing.T) {
	noLeaks(t)
	dir := t.TempDir()
	s, err := server.NewServer(natstest.Options(t, dir, -1))
	require.NoError(t, err)
	go s.Start()
	require.True(t, s.ReadyForConnections(10*time.Second))
	port := s.Addr().(*net.TCPAddr).Port
	cfg := fleetConfig(s.ClientURL(), "a")
	cfg.Flow.Secret = fleetSecret
	cfg.MCP.ShowUserOnlyTools = true
	a, base := startApp(t, cfg)
	robot := connectBoard(t, a, replayMAC)
	waitListed(t, base)
	name := upstream(replayMAC, "self.audio_speaker.set_volume")
	started, rpcErr := flowRPC(t, base, "interaction.start", `"toolName":"`+name+`","initialParams":{}`)
	require.Nil(t, rpcErr)
	token := started["sessionId"].(string)
	cs := manualMRTR(t, base+"/mcp")
	first := mrtrCall(t, cs, name, "", nil)
	require.True(t, first.NeedsInput())
	ran := robot.Stats().CallsRun

	s.Shutdown()
	s.WaitForShutdown()
	_, rpcErr = flowRPC(t, base, "interaction.respond", fmt.Sprintf(`"sessionId":%q,"response":{"value":12}`, token))
	require.NotNil(t, rpcErr)
	require.EqualValues(t, -32603, rpcErr["code"])
	assert.Contains(t, rpcErr["message"], "could not check that this step was not already used")
	assert.Contains(t, rpcErr["message"], "retry")
	res := mrtrCall(t, cs, name, first.RequestState, 13)
	require.True(t, res.IsError)
	assert.Contains(t, res.Content[0].(*mcp.TextContent).Text, "was not run")
	assert.Contains(t, res.Content[0].(*mcp.TextContent).Text, "Retry the same request")
	assert.Equal(t, ran, robot.Stats().CallsRun, "nothing reached the board")

	s2, err := server.NewServer(natstest.Options(t, dir, port))
	require.NoError(t, err)
	go s2.Start()
	require.True(t, s2.ReadyForConnections(10*time.Second))
	t.Cleanup(func() { s2.Shutdown(); s2.WaitForShutdown() })
	require.Eventually(t, func() bool {
		done, rpcErr := flowRPC(t, base, "interaction.respond", fmt.Sprintf(`"sessionId":%q,"response":{"value":12}`, token))
		return rpcErr == nil && done["state"] == "completed"
	}, 20*time.Second, 100*time.Millisecond, "the same token works once NATS is back")
	res = mrtrCall(t, cs, name, first.RequestState, 13)
	require.False(t, res.IsError, "%+v", res.Content)
	assert.EqualValues(t, 13, robot.State()["audio_speaker.volume"])
	assert.Equal(t, ran+2, robot.Stats().CallsRun)
}
