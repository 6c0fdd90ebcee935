package app

// This file is the MQTT side's hook into the app; it is replaced by the MQTT
// transport's wiring.

import (
	"context"
	"flag"
)

// MQTTConfig configures the MQTT side (embedded broker or external one).
type MQTTConfig struct{}

func defaultMQTTConfig() MQTTConfig                     { return MQTTConfig{} }
func (c MQTTConfig) validate() error                    { return nil }
func registerMQTTFlags(fs *flag.FlagSet, c *MQTTConfig) {}

// startMQTT starts the MQTT side; it registers its own shutdown with
// a.onShutdown.
func (a *App) startMQTT(ctx context.Context) error { return nil }
