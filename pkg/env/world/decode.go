package world

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// ErrInvalid is wrapped by every error Load returns for a world file that does not
// validate; errors.Join holds one error per problem, each naming file, line and field.
var ErrInvalid = errors.New("invalid world")

// place is where a value sits in the file.
type place struct {
	line, col int
	field     string
}

// decoder walks a YAML document by hand, so that every unknown key, wrong type and bad
// value is reported, all of them at once, with its line and field path.
type decoder struct {
	file string
	errs []error
}

// LoadError is one problem of a world file.
type LoadError struct {
	File      string
	Line, Col int
	// Field is the path of the offending value, e.g. "tools[2].preconditions[0].when".
	Field string
	Msg   string
}

// Error is "file:line:col: field: message", the form editors jump to.
func (e *LoadError) Error() string {
	f := e.Field
	if f == "" {
		f = "(document)"
	}
	return fmt.Sprintf("%s:%d:%d: %s: %s", e.File, e.Line, e.Col, f, e.Msg)
}

// Unwrap makes every LoadError an ErrInvalid.
func (e *LoadError) Unwrap() error { return ErrInvalid }

func (d *decoder) errAt(p place, format string, args ...any) {
	d.errs = append(d.errs, &LoadError{File: d.file, Line: p.line, Col: p.col, Field: p.field, Msg: fmt.Sprintf(format, args...)})
}

func at(n *yaml.Node, field string) place {
	return place{line: max(n.Line, 1), col: max(n.Column, 1), field: field}
}

func sub(field, key string) string {
	if field == "" {
		return key
	}
	return field + "." + key
}

func idx(field string, i int) string { return field + "[" + strconv.Itoa(i) + "]" }

// parseDoc parses data into its single document node.
func (d *decoder) parseDoc(data []byte) *yaml.Node {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			d.errAt(place{line: 1, col: 1}, "empty file: want a world (a mapping with name, services, tools, ...)")
			return nil
		}
		line := 1
		// yaml.v3 reports "yaml: line N: ..."; keep the line.
		if _, rest, ok := strings.Cut(err.Error(), "line "); ok {
			if n, _, ok := strings.Cut(rest, ":"); ok {
				if v, err := strconv.Atoi(n); err == nil {
					line = v
				}
			}
		}
		d.errAt(place{line: line, col: 1}, "malformed YAML: %v", err)
		return nil
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		d.errAt(at(&extra, ""), "a world file holds one YAML document; found another")
	}
	n := &doc
	if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		n = n.Content[0]
	}
	if size := expandedSize(n, map[*yaml.Node]int{}, 0); size > maxExpandedNodes {
		d.errAt(at(n, ""), "the document expands to more than %d nodes through its aliases", maxExpandedNodes)
		return nil
	}
	return n
}

// maxExpandedNodes bounds a world with its aliases expanded: aliases of aliases grow
// exponentially, and every expanded node is checked (and every expression compiled).
const maxExpandedNodes = 100_000

// expandedSize counts n's nodes with aliases expanded, memoised per node so the count
// itself stays linear; it stops counting past the bound.
func expandedSize(n *yaml.Node, memo map[*yaml.Node]int, depth int) int {
	if n == nil {
		return 0
	}
	if v, ok := memo[n]; ok {
		return v
	}
	if depth > 1000 {
		return maxExpandedNodes + 1
	}
	size := 1
	if n.Kind == yaml.AliasNode {
		size = expandedSize(n.Alias, memo, depth+1)
	} else {
		for _, c := range n.Content {
			size += expandedSize(c, memo, depth+1)
			if size > maxExpandedNodes {
				break
			}
		}
	}
	size = min(size, maxExpandedNodes+1)
	memo[n] = size
	return size
}

// resolve follows aliases; a world is plain data, so anchors and aliases are allowed but
// merged keys are not.
func resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

// member is one key of a mapping, in file order.
type member struct {
	key string
	k   *yaml.Node
	v   *yaml.Node
}

// mapping returns n's members in file order, reporting a non-mapping, duplicate keys and
// keys not in known (known nil: any key).
func (d *decoder) mapping(n *yaml.Node, field string, known ...string) []member {
	n = resolve(n)
	if n == nil {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		d.errAt(at(n, field), "want a mapping, got %s", kindName(n))
		return nil
	}
	var out []member
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], resolve(n.Content[i+1])
		if k.Kind != yaml.ScalarNode {
			d.errAt(at(k, field), "keys must be plain strings")
			continue
		}
		if k.Value == "<<" {
			d.errAt(at(k, field), "merge keys (<<) are not supported")
			continue
		}
		if slices.ContainsFunc(out, func(m member) bool { return m.key == k.Value }) {
			d.errAt(at(k, sub(field, k.Value)), "duplicate key")
			continue
		}
		if known != nil && !slices.Contains(known, k.Value) {
			d.errAt(at(k, sub(field, k.Value)), "unknown key (known: %s)", strings.Join(known, ", "))
			continue
		}
		out = append(out, member{key: k.Value, k: k, v: v})
	}
	return out
}

func (d *decoder) sequence(n *yaml.Node, field string) []*yaml.Node {
	n = resolve(n)
	if n == nil {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		d.errAt(at(n, field), "want a list, got %s", kindName(n))
		return nil
	}
	out := make([]*yaml.Node, len(n.Content))
	for i, c := range n.Content {
		out[i] = resolve(c)
	}
	return out
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "null"
		}
		return fmt.Sprintf("%q", clip(n.Value))
	}
	return "another kind of node"
}

// scalar returns n's value if it is a scalar (not null).
func (d *decoder) scalar(n *yaml.Node, field string) (string, bool) {
	n = resolve(n)
	if n == nil || n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		if n != nil {
			d.errAt(at(n, field), "want a value, got %s", kindName(n))
		}
		return "", false
	}
	return n.Value, true
}

// text returns a string scalar; numbers and booleans written unquoted are refused where
// text is wanted only if they are not strings in YAML's sense.
func (d *decoder) text(n *yaml.Node, field string) (string, bool) {
	s, ok := d.scalar(n, field)
	if !ok {
		return "", false
	}
	if n.Tag != "!!str" {
		d.errAt(at(n, field), "want a string, got %s (quote it)", n.Tag[2:])
		return "", false
	}
	return s, true
}

func (d *decoder) integer(n *yaml.Node, field string, lo, hi int64) (int64, bool) {
	s, ok := d.scalar(n, field)
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n.Tag != "!!int" {
		d.errAt(at(n, field), "want an integer, got %q", clip(s))
		return 0, false
	}
	if v < lo || v > hi {
		d.errAt(at(n, field), "%d is out of range [%d, %d]", v, lo, hi)
		return 0, false
	}
	return v, true
}

func (d *decoder) number(n *yaml.Node, field string, lo, hi float64) (float64, bool) {
	s, ok := d.scalar(n, field)
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || (n.Tag != "!!int" && n.Tag != "!!float") {
		d.errAt(at(n, field), "want a number, got %q", clip(s))
		return 0, false
	}
	if !(v >= lo && v <= hi) {
		d.errAt(at(n, field), "%v is out of range [%v, %v]", v, lo, hi)
		return 0, false
	}
	return v, true
}

func (d *decoder) boolean(n *yaml.Node, field string) (bool, bool) {
	s, ok := d.scalar(n, field)
	if !ok {
		return false, false
	}
	if n.Tag != "!!bool" {
		d.errAt(at(n, field), "want true or false, got %q", clip(s))
		return false, false
	}
	return s == "true", true
}

// name checks an identifier: a letter, then letters, digits and underscores (CEL's
// identifiers), or, with dots, a tool name such as "transfer.create".
func (d *decoder) name(n *yaml.Node, field string, dots bool) (string, bool) {
	s, ok := d.text(n, field)
	if !ok {
		return "", false
	}
	if !validName(s, dots) {
		what := "a letter, then letters, digits or _"
		if dots {
			what += ", parts joined by ."
		}
		d.errAt(at(n, field), "bad name %q: want %s (at most 64 bytes)", clip(s), what)
		return "", false
	}
	return s, true
}

func validName(s string, dots bool) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	parts := []string{s}
	if dots {
		parts = strings.Split(s, ".")
	}
	for _, p := range parts {
		if p == "" {
			return false
		}
		for i, c := range p {
			letter := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
			if !(letter || c == '_' || i > 0 && c >= '0' && c <= '9') {
				return false
			}
		}
	}
	return !celReserved[s]
}

// celReserved are CEL's reserved words and the names the runtime declares itself.
var celReserved = map[string]bool{
	"true": true, "false": true, "null": true, "in": true, "as": true, "break": true,
	"const": true, "continue": true, "else": true, "for": true, "function": true, "if": true,
	"import": true, "let": true, "loop": true, "package": true, "namespace": true,
	"return": true, "var": true, "void": true, "while": true,
	"args": true, "now_ms": true, "step": true, "new_id": true, "task": true, "results": true,
	"i": true, "id": true, "self": true, "int": true, "string": true, "bool": true, "double": true,
	"list": true, "map": true, "type": true, "dyn": true, "bytes": true, "uint": true,
}

func clip(s string) string {
	const n = 64
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
