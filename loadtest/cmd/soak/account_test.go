package main

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestAccount(t *testing.T) {
	complete := runRecorded{ID: "r1", Episodes: 3, MinIdx: 0, MaxIdx: 2, ClaimedSteps: 30, DistinctSteps: 30}
	over := apiEpisode{ID: "e1", Acked: 5, Big: 1, Over: true}
	overRec := apiRecorded{EpisodeRows: 1, Steps: 5, CutArgs: 1}
	tests := []struct {
		name     string
		runs     []runLedger
		recorded []runRecorded
		api      []apiEpisode
		apiRec   map[string]apiRecorded
		want     Accounting // the counters checked; Problems only for emptiness
		ok       bool
		problem  string
	}{
		{name: "all recorded", runs: []runLedger{{"r1", 3}}, recorded: []runRecorded{complete},
			api: []apiEpisode{over}, apiRec: map[string]apiRecorded{"e1": overRec},
			want: Accounting{Runs: 1, BuiltinEpisodes: 3, BuiltinRecorded: 3, BuiltinSteps: 30, APIEpisodes: 1,
				APIOver: 1, APIOverRecorded: 1, APISteps: 5, BigActions: 1, BigRecordedCut: 1}, ok: true},
		{name: "a run missing an episode and steps", runs: []runLedger{{"r1", 4}}, recorded: []runRecorded{complete},
			want:    Accounting{Runs: 1, BuiltinEpisodes: 4, BuiltinRecorded: 3, BuiltinSteps: 30, LostEpisodes: 1},
			problem: "3 of 4 episodes"},
		{name: "a run never recorded", runs: []runLedger{{"r2", 7}},
			want:    Accounting{Runs: 1, BuiltinEpisodes: 7, LostEpisodes: 7},
			problem: "none of its 7 episodes"},
		{name: "steps lost inside recorded episodes", runs: []runLedger{{"r1", 3}},
			recorded: []runRecorded{{ID: "r1", Episodes: 3, MaxIdx: 2, ClaimedSteps: 30, DistinctSteps: 28}},
			want:     Accounting{Runs: 1, BuiltinEpisodes: 3, BuiltinRecorded: 3, BuiltinSteps: 28, LostSteps: 2},
			problem:  "28 steps in ClickHouse, its episodes claim 30"},
		{name: "indices out of range", runs: []runLedger{{"r1", 3}},
			recorded: []runRecorded{{ID: "r1", Episodes: 3, MinIdx: 1, MaxIdx: 3, ClaimedSteps: 30, DistinctSteps: 30}},
			want:     Accounting{Runs: 1, BuiltinEpisodes: 3, BuiltinRecorded: 3, BuiltinSteps: 30},
			problem:  "indices 1..3"},
		{name: "a built-in infra error is false", runs: []runLedger{{"r1", 3}},
			recorded: []runRecorded{{ID: "r1", Episodes: 3, MaxIdx: 2, ClaimedSteps: 30, DistinctSteps: 30, InfraErrors: 2}},
			want: Accounting{Runs: 1, BuiltinEpisodes: 3, BuiltinRecorded: 3, BuiltinSteps: 30,
				InfraErrors: 2, FalseInfraErrors: 2},
			problem: "2 episodes recorded as infra errors"},
		{name: "an API episode over but not recorded", api: []apiEpisode{over},
			want:    Accounting{APIEpisodes: 1, APIOver: 1, APISteps: 5, BigActions: 1, LostEpisodes: 1, LostSteps: 5},
			problem: "not in ClickHouse"},
		{name: "an API episode cut by a kill needs no end row",
			api:  []apiEpisode{{ID: "e2", Acked: 3, Big: 1, Cut: true}},
			want: Accounting{APIEpisodes: 1, APICut: 1, APISteps: 3}, ok: true},
		{name: "a big action recorded whole is a problem", api: []apiEpisode{over},
			apiRec:  map[string]apiRecorded{"e1": {EpisodeRows: 1, Steps: 5}},
			want:    Accounting{APIEpisodes: 1, APIOver: 1, APIOverRecorded: 1, APISteps: 5, BigActions: 1},
			problem: "1 big actions, 0 recorded cut"},
		{name: "unanswered steps may be recorded, no more",
			api:     []apiEpisode{{ID: "e3", Acked: 4, Unacked: 1, Over: true}, {ID: "e4", Acked: 4, Unacked: 1, Over: true}},
			apiRec:  map[string]apiRecorded{"e3": {EpisodeRows: 1, Steps: 5}, "e4": {EpisodeRows: 1, Steps: 6}},
			want:    Accounting{APIEpisodes: 2, APIOver: 2, APIOverRecorded: 2, APISteps: 8, ExtraSteps: 1},
			problem: "4 steps acknowledged (+1 unanswered), 6 in ClickHouse"},
		{name: "an API infra error seen or recorded is false",
			api:    []apiEpisode{{ID: "e5", Acked: 2, Over: true, InfraSeen: 1}, {ID: "e6", Acked: 2, Over: true}},
			apiRec: map[string]apiRecorded{"e5": {EpisodeRows: 1, Steps: 2, InfraError: true}, "e6": {EpisodeRows: 1, Steps: 2, InfraError: true}},
			want: Accounting{APIEpisodes: 2, APIOver: 2, APIOverRecorded: 2, APISteps: 4,
				InfraErrors: 2, FalseInfraErrors: 2},
			problem: "recorded as an infra error"},
		{name: "an API episode never closed", api: []apiEpisode{{ID: "e9", Acked: 3, Unclosed: true}},
			want: Accounting{APIEpisodes: 1, APISteps: 3, APIUnclosed: 1}, problem: "Close not answered"},
		{name: "an API episode the API forgot", api: []apiEpisode{{ID: "e8", Acked: 2, Forgotten: true}},
			want: Accounting{APIEpisodes: 1, APISteps: 2}, problem: "answered NOT_FOUND while live"},
		{name: "an API episode neither over nor cut", api: []apiEpisode{{ID: "e7", Acked: 1}},
			want: Accounting{APIEpisodes: 1, APISteps: 1}, problem: "neither closed nor cut"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := map[string]runRecorded{}
			for _, r := range tc.recorded {
				rec[r.ID] = r
			}
			got := account(tc.runs, rec, tc.api, tc.apiRec)
			problems := got.Problems
			got.Problems = nil
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("account =\n %+v\nwant\n %+v", got, tc.want)
			}
			got.Problems = problems
			if got.OK() != tc.ok {
				t.Errorf("OK() = %v, want %v (problems %q)", got.OK(), tc.ok, problems)
			}
			if tc.problem != "" && !strings.Contains(strings.Join(problems, "\n"), tc.problem) {
				t.Errorf("problems %q, want one saying %q", problems, tc.problem)
			}
		})
	}
}

func TestMemoryVerdict(t *testing.T) {
	series := func(f func(i int) uint64) []rssSample {
		var s []rssSample
		for i := range 20 {
			s = append(s, rssSample{At: time.Duration(i) * time.Minute, RSS: f(i)})
		}
		return s
	}
	const mb = 1 << 20
	tests := []struct {
		name     string
		samples  []rssSample
		warmup   time.Duration
		flat     bool
		measured bool
	}{
		{"constant", series(func(int) uint64 { return 300 * mb }), 0, true, true},
		// A kill every 5 samples restarts the process low: a sawtooth is flat.
		{"sawtooth of restarts", series(func(i int) uint64 { return uint64(200+20*(i%5)) * mb }), 0, true, true},
		{"growing", series(func(i int) uint64 { return uint64(200+10*i) * mb }), 0, false, true},
		{"too few samples", series(func(int) uint64 { return mb })[:3], 0, false, false},
		// A climb from 50 MB to a steady 330 MB over the first 8 minutes: growth, unless
		// the warm-up leaves it out.
		{"climb judged", series(func(i int) uint64 { return uint64(min(50+40*i, 330)) * mb }), 0, false, true},
		{"climb left out", series(func(i int) uint64 { return uint64(min(50+40*i, 330)) * mb }), 8 * time.Minute, true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := memoryVerdict(tc.samples, tc.warmup, 0.10)
			if m.Flat != tc.flat || m.FlatnessMeasured != tc.measured {
				t.Errorf("memoryVerdict = %+v, want flat %v, measured %v", m, tc.flat, tc.measured)
			}
		})
	}
	if s := slopeMBPerHour(series(func(i int) uint64 { return uint64(200+i) * mb })); s < 59.9 || s > 60.1 {
		t.Errorf("slope of 1 MB a minute = %.2f MB/h, want 60", s)
	}
}

func TestPacer(t *testing.T) {
	p := pacer{share: 0.01}
	if p.sendBig(0, 50) {
		t.Error("a big action among the first 50: over 1 %")
	}
	if !p.sendBig(0, 100) {
		t.Error("no big action after 100 actions: under 1 %")
	}
	if p.sendBig(1, 150) || !p.sendBig(1, 199) {
		t.Error("the second big action belongs at the 200th action")
	}
	if !p.submitRun(0, 0) {
		t.Error("the first run is held back")
	}
	if p.submitRun(10, 5000) || !p.submitRun(50, 5000) {
		t.Error("a run of 5,000 steps needs 50 big actions before the next")
	}
	none := pacer{}
	if none.sendBig(0, 1e6) || !none.submitRun(0, 1e9) {
		t.Error("share 0: no big actions, runs never held back")
	}
}

func TestInList(t *testing.T) {
	if got, want := inList([]string{"r1", `o'k\`}), `'r1','o\'k\\'`; got != want {
		t.Errorf("inList = %s, want %s", got, want)
	}
}
