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
				if fd.Cardinality() == protoreflect.Repeated || fd.Kind() == protoreflect.MessageKind {
					continue
				}
				name := prefix + "." + string(fd.Name())
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

// The fast path is taken: the checker resolves a selection of a scalar field to its own
// variable, so the message is never asked for.
func TestScalarFieldSkipsTheMessage(t *testing.T) {
	prg, err := compileExpr("signals.budget > 0.0 ? -signals.spend / signals.budget : metering.virtual_ns > 0u ? 1.0 : 0.0")
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
		if fd.Cardinality() == protoreflect.Repeated || fd.Kind() == protoreflect.MessageKind {
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
