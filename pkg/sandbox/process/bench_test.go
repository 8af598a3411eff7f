//go:build linux

package process_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/pool"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/process"
)

// The benchmarks report, besides Go's mean ns/op, the median and p90 of the timed
// operation (median-ns, p90-ns): the host is shared and noisy, and medians say more.
// Run them side by side with:
//
//	go test -run '^$' -bench . -benchtime 50x ./pkg/sandbox/process/

type samples []time.Duration

func (s *samples) time(f func()) {
	t := time.Now()
	f()
	*s = append(*s, time.Since(t))
}

func (s samples) report(b *testing.B) {
	if len(s) == 0 {
		return
	}
	slices.Sort(s)
	b.ReportMetric(float64(s[len(s)/2].Nanoseconds()), "median-ns")
	b.ReportMetric(float64(s[len(s)*9/10].Nanoseconds()), "p90-ns")
}

func benchRuntime(b *testing.B) *process.Runtime {
	b.Helper()
	rt := open(b, b.TempDir())
	b.Cleanup(func() {
		_ = rt.Purge(context.Background())
		rt.Close()
	})
	return rt
}

// must(f())(b) returns f's value, failing b on f's error.
func must[T any](v T, err error) func(b *testing.B) T {
	return func(b *testing.B) T {
		b.Helper()
		if err != nil {
			b.Fatal(err)
		}
		return v
	}
}

var trueReq = sandbox.ExecRequest{Argv: []string{"true"}}

// BenchmarkColdCreate: Create until the sandbox is ready (volume, overlay, cgroup).
func BenchmarkColdCreate(b *testing.B) {
	rt := benchRuntime(b)
	ctx := context.Background()
	var s samples
	for b.Loop() {
		var h sandbox.Handle
		s.time(func() { h = must(rt.Create(ctx, sandbox.Spec{}))(b) })
		b.StopTimer()
		_ = rt.Destroy(ctx, h.ID)
		b.StartTimer()
	}
	s.report(b)
}

// BenchmarkColdCreateExec: Create plus the first command (true) to completion.
func BenchmarkColdCreateExec(b *testing.B) {
	rt := benchRuntime(b)
	ctx := context.Background()
	var s samples
	for b.Loop() {
		var h sandbox.Handle
		s.time(func() {
			h = must(rt.Create(ctx, sandbox.Spec{}))(b)
			must(rt.Exec(ctx, h.ID, trueReq))(b)
		})
		b.StopTimer()
		_ = rt.Destroy(ctx, h.ID)
		b.StartTimer()
	}
	s.report(b)
}

// BenchmarkWarmAcquire: Acquire from a pool holding ready sandboxes (a hit). Release (a
// workspace restore) runs outside the timer.
func BenchmarkWarmAcquire(b *testing.B) {
	rt := benchRuntime(b)
	ctx := context.Background()
	p := must(pool.New(pool.Config{Runtime: rt, Templates: []pool.Template{{Name: "t", Size: 2}}, MaxSandboxes: 2}))(b)
	if err := p.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer p.Stop(ctx)
	for st, _ := p.Stats("t"); st.Ready < 2; st, _ = p.Stats("t") {
		time.Sleep(time.Millisecond)
	}
	var s samples
	for b.Loop() {
		var l *pool.Lease
		s.time(func() { l = must(p.Acquire(ctx, "t"))(b) })
		b.StopTimer()
		if !l.Warm {
			b.Fatal("miss")
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	s.report(b)
}

// BenchmarkExec: one command (true) in an existing sandbox, round trip.
func BenchmarkExec(b *testing.B) {
	rt := benchRuntime(b)
	ctx := context.Background()
	h := must(rt.Create(ctx, sandbox.Spec{}))(b)
	var s samples
	for b.Loop() {
		s.time(func() { must(rt.Exec(ctx, h.ID, trueReq))(b) })
	}
	s.report(b)
}

// BenchmarkBaselineUnshare: the same command under a plain unshare(1) with the same
// namespaces, no cgroup, no user mapping, no seccomp, no mounts.
func BenchmarkBaselineUnshare(b *testing.B) {
	var s samples
	for b.Loop() {
		s.time(func() {
			if out, err := exec.Command("unshare", "--mount", "--uts", "--ipc", "--net", "--pid", "--fork", "true").CombinedOutput(); err != nil {
				b.Fatalf("unshare: %v %s", err, out)
			}
		})
	}
	s.report(b)
}

// BenchmarkBaselineBwrap: the same command under bare bubblewrap with the runtime's
// namespaces and a minimal root (no cgroup, no uid switch, no seccomp, no init script):
// how much of an exec is bubblewrap itself.
func BenchmarkBaselineBwrap(b *testing.B) {
	args := []string{"--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
		"--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
		"--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev", "/bin/true"}
	var s samples
	for b.Loop() {
		s.time(func() {
			if out, err := exec.Command("bwrap", args...).CombinedOutput(); err != nil {
				b.Fatalf("bwrap: %v %s", err, out)
			}
		})
	}
	s.report(b)
}

// BenchmarkBaselineForkExec: the same command with no isolation at all.
func BenchmarkBaselineForkExec(b *testing.B) {
	var s samples
	for b.Loop() {
		s.time(func() {
			if err := exec.Command("true").Run(); err != nil {
				b.Fatal(err)
			}
		})
	}
	s.report(b)
}

// fill writes 1,000 files of 50 KiB (50 MB) into dir, owned by the sandbox user.
func fill(b *testing.B, dir string, uid, gid int) {
	b.Helper()
	data := make([]byte, 50<<10)
	for i := range data {
		data[i] = byte(i)
	}
	for i := range 1000 {
		d := filepath.Join(dir, fmt.Sprintf("d%02d", i/50))
		if err := os.MkdirAll(d, 0o755); err != nil {
			b.Fatal(err)
		}
		p := filepath.Join(d, fmt.Sprintf("f%03d", i))
		if err := os.WriteFile(p, data, 0o644); err != nil {
			b.Fatal(err)
		}
		_ = os.Chown(p, uid, gid)
	}
}

// bigSandbox returns a sandbox whose workspace holds 50 MB in 1,000 files.
func bigSandbox(b *testing.B, rt *process.Runtime) sandbox.Handle {
	ctx := context.Background()
	h := must(rt.Create(ctx, sandbox.Spec{}))(b)
	ws := must(rt.WorkspaceDir(ctx, h.ID))(b)
	fill(b, ws, 100000, 100000)
	return h
}

// BenchmarkSnapshot50MB: Snapshot of a 50 MB / 1,000-file workspace. "fresh" freezes all
// 50 MB written since the last snapshot (rewritten outside the timer each time);
// "one-file" freezes a workspace where one file changed since the last snapshot.
func BenchmarkSnapshot50MB(b *testing.B) {
	ctx := context.Background()
	b.Run("fresh", func(b *testing.B) {
		rt := benchRuntime(b)
		var s samples
		for b.Loop() {
			b.StopTimer()
			h := bigSandbox(b, rt)
			b.StartTimer()
			s.time(func() { must(rt.Snapshot(ctx, h.ID))(b) })
			b.StopTimer()
			_ = rt.Destroy(ctx, h.ID)
			b.StartTimer()
		}
		s.report(b)
	})
	b.Run("one-file", func(b *testing.B) {
		rt := benchRuntime(b)
		h := bigSandbox(b, rt)
		must(rt.Snapshot(ctx, h.ID))(b)
		ws := must(rt.WorkspaceDir(ctx, h.ID))(b)
		var s samples
		for i := 0; b.Loop(); i++ {
			b.StopTimer()
			if err := os.WriteFile(filepath.Join(ws, "d00", "f000"), []byte(fmt.Sprint(i)), 0o644); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			s.time(func() { must(rt.Snapshot(ctx, h.ID))(b) })
		}
		s.report(b)
	})
}

// BenchmarkRestore50MB: Restore a sandbox to a snapshot of a 50 MB / 1,000-file
// workspace after one file changed.
func BenchmarkRestore50MB(b *testing.B) {
	ctx := context.Background()
	rt := benchRuntime(b)
	h := bigSandbox(b, rt)
	snap := must(rt.Snapshot(ctx, h.ID))(b)
	ws := must(rt.WorkspaceDir(ctx, h.ID))(b)
	var s samples
	for b.Loop() {
		b.StopTimer()
		if err := os.WriteFile(filepath.Join(ws, "d00", "f000"), []byte("changed"), 0o644); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		s.time(func() {
			if err := rt.Restore(ctx, h.ID, snap.ID); err != nil {
				b.Fatal(err)
			}
		})
	}
	s.report(b)
}

// BenchmarkFork50MB: Fork a new sandbox from a snapshot of a 50 MB / 1,000-file workspace.
func BenchmarkFork50MB(b *testing.B) {
	ctx := context.Background()
	rt := benchRuntime(b)
	h := bigSandbox(b, rt)
	snap := must(rt.Snapshot(ctx, h.ID))(b)
	var s samples
	for b.Loop() {
		var f sandbox.Handle
		s.time(func() { f = must(rt.Fork(ctx, snap.ID))(b) })
		b.StopTimer()
		_ = rt.Destroy(ctx, f.ID)
		b.StartTimer()
	}
	s.report(b)
}

// BenchmarkBaselineCopy50MB: what a snapshot by copying costs: cp -a of the same 50 MB /
// 1,000 files, tmpfs to tmpfs.
func BenchmarkBaselineCopy50MB(b *testing.B) {
	dir := b.TempDir()
	src := filepath.Join(dir, "src")
	tmp := exec.Command("mount", "-t", "tmpfs", "-o", "size=256m", "bench", dir)
	if out, err := tmp.CombinedOutput(); err != nil {
		b.Fatalf("mount tmpfs: %v %s", err, out)
	}
	defer exec.Command("umount", dir).Run()
	fill(b, src, 0, 0)
	var s samples
	for i := 0; b.Loop(); i++ {
		dst := filepath.Join(dir, fmt.Sprint("dst", i))
		s.time(func() {
			if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
				b.Fatalf("cp: %v %s", err, out)
			}
		})
		b.StopTimer()
		_ = os.RemoveAll(dst)
		b.StartTimer()
	}
	s.report(b)
}
