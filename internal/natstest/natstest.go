// Package natstest runs in-process NATS servers for the fleet's tests: by
// default configured from configs/nats-fleet.conf, as docs/scaling.md tells
// an operator to run NATS (credentials required, the bridges' user
// confined to the fleet's subjects and buckets), so that the tests prove
// the documented permissions suffice; or open, for tests of what a node
// does on a NATS that lets anyone in.
package natstest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/devicebridge/devicebridge/configs"
)

// User and Password are the fleet's credentials on a server from Options.
const (
	User     = "devicebridge"
	Password = "natstest-fleet-password"
)

// Observer and ObserverPassword are a user of the tests' own on a server
// from Options, in the fleet's account without its user's restrictions:
// a test that watches the fleet's raw subjects ($KV....) uses it. It is not
// part of the documented configuration.
const (
	// Account is the fleet's account in configs/nats-fleet.conf.
	Account = "DEVICEBRIDGE"

	Observer         = "natstest-observer"
	ObserverPassword = "natstest-observer-password"
)

// Options is configs/nats-fleet.conf with Password for the user's
// password, listening on 127.0.0.1 at port (-1: a free one) and storing in
// dir (a test's temp dir; the same dir and port restart the same server).
func Options(t testing.TB, dir string, port int) *server.Options {
	t.Helper()
	conf := strings.ReplaceAll(configs.NATSFleet, "$DEVICEBRIDGE_NATS_PASSWORD", `"`+Password+`"`)
	path := filepath.Join(t.TempDir(), "nats-fleet.conf")
	require.NoError(t, os.WriteFile(path, []byte(conf), 0o600))
	opts, err := server.ProcessConfigFile(path)
	require.NoError(t, err)
	opts.Host, opts.Port, opts.StoreDir = "127.0.0.1", port, dir
	opts.NoLog, opts.NoSigs = true, true
	for _, u := range opts.Users {
		if u.Username == User {
			opts.Users = append(opts.Users, &server.User{Username: Observer, Password: ObserverPassword, Account: u.Account})
			break
		}
	}
	return opts
}

// OpenOptions is a server that lets anyone in (no credentials), with
// JetStream: what the docs started before the fleet bus was secured.
func OpenOptions(t testing.TB, dir string, port int) *server.Options {
	return &server.Options{Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true}
}

// Run starts a server with opts and shuts it down at cleanup (or earlier,
// by the test).
func Run(t testing.TB, opts *server.Options) *server.Server {
	t.Helper()
	s, err := server.NewServer(opts)
	require.NoError(t, err)
	go s.Start()
	require.True(t, s.ReadyForConnections(10*time.Second), "nats server did not start")
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

// Start runs a server from configs/nats-fleet.conf on a free port.
func Start(t testing.TB) *server.Server {
	t.Helper()
	return Run(t, Options(t, t.TempDir(), -1))
}

// StartOpen runs a server that lets anyone in, on a free port.
func StartOpen(t testing.TB) *server.Server {
	t.Helper()
	return Run(t, OpenOptions(t, t.TempDir(), -1))
}
