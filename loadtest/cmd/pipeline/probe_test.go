package main

import (
	"strings"
	"testing"
)

func TestNearestRank(t *testing.T) {
	ms := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, c := range []struct{ p, want float64 }{{50, 5}, {99, 10}, {10, 1}, {100, 10}} {
		if got := nearestRank(ms, c.p); got != c.want {
			t.Errorf("p%v of 1..10 = %v, want %v", c.p, got, c.want)
		}
	}
	// 200 samples: p99 is the 198th, so the two slowest are above it.
	many := make([]float64, 200)
	for i := range many {
		many[i] = float64(i + 1)
	}
	if got := nearestRank(many, 99); got != 198 {
		t.Errorf("p99 of 1..200 = %v, want 198", got)
	}
	if got := nearestRank(nil, 99); got != 0 {
		t.Errorf("p99 of nothing = %v", got)
	}
}

func TestStatsCountErrors(t *testing.T) {
	st := stats([]string{"run", "runs"}, map[string][]probeSample{
		"runs": {{Ms: 3}, {Ms: 1}, {Ms: 2}},
		"run":  {{Ms: 10}, {Ms: 500, Err: "GET /console/api/runs/r1: 504"}, {Ms: 20, Err: "later"}},
	})
	if len(st) != 2 || st[0].Page != "run" || st[1].Page != "runs" {
		t.Fatalf("stats = %+v, want run then runs", st)
	}
	if r := st[0]; r.Count != 3 || r.Errors != 2 || r.FirstError != "GET /console/api/runs/r1: 504" || r.MaxMs != 500 || r.P50Ms != 20 {
		t.Errorf("run = %+v", r)
	}
	if r := st[1]; r.Errors != 0 || r.P50Ms != 2 || r.P99Ms != 3 {
		t.Errorf("runs = %+v", r)
	}
}

// Before any episode has ended only the pages without a run are loaded; then every
// page, the replay once an episode is known, each run page with the requests app.js
// sends for it.
func TestProbePages(t *testing.T) {
	names := func(ps []probePage) string {
		var out []string
		for _, p := range ps {
			out = append(out, p.Name)
		}
		return strings.Join(out, ",")
	}
	if got := names(probePages(consoleTarget{})); got != "shell,runs,curricula" {
		t.Errorf("pages before a run = %s", got)
	}
	ps := probePages(consoleTarget{runID: "r1", episodes: 401, latest: "r1-0000400"})
	if got := names(ps); got != "shell,runs,curricula,run,run, last episodes,fault heatmap,replay" {
		t.Errorf("pages = %s", got)
	}
	for _, p := range ps {
		if p.Name != "shell" && len(p.paths) > 1 && len(p.requests) != len(p.paths) {
			t.Errorf("page %s: %d requests named for %d paths", p.Name, len(p.requests), len(p.paths))
		}
	}
	if got := ps[4].paths[1]; got != "api/runs/r1/episodes?offset=400&limit=200" {
		t.Errorf("last episodes page of 401 = %s", got)
	}
}
