package world

import (
	"cmp"
	"math"
	"strings"
	"unicode/utf8"
	"unsafe"

	"cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/operators"
	"cel.dev/cel-go/common/overloads"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
)

// Typed closures. Most of what a world computes is bools, ints and strings: conditions
// over the state's fields and sums of them. Where the checker typed an expression bool,
// int or string and the expression is a name, a field, or a computation this file
// knows (logic, a comparison, integer arithmetic, string concatenation, a string test,
// membership in an entity collection, a conditional, an exists or all), it compiles to
// a closure returning the value unboxed (a types.Bool, types.Int or types.String, not a
// ref.Val interface) and whether it is sure of it: no type asked at every operation, no
// value boxed between two. "Not sure" means what errUnsure means for a cfn (an error of
// the expression, or a value of another type at run time): the caller gives up and the
// interpreter decides. The operations are CEL's own (its overflow checks, its
// orderings); TestClosuresAgreeWithCEL checks them against the interpreter like every
// closure.
type fn[V scalar] func(a *activation) (v V, ok bool)

// scalar are the CEL types typed closures compute.
type scalar interface {
	types.Bool | types.Int | types.String
	ref.Val
}

type (
	boolFn = fn[types.Bool]
	intFn  = fn[types.Int]
	strFn  = fn[types.String]
)

// typed is an expression compiled to the typed closure of its kind: one of the three.
type typed struct {
	b boolFn
	i intFn
	s strFn
}

// cfn is the typed closure as a closure of CEL values, for a caller that wants one.
func (t typed) cfn() cfn {
	switch {
	case t.b != nil:
		return boxed(t.b)
	case t.i != nil:
		return boxed(t.i)
	}
	return boxed(t.s)
}

func boxed[V scalar](f fn[V]) cfn {
	return func(a *activation) ref.Val {
		if v, ok := f(a); ok {
			return v
		}
		return errUnsure
	}
}

// kindOf is the kind the checker gave an expression (DynKind when it gave none).
func (c *closures) kindOf(e ast.Expr) types.Kind {
	if t := c.types[e.ID()]; t != nil {
		return t.Kind()
	}
	return types.DynKind
}

func (c *closures) boolOf(e ast.Expr) (boolFn, bool) { return typedOf[types.Bool](c, e) }
func (c *closures) intOf(e ast.Expr) (intFn, bool)   { return typedOf[types.Int](c, e) }
func (c *closures) strOf(e ast.Expr) (strFn, bool)   { return typedOf[types.String](c, e) }

// typedOf compiles an expression whose value is a V: read where it lives when it is a
// name or a field, computed by this file's closures when it knows the shape, else the
// CEL value's closure, unboxed.
func typedOf[V scalar](c *closures, e ast.Expr) (fn[V], bool) {
	if e.Kind() == ast.LiteralKind { // an operand's 0, 16 or 'sku-': no CEL value to unbox at each call
		if v, ok := e.AsLiteral().(V); ok {
			return func(*activation) (V, bool) { return v, true }, true
		}
	}
	if f, ok := leaf[V](c, e); ok {
		return f, true
	}
	if f, mine, ok := indexed[V](c, e); mine {
		return f, ok
	}
	if t, mine, ok := c.native(e); mine {
		f, isV := any(t.b).(fn[V])
		switch {
		case t.i != nil:
			f, isV = any(t.i).(fn[V])
		case t.s != nil:
			f, isV = any(t.s).(fn[V])
		}
		return f, ok && isV && f != nil
	}
	g, ok := c.value(e)
	if !ok {
		return nil, false
	}
	return func(a *activation) (V, bool) {
		v, ok := g(a).(V)
		return v, ok
	}, true
}

// leaf reads a comprehension's variable, a variable of the state, or a field (by its
// position) of an entity or of args, in one closure where the general path takes
// three: the name's, the field's, the unboxing's.
func leaf[V scalar](c *closures, e ast.Expr) (fn[V], bool) {
	switch e.Kind() {
	case ast.IdentKind:
		name, ok := c.name(e)
		if !ok {
			return nil, false
		}
		if s, ok := c.local(name); ok {
			return func(a *activation) (V, bool) {
				v, ok := a.ep.loc[s].(V)
				return v, ok
			}, true
		}
		if k, ok := c.slots[name]; ok && k >= 0 {
			return func(a *activation) (V, bool) {
				v, ok := a.ep.vars[k].(V)
				return v, ok
			}, true
		}
	case ast.SelectKind:
		s := e.AsSelect()
		if _, qualified := c.refs[e.ID()]; qualified || s.IsTestOnly() {
			return nil, false
		}
		ot, i := c.fieldOf(s.Operand(), s.FieldName())
		if ot == nil {
			return nil, false
		}
		op := s.Operand()
		if name, ok := c.name(op); ok && op.Kind() == ast.IdentKind {
			if slot, ok := c.local(name); ok {
				return func(a *activation) (V, bool) {
					o, _ := a.ep.loc[slot].(*object)
					return fieldAt[V](o, ot, i)
				}, true
			}
			if _, isState := c.slots[name]; !isState && name == "args" {
				return func(a *activation) (V, bool) { return fieldAt[V](a.args, ot, i) }, true
			}
		}
		g, ok := c.expr(op)
		if !ok {
			return nil, false
		}
		return func(a *activation) (V, bool) {
			o, _ := g(a).(*object)
			return fieldAt[V](o, ot, i)
		}, true
	}
	return nil, false
}

// indexed compiles list[i] of a V where the list is a literal of V literals (a noun
// read from the file's list of nouns) or a list(int) variable drawn by shuffle
// (slots[0]): the element read from a Go slice, where the general path asks CEL's list
// for it through its interface and unboxes it. mine says the shape is this one,
// decided before compiling the index. A variable whose elements the episode does not
// hold (episode.perms: a list computed by an expression) is indexed as the general
// path indexes it; an index out of range is not sure: the interpreter names the error.
func indexed[V scalar](c *closures, e ast.Expr) (f fn[V], mine, ok bool) {
	if e.Kind() != ast.CallKind {
		return nil, false, false
	}
	call := e.AsCall()
	if call.FunctionName() != operators.Index || call.IsMemberFunction() || len(call.Args()) != 2 {
		return nil, false, false
	}
	list, at := call.Args()[0], call.Args()[1]
	if c.kindOf(at) != types.IntKind {
		return nil, false, false
	}
	switch list.Kind() {
	case ast.ListKind:
		l := list.AsList()
		if len(l.OptionalIndices()) > 0 {
			return nil, false, false
		}
		elems := make([]V, len(l.Elements()))
		for i, x := range l.Elements() {
			if x.Kind() != ast.LiteralKind {
				return nil, false, false
			}
			v, isV := x.AsLiteral().(V)
			if !isV {
				return nil, false, false
			}
			elems[i] = v
		}
		idx, ok := c.intOf(at)
		return func(a *activation) (V, bool) {
			i, ok := idx(a)
			if !ok || i < 0 || int64(i) >= int64(len(elems)) {
				var zero V
				return zero, false
			}
			return elems[i], true
		}, true, ok
	case ast.IdentKind:
		var zero V
		if _, isInt := any(zero).(types.Int); !isInt {
			return nil, false, false
		}
		name, ok := c.name(list)
		if !ok {
			return nil, false, false
		}
		if _, isLocal := c.local(name); isLocal {
			return nil, false, false
		}
		k, isVar := c.slots[name]
		if !isVar || k < 0 {
			return nil, false, false
		}
		idx, ok := c.intOf(at)
		return func(a *activation) (V, bool) {
			i, ok := idx(a)
			if !ok {
				var zero V
				return zero, false
			}
			var v ref.Val
			if p := a.ep.permOf(k); p != nil {
				if i < 0 || int64(i) >= int64(len(p)) {
					var zero V
					return zero, false
				}
				v = p[i]
			} else if k < len(a.ep.vars) {
				v = index(a.ep.vars[k], i) // a list computed by an expression
			}
			x, ok := v.(V)
			return x, ok
		}, true, ok
	}
	return nil, false, false
}

// fieldAt is field i of o, an object of type ot (nil: not an object).
func fieldAt[V scalar](o *object, ot *objType, i int) (V, bool) {
	if o == nil || o.t != ot {
		var zero V
		return zero, false
	}
	v, ok := o.vals[i].(V)
	return v, ok
}

// name is the name an identifier reads (its qualified name when the checker resolved
// one), false for a constant or a type.
func (c *closures) name(e ast.Expr) (string, bool) {
	if e.Kind() != ast.IdentKind {
		return "", false
	}
	r, ok := c.refs[e.ID()]
	if !ok {
		return e.AsIdent(), true
	}
	if r.Value != nil || c.kindOf(e) == types.TypeKind {
		return "", false
	}
	return r.Name, true
}

// local is the slot of a comprehension's variable in reach, innermost first.
func (c *closures) local(name string) (int, bool) {
	for i := len(c.scope) - 1; i >= 0; i-- {
		if c.scope[i].name == name {
			return c.scope[i].slot, true
		}
	}
	return 0, false
}

// fieldOf is the object type of an operand the checker typed as one of the world's, and
// the position of its field.
func (c *closures) fieldOf(operand ast.Expr, field string) (*objType, int) {
	t := c.types[operand.ID()]
	if t == nil || t.Kind() != types.StructKind {
		return nil, 0
	}
	ot := c.prov.objs[t.TypeName()]
	if ot == nil {
		return nil, 0
	}
	i, ok := ot.index[field]
	if !ok {
		return nil, 0
	}
	return ot, i
}

// native compiles e to a typed closure when its shape is one of this file's (mine),
// deciding that before compiling any operand, so that every expression is compiled
// once; ok is false when an operand cannot be compiled.
func (c *closures) native(e ast.Expr) (t typed, mine, ok bool) {
	k := c.kindOf(e)
	if k != types.BoolKind && k != types.IntKind && k != types.StringKind {
		return typed{}, false, false
	}
	switch e.Kind() {
	case ast.ComprehensionKind:
		fold := e.AsComprehension()
		if isLet(fold) {
			switch k {
			case types.BoolKind:
				f, ok := letOf[types.Bool](c, fold)
				return typed{b: f}, true, ok
			case types.IntKind:
				f, ok := letOf[types.Int](c, fold)
				return typed{i: f}, true, ok
			}
			f, ok := letOf[types.String](c, fold)
			return typed{s: f}, true, ok
		}
		pred, all, isQ := quantifier(fold)
		if !isQ || k != types.BoolKind {
			return typed{}, false, false
		}
		f, ok := c.quantify(fold, pred, all)
		if j, isPart := c.parts[e.ID()]; isPart && ok {
			f = remembered(j, f)
		}
		return typed{b: f}, true, ok
	case ast.CallKind:
		return c.nativeCall(e, k)
	}
	return typed{}, false, false
}

func (c *closures) nativeCall(e ast.Expr, k types.Kind) (t typed, mine, ok bool) {
	call := e.AsCall()
	fn, args := call.FunctionName(), call.Args()
	if call.IsMemberFunction() {
		args = append([]ast.Expr{call.Target()}, args...)
	}
	two := func(want types.Kind) bool {
		return len(args) == 2 && c.kindOf(args[0]) == want && c.kindOf(args[1]) == want
	}
	switch {
	case (fn == operators.LogicalAnd || fn == operators.LogicalOr) && k == types.BoolKind:
		f, ok := c.logic(e, fn)
		return typed{b: f}, true, ok
	case fn == operators.LogicalNot && k == types.BoolKind && len(args) == 1:
		x, ok := c.boolOf(args[0])
		return typed{b: func(a *activation) (types.Bool, bool) {
			v, ok := x(a)
			return !v, ok
		}}, true, ok
	case fn == operators.Conditional && len(args) == 3:
		t, ok := c.conditional(args, k)
		return t, true, ok
	case cmpMasks[fn] != 0 && k == types.BoolKind && (two(types.IntKind) || two(types.StringKind) || two(types.BoolKind)):
		f, ok := c.compare(args, cmpMasks[fn])
		return typed{b: f}, true, ok
	case intArith[fn] != nil && k == types.IntKind && two(types.IntKind):
		f, ok := c.arith(args, intArith[fn])
		return typed{i: f}, true, ok
	case fn == operators.Negate && k == types.IntKind && len(args) == 1 && c.kindOf(args[0]) == types.IntKind:
		x, ok := c.intOf(args[0])
		return typed{i: func(a *activation) (types.Int, bool) {
			v, ok := x(a)
			return -v, ok && v != math.MinInt64
		}}, true, ok
	case fn == operators.Add && k == types.StringKind && two(types.StringKind):
		f, ok := c.concat(e)
		return typed{s: f}, true, ok
	case fn == "charAt" && call.IsMemberFunction() && k == types.StringKind && len(args) == 2 &&
		c.kindOf(args[0]) == types.StringKind && c.kindOf(args[1]) == types.IntKind:
		f, ok := c.charAt(args)
		return typed{s: f}, true, ok
	case fn == operators.In && k == types.BoolKind && len(args) == 2 && c.kindOf(args[0]) == types.StringKind && c.isCollection(args[1]):
		f, ok := c.inCollection(args)
		return typed{b: f}, true, ok
	}
	if r, found := c.refs[e.ID()]; found && len(r.OverloadIDs) == 1 && k == types.BoolKind && two(types.StringKind) {
		if test := stringTests[r.OverloadIDs[0]]; test != nil {
			f, ok := c.stringTest(args, test)
			return typed{b: f}, true, ok
		}
	}
	return typed{}, false, false
}

// terms lists the operands of a chain of one operator (a && b && c is parsed as a
// balanced tree of two-operand calls).
func terms(e ast.Expr, fn string) []ast.Expr {
	if e.Kind() != ast.CallKind {
		return []ast.Expr{e}
	}
	call := e.AsCall()
	if call.FunctionName() != fn || len(call.Args()) != 2 {
		return []ast.Expr{e}
	}
	return append(terms(call.Args()[0], fn), terms(call.Args()[1], fn)...)
}

// logic is && (which false decides) or || (which true decides): the first term that
// decides is the answer, whatever the others are (CEL's logic absorbs errors so);
// otherwise a term not sure leaves the answer unsure.
func (c *closures) logic(e ast.Expr, fn string) (boolFn, bool) {
	ts := terms(e, fn)
	fs := make([]boolFn, len(ts))
	for i, x := range ts {
		var ok bool
		if fs[i], ok = c.boolOf(x); !ok {
			return nil, false
		}
	}
	stop := types.Bool(fn == operators.LogicalOr)
	return func(a *activation) (types.Bool, bool) {
		sure := true
		for _, f := range fs {
			v, ok := f(a)
			if !ok {
				sure = false
			} else if v == stop {
				return stop, true
			}
		}
		return !stop, sure
	}, true
}

func (c *closures) conditional(args []ast.Expr, k types.Kind) (typed, bool) {
	cond, ok := c.boolOf(args[0])
	if !ok {
		return typed{}, false
	}
	switch k {
	case types.BoolKind:
		f, ok := pick[types.Bool](c, cond, args)
		return typed{b: f}, ok
	case types.IntKind:
		f, ok := pick[types.Int](c, cond, args)
		return typed{i: f}, ok
	}
	f, ok := pick[types.String](c, cond, args)
	return typed{s: f}, ok
}

// pick is cond ? yes : no, evaluating the branch taken only, as CEL does.
func pick[V scalar](c *closures, cond boolFn, args []ast.Expr) (fn[V], bool) {
	yes, ok1 := typedOf[V](c, args[1])
	no, ok2 := typedOf[V](c, args[2])
	return func(a *activation) (V, bool) {
		c, ok := cond(a)
		switch {
		case !ok:
			var zero V
			return zero, false
		case bool(c):
			return yes(a)
		}
		return no(a)
	}, ok1 && ok2
}

// Comparison masks: which outcomes of cmp.Compare (less, equal, greater) make the
// comparison true.
const (
	cmpLess    uint8 = 1 << 0
	cmpEqual   uint8 = 1 << 1
	cmpGreater uint8 = 1 << 2
)

// cmpMasks are CEL's comparison operators. Closures decide them for two ints, two
// strings (ordered by their bytes, as types.String.Compare does) or two bools (false
// before true, as types.Bool.Compare does).
var cmpMasks = map[string]uint8{
	operators.Equals:        cmpEqual,
	operators.NotEquals:     cmpLess | cmpGreater,
	operators.Less:          cmpLess,
	operators.LessEquals:    cmpLess | cmpEqual,
	operators.Greater:       cmpGreater,
	operators.GreaterEquals: cmpGreater | cmpEqual,
}

func (c *closures) compare(args []ast.Expr, mask uint8) (boolFn, bool) {
	switch c.kindOf(args[0]) {
	case types.IntKind:
		l, ok1 := c.intOf(args[0])
		r, ok2 := c.intOf(args[1])
		return compared(l, r, mask), ok1 && ok2
	case types.StringKind:
		l, ok1 := c.strOf(args[0])
		r, ok2 := c.strOf(args[1])
		return compared(l, r, mask), ok1 && ok2
	}
	l, ok1 := c.boolOf(args[0])
	r, ok2 := c.boolOf(args[1])
	asInt := func(f boolFn) intFn {
		return func(a *activation) (types.Int, bool) {
			v, ok := f(a)
			if v {
				return 1, ok
			}
			return 0, ok
		}
	}
	return compared(asInt(l), asInt(r), mask), ok1 && ok2
}

// ordered are the scalars cmp.Compare orders as CEL does.
type ordered interface {
	types.Int | types.String
	ref.Val
}

func compared[V ordered](l, r fn[V], mask uint8) boolFn {
	return func(a *activation) (types.Bool, bool) {
		x, ok := l(a)
		if !ok {
			return false, false
		}
		y, ok := r(a)
		if !ok {
			return false, false
		}
		return mask&(1<<(cmp.Compare(x, y)+1)) != 0, true
	}
}

// intArith is CEL's arithmetic on two ints, with the overflow and division checks of
// its types.Int (an error there is "not sure" here).
var intArith = map[string]func(x, y types.Int) (types.Int, bool){
	operators.Add: func(x, y types.Int) (types.Int, bool) {
		if (y > 0 && x > math.MaxInt64-y) || (y < 0 && x < math.MinInt64-y) {
			return 0, false
		}
		return x + y, true
	},
	operators.Subtract: func(x, y types.Int) (types.Int, bool) {
		if (y < 0 && x > math.MaxInt64+y) || (y > 0 && x < math.MinInt64+y) {
			return 0, false
		}
		return x - y, true
	},
	operators.Multiply: func(x, y types.Int) (types.Int, bool) {
		if (x == -1 && y == math.MinInt64) || (y == -1 && x == math.MinInt64) ||
			(x > 0 && y > 0 && x > math.MaxInt64/y) ||
			(x > 0 && y < 0 && y < math.MinInt64/x) ||
			(x < 0 && y > 0 && x < math.MinInt64/y) ||
			(x < 0 && y < 0 && y < math.MaxInt64/x) {
			return 0, false
		}
		return x * y, true
	},
	operators.Divide: func(x, y types.Int) (types.Int, bool) {
		if y == 0 || x == math.MinInt64 && y == -1 {
			return 0, false
		}
		return x / y, true
	},
	operators.Modulo: func(x, y types.Int) (types.Int, bool) {
		if y == 0 || x == math.MinInt64 && y == -1 {
			return 0, false
		}
		return x % y, true
	},
}

func (c *closures) arith(args []ast.Expr, op func(x, y types.Int) (types.Int, bool)) (intFn, bool) {
	l, ok1 := c.intOf(args[0])
	r, ok2 := c.intOf(args[1])
	return func(a *activation) (types.Int, bool) {
		x, ok := l(a)
		if !ok {
			return 0, false
		}
		y, ok := r(a)
		if !ok {
			return 0, false
		}
		return op(x, y)
	}, ok1 && ok2
}

// concatTerms lists the strings a chain of string + adds.
func (c *closures) concatTerms(e ast.Expr) []ast.Expr {
	if e.Kind() == ast.CallKind && e.AsCall().FunctionName() == operators.Add && len(e.AsCall().Args()) == 2 {
		l, r := e.AsCall().Args()[0], e.AsCall().Args()[1]
		if c.kindOf(e) == types.StringKind && c.kindOf(l) == types.StringKind && c.kindOf(r) == types.StringKind {
			return append(c.concatTerms(l), c.concatTerms(r)...)
		}
	}
	return []ast.Expr{e}
}

// concat is a chain of string +: one string made, where CEL makes one per +.
func (c *closures) concat(e ast.Expr) (strFn, bool) {
	ts := c.concatTerms(e)
	fs := make([]strFn, len(ts))
	for i, x := range ts {
		var ok bool
		if fs[i], ok = c.strOf(x); !ok {
			return nil, false
		}
	}
	return func(a *activation) (types.String, bool) {
		var buf [8]types.String
		parts := buf[:0]
		n := 0
		for _, f := range fs {
			s, ok := f(a)
			if !ok {
				return "", false
			}
			parts = append(parts, s)
			n += len(s)
		}
		return a.ep.joinStrings(parts, n), true
	}, true
}

// strChunk is the size of the blocks an episode's concatenations are written into.
const strChunk = 1024

// joinStrings is the concatenation of parts (n bytes), written after the last one in
// the episode's current block of strings: one allocation per block, not one per string
// (a reset makes three dozen). A string's bytes are never written again once made (the
// block is only appended to, and replaced when full), so the string may point into it;
// the block lives as long as any of its strings.
func (e *episode) joinStrings(parts []types.String, n int) types.String {
	switch {
	case n == 0:
		return ""
	case len(parts) == 1:
		return parts[0]
	case n > strChunk/4: // a string of its own, not most of a block
		var b strings.Builder
		b.Grow(n)
		for _, s := range parts {
			b.WriteString(string(s))
		}
		return types.String(b.String())
	}
	if cap(e.strs)-len(e.strs) < n {
		e.strs = make([]byte, 0, strChunk)
	}
	start := len(e.strs)
	for _, s := range parts {
		e.strs = append(e.strs, s...)
	}
	return types.String(unsafe.String(&e.strs[start], n))
}

// charAt is the strings extension's s.charAt(i) where s is ASCII up to i: the byte at i,
// a slice of s (the extension makes a new string of the character). At the end of s it
// is "", as the extension's; anything else (a character beyond ASCII before i, an index
// out of range) is left to the interpreter, which decides it or names the error.
func (c *closures) charAt(args []ast.Expr) (strFn, bool) {
	sf, ok1 := c.strOf(args[0])
	nf, ok2 := c.intOf(args[1])
	if lit, isLit := literalASCII(args[0]); isLit {
		// A literal of ASCII ('0123456789abcdef'.charAt(n)): its bytes are checked once,
		// here, not at every call.
		return func(a *activation) (types.String, bool) {
			i, ok := nf(a)
			if !ok || i < 0 || int64(i) > int64(len(lit)) {
				return "", false
			}
			return lit[i:min(int(i)+1, len(lit))], true
		}, ok2
	}
	return func(a *activation) (types.String, bool) {
		s, ok := sf(a)
		if !ok {
			return "", false
		}
		i, ok := nf(a)
		if !ok || i < 0 || int64(i) > int64(len(s)) {
			return "", false
		}
		for j := 0; j < int(i) && j < len(s); j++ {
			if s[j] >= utf8.RuneSelf {
				return "", false
			}
		}
		if int(i) == len(s) {
			return "", true
		}
		if s[i] >= utf8.RuneSelf {
			return "", false
		}
		return s[i : i+1], true
	}, ok1 && ok2
}

// literalASCII returns e's string when e is a string literal of ASCII bytes only.
func literalASCII(e ast.Expr) (types.String, bool) {
	if e.Kind() != ast.LiteralKind {
		return "", false
	}
	s, ok := e.AsLiteral().(types.String)
	if !ok {
		return "", false
	}
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return "", false
		}
	}
	return s, true
}

// stringTests are CEL's string predicates, by their overload.
var stringTests = map[string]func(s, sub string) bool{
	overloads.ContainsString:   strings.Contains,
	overloads.StartsWithString: strings.HasPrefix,
	overloads.EndsWithString:   strings.HasSuffix,
}

func (c *closures) stringTest(args []ast.Expr, test func(s, sub string) bool) (boolFn, bool) {
	l, ok1 := c.strOf(args[0])
	r, ok2 := c.strOf(args[1])
	return func(a *activation) (types.Bool, bool) {
		s, ok := l(a)
		if !ok {
			return false, false
		}
		sub, ok := r(a)
		if !ok {
			return false, false
		}
		return types.Bool(test(string(s), string(sub))), true
	}, ok1 && ok2
}

// isCollection reports whether e names an entity collection of the state.
func (c *closures) isCollection(e ast.Expr) bool {
	name, ok := c.name(e)
	if !ok {
		return false
	}
	if _, isLocal := c.local(name); isLocal {
		return false
	}
	k, ok := c.slots[name]
	return ok && k < 0
}

// inCollection is id in collection: whether the collection has an entity of that id.
func (c *closures) inCollection(args []ast.Expr) (boolFn, bool) {
	id, ok1 := c.strOf(args[0])
	coll, ok2 := c.value(args[1])
	return func(a *activation) (types.Bool, bool) {
		s, ok := id(a)
		if !ok {
			return false, false
		}
		m, ok := coll(a).(*collection)
		if !ok {
			return false, false
		}
		_, found := m.row(string(s))
		return types.Bool(found), true
	}, ok1 && ok2
}

// entityAt is collection[id]: the entity of that id.
func (c *closures) entityAt(args []ast.Expr) (cfn, bool) {
	coll, ok1 := c.value(args[0])
	id, ok2 := c.strOf(args[1])
	return func(a *activation) ref.Val {
		m, ok := coll(a).(*collection)
		if !ok {
			return errUnsure
		}
		s, ok := id(a)
		if !ok {
			return errUnsure
		}
		if o, ok := m.row(string(s)); ok {
			return o
		}
		return errUnsure
	}, ok1 && ok2
}

// letOf is closures.let of a V.
func letOf[V scalar](c *closures, fold ast.ComprehensionExpr) (fn[V], bool) {
	initF, accu, ok := c.letStart(fold)
	if !ok {
		return nil, false
	}
	resultF, ok := typedOf[V](c, fold.Result())
	c.scope, c.depth = c.scope[:len(c.scope)-1], c.depth-1
	if !ok {
		return nil, false
	}
	return func(a *activation) (V, bool) {
		v := initF(a)
		if types.IsError(v) {
			var zero V
			return zero, false
		}
		a.ep.loc[accu] = v
		return resultF(a)
	}, true
}

// quantifier reports whether a comprehension is CEL's exists (all false) or all (all
// true) as its macros expand them, and returns the predicate: the accumulator starts
// at false (true), the loop goes on while it is not true (not false), each step is
// accumulator || predicate (&&), and the result is the accumulator.
func quantifier(fold ast.ComprehensionExpr) (pred ast.Expr, all, ok bool) {
	accu := fold.AccuVar()
	if !strings.HasPrefix(accu, "@") || accu == fold.IterVar() || accu == fold.IterVar2() {
		return nil, false, false
	}
	isAccu := func(e ast.Expr) bool { return e.Kind() == ast.IdentKind && e.AsIdent() == accu }
	args := func(e ast.Expr, fn string, n int) []ast.Expr {
		if e.Kind() != ast.CallKind || e.AsCall().FunctionName() != fn || len(e.AsCall().Args()) != n {
			return nil
		}
		return e.AsCall().Args()
	}
	init := fold.AccuInit()
	if init.Kind() != ast.LiteralKind || !isAccu(fold.Result()) {
		return nil, false, false
	}
	start, isBool := init.AsLiteral().(types.Bool)
	if !isBool {
		return nil, false, false
	}
	all = bool(start)
	op := operators.LogicalOr
	cond := args(fold.LoopCondition(), operators.NotStrictlyFalse, 1)
	if cond == nil {
		return nil, false, false
	}
	if all {
		op = operators.LogicalAnd
	} else if cond = args(cond[0], operators.LogicalNot, 1); cond == nil {
		return nil, false, false
	}
	step := args(fold.LoopStep(), op, 2)
	if !isAccu(cond[0]) || step == nil || !isAccu(step[0]) {
		return nil, false, false
	}
	return step[1], all, true
}

// quantify compiles an exists or an all: the predicate per element, the loop stopping
// at the first element that decides.
func (c *closures) quantify(fold ast.ComprehensionExpr, pred ast.Expr, all bool) (boolFn, bool) {
	rangeF, ok := c.expr(fold.IterRange())
	if !ok {
		return nil, false
	}
	scope, depth := len(c.scope), c.depth
	f := &compFold{rangeF: rangeF, all: types.Bool(all), accu: c.push(fold.AccuVar()), v1: c.push(fold.IterVar()), v2: -1}
	if f.two = fold.HasIterVar2() && fold.IterVar2() != ""; f.two {
		f.v2 = c.push(fold.IterVar2())
	}
	f.pred, ok = c.boolOf(pred)
	c.scope, c.depth = c.scope[:scope], depth
	if !ok {
		return nil, false
	}
	return f.quantify, true
}
