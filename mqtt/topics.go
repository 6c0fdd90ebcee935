package mqtt

import (
	"cmp"
	"errors"
	"fmt"
	"strings"

	"github.com/devicebridge/devicebridge/device"
)

// Default topic templates. {mac} stands for the board's topic key: its MAC
// with "_" for ":" (aa_bb_cc_dd_ee_ff).
const (
	// DefaultUplink is where a board publishes when each board has its own
	// uplink topic (required with an external broker).
	DefaultUplink = "devices/up/{mac}"
	// DefaultDownlink is the per-board downlink topic the existing xiaozhi
	// gateways publish to.
	DefaultDownlink = "devices/p2p/{mac}"
	// DefaultShared is the single topic existing xiaozhi backends hand every
	// board as publish_topic; only a broker that knows the sender's
	// connection (the embedded one) can tell boards apart on it.
	DefaultShared = "device-server"
)

// macPlaceholder is the one template variable.
const macPlaceholder = "{mac}"

// Topics names the topics boards and the bridge use. Uplink and Downlink
// are templates holding {mac} as one whole topic level.
type Topics struct {
	// Uplink is the per-board topic the bridge subscribes to (with {mac}
	// replaced by the single-level wildcard).
	Uplink string `yaml:"uplink"`
	// Downlink is the per-board topic the bridge publishes to.
	Downlink string `yaml:"downlink"`
	// Shared lists topics boards may publish to without naming themselves;
	// the embedded broker attributes such publishes to the sender and
	// re-publishes them on its uplink topic. External brokers cannot.
	Shared []string `yaml:"shared"`
}

// DefaultTopics returns the conventional topic layout.
func DefaultTopics() Topics {
	return Topics{Uplink: DefaultUplink, Downlink: DefaultDownlink, Shared: []string{DefaultShared}}
}

// WithDefaults fills empty templates. An explicitly empty Shared list
// (shared: []) is kept: it means boards must use their own uplink topic.
func (t Topics) WithDefaults() Topics {
	t.Uplink = cmp.Or(t.Uplink, DefaultUplink)
	t.Downlink = cmp.Or(t.Downlink, DefaultDownlink)
	if t.Shared == nil { // a slice: cmp.Or cannot compare it
		t.Shared = []string{DefaultShared}
	}
	return t
}

// Validate reports templates that cannot work.
func (t Topics) Validate() error {
	var errs []error
	for _, c := range []struct{ name, tmpl string }{{"uplink", t.Uplink}, {"downlink", t.Downlink}} {
		if _, err := parseTemplate(c.tmpl); err != nil {
			errs = append(errs, fmt.Errorf("mqtt.topics.%s %q: %w", c.name, c.tmpl, err))
		}
	}
	if t.Uplink != "" && t.Uplink == t.Downlink {
		errs = append(errs, errors.New("mqtt.topics.uplink and downlink must differ"))
	}
	for _, s := range t.Shared {
		if s == "" || strings.ContainsAny(s, "+#") || strings.Contains(s, macPlaceholder) {
			errs = append(errs, fmt.Errorf("mqtt.topics.shared %q: must be a plain topic name without wildcards or {mac}", s))
		}
	}
	return errors.Join(errs...)
}

// Template is a compiled topic template.
type Template struct {
	levels []string
	at     int // index of the {mac} level
}

// ParseTemplate compiles a template such as "devices/up/{mac}".
func ParseTemplate(s string) (Template, error) { return parseTemplate(s) }

func parseTemplate(s string) (Template, error) {
	if s == "" {
		return Template{}, errors.New("empty")
	}
	levels := strings.Split(s, "/")
	at := -1
	for i, l := range levels {
		switch {
		case l == macPlaceholder:
			if at >= 0 {
				return Template{}, errors.New("{mac} appears more than once")
			}
			at = i
		case strings.Contains(l, macPlaceholder):
			return Template{}, errors.New("{mac} must be a whole topic level")
		case strings.ContainsAny(l, "+#"):
			return Template{}, errors.New("wildcards are not allowed")
		}
	}
	if at < 0 {
		return Template{}, errors.New("missing {mac}")
	}
	return Template{levels: levels, at: at}, nil
}

// MustTemplate is ParseTemplate for templates already validated.
func MustTemplate(s string) Template {
	t, err := parseTemplate(s)
	if err != nil {
		panic(fmt.Sprintf("mqtt: topic template %q: %v", s, err))
	}
	return t
}

// Topic renders the template for one topic key.
func (t Template) Topic(key string) string {
	l := make([]string, len(t.levels))
	copy(l, t.levels)
	l[t.at] = key
	return strings.Join(l, "/")
}

// Filter is the subscription filter matching every board.
func (t Template) Filter() string { return t.Topic("+") }

// Key extracts the topic key from a topic matching the template.
func (t Template) Key(topic string) (string, bool) {
	levels := strings.Split(topic, "/")
	if len(levels) != len(t.levels) {
		return "", false
	}
	for i, l := range levels {
		if i == t.at {
			continue
		}
		if l != t.levels[i] {
			return "", false
		}
	}
	key := levels[t.at]
	return key, key != ""
}

// TopicKey turns a device id into its topic key: ":" becomes "_".
func TopicKey(deviceID string) string { return strings.ReplaceAll(deviceID, ":", "_") }

// DeviceIDFromKey reads the device id a topic key names: a MAC in any
// spelling becomes the canonical form boards use as their Device-Id (so
// "AA-BB-CC-DD-EE-FF" and "aa_bb_cc_dd_ee_ff" are one board); any other
// plain identifier names a board only with allowAny (see device.BoardID).
// ok is false for keys that name no board.
func DeviceIDFromKey(key string, allowAny bool) (id string, ok bool) {
	id, err := device.BoardID(key, allowAny)
	return id, err == nil
}

// ClientIdentity is what a board's MQTT client id says about it.
type ClientIdentity struct {
	// DeviceID is the board's MAC in lowercase colon form.
	DeviceID string
	// Key is the topic key (DeviceID with "_" for ":").
	Key string
	// Group is the part before the MAC ("GID_test"); empty for plain ids.
	Group string
	// UUID is the board's Client-Id, when the client id carries it.
	UUID string
}

// ErrClientID means a client id is not in the GID_xxx@@@<mac>[@@@<uuid>]
// form the xiaozhi backends hand out.
var ErrClientID = errors.New("client id is not of the form GROUP@@@aa_bb_cc_dd_ee_ff[@@@UUID]")

// ParseClientID reads the board identity out of a client id in the form
// xiaozhi backends use: "GID_test@@@aa_bb_cc_dd_ee_ff@@@<uuid>", or the
// two-part "GID_test@@@aa_bb_cc_dd_ee_ff". The MAC may be spelled any way
// device.CanonicalMAC reads ("_", ":", "-" or no separators, any case); the
// result is its canonical form, so every spelling is the same board.
//
// With allowPlain, a client id not in that form is accepted as the device
// id itself when it is a plain identifier (letters, digits, ".", "_", "-",
// at most 64 characters; a MAC in any spelling is still canonicalized); it
// has no UUID.
func ParseClientID(clientID string, allowPlain bool) (ClientIdentity, error) {
	parts := strings.Split(clientID, "@@@")
	if (len(parts) == 2 || len(parts) == 3) && parts[0] != "" {
		id, ok := device.CanonicalMAC(parts[1])
		if !ok {
			return ClientIdentity{}, ErrClientID
		}
		ci := ClientIdentity{DeviceID: id, Key: TopicKey(id), Group: parts[0]}
		if len(parts) == 3 {
			if parts[2] == "" {
				return ClientIdentity{}, ErrClientID
			}
			ci.UUID = parts[2]
		}
		return ci, nil
	}
	if allowPlain && len(parts) == 1 {
		if id, ok := DeviceIDFromKey(clientID, true); ok {
			return ClientIdentity{DeviceID: id, Key: TopicKey(id)}, nil
		}
	}
	return ClientIdentity{}, ErrClientID
}

// FormatClientID builds the three-part client id xiaozhi backends hand to a
// board: group@@@<mac with _>@@@uuid (uuid may be empty for the two-part
// form).
func FormatClientID(group, mac, uuid string) string {
	id := group + "@@@" + TopicKey(device.NormalizeID(mac))
	if uuid != "" {
		id += "@@@" + uuid
	}
	return id
}
