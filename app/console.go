package app

// This file hands the control API what the web console and the
// devicebridge CLI need: board aliases, guided calls (interactions) with
// /mcp's confirmation rule, and the console's files.

import (
	"github.com/devicebridge/devicebridge/api"
	"github.com/devicebridge/devicebridge/console"
	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/mcpserver"
)

func (a *App) addConsole(o *api.Options) {
	o.Alias = a.boardAlias
	// {id} finds the board an operator named before any a board chose.
	o.Named = a.aliases.Named
	o.Node = a.nodeID
	if f := a.cfg.Flow; f.Enabled {
		confirm := f.confirm()
		o.Interactions = &api.InteractionOptions{
			NeedsConfirm: func(t device.Tool) bool { return mcpserver.NeedsConfirm(confirm, t) },
			Timeout:      f.Timeout, MaxPerOwner: f.MaxPerCaller, MaxPrompts: f.MaxPrompts, MaxDuration: f.MaxDuration,
			// In a fleet, an interaction's id names the node that holds
			// it, and the other nodes forward to it over NATS.
			Node: func() string {
				if n := a.Cluster(); n != nil {
					return n.ID()
				}
				return ""
			},
			Forward: a.forwardInteraction,
		}
	}
	o.Console = console.Handler()
}

// nodeID names this bridge in its fleet, "" when it runs alone.
func (a *App) nodeID() string {
	if n := a.Cluster(); n != nil {
		return n.ID()
	}
	return ""
}

// boardAlias is the alias a board is shown and matched by on the control
// API, the console and the policy: the one /mcp publishes its tools under,
// or, before /mcp has it (or without /mcp), the same rule applied to the
// board alone.
func (a *App) boardAlias(id string) string {
	if a.mcp != nil {
		if alias := a.mcp.Alias(id); alias != "" {
			return alias
		}
	}
	return a.aliases.Alias(id)
}
