// Package authn verifies the bearer credentials of /mcp and the control
// API: static tokens (optionally named) and, when an issuer is configured,
// OAuth 2.1 JWT access tokens, as the MCP authorization spec asks of a
// resource server. It yields a go-sdk auth.TokenInfo whose UserID is the
// caller's identity (policy.FromTokenInfo reads it). It never logs a
// token.
package authn

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/oauthex"

	"github.com/devicebridge/devicebridge/internal/bearer"
	"github.com/devicebridge/devicebridge/policy"
)

// Defaults of OAuthConfig.
const (
	DefaultClockSkew   = 30 * time.Second
	DefaultGroupsClaim = "groups"
)

// SigningAlgs are the JWS algorithms accepted on access tokens: asymmetric
// only, so that "none" and HMAC tokens forged with a public key fail.
var SigningAlgs = []string{oidc.RS256, oidc.RS384, oidc.RS512, oidc.ES256, oidc.ES384, oidc.ES512, oidc.PS256, oidc.PS384, oidc.PS512}

// OAuthConfig configures JWT access tokens from one authorization server.
type OAuthConfig struct {
	// Issuer is the authorization server's issuer URL.
	Issuer string
	// Audiences are accepted "aud" values; a token must name one of them.
	Audiences []string
	// GroupsClaim names the claim holding the caller's groups (a string or
	// a list of strings).
	GroupsClaim string
	// ClockSkew is tolerated on exp and nbf.
	ClockSkew time.Duration
	// HTTPClient fetches metadata and keys; nil uses a client with a 10s
	// timeout.
	HTTPClient *http.Client
}

// withDefaults returns c with unset fields set to their defaults.
func (c OAuthConfig) withDefaults() OAuthConfig {
	c.GroupsClaim = cmp.Or(c.GroupsClaim, DefaultGroupsClaim)
	// max(x, 0): a negative skew has always meant the default too.
	c.ClockSkew = cmp.Or(max(c.ClockSkew, 0), DefaultClockSkew)
	c.HTTPClient = cmp.Or(c.HTTPClient, &http.Client{Timeout: 10 * time.Second})
	return c
}

// OAuth verifies JWT access tokens against an issuer's keys.
type OAuth struct {
	cfg      OAuthConfig
	verifier *oidc.IDTokenVerifier
	// Meta is the authorization server's metadata as discovered.
	Meta *oauthex.AuthServerMeta
}

// Discover reads the issuer's metadata (RFC 8414
// /.well-known/oauth-authorization-server, then OpenID discovery) to find
// its JWKS. Keys are fetched when first needed, cached, and fetched again
// when a token names a key id the cache does not hold (key rotation).
func Discover(ctx context.Context, cfg OAuthConfig) (*OAuth, error) {
	if cfg.Issuer == "" {
		return nil, errors.New("oauth: no issuer")
	}
	if len(cfg.Audiences) == 0 {
		return nil, errors.New("oauth: no audience")
	}
	cfg = cfg.withDefaults()
	meta, err := discover(ctx, cfg.Issuer, cfg.HTTPClient)
	if err != nil {
		return nil, err
	}
	if meta.JWKSURI == "" {
		return nil, fmt.Errorf("oauth: the metadata of %s names no jwks_uri", cfg.Issuer)
	}
	keyCtx := oidc.ClientContext(context.WithoutCancel(ctx), cfg.HTTPClient)
	keys := oidc.NewRemoteKeySet(keyCtx, meta.JWKSURI)
	v := oidc.NewVerifier(cfg.Issuer, keys, &oidc.Config{
		// aud, exp and nbf are checked below with the configured skew
		// and audiences (go-oidc allows one audience and a fixed nbf
		// leeway).
		SkipClientIDCheck:    true,
		SkipExpiryCheck:      true,
		SupportedSigningAlgs: SigningAlgs,
	})
	return &OAuth{cfg: cfg, verifier: v, Meta: meta}, nil
}

// metadataURLs are where RFC 8414 and OpenID Connect Discovery put an
// issuer's metadata, in the order a client tries them.
func metadataURLs(issuer string) ([]string, error) {
	u, err := url.Parse(issuer)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return nil, fmt.Errorf("oauth: issuer %q is not a URL", issuer)
	}
	p := strings.TrimSuffix(u.Path, "/")
	base := u.Scheme + "://" + u.Host
	urls := []string{base + "/.well-known/oauth-authorization-server" + p}
	if p != "" {
		urls = append(urls, base+"/.well-known/openid-configuration"+p)
	}
	urls = append(urls, strings.TrimSuffix(issuer, "/")+"/.well-known/openid-configuration")
	return urls, nil
}

func discover(ctx context.Context, issuer string, c *http.Client) (*oauthex.AuthServerMeta, error) {
	urls, err := metadataURLs(issuer)
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, u := range urls {
		// GetAuthServerMeta checks the issuer matches, the URLs are safe,
		// and HTTPS (or loopback); it returns nil, nil on a 4xx.
		meta, err := oauthex.GetAuthServerMeta(ctx, u, issuer, c)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", u, err))
			continue
		}
		if meta != nil {
			return meta, nil
		}
	}
	if len(errs) == 0 {
		errs = append(errs, errors.New("no metadata found"))
	}
	return nil, fmt.Errorf("oauth: discovering issuer %s: %w", issuer, errors.Join(errs...))
}

// jwtClaims are the claims read besides those go-oidc checks.
type jwtClaims struct {
	Subject   string          `json:"sub"`
	Audience  audience        `json:"aud"`
	Expiry    *json.Number    `json:"exp"`
	NotBefore *json.Number    `json:"nbf"`
	Scope     string          `json:"scope"`
	ClientID  string          `json:"client_id"`
	Extra     json.RawMessage `json:"-"`
}

type audience []string

func (a *audience) UnmarshalJSON(b []byte) error {
	var one string
	if json.Unmarshal(b, &one) == nil {
		*a = audience{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return err
	}
	*a = many
	return nil
}

func unix(n *json.Number) (time.Time, bool) {
	if n == nil {
		return time.Time{}, false
	}
	f, err := n.Float64()
	if err != nil {
		return time.Time{}, false
	}
	return time.Unix(int64(f), 0), true
}

// Verify checks a JWT access token: signature by one of the issuer's keys
// with an accepted algorithm, iss, aud, exp and nbf (with the clock skew).
// The error says why without quoting the token.
func (o *OAuth) Verify(ctx context.Context, raw string) (*auth.TokenInfo, error) {
	tok, err := o.verifier.Verify(ctx, raw)
	if err != nil {
		return nil, fmt.Errorf("%w: %s", auth.ErrInvalidToken, strings.TrimPrefix(err.Error(), "oidc: "))
	}
	var c jwtClaims
	if err := tok.Claims(&c); err != nil {
		return nil, fmt.Errorf("%w: claims: %v", auth.ErrInvalidToken, err)
	}
	now := time.Now()
	exp, ok := unix(c.Expiry)
	if !ok {
		return nil, fmt.Errorf("%w: no exp claim", auth.ErrInvalidToken)
	}
	if now.After(exp.Add(o.cfg.ClockSkew)) {
		return nil, fmt.Errorf("%w: expired at %s", auth.ErrInvalidToken, exp.UTC().Format(time.RFC3339))
	}
	if nbf, ok := unix(c.NotBefore); ok && now.Add(o.cfg.ClockSkew).Before(nbf) {
		return nil, fmt.Errorf("%w: not valid before %s", auth.ErrInvalidToken, nbf.UTC().Format(time.RFC3339))
	}
	if !slices.ContainsFunc(o.cfg.Audiences, func(want string) bool { return oauthex.MatchesResource(c.Audience, want) }) {
		return nil, fmt.Errorf("%w: audience %q is not this bridge (want one of %q)", auth.ErrInvalidToken, []string(c.Audience), o.cfg.Audiences)
	}
	if c.Subject == "" {
		return nil, fmt.Errorf("%w: no sub claim", auth.ErrInvalidToken)
	}
	var all map[string]json.RawMessage
	_ = tok.Claims(&all)
	info := &auth.TokenInfo{
		UserID:     c.Subject,
		Expiration: exp.Add(o.cfg.ClockSkew),
		Scopes:     strings.Fields(c.Scope),
		Extra:      map[string]any{policy.GroupsKey: groups(all[o.cfg.GroupsClaim]), "kind": "oauth"},
	}
	return info, nil
}

// groups reads a groups claim: a list of strings or one string.
func groups(raw json.RawMessage) []string {
	if len(raw) == 0 {
		return nil
	}
	var list []string
	if json.Unmarshal(raw, &list) == nil {
		return list
	}
	var one string
	if json.Unmarshal(raw, &one) == nil && one != "" {
		return []string{one}
	}
	return nil
}

// Verifier accepts the static tokens of one listener and, when set, OAuth
// access tokens. Its Verify is an auth.TokenVerifier.
type Verifier struct {
	static bearer.Named
	oauth  *OAuth
}

// NewVerifier builds a verifier over static tokens ("name=secret" or
// "secret") and an optional OAuth verifier. It returns nil when there is
// nothing to check (the listener is open).
func NewVerifier(tokens []string, o *OAuth) *Verifier {
	v := &Verifier{static: bearer.NewNamed(tokens), oauth: o}
	if v.static.Empty() && o == nil {
		return nil
	}
	return v
}

// Verify is the auth.TokenVerifier: a static token first (constant time),
// then, if it looks like a JWT, the OAuth path.
func (v *Verifier) Verify(ctx context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
	if name, ok := v.static.Lookup(token); ok {
		return &auth.TokenInfo{UserID: name, Extra: map[string]any{"kind": "token"}}, nil
	}
	if v.oauth != nil && strings.Count(token, ".") == 2 {
		return v.oauth.Verify(ctx, token)
	}
	return nil, auth.ErrInvalidToken
}

// TokenVerifier returns Verify as an auth.TokenVerifier, or nil for a nil
// verifier (an open listener).
func (v *Verifier) TokenVerifier() auth.TokenVerifier {
	if v == nil {
		return nil
	}
	return v.Verify
}
