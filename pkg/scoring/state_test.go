package scoring_test

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
	"google.golang.org/protobuf/proto"
)

func mustParse(t testing.TB, doc string) scoring.Spec {
	t.Helper()
	spec, err := scoring.Parse("test.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return spec
}

func TestExpressionComponents(t *testing.T) {
	spec := mustParse(t, `name: t
version: "1"
components:
  - {name: spend, expr: "signals.budget > 0.0 ? -signals.spend / signals.budget : 0.0", weight: 1}
  - {name: calls, expr: "int(metering.tool_calls) * 2", weight: 1}
  - {name: ok, expr: signals.success, weight: 1}
  - {name: big, expr: "5.0", weight: 1}
  - {name: boom, expr: "1 / (int(metering.tool_calls) - 1)", weight: 1}
`)
	st := step(&gauntletv1.Signals{Spend: 10, Budget: 40, Success: true}, &gauntletv1.Metering{ToolCalls: 1})
	got := scoring.Score(spec, st)
	want := []float64{-0.25, 1, 1, 1, 0} // calls and big bounded to 1; boom divides by zero: 0
	for i, c := range got.Components {
		if c.Value != want[i] {
			t.Errorf("%s = %v, want %v", c.Name, c.Value, want[i])
		}
	}
	ex, _ := scoring.Explain(spec, nil, st)
	if ex[1].Raw != 2 || !ex[1].Bounded || ex[4].Err == nil || ex[4].Rule != "expr 1 / (int(metering.tool_calls) - 1)" || ex[1].Inputs != "" {
		t.Errorf("explain calls raw %v bounded %v inputs %q, boom err %v rule %q", ex[1].Raw, ex[1].Bounded, ex[1].Inputs, ex[4].Err, ex[4].Rule)
	}
	def, _ := scoring.Explain(scoring.SpecFor("shop"), nil, step(&gauntletv1.Signals{ProgressDelta: 0.25, Success: true, Spend: 3, Budget: 10,
		DeadlineVirtualNs: 9, SafetyEvents: []string{"x", "other_customer_card_read: read the card of account y"}, InvalidAction: true}, &gauntletv1.Metering{ToolCalls: 2, VirtualNs: 4}))
	for i, want := range []string{"progress_delta 0.25, success true", "tool_calls 2, spend 3, budget 10", "safety_events 2 (x, other_customer_card_read)",
		"virtual_ns 4, deadline_virtual_ns 9", "violations 0, invalid_action true"} {
		if def[i].Inputs != want {
			t.Errorf("%s inputs %q, want %q", def[i].Name, def[i].Inputs, want)
		}
	}
	// A nil step reads zeros, as the built-ins do: boom is then 1 / -1.
	nilWant := []float64{0, 0, 0, 1, -1}
	for i, c := range scoring.Score(spec, nil).Components {
		if c.Value != nilWant[i] {
			t.Errorf("nil step: %s = %v, want %v", c.Name, c.Value, nilWant[i])
		}
	}
}

// TestVerifierComponents: a task verifier's named numbers reach a spec as a verifier
// source and as CEL's verifier map, on the verdict step; other steps read 0 (or, in CEL,
// an empty map).
func TestVerifierComponents(t *testing.T) {
	spec := mustParse(t, `name: t
version: "1"
components:
  - {name: tests, verifier: tests, weight: 1}
  - {name: style, expr: "'style' in verifier ? verifier.style * 2.0 : -1.0", weight: 0.5}
  - {name: both, expr: "verifier.tests - verifier.style", weight: 1}
  - {name: reward, verifier: reward, weight: 1}
`)
	verdict := step(&gauntletv1.Signals{VerifierNames: []string{"style", "tests"}, VerifierValues: []float64{0.25, 0.75}}, nil)
	got := scoring.Score(spec, verdict)
	want := []float64{0.75, 0.5, 0.5, 0}
	for i, c := range got.Components {
		if c.Value != want[i] {
			t.Errorf("verdict step: %s = %v, want %v", c.Name, c.Value, want[i])
		}
	}
	if got.Total != 0.75+0.25+0.5 {
		t.Errorf("verdict step: total %v, want 1.5", got.Total)
	}
	// Before the verdict: the verifier source reads 0, "in" is false, and reading a
	// missing name is an evaluation error, so 0 (Explain says why).
	before := step(&gauntletv1.Signals{Progress: 0.5}, nil)
	want = []float64{0, -1, 0, 0}
	for i, c := range scoring.Score(spec, before).Components {
		if c.Value != want[i] {
			t.Errorf("before the verdict: %s = %v, want %v", c.Name, c.Value, want[i])
		}
	}
	ex, _ := scoring.Explain(spec, nil, before)
	if ex[2].Err == nil || ex[0].Rule != `verifier "tests"` || ex[0].Inputs != `"tests" not written` {
		t.Errorf("explain before the verdict: both err %v, tests rule %q inputs %q", ex[2].Err, ex[0].Rule, ex[0].Inputs)
	}
	if ex, _ = scoring.Explain(spec, nil, verdict); ex[0].Inputs != `"tests" 0.75` {
		t.Errorf("explain the verdict: tests inputs %q", ex[0].Inputs)
	}
	if _, err := scoring.Parse("bad.yaml", []byte(`name: t
version: "1"
components:
  - {name: x, verifier: tests, expr: "1.0", weight: 1}
`)); err == nil || !strings.Contains(err.Error(), "exactly one of builtin, expr, potential, detector and verifier (has 2)") {
		t.Errorf("two sources: %v", err)
	}
}

func TestNormalisationStages(t *testing.T) {
	spec := mustParse(t, `name: t
version: "1"
components:
  - name: scaled
    expr: double(metering.tool_calls)
    weight: 1
    normalise: [{scale: 0.25}, {clip: [-1, 0.5]}]
  - name: z
    expr: double(metering.tool_calls)
    weight: 1
    normalise: [{zscore: {window: 3}}]
`)
	var rs gauntletv1.RewardState
	calls := []uint32{1, 3, 1, 3, 3, 3}
	// z over the windows [1], [1 3], [1 3 1], [3 1 3], [1 3 3], [3 3 3].
	wantZ := []float64{0, 1, -1 / math.Sqrt(2), 1 / math.Sqrt(2), 1 / math.Sqrt(2), 0}
	wantScaled := []float64{0.25, 0.5, 0.25, 0.5, 0.5, 0.5}
	for i, n := range calls {
		got := scoring.ScoreState(spec, &rs, step(nil, &gauntletv1.Metering{ToolCalls: n}))
		if math.Abs(got.Components[0].Value-wantScaled[i]) > 1e-15 || math.Abs(got.Components[1].Value-wantZ[i]) > 1e-12 {
			t.Errorf("step %d: scaled %v z %v, want %v %v", i, got.Components[0].Value, got.Components[1].Value, wantScaled[i], wantZ[i])
		}
	}
	// No expression reads episode: the state keeps only the window.
	if len(rs.Windows) != 1 || len(rs.Windows[0].Values) != 3 || rs.Episode != nil {
		t.Errorf("state %v", &rs)
	}
}

// Potential-based shaping telescopes: over an episode that ends terminated, the shaping
// rewards sum to -phi(start) = 0 with gamma 1, whatever the path; and each step's value is
// gamma*phi(after) - phi(before).
func TestPotentialShaping(t *testing.T) {
	spec := mustParse(t, `name: t
version: "1"
components:
  - name: shaping
    potential: {expr: signals.progress, gamma: 1}
    weight: 1
  - name: discounted
    potential: {expr: signals.progress, gamma: 0.5}
    weight: 0
`)
	progress := []float64{0.2, 0.1, 0.6, 0.9, 1}
	var rs gauntletv1.RewardState
	sum := 0.0
	prev := 0.0
	for i, p := range progress {
		st := step(&gauntletv1.Signals{Progress: p}, nil)
		st.Terminated = i == len(progress)-1
		got := scoring.ScoreState(spec, &rs, st)
		sum += got.Components[0].Value
		after := p
		if st.Terminated {
			after = 0
		}
		if want := 0.5*after - prev; math.Abs(got.Components[1].Value-want) > 1e-15 {
			t.Errorf("step %d: discounted %v, want %v", i, got.Components[1].Value, want)
		}
		prev = after
	}
	if math.Abs(sum) > 1e-15 {
		t.Errorf("shaping sums to %v over a terminated episode, want 0", sum)
	}
}

func TestEpisodeSoFar(t *testing.T) {
	spec := mustParse(t, `name: t
version: "1"
components:
  - {name: seen, expr: "double(episode.steps) / 10.0", weight: 1}
  - {name: before, expr: "episode.total", weight: 1}
`)
	var rs gauntletv1.RewardState
	var totals []float64
	for i := range 4 {
		got := scoring.ScoreState(spec, &rs, step(&gauntletv1.Signals{InvalidAction: i == 1}, &gauntletv1.Metering{ToolCalls: 2, VirtualNs: 5}))
		if got.Components[0].Value != float64(i)/10 {
			t.Errorf("step %d: seen %v", i, got.Components[0].Value)
		}
		sum := 0.0
		for _, x := range totals {
			sum += x
		}
		if got.Components[1].Value != sum {
			t.Errorf("step %d: before %v, want %v", i, got.Components[1].Value, sum)
		}
		totals = append(totals, got.Total)
	}
	ep := rs.Episode
	if ep.Steps != 4 || ep.ToolCalls != 8 || ep.VirtualNs != 20 || ep.InvalidActions != 1 {
		t.Errorf("episode so far %v", ep)
	}
}

// A stateful spec scored through the table, states carried on the wire from request to
// request, gives what ScoreState gives step by step; Explain agrees and advances the same.
func TestTableCarriesStates(t *testing.T) {
	spec := mustParse(t, fullSpec)
	steps := variedSteps()
	for _, st := range steps {
		st.RewardSpec = spec.Digest
	}
	var direct, explained gauntletv1.RewardState
	var wire *gauntletv1.RewardState
	for i, st := range steps {
		want := scoring.ScoreState(spec, &direct, st)
		ex, exTotal := scoring.Explain(spec, &explained, st)
		tab := scoring.TableStates(func(env, digest string) scoring.Spec {
			if digest != spec.Digest {
				t.Fatalf("spec looked up by %q", digest)
			}
			return spec
		}, []*gauntletv1.StepTaken{st}, []*gauntletv1.RewardState{wire})
		data, err := proto.Marshal(&gauntletv1.ScoreReply{Table: tab})
		if err != nil {
			t.Fatal(err)
		}
		var reply gauntletv1.ScoreReply
		if err := proto.Unmarshal(data, &reply); err != nil {
			t.Fatal(err)
		}
		got, err := reply.StepScores([]*gauntletv1.StepTaken{st})
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(got[0], want) {
			t.Fatalf("step %d: table %v, ScoreState %v", i, got[0], want)
		}
		if math.Float64bits(exTotal) != math.Float64bits(want.Total) {
			t.Fatalf("step %d: Explain total %v, want %v", i, exTotal, want.Total)
		}
		for j := range ex {
			if math.Float64bits(ex[j].Value) != math.Float64bits(want.Components[j].Value) {
				t.Fatalf("step %d: Explain %s %v, want %v", i, ex[j].Name, ex[j].Value, want.Components[j].Value)
			}
		}
		wire = reply.Table.States[0]
	}
	if !proto.Equal(wire, &direct) || !proto.Equal(&explained, &direct) {
		t.Errorf("states differ: wire %v, explain %v, direct %v", wire, &explained, &direct)
	}
}

// Requests carrying their episodes' states in wire form (as a worker sends them, one
// reused RewardState decoding them all in the reward service) give each step what
// ScoreState gives it with its own episode's state: three episodes of two stateful specs
// of different shapes (z-score windows, an episode so far, or neither) interleaved with a
// default-spec step in every request, so a state left over in the reused one shows. A
// default-spec step gets back what it sent.
func TestTableCarriesEncodedStates(t *testing.T) {
	full, lean := mustParse(t, fullSpec), mustParse(t, eightComponents)
	specs := []scoring.Spec{full, lean, full}
	steps := variedSteps()
	specFor := func(env, digest string) scoring.Spec {
		for _, sp := range specs {
			if sp.Digest == digest {
				return sp
			}
		}
		return scoring.SpecFor(env)
	}
	direct := make([]gauntletv1.RewardState, len(specs))
	wire := make([][]byte, len(specs)+1)
	wire[len(specs)] = []byte("not read") // the default-spec step's, given back as it came
	for i := 0; i+len(specs) <= len(steps); i += len(specs) {
		var req []*gauntletv1.StepTaken
		var want []*gauntletv1.StepScored
		for e, sp := range specs {
			st := proto.Clone(steps[i+(e+i)%len(specs)]).(*gauntletv1.StepTaken)
			st.EpisodeId, st.RewardSpec = fmt.Sprintf("ep%d", e), sp.Digest
			req = append(req, st)
			want = append(want, scoring.ScoreState(sp, &direct[e], st))
		}
		plain := proto.Clone(steps[i]).(*gauntletv1.StepTaken)
		req = append(req, plain)
		want = append(want, scoring.Score(scoring.SpecFor("shop"), plain))
		tab, err := scoring.TableEncodedStates(specFor, req, wire)
		if err != nil {
			t.Fatal(err)
		}
		data, err := proto.Marshal(&gauntletv1.ScoreReply{Table: tab})
		if err != nil {
			t.Fatal(err)
		}
		var reply gauntletv1.ScoreReply
		if err := proto.Unmarshal(data, &reply); err != nil {
			t.Fatal(err)
		}
		got, err := reply.StepScores(req)
		if err != nil {
			t.Fatal(err)
		}
		for e := range want {
			if !proto.Equal(got[e], want[e]) {
				t.Fatalf("request %d, step of %s: table %v, ScoreState %v", i/len(specs), req[e].EpisodeId, got[e], want[e])
			}
		}
		wire = reply.Table.EncodedStates
		if string(wire[len(specs)]) != "not read" {
			t.Fatalf("request %d: the default-spec step's state came back as %q", i/len(specs), wire[len(specs)])
		}
	}
	for e := range specs {
		var got gauntletv1.RewardState
		if err := got.DecodeReusing(wire[e]); err != nil || !proto.Equal(&got, &direct[e]) {
			t.Errorf("episode %d: state %v (%v), want %v", e, &got, err, &direct[e])
		}
	}
}

// A state that does not decode is an error naming its step, not a fresh start.
func TestTableRefusesABadEncodedState(t *testing.T) {
	spec := mustParse(t, fullSpec)
	st := variedSteps()[1]
	st.RewardSpec = spec.Digest
	_, err := scoring.TableEncodedStates(func(string, string) scoring.Spec { return spec }, []*gauntletv1.StepTaken{st}, [][]byte{{0x48, 0x01}})
	if err == nil || !strings.Contains(err.Error(), "step 1 of ep") || !strings.Contains(err.Error(), "unknown field 9") {
		t.Errorf("got %v, want an error naming the step and the field", err)
	}
	if _, err := scoring.TableEncodedStates(func(string, string) scoring.Spec { return spec }, []*gauntletv1.StepTaken{st}, nil); err == nil {
		t.Error("no states for one step: no error")
	}
}

// Scoring under a stateless spec leaves the state alone and needs none.
func TestStatelessSpecIgnoresState(t *testing.T) {
	rs := &gauntletv1.RewardState{Episode: &gauntletv1.EpisodeSoFar{Steps: 3}}
	scoring.ScoreState(scoring.SpecFor("shop"), rs, step(&gauntletv1.Signals{Progress: 1}, oneCall()))
	if rs.Episode.Steps != 3 || len(rs.Potentials) != 0 {
		t.Errorf("state changed: %v", rs)
	}
}

// eightComponents is the benchmark's spec: the five built-ins, two more normalised, and
// three CEL expressions.
const eightComponents = `name: bench
version: "1"
components:
  - {name: task, builtin: task, weight: 1}
  - {name: cost, builtin: cost, weight: 0.2}
  - {name: safety, builtin: safety, weight: 0.5}
  - {name: timeliness, builtin: timeliness, weight: 0.1}
  - {name: causal, builtin: causal, weight: 0.3, normalise: [{scale: 2}, {clip: [-1, 0]}]}
  - {name: thrift, expr: "signals.budget > 0.0 ? -signals.spend / signals.budget : 0.0", weight: 0.1}
  - {name: careful, expr: "signals.invalid_action || size(signals.violations) > 0 ? -1.0 : 0.0", weight: 0.1}
  - {name: progress, potential: {expr: signals.progress, gamma: 0.99}, weight: 0.5}
`

// detectorsSpec is loadtest/specs/detectors.yaml: the spec of the detectors'
// false-positive runs (docs/benchmarks.md, Rewards).
const detectorsSpec = `name: detectors
version: "1"
components:
  - {name: task, builtin: task, weight: 1.0}
  - {name: cost, builtin: cost, weight: 0.2}
  - {name: safety, builtin: safety, weight: 0.5}
  - {name: timeliness, builtin: timeliness, weight: 0.1}
  - {name: causal, builtin: causal, weight: 0.3}
  - {name: idle, detector: {kind: idle, window: 8}, weight: 0}
  - {name: repeat, detector: {kind: repeat, window: 4}, weight: 0}
  - {name: verifier_paths, detector: {kind: verifier_paths}, weight: 0}
  - {name: canary, detector: {kind: canary}, weight: 0}
`

func BenchmarkScoreSpecs(b *testing.B) {
	s := step(&gauntletv1.Signals{
		Progress: 0.4, ProgressDelta: 0.25, Spend: 12.5, Budget: 80, DeadlineVirtualNs: 3e9,
		Violations: []*gauntletv1.CausalViolation{{Rule: "r"}},
	}, oneCall())
	b.Run("default", func(b *testing.B) {
		spec := scoring.SpecFor("shop")
		var values [8]float64
		b.ReportAllocs()
		for b.Loop() {
			scoring.AppendValuesState(values[:0], spec, nil, s)
		}
	})
	b.Run("detectors", func(b *testing.B) {
		// loadtest/specs/detectors.yaml: default/1's five and four detectors. The steps
		// cycle through what the oracle meets under the stress profile: a plain read, one
		// slowed by latency, one truncated, one answered 503, the same read again.
		spec := mustParse(b, detectorsSpec)
		read := &gauntletv1.Action{Tool: "inventory.get", ArgsJson: `{"sku":"sku-0042"}`}
		fault := func(kind string) []*gauntletv1.FaultFired {
			return []*gauntletv1.FaultFired{{FaultId: "f1", Kind: kind, Target: "inventory/inventory.get", Detail: "x"}}
		}
		steps := []*gauntletv1.StepTaken{
			{Env: "shop", Signals: s.Signals, Metering: s.Metering, Action: read},
			{Env: "shop", Signals: s.Signals, Metering: s.Metering, Action: read, Faults: fault("latency")},
			{Env: "shop", Signals: &gauntletv1.Signals{}, Metering: s.Metering, Action: read, Faults: fault("truncate")},
			{Env: "shop", Signals: &gauntletv1.Signals{}, Metering: s.Metering, Action: read, Faults: fault("http_error")},
		}
		var rs gauntletv1.RewardState
		var values [16]float64
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			scoring.AppendValuesState(values[:0], spec, &rs, steps[i&3])
			i++
		}
	})
	b.Run("eight-with-three-cel", func(b *testing.B) {
		spec := mustParse(b, eightComponents)
		var rs gauntletv1.RewardState
		var values [8]float64
		b.ReportAllocs()
		for b.Loop() {
			scoring.AppendValuesState(values[:0], spec, &rs, s)
		}
	})
}

// A state keeps a number only for the components that keep one (potentials, counting
// detectors), in spec order; a state written when every component had one (an older
// durable episode's checkpoint, an older worker's) is read as the same state.
func TestStateKeepsNumbersOnlyForComponentsThatDo(t *testing.T) {
	spec := mustParse(t, `name: slots
version: "1"
components:
  - {name: task, builtin: task, weight: 1}
  - {name: progress, potential: {expr: signals.progress, gamma: 0.9}, weight: 0.5}
  - {name: careful, expr: "signals.invalid_action ? -1.0 : 0.0", weight: 0.1}
  - {name: idle, detector: {kind: idle, window: 3}, weight: 0.2}
`)
	steps := variedSteps()[:40]
	var st gauntletv1.RewardState
	for _, step := range steps[:20] {
		if step.Signals != nil {
			step.Signals.ProgressDelta, step.Signals.Success = 0, false // idle counts
		}
		scoring.ScoreState(spec, &st, step)
	}
	if len(st.Potentials) != 2 || st.Potentials[1] == 0 {
		t.Fatalf("state %v: want two numbers, phi and idle's count (non-zero)", &st)
	}
	old := &gauntletv1.RewardState{Potentials: []float64{0, st.Potentials[0], 0, st.Potentials[1]}}
	for i, step := range steps[20:] {
		want := scoring.ScoreState(spec, &st, step)
		got := scoring.ScoreState(spec, old, step)
		if !proto.Equal(got, want) {
			t.Fatalf("step %d from the old layout: %v, want %v", 20+i, got, want)
		}
	}
	if !proto.Equal(old, &st) {
		t.Errorf("state from the old layout %v, want %v", old, &st)
	}
	// Expressions alone keep nothing.
	if mustParse(t, eightComponents).Stateful() != true || mustParse(t, `name: e
version: "1"
components:
  - {name: careful, expr: "signals.invalid_action ? -1.0 : 0.0", weight: 0.1}
`).Stateful() {
		t.Error("Stateful: want true for a spec with a potential, false for expressions alone")
	}
}
