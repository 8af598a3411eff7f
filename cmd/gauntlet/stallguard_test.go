package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/services/store"
	"github.com/gauntlet-rl/gauntlet/services/worker"
)

// stallAfter is how long an end-to-end wait lets a run go without any progress (episodes
// assigned or ended, events written by the store) before it fails. Every wait has a long
// overall bound too, but a loss shows as progress stopping: failing then, with what is
// missing, turns a ten-minute hang into a minute and a reason.
const stallAfter = 60 * time.Second

// guardStall returns ctx cancelled, with a cause describing the stall, once the run has
// made no progress for stallAfter. The cause names the run's counts and the lag of the
// workers' and the store's consumers. Cancel it when the wait is over.
func guardStall(ctx context.Context, t *testing.T, b *bus.Bus, runID string) (context.Context, context.CancelFunc) {
	t.Helper()
	gctx, cancel := context.WithCancelCause(ctx)
	runsKV, err := b.JS.KeyValue(ctx, bus.BucketRuns)
	if err != nil {
		t.Fatal(err)
	}
	storeKV, _ := b.StoreBucket(ctx) // nil on a stack without a store: then not watched
	go func() {
		var last string
		changed := time.Now()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-gctx.Done():
				return
			case <-tick.C:
			}
			var written uint64
			if storeKV != nil {
				if p, err := bus.GetStoreProgress(gctx, storeKV); err == nil {
					written = p.GetWrittenSeq()
				}
			}
			p := progressFromKV(gctx, runsKV, runID)
			state := fmt.Sprintf("%d/%d episodes assigned, %d ended; the store has written up to event %d",
				p.GetAssigned(), p.GetEpisodes(), p.GetEnded(), written)
			if state != last {
				last, changed = state, time.Now()
				continue
			}
			if time.Since(changed) >= stallAfter {
				cancel(fmt.Errorf("run %s made no progress for %v: %s; %s", runID, stallAfter, state, consumerLag(gctx, b)))
				return
			}
		}
	}()
	return gctx, func() { cancel(nil) }
}

// consumerLag describes the workers' and the store's consumers: what waits for them and
// what they hold unacknowledged.
func consumerLag(ctx context.Context, b *bus.Bus) string {
	var parts []string
	for _, c := range []struct{ stream, name string }{
		{bus.StreamCommands, worker.ConsumerName}, {bus.StreamEvents, store.ConsumerName},
	} {
		cons, err := b.JS.Consumer(ctx, c.stream, c.name)
		var info *jetstream.ConsumerInfo
		if err == nil {
			info, err = cons.Info(ctx)
		}
		if err != nil {
			parts = append(parts, fmt.Sprintf("consumer %s: %v", c.name, err))
			continue
		}
		parts = append(parts, fmt.Sprintf("consumer %s: %d not delivered, %d unacknowledged, %d redelivered, acknowledged up to %d",
			c.name, info.NumPending, info.NumAckPending, info.NumRedelivered, info.AckFloor.Stream))
	}
	return strings.Join(parts, "; ")
}

// failStalled fails t with ctx's stall cause when there is one, else with err.
func failStalled(t *testing.T, ctx context.Context, err error) {
	t.Helper()
	if cause := context.Cause(ctx); cause != nil && cause != ctx.Err() {
		t.Fatal(cause)
	}
	t.Fatal(err)
}
