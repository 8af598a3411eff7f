package scoring

import (
	"cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/operators"
	"cel.dev/cel-go/common/overloads"
	"cel.dev/cel-go/common/types"

	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// An expression's native form: the common shapes of a spec's expressions (conditionals,
// comparisons, arithmetic on doubles, && || !, size of a list field, double() of a number,
// the scalar fields and literals) compiled once, at load, into Go closures over the step's messages, so scoring a
// step neither walks CEL's plan nor boxes a value. Within these shapes CEL's evaluation
// cannot fail (double arithmetic is IEEE's, a NaN compares false and unequal to everything,
// integers are only compared), so a closure gives exactly CEL's value. An expression with
// anything else (int arithmetic, which CEL checks for overflow; comparisons across number
// types; strings; maps; macros) has no native form and is evaluated by CEL.
// TestNativeIsCEL checks the two agree bit for bit.
type (
	nativeDouble func(m msgs) float64
	nativeBool   func(m msgs) bool
	nativeInt    func(m msgs) int64
	nativeUint   func(m msgs) uint64
)

// msgs are what a native form reads: a step's messages, never nil (activation's). Passed
// by value, so the activation of a step stays on the stack.
type msgs struct {
	sig *gauntletv1.Signals
	met *gauntletv1.Metering
	ep  *gauntletv1.EpisodeSoFar
}

// native is one compiled node: exactly one of its closures is set, the one of its type.
type native struct {
	d nativeDouble
	b nativeBool
	i nativeInt
	u nativeUint
}

// nativeExpr returns the native form of a checked expression as a number (number's
// conversion of CEL's value), nil when it has none.
func nativeExpr(checked *ast.AST) func(m msgs) float64 {
	n, ok := nativeNode(checked, checked.Expr())
	if !ok {
		return nil
	}
	switch {
	case n.d != nil:
		return n.d
	case n.i != nil:
		f := n.i
		return func(m msgs) float64 { return float64(f(m)) }
	case n.u != nil:
		f := n.u
		return func(m msgs) float64 { return float64(f(m)) }
	case n.b != nil:
		f := n.b
		return func(m msgs) float64 {
			if f(m) {
				return 1
			}
			return 0
		}
	}
	return nil
}

// nativeNode compiles e; false when e, or a part of it, has no native form.
func nativeNode(checked *ast.AST, e ast.Expr) (native, bool) {
	switch e.Kind() {
	case ast.LiteralKind:
		switch v := e.AsLiteral().(type) {
		case types.Double:
			return native{d: func(msgs) float64 { return float64(v) }}, true
		case types.Int:
			return native{i: func(msgs) int64 { return int64(v) }}, true
		case types.Uint:
			return native{u: func(msgs) uint64 { return uint64(v) }}, true
		case types.Bool:
			return native{b: func(msgs) bool { return bool(v) }}, true
		}
	case ast.IdentKind, ast.SelectKind:
		// The checker rewrites a scalar field's selection (signals.budget) into the
		// variable of that name.
		return nativeField(variable(checked, e))
	case ast.CallKind:
		return nativeCall(checked, e.AsCall())
	}
	return native{}, false
}

// variable is the name of the variable e refers to, "" when it refers to none.
func variable(checked *ast.AST, e ast.Expr) string {
	if r, ok := checked.ReferenceMap()[e.ID()]; ok && r.Value == nil {
		return r.Name
	}
	return ""
}

// nativeCall compiles a call: an operator, size, or a conversion of a number to double.
func nativeCall(checked *ast.AST, call ast.CallExpr) (native, bool) {
	args := call.Args()
	if call.IsMemberFunction() {
		args = append([]ast.Expr{call.Target()}, args...)
	}
	if call.FunctionName() == overloads.Size && len(args) == 1 {
		return nativeSize(variable(checked, args[0]))
	}
	ns := make([]native, len(args))
	for i, arg := range args {
		n, ok := nativeNode(checked, arg)
		if !ok {
			return native{}, false
		}
		ns[i] = n
	}
	switch fn := call.FunctionName(); {
	case fn == operators.Conditional && len(ns) == 3:
		return nativeConditional(ns[0], ns[1], ns[2])
	case fn == operators.LogicalOr && len(ns) == 2 && ns[0].b != nil && ns[1].b != nil:
		l, r := ns[0].b, ns[1].b
		return native{b: func(m msgs) bool { return l(m) || r(m) }}, true
	case fn == operators.LogicalAnd && len(ns) == 2 && ns[0].b != nil && ns[1].b != nil:
		l, r := ns[0].b, ns[1].b
		return native{b: func(m msgs) bool { return l(m) && r(m) }}, true
	case fn == operators.LogicalNot && len(ns) == 1 && ns[0].b != nil:
		f := ns[0].b
		return native{b: func(m msgs) bool { return !f(m) }}, true
	case fn == overloads.TypeConvertDouble && len(ns) == 1 && ns[0].i != nil:
		f := ns[0].i
		return native{d: func(m msgs) float64 { return float64(f(m)) }}, true
	case fn == overloads.TypeConvertDouble && len(ns) == 1 && ns[0].u != nil:
		f := ns[0].u
		return native{d: func(m msgs) float64 { return float64(f(m)) }}, true
	case fn == overloads.TypeConvertDouble && len(ns) == 1 && ns[0].d != nil:
		return ns[0], true
	case fn == operators.Negate && len(ns) == 1 && ns[0].d != nil:
		// Only doubles: negating an int can overflow, which CEL reports.
		f := ns[0].d
		return native{d: func(m msgs) float64 { return -f(m) }}, true
	case len(ns) == 2:
		return nativeBinary(fn, ns[0], ns[1])
	}
	return native{}, false
}

// nativeConditional is cond ? t : f, both branches of one type.
func nativeConditional(cond, t, f native) (native, bool) {
	c := cond.b
	switch {
	case c == nil:
	case t.d != nil && f.d != nil:
		td, fd := t.d, f.d
		return native{d: func(m msgs) float64 {
			if c(m) {
				return td(m)
			}
			return fd(m)
		}}, true
	case t.b != nil && f.b != nil:
		tb, fb := t.b, f.b
		return native{b: func(m msgs) bool {
			if c(m) {
				return tb(m)
			}
			return fb(m)
		}}, true
	case t.i != nil && f.i != nil:
		ti, fi := t.i, f.i
		return native{i: func(m msgs) int64 {
			if c(m) {
				return ti(m)
			}
			return fi(m)
		}}, true
	case t.u != nil && f.u != nil:
		tu, fu := t.u, f.u
		return native{u: func(m msgs) uint64 {
			if c(m) {
				return tu(m)
			}
			return fu(m)
		}}, true
	}
	return native{}, false
}

// nativeBinary is an arithmetic operator on doubles, or a comparison of two operands of
// one type: doubles, ints or uints ordered or compared, bools compared (CEL's comparisons
// across number types, and its ordering of bools, are left to it).
func nativeBinary(fn string, l, r native) (native, bool) {
	switch {
	case l.d != nil && r.d != nil:
		x, y := l.d, r.d
		var d nativeDouble
		switch fn {
		case operators.Add:
			d = func(m msgs) float64 { return x(m) + y(m) }
		case operators.Subtract:
			d = func(m msgs) float64 { return x(m) - y(m) }
		case operators.Multiply:
			d = func(m msgs) float64 { return x(m) * y(m) }
		case operators.Divide:
			d = func(m msgs) float64 { return x(m) / y(m) }
		}
		if d != nil {
			return native{d: d}, true
		}
		// A NaN, which CEL neither orders nor finds equal to anything, compares as in Go.
		return compare(fn, x, y)
	case l.i != nil && r.i != nil:
		return compare(fn, l.i, r.i)
	case l.u != nil && r.u != nil:
		return compare(fn, l.u, r.u)
	case l.b != nil && r.b != nil:
		x, y := l.b, r.b
		switch fn {
		case operators.Equals:
			return native{b: func(m msgs) bool { return x(m) == y(m) }}, true
		case operators.NotEquals:
			return native{b: func(m msgs) bool { return x(m) != y(m) }}, true
		}
	}
	return native{}, false
}

// compare is the comparison operator fn of two operands of one type.
func compare[T float64 | int64 | uint64](fn string, x, y func(m msgs) T) (native, bool) {
	var b nativeBool
	switch fn {
	case operators.Equals:
		b = func(m msgs) bool { return x(m) == y(m) }
	case operators.NotEquals:
		b = func(m msgs) bool { return x(m) != y(m) }
	case operators.Less:
		b = func(m msgs) bool { return x(m) < y(m) }
	case operators.LessEquals:
		b = func(m msgs) bool { return x(m) <= y(m) }
	case operators.Greater:
		b = func(m msgs) bool { return x(m) > y(m) }
	case operators.GreaterEquals:
		b = func(m msgs) bool { return x(m) >= y(m) }
	default:
		return native{}, false
	}
	return native{b: b}, true
}

// nativeSize is size() of one of the list fields.
func nativeSize(name string) (native, bool) {
	var n func(sig *gauntletv1.Signals) int
	switch name {
	case "signals.violations":
		n = func(sig *gauntletv1.Signals) int { return len(sig.GetViolations()) }
	case "signals.safety_events":
		n = func(sig *gauntletv1.Signals) int { return len(sig.GetSafetyEvents()) }
	case "signals.verifier_names":
		n = func(sig *gauntletv1.Signals) int { return len(sig.GetVerifierNames()) }
	case "signals.verifier_values":
		n = func(sig *gauntletv1.Signals) int { return len(sig.GetVerifierValues()) }
	case "signals.limits":
		n = func(sig *gauntletv1.Signals) int { return len(sig.GetLimits()) }
	default:
		return native{}, false
	}
	return native{i: func(m msgs) int64 { return int64(n(m.sig)) }}, true
}

// nativeField reads the scalar field name (scalarFields) with its getter, as
// activation.field does; strings have no native form.
func nativeField(name string) (native, bool) {
	switch name {
	case "signals.progress":
		return native{d: func(m msgs) float64 { return m.sig.GetProgress() }}, true
	case "signals.spend":
		return native{d: func(m msgs) float64 { return m.sig.GetSpend() }}, true
	case "signals.budget":
		return native{d: func(m msgs) float64 { return m.sig.GetBudget() }}, true
	case "signals.progress_delta":
		return native{d: func(m msgs) float64 { return m.sig.GetProgressDelta() }}, true
	case "signals.invalid_action":
		return native{b: func(m msgs) bool { return m.sig.GetInvalidAction() }}, true
	case "signals.success":
		return native{b: func(m msgs) bool { return m.sig.GetSuccess() }}, true
	case "signals.deadline_virtual_ns":
		return native{i: func(m msgs) int64 { return m.sig.GetDeadlineVirtualNs() }}, true
	case "episode.total":
		return native{d: func(m msgs) float64 { return m.ep.GetTotal() }}, true
	case "episode.progress":
		return native{d: func(m msgs) float64 { return m.ep.GetProgress() }}, true
	}
	if get := uintFields[name]; get != nil {
		return native{u: func(m msgs) uint64 { return get(m) }}, true
	}
	return native{}, false
}

// uintFields are the unsigned scalar fields of metering and episode, by name.
var uintFields = map[string]func(m msgs) uint64{
	"metering.tool_calls":        func(m msgs) uint64 { return uint64(m.met.GetToolCalls()) },
	"metering.errors":            func(m msgs) uint64 { return uint64(m.met.GetErrors()) },
	"metering.virtual_ns":        func(m msgs) uint64 { return m.met.GetVirtualNs() },
	"metering.wall_ns":           func(m msgs) uint64 { return m.met.GetWallNs() },
	"metering.bytes_in":          func(m msgs) uint64 { return uint64(m.met.GetBytesIn()) },
	"metering.bytes_out":         func(m msgs) uint64 { return uint64(m.met.GetBytesOut()) },
	"metering.cpu_ns":            func(m msgs) uint64 { return m.met.GetCpuNs() },
	"metering.peak_memory_bytes": func(m msgs) uint64 { return m.met.GetPeakMemoryBytes() },
	"metering.processes":         func(m msgs) uint64 { return uint64(m.met.GetProcesses()) },
	"metering.read_bytes":        func(m msgs) uint64 { return m.met.GetReadBytes() },
	"metering.written_bytes":     func(m msgs) uint64 { return m.met.GetWrittenBytes() },
	"metering.policy_ns":         func(m msgs) uint64 { return m.met.GetPolicyNs() },
	"metering.reward_ns":         func(m msgs) uint64 { return m.met.GetRewardNs() },
	"episode.steps":              func(m msgs) uint64 { return uint64(m.ep.GetSteps()) },
	"episode.tool_calls":         func(m msgs) uint64 { return m.ep.GetToolCalls() },
	"episode.errors":             func(m msgs) uint64 { return m.ep.GetErrors() },
	"episode.virtual_ns":         func(m msgs) uint64 { return m.ep.GetVirtualNs() },
	"episode.safety_events":      func(m msgs) uint64 { return uint64(m.ep.GetSafetyEvents()) },
	"episode.violations":         func(m msgs) uint64 { return uint64(m.ep.GetViolations()) },
	"episode.invalid_actions":    func(m msgs) uint64 { return uint64(m.ep.GetInvalidActions()) },
}
