package world

import (
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"sync"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/types"
)

// sizedBound bounds the cost of an expression that CEL's static estimate cannot keep
// under maxCost whatever the state (the shop's search: a query of up to 200 characters
// split into words, each looked for in every product's text) on the sizes of the state
// at hand: the length of each string and the number of entities it reads. Those sizes,
// rounded up to a power of two, key a cache of CEL's estimate made with them; when it is
// under maxCost, the evaluation runs compiled and without cost tracking, as it would
// finish under the limit anyway. CEL's estimate grows with the sizes it is given, so a
// larger state never borrows a smaller one's verdict.
type sizedBound struct {
	env   *cel.Env
	ast   *cel.Ast
	base  sizes
	paths []sizedPath

	mu    sync.RWMutex
	cache map[string]bool
	// sig numbers the paths it measures among the world's bounds (World.sizedSigs):
	// bounds that measure the same paths share their measure (episode.sizedAt).
	sig int
}

// sizedPath is a path CEL's estimate sized, and how to measure it on a state.
type sizedPath struct {
	key  string
	what sizedKind
	k    int // variable, entity collection or argument position
	f    int // field position, for sizeField
}

type sizedKind uint8

const (
	sizeArg   sizedKind = iota // a string argument's length
	sizeVar                    // a string variable's length
	sizeCount                  // the entities of a collection
	sizeIDs                    // the longest id of a collection
	sizeField                  // the longest string field of a collection's entities
)

// sizedBound returns the bound of an expression on the sizes of a state, or nil when
// some path the estimate sized is one it cannot measure (a comprehension's variable
// named like the state would be one).
func (c *compiler) sizedBound(sp stateProgram, ents map[string]uint64, seen map[string][]string) *sizedBound {
	w := c.w
	locals := map[string]bool{}
	ast.PreOrderVisit(sp.p.ast.NativeRep().Expr(), ast.NewExprVisitor(func(e ast.Expr) {
		if e.Kind() == ast.ComprehensionKind {
			f := e.AsComprehension()
			locals[f.AccuVar()], locals[f.IterVar()], locals[f.IterVar2()] = true, true, true
		}
	}))
	b := &sizedBound{env: sp.env, ast: sp.p.ast, base: sizes{ents: ents, lists: c.lists, args: sp.args}, cache: map[string]bool{}}
	for key, path := range seen {
		if locals[path[0]] {
			return nil
		}
		p := sizedPath{key: key}
		slot, isState := w.slots[path[0]]
		switch {
		case path[0] == "args" && len(path) == 2 && sp.args != nil && sp.args.otype != nil:
			i, ok := sp.args.otype.index[path[1]]
			if !ok {
				return nil
			}
			p.what, p.k = sizeArg, i
		case isState && slot >= 0 && len(path) == 1:
			p.what, p.k = sizeVar, slot
		case isState && slot < 0 && len(path) == 1:
			p.what, p.k = sizeCount, -slot-1
		case isState && slot < 0 && len(path) == 2 && path[1] == "@keys":
			p.what, p.k = sizeIDs, -slot-1
		case isState && slot < 0 && len(path) == 3 && path[1] == "@values":
			ot := w.entities[-slot-1].otype
			i, ok := ot.index[path[2]]
			if !ok {
				return nil
			}
			p.what, p.k, p.f = sizeField, -slot-1, i
		default:
			return nil
		}
		b.paths = append(b.paths, p)
	}
	// In the order of their keys, so that bounds measuring the same paths measure them
	// in the same order (World.sizedSig).
	slices.SortFunc(b.paths, func(x, y sizedPath) int { return strings.Compare(x.key, y.key) })
	// An expression over even an empty state may be unbounded (string(int) has no size
	// in CEL's estimate): the interpreter's.
	s := b.base
	s.actual = make(map[string]uint64, len(b.paths))
	for _, p := range b.paths {
		s.actual[p.key] = 0
	}
	if est, err := b.env.EstimateCost(b.ast, &s); err != nil || est.Max > maxCost {
		return nil
	}
	return b
}

// underSettled is under with the state's sizes measured once per step after its
// effects (activation.settled), while the state stays as it is: the shop search's
// total, results and milestone, which read the same strings, measure the catalog once.
func (b *sizedBound) underSettled(a *activation) bool {
	ep := a.ep
	if !a.settled || ep.settledEpoch == 0 || len(b.paths) > maxSizedPaths || b.sig >= len(ep.sizedAt) {
		return b.under(a)
	}
	key := ep.sizedKeys[b.sig][:len(b.paths)]
	if ep.sizedAt[b.sig] != ep.settledEpoch {
		if !b.measure(a, key) {
			return false
		}
		ep.sizedAt[b.sig] = ep.settledEpoch
	}
	return b.decide(key)
}

// maxSizedPaths is the most paths a bound measures (more: never under); maxSizedSigs
// how many lists of paths an episode keeps the measures of (the others are measured
// by each bound).
const (
	maxSizedPaths = 16
	maxSizedSigs  = 4
)

// under reports whether the expression's cost on the state of a stays under maxCost.
func (b *sizedBound) under(a *activation) bool {
	var buf [maxSizedPaths]byte
	if len(b.paths) > len(buf) {
		return false
	}
	key := buf[:len(b.paths)]
	return b.measure(a, key) && b.decide(key)
}

// measure writes the bit length of each path's size on the state of a into key; false
// when one cannot be measured.
func (b *sizedBound) measure(a *activation, key []byte) bool {
	for i, p := range b.paths {
		n, ok := p.size(a)
		if !ok {
			return false
		}
		key[i] = byte(bits.Len64(n))
	}
	return true
}

// decide reports whether the estimate on the sizes key (bit lengths) is under maxCost.
func (b *sizedBound) decide(key []byte) bool {
	b.mu.RLock()
	v, ok := b.cache[string(key)]
	b.mu.RUnlock()
	if ok {
		return v
	}
	actual := make(map[string]uint64, len(b.paths))
	for i, p := range b.paths {
		actual[p.key] = 1<<key[i] - 1 // at least the size, and the same for the whole bucket
	}
	s := b.base
	s.actual = actual
	est, err := b.env.EstimateCost(b.ast, &s)
	v = err == nil && est.Max <= maxCost
	b.mu.Lock()
	b.cache[string(key)] = v
	b.mu.Unlock()
	return v
}

func (p *sizedPath) size(a *activation) (uint64, bool) {
	ep := a.ep
	switch p.what {
	case sizeArg:
		if a.args == nil {
			return 0, false
		}
		return strLen(a.args.vals[p.k])
	case sizeVar:
		return strLen(ep.vars[p.k])
	case sizeCount:
		if p.k >= len(ep.ents) {
			return 0, false
		}
		return uint64(len(ep.ents[p.k].ids)), true
	case sizeIDs:
		if p.k >= len(ep.ents) {
			return 0, false
		}
		n := 0
		for _, id := range ep.ents[p.k].ids {
			n = max(n, len(id))
		}
		return uint64(n), true
	case sizeField:
		if p.k >= len(ep.ents) {
			return 0, false
		}
		var n uint64
		for _, o := range ep.ents[p.k].objs {
			m, ok := strLen(o.vals[p.f])
			if !ok {
				return 0, false
			}
			n = max(n, m)
		}
		return n, true
	}
	return 0, false
}

// strLen is the length of a string of the state (nil, not drawn yet, counts as none).
func strLen(v any) (uint64, bool) {
	switch x := v.(type) {
	case nil:
		return 0, true
	case types.String:
		return uint64(len(x)), true
	}
	return 0, false
}

// sizedSig returns the number of a list of paths (what each measures), the same for
// every bound that measures the same.
func (w *World) sizedSig(paths []sizedPath) int {
	var b strings.Builder
	for _, p := range paths {
		b.WriteString(strconv.Itoa(int(p.what)) + "," + strconv.Itoa(p.k) + "," + strconv.Itoa(p.f) + ";")
	}
	if w.sizedSigs == nil {
		w.sizedSigs = map[string]int{}
	}
	sig, ok := w.sizedSigs[b.String()]
	if !ok {
		sig = len(w.sizedSigs)
		w.sizedSigs[b.String()] = sig
	}
	return sig
}
