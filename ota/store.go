package ota

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/devicebridge/devicebridge/internal/logthrottle"
	"github.com/devicebridge/devicebridge/internal/randid"
)

// Files under the data directory.
const (
	// DevicesFile holds the admission state: one JSON document, rewritten
	// whole (temp file, fsync, rename) by the store's writer (see Store).
	DevicesFile = "ota-devices.json"
	// SecretFile holds the generated server secret (hex), mode 0600.
	SecretFile = "ota-secret"
	// storeVersion is the DevicesFile format version.
	storeVersion = 1
)

// Record is what the bridge remembers about a board that called its OTA
// endpoint.
type Record struct {
	DeviceID string `json:"device_id"`
	ClientID string `json:"client_id,omitempty"`
	Board    string `json:"board,omitempty"`
	Firmware string `json:"firmware,omitempty"`
	Chip     string `json:"chip,omitempty"`
	// Approved is set by an operator (approval mode); boards admitted by
	// the allowlist or with admission off are not marked.
	Approved   bool       `json:"approved"`
	ApprovedAt *time.Time `json:"approved_at,omitempty"`
	// Code and Challenge are the pending activation shown on the board.
	Code      string `json:"code,omitempty"`
	Challenge string `json:"challenge,omitempty"`
	// Transport is the last transport the board was told to use.
	Transport string    `json:"transport,omitempty"`
	FirstSeen time.Time `json:"first_seen"`
	// LastSeen is updated on every OTA call but written to disk only with
	// another change (a fleet rebooting together must not make the writer
	// busy for it), or for a pending board once it is a quarter of the
	// pending TTL older than on disk, so that a restart does not forget
	// boards that are still asking.
	LastSeen time.Time `json:"last_seen"`
	// RejectedClientID, RejectedAt and Rejections record OTA calls for
	// this MAC with another Client-Id than the one its credentials are
	// bound to: a board whose flash was erased, or an impostor. An
	// operator reads them before resetting the binding.
	RejectedClientID string     `json:"rejected_client_id,omitempty"`
	RejectedAt       *time.Time `json:"rejected_at,omitempty"`
	Rejections       int        `json:"rejections,omitempty"`

	// savedSeen is LastSeen as the file has it.
	savedSeen time.Time
	// secured numbers the record's last durable change (approval, reset,
	// Client-Id binding; see Store): until the file holds that change, no
	// credentials are handed out on the strength of it.
	secured uint64
}

// Pending reports whether the board waits for an operator.
func (r Record) Pending() bool { return !r.Approved && r.Code != "" }

// Limits bound what boards, which anyone can impersonate before admission,
// can make the store hold. Zero fields take the defaults.
type Limits struct {
	// MaxPending bounds boards waiting for approval.
	MaxPending int
	// MaxDevices bounds every record: approved, pending and merely seen.
	MaxDevices int
	// PendingTTL is how long a pending board that stopped asking is kept.
	PendingTTL time.Duration
	// CodeDigits is the length of activation codes.
	CodeDigits int
}

// Defaults of Limits: far above what a fleet of 10,000 boards needs at
// once (boards wait for approval a few at a time; a waiting board asks
// again every half minute or so), and 10^CodeDigits at least 1000 times
// MaxPending, so that a guessed code names a waiting board at most once
// in a thousand tries.
const (
	DefaultMaxPending = 1000
	DefaultMaxDevices = 50_000
	DefaultPendingTTL = time.Hour
	DefaultCodeDigits = 6
)

func (l Limits) withDefaults() Limits {
	// max(x, 0): a negative value here has always meant the default too.
	l.MaxPending = cmp.Or(max(l.MaxPending, 0), DefaultMaxPending)
	l.MaxDevices = cmp.Or(max(l.MaxDevices, 0), DefaultMaxDevices)
	l.PendingTTL = cmp.Or(max(l.PendingTTL, 0), DefaultPendingTTL)
	l.CodeDigits = cmp.Or(max(l.CodeDigits, 0), DefaultCodeDigits)
	// Out of range values from code that builds a Limits itself: codes a
	// board can read aloud, and pending boards given time to ask again.
	l.CodeDigits = min(max(l.CodeDigits, minCodeDigits), maxCodeDigits)
	l.PendingTTL = max(l.PendingTTL, minPendingTTL)
	return l
}

// Errors of Seen that refuse a board; the OTA endpoint turns each into an
// answer the firmware retries later.
var (
	ErrTooManyPending   = errors.New("too many boards are waiting for approval")
	ErrStoreFull        = errors.New("the bridge already records as many boards as ota.max_devices allows")
	ErrClientIDConflict = errors.New("this board's credentials are bound to another Client-Id")
)

// SeenPolicy says what an OTA call may change.
type SeenPolicy struct {
	// Approval gives a board that is neither approved nor waiting an
	// activation code.
	Approval bool
	// Bind keeps the Client-Id a board first registered with: a call with
	// another one is recorded on the board and refused with
	// ErrClientIDConflict until Reset.
	Bind bool
}

type storeFile struct {
	Version int      `json:"version"`
	Devices []Record `json:"devices"`
}

// Store is the admission state: every board seen, approvals and pending
// activation codes. With a directory it survives restarts; without one it
// lives in memory.
//
// Every change is made in memory and numbered. The file is rewritten whole,
// and a store may hold ota.max_devices boards (tens of megabytes), so most
// changes are coalesced: the first change after a write marks the store
// dirty, and one writer goroutine writes everything writeInterval later. A
// fleet booting together, or an outsider inventing MACs or changing its
// firmware string at every call, costs one write per interval, not one per
// request. The writer also paces itself on a slow disk: the next write
// comes no sooner than writeShare times the last one's duration.
//
// Durable changes are on disk before the request that made them is
// answered, because security rests on them:
//   - an approval (Approve): the operator is told the board is admitted,
//     and a restart must not quietly revoke it;
//   - a reset of a Client-Id binding (Reset), likewise;
//   - a new Client-Id binding where credentials are required, before the
//     answer that hands the board its credentials (Seen): were it lost in
//     a crash, the first caller to name the MAC after the restart, an
//     impostor as well as the board, would bind the credentials to itself.
//
// Their callers ask the writer for a write at once and wait for it; callers
// waiting together share one write. An outsider can cause one durable change
// per board recorded (ota.max_devices), and no more: a binding is made once.
//
// A crash loses what changed since the last write, at most writeInterval (or
// the pacing) old: last-seen times, board, firmware and chip names, the
// transport last handed out, the record of refused Client-Ids, and pending
// boards with their activation codes (such a board asks again and shows a
// new code). Close writes everything.
type Store struct {
	path string   // "" keeps everything in memory
	lock *os.File // holds the data directory (lockDir) until Close; nil in memory
	lim  Limits
	log  *zap.Logger

	mu        sync.Mutex
	devices   map[string]*Record
	codes     map[string]string // pending code → device id
	lastSweep time.Time         // when expired pending boards were last looked for

	// The writer's state, under mu. Changes are numbered by gen; dirty
	// is the newest one that must be written (the others wait for a
	// write made for another reason, or for Close); written is the
	// newest one on disk.
	gen, dirty, written uint64
	// interval is writeInterval (tests shorten or lengthen it).
	interval time.Duration
	// notBefore is when the writer may write next, unless urgent.
	notBefore time.Time
	// urgent: a caller waits for a durable change to be written.
	urgent bool
	// writing: the writer goroutine runs; it is started when there is
	// something to write and ends when there is not.
	writing, closed bool
	// attempts counts finished writes; lastGen and lastErr are the newest
	// change the last one held and how it ended.
	attempts, lastGen uint64
	lastErr           error
	writes            int // successful writes, for tests
	// wake tells a waiting writer that a change became urgent, or that
	// the store closes; flushed is signalled after every write.
	wake     chan struct{}
	flushed  *sync.Cond
	writer   sync.WaitGroup
	writeLog logthrottle.Throttle
}

// writeInterval is the most a coalesced change waits to be written, and
// the least time between two coalesced writes; writeShare keeps the
// writer from spending more than a tenth of its time writing.
const (
	writeInterval = time.Second
	writeShare    = 10
)

// ErrStoreClosed: the store was closed before a durable change could be
// written.
var ErrStoreClosed = errors.New("the OTA store is closed; the change was not written")

// OpenStore loads dir/DevicesFile (dir "" means in memory only) within
// lim as of now: pending boards not seen for PendingTTL are forgotten, and
// past MaxPending or MaxDevices the boards seen least recently (never an
// approved one) are left out. dropped counts them. A missing file is an
// empty store; a file it cannot read is an error, so that a corrupt file
// never silently drops approvals.
func OpenStore(dir string, lim Limits, now time.Time) (s *Store, dropped int, err error) {
	s = &Store{lim: lim.withDefaults(), log: zap.NewNop(), devices: map[string]*Record{}, codes: map[string]string{},
		interval: writeInterval, wake: make(chan struct{}, 1)}
	s.flushed = sync.NewCond(&s.mu)
	if dir == "" {
		return s, 0, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, 0, fmt.Errorf("ota data dir: %w", err)
	}
	if s.lock, err = lockDir(dir); err != nil {
		return nil, 0, err
	}
	opened := s // s is nil by the time a failed return runs this
	defer func() {
		if err != nil {
			opened.unlock()
		}
	}()
	s.path = filepath.Join(dir, DevicesFile)
	data, err := os.ReadFile(s.path)
	if errors.Is(err, os.ErrNotExist) {
		return s, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("ota store: %w", err)
	}
	var f storeFile
	if err = json.Unmarshal(data, &f); err != nil {
		return nil, 0, fmt.Errorf("ota store %s: %w (fix or remove the file)", s.path, err)
	}
	if f.Version != storeVersion {
		err = fmt.Errorf("ota store %s: format version %d, want %d", s.path, f.Version, storeVersion)
		return nil, 0, err
	}
	return s, s.load(f.Devices, now), nil
}

// unlock lets another bridge use the data directory.
func (s *Store) unlock() {
	if s.lock != nil {
		_ = s.lock.Close() // closing the file drops its flock
		s.lock = nil
	}
}

// load keeps what the limits allow of records, the most recently seen
// first, and returns how many it left out.
func (s *Store) load(records []Record, now time.Time) int {
	sort.SliceStable(records, func(i, j int) bool { return records[i].LastSeen.After(records[j].LastSeen) })
	room := s.lim.MaxDevices // left for boards nobody approved
	for _, r := range records {
		if r.Approved {
			room--
		}
	}
	dropped := 0
	for i := range records {
		r := records[i]
		if r.DeviceID == "" || s.devices[r.DeviceID] != nil {
			dropped++
			continue
		}
		if r.Approved {
			r.Code, r.Challenge = "", ""
		} else {
			if room <= 0 || r.Pending() && (s.expired(&r, now) || len(s.codes) >= s.lim.MaxPending) {
				dropped++
				continue
			}
			room--
			if r.Pending() {
				if _, taken := s.codes[r.Code]; taken {
					r.Code = s.newCode()
				}
				s.codes[r.Code] = r.DeviceID
			}
		}
		r.savedSeen = r.LastSeen
		s.devices[r.DeviceID] = &r
	}
	return dropped
}

// Get returns the record of a device.
func (s *Store) Get(id string) (Record, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.devices[id]
	if !ok {
		return Record{}, false
	}
	return *r, true
}

// List returns every record as of now, sorted by device id; pending
// boards that stopped asking are forgotten first.
func (s *Store) List(now time.Time) []Record {
	s.mu.Lock()
	s.sweepLocked(now, false)
	out := make([]Record, 0, len(s.devices))
	for _, r := range s.devices {
		out = append(out, *r)
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].DeviceID < out[j].DeviceID })
	return out
}

// Counts is how many boards the store holds, by state.
type Counts struct {
	Devices, Pending, Approved int
}

// Counts counts the boards as of now, without copying them: the status
// page anyone can open asks for it.
func (s *Store) Counts(now time.Time) Counts {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweepLocked(now, false)
	c := Counts{Devices: len(s.devices), Pending: len(s.codes)}
	for _, r := range s.devices {
		if r.Approved {
			c.Approved++
		}
	}
	return c
}

// Limits returns the store's limits, defaults filled in.
func (s *Store) Limits() Limits { return s.lim }

// Seen records an OTA call. With p.Approval, a board that is neither
// approved nor waiting gets an activation code and challenge, unless
// MaxPending boards already wait (ErrTooManyPending); a board the store
// does not know is refused past MaxDevices (ErrStoreFull). With p.Bind, a
// Client-Id other than the one the board registered with is recorded on
// the board and refused (ErrClientIDConflict). It returns the updated
// record. A change other than LastSeen (or a pending board's LastSeen
// getting old on disk) is written within writeInterval; with p.Bind, a
// record that gets credentials (no approval needed, or approved) returns
// only once its binding and approval are on disk.
func (s *Store) Seen(req Request, now time.Time, p SeenPolicy) (Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweepLocked(now, false)
	r, ok := s.devices[req.DeviceID]
	if ok && p.Bind && r.ClientID != req.ClientID && r.ClientID != "" {
		r.reject(req.ClientID, now)
		s.touchedLocked()
		return *r, ErrClientIDConflict
	}
	newPending := p.Approval && (!ok || !r.Approved && r.Code == "")
	if newPending && len(s.codes) >= s.lim.MaxPending {
		if s.sweepLocked(now, true); len(s.codes) >= s.lim.MaxPending {
			return Record{}, ErrTooManyPending
		}
	}
	if !ok && len(s.devices) >= s.lim.MaxDevices {
		if s.sweepLocked(now, true); len(s.devices) >= s.lim.MaxDevices {
			return Record{}, ErrStoreFull
		}
	}
	changed := !ok
	if !ok {
		r = &Record{DeviceID: req.DeviceID, FirstSeen: now}
	}
	boundTo := r.ClientID
	r.LastSeen = now
	for _, f := range []struct {
		dst *string
		v   string
	}{{&r.ClientID, req.ClientID}, {&r.Board, req.Board}, {&r.Firmware, req.Firmware}, {&r.Chip, req.Chip}} {
		if f.v != "" && *f.dst != f.v {
			*f.dst, changed = f.v, true
		}
	}
	if newPending {
		r.Code = s.newCode()
		r.Challenge = randid.Hex16()
		s.codes[r.Code] = r.DeviceID
		changed = true
	}
	if r.Pending() && now.Sub(r.savedSeen) > s.lim.PendingTTL/4 {
		changed = true
	}
	s.devices[req.DeviceID] = r
	switch {
	case p.Bind && r.ClientID != boundTo:
		r.secured = s.changedLocked()
	case changed:
		s.changedLocked()
	default:
		s.touchedLocked()
	}
	if p.Bind && (!p.Approval || r.Approved) {
		// The answer hands out credentials bound to r.ClientID. A
		// binding that failed to reach the disk on an earlier call is
		// waited for again here.
		if err := s.waitWrittenLocked(r.secured); err != nil {
			return Record{}, err
		}
	}
	return *r, nil
}

// Reject records, on board id, a Client-Id other than the one its
// credentials are bound to: an operator reads it before resetting the
// binding.
func (s *Store) Reject(id, clientID string, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.devices[id]; ok {
		r.reject(clientID, now)
		s.touchedLocked()
	}
}

// reject is kept in memory until the next write made for another reason:
// anyone can repeat it at will, and it must not keep the writer busy.
func (r *Record) reject(clientID string, now time.Time) {
	r.RejectedClientID, r.RejectedAt = clientID, &now
	r.Rejections++
}

// expired reports whether r waits for approval but stopped asking.
func (s *Store) expired(r *Record, now time.Time) bool {
	return r.Pending() && now.Sub(r.LastSeen) > s.lim.PendingTTL
}

// sweepInterval is how often expired pending boards are looked for in
// passing; at a limit (force) a sweep may run every second instead.
const sweepInterval = time.Minute

// sweepLocked forgets pending boards that stopped asking and returns how
// many. It scans every record, so it runs at most once per sweepInterval,
// or once a second when forced by a full store. The file is not rewritten
// for it: the next write (or Close) drops them, and a load leaves expired
// boards out.
func (s *Store) sweepLocked(now time.Time, force bool) int {
	since := now.Sub(s.lastSweep)
	if since < sweepInterval && (!force || since < time.Second) {
		return 0
	}
	s.lastSweep = now
	n := 0
	for id, r := range s.devices {
		if s.expired(r, now) {
			delete(s.codes, r.Code)
			delete(s.devices, id)
			n++
		}
	}
	if n > 0 {
		s.touchedLocked()
	}
	return n
}

// SetTransport remembers the transport last handed to a board; it is
// written within writeInterval.
func (s *Store) SetTransport(id, transport string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.devices[id]
	if !ok || r.Transport == transport {
		return
	}
	r.Transport = transport
	s.changedLocked()
}

// ErrUnknownDevice: no board with that id or code called the OTA endpoint.
var ErrUnknownDevice = errors.New("no such board has called the OTA endpoint")

// Approve admits a board, named by its device id or by the activation
// code on its screen, and returns its record once the approval is on disk.
// Approving twice is fine; it waits again for an approval whose write
// failed.
func (s *Store) Approve(idOrCode string, now time.Time) (Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := idOrCode
	if dev, ok := s.codes[idOrCode]; ok {
		id = dev
	}
	r, ok := s.devices[id]
	if !ok {
		return Record{}, ErrUnknownDevice
	}
	if !r.Approved {
		delete(s.codes, r.Code)
		r.Approved, r.ApprovedAt, r.Code, r.Challenge = true, &now, "", ""
		r.secured = s.changedLocked()
	}
	// A failed write leaves the approval in memory, where it holds until
	// a restart; the writer tries again, and so does a second Approve.
	if err := s.waitWrittenLocked(r.secured); err != nil {
		return Record{}, err
	}
	return *r, nil
}

// Reset binds a board's credentials to clientID ("": to the Client-Id of
// its next OTA call) and forgets the rejected calls: what an operator does
// for a board whose flash was erased. The board stays approved. It returns
// once the reset is on disk.
func (s *Store) Reset(id, clientID string) (Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.devices[id]
	if !ok {
		return Record{}, ErrUnknownDevice
	}
	r.ClientID, r.RejectedClientID, r.RejectedAt, r.Rejections = clientID, "", nil, 0
	r.secured = s.changedLocked()
	if err := s.waitWrittenLocked(r.secured); err != nil {
		return Record{}, err
	}
	return *r, nil
}

// newCode draws a code of CodeDigits digits that no pending board holds.
// MaxPending keeps the code space at least a thousand times emptier than
// full (Config.Validate), so this rarely draws twice.
func (s *Store) newCode() string {
	space := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(s.lim.CodeDigits)), nil)
	for {
		n, _ := rand.Int(rand.Reader, space)
		code := fmt.Sprintf("%0*s", s.lim.CodeDigits, n.String())
		if _, taken := s.codes[code]; !taken {
			return code
		}
	}
}

// touchedLocked numbers a change that waits for the next write made for
// another reason, or for Close.
func (s *Store) touchedLocked() { s.gen++ }

// changedLocked numbers a change the writer writes within the interval,
// and returns its number.
func (s *Store) changedLocked() uint64 {
	s.gen++
	if s.path == "" || s.closed {
		return s.gen
	}
	if s.dirty <= s.written {
		// The first change since the last write starts the interval, so
		// that a burst of changes shares one write.
		s.notBefore = later(s.notBefore, time.Now().Add(s.interval))
	}
	s.dirty = s.gen
	s.startWriterLocked()
	return s.gen
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func (s *Store) startWriterLocked() {
	if !s.writing {
		s.writing = true
		s.writer.Add(1)
		go s.runWriter()
	}
}

// waitWrittenLocked returns once the file holds change gen, asking the
// writer to write at once; it returns the error of a write that was to
// hold it. mu is released while it waits.
func (s *Store) waitWrittenLocked(gen uint64) error {
	from := s.attempts
	for s.path != "" && s.written < gen {
		if s.attempts > from && s.lastErr != nil && s.lastGen >= gen {
			return s.lastErr
		}
		if !s.writing {
			if s.closed {
				return ErrStoreClosed
			}
			s.startWriterLocked()
		}
		s.urgent = true
		select {
		case s.wake <- struct{}{}:
		default:
		}
		s.flushed.Wait()
	}
	return nil
}

// runWriter is the writer goroutine: it writes while something must be
// written, and ends when nothing must. Once the store is closed it makes
// one last write of everything, whatever the pacing says.
func (s *Store) runWriter() {
	defer s.writer.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.dirty > s.written || s.closed && s.gen > s.written {
		if wait := time.Until(s.notBefore); wait > 0 && !s.urgent && !s.closed {
			timer.Reset(wait)
			s.mu.Unlock()
			select {
			case <-s.wake:
			case <-timer.C:
			}
			timer.Stop()
			s.mu.Lock()
			continue
		}
		last := s.closed
		gen := s.gen
		records := make([]Record, 0, len(s.devices))
		for _, r := range s.devices {
			records = append(records, *r)
		}
		s.urgent = false
		s.mu.Unlock()

		start := time.Now()
		err := s.save(records)
		took := time.Since(start)
		if err != nil {
			s.writeLog.Warn(s.log, "could not write the OTA admission state; retrying (approvals and bindings made since are answered 500 until it works)",
				zap.String("path", s.path), zap.Error(err))
		}

		s.mu.Lock()
		s.attempts++
		s.lastGen, s.lastErr = gen, err
		s.notBefore = time.Now().Add(max(s.interval, writeShare*took))
		if err == nil {
			s.written = max(s.written, gen)
			s.writes++
			for i := range records {
				if r := s.devices[records[i].DeviceID]; r != nil {
					r.savedSeen = records[i].LastSeen
				}
			}
		}
		s.flushed.Broadcast()
		if last {
			break
		}
	}
	s.writing = false
	s.flushed.Broadcast()
}

// Close writes whatever is not on disk yet and waits for the writer to
// end. Changes made after Close stay in memory; a durable one fails with
// ErrStoreClosed. Close may be called more than once.
func (s *Store) Close() error {
	s.mu.Lock()
	s.closed = true
	if s.path != "" && s.gen > s.written {
		s.startWriterLocked()
	}
	select {
	case s.wake <- struct{}{}:
	default:
	}
	s.mu.Unlock()
	s.writer.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unlock()
	if s.path != "" && s.gen > s.written && s.lastErr != nil {
		return s.lastErr
	}
	return nil
}

// save writes records atomically: a reader (or a crash) sees the old file
// or the new one, never half of one.
func (s *Store) save(records []Record) error {
	sort.Slice(records, func(i, j int) bool { return records[i].DeviceID < records[j].DeviceID })
	data, err := json.MarshalIndent(storeFile{Version: storeVersion, Devices: records}, "", "  ")
	if err != nil {
		return err
	}
	return writeAtomic(s.path, append(data, '\n'), 0o600)
}

func writeAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("ota store: %w", err)
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	if err := tmp.Chmod(mode); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("ota store: %w", err)
	}
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("ota store: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("ota store: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("ota store: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("ota store: %w", err)
	}
	// The rename is durable only once the directory is synced.
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("ota store: %w", err)
	}
	defer dir.Close()
	if err := dir.Sync(); err != nil {
		return fmt.Errorf("ota store: %w", err)
	}
	return nil
}

// LoadOrCreateSecret returns the secret in dir/SecretFile, creating a
// random one the first time. Boards keep the credentials they were issued
// across bridge restarts only if the secret stays the same.
func LoadOrCreateSecret(dir string) ([]byte, error) {
	path := filepath.Join(dir, SecretFile)
	data, err := os.ReadFile(path)
	if err == nil {
		secret, derr := hex.DecodeString(string(bytes.TrimRight(data, "\n\r ")))
		if derr != nil || len(secret) < minSecretLen {
			return nil, fmt.Errorf("ota secret %s: want at least %d bytes as hex", path, minSecretLen)
		}
		return secret, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("ota secret: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("ota data dir: %w", err)
	}
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	if err := writeAtomic(path, []byte(hex.EncodeToString(secret)+"\n"), 0o600); err != nil {
		return nil, err
	}
	return secret, nil
}
