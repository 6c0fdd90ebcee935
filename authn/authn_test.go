package authn_test

import (
	"context"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/devicebridge/devicebridge/authn"
	"github.com/devicebridge/devicebridge/internal/testissuer"
	"github.com/devicebridge/devicebridge/policy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const aud = "http://127.0.0.1:8080/mcp"

func setup(t *testing.T) (*testissuer.Issuer, *authn.Verifier) {
	is := testissuer.Start(t)
	o, err := authn.Discover(context.Background(), authn.OAuthConfig{Issuer: is.URL, Audiences: []string{aud}, GroupsClaim: "roles"})
	require.NoError(t, err)
	require.Equal(t, is.URL+"/jwks", o.Meta.JWKSURI)
	return is, authn.NewVerifier([]string{"kitchen=k-secret", "plain-secret"}, o)
}

func TestAccessTokens(t *testing.T) {
	is, v := setup(t)
	ctx := context.Background()
	now := time.Now()
	good := testissuer.Claims{"sub": "alice", "aud": aud, "roles": []string{"office"}, "scope": "devices"}
	with := func(k string, val any) testissuer.Claims {
		c := testissuer.Claims{}
		for kk, vv := range good {
			c[kk] = vv
		}
		c[k] = val
		return c
	}

	for name, tok := range map[string]string{
		"RS256":                  is.RS256(t, good),
		"ES256":                  is.ES256(t, good),
		"aud list":               is.RS256(t, with("aud", []string{"other", aud})),
		"expired within skew":    is.RS256(t, with("exp", now.Add(-5*time.Second).Unix())),
		"nbf just ahead in skew": is.ES256(t, with("nbf", now.Add(5*time.Second).Unix())),
	} {
		info, err := v.Verify(ctx, tok, nil)
		require.NoError(t, err, name)
		id := policy.FromTokenInfo(info)
		require.Equal(t, "alice", id.Name, name)
		require.Equal(t, []string{"office"}, id.Groups, name)
	}

	unknown, publish := is.Unpublished(t, "rsa-2", good)
	for name, tok := range map[string]string{
		"expired":             is.RS256(t, with("exp", now.Add(-time.Hour).Unix())),
		"not yet valid":       is.RS256(t, with("nbf", now.Add(time.Hour).Unix())),
		"wrong audience":      is.RS256(t, with("aud", "http://elsewhere/mcp")),
		"wrong issuer":        is.RS256(t, with("iss", "https://evil.example")),
		"no exp":              is.RS256(t, with("exp", nil)),
		"no sub":              is.RS256(t, with("sub", nil)),
		"unknown key":         unknown,
		"alg none":            is.AlgNone(good),
		"HS256 w/ public key": is.HS256WithPublicKey(good),
		"garbage":             "a.b.c",
		"static, name only":   "kitchen",
	} {
		_, err := v.Verify(ctx, tok, nil)
		require.ErrorIs(t, err, auth.ErrInvalidToken, name)
		require.NotContains(t, err.Error(), tok, "errors never quote the token")
	}

	// Key rotation: a token with a kid the cache lacks makes the verifier
	// fetch the JWKS again.
	// (go-oidc hands a caller arriving just as a fetch ends that fetch's
	// result, which may predate the rotation: a retry sees the new key.)
	before := is.JWKSFetches.Load()
	publish()
	require.Eventually(t, func() bool {
		_, err := v.Verify(ctx, unknown, nil)
		return err == nil
	}, 10*time.Second, 10*time.Millisecond, "a rotated-in key is found by refetching the JWKS")
	require.Greater(t, is.JWKSFetches.Load(), before)
}

func TestStaticTokens(t *testing.T) {
	_, v := setup(t)
	info, err := v.Verify(context.Background(), "k-secret", nil)
	require.NoError(t, err)
	require.Equal(t, "kitchen", info.UserID)
	info, err = v.Verify(context.Background(), "kitchen=k-secret", nil)
	require.NoError(t, err, "a token configured as name=secret before names existed keeps working")
	require.Equal(t, "kitchen", info.UserID)
	info, err = v.Verify(context.Background(), "plain-secret", nil)
	require.NoError(t, err)
	require.NotContains(t, info.UserID, "plain-secret")
	require.Nil(t, authn.NewVerifier(nil, nil), "nothing configured: the listener is open")
}

func TestDiscoveryFailsClearly(t *testing.T) {
	_, err := authn.Discover(context.Background(), authn.OAuthConfig{Issuer: "http://127.0.0.1:1", Audiences: []string{aud}})
	require.ErrorContains(t, err, "discovering issuer")
}
