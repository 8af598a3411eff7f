package world

import (
	"cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/types"
)

// End conditions' parts. A step re-evaluates an end condition when it wrote something
// the condition reads (World.ends); most of that evaluation is its exists and all over
// entity collections, and most of those read nothing the step wrote: an order created
// changes what orders.exists(...) finds, not what product.exists(...) does. A part is
// such an exists or all: not inside another comprehension, reading nothing but the
// state (no clock, no step). While a step evaluates the end conditions, a part's value
// stands until a step writes something it reads, as an end condition's verdict does,
// and a part written the same way in two conditions is evaluated once for both.

// endPart is a part of the end conditions: the state it reads.
type endPart struct {
	reads stateSet
}

// endParts numbers the parts of p, an end condition, by their expression's id (nil when
// p is not an end condition or has none), adding new parts to the world's.
func (w *World) endParts(p *program) map[int64]int {
	if p == nil || p.ast == nil || !w.isEnd(p) {
		return nil
	}
	native := p.ast.NativeRep()
	var parts map[int64]int
	var walk func(e ast.Expr)
	walk = func(e ast.Expr) {
		switch e.Kind() {
		case ast.ComprehensionKind:
			fold := e.AsComprehension()
			if _, _, isQ := quantifier(fold); !isQ {
				return
			}
			reads, closed := w.closedReads(e)
			if !closed {
				return
			}
			text := exprKey(e)
			j, ok := w.partText[text]
			if !ok {
				j = len(w.parts)
				w.parts = append(w.parts, endPart{reads: reads})
				if w.partText == nil {
					w.partText = map[string]int{}
				}
				w.partText[text] = j
			}
			if parts == nil {
				parts = map[int64]int{}
			}
			parts[e.ID()] = j
		case ast.CallKind:
			call := e.AsCall()
			if call.IsMemberFunction() {
				walk(call.Target())
			}
			for _, x := range call.Args() {
				walk(x)
			}
		case ast.SelectKind:
			walk(e.AsSelect().Operand())
		case ast.ListKind:
			for _, x := range e.AsList().Elements() {
				walk(x)
			}
		}
	}
	walk(native.Expr())
	return parts
}

func (w *World) isEnd(p *program) bool {
	for _, ec := range w.ends {
		if ec.p == p {
			return true
		}
	}
	return false
}

// closedReads is the state a comprehension reads, and whether it reads nothing else:
// every name in it is the state's or one of its own comprehensions' variables.
func (w *World) closedReads(e ast.Expr) (stateSet, bool) {
	own := map[string]bool{}
	ast.PreOrderVisit(e, ast.NewExprVisitor(func(x ast.Expr) {
		if x.Kind() == ast.ComprehensionKind {
			f := x.AsComprehension()
			own[f.AccuVar()], own[f.IterVar()], own[f.IterVar2()] = true, true, true
		}
	}))
	reads := newStateSet(len(w.vars) + len(w.entities))
	closed := true
	ast.PreOrderVisit(e, ast.NewExprVisitor(func(x ast.Expr) {
		if x.Kind() != ast.IdentKind {
			return
		}
		name := x.AsIdent()
		k, isState := w.slots[name]
		switch {
		case isState:
			// A comprehension's variable named like the state shadows it: counted as a
			// read, which only costs an evaluation.
			if k < 0 {
				k = len(w.vars) - 1 - k
			}
			reads.add(k)
		case !own[name]:
			closed = false
		}
	}))
	return reads, closed
}

// remembered is part j of the end conditions, compiled as f: while a step evaluates
// them (activation.ends), its value stands until a step writes what it reads
// (episode.apply forgets it then).
func remembered(j int, f boolFn) boolFn {
	return func(a *activation) (types.Bool, bool) {
		if !a.ends {
			return f(a)
		}
		ep := a.ep
		if ep.partKnown[j] {
			return ep.partValue[j], true
		}
		v, ok := f(a)
		if ok {
			ep.partKnown[j], ep.partValue[j] = true, v
		}
		return v, ok
	}
}
