package flow

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"go.uber.org/zap"
)

// tokenStore is stateless mode: the interaction's whole record travels in
// the sessionId, signed and bound to the owner (token.go), so any engine
// with the secret can continue it. What was consumed lives in the
// SpentStore: each token's step ("<id>.<turn>": answered or cancelled,
// once) and each interaction's end ("<id>.end": its final state), so that
// a token cannot run its step twice, on this replica or on any other
// sharing the store, and a second cancel gets CodeAlreadyCancelled.
//
// The table holds only short-lived markers: the answers being processed
// here (so that a cancel can stop them, and a second answer with the same
// token is refused at once), and the interactions that ended here (for
// Counts, and as a shortcut), until their tokens expire. Nothing is
// counted per owner.
type tokenStore struct {
	table
	secret  []byte
	spent   SpentStore
	timeout time.Duration
	now     func() time.Time
	log     *zap.Logger
}

func newTokenStore(secret []byte, spent SpentStore, timeout time.Duration, now func() time.Time, log *zap.Logger) *tokenStore {
	return &tokenStore{table: newTable(), secret: append([]byte(nil), secret...), spent: spent,
		timeout: timeout, now: now, log: log}
}

// open keeps nothing: the record goes out in the token commit makes.
func (s *tokenStore) open(_ string, _ *record, _ int, now int64, _ context.CancelFunc) (*entry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errClosed()
	}
	s.sweep(now, s.timeout.Milliseconds(), nil)
	return nil, nil
}

func (s *tokenStore) acquire(owner, id string, cancel context.CancelFunc) (*entry, *record, error) {
	rec, err := s.decode(owner, id, nowMS(s.now()))
	if err != nil {
		return nil, nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, nil, errClosed()
	}
	if m := s.marker(owner, rec.ID); m != nil {
		return nil, nil, errNotWaiting(id, m.rec.State)
	}
	if rec.State != StateWaitingUser {
		return nil, nil, errNotWaiting(id, rec.State)
	}
	m := &entry{key: rec.ID, owner: owner, rec: &record{State: StateProcessing}, cancel: cancel}
	m.deadline, _ = rec.deadline()
	s.add(m)
	work := rec.clone()
	work.State = StateProcessing
	return m, work, nil
}

// claim spends the token's step, fleet-wide: it fails if the interaction
// has ended, or if the token was already answered or cancelled (here or
// on another replica sharing the store).
func (s *tokenStore) claim(ctx context.Context, id string, _ *entry, rec *record) error {
	end, err := s.spent.Spent(ctx, endKey(rec.ID))
	if err != nil {
		return s.replayErr(err)
	}
	if end != "" {
		return errNotWaiting(id, State(end))
	}
	d, _ := rec.deadline()
	first, prior, err := s.spent.Spend(ctx, stepKey(rec), UseAnswered, time.UnixMilli(d))
	if err != nil {
		return s.replayErr(err)
	}
	if !first {
		if prior == UseCancelled {
			return errNotWaiting(id, StateCancelled)
		}
		return errStepUsed(id)
	}
	return nil
}

func (s *tokenStore) release(m *entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m.cancel = nil
	if s.entries[m.key] == m && m.rec.State == StateProcessing {
		s.drop(m)
	}
}

// commit seals work into the next token. After an answer (m not nil) that
// ended the interaction, the end is recorded in the SpentStore first.
func (s *tokenStore) commit(ctx context.Context, owner string, m *entry, work *record, step *Step, err error) (string, *record, *Step, error) {
	if m != nil && work.State.Final() {
		step, err = s.recordEnd(ctx, work, step, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if m != nil {
		m.cancel = nil
		if s.closed || s.entries[m.key] != m {
			if err == nil {
				err = errClosed()
			}
			return "", nil, nil, err
		}
		if m.rec.State == StateCancelled {
			// Cancelled here while processing: the outcome is discarded.
			work.State, work.Reason, work.Current = StateCancelled, m.rec.Reason, nil
			step, err = cancelledMeanwhile(m.rec.Reason), nil
		}
		// A finished interaction keeps its marker until its tokens expire.
		if work.State.Final() {
			m.rec = &record{State: work.State}
			m.deadline, _ = work.deadline()
			s.moved(m)
		} else {
			s.drop(m)
		}
	}
	return s.encode(owner, work), work, step, err
}

// get is the token's state, or the interaction's end when this replica or
// the SpentStore knows it (ctx bounds that lookup; its failure is
// ErrReplayCheck).
func (s *tokenStore) get(ctx context.Context, owner, id string) (*Snapshot, error) {
	rec, err := s.decode(owner, id, nowMS(s.now()))
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errClosed()
	}
	m := s.marker(owner, rec.ID)
	if m != nil {
		rec.State = m.rec.State
	}
	s.mu.Unlock()
	if m == nil {
		end, err := s.spent.Spent(ctx, endKey(rec.ID))
		if err != nil {
			return nil, s.replayErr(err)
		}
		if end != "" {
			rec.State, rec.Current = State(end), nil
		}
	}
	return rec.snapshot(id), nil
}

// cancel with any token of the interaction cancels it, on every replica
// sharing the SpentStore; a board call already running on another replica
// is not stopped there, but its outcome is discarded (recordEnd).
func (s *tokenStore) cancel(ctx context.Context, owner, id, reason string) error {
	rec, err := s.decode(owner, id, nowMS(s.now()))
	if err != nil {
		return err
	}
	if err := errCannotCancel(id, rec.State); err != nil {
		return err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errClosed()
	}
	if m := s.marker(owner, rec.ID); m != nil && m.rec.State.Final() {
		s.mu.Unlock()
		return errCannotCancel(id, m.rec.State)
	}
	s.mu.Unlock()
	// The token's step first: a cancel and an answer with the same token
	// race on it, and exactly one wins.
	d, _ := rec.deadline()
	first, prior, err := s.spent.Spend(ctx, stepKey(rec), UseCancelled, time.UnixMilli(d))
	if err != nil {
		return s.replayErr(err)
	}
	if !first && prior == UseCancelled {
		return errCannotCancel(id, StateCancelled)
	}
	// The token was current (first), or was answered: either way the
	// interaction as a whole ends here, unless it already ended.
	first, prior, err = s.spent.Spend(ctx, endKey(rec.ID), string(StateCancelled), s.endUntil(rec))
	if err != nil {
		return s.replayErr(err)
	}
	if !first {
		return errCannotCancel(id, State(prior))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	if m := s.marker(owner, rec.ID); m != nil {
		// Being processed here: stop it; commit discards the outcome.
		m.rec.State, m.rec.Reason = StateCancelled, reason
		if m.cancel != nil {
			m.cancel()
		}
	} else {
		m = &entry{key: rec.ID, owner: owner, rec: &record{State: StateCancelled, Reason: reason}}
		m.deadline = s.endUntil(rec).UnixMilli()
		s.add(m)
	}
	s.log.Debug("flow: interaction cancelled", zap.String("tool", rec.Tool))
	return nil
}

func (s *tokenStore) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.shut()
}

// marker returns owner's marker of interaction recID, or nil (mu held).
func (s *tokenStore) marker(owner, recID string) *entry {
	if m := s.entries[recID]; m != nil && m.owner == owner && m.rec != nil {
		return m
	}
	return nil
}

// recordEnd records the final state of an interaction. If it was
// cancelled meanwhile on another replica (which could not stop this one's
// call), the outcome is discarded as for a local cancel.
func (s *tokenStore) recordEnd(ctx context.Context, work *record, step *Step, err error) (*Step, error) {
	first, prior, serr := s.spent.Spend(context.WithoutCancel(ctx), endKey(work.ID), string(work.State), s.endUntil(work))
	switch {
	case serr != nil:
		// Its tokens are all spent already; only a later cancel with an
		// older token could be told "cancelled" instead of "completed".
		s.log.Warn("flow: could not record the end of an interaction", zap.String("tool", work.Tool), zap.Error(serr))
	case !first && State(prior) == StateCancelled && work.State != StateCancelled:
		work.State, work.Reason, work.Current = StateCancelled, "cancelled on another replica", nil
		return &Step{State: StateCancelled,
			Summary: "Cancelled (on another bridge) while the answer was being processed; the outcome was discarded, but what the tool already did stays done."}, nil
	}
	return step, err
}

// stepKey names a token's step in the SpentStore: every token that waits
// for an answer has its own prompt count (Turns), so the interaction id
// and that count identify it.
func stepKey(rec *record) string { return "flt." + rec.ID + "." + strconv.Itoa(rec.Turns) }

// endKey names an interaction's end in the SpentStore.
func endKey(id string) string { return "flt." + id + ".end" }

// endUntil is how long the end of rec's interaction must be remembered:
// as long as any of its tokens can be presented (none was issued after
// now, and none outlives its timeout or the interaction's hard expiry).
func (s *tokenStore) endUntil(rec *record) time.Time {
	d := nowMS(s.now()) + rec.Timeout
	if rec.Hard > 0 && rec.Hard < d {
		d = rec.Hard
	}
	return time.UnixMilli(d)
}

func (s *tokenStore) replayErr(err error) error {
	s.log.Warn("flow: replay store unavailable; refusing the step", zap.Error(err))
	return fmt.Errorf("flow: %w (%v)", ErrReplayCheck, err)
}

func errStepUsed(id string) *Error {
	return newError(CodeInvalidStateTransition, map[string]any{"sessionId": id, "reason": "token already used"},
		"This sessionId of interaction %s was already answered (on this bridge or another one sharing its flow secret), so this answer was not used and nothing ran again. "+
			"The sessionId changes with every step: answer with the latest one, which the previous interaction.respond returned. Use interaction.getState to see where it stands.", short(id))
}
