//go:build linux

package process_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/faultfs"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/pool"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/sandboxtest"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
)

func run(t *testing.T, tb *tools.Toolbox, cmd string) tools.ExecResult {
	t.Helper()
	res, err := tb.Exec(context.Background(), tools.ExecArgs{Command: cmd})
	if err != nil {
		t.Fatalf("shell.exec %q: %v", cmd, err)
	}
	return res
}

// TestStorageFaultsReachCommands: with a storage-fault layer attached, the
// workspace of a real process sandbox is one FUSE mount: io_latency meets both reads of
// coreutils' `cat`; files commands create belong to the sandbox user; a snapshot and a
// restore keep the layer; without it (before attach, after detach) there is no FUSE
// mount.
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

	f := sandboxtest.NewStorageFaulted(t, rt, 7)
	tb, id := f.Toolbox, f.ID
	if res := run(t, tb, fuseMounts); strings.TrimSpace(res.Stdout) != "1" {
		t.Fatalf("the faulted sandbox has %q FUSE mounts, want its workspace", res.Stdout)
	}
	f.Take()

	// What each kind does to a command, and that a seed fires the same faults every
	// time, is the storage-fault suite's (sandboxtest.StorageFaults, run on every runtime
	// by package runtimes); here what is the process runtime's own.
	res := run(t, tb, "cat slow/a.txt")
	if res.ExitCode != 0 || res.Stdout != "slow\n" {
		t.Errorf("cat slow/a.txt: exit %d, %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	// Two reads (the data, then end of file) of 150 ms each; only a lower bound, the
	// machine is shared.
	if res.Metering.WallTime < 250*time.Millisecond {
		t.Errorf("cat under io_latency took %v, want at least 300 ms", res.Metering.WallTime)
	}
	if got := f.Take(); len(got) != 2 || !strings.HasPrefix(got[0], "slow read /slow/a.txt") {
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
	if got := f.Take(); len(got) != 0 {
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
	f.Take()
	if res := run(t, tb, fuseMounts+"; echo y > full/g && cat full/g"); res.Stdout != "0\ny\n" {
		t.Errorf("after detach: %q %q", res.Stdout, res.Stderr)
	}
	if got := f.Take(); len(got) != 0 {
		t.Errorf("fired %q after detach", got)
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
	_, rules, err := plans.ParseSpec([]byte("name: ro\nfaults:\n  - {id: ro, kind: read_only}\n"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := p.Acquire(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.AttachStorageFaults(ctx, l.Handle.ID, faultfs.NewGate(inject.NewDecider(1, rules), nil, nil)); err != nil {
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

// TestStorageFaultsKeepModes: under a storage-fault layer a command's chmod holds as it
// does without one, mode 000 included: the mode reads back and the kernel enforces it.
func TestStorageFaultsKeepModes(t *testing.T) {
	rt := open(t, t.TempDir())
	f := sandboxtest.NewStorageFaulted(t, rt, 7)
	res := run(t, f.Toolbox, "mkdir dir && echo x > dir/f && chmod 000 dir/f && chmod 000 dir && stat -c %a dir; ls dir || echo refused; chmod 700 dir; stat -c %a dir/f; cat dir/f || echo refused")
	if want := "0\nrefused\n0\nrefused\n"; res.Stdout != want {
		t.Fatalf("chmod 000 under the layer: %q (stderr %q), want %q", res.Stdout, res.Stderr, want)
	}
}
