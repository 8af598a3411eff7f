package ctrd_test

import (
	"context"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/ctrd"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/pool"
)

// warmPool starts a pool of size ready containerd sandboxes of one template, "ws".
func warmPool(t testing.TB, rt *ctrd.Runtime, size int) *pool.Pool {
	t.Helper()
	p, err := pool.New(pool.Config{
		Runtime:      rt,
		Templates:    []pool.Template{{Name: "ws", Size: size, Spec: sandbox.Spec{Workspace: []sandbox.File{{Path: "task.txt", Data: []byte("fix me\n")}}}}},
		ReapInterval: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(context.Background()) })
	waitPoolReady(t, p, size)
	return p
}

func waitPoolReady(t testing.TB, p *pool.Pool, n int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if st, _ := p.Stats("ws"); st.Ready >= n {
			return
		}
		if time.Now().After(deadline) {
			st, _ := p.Stats("ws")
			t.Fatalf("pool: %d ready after 2 minutes, want %d", st.Ready, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestWarmPoolResetsContainerdSandboxes runs the shared warm pool (package pool) on
// the containerd runtime: a released sandbox comes back reset to the template.
func TestWarmPoolResetsContainerdSandboxes(t *testing.T) {
	_, rt := start(t)
	p := warmPool(t, rt, 1)
	ctx := context.Background()
	l, err := p.Acquire(ctx, "ws")
	if err != nil || !l.Warm {
		t.Fatalf("acquire: warm %v, %v", l != nil && l.Warm, err)
	}
	res := run(t, rt, l.Handle.ID, sh("cat task.txt; echo dirty > task.txt; echo x > extra", 10*time.Second))
	if string(res.Stdout) != "fix me\n" {
		t.Fatalf("template workspace: %q", res.Stdout)
	}
	id := l.Handle.ID
	if err := l.Release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}
	waitPoolReady(t, p, 1)
	l, err = p.Acquire(ctx, "ws")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Discard(ctx)
	if l.Handle.ID != id {
		t.Logf("got another sandbox (%s, released %s)", l.Handle.ID, id)
	}
	res = run(t, rt, l.Handle.ID, sh("cat task.txt; ls", 10*time.Second))
	if string(res.Stdout) != "fix me\ntask.txt\n" {
		t.Fatalf("after release and re-acquire: %q, want the template's workspace", res.Stdout)
	}
}
