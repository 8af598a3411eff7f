package report

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/chlocal/chtest"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// TestLimitsAgainstClickHouse writes, through the store's writer into a real
// ClickHouse, a run whose sandboxes hit resource limits: two kinds in one step, a kind
// hit twice in an episode, an episode ending on a step that hit one, and an infra
// error that hit one (left out, as every rate of the report leaves infra errors out).
// The report's limits section has the numbers worked out by hand, the documented SQL
// gives the same, and no limit counts as a safety event.
func TestLimitsAgainstClickHouse(t *testing.T) {
	if testing.Short() {
		t.Skip("starts ClickHouse; -short runs unit tests only")
	}
	ctx := context.Background()
	ch := chtest.Start(t)
	conn, err := trajectory.Connect(ctx, ch.Addr(), "rep")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := trajectory.Migrate(ctx, conn, "rep"); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC).UnixNano()
	type step struct {
		reward      float64
		limits      []string
		ends, trunc bool
	}
	var events []*gauntletv1.Event
	episode := func(id string, success, infra bool, total float64, steps ...step) {
		for i, s := range steps {
			events = append(events, &gauntletv1.Event{Body: &gauntletv1.Event_Step{Step: &gauntletv1.StepTaken{
				EpisodeId: id, Step: uint32(i), RunId: "rl", Env: "codefix", Policy: "oracle", Profile: "baseline",
				Action:  &gauntletv1.Action{Tool: "shell", ArgsJson: `{"i":` + string(rune('0'+i)) + `}`},
				Signals: &gauntletv1.Signals{Limits: s.limits}, Terminated: s.ends, Truncated: s.trunc,
				RequestedAtUnixNano: at, Score: &gauntletv1.StepScored{EpisodeId: id, Step: uint32(i), Total: s.reward},
			}}})
		}
		end := &gauntletv1.EpisodeEnded{
			Episode: &gauntletv1.EpisodeRequested{EpisodeId: id, RunId: "rl", Env: "codefix", Policy: "oracle", RequestedAtUnixNano: at},
			Steps:   uint32(len(steps)), Success: success, TotalReward: total, Terminated: !infra, InfraError: infra,
			StartedAtUnixNano: at, EndedAtUnixNano: at + 1,
		}
		events = append(events, &gauntletv1.Event{Body: &gauntletv1.Event_Ended{Ended: end}})
	}
	episode("e1", true, false, 1,
		step{reward: 0.1, limits: []string{"timeout: exec ran 10s"}},
		step{reward: 0.2},
		step{reward: 0.3, limits: []string{"output_capped: 1 MiB kept", "timeout: exec ran 10s"}, ends: true})
	episode("e2", false, false, 0.2,
		step{reward: 0.5, limits: []string{"oom_kill: 1 process(es) killed"}},
		step{reward: -0.5, limits: []string{"timeout: exec ran 10s"}, trunc: true})
	episode("e3", false, true, 0, step{reward: 0, limits: []string{"timeout: exec ran 10s"}})
	episode("e4", true, false, 1, step{reward: 1})
	if _, err := trajectory.NewWriter(conn, "rep").Write(ctx, events); err != nil {
		t.Fatal(err)
	}

	r, err := Build(ctx, conn, Options{Database: "rep", RunIDs: []string{"rl"}})
	if err != nil {
		t.Fatal(err)
	}
	want := []Limit{
		{Kind: "timeout", Times: 3, Met: Wilson(1, 2), RewardMean: 0.6, Ended: 2, StepRewardMean: (0.1 + 0.3 - 0.5) / 3},
		{Kind: "oom_kill", Times: 1, Met: Wilson(0, 1), RewardMean: 0.2, Ended: 0, StepRewardMean: 0.5},
		{Kind: "output_capped", Times: 1, Met: Wilson(1, 1), RewardMean: 1, Ended: 1, StepRewardMean: 0.3},
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-12 }
	if len(r.Limits) != len(want) {
		t.Fatalf("limits %+v, want %+v", r.Limits, want)
	}
	for i, w := range want {
		g := r.Limits[i]
		if g.Kind != w.Kind || g.Times != w.Times || g.Met != w.Met || g.Ended != w.Ended || !near(g.RewardMean, w.RewardMean) || !near(g.StepRewardMean, w.StepRewardMean) {
			t.Errorf("limit %d: %+v, want %+v", i, g, w)
		}
	}
	if len(r.Safety) != 0 {
		t.Errorf("safety events %+v: a limit is no attack", r.Safety)
	}

	// The query docs/querying.md shows gives the same lines.
	var doc string
	for _, b := range sqlBlocks(t) {
		if b.marker == "limits" {
			doc = strings.ReplaceAll(b.sql, "gauntlet.", "{db}.")
		}
	}
	rows, err := Run(ctx, conn, doc, Scope{Database: "rep", Runs: []string{"rl"}, First: uint64(at / 1e9), Last: uint64(at / 1e9)})
	if err != nil || len(rows) != len(r.Limits) {
		t.Fatalf("documented limits query: %d rows, %v; the report has %d lines", len(rows), err, len(r.Limits))
	}
	for i, row := range rows {
		g := r.Limits[i]
		if row.s("kind") != g.Kind || row.u("times") != g.Times || row.u("episodes") != g.Met.Trials || row.u("succeeded") != g.Met.Successes ||
			row.u("ended") != g.Ended || row.f("reward_mean") != g.RewardMean || row.f("step_reward_mean") != g.StepRewardMean {
			t.Errorf("documented SQL line %d: %v; the report: %+v", i, row, g)
		}
	}
}
