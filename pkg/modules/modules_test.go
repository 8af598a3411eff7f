package modules

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/lifecycle"
)

type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) add(s string) {
	r.mu.Lock()
	r.events = append(r.events, s)
	r.mu.Unlock()
}

func (r *recorder) module(name string, startErr, runErr error) InitFunc {
	return func() (lifecycle.Service, error) {
		return lifecycle.Funcs{
			OnStarting: func(context.Context) error { r.add("start " + name); return startErr },
			OnRunning: func(ctx context.Context) error {
				if runErr != nil {
					return runErr
				}
				<-ctx.Done()
				return nil
			},
			OnStopping: func(context.Context) error { r.add("stop " + name); return nil },
		}, nil
	}
}

func newManager() *Manager {
	return New(slog.New(slog.NewTextHandler(io.Discard, nil)), 5*time.Second)
}

func TestOrderDependenciesFirst(t *testing.T) {
	m := newManager()
	r := &recorder{}
	m.Register("bus", r.module("bus", nil, nil))
	m.Register("worker", r.module("worker", nil, nil), "bus")
	m.Register("store", r.module("store", nil, nil), "bus")
	m.RegisterVirtual("all", "worker", "store")
	got, err := m.Order([]string{"all"})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != "bus,worker,store,all" {
		t.Fatalf("order = %v", got)
	}
}

func TestOrderErrors(t *testing.T) {
	m := newManager()
	m.RegisterVirtual("a", "b")
	m.RegisterVirtual("b", "a")
	for _, tc := range []struct{ target, want string }{
		{"nope", `unknown module "nope"`},
		{"a", "cycle: a -> b -> a"},
	} {
		_, err := m.Order([]string{tc.target})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Order(%s) error = %v, want %q", tc.target, err, tc.want)
		}
	}
}

func TestRunStopsInReverseOnCancel(t *testing.T) {
	m := newManager()
	r := &recorder{}
	m.Register("bus", r.module("bus", nil, nil))
	m.Register("worker", r.module("worker", nil, nil), "bus")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- m.Run(ctx, []string{"worker"}) }()
	for m.Ready() != nil {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	want := "start bus,start worker,stop worker,stop bus"
	if got := strings.Join(r.events, ","); got != want {
		t.Fatalf("events = %s, want %s", got, want)
	}
}

func TestRunFailureStopsEverything(t *testing.T) {
	m := newManager()
	r := &recorder{}
	boom := errors.New("boom")
	m.Register("bus", r.module("bus", nil, nil))
	m.Register("worker", r.module("worker", nil, boom), "bus")
	err := m.Run(context.Background(), []string{"worker"})
	if !errors.Is(err, boom) {
		t.Fatalf("Run = %v, want boom", err)
	}
	if got := strings.Join(r.events, ","); got != "start bus,start worker,stop worker,stop bus" {
		t.Fatalf("events = %s", got)
	}
}

func TestStartFailureStopsStarted(t *testing.T) {
	m := newManager()
	r := &recorder{}
	m.Register("bus", r.module("bus", nil, nil))
	m.Register("store", r.module("store", errors.New("no clickhouse"), nil), "bus")
	err := m.Run(context.Background(), []string{"store"})
	if err == nil || !strings.Contains(err.Error(), "start module store: no clickhouse") {
		t.Fatalf("Run = %v", err)
	}
	if got := strings.Join(r.events, ","); got != "start bus,start store,stop store,stop bus" {
		t.Fatalf("events = %s", got)
	}
}

// A module whose run loop ends by itself, without an error, while the others run is a
// failure: the process stops and says which module, instead of running on without it.
func TestRunLoopEndingEarlyIsAFailure(t *testing.T) {
	m := newManager()
	r := &recorder{}
	m.Register("bus", r.module("bus", nil, nil))
	m.Register("worker", func() (lifecycle.Service, error) {
		return lifecycle.Funcs{
			OnStarting: func(context.Context) error { r.add("start worker"); return nil },
			OnRunning:  func(context.Context) error { return nil }, // quietly done
			OnStopping: func(context.Context) error { r.add("stop worker"); return nil },
		}, nil
	}, "bus")
	done := make(chan error, 1)
	go func() { done <- m.Run(context.Background(), []string{"worker"}) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "module worker failed: its run loop returned before the stop") {
			t.Fatalf("Run = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run kept going after the worker's run loop ended")
	}
	if got := strings.Join(r.events, ","); got != "start bus,start worker,stop worker,stop bus" {
		t.Fatalf("events = %s", got)
	}
}

// A running module whose service says it cannot work (its child server is down) makes
// Ready name it with the reason and States call it unready, until it can again.
func TestReadyAsksReadiers(t *testing.T) {
	m := newManager()
	var mu sync.Mutex
	var down error
	m.Register("bus", func() (lifecycle.Service, error) { return lifecycle.Funcs{}, nil })
	m.Register("clickhouse", func() (lifecycle.Service, error) {
		return lifecycle.Funcs{OnReady: func() error {
			mu.Lock()
			defer mu.Unlock()
			return down
		}}, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- m.Run(ctx, []string{"bus", "clickhouse"}) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	}()
	for m.Ready() != nil {
		time.Sleep(time.Millisecond)
	}
	mu.Lock()
	down = errors.New("clickhouse exited unexpectedly (signal: killed)")
	mu.Unlock()
	err := m.Ready()
	if err == nil || err.Error() != "clickhouse is not ready: clickhouse exited unexpectedly (signal: killed)" {
		t.Fatalf("Ready with clickhouse down = %v", err)
	}
	if st := m.States(); st["clickhouse"] != StateUnready || st["bus"] != StateRunning {
		t.Fatalf("States with clickhouse down = %v", st)
	}
	mu.Lock()
	down = nil
	mu.Unlock()
	if err := m.Ready(); err != nil {
		t.Fatalf("Ready with clickhouse back = %v", err)
	}
	if st := m.States(); st["clickhouse"] != StateRunning {
		t.Fatalf("States with clickhouse back = %v", st)
	}
}
