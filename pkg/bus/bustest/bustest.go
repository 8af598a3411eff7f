// Package bustest starts gauntlet's bus for tests: an embedded JetStream server (file
// storage in the test's temp dir), one in-process connection, and gauntlet's streams and
// KV buckets, all stopped when the test ends. A server that cannot start fails the test.
package bustest

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
)

// Start returns a connected bus with gauntlet's streams and buckets created.
func Start(t testing.TB) *bus.Bus {
	t.Helper()
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv := bus.NewServer(bus.ServerConfig{StoreDir: t.TempDir(), Port: -1}, log)
	if err := srv.Starting(ctx); err != nil {
		t.Fatalf("start embedded NATS: %v", err)
	}
	t.Cleanup(func() { _ = srv.Stopping(context.Background()) })
	b, err := bus.Connect("", t.Name(), log, srv.ConnectOption())
	if err != nil {
		t.Fatalf("connect to embedded NATS: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	if err := b.EnsureStreams(ctx, bus.DefaultStreamConfig()); err != nil {
		t.Fatalf("create streams: %v", err)
	}
	return b
}
