package app

// This file is the flow: section of the config (interactions: MCP Flow
// methods and the guided tools/call path of the upstream MCP server) and
// its flags. The server itself is in package mcpserver (flow.go, flowcall.go).

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/devicebridge/devicebridge/cluster"
	"github.com/devicebridge/devicebridge/flow"
	"github.com/devicebridge/devicebridge/mcpserver"
)

// FlowConfig configures interactions on /mcp.
type FlowConfig struct {
	// Enabled turns on MCP Flow methods and guided tools/call
	// (elicitation, MRTR, confirmation). Default true.
	Enabled bool `yaml:"enabled"`
	// Timeout is the inactivity timeout of an interaction (and the life of
	// a tools/call requestState).
	Timeout time.Duration `yaml:"timeout"`
	// MaxPerCaller bounds a caller's open interactions; MaxPrompts the
	// prompts of one interaction (refused answers count); MaxDuration an
	// interaction's whole life. Each is at least 1 (app/configcheck.go).
	MaxPerCaller int           `yaml:"max_per_caller"`
	MaxPrompts   int           `yaml:"max_prompts"`
	MaxDuration  time.Duration `yaml:"max_duration"`
	// Confirm lists the board tools (path.Match patterns on the board's
	// tool name, case-insensitive) that need the user's confirmation;
	// tools annotated destructiveHint:true always do.
	Confirm []string `yaml:"confirm"`
	// Secret (≥ 32 bytes) makes interactions stateless: their state
	// travels signed in the sessionId, so a restart or another replica
	// with the same secret continues them. SecretFile reads it from a
	// file instead (trailing newline ignored), to keep it out of the
	// config.
	Secret     string `yaml:"secret"`
	SecretFile string `yaml:"secret_file"`
}

func defaultFlowConfig() FlowConfig {
	return FlowConfig{
		Enabled:      true,
		Timeout:      flow.DefaultTimeout,
		MaxPerCaller: flow.DefaultMaxPerOwner,
		MaxPrompts:   flow.DefaultMaxPrompts,
		MaxDuration:  flow.DefaultMaxDuration,
		Confirm:      append([]string(nil), mcpserver.DefaultConfirmTools...),
	}
}

func (c FlowConfig) validate() error {
	if !c.Enabled {
		return nil
	}
	var errs []error
	if c.Timeout < 0 {
		errs = append(errs, errors.New("flow.timeout must not be negative (e.g. 5m)"))
	}
	if c.Secret != "" && c.SecretFile != "" {
		errs = append(errs, errors.New("flow: give secret or secret_file, not both"))
	}
	if c.SecretFile != "" {
		if _, err := os.Stat(c.SecretFile); err != nil {
			errs = append(errs, errors.New("flow.secret_file: "+err.Error()))
		}
	}
	o, err := c.options()
	if err != nil {
		errs = append(errs, err)
	} else if err := (mcpserver.Options{Flow: o}).Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// confirm is the list of tools that need confirmation.
func (c FlowConfig) confirm() []string {
	if c.Confirm == nil {
		return []string{} // an explicit empty list in the file: destructive-annotated tools only
	}
	return c.Confirm
}

// options maps the section onto mcpserver.FlowOptions (reading secret_file).
func (c FlowConfig) options() (mcpserver.FlowOptions, error) {
	o := mcpserver.FlowOptions{Disabled: !c.Enabled, Timeout: c.Timeout, MaxPerOwner: c.MaxPerCaller,
		MaxPrompts: c.MaxPrompts, MaxDuration: c.MaxDuration, Confirm: c.confirm()}
	secret := c.Secret
	if c.SecretFile != "" {
		data, err := os.ReadFile(c.SecretFile)
		if err != nil {
			return o, errors.New("flow.secret_file: " + err.Error())
		}
		secret = strings.TrimRight(string(data), "\r\n")
	}
	if secret != "" {
		o.Secret = []byte(secret)
	}
	return o, nil
}

func registerFlowFlags(fs *flag.FlagSet, c *FlowConfig) {
	fs.BoolVar(&c.Enabled, "flow", c.Enabled, "guide tool calls with missing arguments or needing confirmation (elicitation, MRTR) and serve interaction.* on /mcp")
	fs.StringVar(&c.Secret, "flow-secret", c.Secret, "secret (≥32 bytes) for stateless interaction tokens: a restart or another replica can continue them")
	fs.DurationVar(&c.Timeout, "flow-timeout", c.Timeout, "inactivity timeout of an interaction")
}

// stateless reports whether interactions travel as signed tokens.
func (c FlowConfig) stateless() bool { return c.Enabled && (c.Secret != "" || c.SecretFile != "") }

// spentTTL is how long the fleet must remember a used flow token or
// requestState: the longest either lives (an interaction's max_duration,
// a requestState's timeout). With no max_duration, a day (or the timeout
// if longer): an interaction given a longer timeout of its own is then
// protected for that day only.
func (c FlowConfig) spentTTL() time.Duration {
	d := c.MaxDuration
	switch {
	case d == 0:
		d = flow.DefaultMaxDuration
	case d < 0:
		d = 24 * time.Hour
	}
	timeout := cmp.Or(max(c.Timeout, 0), flow.DefaultTimeout)
	return max(d, timeout)
}

// errNotJoined: the node has not joined the fleet yet (or has left it).
var errNotJoined = errors.New("this bridge is not connected to its fleet's replay store (NATS) yet")

// fleetSpent is the flow.SpentStore of a fleet node with a flow secret:
// the cluster's <prefix>_spent bucket once the node has joined. The MCP
// server is built before the node joins, so until then every call fails
// (fail closed): a token may have been used on another node already.
type fleetSpent struct{ store atomic.Pointer[cluster.Spent] }

var _ flow.SpentStore = (*cluster.Spent)(nil)

func (f *fleetSpent) Spend(ctx context.Context, key, use string, until time.Time) (bool, string, error) {
	s := f.store.Load()
	if s == nil {
		return false, "", errNotJoined
	}
	return s.Spend(ctx, key, use, until)
}

func (f *fleetSpent) Spent(ctx context.Context, key string) (string, error) {
	s := f.store.Load()
	if s == nil {
		return "", errNotJoined
	}
	return s.Spent(ctx, key)
}
