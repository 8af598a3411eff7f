package scoring

import (
	"math"
	"math/rand/v2"
	"testing"

	"cel.dev/cel-go/cel"
	"google.golang.org/protobuf/proto"

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
	"double(episode.steps) / 100.0",
	"double(metering.virtual_ns) / 1e9 - double(signals.deadline_virtual_ns) * double(signals.spend)",
	"double(size(signals.violations)) > 1.5",
}

// celOnly have no native form and are always CEL's.
var celOnly = []string{
	"size(signals.verifier_names) + 0 > 0 ? 1.0 : 0.0",
	"-signals.deadline_virtual_ns",
	"metering.runtime == 'process' ? 1.0 : 0.0",
	"has(signals.budget) ? 1.0 : 0.0",
	"verifier['tests'] > 0.0",
	"signals.violations.exists(v, v.rule == 'r')",
	"int(signals.spend) > 3",
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

// A spec whose expressions have native forms scores an episode's steps, and leaves its
// state, exactly as the same spec evaluated by CEL alone.
func TestNativeSpecScoresAsCEL(t *testing.T) {
	const doc = `name: native
version: "1"
components:
  - {name: task, builtin: task, weight: 1}
  - {name: thrift, expr: "signals.budget > 0.0 ? -signals.spend / signals.budget : 0.0", weight: 0.1, normalise: [{zscore: {window: 3}}]}
  - {name: careful, expr: "signals.invalid_action || size(signals.violations) > 0 ? -1.0 : 0.0", weight: 0.1}
  - {name: pace, expr: "double(episode.steps) / 10.0 - episode.total", weight: 0.2}
  - {name: progress, potential: {expr: signals.progress, gamma: 0.99}, weight: 0.5}
  - {name: spent, potential: {expr: "double(episode.tool_calls) * 0.1 + signals.spend", gamma: 1}, weight: 0.3}
`
	spec, err := Parse("native.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	natives := 0
	celSpec := spec
	cc := *spec.c
	cc.comps = append([]comp(nil), cc.comps...)
	for i := range cc.comps {
		if cc.comps[i].native != nil {
			natives++
		}
		cc.comps[i].native, cc.comps[i].field = nil, ""
	}
	celSpec.c = &cc
	if natives != 5 {
		t.Fatalf("%d components with a native form, want 5", natives)
	}
	rng := rand.New(rand.NewPCG(11, 12))
	for range 50 {
		var nst, cst gauntletv1.RewardState
		for i := range 20 {
			act := randomActivation(rng)
			st := &gauntletv1.StepTaken{Step: uint32(i), Signals: act.sig, Metering: act.met, Terminated: i == 19}
			got, gt := AppendValuesState(nil, spec, &nst, st)
			want, wt := AppendValuesState(nil, celSpec, &cst, st)
			for j := range want {
				if math.Float64bits(got[j]) != math.Float64bits(want[j]) {
					t.Fatalf("step %d component %d: native %v, CEL %v", i, j, got[j], want[j])
				}
			}
			if math.Float64bits(gt) != math.Float64bits(wt) || !proto.Equal(&nst, &cst) {
				t.Fatalf("step %d: native total %v state %v, CEL %v %v", i, gt, &nst, wt, &cst)
			}
		}
	}
}
