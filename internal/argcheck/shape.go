package argcheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"regexp/syntax"
	"strconv"
)

// Shape is what a schema's structure costs, measured in one pass over its
// bytes without handing it to any library: the device layer compares it
// with its configured limits before it accepts a board's tool, and Parse
// with the ceilings below before it lets jsonschema-go resolve the schema.
type Shape struct {
	// Bytes is the schema's length.
	Bytes int
	// Depth is the deepest JSON nesting (objects and arrays) anywhere in
	// the document: {"type":"object","properties":{"a":{}}} is 3.
	Depth int
	// Properties counts the entries of every "properties" map, at any
	// depth.
	Properties int
	// MaxEnum is the length of the longest "enum".
	MaxEnum int
	// Ref is the first reference keyword found in a schema ($ref,
	// $dynamicRef, $recursiveRef); "" when none.
	Ref string
	// Header is set when a schema carries x-mcp-header, which asks MCP
	// clients to copy an argument into an HTTP header.
	Header bool
	// PatternCost estimates the work of matching one byte against every
	// "pattern" and "patternProperties" regular expression of the schema
	// (the sum of their program sizes); a string is matched in time
	// proportional to its length times this.
	PatternCost int
	// LongestPattern is the length of the longest regular expression.
	LongestPattern int
}

// Ceilings Parse holds every schema to, whatever the device layer allows:
// past them the schema is not checked (see Parse), because the library
// could then spend seconds on one call or fail.
const (
	// MaxSchemaDepth bounds the JSON nesting of a schema. Firmware schemas
	// nest 3 levels; go-sdk refuses (by panicking) past about 1000.
	MaxSchemaDepth = 64
	// MaxPatternBytes bounds one regular expression's length.
	MaxPatternBytes = 1 << 10
	// MaxPatternCost bounds Shape.PatternCost. Go's regular expressions
	// run in linear time, but their constant is the program size: a
	// 200-instruction pattern took over a second on a 64 KiB string.
	MaxPatternCost = 1 << 10
)

// schemaRole says how a JSON value inside a schema is read.
type schemaRole uint8

const (
	roleOther  schemaRole = iota // a value (default, const, examples...)
	roleSchema                   // a schema or a boolean schema
	roleMap                      // name → schema (properties, $defs...)
	roleList                     // a list of schemas (allOf...)
	roleEnum                     // the values of an enum
)

// Keywords whose value is a schema, a map of schemas or a list of schemas
// (2020-12 and the drafts still seen in the wild).
var (
	schemaKeywords = map[string]bool{
		"items": true, "additionalItems": true, "additionalProperties": true, "not": true, "if": true,
		"then": true, "else": true, "contains": true, "propertyNames": true, "unevaluatedItems": true,
		"unevaluatedProperties": true,
	}
	mapKeywords = map[string]bool{
		"properties": true, "patternProperties": true, "$defs": true, "definitions": true,
		"dependentSchemas": true, "dependencies": true,
	}
	listKeywords = map[string]bool{"allOf": true, "anyOf": true, "oneOf": true, "prefixItems": true}
	refKeywords  = map[string]bool{"$ref": true, "$dynamicRef": true, "$recursiveRef": true}
)

// frame is one open object or array during Measure.
type frame struct {
	array bool
	role  schemaRole
	// key is the object's last key, waiting for its value.
	key     string
	wantKey bool
	// parentKey is the key this map sits under in its schema
	// (properties, patternProperties...).
	parentKey string
	count     int
}

// Measure reads a schema's shape. It fails only when raw is not one
// JSON value.
func Measure(raw json.RawMessage) (Shape, error) {
	sh := Shape{Bytes: len(raw)}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var stack []frame
	values := 0 // complete values at the top level
	// roleOfValue is the role of the next value read, from where it sits.
	roleOfValue := func() (schemaRole, string) {
		if len(stack) == 0 {
			return roleSchema, ""
		}
		f := &stack[len(stack)-1]
		switch {
		case f.array && f.role == roleList:
			return roleSchema, ""
		case f.array && f.role == roleSchema: // items as a list (older drafts)
			return roleSchema, ""
		case f.array:
			return roleOther, ""
		case f.role == roleMap:
			return roleSchema, ""
		case f.role == roleSchema:
			switch k := f.key; {
			case schemaKeywords[k]:
				return roleSchema, k
			case mapKeywords[k]:
				return roleMap, k
			case listKeywords[k]:
				return roleList, k
			case k == "enum":
				return roleEnum, k
			}
		}
		return roleOther, ""
	}
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			return sh, err
		}
		if values > 0 {
			return sh, errors.New("unexpected data after the schema")
		}
		top := func() *frame {
			if len(stack) == 0 {
				return nil
			}
			return &stack[len(stack)-1]
		}
		// A key of an object.
		if f := top(); f != nil && !f.array && f.wantKey {
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:len(stack)-1]
				values += afterValue(top())
				continue
			}
			k, _ := tok.(string)
			f.key, f.wantKey = k, false
			if f.role == roleMap {
				if f.parentKey == "properties" {
					sh.Properties++
				}
				if f.parentKey == "patternProperties" {
					sh.addPattern(k)
				}
			}
			if f.role == roleSchema {
				if refKeywords[k] && sh.Ref == "" {
					sh.Ref = k
				}
				if k == "x-mcp-header" {
					sh.Header = true
				}
			}
			continue
		}
		switch d := tok.(type) {
		case json.Delim:
			switch d {
			case '{', '[':
				role, key := roleOfValue()
				stack = append(stack, frame{array: d == '[', role: role, parentKey: key, wantKey: d == '{'})
				sh.Depth = max(sh.Depth, len(stack))
			case ']':
				if f := top(); f.role == roleEnum {
					sh.MaxEnum = max(sh.MaxEnum, f.count)
				}
				stack = stack[:len(stack)-1]
				values += afterValue(top())
			}
		default:
			if f := top(); f != nil && !f.array && f.role == roleSchema && f.key == "pattern" {
				if p, ok := d.(string); ok {
					sh.addPattern(p)
				}
			}
			values += afterValue(top())
		}
	}
	if len(stack) != 0 || values == 0 {
		return sh, errors.New("unexpected end of JSON input")
	}
	return sh, nil
}

// afterValue records that f, the enclosing container, received one
// value; at the top level (f nil) it returns 1.
func afterValue(f *frame) int {
	if f == nil {
		return 1
	}
	f.count++
	if !f.array {
		f.wantKey = true
	}
	return 0
}

// addPattern adds a regular expression's cost. One that does not parse
// costs nothing here: the library refuses it.
func (sh *Shape) addPattern(p string) {
	sh.LongestPattern = max(sh.LongestPattern, len(p))
	if len(p) > MaxPatternBytes {
		return // refused for its length; not worth parsing
	}
	re, err := syntax.Parse(p, syntax.Perl)
	if err != nil {
		return
	}
	sh.PatternCost += patternSize(re, MaxPatternCost+1)
}

// patternSize estimates the program size of re, expanding counted
// repetitions as the compiler does, and stops counting past limit (so
// that a{1000}{1000}-like nesting costs nothing to measure).
func patternSize(re *syntax.Regexp, limit int) int {
	n := 1
	for _, sub := range re.Sub {
		n += patternSize(sub, limit)
		if n > limit {
			return n
		}
	}
	switch re.Op {
	case syntax.OpLiteral:
		n += len(re.Rune)
	case syntax.OpRepeat:
		times := max(re.Max, re.Min, 1)
		n = min(n*times, limit+1)
	}
	return n
}

// Exceeds reports the first of Parse's ceilings the shape passes, in
// words, or "" when it fits them all.
func (sh Shape) Exceeds() string {
	switch {
	case sh.Depth > MaxSchemaDepth:
		return "it nests " + strconv.Itoa(sh.Depth) + " levels deep, more than the " + strconv.Itoa(MaxSchemaDepth) + " the bridge reads"
	case sh.Ref != "":
		return "it uses " + sh.Ref + ", which the bridge does not follow (a reference can make checking one call take exponential time)"
	case sh.LongestPattern > MaxPatternBytes:
		return "a pattern is " + strconv.Itoa(sh.LongestPattern) + " bytes long, more than the " + strconv.Itoa(MaxPatternBytes) + " the bridge checks"
	case sh.PatternCost > MaxPatternCost:
		return "its patterns are too complex to check in bounded time"
	}
	return ""
}
