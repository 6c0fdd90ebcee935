package policy

import (
	"context"
	"slices"

	"github.com/modelcontextprotocol/go-sdk/auth"
)

// Anonymous is the identity of a caller on a listener that takes no
// credentials. A policy can name it like any other identity.
const Anonymous = "anonymous"

// GroupsKey is the key of auth.TokenInfo.Extra that carries an identity's
// groups ([]string).
const GroupsKey = "groups"

// Identity is who is calling: a JWT subject with its groups, or the name
// of a static token.
type Identity struct {
	Name   string
	Groups []string
}

func (id Identity) String() string { return id.Name }

// FromTokenInfo reads the identity a token verifier put in a TokenInfo:
// UserID is the name, Extra["groups"] the groups. nil is Anonymous.
func FromTokenInfo(ti *auth.TokenInfo) Identity {
	if ti == nil || ti.UserID == "" {
		return Identity{Name: Anonymous}
	}
	id := Identity{Name: ti.UserID}
	if g, ok := ti.Extra[GroupsKey].([]string); ok {
		id.Groups = slices.Clone(g)
	}
	return id
}

type identityKey struct{}

// WithIdentity returns ctx carrying id.
func WithIdentity(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, identityKey{}, id)
}

// IdentityFrom returns the identity in ctx: the one WithIdentity put there,
// else the one of the go-sdk TokenInfo in ctx, else Anonymous.
func IdentityFrom(ctx context.Context) Identity {
	if id, ok := ctx.Value(identityKey{}).(Identity); ok {
		return id
	}
	return FromTokenInfo(auth.TokenInfoFromContext(ctx))
}
