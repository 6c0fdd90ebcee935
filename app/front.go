package app

// This file puts the control listener behind its front door (package
// frontdoor): the Host names and browser origins it answers, with their
// keys and flags, and the Mux every control route is mounted on. Who is
// authenticated how is access.go's (apiGuard, mcpGuard); which routes are
// open is decided where they are mounted (HandleOpen in api.Register, the
// OAuth metadata in mountMetadata).

import (
	"errors"
	"flag"
	"fmt"
	"net/url"
	"slices"

	"github.com/devicebridge/devicebridge/api"
	"github.com/devicebridge/devicebridge/frontdoor"
)

func (c Config) validateFront() error {
	var errs []error
	if _, err := frontdoor.ParseOrigins(c.Control.AllowedOrigins); err != nil {
		errs = append(errs, fmt.Errorf("control.allowed_origins: %w", err))
	}
	if _, err := frontdoor.ParseOrigins(c.MCP.AllowedOrigins); err != nil {
		errs = append(errs, fmt.Errorf("mcp.allowed_origins: %w", err))
	}
	if c.MCP.AllowedOrigins != nil && !slices.Equal(c.Control.AllowedOrigins, frontdoor.DefaultAllowedOrigins) {
		errs = append(errs, errors.New("mcp.allowed_origins is the old name of control.allowed_origins (--allowed-origin), "+
			"which covers the whole control listener: set only control.allowed_origins"))
	}
	if _, err := frontdoor.ParseHosts(c.Control.AllowedHosts); err != nil {
		errs = append(errs, fmt.Errorf("control.allowed_hosts: %w", err))
	}
	return errors.Join(errs...)
}

// allowedOrigins is the control listener's origin allow-list:
// control.allowed_origins, or mcp.allowed_origins where a file still uses
// that old name.
func (c Config) allowedOrigins() []string {
	if c.MCP.AllowedOrigins != nil {
		return c.MCP.AllowedOrigins
	}
	return c.Control.AllowedOrigins
}

func registerFrontFlags(fs *flag.FlagSet, c *ControlConfig) {
	fs.Var(stringList{&c.AllowedOrigins}, "allowed-origin",
		"browser Origin admitted on the control listener (/api, /mcp, the console), added to the defaults (repeatable; scheme://host[:port|:*] or *)")
	fs.Var(stringList{&c.AllowedOrigins}, "mcp-allowed-origin", "old name of --allowed-origin")
	fs.Var(stringList{&c.AllowedHosts}, "allowed-host",
		"DNS name clients reach the control listener by, besides localhost and --public-url's host (repeatable; * turns the DNS-rebinding check off)")
}

// newControlMux builds the control listener's front door: the control
// API's authentication for the routes mounted with Handle, and its JSON
// refusals. Called once the listener is bound and OAuth discovered, so
// that the public URL's host is one it answers to.
func (a *App) newControlMux() (*frontdoor.Mux, error) {
	hosts := slices.Clone(a.cfg.Control.AllowedHosts)
	if u, err := url.Parse(a.access.publicURL); err == nil && u.Hostname() != "" {
		hosts = append(hosts, u.Hostname())
	}
	log := a.log.Named("frontdoor")
	if slices.Contains(hosts, "*") {
		log.Warn("control.allowed_hosts holds *: every Host is answered and DNS rebinding is not checked; keep it for a proxy that checks Host itself")
	}
	m, err := frontdoor.NewMux(frontdoor.Config{
		AllowedOrigins: a.cfg.allowedOrigins(),
		AllowedHosts:   hosts,
		Auth:           a.apiGuard().Middleware(),
		Refuse:         api.Refuse,
		Logger:         log,
	})
	if err != nil {
		return nil, err
	}
	a.controlMux = m
	return m, nil
}

// ControlRoutes is the control listener's route table (tests walk it);
// nil before Start.
func (a *App) ControlRoutes() []frontdoor.Route {
	if a.controlMux == nil {
		return nil
	}
	return a.controlMux.Routes()
}
