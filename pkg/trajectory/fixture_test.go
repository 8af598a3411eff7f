package trajectory

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/gauntlet-rl/gauntlet/pkg/chlocal/chtest"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

const testDB = "gauntlet_test"

// requestedAt is a fixed request time: 2026-03-14 15:09:26.535897932 UTC.
var requestedAt = time.Date(2026, 3, 14, 15, 9, 26, 535897932, time.UTC).UnixNano()

// setup starts a ClickHouse, connects and migrates testDB.
func setup(t testing.TB) driver.Conn {
	t.Helper()
	srv := chtest.Start(t)
	ctx := context.Background()
	conn, err := Connect(ctx, srv.Addr(), testDB)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := Migrate(ctx, conn, testDB); err != nil {
		t.Fatal(err)
	}
	return conn
}

// stepEvent returns a realistic StepTaken of the shop env: a ~300-byte observation, a
// state diff, metering, signals and a five-component reward vector; every fifth step
// meets a fault and every seventh breaks a causal rule.
func stepEvent(runID string, episode, step int) *gauntletv1.Event {
	episodeID := fmt.Sprintf("%s-ep-%06d", runID, episode)
	s := &gauntletv1.StepTaken{
		EpisodeId: episodeID,
		Step:      uint32(step),
		RunId:     runID,
		Env:       "shop",
		Policy:    "scripted-oracle",
		Profile:   "stress",
		Action: &gauntletv1.Action{
			Tool:     "catalog.search",
			ArgsJson: fmt.Sprintf(`{"query":"usb-c cable","category":"electronics","page":%d}`, step%3),
		},
		ObservationJson: fmt.Sprintf(`{"ok":true,"total":3,"results":[`+
			`{"sku":"sku-%05d","name":"USB-C cable 1m braided","price":1299},`+
			`{"sku":"sku-%05d","name":"USB-C cable 2m braided","price":1599},`+
			`{"sku":"sku-%05d","name":"USB-C to Lightning cable","price":1899}],`+
			`"balance":%d,"cart":[{"sku":"sku-00042","qty":1}],"elapsed_ms":%d}`,
			step*3, step*3+1, step*3+2, 50000-step*100, step*137),
		StateDiffJson: fmt.Sprintf(`[{"op":"replace","path":"/balance","value":%d}]`, 50000-step*100),
		Metering: &gauntletv1.Metering{
			ToolCalls: 1, VirtualNs: 12_500_000, WallNs: 48_211, BytesIn: 61, BytesOut: 312,
		},
		Signals: &gauntletv1.Signals{
			Progress: float64(step%10) / 10, Spend: 12.99, Budget: 500,
			DeadlineVirtualNs: 60_000_000_000, ProgressDelta: 0.1,
		},
		VirtualTimeNs:       int64(step+1) * 12_500_000,
		WorkerId:            "worker-1",
		RequestedAtUnixNano: requestedAt,
		Score: &gauntletv1.StepScored{
			EpisodeId: episodeID,
			Step:      uint32(step),
			Components: []*gauntletv1.RewardComponent{
				{Name: "task", Value: 0.1, Weight: 1},
				{Name: "cost", Value: -0.026, Weight: 0.5},
				{Name: "safety", Value: 0, Weight: 1},
				{Name: "timeliness", Value: -0.002, Weight: 0.25},
				{Name: "causal", Value: 0, Weight: 0.5},
			},
			Total:       0.0865,
			SpecVersion: "default/1",
		},
	}
	if step%5 == 4 {
		s.Faults = []*gauntletv1.FaultFired{{
			FaultId: "f1", Kind: "http_error", Target: "catalog",
			Detail: "status=503 retry_after_ms=200", AtVirtualNs: int64(step) * 12_500_000,
		}}
		s.Metering.Errors = 1
	}
	if step%7 == 6 {
		s.Signals.InvalidAction = true
		s.Signals.Violations = []*gauntletv1.CausalViolation{
			{Rule: "pay_before_ship", Reason: "order not paid", Suggestion: "call payment.pay first"},
		}
	}
	return &gauntletv1.Event{Body: &gauntletv1.Event_Step{Step: s}}
}

// endEvent returns the EpisodeEnded of an episode of stepEvent's run.
func endEvent(runID string, episode, steps int, endedAt int64) *gauntletv1.Event {
	return &gauntletv1.Event{Body: &gauntletv1.Event_Ended{Ended: &gauntletv1.EpisodeEnded{
		Episode: &gauntletv1.EpisodeRequested{
			EpisodeId:           fmt.Sprintf("%s-ep-%06d", runID, episode),
			RunId:               runID,
			Index:               uint64(episode),
			Env:                 "shop",
			ParamsJson:          `{"difficulty":"easy"}`,
			Seed:                uint64(1000 + episode),
			Policy:              "scripted-oracle",
			MaxSteps:            50,
			RequestedAtUnixNano: requestedAt,
		},
		Profile:           "stress",
		WorkerId:          "worker-1",
		Steps:             uint32(steps),
		Terminated:        true,
		Reason:            gauntletv1.TerminationReason_TERMINATION_REASON_SUCCESS,
		Success:           true,
		TotalReward:       0.865,
		FaultsFired:       1,
		VirtualTimeNs:     int64(steps) * 12_500_000,
		StartedAtUnixNano: requestedAt + 2_000_000_000,
		EndedAtUnixNano:   endedAt,
		Plan: &gauntletv1.FaultPlan{
			Profile: "stress",
			Seed:    uint64(1000 + episode),
			Rules: []*gauntletv1.FaultRule{{
				Id: "f1", Target: "catalog", Probability: 0.2,
				Spec: &gauntletv1.FaultRule_HttpError{HttpError: &gauntletv1.HTTPErrorFault{Status: 503, RetryAfterMs: 200}},
			}},
			CatalogueVersion: "v1",
			DriftValues: []*gauntletv1.DriftValue{
				{Selector: "*.latency.mean_ms", Value: 250, Source: "global"},
				{Selector: "catalog.http_503.probability", Value: 0.2, Source: "run"},
			},
		},
	}}}
}

// runEvents returns the steps of episodes episodes of n steps each, then their ends.
func runEvents(runID string, episodes, steps int) []*gauntletv1.Event {
	events := make([]*gauntletv1.Event, 0, episodes*(steps+1))
	for e := range episodes {
		for s := range steps {
			events = append(events, stepEvent(runID, e, s))
		}
	}
	for e := range episodes {
		events = append(events, endEvent(runID, e, steps, requestedAt+5_000_000_000))
	}
	return events
}

// mustScore reads the score of st, a step of seg (nil: a lone step).
func mustScore(t testing.TB, seg *gauntletv1.StepsTaken, st *gauntletv1.StepTaken) gauntletv1.Score {
	t.Helper()
	sc, err := seg.ScoreOf(st)
	if err != nil {
		t.Fatal(err)
	}
	return sc
}
