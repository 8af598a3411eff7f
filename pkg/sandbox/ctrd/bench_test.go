package ctrd_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/ctrd"
)

// BenchmarkContainerd measures the runtime's operations side by side with the bare
// baselines in one run against one private containerd (docs/benchmarks.md):
//
//	go test -run '^$' -bench BenchmarkContainerd -benchtime 20x ./pkg/sandbox/ctrd/
func BenchmarkContainerd(b *testing.B) {
	srv, rt := start(b)
	ctx := context.Background()
	trueReq := sandbox.ExecRequest{Argv: []string{"true"}}

	b.Run("ColdCreate", func(b *testing.B) {
		// The commands' cgroup step of each start (cmdcgroup.go), reported apart.
		var cg []time.Duration
		ctrd.SetPhaseHook(rt, func(ph ctrd.Phases) { cg = append(cg, ph.Cgroup) })
		defer ctrd.SetPhaseHook(rt, nil)
		for b.Loop() {
			h, err := rt.Create(ctx, sandbox.Spec{})
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if err := rt.Destroy(ctx, h.ID); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		if len(cg) > 0 {
			slices.Sort(cg)
			b.ReportMetric(float64(cg[len(cg)/2].Microseconds()), "cgroup-µs(median)")
		}
	})
	b.Run("CreateExecDestroy", func(b *testing.B) {
		for b.Loop() {
			h, err := rt.Create(ctx, sandbox.Spec{})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := rt.Exec(ctx, h.ID, trueReq); err != nil {
				b.Fatal(err)
			}
			if err := rt.Destroy(ctx, h.ID); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("BaselineCtrRun", func(b *testing.B) {
		// The same image and command through containerd's own CLI: snapshot, container,
		// task, wait, delete.
		i := 0
		for b.Loop() {
			i++
			out, err := exec.Command("ctr", "-a", srv.Address(), "-n", ctrd.DefaultNamespace, "run", "--rm",
				ctrd.BaseImage, fmt.Sprintf("ctr-bench-%d", i), "/bin/true").CombinedOutput()
			if err != nil {
				b.Fatalf("ctr run: %v: %s", err, out)
			}
		}
	})

	b.Run("WarmAcquire", func(b *testing.B) {
		// A ready sandbox from the warm pool (package pool); release, reset and refill
		// are outside the timer.
		p := warmPool(b, rt, 2)
		for b.Loop() {
			l, err := p.Acquire(ctx, "ws")
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if !l.Warm {
				b.Fatal("acquire missed the pool")
			}
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
			waitPoolReady(b, p, 2)
			b.StartTimer()
		}
		b.StopTimer()
		_ = p.Stop(ctx)
	})

	h := mustCreate(b, rt, sandbox.Spec{})
	b.Run("ExecRoundTrip", func(b *testing.B) {
		for b.Loop() {
			if _, err := rt.Exec(ctx, h.ID, trueReq); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("BaselineTaskExec", func(b *testing.B) {
		// The same command through containerd's task exec (a runc exec each time).
		c, err := srv.Client(ctrd.DefaultNamespace)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		nctx := namespaces.WithNamespace(ctx, ctrd.DefaultNamespace)
		ctr, err := c.LoadContainer(nctx, h.ID)
		if err != nil {
			b.Fatal(err)
		}
		task, err := ctr.Task(nctx, nil)
		if err != nil {
			b.Fatal(err)
		}
		i := 0
		for b.Loop() {
			i++
			p, err := task.Exec(nctx, fmt.Sprintf("x%d", i), &specs.Process{Args: []string{"/bin/true"}, Cwd: "/"}, cio.NullIO)
			if err != nil {
				b.Fatal(err)
			}
			st, err := p.Wait(nctx)
			if err != nil {
				b.Fatal(err)
			}
			if err := p.Start(nctx); err != nil {
				b.Fatal(err)
			}
			<-st
			if _, err := p.Delete(nctx); err != nil {
				b.Fatal(err)
			}
		}
	})

	// A 50 MB workspace of 1,000 files of 50 KiB, written from the host.
	ws := mustCreate(b, rt, sandbox.Spec{})
	dir, err := rt.WorkspaceDir(ctx, ws.ID)
	if err != nil {
		b.Fatal(err)
	}
	// The same files on the host, on the daemon's root tmpfs, for the cp baseline.
	hostCopy := filepath.Join(srv.Dir(), "root", "bench-src")
	blob := make([]byte, 50<<10)
	for i := range blob {
		blob[i] = byte(i * 7)
	}
	for _, root := range []string{dir, hostCopy} {
		for i := range 1000 {
			sub := filepath.Join(root, fmt.Sprintf("d%02d", i/50))
			if err := os.MkdirAll(sub, 0o755); err != nil {
				b.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%04d", i)), blob, 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
	snap, err := rt.Snapshot(ctx, ws.ID)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("Snapshot50MB", func(b *testing.B) {
		for b.Loop() {
			s, err := rt.Snapshot(ctx, ws.ID)
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if err := rt.DeleteSnapshot(ctx, s.ID); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	})
	b.Run("Restore50MB", func(b *testing.B) {
		for b.Loop() {
			if err := rt.Restore(ctx, ws.ID, snap.ID); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Fork50MB", func(b *testing.B) {
		for b.Loop() {
			f, err := rt.Fork(ctx, snap.ID)
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if err := rt.Destroy(ctx, f.ID); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	})
	b.Run("BaselineCp50MB", func(b *testing.B) {
		// Copying the same workspace with cp -a within the same filesystem (the
		// daemon's root tmpfs): the floor under a copy-based snapshot.
		tmp := filepath.Join(srv.Dir(), "root", "bench-cp")
		if err := os.MkdirAll(tmp, 0o700); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			dst := filepath.Join(tmp, "ws")
			if out, err := exec.Command("cp", "-a", hostCopy, dst).CombinedOutput(); err != nil {
				b.Fatalf("cp: %v: %s", err, out)
			}
			b.StopTimer()
			_ = os.RemoveAll(dst)
			b.StartTimer()
		}
	})
}
