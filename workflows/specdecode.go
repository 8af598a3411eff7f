package workflows

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Limits on how a spec and its errors are sized.
const (
	// MaxSpecBytes bounds a spec: the file `curriculum validate` and `start` read, and the
	// JSON the workflow takes as input (well under Temporal's 2 MiB payload limit, so a
	// spec that validates is never refused by the server).
	MaxSpecBytes = 1 << 20
	// MaxNameBytes bounds the curriculum's and each stage's name: the default workflow
	// id and every batch's label carry them.
	MaxNameBytes = 200
	// maxQuoted bounds how much of a user's value an error message quotes.
	maxQuoted = 64
	// maxErrorLines bounds how many problems one error lists.
	maxErrorLines = 50
)

// ErrSpecTooLarge is the error of a spec over MaxSpecBytes.
var ErrSpecTooLarge = fmt.Errorf("curriculum spec: larger than the %d KiB limit", MaxSpecBytes>>10)

// FieldError is one problem of a spec, named as the user wrote it: the key path
// ("stages[1].drift[0].to") and, for YAML read by LoadSpec, the line of the key.
type FieldError struct {
	Path string
	Line int
	Msg  string
}

// Error is "line 7: stages[1].drift[0].to: must be a finite number" (parts left out
// when unknown).
func (e *FieldError) Error() string {
	var b strings.Builder
	if e.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// quote quotes a user's value for an error message, cut to maxQuoted bytes so an error
// never echoes a large input back.
func quote(s string) string {
	if len(s) <= maxQuoted {
		return strconv.Quote(s)
	}
	cut := maxQuoted
	for cut > 0 && !isRuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes)", strconv.Quote(s[:cut]), len(s))
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }

// decodeInput reads a workflow's input (what names the workflow in errors) from JSON,
// refusing unknown keys and anything after the value: a misspelt key would otherwise be
// dropped without a word, and the workflow run with the field's default. Inputs over
// MaxSpecBytes are refused.
func decodeInput[T any](what string, b []byte) (T, error) {
	var v T
	if len(b) > MaxSpecBytes {
		return v, fmt.Errorf("%s: input larger than the %d KiB limit", what, MaxSpecBytes>>10)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return v, fmt.Errorf("%s: %s", what, boundMessage(err.Error()))
	}
	if dec.More() {
		return v, fmt.Errorf("%s: more than one JSON value", what)
	}
	return v, nil
}

// boundMessage cuts one error message to a readable size: messages of other packages
// (env, policy, fault checks) may quote the user's value in full.
func boundMessage(s string) string {
	const max = 4 * maxQuoted
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !isRuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes cut)", s[:cut], len(s)-cut)
}

// specDecoder fills a CurriculumSpec from a YAML node tree, key by key, so that every
// problem (unknown keys, wrong types, negative counts) is reported at once with the path
// and line of the key the user wrote, and records each key's line for the checks that
// come after decoding.
type specDecoder struct {
	errs  []*FieldError
	lines map[string]int
}

func (d *specDecoder) fail(path string, line int, format string, a ...any) {
	d.errs = append(d.errs, &FieldError{Path: path, Line: line, Msg: fmt.Sprintf(format, a...)})
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// decode fills v (addressable) from n; path names v, line is the line of its key.
func (d *specDecoder) decode(path string, line int, n *yaml.Node, v reflect.Value) {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return // an empty value leaves the default
	}
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		d.decode(path, line, n, v.Elem())
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			d.fail(path, line, "want a mapping of keys, got %s", describe(n))
			return
		}
		t := v.Type()
		fields := map[string]int{}
		var known []string
		for i := 0; i < t.NumField(); i++ {
			name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
			if name != "" && name != "-" {
				fields[name] = i
				known = append(known, name)
			}
		}
		sort.Strings(known)
		seen := map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			fi, ok := fields[k.Value]
			if !ok {
				where := ""
				if path != "" {
					where = " in " + path
				}
				d.fail("", k.Line, "unknown key %s%s (known: %s)", quote(k.Value), where, strings.Join(known, ", "))
				continue
			}
			p := join(path, k.Value)
			if seen[k.Value] {
				d.fail(p, k.Line, "listed twice")
				continue
			}
			seen[k.Value] = true
			d.lines[p] = k.Line
			d.decode(p, k.Line, val, v.Field(fi))
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			d.fail(path, line, "want a list, got %s", describe(n))
			return
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, item := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			d.lines[p] = item.Line
			d.decode(p, item.Line, item, s.Index(i))
		}
		v.Set(s)
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			d.fail(path, line, "want a mapping, got %s", describe(n))
			return
		}
		if err := n.Decode(v.Addr().Interface()); err != nil {
			d.fail(path, line, "%s", boundMessage(yamlMessage(err)))
		}
	case reflect.String:
		if n.Kind != yaml.ScalarNode {
			d.fail(path, line, "want a string, got %s", describe(n))
			return
		}
		v.SetString(n.Value)
	case reflect.Uint32, reflect.Uint64:
		if n.Kind != yaml.ScalarNode {
			d.fail(path, line, "want a whole number, got %s", describe(n))
			return
		}
		var i int64
		if n.Tag == "!!int" && n.Decode(&i) == nil && i < 0 {
			d.fail(path, line, "must not be negative, got %d", i)
			return
		}
		u, err := strconv.ParseUint(n.Value, 0, v.Type().Bits())
		if n.Tag != "!!int" || err != nil {
			if n.Tag == "!!int" {
				d.fail(path, line, "%s is too large (at most %d)", quote(n.Value), uint64(1)<<v.Type().Bits()-1)
			} else {
				d.fail(path, line, "want a whole number, got %s", describe(n))
			}
			return
		}
		v.SetUint(u)
	case reflect.Float64:
		var f float64
		if n.Kind != yaml.ScalarNode || (n.Tag != "!!int" && n.Tag != "!!float") || n.Decode(&f) != nil {
			d.fail(path, line, "want a number, got %s", describe(n))
			return
		}
		v.SetFloat(f)
	case reflect.Bool:
		var b bool
		if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" || n.Decode(&b) != nil {
			d.fail(path, line, "want true or false, got %s", describe(n))
			return
		}
		v.SetBool(b)
	default:
		d.fail(path, line, "cannot be read (type %s)", v.Type())
	}
}

// describe names what a node holds, quoting at most a little of it.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return quote(n.Value)
}

// decodeSpec reads a spec from YAML (JSON is YAML too) into s. It returns the problems
// found while decoding and the line of every key it read.
func decodeSpec(data []byte, s *CurriculumSpec) ([]*FieldError, map[string]int, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, nil, fmt.Errorf("curriculum spec: %s", boundMessage(err.Error()))
	}
	if root.Kind == 0 || (root.Kind == yaml.DocumentNode && len(root.Content) == 0) {
		return nil, nil, errors.New("curriculum spec: empty document")
	}
	doc := &root
	if doc.Kind == yaml.DocumentNode {
		doc = doc.Content[0]
	}
	d := &specDecoder{lines: map[string]int{}}
	d.decode("", doc.Line, doc, reflect.ValueOf(s).Elem())
	return d.errs, d.lines, nil
}

// joinFieldErrors joins problems into one error, at most maxErrorLines of them, each
// message bounded.
func joinFieldErrors(fe []*FieldError) error {
	if len(fe) == 0 {
		return nil
	}
	errs := make([]error, 0, min(len(fe), maxErrorLines)+1)
	for i, e := range fe {
		if i == maxErrorLines {
			errs = append(errs, fmt.Errorf("... and %d more problems", len(fe)-maxErrorLines))
			break
		}
		e.Msg = boundMessage(e.Msg)
		errs = append(errs, e)
	}
	return errors.Join(errs...)
}

// finite reports whether f is a usable number.
func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }
