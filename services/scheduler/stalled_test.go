package scheduler

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/runs"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// An assignment whose workers never ack it (each died or hung on it) runs out of
// deliveries; on real JetStream the advisory reaches the scheduler through
// GAUNTLET_STALLED, and it records an infra error for each of the assignment's episodes
// that has not ended (and none for the one that has), then deletes the assignment.
func TestStalledAssignmentEndsAsInfraErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, b := startScheduler(ctx, t)
	spec := stallRun("rstall")
	r := &run{spec: spec, Assigned: 3}
	r.Ended.Add(0) // episode 0 ended before the assignment stalled
	s.runs[spec.RunId] = r
	stallAssignment(ctx, t, b, spec, nil)
	go func() { _ = s.stalledLoop(ctx) }()

	got := endsOf(ctx, t, b, spec.RunId, 2)
	if len(got) != 2 {
		t.Fatalf("%d ends recorded, want 2 (episodes 1 and 2; 0 had ended)", len(got))
	}
	for i, e := range got {
		if e.GetEpisode().GetIndex() != uint64(i+1) || !e.GetInfraError() ||
			e.GetReason() != gauntletv1.TerminationReason_TERMINATION_REASON_INFRA_ERROR || e.GetPlan().GetProfile() != "baseline" {
			t.Errorf("end %d: %v", i, e)
		}
	}
	// The assignment is gone from the work queue.
	waitEmpty(ctx, t, b)
}

// A worker that published its lot's events and died before the ack leaves an assignment
// that runs out of deliveries with all its episodes ended in the stream but not yet in the
// scheduler's tables (a scheduler restarting with a backlog reads both streams at once).
// The advisory waits for those ends: each episode ends once, as its worker recorded it.
func TestStalledAssignmentWaitsForEndsAlreadyPublished(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, b := startScheduler(ctx, t)
	spec := stallRun("rstall2")
	s.runs[spec.RunId] = &run{spec: spec, Assigned: 3}
	stallAssignment(ctx, t, b, spec, func() {
		// The lot's batch, as the worker publishes it when its last episode ends.
		batch := &gauntletv1.EventBatch{}
		for i := range uint64(3) {
			ep := runs.Episode(spec, i)
			end := &gauntletv1.EpisodeEnded{Episode: ep, Steps: 1, Terminated: true, Success: true,
				Reason: gauntletv1.TerminationReason_TERMINATION_REASON_SUCCESS}
			seg := &gauntletv1.StepsTaken{Steps: []*gauntletv1.StepTaken{{EpisodeId: ep.EpisodeId, RunId: spec.RunId, Step: 0}}, Ended: end}
			batch.Events = append(batch.Events, &gauntletv1.Event{Body: &gauntletv1.Event_Steps{Steps: seg}})
		}
		if err := b.PublishEvent(ctx, &gauntletv1.Event{Body: &gauntletv1.Event_Batch{Batch: batch}}); err != nil {
			t.Fatal(err)
		}
	})
	go func() { _ = s.stalledLoop(ctx) }()
	// The ended events are folded in only once the scheduler holds the advisory (taken,
	// not yet acknowledged: it is waiting for the ends), so the test sees that wait
	// rather than ends already folded in.
	waitAdvisoryHeld(ctx, t, s)
	go func() { _ = s.endedLoop(ctx) }()

	got := endsOf(ctx, t, b, spec.RunId, 3)
	if len(got) != 3 {
		t.Errorf("%d ends in the stream, want the worker's 3", len(got))
	}
	for _, e := range got {
		if e.GetInfraError() {
			t.Errorf("episode %d ended as an infra error though its worker had recorded its end: %v", e.GetEpisode().GetIndex(), e)
		}
	}
	// The assignment is deleted all the same.
	waitEmpty(ctx, t, b)
}

func stallRun(id string) *gauntletv1.RunRequested {
	return &gauntletv1.RunRequested{RunId: id, Env: "shop", Seed: 3, Episodes: 3,
		Policies: []*gauntletv1.Share{{Name: "oracle", Weight: 1}}}
}

// stallAssignment publishes one assignment of the run's three episodes and has it
// delivered twice without an ack (a worker dying on it twice) on a workers' consumer with
// short leases and two deliveries, calls beforeLastPull (when not nil), then pulls once
// more, as live workers keep doing: past its lease the assignment is out of deliveries,
// and the server says so in the advisory instead of delivering it.
func stallAssignment(ctx context.Context, t *testing.T, b *bus.Bus, spec *gauntletv1.RunRequested, beforeLastPull func()) {
	t.Helper()
	worker, err := b.JS.CreateOrUpdateConsumer(ctx, bus.StreamCommands, jetstream.ConsumerConfig{
		Durable: "worker", FilterSubject: bus.SubjectEpisodePrefix + ">",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 200 * time.Millisecond, MaxDeliver: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	a := &gauntletv1.Assignment{}
	for i := range uint64(3) {
		a.Episodes = append(a.Episodes, &gauntletv1.EpisodeAssigned{Episode: runs.Episode(spec, i),
			Plan: &gauntletv1.FaultPlan{Profile: "baseline", Seed: i}})
	}
	if err := b.PublishCommand(ctx, bus.SubjectEpisode(spec.RunId), spec.RunId+"/assigned", a); err != nil {
		t.Fatal(err)
	}
	for delivered := 0; delivered < 2; {
		batch, err := worker.Fetch(1, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for range batch.Messages() {
			delivered++
		}
		if ctx.Err() != nil {
			t.Fatal("the assignment was not delivered twice")
		}
	}
	if beforeLastPull != nil {
		beforeLastPull()
	}
	time.Sleep(300 * time.Millisecond)
	if batch, err := worker.Fetch(1, jetstream.FetchMaxWait(500*time.Millisecond)); err == nil {
		for range batch.Messages() {
			t.Fatal("the assignment was delivered a third time; max deliver is 2")
		}
	}
}

// endsOf reads the run's ended subject from the start: at least want ends (waiting up to
// 20 s for the first), then whatever follows within a second.
func endsOf(ctx context.Context, t *testing.T, b *bus.Bus, runID string, want int) []*gauntletv1.EpisodeEnded {
	t.Helper()
	ended, err := b.JS.OrderedConsumer(ctx, bus.StreamEvents, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{bus.SubjectEvent(bus.KindEnded, runID)}})
	if err != nil {
		t.Fatal(err)
	}
	var got []*gauntletv1.EpisodeEnded
	for {
		wait := time.Second
		if len(got) < want {
			wait = 20 * time.Second
		}
		m, err := ended.Next(jetstream.FetchMaxWait(wait))
		if errors.Is(err, nats.ErrTimeout) {
			return got
		}
		if err != nil {
			t.Fatal(err)
		}
		var ev gauntletv1.Event
		if err := gauntletv1.Unmarshal(m.Data(), &ev); err != nil {
			t.Fatal(err)
		}
		for _, e := range ev.Events() {
			got = append(got, e.EpisodeEnd())
		}
	}
}

// waitEmpty waits until the work queue holds no assignment.
// waitAdvisoryHeld waits until the scheduler has taken a stalled-assignment advisory
// and not yet acknowledged it.
func waitAdvisoryHeld(ctx context.Context, t *testing.T, s *Service) {
	t.Helper()
	for {
		info, err := s.stalledCons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumAckPending == 1 {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("the scheduler never took the advisory: %d pending, %d acknowledged", info.NumPending, info.AckFloor.Stream)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitEmpty(ctx context.Context, t *testing.T, b *bus.Bus) {
	t.Helper()
	for {
		info, err := b.JS.Stream(ctx, bus.StreamCommands)
		if err != nil {
			t.Fatal(err)
		}
		si, err := info.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if si.State.Msgs == 0 {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("%d messages left in %s", si.State.Msgs, bus.StreamCommands)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
