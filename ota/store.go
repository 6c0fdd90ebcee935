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
	// another change: a fleet rebooting together must not rewrite the file
	// once per board.
	LastSeen time.Time `json:"last_seen"`
}

// Pending reports whether the board waits for an operator.
func (r Record) Pending() bool { return !r.Approved && r.Code != "" }

type storeFile struct {
	Version int      `json:"version"`
	Devices []Record `json:"devices"`
}

// Store is the admission state: every board seen, approvals and pending
// activation codes. With a directory it survives restarts; without one it
// lives in memory.
type Store struct {
	path string // "" keeps everything in memory

	mu      sync.Mutex
	devices map[string]*Record
	codes   map[string]string // pending code → device id
}

// OpenStore loads dir/DevicesFile (dir "" means in memory only). A missing
// file is an empty store; a file it cannot read is an error, so that a
// corrupt file never silently drops approvals.
func OpenStore(dir string) (*Store, error) {
	s := &Store{devices: map[string]*Record{}, codes: map[string]string{}}
	if dir == "" {
		return s, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("ota data dir: %w", err)
	}
	s.path = filepath.Join(dir, DevicesFile)
	data, err := os.ReadFile(s.path)
	if errors.Is(err, os.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ota store: %w", err)
	}
	var f storeFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("ota store %s: %w (fix or remove the file)", s.path, err)
	}
	if f.Version != storeVersion {
		return nil, fmt.Errorf("ota store %s: format version %d, want %d", s.path, f.Version, storeVersion)
	}
	for i := range f.Devices {
		r := f.Devices[i]
		s.devices[r.DeviceID] = &r
		if r.Pending() {
			s.codes[r.Code] = r.DeviceID
		}
	}
	return s, nil
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

// List returns every record, sorted by device id.
func (s *Store) List() []Record {
	s.mu.Lock()
	out := make([]Record, 0, len(s.devices))
	for _, r := range s.devices {
		out = append(out, *r)
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].DeviceID < out[j].DeviceID })
	return out
}

// Seen records an OTA call. With pending, a board that is neither approved
// nor waiting gets an activation code and challenge. It returns the
// updated record; the file is rewritten only when something other than
// LastSeen changed.
func (s *Store) Seen(req Request, now time.Time, needsApproval bool) (Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.devices[req.DeviceID]
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
	if needsApproval && !r.Approved && r.Code == "" {
		r.Code = s.newCode()
		r.Challenge = randid.Hex16()
		s.codes[r.Code] = r.DeviceID
		changed = true
	}
	s.devices[req.DeviceID] = r
	if changed {
		if err := s.saveLocked(); err != nil {
			*r = before
			if !ok {
				delete(s.devices, req.DeviceID)
			}
			return Record{}, err
		}
	}
	return *r, nil
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

// newCode draws a six-digit code no pending board holds.
func (s *Store) newCode() string {
	for {
		n, _ := rand.Int(rand.Reader, big.NewInt(1_000_000))
		code := fmt.Sprintf("%06d", n.Int64())
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
