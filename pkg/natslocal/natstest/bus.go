package natstest

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/natslocal"
)

// Bus connects a bus to c and creates gauntlet's streams on it at replicas, the events
// stream capped at eventsMaxBytes (0: bus.DefaultStreamConfig's cap, more than a test
// cluster's file store holds). The bus is closed when the test ends, before the cluster
// stops.
func Bus(ctx context.Context, t testing.TB, c *natslocal.Cluster, replicas int, eventsMaxBytes int64) *bus.Bus {
	t.Helper()
	b, err := bus.Connect(c.URL(), "test", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	cfg := bus.DefaultStreamConfig()
	cfg.Replicas = replicas
	if eventsMaxBytes > 0 {
		cfg.EventsMaxBytes = eventsMaxBytes
	}
	if err := b.EnsureStreams(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	return b
}
