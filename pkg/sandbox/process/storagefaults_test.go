//go:build linux

package process_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/faultfs"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/pool"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/process"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
)

const storageSpec = `name: bad-disk
faults:
  - {id: full, kind: disk_full, match: {paths: ["/full/*"]}}
  - {id: ro, kind: read_only, match: {paths: ["/ro/*"]}}
  - {id: slow, kind: io_latency, match: {paths: ["/slow/*"], ops: [read]}, params: {mean_ms: 150, jitter_ms: 0}}
  - {id: coin, kind: disk_full, probability: 0.5, match: {paths: ["/coin/*"]}}
`

// recorder collects what a gate fires, from the FUSE server's goroutines.
type recorder struct {
	mu    sync.Mutex
	fired []string
}

func (r *recorder) onFire(_ string, ev faults.Event, fs []faults.Fired) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, f := range fs {
		r.fired = append(r.fired, f.RuleID+" "+ev.Op+" "+ev.Path+": "+f.Detail)
	}
}

func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.fired
	r.fired = nil
	return out
}

// faultedSandbox creates a sandbox and attaches a storage-fault layer deciding with seed.
func faultedSandbox(t *testing.T, rt *process.Runtime, seed uint64) (*tools.Toolbox, string, *recorder) {
	t.Helper()
	ctx := context.Background()
	_, rules, err := faults.ParseSpec([]byte(storageSpec))
	if err != nil {
		t.Fatal(err)
	}
	h, err := rt.Create(ctx, sandbox.Spec{Workspace: []sandbox.File{
		{Path: "full/.keep"}, {Path: "ro/keep.txt", Data: []byte("keep\n")},
		{Path: "slow/a.txt", Data: []byte("slow\n")}, {Path: "coin/.keep"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Destroy(context.Background(), h.ID) })
	rec := &recorder{}
	if err := rt.AttachStorageFaults(ctx, h.ID, faultfs.NewGate(faults.NewDecider(seed, rules), rec.onFire, nil)); err != nil {
		t.Fatalf("attach storage faults (FUSE must mount here): %v", err)
	}
	return tools.New(rt, h.ID, tools.Options{}), h.ID, rec
}

func run(t *testing.T, tb *tools.Toolbox, cmd string) tools.ExecResult {
	t.Helper()
	res, err := tb.Exec(context.Background(), tools.ExecArgs{Command: cmd})
	if err != nil {
		t.Fatalf("shell.exec %q: %v", cmd, err)
	}
	return res
}

// TestStorageFaultsReachCommands: with a storage-fault layer attached, commands
// run by shell.exec in a real process sandbox meet the plan's storage faults: ENOSPC on
// `echo x > f`, EROFS on `touch`, io_latency on `cat`; files they create belong to the
// sandbox user; without the layer (before attach, after detach) there is no FUSE mount.
func TestStorageFaultsReachCommands(t *testing.T) {
	rt := open(t, t.TempDir())
	ctx := context.Background()
	plain, err := rt.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Destroy(ctx, plain.ID)
	fuseMounts := "grep -c ' fuse' /proc/self/mountinfo || true"
	if res := run(t, tools.New(rt, plain.ID, tools.Options{}), fuseMounts); strings.TrimSpace(res.Stdout) != "0" {
		t.Fatalf("a sandbox without storage faults has %s FUSE mounts", res.Stdout)
	}

	tb, id, rec := faultedSandbox(t, rt, 7)
	if res := run(t, tb, fuseMounts); strings.TrimSpace(res.Stdout) != "1" {
		t.Fatalf("the faulted sandbox has %q FUSE mounts, want its workspace", res.Stdout)
	}
	rec.take()

	res := run(t, tb, "echo x > full/f")
	if res.ExitCode == 0 || !strings.Contains(res.Stderr, "No space left on device") {
		t.Errorf("echo x > full/f: exit %d, stderr %q; want ENOSPC", res.ExitCode, res.Stderr)
	}
	if got := rec.take(); len(got) != 1 || !strings.HasPrefix(got[0], "full create /full/f") {
		t.Errorf("fired %q, want disk_full on create /full/f", got)
	}

	res = run(t, tb, "touch ro/new")
	if res.ExitCode == 0 || !strings.Contains(res.Stderr, "Read-only file system") {
		t.Errorf("touch ro/new: exit %d, stderr %q; want EROFS", res.ExitCode, res.Stderr)
	}
	if got := rec.take(); len(got) != 1 || !strings.HasPrefix(got[0], "ro create /ro/new") {
		t.Errorf("fired %q, want read_only on create /ro/new", got)
	}

	res = run(t, tb, "cat slow/a.txt")
	if res.ExitCode != 0 || res.Stdout != "slow\n" {
		t.Errorf("cat slow/a.txt: exit %d, %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	// Two reads (the data, then end of file) of 150 ms each; only a lower bound, the
	// machine is shared.
	if res.Metering.WallTime < 250*time.Millisecond {
		t.Errorf("cat under io_latency took %v, want at least 300 ms", res.Metering.WallTime)
	}
	if got := rec.take(); len(got) != 2 || !strings.HasPrefix(got[0], "slow read /slow/a.txt") {
		t.Errorf("fired %q, want io_latency on two reads of /slow/a.txt", got)
	}

	res = run(t, tb, "mkdir -p src/pkg && echo ok > src/pkg/ok.txt && cat src/pkg/ok.txt && ln -s ok.txt src/pkg/l && cat src/pkg/l && mv src/pkg/ok.txt src/pkg/ok2.txt && rm src/pkg/l && ls src/pkg && cp /usr/bin/true bin && ./bin && rm bin && echo ran")
	if res.ExitCode != 0 || res.Stdout != "ok\nok\nok2.txt\nran\n" {
		t.Errorf("ordinary commands through the layer: exit %d, %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	ws, _ := rt.WorkspaceDir(ctx, id)
	uid, gid, _ := rt.WorkspaceOwner(ctx, id)
	st, err := os.Stat(filepath.Join(ws, "src/pkg/ok2.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if s := st.Sys().(*syscall.Stat_t); int(s.Uid) != uid || int(s.Gid) != gid {
		t.Errorf("a file made through the layer belongs to %d:%d, want the sandbox user %d:%d", s.Uid, s.Gid, uid, gid)
	}
	if got := rec.take(); len(got) != 0 {
		t.Errorf("fired %q outside the faulted paths", got)
	}

	// A snapshot and a restore while attached keep working, and so does the layer.
	snap, err := rt.Snapshot(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	run(t, tb, "echo later > later.txt")
	if err := rt.Restore(ctx, id, snap.ID); err != nil {
		t.Fatal(err)
	}
	if res := run(t, tb, "ls; echo y > full/g"); strings.Contains(res.Stdout, "later.txt") || !strings.Contains(res.Stderr, "No space left") {
		t.Errorf("after restore: %q %q", res.Stdout, res.Stderr)
	}

	if err := rt.DetachStorageFaults(ctx, id); err != nil {
		t.Fatal(err)
	}
	rec.take()
	if res := run(t, tb, fuseMounts+"; echo y > full/g && cat full/g"); res.Stdout != "0\ny\n" {
		t.Errorf("after detach: %q %q", res.Stdout, res.Stderr)
	}
	if got := rec.take(); len(got) != 0 {
		t.Errorf("fired %q after detach", got)
	}
}

// TestStorageFaultsSameSeedSameFaults: a single-threaded command meets the same
// faults on the same seed, in the same order, and another seed differs.
func TestStorageFaultsSameSeedSameFaults(t *testing.T) {
	rt := open(t, t.TempDir())
	cmd := "for i in $(seq 1 16); do echo $i > coin/f$i || true; done 2>/dev/null; ls coin | wc -l"
	var traces [][]string
	for _, seed := range []uint64{7, 7, 8} {
		tb, _, rec := faultedSandbox(t, rt, seed)
		res := run(t, tb, cmd)
		fired := rec.take()
		creates := 0 // a file whose create failed does not exist; one whose write failed is empty
		for _, f := range fired {
			if strings.HasPrefix(f, "coin create ") {
				creates++
			}
		}
		if want := fmt.Sprint(16 - creates); strings.TrimSpace(res.Stdout) != want {
			t.Errorf("seed %d: %s files made, want %s (16 minus %d failed creates)", seed, strings.TrimSpace(res.Stdout), want, creates)
		}
		traces = append(traces, fired)
	}
	if len(traces[0]) == 0 || len(traces[0]) == 16 {
		t.Errorf("the coin (disk_full, probability 0.5) fired %d times on 16 files", len(traces[0]))
	}
	if !slices.Equal(traces[0], traces[1]) {
		t.Errorf("seed 7 twice fired different faults:\n%q\n%q", traces[0], traces[1])
	}
	if slices.Equal(traces[0], traces[2]) {
		t.Errorf("seeds 7 and 8 fired the same faults: %q", traces[0])
	}
}

// TestPoolReleaseDetachesStorageFaults: a sandbox going back to its pool leaves its
// episode's storage-fault layer behind; the next lease's commands meet no fault.
func TestPoolReleaseDetachesStorageFaults(t *testing.T) {
	rt := open(t, t.TempDir())
	ctx := context.Background()
	p, err := pool.New(pool.Config{Runtime: rt, Templates: []pool.Template{{Name: "t", Size: 1}}, MaxSandboxes: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop(ctx)
	deadline := time.Now().Add(30 * time.Second)
	for st, _ := p.Stats("t"); st.Ready < 1; st, _ = p.Stats("t") {
		if time.Now().After(deadline) {
			t.Fatal("the pool made no ready sandbox in 30 s")
		}
		time.Sleep(time.Millisecond) // the pool fills itself
	}
	_, rules, err := faults.ParseSpec([]byte("name: ro\nfaults:\n  - {id: ro, kind: read_only}\n"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := p.Acquire(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.AttachStorageFaults(ctx, l.Handle.ID, faultfs.NewGate(faults.NewDecider(1, rules), nil, nil)); err != nil {
		t.Fatalf("attach (FUSE must mount here): %v", err)
	}
	if res := run(t, tools.New(rt, l.Handle.ID, tools.Options{}), "touch x"); !strings.Contains(res.Stderr, "Read-only file system") {
		t.Fatalf("touch under read_only: %q", res.Stderr)
	}
	id := l.Handle.ID
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l, err = p.Acquire(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if l.Handle.ID != id {
		t.Fatalf("the pool handed out %s, not the released %s", l.Handle.ID, id)
	}
	if res := run(t, tools.New(rt, id, tools.Options{}), "touch x && grep -c ' fuse' /proc/self/mountinfo || true"); res.ExitCode != 0 || strings.TrimSpace(res.Stdout) != "0" {
		t.Fatalf("after release: exit %d %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
}
