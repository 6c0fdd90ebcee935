package app

// This file hands the control API what the web console and the
// devicebridge CLI need: board aliases, guided calls (interactions) with
// /mcp's confirmation rule, and the console's files.

import (
	"strings"

	"github.com/devicebridge/devicebridge/api"
	"github.com/devicebridge/devicebridge/console"
	"github.com/devicebridge/devicebridge/device"
	"github.com/devicebridge/devicebridge/tools"
)

func (a *App) addConsole(o *api.Options) {
	aliases := a.configAliases()
	// The alias /mcp names the board's tools by (before any clash suffix).
	o.Alias = func(id string) string {
		if alias, ok := aliases[device.NormalizeID(id)]; ok {
			return alias
		}
		return tools.DefaultAlias(id)
	}
	if f := a.cfg.Flow; f.Enabled {
		confirm := f.confirm()
		o.Interactions = &api.InteractionOptions{
			NeedsConfirm: func(t device.Tool) bool { return tools.NeedsConfirm(confirm, t) },
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

// configAliases is mcp.aliases keyed by normalized device id, so a MAC
// written in any spelling in the config finds its board.
func (a *App) configAliases() map[string]string {
	aliases := make(map[string]string, len(a.cfg.MCP.Aliases))
	for id, alias := range a.cfg.MCP.Aliases {
		aliases[device.NormalizeID(strings.TrimSpace(id))] = alias
	}
	return aliases
}
