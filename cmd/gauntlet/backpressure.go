package main

import (
	"context"
	"fmt"
	"sync"

	"go.opentelemetry.io/otel/metric"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
)

// publishers are the process's bus connections, for the back-pressure metrics: each
// counts its own publishes refused for lack of room (bus.Bus.Stalls).
type publishers struct {
	mu    sync.Mutex
	conns []*bus.Bus
}

func (p *publishers) add(b *bus.Bus) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conns = append(p.conns, b)
}

// register declares the two metrics of waits for room in the events stream: a counter of
// refused tries, and how many publishes are waiting now (non-zero while producers are
// held back because the store is behind or the disk is full).
func (p *publishers) register(m metric.Meter) error {
	sum := func() (refused, waiting int64) {
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, b := range p.conns {
			r, w := b.Stalls()
			refused, waiting = refused+r, waiting+w
		}
		return refused, waiting
	}
	if _, err := m.Int64ObservableCounter("gauntlet_bus_publishes_refused_full_total",
		metric.WithDescription("Publish tries refused because a stream (or JetStream's storage) was full; each is retried after a bounded back-off."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			r, _ := sum()
			o.Observe(r)
			return nil
		})); err != nil {
		return fmt.Errorf("register gauntlet_bus_publishes_refused_full_total: %w", err)
	}
	if _, err := m.Int64ObservableGauge("gauntlet_bus_publishes_waiting_for_room",
		metric.WithDescription("Publishes waiting now because a stream (or JetStream's storage) is full."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			_, w := sum()
			o.Observe(w)
			return nil
		})); err != nil {
		return fmt.Errorf("register gauntlet_bus_publishes_waiting_for_room: %w", err)
	}
	return nil
}
