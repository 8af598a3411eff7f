package scoring

import (
	"math"
	"math/rand/v2"
	"testing"

	"cel.dev/cel-go/cel"

	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// nativeExprs have a native form; each is checked against CEL on random messages, NaN,
// infinities, -0 and extreme integers included.
var nativeExprs = []string{
	"signals.budget > 0.0 ? -signals.spend / signals.budget : 0.0",
	"signals.invalid_action || size(signals.violations) > 0 ? -1.0 : 0.0",
	"signals.violations.size() >= 2 && !signals.success",
	"signals.progress * 2.0 - signals.progress_delta + 0.5",
	"signals.progress == signals.progress_delta || signals.spend != 1.0",
	"signals.progress <= 0.5 ? signals.budget : signals.spend * -1.5",
	"signals.progress < signals.spend ? 1 : -3",
	"metering.tool_calls > 2u ? metering.errors : 7u",
	"metering.virtual_ns >= episode.virtual_ns",
	"signals.deadline_virtual_ns < 0 || signals.deadline_virtual_ns == 1000",
	"episode.steps > 3u && episode.total / 2.0 > episode.progress",
	"signals.success == signals.invalid_action ? size(signals.safety_events) : size(signals.limits)",
	"signals.success != true",
	"signals.deadline_virtual_ns",
	"metering.peak_memory_bytes",
	"-(signals.spend / signals.budget)",
	"size(signals.verifier_values) == 0 ? episode.progress : 1.0 / 0.0",
}

// celOnly have no native form and are always CEL's.
var celOnly = []string{
	"size(signals.verifier_names) + 0 > 0 ? 1.0 : 0.0",
	"-signals.deadline_virtual_ns",
	"metering.runtime == 'process' ? 1.0 : 0.0",
	"has(signals.budget) ? 1.0 : 0.0",
	"verifier['tests'] > 0.0",
	"signals.violations.exists(v, v.rule == 'r')",
	"double(metering.tool_calls) * 0.5",
	"[1.0, 2.0][0] > signals.progress",
}

// The native form of an expression gives exactly what CEL gives, bit for bit, and CEL
// never fails on one.
func TestNativeIsCEL(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, src := range celOnly {
		_, nat, _, err := compileChecked(src)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		if nat != nil {
			t.Errorf("%s has a native form, want CEL's alone", src)
		}
	}
	for _, src := range nativeExprs {
		prg, nat, _, err := compileChecked(src)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		if nat == nil {
			t.Errorf("%s has no native form", src)
			continue
		}
		for range 2000 {
			act := randomActivation(rng)
			got := nat(msgs{act.sig, act.met, act.ep})
			want, err := eval(prg, act)
			if err != nil || math.Float64bits(got) != math.Float64bits(want) {
				t.Fatalf("%s on %v %v %v: native %v, CEL %v (%v)", src, act.sig, act.met, act.ep, got, want, err)
			}
		}
	}
}

func randomActivation(rng *rand.Rand) *activation {
	sig, met, ep := &gauntletv1.Signals{}, &gauntletv1.Metering{}, &gauntletv1.EpisodeSoFar{}
	fill(rng, sig.ProtoReflect())
	fill(rng, met.ProtoReflect())
	fill(rng, ep.ProtoReflect())
	return &activation{sig: sig, met: met, ep: ep}
}

// Every number and bool field reads natively as activation.field reads it.
func TestNativeFieldsReadAsField(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for name, typ := range scalarFields {
		n, ok := nativeField(name)
		if typ == cel.StringType {
			if ok {
				t.Errorf("%s, a string, has a native form", name)
			}
			continue
		}
		if !ok {
			t.Errorf("%s has no native form: add it to nativeField", name)
			continue
		}
		for range 30 {
			act := randomActivation(rng)
			want, _ := act.field(name)
			wf, err := number(want)
			if err != nil {
				t.Fatal(err)
			}
			var got float64
			m := msgs{act.sig, act.met, act.ep}
			switch {
			case n.d != nil:
				got = n.d(m)
			case n.i != nil:
				got = float64(n.i(m))
			case n.u != nil:
				got = float64(n.u(m))
			case n.b != nil && n.b(m):
				got = 1
			}
			if math.Float64bits(got) != math.Float64bits(wf) || (n.d != nil) != (typ == cel.DoubleType) ||
				(n.i != nil) != (typ == cel.IntType) || (n.u != nil) != (typ == cel.UintType) || (n.b != nil) != (typ == cel.BoolType) {
				t.Fatalf("%s (%v): native %v, field %v", name, typ, got, want)
			}
		}
	}
}
