package world

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

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/types"
	"gopkg.in/yaml.v3"

	"github.com/gauntlet-rl/gauntlet/pkg/canonjson"
	"github.com/gauntlet-rl/gauntlet/pkg/env"
)

// argSchema is a tool's arguments: a JSON Schema object of flat properties, each a
// string (length bounds, enum), an integer (range) or a boolean. A world declares its
// arguments in that subset; other keywords are refused when the world loads, so what
// agents read in the spec is exactly what the world checks.
type argSchema struct {
	typeName string
	otype    *objType
	props    []argProp
	required []string
	// schema is the canonical JSON Schema the spec publishes; usage the call shape the
	// invalid-action observation suggests.
	schema []byte
	usage  string
	// call is the tool's name and usage, as the answer to a bad call shows it.
	call string
}

type argProp struct {
	name           string
	kind           kind
	desc           string
	minLen, maxLen int
	min, max       int64
	enum           []string
	required       bool
}

func (s *argSchema) prop(name string) *argProp {
	for i := range s.props {
		if s.props[i].name == name {
			return &s.props[i]
		}
	}
	return nil
}

func (s *argSchema) celFields() ([]string, []*cel.Type) {
	names := make([]string, len(s.props))
	ts := make([]*cel.Type, len(s.props))
	for i, p := range s.props {
		names[i], ts[i] = p.name, p.kind.cel()
	}
	return names, ts
}

var schemaKeys = []string{"type", "properties", "required", "additionalProperties", "description"}
var propKeys = []string{"type", "description", "minLength", "maxLength", "enum", "minimum", "maximum"}

// maxStringArg bounds a string argument that declares no maxLength.
const maxStringArg = 1024

// schema reads a tool's args.
func (c *compiler) schema(n *yaml.Node, f string, typeName string) argSchema {
	d := c.d
	s := argSchema{typeName: typeName}
	var reqNode *yaml.Node
	for _, m := range d.mapping(n, f, schemaKeys...) {
		mf := sub(f, m.key)
		switch m.key {
		case "type":
			if v, ok := d.text(m.v, mf); ok && v != "object" {
				d.errAt(at(m.v, mf), "arguments are an object; got type %q", clip(v))
			}
		case "additionalProperties":
			if v, ok := d.boolean(m.v, mf); ok && v {
				d.errAt(at(m.v, mf), "must be false: unknown arguments are refused")
			}
		case "description":
			d.text(m.v, mf)
		case "required":
			reqNode = m.v
		case "properties":
			for _, pm := range d.mapping(m.v, mf) {
				pf := sub(mf, pm.key)
				if !validName(pm.key, false) {
					d.errAt(at(pm.k, pf), "bad argument name %q: want a letter, then letters, digits or _", clip(pm.key))
					continue
				}
				s.props = append(s.props, c.prop(pm.key, pm.v, pf))
			}
		}
	}
	for i, r := range d.sequence(reqNode, sub(f, "required")) {
		rf := idx(sub(f, "required"), i)
		if v, ok := d.text(r, rf); ok {
			p := s.prop(v)
			if p == nil {
				d.errAt(at(r, rf), "%q is not among the properties", clip(v))
				continue
			}
			if !p.required {
				p.required = true
				s.required = append(s.required, v)
			}
		}
	}
	s.schema, s.usage = s.render()
	return s
}

func (c *compiler) prop(name string, n *yaml.Node, f string) argProp {
	d := c.d
	p := argProp{name: name, maxLen: maxStringArg, min: math.MinInt64, max: math.MaxInt64}
	ms := d.mapping(n, f, propKeys...)
	for _, m := range ms {
		if m.key == "type" {
			if v, ok := d.text(m.v, sub(f, "type")); ok {
				switch v {
				case "string":
					p.kind = kString
				case "integer":
					p.kind = kInt
				case "boolean":
					p.kind = kBool
				default:
					d.errAt(at(m.v, sub(f, "type")), "unsupported type %q (string, integer, boolean)", clip(v))
				}
			}
		}
	}
	if p.kind == 0 {
		if !hasKey(n, "type") && resolve(n) != nil && resolve(n).Kind == yaml.MappingNode {
			d.errAt(at(n, sub(f, "type")), "required: string, integer or boolean")
		}
		p.kind = kString
	}
	for _, m := range ms {
		mf := sub(f, m.key)
		only := func(k kind) bool {
			if p.kind != k {
				d.errAt(at(m.k, mf), "%s applies to %s arguments, not %s", m.key, k, p.kind)
				return false
			}
			return true
		}
		switch m.key {
		case "description":
			p.desc, _ = d.text(m.v, mf)
		case "minLength":
			if only(kString) {
				v, _ := d.integer(m.v, mf, 0, env.MaxArgsBytes)
				p.minLen = int(v)
			}
		case "maxLength":
			if only(kString) {
				v, _ := d.integer(m.v, mf, 1, env.MaxArgsBytes)
				p.maxLen = int(v)
			}
		case "minimum":
			if only(kInt) {
				p.min, _ = d.integer(m.v, mf, math.MinInt64, math.MaxInt64)
			}
		case "maximum":
			if only(kInt) {
				p.max, _ = d.integer(m.v, mf, math.MinInt64, math.MaxInt64)
			}
		case "enum":
			if only(kString) {
				for i, e := range d.sequence(m.v, mf) {
					if v, ok := d.text(e, idx(mf, i)); ok {
						p.enum = append(p.enum, v)
					}
				}
			}
		}
	}
	if p.minLen > p.maxLen {
		d.errAt(at(n, f), "minLength %d exceeds maxLength %d", p.minLen, p.maxLen)
	}
	if p.min > p.max {
		d.errAt(at(n, f), "minimum %d exceeds maximum %d", p.min, p.max)
	}
	return p
}

// render writes the schema as canonical JSON (keys sorted) and the usage line.
func (s *argSchema) render() ([]byte, string) {
	b := []byte(`{"additionalProperties":false,"properties":{`)
	var usage []string
	// The properties' keys sorted, as every object of canonical JSON; the usage line
	// keeps the file's order.
	sorted := slices.Clone(s.props)
	slices.SortFunc(sorted, func(x, y argProp) int { return cmpString(x.name, y.name) })
	for i, p := range sorted {
		if i > 0 {
			b = append(b, ',')
		}
		b = canonjson.AppendString(b, p.name)
		b = append(b, ":{"...)
		var parts [][]byte
		if p.desc != "" {
			parts = append(parts, canonjson.AppendString([]byte(`"description":`), p.desc))
		}
		switch p.kind {
		case kString:
			if len(p.enum) > 0 {
				e := []byte(`"enum":[`)
				for j, v := range p.enum {
					if j > 0 {
						e = append(e, ',')
					}
					e = canonjson.AppendString(e, v)
				}
				parts = append(parts, append(e, ']'))
			}
			parts = append(parts, strconv.AppendInt([]byte(`"maxLength":`), int64(p.maxLen), 10))
			if p.minLen > 0 {
				parts = append(parts, strconv.AppendInt([]byte(`"minLength":`), int64(p.minLen), 10))
			}
			parts = append(parts, []byte(`"type":"string"`))
		case kInt:
			if p.max != math.MaxInt64 {
				parts = append(parts, strconv.AppendInt([]byte(`"maximum":`), p.max, 10))
			}
			if p.min != math.MinInt64 {
				parts = append(parts, strconv.AppendInt([]byte(`"minimum":`), p.min, 10))
			}
			parts = append(parts, []byte(`"type":"integer"`))
		case kBool:
			parts = append(parts, []byte(`"type":"boolean"`))
		}
		b = append(b, bytes.Join(parts, []byte(","))...)
		b = append(b, '}')
	}
	b = append(b, '}')
	// The usage line is the Go envs' (the shop's usageOf): name: type, an integer's
	// range when it has both bounds.
	for _, p := range s.props {
		t := map[kind]string{kString: "string", kInt: "integer", kBool: "boolean"}[p.kind]
		if p.kind == kInt && p.min != math.MinInt64 && p.max != math.MaxInt64 {
			t = fmt.Sprintf("integer %d..%d", p.min, p.max)
		}
		usage = append(usage, p.name+": "+t)
	}
	if len(s.required) > 0 {
		req := slices.Clone(s.required)
		b = append(b, `,"required":[`...)
		for i, r := range req {
			if i > 0 {
				b = append(b, ',')
			}
			b = canonjson.AppendString(b, r)
		}
		b = append(b, ']')
	}
	b = append(b, `,"type":"object"}`...)
	return b, "{" + strings.Join(usage, ", ") + "}"
}

// parseInto decodes an action's args against the schema; its error lists every problem,
// each naming the argument, in a deterministic order. Optional arguments not given hold
// their type's zero value.
//
// The flat shape is read into dst, when not nil: an object of the arguments' type,
// reused from step to step (no expression keeps the arguments).
func (s *argSchema) parseInto(raw json.RawMessage, dst *object) (*object, error) {
	if len(raw) > env.MaxArgsBytes {
		return nil, fmt.Errorf("args: %d bytes exceeds the limit of %d", len(raw), env.MaxArgsBytes)
	}
	if dst == nil {
		dst = newObject(s.otype)
	} else {
		clear(dst.vals)
		clear(dst.memo)
	}
	if o, ok := s.parseFlatInto(raw, dst); ok {
		return o, nil
	}
	return s.parseJSON(raw)
}

// parseJSON is parse through encoding/json: every shape of arguments, and every error,
// worded as the Go envs word them (the shop's parseArgs), so a Go env written as a world
// answers a bad call with the same bytes.
func (s *argSchema) parseJSON(raw json.RawMessage) (*object, error) {
	raw = bytes.TrimSpace(raw)
	var m map[string]json.RawMessage
	if len(raw) > 0 && string(raw) != "null" {
		if raw[0] != '{' {
			if !json.Valid(raw) {
				return nil, errors.New("args: malformed JSON")
			}
			return nil, fmt.Errorf("args: want object, got %s", env.JSONKind(raw))
		}
		if err := json.Unmarshal(raw, &m); err != nil {
			return nil, fmt.Errorf("args: malformed JSON: %w", err)
		}
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var errs []error
	for _, k := range keys {
		if s.prop(k) == nil {
			errs = append(errs, fmt.Errorf("args.%s: unknown field (%s)", echo(k), s.call))
		}
	}
	out := newObject(s.otype)
	for i := range s.props {
		p := &s.props[i]
		v, ok := m[p.name]
		if !ok {
			if p.required {
				errs = append(errs, fmt.Errorf("args.%s: required", p.name))
			}
			out.vals[i] = p.kind.zero()
			continue
		}
		val, err := p.decode(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("args.%s: %w", p.name, err))
			continue
		}
		out.vals[i] = celValue(val)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// parseFlat is parse's hot path: the arguments nearly every action has, an object of
// known keys, each once, whose values are plain strings (printable ASCII without escapes),
// integers written as digits, or booleans, all valid, every required one given. It reads
// them without encoding/json's reflection and maps; anything else (ok false) is left to
// parse, which also words every error.
func (s *argSchema) parseFlat(raw []byte) (*object, bool) {
	return s.parseFlatInto(raw, newObject(s.otype))
}

func (s *argSchema) parseFlatInto(raw []byte, out *object) (*object, bool) {
	i := skipWS(raw, 0)
	if i >= len(raw) || raw[i] != '{' {
		return nil, false
	}
	i = skipWS(raw, i+1)
	if i < len(raw) && raw[i] == '}' {
		i++
	} else {
		for {
			key, j, ok := plainBytes(raw, i)
			if !ok {
				return nil, false
			}
			k := -1
			for n := range s.props {
				if s.props[n].name == string(key) {
					k = n
					break
				}
			}
			if k < 0 || out.vals[k] != nil {
				return nil, false
			}
			if j = skipWS(raw, j); j >= len(raw) || raw[j] != ':' {
				return nil, false
			}
			j = skipWS(raw, j+1)
			p := &s.props[k]
			switch p.kind {
			case kString:
				v, end, ok := plainString(raw, j)
				if !ok || len(v) > p.maxLen || len(v) < p.minLen || len(p.enum) > 0 && !slices.Contains(p.enum, v) {
					return nil, false
				}
				out.vals[k], j = types.String(v), end
			case kInt:
				end := j
				if end < len(raw) && raw[end] == '-' {
					end++
				}
				if end+1 < len(raw) && raw[end] == '0' && raw[end+1] >= '0' && raw[end+1] <= '9' {
					return nil, false // a leading zero is not JSON
				}
				for end < len(raw) && raw[end] >= '0' && raw[end] <= '9' {
					end++
				}
				n, err := strconv.ParseInt(string(raw[j:end]), 10, 64)
				if err != nil || n < p.min || n > p.max || end < len(raw) && (raw[end] == '.' || raw[end] == 'e' || raw[end] == 'E') {
					return nil, false
				}
				out.vals[k], j = types.Int(n), end
			case kBool:
				switch {
				case bytes.HasPrefix(raw[j:], []byte("true")):
					out.vals[k], j = types.True, j+4
				case bytes.HasPrefix(raw[j:], []byte("false")):
					out.vals[k], j = types.False, j+5
				default:
					return nil, false
				}
			}
			if j = skipWS(raw, j); j >= len(raw) {
				return nil, false
			}
			if raw[j] == '}' {
				i = j + 1
				break
			}
			if raw[j] != ',' {
				return nil, false
			}
			i = skipWS(raw, j+1)
		}
	}
	if skipWS(raw, i) != len(raw) {
		return nil, false
	}
	for k := range s.props {
		if out.vals[k] == nil {
			if s.props[k].required {
				return nil, false
			}
			out.vals[k] = s.props[k].kind.zero()
		}
	}
	return out, true
}

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// plainString reads a JSON string at b[i] made of printable ASCII without escapes, and
// returns it and the index after its closing quote.
func plainString(b []byte, i int) (string, int, bool) {
	s, j, ok := plainBytes(b, i)
	return string(s), j, ok
}

// plainBytes is plainString's bytes, in b.
func plainBytes(b []byte, i int) ([]byte, int, bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, 0, false
	}
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return b[i+1 : j], j + 1, true
		case c == '\\' || c < 0x20 || c > 0x7e:
			return nil, 0, false
		}
	}
	return nil, 0, false
}

func (p *argProp) decode(raw json.RawMessage) (any, error) {
	raw = bytes.TrimSpace(raw)
	switch p.kind {
	case kString:
		if len(raw) == 0 || raw[0] != '"' {
			return nil, fmt.Errorf("want string, got %s", env.JSONKind(raw))
		}
		var v string
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, err
		}
		if len(v) > p.maxLen {
			return nil, fmt.Errorf("%d bytes exceeds the limit of %d", len(v), p.maxLen)
		}
		if utf8.RuneCountInString(v) < p.minLen {
			return nil, fmt.Errorf("shorter than %d characters", p.minLen)
		}
		if len(p.enum) > 0 && !slices.Contains(p.enum, v) {
			return nil, fmt.Errorf("%q is not one of %s", echo(v), strings.Join(p.enum, ", "))
		}
		return v, nil
	case kBool:
		switch string(raw) {
		case "true":
			return true, nil
		case "false":
			return false, nil
		}
		return nil, fmt.Errorf("want true or false, got %s", env.JSONKind(raw))
	}
	// The shop's parseInt, word for word.
	if k := env.JSONKind(raw); k != "number" {
		return nil, fmt.Errorf("want integer, got %s", k)
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		// Integral numbers written with a fraction or exponent (2.0, 1e2) are integers,
		// as in JSON Schema.
		f, ferr := strconv.ParseFloat(string(raw), 64)
		switch {
		case ferr != nil && !errors.Is(ferr, strconv.ErrRange):
			return nil, fmt.Errorf("want integer, got %s", echo(string(raw)))
		case f != math.Trunc(f) || math.IsInf(f, 0):
			return nil, fmt.Errorf("want integer, got number %s", echo(string(raw)))
		case f < float64(p.min) || f > float64(p.max):
			return nil, fmt.Errorf("%s is outside [%d,%d]", echo(string(raw)), p.min, p.max)
		}
		n = int64(f)
	}
	if n < p.min || n > p.max {
		return nil, fmt.Errorf("%d is outside [%d,%d]", n, p.min, p.max)
	}
	return n, nil
}

// template is a text with ${expr} parts, each a CEL expression whose value is written in.
type template struct {
	parts []string   // literal text, len(exprs)+1 parts
	exprs []*program // between the parts
}

func (c *compiler) template(envc *cel.Env, n *yaml.Node, f string) template {
	var t template
	s, ok := c.d.text(n, f)
	if !ok {
		return t
	}
	for {
		i := strings.Index(s, "${")
		if i < 0 {
			t.parts = append(t.parts, s)
			return t
		}
		j := closingBrace(s[i+2:])
		if j < 0 {
			c.d.errAt(at(n, f), "unclosed ${ in template")
			t.parts = append(t.parts, s)
			return t
		}
		t.parts = append(t.parts, s[:i])
		src := s[i+2 : i+2+j]
		expr := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: src, Line: n.Line, Column: n.Column}
		t.exprs = append(t.exprs, c.compile(envc, expr, f, nil))
		s = s[i+2+j+1:]
	}
}

// closingBrace finds the } that ends a template's expression: braces of map literals
// nest, and quoted strings (with their escapes) are skipped. -1: none.
func closingBrace(s string) int {
	depth := 0
	var quote byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0:
			if c == '\\' {
				i++
			} else if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '{':
			depth++
		case c == '}':
			if depth == 0 {
				return i
			}
			depth--
		}
	}
	return -1
}

func (t template) empty() bool { return len(t.parts) == 0 }
