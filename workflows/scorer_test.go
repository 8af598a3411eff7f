package workflows

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/bus/bustest"
	"github.com/gauntlet-rl/gauntlet/pkg/play"
	"github.com/gauntlet-rl/gauntlet/pkg/rewardspecs"
	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
	"github.com/gauntlet-rl/gauntlet/services/reward"
)

// repeatSpec flags the third identical action in a row.
const repeatSpec = `name: durable-repeat
version: "1"
components:
  - {name: task, builtin: task, weight: 1}
  - {name: repeat, detector: {kind: repeat, window: 3, faults: hold}, weight: 0.5}
`

// A durable episode's steps are scored one request each by requestScorer; under a named
// spec they must carry what the spec reads, the action and the faults that answered a
// call included, so that its scores are the pure function's: a repeat detector flags an
// agent repeating itself here as it does on a worker, and holds its count on a retry a
// fault answered.
func TestRequestScorerScoresAsThePureFunction(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := bustest.Start(t)
	svc := reward.New(reward.Config{Subscribers: 1}, func() *bus.Bus { return b }, noop.NewMeterProvider().Meter("test"), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := svc.Starting(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stopping(ctx) })
	sp, err := scoring.Parse("repeat.yaml", []byte(repeatSpec))
	if err != nil {
		t.Fatal(err)
	}
	if err := rewardspecs.NewClient(b.JS).Put(ctx, sp); err != nil {
		t.Fatal(err)
	}
	named := play.NewEpisodeScoring(&gauntletv1.EpisodeRequested{EpisodeId: "r1-0000001", Env: "shop", RewardSpec: sp.Digest})
	var want gauntletv1.RewardState
	flagged := 0
	for i := range 6 {
		st := &gauntletv1.StepTaken{
			EpisodeId: "r1-0000001", Step: uint32(i), Env: "shop", Terminated: i == 5,
			Signals:  &gauntletv1.Signals{Progress: 0.1},
			Metering: &gauntletv1.Metering{ToolCalls: 1},
			Action:   &gauntletv1.Action{Tool: "wallet.balance", ArgsJson: `{}`},
		}
		if i == 3 { // a retry an injected 503 answered: the detector holds its count
			st.Faults = []*gauntletv1.FaultFired{
				{FaultId: "f1", Kind: "latency", Target: "wallet/wallet.balance", Detail: "latency_ms=12.5"},
				{FaultId: "f2", Kind: "http_error", Target: "wallet/wallet.balance", Detail: "status=503 retry_after_ms=0"},
			}
		}
		got, err := requestScorer{b}.Score(ctx, st, named, nil)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		expect := scoring.ScoreState(sp, &want, st)
		if !proto.Equal(got, expect) {
			t.Fatalf("step %d: scored %v through the activity's scorer, %v by the pure function", i, got, expect)
		}
		for _, c := range got.GetComponents() {
			if c.GetName() == "repeat" && c.GetValue() < 0 {
				flagged++
			}
		}
	}
	if flagged != 3 {
		t.Errorf("repeat flagged %d of 6 identical actions, want 3 (the 3rd on, but the 4th, which a fault answered)", flagged)
	}
}
