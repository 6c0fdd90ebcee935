package app

import (
	"context"
	"fmt"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/simulator"
)

// startSimulators starts cfg.Simulate.Count boards in-process. They are
// ordinary clients of the bridge's own device listener: they speak the real
// WebSocket protocol over loopback, exactly as hardware would.
func (a *App) startSimulators(_ context.Context) error {
	n := a.cfg.Simulate.Count
	if n == 0 {
		return nil
	}
	profile, err := simulator.LoadProfile(a.cfg.Simulate.Profile)
	if err != nil {
		return err
	}
	var token string
	if len(a.cfg.WebSocket.Tokens) > 0 {
		token = a.cfg.WebSocket.Tokens[0]
	}
	fleet, err := simulator.NewFleet(simulator.FleetConfig{
		URL:       a.DeviceURL(),
		Profile:   profile,
		Count:     n,
		Token:     token,
		Reconnect: true,
		// Only errors: the bridge already logs what happens to these boards,
		// and at shutdown each would otherwise warn that it is reconnecting.
		Logger: a.log.Named("simulator").WithOptions(zap.IncreaseLevel(zap.ErrorLevel)),
	})
	if err != nil {
		return fmt.Errorf("simulated boards: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a.mu.Lock()
	a.stopSimulators = cancel
	a.mu.Unlock()
	if token == "" && a.cfg.WebSocket.RequireToken && a.ota != nil {
		// Credentials are required and there is no static token to share:
		// the boards boot through the OTA endpoint like real ones and use
		// what it issues them (and wait for approval in approval mode).
		a.goOwned(func() { _ = fleet.RunOTA(ctx, simulator.OTAConfig{URL: a.OTAURL()}) })
	} else {
		a.goOwned(func() { _ = fleet.Run(ctx) })
	}
	a.log.Info("started simulated boards", zap.Int("count", n), zap.String("profile", profile.Name))
	return nil
}
