package app

import "context"

// startSimulators starts cfg.Simulate.Count in-process boards against the
// bridge's own device listener.
func (a *App) startSimulators(ctx context.Context) error {
	if a.cfg.Simulate.Count == 0 {
		return nil
	}
	return nil // wired once the simulator library lands
}
