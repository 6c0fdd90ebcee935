package authn

// The one authentication step of the control listener's front door
// (package frontdoor). The control API and /mcp each mount it with their
// own Guard (their own tokens, their own refusal format); nothing else
// reads a bearer token to decide who may pass.

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/audit"
	"github.com/devicebridge/devicebridge/internal/bearer"
	"github.com/devicebridge/devicebridge/internal/clip"
	"github.com/devicebridge/devicebridge/internal/logthrottle"
	"github.com/devicebridge/devicebridge/policy"
)

// Guard authenticates the requests of one surface of the control
// listener. Build it once and mount Middleware on every route of the
// surface.
type Guard struct {
	// Verifier checks bearer credentials; nil leaves the surface open:
	// requests pass with no identity (policy.Anonymous).
	Verifier *Verifier
	// ResourceMetadataURL is named in challenges (RFC 9728), so that
	// clients can find the authorization server.
	ResourceMetadataURL string
	// Scopes are required of OAuth access tokens (403 insufficient_scope
	// without them) and advertised in challenges; static tokens carry no
	// scopes and are not checked.
	Scopes []string
	// Via names the surface in audit records and log lines ("api", "mcp").
	Via string
	// Keys names, in the 401 message, where the surface's tokens are
	// configured ("control.tokens").
	Keys string
	// Audit records refusals; nil records nothing.
	Audit *audit.Log
	// Log receives one throttled line per kind of refusal.
	Log *zap.Logger
	// Refuse answers a refusal (status, code, message); nil is plain
	// text.
	Refuse func(w http.ResponseWriter, r *http.Request, status int, code, msg string)

	unauthenticated, unscoped, auditFailed logthrottle.Throttle
}

type verifiedKey struct{}

// TokenInfoFrom returns what Middleware verified for the request of ctx;
// nil on an open surface.
func TokenInfoFrom(ctx context.Context) *auth.TokenInfo {
	ti, _ := ctx.Value(verifiedKey{}).(*auth.TokenInfo)
	return ti
}

// RequireVerified is go-sdk's RequireBearerToken fed by Middleware: it
// binds MCP sessions to the identity that opened them without checking the
// token a second time. A request Middleware did not verify gets 401, so a
// handler mounted outside the door fails closed.
func RequireVerified() func(http.Handler) http.Handler {
	verified := func(ctx context.Context, _ string, _ *http.Request) (*auth.TokenInfo, error) {
		if ti := TokenInfoFrom(ctx); ti != nil {
			return ti, nil
		}
		return nil, auth.ErrInvalidToken
	}
	// Static tokens have no expiry; OAuth ones were checked with the skew.
	return auth.RequireBearerToken(verified, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})
}

// Middleware is the authentication step: it reads the bearer token,
// verifies it, checks the required scopes, and puts the TokenInfo
// (TokenInfoFrom) and the policy identity (policy.IdentityFrom) in the
// request's context. A refusal is audited, logged (throttled) and answered
// with 401 or 403 and a WWW-Authenticate challenge.
func (g *Guard) Middleware() func(http.Handler) http.Handler {
	refuse := g.Refuse
	if refuse == nil {
		refuse = func(w http.ResponseWriter, _ *http.Request, status int, _, msg string) {
			http.Error(w, http.StatusText(status)+": "+msg, status)
		}
	}
	return func(next http.Handler) http.Handler {
		if g.Verifier == nil {
			return next
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			info, why := g.verify(r)
			if info == nil {
				g.unauthenticated.Info(g.logger(), g.Via+" request refused: missing or invalid bearer token",
					zap.String("remote", r.RemoteAddr), clip.Field("why", why))
				g.audit(r, "unauthenticated", why)
				w.Header().Set("WWW-Authenticate", g.challenge(""))
				keys := g.Keys
				if g.ResourceMetadataURL != "" {
					keys += ", or the OAuth metadata named in WWW-Authenticate"
				}
				refuse(w, r, http.StatusUnauthorized, "unauthorized",
					fmt.Sprintf("missing or invalid bearer token: send Authorization: Bearer <token> (see %s)", keys))
				return
			}
			if missing := g.missingScope(info); missing != "" {
				g.unscoped.Info(g.logger(), g.Via+" request refused: token lacks a required scope",
					zap.String("remote", r.RemoteAddr), zap.String("identity", info.UserID), zap.String("scope", missing))
				g.audit(r, "insufficient_scope", info.UserID)
				w.Header().Set("WWW-Authenticate", g.challenge("insufficient_scope"))
				refuse(w, r, http.StatusForbidden, "insufficient_scope",
					fmt.Sprintf("the access token lacks the scope %q", missing))
				return
			}
			ctx := context.WithValue(r.Context(), verifiedKey{}, info)
			next.ServeHTTP(w, r.WithContext(policy.WithIdentity(ctx, policy.FromTokenInfo(info))))
		})
	}
}

var nop = zap.NewNop()

func (g *Guard) logger() *zap.Logger {
	if g.Log == nil {
		return nop
	}
	return g.Log
}

// verify returns what the request's token grants, or nil and why not
// (never the token).
func (g *Guard) verify(r *http.Request) (*auth.TokenInfo, string) {
	token, ok := bearer.FromHeader(r.Header.Get("Authorization"))
	if !ok || token == "" {
		return nil, "no bearer token"
	}
	info, err := g.Verifier.Verify(r.Context(), token, r)
	if err != nil {
		return nil, err.Error()
	}
	if info == nil {
		return nil, "invalid token"
	}
	return info, ""
}

// missingScope is the first required scope an OAuth token lacks, or "".
func (g *Guard) missingScope(info *auth.TokenInfo) string {
	if kind, _ := info.Extra["kind"].(string); kind != "oauth" {
		return ""
	}
	for _, sc := range g.Scopes {
		if !slices.Contains(info.Scopes, sc) {
			return sc
		}
	}
	return ""
}

func (g *Guard) audit(r *http.Request, outcome, reason string) {
	if g.Audit == nil {
		return
	}
	if err := g.Audit.Write(audit.Record{Kind: audit.KindAdmission, Via: g.Via, Outcome: outcome, Reason: reason,
		Identity: "remote " + r.RemoteAddr}); err != nil {
		g.auditFailed.Warn(g.logger(), "audit log write failed", zap.Error(err))
	}
}

// challenge is the WWW-Authenticate value of a refusal (RFC 6750, RFC
// 9728).
func (g *Guard) challenge(errCode string) string {
	parts := []string{`realm="devicebridge"`}
	if errCode != "" {
		parts = append(parts, fmt.Sprintf("error=%q", errCode))
	}
	if g.ResourceMetadataURL != "" {
		parts = append(parts, fmt.Sprintf("resource_metadata=%q", g.ResourceMetadataURL))
	}
	if len(g.Scopes) > 0 {
		parts = append(parts, fmt.Sprintf("scope=%q", strings.Join(g.Scopes, " ")))
	}
	return "Bearer " + strings.Join(parts, ", ")
}
