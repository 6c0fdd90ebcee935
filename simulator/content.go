package simulator

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"gopkg.in/yaml.v3"
)

// Profiles can give a tool what the stock firmware cannot express: a whole
// inputSchema (input_schema) and a whole tools/call result (behavior
// content with result), written as YAML and sent as JSON. They stand for
// boards beyond the stock firmware (custom firmware, py-xiaozhi, a
// camera board returning an image), and let the bridge's pass-through of
// every MCP content kind be tested with the real protocols.

// MaxResultBytes bounds a content tool's result as sent (compact JSON):
// with the envelope around it, it stays well under the 64 KiB a board's
// message may take.
const MaxResultBytes = 32 << 10

// yamlJSON writes a YAML node as compact JSON, keeping the order of
// mapping keys as written, and also returns it decoded into plain values
// for checking. Mapping keys must be strings.
func yamlJSON(n *yaml.Node) (json.RawMessage, any, error) {
	var v any
	if err := n.Decode(&v); err != nil {
		return nil, nil, err
	}
	data, err := appendNodeJSON(nil, n, 0)
	if err != nil {
		return nil, nil, err
	}
	return data, v, nil
}

// maxYAMLDepth bounds the nesting appendNodeJSON follows (aliases
// included), far beyond any schema or result a profile needs.
const maxYAMLDepth = 64

func appendNodeJSON(buf []byte, n *yaml.Node, depth int) ([]byte, error) {
	if depth > maxYAMLDepth {
		return nil, fmt.Errorf("nested more than %d levels", maxYAMLDepth)
	}
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) != 1 {
			return nil, errors.New("empty document")
		}
		return appendNodeJSON(buf, n.Content[0], depth+1)
	case yaml.AliasNode:
		return appendNodeJSON(buf, n.Alias, depth+1)
	case yaml.MappingNode:
		buf = append(buf, '{')
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if k.Kind != yaml.ScalarNode || k.Tag != "!!str" {
				return nil, fmt.Errorf("key %q cannot be written as JSON (mapping keys must be strings)", k.Value)
			}
			if i > 0 {
				buf = append(buf, ',')
			}
			key, _ := json.Marshal(k.Value)
			buf = append(append(buf, key...), ':')
			var err error
			if buf, err = appendNodeJSON(buf, n.Content[i+1], depth+1); err != nil {
				return nil, err
			}
		}
		return append(buf, '}'), nil
	case yaml.SequenceNode:
		buf = append(buf, '[')
		for i, it := range n.Content {
			if i > 0 {
				buf = append(buf, ',')
			}
			var err error
			if buf, err = appendNodeJSON(buf, it, depth+1); err != nil {
				return nil, err
			}
		}
		return append(buf, ']'), nil
	}
	var v any
	if err := n.Decode(&v); err != nil {
		return nil, err
	}
	data, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("%q cannot be written as JSON: %v", n.Value, err)
	}
	return append(buf, data...), nil
}

// inputSchemaJSON checks a tool's input_schema: an object schema (MCP
// requires type object at the top), whose required list, if any, names
// arguments as strings.
func inputSchemaJSON(n *yaml.Node) (json.RawMessage, error) {
	data, v, err := yamlJSON(n)
	if err != nil {
		return nil, err
	}
	m, ok := v.(map[string]any)
	if !ok || m["type"] != "object" {
		return nil, errors.New(`must be a mapping with type: object`)
	}
	if req, ok := m["required"]; ok {
		list, ok := req.([]any)
		if !ok {
			return nil, errors.New("required must be a list of argument names")
		}
		for _, r := range list {
			if s, ok := r.(string); !ok || s == "" {
				return nil, errors.New("required must be a list of argument names")
			}
		}
	}
	return data, nil
}

// resultJSON checks a content tool's result: a mapping in the shape of
// MCP's CallToolResult (content, isError, structuredContent, _meta), each
// content item well formed for its type, at most MaxResultBytes as JSON.
func resultJSON(n *yaml.Node) (json.RawMessage, error) {
	data, v, err := yamlJSON(n)
	if err != nil {
		return nil, err
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, errors.New("must be a mapping (content, isError, structuredContent, _meta)")
	}
	for k, val := range m {
		switch k {
		case "content":
			items, ok := val.([]any)
			if !ok {
				return nil, errors.New("content must be a list")
			}
			for i, it := range items {
				if err := checkContentItem(it); err != nil {
					return nil, fmt.Errorf("content[%d]: %v", i, err)
				}
			}
		case "isError":
			if _, ok := val.(bool); !ok {
				return nil, errors.New("isError must be true or false")
			}
		case "structuredContent", "_meta":
			if _, ok := val.(map[string]any); !ok {
				return nil, fmt.Errorf("%s must be a mapping", k)
			}
		default:
			return nil, fmt.Errorf("unknown key %q (content, isError, structuredContent, _meta)", k)
		}
	}
	if _, ok := m["content"]; !ok {
		return nil, errors.New("content is missing")
	}
	if len(data) > MaxResultBytes {
		return nil, fmt.Errorf("takes %d bytes as JSON, more than %d", len(data), MaxResultBytes)
	}
	return data, nil
}

// contentKeys are the keys each content type may carry besides type,
// annotations and _meta, and which of them it must.
var contentKeys = map[string]struct{ allowed, required []string }{
	"text":          {[]string{"text"}, []string{"text"}},
	"image":         {[]string{"data", "mimeType"}, []string{"data", "mimeType"}},
	"audio":         {[]string{"data", "mimeType"}, []string{"data", "mimeType"}},
	"resource_link": {[]string{"uri", "name", "title", "description", "mimeType", "size", "icons"}, []string{"uri", "name"}},
	"resource":      {[]string{"resource"}, []string{"resource"}},
}

func checkContentItem(it any) error {
	m, ok := it.(map[string]any)
	if !ok {
		return errors.New("must be a mapping")
	}
	typ, _ := m["type"].(string)
	keys, ok := contentKeys[typ]
	if !ok {
		return fmt.Errorf("type %q: want one of text, image, audio, resource_link, resource", m["type"])
	}
	for k := range m {
		if k != "type" && k != "annotations" && k != "_meta" && !slices.Contains(keys.allowed, k) {
			return fmt.Errorf("%s content has no key %q", typ, k)
		}
	}
	for _, k := range keys.required {
		if _, ok := m[k]; !ok {
			return fmt.Errorf("%s content needs %s", typ, k)
		}
	}
	switch typ {
	case "image", "audio":
		return checkBase64(m["data"], "data")
	case "resource":
		r, ok := m["resource"].(map[string]any)
		if !ok {
			return errors.New("resource must be a mapping (uri, mimeType, text or blob)")
		}
		if uri, _ := r["uri"].(string); uri == "" {
			return errors.New("resource needs a uri")
		}
		_, text := r["text"]
		_, blob := r["blob"]
		if text == blob {
			return errors.New("resource needs exactly one of text and blob")
		}
		if blob {
			return checkBase64(r["blob"], "blob")
		}
	}
	return nil
}

func checkBase64(v any, key string) error {
	s, ok := v.(string)
	if !ok {
		return fmt.Errorf("%s must be a base64 string", key)
	}
	if _, err := base64.StdEncoding.DecodeString(s); err != nil {
		return fmt.Errorf("%s is not standard base64: %v", key, err)
	}
	return nil
}

// appendCJSONValue prints a parsed value the way cJSON_PrintUnformatted
// does: members in their order, duplicates kept.
func appendCJSONValue(buf []byte, v *jsonValue) []byte {
	if v == nil {
		return append(buf, "null"...)
	}
	switch v.kind {
	case jsonNull:
		return append(buf, "null"...)
	case jsonFalse:
		return append(buf, "false"...)
	case jsonTrue:
		return append(buf, "true"...)
	case jsonNumber:
		return appendCJSONNumber(buf, v.num)
	case jsonString:
		return appendCJSONString(buf, v.str)
	case jsonArray:
		buf = append(buf, '[')
		for i, it := range v.items {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = appendCJSONValue(buf, it)
		}
		return append(buf, ']')
	}
	buf = append(buf, '{')
	for i, it := range v.items {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = appendCJSONString(buf, v.keys[i])
		buf = append(buf, ':')
		buf = appendCJSONValue(buf, it)
	}
	return append(buf, '}')
}
