package bus_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/bus/bustest"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// smallEvents connects to a server whose events stream holds maxBytes.
func smallEvents(t *testing.T, srv bus.ServerConfig, maxBytes int64, log io.Writer) *bus.Bus {
	t.Helper()
	b := bustest.Connect(t, srv, slog.New(slog.NewTextHandler(log, nil)))
	cfg := bus.DefaultStreamConfig()
	cfg.EventsMaxBytes = maxBytes
	if err := b.EnsureStreams(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	return b
}

// publishRaw publishes n events of size bytes on subject, each with its own id.
func publishRaw(t *testing.T, b *bus.Bus, subject string, n, size int) error {
	t.Helper()
	for i := 0; i < n; i++ {
		if _, err := b.JS.Publish(context.Background(), subject, make([]byte, size),
			jetstream.WithMsgID(fmt.Sprintf("%s/%d/%d", subject, time.Now().UnixNano(), i))); err != nil {
			return err
		}
	}
	return nil
}

// consume creates a durable consumer of the events stream and acknowledges its first n
// messages (all when n < 0).
func consume(t *testing.T, b *bus.Bus, name, filter string, n int) jetstream.Consumer {
	t.Helper()
	ctx := context.Background()
	c, err := b.JS.CreateOrUpdateConsumer(ctx, bus.StreamEvents, jetstream.ConsumerConfig{
		Durable: name, FilterSubject: filter, AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		t.Fatal(err)
	}
	ack(t, c, n)
	return c
}

func ack(t *testing.T, c jetstream.Consumer, n int) {
	t.Helper()
	for n != 0 {
		batch, err := c.Fetch(max(n, 1), jetstream.FetchMaxWait(200*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for m := range batch.Messages() {
			if err := m.DoubleAck(context.Background()); err != nil {
				t.Fatal(err)
			}
			got++
		}
		if got == 0 {
			return
		}
		if n > 0 {
			n -= got
		}
	}
}

func firstSeq(t *testing.T, b *bus.Bus) uint64 {
	t.Helper()
	st, err := b.JS.Stream(context.Background(), bus.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	return st.CachedInfo().State.FirstSeq
}

// Only what the store and the scheduler have both processed leaves the stream, and only
// beyond the history kept; without the store's consumer nothing does.
func TestTrimEventsRemovesOnlyWhatIsProcessed(t *testing.T) {
	ctx := context.Background()
	b := smallEvents(t, bus.ServerConfig{}, 8<<20, io.Discard)
	steps, ended := bus.SubjectEvent(bus.KindSteps, "r1"), bus.SubjectEvent(bus.KindEnded, "r1")
	if err := publishRaw(t, b, steps, 10, 4<<10); err != nil {
		t.Fatal(err)
	}
	if err := publishRaw(t, b, ended, 1, 4<<10); err != nil { // sequence 11
		t.Fatal(err)
	}
	if err := publishRaw(t, b, steps, 9, 4<<10); err != nil {
		t.Fatal(err)
	}
	if n, err := b.TrimEvents(ctx, 0); err != nil || n != 0 {
		t.Fatalf("no store consumer: trimmed %d, %v; want nothing", n, err)
	}

	store := consume(t, b, bus.ConsumerStore, bus.SubjectEventsAll, 15)
	if n, err := b.TrimEvents(ctx, 0); err != nil || n != 15 {
		t.Fatalf("store acknowledged 15, no scheduler consumer: trimmed %d, %v; want 15", n, err)
	}
	// The scheduler's consumer, created after the trim, has an end still to fold in
	// (sequence 21): until it has, nothing more leaves, though the store has it all.
	if err := publishRaw(t, b, ended, 1, 4<<10); err != nil { // sequence 21
		t.Fatal(err)
	}
	sched := consume(t, b, bus.ConsumerEnded, bus.SubjectEndedAll, 0)
	ack(t, store, -1)
	if n, err := b.TrimEvents(ctx, 0); err != nil || n != 0 || firstSeq(t, b) != 16 {
		t.Fatalf("scheduler behind: trimmed %d, %v, first sequence %d; want nothing trimmed, first 16", n, err, firstSeq(t, b))
	}
	ack(t, sched, -1)
	// A history larger than the stream keeps everything.
	if n, err := b.TrimEvents(ctx, 1<<20); err != nil || n != 0 {
		t.Fatalf("history above the stream's size: trimmed %d, %v; want nothing", n, err)
	}
	if n, err := b.TrimEvents(ctx, 0); err != nil || n != 6 {
		t.Fatalf("all processed: trimmed %d, %v; want the last 6", n, err)
	}
}

// A full stream refuses a publish with a room error, which the publish waits out (not an
// error to its caller), counted, until the store catches up and the trim makes room.
func TestPublishWaitsForRoom(t *testing.T) {
	ctx := context.Background()
	var logs syncBuffer
	b := smallEvents(t, bus.ServerConfig{}, 1<<20, &logs)
	subj := bus.SubjectEvent(bus.KindSteps, "r1")
	err := publishRaw(t, b, subj, 1000, 16<<10)
	if !bus.IsFull(err) {
		t.Fatalf("filling a 1 MiB stream: %v, want a room error", err)
	}
	if err := publishRaw(t, b, subj, 1<<20, 1); !bus.IsFull(err) { // to the last byte
		t.Fatalf("filling the rest: %v, want a room error", err)
	}
	store := consume(t, b, bus.ConsumerStore, bus.SubjectEventsAll, 0)

	ev := &gauntletv1.Event{Body: &gauntletv1.Event_Ended{Ended: &gauntletv1.EpisodeEnded{
		Episode: &gauntletv1.EpisodeRequested{EpisodeId: "e1", RunId: "r1"}}}}
	done := make(chan error, 1)
	waits := 0
	go func() {
		done <- b.PublishEventWith(ctx, ev, bus.Patience{Other: time.Second, Waiting: func() { waits++ }})
	}()
	time.Sleep(1500 * time.Millisecond) // longer than Other: a full stream is not a failure
	select {
	case err := <-done:
		t.Fatalf("publish to a full stream returned %v, want it to wait", err)
	default:
	}
	refused, waiting := b.Stalls()
	if refused < 2 || waiting != 1 {
		t.Errorf("Stalls = %d refused, %d waiting; want several, 1", refused, waiting)
	}
	// Logged once, not per try (a full stream used to log every retry).
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 {
		t.Errorf("%d warnings for %d refused tries, want 1:\n%s", n, refused, logs.String())
	}

	ack(t, store, -1)
	if _, err := b.TrimEvents(ctx, 0); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("publish after the trim: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("publish still waiting after the trim made room")
	}
	if _, waiting := b.Stalls(); waiting != 0 || waits == 0 {
		t.Errorf("after: %d waiting, Waiting called %d times; want 0 and some", waiting, waits)
	}
}

// A data dir whose events stream an older gauntlet created (the same limits policy, a
// 64 MiB cap) starts with this code as it is: its events stay, and what the store had
// acknowledged is trimmed.
func TestEventsStreamOfAnOlderDataDirUpgrades(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	start := func() (*bus.Server, *bus.Bus) {
		srv := bus.NewServer(bus.ServerConfig{StoreDir: dir, Port: -1}, log)
		if err := srv.Starting(ctx); err != nil {
			t.Fatal(err)
		}
		b, err := bus.Connect("", t.Name(), log, srv.ConnectOption())
		if err != nil {
			t.Fatal(err)
		}
		return srv, b
	}
	srv, old := start()
	if _, err := old.JS.CreateStream(ctx, jetstream.StreamConfig{ // as EnsureStreams made it before
		Name: bus.StreamEvents, Subjects: []string{"gauntlet.ev.>"}, Retention: jetstream.LimitsPolicy,
		Storage: jetstream.FileStorage, Replicas: 1, MaxAge: 24 * time.Hour, MaxBytes: 64 << 20,
		Duplicates: 30 * time.Second, Discard: jetstream.DiscardNew,
	}); err != nil {
		t.Fatal(err)
	}
	if err := publishRaw(t, old, bus.SubjectEvent(bus.KindSteps, "r1"), 20, 1<<10); err != nil {
		t.Fatal(err)
	}
	consume(t, old, bus.ConsumerStore, bus.SubjectEventsAll, 12)
	_ = old.Close()
	if err := srv.Stopping(ctx); err != nil {
		t.Fatal(err)
	}

	srv, b := start()
	t.Cleanup(func() { _ = b.Close(); _ = srv.Stopping(ctx) })
	cfg := bus.DefaultStreamConfig()
	cfg.EventsMaxBytes = 64 << 20
	if err := b.EnsureStreams(ctx, cfg); err != nil {
		t.Fatalf("EnsureStreams on an older data dir: %v", err)
	}
	if n, err := b.TrimEvents(ctx, 0); err != nil || n != 12 {
		t.Fatalf("trim after the upgrade: %d, %v; want the 12 acknowledged", n, err)
	}
	if last, err := b.EventsLastSeq(ctx); err != nil || last != 20 {
		t.Fatalf("last sequence after the upgrade = %d, %v; want 20", last, err)
	}
}
