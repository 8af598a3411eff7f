package console

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// counter computes answers numbered from 1 on, each summarising episodes episodes.
type counter struct {
	calls    atomic.Int64
	episodes uint64
	// gate, when set, holds each computation until it is closed.
	gate chan struct{}
}

func (c *counter) compute(ctx context.Context) (any, uint64, error) {
	if c.gate != nil {
		select {
		case <-c.gate:
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		}
	}
	return int(c.calls.Add(1)), c.episodes, nil
}

func newTestCache(from uint64, refreshAfter time.Duration) *answerCache {
	return newAnswerCache(from, refreshAfter, time.Hour, func(string, error) {})
}

func TestCacheKeepsOnlyLargeAnswers(t *testing.T) {
	c := newTestCache(10, time.Hour)
	defer c.close()
	small, large := &counter{episodes: 9}, &counter{episodes: 10}
	for i := 1; i <= 3; i++ {
		v, err := c.get(context.Background(), "small", small.compute)
		if err != nil || v != i {
			t.Fatalf("small, get %d: %v, %v; want %d computed now", i, v, err, i)
		}
	}
	if v, err := c.get(context.Background(), "large", large.compute); err != nil || v != 1 {
		t.Fatalf("large, first get: %v, %v", v, err)
	}
	for range 3 {
		v, err := c.get(context.Background(), "large", large.compute)
		if k, ok := v.(cached); err != nil || !ok || k.v != 1 {
			t.Fatalf("large, later get: %#v, %v; want the kept 1", v, err)
		}
	}
	if n := large.calls.Load(); n != 1 {
		t.Errorf("large computed %d times, want 1", n)
	}
}

func TestCacheRefreshesInTheBackground(t *testing.T) {
	c := newTestCache(1, 20*time.Millisecond)
	defer c.close()
	a := &counter{episodes: 5}
	if _, err := c.get(context.Background(), "a", a.compute); err != nil {
		t.Fatal(err)
	}
	time.Sleep(30 * time.Millisecond)
	// Old enough: served as kept, and recomputed behind it.
	v, err := c.get(context.Background(), "a", a.compute)
	if k, ok := v.(cached); err != nil || !ok || k.v != 1 || k.age < 20*time.Millisecond {
		t.Fatalf("get after refreshAfter: %#v, %v; want the kept 1, at least 20ms old", v, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		v, _ := c.get(context.Background(), "a", a.compute)
		if k, ok := v.(cached); ok && k.v == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the refreshed answer never came: %#v", v)
		}
		time.Sleep(time.Millisecond)
	}
}

// A first computation slower than its request's timeout still ends, and the next
// request is served what it found: a large run's first look fails (504) once, not on
// every refresh of the page.
func TestCacheFirstComputationOutlivesItsRequest(t *testing.T) {
	c := newTestCache(1, time.Hour)
	defer c.close()
	a := &counter{episodes: 5, gate: make(chan struct{})}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := c.get(ctx, "a", a.compute); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("get while computing: %v, want the request's deadline", err)
	}
	close(a.gate)
	deadline := time.Now().Add(5 * time.Second)
	for {
		v, err := c.get(context.Background(), "a", a.compute)
		if err != nil {
			t.Fatal(err)
		}
		if k, ok := v.(cached); ok && k.v == 1 {
			break
		}
		if v == 1 && a.calls.Load() == 1 {
			break // the joined computation answered this request itself
		}
		if time.Now().After(deadline) {
			t.Fatalf("get after the computation: %#v", v)
		}
		time.Sleep(time.Millisecond)
	}
	if n := a.calls.Load(); n != 1 {
		t.Errorf("computed %d times, want 1", n)
	}
}

func TestCacheOneComputationAtATime(t *testing.T) {
	c := newTestCache(1, time.Hour)
	defer c.close()
	a := &counter{episodes: 5, gate: make(chan struct{})}
	var wg sync.WaitGroup
	vals := make([]any, 8)
	for i := range vals {
		wg.Add(1)
		go func() {
			defer wg.Done()
			vals[i], _ = c.get(context.Background(), "a", a.compute)
		}()
	}
	time.Sleep(20 * time.Millisecond)
	close(a.gate)
	wg.Wait()
	if n := a.calls.Load(); n != 1 {
		t.Errorf("8 requests at once computed %d times, want 1", n)
	}
	for i, v := range vals {
		if k, ok := v.(cached); v != 1 && (!ok || k.v != 1) {
			t.Errorf("request %d: %#v, want 1", i, v)
		}
	}
}

// Close ends a computation under way and waits for it.
func TestCacheCloseStopsComputations(t *testing.T) {
	c := newTestCache(1, time.Hour)
	a := &counter{episodes: 5, gate: make(chan struct{})}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	_, _ = c.get(ctx, "a", a.compute)
	done := make(chan struct{})
	go func() { c.close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("close did not end the computation under way")
	}
}
