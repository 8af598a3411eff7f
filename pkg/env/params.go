package env

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ErrUnknownParam is what a DecodeParams set function returns for a name its env does not
// have; DecodeParams then reports the name with the list of known ones.
var ErrUnknownParam = errors.New("unknown parameter")

// DecodeParams decodes an episode request's params object strictly, the one way every
// env does, and reports every problem at once, each naming its field (params.NAME).
// Empty or null params set nothing. Otherwise raw must be a JSON object; set is called for
// each of its keys in sorted order with the key's raw value, and either stores the value or
// returns why not: ErrUnknownParam for a name the env does not have (the error then lists
// known(), which is called only then), any other error for a bad value.
func DecodeParams(raw json.RawMessage, set func(name string, v json.RawMessage) error, known func() []string) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	if raw[0] != '{' {
		return fmt.Errorf("params: want object, got %s", JSONKind(raw))
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return fmt.Errorf("params: malformed JSON: %w", err)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var errs []error
	for _, k := range keys {
		err := set(k, m[k])
		switch {
		case err == nil:
		case errors.Is(err, ErrUnknownParam):
			names := slices.Clone(known())
			slices.Sort(names)
			errs = append(errs, fmt.Errorf("params.%s: unknown parameter (known: %s)", clipName(k), strings.Join(names, ", ")))
		default:
			errs = append(errs, fmt.Errorf("params.%s: %w", k, err))
		}
	}
	return errors.Join(errs...)
}

// clipName bounds an unknown param's name echoed back in an error.
func clipName(s string) string {
	const n = 64
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// JSONKind names the JSON type of a value by its first byte (after no space): string,
// object, array, boolean, null, number, nothing for an empty value, else invalid JSON.
func JSONKind(raw []byte) string {
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '"':
		return "string"
	case '{':
		return "object"
	case '[':
		return "array"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return "number"
	}
	return "invalid JSON"
}
