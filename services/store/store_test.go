package store

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/bus/bustest"
	"github.com/gauntlet-rl/gauntlet/pkg/chlocal/chtest"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// TestIdleFlushWritesTheTail runs the store on real NATS and ClickHouse with batches far
// larger than the traffic and a flush interval of an hour: the events still land, because
// the store writes a partial batch once the stream goes quiet.
func TestIdleFlushWritesTheTail(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ch := chtest.Start(t)

	b := bustest.Start(t)

	cfg := Config{Addr: ch.Addr, Database: "idle", BatchRows: 1_000_000, FlushEvery: time.Hour, IdleFlush: 100 * time.Millisecond, AckWait: 30 * time.Second}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s := New(cfg, func() *bus.Bus { return b }, noop.NewMeterProvider().Meter("test"), log)
	if err := s.Starting(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Stopping(context.Background()) }()
	done := make(chan error, 1)
	go func() { done <- s.Running(ctx) }()

	// Three whole episodes, each one message, as workers publish them.
	for e := range 3 {
		req := &gauntletv1.EpisodeRequested{EpisodeId: "run-idle-" + string(rune('a'+e)), RunId: "run-idle", Env: "shop", RequestedAtUnixNano: time.Now().UnixNano()}
		seg := &gauntletv1.StepsTaken{Started: &gauntletv1.EpisodeStarted{Episode: req}, Ended: &gauntletv1.EpisodeEnded{Episode: req, Steps: 4}}
		for i := range uint32(4) {
			seg.Steps = append(seg.Steps, &gauntletv1.StepTaken{EpisodeId: req.EpisodeId, RunId: req.RunId, Env: "shop", Step: i, RequestedAtUnixNano: req.RequestedAtUnixNano})
		}
		if err := b.PublishEvent(ctx, &gauntletv1.Event{Body: &gauntletv1.Event_Steps{Steps: seg}}); err != nil {
			t.Fatal(err)
		}
	}

	// A generous bound for a loaded machine: without the idle flush nothing would land
	// for an hour.
	deadline := time.Now().Add(time.Minute)
	for {
		eps, steps, err := trajectory.RunCounts(ctx, s.conn, "idle", "run-idle")
		if err == nil && eps == 3 && steps == 12 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a minute ClickHouse holds %d episodes and %d steps (err %v), want 3 and 12", eps, steps, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// And the store says so: its published StoreProgress reaches the stream's last event.
	kv, err := b.StoreBucket(ctx)
	if err != nil || kv == nil {
		t.Fatalf("store bucket: %v, %v", kv, err)
	}
	last, err := b.EventsLastSeq(ctx)
	if err != nil || last != 3 {
		t.Fatalf("last sequence %d (%v), want 3", last, err)
	}
	for {
		p, err := bus.GetStoreProgress(ctx, kv)
		if err == nil && p.GetWrittenSeq() == last {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the store published %v (err %v), want written_seq %d", p, err, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Before it has written anything, the store publishes the floor it starts from, so a
// waiter knows a store runs.
func TestStoreProgressStartsAtTheFloor(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := chtest.Start(t)
	b := bustest.Start(t)
	s := New(Config{Addr: ch.Addr, Database: "floor", BatchRows: 10, FlushEvery: time.Second, IdleFlush: 50 * time.Millisecond, AckWait: 30 * time.Second},
		func() *bus.Bus { return b }, noop.NewMeterProvider().Meter("test"), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := s.Starting(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Stopping(context.Background()) }()
	kv, err := b.StoreBucket(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p, err := bus.GetStoreProgress(ctx, kv)
	if err != nil || p == nil || p.GetWrittenSeq() != 0 {
		t.Fatalf("progress after Starting = %v, %v; want written_seq 0", p, err)
	}
}

func TestConfigNamesBadFields(t *testing.T) {
	err := Config{Database: "", BatchRows: 0, FlushEvery: 0, IdleFlush: -time.Second, AckWait: time.Second}.Validate()
	for _, field := range []string{"store.database", "store.batch-rows", "store.flush-every", "store.idle-flush", "store.ack-wait"} {
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("error %v does not name %s", err, field)
		}
	}
}
