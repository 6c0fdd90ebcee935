package envelope

import (
	"bytes"
	"encoding/json"
)

// errorMessageKey is how the firmware starts an error reply. It builds
// {"jsonrpc":"2.0","id":N,"error":{"message":"<text>"}} by string
// concatenation, so the key and its position are fixed.
var errorMessageKey = []byte(`"error":{"message":"`)

// errorMessageEnd closes the message string and the error object. The last
// occurrence in the document is the real end: the unescaped text may itself
// contain the sequence, but never after the closing one.
var errorMessageEnd = []byte(`"}}`)

// repairErrorMessage re-escapes the text of a firmware error message. It is
// tried only after the document failed to parse, and reports false when the
// document does not have the firmware's error shape or is still invalid
// after the repair, so it can never turn garbage into a message.
func repairErrorMessage(doc []byte) ([]byte, bool) {
	start := bytes.Index(doc, errorMessageKey)
	if start < 0 {
		return nil, false
	}
	start += len(errorMessageKey)
	end := bytes.LastIndex(doc, errorMessageEnd)
	if end < start {
		return nil, false
	}
	// The firmware pastes the text raw, so every byte is literal: encode it
	// as a fresh JSON string rather than guessing which quotes were meant.
	text, err := json.Marshal(string(doc[start:end]))
	if err != nil {
		return nil, false
	}
	fixed := make([]byte, 0, len(doc)+len(text))
	fixed = append(fixed, doc[:start-1]...) // up to and excluding the opening quote
	fixed = append(fixed, text...)
	fixed = append(fixed, doc[end+1:]...) // from the "}}" after the closing quote
	if !json.Valid(fixed) {
		return nil, false
	}
	return fixed, true
}
