package bus_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/bus/bustest"
)

// TestEventsStreamFitsTheStore: on a server that may store less than the events
// stream's configured size (an embedded server on a fuller disk), the stream is still
// created, capped to what the server can reserve, and a warning names both sizes.
func TestEventsStreamFitsTheStore(t *testing.T) {
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	const store = 256 << 20
	b := bustest.Connect(t, bus.ServerConfig{MaxStore: store}, log)
	ctx := context.Background()

	cfg := bus.DefaultStreamConfig()
	cfg.EventsMaxBytes = 1 << 30 // four times the store
	if err := b.EnsureStreams(ctx, cfg); err != nil {
		t.Fatalf("EnsureStreams on a %d-byte store: %v", store, err)
	}
	st, err := b.JS.Stream(ctx, bus.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.CachedInfo().Config.MaxBytes; got <= 0 || got > store {
		t.Errorf("events stream max_bytes = %d, want at most the store's %d", got, store)
	}
	if !strings.Contains(logs.String(), "configured_max_bytes=1073741824") {
		t.Errorf("no warning naming the configured size; logs:\n%s", logs.String())
	}
	// A second start with the same configuration succeeds again.
	if err := b.EnsureStreams(ctx, cfg); err != nil {
		t.Fatalf("second EnsureStreams: %v", err)
	}

	// A store too small for even the smallest size is an error naming the stream.
	cfg.EventsMaxBytes = 1 << 40
	tb := bustest.Connect(t, bus.ServerConfig{MaxStore: 8 << 20}, log)
	if err := tb.EnsureStreams(ctx, cfg); err == nil || !strings.Contains(err.Error(), "create stream "+bus.StreamEvents) {
		t.Errorf("EnsureStreams on an 8 MiB store: %v, want an error naming %s", err, bus.StreamEvents)
	}
}
