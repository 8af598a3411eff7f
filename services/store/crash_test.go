package store

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/chlocal/chtest"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// A store that dies in the middle of its write path loses nothing and duplicates nothing
// that FINAL shows. At each crash point the first store stops for good, as a killed
// process would (its connection closed, the batch neither written further nor acked); a
// second store on the same consumer receives the batch again once the first one's lease
// lapses, and ClickHouse ends with every episode and step exactly once. At the crash
// point itself the test checks the promise the order rests on: nothing is acknowledged
// before ClickHouse has it.
func TestCrashInTheWritePathLosesNothing(t *testing.T) {
	ch := chtest.Start(t)
	for _, tc := range []struct {
		name  string
		point crashPoint
		// inserted is how many steps ClickHouse holds (raw) when the crash happens.
		inserted int
	}{
		{"before insert", beforeInsert, 0},
		{"after insert, before ack", beforeAck, crashEpisodes * crashSteps},
	} {
		t.Run(tc.name, func(t *testing.T) {
			crashAndRecover(t, ch.Addr, fmt.Sprintf("crash%d", tc.point), tc.point, tc.inserted)
		})
	}
}

const crashEpisodes, crashSteps = 5, 4

func crashAndRecover(t *testing.T, chAddr func() string, db string, point crashPoint, inserted int) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv := bus.NewServer(bus.ServerConfig{StoreDir: t.TempDir(), Port: -1}, log)
	if err := srv.Starting(ctx); err != nil {
		t.Fatalf("start embedded NATS: %v", err)
	}
	t.Cleanup(func() { _ = srv.Stopping(context.Background()) })
	connect := func(name string) *bus.Bus {
		b, err := bus.Connect("", name, log, srv.ConnectOption())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		return b
	}
	b1 := connect("store-1")
	if err := b1.EnsureStreams(ctx, bus.DefaultStreamConfig()); err != nil {
		t.Fatal(err)
	}
	for e := range crashEpisodes {
		req := &gauntletv1.EpisodeRequested{EpisodeId: fmt.Sprintf("run-crash-%d", e), RunId: "run-crash", Env: "shop", RequestedAtUnixNano: time.Now().UnixNano()}
		seg := &gauntletv1.StepsTaken{Started: &gauntletv1.EpisodeStarted{Episode: req}, Ended: &gauntletv1.EpisodeEnded{Episode: req, Steps: crashSteps}}
		for i := range uint32(crashSteps) {
			seg.Steps = append(seg.Steps, &gauntletv1.StepTaken{EpisodeId: req.EpisodeId, RunId: req.RunId, Env: "shop", Step: i, RequestedAtUnixNano: req.RequestedAtUnixNano})
		}
		if err := b1.PublishEvent(ctx, &gauntletv1.Event{Body: &gauntletv1.Event_Steps{Steps: seg}}); err != nil {
			t.Fatal(err)
		}
	}

	// One batch holds all five events: the batch bound is far off, the idle flush closes it.
	cfg := Config{Addr: chAddr, Database: db, BatchRows: 1_000_000, FlushEvery: time.Hour, IdleFlush: 100 * time.Millisecond, AckWait: 10 * time.Second}
	start := func(b *bus.Bus, crashAt func(crashPoint, int) bool) (*Service, context.CancelFunc, chan error) {
		s := New(cfg, func() *bus.Bus { return b }, noop.NewMeterProvider().Meter("test"), log)
		s.crashAt = crashAt
		if err := s.Starting(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Stopping(context.Background()) })
		sctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- s.Running(sctx) }()
		return s, stop, done
	}

	crashed := make(chan int, 1)
	first, stop1, done1 := start(b1, func(p crashPoint, events int) bool {
		if p != point {
			return false
		}
		crashed <- events
		return true
	})
	var events int
	select {
	case events = <-crashed:
	case <-ctx.Done():
		t.Fatal("the store never reached the crash point")
	}
	if events != crashEpisodes {
		t.Fatalf("the crashed batch held %d events, want all %d", events, crashEpisodes)
	}
	// What the dead store left: nothing acknowledged, and ClickHouse as far as it got.
	info, err := first.cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.AckFloor.Stream != 0 {
		t.Fatalf("at the crash point the store's consumer had acknowledged up to sequence %d: events were acked before ClickHouse had them", info.AckFloor.Stream)
	}
	if raw := count(ctx, t, first, db, "steps"); raw != inserted {
		t.Fatalf("at the crash point ClickHouse held %d steps, want %d", raw, inserted)
	}
	b1.NC.Close() // the process is gone: no ack of it can arrive any more
	stop1()
	<-done1

	b2 := connect("store-2")
	second, stop2, done2 := start(b2, nil)
	defer func() {
		stop2()
		<-done2
	}()
	// The lease (10 s) lapses, the batch is redelivered to the second store. The wait
	// ends as soon as the consumer has acknowledged everything; then the counts must be
	// exact.
	deadline := time.Now().Add(45 * time.Second)
	for {
		info, err := second.cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.AckFloor.Stream == crashEpisodes {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("45 s after the crash the store has acknowledged up to %d of %d events (%d pending, %d redelivered)",
				info.AckFloor.Stream, crashEpisodes, info.NumPending, info.NumRedelivered)
		}
		time.Sleep(100 * time.Millisecond)
	}
	eps, steps := count(ctx, t, second, db, "episodes FINAL"), count(ctx, t, second, db, "steps FINAL")
	if eps != crashEpisodes || steps != crashEpisodes*crashSteps {
		t.Fatalf("after the crash and redelivery ClickHouse holds %d episodes and %d steps (FINAL), want exactly %d and %d",
			eps, steps, crashEpisodes, crashEpisodes*crashSteps)
	}
}

// count counts the rows of db.from ("steps", or "steps FINAL" for what the table's key
// leaves of copies).
func count(ctx context.Context, t *testing.T, s *Service, db, from string) int {
	t.Helper()
	var n uint64
	if err := s.conn.QueryRow(ctx, "SELECT count() FROM "+db+"."+from).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return int(n)
}
