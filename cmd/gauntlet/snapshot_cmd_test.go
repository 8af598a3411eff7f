package main

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// Bad snapshot and fork command lines are refused before anything starts.
func TestBadSnapshotCommandLines(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"episode", "snapshot", "ep-1"}, "usage: gauntlet episode snapshot"},
		{[]string{"episode", "snapshot", "--step", "2"}, "usage: gauntlet episode snapshot"},
		{[]string{"episode", "snapshot", "a", "b", "--step", "1"}, "usage: gauntlet episode snapshot"},
		{[]string{"episode", "snapshot", "x'; DROP", "--step", "1"}, "only letters, digits"},
		{[]string{"episode", "snapshot", "ep-1", "--step", "x"}, `invalid value "x" for flag -step`},
		{[]string{"episode", "fork", "ep-1", "--step", "1", "--branches", "0"}, "--branches: 0 must be between 1 and 64"},
		{[]string{"episode", "fork", "ep-1", "--step", "1", "--policy", "genius"}, `unknown policy "genius"`},
		{[]string{"episode", "fork", "ep-1", "--step", "1", "--data-dir", "/nonexistent"}, "no running stack found"},
		{[]string{"episode", "show"}, "usage: gauntlet episode show"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := runMain(context.Background(), tc.args, &out, &errOut)
			if err == nil {
				t.Fatalf("accepted; stdout %q", out.String())
			}
			if msg := err.Error() + "\n" + errOut.String(); !strings.Contains(msg, tc.want) {
				t.Fatalf("error %q does not say %q", msg, tc.want)
			}
		})
	}
}

// A shop episode forks like a codefix one: the oracle takes over a random episode after
// its first steps, in several branches, and at step 0; shop episodes keep no sandbox, so
// each branch is the episode replayed afresh.
func TestForkShopEpisode(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse; run without -short")
	}
	cfg := testConfig(t)
	s := startStack(t, cfg)
	conn := connect(t, s.app.clickHouseAddr(), cfg.Database)
	req := newRun(t, 16, "random=1", 5)
	req.Profiles = []*gauntletv1.Share{{Name: "baseline", Weight: 1}}
	runToEnd(t, s.app.getBus(), conn, cfg.Database, req)
	ep := queryOne(t, conn, fmt.Sprintf(`SELECT min(episode_id) FROM %s.episodes FINAL WHERE run_id = '%s' AND steps >= 3`, cfg.Database, req.RunId))
	cli := []string{"--clickhouse", s.app.clickHouseAddr(), "--database", cfg.Database, "--data-dir", t.TempDir()}
	for _, tc := range []struct{ step, branches int }{{2, 1}, {2, 3}, {0, 1}} {
		var stdout, stderr bytes.Buffer
		args := append([]string{"episode", "fork", ep, "--step", strconv.Itoa(tc.step), "--policy", "oracle", "--branches", strconv.Itoa(tc.branches)}, cli...)
		if err := runMain(context.Background(), args, &stdout, &stderr); err != nil {
			t.Errorf("%v: %v\n%s%s", args, err, stdout.String(), stderr.String())
			continue
		}
		if !strings.Contains(stdout.String(), "every observation identical") {
			t.Errorf("fork --step %d: replay not exact:\n%s", tc.step, stdout.String())
		}
		if n := strings.Count(stdout.String(), "success=true"); n != tc.branches {
			t.Errorf("fork --step %d: %d of %d branches succeeded:\n%s", tc.step, n, tc.branches, stdout.String())
		}
	}
}

// episode show writes a step's reward as the weighted sum it is, with its spec, and says
// so when the weights are unknown instead of presenting the values as the sum.
func TestFormatReward(t *testing.T) {
	tests := []struct {
		total, names, values string
		weights              []float64
		want                 string
	}{
		{"0.2435", "['task','cost','safety','timeliness','causal']", "[0.25,-0.02,0,-0.0025,0]", []float64{1, 0.2, 0.5, 0.1, 0.3},
			"reward 0.244 = 1×task 0.25 + 0.2×cost -0.02 + 0.5×safety 0 + 0.1×timeliness -0.003 + 0.3×causal 0  (default/1)"},
		{"-0.5", "['late']", "[-0.5]", nil, "reward -0.5 = ?×late -0.5  (x/1)"},
		{"1", "garbled", "[1]", nil, "reward 1 (x/1)"},
	}
	for _, tt := range tests {
		spec := "x/1"
		if len(tt.weights) == 5 {
			spec = "default/1"
		}
		if got := formatReward(tt.total, tt.names, tt.values, spec, tt.weights); got != tt.want {
			t.Errorf("formatReward(%s, %s) = %q, want %q", tt.names, tt.values, got, tt.want)
		}
	}
}
