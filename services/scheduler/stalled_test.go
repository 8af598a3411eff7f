package scheduler

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/campaign"
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
	spec := &gauntletv1.RunRequested{RunId: "rstall", Env: "shop", Seed: 3, Episodes: 3,
		Policies: []*gauntletv1.Share{{Name: "oracle", Weight: 1}}}
	r := &run{spec: spec, Assigned: 3}
	r.Ended.Add(0) // episode 0 ended before the assignment stalled
	s.runs[spec.RunId] = r

	// The workers' consumer, as a worker creates it but with short leases.
	worker, err := b.JS.CreateOrUpdateConsumer(ctx, bus.StreamCommands, jetstream.ConsumerConfig{
		Durable: "worker", FilterSubject: bus.SubjectEpisodePrefix + ">",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 200 * time.Millisecond, MaxDeliver: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	a := &gauntletv1.Assignment{}
	for i := range uint64(3) {
		a.Episodes = append(a.Episodes, &gauntletv1.EpisodeAssigned{Episode: campaign.Episode(spec, i),
			Plan: &gauntletv1.FaultPlan{Profile: "baseline", Seed: i}})
	}
	if err := b.PublishCommand(ctx, bus.SubjectEpisode(spec.RunId), "rstall/assigned", a); err != nil {
		t.Fatal(err)
	}
	// Two deliveries, never acked: a worker dying on it twice.
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

	// A third pull, as live workers keep making: past its lease the assignment is out of
	// deliveries, and the server says so in the advisory instead of delivering it.
	time.Sleep(300 * time.Millisecond)
	if batch, err := worker.Fetch(1, jetstream.FetchMaxWait(500*time.Millisecond)); err == nil {
		for range batch.Messages() {
			t.Fatal("the assignment was delivered a third time; max deliver is 2")
		}
	}
	go func() { _ = s.stalledLoop(ctx) }()

	ended, err := b.JS.OrderedConsumer(ctx, bus.StreamEvents, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{bus.SubjectEvent(bus.KindEnded, spec.RunId)}})
	if err != nil {
		t.Fatal(err)
	}
	m, err := ended.Next(jetstream.FetchMaxWait(20 * time.Second))
	if err != nil {
		t.Fatalf("no end recorded for the stalled assignment: %v", err)
	}
	var got []*gauntletv1.EpisodeEnded
	for {
		var ev gauntletv1.Event
		if err := gauntletv1.Unmarshal(m.Data(), &ev); err != nil {
			t.Fatal(err)
		}
		got = append(got, ev.EpisodeEnd())
		if m, err = ended.Next(jetstream.FetchMaxWait(time.Second)); errors.Is(err, nats.ErrTimeout) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
	}
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
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("%d messages left in %s", si.State.Msgs, bus.StreamCommands)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
