package scheduler

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	_ "github.com/gauntlet-rl/gauntlet/pkg/env/shop"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
	faultsvc "github.com/gauntlet-rl/gauntlet/services/faults"
)

// startFaults runs the faults service on b, as `gauntlet up` does beside the scheduler.
func startFaults(ctx context.Context, t *testing.T, b *bus.Bus) {
	t.Helper()
	f := faultsvc.New(func() *bus.Bus { return b }, noop.NewMeterProvider().Meter("test"), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := f.Starting(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Stopping(context.Background()) })
}

// runScheduler starts a scheduler configured by cfg and the faults service on a fresh
// bus, and runs the scheduler's loops until the test ends.
func runScheduler(ctx context.Context, t *testing.T, cfg Config) (*Service, *bus.Bus) {
	t.Helper()
	s, b := startSchedulerWith(ctx, t, cfg)
	startFaults(ctx, t, b)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Running(rctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("scheduler: %v", err)
		}
	})
	return s, b
}

func addRun(s *Service, spec *gauntletv1.RunRequested) *run {
	r := &run{spec: spec, dirty: true}
	r.Spec, _ = proto.Marshal(spec)
	s.mu.Lock()
	s.runs[spec.RunId] = r
	s.mu.Unlock()
	return r
}

// A KV bucket the faults service reads failing for a while (here the global drift's
// bucket cannot be opened, as when JetStream does not answer in time) is a transient
// failure: the scheduler does not refuse the run for good, it asks again with backoff, and
// once the bucket answers the run's episodes are assigned.
func TestUnavailableFaultsServiceDoesNotFailTheRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, b := startScheduler(ctx, t)
	startFaults(ctx, t, b)
	if err := b.JS.DeleteKeyValue(ctx, bus.BucketDrift); err != nil {
		t.Fatal(err)
	}
	spec := stallRun("rplan")
	spec.MaxInFlight = 3
	r := addRun(s, spec)

	if err := s.dispatch(ctx, spec.RunId); err == nil {
		t.Fatal("dispatch succeeded without the drift bucket")
	}
	s.mu.Lock()
	refused, assigned := r.Error, r.Assigned
	s.mu.Unlock()
	if refused != "" || assigned != 0 {
		t.Fatalf("after a transient KV failure: run refused with %q, %d assigned; want it retried later", refused, assigned)
	}
	// The bucket answers again (the bus creates it idempotently).
	if err := b.EnsureStreams(ctx, bus.DefaultStreamConfig()); err != nil {
		t.Fatal(err)
	}
	for {
		_ = s.dispatch(ctx, spec.RunId)
		s.mu.Lock()
		refused, assigned = r.Error, r.Assigned
		s.mu.Unlock()
		if refused != "" {
			t.Fatalf("run refused: %s", refused)
		}
		if assigned == spec.Episodes {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("%d of %d episodes assigned once the bucket was back", assigned, spec.Episodes)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A run the faults service cannot plan (an unknown profile) is refused at once, with the
// service's reason.
func TestInvalidPlanRefusesTheRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, b := startScheduler(ctx, t)
	startFaults(ctx, t, b)
	spec := stallRun("rbad")
	spec.MaxInFlight = 3
	spec.Profiles = []*gauntletv1.Share{{Name: "chaos", Weight: 1}}
	r := addRun(s, spec)
	if err := s.dispatch(ctx, spec.RunId); err == nil {
		t.Fatal("dispatch succeeded with an unknown profile")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !strings.Contains(r.Error, `unknown profile "chaos"`) || r.Assigned != 0 || !r.done() {
		t.Fatalf("run error %q, %d assigned, done %v; want it refused naming the profile", r.Error, r.Assigned, r.done())
	}
}
