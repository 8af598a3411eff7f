package main

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/chlocal"
	"github.com/gauntlet-rl/gauntlet/pkg/chlocal/chtest"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// smallStreamConfig is a stack whose events stream holds a few hundred episodes: a run of
// thousands must pass through it many times over.
func smallStreamConfig(t *testing.T, ch *chlocal.Server) config {
	t.Helper()
	cfg := testConfig(t)
	cfg.ClickHouse = ch.Addr()
	cfg.EventsMaxBytes = 2 << 20
	cfg.EventsHistoryBytes = 512 << 10
	// A short lease: an assignment whose publishes wait longer than this must keep it.
	cfg.Worker.AckWait = 6 * time.Second
	cfg.Worker.Concurrency = 32
	return cfg
}

// followWithin follows a run until it is done, failing the test if it is not done in time
// (a stalled pipeline) or has any infra error (a lie about the workers).
func followWithin(t *testing.T, s *testStack, req *gauntletv1.RunRequested, d time.Duration) *gauntletv1.RunProgress {
	t.Helper()
	final, err := followFor(s, req, d)
	if err != nil {
		t.Fatal(err)
	}
	if final.InfraErrors != 0 {
		t.Errorf("run %s: %d infra errors, want 0", req.RunId, final.InfraErrors)
	}
	return final
}

// followFor follows a run until it is done, or fails naming how far it got in d.
func followFor(s *testStack, req *gauntletv1.RunRequested, d time.Duration) (*gauntletv1.RunProgress, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	final, err := follow(ctx, s.app.getBus(), req, io.Discard)
	if err != nil {
		progress := ""
		if p, perr := runProgress(s.app.getBus(), req.RunId); perr == nil {
			progress = fmt.Sprintf(" (ended %d of %d, infra errors %d)", p.Ended, p.Episodes, p.InfraErrors)
		}
		return nil, fmt.Errorf("run %s not done within %v%s: %w", req.RunId, d, progress, err)
	}
	return final, nil
}

// runProgress reads a run's state from the scheduler's bucket.
func runProgress(b *bus.Bus, runID string) (*gauntletv1.RunProgress, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := b.JS.KeyValue(ctx, bus.BucketRuns)
	if err != nil {
		return nil, err
	}
	e, err := kv.Get(ctx, runID)
	if err != nil {
		return nil, err
	}
	return gauntletv1.DecodeRunProgress(e.Value())
}

// assertStored checks that ClickHouse holds every episode and step of the run once.
func assertStored(t *testing.T, s *testStack, ch *chlocal.Server, db string, req *gauntletv1.RunRequested, final *gauntletv1.RunProgress) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	conn := connect(t, ch.Addr(), db)
	if err := waitPersisted(ctx, s.app.getBus(), conn, db, req.RunId, req.Episodes, final.Steps, io.Discard); err != nil {
		t.Fatal(err)
	}
	if got := queryOne(t, conn, fmt.Sprintf(`SELECT count() FROM %s.episodes FINAL WHERE run_id = '%s'`, db, req.RunId)); got != fmt.Sprint(req.Episodes) {
		t.Errorf("episodes in ClickHouse = %s, want %d", got, req.Episodes)
	}
	if got := queryOne(t, conn, fmt.Sprintf(`SELECT count() FROM %s.steps FINAL WHERE run_id = '%s'`, db, req.RunId)); got != fmt.Sprint(final.Steps) {
		t.Errorf("steps in ClickHouse = %s, workers reported %d", got, final.Steps)
	}
	if got := queryOne(t, conn, fmt.Sprintf(`SELECT sum(infra_error) FROM %s.episodes FINAL WHERE run_id = '%s'`, db, req.RunId)); got != "0" {
		t.Errorf("infra errors in ClickHouse = %s, want 0", got)
	}
}

// eventsState reads the events stream's first sequence and bytes.
func eventsState(t *testing.T, b *bus.Bus) (first uint64, bytes uint64, maxBytes int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := b.JS.Stream(ctx, bus.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	si, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return si.State.FirstSeq, si.State.Bytes, si.Config.MaxBytes
}

// A run many times larger than the events stream passes through it: what the store has
// written leaves the stream, so publishing never stops, and no episode is lost or
// recorded as an infra error.
func TestSmallEventsStreamNeverStalls(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse; run without -short")
	}
	ch := chtest.Start(t)
	cfg := smallStreamConfig(t, ch)
	s := startStack(t, cfg)
	req := newRun(t, 3000, "oracle=1", 21)
	final := followWithin(t, s, req, 90*time.Second)
	assertStored(t, s, ch, cfg.Database, req, final)
	first, bytes, maxBytes := eventsState(t, s.app.getBus())
	if first <= 1 {
		t.Errorf("events stream first sequence %d: nothing written was ever removed", first)
	}
	t.Logf("events stream: first sequence %d, %d bytes of %d", first, bytes, maxBytes)
}

// With ClickHouse down the store cannot write, so the small stream fills and producers
// wait, longer than their assignments' lease; once ClickHouse is back the store catches
// up, the stream drains and the run finishes with every episode stored and no infra
// error.
func TestFullEventsStreamRecovers(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse; run without -short")
	}
	ch := chtest.Start(t)
	cfg := smallStreamConfig(t, ch)
	// One delivery: an assignment given up on even once would be an infra error.
	cfg.Worker.MaxDeliver = 1
	s := startStack(t, cfg)
	conn := connect(t, ch.Addr(), cfg.Database)
	req := newRun(t, 2000, "oracle=1", 22)

	type result struct {
		final *gauntletv1.RunProgress
		err   error
	}
	done := make(chan result, 1)
	go func() {
		final, err := followFor(s, req, 110*time.Second)
		done <- result{final, err}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	waitFor(ctx, t, func() bool {
		eps, _, _ := trajectory.RunCounts(ctx, conn, cfg.Database, req.RunId)
		return eps > 50
	})
	if err := ch.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	// Down until the stream is full, then for longer than a worker's lease and than the
	// 30 s after which a publish failing for any other reason is given up on.
	waitFor(ctx, t, func() bool {
		_, bytes, maxBytes := eventsState(t, s.app.getBus())
		return int64(bytes) > maxBytes*3/4
	})
	time.Sleep(35 * time.Second)
	if p, err := runProgress(s.app.getBus(), req.RunId); err == nil && p.InfraErrors > 0 {
		t.Errorf("while the stream was full: %d infra errors", p.InfraErrors)
	}
	if err := ch.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.final.InfraErrors != 0 {
		t.Errorf("run %s: %d infra errors, want 0", req.RunId, r.final.InfraErrors)
	}
	assertStored(t, s, ch, cfg.Database, req, r.final)
}
