package scheduler

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// Run requests as `gauntlet run` submits them, through the scheduler's real loops: an
// undecodable request is dropped without holding up the ones behind it; an invalid run is
// recorded refused, with every reason, and never assigned; a run id submitted again (a
// retried submission) keeps the run first accepted; a valid run's episodes are assigned
// once each, never more than its max_in_flight at a time.
func TestRunIntake(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, b := runScheduler(ctx, t, testConfig())

	if _, err := b.JS.Publish(ctx, bus.SubjectRun, []byte("\xff\xfe not a run")); err != nil {
		t.Fatal(err)
	}
	bad := stallRun("rbad")
	bad.Env, bad.MaxInFlight = "nope", 0
	good := stallRun("rgood")
	good.Episodes, good.MaxInFlight = 6, 2
	again := proto.Clone(good).(*gauntletv1.RunRequested)
	again.Episodes = 60
	for _, r := range []struct {
		spec *gauntletv1.RunRequested
		id   string
	}{{bad, "rbad/run"}, {good, "rgood/run"}, {again, "rgood/run-again"}} {
		if err := b.PublishCommand(ctx, bus.SubjectRun, r.id, r.spec); err != nil {
			t.Fatal(err)
		}
	}

	kv, err := b.JS.KeyValue(ctx, bus.BucketRuns)
	if err != nil {
		t.Fatal(err)
	}
	// A run request is recorded within a few scheduler ticks; 20 s means it never will be.
	state := func(id string) *run {
		t.Helper()
		deadline := time.After(20 * time.Second)
		for {
			e, err := kv.Get(ctx, id)
			if err == nil {
				r, _, err := decodeRun(e.Value())
				if err != nil {
					t.Fatal(err)
				}
				return r
			}
			if !errors.Is(err, jetstream.ErrKeyNotFound) {
				t.Fatal(err)
			}
			select {
			case <-deadline:
				t.Fatalf("run %s not recorded within 20s", id)
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	if r := state("rbad"); !strings.Contains(r.Error, "env: ") || !strings.Contains(r.Error, "max_in_flight") {
		t.Errorf("the invalid run is recorded with error %q, want its reasons (env, max_in_flight)", r.Error)
	}

	workers, err := b.JS.CreateOrUpdateConsumer(ctx, bus.StreamCommands, jetstream.ConsumerConfig{
		Durable: "worker", FilterSubject: bus.SubjectEpisodePrefix + ">",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[uint64]bool{}
	var inFlight []*gauntletv1.EpisodeRequested
	idle := 0
	for len(seen) < int(good.Episodes) || idle < 3 {
		batch, err := workers.Fetch(8, jetstream.FetchMaxWait(300*time.Millisecond))
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
			_ = m.Ack()
			for _, ea := range a.Episodes {
				ep := ea.GetEpisode()
				if ep.RunId != good.RunId || ep.Index >= good.Episodes || seen[ep.Index] {
					t.Fatalf("assigned %s (run %s, index %d): only rgood's 6 episodes, once each, are due", ep.EpisodeId, ep.RunId, ep.Index)
				}
				seen[ep.Index] = true
				inFlight = append(inFlight, ep)
			}
			if len(inFlight) > int(good.MaxInFlight) {
				t.Fatalf("%d of rgood's episodes in flight, its max_in_flight is %d", len(inFlight), good.MaxInFlight)
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("%d of rgood's episodes assigned, want %d", len(seen), good.Episodes)
		}
		if n > 0 {
			idle = 0
			continue
		}
		idle++
		// End what is in flight, as workers finishing it would.
		for _, ep := range inFlight {
			end := &gauntletv1.EpisodeEnded{Episode: ep, Steps: 1, Terminated: true, Success: true,
				Reason: gauntletv1.TerminationReason_TERMINATION_REASON_SUCCESS}
			if err := b.PublishEvent(ctx, &gauntletv1.Event{Body: &gauntletv1.Event_Ended{Ended: end}}); err != nil {
				t.Fatal(err)
			}
		}
		inFlight = inFlight[:0]
	}
	if r := state("rgood"); r.Error != "" || r.spec.GetEpisodes() != good.Episodes {
		t.Errorf("rgood recorded with %d episodes, error %q; want the first submission's %d", r.spec.GetEpisodes(), r.Error, good.Episodes)
	}
}
