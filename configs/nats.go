package configs

import _ "embed"

// NATSFleet is nats-fleet.conf: the NATS server configuration docs/scaling.md
// recommends for a fleet (loopback, credentials required, the bridges' user
// confined to the fleet's subjects and buckets). The tests run their
// in-process NATS from it, so that the documented permissions are the ones
// every fleet test exercises.
//
//go:embed nats-fleet.conf
var NATSFleet string
