package gauntletv1

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
)

// fullScore is a score in the full form, as a worker holds it.
func fullScore(episode string, step uint32, version string, names []string, weights, values []float64) *StepScored {
	sc := &StepScored{EpisodeId: episode, Step: step, SpecVersion: version}
	for i, n := range names {
		sc.Components = append(sc.Components, &RewardComponent{Name: n, Weight: weights[i], Value: values[i]})
		sc.Total += weights[i] * values[i]
	}
	return sc
}

// segmentEvent is a batch of two segments: the first with steps scored under two specs
// and one step without a score, the second under the first spec only.
func segmentEvent() *Event {
	names := []string{"task", "cost", "safety"}
	a, b := []float64{1, 0.2, 0.5}, []float64{1, 0.4, 0.5}
	seg := func(id string, steps int, weights func(i int) []float64) *Event {
		s := &StepsTaken{Started: &EpisodeStarted{WorkerId: "w"}}
		for i := range steps {
			st := &StepTaken{EpisodeId: id, Step: uint32(i), ObservationJson: `{"ok":true}`}
			if i != 2 {
				st.Score = fullScore(id, uint32(i), "v/1", names, weights(i), []float64{0.1 * float64(i), -0.02, 0})
			}
			s.Steps = append(s.Steps, st)
		}
		return &Event{Body: &Event_Steps{Steps: s}}
	}
	return &Event{Body: &Event_Batch{Batch: &EventBatch{Events: []*Event{
		seg("e1", 5, func(i int) []float64 {
			if i == 3 {
				return b
			}
			return a
		}),
		seg("e2", 3, func(int) []float64 { return a }),
	}}}}
}

// TestMarshalCompactsSegmentScores: Marshal writes a segment's scores in the compact
// form, leaves the event as it was, and ScoreOf reads every score back as it was.
func TestMarshalCompactsSegmentScores(t *testing.T) {
	ev := segmentEvent()
	before := proto.Clone(ev)
	data, err := Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(ev, before) {
		t.Fatal("Marshal changed the event it encoded")
	}
	full, err := proto.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) >= len(full) {
		t.Errorf("compact encoding is %d bytes, the full one %d", len(data), len(full))
	}
	var got Event
	if err := UnmarshalAliasing(data, &got); err != nil {
		t.Fatal(err)
	}
	segs := got.GetBatch().GetEvents()
	if n := len(segs[0].GetSteps().GetScoreSpecs()); n != 2 {
		t.Errorf("first segment: %d score specs, want 2 (two weightings)", n)
	}
	if n := len(segs[1].GetSteps().GetScoreSpecs()); n != 1 {
		t.Errorf("second segment: %d score specs, want 1", n)
	}
	for i, e := range segs {
		seg := e.GetSteps()
		orig := ev.GetBatch().GetEvents()[i].GetSteps()
		for j, st := range seg.GetSteps() {
			sc, err := seg.ScoreOf(st)
			if err != nil {
				t.Fatalf("segment %d step %d: %v", i, j, err)
			}
			want, err := orig.ScoreOf(orig.Steps[j]) // the full form
			if err != nil {
				t.Fatal(err)
			}
			if !sameScore(sc, want) {
				t.Errorf("segment %d step %d: ScoreOf = %+v, want %+v", i, j, sc, want)
			}
			if len(st.GetScore().GetComponents()) != 0 || st.GetScore().GetEpisodeId() != "" {
				t.Errorf("segment %d step %d: score not compact on the wire: %v", i, j, st.GetScore())
			}
		}
		if st := seg.GetSteps()[2]; st.GetScore() != nil {
			t.Errorf("segment %d: the step without a score got one: %v", i, st.GetScore())
		}
	}
	// A decoded segment published again (a republish) is written as it is.
	again, err := Marshal(&got)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, data) {
		t.Error("re-encoding a decoded compact event changed its bytes")
	}
}

func sameScore(a, b Score) bool {
	if a.Version != b.Version || a.Total != b.Total || len(a.Names) != len(b.Names) || len(a.Values) != len(b.Values) {
		return false
	}
	for i := range a.Names {
		if a.Names[i] != b.Names[i] || a.Values[i] != b.Values[i] {
			return false
		}
	}
	return true
}

// TestScoreOfRefusesWhatDoesNotFit: a compact score that names a spec the segment does not
// have, or has the wrong number of values, is an error naming the field; its total stays.
func TestScoreOfRefusesWhatDoesNotFit(t *testing.T) {
	seg := &StepsTaken{ScoreSpecs: []*ScoreSpec{{Version: "v/1", Names: []string{"task", "cost"}, Weights: []float64{1, 0.2}}}}
	for _, c := range []struct {
		score *StepScored
		want  string
	}{
		{&StepScored{Spec: 1, Values: []float64{1, 2}, Total: 0.5}, "score.spec: 1, past the segment's 1 score_specs"},
		{&StepScored{Spec: 0, Values: []float64{1}, Total: 0.5}, "score.values: 1 values for the 2 components of score_specs[0]"},
	} {
		sc, err := seg.ScoreOf(&StepTaken{Step: 7, Score: c.score})
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "step 7") {
			t.Errorf("ScoreOf(%v) error = %v, want one containing %q", c.score, err, c.want)
		}
		if sc.Total != 0.5 || sc.Names != nil {
			t.Errorf("ScoreOf(%v) = %+v, want only the total", c.score, sc)
		}
	}
	// A lone step (no segment) in the full form reads as it is.
	sc, err := (*StepsTaken)(nil).ScoreOf(&StepTaken{Score: fullScore("e", 0, "v/1", []string{"task"}, []float64{1}, []float64{0.3})})
	if err != nil || sc.Version != "v/1" || len(sc.Names) != 1 || sc.Values[0] != 0.3 || sc.Total != 0.3 {
		t.Errorf("lone step: %+v, %v", sc, err)
	}
}

// A worker's scores in the values form (LeanStepScores), mixed in one segment with scores
// in the full form, are written in the compact form like them: a reader of the bytes
// finds every step's names, weights and values, and the segment is left as it was.
// Full gives each lean score what StepScores gives its step.
func TestLeanScoresEncodeAsFullOnes(t *testing.T) {
	reply := &ScoreReply{Table: &ScoreTable{
		Specs: []*ScoreSpec{
			{Version: "lean/1", Digest: "sha256:lean-test", Names: []string{"task", "cost", "progress"}, Weights: []float64{1, 0.2, 0.5}},
			{Version: "lean/2", Digest: "sha256:lean-test-2", Names: []string{"task"}, Weights: []float64{2}},
		},
		Spec:   []uint32{0, 1, 0},
		Values: []float64{0.5, -0.1, 0.25, 1, 0, -0.3, 0.125},
		Totals: []float64{0.605, 2, 0.0025},
	}}
	steps := scoreSteps(3)
	lean, err := reply.LeanStepScores(steps)
	if err != nil {
		t.Fatal(err)
	}
	full, err := reply.StepScores(steps)
	if err != nil {
		t.Fatal(err)
	}
	for i := range steps {
		if len(lean[i].Components) != 0 || len(lean[i].Values) == 0 {
			t.Fatalf("step %d: %v, want the values form", i, lean[i])
		}
		if !proto.Equal(lean[i].Full(), full[i]) {
			t.Errorf("step %d: Full %v, StepScores %v", i, lean[i].Full(), full[i])
		}
		steps[i].Score = lean[i]
	}
	// A fourth step in the full form, under a spec of its own.
	fourth := &StepTaken{EpisodeId: "ep", Step: 3, Score: fullScore("ep", 3, "v/9", []string{"safety"}, []float64{1}, []float64{-0.5})}
	seg := &StepsTaken{Steps: append(steps, fourth)}
	ev := &Event{Body: &Event_Steps{Steps: seg}}
	before := proto.Clone(ev)
	data, err := Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(ev, before) {
		t.Fatal("Marshal changed the event it encoded")
	}
	var got Event
	if err := Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	gs := got.GetSteps()
	if len(gs.GetScoreSpecs()) != 3 {
		t.Fatalf("%d score_specs, want 3 (each spec once)", len(gs.GetScoreSpecs()))
	}
	for i, st := range gs.GetSteps() {
		sc, err := gs.ScoreOf(st)
		if err != nil {
			t.Fatal(err)
		}
		want := full[min(i, 2)]
		if i == 3 {
			want = fourth.Score
		}
		if sc.Version != want.SpecVersion || sc.Digest != want.SpecDigest || sc.Total != want.Total || len(sc.Names) != len(want.Components) {
			t.Fatalf("step %d read back as %+v, want %v", i, sc, want)
		}
		for j, c := range want.Components {
			if sc.Names[j] != c.Name || sc.Values[j] != c.Value || gs.ScoreSpecs[st.Score.Spec].Weights[j] != c.Weight {
				t.Fatalf("step %d component %d read back as %s=%v, want %v", i, j, sc.Names[j], sc.Values[j], c)
			}
		}
		// A lone step in the values form, not yet encoded, reads the same.
		if i < 3 {
			if lone, err := (*StepsTaken)(nil).ScoreOf(steps[i]); err != nil || lone.Version != sc.Version || !slices.Equal(lone.Names, sc.Names) || !slices.Equal(lone.Values, sc.Values) {
				t.Errorf("step %d alone: %+v (%v), want %+v", i, lone, err, sc)
			}
		}
	}
}

// A spec the process keeps under a version and digest with other weights (specs built in
// Go, without a digest) gives its steps' scores in the full form, never values a reader
// would name wrongly.
func TestLeanScoresOfAConflictingSpecAreFull(t *testing.T) {
	table := func(w float64) *ScoreReply {
		return &ScoreReply{Table: &ScoreTable{
			Specs:  []*ScoreSpec{{Version: "conflict/1", Names: []string{"task"}, Weights: []float64{w}}},
			Spec:   []uint32{0},
			Values: []float64{0.5},
			Totals: []float64{0.5 * w},
		}}
	}
	if got, err := table(1).LeanStepScores(scoreSteps(1)); err != nil || len(got[0].Values) != 1 {
		t.Fatalf("first spec: %v, %v; want the values form", got, err)
	}
	got, err := table(3).LeanStepScores(scoreSteps(1))
	if err != nil || len(got[0].Components) != 1 || got[0].Components[0].Weight != 3 {
		t.Fatalf("the same version with another weight: %v, %v; want the full form with weight 3", got, err)
	}
}
