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
	b := Connect(t, bus.ServerConfig{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := b.EnsureStreams(context.Background(), bus.DefaultStreamConfig()); err != nil {
		t.Fatalf("create streams: %v", err)
	}
	return b
}

// Connect starts an embedded server configured by cfg (in-process only, its store in
// the test's temp dir unless cfg names one) and returns a bus connected to it, with no
// streams created yet: for tests of the streams themselves. log receives both.
func Connect(t testing.TB, cfg bus.ServerConfig, log *slog.Logger) *bus.Bus {
	t.Helper()
	if cfg.StoreDir == "" {
		cfg.StoreDir = t.TempDir()
	}
	cfg.Port = -1
	srv := bus.NewServer(cfg, log)
	if err := srv.Starting(context.Background()); err != nil {
		t.Fatalf("start embedded NATS: %v", err)
	}
	t.Cleanup(func() { _ = srv.Stopping(context.Background()) })
	b, err := bus.Connect("", t.Name(), log, srv.ConnectOption())
	if err != nil {
		t.Fatalf("connect to embedded NATS: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}
