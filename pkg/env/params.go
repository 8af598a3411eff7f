package env

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
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
	if len(raw) >= 2 && raw[len(raw)-1] == '}' && len(bytes.TrimSpace(raw[1:len(raw)-1])) == 0 {
		return nil // an empty object, what most requests send: nothing to decode
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

// IntParam is an integer param of a Go env: what the env's spec says of it, and how a
// value sets the env's decoded params, of type P.
type IntParam[P any] struct {
	Name        string
	Default     int64
	Min, Max    int64
	Description string
	// Set stores a value within Min..Max (or the default) in p.
	Set func(p *P, v int64)
}

// IntParams are a Go env's integer params, all it has.
type IntParams[P any] []IntParam[P]

// Spec describes the params for the env's spec, each one's bounds after its description.
func (ps IntParams[P]) Spec() []Param {
	out := make([]Param, len(ps))
	for i, p := range ps {
		out[i] = Param{Name: p.Name, Type: "int", Default: strconv.FormatInt(p.Default, 10),
			Description: fmt.Sprintf("%s (%d..%d)", p.Description, p.Min, p.Max)}
	}
	return out
}

// Decode decodes a request's params strictly (DecodeParams) into a P holding every
// default the request does not change. value reads one param's JSON value held to its
// bounds; its error says what is wrong with the value, and Decode prefixes the field.
func (ps IntParams[P]) Decode(raw json.RawMessage, value func(v json.RawMessage, min, max int64) (int64, error)) (P, error) {
	var p P
	for _, d := range ps {
		d.Set(&p, d.Default)
	}
	err := DecodeParams(raw, func(k string, v json.RawMessage) error {
		i := slices.IndexFunc(ps, func(d IntParam[P]) bool { return d.Name == k })
		if i < 0 {
			return ErrUnknownParam
		}
		n, err := value(v, ps[i].Min, ps[i].Max)
		if err != nil {
			return err
		}
		ps[i].Set(&p, n)
		return nil
	}, ps.names)
	return p, err
}

// names lists the params' names.
func (ps IntParams[P]) names() []string {
	out := make([]string, len(ps))
	for i, d := range ps {
		out[i] = d.Name
	}
	return out
}
