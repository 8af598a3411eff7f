package gauntletv1

import (
	"bytes"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
)

func scoreSteps(n int) []*StepTaken {
	steps := make([]*StepTaken, n)
	for i := range steps {
		steps[i] = &StepTaken{EpisodeId: "ep", Step: uint32(i)}
	}
	return steps
}

func twoComponents() *ScoreSpec {
	return &ScoreSpec{Version: "v/1", Names: []string{"task", "cost"}, Weights: []float64{1, 0.2}}
}

func TestStepScoresReadsATable(t *testing.T) {
	r := &ScoreReply{Table: &ScoreTable{
		Specs:  []*ScoreSpec{twoComponents(), {Version: "v/2", Names: []string{"causal"}, Weights: []float64{3}}},
		Spec:   []uint32{0, 1, 0},
		Values: []float64{0.5, -0.1, -0.25, 1, 0},
		Totals: []float64{0.48, -0.75, 1},
	}}
	got, err := r.StepScores(scoreSteps(3))
	if err != nil {
		t.Fatal(err)
	}
	want := []*StepScored{
		{EpisodeId: "ep", Step: 0, SpecVersion: "v/1", Total: 0.48, Components: []*RewardComponent{{Name: "task", Value: 0.5, Weight: 1}, {Name: "cost", Value: -0.1, Weight: 0.2}}},
		{EpisodeId: "ep", Step: 1, SpecVersion: "v/2", Total: -0.75, Components: []*RewardComponent{{Name: "causal", Value: -0.25, Weight: 3}}},
		{EpisodeId: "ep", Step: 2, SpecVersion: "v/1", Total: 1, Components: []*RewardComponent{{Name: "task", Value: 1, Weight: 1}, {Name: "cost", Value: 0, Weight: 0.2}}},
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("score %d = %v, want %v", i, got[i], want[i])
		}
	}
	// Each score's components are its own: appending to one must not reach the next.
	got[1].Components = append(got[1].Components, &RewardComponent{Name: "extra"})
	if got[2].Components[0].Name != "task" {
		t.Error("appending to one score's components overwrote the next score's")
	}
}

func TestStepScoresReadsScores(t *testing.T) {
	old := &ScoreReply{Scores: []*StepScored{{EpisodeId: "ep", Step: 0, Total: 1}}}
	got, err := old.StepScores(scoreSteps(1))
	if err != nil || len(got) != 1 || got[0].Total != 1 {
		t.Fatalf("StepScores of a reply without a table = %v, %v", got, err)
	}
}

func TestStepScoresRefusesWhatDoesNotFit(t *testing.T) {
	table := func(edit func(*ScoreTable)) *ScoreReply {
		tb := &ScoreTable{Specs: []*ScoreSpec{twoComponents()}, Spec: []uint32{0, 0}, Values: []float64{1, 2, 3, 4}, Totals: []float64{1, 2}}
		edit(tb)
		return &ScoreReply{Table: tb}
	}
	for _, tt := range []struct {
		name  string
		reply *ScoreReply
		want  string
	}{
		{"an error", &ScoreReply{Error: "spec store down"}, "reward service: spec store down"},
		{"too few scores", &ScoreReply{Scores: []*StepScored{{}}}, "returned 1 scores for 2 steps"},
		{"a spec index short", table(func(tb *ScoreTable) { tb.Spec = tb.Spec[:1] }), "1 spec indexes and 2 totals for 2 steps"},
		{"a total short", table(func(tb *ScoreTable) { tb.Totals = tb.Totals[:1] }), "2 spec indexes and 1 totals for 2 steps"},
		{"a spec out of range", table(func(tb *ScoreTable) { tb.Spec[1] = 1 }), "spec[1] is 1, past the 1 specs"},
		{"weights short of names", table(func(tb *ScoreTable) { tb.Specs[0].Weights = tb.Specs[0].Weights[:1] }), "specs[0] has 2 names but 1 weights"},
		{"a value short", table(func(tb *ScoreTable) { tb.Values = tb.Values[:3] }), "3 values where its steps' specs have 4 components"},
		{"a value extra", table(func(tb *ScoreTable) { tb.Values = append(tb.Values, 5) }), "5 values where its steps' specs have 4 components"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.reply.StepScores(scoreSteps(2))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to say %q", err, tt.want)
			}
		})
	}
}

// Whatever bytes a reply holds, reading it gives scores or an error, never a panic.
func FuzzStepScores(f *testing.F) {
	good, _ := proto.Marshal(&ScoreReply{Table: &ScoreTable{Specs: []*ScoreSpec{twoComponents()}, Spec: []uint32{0, 0}, Values: []float64{1, 2, 3, 4}, Totals: []float64{1, 2}}})
	f.Add(good, 2)
	f.Add([]byte{}, 0)
	f.Fuzz(func(t *testing.T, data []byte, n int) {
		var r ScoreReply
		if err := UnmarshalAliasing(data, &r); err != nil {
			return
		}
		steps := scoreSteps(min(max(n, 0), 64))
		scores, err := r.StepScores(steps)
		if err == nil && len(scores) != len(steps) {
			t.Fatalf("%d scores for %d steps", len(scores), len(steps))
		}
	})
}

// Reading a busy worker's reply (33 steps of five components) off the wire, as scores and
// as a table, side by side.
func BenchmarkStepScores(b *testing.B) {
	const n = 33
	names := []string{"task", "cost", "safety", "timeliness", "causal"}
	weights := []float64{1, 0.2, 0.5, 0.1, 0.3}
	steps := make([]*StepTaken, n)
	asScores := &ScoreReply{}
	asTable := &ScoreReply{Table: &ScoreTable{Specs: []*ScoreSpec{{Version: "default/1", Names: names, Weights: weights}}}}
	for i := range steps {
		steps[i] = &StepTaken{EpisodeId: "r-7f3a9c1e-0000042", Step: uint32(i)}
		sc := &StepScored{EpisodeId: steps[i].EpisodeId, Step: steps[i].Step, SpecVersion: "default/1", Total: 0.37}
		for j, name := range names {
			v := -0.02 * float64(j+1)
			sc.Components = append(sc.Components, &RewardComponent{Name: name, Value: v, Weight: weights[j]})
			asTable.Table.Values = append(asTable.Table.Values, v)
		}
		asScores.Scores = append(asScores.Scores, sc)
		asTable.Table.Spec = append(asTable.Table.Spec, 0)
		asTable.Table.Totals = append(asTable.Table.Totals, 0.37)
	}
	for _, form := range []struct {
		name  string
		reply *ScoreReply
	}{{"scores", asScores}, {"table", asTable}} {
		wire, err := Marshal(form.reply)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(form.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(wire)))
			for b.Loop() {
				var r ScoreReply
				if err := UnmarshalAliasing(wire, &r); err != nil {
					b.Fatal(err)
				}
				if _, err := r.StepScores(steps); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// DecodeReusing reads what AppendEncoded and proto.Marshal write, replacing what the
// message held (a longer window, an episode so far the next state lacks), and allocates
// nothing once the message has grown to the states' size.
func TestRewardStateDecodeReusing(t *testing.T) {
	big := &RewardState{Episode: &EpisodeSoFar{Steps: 3, Total: 1.5, Progress: 0.25}, Potentials: []float64{0, 0.5, -1},
		Windows: []*ZWindow{{Values: []float64{1, 2, 3}}, {}, {Values: []float64{-4}}}}
	small := &RewardState{Potentials: []float64{0.75}, Windows: []*ZWindow{{Values: []float64{9}}}}
	var st RewardState
	for _, want := range []*RewardState{big, small, {}, big} {
		data, err := want.AppendEncoded([]byte("prefix"))
		if err != nil {
			t.Fatal(err)
		}
		if other, _ := proto.Marshal(want); !bytes.Equal(data[len("prefix"):], other) {
			t.Fatalf("AppendEncoded %x, proto.Marshal %x", data[len("prefix"):], other)
		}
		if err := st.DecodeReusing(data[len("prefix"):]); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(&st, want) {
			t.Fatalf("decoded %v, want %v", &st, want)
		}
	}
	data, _ := proto.Marshal(big)
	if n := testing.AllocsPerRun(100, func() {
		if err := st.DecodeReusing(data); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("%v allocations a decode into a grown message, want 0", n)
	}
}

// A state DecodeReusing cannot read whole is an error naming the field.
func TestRewardStateDecodeRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"unknown field", []byte{0x48, 0x01}, "unknown field 9"},
		{"wrong wire type", []byte{0x08, 0x01}, "field 1: wire type 0"},
		{"unpacked potential", []byte{0x11, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f}, "potentials: wire type 1"},
		{"torn doubles", []byte{0x12, 0x03, 1, 2, 3}, "potentials: 3 bytes"},
		{"unknown window field", []byte{0x1a, 0x02, 0x10, 0x01}, "windows[0]: unknown field 2"},
		{"bad episode", []byte{0x0a, 0x02, 0x08, 0x80}, "episode:"},
		{"truncated", []byte{0x12, 0x10, 1}, "reward state:"},
	} {
		var st RewardState
		if err := st.DecodeReusing(tc.data); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
	}
}
