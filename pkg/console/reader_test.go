package console

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// episodeFixture is one ended episode of the test's run, with the faults fired in it.
type episodeFixture struct {
	success uint8
	reward  float64
	steps   uint32
	infra   uint8
	faults  []string // kinds, one per fired fault
}

// runFixture: 3 of 5 episodes succeed, rewards sum to 3.0, one infra error (a model
// endpoint's, episode 4); http_error fired in episodes 1, 2 and 4 (twice in 4), latency
// in 1; 0 and 3 met no fault.
var runFixture = []episodeFixture{
	{1, 1.0, 3, 0, nil},
	{0, -0.5, 3, 0, []string{"http_error", "latency"}},
	{1, 0.5, 2, 0, []string{"http_error"}},
	{1, 2.0, 4, 0, nil},
	{0, 0.0, 1, 1, []string{"http_error", "http_error"}},
}

func insertFixture(t *testing.T, conn driver.Conn, db, runID string, eps []episodeFixture, copies int) {
	t.Helper()
	ctx := context.Background()
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	// Each copy is its own insert, as a redelivered event would be: FINAL must show
	// each episode once.
	for range copies {
		eb, err := conn.PrepareBatch(ctx, "INSERT INTO "+db+".episodes (run_id, episode_id, idx, env, seed, policy, profile, requested_at, started_at, ended_at, steps, success, total_reward, infra_error, infra_kind, faults_fired, reason, version)")
		if err != nil {
			t.Fatal(err)
		}
		fb, err := conn.PrepareBatch(ctx, "INSERT INTO "+db+".faults (run_id, episode_id, step, seq, requested_at, kind, target, detail, version)")
		if err != nil {
			t.Fatal(err)
		}
		for i, e := range eps {
			id := episodeID(runID, i)
			at := t0.Add(time.Duration(i) * time.Second)
			kind := ""
			if e.infra == 1 {
				kind = "model_endpoint"
			}
			if err := eb.Append(runID, id, uint64(i), "shop", uint64(100+i), "oracle", "stress", at, at, at.Add(time.Second),
				e.steps, e.success, e.reward, e.infra, kind, uint32(len(e.faults)), "success", uint64(1)); err != nil {
				t.Fatal(err)
			}
			for j, k := range e.faults {
				if err := fb.Append(runID, id, uint32(0), uint16(j), at, k, "api", "detail", uint64(1)); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := eb.Send(); err != nil {
			t.Fatal(err)
		}
		if err := fb.Send(); err != nil {
			t.Fatal(err)
		}
	}
	sb, err := conn.PrepareBatch(ctx, "INSERT INTO "+db+".steps (run_id, episode_id, step, requested_at, tool, args, observation, state_diff, fault_kinds, fault_targets, fault_details, reward, reward_names, reward_values, reward_spec, terminated, reason, version)")
	if err != nil {
		t.Fatal(err)
	}
	// Episode 1's steps, requested when it was (requested_at is fixed per episode: the
	// replay reads its steps by it).
	id, at := episodeID(runID, 1), t0.Add(time.Second)
	for _, s := range []struct {
		step   uint32
		tool   string
		kinds  []string
		reward float64
	}{{0, "search", []string{"http_error"}, 0.25}, {1, "buy", []string{"latency"}, -0.75}, {2, "pay", nil, 0}} {
		if err := sb.Append(runID, id, s.step, at, s.tool, `{"q":"x"}`, `{"ok":true}`, `[]`,
			s.kinds, make([]string, len(s.kinds)), make([]string, len(s.kinds)), s.reward,
			[]string{"task", "cost"}, []float64{s.reward + 1, -1}, "shop/v1", uint8(0), "", uint64(1)); err != nil {
			t.Fatal(err)
		}
	}
	if err := sb.Send(); err != nil {
		t.Fatal(err)
	}
}

func episodeID(runID string, i int) string { return runID + "-000000" + string(rune('0'+i)) }

// TestAPIAgainstClickHouse reads a known run through the API from a real ClickHouse
// (the schema the store migrates, rows inserted twice as a redelivery would) and checks
// every figure against the numbers worked out by hand.
func TestAPIAgainstClickHouse(t *testing.T) {
	srv, conn := migratedClickHouse(t)
	ctx := context.Background()
	const db = testDB
	insertFixture(t, conn, db, "rA", runFixture, 2)
	insertFixture(t, conn, db, "rB", runFixture[:1], 1)

	c := New(Config{ClickHouse: srv.Addr, Database: db}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer c.Close()
	get := func(path string, v any) int {
		t.Helper()
		rec := httptest.NewRecorder()
		c.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code == http.StatusOK {
			if err := json.Unmarshal(rec.Body.Bytes(), v); err != nil {
				t.Fatalf("%s: %v", path, err)
			}
		}
		return rec.Code
	}
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-12 {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}

	var runs RunsPage
	if code := get("/console/api/runs", &runs); code != http.StatusOK {
		t.Fatalf("runs: status %d", code)
	}
	if len(runs.Runs) != 2 || runs.Runs[0].RunID != "rA" {
		t.Fatalf("runs = %+v, want rA (ended last) then rB", runs.Runs)
	}
	a := runs.Runs[0]
	if a.Env != "shop" || a.Episodes != 5 || a.Successes != 3 || a.InfraErrors != 1 || a.Steps != 13 || a.Live {
		t.Errorf("rA summary = %+v", a)
	}
	// The infra error is left out of the rates, as the run summary and episodes_scored
	// leave it out: 3 successes and 3.0 of reward over the 4 scored episodes.
	near("rA success rate", a.SuccessRate, 0.75)
	near("rA mean reward", a.MeanReward, 0.75)
	if len(a.InfraByKind) != 1 || a.InfraByKind["model_endpoint"] != 1 {
		t.Errorf("rA infra errors by kind = %v, want model_endpoint 1", a.InfraByKind)
	}
	if want := time.Date(2026, 12, 1, 12, 0, 5, 0, time.UTC); !a.Last.Equal(want) {
		t.Errorf("rA last = %v, want %v", a.Last, want)
	}
	if code := get("/console/api/runs?limit=1", &runs); code != http.StatusOK || len(runs.Runs) != 1 {
		t.Errorf("runs?limit=1: status %d, %d runs", code, len(runs.Runs))
	}

	var run RunPage
	if code := get("/console/api/runs/rA", &run); code != http.StatusOK {
		t.Fatalf("run rA: status %d", code)
	}
	// Over the scored episodes: http_error met 1 and 2 (the infra error 4 left out).
	wantKinds := []FaultKind{
		{Kind: "http_error", Episodes: 2, Successes: 1, SuccessRate: 0.5, MeanReward: 0},
		{Kind: "latency", Episodes: 1, Successes: 0, SuccessRate: 0, MeanReward: -0.5},
		{Kind: "", Episodes: 2, Successes: 2, SuccessRate: 1, MeanReward: 1.5},
	}
	if len(run.FaultKinds) != len(wantKinds) {
		t.Fatalf("fault kinds = %+v, want %+v", run.FaultKinds, wantKinds)
	}
	for i, w := range wantKinds {
		g := run.FaultKinds[i]
		if g.Kind != w.Kind || g.Episodes != w.Episodes || g.Successes != w.Successes {
			t.Errorf("fault kind %d = %+v, want %+v", i, g, w)
		}
		near("success rate of "+w.Kind, g.SuccessRate, w.SuccessRate)
		near("mean reward of "+w.Kind, g.MeanReward, w.MeanReward)
	}
	// Rewards of the scored episodes -0.5 .. 2.0 in 20 bins of 0.125: -0.5, 0.5, 1.0 open
	// bins 0, 8, 12; the highest, 2.0, falls in the last. The infra error's 0 is no reward.
	wantBins := map[int]uint64{0: 1, 8: 1, 12: 1, 19: 1}
	if len(run.Histogram) != histogramBins {
		t.Fatalf("%d bins, want %d", len(run.Histogram), histogramBins)
	}
	for i, b := range run.Histogram {
		if b.Count != wantBins[i] {
			t.Errorf("bin %d [%v, %v) = %d, want %d", i, b.Lo, b.Hi, b.Count, wantBins[i])
		}
	}
	if run.SeriesWidth != 1 || len(run.Series) != 5 || run.Series[1].SuccessRate != 0 || run.Series[3].MeanReward != 2 ||
		run.Series[4].InfraErrors != 1 || run.Series[4].SuccessRate != 0 || run.Series[0].InfraErrors != 0 {
		t.Errorf("series (width %d) = %+v", run.SeriesWidth, run.Series)
	}

	var eps EpisodesPage
	if code := get("/console/api/runs/rA/episodes?offset=1&limit=2", &eps); code != http.StatusOK {
		t.Fatalf("episodes: status %d", code)
	}
	if len(eps.Episodes) != 2 || eps.Episodes[0].Idx != 1 || eps.Episodes[1].Idx != 2 || eps.Episodes[0].FaultsFired != 2 {
		t.Errorf("episodes offset 1 limit 2 = %+v", eps.Episodes)
	}

	var ep EpisodePage
	if code := get("/console/api/episodes/"+episodeID("rA", 1)+"?from=1&limit=1", &ep); code != http.StatusOK {
		t.Fatalf("episode: status %d", code)
	}
	if ep.Episode == nil || ep.Episode.Seed != 101 || ep.Episode.Success {
		t.Errorf("episode header = %+v", ep.Episode)
	}
	if len(ep.Steps) != 1 {
		t.Fatalf("steps from 1 limit 1 = %+v", ep.Steps)
	}
	s := ep.Steps[0]
	if s.Step != 1 || s.Tool != "buy" || s.Reward != -0.75 || len(s.Faults) != 1 || s.Faults[0].Kind != "latency" ||
		len(s.Components) != 2 || s.Components[0] != (Component{"task", 0.25}) || s.RewardSpec != "shop/v1" {
		t.Errorf("step 1 = %+v", s)
	}

	// The fault heatmap leaves the infra error (episode 4) out: http_error on api met
	// episodes 1 and 2 (one success), latency on api episode 1.
	var heat HeatmapPage
	if code := get("/console/api/runs/rA/faults", &heat); code != http.StatusOK {
		t.Fatalf("heatmap: status %d", code)
	}
	wantHeat := []HeatCell{{"http_error", "api", 2, 1, 0.5}, {"latency", "api", 1, 0, 0}}
	if len(heat.Cells) != len(wantHeat) || heat.Run.RunID != "rA" {
		t.Fatalf("heatmap = %+v, want %+v", heat, wantHeat)
	}
	for i, w := range wantHeat {
		if heat.Cells[i] != w {
			t.Errorf("heatmap cell %d = %+v, want %+v", i, heat.Cells[i], w)
		}
	}

	// A fork names its parent and step; the parent lists its forks.
	fb, err := conn.PrepareBatch(ctx, "INSERT INTO "+db+".episodes (run_id, episode_id, idx, requested_at, steps, parent_episode_id, parent_step, version)")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		id, parent string
		step       uint32
	}{{"rF-0", "", 0}, {"rF-1", "rF-0", 2}, {"rF-2", "rF-0", 1}} {
		if err := fb.Append("rF", f.id, uint64(0), time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC), uint32(4), f.parent, f.step, uint64(1)); err != nil {
			t.Fatal(err)
		}
	}
	if err := fb.Send(); err != nil {
		t.Fatal(err)
	}
	var fork, parent EpisodePage
	if code := get("/console/api/episodes/rF-1", &fork); code != http.StatusOK || fork.Episode == nil {
		t.Fatalf("fork: status %d %+v", code, fork)
	}
	if fork.Episode.ParentEpisodeID != "rF-0" || fork.Episode.ParentStep != 2 || len(fork.Forks) != 0 {
		t.Errorf("fork rF-1 = %+v, forks %+v; want parent rF-0 at step 2, no forks", fork.Episode, fork.Forks)
	}
	if code := get("/console/api/episodes/rF-0", &parent); code != http.StatusOK || parent.Episode == nil {
		t.Fatalf("parent: status %d %+v", code, parent)
	}
	if want := []Fork{{"rF-2", 1}, {"rF-1", 2}}; len(parent.Forks) != 2 || parent.Forks[0] != want[0] || parent.Forks[1] != want[1] || parent.Episode.ParentEpisodeID != "" {
		t.Errorf("parent rF-0: forks %+v, parent %q; want %+v and none", parent.Forks, parent.Episode.ParentEpisodeID, want)
	}

	for _, path := range []string{"/console/api/runs/rNone", "/console/api/episodes/rNone-0000000"} {
		var v map[string]any
		if code := get(path, &v); code != http.StatusNotFound {
			t.Errorf("%s: status %d, want 404", path, code)
		}
	}
}

// TestCurriculumBatchesAgainstClickHouse reads a curriculum's batches, their episodes
// and the drift each had from a real ClickHouse: batches in stage order, drift values
// averaged per batch and selector, null where a batch had no such drift, and the counts
// of the curricula list.
func TestCurriculumBatchesAgainstClickHouse(t *testing.T) {
	_, conn := migratedClickHouse(t)
	ctx := context.Background()
	const db = testDB
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	rb, err := conn.PrepareBatch(ctx, "INSERT INTO "+db+".runs (run_id, curriculum_id, curriculum_name, stage, stage_name, batch, drift_text, submitted_at, version)")
	if err != nil {
		t.Fatal(err)
	}
	// Inserted out of order, and the stage 1 batch twice (a rewritten row).
	for _, r := range []struct {
		run   string
		stage uint32
		batch uint32
	}{{"c-s1-b0", 1, 0}, {"c-s0-b1", 0, 1}, {"c-s0-b0", 0, 0}, {"c-s1-b0", 1, 0}, {"other-s0-b0", 0, 0}} {
		cur := "cur-1"
		if r.run == "other-s0-b0" {
			cur = "cur-2"
		}
		if err := rb.Append(r.run, cur, "demo", r.stage, "st", r.batch, "", t0, uint64(1)); err != nil {
			t.Fatal(err)
		}
	}
	if err := rb.Send(); err != nil {
		t.Fatal(err)
	}
	eb, err := conn.PrepareBatch(ctx, "INSERT INTO "+db+".episodes (run_id, episode_id, requested_at, success, total_reward, infra_error, infra_kind, drift_selectors, drift_values, version)")
	if err != nil {
		t.Fatal(err)
	}
	// Batch c-s1-b0 has two infra errors (a sandbox's, and one recorded before infra
	// errors had kinds) beside its two successes: left out of its rates, counted by kind.
	for _, e := range []struct {
		run, id string
		ok      uint8
		sels    []string
		vals    []float64
		infra   string // "-": none; else the kind
	}{
		{"c-s0-b0", "a", 1, nil, nil, "-"}, {"c-s0-b0", "b", 0, nil, nil, "-"},
		{"c-s0-b1", "c", 1, []string{"*.latency.mean_ms"}, []float64{10}, "-"},
		{"c-s1-b0", "d", 1, []string{"*.latency.mean_ms"}, []float64{100}, "-"},
		{"c-s1-b0", "e", 1, []string{"*.latency.mean_ms", "api.http_error.p"}, []float64{200, 0.5}, "-"},
		{"c-s1-b0", "g", 0, nil, nil, "sandbox"},
		{"c-s1-b0", "h", 0, nil, nil, ""},
		{"other-s0-b0", "f", 0, nil, nil, "-"},
	} {
		infra, kind := uint8(0), ""
		if e.infra != "-" {
			infra, kind = 1, e.infra
		}
		reward := 1.0
		if infra == 1 {
			reward = 0
		}
		if err := eb.Append(e.run, e.id, t0, e.ok, reward, infra, kind, e.sels, e.vals, uint64(1)); err != nil {
			t.Fatal(err)
		}
	}
	if err := eb.Send(); err != nil {
		t.Fatal(err)
	}
	rd := reader{conn: conn, database: db}
	batches, sels, err := rd.CurriculumBatches(ctx, "cur-1")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"*.latency.mean_ms", "api.http_error.p"}; len(sels) != 2 || sels[0] != want[0] || sels[1] != want[1] {
		t.Fatalf("selectors = %v, want %v", sels, want)
	}
	if len(batches) != 3 {
		t.Fatalf("batches = %+v, want 3", batches)
	}
	show := func(v *float64) string {
		if v == nil {
			return "null"
		}
		return strconv.FormatFloat(*v, 'g', -1, 64)
	}
	for i, w := range []struct {
		run            string
		eps, infra, ok uint64
		rate, reward   float64
		lat, errorP    string
		kinds          string
	}{
		{"c-s0-b0", 2, 0, 1, 0.5, 1, "null", "null", "map[]"},
		{"c-s0-b1", 1, 0, 1, 1, 1, "10", "null", "map[]"},
		{"c-s1-b0", 4, 2, 2, 1, 1, "150", "0.5", "map[sandbox:1 unknown:1]"},
	} {
		b := batches[i]
		if b.RunID != w.run || b.Episodes != w.eps || b.InfraErrors != w.infra || b.Successes != w.ok || b.SuccessRate != w.rate ||
			b.MeanReward != w.reward || show(b.Drift[0]) != w.lat || show(b.Drift[1]) != w.errorP || fmt.Sprint(b.InfraByKind) != w.kinds {
			t.Errorf("batch %d = %+v (drift %s, %s), want %+v", i, b, show(b.Drift[0]), show(b.Drift[1]), w)
		}
	}
	counts, err := rd.CurriculumCounts(ctx, []string{"cur-1", "cur-2", "cur-none"})
	if err != nil {
		t.Fatal(err)
	}
	if got := counts["cur-1"]; got != (curriculumCount{Name: "demo", Runs: 3, Episodes: 7, InfraErrors: 2, Successes: 4}) {
		t.Errorf("cur-1 counts = %+v", got)
	}
	if got := counts["cur-2"]; got != (curriculumCount{Name: "demo", Runs: 1, Episodes: 1}) {
		t.Errorf("cur-2 counts = %+v", got)
	}
	if _, ok := counts["cur-none"]; ok || len(counts) != 2 {
		t.Errorf("counts = %+v, want cur-1 and cur-2 only", counts)
	}

	// A closed stage says how many of its episodes were infra errors, and of which kind;
	// one closed before kinds were recorded gives its count alone.
	sb, err := conn.PrepareBatch(ctx, "INSERT INTO "+db+".curriculum_stages (curriculum_id, curriculum_prefix, stage, stage_name, outcome, episodes, succeeded, infra_errors, infra_kinds, infra_counts, batches, closed_at, closed_at_ns, version)")
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Append("cur-1", "c", uint32(0), "old", "promoted", uint64(20), uint64(18), uint64(1), []string{}, []uint64{}, uint32(2), t0, uint64(t0.UnixNano()), uint64(1)); err != nil {
		t.Fatal(err)
	}
	if err := sb.Append("cur-1", "c", uint32(1), "st", "promoted", uint64(40), uint64(27), uint64(10), []string{"model_endpoint", "sandbox"}, []uint64{7, 3}, uint32(2), t0, uint64(t0.UnixNano()), uint64(1)); err != nil {
		t.Fatal(err)
	}
	if err := sb.Send(); err != nil {
		t.Fatal(err)
	}
	stages, err := rd.CurriculumStages(ctx, "cur-1")
	if err != nil {
		t.Fatal(err)
	}
	if len(stages) != 2 || stages[1].Episodes != 40 || stages[1].InfraErrors != 10 || stages[1].Succeeded != 27 {
		t.Fatalf("stages = %+v, want stage 1 with 40 episodes, 10 infra errors, 27 successes", stages)
	}
	if got := fmt.Sprint(stages[1].InfraByKind); got != "map[model_endpoint:7 sandbox:3]" {
		t.Errorf("stage 1 infra errors by kind %s, want model_endpoint 7, sandbox 3", got)
	}
	if got := fmt.Sprint(stages[0].InfraByKind); got != "map[]" || stages[0].InfraErrors != 1 {
		t.Errorf("stage 0 (closed before kinds): %d infra errors by kind %s, want 1 and no kinds", stages[0].InfraErrors, got)
	}
}
