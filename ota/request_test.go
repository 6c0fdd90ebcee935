package ota

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// systemInfoBody is a board's body as the firmware builds it: string
// minimum_free_heap_size, a space after "partition_table":.
const systemInfoBody = `{"version":2,"language":"zh-CN","flash_size":16777216,"minimum_free_heap_size":"8318916",` +
	`"mac_address":"aa:bb:cc:dd:ee:ff","uuid":"1f0a0b0c-0000-4000-8000-000000000001","chip_model_name":"esp32s3",` +
	`"chip_info":{"model":9,"cores":2,"revision":2,"features":18},"application":{"name":"xiaozhi","version":"2.4.2",` +
	`"compile_time":"Aug  8 2026T08:33:45Z","idf_version":"v5.5.2","elf_sha256":"00"},"partition_table": [{"label":"nvs",` +
	`"type":1,"subtype":2,"address":36864,"size":16384}],"ota":{"label":"ota_0"},"display":{"monochrome":true,"width":128,` +
	`"height":32},"board":{"type":"bread-compact-wifi","name":"bread-compact-wifi","manufacturer":"","ssid":"x","rssi":-50,` +
	`"channel":6,"ip":"192.168.1.23","mac":"aa:bb:cc:dd:ee:ff"}}`

func boardHeaders() http.Header {
	return http.Header{
		"Activation-Version": {"1"},
		"Device-Id":          {"AA:BB:CC:DD:EE:FF"},
		"Client-Id":          {"1f0a0b0c-0000-4000-8000-000000000001"},
		"User-Agent":         {"bread-compact-wifi/2.4.2"},
		"Accept-Language":    {"zh-CN"},
		"Content-Type":       {"application/json"},
	}
}

func TestParseRealBoard(t *testing.T) {
	req, err := parse(boardHeaders(), []byte(systemInfoBody))
	require.NoError(t, err)
	assert.Equal(t, Request{DeviceID: "aa:bb:cc:dd:ee:ff", ClientID: "1f0a0b0c-0000-4000-8000-000000000001",
		Board: "bread-compact-wifi", Firmware: "2.4.2", Chip: "esp32s3", Language: "zh-CN", ActivationVersion: "1"}, req)
}

func TestParseQuirks(t *testing.T) {
	// Numbers sent as strings and strings sent as numbers, missing
	// headers: the body still names the board.
	body := `{"version":"2","flash_size":"16777216","minimum_free_heap_size":8318916,"mac_address":"aa-bb-cc-dd-ee-01",` +
		`"uuid":"u-1","application":{"version":"2.4.2"},"board":{"name":"esp-box-3"}}`
	req, err := parse(http.Header{}, []byte(body))
	require.NoError(t, err)
	assert.Equal(t, "aa:bb:cc:dd:ee:01", req.DeviceID)
	assert.Equal(t, "u-1", req.ClientID)
	assert.Equal(t, "esp-box-3", req.Board)
	assert.Equal(t, "2.4.2", req.Firmware)

	// A minimal body with the identity in the headers only.
	req, err = parse(boardHeaders(), []byte(`{}`))
	require.NoError(t, err)
	assert.Equal(t, "2.4.2", req.Firmware, "from User-Agent")
}

func TestParseMalformed(t *testing.T) {
	noID := boardHeaders()
	noID.Del("Device-Id")
	badUUID := boardHeaders()
	badUUID.Set("Client-Id", "x/../../y")
	for name, tc := range map[string]struct {
		h      http.Header
		body   string
		reason string
	}{
		"empty":          {boardHeaders(), "", "empty body"},
		"not json":       {boardHeaders(), "hello", "not a JSON object"},
		"array":          {boardHeaders(), "[1]", "not a JSON object"},
		"truncated":      {boardHeaders(), `{"version":2,`, "not valid system information"},
		"no mac":         {noID, `{"version":2}`, "no Device-Id"},
		"bad mac":        {noID, `{"mac_address":"nope"}`, "not a MAC"},
		"object version": {boardHeaders(), `{"application":{"version":{"a":1}}}`, "not valid system information"},
		"bad client id":  {badUUID, `{}`, "Client-Id"},
		"odd version":    {boardHeaders(), `{"application":{"version":"2.4 <script>"}}`, "firmware version"},
	} {
		_, err := parse(tc.h, []byte(tc.body))
		require.ErrorIs(t, err, ErrBadRequest, name)
		assert.ErrorContains(t, err, tc.reason, name)
	}
}

func TestParseRequestBodyLimit(t *testing.T) {
	r, _ := http.NewRequest(http.MethodPost, "/", strings.NewReader(`{"pad":"`+strings.Repeat("x", 100)+`"}`))
	r.Header = boardHeaders()
	_, err := ParseRequest(r, 50)
	assert.ErrorContains(t, err, "larger than 50 bytes")
}
