package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// DefaultSpentTTL is how long the spent bucket keeps an entry when
// Config.SpentTTL is zero: flow's default max_duration, the longest a
// flow token can live.
const DefaultSpentTTL = 30 * time.Minute

// ErrSpentUnavailable wraps a failure of the spent bucket: nobody can tell
// whether the token was used, so the caller must not act on it.
var ErrSpentUnavailable = errors.New("cluster: the fleet's replay store (NATS) is unreachable")

// Spent is the fleet's replay protection for flow tokens and MRTR
// requestStates: a JetStream key-value bucket, <prefix>_spent, in which a
// used token's key is created once. It implements flow.SpentStore (this
// package does not import flow; app/ wires it).
//
// Create is the only write, so the first node to spend a key wins and any
// other gets "key exists". Entries expire with the bucket's TTL
// (Config.SpentTTL), which must be at least the life of a token; the
// until time given to Spend is not stored.
//
// Without NATS every call fails with ErrSpentUnavailable (at once while
// the connection is down, within opTimeout if NATS does not answer): fail closed, since the token may have been used on
// a node this one cannot reach.
type Spent struct {
	nc  *nats.Conn
	kv  jetstream.KeyValue
	ttl time.Duration
	log *zap.Logger
}

// Spent returns the fleet's replay store.
func (n *Node) Spent() *Spent { return &Spent{nc: n.nc, kv: n.spent, ttl: n.cfg.SpentTTL, log: n.log} }

// connected fails at once while the connection is down, rather than
// after opTimeout (a request would wait in the reconnect buffer).
func (s *Spent) connected(key string) error {
	if s.nc.IsConnected() {
		return nil
	}
	return fmt.Errorf("%w: checking %s: not connected (%s)", ErrSpentUnavailable, key, s.nc.Status())
}

// Spend records key as used for use. first is true for exactly one caller
// per key in the fleet until the entry expires; the others get the first
// one's use.
func (s *Spent) Spend(ctx context.Context, key, use string, until time.Time) (bool, string, error) {
	if err := s.connected(key); err != nil {
		return false, "", err
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if d := time.Until(until); d > s.ttl {
		s.log.Warn("a flow token outlives the spent bucket's TTL; raise flow.max_duration's bound (cluster spent TTL)",
			zap.Duration("token_life", d), zap.Duration("ttl", s.ttl))
	}
	_, err := s.kv.Create(ctx, key, []byte(use))
	if err == nil {
		return true, "", nil
	}
	if !errors.Is(err, jetstream.ErrKeyExists) {
		return false, "", fmt.Errorf("%w: spending %s: %v", ErrSpentUnavailable, key, err)
	}
	e, err := s.kv.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		// Expired between the two calls: it was spent all the same.
		return false, "", nil
	case err != nil:
		return false, "", fmt.Errorf("%w: reading %s: %v", ErrSpentUnavailable, key, err)
	}
	return false, string(e.Value()), nil
}

// Spent returns the use recorded for key, or "" if none.
func (s *Spent) Spent(ctx context.Context, key string) (string, error) {
	if err := s.connected(key); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	e, err := s.kv.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("%w: reading %s: %v", ErrSpentUnavailable, key, err)
	}
	return string(e.Value()), nil
}
