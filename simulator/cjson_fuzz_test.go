package simulator

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzParseCJSON checks that the board's JSON parser never panics and that
// whatever encoding/json accepts as a complete document, it accepts too
// (cJSON is the more lenient of the two: trailing bytes, for one). The one
// exception is a \u escape of a lone UTF-16 surrogate, which cJSON refuses
// and encoding/json replaces with U+FFFD.
func FuzzParseCJSON(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":50.7}}}`,
		`{"type":"hello","transport":"websocket","session_id":"x"}`,
		`{"A":1,"a":2}`, `[1,2,3] trailing`, `"\ud83d\ude00"`, `{"x":"\u0000"}`, `1e999`, `-0`, `{`, `nul`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, ok := parseCJSON(data)
		if ok && v == nil {
			t.Fatalf("accepted %q without a value", data)
		}
		if json.Valid(data) && !ok && !bytes.Contains(bytes.ToLower(data), []byte(`\ud`)) {
			t.Fatalf("rejected valid JSON %q", data)
		}
	})
}
