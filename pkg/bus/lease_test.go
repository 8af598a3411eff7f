package bus_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/bus/bustest"
)

// One holder at a time: a second instance waits while the first renews, takes the lease
// at once when it is released, and within about LeaseTTL when its holder dies without
// releasing it; a holder whose lease another took is told at once.
func TestLeaseHasOneHolder(t *testing.T) {
	b := bustest.Start(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, c := b.NewLease("role", "a", log), b.NewLease("role", "c", log)
	if err := a.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	hctx, stopA := context.WithCancel(ctx)
	held := make(chan error, 1)
	go func() { held <- a.Hold(hctx, func() {}) }()

	// While a renews, c waits, across several renewals and past the TTL.
	wctx, wcancel := context.WithTimeout(ctx, bus.LeaseTTL+time.Second)
	err := c.Acquire(wctx)
	wcancel()
	if !errors.Is(err, context.DeadlineExceeded) || !a.Held() {
		t.Fatalf("second instance's Acquire while the first holds it: %v (first holds: %v)", err, a.Held())
	}

	// Released: c takes it at once.
	stopA()
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	if err := c.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(begin); took > bus.LeaseTTL/2 {
		t.Errorf("took a released lease after %v", took)
	}

	// c dies holding it (no renewal, no release): a takes it once the entry expires.
	begin = time.Now()
	if err := a.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(begin); took < bus.LeaseTTL/2 || took > 2*bus.LeaseTTL {
		t.Errorf("took a dead holder's lease after %v, want about %v", took, bus.LeaseTTL)
	}

	// c, back and still believing it holds the lease, learns it lost it on its next renewal.
	lost := make(chan struct{})
	if err := c.Hold(ctx, func() { close(lost) }); !errors.Is(err, bus.ErrLeaseLost) {
		t.Fatalf("Hold of a lease another took: %v, want ErrLeaseLost", err)
	}
	select {
	case <-lost:
	default:
		t.Fatal("Hold returned ErrLeaseLost without calling lost")
	}
	if c.Held() {
		t.Error("a lost lease still counts as held")
	}
}
