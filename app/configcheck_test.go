package app

import (
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEveryNumberHasARange: each numeric key of the configuration has an
// entry in numericKeys (so a key added later cannot skip the check), and
// each entry names a key that exists.
func TestEveryNumberHasARange(t *testing.T) {
	seen := map[string]bool{}
	for _, nv := range numericValues(withEveryPointer(Default())) {
		seen[nv.rule] = true
		_, ok := numericKeys[nv.rule]
		assert.True(t, ok, "%s is a number with no range in numericKeys (app/configcheck.go)", nv.rule)
	}
	for key := range numericKeys {
		assert.True(t, seen[key], "numericKeys names %s, which is not a configuration key", key)
	}
}

// TestDefaultsAreInRange: the defaults pass their own ranges, and the
// shipped configs/bridge.yaml spells out every numeric default.
func TestDefaultsAreInRange(t *testing.T) {
	assert.Empty(t, Default().checkNumbers())
	shipped, err := ParseArgs("bridge", []string{"--config", "../configs/bridge.yaml"})
	require.NoError(t, err)
	want := map[string]string{}
	for _, nv := range numericValues(Default()) {
		want[nv.key] = showValue(nv.v, asFloat(nv.v), "")
	}
	for _, nv := range numericValues(shipped) {
		if w, ok := want[nv.key]; ok {
			assert.Equal(t, w, showValue(nv.v, asFloat(nv.v), ""), "configs/bridge.yaml shows %s with another value than the default", nv.key)
		}
	}
}

// TestOutOfRangeNumbersAreRefused: for every numeric key, a value below its
// range and one above it stop the bridge with an error that names the key
// and what is allowed.
func TestOutOfRangeNumbersAreRefused(t *testing.T) {
	for _, nv := range numericValues(withEveryPointer(Default())) {
		r := numericKeys[nv.rule]
		var bad []float64
		switch {
		case r.off != "":
			bad = append(bad, r.max*2+1) // every negative value is allowed
			if r.min > 0 && r.min != math.SmallestNonzeroFloat64 {
				bad = append(bad, 0)
			}
		default:
			bad = append(bad, below(r.min), r.max*2+1)
		}
		for _, x := range bad {
			cfg := withEveryPointer(Default())
			setNumber(t, &cfg, nv.key, x)
			err := cfg.Validate()
			if assert.Error(t, err, "%s = %v must be refused", nv.key, x) {
				assert.Contains(t, err.Error(), nv.key+" ", "the error names the key")
				assert.Contains(t, err.Error(), "use a ", "the error says what is allowed")
			}
		}
	}
}

// below is a value under min: 0 for a positive minimum, else negative.
func below(min float64) float64 {
	if min > 0 {
		return 0
	}
	return min - 1
}

// TestNumberErrorsReadWell pins the wording of a few messages.
func TestNumberErrorsReadWell(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "bridge.yaml")
	for body, want := range map[string]string{
		"websocket: {hello_timeout: -5s}":                        "websocket.hello_timeout -5s: use a duration from 100ms to 5m; default 10s",
		"websocket: {max_connections: -1}":                       "websocket.max_connections -1: use a whole number from 1 to 1048576; default 16384",
		"devices: {queue_size: 0}":                               "devices.queue_size 0: use a whole number from 1 to 4096; default 16",
		"devices: {tool_timeouts: {self.camera.take_photo: 0s}}": "devices.tool_timeouts.self.camera.take_photo 0s: use a duration from 100ms to 5m; default 1m",
		"mqtt: {liveness: {interval: 0s}}":                       "mqtt.liveness.interval 0s: use a duration from 1s to 24h, or a negative value, which turns probing off; default 1m",
		"tracing: {sample_ratio: 0}":                             "tracing.sample_ratio 0: use a number above 0, up to 1; default 1",
	} {
		require.NoError(t, os.WriteFile(path, []byte(body+"\n"), 0o600))
		_, err := ParseArgs("bridge", []string{"--config", path})
		require.Error(t, err, body)
		assert.Contains(t, err.Error(), want, body)
	}
	_, err := ParseArgs("bridge", []string{"--mqtt-listen", "", "--call-timeout", "-1s"})
	require.ErrorContains(t, err, "devices.call_timeout -1s: use a duration from 100ms to 1h; default 30s", "flags are checked the same way")
}

// withEveryPointer returns c with every nil pointer to a number set, so the
// walk reaches the keys behind them.
func withEveryPointer(c Config) Config {
	var fill func(v reflect.Value)
	fill = func(v reflect.Value) {
		switch v.Kind() {
		case reflect.Struct:
			for i := range v.NumField() {
				if v.Type().Field(i).IsExported() {
					fill(v.Field(i))
				}
			}
		case reflect.Pointer:
			if v.IsNil() && v.CanSet() && v.Type().Elem().Kind() != reflect.Struct && v.Type().Elem().Kind() != reflect.Interface {
				v.Set(reflect.New(v.Type().Elem()))
			}
		}
	}
	fill(reflect.ValueOf(&c).Elem())
	return c
}

// setNumber sets the key named by a numericValues key in cfg to x.
func setNumber(t *testing.T, cfg *Config, key string, x float64) {
	t.Helper()
	found := false
	for _, nv := range numericValuesOf(reflect.ValueOf(cfg).Elem()) {
		if nv.key != key {
			continue
		}
		found = true
		v := nv.v
		if !v.CanSet() { // a map entry: write a new value back
			m, k := mapOf(t, *cfg, key)
			nvv := reflect.New(m.Type().Elem()).Elem()
			assign(nvv, x)
			m.SetMapIndex(k, nvv)
			return
		}
		assign(v, x)
	}
	require.True(t, found, "no key %s", key)
}

func assign(v reflect.Value, x float64) {
	switch {
	case v.CanInt():
		v.SetInt(int64(x))
	case v.CanUint():
		v.SetUint(uint64(max(x, 0)))
	default:
		v.SetFloat(x)
	}
}

// mapOf finds the map and map key behind a key like
// devices.tool_timeouts.self.camera.take_photo.
func mapOf(t *testing.T, cfg Config, key string) (reflect.Value, reflect.Value) {
	t.Helper()
	v := reflect.ValueOf(cfg)
	rest := key
	for rest != "" {
		name, after, _ := strings.Cut(rest, ".")
		f, ok := fieldByYAML(v, name)
		require.True(t, ok, "no field %s in %s", name, key)
		if f.Kind() == reflect.Map {
			return f, reflect.ValueOf(after)
		}
		v, rest = f, after
	}
	t.Fatalf("%s is not in a map", key)
	return reflect.Value{}, reflect.Value{}
}

func fieldByYAML(v reflect.Value, name string) (reflect.Value, bool) {
	for v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	for i := range v.NumField() {
		f := v.Type().Field(i)
		tag, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if opts == "inline" {
			if fv, ok := fieldByYAML(v.Field(i), name); ok {
				return fv, true
			}
			continue
		}
		if tag == name {
			return v.Field(i), true
		}
	}
	return reflect.Value{}, false
}
