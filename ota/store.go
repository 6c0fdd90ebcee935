package ota

import (
	"bytes"
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

	"github.com/devicebridge/devicebridge/internal/randid"
)

// Files under the data directory.
const (
	// DevicesFile holds the admission state: one JSON document, rewritten
	// whole (temp file, fsync, rename) whenever it changes.
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
	// another change (a fleet rebooting together must not rewrite the file
	// once per board), or for a pending board once it is a quarter of
	// the pending TTL older than on disk, so that a restart does not
	// forget boards that are still asking.
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
	if l.MaxPending <= 0 {
		l.MaxPending = DefaultMaxPending
	}
	if l.MaxDevices <= 0 {
		l.MaxDevices = DefaultMaxDevices
	}
	if l.PendingTTL <= 0 {
		l.PendingTTL = DefaultPendingTTL
	}
	if l.CodeDigits <= 0 {
		l.CodeDigits = DefaultCodeDigits
	}
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
type Store struct {
	path string // "" keeps everything in memory
	lim  Limits

	mu        sync.Mutex
	devices   map[string]*Record
	codes     map[string]string // pending code → device id
	lastSweep time.Time         // when expired pending boards were last looked for
}

// OpenStore loads dir/DevicesFile (dir "" means in memory only) within
// lim as of now: pending boards not seen for PendingTTL are forgotten, and
// past MaxPending or MaxDevices the boards seen least recently (never an
// approved one) are left out. dropped counts them. A missing file is an
// empty store; a file it cannot read is an error, so that a corrupt file
// never silently drops approvals.
func OpenStore(dir string, lim Limits, now time.Time) (s *Store, dropped int, err error) {
	s = &Store{lim: lim.withDefaults(), devices: map[string]*Record{}, codes: map[string]string{}}
	if dir == "" {
		return s, 0, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, 0, fmt.Errorf("ota data dir: %w", err)
	}
	s.path = filepath.Join(dir, DevicesFile)
	data, err := os.ReadFile(s.path)
	if errors.Is(err, os.ErrNotExist) {
		return s, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("ota store: %w", err)
	}
	var f storeFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, 0, fmt.Errorf("ota store %s: %w (fix or remove the file)", s.path, err)
	}
	if f.Version != storeVersion {
		return nil, 0, fmt.Errorf("ota store %s: format version %d, want %d", s.path, f.Version, storeVersion)
	}
	return s, s.load(f.Devices, now), nil
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
// record; the file is rewritten only when something other than LastSeen
// changed, or a pending board's LastSeen on disk is getting old.
func (s *Store) Seen(req Request, now time.Time, p SeenPolicy) (Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweepLocked(now, false)
	r, ok := s.devices[req.DeviceID]
	if ok && p.Bind && r.ClientID != req.ClientID && r.ClientID != "" {
		r.reject(req.ClientID, now)
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
	before := *r
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
	if changed {
		if err := s.saveLocked(); err != nil {
			if newPending {
				delete(s.codes, r.Code)
			}
			*r = before
			if !ok {
				delete(s.devices, req.DeviceID)
			}
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
	}
}

// reject is kept in memory until the next write: anyone can repeat it at
// will, and it must not cost a file write each time.
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
// for it: the next change writes it, and a load leaves expired boards out.
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
	return n
}

// SetTransport remembers the transport last handed to a board.
func (s *Store) SetTransport(id, transport string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.devices[id]
	if !ok || r.Transport == transport {
		return nil
	}
	r.Transport = transport
	return s.saveLocked()
}

// ErrUnknownDevice: no board with that id or code called the OTA endpoint.
var ErrUnknownDevice = errors.New("no such board has called the OTA endpoint")

// Approve admits a board, named by its device id or by the activation
// code on its screen, and returns its record. Approving twice is fine.
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
	if r.Approved {
		return *r, nil
	}
	before := *r
	delete(s.codes, r.Code)
	r.Approved, r.ApprovedAt, r.Code, r.Challenge = true, &now, "", ""
	if err := s.saveLocked(); err != nil {
		*r = before
		if before.Code != "" {
			s.codes[before.Code] = id
		}
		return Record{}, err
	}
	return *r, nil
}

// Reset binds a board's credentials to clientID ("": to the Client-Id of
// its next OTA call) and forgets the rejected calls: what an operator does
// for a board whose flash was erased. The board stays approved.
func (s *Store) Reset(id, clientID string) (Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.devices[id]
	if !ok {
		return Record{}, ErrUnknownDevice
	}
	before := *r
	r.ClientID, r.RejectedClientID, r.RejectedAt, r.Rejections = clientID, "", nil, 0
	if err := s.saveLocked(); err != nil {
		*r = before
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

// saveLocked writes the whole store atomically: a reader (or a crash)
// sees the old file or the new one, never half of one.
func (s *Store) saveLocked() error {
	if s.path == "" {
		return nil
	}
	f := storeFile{Version: storeVersion, Devices: make([]Record, 0, len(s.devices))}
	for _, r := range s.devices {
		f.Devices = append(f.Devices, *r)
	}
	sort.Slice(f.Devices, func(i, j int) bool { return f.Devices[i].DeviceID < f.Devices[j].DeviceID })
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	if err := writeAtomic(s.path, append(data, '\n'), 0o600); err != nil {
		return err
	}
	for _, r := range s.devices {
		r.savedSeen = r.LastSeen
	}
	return nil
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
