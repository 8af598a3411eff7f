package store

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/bus/bustest"
	"github.com/gauntlet-rl/gauntlet/pkg/childproc/childproctest"
	"github.com/gauntlet-rl/gauntlet/pkg/chlocal"
	"github.com/gauntlet-rl/gauntlet/pkg/chlocal/chtest"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

const replSteps = 5 // steps per episode in the replicated tests

// TestStoreOnReplicas runs the store against a two-replica ClickHouse (real ZooKeeper,
// real servers), given both addresses, and checks what a trainer relies on:
//   - what the store writes (into the first replica) is read from the other, with
//     FINAL, each step exactly once;
//   - the other replica killed mid-write and restarted catches up: every step exactly
//     once on both;
//   - the replica written to killed mid-write: the store fails over to the other and
//     loses nothing; restarted, the killed one catches up too.
func TestStoreOnReplicas(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	// The store's warnings (failed inserts while a replica is down) go to t.Log.
	log := childproctest.Logger(t)
	_, replicas := chtest.StartCluster(t)
	a, b := replicas[0], replicas[1]
	addrs := strings.Join(chlocal.Addrs(replicas), ",")
	nats := bustest.Start(t)

	const db = "repl"
	s := New(Config{Addr: func() string { return addrs }, Database: db, BatchRows: 200, FlushEvery: time.Second,
		IdleFlush: 50 * time.Millisecond, AckWait: 30 * time.Second},
		func() *bus.Bus { return nats }, noop.NewMeterProvider().Meter("test"), log)
	if err := s.Starting(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Stopping(context.Background()) }()
	runCtx, stopRun := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Running(runCtx) }()
	defer func() {
		stopRun()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	var published atomic.Int64 // episodes
	publish := func(n int) {
		t.Helper()
		for range n {
			e := published.Add(1)
			req := &gauntletv1.EpisodeRequested{EpisodeId: fmt.Sprintf("repl-%06d", e), RunId: "repl", Env: "shop", RequestedAtUnixNano: time.Now().UnixNano()}
			seg := &gauntletv1.StepsTaken{Started: &gauntletv1.EpisodeStarted{Episode: req}, Ended: &gauntletv1.EpisodeEnded{Episode: req, Steps: replSteps}}
			for i := range uint32(replSteps) {
				seg.Steps = append(seg.Steps, &gauntletv1.StepTaken{EpisodeId: req.EpisodeId, RunId: req.RunId, Env: "shop", Step: i, RequestedAtUnixNano: req.RequestedAtUnixNano})
			}
			if err := nats.PublishEvent(ctx, &gauntletv1.Event{Body: &gauntletv1.Event_Steps{Steps: seg}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// publishWhile publishes episodes in small groups, as workers do, until what returns.
	publishWhile := func(what func()) {
		t.Helper()
		stop := make(chan struct{})
		pubDone := make(chan struct{})
		go func() {
			defer close(pubDone)
			for {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
					publish(10)
				}
			}
		}()
		time.Sleep(300 * time.Millisecond) // mid-write
		what()
		time.Sleep(300 * time.Millisecond)
		close(stop)
		<-pubDone
	}

	// 1. Written through the store, read on the other replica.
	publish(100)
	waitExactlyOnce(ctx, t, b, db, int(published.Load()))
	// The analysts' names on the replica read are Distributed tables.
	conn, err := trajectory.Connect(ctx, b.Addr(), db)
	if err != nil {
		t.Fatal(err)
	}
	var engine string
	if err := conn.QueryRow(ctx, "SELECT engine FROM system.tables WHERE database = ? AND name = 'steps'", db).Scan(&engine); err != nil || engine != "Distributed" {
		t.Fatalf("%s.steps on %s is %q (%v), want Distributed", db, b.Replica(), engine, err)
	}
	conn.Close()

	// 2. The other replica killed mid-write, then restarted.
	publishWhile(func() {
		if err := b.Kill(); err != nil {
			t.Fatal(err)
		}
		publish(50) // while it is down
	})
	if err := b.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	want := int(published.Load())
	waitExactlyOnce(ctx, t, a, db, want)
	waitExactlyOnce(ctx, t, b, db, want)

	// 3. The replica written to killed mid-write: the store fails over to the other, which
	// takes every batch from then on. What the killed one acknowledged but the other had
	// not fetched yet is on the killed one's disk and reaches the other once it is back.
	publishWhile(func() {
		if err := a.Kill(); err != nil {
			t.Fatal(err)
		}
	})
	mark := published.Load()
	publish(50)
	waitFor(ctx, t, b, db, fmt.Sprintf("repl-%06d", mark), 50)
	if err := a.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	want = int(published.Load())
	waitExactlyOnce(ctx, t, a, db, want)
	waitExactlyOnce(ctx, t, b, db, want)
	t.Logf("%d episodes of %d steps, each exactly once on both replicas", want, replSteps)
}

// waitExactlyOnce waits until srv's analysts' tables hold the run's episodes, each of
// its steps once with FINAL, and fails the test after two minutes with what they hold.
func waitExactlyOnce(ctx context.Context, t *testing.T, srv *chlocal.Server, db string, episodes int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	var last string
	for {
		got, err := exactCounts(ctx, srv, db)
		if err == nil && got == [3]uint64{uint64(episodes), uint64(episodes * replSteps), uint64(episodes * replSteps)} {
			return
		}
		last = fmt.Sprintf("episodes, steps FINAL, distinct steps = %v (err %v)", got, err)
		if time.Now().After(deadline) {
			t.Fatalf("replica %s after two minutes: %s; want %d episodes of %d steps", srv.Replica(), last, episodes, replSteps)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// waitFor waits until srv holds, each once, the steps of the episodes after the
// episode id after, and of exactly n episodes.
func waitFor(ctx context.Context, t *testing.T, srv *chlocal.Server, db, after string, n int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var steps, distinct uint64
		conn, err := trajectory.Connect(ctx, srv.Addr(), db)
		if err == nil {
			err = conn.QueryRow(ctx, `SELECT
				(SELECT count() FROM `+db+`.steps FINAL WHERE run_id = 'repl' AND episode_id > ?),
				(SELECT uniqExact(episode_id) FROM `+db+`.steps WHERE run_id = 'repl' AND episode_id > ?)`, after, after).Scan(&steps, &distinct)
			conn.Close()
		}
		if err == nil && steps == uint64(n*replSteps) && distinct == uint64(n) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica %s after two minutes holds %d steps of %d episodes after %s (err %v); want %d episodes of %d steps",
				srv.Replica(), steps, distinct, after, err, n, replSteps)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// exactCounts reads, on srv alone, episodes FINAL, steps FINAL and distinct steps.
func exactCounts(ctx context.Context, srv *chlocal.Server, db string) ([3]uint64, error) {
	var out [3]uint64
	conn, err := trajectory.Connect(ctx, srv.Addr(), db)
	if err != nil {
		return out, err
	}
	defer conn.Close()
	err = conn.QueryRow(ctx, `SELECT
		(SELECT count() FROM `+db+`.episodes FINAL WHERE run_id = 'repl'),
		(SELECT count() FROM `+db+`.steps FINAL WHERE run_id = 'repl'),
		(SELECT uniqExact(episode_id, step) FROM `+db+`.steps WHERE run_id = 'repl')`).Scan(&out[0], &out[1], &out[2])
	return out, err
}
