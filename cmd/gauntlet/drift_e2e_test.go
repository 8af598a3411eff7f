package main

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
	"github.com/gauntlet-rl/gauntlet/services/faults"
)

// TestDriftFollowsLinearRampAcrossRun drives a run with a linear drift schedule through the
// real pipeline (scheduler, faults service, workers, store, ClickHouse) and checks that
// every episode's recorded drift value is the ramp's value at the episode's index, that the
// plan the episode met carried it, and that a global drift set in the gauntlet_drift KV
// bucket is applied to every episode and recorded as a change.
func TestDriftFollowsLinearRampAcrossRun(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse; run without -short")
	}
	cfg := testConfig(t)
	cfg.NATSPort = freePort(t) // `gauntlet faults drift` connects from outside below
	s := startStack(t, cfg)
	b := s.app.getBus()
	conn := connect(t, s.app.clickHouseAddr(), cfg.Database)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// Global drift: every planner reads it from KV.
	global, err := plans.ParseDrift("*.latency.jitter_ms=step(0:7)", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := faults.SetGlobalDrift(ctx, b.JS, &gauntletv1.DriftSet{Drift: global, SetBy: t.Name()}); err != nil {
		t.Fatal(err)
	}

	const n = 60
	req := newRun(t, n, "random=1,oracle=1", 11)
	req.Drift, err = plans.ParseDrift("*.http_503.probability=linear(0:0,59:0.59);*.latency.mean_ms=linear(0:10,59:600)", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	runToEnd(t, b, conn, cfg.Database, req)

	_, rows, err := trajectory.Query(ctx, conn, fmt.Sprintf(`SELECT idx, arrayStringConcat(drift_selectors, ' '),
		arrayStringConcat(arrayMap(x -> toString(x), drift_values), ' '), arrayStringConcat(drift_sources, ' '), episode_id
		FROM %s.episodes_final WHERE run_id = '%s' ORDER BY idx`, cfg.Database, req.RunId))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != n {
		t.Fatalf("%d episode rows, want %d", len(rows), n)
	}
	for _, r := range rows {
		idx, _ := strconv.Atoi(r[0])
		if want := "*.latency.jitter_ms *.http_503.probability *.latency.mean_ms"; r[1] != want {
			t.Fatalf("episode %d: selectors %q, want %q", idx, r[1], want)
		}
		if want := "global run run"; r[3] != want {
			t.Fatalf("episode %d: sources %q, want %q", idx, r[3], want)
		}
		vals := strings.Fields(r[2])
		got := make([]float64, len(vals))
		for i, v := range vals {
			got[i], _ = strconv.ParseFloat(v, 64)
		}
		want := []float64{7, float64(idx) / 100, 10 + float64(idx)*590/59}
		for i := range want {
			if math.Abs(got[i]-want[i]) > 1e-9 {
				t.Errorf("episode %d: drift value %d = %v, want %v (ramp)", idx, i, got[i], want[i])
			}
		}
		// The plan the episode met, re-derived from its record (digest checked), holds
		// the drifted numbers.
		row, err := trajectory.Episode(ctx, conn, cfg.Database, r[4])
		if err != nil {
			t.Fatal(err)
		}
		plan, err := trajectory.EpisodePlan(ctx, conn, cfg.Database, row, envServices(t, "shop"))
		if err != nil {
			t.Fatalf("episode %d: %v", idx, err)
		}
		for _, rule := range plan.Rules {
			if l := rule.GetLatency(); strings.HasSuffix(rule.Id, ".latency") && l.GetJitterMs() != 7 {
				t.Errorf("episode %d: rule %s has jitter %v, not the drifted 7", idx, rule.Id, l.JitterMs)
			}
		}
	}
	hist, err := faults.DriftHistory(ctx, b.JS)
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) != 1 || hist[0].Set.SetBy != t.Name() || plans.FormatDrift(hist[0].Set.Drift) != "*.latency.jitter_ms=step(0:7)" {
		t.Fatalf("drift history = %v", hist)
	}

	// The CLI changes the global drift mid-run style and the change is recorded.
	url := s.app.natsURL()
	if out, err := runCLI(t, "faults", "drift", "--nats", url, "set", "*.latency.jitter_ms=step(0:9);payment.http_429.probability=linear(0:0,100:0.5)"); err != nil {
		t.Fatalf("drift set: %v\n%s", err, out)
	}
	out, err := runCLI(t, "faults", "drift", "--nats", url, "show")
	if err != nil || !strings.Contains(out, "revision 2: *.latency.jitter_ms=step(0:9);payment.http_429.probability=linear(0:0,100:0.5)") {
		t.Fatalf("drift show: %v\n%s", err, out)
	}
	out, err = runCLI(t, "faults", "drift", "--nats", url, "history")
	if err != nil || strings.Count(out, "revision ") != 2 || !strings.Contains(out, "by "+t.Name()) {
		t.Fatalf("drift history: %v\n%s", err, out)
	}
	if out, err := runCLI(t, "faults", "drift", "--nats", url, "set", "*.latency.jitter_ms=step(0:-1)"); err == nil || !strings.Contains(out+err.Error(), "-1 is below the minimum 0 ms") {
		t.Fatalf("an invalid drift was accepted: %v\n%s", err, out)
	}
}
