package bus_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/natslocal/natstest"
)

// Every process of a split deployment creates the streams at its start, and pods start
// together: processes on different nodes of a cluster creating the same 3-replica streams
// at once must all succeed. They did not: all but one request went unanswered ("create
// stream GAUNTLET_CMD: context deadline exceeded", whatever the wait), or lost the race
// ("stream name already in use").
func TestEnsureStreamsConcurrentlyOnACluster(t *testing.T) {
	c := natstest.Start(t, 3)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := bus.DefaultStreamConfig()
	cfg.Replicas = 3
	cfg.EventsMaxBytes = 64 << 20 // within the test cluster's room: sizing is the next test's
	const procs = 6
	var wg sync.WaitGroup
	errs := make([]error, procs)
	for i := range procs {
		b, err := bus.Connect(c.NodeURL(i%c.Nodes()), "test", log)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			errs[i] = b.EnsureStreams(ctx, cfg)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("process %d: %v", i, err)
		}
	}
}

// A cluster whose nodes have less room than the events stream's configured size caps the
// stream, as a single server does, instead of refusing to start: its refusal says "no
// suitable peers for placement, insufficient storage" (10005), not a single server's
// 10047, and was returned as an error.
func TestEventsStreamFitsTheClusterStore(t *testing.T) {
	c := natstest.Start(t, 3) // 1 GiB of file store per node
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := natstest.Bus(ctx, t, c, 3, 0) // the default cap, 32 GiB
	s, err := b.JS.Stream(ctx, bus.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.MaxBytes >= 1<<30 || info.Config.Replicas != 3 {
		t.Fatalf("events stream: max_bytes %d, replicas %d; want capped under the 1 GiB store, 3 replicas", info.Config.MaxBytes, info.Config.Replicas)
	}
}
