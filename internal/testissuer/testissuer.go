// Package testissuer is an OAuth authorization server for tests: it
// generates its keys, serves RFC 8414 metadata and a JWKS over httptest,
// and mints access tokens, well-formed or deliberately broken.
package testissuer

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// Issuer is a running test authorization server.
type Issuer struct {
	URL string
	srv *httptest.Server

	mu        sync.Mutex
	published []jose.JSONWebKey // public keys in the JWKS
	rsa       *rsa.PrivateKey
	ec        *ecdsa.PrivateKey
	// JWKSFetches counts GETs of the JWKS.
	JWKSFetches atomic.Int64
}

// Start runs an issuer until the test ends. It publishes one RSA key
// ("rsa-1") and one P-256 key ("ec-1").
func Start(t testing.TB) *Issuer {
	t.Helper()
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ek, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	is := &Issuer{rsa: rk, ec: ek}
	is.published = []jose.JSONWebKey{
		{Key: rk.Public(), KeyID: "rsa-1", Algorithm: "RS256", Use: "sig"},
		{Key: ek.Public(), KeyID: "ec-1", Algorithm: "ES256", Use: "sig"},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/oauth-authorization-server", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"issuer":                           is.URL,
			"authorization_endpoint":           is.URL + "/authorize",
			"token_endpoint":                   is.URL + "/token",
			"jwks_uri":                         is.URL + "/jwks",
			"response_types_supported":         []string{"code"},
			"code_challenge_methods_supported": []string{"S256"},
			"scopes_supported":                 []string{"devices"},
		})
	})
	mux.HandleFunc("GET /jwks", func(w http.ResponseWriter, _ *http.Request) {
		is.JWKSFetches.Add(1)
		is.mu.Lock()
		set := jose.JSONWebKeySet{Keys: append([]jose.JSONWebKey(nil), is.published...)}
		is.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(set)
	})
	is.srv = httptest.NewServer(mux)
	is.URL = is.srv.URL
	t.Cleanup(is.srv.Close)
	return is
}

// Claims are a token's claims; Token fills iss, iat, and exp/nbf when
// zero.
type Claims map[string]any

func (is *Issuer) defaults(c Claims) Claims {
	out := Claims{"iss": is.URL, "iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix()}
	for k, v := range c {
		if v == nil {
			delete(out, k)
			continue
		}
		out[k] = v
	}
	return out
}

// RS256 mints a token signed by the published RSA key.
func (is *Issuer) RS256(t testing.TB, c Claims) string {
	return is.sign(t, jose.RS256, is.rsa, "rsa-1", c)
}

// ES256 mints a token signed by the published P-256 key.
func (is *Issuer) ES256(t testing.TB, c Claims) string {
	return is.sign(t, jose.ES256, is.ec, "ec-1", c)
}

// Unpublished mints an RS256 token with a key the JWKS does not hold
// (yet); Publish adds that key.
func (is *Issuer) Unpublished(t testing.TB, kid string, c Claims) (token string, publish func()) {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return is.sign(t, jose.RS256, k, kid, c), func() {
		is.mu.Lock()
		is.published = append(is.published, jose.JSONWebKey{Key: k.Public(), KeyID: kid, Algorithm: "RS256", Use: "sig"})
		is.mu.Unlock()
	}
}

func (is *Issuer) sign(t testing.TB, alg jose.SignatureAlgorithm, key crypto.Signer, kid string, c Claims) string {
	t.Helper()
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: jose.JSONWebKey{Key: key, KeyID: kid}},
		(&jose.SignerOptions{}).WithType("at+jwt"))
	if err != nil {
		t.Fatal(err)
	}
	payload, _ := json.Marshal(is.defaults(c))
	obj, err := signer.Sign(payload)
	if err != nil {
		t.Fatal(err)
	}
	s, err := obj.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func b64(v any) string {
	b, _ := json.Marshal(v)
	return base64.RawURLEncoding.EncodeToString(b)
}

// AlgNone is an unsigned token ("alg": "none") with valid claims.
func (is *Issuer) AlgNone(c Claims) string {
	return b64(map[string]string{"alg": "none", "typ": "JWT", "kid": "rsa-1"}) + "." + b64(is.defaults(c)) + "."
}

// HS256WithPublicKey is the key-confusion attack: an HMAC token whose
// secret is the issuer's public RSA key, as a verifier that trusts the
// header's alg would check it.
func (is *Issuer) HS256WithPublicKey(c Claims) string {
	der, _ := x509.MarshalPKIXPublicKey(is.rsa.Public())
	head := b64(map[string]string{"alg": "HS256", "typ": "JWT", "kid": "rsa-1"}) + "." + b64(is.defaults(c))
	mac := hmac.New(sha256.New, der)
	mac.Write([]byte(head))
	return head + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}
