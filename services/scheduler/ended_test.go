package scheduler

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/bus/bustest"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// The scheduler's ended consumer is headers-only on real JetStream: an end published by
// the bus is counted from its header without the steps reaching the scheduler, and an end
// published without the header (an older version's) is fetched from the stream, and a
// batch of ends (a worker's assignment of several episodes) counts every one of them.
func TestEndsAreCountedFromHeaders(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, b := startScheduler(ctx, t)

	end := func(i uint64) *gauntletv1.EpisodeEnded {
		return &gauntletv1.EpisodeEnded{Episode: &gauntletv1.EpisodeRequested{EpisodeId: "e" + string(rune('0'+i)), RunId: "r1", Index: i},
			Steps: 2, Success: i == 0, TotalReward: 0.5, FaultsFired: uint32(i)}
	}
	steps := []*gauntletv1.StepTaken{{EpisodeId: "e0", RunId: "r1", Step: 0, ObservationJson: `{"cart":["a","b"]}`}, {EpisodeId: "e0", RunId: "r1", Step: 1}}
	if err := b.PublishEvent(ctx, &gauntletv1.Event{Body: &gauntletv1.Event_Steps{Steps: &gauntletv1.StepsTaken{Steps: steps, Ended: end(0)}}}); err != nil {
		t.Fatal(err)
	}
	old, _ := proto.Marshal(&gauntletv1.Event{Body: &gauntletv1.Event_Ended{Ended: end(1)}})
	if _, err := b.JS.Publish(ctx, bus.SubjectEvent(bus.KindEnded, "r1"), old); err != nil {
		t.Fatal(err)
	}

	lone := func(i uint64) *gauntletv1.Event {
		return &gauntletv1.Event{Body: &gauntletv1.Event_Ended{Ended: end(i)}}
	}
	if err := b.PublishEvent(ctx, &gauntletv1.Event{Body: &gauntletv1.Event_Batch{Batch: &gauntletv1.EventBatch{
		Events: []*gauntletv1.Event{lone(2), lone(3), lone(4)}}}}); err != nil {
		t.Fatal(err)
	}

	batch, err := s.endedCons.Fetch(3, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got []*gauntletv1.EndedSummary
	for m := range batch.Messages() {
		if len(m.Data()) != 0 {
			t.Errorf("the scheduler received %d bytes of an ended event; its consumer is headers-only", len(m.Data()))
		}
		es, err := s.endsOf(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, es...)
	}
	if len(got) != 5 {
		t.Fatalf("%d ends fetched, want 5", len(got))
	}
	for i, e := range got {
		want := &gauntletv1.EndedSummary{Episode: &gauntletv1.EpisodeRef{EpisodeId: end(uint64(i)).Episode.EpisodeId, RunId: "r1", Index: uint64(i)},
			Steps: 2, Success: i == 0, TotalReward: 0.5, FaultsFired: uint32(i)}
		if !proto.Equal(e, want) {
			t.Errorf("end %d read as %v, want %v", i, e, want)
		}
	}
}

// startScheduler returns a scheduler, started (consumers bound, nothing running), on a
// fresh embedded bus, and the bus.
func startScheduler(ctx context.Context, t *testing.T) (*Service, *bus.Bus) {
	t.Helper()
	return startSchedulerWith(ctx, t, testConfig())
}

// testConfig is the tests' scheduler: a global cap of 10, batches of 10, 4 episodes per
// assignment, progress every second.
func testConfig() Config {
	return Config{MaxInFlight: 10, AssignBatch: 10, EpisodesPerAssignment: 4, ProgressEvery: time.Second}
}

// startSchedulerWith is startScheduler with cfg.
func startSchedulerWith(ctx context.Context, t *testing.T, cfg Config) (*Service, *bus.Bus) {
	t.Helper()
	b := bustest.Start(t)
	return startOn(ctx, t, b, cfg), b
}

// startOn starts a scheduler with cfg on the bus b, another's or a fresh one.
func startOn(ctx context.Context, t *testing.T, b *bus.Bus, cfg Config) *Service {
	t.Helper()
	s := New(cfg, func() *bus.Bus { return b }, noop.NewMeterProvider().Meter("test"), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := s.Starting(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}
