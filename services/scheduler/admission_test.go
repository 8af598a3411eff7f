package scheduler

import (
	"encoding/json"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

func TestAdmit(t *testing.T) {
	base := Snapshot{Episodes: 100, MaxInFlight: 10, GlobalMax: 1000, Batch: 64}
	cases := []struct {
		name string
		mod  func(*Snapshot)
		want uint64
	}{
		{"fresh run fills its cap", func(*Snapshot) {}, 10},
		{"room left under the cap", func(s *Snapshot) { s.Assigned, s.Ended = 20, 14 }, 4},
		{"cap reached", func(s *Snapshot) { s.Assigned, s.Ended = 20, 10 }, 0},
		{"never past the run's size", func(s *Snapshot) { s.Assigned, s.Ended = 97, 95 }, 3},
		{"run fully assigned", func(s *Snapshot) { s.Assigned, s.Ended = 100, 90 }, 0},
		{"global cap binds", func(s *Snapshot) { s.GlobalInFlight = 996 }, 4},
		{"global cap reached", func(s *Snapshot) { s.GlobalInFlight = 1000 }, 0},
		{"batch binds", func(s *Snapshot) { s.MaxInFlight = 500 }, 64},
		{"duplicate ends never underflow", func(s *Snapshot) { s.Assigned, s.Ended = 5, 9 }, 10},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := base
			tc.mod(&s)
			if got := Admit(s); got != tc.want {
				t.Fatalf("Admit(%+v) = %d, want %d", s, got, tc.want)
			}
		})
	}
}

func TestEndedSetStaysSmallAndDeduplicates(t *testing.T) {
	var s endedSet
	// Out of order within a window of 8, every index twice.
	for base := uint64(0); base < 10_000; base += 8 {
		for _, off := range []uint64{3, 1, 7, 0, 2, 6, 4, 5} {
			if !s.Add(base + off) {
				t.Fatalf("index %d reported as seen", base+off)
			}
			if s.Add(base + off) {
				t.Fatalf("duplicate %d reported as new", base+off)
			}
			if len(s.above) > 8 {
				t.Fatalf("%d stragglers kept, want at most the window", len(s.above))
			}
		}
	}
	if s.Count() != 10_000 || s.Low != 10_000 || len(s.above) != 0 {
		t.Fatalf("count %d low %d above %d", s.Count(), s.Low, len(s.above))
	}
}

func TestEndedSetRoundTrip(t *testing.T) {
	r := &run{spec: &gauntletv1.RunRequested{RunId: "r1", Episodes: 20}}
	r.Spec, _ = proto.Marshal(r.spec)
	for _, i := range []uint64{0, 9, 1, 2, 5} {
		r.Ended.Add(i)
	}
	b, err := r.encode()
	if err != nil {
		t.Fatal(err)
	}
	st, err := gauntletv1.DecodeRunState(b)
	if err != nil {
		t.Fatal(err)
	}
	if st.GetEndedLow() != 3 || !slices.Equal(st.GetEndedAbove(), []uint64{5, 9}) || !proto.Equal(st.GetSpec(), r.spec) {
		t.Fatalf("encoded %v", st)
	}
	back, legacy, err := decodeRun(b)
	if err != nil || legacy {
		t.Fatalf("decodeRun: legacy %v, %v", legacy, err)
	}
	if back.Ended.Count() != 5 || back.Ended.Add(5) || !back.Ended.Add(3) {
		t.Fatalf("decoded set differs: %+v", back.Ended)
	}
}

// A run's state written as JSON by an older scheduler still reads, whole, and is
// reported as legacy so Starting rewrites it.
func TestLegacyJSONRunStateReads(t *testing.T) {
	spec := &gauntletv1.RunRequested{RunId: "r-old", Env: "shop", Episodes: 10, Label: "old"}
	specBytes, _ := proto.Marshal(spec)
	legacy, _ := json.Marshal(map[string]any{
		"spec": specBytes, "assigned": 8, "ended": map[string]any{"low": 3, "above": []uint64{5, 9}},
		"succeeded": 4, "steps": 30, "faults": 2, "infra_errors": 1, "reward_sum": 2.5,
		"started_at": 11, "updated_at": 12,
	})
	r, isLegacy, err := decodeRun(legacy)
	if err != nil || !isLegacy {
		t.Fatalf("decodeRun: legacy %v, %v", isLegacy, err)
	}
	want := &gauntletv1.RunProgress{RunId: "r-old", Env: "shop", Label: "old", Episodes: 10, Assigned: 8, Ended: 5,
		Succeeded: 4, Steps: 30, FaultsFired: 2, InfraErrors: 1, RewardSum: 2.5, StartedAtUnixNano: 11, UpdatedAtUnixNano: 12}
	if got := r.progress(); !proto.Equal(got, want) {
		t.Fatalf("progress = %v, want %v", got, want)
	}
	// Rewritten as a RunState, it says the same.
	b, err := r.encode()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := gauntletv1.DecodeRunProgress(b); err != nil || !proto.Equal(got, want) {
		t.Fatalf("after the rewrite: %v, %v; want %v", got, err, want)
	}
	if got, err := gauntletv1.DecodeRunProgress(legacy); err != nil || !proto.Equal(got, want) {
		t.Fatalf("clients read the JSON as %v, %v; want %v", got, err, want)
	}
}

func TestRunRecordIgnoresDuplicates(t *testing.T) {
	r := &run{spec: &gauntletv1.RunRequested{RunId: "r1", Episodes: 2}}
	end := func(i uint64, ok bool) *gauntletv1.EndedSummary {
		e := &gauntletv1.EpisodeEnded{Episode: &gauntletv1.EpisodeRequested{Index: i, RunId: "r1"}, Steps: 3, Success: ok, TotalReward: 1.5, FaultsFired: 2}
		// Alternate the two shapes an end arrives in: a lone event and a segment's end.
		ev := &gauntletv1.Event{Body: &gauntletv1.Event_Ended{Ended: e}}
		if ok {
			ev = &gauntletv1.Event{Body: &gauntletv1.Event_Steps{Steps: &gauntletv1.StepsTaken{Ended: e}}}
		}
		data, err := proto.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		sum, err := decodeEnded(data)
		if err != nil {
			t.Fatal(err)
		}
		return sum
	}
	r.record(end(0, true))
	r.record(end(0, true)) // a re-run after a crash
	r.record(end(1, false))
	p := r.progress()
	if p.Ended != 2 || p.Succeeded != 1 || p.Steps != 6 || p.FaultsFired != 4 || p.RewardSum != 3 || !p.Done {
		t.Fatalf("progress = %+v", p)
	}
	r.Spec, _ = proto.Marshal(r.spec)
	b, err := r.encode()
	if err != nil {
		t.Fatal(err)
	}
	back, err := gauntletv1.DecodeRunProgress(b)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(back, p) {
		t.Fatalf("progress after a round trip through KV = %v, want %v", back, p)
	}
}

func TestLotsCutAtMultiplesOfTheSize(t *testing.T) {
	for _, c := range []struct {
		first, n, size uint64
		want           []lot
	}{
		{0, 40, 16, []lot{{0, 16}, {16, 16}, {32, 8}}},
		{5, 30, 16, []lot{{5, 11}, {16, 16}, {32, 3}}},
		// A round re-published after a failure, with more room: the same messages but
		// for the last.
		{5, 40, 16, []lot{{5, 11}, {16, 16}, {32, 13}}},
		{7, 3, 1, []lot{{7, 1}, {8, 1}, {9, 1}}},
		{3, 0, 16, nil},
	} {
		if got := lots(c.first, c.n, c.size); !slices.Equal(got, c.want) {
			t.Errorf("lots(%d, %d, %d) = %v, want %v", c.first, c.n, c.size, got, c.want)
		}
	}
}

// BenchmarkRunEncode is the cost of writing a run's state, done for every run an ended
// batch touches before the batch is acknowledged.
func BenchmarkRunEncode(b *testing.B) {
	spec := &gauntletv1.RunRequested{RunId: "run-bench", Env: "shop", ParamsJson: "{}", Episodes: 100_000, MaxInFlight: 512,
		Policies: []*gauntletv1.Share{{Name: "oracle", Weight: 1}}, Label: "bench"}
	r := &run{spec: spec, Assigned: 50_000, Succeeded: 40_000, Steps: 350_000, StartedAt: 1, UpdatedAt: 2}
	r.Spec, _ = proto.Marshal(spec)
	for i := range uint64(40_000) {
		r.Ended.Add(i)
	}
	for i := uint64(40_001); i < 40_400; i += 3 {
		r.Ended.Add(i)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.encode(); err != nil {
			b.Fatal(err)
		}
	}
}
