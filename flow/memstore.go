package flow

import (
	"context"
	"time"

	"go.uber.org/zap"
)

// memStore keeps interactions in memory (stateful mode): by sessionId
// ("flw_" + a random id), visible only to their owner, at most
// maxPerOwner open ones per owner. An interaction past its deadline
// becomes a tombstone that answers CodeSessionExpired for one more
// timeout, then goes.
type memStore struct {
	table
	owners map[string]int // open (not finished) interactions per owner

	timeout     time.Duration
	maxPerOwner int
	maxDuration time.Duration
	now         func() time.Time
	log         *zap.Logger
}

func newMemStore(timeout time.Duration, maxPerOwner int, maxDuration time.Duration, now func() time.Time, log *zap.Logger) *memStore {
	return &memStore{table: newTable(), owners: map[string]int{},
		timeout: timeout, maxPerOwner: maxPerOwner, maxDuration: maxDuration, now: now, log: log}
}

func (m *memStore) open(owner string, rec *record, need int, now int64, cancel context.CancelFunc) (*entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, errClosed()
	}
	m.sweep(now)
	if m.maxPerOwner > 0 && need > 0 && m.owners[owner] >= m.maxPerOwner {
		n := m.owners[owner]
		return nil, newError(CodeTimeout, map[string]any{"limit": "maxPerOwner", "open": n},
			"You already have %d open interactions, the most allowed at once. Finish or cancel one (interaction.cancel {\"sessionId\": ...}) or wait for one to expire (after %s without activity), then start again.",
			n, m.timeout)
	}
	ent := &entry{key: "flw_" + rec.ID, owner: owner, rec: rec, open: true, cancel: cancel}
	ent.deadline, _ = rec.deadline()
	m.add(ent)
	m.owners[owner]++
	return ent, nil
}

func (m *memStore) acquire(owner, id string, cancel context.CancelFunc) (*entry, *record, error) {
	now := nowMS(m.now())
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, nil, errClosed()
	}
	ent, err := m.find(owner, id, now)
	if err != nil {
		return nil, nil, err
	}
	if ent.rec.State != StateWaitingUser {
		return nil, nil, errNotWaiting(id, ent.rec.State)
	}
	work := ent.rec.clone()
	ent.rec.State = StateProcessing
	ent.cancel = cancel
	work.State = StateProcessing
	return ent, work, nil
}

// claim has nothing to do: acquire marked the interaction processing
// under the lock, so no second answer gets it.
func (m *memStore) claim(context.Context, string, *entry, *record) error { return nil }

func (m *memStore) release(ent *entry) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ent.cancel = nil
	if ent.rec != nil && ent.rec.State == StateProcessing {
		ent.rec.State = StateWaitingUser
	}
}

func (m *memStore) commit(_ context.Context, _ string, ent *entry, work *record, step *Step, err error) (string, *record, *Step, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ent.cancel = nil
	if m.closed || m.entries[ent.key] != ent {
		if err == nil {
			err = errClosed()
		}
		return "", nil, nil, err
	}
	if ent.rec != nil && ent.rec.State == StateCancelled {
		// Cancelled while processing: the outcome is discarded, and the
		// cancelled record stays.
		step, err = cancelledMeanwhile(ent.rec.Reason), nil
		work = ent.rec
	}
	if ent.rec != work {
		ent.rec = work
		ent.deadline, _ = work.deadline()
		m.moved(ent)
	}
	if work.State.Final() && ent.open {
		m.unopen(ent)
	}
	return ent.key, work, step, err
}

func (m *memStore) get(_ context.Context, owner, id string) (*Snapshot, error) {
	now := nowMS(m.now())
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, errClosed()
	}
	ent, err := m.find(owner, id, now)
	if err != nil {
		return nil, err
	}
	return ent.rec.snapshot(id), nil
}

func (m *memStore) cancel(_ context.Context, owner, id, reason string) error {
	now := nowMS(m.now())
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return errClosed()
	}
	ent, err := m.find(owner, id, now)
	if err != nil {
		return err
	}
	if err := errCannotCancel(id, ent.rec.State); err != nil {
		return err
	}
	if ent.cancel != nil {
		ent.cancel()
	}
	// Replace the record rather than change it: a Respond in flight works
	// on its own copy and will see the cancellation at commit.
	c := ent.rec.clone()
	c.State, c.Reason, c.Current, c.Last = StateCancelled, reason, nil, now
	ent.rec = c
	ent.deadline, _ = c.deadline()
	m.moved(ent)
	if ent.open {
		m.unopen(ent)
	}
	m.log.Debug("flow: interaction cancelled", zap.String("tool", c.Tool))
	return nil
}

func (m *memStore) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.shut()
	m.owners = map[string]int{}
}

// find returns owner's live interaction id (mu held), expiring it when
// its time is up.
func (m *memStore) find(owner, id string, now int64) (*entry, error) {
	ent := m.entries[id]
	if ent == nil || ent.owner != owner {
		return nil, errNotFound(id)
	}
	if ent.rec == nil {
		return nil, errExpired(id, ent.expired, ent.limit)
	}
	if !ent.rec.State.busy() {
		if d, why := ent.rec.deadline(); now > d {
			m.expire(ent, why, now)
			return nil, errExpired(id, ent.expired, ent.limit)
		}
	}
	return ent, nil
}

// sweep expires or removes up to sweepBatch entries past their deadline
// (mu held): live interactions become tombstones, tombstones go.
func (m *memStore) sweep(now int64) {
	m.table.sweep(now, m.timeout.Milliseconds(), func(ent *entry, now int64) {
		_, why := ent.rec.deadline()
		m.expire(ent, why, now)
	})
}

// expire turns a live entry into a tombstone that answers
// CodeSessionExpired until it is swept (mu held).
func (m *memStore) expire(ent *entry, why string, now int64) {
	ent.limit = fmtDur(ent.rec.Timeout)
	if why == reasonMaxDuration {
		ent.limit = m.maxDuration.String()
	}
	ent.expired = why
	if ent.open {
		m.unopen(ent)
	}
	m.log.Debug("flow: interaction expired", zap.String("tool", ent.rec.Tool), zap.String("reason", why))
	ent.rec = nil
	ent.deadline = now + m.timeout.Milliseconds()
	m.moved(ent)
}

// unopen stops counting an entry as open for its owner (mu held).
func (m *memStore) unopen(ent *entry) {
	ent.open = false
	if m.owners[ent.owner]--; m.owners[ent.owner] <= 0 {
		delete(m.owners, ent.owner)
	}
}
