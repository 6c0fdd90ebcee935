package app

// This file wires access control into the app (issue 14): the auth:
// section and its flags, OAuth discovery, the protected-resource metadata
// (RFC 9728), the policy file with its reloads (on change and SIGHUP), and
// the audit log. The decisions live in package policy; credentials are
// checked by package authn.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/api"
	"github.com/devicebridge/devicebridge/audit"
	"github.com/devicebridge/devicebridge/authn"
	"github.com/devicebridge/devicebridge/frontdoor"
	"github.com/devicebridge/devicebridge/mcpserver"
	"github.com/devicebridge/devicebridge/policy"
	"github.com/devicebridge/devicebridge/tracing"
)

// AuthConfig is the auth: section.
type AuthConfig struct {
	// PublicURL is the control listener's URL as clients reach it
	// (scheme://host[:port], behind any proxy). It names the resource in
	// OAuth metadata, and its host is one the front door answers to;
	// default: the listener's own address.
	PublicURL string          `yaml:"public_url"`
	OAuth     OAuthFileConfig `yaml:"oauth"`
	// PolicyFile is the policy (see docs/security.md); "" means every
	// authenticated caller may use every board, as before.
	PolicyFile string `yaml:"policy_file"`
	// PolicyCheckInterval is how often the policy file is checked for
	// changes (SIGHUP reloads at once). Default 2s.
	PolicyCheckInterval time.Duration `yaml:"policy_check_interval"`
	// AuditLog is the audit log file, "-" for standard output, "" for none.
	AuditLog      string `yaml:"audit_log"`
	AuditMaxBytes int64  `yaml:"audit_max_bytes"`
	AuditKeep     int    `yaml:"audit_keep"`
}

// OAuthFileConfig is auth.oauth: the authorization server whose JWT access
// tokens /mcp and the control API accept.
type OAuthFileConfig struct {
	// Issuer is the authorization server's issuer URL; "" turns OAuth off.
	Issuer string `yaml:"issuer"`
	// Audience is the "aud" tokens must carry; default: the public URL of
	// /mcp. Tokens for the public URL itself (the control API's resource)
	// are accepted too.
	Audience string `yaml:"audience"`
	// GroupsClaim names the claim with the caller's groups. Default groups.
	GroupsClaim string `yaml:"groups_claim"`
	// Scopes, when set, are required of every access token and advertised.
	Scopes []string `yaml:"scopes"`
	// ClockSkew tolerated on exp and nbf. Default 30s.
	ClockSkew time.Duration `yaml:"clock_skew"`
}

func defaultAuthConfig() AuthConfig {
	return AuthConfig{OAuth: OAuthFileConfig{ClockSkew: authn.DefaultClockSkew, GroupsClaim: authn.DefaultGroupsClaim},
		PolicyCheckInterval: policy.DefaultWatchInterval, AuditMaxBytes: audit.DefaultMaxBytes, AuditKeep: audit.DefaultKeep}
}

func (c AuthConfig) validate() error {
	var errs []error
	if c.PublicURL != "" {
		if u, err := url.Parse(c.PublicURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("auth.public_url %q: use http(s)://host[:port]", c.PublicURL))
		}
	}
	if c.OAuth.Issuer != "" {
		if u, err := url.Parse(c.OAuth.Issuer); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("auth.oauth.issuer %q: use the issuer URL, https://…", c.OAuth.Issuer))
		}
	}
	return errors.Join(errs...)
}

func registerAuthFlags(fs *flag.FlagSet, c *AuthConfig) {
	fs.StringVar(&c.OAuth.Issuer, "oauth-issuer", c.OAuth.Issuer, "OAuth authorization server (issuer URL) whose JWT access tokens /mcp and /api accept")
	fs.StringVar(&c.OAuth.Audience, "oauth-audience", c.OAuth.Audience, "audience access tokens must carry (default: the public URL of /mcp)")
	fs.StringVar(&c.PublicURL, "public-url", c.PublicURL, "the control listener's URL as clients reach it, e.g. https://bridge.example (OAuth metadata; its host is answered to)")
	fs.StringVar(&c.PolicyFile, "policy", c.PolicyFile, "policy file: which identities may see and call which boards and tools (reloaded on change and SIGHUP)")
	fs.StringVar(&c.AuditLog, "audit-log", c.AuditLog, "audit log file (- for stdout): one JSON line per tool call, interaction step and refusal")
}

// access is the app's access-control state.
type access struct {
	trace     *tracing.Provider
	oauth     *authn.OAuth
	gate      *policy.Gate
	audit     *audit.Log
	publicURL string
}

// openAccess opens what can fail before anything listens: the policy file
// and the audit log.
func (a *App) openAccess() error {
	c := a.cfg.Auth
	if c.PolicyFile != "" {
		g, err := policy.Open(c.PolicyFile, a.log.Named("policy"))
		if err != nil {
			return err
		}
		a.access.gate = g
		// The identity label is bounded: a policy entry's name or
		// "unlisted" (issue 14: no unbounded identity label).
		denials := prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "devicebridge_policy_denials_total",
			Help: "Calls and interactions refused by the policy, by the policy identity the caller matched (or unlisted).",
		}, []string{"identity"})
		if err := a.Metrics.Registry().Register(denials); err != nil {
			return err
		}
		g.OnDeny(func(label string) { denials.WithLabelValues(label).Inc() })
	}
	if c.AuditLog != "" {
		l, err := audit.Open(c.AuditLog, c.AuditMaxBytes, c.AuditKeep)
		if err != nil {
			return err
		}
		a.access.audit = l
	}
	return nil
}

// closeAccess flushes traces and closes the audit log (last, after every
// call ended).
func (a *App) closeAccess(ctx context.Context) {
	if err := a.access.trace.Shutdown(ctx); err != nil {
		a.log.Warn("traces not exported at shutdown", zap.Error(err))
	}
	_ = a.access.audit.Close()
}

// mcpResource is the URL of /mcp clients use: the resource of its
// protected-resource metadata.
func (a *App) mcpResource() string { return a.access.publicURL + "/mcp" }

// metadataURL is where the protected-resource metadata of path is served
// (RFC 9728 §3.1: the well-known prefix inserted before the path).
func (a *App) metadataURL(path string) string {
	return a.access.publicURL + "/.well-known/oauth-protected-resource" + path
}

// startAccess starts tracing, works out the public URL and discovers the
// OAuth issuer. Called once the control listener is bound.
func (a *App) startAccess(ctx context.Context) error {
	c := a.cfg.Auth
	tp, err := tracing.Start(ctx, a.cfg.Tracing, Version)
	if err != nil {
		return err
	}
	a.access.trace = tp
	a.access.publicURL = strings.TrimSuffix(c.PublicURL, "/")
	if a.access.publicURL == "" {
		a.access.publicURL = secureScheme("http", a.controlTLS) + "://" + loopbackFor(a.ControlAddr())
	}
	if c.OAuth.Issuer != "" {
		audiences := []string{a.mcpResource(), a.access.publicURL}
		if c.OAuth.Audience != "" {
			audiences = append([]string{c.OAuth.Audience}, audiences...)
		}
		dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		o, err := authn.Discover(dctx, authn.OAuthConfig{Issuer: c.OAuth.Issuer, Audiences: audiences,
			GroupsClaim: c.OAuth.GroupsClaim, ClockSkew: c.OAuth.ClockSkew})
		cancel()
		if err != nil {
			_ = tp.Shutdown(context.WithoutCancel(ctx))
			return err
		}
		a.access.oauth = o
		a.log.Info("OAuth access tokens accepted", zap.String("issuer", c.OAuth.Issuer), zap.Strings("audiences", audiences),
			zap.String("metadata", a.metadataURL("/mcp")))
	}
	return nil
}

// mountMetadata serves the protected-resource metadata (RFC 9728) of /mcp
// and of the control API. It is open to every origin (go-sdk's handler
// answers with CORS headers): clients read it before they hold a token.
func (a *App) mountMetadata(m *frontdoor.Mux) {
	c := a.cfg.Auth
	if a.access.oauth == nil {
		return
	}
	for _, doc := range []struct{ path, resource string }{{"/mcp", a.mcpResource()}, {"", a.access.publicURL}} {
		m.Mount("/.well-known/oauth-protected-resource"+doc.path, frontdoor.Door{CrossOrigin: true},
			auth.ProtectedResourceMetadataHandler(&oauthex.ProtectedResourceMetadata{
				Resource:               doc.resource,
				AuthorizationServers:   []string{c.OAuth.Issuer},
				ScopesSupported:        c.OAuth.Scopes,
				BearerMethodsSupported: []string{"header"},
				ResourceName:           "devicebridge",
			}))
	}
}

// watchPolicy reloads the policy on change and on SIGHUP. Called once
// the MCP server exists (a change re-publishes its tools).
func (a *App) watchPolicy(ctx context.Context) {
	c := a.cfg.Auth
	if g := a.access.gate; g != nil {
		g.OnChange(func() {
			if a.mcp != nil {
				a.mcp.Sync() // confirmation rules are part of what tools/list shows
			}
		})
		wctx, cancel := context.WithCancel(ctx)
		a.onDrain(cancel)
		a.goOwned(func() { g.Watch(wctx, c.PolicyCheckInterval) })
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		a.goOwned(func() {
			defer signal.Stop(hup)
			for {
				select {
				case <-wctx.Done():
					return
				case <-hup:
					_ = g.Reload() // a bad file is logged and the old policy stays
				}
			}
		})
		a.log.Info("policy in force", zap.String("file", c.PolicyFile), zap.Int("identities", g.Policy().Identities()))
	}
}

// ReloadPolicy reads the policy file again now (as SIGHUP does). A bad
// file is rejected, naming the line, and the policy in force stays.
func (a *App) ReloadPolicy() error { return a.access.gate.Reload() }

// apiGuard authenticates the control API: every /api route, /metrics,
// /api/events and the OTA approvals. It takes control.tokens and, with an
// issuer, OAuth access tokens; with neither the control API is open (it is
// on loopback by default) and the front door's other steps are what keeps
// web pages out.
func (a *App) apiGuard() *authn.Guard {
	g := &authn.Guard{Verifier: authn.NewVerifier(a.cfg.Control.Tokens, a.access.oauth), Via: "api",
		Keys: "control.tokens, --control-token", Audit: a.access.audit, Log: a.log.Named("api"), Refuse: api.Refuse}
	if a.access.oauth != nil {
		g.ResourceMetadataURL = a.metadataURL("")
		g.Scopes = a.cfg.Auth.OAuth.Scopes
	}
	return g
}

// mcpGuard authenticates /mcp: tokens (mcp.tokens, else control.tokens)
// and OAuth access tokens. Its refusals are plain text, as MCP clients
// have always got them.
func (a *App) mcpGuard(tokens []string) *authn.Guard {
	g := &authn.Guard{Verifier: authn.NewVerifier(tokens, a.access.oauth), Via: "mcp",
		Keys: "mcp.tokens, --mcp-token", Audit: a.access.audit, Log: a.log.Named("mcp"), Refuse: frontdoor.PlainText}
	if a.access.oauth != nil {
		g.ResourceMetadataURL = a.metadataURL("/mcp")
		g.Scopes = a.cfg.Auth.OAuth.Scopes
	}
	return g
}

// apiAccess is the control API's policy and audit.
func (a *App) apiAccess() api.Access {
	acc := api.Access{Policy: a.access.gate, Audit: a.access.audit}
	acc.Alias = a.boardAlias
	return acc
}

// mcpAccess is /mcp's policy, audit and tracing; authenticated says its
// guard checks credentials.
func (a *App) mcpAccess(authenticated bool) mcpserver.Access {
	return mcpserver.Access{Authenticated: authenticated, Policy: a.access.gate, Audit: a.access.audit, Tracer: a.access.trace.Tracer()}
}
