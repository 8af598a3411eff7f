package bus_test

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/bus/bustest"
)

// A stack without the store's bucket, or whose store never published, has no fact to
// offer (nil, no error): waiters then ask ClickHouse. Once published, the fact reads back.
func TestStoreProgressRoundTrip(t *testing.T) {
	ctx := context.Background()
	bare := bustest.Connect(t, bus.ServerConfig{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if kv, err := bare.StoreBucket(ctx); kv != nil || err != nil {
		t.Fatalf("no bucket: %v, %v; want nil, nil", kv, err)
	}

	b := bustest.Start(t)
	kv, err := b.StoreBucket(ctx)
	if err != nil || kv == nil {
		t.Fatalf("StoreBucket: %v, %v", kv, err)
	}
	if p, err := bus.GetStoreProgress(ctx, kv); p != nil || err != nil {
		t.Fatalf("nothing published: %v, %v; want nil, nil", p, err)
	}
	if err := bus.PutStoreProgress(ctx, kv, 42); err != nil {
		t.Fatal(err)
	}
	if p, err := bus.GetStoreProgress(ctx, kv); err != nil || p.GetWrittenSeq() != 42 || p.GetUpdatedAtUnixNano() == 0 {
		t.Fatalf("published 42, read %v, %v", p, err)
	}
	if last, err := b.EventsLastSeq(ctx); err != nil || last != 0 {
		t.Fatalf("EventsLastSeq of an empty stream = %d, %v", last, err)
	}
}
