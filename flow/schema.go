package flow

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/devicebridge/devicebridge/internal/argcheck"
)

// Schemas are read, checked and explained by internal/argcheck, the
// bridge's one validator (jsonschema-go for the verdict, the firmware's
// rules and the teaching layer on top); the engine adds prompts, answers
// and its own size limit.

// maxValueBytes bounds one answer or argument value, so interactions (and
// stateless tokens) stay small.
const maxValueBytes = 16 << 10

// loadSchema returns the parsed form of a tool's input schema, shared
// through argcheck's cache. A schema argcheck cannot understand has Err
// set: it cannot drive an interaction.
func loadSchema(raw json.RawMessage) *argcheck.Schema { return argcheck.Shared(raw) }

// check validates one present value of a property: argcheck's verdict
// and wording, within the engine's size limit.
func check(p *argcheck.Prop, raw json.RawMessage) *argcheck.Problem {
	raw = bytes.TrimSpace(raw)
	if len(raw) > maxValueBytes {
		return p.Refuse(fmt.Sprintf("the value for %q is %d bytes long, more than the %d allowed", p.Name, len(raw), maxValueBytes), "")
	}
	return p.Check(raw)
}

// issue turns argcheck's problem into the engine's.
func issue(pr *argcheck.Problem) Problem {
	return Problem{Property: pr.Arg, Error: pr.Msg, Suggestion: pr.Suggestion}
}

// label is how prompts and messages name the property.
func label(p *argcheck.Prop) string {
	if p.Title != "" {
		return p.Title
	}
	return p.Name
}
