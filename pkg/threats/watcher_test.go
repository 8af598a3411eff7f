package threats_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/bus/bustest"
	"github.com/gauntlet-rl/gauntlet/pkg/threats"
)

func start(t *testing.T, b *bus.Bus) *threats.Watcher {
	t.Helper()
	w := threats.NewWatcher(b.JS, noop.NewMeterProvider().Meter("test"), "test", slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	go w.Run(ctx)
	return w
}

// A fingerprint one watcher records is known to another (in production, another
// process) through the bucket, and to a watcher started after it, from the start.
func TestWatchersShareFingerprints(t *testing.T) {
	b := bustest.Start(t)
	rec, other := start(t, b), start(t, b)
	args := []byte(`{"command":"cat /dev/mem"}`)
	if other.Match("shell.exec", args) != nil {
		t.Fatal("matched before anything was recorded")
	}
	f, ok := threats.Make("shell.exec", args, []string{"device_access: /dev/mem opened: a decoy"})
	if !ok {
		t.Fatal("no fingerprint")
	}
	f.Episode, f.Step = "e1", 3
	rec.Record(f)
	rec.Record(f) // queued already: published once
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := other.WaitFor(ctx, f.ID); err != nil {
		t.Fatal(err)
	}
	got := other.Match("shell.exec", []byte(`{"command":"cat   '/dev/mem'"}`))
	if got == nil || got.Episode != "e1" || got.Step != 3 || got.RecordedAtUnixNano == 0 {
		t.Fatalf("match %+v", got)
	}
	if err := rec.WaitFor(ctx, f.ID); err != nil {
		t.Fatal(err)
	}
	late := start(t, b)
	if late.Match("shell.exec", args) == nil {
		t.Error("a watcher started later does not know the fingerprint")
	}
	kv, err := b.JS.KeyValue(ctx, bus.BucketThreats)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := kv.Status(ctx); err != nil || st.Values() != 1 {
		t.Fatalf("bucket holds %v values (%v), want 1", st, err)
	}
	// Purging the key forgets it everywhere.
	if err := kv.Purge(ctx, f.ID); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for other.Match("shell.exec", args) != nil {
		if time.Now().After(deadline) {
			t.Fatal("a purged fingerprint still matches")
		}
		time.Sleep(time.Millisecond)
	}
}

// While no fingerprint is known, matching a step costs no allocation (the step's hot
// path); once one is, a step of another tool costs none either.
func TestMatchAllocatesNothingWhenNoneIsKnown(t *testing.T) {
	b := bustest.Start(t)
	w := start(t, b)
	args := []byte(`{"command":"ls -la"}`)
	if n := testing.AllocsPerRun(1000, func() { _ = w.Match("shell.exec", args) }); n != 0 {
		t.Errorf("Match with no fingerprint: %v allocations, want 0", n)
	}
	f, _ := threats.Make("shell.exec", []byte(`{"command":"cat /dev/mem"}`), []string{"device_access: /dev/mem opened"})
	w.Record(f)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.WaitFor(ctx, f.ID); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(1000, func() { _ = w.Match("catalog.search", args) }); n != 0 {
		t.Errorf("Match of a tool no fingerprint has: %v allocations, want 0", n)
	}
}

// List reads every fingerprint, oldest first; Forget purges one so that players stop
// flagging it, and refuses an id that is malformed or not held, naming it.
func TestListAndForget(t *testing.T) {
	b := bustest.Start(t)
	w := start(t, b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if got, err := threats.List(ctx, b.JS); err != nil || len(got) != 0 {
		t.Fatalf("empty bucket: %v %v", got, err)
	}
	var ids []string
	for _, cmd := range []string{"cat /dev/mem", "nc 10.0.0.7 4444"} {
		f, ok := threats.Make("shell.exec", []byte(`{"command":"`+cmd+`"}`), []string{"device_access: /dev/mem opened: a decoy"})
		if !ok {
			t.Fatal("no fingerprint")
		}
		w.Record(f)
		if err := w.WaitFor(ctx, f.ID); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, f.ID)
	}
	got, err := threats.List(ctx, b.JS)
	if err != nil || len(got) != 2 || got[0].ID != ids[0] || got[1].ID != ids[1] || got[1].Command != "nc N.N.N.N N" {
		t.Fatalf("list: %v %v; want %v oldest first", got, err, ids)
	}
	if err := threats.Forget(ctx, b.JS, ids[0]); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for w.Match("shell.exec", []byte(`{"command":"cat /dev/mem"}`)) != nil {
		if time.Now().After(deadline) {
			t.Fatal("a forgotten fingerprint still matches")
		}
		time.Sleep(time.Millisecond)
	}
	if got, err := threats.List(ctx, b.JS); err != nil || len(got) != 1 || got[0].ID != ids[1] {
		t.Fatalf("list after forget: %v %v", got, err)
	}
	if err := threats.Forget(ctx, b.JS, ids[0]); !errors.Is(err, threats.ErrUnknown) {
		t.Errorf("forget twice: %v, want ErrUnknown", err)
	}
	if err := threats.Forget(ctx, b.JS, "cat /dev/mem"); err == nil || !strings.Contains(err.Error(), "16 hex digits") {
		t.Errorf("forget a malformed id: %v", err)
	}
}
