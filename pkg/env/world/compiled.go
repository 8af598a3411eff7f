package world

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/functions"
	"cel.dev/cel-go/common/operators"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/common/types/traits"
)

// cfn is an expression compiled to Go closures when the world loads. It returns what
// CEL's interpreter returns for the same state, or an error value whenever it cannot be
// sure of that (an error of the expression, a shape it does not know at run time): the
// caller then evaluates the expression with CEL's interpreter, which decides. CEL's
// logic is such that an error in place of a value can only turn a result into an error,
// never into another value, so a closure that gives up early never changes an answer.
//
// Every operation calls what the interpreter calls (the function bindings of the
// expression's environment, types.Equal, the values' own Get, Find and Fold), so the
// values are the interpreter's own; what the closures save is the interpreter's
// machinery around them: names resolved by string per evaluation, attributes and
// qualifiers, frames, folders and their pools. Bools, ints and strings the checker
// typed are computed without boxing them (compiledtyped.go: logic, comparisons,
// arithmetic, string operations, exists and all); expr chooses between the two.
type cfn func(a *activation) ref.Val

// errUnsure is what a closure returns when it leaves the decision to the interpreter.
var errUnsure = types.NewErr("compiled expression leaves this evaluation to the interpreter")

// closures compiles the checked expressions of one CEL environment.
type closures struct {
	w       *World
	prov    *provider
	adapter types.Adapter
	fns     map[string]*functions.Overload
	refs    map[int64]*ast.ReferenceInfo
	types   map[int64]*types.Type
	// parts numbers the end conditions' parts (endparts.go) of the expression being
	// compiled, by their expression's id: nil for other expressions.
	parts map[int64]int
	// scope lists the comprehension variables in reach, innermost last; depth is the
	// number of local slots they take.
	scope []local
	depth int
	// slots resolves the state's names (the world's slots); plan, for the oracle plan's
	// expressions, makes it empty and resolves task and results instead: the plan reads
	// only what agents see.
	slots map[string]int
	plan  bool
	// memoSlots numbers the plan's remembered expressions by their text (planMemo).
	memoSlots map[string]int
}

type local struct {
	name string
	slot int
}

// newClosures reads the function bindings of env: the same the interpreter dispatches to.
func newClosures(w *World, prov *provider, env *cel.Env) *closures {
	c := &closures{w: w, prov: prov, adapter: env.CELTypeAdapter(), fns: map[string]*functions.Overload{}, slots: w.slots}
	for _, fd := range env.Functions() {
		bs, err := fd.Bindings()
		if err != nil {
			continue
		}
		for _, b := range bs {
			c.fns[b.Operator] = b
		}
	}
	return c
}

// newPlanClosures is newClosures for the expressions of the oracle's plan, which read
// task and results (the answers, dyn maps) and nothing of the state.
func newPlanClosures(w *World, prov *provider, env *cel.Env) *closures {
	c := newClosures(w, prov, env)
	c.slots, c.plan = map[string]int{}, true
	return c
}

// compile returns the closure of a checked expression, or nil when some part of it is
// a shape the closures do not cover (the interpreter then evaluates it every time).
func (c *closures) compile(a *cel.Ast) cfn {
	f, _ := c.compileTyped(a)
	return f
}

// compileTyped is compile, and the typed closure of the expression as well when it is a
// bool, int or string computation compiledtyped.go knows (else the zero typed): what
// evalBool and evalInt call without boxing the value they unbox.
func (c *closures) compileTyped(a *cel.Ast) (cfn, typed) {
	native := a.NativeRep()
	c.refs, c.types = native.ReferenceMap(), native.TypeMap()
	c.scope, c.depth = c.scope[:0], 0
	e := native.Expr()
	if t, mine, ok := c.native(e); mine {
		if !ok {
			return nil, typed{}
		}
		return t.cfn(), t
	}
	f, ok := c.expr(e)
	if !ok {
		return nil, typed{}
	}
	var t typed
	switch c.kindOf(e) {
	case types.IntKind:
		t.i = constOrLeaf[types.Int](c, e)
	case types.BoolKind:
		t.b = constOrLeaf[types.Bool](c, e)
	}
	return f, t
}

// constOrLeaf is the typed closure of a literal (a draw's bounds, [0, 6]: its value
// made once, when the world loads), of a name or a field read where it lives, or of an
// element of a literal or shuffled list (indexed: order[0]); nil for anything else.
func constOrLeaf[V scalar](c *closures, e ast.Expr) fn[V] {
	if e.Kind() == ast.LiteralKind {
		v, ok := e.AsLiteral().(V)
		if !ok {
			return nil
		}
		return func(*activation) (V, bool) { return v, true }
	}
	if f, ok := leaf[V](c, e); ok {
		return f
	}
	if f, mine, ok := indexed[V](c, e); mine && ok {
		return f
	}
	return nil
}

// expr compiles an expression: to a typed closure where compiledtyped.go knows its
// shape, else to a closure of CEL values.
func (c *closures) expr(e ast.Expr) (cfn, bool) {
	if t, mine, ok := c.native(e); mine {
		if !ok {
			return nil, false
		}
		return t.cfn(), true
	}
	f, ok := c.value(e)
	if !ok {
		return nil, false
	}
	if c.plan {
		return c.planMemo(e, f), true
	}
	return c.memoize(e, f), true
}

// planMemo returns f, the closure of e, computed once while the oracle's results stay
// the same when e is a comprehension or a library call of the plan outside any
// comprehension: it reads nothing but task and results then, and the plan's other
// expressions that write it the same way share its value (the shop's candidate filter,
// written in each of its stock checks). CEL's functions are pure, so the value is the
// one each would compute.
func (c *closures) planMemo(e ast.Expr, f cfn) cfn {
	switch {
	case len(c.scope) > 0:
		return f
	case e.Kind() == ast.ComprehensionKind:
	case e.Kind() == ast.CallKind && !isOperator(e.AsCall().FunctionName()):
	default:
		return f
	}
	slot := memoSlot(&c.memoSlots, exprKey(e))
	if slot == len(c.w.planReads) {
		c.w.planReads = append(c.w.planReads, resultsRead(e))
	}
	return func(a *activation) ref.Val {
		o := a.plan
		if o == nil {
			return f(a)
		}
		if slot >= len(o.memo) {
			o.memo = append(o.memo, make([]ref.Val, slot+1-len(o.memo))...)
		}
		if v := o.memo[slot]; v != nil {
			return v
		}
		v := f(a)
		if !types.IsError(v) {
			o.memo[slot] = v
		}
		return v
	}
}

// planReads is what a remembered plan expression reads of the oracle's results: the
// answers of the steps it names, or any of them (all). Its value stays the same until
// one of those is added; the task never changes.
type planReads struct {
	all   bool
	names []string
}

// reads reports whether an expression that reads r may change when the answer of the
// step named name is added to the results.
func (r planReads) reads(name string) bool {
	return r.all || slices.Contains(r.names, name)
}

// resultsRead is what e reads of the results. An answer is named where results is the
// operand of a field (results.search), indexed by a string literal (results['search'])
// or asked for one (has(results.search), 'search' in results); results read any other
// way (results[n], size(results), results passed to a function or a comprehension)
// may read any answer. A comprehension's variable of that name is taken for the
// results too, which only adds names.
func resultsRead(e ast.Expr) planReads {
	var r planReads
	name := func(n string) {
		if !slices.Contains(r.names, n) {
			r.names = append(r.names, n)
		}
	}
	isResults := func(x ast.Expr) bool { return x.Kind() == ast.IdentKind && x.AsIdent() == "results" }
	literal := func(x ast.Expr) (string, bool) {
		if x.Kind() != ast.LiteralKind {
			return "", false
		}
		s, ok := x.AsLiteral().(types.String)
		return string(s), ok
	}
	var walk func(x ast.Expr)
	walk = func(x ast.Expr) {
		switch x.Kind() {
		case ast.IdentKind:
			if isResults(x) {
				r.all = true
			}
		case ast.SelectKind:
			s := x.AsSelect()
			if isResults(s.Operand()) {
				name(s.FieldName())
				return
			}
			walk(s.Operand())
		case ast.CallKind:
			call := x.AsCall()
			args := call.Args()
			if len(args) == 2 && isResults(args[0]) && (call.FunctionName() == operators.Index || call.FunctionName() == operators.OptIndex) {
				if n, ok := literal(args[1]); ok {
					name(n)
					return
				}
			}
			if len(args) == 2 && isResults(args[1]) && call.FunctionName() == operators.In {
				if n, ok := literal(args[0]); ok {
					name(n)
					return
				}
			}
			if call.IsMemberFunction() {
				walk(call.Target())
			}
			for _, a := range args {
				walk(a)
			}
		case ast.ListKind:
			for _, el := range x.AsList().Elements() {
				walk(el)
			}
		case ast.MapKind:
			for _, en := range x.AsMap().Entries() {
				walk(en.AsMapEntry().Key())
				walk(en.AsMapEntry().Value())
			}
		case ast.StructKind:
			for _, f := range x.AsStruct().Fields() {
				walk(f.AsStructField().Value())
			}
		case ast.ComprehensionKind:
			f := x.AsComprehension()
			for _, y := range []ast.Expr{f.IterRange(), f.AccuInit(), f.LoopCondition(), f.LoopStep(), f.Result()} {
				walk(y)
			}
		}
	}
	walk(e)
	if r.all {
		r.names = nil
	}
	return r
}

// memoSlot returns the slot of the expression written key among slots, numbering a new
// one after the others: expressions written the same way share one.
func memoSlot(slots *map[string]int, key string) int {
	if *slots == nil {
		*slots = map[string]int{}
	}
	slot, ok := (*slots)[key]
	if !ok {
		slot = len(*slots)
		(*slots)[key] = slot
	}
	return slot
}

// memoize returns f, the closure of e, computed once per step when e is a library
// call reading nothing but the tool's arguments (a query's words,
// args.query.lowerAscii().split(' ')): every expression of the tool that has the same
// call shares its value, kept with the arguments. CEL's functions are pure, so the
// value is the one each would compute.
func (c *closures) memoize(e ast.Expr, f cfn) cfn {
	if e.Kind() == ast.ComprehensionKind {
		return c.memoSettled(e, f)
	}
	if e.Kind() != ast.CallKind || isOperator(e.AsCall().FunctionName()) {
		return f
	}
	ot := c.argsOnly(e)
	if ot == nil {
		return c.memoSettled(e, f)
	}
	slot := memoSlot(&ot.memoSlots, exprKey(e))
	return func(a *activation) ref.Val {
		o := a.args
		if o == nil || o.t != ot {
			return f(a)
		}
		if slot >= len(o.memo) {
			o.memo = make([]ref.Val, len(ot.memoSlots))
		}
		if v := o.memo[slot]; v != nil {
			return v
		}
		v := f(a)
		if !types.IsError(v) {
			o.memo[slot] = v
		}
		return v
	}
}

// memoSettled returns f, the closure of e, computed once per step after the step's
// effects when e is a comprehension or a library call outside any comprehension that
// reads the state, the arguments, new_id, the clock and the step only: what stays the
// same from the effects to the step's end. Expressions written the same way share
// the value. Anywhere else (a precondition, a reset, an end condition) f runs as is.
func (c *closures) memoSettled(e ast.Expr, f cfn) cfn {
	if len(c.scope) > 0 || !c.settledOnly(e, nil) {
		return f
	}
	slot := memoSlot(&c.w.settledSlots, exprKey(e))
	w := c.w
	return func(a *activation) ref.Val {
		if !a.settled {
			return f(a)
		}
		ep := a.ep
		if slot >= len(ep.settled) {
			ep.settled = make([]ref.Val, len(w.settledSlots))
		}
		if v := ep.settled[slot]; v != nil {
			return v
		}
		v := f(a)
		if !types.IsError(v) {
			ep.settled[slot] = v
		}
		return v
	}
}

// settledOnly reports whether e reads nothing but the state's names, args, new_id,
// now_ms, step and the variables of its own comprehensions (bound): not the element
// an answer's list is being written for, nor an entity's i, id or self.
func (c *closures) settledOnly(e ast.Expr, bound []string) bool {
	switch e.Kind() {
	case ast.LiteralKind:
		return true
	case ast.IdentKind:
		name := e.AsIdent()
		if r, ok := c.refs[e.ID()]; ok {
			if r.Value != nil {
				return true
			}
			name = r.Name
		}
		if slices.Contains(bound, name) {
			return true
		}
		if _, ok := c.slots[name]; ok {
			return true
		}
		switch name {
		case "args", "new_id", "now_ms", "step":
			return true
		}
		return false
	case ast.SelectKind:
		return c.settledOnly(e.AsSelect().Operand(), bound)
	case ast.CallKind:
		call := e.AsCall()
		if call.IsMemberFunction() && !c.settledOnly(call.Target(), bound) {
			return false
		}
		for _, x := range call.Args() {
			if !c.settledOnly(x, bound) {
				return false
			}
		}
		return true
	case ast.ListKind:
		for _, x := range e.AsList().Elements() {
			if !c.settledOnly(x, bound) {
				return false
			}
		}
		return true
	case ast.MapKind:
		for _, en := range e.AsMap().Entries() {
			me := en.AsMapEntry()
			if !c.settledOnly(me.Key(), bound) || !c.settledOnly(me.Value(), bound) {
				return false
			}
		}
		return true
	case ast.ComprehensionKind:
		f := e.AsComprehension()
		if !c.settledOnly(f.IterRange(), bound) || !c.settledOnly(f.AccuInit(), bound) {
			return false
		}
		withAccu := append(slices.Clip(bound), f.AccuVar())
		inner := append(slices.Clip(withAccu), f.IterVar())
		if f.HasIterVar2() && f.IterVar2() != "" {
			inner = append(inner, f.IterVar2())
		}
		return c.settledOnly(f.LoopCondition(), inner) && c.settledOnly(f.LoopStep(), inner) &&
			c.settledOnly(f.Result(), withAccu)
	}
	return false // a struct literal, or a kind added later
}

// exprKey writes an expression out whole: two expressions of one environment with the
// same key compute the same value on the same state and arguments. (CEL's unparser
// cannot write a comprehension without the macro calls the parser may not keep.)
func exprKey(e ast.Expr) string {
	var b strings.Builder
	var write func(e ast.Expr)
	list := func(open, close string, es []ast.Expr) {
		b.WriteString(open)
		for i, x := range es {
			if i > 0 {
				b.WriteByte(',')
			}
			write(x)
		}
		b.WriteString(close)
	}
	write = func(e ast.Expr) {
		switch e.Kind() {
		case ast.LiteralKind:
			v := e.AsLiteral()
			fmt.Fprintf(&b, "%s(%q)", v.Type().TypeName(), fmt.Sprint(v.Value()))
		case ast.IdentKind:
			b.WriteString(e.AsIdent())
		case ast.SelectKind:
			s := e.AsSelect()
			if s.IsTestOnly() {
				b.WriteString("has:")
			}
			write(s.Operand())
			b.WriteString("." + s.FieldName())
		case ast.CallKind:
			call := e.AsCall()
			if call.IsMemberFunction() {
				write(call.Target())
				b.WriteByte('.')
			}
			b.WriteString(call.FunctionName())
			list("(", ")", call.Args())
		case ast.ListKind:
			l := e.AsList()
			fmt.Fprint(&b, l.OptionalIndices())
			list("[", "]", l.Elements())
		case ast.MapKind:
			b.WriteByte('{')
			for _, en := range e.AsMap().Entries() {
				me := en.AsMapEntry()
				if me.IsOptional() {
					b.WriteByte('?')
				}
				write(me.Key())
				b.WriteByte(':')
				write(me.Value())
				b.WriteByte(',')
			}
			b.WriteByte('}')
		case ast.ComprehensionKind:
			f := e.AsComprehension()
			b.WriteString("fold(" + f.IterVar() + "," + f.IterVar2() + "," + f.AccuVar())
			list(";", ")", []ast.Expr{f.IterRange(), f.AccuInit(), f.LoopCondition(), f.LoopStep(), f.Result()})
		default: // a struct literal: never the same key as another expression
			fmt.Fprintf(&b, "#%d", e.ID())
		}
	}
	write(e)
	return b.String()
}

// isOperator tells CEL's operators (_+_, !_, -_, @in, ...) from its functions.
func isOperator(fn string) bool {
	return fn != "" && strings.ContainsRune("_@!-", rune(fn[0]))
}

// argsOnly is the type of the arguments e reads when it reads nothing else (no state,
// no comprehension, no clock), nil otherwise.
func (c *closures) argsOnly(e ast.Expr) *objType {
	var ot *objType
	only := true
	ast.PreOrderVisit(e, ast.NewExprVisitor(func(x ast.Expr) {
		switch x.Kind() {
		case ast.ComprehensionKind:
			only = false
		case ast.IdentKind:
			name, ok := c.name(x)
			if _, local := c.local(name); !ok || local || name != "args" {
				only = false
				return
			}
			if _, isState := c.slots[name]; isState {
				only = false
				return
			}
			t := c.types[x.ID()]
			if t == nil || t.Kind() != types.StructKind || c.prov.objs[t.TypeName()] == nil {
				only = false
				return
			}
			ot = c.prov.objs[t.TypeName()]
		}
	}))
	if !only {
		return nil
	}
	return ot
}

// value compiles an expression to a closure of CEL values (its operands as expr does).
func (c *closures) value(e ast.Expr) (cfn, bool) {
	switch e.Kind() {
	case ast.LiteralKind:
		v := e.AsLiteral()
		return func(*activation) ref.Val { return v }, true
	case ast.IdentKind:
		return c.ident(e.ID(), e.AsIdent())
	case ast.SelectKind:
		return c.selectField(e)
	case ast.ListKind:
		return c.list(e)
	case ast.MapKind:
		return c.mapLit(e)
	case ast.CallKind:
		return c.call(e)
	case ast.ComprehensionKind:
		return c.comprehension(e)
	}
	return nil, false
}

// ident resolves a name when the world loads: a comprehension's variable, then the
// state's names and the activation's own, in the order activation.ResolveName reads them.
func (c *closures) ident(id int64, name string) (cfn, bool) {
	if r, ok := c.refs[id]; ok {
		if r.Value != nil {
			v := r.Value
			return func(*activation) ref.Val { return v }, true
		}
		if t := c.types[id]; t != nil && t.Kind() == types.TypeKind {
			return nil, false
		}
		name = r.Name
	}
	for i := len(c.scope) - 1; i >= 0; i-- {
		if c.scope[i].name == name {
			s := c.scope[i].slot
			return func(a *activation) ref.Val {
				if v := a.ep.loc[s]; v != nil {
					return v
				}
				return errUnsure
			}, true
		}
	}
	if c.plan {
		switch name {
		case "task":
			return func(a *activation) ref.Val {
				if a.plan != nil {
					return a.plan.taskVal
				}
				return errUnsure
			}, true
		case "results":
			return func(a *activation) ref.Val {
				if a.plan != nil {
					return a.plan.resultsVal
				}
				return errUnsure
			}, true
		}
		return nil, false
	}
	if k, ok := c.slots[name]; ok {
		if k >= 0 {
			return func(a *activation) ref.Val {
				if v := a.ep.vars[k]; v != nil {
					return v
				}
				return errUnsure
			}, true
		}
		k = -k - 1
		return func(a *activation) ref.Val {
			if k < len(a.ep.ents) {
				return &a.ep.ents[k]
			}
			return errUnsure
		}, true
	}
	switch name {
	case "args":
		return func(a *activation) ref.Val {
			if a.args != nil {
				return a.args
			}
			return errUnsure
		}, true
	case "now_ms":
		return func(a *activation) ref.Val { return types.Int(a.ep.clock.Milliseconds()) }, true
	case "step":
		return func(a *activation) ref.Val { return types.Int(a.ep.step) }, true
	case "new_id":
		return func(a *activation) ref.Val {
			if a.newID != nil {
				return a.newID
			}
			return errUnsure
		}, true
	case "i":
		return func(a *activation) ref.Val {
			if a.self != nil && a.i != nil {
				return a.i
			}
			return errUnsure
		}, true
	case "id":
		return func(a *activation) ref.Val {
			if a.self != nil && a.id != nil {
				return a.id
			}
			return errUnsure
		}, true
	case "self":
		return func(a *activation) ref.Val {
			if a.self != nil {
				return a.self
			}
			return errUnsure
		}, true
	}
	// Any other declared name is the element an answer's list of objects binds
	// (obsField.as) while it writes the element's object.
	return func(a *activation) ref.Val {
		if a.elem != nil && a.elemName == name {
			return a.elem
		}
		return errUnsure
	}, true
}

// selectField reads a field: of an object by its position, of a map by its key.
func (c *closures) selectField(e ast.Expr) (cfn, bool) {
	s := e.AsSelect()
	if s.IsTestOnly() {
		return nil, false
	}
	if r, ok := c.refs[e.ID()]; ok {
		return c.ident(e.ID(), r.Name) // a qualified name
	}
	op, ok := c.expr(s.Operand())
	if !ok {
		return nil, false
	}
	field := s.FieldName()
	// An interface value made once: a types.String made one at each call allocates.
	var key ref.Val = types.String(field)
	var ot *objType
	if t := c.types[s.Operand().ID()]; t != nil && t.Kind() == types.StructKind {
		ot = c.prov.objs[t.TypeName()]
	}
	if ot != nil {
		if i, ok := ot.index[field]; ok {
			return func(a *activation) ref.Val {
				v := op(a)
				if o, ok := v.(*object); ok && o.t == ot {
					if x := o.vals[i]; x != nil {
						return x
					}
					return errUnsure
				}
				return selectDyn(v, key)
			}, true
		}
	}
	return func(a *activation) ref.Val { return selectDyn(op(a), key) }, true
}

func selectDyn(v ref.Val, key ref.Val) ref.Val {
	if m, ok := v.(traits.Mapper); ok {
		if x, found := m.Find(key); found && !types.IsError(x) {
			return x
		}
	}
	return errUnsure
}

// index is a[k]: an entity of a collection or an entry of a map by its key, an element
// of a list by its position.
func index(v, k ref.Val) ref.Val {
	switch x := v.(type) {
	case *collection:
		if s, ok := k.(types.String); ok {
			if o, ok := x.row(string(s)); ok {
				return o
			}
		}
		return errUnsure
	case traits.Mapper:
		if r, found := x.Find(k); found && !types.IsError(r) {
			return r
		}
		return errUnsure
	case traits.Lister:
		if n, ok := k.(types.Int); ok && n >= 0 && n < x.Size().(types.Int) {
			return x.Get(n)
		}
	}
	return errUnsure
}

func (c *closures) list(e ast.Expr) (cfn, bool) {
	l := e.AsList()
	if len(l.OptionalIndices()) > 0 {
		return nil, false
	}
	elems := make([]cfn, len(l.Elements()))
	constant := true
	for i, x := range l.Elements() {
		f, ok := c.expr(x)
		if !ok {
			return nil, false
		}
		elems[i] = f
		constant = constant && x.Kind() == ast.LiteralKind
	}
	if constant {
		vals := make([]ref.Val, len(elems))
		for i, x := range l.Elements() {
			vals[i] = x.AsLiteral()
		}
		v := types.NewRefValList(c.adapter, vals)
		return func(*activation) ref.Val { return v }, true
	}
	adapter := c.adapter
	return func(a *activation) ref.Val {
		vals := make([]ref.Val, len(elems))
		for i, f := range elems {
			v := f(a)
			if types.IsError(v) {
				return v
			}
			vals[i] = v
		}
		return types.NewRefValList(adapter, vals)
	}, true
}

func (c *closures) mapLit(e ast.Expr) (cfn, bool) {
	m := e.AsMap()
	keys := make([]cfn, len(m.Entries()))
	vals := make([]cfn, len(m.Entries()))
	for i, en := range m.Entries() {
		me := en.AsMapEntry()
		if me.IsOptional() {
			return nil, false
		}
		var ok bool
		if keys[i], ok = c.expr(me.Key()); !ok {
			return nil, false
		}
		if vals[i], ok = c.expr(me.Value()); !ok {
			return nil, false
		}
	}
	adapter := c.adapter
	if rk := constantKeys(m, adapter); rk != nil {
		return func(a *activation) ref.Val {
			r := &record{keys: rk, vals: make([]ref.Val, len(vals))}
			for i, vf := range vals {
				v := vf(a)
				if types.IsError(v) {
					return v
				}
				r.vals[i] = v
			}
			return r
		}, true
	}
	return func(a *activation) ref.Val {
		entries := make(map[ref.Val]ref.Val, len(keys))
		for i, kf := range keys {
			k := kf(a)
			if types.IsError(k) {
				return k
			}
			v := vals[i](a)
			if types.IsError(v) {
				return v
			}
			entries[k] = v
		}
		return types.NewRefValMap(adapter, entries)
	}, true
}

func (c *closures) call(e ast.Expr) (cfn, bool) {
	call := e.AsCall()
	fn := call.FunctionName()
	var exprs []ast.Expr
	if call.IsMemberFunction() {
		exprs = append(exprs, call.Target())
	}
	exprs = append(exprs, call.Args()...)
	switch {
	case fn == operators.Conditional && len(exprs) == 3:
		return c.conditionalValue(exprs)
	case fn == operators.Index && len(exprs) == 2 && c.isCollection(exprs[0]) && c.kindOf(exprs[1]) == types.StringKind:
		return c.entityAt(exprs)
	}
	args := make([]cfn, len(exprs))
	for i, x := range exprs {
		f, ok := c.expr(x)
		if !ok {
			return nil, false
		}
		args[i] = f
	}
	switch fn {
	case operators.Equals, operators.NotEquals:
		if len(args) != 2 {
			return nil, false
		}
		l, r := args[0], args[1]
		ne := fn == operators.NotEquals
		return func(a *activation) ref.Val {
			lv := l(a)
			if types.IsError(lv) {
				return lv
			}
			rv := r(a)
			if types.IsError(rv) {
				return rv
			}
			eq := types.Equal(lv, rv)
			if ne {
				return types.Bool(eq != types.True)
			}
			return eq
		}, true
	case operators.Index:
		if len(args) != 2 {
			return nil, false
		}
		l, r := args[0], args[1]
		return func(a *activation) ref.Val {
			lv := l(a)
			if types.IsError(lv) {
				return lv
			}
			rv := r(a)
			if types.IsError(rv) {
				return rv
			}
			return index(lv, rv)
		}, true
	case operators.OptIndex, operators.OptSelect:
		return nil, false
	}
	// The binding the interpreter would call: by the overload the checker chose, else
	// the function's own dispatch by the arguments' types.
	var impl *functions.Overload
	if r, ok := c.refs[e.ID()]; ok && len(r.OverloadIDs) == 1 {
		impl = c.fns[r.OverloadIDs[0]]
	}
	if impl == nil {
		impl = c.fns[fn]
	}
	if impl == nil || impl.Async != nil || impl.LateBound {
		return nil, false
	}
	strict, trait := !impl.NonStrict, impl.OperandTrait
	ok := func(v ref.Val) bool {
		if trait == 0 {
			return true
		}
		if !strict && types.IsUnknownOrError(v) {
			return true
		}
		return v.Type().HasTrait(trait)
	}
	switch {
	case len(args) == 1 && impl.Unary != nil:
		f, x := impl.Unary, args[0]
		return func(a *activation) ref.Val {
			v := x(a)
			if strict && types.IsError(v) {
				return v
			}
			if !ok(v) {
				return errUnsure
			}
			return f(v)
		}, true
	case len(args) == 2 && impl.Binary != nil:
		f, l, r := impl.Binary, args[0], args[1]
		return func(a *activation) ref.Val {
			lv := l(a)
			if strict && types.IsError(lv) {
				return lv
			}
			rv := r(a)
			if strict && types.IsError(rv) {
				return rv
			}
			if !ok(lv) {
				return errUnsure
			}
			return f(lv, rv)
		}, true
	case impl.Function != nil && (len(args) > 2 || len(args) == 0 ||
		(len(args) == 1 && impl.Unary == nil) || (len(args) == 2 && impl.Binary == nil)):
		f := impl.Function
		return func(a *activation) ref.Val {
			vals := make([]ref.Val, len(args))
			for i, x := range args {
				v := x(a)
				if strict && types.IsError(v) {
					return v
				}
				vals[i] = v
			}
			if len(vals) > 0 && !ok(vals[0]) {
				return errUnsure
			}
			return f(vals...)
		}, true
	}
	return nil, false
}

// conditionalValue is cond ? yes : no of values that are not bools, ints or strings
// (compiledtyped.go has those).
func (c *closures) conditionalValue(args []ast.Expr) (cfn, bool) {
	cond, ok := c.boolOf(args[0])
	if !ok {
		return nil, false
	}
	yes, ok1 := c.expr(args[1])
	no, ok2 := c.expr(args[2])
	if !ok1 || !ok2 {
		return nil, false
	}
	return func(a *activation) ref.Val {
		switch v, ok := cond(a); {
		case !ok:
			return errUnsure
		case bool(v):
			return yes(a)
		}
		return no(a)
	}, true
}

func (c *closures) push(name string) int {
	s := c.depth
	c.depth++
	c.w.locals = max(c.w.locals, c.depth)
	c.scope = append(c.scope, local{name: name, slot: s})
	return s
}

func (c *closures) comprehension(e ast.Expr) (cfn, bool) {
	fold := e.AsComprehension()
	if isLet(fold) {
		return c.let(fold)
	}
	if isMapInsert(fold) {
		return nil, false
	}
	mutable := isListAppend(fold)
	rangeF, ok := c.expr(fold.IterRange())
	if !ok {
		return nil, false
	}
	initF, ok := c.expr(fold.AccuInit())
	if !ok {
		return nil, false
	}
	scope, depth := len(c.scope), c.depth
	accu := c.push(fold.AccuVar())
	v1 := c.push(fold.IterVar())
	v2 := -1
	two := fold.HasIterVar2() && fold.IterVar2() != ""
	if two {
		v2 = c.push(fold.IterVar2())
	}
	condF, ok := c.expr(fold.LoopCondition())
	if !ok {
		return nil, false
	}
	stepF, ok := c.expr(fold.LoopStep())
	if !ok {
		return nil, false
	}
	fast := false
	if mutable {
		if stepF, fast = c.appendStep(fold, accu); !fast {
			return nil, false
		}
	}
	c.scope = c.scope[:scope+1] // the result sees the accumulator, not the iteration variables
	resultF, ok := c.expr(fold.Result())
	if !ok {
		return nil, false
	}
	c.scope, c.depth = c.scope[:scope], depth
	f := &compFold{rangeF: rangeF, initF: initF, condF: condF, stepF: stepF, resultF: resultF,
		accu: accu, v1: v1, v2: v2, two: two, mutable: mutable, adapter: c.adapter}
	return f.eval, true
}

// compFold is a compiled comprehension: CEL's macros (exists, all, map, filter,
// transformList, cel.bind) are comprehensions.
type compFold struct {
	rangeF, initF, condF, stepF, resultF cfn
	accu, v1, v2                         int
	two, mutable                         bool
	adapter                              types.Adapter
	// pred, for an exists (all false) or an all (all true) compiled by quantify, takes
	// the place of the condition and the step.
	pred boolFn
	all  types.Bool
}

// turn folds one entry into the accumulator: false stops the fold, and stopped says
// its condition was neither true nor false (the interpreter decides then).
func (f *compFold) turn(a *activation, k, v ref.Val) (more, stopped bool) {
	loc := a.ep.loc
	loc[f.v1] = k
	if f.two {
		loc[f.v2] = v
	}
	if f.pred != nil {
		// The accumulator as CEL's: the start until an element decides, then what it
		// decided; an element not sure leaves it unsure unless a later one decides.
		switch p, ok := f.pred(a); {
		case !ok:
			loc[f.accu] = errUnsure
		case p != f.all:
			loc[f.accu] = p
			return false, false
		}
		return true, false
	}
	switch f.condF(a) {
	case types.True:
	case types.False:
		return false, false
	default:
		return false, true
	}
	loc[f.accu] = f.stepF(a)
	return true, false
}

func (f *compFold) eval(a *activation) ref.Val {
	r := f.rangeF(a)
	if types.IsError(r) {
		return r
	}
	init := f.initF(a)
	if types.IsError(init) {
		return init
	}
	made := false
	if f.mutable {
		if l, ok := init.(traits.Lister); ok && l.Size() == types.IntZero {
			init = &appendAcc{}
			made = true
		}
	}
	a.ep.loc[f.accu] = init
	if !f.each(a, r) {
		return errUnsure
	}
	res := f.resultF(a)
	if made {
		acc, ok := res.(*appendAcc)
		if !ok {
			return errUnsure
		}
		res = types.NewRefValList(f.adapter, acc.elems)
	}
	return res
}

// quantify is an exists or an all.
func (f *compFold) quantify(a *activation) (types.Bool, bool) {
	r := f.rangeF(a)
	if types.IsError(r) {
		return false, false
	}
	a.ep.loc[f.accu] = f.all
	if !f.each(a, r) {
		return false, false
	}
	b, ok := a.ep.loc[f.accu].(types.Bool)
	return b, ok
}

// each folds the entries of r in the interpreter's order until a turn stops: false
// when the interpreter decides (r is not a range closures know, or a condition was
// neither true nor false).
func (f *compFold) each(a *activation, r ref.Val) bool {
	stopped := false
	switch x := r.(type) {
	case *collection:
		for i, o := range x.objs {
			var k ref.Val = o.vals[0] // an entity's id, already a CEL value
			if s, ok := k.(types.String); !ok || string(s) != x.ids[i] {
				k = types.String(x.ids[i])
			}
			var more bool
			if more, stopped = f.turn(a, k, o); !more {
				break
			}
		}
	case traits.Lister:
		elems := a.ep.listElems(x)
		n := int64(x.Size().(types.Int))
		for i := int64(0); i < n; i++ {
			var el ref.Val
			if elems != nil {
				el = elems[i]
			} else {
				el = x.Get(types.Int(i))
			}
			var more bool
			if f.two {
				more, stopped = f.turn(a, types.Int(i), el)
			} else {
				more, stopped = f.turn(a, el, nil)
			}
			if !more {
				break
			}
		}
	case traits.Mapper:
		if sz, ok := x.Size().(types.Int); ok && sz == 0 {
			break
		}
		mf := &mapFolder{f: f, a: a}
		types.ToFoldableMap(x).Fold(mf)
		stopped = mf.stopped
	default:
		return false
	}
	return !stopped
}

// mapFolder folds the entries of a map that is not an entity collection.
type mapFolder struct {
	f       *compFold
	a       *activation
	stopped bool
}

func (m *mapFolder) FoldEntry(k, v any) bool {
	kv, ok1 := k.(ref.Val)
	vv, ok2 := v.(ref.Val)
	if !ok1 || !ok2 {
		m.stopped = true
		return false
	}
	more, stopped := m.f.turn(m.a, kv, vv)
	m.stopped = stopped
	return more
}

// isLet is a comprehension over an empty list (cel.bind is one): its result read with
// the accumulator at its start, the loop never run.
func isLet(fold ast.ComprehensionExpr) bool {
	r := fold.IterRange()
	return r.Kind() == ast.ListKind && r.AsList().Size() == 0
}

// let compiles a comprehension isLet accepts: its start into the accumulator's slot,
// then its result.
func (c *closures) let(fold ast.ComprehensionExpr) (cfn, bool) {
	initF, accu, ok := c.letStart(fold)
	if !ok {
		return nil, false
	}
	resultF, ok := c.expr(fold.Result())
	c.scope, c.depth = c.scope[:len(c.scope)-1], c.depth-1
	if !ok {
		return nil, false
	}
	return func(a *activation) ref.Val {
		v := initF(a)
		if types.IsError(v) {
			return v
		}
		a.ep.loc[accu] = v
		return resultF(a)
	}, true
}

// letStart compiles a let's start and puts its accumulator in reach (the caller takes
// it out once the result is compiled).
func (c *closures) letStart(fold ast.ComprehensionExpr) (cfn, int, bool) {
	initF, ok := c.expr(fold.AccuInit())
	if !ok {
		return nil, 0, false
	}
	return initF, c.push(fold.AccuVar()), true
}

// isListAppend is the shape of comprehension whose list accumulator the interpreter
// backs by a mutable list (map, filter, transformList): its accumulator is a name
// expressions cannot write, starts as [] and grows by accu + [elem].
func isListAppend(fold ast.ComprehensionExpr) bool {
	accu := fold.AccuVar()
	if !strings.HasPrefix(accu, "@") || accu == fold.IterVar() || accu == fold.IterVar2() {
		return false
	}
	if r := fold.Result(); r.Kind() != ast.IdentKind || r.AsIdent() != accu {
		return false
	}
	init := fold.AccuInit()
	if init.Kind() != ast.ListKind || init.AsList().Size() != 0 {
		return false
	}
	step := fold.LoopStep()
	if step.Kind() != ast.CallKind {
		return false
	}
	call := step.AsCall()
	if call.FunctionName() == operators.Conditional && len(call.Args()) == 3 {
		branch := call.Args()[1]
		if branch.Kind() != ast.CallKind {
			return false
		}
		call = branch.AsCall()
	}
	args := call.Args()
	return call.FunctionName() == operators.Add && len(args) == 2 &&
		args[0].Kind() == ast.IdentKind && args[0].AsIdent() == accu &&
		args[1].Kind() == ast.ListKind && args[1].AsList().Size() == 1
}

// isMapInsert is the shape whose map accumulator the interpreter backs by a mutable map
// (transformMap): left to the interpreter.
func isMapInsert(fold ast.ComprehensionExpr) bool {
	init := fold.AccuInit()
	return init.Kind() == ast.MapKind && init.AsMap().Size() == 0
}

// checkClosures, when set, is called with every value a closure gave instead of the
// interpreter: the differential test evaluates the expression again with the
// interpreter there.
var checkClosures func(p *program, a *activation, v ref.Val)

// record is a map literal whose keys are distinct string constants ({'sku': k, 'name':
// p.name}), as a closure builds it: its values in the literal's order, its keys shared.
// It is the map CEL's interpreter would build, without a Go map per evaluation; what
// it does not do itself (equality, conversions) it does as that map.
type record struct {
	keys *recordKeys
	vals []ref.Val
}

// recordKeys are the keys of a map literal (or of an object of an answer the oracle
// read): in the literal's order, as CEL values, and the positions in the order of
// their names (JSON's). A literal's are made when the world loads (none are made
// later for it: an empty literal has none to make); an answer's, nil until something
// needs them (keyVals, order), which only the oracle that read it does.
type recordKeys struct {
	names   []string
	vals    []ref.Val
	sorted  []int
	adapter types.Adapter
}

// keyVals returns the keys as CEL values.
func (rk *recordKeys) keyVals() []ref.Val {
	if rk.vals == nil && len(rk.names) > 0 {
		rk.vals = make([]ref.Val, len(rk.names))
		for i, k := range rk.names {
			rk.vals[i] = types.String(k)
		}
	}
	return rk.vals
}

// order returns the positions of the keys in the order of their names.
func (rk *recordKeys) order() []int {
	if rk.sorted == nil && len(rk.names) > 0 {
		rk.sorted = make([]int, len(rk.names))
		for i := range rk.sorted {
			rk.sorted[i] = i
		}
		slices.SortFunc(rk.sorted, func(a, b int) int { return cmpString(rk.names[a], rk.names[b]) })
	}
	return rk.sorted
}

// constantKeys returns the keys of a map literal whose keys are distinct string
// literals, or nil.
func constantKeys(m ast.MapExpr, adapter types.Adapter) *recordKeys {
	rk := &recordKeys{adapter: adapter}
	for _, en := range m.Entries() {
		k := en.AsMapEntry().Key()
		if k.Kind() != ast.LiteralKind {
			return nil
		}
		s, ok := k.AsLiteral().(types.String)
		if !ok || slices.Contains(rk.names, string(s)) {
			return nil
		}
		rk.names = append(rk.names, string(s))
		rk.vals = append(rk.vals, s)
	}
	rk.sorted = make([]int, len(rk.names))
	for i := range rk.sorted {
		rk.sorted[i] = i
	}
	slices.SortFunc(rk.sorted, func(a, b int) int { return cmpString(rk.names[a], rk.names[b]) })
	return rk
}

var (
	_ traits.Mapper = (*record)(nil)
)

// asMap is the record as the map CEL's interpreter builds.
func (r *record) asMap() traits.Mapper {
	entries := make(map[ref.Val]ref.Val, len(r.vals))
	keys := r.keys.keyVals()
	for i, v := range r.vals {
		entries[keys[i]] = v
	}
	return types.NewRefValMap(r.keys.adapter, entries)
}

func (r *record) ConvertToNative(t reflect.Type) (any, error) { return r.asMap().ConvertToNative(t) }
func (r *record) ConvertToType(t ref.Type) ref.Val            { return r.asMap().ConvertToType(t) }
func (r *record) Equal(other ref.Val) ref.Val                 { return r.asMap().Equal(other) }
func (r *record) Type() ref.Type                              { return types.MapType }
func (r *record) Value() any                                  { return r.asMap().Value() }
func (r *record) Size() ref.Val                               { return types.Int(len(r.vals)) }
func (r *record) Iterator() traits.Iterator                   { return r.asMap().Iterator() }

func (r *record) Contains(key ref.Val) ref.Val {
	if s, ok := key.(types.String); ok {
		return types.Bool(slices.Contains(r.keys.names, string(s)))
	}
	return r.asMap().Contains(key)
}

func (r *record) Find(key ref.Val) (ref.Val, bool) {
	if s, ok := key.(types.String); ok {
		if i := slices.Index(r.keys.names, string(s)); i >= 0 {
			return r.vals[i], true
		}
		return nil, false
	}
	return r.asMap().Find(key)
}

// field is the value of key name, nil when the record has none.
func (r *record) field(name string) ref.Val {
	if i := slices.Index(r.keys.names, name); i >= 0 {
		return r.vals[i]
	}
	return nil
}

// put sets key name to v, adding the key after the others when it is new. Only a
// record whose keys are its own may grow (the oracle's results).
func (r *record) put(name string, v ref.Val) {
	if i := slices.Index(r.keys.names, name); i >= 0 {
		r.vals[i] = v
		return
	}
	rk := r.keys
	rk.names, r.vals = append(rk.names, name), append(r.vals, v)
	rk.vals, rk.sorted = nil, nil // made again when needed
}

func (r *record) Get(key ref.Val) ref.Val {
	if v, ok := r.Find(key); ok {
		return v
	}
	return r.asMap().Get(key)
}

// listElems returns the elements of a list a comprehension iterates for the second
// time in a row (a list of words bound once and folded once per entity), read once:
// a list of strings makes a new CEL value of each element on every read. Nil the first
// time. The episode keeps the list, so that its address stands for it.
func (e *episode) listElems(l traits.Lister) []ref.Val {
	if reflect.TypeOf(l).Kind() != reflect.Pointer {
		return nil
	}
	if e.lastList != l {
		e.lastList, e.lastElems = l, nil
		return nil
	}
	if e.lastElems == nil {
		n := int64(l.Size().(types.Int))
		elems := make([]ref.Val, n)
		for i := range n {
			elems[i] = l.Get(types.Int(i))
		}
		e.lastElems = elems
	}
	return e.lastElems
}

// appendStep compiles the step of a comprehension that builds a list (map, filter,
// transformList: accu + [elem], or cond ? accu + [elem] : accu) to append to a Go slice,
// where the interpreter appends to a mutable list a one-element list made per turn; the
// list it ends with is the same. The accumulator is an appendAcc while the fold runs.
func (c *closures) appendStep(fold ast.ComprehensionExpr, accu int) (cfn, bool) {
	if l := fold.LoopCondition(); l.Kind() != ast.LiteralKind || l.AsLiteral() != types.True {
		return nil, false
	}
	step := fold.LoopStep()
	var when boolFn
	if call := step.AsCall(); call.FunctionName() == operators.Conditional {
		args := call.Args()
		if no := args[2]; no.Kind() != ast.IdentKind || no.AsIdent() != fold.AccuVar() {
			return nil, false
		}
		var ok bool
		if when, ok = c.boolOf(args[0]); !ok {
			return nil, false
		}
		step = args[1]
	}
	elem, ok := c.expr(step.AsCall().Args()[1].AsList().Elements()[0])
	if !ok {
		return nil, false
	}
	return func(a *activation) ref.Val {
		acc, ok := a.ep.loc[accu].(*appendAcc)
		if !ok {
			return errUnsure
		}
		if when != nil {
			switch v, ok := when(a); {
			case !ok:
				return errUnsure
			case !bool(v):
				return acc
			}
		}

		v := elem(a)
		if types.IsError(v) {
			return errUnsure
		}
		acc.elems = append(acc.elems, v)
		return acc
	}, true
}

// appendAcc is the accumulator of a list-building comprehension while it runs: never
// seen by anything but its step and its result.
type appendAcc struct{ elems []ref.Val }

func (x *appendAcc) ConvertToNative(reflect.Type) (any, error) {
	return nil, errors.New("an accumulator has no native form")
}
func (x *appendAcc) ConvertToType(ref.Type) ref.Val { return errUnsure }
func (x *appendAcc) Equal(ref.Val) ref.Val          { return errUnsure }
func (x *appendAcc) Type() ref.Type                 { return types.ErrType }
func (x *appendAcc) Value() any                     { return x }
