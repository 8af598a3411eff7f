package scoring

import (
	"math"
	"math/rand/v2"
	"testing"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// Every scalar field of signals, metering and episode reads the same through its own
// variable (activation.field) as CEL's selection of it from the message, which
// "[signals][0].budget" forces: same CEL type, same bits, zero or not. A field added to the
// messages without a case in activation.field fails here, so it is added there too.
func TestScalarFieldsReadAsTheMessage(t *testing.T) {
	env, err := exprEnv()
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 9))
	for round := range 50 {
		sig, met, ep := &gauntletv1.Signals{}, &gauntletv1.Metering{}, &gauntletv1.EpisodeSoFar{}
		msgs := []proto.Message{sig, met, ep}
		for _, m := range msgs {
			if round == 0 {
				continue // every field absent: zeros
			}
			fill(rng, m.ProtoReflect())
		}
		act := &activation{sig: sig, met: met, ep: ep}
		for i, m := range msgs {
			prefix := [...]string{"signals", "metering", "episode"}[i]
			fields := m.ProtoReflect().Descriptor().Fields()
			for j := range fields.Len() {
				fd := fields.Get(j)
				name := prefix + "." + string(fd.Name())
				if fd.Cardinality() == protoreflect.Repeated {
					if _, ok := listFields[name]; !ok {
						t.Fatalf("%s is not read by activation.list: add it there", name)
					}
					// Lists read as the message's: the same size, equal element by element.
					for _, src := range []string{
						"size(" + name + ") == size([" + prefix + "][0]." + string(fd.Name()) + ")",
						name + " == [" + prefix + "][0]." + string(fd.Name()),
					} {
						if got := evalAny(t, env, src, act); got != types.True {
							t.Errorf("round %d: %s is %v", round, src, got)
						}
					}
					continue
				}
				if fd.Kind() == protoreflect.MessageKind {
					continue
				}
				if _, ok := scalarFields[name]; !ok {
					t.Fatalf("%s is not read by activation.field: add it there", name)
				}
				direct := evalAny(t, env, name, act)
				viaMessage := evalAny(t, env, "["+prefix+"][0]."+string(fd.Name()), act)
				if !sameVal(direct, viaMessage) {
					t.Errorf("round %d: %s reads %v (%T), the message's field %v (%T)", round, name, direct, direct, viaMessage, viaMessage)
				}
			}
		}
	}
}

// An expression that is only a numeric or bool field's name reads the field without CEL,
// and gives what CEL gives for it, NaN and infinities included.
func TestFieldOnlyExpressionIsCEL(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	names := 0
	for name := range scalarFields {
		prg, _, err := compileExpr(name)
		if fieldOnly(name) == "" {
			if err == nil {
				t.Errorf("%s compiles but is not read as a field", name)
			}
			continue // a string field: not a number
		}
		if err != nil {
			t.Fatal(err)
		}
		names++
		cp := comp{prg: prg, field: fieldOnly(" " + name + " ")}
		for range 30 {
			sig, met, ep := &gauntletv1.Signals{}, &gauntletv1.Metering{}, &gauntletv1.EpisodeSoFar{}
			fill(rng, sig.ProtoReflect())
			fill(rng, met.ProtoReflect())
			fill(rng, ep.ProtoReflect())
			act := &activation{sig: sig, met: met, ep: ep}
			got, gerr := cp.eval(act)
			want, werr := eval(prg, act)
			if math.Float64bits(got) != math.Float64bits(want) || (gerr == nil) != (werr == nil) {
				t.Fatalf("%s: read %v (%v), CEL gives %v (%v)", name, got, gerr, want, werr)
			}
		}
	}
	if names < 20 || fieldOnly("signals.progress + 0.0") != "" || fieldOnly("metering.runtime") != "" {
		t.Errorf("%d fields read directly; or a bigger expression, or a string, is one", names)
	}
}

// The fast path is taken: the checker resolves a selection of a scalar field to its own
// variable, so the message is never asked for.
func TestScalarFieldSkipsTheMessage(t *testing.T) {
	prg, _, err := compileExpr("signals.budget > 0.0 ? -signals.spend / signals.budget : metering.virtual_ns > 0u ? 1.0 : 0.0")
	if err != nil {
		t.Fatal(err)
	}
	act := &noMessages{activation{sig: &gauntletv1.Signals{Spend: 3, Budget: 4}, met: noMetering, ep: &gauntletv1.EpisodeSoFar{}}}
	out, _, err := prg.Eval(act)
	if err != nil {
		t.Fatal(err)
	}
	if out != types.Double(-0.75) {
		t.Fatalf("got %v, want -0.75", out)
	}
}

// noMessages refuses the messages themselves, to prove an expression did not need them.
type noMessages struct{ activation }

func (n *noMessages) ResolveName(name string) (any, bool) {
	switch name {
	case "signals", "metering", "episode":
		return nil, false
	}
	return n.activation.ResolveName(name)
}

func evalAny(t *testing.T, e *cel.Env, src string, act *activation) ref.Val {
	t.Helper()
	ast, iss := e.Compile(src)
	if iss.Err() != nil {
		t.Fatalf("compile %s: %v", src, iss.Err())
	}
	prg, err := e.Program(ast)
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := prg.Eval(act)
	if err != nil {
		t.Fatalf("eval %s: %v", src, err)
	}
	return out
}

func sameVal(a, b ref.Val) bool {
	if a.Type() != b.Type() {
		return false
	}
	if x, ok := a.(types.Double); ok {
		return math.Float64bits(float64(x)) == math.Float64bits(float64(b.(types.Double)))
	}
	return a.Equal(b) == types.True
}

// fill sets every scalar field of m to a random value, some of them special (NaN, -0, ±Inf,
// the extremes of integers).
func fill(rng *rand.Rand, m protoreflect.Message) {
	fields := m.Descriptor().Fields()
	for j := range fields.Len() {
		fd := fields.Get(j)
		if fd.Cardinality() == protoreflect.Repeated {
			l := m.Mutable(fd).List()
			for range rng.IntN(3) {
				switch fd.Kind() {
				case protoreflect.StringKind:
					l.Append(protoreflect.ValueOfString([]string{"a", "threat_fingerprint: x", ""}[rng.IntN(3)]))
				case protoreflect.DoubleKind: // no NaN: a list holding one equals nothing
					l.Append(protoreflect.ValueOfFloat64(rng.NormFloat64()))
				case protoreflect.MessageKind:
					e := l.NewElement()
					fill(rng, e.Message())
					l.Append(e)
				}
			}
			continue
		}
		if fd.Kind() == protoreflect.MessageKind {
			continue
		}
		var v protoreflect.Value
		switch fd.Kind() {
		case protoreflect.DoubleKind:
			v = protoreflect.ValueOfFloat64([]float64{rng.NormFloat64() * 1e3, math.NaN(), math.Copysign(0, -1), math.Inf(1), math.Inf(-1), 0.1}[rng.IntN(6)])
		case protoreflect.BoolKind:
			v = protoreflect.ValueOfBool(rng.IntN(2) == 1)
		case protoreflect.StringKind:
			v = protoreflect.ValueOfString([]string{"", "process", "containerd"}[rng.IntN(3)])
		case protoreflect.Uint32Kind:
			v = protoreflect.ValueOfUint32([]uint32{rng.Uint32(), 0, math.MaxUint32}[rng.IntN(3)])
		case protoreflect.Uint64Kind:
			v = protoreflect.ValueOfUint64([]uint64{rng.Uint64(), 0, math.MaxUint64}[rng.IntN(3)])
		case protoreflect.Int64Kind:
			v = protoreflect.ValueOfInt64([]int64{rng.Int64() - math.MaxInt64/2, 0, math.MinInt64, math.MaxInt64}[rng.IntN(4)])
		case protoreflect.Int32Kind:
			v = protoreflect.ValueOfInt32(int32(rng.Uint32()))
		default:
			continue
		}
		m.Set(fd, v)
	}
}

// A spec whose expressions do not read episode keeps none in its state, and scores every
// step of an episode to the same bits as when it kept one: the state a request carries is
// then the potentials, counters and windows alone.
func TestStateWithoutEpisodeScoresTheSame(t *testing.T) {
	spec, err := Parse("t.yaml", []byte(`name: t
version: "1"
components:
  - {name: task, builtin: task, weight: 1}
  - {name: causal, builtin: causal, weight: 0.3, normalise: [{scale: 2}, {clip: [-1, 0]}]}
  - {name: thrift, expr: "signals.budget > 0.0 ? -signals.spend / signals.budget : 0.0", weight: 0.1}
  - {name: careful, expr: "signals.invalid_action || size(signals.violations) > 0 ? -1.0 : 0.0", weight: 0.1}
  - {name: progress, potential: {expr: signals.progress, gamma: 0.99}, weight: 0.5}
  - {name: calls, expr: double(metering.tool_calls), weight: 0.2, normalise: [{zscore: {window: 3}}]}
  - {name: idle, detector: {kind: idle, window: 3}, weight: 0.1}
`))
	if err != nil {
		t.Fatal(err)
	}
	if spec.c.episode {
		t.Fatal("the spec's expressions do not read episode, but it keeps one")
	}
	keeping := spec
	c := *spec.c
	c.episode = true // as every stateful spec did before
	keeping.c = &c
	rng := rand.New(rand.NewPCG(3, 4))
	var lean, full gauntletv1.RewardState
	for i := range 200 {
		st := &gauntletv1.StepTaken{
			Step: uint32(i), Terminated: i%17 == 16,
			Signals: &gauntletv1.Signals{
				Progress: rng.Float64(), ProgressDelta: rng.NormFloat64() / 4, Success: i%17 == 16,
				Spend: rng.Float64() * 10, Budget: float64(rng.IntN(3)) * 20, InvalidAction: rng.IntN(5) == 0,
				Violations: make([]*gauntletv1.CausalViolation, rng.IntN(2)),
			},
			Metering: &gauntletv1.Metering{ToolCalls: uint32(rng.IntN(4)), VirtualNs: uint64(rng.IntN(1e9))},
		}
		if i%17 == 0 {
			lean, full = gauntletv1.RewardState{}, gauntletv1.RewardState{}
		}
		var a, b [8]float64
		va, ta := AppendValuesState(a[:0], spec, &lean, st)
		vb, tb := AppendValuesState(b[:0], keeping, &full, st)
		if math.Float64bits(ta) != math.Float64bits(tb) {
			t.Fatalf("step %d: total %v without the episode, %v with it", i, ta, tb)
		}
		for j := range va {
			if math.Float64bits(va[j]) != math.Float64bits(vb[j]) {
				t.Fatalf("step %d: %s %v without the episode, %v with it", i, spec.Weights[j].Component, va[j], vb[j])
			}
		}
		if lean.Episode != nil || full.Episode == nil {
			t.Fatalf("step %d: episode %v without, %v with", i, lean.Episode, full.Episode)
		}
		withoutEpisode := proto.Clone(&full).(*gauntletv1.RewardState)
		withoutEpisode.Episode = nil
		if !proto.Equal(&lean, withoutEpisode) {
			t.Fatalf("step %d: state %v, want %v", i, &lean, withoutEpisode)
		}
	}
}

// Any reading of episode keeps it: a field, the message, has().
func TestReadsEpisode(t *testing.T) {
	for src, want := range map[string]bool{
		"episode.total":                                                     true,
		"double(episode.steps)":                                             true,
		"has(episode.steps) ? 1.0 : 0.0":                                    true,
		"[episode][0].progress":                                             true,
		"signals.progress - 0.5":                                            false,
		"double(metering.tool_calls)":                                       false,
		"size(signals.violations) > 0":                                      false,
		"'episode' in verifier ? 1.0 : 0.0":                                 false,
		"signals.success && signals.budget > 0.0":                           false,
		"size(signals.violations) > 0 && signals.violations[0].rule == 'r'": false,
	} {
		_, got, err := compileExpr(src)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		if got != want {
			t.Errorf("%s: reads episode %v, want %v", src, got, want)
		}
	}
}
