package app_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/cluster"
	"github.com/devicebridge/devicebridge/internal/natstest"
	"github.com/devicebridge/devicebridge/simulator"
)

// startNATS runs an in-process NATS server with JetStream on a random
// port, stored in a temp dir; tests never use a NATS of the machine. It is
// configured as docs/scaling.md says to run the fleet's NATS
// (configs/nats-fleet.conf): fleetConfig has its credentials.
func startNATS(t *testing.T) string {
	t.Helper()
	return startNATSServer(t).ClientURL()
}

func startNATSServer(t *testing.T) *server.Server {
	t.Helper()
	return natstest.Start(t)
}

const offlineWindow = 1500 * time.Millisecond

// fleetConfig is testConfig for node id of the fleet on natsURL, with the
// tests' offline window.
func fleetConfig(natsURL, id string) app.Config {
	cfg := testConfig()
	cfg.Cluster.NATSURL = natsURL
	cfg.Cluster.NodeID = id
	cfg.Cluster.User, cfg.Cluster.Password = natstest.User, natstest.Password
	cfg.Cluster.OfflineAfter = offlineWindow
	return cfg
}

// startNode starts one bridge node of the fleet, stopped at cleanup.
func startNode(t *testing.T, natsURL, id string) (*app.App, string) {
	t.Helper()
	return startApp(t, fleetConfig(natsURL, id))
}

// connectBoard connects a simulated board with the given MAC to a node.
func connectBoard(t *testing.T, a *app.App, mac string) *simulator.Board {
	t.Helper()
	b := newSimBoard(t, mac)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, b.ConnectWebSocket(ctx, a.DeviceURL()))
	return b
}

// readyBoards lists the ready boards GET /api/devices shows.
func readyBoards(t *testing.T, base string) []string {
	var list deviceList
	getJSON(t, base+"/api/devices", &list)
	var out []string
	for _, d := range list.Devices {
		if d.State == "ready" && d.ToolCount > 0 {
			out = append(out, d.DeviceID)
		}
	}
	sort.Strings(out)
	return out
}

func callStatus(t *testing.T, base, mac string) int {
	return postJSON(t, base+"/api/devices/"+mac+"/call", `{"name":"self.get_device_status"}`, nil)
}

// TestThreeNodesServeOneFleet: three bridges on one NATS, boards on each;
// every node's control API and /mcp list and call every board; a node that
// dies without a word has its boards shown offline elsewhere within the
// window, and a board that reconnects to a survivor is ready there.
func TestThreeNodesServeOneFleet(t *testing.T) {
	noLeaks(t)
	url := startNATS(t)
	a, baseA := startNode(t, url, "a")
	b, baseB := startNode(t, url, "b")
	c, baseC := startNode(t, url, "c")
	macs := map[*app.App][]string{
		a: {"0a:00:00:00:00:01", "0a:00:00:00:00:02"},
		b: {"0b:00:00:00:00:01", "0b:00:00:00:00:02"},
		c: {"0c:00:00:00:00:01"},
	}
	var all []string
	boards := map[string]*simulator.Board{}
	for node, list := range macs {
		for _, mac := range list {
			boards[mac] = connectBoard(t, node, mac)
			all = append(all, mac)
		}
	}
	sort.Strings(all)
	for _, base := range []string{baseA, baseB, baseC} {
		require.Eventually(t, func() bool { return fmt.Sprint(readyBoards(t, base)) == fmt.Sprint(all) },
			15*time.Second, 20*time.Millisecond, "every node lists every board")
	}

	// Metrics say which node holds what.
	m := scrapeMetrics(t, http.DefaultClient, baseC)
	require.Equal(t, 2.0, m[metricSeries("devicebridge_fleet_boards", "node", "a")])
	require.Equal(t, 2.0, m[metricSeries("devicebridge_fleet_boards", "node", "b")])
	require.Equal(t, 1.0, m[metricSeries("devicebridge_fleet_boards", "node", "c")])

	// Calls through the control API, routed both ways.
	require.Equal(t, http.StatusOK, callStatus(t, baseA, "0b:00:00:00:00:01"))
	require.Equal(t, http.StatusOK, callStatus(t, baseB, "0a:00:00:00:00:02"))
	require.Equal(t, http.StatusOK, callStatus(t, baseC, "0a:00:00:00:00:01"))
	var detail struct {
		Node  string `json:"node"`
		Tools []struct {
			Name string `json:"name"`
		} `json:"tools"`
	}
	require.Equal(t, http.StatusOK, getJSON(t, baseA+"/api/devices/0b_00_00_00_00_01", &detail), "a remote board's details")
	require.Equal(t, "b", detail.Node)
	require.NotEmpty(t, detail.Tools)
	require.Equal(t, http.StatusNotFound, postJSON(t, baseA+"/api/devices/0b:00:00:00:00:01/call", `{"name":"self.nope"}`, nil),
		"an unknown tool on a remote board is the same 404 as on a local one")

	// /mcp on node a publishes every board's tools and calls them.
	mcpCtx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "fleet-test", Version: "1"}, nil).Connect(mcpCtx,
		&mcp.StreamableClientTransport{Endpoint: baseA + "/mcp", MaxRetries: -1}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	require.NoError(t, err)
	var status []string
	require.Eventually(t, func() bool {
		list, err := cs.ListTools(mcpCtx, nil)
		require.NoError(t, err)
		status = status[:0]
		for _, tool := range list.Tools {
			if strings.HasSuffix(tool.Name, "get_device_status") {
				status = append(status, tool.Name)
			}
		}
		return len(status) == len(all)
	}, 10*time.Second, 20*time.Millisecond, "one status tool per board of the fleet")
	for _, name := range status {
		res, err := cs.CallTool(mcpCtx, &mcp.CallToolParams{Name: name})
		require.NoError(t, err)
		require.False(t, res.IsError, "%s: %+v", name, res.Content)
	}
	require.NoError(t, cs.Close())

	// 100 concurrent calls, each from a node to a board another node holds.
	type route struct{ base, mac string }
	routes := []route{{baseA, "0b:00:00:00:00:01"}, {baseA, "0c:00:00:00:00:01"}, {baseB, "0a:00:00:00:00:01"},
		{baseB, "0c:00:00:00:00:01"}, {baseC, "0a:00:00:00:00:02"}, {baseC, "0b:00:00:00:00:02"}}
	var wg sync.WaitGroup
	codes := make(chan int, 100)
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := routes[i%len(routes)]
			codes <- callStatus(t, r.base, r.mac)
		}()
	}
	wg.Wait()
	close(codes)
	for code := range codes {
		// 503 busy is a board's bounded queue answering honestly; anything
		// else would be a routing failure.
		require.Contains(t, []int{http.StatusOK, http.StatusServiceUnavailable}, code)
	}

	// Node b dies without cleaning up: its heartbeat lapses.
	// How soon is cluster.offline_after's business (tested in cluster/);
	// the poll's deadline only bounds the test on a loaded machine.
	b.Cluster().Abandon()
	want := []string{"0a:00:00:00:00:01", "0a:00:00:00:00:02", "0c:00:00:00:00:01"}
	for _, base := range []string{baseA, baseC} {
		require.Eventually(t, func() bool { return fmt.Sprint(readyBoards(t, base)) == fmt.Sprint(want) },
			10*time.Second, 10*time.Millisecond, "b's boards offline elsewhere")
	}
	// Boards on healthy nodes never fail meanwhile.
	require.Equal(t, http.StatusOK, callStatus(t, baseA, "0c:00:00:00:00:01"))
	require.Equal(t, http.StatusOK, callStatus(t, baseC, "0a:00:00:00:00:01"))

	// One of b's boards comes back through a survivor, c; every node sees
	// it there and calls reach it.
	ctx, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	require.NoError(t, boards["0b:00:00:00:00:01"].ConnectWebSocket(ctx, c.DeviceURL()))
	want = append(want, "0b:00:00:00:00:01")
	sort.Strings(want)
	require.Eventually(t, func() bool { return fmt.Sprint(readyBoards(t, baseA)) == fmt.Sprint(want) },
		10*time.Second, 20*time.Millisecond)
	require.Equal(t, http.StatusOK, callStatus(t, baseA, "0b:00:00:00:00:01"))
}

// TestWithoutNATSNothingChanges: no --nats, no fleet.
func TestWithoutNATSNothingChanges(t *testing.T) {
	noLeaks(t)
	a, _ := startApp(t, testConfig())
	require.Nil(t, a.Cluster())
}

func TestClusterFlags(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "nats-password")
	require.NoError(t, os.WriteFile(pw, []byte("s3cret\n"), 0o600))
	files := map[string]string{}
	for _, name := range []string{"creds", "nkey", "ca", "cert", "key"} {
		files[name] = filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(files[name], []byte("x"), 0o600))
	}
	cfg, err := app.ParseArgs("bridge", []string{"--nats", "nats://127.0.0.1:4333", "--node-id", "n1",
		"--nats-user", "bridge", "--nats-password-file", pw, "--nats-ca", files["ca"], "--nats-cert", files["cert"], "--nats-key", files["key"]})
	require.NoError(t, err)
	c := cfg.Cluster
	require.Equal(t, "nats://127.0.0.1:4333", c.NATSURL)
	require.Equal(t, "n1", c.NodeID)
	require.Equal(t, []string{"bridge", pw, files["ca"], files["cert"], files["key"]}, []string{c.User, c.PasswordFile, c.CAFile, c.CertFile, c.KeyFile})
	require.Empty(t, c.Password, "the password stays in its file")
	cfg.Cluster.NodeID = "bad.id"
	require.ErrorContains(t, cfg.Validate(), "node_id")

	cfg, err = app.ParseArgs("bridge", []string{"--nats", "nats://127.0.0.1:4333", "--nats-creds", files["creds"]})
	require.NoError(t, err)
	require.Equal(t, files["creds"], cfg.Cluster.CredsFile)
	cfg, err = app.ParseArgs("bridge", []string{"--nats", "nats://127.0.0.1:4333", "--nats-nkey", files["nkey"]})
	require.NoError(t, err)
	require.Equal(t, files["nkey"], cfg.Cluster.NKeySeedFile)
	cfg, err = app.ParseArgs("bridge", []string{"--nats", "nats://127.0.0.1:4333", "--nats-token-file", pw})
	require.NoError(t, err)
	require.Equal(t, pw, cfg.Cluster.TokenFile)
	cfg, err = app.ParseArgs("bridge", []string{"--nats", "nats://127.0.0.1:4333", "--nats-insecure"})
	require.NoError(t, err)
	require.True(t, cfg.Cluster.Insecure)
}

// TestClusterCredentials (issue 24, defect 15): a node refuses to start
// without NATS credentials unless insecure, saying which keys and flags
// give them; bad combinations are refused naming the key.
func TestClusterCredentials(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	require.NoError(t, os.WriteFile(pw, []byte("s3cret\n"), 0o600))
	empty := filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(empty, nil, 0o600))
	base := func() app.Config {
		cfg := testConfig()
		cfg.Cluster.NATSURL = "nats://127.0.0.1:4333"
		return cfg
	}
	cases := []struct {
		name string
		set  func(*app.ClusterConfig)
		env  map[string]string
		want string // "" is valid
	}{
		{"nothing", func(*app.ClusterConfig) {}, nil, "cluster: no NATS credentials"},
		{"insecure", func(c *app.ClusterConfig) { c.Insecure = true }, nil, ""},
		{"user and password", func(c *app.ClusterConfig) { c.User, c.Password = "bridge", "s3cret" }, nil, ""},
		{"user and password file", func(c *app.ClusterConfig) { c.User, c.PasswordFile = "bridge", pw }, nil, ""},
		{"user and password from the environment", func(c *app.ClusterConfig) { c.User = "bridge" },
			map[string]string{"DEVICEBRIDGE_NATS_PASSWORD": "s3cret"}, ""},
		{"token from the environment", func(*app.ClusterConfig) {}, map[string]string{"DEVICEBRIDGE_NATS_TOKEN": "t0ken"}, ""},
		{"token file", func(c *app.ClusterConfig) { c.TokenFile = pw }, nil, ""},
		{"user without password", func(c *app.ClusterConfig) { c.User = "bridge" }, nil, `cluster.user "bridge" needs a password`},
		{"password without user", func(c *app.ClusterConfig) { c.Password = "s3cret"; c.Insecure = true }, nil, "cluster.password goes with cluster.user"},
		{"password and its file", func(c *app.ClusterConfig) { c.User, c.Password, c.PasswordFile = "bridge", "x", pw }, nil,
			"give password or password_file, not both"},
		{"empty password file", func(c *app.ClusterConfig) { c.User, c.PasswordFile = "bridge", empty }, nil, "cluster.password_file " + empty + " is empty"},
		{"missing token file", func(c *app.ClusterConfig) { c.TokenFile = filepath.Join(dir, "nope") }, nil, "cluster.token_file"},
		{"two methods", func(c *app.ClusterConfig) { c.User, c.Password, c.Token = "bridge", "x", "t" }, nil, "give one of user/password, token"},
		{"missing creds file", func(c *app.ClusterConfig) { c.CredsFile = filepath.Join(dir, "nope.creds") }, nil, "cluster.creds_file"},
		{"missing nkey seed", func(c *app.ClusterConfig) { c.NKeySeedFile = filepath.Join(dir, "nope.nk") }, nil, "cluster.nkey_seed_file"},
		{"cert without key", func(c *app.ClusterConfig) { c.CertFile = pw }, nil, "cluster.cert_file and cluster.key_file go together"},
		{"credentials in the URL", func(c *app.ClusterConfig) {
			c.NATSURL, c.User, c.Password = "nats://127.0.0.1:4334,nats://bridge:s3cret@127.0.0.1:4333", "bridge", "x"
		}, nil, "cluster.nats_url: cluster: a NATS URL carries credentials"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			cfg := base()
			tc.set(&cfg.Cluster)
			err := cfg.Validate()
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), "s3cret", "a secret never appears in an error")
		})
	}
	err := base().Validate()
	for _, hint := range []string{"--nats-user", "--nats-password-file", "DEVICEBRIDGE_NATS_PASSWORD", "--nats-creds", "--nats-nkey",
		"--nats-cert", "--nats-insecure", "configs/nats-fleet.conf"} {
		require.ErrorContains(t, err, hint)
	}
}

// TestFleetNodeRefusesOpenNATS (issue 24, defect 15): a node refuses to
// start on a NATS that lets clients in without credentials: without
// credentials of its own (at validation) and with them (NATS ignores
// them; the probe gets in), unless insecure.
func TestFleetNodeRefusesOpenNATS(t *testing.T) {
	noLeaks(t)
	open := natstest.StartOpen(t).ClientURL()
	cfg := fleetConfig(open, "a")
	cfg.Cluster.User, cfg.Cluster.Password = "", ""
	_, err := app.New(cfg, nil)
	require.ErrorContains(t, err, "cluster: no NATS credentials")

	a, err := app.New(fleetConfig(open, "a"), nil)
	require.NoError(t, err)
	err = a.Start(context.Background())
	require.ErrorIs(t, err, cluster.ErrOpenNATS)
	require.ErrorContains(t, err, "lets clients in without credentials")

	cfg.Cluster.Insecure = true
	node, _ := startApp(t, cfg)
	require.NotNil(t, node.Cluster())
}

// TestInteractionOnARemoteBoard: a guided call (/api/interactions) on node
// a drives a board node b holds.
func TestInteractionOnARemoteBoard(t *testing.T) {
	noLeaks(t)
	url := startNATS(t)
	_, baseA := startNode(t, url, "a")
	b, _ := startNode(t, url, "b")
	connectBoard(t, b, "0b:00:00:00:00:07")
	require.Eventually(t, func() bool { return len(readyBoards(t, baseA)) == 1 }, 10*time.Second, 20*time.Millisecond)

	var s struct {
		SessionID string `json:"sessionId"`
		State     string `json:"state"`
	}
	require.Equal(t, http.StatusOK, doJSON(t, "POST", baseA+"/api/devices/0b:00:00:00:00:07/interactions", "",
		`{"name":"self.audio_speaker.set_volume","arguments":{}}`, &s))
	require.Equal(t, "waiting_user", s.State)
	require.Equal(t, http.StatusOK, doJSON(t, "POST", baseA+"/api/interactions/"+s.SessionID, "", `{"value":42}`, &s))
	require.Equal(t, "completed", s.State)
	var res struct{ Content []struct{ Text string } }
	require.Equal(t, http.StatusOK, doJSON(t, "POST", baseA+"/api/devices/0b:00:00:00:00:07/call", "", `{"name":"self.get_device_status"}`, &res))
	require.Contains(t, res.Content[0].Text, `"volume":42`)
}

// TestRoutedCallMetrics: routed calls are counted on both nodes, by
// direction and outcome, with their latency; a call the holder cannot
// answer any more counts as no responder; each node says whether it is
// connected to NATS.
func TestRoutedCallMetrics(t *testing.T) {
	noLeaks(t)
	srv := startNATSServer(t)
	url := srv.ClientURL()
	node := func(id string) (*app.App, string) {
		cfg := fleetConfig(url, id)
		// Long enough that a's view keeps b's board after b is gone.
		cfg.Cluster.OfflineAfter = time.Minute
		return startApp(t, cfg)
	}
	_, baseA := node("a")
	b, baseB := node("b")
	connectBoard(t, b, "0b:00:00:00:00:05")
	require.Eventually(t, func() bool { return len(readyBoards(t, baseA)) == 1 }, 10*time.Second, 20*time.Millisecond)

	for range 3 {
		require.Equal(t, http.StatusOK, callStatus(t, baseA, "0b:00:00:00:00:05"))
	}
	require.Equal(t, http.StatusUnprocessableEntity, postJSON(t, baseA+"/api/devices/0b:00:00:00:00:05/call",
		`{"name":"self.audio_speaker.set_volume","arguments":{"volume":"loud"}}`, nil))

	mA, mB := scrapeMetrics(t, http.DefaultClient, baseA), scrapeMetrics(t, http.DefaultClient, baseB)
	series := func(dir, outcome string) string {
		return metricSeries("devicebridge_routed_calls_total", "direction", dir, "outcome", outcome)
	}
	require.Equal(t, 3.0, mA[series("out", "ok")])
	require.Equal(t, 3.0, mB[series("in", "ok")])
	require.Equal(t, 0.0, mA[series("in", "ok")], "a answered nothing")
	outFailed, inFailed := 0.0, 0.0
	for k, v := range mA {
		if strings.HasPrefix(k, "devicebridge_routed_calls_total{") && strings.Contains(k, `direction="out"`) && !strings.Contains(k, `"ok"`) {
			outFailed += v
		}
	}
	for k, v := range mB {
		if strings.HasPrefix(k, "devicebridge_routed_calls_total{") && strings.Contains(k, `direction="in"`) && !strings.Contains(k, `"ok"`) {
			inFailed += v
		}
	}
	require.Equal(t, 1.0, outFailed, "the refused call, on the caller")
	require.Equal(t, 1.0, inFailed, "and on the holder, with the same outcome")
	require.Equal(t, 4.0, mA[metricSeries("devicebridge_routed_call_duration_seconds_count", "direction", "out")])
	require.Equal(t, 4.0, mB[metricSeries("devicebridge_routed_call_duration_seconds_count", "direction", "in")])
	require.Equal(t, 1.0, mA["devicebridge_cluster_nats_connected"])
	require.Equal(t, 0.0, mA["devicebridge_routed_call_no_responders_total"])
	require.Equal(t, 0.0, mA[metricSeries("devicebridge_cluster_directory_write_failures_total", "bucket", "boards")])

	// b dies without a word; a still lists its board (the window is long)
	// and its call finds nobody answering: offline, counted as no responder.
	bCalls := cluster.DefaultPrefix + ".call.b.any"
	fleet, err := srv.LookupAccount(natstest.Account)
	require.NoError(t, err)
	require.True(t, fleet.SubscriptionInterest(bCalls), "b takes calls")
	b.Cluster().Abandon()
	// Wait for what the call depends on, nobody subscribed to b's calls,
	// not for NATS's client count: nats-server drops a closed client from
	// that count before it removes the client's subscriptions.
	require.Eventually(t, func() bool {
		return !fleet.SubscriptionInterest(bCalls)
	}, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, http.StatusBadGateway, callStatus(t, baseA, "0b:00:00:00:00:05"), "offline")
	mA, mB = scrapeMetrics(t, http.DefaultClient, baseA), scrapeMetrics(t, http.DefaultClient, baseB)
	require.Equal(t, 1.0, mA["devicebridge_routed_call_no_responders_total"])
	require.Equal(t, 1.0, mA[series("out", "offline")])
	require.Equal(t, 0.0, mB["devicebridge_cluster_nats_connected"], "b left NATS")
}
