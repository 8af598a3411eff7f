package world

import (
	"maps"
	"slices"
	"strconv"
	"unicode/utf8"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/cost"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/common/types/traits"
)

// decodeAnswer decodes an observation object for the plan's expressions: the same
// values decodeObs gives (integers as int, other numbers as double), made CEL values
// once here, with objects as CEL maps and arrays as CEL lists, so that an expression
// reading them does not adapt (and allocate) a value again at each access. Every
// object, the top level too, is a record: a key is found among a handful of strings,
// not hashed and its value adapted at each read (task.qty, results.search). Plain JSON (no escapes, no
// bytes outside ASCII, no deep nesting) is read here; anything else goes through
// encoding/json exactly as decodeObs reads it, then converted: the two agree on every
// input (TestDecodeAnswerAgreesWithDecodeObs).
//
// size is the size of its largest value, as planSizes counts it (the object itself and
// its keys included).
//
// The answer is made one string, and every key and string value read from it is a
// part of that string: one allocation an answer, not one a string (the oracle keeps
// the answers it reads for the episode, and with them the string).
func decodeAnswer(raw []byte, a types.Adapter) (m *record, size uint64, ok bool) {
	return decodeAnswerWith(raw, a, nil)
}

// decodeAnswerWith is decodeAnswer with the room for the values being read (scratch's,
// nil for new): the oracle keeps it from one answer to the next.
func decodeAnswerWith(raw []byte, a types.Adapter, scratch *[]ref.Val) (m *record, size uint64, ok bool) {
	d := answerDecoder{b: string(raw), a: a}
	if scratch != nil {
		d.stack = (*scratch)[:0]
		defer func() { *scratch = d.stack[:0] }()
	}
	d.ws()
	if m, ok := d.object(0); ok {
		return m, d.max, true
	}
	obj, ok := decodeObs(raw)
	if !ok {
		return nil, 0, false
	}
	names := slices.Sorted(maps.Keys(obj))
	vals := make([]ref.Val, len(names))
	for i, k := range names {
		vals[i] = toVal(obj[k], a)
	}
	m = &record{keys: newRecordKeys(names, a), vals: vals}
	return m, valueSize(m), true
}

// newRecordKeys makes the keys of a record from their names, in that order (their CEL
// values and their sorted order made when something asks for them).
func newRecordKeys(names []string, a types.Adapter) *recordKeys {
	return &recordKeys{names: names, adapter: a}
}

// toVal makes a value decodeObs gives a CEL value, as the adapter would when an
// expression reads it.
func toVal(v any, a types.Adapter) ref.Val {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = toVal(e, a)
		}
		return types.NewStringInterfaceMap(a, x)
	case []any:
		vals := make([]ref.Val, len(x))
		for i, e := range x {
			vals[i] = toVal(e, a)
		}
		return types.NewRefValList(a, vals)
	}
	return a.NativeToValue(v)
}

// answerDecoder reads the plain JSON decodeAnswer takes; it reports !ok on anything
// else, and the caller falls back to encoding/json.
type answerDecoder struct {
	b   string
	i   int
	a   types.Adapter
	max uint64 // the largest string, list or object read
	// keys are the keys of the last nested object read (record).
	keys *recordKeys
	// stack holds the values of the objects and arrays being read, innermost last: each
	// is copied out once complete, at its size, not grown in a slice of its own.
	stack []ref.Val
}

// maxAnswerDepth is how deep a plain answer nests before encoding/json reads it.
const maxAnswerDepth = 64

func (d *answerDecoder) ws() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

func (d *answerDecoder) object(depth int) (*record, bool) {
	d.keys = nil // the top level's keys are its own
	names, vals, ok := d.fields(depth)
	if !ok {
		return nil, false
	}
	return &record{keys: newRecordKeys(names, d.a), vals: slices.Clone(vals)}, true
}

// record reads a nested object as a record (compiled.go): its keys, shared with the
// object read before when they are the same (a list of search results), and its
// values, where a CEL map over a Go map would hash each key and box each value again at
// every read.
func (d *answerDecoder) record(depth int) (ref.Val, bool) {
	last := d.keys
	names, vals, ok := d.fields(depth)
	if !ok {
		return nil, false
	}
	rk := last
	if names != nil {
		rk = newRecordKeys(names, d.a)
	}
	d.keys = rk
	return &record{keys: rk, vals: slices.Clip(append([]ref.Val(nil), vals...))}, true
}

// fields reads an object's keys and values, in the order of their first appearance;
// a key given again takes the later value, as encoding/json has it. names is nil when
// the keys are those of the last nested object read (d.keys), which is then nil. vals
// is the top of d.stack, already popped: the caller copies it before reading on.
func (d *answerDecoder) fields(depth int) (names []string, vals []ref.Val, ok bool) {
	if depth > maxAnswerDepth || d.i >= len(d.b) || d.b[d.i] != '{' {
		return nil, nil, false
	}
	// While the keys are the last object's, in its order, n counts them and names
	// stays nil.
	var same []string
	if d.keys != nil {
		same = d.keys.names
	}
	d.keys = nil // a nested object read on the way is not this one's sibling
	n := 0
	d.i++
	d.ws()
	if d.i < len(d.b) && d.b[d.i] == '}' {
		d.i++
		if len(same) == 0 && same != nil {
			return nil, []ref.Val{}, true
		}
		return []string{}, []ref.Val{}, true
	}
	start := len(d.stack)
	defer func() { d.stack = d.stack[:start] }()
	for {
		d.ws()
		k, ok := d.str()
		if !ok {
			return nil, nil, false
		}
		d.ws()
		if d.i >= len(d.b) || d.b[d.i] != ':' {
			return nil, nil, false
		}
		d.i++
		d.ws()
		v, ok := d.value(depth)
		if !ok {
			return nil, nil, false
		}
		switch {
		case names == nil && n < len(same) && same[n] == k:
			n++
			d.stack = append(d.stack, v)
		case names == nil && slices.Contains(same[:n], k):
			d.stack[start+slices.Index(same[:n], k)] = v
		default:
			if names == nil {
				names = append(make([]string, 0, n+10), same[:n]...) // a first observation's keys fit
			}
			if j := slices.Index(names, k); j >= 0 {
				d.stack[start+j] = v
			} else {
				names, d.stack = append(names, k), append(d.stack, v)
			}
		}
		d.ws()
		if d.i >= len(d.b) {
			return nil, nil, false
		}
		switch d.b[d.i] {
		case ',':
			d.i++
		case '}':
			d.i++
			if names == nil && n < len(same) {
				names = slices.Clone(same[:n]) // fewer keys than the last object's
			}
			if names == nil {
				d.max = max(d.max, uint64(n))
			} else {
				d.max = max(d.max, uint64(len(names)))
			}
			return names, d.stack[start:], true
		default:
			return nil, nil, false
		}
	}
}

func (d *answerDecoder) value(depth int) (ref.Val, bool) {
	if d.i >= len(d.b) {
		return nil, false
	}
	switch c := d.b[d.i]; {
	case c == '{':
		return d.record(depth + 1)
	case c == '[':
		return d.array(depth + 1)
	case c == '"':
		s, ok := d.str()
		return types.String(s), ok
	case c == '-' || c >= '0' && c <= '9':
		return d.number()
	}
	for _, lit := range [...]struct {
		s string
		v ref.Val
	}{{"true", types.True}, {"false", types.False}, {"null", types.NullValue}} {
		if len(d.b)-d.i >= len(lit.s) && d.b[d.i:d.i+len(lit.s)] == lit.s {
			d.i += len(lit.s)
			return lit.v, true
		}
	}
	return nil, false
}

func (d *answerDecoder) array(depth int) (ref.Val, bool) {
	if depth > maxAnswerDepth {
		return nil, false
	}
	d.i++ // [
	start := len(d.stack)
	defer func() { d.stack = d.stack[:start] }()
	d.ws()
	if d.i < len(d.b) && d.b[d.i] == ']' {
		d.i++
		return types.NewRefValList(d.a, []ref.Val{}), true
	}
	for {
		d.ws()
		v, ok := d.value(depth)
		if !ok {
			return nil, false
		}
		d.stack = append(d.stack, v)
		d.ws()
		if d.i >= len(d.b) {
			return nil, false
		}
		switch d.b[d.i] {
		case ',':
			d.i++
		case ']':
			d.i++
			vals := append([]ref.Val(nil), d.stack[start:]...)
			d.max = max(d.max, uint64(len(vals)))
			return types.NewRefValList(d.a, vals), true
		default:
			return nil, false
		}
	}
}

// str reads a string without escapes whose bytes are printable ASCII.
func (d *answerDecoder) str() (string, bool) {
	if d.i >= len(d.b) || d.b[d.i] != '"' {
		return "", false
	}
	for j := d.i + 1; j < len(d.b); j++ {
		switch c := d.b[j]; {
		case c == '"':
			s := d.b[d.i+1 : j]
			d.i = j + 1
			d.max = max(d.max, uint64(len(s)))
			return s, true
		case c == '\\' || c < 0x20 || c >= utf8.RuneSelf:
			return "", false
		}
	}
	return "", false
}

// number reads a number of JSON's grammar: an int when strconv.ParseInt takes it, a
// double otherwise (±Inf past float64's range, as decodeObs has it).
func (d *answerDecoder) number() (ref.Val, bool) {
	b, j := d.b, d.i
	if j < len(b) && b[j] == '-' {
		j++
	}
	digits := func() int {
		k := j
		for j < len(b) && b[j] >= '0' && b[j] <= '9' {
			j++
		}
		return j - k
	}
	switch {
	case j < len(b) && b[j] == '0':
		j++
	case digits() == 0:
		return nil, false
	}
	if j < len(b) && b[j] == '.' {
		j++
		if digits() == 0 {
			return nil, false
		}
	}
	if j < len(b) && (b[j] == 'e' || b[j] == 'E') {
		j++
		if j < len(b) && (b[j] == '+' || b[j] == '-') {
			j++
		}
		if digits() == 0 {
			return nil, false
		}
	}
	tok := b[d.i:j]
	d.i = j
	if n, err := strconv.ParseInt(tok, 10, 64); err == nil {
		return types.Int(n), true
	}
	f, _ := strconv.ParseFloat(tok, 64)
	return types.Double(f), true
}

// planSizes is CEL's size estimate of a plan expression when no value of the answers
// the plan has read is larger than max: no string has more bytes (so no more code
// points, which CEL counts), no list more elements, no map more entries.
type planSizes struct{ max uint64 }

func (s planSizes) EstimateSize(n cost.AstNode) *cost.SizeEstimate {
	if len(n.Path()) == 0 {
		return nil
	}
	return &cost.SizeEstimate{Min: 0, Max: s.max}
}

// EstimateCallCost sizes what CEL's estimate leaves unsized and a plan reads: the
// result of math.least and math.greatest over two or more values, always one of them,
// a number (their single-argument forms take lists, which ext.Math's own cost model
// prices). An answer's numbers are dyn to the checker, which otherwise prices a
// comparison with such a result as one of strings of any length.
func (planSizes) EstimateCallCost(function, _ string, _ *cost.AstNode, args []cost.AstNode) *cost.CallEstimate {
	if (function == "math.@min" || function == "math.@max") && len(args) >= 2 {
		return &cost.CallEstimate{CostEstimate: cost.Estimate{Min: 1, Max: uint64(len(args))}, ResultSize: &cost.SizeEstimate{Min: 1, Max: 1}}
	}
	return nil
}

// boundPlan gives a plan expression a program without cost tracking (program.fast)
// and the largest value of the answers, as a bit length (program.planFit), up to which
// CEL's estimate keeps it under maxCost: the oracle runs fast while the answers it
// holds have no larger value. The estimate grows with the sizes, so a binary search
// over bit lengths finds it. Such an expression is also compiled to closures
// (compiled.go; cl is the plan's), which the oracle tries first.
func boundPlan(env *cel.Env, cl *closures, p *program) {
	if p == nil {
		return
	}
	fits := func(k int) bool {
		est, err := env.EstimateCost(p.ast, planSizes{max: 1<<k - 1})
		return err == nil && est.Max <= maxCost
	}
	if !fits(1) {
		return
	}
	lo, hi := 1, 40 // fits(lo); no answer holds a value of 2^40
	for lo < hi {
		if mid := (lo + hi + 1) / 2; fits(mid) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	fast, err := env.Program(p.ast, cel.EvalOptions(cel.OptOptimize))
	if err != nil {
		return
	}
	p.fast, p.planFit = fast, lo
	p.run = cl.compile(p.ast)
}

// checkPlanCost, when set, is called with every plan expression about to run without
// cost tracking (tests check CEL's actual cost against the estimate that allowed it).
var checkPlanCost func(p *program, a planVars)

// valueSize is the size of the largest value in v, as planSizes counts it.
func valueSize(v ref.Val) uint64 {
	switch x := v.(type) {
	case types.String:
		return uint64(len(x))
	case traits.Lister:
		size, _ := x.Size().(types.Int)
		n := uint64(max(size, 0))
		for i := range int64(size) {
			n = max(n, valueSize(x.Get(types.Int(i))))
		}
		return n
	case traits.Mapper:
		size, _ := x.Size().(types.Int)
		n := uint64(max(size, 0))
		for it := x.Iterator(); it.HasNext() == types.True; {
			k := it.Next()
			n = max(n, valueSize(k), valueSize(x.Get(k)))
		}
		return n
	}
	return 0
}
