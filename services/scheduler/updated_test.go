package scheduler

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/bus/bustest"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// A run's state in KV says when it last changed from the moment it is accepted, not only
// after the scheduler's next progress tick: a curriculum's batch reads it there to tell
// a run that waits (episodes held by a worker that died) from one not yet accepted, and
// with the time missing it called the first the second. Here the progress tick is an
// hour away, so only acceptance and assignment can have set it.
func TestRunStateSaysWhenItChangedFromAcceptance(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b := bustest.Start(t)
	s := New(Config{MaxInFlight: 10, AssignBatch: 10, EpisodesPerAssignment: 4, ProgressEvery: time.Hour},
		func() *bus.Bus { return b }, noop.NewMeterProvider().Meter("test"), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := s.Starting(ctx); err != nil {
		t.Fatal(err)
	}
	startFaults(ctx, t, b)
	done := make(chan error, 1)
	rctx, stop := context.WithCancel(ctx)
	go func() { done <- s.Running(rctx) }()
	defer func() { stop(); <-done }()

	before := time.Now().UnixNano()
	spec := stallRun("rupdated")
	spec.MaxInFlight = 3
	if err := b.PublishCommand(ctx, bus.SubjectRun, spec.RunId+"/run", spec); err != nil {
		t.Fatal(err)
	}
	kv, err := b.JS.KeyValue(ctx, bus.BucketRuns)
	if err != nil {
		t.Fatal(err)
	}
	for {
		if e, err := kv.Get(ctx, spec.RunId); err == nil {
			p, err := gauntletv1.DecodeRunProgress(e.Value())
			if err != nil {
				t.Fatal(err)
			}
			if p.GetAssigned() == spec.Episodes {
				if p.GetUpdatedAtUnixNano() < before {
					t.Fatalf("run state after acceptance and assignment has updated_at %d, before the run was submitted (%d)", p.GetUpdatedAtUnixNano(), before)
				}
				return
			}
		}
		if ctx.Err() != nil {
			t.Fatal("the run was never accepted and assigned")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
