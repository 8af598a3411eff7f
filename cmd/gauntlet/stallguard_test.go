package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
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

// failStalled fails t with ctx's stall cause when there is one, else with err, followed
// by what more the caller knows of what is missing (missingEpisodes).
func failStalled(t *testing.T, ctx context.Context, err error, missing ...string) {
	t.Helper()
	why := err
	if cause := context.Cause(ctx); cause != nil && cause != ctx.Err() {
		why = cause
	}
	t.Fatal(strings.Join(append([]string{why.Error()}, missing...), "; "))
}

// missingEpisodes names the episodes of a run of n that ClickHouse does not hold (read
// with FINAL), the first few by index. It reads with its own short deadline, so it
// answers after the test's context has ended.
func missingEpisodes(conn driver.Conn, db, runID string, n uint64) string {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rows, err := conn.Query(ctx, fmt.Sprintf("SELECT DISTINCT idx FROM %s.episodes FINAL WHERE run_id = '%s'", db, runID))
	if err != nil {
		return fmt.Sprintf("episodes in ClickHouse: %v", err)
	}
	defer rows.Close()
	held := make(map[uint64]bool, n)
	for rows.Next() {
		var idx uint64
		if err := rows.Scan(&idx); err != nil {
			return fmt.Sprintf("episodes in ClickHouse: %v", err)
		}
		held[idx] = true
	}
	var first []string
	missing := 0
	for i := range n {
		if !held[i] {
			if missing++; len(first) < 10 {
				first = append(first, fmt.Sprint(i))
			}
		}
	}
	if missing == 0 {
		return fmt.Sprintf("ClickHouse holds all %d episodes' ends", n)
	}
	return fmt.Sprintf("%d of %d episodes have no end in ClickHouse, by index: %s", missing, n, strings.Join(first, ", "))
}
