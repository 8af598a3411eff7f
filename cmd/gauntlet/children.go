package main

import (
	"context"
	"fmt"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/gauntlet-rl/gauntlet/pkg/childproc"
)

// children are the supervisors of the local servers (ClickHouse, the Temporal dev
// server, a private containerd) that this process runs, by name.
type children struct {
	mu   sync.Mutex
	sups map[string]*childproc.Supervisor
}

// add records a module's supervisor once its server has started.
func (c *children) add(module string, s *childproc.Supervisor) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sups == nil {
		c.sups = map[string]*childproc.Supervisor{}
	}
	c.sups[module] = s
}

// register declares gauntlet_child_restarts_total{child}: a server that keeps dying shows
// as a climbing count even while readiness flips between red and green too fast to see.
func (c *children) register(m metric.Meter) error {
	_, err := m.Int64ObservableCounter("gauntlet_child_restarts_total",
		metric.WithDescription("Restarts of a local server (clickhouse, temporal, containerd) after it exited unexpectedly, failed attempts included."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			c.mu.Lock()
			defer c.mu.Unlock()
			for name, s := range c.sups {
				o.Observe(s.Restarts(), metric.WithAttributes(attribute.String("child", name)))
			}
			return nil
		}))
	if err != nil {
		return fmt.Errorf("register gauntlet_child_restarts_total: %w", err)
	}
	return nil
}
