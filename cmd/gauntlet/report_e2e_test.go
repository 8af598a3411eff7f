package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/gauntlet-rl/gauntlet/pkg/report"
	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// TestReportEqualsTheDocumentedSQL runs two batches of a curriculum-like pair of runs
// (stage 0 and stage 1, different seeds) through the real pipeline, then checks the runs
// table against what was submitted and what the scheduler counted, and the report (of the
// two runs, and of the curriculum) against the SQL docs/querying.md shows, run on the
// same ClickHouse: every number of the report is that SQL's.
func TestReportEqualsTheDocumentedSQL(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse; run without -short")
	}
	ctx := context.Background()
	cfg := testConfig(t)
	s := startStack(t, cfg)
	conn := connect(t, s.app.clickHouseAddr(), cfg.Database)
	var reqs []*gauntletv1.RunRequested
	finals := map[string]*gauntletv1.RunProgress{}
	for stage, seed := range []uint64{7, 8} {
		req := newRun(t, 300, "random=1,oracle=1", seed)
		req.Profiles = []*gauntletv1.Share{{Name: "baseline", Weight: 1}, {Name: "stress", Weight: 2}, {Name: "edge", Weight: 1}}
		req.Origin.CurriculumId, req.Origin.CurriculumName, req.Origin.CurriculumPrefix = "curriculum-report-test", "report", "cfeedbeef"
		req.Origin.Stage, req.Origin.StageName, req.Origin.Batch = uint32(stage), fmt.Sprintf("stage%d", stage), 0
		finals[req.RunId] = runToEnd(t, s.app.getBus(), conn, cfg.Database, req)
		reqs = append(reqs, req)
	}

	// The runs table: what was submitted, and the scheduler's final counts.
	var rows []trajectory.RunRow
	deadline := time.Now().Add(time.Minute)
	for {
		var err error
		rows, err = trajectory.Runs(ctx, conn, cfg.Database, reqs[0].RunId, reqs[1].RunId)
		if err == nil && len(rows) == 2 && rows[0].State == trajectory.RunDone && rows[1].State == trajectory.RunDone {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("runs rows after a minute: %+v (err %v)", rows, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, r := range rows {
		var req *gauntletv1.RunRequested
		for _, q := range reqs {
			if q.RunId == r.RunID {
				req = q
			}
		}
		f := finals[r.RunID]
		if r.Seed != req.Seed || r.Label != req.Label || r.PolicyMix != "random=1,oracle=1" || r.ProfileMix != "baseline=1,stress=2,edge=1" ||
			r.Env != "shop" || r.Episodes != 300 || r.SubmittedBy == "" || r.GauntletVersion != version ||
			r.RewardSpec != scoring.SpecFor("shop").Version || r.CurriculumID != "curriculum-report-test" || r.Stage != req.Origin.Stage ||
			r.SubmittedAtNs != uint64(req.RequestedAtUnixNano) || r.StartedAtNs == 0 || r.FinishedAtNs < r.StartedAtNs {
			t.Errorf("runs row %+v does not match the request %v", r, req)
		}
		if r.Ended != f.Ended || r.Succeeded != f.Succeeded || r.Steps != f.Steps || r.FaultsFired != f.FaultsFired || r.InfraErrors != f.InfraErrors {
			t.Errorf("runs row counts %+v; the scheduler's %v", r, f)
		}
	}

	docs := documentedQueries(t)
	ids := []string{reqs[0].RunId, reqs[1].RunId}
	for _, c := range []struct {
		name string
		args []string
		runs []string
	}{
		{"runs", ids, ids},
		{"curriculum", []string{"--curriculum", "curriculum-report-test"}, ids},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			args := append([]string{"--clickhouse", s.app.clickHouseAddr(), "--database", cfg.Database, "--format", "json"}, c.args...)
			if err := cmdReport(ctx, args, &out, &errOut); err != nil {
				t.Fatalf("report: %v\n%s", err, errOut.String())
			}
			var r report.Report
			if err := json.Unmarshal(out.Bytes(), &r); err != nil {
				t.Fatalf("report JSON: %v\n%s", err, out.String())
			}
			checkReport(t, conn, cfg.Database, docs, c.runs, &r, c.name == "curriculum")
		})
	}

	// The other formats: a table, and one HTML file that needs nothing from a network.
	var table bytes.Buffer
	if err := cmdReport(ctx, append([]string{"--clickhouse", s.app.clickHouseAddr(), "--database", cfg.Database}, ids...), &table, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Overview", "By run", "Under faults", "Resource limits", "Cost and metering", "Step latency", "Stuck and looping", reqs[1].RunId} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table report lacks %q:\n%s", want, table.String())
		}
	}
	htmlPath := filepath.Join(t.TempDir(), "report.html")
	args := []string{"--clickhouse", s.app.clickHouseAddr(), "--database", cfg.Database, "--format", "html", "--out", htmlPath, "--curriculum", "cfeedbeef"}
	if err := cmdReport(ctx, args, &bytes.Buffer{}, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(htmlPath)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(page), "<svg"); n < 4 {
		t.Errorf("HTML report has %d charts; want at least 4", n)
	}
	// The only URL is SVG's namespace, a name that is never fetched.
	if urls := regexp.MustCompile(`(?:https?:)?//[a-z0-9.-]+\.[a-z]+[^"'\s]*`).FindAllString(strings.ReplaceAll(string(page), "http://www.w3.org/2000/svg", ""), -1); len(urls) > 0 {
		t.Errorf("HTML report refers to %v; it must open offline", urls)
	}
	if regexp.MustCompile(`<(script|link|img|iframe)\b`).Match(page) {
		t.Error("HTML report loads scripts, styles or images; it must be one self-contained file")
	}
}

// documentedQueries reads the report's queries from docs/querying.md, by marker.
func documentedQueries(t *testing.T) map[string]string {
	t.Helper()
	data, err := os.ReadFile("../../docs/querying.md")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, m := range regexp.MustCompile("(?s)<!-- report:(\\w+) -->\n```sql\n(.*?)\n```").FindAllStringSubmatch(string(data), -1) {
		out[m[1]] = strings.ReplaceAll(m[2], "gauntlet.", "{db}.")
	}
	for _, q := range report.Queries {
		if out[q.Name] == "" {
			t.Fatalf("docs/querying.md shows no query report:%s", q.Name)
		}
	}
	return out
}

// checkReport compares every number of r with the documented SQL run over runs.
func checkReport(t *testing.T, conn driver.Conn, db string, docs map[string]string, runs []string, r *report.Report, curriculum bool) {
	t.Helper()
	scope := report.Scope{Database: db, Runs: runs}
	sql := func(name string) []report.Row {
		t.Helper()
		rows, err := report.Run(context.Background(), conn, docs[name], scope)
		if err != nil {
			t.Fatalf("documented query %s: %v", name, err)
		}
		return rows
	}
	u := func(row report.Row, col string) uint64 { v, _ := row[col].(uint64); return v }
	f := func(row report.Row, col string) float64 {
		switch v := row[col].(type) {
		case float64:
			return v
		case uint64:
			return float64(v)
		}
		return 0
	}
	eqf := func(what string, got, want float64) {
		t.Helper()
		if got != want && math.Abs(got-want) > 1e-9*math.Max(1, math.Abs(want)) {
			t.Errorf("%s: report %v, SQL %v", what, got, want)
		}
	}
	equ := func(what string, got, want uint64) {
		t.Helper()
		if got != want {
			t.Errorf("%s: report %d, SQL %d", what, got, want)
		}
	}
	rate := func(what string, got report.Rate, k, n uint64) {
		t.Helper()
		equ(what+" successes", got.Successes, k)
		equ(what+" trials", got.Trials, n)
		want := report.Wilson(k, n)
		eqf(what+" rate", got.Rate, want.Rate)
		eqf(what+" low", got.Low, want.Low)
		eqf(what+" high", got.High, want.High)
	}
	quant := func(what string, got report.Quantiles, row report.Row, col string) {
		t.Helper()
		v, _ := row[col].([]float64)
		if len(v) != 3 {
			t.Fatalf("%s: SQL gave %v", what, row[col])
		}
		eqf(what+" p50", got.P50, v[0])
		eqf(what+" p90", got.P90, v[1])
		eqf(what+" p99", got.P99, v[2])
	}

	ov := sql("overview")[0]
	scope.First, scope.Last = u(ov, "first"), u(ov, "last")
	if scope.First == 0 || scope.Last < scope.First {
		t.Fatalf("overview: episodes requested from %d to %d", scope.First, scope.Last)
	}
	equ("episodes", r.Episodes, u(ov, "episodes"))
	equ("infra errors", r.InfraErrors, u(ov, "infra_errors"))
	rate("success", r.Success, u(ov, "succeeded"), u(ov, "scored"))
	eqf("reward mean", r.RewardMean, f(ov, "reward_mean"))
	quant("reward", r.Reward, ov, "reward_p50_p90_p99")
	quant("steps", r.Steps, ov, "steps_p50_p90_p99")
	equ("stuck", r.Stuck, u(ov, "stuck"))
	if r.Episodes != 600 || r.Success.Successes == 0 {
		t.Errorf("overview %+v: want the 600 episodes, some of them successful", r)
	}

	byRun := sql("by_run")
	if len(byRun) != len(r.ByRun) {
		t.Fatalf("by run: report %d lines, SQL %d", len(r.ByRun), len(byRun))
	}
	for i, row := range byRun {
		g := r.ByRun[i]
		if g.Key != row["run_id"] || g.Run == nil || g.Run.RunID != g.Key {
			t.Errorf("by run line %d: %+v, SQL run %v", i, g, row["run_id"])
		}
		equ("by run episodes", g.Episodes, u(row, "episodes"))
		rate("by run "+g.Key, g.Success, u(row, "succeeded"), u(row, "scored"))
		eqf("by run reward mean", g.RewardMean, f(row, "reward_mean"))
		quant("by run reward", g.Reward, row, "reward_p50_p90_p99")
	}
	byPolicy := sql("by_policy")
	if len(byPolicy) != len(r.ByPolicy) || len(byPolicy) != 2 {
		t.Fatalf("by policy: report %d lines, SQL %d; want 2", len(r.ByPolicy), len(byPolicy))
	}
	for i, row := range byPolicy {
		g := r.ByPolicy[i]
		if g.Key != row["policy"] {
			t.Errorf("by policy line %d: %s, SQL %v", i, g.Key, row["policy"])
		}
		rate("by policy "+g.Key, g.Success, u(row, "succeeded"), u(row, "scored"))
		eqf("by policy reward mean", g.RewardMean, f(row, "reward_mean"))
	}
	if curriculum {
		byStage := sql("by_stage")
		if len(byStage) != 2 || len(r.ByStage) != 2 {
			t.Fatalf("by stage: report %d lines, SQL %d; want 2", len(r.ByStage), len(byStage))
		}
		for i, row := range byStage {
			g := r.ByStage[i]
			if g.Key != fmt.Sprintf("%d %s", u(row, "stage"), row["stage_name"]) {
				t.Errorf("by stage line %d: %s, SQL %v", i, g.Key, row)
			}
			equ("by stage episodes", g.Episodes, u(row, "episodes"))
			equ("stage "+g.Key+" episodes (each stage is one run of 300)", g.Episodes, 300)
			rate("by stage "+g.Key, g.Success, u(row, "succeeded"), u(row, "scored"))
			eqf("by stage reward mean", g.RewardMean, f(row, "reward_mean"))
		}
	}

	un := sql("unfaulted")[0]
	rate("unfaulted", r.Unfaulted, u(un, "succeeded"), u(un, "episodes"))
	eqf("unfaulted reward mean", r.UnfaultedRewardMean, f(un, "reward_mean"))
	met, first := sql("fault_met"), sql("fault_first")
	if len(met) == 0 || len(first) == 0 {
		t.Fatalf("no faults in a run with stress and edge profiles: met %v, first %v", met, first)
	}
	kinds := map[string]report.FaultLine{}
	for _, l := range r.Faults {
		kinds[l.Kind] = l
	}
	if len(kinds) != len(met) {
		t.Errorf("fault kinds: report %d, SQL %d", len(kinds), len(met))
	}
	var firstTotal uint64
	for _, row := range met {
		l := kinds[row["kind"].(string)]
		rate("met "+l.Kind, l.Met, u(row, "succeeded"), u(row, "episodes"))
		eqf("met reward mean "+l.Kind, l.MetRewardMean, f(row, "reward_mean"))
	}
	for _, row := range first {
		l := kinds[row["kind"].(string)]
		rate("first "+l.Kind, l.First, u(row, "succeeded"), u(row, "episodes"))
		eqf("first reward mean "+l.Kind, l.FirstRewardMean, f(row, "reward_mean"))
		firstTotal += u(row, "episodes")
	}
	// The first-fault cut partitions the scored episodes that met a fault.
	equ("faulted episodes (first-fault cut + unfaulted = scored)", firstTotal+r.Unfaulted.Trials, r.Success.Trials)

	for _, c := range []struct {
		name, key, comp string
		got             []report.Trigger
	}{{"safety", "event", "safety_mean", r.Safety}, {"violations", "rule", "causal_mean", r.Violations}} {
		rows := sql(c.name)
		if len(rows) != len(c.got) {
			t.Fatalf("%s: report %d lines, SQL %d", c.name, len(c.got), len(rows))
		}
		for i, row := range rows {
			g := c.got[i]
			if g.Name != row[c.key] {
				t.Errorf("%s line %d: %s, SQL %v", c.name, i, g.Name, row[c.key])
			}
			equ(c.name+" times", g.Times, u(row, "times"))
			equ(c.name+" episodes", g.Episodes, u(row, "episodes"))
			eqf(c.name+" component", g.ComponentMean, f(row, c.comp))
			eqf(c.name+" step reward", g.StepRewardMean, f(row, "step_reward_mean"))
		}
	}

	limits := sql("limits")
	if len(limits) != len(r.Limits) {
		t.Fatalf("limits: report %d lines, SQL %d", len(r.Limits), len(limits))
	}
	for i, row := range limits {
		l := r.Limits[i]
		if l.Kind != row["kind"] {
			t.Errorf("limits line %d: %s, SQL %v", i, l.Kind, row["kind"])
		}
		equ("limit "+l.Kind+" times", l.Times, u(row, "times"))
		rate("limit "+l.Kind, l.Met, u(row, "succeeded"), u(row, "episodes"))
		equ("limit "+l.Kind+" ended", l.Ended, u(row, "ended"))
		eqf("limit "+l.Kind+" reward mean", l.RewardMean, f(row, "reward_mean"))
		eqf("limit "+l.Kind+" step reward mean", l.StepRewardMean, f(row, "step_reward_mean"))
	}

	cost := sql("cost")[0]
	c := r.Cost
	for _, x := range []struct {
		col string
		got uint64
	}{{"steps", c.Steps}, {"tool_calls", c.ToolCalls}, {"errors", c.Errors}, {"invalid_actions", c.InvalidActions},
		{"bytes_in", c.BytesIn}, {"bytes_out", c.BytesOut}, {"cpu_ns", c.CPUNs}, {"peak_memory_bytes", c.PeakMemoryBytes},
		{"wall_ns", c.WallNs}, {"virtual_ns", c.VirtualNs}} {
		equ("cost "+x.col, x.got, u(cost, x.col))
	}
	eqf("cost spend", c.Spend, f(cost, "spend"))
	eqf("cost step reward mean", c.StepRewardMean, f(cost, "step_reward_mean"))
	if c.Steps == 0 || c.ToolCalls == 0 {
		t.Errorf("cost %+v: want the run's steps and tool calls", c)
	}

	lat := sql("latency")[0]
	quant("env latency", r.Latency.Env, lat, "env_p50_p90_p99")
	quant("policy latency", r.Latency.Policy, lat, "policy_p50_p90_p99")
	quant("reward latency", r.Latency.Reward, lat, "reward_p50_p90_p99")
	quant("step latency", r.Latency.Step, lat, "step_p50_p90_p99")
	// The pipeline records where each step's time went: the scoring is a round trip to
	// the reward service, never free.
	if r.Latency.Reward.P50 == 0 || r.Latency.Env.P50 == 0 || r.Latency.Step.P99 < r.Latency.Reward.P99 {
		t.Errorf("step latency %+v: want the env's and the scoring's time recorded", r.Latency)
	}

	stuck := sql("stuck")
	if len(stuck) != len(r.StuckBy) {
		t.Errorf("stuck reasons: report %v, SQL %v", r.StuckBy, stuck)
	}
	var stuckTotal uint64
	for _, row := range stuck {
		equ("stuck "+row["reason"].(string), r.StuckBy[row["reason"].(string)], u(row, "episodes"))
		stuckTotal += u(row, "episodes")
	}
	equ("stuck total", stuckTotal, r.Stuck)
	lp := sql("looping")[0]
	rate("looping", r.Looping, u(lp, "succeeded"), u(lp, "episodes"))
	top := sql("looping_top")
	if len(top) != len(r.LoopingTop) {
		t.Fatalf("looping top: report %d, SQL %d", len(r.LoopingTop), len(top))
	}
	for i, row := range top {
		l := r.LoopingTop[i]
		if l.EpisodeID != row["episode_id"] || l.Tool != row["tool"] {
			t.Errorf("looping top %d: %+v, SQL %v", i, l, row)
		}
		equ("looping repeats", l.Repeats, u(row, "repeats"))
		equ("looping steps", l.Steps, u(row, "steps"))
	}
}
