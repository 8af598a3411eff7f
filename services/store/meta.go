package store

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// How the store projects run and curriculum metadata (the runs and curriculum_stages
// tables). Their sources are KV buckets, not the events stream: the scheduler's run
// state (gauntlet_runs) is rewritten as episodes end, and the curriculum workflow puts
// each closed stage in gauntlet_curricula. A watch delivers every key's latest value when
// it starts, so a restarted store rewrites every row (idempotent: ReplacingMergeTree by
// the state's update time) and misses nothing that happened while it was down.
const (
	// metaFlush is how often pending metadata rows are written.
	metaFlush = time.Second
	// runningRewrite bounds how often a running run's row is rewritten: the scheduler
	// updates its state many times a second, an analyst needs its counts within seconds.
	// A run's first row and its final one are written at the next flush.
	runningRewrite = 10 * time.Second
	// metaRetry is the wait before a watch that failed (a missing bucket, a lost
	// connection) is opened again.
	metaRetry = 5 * time.Second
)

// metaEntry is one KV value to project: from which bucket, and its bytes.
type metaEntry struct {
	bucket string
	value  []byte
}

// projectMeta watches the metadata buckets and writes their rows until ctx ends.
func (s *Service) projectMeta(ctx context.Context) {
	entries := make(chan metaEntry, 256)
	for _, bucket := range []string{bus.BucketRuns, bus.BucketCurricula} {
		go s.watchBucket(ctx, bucket, entries)
	}
	pendingRuns := map[string]trajectory.RunRow{}
	var pendingStages []trajectory.StageRow
	written := map[string]time.Time{} // running runs: when their row was last written
	// After a failed write (ClickHouse down), the next waits backoff, doubling up to
	// metaRetry, so a long outage logs a line every few seconds, not every flush.
	var retryAt time.Time
	backoff := metaFlush
	flush := func(ctx context.Context, now time.Time, all bool) {
		if !all && now.Before(retryAt) {
			return
		}
		ok := true
		var rows []trajectory.RunRow
		for id, r := range pendingRuns {
			last, seen := written[id]
			if !all && r.State == trajectory.RunRunning && seen && now.Sub(last) < runningRewrite {
				continue
			}
			rows = append(rows, r)
		}
		if len(rows) > 0 {
			if err := s.writer.WriteRuns(ctx, rows); err != nil {
				s.log.Warn("write runs; retrying", "rows", len(rows), "retry_in", backoff, "err", err)
				ok = false
			} else {
				for _, r := range rows {
					delete(pendingRuns, r.RunID)
					if r.State == trajectory.RunRunning {
						written[r.RunID] = now
					} else {
						delete(written, r.RunID)
					}
				}
			}
		}
		if len(pendingStages) > 0 {
			if err := s.writer.WriteStages(ctx, pendingStages); err != nil {
				s.log.Warn("write curriculum stages; retrying", "rows", len(pendingStages), "retry_in", backoff, "err", err)
				ok = false
			} else {
				pendingStages = nil
			}
		}
		if ok {
			backoff = metaFlush
		} else {
			retryAt = now.Add(backoff)
			backoff = min(2*backoff, metaRetry)
		}
	}
	tick := time.NewTicker(metaFlush)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			// A stopping store writes what it holds, within bounds; a restarted one
			// rewrites every row anyway.
			wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			flush(wctx, time.Now(), true)
			cancel()
			return
		case e := <-entries:
			switch e.bucket {
			case bus.BucketRuns:
				st, err := gauntletv1.DecodeRunState(e.value)
				if err != nil || st.GetSpec().GetRunId() == "" {
					s.log.Warn("undecodable run state; not projected into runs", "err", err)
					continue
				}
				row := trajectory.RunRowOf(st)
				if old, ok := pendingRuns[row.RunID]; !ok || row.Version >= old.Version {
					pendingRuns[row.RunID] = row
				}
			case bus.BucketCurricula:
				t := &gauntletv1.StageTransition{}
				if err := gauntletv1.Unmarshal(e.value, t); err != nil || t.GetCurriculumPrefix() == "" {
					s.log.Warn("undecodable stage transition; not projected into curriculum_stages", "err", err)
					continue
				}
				pendingStages = append(pendingStages, trajectory.StageRowOf(t))
			}
		case now := <-tick.C:
			flush(ctx, now, false)
		}
	}
}

// watchBucket sends every value put in bucket (the current ones first) to out until ctx
// ends, opening the watch again after a failure.
func (s *Service) watchBucket(ctx context.Context, bucket string, out chan<- metaEntry) {
	for {
		err := s.watchOnce(ctx, bucket, out)
		if ctx.Err() != nil {
			return
		}
		s.log.Warn("watch of a metadata bucket ended; opening it again", "bucket", bucket, "retry_in", metaRetry, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(metaRetry):
		}
	}
}

func (s *Service) watchOnce(ctx context.Context, bucket string, out chan<- metaEntry) error {
	kv, err := s.bus().JS.KeyValue(ctx, bucket)
	if err != nil {
		return err
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("watch closed")
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue // the end of the current values, or a delete
			}
			select {
			case out <- metaEntry{bucket: bucket, value: e.Value()}:
			case <-ctx.Done():
				return nil
			}
		}
	}
}
