package scheduler

import (
	"context"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
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
	cfg := testConfig()
	cfg.ProgressEvery = time.Hour
	_, b := runScheduler(ctx, t, cfg)

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
