package flow

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Real firmware schemas.
const (
	volumeSchema = `{"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},"required":["volume"]}`
	themeSchema  = `{"type":"object","properties":{"theme":{"type":"string"}},"required":["theme"]}`
	photoSchema  = `{"type":"object","properties":{"url":{"type":"string"},"quality":{"type":"integer","default":80,"minimum":1,"maximum":100}},"required":["url"]}`
	emptySchema  = `{"type":"object","properties":{}}`
	enableSchema = `{"type":"object","properties":{"enable":{"type":"boolean"}},"required":["enable"]}`
)

func raw(s string) json.RawMessage { return json.RawMessage(s) }

// requireCode asserts err is an *Error with the code.
func requireCode(t *testing.T, err error, code int) *Error {
	t.Helper()
	require.Error(t, err)
	var fe *Error
	require.ErrorAs(t, err, &fe)
	require.Equal(t, code, fe.Code, "error: %v", err)
	require.NotEmpty(t, fe.Message)
	return fe
}

func bytesReader(b []byte) *bytes.Reader { return bytes.NewReader(b) }

func mustRaw(dec *json.Decoder) json.RawMessage {
	var r json.RawMessage
	_ = dec.Decode(&r)
	return r
}
