package scheduler

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// The scheduler-wide cap (--scheduler.max-in-flight) binds over all runs together, through
// the scheduler's real loops: three runs submitted as `gauntlet run` submits them, each
// allowed more in flight than the whole scheduler, never have more episodes assigned and
// not yet ended than the global cap, fill it whenever they can, and every episode of every
// run is assigned exactly once. The test plays the workers' side of the contract: it takes
// assignments from the work queue and publishes the episodes' ends, a few at a time.
func TestGlobalCapHoldsAcrossRuns(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const globalCap = 10
	cfg := testConfig()
	cfg.MaxInFlight = globalCap
	_, b := runScheduler(ctx, t, cfg)

	const runsN, perRun, runCap = 3, 12, 8
	for i := range runsN {
		spec := stallRun(fmt.Sprintf("rcap%d", i))
		spec.Episodes, spec.MaxInFlight = perRun, runCap // 3 runs × 8 is well over the global 10
		if err := b.PublishCommand(ctx, bus.SubjectRun, spec.RunId+"/run", spec); err != nil {
			t.Fatal(err)
		}
	}
	workers, err := b.JS.CreateOrUpdateConsumer(ctx, bus.StreamCommands, jetstream.ConsumerConfig{
		Durable: "worker", FilterSubject: bus.SubjectEpisodePrefix + ">",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}

	inFlight := map[string]*gauntletv1.EpisodeRequested{}
	seen := map[string]bool{}
	// take pulls assignments until want episodes are in flight, then for ten more of the
	// scheduler's dispatch ticks (an over-assignment would come at the next one), checking
	// the cap after each assignment.
	take := func(want int) {
		t.Helper()
		for {
			batch, err := workers.Fetch(16, jetstream.FetchMaxWait(500*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for m := range batch.Messages() {
				n++
				var a gauntletv1.Assignment
				if err := proto.Unmarshal(m.Data(), &a); err != nil {
					t.Fatal(err)
				}
				for _, ea := range a.Episodes {
					id := ea.GetEpisode().GetEpisodeId()
					if seen[id] {
						t.Fatalf("episode %s assigned twice", id)
					}
					seen[id] = true
					inFlight[id] = ea.GetEpisode()
				}
				if err := m.Ack(); err != nil {
					t.Fatal(err)
				}
				if len(inFlight) > globalCap {
					t.Fatalf("%d episodes in flight over all runs, the global cap is %d", len(inFlight), globalCap)
				}
			}
			if ctx.Err() != nil {
				t.Fatalf("%d episodes in flight, waiting for %d: the scheduler stopped filling the global cap", len(inFlight), want)
			}
			if n == 0 && len(inFlight) >= want {
				return
			}
		}
	}

	ended, endedOf := 0, map[string]int{}
	for ended < runsN*perRun {
		// The most that can be in flight now: each run's unended episodes up to its own
		// cap, all runs together up to the global one (once two runs are done, the last
		// one's cap binds).
		fill := 0
		for i := range runsN {
			fill += min(runCap, perRun-endedOf[fmt.Sprintf("rcap%d", i)])
		}
		take(min(globalCap, fill))
		// End three episodes (or what is left), as workers finishing them would.
		k := 0
		for id, ep := range inFlight {
			if k == 3 {
				break
			}
			end := &gauntletv1.EpisodeEnded{Episode: ep, Steps: 1, Terminated: true, Success: true,
				Reason: gauntletv1.TerminationReason_TERMINATION_REASON_SUCCESS}
			if err := b.PublishEvent(ctx, &gauntletv1.Event{Body: &gauntletv1.Event_Ended{Ended: end}}); err != nil {
				t.Fatal(err)
			}
			delete(inFlight, id)
			endedOf[ep.GetRunId()]++
			ended++
			k++
		}
	}
	if len(seen) != runsN*perRun {
		t.Fatalf("%d distinct episodes assigned, want %d", len(seen), runsN*perRun)
	}
}
