//go:build faults

package faults

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/devicebridge/devicebridge/app"
	"github.com/devicebridge/devicebridge/cluster"
	"github.com/devicebridge/devicebridge/internal/natstest"
	"github.com/devicebridge/devicebridge/simulator"
)

// TestFleetBus: a node of a fleet on an in-process NATS configured as
// docs/scaling.md says (configs/nats-fleet.conf: credentials required).
// Outsiders without the fleet's credentials (none, a wrong password, an
// unknown user, the fleet's user without its password, a token) are
// refused by NATS, a bypass if one gets in; the node's board answers
// throughout. A node told to join a NATS that lets anyone in refuses to
// start, with or without credentials of its own (a bypass if it starts),
// unless cluster.insecure says so.
func TestFleetBus(t *testing.T) {
	s := scenario(t, "fleet bus outsiders")
	srv := natstest.Start(t)
	cfg := baseConfig()
	cfg.Cluster.NATSURL = srv.ClientURL()
	cfg.Cluster.NodeID = "faults-a"
	cfg.Cluster.User, cfg.Cluster.Password = natstest.User, natstest.Password
	b := startBridge(t, cfg, nil)
	ref := b.board(simulator.Config{MAC: mac(23, 0)}).MAC()

	for _, tc := range []struct {
		name string
		opts []nats.Option
	}{
		{"no credentials", nil},
		{"wrong password", []nats.Option{nats.UserInfo(natstest.User, "not-the-password")}},
		{"unknown user", []nats.Option{nats.UserInfo("outsider", natstest.Password)}},
		{"the fleet's user without a password", []nats.Option{nats.UserInfo(natstest.User, "")}},
		{"a token", []nats.Option{nats.Token(natstest.Password)}},
	} {
		opts := append([]nats.Option{nats.Timeout(5 * time.Second), nats.NoReconnect()}, tc.opts...)
		nc, err := nats.Connect(srv.ClientURL(), opts...)
		switch {
		case err == nil:
			nc.Close()
			s.bypass("outsider with %s: connected", tc.name)
		case !errors.Is(err, nats.ErrAuthorization) && !errors.Is(err, nats.ErrAuthExpired):
			s.fail("outsider with %s: %v, want an authorization error", tc.name, err)
		default:
			s.checkAs(lossCrash, "the node after an outsider with "+tc.name, b.healthy(ref))
		}
	}

	// A node on a NATS that lets anyone in.
	open := natstest.StartOpen(t).ClientURL()
	for _, creds := range []bool{true, false} {
		c := baseConfig()
		c.Cluster.NATSURL, c.Cluster.NodeID = open, "faults-open"
		if creds {
			c.Cluster.User, c.Cluster.Password = natstest.User, natstest.Password
		}
		a, err := app.New(c, nil)
		if err == nil {
			ctx, cancel := context.WithCancel(context.Background())
			err = a.Start(ctx)
			if err == nil {
				s.bypass("a node joined an open NATS (credentials of its own: %v)", creds)
				sctx, scancel := context.WithTimeout(context.Background(), wait)
				_ = a.Shutdown(sctx)
				scancel()
			}
			cancel()
		}
		switch {
		case err == nil:
		case creds && errors.Is(err, cluster.ErrOpenNATS), !creds && err != nil:
			t.Logf("open NATS, credentials %v: %v", creds, err)
			s.ok()
		default:
			s.fail("open NATS, credentials %v: %v", creds, err)
		}
	}
	code, body := b.call(ref, "self.get_device_status", nil)
	s.checkAs(lossCrash, "the node's board at the end", statusErr(code, body, http.StatusOK))
}
