package device

import (
	"cmp"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/devicebridge/devicebridge/internal/argcheck"
)

// ToolLimits bound what a board may declare about one tool. A board's tool
// list is input like any other: before any library (the schema validator,
// the MCP server that publishes tools upstream, JSON encoders) sees a
// tool, its name, description, schema and annotations are measured here,
// and a tool past a limit is refused on its own, with a reason in the log
// and in the board's Info.RefusedTools; the board's other tools keep
// working. Firmware tools are far inside every default: names of about 30
// bytes, schemas of under 300 bytes nesting 3 levels, a tools/list page of
// under 8000 bytes.
//
// The yaml keys are those of the bridge config's devices.tool_limits
// section. Zero takes the default.
type ToolLimits struct {
	// MaxNameBytes bounds a tool's name (and cuts the board's name and
	// firmware version from initialize).
	MaxNameBytes int `yaml:"max_name_bytes"`
	// MaxDescriptionBytes bounds a tool's description.
	MaxDescriptionBytes int `yaml:"max_description_bytes"`
	// MaxSchemaBytes bounds a tool's input schema, and its annotations.
	MaxSchemaBytes int `yaml:"max_schema_bytes"`
	// MaxSchemaDepth bounds the JSON nesting of a schema (and of the
	// annotations): a firmware schema nests 3 levels.
	MaxSchemaDepth int `yaml:"max_schema_depth"`
	// MaxProperties bounds the properties a schema declares, at every
	// level together.
	MaxProperties int `yaml:"max_properties"`
	// MaxEnumValues bounds the values of one enum.
	MaxEnumValues int `yaml:"max_enum_values"`
}

// Defaults for ToolLimits.
const (
	DefaultMaxNameBytes        = 128
	DefaultMaxDescriptionBytes = 8 << 10
	DefaultMaxSchemaBytes      = 32 << 10
	DefaultMaxSchemaDepth      = 32
	DefaultMaxProperties       = 128
	DefaultMaxEnumValues       = 256
)

// MostSchemaDepth is the deepest max_schema_depth accepted: a schema
// deeper than argcheck can check is never published.
const MostSchemaDepth = argcheck.MaxSchemaDepth

// WithDefaults returns l with zero and negative fields set to their
// defaults, and the depth kept to what argcheck can check. The bridge's
// configuration refuses values out of range at start (app/configcheck.go);
// this keeps the package safe for any caller.
func (l ToolLimits) WithDefaults() ToolLimits {
	// max(x, 0): a negative value here has always meant the default too.
	l.MaxNameBytes = cmp.Or(max(l.MaxNameBytes, 0), DefaultMaxNameBytes)
	l.MaxDescriptionBytes = cmp.Or(max(l.MaxDescriptionBytes, 0), DefaultMaxDescriptionBytes)
	l.MaxSchemaBytes = cmp.Or(max(l.MaxSchemaBytes, 0), DefaultMaxSchemaBytes)
	l.MaxSchemaDepth = cmp.Or(max(l.MaxSchemaDepth, 0), DefaultMaxSchemaDepth)
	l.MaxProperties = cmp.Or(max(l.MaxProperties, 0), DefaultMaxProperties)
	l.MaxEnumValues = cmp.Or(max(l.MaxEnumValues, 0), DefaultMaxEnumValues)
	l.MaxSchemaDepth = min(l.MaxSchemaDepth, MostSchemaDepth)
	return l
}

// RefusedTool is a tool a board listed that the bridge does not offer,
// and why.
type RefusedTool struct {
	// Name is the board's name for the tool, cut to 128 bytes.
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// maxShownName and maxShownReason bound a refused tool's name and reason
// as Info shows them.
const (
	maxShownName   = 128
	maxShownReason = 256
)

// CheckTools splits a board's tool list into the tools within l, in the
// board's order, and those refused. l must have its defaults filled.
func CheckTools(tools []Tool, l ToolLimits) (kept []Tool, refused []RefusedTool) {
	kept = tools[:0:0]
	for _, t := range tools {
		if why := checkTool(t, l); why != "" {
			refused = append(refused, RefusedTool{Name: cutUTF8(t.Name, maxShownName), Reason: why})
			continue
		}
		kept = append(kept, t)
	}
	return kept, refused
}

// checkTool returns why t is refused, or "".
func checkTool(t Tool, l ToolLimits) string {
	const key = "devices.tool_limits."
	over := func(what string, n int, k string, limit int) string {
		return fmt.Sprintf("%s is %d bytes, more than %s%s (%d)", what, n, key, k, limit)
	}
	switch {
	case len(t.Name) > l.MaxNameBytes:
		return over("its name", len(t.Name), "max_name_bytes", l.MaxNameBytes)
	case strings.ContainsFunc(t.Name, unicode.IsControl):
		return "its name contains control characters"
	case len(t.Description) > l.MaxDescriptionBytes:
		return over("its description", len(t.Description), "max_description_bytes", l.MaxDescriptionBytes)
	case len(t.InputSchema) > l.MaxSchemaBytes:
		return over("its input schema", len(t.InputSchema), "max_schema_bytes", l.MaxSchemaBytes)
	case len(t.Annotations) > l.MaxSchemaBytes:
		return over("its annotations", len(t.Annotations), "max_schema_bytes", l.MaxSchemaBytes)
	}
	if len(t.Annotations) > 0 {
		sh, err := argcheck.Measure(t.Annotations)
		switch {
		case err != nil:
			return "its annotations are not JSON"
		case sh.Depth > l.MaxSchemaDepth:
			return fmt.Sprintf("its annotations nest %d levels, more than %smax_schema_depth (%d)", sh.Depth, key, l.MaxSchemaDepth)
		}
	}
	if len(t.InputSchema) == 0 {
		return ""
	}
	sh, err := argcheck.Measure(t.InputSchema)
	switch {
	case err != nil:
		return "its input schema is not JSON"
	case sh.Depth > l.MaxSchemaDepth:
		return fmt.Sprintf("its input schema nests %d levels, more than %smax_schema_depth (%d)", sh.Depth, key, l.MaxSchemaDepth)
	case sh.Properties > l.MaxProperties:
		return fmt.Sprintf("its input schema declares %d properties, more than %smax_properties (%d)", sh.Properties, key, l.MaxProperties)
	case sh.MaxEnum > l.MaxEnumValues:
		return fmt.Sprintf("its input schema has an enum of %d values, more than %smax_enum_values (%d)", sh.MaxEnum, key, l.MaxEnumValues)
	case sh.Ref != "":
		return "its input schema uses " + sh.Ref + ", which the bridge does not follow (board schemas never need one)"
	case sh.Header:
		return "its input schema asks for x-mcp-header, which would let a board add headers to MCP hosts' requests"
	}
	if why := sh.Exceeds(); why != "" {
		return "its input schema cannot be checked: " + why
	}
	return ""
}

// cutUTF8 cuts s to at most n bytes without splitting a character,
// marking the cut with "…".
func cutUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "…"
	i := n - len(mark)
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + mark
}
