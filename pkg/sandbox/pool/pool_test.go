package pool_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/pool"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/process"
)

func runtime(t testing.TB) *process.Runtime {
	t.Helper()
	rt, err := process.New(process.Config{StateDir: t.TempDir()})
	if err != nil {
		t.Fatalf("process runtime unavailable: %v", err)
	}
	t.Cleanup(func() {
		_ = rt.Purge(context.Background())
		rt.Close()
	})
	return rt
}

func newPool(t testing.TB, cfg pool.Config) *pool.Pool {
	t.Helper()
	p, err := pool.New(cfg)
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(context.Background()) })
	return p
}

// waitReady polls until the template has n ready sandboxes.
func waitReady(t testing.TB, p *pool.Pool, tpl string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, _ := p.Stats(tpl)
		if st.Ready >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("template %s: %d ready after 30s, want %d (%+v)", tpl, st.Ready, n, st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func sh(t *testing.T, rt sandbox.Runtime, id, script string) string {
	t.Helper()
	res, err := rt.Exec(context.Background(), id, sandbox.ExecRequest{Argv: []string{"sh", "-c", script}})
	if err != nil {
		t.Fatalf("%q: %v", script, err)
	}
	return string(res.Stdout)
}

func TestValidate(t *testing.T) {
	_, err := pool.New(pool.Config{Templates: []pool.Template{{Name: "a", Size: -1}, {Name: "a", Spec: sandbox.Spec{ID: "x"}}}})
	if !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("got %v, want ErrInvalid", err)
	}
	for _, want := range []string{"runtime: required", "size: -1 is negative", `"a" appears twice`, "spec.id: must be empty"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not say %q", err, want)
		}
	}
}

func TestWarmAcquireResetRefill(t *testing.T) {
	rt := runtime(t)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	p := newPool(t, pool.Config{
		Runtime: rt,
		Templates: []pool.Template{
			{Name: "py", Size: 2, Spec: sandbox.Spec{Workspace: []sandbox.File{{Path: "task.txt", Data: []byte("fix me")}}}},
			{Name: "cold", Size: 0},
		},
		Meter: mp.Meter("test"),
	})
	waitReady(t, p, "py", 2)
	ctx := context.Background()

	l, err := p.Acquire(ctx, "py")
	if err != nil {
		t.Fatal(err)
	}
	if !l.Warm || l.Template != "py" {
		t.Fatalf("lease %+v: want a warm py sandbox", l)
	}
	if got := sh(t, rt, l.Handle.ID, "cat task.txt; echo dirty > task.txt; echo x > extra"); got != "fix me" {
		t.Fatalf("template seed: %q", got)
	}
	// The pool refills behind the lease.
	waitReady(t, p, "py", 2)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("second release: %v", err)
	}
	// Full pool: the released sandbox was destroyed rather than kept beyond Size.
	if _, err := rt.Stats(ctx, l.Handle.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("released sandbox beyond the pool size: stats %v, want ErrNotFound", err)
	}

	// A template with no warm sandboxes is a miss.
	m, err := p.Acquire(ctx, "cold")
	if err != nil || m.Warm {
		t.Fatalf("cold acquire: %+v %v", m, err)
	}
	m.Discard(ctx)
	if _, err := p.Acquire(ctx, "nope"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("unknown template: %v", err)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					r, _ := dp.Attributes.Value("result")
					tpl, _ := dp.Attributes.Value("template")
					got[m.Name+"/"+tpl.AsString()+"/"+r.AsString()] += dp.Value
				}
			case metricdata.Gauge[int64]:
				for _, dp := range d.DataPoints {
					tpl, _ := dp.Attributes.Value("template")
					got[m.Name+"/"+tpl.AsString()] = dp.Value
				}
			}
		}
	}
	if got["gauntlet_pool_acquires_total/py/hit"] != 1 || got["gauntlet_pool_acquires_total/cold/miss"] != 1 {
		t.Errorf("acquire counters: %v", got)
	}
	if _, ok := got["gauntlet_pool_ready/py"]; !ok {
		t.Errorf("no ready gauge: %v", got)
	}
}

func TestCapAndReaper(t *testing.T) {
	rt := runtime(t)
	p := newPool(t, pool.Config{
		Runtime:      rt,
		Templates:    []pool.Template{{Name: "t", Size: 1}},
		MaxSandboxes: 2,
		MaxStarting:  1,
		LeaseTTL:     300 * time.Millisecond,
		ReapInterval: 20 * time.Millisecond,
	})
	waitReady(t, p, "t", 1)
	ctx := context.Background()
	a, err := p.Acquire(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	// The refill makes the second sandbox; a third cannot exist.
	waitReady(t, p, "t", 1)
	b, err := p.Acquire(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	// A third cannot exist before one comes back: an Acquire waits for that, here past
	// its deadline (well before the reaper's first pass).
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err = p.Acquire(short, "t")
	cancel()
	if !errors.Is(err, sandbox.ErrLimit) {
		t.Fatalf("third acquire over MaxSandboxes=2: %v, want ErrLimit", err)
	}
	// b is renewed, a leaks: the reaper destroys a only.
	deadline := time.Now().Add(20 * time.Second)
	for {
		if err := b.Renew(); err != nil {
			t.Fatalf("renew: %v", err)
		}
		if _, err := rt.Stats(ctx, a.Handle.ID); errors.Is(err, sandbox.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("leaked lease not reaped")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := a.Renew(); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("renew a reaped lease: %v", err)
	}
	if _, err := rt.Stats(ctx, b.Handle.ID); err != nil {
		t.Fatalf("renewed lease lost its sandbox: %v", err)
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	hs, _ := rt.List(ctx)
	if len(hs) != 0 {
		t.Fatalf("%d sandboxes left after Stop", len(hs))
	}
}

func TestReleaseResets(t *testing.T) {
	rt := runtime(t)
	// One sandbox at most: the refill cannot race the release, which must reset and keep
	// the sandbox.
	p := newPool(t, pool.Config{
		Runtime:      rt,
		Templates:    []pool.Template{{Name: "py", Size: 1, Spec: sandbox.Spec{Workspace: []sandbox.File{{Path: "task.txt", Data: []byte("fix me")}}}}},
		MaxSandboxes: 1,
	})
	waitReady(t, p, "py", 1)
	ctx := context.Background()
	for round := range 3 {
		a, err := p.Acquire(ctx, "py")
		if err != nil {
			t.Fatal(err)
		}
		if !a.Warm {
			t.Fatalf("round %d: not warm", round)
		}
		if got := sh(t, rt, a.Handle.ID, "cat task.txt; ls"); got != "fix metask.txt\n" {
			t.Fatalf("round %d: acquired sandbox not reset: %q", round, got)
		}
		sh(t, rt, a.Handle.ID, "echo dirty > task.txt; mkdir junk")
		if err := a.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if st, _ := p.Stats("py"); st.Ready != 1 {
			t.Fatalf("round %d: after release %+v, want the sandbox ready again", round, st)
		}
	}
}

// TestAcquireWaitsAtTheCap: an Acquire at MaxSandboxes waits for a sandbox to come back
// instead of failing, so a worker running more episodes than the pool may hold slows down
// rather than recording the surplus as infra errors. Only its context bounds the wait.
func TestAcquireWaitsAtTheCap(t *testing.T) {
	rt := runtime(t)
	p := newPool(t, pool.Config{
		Runtime:      rt,
		Templates:    []pool.Template{{Name: "t", Size: 1}},
		MaxSandboxes: 2,
	})
	waitReady(t, p, "t", 1)
	ctx := context.Background()
	a, err := p.Acquire(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Acquire(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	// A deadline ends the wait with both reasons.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err = p.Acquire(short, "t")
	cancel()
	if !errors.Is(err, sandbox.ErrLimit) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("acquire at the cap past its deadline: %v, want ErrLimit and DeadlineExceeded", err)
	}
	// Waiters get the sandboxes given back, by release (reset) or by discard (room to
	// create one).
	got := make(chan error, 2)
	for range 2 {
		go func() {
			l, err := p.Acquire(ctx, "t")
			if err == nil {
				err = l.Release(ctx)
			}
			got <- err
		}()
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Discard(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-got; err != nil {
			t.Fatalf("waiting acquire: %v", err)
		}
	}
	// Stop wakes a waiter with ErrClosed.
	c, err := p.Acquire(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	d, err := p.Acquire(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		_, err := p.Acquire(ctx, "t")
		got <- err
	}()
	time.Sleep(20 * time.Millisecond) // let it wait; a late start still sees the stop
	if err := p.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; !errors.Is(err, sandbox.ErrClosed) {
		t.Fatalf("acquire waiting at Stop: %v, want ErrClosed", err)
	}
	_, _ = c.Release(ctx), d.Release(ctx)
}

// TestAddTemplate: a template added to a running pool is filled and served warm like
// those it started with, a name it knows is refused, and the cap grows with it.
func TestAddTemplate(t *testing.T) {
	rt := runtime(t)
	p := newPool(t, pool.Config{Runtime: rt, Templates: []pool.Template{{Name: "first", Size: 0}}})
	ctx := context.Background()
	spec := sandbox.Spec{Workspace: []sandbox.File{{Path: "task.txt", Data: []byte("added")}}}
	if err := p.AddTemplate(pool.Template{Name: "added", Size: 2, Spec: spec}); err != nil {
		t.Fatal(err)
	}
	if err := p.AddTemplate(pool.Template{Name: "added", Size: 1}); !errors.Is(err, sandbox.ErrExists) {
		t.Errorf("adding a known name: %v, want ErrExists", err)
	}
	if err := p.AddTemplate(pool.Template{Name: "bad", Size: -1}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("adding a bad template: %v, want ErrInvalid", err)
	}
	waitReady(t, p, "added", 2)
	l, err := p.Acquire(ctx, "added")
	if err != nil {
		t.Fatal(err)
	}
	if !l.Warm || l.Template != "added" || l.Handle.Spec.Template != "added" {
		t.Errorf("lease %+v: want a warm sandbox of the added template", l)
	}
	if got := sh(t, rt, l.Handle.ID, "cat task.txt"); got != "added" {
		t.Errorf("the added template's workspace: %q", got)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.AddTemplate(pool.Template{Name: "late", Size: 1}); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("adding to a stopped pool: %v, want ErrClosed", err)
	}
}

// TestRemoveTemplate: a removed template's ready sandboxes and snapshot are destroyed at
// once, Acquire no longer knows it, a sandbox of it still leased is destroyed when
// released (never made ready again), the other templates go on, and the cap shrinks
// back.
func TestRemoveTemplate(t *testing.T) {
	rt := runtime(t)
	p := newPool(t, pool.Config{Runtime: rt, Templates: []pool.Template{{Name: "kept", Size: 1}}})
	ctx := context.Background()
	if err := p.AddTemplate(pool.Template{Name: "gone", Size: 2}); err != nil {
		t.Fatal(err)
	}
	waitReady(t, p, "gone", 2)
	waitReady(t, p, "kept", 1)
	out, err := p.Acquire(ctx, "gone")
	if err != nil {
		t.Fatal(err)
	}
	waitReady(t, p, "gone", 2) // refilled beside the lease
	snaps := func() int {
		t.Helper()
		s, err := rt.ListSnapshots(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return len(s)
	}
	if n := snaps(); n != 2 {
		t.Fatalf("%d template snapshots before the removal, want 2 (kept's and gone's)", n)
	}
	if err := p.RemoveTemplate(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	if _, ok := p.Stats("gone"); ok {
		t.Error("the removed template still has stats")
	}
	if _, err := p.Acquire(ctx, "gone"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("acquire of a removed template: %v, want ErrNotFound", err)
	}
	if err := p.RemoveTemplate(ctx, "gone"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("removing it twice: %v, want ErrNotFound", err)
	}
	if n := snaps(); n != 1 {
		t.Errorf("%d template snapshots after the removal, want 1 (kept's)", n)
	}
	// Only the lease and kept's ready sandbox are left.
	live := func() []sandbox.Handle {
		t.Helper()
		hs, err := rt.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return hs
	}
	if hs := live(); len(hs) != 2 {
		t.Errorf("%d sandboxes after the removal, want 2 (the lease and kept's ready one): %+v", len(hs), hs)
	}
	if err := out.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, h := range live() {
		if h.ID == out.Handle.ID {
			t.Errorf("the removed template's lease %s lives on after its release", h.ID)
		}
	}
	l, err := p.Acquire(ctx, "kept")
	if err != nil || !l.Warm {
		t.Fatalf("the kept template after the removal: %+v, %v; want a warm lease", l, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
