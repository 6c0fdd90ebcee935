package app

// This file checks every number in the configuration against one table of
// allowed ranges, so that a value that makes no sense (a negative timeout,
// a queue of 0, a cap of -1) stops the bridge at start with the key, what
// was given and what is allowed, instead of being quietly replaced by a
// default or turning a bound off. TestEveryNumberHasARange walks Config and
// fails when a numeric key has no entry here, so a new key cannot skip it.

import (
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/devicebridge/devicebridge/device"
)

// numRange is the set of values one numeric key accepts.
type numRange struct {
	// min and max bound the value, inclusive, in the field's own unit
	// (nanoseconds for durations).
	min, max float64
	// off: a negative value turns the feature off, and says so.
	off string
	// unit names what an integer counts, for the message ("bytes").
	unit string
}

// Shorthands for the table.
func durations(lo, hi time.Duration) numRange { return numRange{min: float64(lo), max: float64(hi)} }
func counts(lo, hi int64) numRange            { return numRange{min: float64(lo), max: float64(hi)} }
func byteSizes(lo, hi int64) numRange {
	return numRange{min: float64(lo), max: float64(hi), unit: "bytes"}
}
func (r numRange) orOff(what string) numRange {
	r.off = what
	return r
}

const (
	kib = 1 << 10
	mib = 1 << 20
	gib = 1 << 30
	day = 24 * time.Hour
)

// numericKeys is every numeric configuration key with the values it
// accepts. Ranges are wide: they refuse what cannot be meant (a negative
// timeout, zero workers, a bound switched off) and what would hurt the
// bridge itself (a queue of a billion), not unusual choices.
var numericKeys = map[string]numRange{
	"log.sampling.initial":    counts(1, 1<<20).orOff("turns sampling off"),
	"log.sampling.thereafter": counts(1, 1<<20),
	"log.sampling.tick":       durations(10*time.Millisecond, time.Hour),

	"websocket.hello_timeout":      durations(100*time.Millisecond, 5*time.Minute),
	"websocket.read_limit":         byteSizes(512, 16*mib),
	"websocket.write_timeout":      durations(time.Second, 5*time.Minute),
	"websocket.ping_interval":      durations(time.Second, 110*time.Second), // boards drop a link silent for 120 s
	"websocket.pong_wait":          durations(time.Second, 5*time.Minute),
	"websocket.send_queue":         counts(1, 4096),
	"websocket.max_connections":    counts(1, 1<<20),
	"websocket.max_pending_hellos": counts(1, 1<<20),

	"devices.request_timeout":                   durations(100*time.Millisecond, 10*time.Minute),
	"devices.call_timeout":                      durations(100*time.Millisecond, time.Hour),
	"devices.tool_timeouts.*":                   durations(100*time.Millisecond, device.MaxToolTimeout),
	"devices.init_timeout":                      durations(time.Second, time.Hour),
	"devices.ready_wait":                        durations(100*time.Millisecond, 10*time.Minute),
	"devices.queue_size":                        counts(1, 4096),
	"devices.max_pages":                         counts(1, 1024),
	"devices.max_tools":                         counts(1, 4096),
	"devices.max_probes":                        counts(1, 4096),
	"devices.max_catalog_bytes":                 byteSizes(16*kib, 64*mib),
	"devices.peer_max_pending":                  counts(1, 1024),
	"devices.tool_limits.max_name_bytes":        byteSizes(32, 4*kib),
	"devices.tool_limits.max_description_bytes": byteSizes(256, gib),
	"devices.tool_limits.max_schema_bytes":      byteSizes(kib, gib),
	"devices.tool_limits.max_schema_depth":      counts(4, device.MostSchemaDepth),
	"devices.tool_limits.max_properties":        counts(16, 1<<30),
	"devices.tool_limits.max_enum_values":       counts(16, 1<<30),
	"devices.flapping.limit":                    counts(1, 1000),
	"devices.flapping.window":                   durations(time.Second, day),
	"devices.flapping.backoff":                  durations(time.Second, day),
	"control.max_body_bytes":                    byteSizes(4*kib, gib),
	"control.events_replay":                     counts(0, 1<<20),
	"simulate.count":                            counts(0, 100000),
	"mqtt.keepalive":                            durations(time.Second, time.Hour),
	"mqtt.connect_timeout":                      durations(100*time.Millisecond, 10*time.Minute),
	"mqtt.write_timeout":                        durations(100*time.Millisecond, 10*time.Minute),
	"mqtt.max_reconnect_interval":               durations(100*time.Millisecond, time.Hour),
	"mqtt.max_message_size":                     byteSizes(512, 16*mib),
	"mqtt.inbox_size":                           counts(1, 4096),
	"mqtt.liveness.interval":                    durations(time.Second, day).orOff("turns probing off"),
	"mqtt.liveness.timeout":                     durations(100*time.Millisecond, 10*time.Minute),
	"mqtt.liveness.misses":                      counts(1, 100),
	"mqtt.recover_window":                       durations(time.Second, day),
	"mqtt.rediscover_interval":                  durations(100*time.Millisecond, time.Hour),
	"mqtt.max_packet_size":                      byteSizes(512, 256*mib),
	"mqtt.client_writes_pending":                counts(1, 65535),
	"mqtt.board_limits.rate":                    {min: math.SmallestNonzeroFloat64, max: 1e6},
	"mqtt.board_limits.burst":                   counts(1, 1<<20),
	"mqtt.board_limits.flood_grace":             durations(10*time.Millisecond, time.Hour),
	"mqtt.max_connections":                      counts(1, 1<<20),
	"mqtt.max_pending_connects":                 counts(1, 1<<20),
	"mqtt.connect_packet_timeout":               durations(100*time.Millisecond, 10*time.Minute),

	"mcp.page_size":               counts(1, 10000),
	"mcp.max_body_bytes":          byteSizes(4*kib, gib),
	"mcp.rate_limit":              {min: math.SmallestNonzeroFloat64, max: 1e6, off: "turns rate limiting off"},
	"mcp.rate_burst":              counts(1, 1<<20),
	"mcp.session_timeout":         durations(time.Second, 7*day),
	"mcp.progress_interval":       durations(10*time.Millisecond, time.Hour).orOff("turns progress heartbeats off"),
	"mcp.max_sessions":            counts(1, 1<<20),
	"mcp.max_sessions_per_client": counts(1, 1<<20),
	"mcp.event_store_bytes":       byteSizes(64*kib, 4*gib),
	"mcp.tasks.ttl":               durations(time.Second, day),
	"mcp.tasks.poll_interval":     durations(100*time.Millisecond, time.Minute),
	"mcp.tasks.max_tasks":         counts(1, 1<<16),
	"mcp.tasks.max_per_caller":    counts(1, 1<<16),
	"mcp.max_subscriptions":       counts(1, 1<<16),

	"flow.timeout":        durations(time.Second, 7*day),
	"flow.max_per_caller": counts(1, 1<<20),
	"flow.max_prompts":    counts(1, 10000),
	"flow.max_duration":   durations(time.Second, 30*day),

	"ota.mqtt_keepalive":                   {min: 10, max: 3600, unit: "seconds"},
	"ota.timezone_offset":                  {min: -12 * 60, max: 14 * 60, unit: "minutes"},
	"ota.max_body_bytes":                   byteSizes(kib, 16*mib),
	"ota.max_pending":                      counts(1, 1<<20),
	"ota.pending_ttl":                      durations(time.Minute, 30*day),
	"ota.max_devices":                      counts(1, 1<<24),
	"ota.requests_per_second":              {min: math.SmallestNonzeroFloat64, max: 1e6},
	"ota.request_burst":                    counts(1, 1<<20),
	"ota.max_addresses":                    counts(1, 1<<24),
	"ota.code_digits":                      counts(6, 10),
	"ota.code_guesses_per_hour":            counts(1, 1<<20),
	"ota.code_guesses_per_caller_per_hour": counts(1, 1<<20),

	"voice.ota_timeout":       durations(100*time.Millisecond, time.Minute),
	"voice.hello_timeout":     durations(100*time.Millisecond, 9*time.Second),
	"voice.write_timeout":     durations(100*time.Millisecond, time.Minute),
	"voice.queue_frames":      counts(4, 4096),
	"voice.max_message":       byteSizes(4*kib, 16*mib),
	"voice.max_conversations": counts(1, 1000000),
	"voice.retry_after":       durations(0, time.Hour),
	"voice.mcp_queue":         counts(1, 1024),
	"voice.ota_max_in_flight": counts(1, 4096),

	"auth.oauth.clock_skew":      durations(time.Second, 5*time.Minute),
	"auth.policy_check_interval": durations(10*time.Millisecond, day),
	"auth.audit_max_bytes":       byteSizes(64*kib, 1<<40),
	"auth.audit_keep":            counts(1, 1000),

	"tracing.sample_ratio":   {min: math.SmallestNonzeroFloat64, max: 1},
	"tracing.flush_interval": durations(10*time.Millisecond, time.Hour),

	"http.read_header_timeout":     durations(10*time.Millisecond, time.Hour),
	"http.read_timeout":            durations(10*time.Millisecond, time.Hour),
	"http.write_timeout":           durations(10*time.Millisecond, time.Hour),
	"http.idle_timeout":            durations(10*time.Millisecond, day),
	"http.device_max_connections":  counts(1, 1<<24),
	"http.max_header_bytes":        byteSizes(4*kib, 16*mib),
	"http.control_max_connections": counts(1, 1<<20),

	"cluster.offline_after": durations(time.Second, time.Hour),

	"shutdown_timeout": durations(0, time.Hour),
}

// numericValue is one numeric key found in a Config.
type numericValue struct {
	key  string // yaml path; map entries end in their own key
	rule string // the numericKeys entry that governs it
	v    reflect.Value
}

// numericValues lists every numeric key of c (map entries and non-nil
// pointers included), sorted by key.
func numericValues(c Config) []numericValue { return numericValuesOf(reflect.ValueOf(&c).Elem()) }

// numericValuesOf is numericValues of a Config value; an addressable one
// yields settable values.
func numericValuesOf(root reflect.Value) []numericValue {
	var out []numericValue
	var walk func(v reflect.Value, key, rule string)
	walk = func(v reflect.Value, key, rule string) {
		switch v.Kind() {
		case reflect.Struct:
			for i := range v.NumField() {
				f := v.Type().Field(i)
				name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
				if !f.IsExported() || name == "-" {
					continue
				}
				if opts == "inline" {
					walk(v.Field(i), key, rule)
					continue
				}
				if name == "" {
					name = strings.ToLower(f.Name)
				}
				walk(v.Field(i), join(key, name), join(rule, name))
			}
		case reflect.Pointer:
			if !v.IsNil() {
				walk(v.Elem(), key, rule)
			}
		case reflect.Map:
			if v.Type().Key().Kind() != reflect.String {
				return
			}
			for _, k := range v.MapKeys() {
				walk(v.MapIndex(k), key+"."+k.String(), rule+".*")
			}
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
			reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
			reflect.Float32, reflect.Float64:
			out = append(out, numericValue{key: key, rule: rule, v: v})
		}
	}
	walk(root, "", "")
	sort.Slice(out, func(i, j int) bool { return out[i].key < out[j].key })
	return out
}

func join(a, b string) string {
	if a == "" {
		return b
	}
	return a + "." + b
}

func asFloat(v reflect.Value) float64 {
	switch {
	case v.CanInt():
		return float64(v.Int())
	case v.CanUint():
		return float64(v.Uint())
	default:
		return v.Float()
	}
}

var isDuration = func(v reflect.Value) bool { return v.Type() == reflect.TypeOf(time.Duration(0)) }

// defaultShown is each key's default as the messages show it.
var defaultShown = sync.OnceValue(func() map[string]string {
	m := map[string]string{}
	for _, nv := range numericValues(Default()) {
		if _, ok := m[nv.rule]; !ok {
			m[nv.rule] = showValue(nv.v, asFloat(nv.v), numericKeys[nv.rule].unit)
		}
	}
	return m
})

// checkNumbers reports every numeric key of c outside its range.
func (c Config) checkNumbers() []error {
	var errs []error
	for _, nv := range numericValues(c) {
		r, ok := numericKeys[nv.rule]
		if !ok {
			continue // TestEveryNumberHasARange keeps this from happening
		}
		x := asFloat(nv.v)
		if (x < 0 && r.off != "") || (x >= r.min && x <= r.max && !math.IsNaN(x)) {
			continue
		}
		errs = append(errs, fmt.Errorf("%s %s: %s", nv.key, showValue(nv.v, x, r.unit), r.allowed(nv.v, defaultShown()[nv.rule])))
	}
	return errs
}

// allowed says in words what r accepts.
func (r numRange) allowed(v reflect.Value, def string) string {
	var s string
	switch {
	case isDuration(v):
		s = fmt.Sprintf("use a duration from %s to %s", showDuration(time.Duration(r.min)), showDuration(time.Duration(r.max)))
	case v.CanFloat() && r.min == math.SmallestNonzeroFloat64:
		s = fmt.Sprintf("use a number above 0, up to %g", r.max)
	case v.CanFloat():
		s = fmt.Sprintf("use a number from %g to %g", r.min, r.max)
	default:
		what := "a whole number"
		if r.unit != "" {
			what = "a number of " + r.unit
		}
		s = fmt.Sprintf("use %s from %s to %s", what, showInt(r.min, r.unit), showInt(r.max, r.unit))
	}
	if r.off != "" {
		s += ", or a negative value, which " + r.off
	}
	if def != "" {
		s += "; default " + def
	}
	return s
}

func showValue(v reflect.Value, x float64, unit string) string {
	switch {
	case isDuration(v):
		return showDuration(time.Duration(v.Int()))
	case v.CanFloat():
		return strconv.FormatFloat(x, 'g', -1, 64)
	default:
		return showInt(x, unit)
	}
}

// showInt writes an integer; a byte size also in KiB/MiB/GiB when it is a
// whole number of them.
func showInt(x float64, unit string) string {
	n := int64(x)
	if unit != "bytes" {
		return strconv.FormatInt(n, 10)
	}
	for _, u := range []struct {
		size int64
		name string
	}{{gib, "GiB"}, {mib, "MiB"}, {kib, "KiB"}} {
		if n >= u.size && n%u.size == 0 {
			return fmt.Sprintf("%d (%d %s)", n, n/u.size, u.name)
		}
	}
	return strconv.FormatInt(n, 10)
}

// showDuration writes 5m rather than 5m0s.
func showDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
