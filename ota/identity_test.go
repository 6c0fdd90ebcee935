package ota

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMACSpellingsAreOneBoard: an OTA call naming a board's MAC in another
// spelling, in the Device-Id header or in the body's mac_address, is the
// same board (one record, the canonical id), and an operator approves it
// by any spelling in the path.
func TestMACSpellingsAreOneBoard(t *testing.T) {
	f := newFixture(t, Config{Secret: "0123456789abcdef0123", Approval: true}, embedded())
	for _, v := range []string{"AA-BB-CC-DD-EE-FF", "aabbccddeeff", "aa_bb_cc_dd_ee_ff", "AABB.CCDD.EEFF"} {
		h := boardHeaders()
		h.Set("Device-Id", v)
		code, _, _ := f.boot(t, h)
		require.Equal(t, http.StatusOK, code, v)
		noHeader := boardHeaders()
		noHeader.Del("Device-Id")
		code, _ = f.post(t, f.url, noHeader, strings.Replace(systemInfoBody, `"mac_address":"aa:bb:cc:dd:ee:ff"`, `"mac_address":"`+v+`"`, 1))
		require.Equal(t, http.StatusOK, code, v)
	}
	list := f.srv.Store().List(time.Now())
	require.Len(t, list, 1)
	assert.Equal(t, "aa:bb:cc:dd:ee:ff", list[0].DeviceID)
	assert.False(t, f.srv.Admitted("AA-BB-CC-DD-EE-FF"))

	code, _ := f.post(t, f.control+"/api/ota/devices/AA-BB-CC-DD-EE-FF/approve", http.Header{}, "")
	require.Equal(t, http.StatusOK, code)
	for _, v := range []string{"aa:bb:cc:dd:ee:ff", "aabbccddeeff", "AA_BB_CC_DD_EE_FF"} {
		assert.True(t, f.srv.Admitted(v), v)
	}
}
