package play_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	_ "github.com/gauntlet-rl/gauntlet/pkg/env/codefix"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/play"
	"github.com/gauntlet-rl/gauntlet/pkg/rng"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes/runtimestest"
	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// A step that hit a limit is played with the limit in its limits and no safety penalty;
// a replay of a step recorded before limits were kept apart (its safety events hold the
// limit) puts the limit back among the safety events, so reward explain re-derives the
// score it was recorded with, penalty included; a replay of a step recorded since does not.
func TestReplayScoresLimitsAsRecorded(t *testing.T) {
	if testing.Short() {
		t.Skip("runs codefix in process sandboxes")
	}
	sb := runtimestest.Open(t, runtimes.Process, 0)
	args, _ := json.Marshal(map[string]any{"command": "sleep 5", "timeout_ms": 200})
	slow := env.Action{Tool: "shell.exec", Args: args}
	play1 := func(rec []play.Recorded) *gauntletv1.StepTaken {
		t.Helper()
		req := &gauntletv1.EpisodeRequested{EpisodeId: "e", RunId: "r", Env: "codefix", ParamsJson: "{}", Seed: 3, Policy: "scripted"}
		plan := &gauntletv1.FaultPlan{Profile: "baseline", Seed: rng.Derive(3, "faults"), CatalogueVersion: plans.CatalogueVersion, Compact: true}
		out := &memOut{}
		s := play.NewSession(&gauntletv1.EpisodeAssigned{Episode: req, Plan: plan}, "w", play.LocalScorer{Spec: scoring.SpecFor("codefix")}, out)
		defer func() { _ = s.Close() }()
		ctx := context.Background()
		if _, err := s.Prepare(ctx, play.Deps{Sandboxes: sb}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Reset(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if rec != nil {
			if _, _, err := s.Replay(ctx, rec); err != nil {
				t.Fatal(err)
			}
		} else if _, _, err := s.Step(ctx, slow, nil); err != nil {
			t.Fatal(err)
		}
		return out.steps[0]
	}
	safety := func(st *gauntletv1.StepTaken) float64 {
		for _, c := range st.GetScore().GetComponents() {
			if c.Name == scoring.ComponentSafety {
				return c.Value
			}
		}
		t.Fatalf("no safety component in %v", st.GetScore())
		return 0
	}
	live := play1(nil)
	if lim := live.Signals.GetLimits(); len(lim) != 1 || !strings.HasPrefix(lim[0], "timeout: ") || len(live.Signals.GetSafetyEvents()) != 0 || safety(live) != 0 {
		t.Fatalf("played: limits %q, safety events %q, safety %v; want the timeout in the limits alone, unpenalised",
			lim, live.Signals.GetSafetyEvents(), safety(live))
	}

	old := []string{"timeout: killed after 200ms"} // as a step recorded before held it
	replayed := play1([]play.Recorded{{Action: slow, LimitsAsSafety: play.RecordedLimitsAsSafety(old)}})
	if ev := replayed.Signals.GetSafetyEvents(); len(ev) != 1 || !strings.HasPrefix(ev[0], "timeout: ") || len(replayed.Signals.GetLimits()) != 0 || safety(replayed) != -0.5 {
		t.Errorf("replay of an older recording: safety events %q, limits %q, safety %v; want the timeout among the safety events, -0.5",
			ev, replayed.Signals.GetLimits(), safety(replayed))
	}
	replayed = play1([]play.Recorded{{Action: slow, LimitsAsSafety: play.RecordedLimitsAsSafety(live.Signals.GetSafetyEvents())}})
	if safety(replayed) != 0 || len(replayed.Signals.GetLimits()) != 1 {
		t.Errorf("replay of a recording with its limits apart: limits %q, safety %v; want as played", replayed.Signals.GetLimits(), safety(replayed))
	}
}
