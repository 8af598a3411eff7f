package world

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"cel.dev/cel-go/common/types/ref"
	"gopkg.in/yaml.v3"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
)

// Params. A world may declare params: values an episode's request sets (a run's
// --params, a curriculum stage's params, an env API session's), each with its type,
// default, bounds and description, read by the world's expressions like any variable.
// A param holds the first positions of the world's variables, so every expression, the
// compiled closures included, reads it where it reads a variable; no tool sets one. The
// request's params are recorded with the episode and the defaults and bounds are part of
// the file (its digest), so a replay builds the same world.

// paramDef is one declared param: its name, its schema (argProp: the same checks as a
// tool's argument), its default and description.
type paramDef struct {
	prop argProp
	def  ref.Val
	at   place
}

// builtinParams are the params every world has (limits the request may change).
var builtinParams = []string{"deadline_ms", "max_invalid"}

// paramKeys are what a param declares.
var paramKeys = []string{"type", "default", "min", "max", "max_length", "one_of", "description"}

// reservedParamNames are the names expressions already read (and the built-in params):
// a param may not shadow one.
var reservedParamNames = []string{"deadline_ms", "max_invalid", "now_ms", "step", "args", "new_id", "i", "id", "self"}

// declareParams reads the params mapping; each param becomes a variable (draw.param
// set) in front of the file's own variables.
func (c *compiler) declareParams(n *yaml.Node) {
	if n == nil {
		return
	}
	d, w := c.d, c.w
	for _, m := range d.mapping(n, "params") {
		f := sub("params", m.key)
		if !validName(m.key, false) || slices.Contains(reservedParamNames, m.key) {
			d.errAt(at(m.k, f), "bad name %q: want a letter, then letters, digits or _, not a reserved word nor one of %s", clip(m.key), strings.Join(reservedParamNames, ", "))
			continue
		}
		if c.taken(m.key) {
			d.errAt(at(m.k, f), "name %q is already declared", m.key)
			continue
		}
		// A param whose type is known is declared even when the rest of it is wrong, so
		// that the expressions reading it are checked too (and not reported as
		// reading an undeclared name); its problems fail the load anyway.
		p, ok := c.param(m.key, m.v, f)
		if p.prop.kind == 0 {
			continue
		}
		if !ok {
			p.def = p.prop.kind.zero()
		}
		w.params = append(w.params, p)
		w.vars = append(w.vars, varDef{name: m.key, desc: p.prop.desc, path: m.key, draw: draw{kind: p.prop.kind, param: len(w.params)}})
	}
}

// param reads one param's declaration, every problem reported with its field.
func (c *compiler) param(name string, n *yaml.Node, f string) (paramDef, bool) {
	d := c.d
	p := paramDef{prop: argProp{name: name}, at: at(n, f)}
	errs := len(d.errs)
	ms := d.mapping(n, f, paramKeys...)
	get := func(k string) *yaml.Node {
		for _, m := range ms {
			if m.key == k {
				return m.v
			}
		}
		return nil
	}
	if rn := resolve(n); rn == nil || rn.Kind != yaml.MappingNode {
		return p, false
	}
	tn := get("type")
	if tn == nil {
		d.errAt(at(n, sub(f, "type")), "required: int, bool or string")
		return p, false
	}
	s, ok := d.text(tn, sub(f, "type"))
	if !ok {
		return p, false
	}
	switch s {
	case "int":
		p.prop.kind = kInt
	case "bool":
		p.prop.kind = kBool
	case "string":
		p.prop.kind = kString
	default:
		d.errAt(at(tn, sub(f, "type")), "unknown type %q (known: bool, int, string)", clip(s))
		return p, false
	}
	if dn := get("description"); dn == nil {
		d.errAt(at(n, sub(f, "description")), "required: what the param changes, for whoever sets it")
	} else {
		p.prop.desc, _ = d.text(dn, sub(f, "description"))
	}
	only := func(k, kinds string) {
		if v := get(k); v != nil {
			d.errAt(at(v, sub(f, k)), "%s is for a param of type %s", k, kinds)
		}
	}
	switch p.prop.kind {
	case kInt:
		only("max_length", "string")
		only("one_of", "string")
		lo, hi := get("min"), get("max")
		if lo == nil || hi == nil {
			d.errAt(at(n, sub(f, "min")), "required: min and max, the bounds a request is held to")
			break
		}
		p.prop.min, _ = d.integer(lo, sub(f, "min"), -1<<53, 1<<53)
		p.prop.max, _ = d.integer(hi, sub(f, "max"), -1<<53, 1<<53)
		if p.prop.max < p.prop.min {
			d.errAt(at(hi, sub(f, "max")), "max %d is below min %d", p.prop.max, p.prop.min)
		}
	case kString:
		only("min", "int")
		only("max", "int")
		p.prop.maxLen = 256
		if v := get("max_length"); v != nil {
			n, _ := d.integer(v, sub(f, "max_length"), 1, maxStateString)
			p.prop.maxLen = int(n)
		}
		if v := get("one_of"); v != nil {
			for i, it := range d.sequence(v, sub(f, "one_of")) {
				s, ok := d.text(it, idx(sub(f, "one_of"), i))
				if !ok {
					continue
				}
				if slices.Contains(p.prop.enum, s) {
					d.errAt(at(it, idx(sub(f, "one_of"), i)), "duplicate value %q", clip(s))
				}
				p.prop.enum = append(p.prop.enum, s)
				p.prop.maxLen = max(p.prop.maxLen, len(s))
			}
			if len(p.prop.enum) == 0 {
				d.errAt(at(v, sub(f, "one_of")), "want a non-empty list of strings")
			}
		}
	case kBool:
		only("min", "int")
		only("max", "int")
		only("max_length", "string")
		only("one_of", "string")
	}
	dn := get("default")
	if dn == nil {
		d.errAt(at(n, sub(f, "default")), "required: the value when a request does not set it")
		return p, false
	}
	if len(d.errs) > errs {
		return p, false
	}
	raw, err := json.Marshal(yamlScalar(dn))
	if err == nil {
		var v any
		if v, err = p.prop.decode(raw); err == nil {
			p.def = celValue(v)
		}
	}
	if err != nil {
		d.errAt(at(dn, sub(f, "default")), "%v", err)
		return p, false
	}
	return p, true
}

// yamlScalar is a default's YAML scalar as the JSON value a request would send: an
// integer or a boolean by its YAML tag, anything else a string.
func yamlScalar(n *yaml.Node) any {
	rn := resolve(n)
	if rn == nil || rn.Kind != yaml.ScalarNode {
		return nil
	}
	switch rn.ShortTag() {
	case "!!int":
		if v, err := strconv.ParseInt(rn.Value, 0, 64); err == nil {
			return v
		}
	case "!!bool":
		return rn.Value == "true"
	case "!!float":
		return json.Number(rn.Value)
	}
	return rn.Value
}

// specParam describes a param for the env's spec, its bounds in the description as the
// Go envs write them.
func (p *paramDef) specParam() (name, typ, def, desc string) {
	desc = p.prop.desc
	switch p.prop.kind {
	case kInt:
		desc = fmt.Sprintf("%s (%d..%d)", desc, p.prop.min, p.prop.max)
	case kString:
		if len(p.prop.enum) > 0 {
			desc = fmt.Sprintf("%s (one of %s)", desc, strings.Join(p.prop.enum, ", "))
		}
	}
	switch v := p.def.Value().(type) {
	case int64:
		def = strconv.FormatInt(v, 10)
	case bool:
		def = strconv.FormatBool(v)
	case string:
		def = v
	}
	return p.prop.name, p.prop.kind.String(), def, desc
}

// episodeParams are the values of one episode's params and limits, from its request.
type episodeParams struct {
	vals                 []ref.Val // by position in World.params; nil: the defaults
	deadline, maxInvalid int64
}

// parseParams decodes the request's params object strictly (env.DecodeParams) and reports
// every problem at once, each naming its field: the world's own params, deadline_ms and
// max_invalid.
func (w *World) parseParams(raw json.RawMessage) (episodeParams, error) {
	out := episodeParams{deadline: w.deadlineMs, maxInvalid: w.maxInvalid}
	err := env.DecodeParams(raw, func(k string, v json.RawMessage) error {
		var p *argProp
		var set func(any)
		switch k {
		case "deadline_ms":
			p, set = &argProp{kind: kInt, min: 100, max: 86_400_000}, func(v any) { out.deadline = v.(int64) }
		case "max_invalid":
			p, set = &argProp{kind: kInt, min: 1, max: 1000}, func(v any) { out.maxInvalid = v.(int64) }
		default:
			i := slices.IndexFunc(w.params, func(p paramDef) bool { return p.prop.name == k })
			if i < 0 {
				return env.ErrUnknownParam
			}
			p, set = &w.params[i].prop, func(v any) {
				if out.vals == nil { // the defaults until a request sets one
					out.vals = make([]ref.Val, len(w.params))
					for j := range w.params {
						out.vals[j] = w.params[j].def
					}
				}
				out.vals[i] = celValue(v)
			}
		}
		d, err := p.decode(v)
		if err != nil {
			return err
		}
		set(d)
		return nil
	}, w.paramNames)
	return out, err
}

// paramNames lists the params a request may set, sorted.
func (w *World) paramNames() []string {
	names := slices.Clone(builtinParams)
	for _, p := range w.params {
		names = append(names, p.prop.name)
	}
	slices.Sort(names)
	return names
}
