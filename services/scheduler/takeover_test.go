package scheduler

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/runs"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// A leader killed between fetching ends and acknowledging them leaves them pending on
// the shared ended consumer. Its successor must fold them in about when it takes the
// lease, not after a 30 s redelivery: until then the run's in-flight slots stay full of
// episodes that have ended and nothing is assigned (the split stack's chaos test saw a
// new leader idle for 30.0 s after the old one's kill).
func TestEndsFetchedByAKilledLeaderReachItsSuccessor(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	old, b := startScheduler(ctx, t)
	spec := persistedRun(ctx, t, old, "rheld")
	publishEnds(ctx, t, b, spec, 3)
	// The old leader fetches the three ends and dies before its ack.
	batch, err := old.endedCons.Fetch(3, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for range batch.Messages() {
		n++
	}
	if n != 3 {
		t.Fatalf("the old leader fetched %d ends, want 3", n)
	}
	killed := time.Now()

	next := successor(ctx, t, b)
	got := waitEnded(ctx, next, spec.RunId, 3)
	// Its lease had to run out before a successor could lead, so by then the ends are
	// due again; twice the lease leaves room for a loaded machine, and is far below the
	// 30 s the ends once waited.
	if took := time.Since(killed); got != 3 || took > 2*bus.LeaseTTL {
		t.Fatalf("successor counted %d of 3 ends %v after the kill; want all within %v (the leader lease's TTL, %v, plus slack)",
			got, took.Round(100*time.Millisecond), 2*bus.LeaseTTL, bus.LeaseTTL)
	}
}

// A leader that cannot persist what a batch of ends changed (KV unavailable, or the lease
// lost under it) hands the batch back rather than holding it for its whole lease: the
// next fetch, its own or a successor's, gets the ends within a second or so.
func TestEndsAreHandedBackWhenPersistFails(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	old, b := startScheduler(ctx, t)
	spec := persistedRun(ctx, t, old, "rback")
	old.lost.Store(true) // every persist now fails, as after a lost lease
	lctx, stopOld := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = old.endedLoop(lctx) }()
	publishEnds(ctx, t, b, spec, 3)
	// Wait until the old leader holds the ends (fetched, not acknowledged), then stop it.
	for {
		ci, err := old.endedCons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ci.NumPending == 0 && ci.NumAckPending == 3 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the ends never reached the old leader: %+v", ci)
		}
		time.Sleep(20 * time.Millisecond)
	}
	stopOld()
	<-done
	stopped := time.Now()

	next := successor(ctx, t, b)
	got := waitEnded(ctx, next, spec.RunId, 3)
	if took := time.Since(stopped); got != 3 || took >= endedAckWait {
		t.Fatalf("successor counted %d of 3 ends %v after the old leader stopped; want all before their lease (%v) ran out",
			got, took.Round(100*time.Millisecond), endedAckWait)
	}
}

// persistedRun puts a run of 10 episodes, 3 of them assigned, into s's table and KV, as
// s would have it while leading, and returns its spec.
func persistedRun(ctx context.Context, t *testing.T, s *Service, id string) *gauntletv1.RunRequested {
	t.Helper()
	spec := heldRun(id)
	r := &run{spec: spec, Assigned: 3}
	var err error
	if r.Spec, err = proto.Marshal(spec); err != nil {
		t.Fatal(err)
	}
	s.runs[id] = r
	if err := s.persist(ctx, id); err != nil {
		t.Fatal(err)
	}
	return spec
}

func heldRun(id string) *gauntletv1.RunRequested {
	return &gauntletv1.RunRequested{RunId: id, Env: "shop", Seed: 5, Episodes: 10, MaxInFlight: 3,
		Policies: []*gauntletv1.Share{{Name: "oracle", Weight: 1}}}
}

// publishEnds publishes the ends of the run's first n episodes, as a worker does.
func publishEnds(ctx context.Context, t *testing.T, b *bus.Bus, spec *gauntletv1.RunRequested, n uint64) {
	t.Helper()
	for i := range n {
		end := &gauntletv1.EpisodeEnded{Episode: runs.Episode(spec, i), Steps: 1, Terminated: true, Success: true,
			Reason: gauntletv1.TerminationReason_TERMINATION_REASON_SUCCESS}
		if err := b.PublishEvent(ctx, &gauntletv1.Event{Body: &gauntletv1.Event_Ended{Ended: end}}); err != nil {
			t.Fatal(err)
		}
	}
}

// successor starts a second scheduler on b as a new leader does: it binds the consumers,
// loads the runs from KV and follows the ends.
func successor(ctx context.Context, t *testing.T, b *bus.Bus) *Service {
	t.Helper()
	s := startOn(ctx, t, b, testConfig())
	if err := s.loadRuns(ctx); err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.endedLoop(ctx) }()
	return s
}

// waitEnded waits until run id counts want ends in s, or ctx ends, and returns the count.
func waitEnded(ctx context.Context, s *Service, id string, want uint64) uint64 {
	for {
		s.mu.Lock()
		var got uint64
		if r, ok := s.runs[id]; ok {
			got = r.Ended.Count()
		}
		s.mu.Unlock()
		if got >= want || ctx.Err() != nil {
			return got
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A leader paused past its lease (a stopped process, a long GC) may write a run's state
// once more before it learns that it lost the lease. Its write must not replace what its
// successor wrote meanwhile: the successor's ends, acknowledged once persisted, would be
// lost for good and the run would never finish.
func TestAStaleLeaderCannotOverwriteItsSuccessor(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stale, b := startScheduler(ctx, t)
	spec := persistedRun(ctx, t, stale, "rstale")
	next := successor(ctx, t, b)
	publishEnds(ctx, t, b, spec, 2)
	if got := waitEnded(ctx, next, spec.RunId, 2); got != 2 {
		t.Fatalf("successor counted %d ends, want 2", got)
	}
	waitPersisted(ctx, t, next, spec.RunId, 2)

	// The stale leader wakes up and writes what it knew: nothing ended.
	err := stale.persist(ctx, spec.RunId)
	if !errors.Is(err, bus.ErrLeaseLost) {
		t.Fatalf("stale leader's write: %v, want refused as superseded (ErrLeaseLost)", err)
	}
	if !stale.lost.Load() {
		t.Error("the stale leader does not know it was superseded")
	}
	if got := persistedEnded(ctx, t, next, spec.RunId); got != 2 {
		t.Fatalf("KV holds %d ended after the stale write, want the successor's 2", got)
	}
}

// The other order: the paused leader's last write lands after its successor loaded the
// run and before the successor's first write. The successor's write then finds the
// revision moved; it steps down, gives the lease up and leads again from what KV holds,
// so the ends of both count.
func TestASupersededLeaderReloadsWhatTheOtherWrote(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stale, b := startScheduler(ctx, t)
	spec := persistedRun(ctx, t, stale, "rrace")
	// The successor leads (lease taken, runs loaded), then the stale leader folds in
	// episode 0's end, which its successor never sees on the consumer (acked by the
	// stale one), and writes.
	next := New(testConfig(), func() *bus.Bus { return b }, noop.NewMeterProvider().Meter("test"), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := next.Starting(ctx); err != nil {
		t.Fatal(err)
	}
	running := make(chan error, 1)
	go func() { running <- next.Running(ctx) }()
	if got := waitLoaded(ctx, next, spec.RunId); !got {
		t.Fatal("the successor never loaded the run")
	}
	stale.mu.Lock()
	stale.runs[spec.RunId].record(&gauntletv1.EndedSummary{Episode: &gauntletv1.EpisodeRef{RunId: spec.RunId, Index: 0}, Steps: 1, Success: true})
	stale.mu.Unlock()
	if err := stale.persist(ctx, spec.RunId); err != nil {
		t.Fatal(err)
	}
	// Episode 1 ends on the consumer: the successor's write of it is refused.
	ep := runs.Episode(spec, 1)
	if err := b.PublishEvent(ctx, &gauntletv1.Event{Body: &gauntletv1.Event_Ended{Ended: &gauntletv1.EpisodeEnded{Episode: ep, Steps: 1, Terminated: true}}}); err != nil {
		t.Fatal(err)
	}
	waitPersisted(ctx, t, next, spec.RunId, 2)
	if got := waitEnded(ctx, next, spec.RunId, 2); got != 2 {
		t.Fatalf("the successor counts %d ends, want 2 (the stale leader's and its own)", got)
	}
	select {
	case err := <-running:
		t.Fatalf("the successor stopped leading for good: %v", err)
	default:
	}
}

// waitLoaded waits until s has run id in its table.
func waitLoaded(ctx context.Context, s *Service, id string) bool {
	for ctx.Err() == nil {
		s.mu.Lock()
		_, ok := s.runs[id]
		s.mu.Unlock()
		if ok {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// persistedEnded reads how many episodes of run id have ended by its state in KV.
func persistedEnded(ctx context.Context, t *testing.T, s *Service, id string) uint64 {
	t.Helper()
	e, err := s.kv.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	r, _, err := decodeRun(e.Value())
	if err != nil {
		t.Fatal(err)
	}
	return r.Ended.Count()
}

// waitPersisted waits, at most 20 s, until run id's state in KV counts want ends.
func waitPersisted(ctx context.Context, t *testing.T, s *Service, id string, want uint64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := persistedEnded(ctx, t, s, id)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("KV holds %d ended of run %s, want %d", got, id, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
