package scoring

import (
	"fmt"
	"math"
	"strings"
	"sync"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/interpreter"
	"google.golang.org/protobuf/proto"

	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// kind is where a component's raw value comes from.
type kind uint8

const (
	kindBuiltin   kind = iota // one of the formulas of value
	kindExpr                  // a CEL expression
	kindPotential             // potential-based shaping: gamma*phi(after) - phi(before)
	kindDetector              // an anti-hacking detector (detect.go)
	kindVerifier              // one of the named numbers of a task's verifier
)

// stageOp is one normalisation stage.
type stageOp uint8

const (
	opClip stageOp = iota
	opScale
	opZScore
)

type stage struct {
	op     stageOp
	lo, hi float64 // clip
	factor float64 // scale
	window int     // zscore: steps in the window
	slot   int     // zscore: index of its window in RewardState.windows
}

func (s stage) String() string {
	switch s.op {
	case opClip:
		return fmt.Sprintf("clip [%v, %v]", s.lo, s.hi)
	case opScale:
		return fmt.Sprintf("scale %v", s.factor)
	case opZScore:
		return fmt.Sprintf("zscore window %d", s.window)
	}
	return "?"
}

// comp is one compiled component.
type comp struct {
	kind    kind
	builtin string
	prg     cel.Program
	// field: the expression is only this scalar field's name, of a number or a bool type,
	// read without CEL (comp.eval).
	field string
	// native: the expression's native form (native.go), nil when it has none.
	native func(msgs) float64
	gamma  float64
	// detector and window: a detector's kind and its window (idle, repeat: steps in a
	// row); slot: repeat's window in RewardState.windows, which holds the fingerprint of
	// the last action.
	detector string
	window   int
	slot     int
	// pot: the index in RewardState.potentials of the number the component keeps from
	// step to step (a potential's phi, a counting detector's count); -1 for none.
	pot int
	// hold: a counting detector (idle, repeat) holds its count on a step an injected
	// fault answered (faults: hold).
	hold bool
	// verifier: the verifier's name a kindVerifier component reads.
	verifier string
	stages   []stage
	rule     string // what produced the raw value, for Explain
}

// compiled is what a spec file compiles to, shared by every copy of the Spec (read only).
type compiled struct {
	comps []comp
	// plain: every component is a built-in without normalisation, scored exactly as the
	// specs before spec files were (no state, no CEL).
	plain bool
	// stateful: scoring reads and advances a RewardState.
	stateful   bool
	windows    int // running z-score stages and repeat detectors, each with its window in RewardState.windows
	potentials int // potentials and counting detectors, each with its number in RewardState.potentials
	// actions: a component reads the step's action (a repeat detector).
	actions bool
	// faults: a component reads the step's faults (a detector that holds under them).
	faults bool
	// episode: an expression reads episode, so the state carries the episode so far
	// (RewardState.episode). Without one the state is only the potentials, the detectors'
	// counters and the windows: scoring keeps no episode, and the requests and replies that
	// carry the state are the smaller for it.
	episode bool
}

// The CEL environment every spec's expressions compile in: the step's signals and
// metering as their protobuf messages, and what came before in the episode. One for the
// process: cel.Env is safe for concurrent use and costly to build.
var (
	celEnvOnce sync.Once
	celEnv     *cel.Env
	celEnvErr  error
)

func exprEnv() (*cel.Env, error) {
	celEnvOnce.Do(func() {
		opts := []cel.EnvOption{
			cel.Types(&gauntletv1.Signals{}, &gauntletv1.Metering{}, &gauntletv1.EpisodeSoFar{}),
			cel.VariableWithDoc("signals", cel.ObjectType("gauntlet.v1.Signals"), "the env's judgement of the step"),
			cel.VariableWithDoc("metering", cel.ObjectType("gauntlet.v1.Metering"), "what the sandbox measured of the step"),
			cel.VariableWithDoc("episode", cel.ObjectType("gauntlet.v1.EpisodeSoFar"), "the episode's steps before this one"),
			cel.VariableWithDoc("verifier", cel.MapType(cel.StringType, cel.DoubleType),
				"the named numbers a task's verifier wrote, on the verdict step (signals.verifier_names, verifier_values); empty on other steps"),
			cel.ParserExpressionSizeLimit(4096),
		}
		for name, typ := range scalarFields {
			opts = append(opts, cel.Variable(name, typ))
		}
		for name, typ := range listFields {
			opts = append(opts, cel.Variable(name, typ))
		}
		celEnv, celEnvErr = cel.NewEnv(opts...)
	})
	return celEnv, celEnvErr
}

// scalarFields are the scalar fields of signals, metering and episode ("signals.budget"),
// each declared to CEL as a variable of its own, of the type CEL gives the field (double,
// int, uint, bool, string): the type checker resolves a selection of such a field to that
// variable, and activation.field reads it with the message's getter, instead of CEL
// wrapping the message and selecting the field by protobuf reflection on every step. The
// value is the same either way. Repeated fields, has(), and a field activation.field does
// not know (one added to the messages since) still go through the message.
var scalarFields = func() map[string]*cel.Type {
	m := map[string]*cel.Type{}
	empty := activation{sig: noSignals, met: noMetering, ep: &gauntletv1.EpisodeSoFar{}}
	for i, msg := range []proto.Message{noSignals, noMetering, empty.ep} {
		prefix := [...]string{"signals.", "metering.", "episode."}[i]
		fields := msg.ProtoReflect().Descriptor().Fields()
		for j := range fields.Len() {
			name := prefix + string(fields.Get(j).Name())
			v, ok := empty.field(name)
			if !ok {
				continue
			}
			switch v.(type) {
			case types.Double:
				m[name] = cel.DoubleType
			case types.Int:
				m[name] = cel.IntType
			case types.Uint:
				m[name] = cel.UintType
			case types.Bool:
				m[name] = cel.BoolType
			case types.String:
				m[name] = cel.StringType
			}
		}
	}
	return m
}()

// listFields are the repeated fields of signals, declared like scalarFields: an empty one,
// a step's usual, reads as one shared empty list instead of a list CEL wraps around the
// message's each time; a full one as the message's slice, whose elements CEL's adapter
// wraps as it wraps the message's.
var listFields = map[string]*cel.Type{
	"signals.violations":      cel.ListType(cel.ObjectType("gauntlet.v1.CausalViolation")),
	"signals.safety_events":   cel.ListType(cel.StringType),
	"signals.verifier_names":  cel.ListType(cel.StringType),
	"signals.verifier_values": cel.ListType(cel.DoubleType),
	"signals.limits":          cel.ListType(cel.StringType),
}

// emptyList is every empty list field.
var emptyList = types.NewDynamicList(types.DefaultTypeAdapter, []any{})

// list returns the value of the list field name, false for any other name.
func (a *activation) list(name string) (any, bool) {
	var l any
	n := 0
	switch name {
	case "signals.violations":
		v := a.sig.GetViolations()
		l, n = v, len(v)
	case "signals.safety_events":
		v := a.sig.GetSafetyEvents()
		l, n = v, len(v)
	case "signals.verifier_names":
		v := a.sig.GetVerifierNames()
		l, n = v, len(v)
	case "signals.verifier_values":
		v := a.sig.GetVerifierValues()
		l, n = v, len(v)
	case "signals.limits":
		v := a.sig.GetLimits()
		l, n = v, len(v)
	default:
		return nil, false
	}
	if n == 0 {
		return emptyList, true
	}
	return l, true
}

// fieldOnly returns src when it is only the name of a scalar field of a number or a bool
// type, "" otherwise.
func fieldOnly(src string) string {
	src = strings.TrimSpace(src)
	if t, ok := scalarFields[src]; ok && t != cel.StringType {
		return src
	}
	return ""
}

// field returns the value of the scalar field name ("signals.budget") as CEL types it,
// false for any other name. TestScalarFieldsReadAsTheMessage checks each against CEL's own
// selection of the field from the message.
func (a *activation) field(name string) (ref.Val, bool) {
	switch name {
	case "signals.progress":
		return types.Double(a.sig.GetProgress()), true
	case "signals.invalid_action":
		return types.Bool(a.sig.GetInvalidAction()), true
	case "signals.success":
		return types.Bool(a.sig.GetSuccess()), true
	case "signals.spend":
		return types.Double(a.sig.GetSpend()), true
	case "signals.budget":
		return types.Double(a.sig.GetBudget()), true
	case "signals.deadline_virtual_ns":
		return types.Int(a.sig.GetDeadlineVirtualNs()), true
	case "signals.progress_delta":
		return types.Double(a.sig.GetProgressDelta()), true

	case "metering.tool_calls":
		return types.Uint(a.met.GetToolCalls()), true
	case "metering.errors":
		return types.Uint(a.met.GetErrors()), true
	case "metering.virtual_ns":
		return types.Uint(a.met.GetVirtualNs()), true
	case "metering.wall_ns":
		return types.Uint(a.met.GetWallNs()), true
	case "metering.bytes_in":
		return types.Uint(a.met.GetBytesIn()), true
	case "metering.bytes_out":
		return types.Uint(a.met.GetBytesOut()), true
	case "metering.cpu_ns":
		return types.Uint(a.met.GetCpuNs()), true
	case "metering.peak_memory_bytes":
		return types.Uint(a.met.GetPeakMemoryBytes()), true
	case "metering.processes":
		return types.Uint(a.met.GetProcesses()), true
	case "metering.read_bytes":
		return types.Uint(a.met.GetReadBytes()), true
	case "metering.written_bytes":
		return types.Uint(a.met.GetWrittenBytes()), true
	case "metering.runtime":
		return types.String(a.met.GetRuntime()), true
	case "metering.policy_ns":
		return types.Uint(a.met.GetPolicyNs()), true
	case "metering.reward_ns":
		return types.Uint(a.met.GetRewardNs()), true

	case "episode.steps":
		return types.Uint(a.ep.GetSteps()), true
	case "episode.total":
		return types.Double(a.ep.GetTotal()), true
	case "episode.tool_calls":
		return types.Uint(a.ep.GetToolCalls()), true
	case "episode.errors":
		return types.Uint(a.ep.GetErrors()), true
	case "episode.virtual_ns":
		return types.Uint(a.ep.GetVirtualNs()), true
	case "episode.safety_events":
		return types.Uint(a.ep.GetSafetyEvents()), true
	case "episode.violations":
		return types.Uint(a.ep.GetViolations()), true
	case "episode.invalid_actions":
		return types.Uint(a.ep.GetInvalidActions()), true
	case "episode.progress":
		return types.Double(a.ep.GetProgress()), true
	}
	return nil, false
}

// compileExpr parses and type-checks one expression, which must give a number or a bool,
// and reports whether it reads episode.
func compileExpr(src string) (prg cel.Program, readsEpisode bool, err error) {
	prg, _, readsEpisode, err = compileChecked(src)
	return prg, readsEpisode, err
}

// compileChecked is compileExpr, also returning the expression's native form (native.go),
// nil when it has none.
func compileChecked(src string) (prg cel.Program, nat func(msgs) float64, readsEpisode bool, err error) {
	prg, readsEpisode, checked, err := compileAST(src)
	if err != nil {
		return nil, nil, false, err
	}
	return prg, nativeExpr(checked), readsEpisode, nil
}

// compileAST is compileExpr, also returning the checked expression.
func compileAST(src string) (prg cel.Program, readsEpisode bool, checked *ast.AST, err error) {
	env, err := exprEnv()
	if err != nil {
		return nil, false, nil, fmt.Errorf("expression environment: %w", err)
	}
	a, iss := env.Compile(src)
	if err := iss.Err(); err != nil {
		// "ERROR: <input>:1:8: msg" and a snippet: keep the position and the snippet.
		msg := strings.ReplaceAll(strings.TrimSpace(err.Error()), "ERROR: <input>:", "expression ")
		return nil, false, nil, fmt.Errorf("%s", strings.ReplaceAll(msg, "\n", "\n    "))
	}
	switch a.OutputType().Kind() {
	case types.DoubleKind, types.IntKind, types.UintKind, types.BoolKind:
	default:
		return nil, false, nil, fmt.Errorf("%q gives %v, want a number (double, int, uint) or a bool", src, a.OutputType())
	}
	prg, err = env.Program(a, cel.EvalOptions(cel.OptOptimize))
	if err != nil {
		return nil, false, nil, fmt.Errorf("plan %q: %w", src, err)
	}
	// The checker resolved every name: "episode", or "episode.steps" and the like.
	for _, ref := range a.NativeRep().ReferenceMap() {
		if ref.Name == "episode" || strings.HasPrefix(ref.Name, "episode.") {
			readsEpisode = true
		}
	}
	return prg, readsEpisode, a.NativeRep(), nil
}

// activation resolves an expression's variables without building a map per step.
type activation struct {
	sig *gauntletv1.Signals
	met *gauntletv1.Metering
	ep  *gauntletv1.EpisodeSoFar
	// verifier is the verifier's named numbers as a CEL map, built the first time an
	// expression of the step reads them: only verdict steps of specs that read them pay
	// for a map.
	verifier ref.Val
}

// ResolveName implements interpreter.Activation.
func (a *activation) ResolveName(name string) (any, bool) {
	switch name {
	case "signals":
		return a.sig, true
	case "metering":
		return a.met, true
	case "episode":
		return a.ep, true
	case "verifier":
		if a.verifier == nil {
			a.verifier = verifierMap(a.sig)
		}
		return a.verifier, true
	}
	if v, ok := a.field(name); ok {
		return v, true
	}
	return a.list(name)
}

// noVerifier is the verifier variable of a step without named numbers.
var noVerifier = types.DefaultTypeAdapter.NativeToValue(map[string]float64{})

// verifierMap is sig's verifier names and values as a CEL map; a name given twice keeps
// its last value, as verifierValue reads it.
func verifierMap(sig *gauntletv1.Signals) ref.Val {
	names, values := sig.GetVerifierNames(), sig.GetVerifierValues()
	if len(names) == 0 {
		return noVerifier
	}
	m := make(map[string]float64, len(names))
	for i, n := range names {
		m[n] = valueAt(values, i)
	}
	return types.DefaultTypeAdapter.NativeToValue(m)
}

// verifierValue is the value sig's verifier gave name, 0 when it gave none (a step before
// the verdict, or a verifier that did not write that name). A name given twice reads its
// last value; a names list longer than the values reads 0 past their end.
func verifierValue(sig *gauntletv1.Signals, name string) float64 {
	names := sig.GetVerifierNames()
	for i := len(names) - 1; i >= 0; i-- {
		if names[i] == name {
			return valueAt(sig.GetVerifierValues(), i)
		}
	}
	return 0
}

func valueAt(values []float64, i int) float64 {
	if i < len(values) {
		return values[i]
	}
	return 0
}

// Parent implements interpreter.Activation.
func (a *activation) Parent() interpreter.Activation { return nil }

// Empty messages stand for absent ones, so expressions read zeros, as the built-ins do.
// noEpisode is the episode of a spec whose expressions do not read it: nothing writes it.
var (
	noSignals  = &gauntletv1.Signals{}
	noMetering = &gauntletv1.Metering{}
	noEpisode  = &gauntletv1.EpisodeSoFar{}
)

// eval runs the component's expression; one that is only a scalar field's name
// (signals.progress, a potential's usual) reads the field, and one with a native form
// (native.go) runs it: both give what CEL would.
func (cp *comp) eval(act *activation) (float64, error) {
	if cp.native != nil {
		return cp.native(msgs{act.sig, act.met, act.ep}), nil
	}
	if cp.field != "" {
		v, _ := act.field(cp.field)
		return number(v)
	}
	// CEL keeps the activation it is handed: a copy on the heap, so the step's own stays
	// on the stack; the verifier map it builds is kept for the step's next expressions.
	heap := *act
	v, err := eval(cp.prg, &heap)
	act.verifier = heap.verifier
	return v, err
}

// eval runs one expression; an evaluation error (an int overflow, a missing map key)
// scores 0 and is returned for Explain.
func eval(prg cel.Program, act *activation) (float64, error) {
	out, _, err := prg.Eval(act)
	if err != nil {
		return 0, err
	}
	return number(out)
}

func number(v ref.Val) (float64, error) {
	switch x := v.(type) {
	case types.Double:
		return float64(x), nil
	case types.Int:
		return float64(x), nil
	case types.Uint:
		return float64(x), nil
	case types.Bool:
		if x {
			return 1, nil
		}
		return 0, nil
	}
	return 0, fmt.Errorf("expression gave %v (%s), want a number", v, v.Type())
}

// trace records how one component's value was produced, for Explain; nil when scoring.
type trace struct {
	raw    float64
	err    error
	stages []StageValue
	bound  bool
}

// componentValue computes component i of c for a step: its raw value, its normalisation
// stages in order, bounded to [-1, 1]. It advances st's potentials and windows; st and
// act.ep are never nil here.
func (c *compiled) componentValue(i int, sig *gauntletv1.Signals, met *gauntletv1.Metering, step *gauntletv1.StepTaken,
	act *activation, st *gauntletv1.RewardState, tr *trace) float64 {
	cp := &c.comps[i]
	var v float64
	var err error
	switch cp.kind {
	case kindBuiltin:
		v = value(cp.builtin, sig, met)
	case kindExpr:
		v, err = cp.eval(act)
	case kindDetector:
		v = detect(cp, sig, step.GetAction(), step.GetFaults(), st)
	case kindVerifier:
		v = verifierValue(sig, cp.verifier)
	case kindPotential:
		var phi float64
		if !step.GetTerminated() { // an absorbing state's potential is 0, so shaping telescopes
			phi, err = cp.eval(act)
			phi = notNaN(phi)
		}
		v = cp.gamma*phi - st.Potentials[cp.pot]
		st.Potentials[cp.pot] = phi
	}
	v = notNaN(v)
	if tr != nil {
		tr.raw, tr.err = v, err
	}
	for _, s := range cp.stages {
		switch s.op {
		case opClip:
			v = math.Max(s.lo, math.Min(s.hi, v))
		case opScale:
			v *= s.factor
		case opZScore:
			v = zscore(st.Windows[s.slot], s.window, v)
		}
		v = notNaN(v)
		if tr != nil {
			tr.stages = append(tr.stages, StageValue{Rule: s.String(), Value: v})
		}
	}
	b := clip(v, -1, 1)
	if tr != nil {
		tr.bound = b != v && !(b == 0 && v == 0)
	}
	return b
}

// zscore adds x to the window w (keeping its last n values) and returns x's distance from
// the window's mean in standard deviations; 0 while the window has no spread.
func zscore(w *gauntletv1.ZWindow, n int, x float64) float64 {
	if len(w.Values) >= n {
		copy(w.Values, w.Values[len(w.Values)-n+1:])
		w.Values = w.Values[:n-1]
	}
	w.Values = append(w.Values, x)
	var mean float64
	for _, y := range w.Values {
		mean += y
	}
	mean /= float64(len(w.Values))
	var ss float64
	for _, y := range w.Values {
		ss += (y - mean) * (y - mean)
	}
	sd := math.Sqrt(ss / float64(len(w.Values)))
	if !(sd > 0) || math.IsInf(sd, 0) {
		return 0
	}
	return (x - mean) / sd
}

// prepare makes st fit c (a fresh state for a first step), so scoring never checks.
func (c *compiled) prepare(st *gauntletv1.RewardState) {
	switch {
	case !c.episode:
		st.Episode = nil // nothing reads it
	case st.Episode == nil:
		st.Episode = &gauntletv1.EpisodeSoFar{}
	}
	if len(st.Potentials) != c.potentials {
		if len(st.Potentials) == len(c.comps) {
			// A state written when every component had a number, kept or not (a durable
			// episode's checkpoint, a worker that sends states as messages): keep the
			// numbers of the components that keep one, in order.
			for i := range c.comps {
				if k := c.comps[i].pot; k >= 0 {
					st.Potentials[k] = st.Potentials[i]
				}
			}
			st.Potentials = st.Potentials[:c.potentials]
		} else {
			st.Potentials = append(st.Potentials[:0], make([]float64, c.potentials)...)
		}
	}
	if len(st.Windows) != c.windows {
		// A fresh state: empty windows, in the ones st had room for (a state decoded
		// again and again into one RewardState keeps them) or new ones.
		if cap(st.Windows) < c.windows {
			st.Windows = append(st.Windows[:cap(st.Windows)], make([]*gauntletv1.ZWindow, c.windows-cap(st.Windows))...)
		}
		st.Windows = st.Windows[:c.windows]
		for _, w := range st.Windows {
			if w != nil {
				w.Values = w.Values[:0]
			}
		}
	}
	for i, w := range st.Windows {
		if w == nil {
			st.Windows[i] = &gauntletv1.ZWindow{}
		}
	}
}

// advance records a scored step in the episode so far, when the spec keeps one (ep is
// nil otherwise).
func advance(ep *gauntletv1.EpisodeSoFar, sig *gauntletv1.Signals, met *gauntletv1.Metering, total float64) {
	if ep == nil {
		return
	}
	ep.Steps++
	ep.Total += total
	ep.ToolCalls += uint64(met.GetToolCalls())
	ep.Errors += uint64(met.GetErrors())
	ep.VirtualNs += met.GetVirtualNs()
	ep.SafetyEvents += uint32(observed(sig))
	ep.Violations += uint32(len(sig.GetViolations()))
	if sig.GetInvalidAction() {
		ep.InvalidActions++
	}
	ep.Progress = sig.GetProgress()
}
