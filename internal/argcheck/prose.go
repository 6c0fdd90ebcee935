package argcheck

import (
	"encoding/json"
	"strings"
	"unicode"
)

// ProseDefault reports whether def, the JSON "default" a board declared for
// the property name (with its description and format), is prose about the
// property rather than a value for it. Boards do this: the firmware's
// self.upgrade_firmware declares its url's default as "The URL of the
// firmware binary file to download and install". Such a default is not
// offered, prefilled, shown or used as an example anywhere in the bridge;
// sent to the board it would be taken as the value.
//
// Only a string default can be prose. It is when it:
//   - is the description itself (any case, a final "." aside);
//   - is given for a URL (format uri/url/iri…, or a name such as url or
//     upload_url) and holds a space, which no URL does;
//   - reads as a sentence about the property: four words or more, starting
//     with "the", "a" or "an", naming the property ("The URL of …");
//   - is four words or more, nearly all of them words of the description.
func ProseDefault(name, description, format string, def json.RawMessage) bool {
	var s string
	if json.Unmarshal(def, &s) != nil {
		return false
	}
	s = strings.TrimSpace(s)
	if s == "" {
		return false
	}
	norm := func(x string) string { return strings.ToLower(strings.TrimSuffix(strings.TrimSpace(x), ".")) }
	if description != "" && norm(s) == norm(description) {
		return true
	}
	if urlish(name, format) && strings.ContainsFunc(s, unicode.IsSpace) {
		return true
	}
	ws := words(s)
	if len(ws) < 4 {
		return false
	}
	if ws[0] == "the" || ws[0] == "a" || ws[0] == "an" {
		nameWords := words(name)
		if len(nameWords) > 0 && containsRun(ws, nameWords) {
			return true
		}
	}
	if description != "" {
		desc := map[string]bool{}
		for _, w := range words(description) {
			desc[w] = true
		}
		in := 0
		for _, w := range ws {
			if desc[w] {
				in++
			}
		}
		if in*5 >= len(ws)*4 {
			return true
		}
	}
	return false
}

// urlish reports whether a string property named name with this format
// holds a URL.
func urlish(name, format string) bool {
	switch strings.ToLower(format) {
	case "uri", "url", "iri", "uri-reference", "iri-reference", "uri-template":
		return true
	}
	ws := words(name)
	if len(ws) == 0 {
		return false
	}
	last := ws[len(ws)-1]
	return last == "url" || last == "uri" || last == "href"
}

// words splits s into lower-case words: letters and digits, with
// snake_case, kebab-case and camelCase names split into their parts.
func words(s string) []string {
	var out []string
	var cur []rune
	flush := func() {
		if len(cur) > 0 {
			out = append(out, strings.ToLower(string(cur)))
			cur = cur[:0]
		}
	}
	rs := []rune(s)
	for i, r := range rs {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r):
			// camelCase: a capital after a lower-case letter starts a word.
			if unicode.IsUpper(r) && i > 0 && unicode.IsLower(rs[i-1]) {
				flush()
			}
			cur = append(cur, r)
		default:
			flush()
		}
	}
	flush()
	return out
}

// containsRun reports whether run appears in ws as consecutive words.
func containsRun(ws, run []string) bool {
	for i := 0; i+len(run) <= len(ws); i++ {
		match := true
		for j := range run {
			if ws[i+j] != run[j] {
				match = false
				break
			}
		}
		if match {
			return true
		}
	}
	return false
}

// URLish reports whether the argument is a URL, by its format or its name
// (url, upload_url, iconHref): prompts and examples then show a URL.
func (p *Prop) URLish() bool {
	return p.Type == "string" && urlish(p.Name, p.Format)
}

// exampleURL is the example value of a URL argument.
const exampleURL = "http://example.com/file"
