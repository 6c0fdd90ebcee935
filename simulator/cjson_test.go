package simulator

import (
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseCJSONAccepts(t *testing.T) {
	cases := []struct {
		in   string
		kind jsonKind
		num  float64
		str  string
	}{
		{`  {"a":1}`, jsonObject, 0, ""},
		{"\xEF\xBB\xBF{}", jsonObject, 0, ""},
		{"\x01\x02[1]", jsonArray, 0, ""}, // bytes up to 0x20 count as whitespace
		{`{"a":1} trailing`, jsonObject, 0, ""},
		{`{"a":1}}`, jsonObject, 0, ""},
		{`0x10`, jsonNumber, 0, ""}, // strtod stops at x; the rest is trailing
		{`-.5`, jsonNumber, -0.5, ""},
		{`1.`, jsonNumber, 1, ""},
		{`01`, jsonNumber, 1, ""},
		{`1e`, jsonNumber, 1, ""}, // an exponent without digits is not consumed
		{`1e+3`, jsonNumber, 1000, ""},
		{`1e999`, jsonNumber, math.Inf(1), ""},
		{`"a\u00e9\ud83d\ude00\/"`, jsonString, 0, "aé😀/"},
		{"\"raw\x01ctl\xff\"", jsonString, 0, "raw\x01ctl\xff"},
		{`"cut\u0000here"`, jsonString, 0, "cut"},
		{"{\"a\":1}\x00garbage", jsonObject, 0, ""},
		{`nullx`, jsonNull, 0, ""},
		{`truex`, jsonTrue, 0, ""},
	}
	for _, tc := range cases {
		v, ok := parseCJSON([]byte(tc.in))
		require.True(t, ok, "%q should parse", tc.in)
		assert.Equal(t, tc.kind, v.kind, "%q", tc.in)
		if tc.kind == jsonNumber {
			assert.Equal(t, tc.num, v.num, "%q", tc.in)
		}
		if tc.kind == jsonString {
			assert.Equal(t, tc.str, v.str, "%q", tc.in)
		}
	}
}

func TestParseCJSONRejects(t *testing.T) {
	for _, in := range []string{
		``, `   `, `{`, `{"a":1,}`, `[1,]`, `{"a" 1}`, `{a:1}`, `-`, `+1`, `.5`, `"\x"`, `"\u12"`,
		`"\udc00"`, `"\ud83d"`, `"\ud83dx"`, `"\ud83d\u0041"`, `"unterminated`, `"ends with \`, `nul`,
		`[` + strings.Repeat("[", cjsonNestingLimit) + strings.Repeat("]", cjsonNestingLimit+1),
	} {
		_, ok := parseCJSON([]byte(in))
		assert.False(t, ok, "%q should not parse", in)
	}
	_, ok := parseCJSON([]byte(strings.Repeat("[", cjsonNestingLimit) + strings.Repeat("]", cjsonNestingLimit)))
	assert.True(t, ok, "nesting up to the limit is fine")
}

func TestCJSONLookup(t *testing.T) {
	v, ok := parseCJSON([]byte(`{"Key":1,"key":2,"other":{"Inner":"x"}}`))
	require.True(t, ok)
	assert.Equal(t, 1.0, v.get("KEY").num, "first match wins, case ignored")
	assert.Equal(t, "x", v.get("OTHER").get("inner").str)
	assert.Nil(t, v.get("missing").get("deeper"), "lookups are nil-safe")
}

func TestValueInt(t *testing.T) {
	for f, want := range map[float64]int{
		7.9: 7, -7.9: -7, 2147483647: 2147483647, 2147483648: 2147483647, -2147483649: -2147483648,
		math.Inf(1): 2147483647, math.Inf(-1): -2147483648,
	} {
		assert.Equal(t, want, (&jsonValue{kind: jsonNumber, num: f}).valueInt(), "%v", f)
	}
}

func TestAppendCJSONString(t *testing.T) {
	got := string(appendCJSONString(nil, "a\"b\\c/\b\f\n\r\t\x01\x1f\x7f<>&é\x00hidden"))
	assert.Equal(t, `"a\"b\\c/\b\f\n\r\t\u0001\u001f`+"\x7f"+`<>&é"`, got)
}

func TestAppendCJSONNumber(t *testing.T) {
	for f, want := range map[float64]string{
		0: "0", -3: "-3", 45.5: "45.5", 0.1: "0.1", 3e9: "3000000000", 1e20: "1e+20",
		float64(float32(45.3)): "45.299999237060547", math.NaN(): "null",
	} {
		assert.Equal(t, want, string(appendCJSONNumber(nil, f)), "%v", f)
	}
}
