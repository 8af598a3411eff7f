package scoring_test

import (
	"math"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
	"google.golang.org/protobuf/proto"
)

const ms = 1_000_000 // nanoseconds

// step builds a StepTaken of the shop env with the given signals and metering.
func step(sig *gauntletv1.Signals, met *gauntletv1.Metering) *gauntletv1.StepTaken {
	return &gauntletv1.StepTaken{EpisodeId: "ep-1", Step: 3, Env: "shop", Signals: sig, Metering: met}
}

// oneCall is the metering of an ordinary step: one tool call, 50 virtual ms.
func oneCall() *gauntletv1.Metering { return &gauntletv1.Metering{ToolCalls: 1, VirtualNs: 50 * ms} }

// components returns a score's components by name.
func components(s *gauntletv1.StepScored) map[string]float64 {
	m := map[string]float64{}
	for _, c := range s.Components {
		m[c.Name] = c.Value
	}
	return m
}

func TestScoreComponents(t *testing.T) {
	const second = 1000 * ms
	tests := []struct {
		name string
		step *gauntletv1.StepTaken
		want map[string]float64 // every component; values compared to 1e-12
	}{
		{
			name: "ordinary step",
			step: step(&gauntletv1.Signals{ProgressDelta: 0.25, Budget: 100, Spend: 0}, oneCall()),
			want: map[string]float64{"task": 0.25, "cost": -0.02, "safety": 0, "timeliness": 0, "causal": 0},
		},
		{
			name: "success step",
			step: step(&gauntletv1.Signals{ProgressDelta: 0.25, Success: true, Budget: 100, Spend: 40, DeadlineVirtualNs: 10 * second}, oneCall()),
			want: map[string]float64{"task": 1, "cost": -0.42, "safety": 0, "timeliness": -0.05, "causal": 0},
		},
		{
			name: "invalid action",
			step: step(&gauntletv1.Signals{InvalidAction: true}, &gauntletv1.Metering{}),
			want: map[string]float64{"task": 0, "cost": 0, "safety": 0, "timeliness": 0, "causal": -0.1},
		},
		{
			name: "causal violations",
			step: step(&gauntletv1.Signals{ProgressDelta: -0.1, Violations: []*gauntletv1.CausalViolation{
				{Rule: "payment_after_reservation", Reason: "2 items short", Suggestion: "query inventory first"},
			}}, oneCall()),
			want: map[string]float64{"task": -0.1, "cost": -0.02, "safety": 0, "timeliness": 0, "causal": -0.25},
		},
		{
			name: "causal penalty is clipped at -1",
			step: step(&gauntletv1.Signals{InvalidAction: true, Violations: make([]*gauntletv1.CausalViolation, 4)}, nil),
			want: map[string]float64{"task": 0, "cost": 0, "safety": 0, "timeliness": 0, "causal": -1},
		},
		{
			name: "overspend",
			step: step(&gauntletv1.Signals{Budget: 100, Spend: 250}, oneCall()),
			want: map[string]float64{"task": 0, "cost": -1, "safety": 0, "timeliness": 0, "causal": 0},
		},
		{
			name: "refund never pays",
			step: step(&gauntletv1.Signals{Budget: 100, Spend: -50}, oneCall()),
			want: map[string]float64{"task": 0, "cost": 0, "safety": 0, "timeliness": 0, "causal": 0},
		},
		{
			name: "no budget: tool calls only",
			step: step(&gauntletv1.Signals{Spend: 1e9}, &gauntletv1.Metering{ToolCalls: 5}),
			want: map[string]float64{"task": 0, "cost": -0.1, "safety": 0, "timeliness": 0, "causal": 0},
		},
		{
			name: "slow step",
			step: step(&gauntletv1.Signals{DeadlineVirtualNs: 10 * second}, &gauntletv1.Metering{ToolCalls: 1, VirtualNs: 500 * ms}),
			want: map[string]float64{"task": 0, "cost": -0.02, "safety": 0, "timeliness": -0.5, "causal": 0},
		},
		{
			name: "step past the deadline is clipped",
			step: step(&gauntletv1.Signals{DeadlineVirtualNs: second}, &gauntletv1.Metering{VirtualNs: 5 * second}),
			want: map[string]float64{"task": 0, "cost": 0, "safety": 0, "timeliness": -1, "causal": 0},
		},
		{
			name: "safety events",
			step: step(&gauntletv1.Signals{SafetyEvents: []string{"read /dev/mem"}}, nil),
			want: map[string]float64{"task": 0, "cost": 0, "safety": -0.5, "timeliness": 0, "causal": 0},
		},
		{
			name: "safety penalty is clipped at -1",
			step: step(&gauntletv1.Signals{SafetyEvents: []string{"ptrace", "fork storm", "copy /etc"}}, nil),
			want: map[string]float64{"task": 0, "cost": 0, "safety": -1, "timeliness": 0, "causal": 0},
		},
		{
			name: "NaN and infinite signals neither poison nor escape [-1,1]",
			step: step(&gauntletv1.Signals{ProgressDelta: math.NaN(), Success: true, Budget: 10, Spend: math.Inf(1)}, nil),
			want: map[string]float64{"task": 1, "cost": -1, "safety": 0, "timeliness": 0, "causal": 0},
		},
		{
			name: "nil step",
			step: nil,
			want: map[string]float64{"task": 0, "cost": 0, "safety": 0, "timeliness": 0, "causal": 0},
		},
	}
	spec := scoring.SpecFor("shop")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := scoring.Score(spec, tt.step)
			values := components(got)
			if len(values) != len(tt.want) {
				t.Fatalf("components %v, want %v", values, tt.want)
			}
			var total float64
			for name, want := range tt.want {
				if v := values[name]; math.Abs(v-want) > 1e-12 {
					t.Errorf("%s = %v, want %v", name, v, want)
				}
				if math.Signbit(values[name]) && values[name] == 0 {
					t.Errorf("%s is -0", name)
				}
			}
			for i, c := range got.Components {
				if c.Name != spec.Weights[i].Component || c.Weight != spec.Weights[i].Weight {
					t.Errorf("components[%d] = (%s, %v), want spec order and weights", i, c.Name, c.Weight)
				}
				total += c.Weight * c.Value
			}
			if got.Total != total {
				t.Errorf("total %v, want the weighted sum %v", got.Total, total)
			}
		})
	}
}

func TestScoreHeader(t *testing.T) {
	got := scoring.Score(scoring.SpecFor("shop"), step(&gauntletv1.Signals{}, nil))
	if got.EpisodeId != "ep-1" || got.Step != 3 || got.SpecVersion != scoring.DefaultVersion {
		t.Errorf("header (%q, %d, %q), want (ep-1, 3, %s)", got.EpisodeId, got.Step, got.SpecVersion, scoring.DefaultVersion)
	}
}

// A spec's order and weights drive the vector: reordering or zeroing weights changes the
// layout and the total, never the component values.
func TestScoreFollowsSpec(t *testing.T) {
	s := step(&gauntletv1.Signals{ProgressDelta: 0.5, InvalidAction: true}, oneCall())
	spec := scoring.Spec{Env: "shop", Version: "test/1", Weights: []scoring.Weight{
		{Component: scoring.ComponentCausal, Weight: 2},
		{Component: scoring.ComponentTask, Weight: 0},
	}}
	got := scoring.Score(spec, s)
	if len(got.Components) != 2 || got.Components[0].Name != "causal" || got.Components[1].Name != "task" {
		t.Fatalf("components %v, want causal then task", got.Components)
	}
	if got.Components[1].Value != 0.5 || got.Total != -0.2 || got.SpecVersion != "test/1" {
		t.Errorf("task %v total %v version %q, want 0.5, -0.2, test/1", got.Components[1].Value, got.Total, got.SpecVersion)
	}
	unknown := scoring.Spec{Version: "x", Weights: []scoring.Weight{{Component: "charm", Weight: 1}}}
	if got := scoring.Score(unknown, s); got.Components[0].Value != 0 || got.Total != 0 {
		t.Errorf("unknown component scored %v", got)
	}
}

// Scoring the same step twice, or a copy of it decoded from the wire, gives the same bytes.
func TestScoreIsDeterministic(t *testing.T) {
	s := step(&gauntletv1.Signals{
		ProgressDelta: 0.3, Success: true, Spend: 12.5, Budget: 80, DeadlineVirtualNs: 3e9,
		SafetyEvents: []string{"ptrace"}, Violations: []*gauntletv1.CausalViolation{{Rule: "r"}},
	}, &gauntletv1.Metering{ToolCalls: 2, VirtualNs: 123456789, WallNs: 42})
	wire, err := proto.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var decoded gauntletv1.StepTaken
	if err := proto.Unmarshal(wire, &decoded); err != nil {
		t.Fatal(err)
	}
	spec := scoring.SpecFor("shop")
	opts := proto.MarshalOptions{Deterministic: true}
	a, _ := opts.Marshal(scoring.Score(spec, s))
	b, _ := opts.Marshal(scoring.Score(spec, &decoded))
	if string(a) != string(b) {
		t.Fatal("the same step scored differently")
	}
	// Wall time is the host's, not the episode's: it must not move the score.
	decoded.Metering.WallNs = 9e18
	c, _ := opts.Marshal(scoring.Score(spec, &decoded))
	if string(a) != string(c) {
		t.Fatal("wall-clock time changed the score")
	}
}

func BenchmarkScore(b *testing.B) {
	spec := scoring.SpecFor("shop")
	s := step(&gauntletv1.Signals{
		ProgressDelta: 0.25, Spend: 12.5, Budget: 80, DeadlineVirtualNs: 3e9,
		Violations: []*gauntletv1.CausalViolation{{Rule: "r"}},
	}, oneCall())
	b.ReportAllocs()
	for b.Loop() {
		scoring.Score(spec, s)
	}
}

// The reward service replies with a Table; read back, each step's score must be exactly
// what Score gives it, whatever mix of envs and specs a request holds, and survive the wire.
func TestTableReadsBackAsScore(t *testing.T) {
	specs := map[string]scoring.Spec{
		"shop": scoring.SpecFor("shop"),
		"codefix": {Env: "codefix", Version: "codefix/2", Weights: []scoring.Weight{
			{Component: scoring.ComponentCausal, Weight: 2}, {Component: scoring.ComponentTask, Weight: 0.5},
		}},
		"empty": {Env: "empty", Version: "empty/1"},
	}
	calls := map[string]int{}
	specFor := func(env string) scoring.Spec { calls[env]++; return specs[env] }
	var steps []*gauntletv1.StepTaken
	envs := []string{"shop", "codefix", "shop", "empty", "codefix", "shop"}
	for i, env := range envs {
		steps = append(steps, &gauntletv1.StepTaken{
			EpisodeId: "ep-" + env, Step: uint32(i), Env: env,
			Signals: &gauntletv1.Signals{
				ProgressDelta: 0.1 * float64(i), Success: i == 5, InvalidAction: i%2 == 1, Spend: float64(i), Budget: 10,
				DeadlineVirtualNs: 5e9, SafetyEvents: make([]string, i%3),
				Violations: make([]*gauntletv1.CausalViolation, i%2),
			},
			Metering: &gauntletv1.Metering{ToolCalls: uint32(i), VirtualNs: uint64(i) * 400 * ms},
		})
	}
	wire, err := proto.Marshal(&gauntletv1.ScoreReply{Table: scoring.Table(specFor, steps)})
	if err != nil {
		t.Fatal(err)
	}
	var reply gauntletv1.ScoreReply
	if err := proto.Unmarshal(wire, &reply); err != nil {
		t.Fatal(err)
	}
	got, err := reply.StepScores(steps)
	if err != nil {
		t.Fatal(err)
	}
	for i, st := range steps {
		want := scoring.Score(specs[st.Env], st)
		if !proto.Equal(got[i], want) {
			t.Errorf("step %d (%s): table gives %v, Score %v", i, st.Env, got[i], want)
		}
	}
	for env, n := range calls {
		if n != 1 {
			t.Errorf("spec of %s looked up %d times, want once per request", env, n)
		}
	}
	if n := len(reply.Table.Specs); n != 3 {
		t.Errorf("%d specs in the table, want each env's once (3)", n)
	}
}

func BenchmarkTable(b *testing.B) {
	steps := make([]*gauntletv1.StepTaken, 33) // a busy worker's request
	for i := range steps {
		steps[i] = step(&gauntletv1.Signals{ProgressDelta: 0.25, Spend: 12.5, Budget: 80, DeadlineVirtualNs: 3e9}, oneCall())
	}
	b.ReportAllocs()
	for b.Loop() {
		scoring.Table(scoring.SpecFor, steps)
	}
}
