package shop

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
)

// field is one argument of a tool: a string (bounded length) or an integer (bounded range).
type field struct {
	name    string
	integer bool
	min     int64 // integers only
	max     int64 // integers only
	maxLen  int   // strings only, in bytes
	desc    string
}

// args holds the decoded arguments of any tool; each tool reads the fields it declares.
type args struct {
	query   string
	sku     string
	orderID string
	qty     int64
	ms      int64
}

func (a *args) setString(name, v string) {
	switch name {
	case "query":
		a.query = v
	case "sku":
		a.sku = v
	case "order_id":
		a.orderID = v
	}
}

func (a *args) setInt(name string, v int64) {
	switch name {
	case "qty":
		a.qty = v
	case "ms":
		a.ms = v
	}
}

var (
	fSKU     = field{name: "sku", maxLen: 32, desc: `product id, e.g. "sku-3f2a"`}
	fOrderID = field{name: "order_id", maxLen: 32, desc: `order id returned by order.create, e.g. "o-1"`}
	fQuery   = field{name: "query", maxLen: 200, desc: "words that must all appear in a product's name or category"}
	fQty     = field{name: "qty", integer: true, min: 1, max: 1000, desc: "units to order"}
	fMs      = field{name: "ms", integer: true, min: 1, max: MaxWaitMs, desc: "virtual milliseconds to wait"}
)

// member is one key and raw value of an args object.
type member struct {
	key string
	raw []byte
}

// parseArgs decodes raw against the tool's fields. Its error lists every problem, each
// naming the field, in a deterministic order.
func parseArgs(t *toolDef, raw json.RawMessage) (args, error) {
	var a args
	if len(raw) > env.MaxArgsBytes {
		return a, fmt.Errorf("args: %d bytes exceeds the limit of %d", len(raw), env.MaxArgsBytes)
	}
	ms, err := members(raw)
	if err != nil {
		return a, err
	}
	var errs []error
	for _, m := range ms {
		if !slices.ContainsFunc(t.fields, func(f field) bool { return f.name == m.key }) {
			errs = append(errs, fmt.Errorf("args.%s: unknown field (%s)", clip(m.key), t.usage))
		}
	}
	for _, f := range t.fields {
		i := slices.IndexFunc(ms, func(m member) bool { return m.key == f.name })
		if i < 0 {
			errs = append(errs, fmt.Errorf("args.%s: required", f.name))
			continue
		}
		v := ms[i].raw
		if f.integer {
			n, err := parseInt(v, f.min, f.max)
			if err != nil {
				errs = append(errs, fmt.Errorf("args.%s: %w", f.name, err))
				continue
			}
			a.setInt(f.name, n)
			continue
		}
		s, err := parseString(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("args.%s: %w", f.name, err))
			continue
		}
		if len(s) > f.maxLen {
			errs = append(errs, fmt.Errorf("args.%s: %d bytes exceeds the limit of %d", f.name, len(s), f.maxLen))
			continue
		}
		a.setString(f.name, s)
	}
	return a, errors.Join(errs...)
}

// members splits an args object into its members, sorted by key, the last of duplicate
// keys winning as in encoding/json. Empty args and null mean {}.
func members(raw []byte) ([]member, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	if raw[0] != '{' {
		if !json.Valid(raw) {
			return nil, errors.New("args: malformed JSON")
		}
		return nil, fmt.Errorf("args: want object, got %s", env.JSONKind(raw))
	}
	if ms, ok := scanFlat(raw); ok {
		return ms, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("args: malformed JSON: %w", err)
	}
	ms := make([]member, 0, len(m))
	for _, k := range sortedKeys(m) {
		ms = append(ms, member{k, m[k]})
	}
	return ms, nil
}

// scanFlat is the hot path of members: it splits an object whose keys and values are
// plain strings (printable ASCII, no escapes) or integers, the shape of nearly every
// action, without encoding/json's reflection. It gives up (ok false) on anything else,
// including duplicate keys, and leaves that to encoding/json.
func scanFlat(b []byte) (ms []member, ok bool) {
	s := scanner{b: b}
	ok = s.object(func(key string) bool {
		for _, m := range ms {
			if m.key == key {
				return false
			}
		}
		s.ws()
		start := s.i
		switch c := s.next(); {
		case c == '"':
			if _, _, ok := s.plain(); !ok {
				return false
			}
		case c == '-' || c >= '0' && c <= '9':
			if _, ok := s.integer(); !ok {
				return false
			}
		default:
			return false
		}
		ms = append(ms, member{key, b[start:s.i]})
		return true
	})
	if !ok || !s.end() {
		return nil, false
	}
	slices.SortFunc(ms, func(x, y member) int { return strings.Compare(x.key, y.key) })
	return ms, true
}

// parseString reads a JSON string value.
func parseString(raw []byte) (string, error) {
	if len(raw) == 0 || raw[0] != '"' {
		return "", fmt.Errorf("want string, got %s", env.JSONKind(raw))
	}
	if bytes.IndexByte(raw, '\\') < 0 {
		if s := raw[1 : len(raw)-1]; utf8.Valid(s) {
			return string(s), nil // no escapes: the bytes are the string
		}
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", err
	}
	return s, nil
}

// parseInt reads a JSON integer within [lo, hi]. Integral numbers written with a fraction
// or exponent (2.0, 1e2) are integers, as in JSON Schema.
func parseInt(raw json.RawMessage, lo, hi int64) (int64, error) {
	raw = bytes.TrimSpace(raw)
	if k := env.JSONKind(raw); k != "number" {
		return 0, fmt.Errorf("want integer, got %s", k)
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		f, ferr := strconv.ParseFloat(string(raw), 64)
		switch {
		case ferr != nil && !errors.Is(ferr, strconv.ErrRange):
			return 0, fmt.Errorf("want integer, got %s", clip(string(raw)))
		case f != math.Trunc(f) || math.IsInf(f, 0):
			return 0, fmt.Errorf("want integer, got number %s", clip(string(raw)))
		case f < float64(lo) || f > float64(hi):
			return 0, fmt.Errorf("%s is outside [%d,%d]", clip(string(raw)), lo, hi)
		}
		n = int64(f)
	}
	if n < lo || n > hi {
		return 0, fmt.Errorf("%d is outside [%d,%d]", n, lo, hi)
	}
	return n, nil
}

// sortedKeys lists an object's keys in order, so that errors come out the same each time.
func sortedKeys(m map[string]json.RawMessage) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// clip bounds agent-supplied text echoed back in observations.
func clip(s string) string {
	const max = 48
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}

// schemaOf returns the JSON Schema of a tool's arguments, with sorted keys.
func schemaOf(fields []field) []byte {
	props := map[string]any{}
	required := []string{}
	for _, f := range fields {
		if f.integer {
			props[f.name] = map[string]any{"type": "integer", "minimum": f.min, "maximum": f.max, "description": f.desc}
		} else {
			props[f.name] = map[string]any{"type": "string", "maxLength": f.maxLen, "description": f.desc}
		}
		required = append(required, f.name)
	}
	s := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	if len(required) > 0 {
		s["required"] = required
	}
	b, err := json.Marshal(s)
	if err != nil { // unreachable: the schema is made of strings, ints and maps
		return []byte(`{"type":"object"}`)
	}
	return b
}

// usageOf is a one-line signature of a tool, shown to agents that called it wrongly.
func usageOf(name string, fields []field) string {
	parts := make([]string, len(fields))
	for i, f := range fields {
		if f.integer {
			parts[i] = fmt.Sprintf("%s: integer %d..%d", f.name, f.min, f.max)
		} else {
			parts[i] = f.name + ": string"
		}
	}
	return name + " {" + strings.Join(parts, ", ") + "}"
}
