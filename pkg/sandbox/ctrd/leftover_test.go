package ctrd_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/ctrdlocal/ctrdtest"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/ctrd"
)

// quotaMounts counts the disk quota tmpfs mounts in the mount namespace of process pid.
func quotaMounts(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), " gauntlet-disk ")
}

// cgroupsOf lists sandbox id's cgroup directories in every hierarchy.
func cgroupsOf(id string) []string {
	m, _ := filepath.Glob("/sys/fs/cgroup/*" + ctrd.DefaultCgroupParent + "/*-" + id)
	n, _ := filepath.Glob("/sys/fs/cgroup" + ctrd.DefaultCgroupParent + "/*-" + id)
	return append(m, n...)
}

// TestLeftoversOfAnEarlierRuntime: a runtime over the state directory of one that went
// away without destroying its sandboxes (a crashed worker) recovers one of them, whose
// workspace (on its disk quota tmpfs) snapshots and forks as before, and destroys the
// other without recovering it: its processes, cgroups and disk quota mount go, not only
// its record.
func TestLeftoversOfAnEarlierRuntime(t *testing.T) {
	srv := ctrdtest.Start(t)
	ctx := context.Background()
	dir := t.TempDir()
	first := open(t, srv, dir)
	keep, err := first.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	gone, err := first.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	run(t, first, keep.ID, sh("echo kept > /workspace/f", 10*time.Second))
	mounts := quotaMounts(t, srv.Pid())
	if mounts < 2 {
		t.Fatalf("%d disk quota mounts in the daemon's namespace for two sandboxes", mounts)
	}
	var agent string // the leftover's processes: its agent
	for _, cg := range cgroupsOf(gone.ID) {
		if b, err := os.ReadFile(filepath.Join(cg, "cgroup.procs")); err == nil && agent == "" {
			agent = strings.TrimSpace(string(b))
		}
	}
	if agent == "" || strings.Contains(agent, "\n") {
		t.Fatalf("no process in the cgroups %v of sandbox %s", cgroupsOf(gone.ID), gone.ID)
	}
	_ = first.Close() // the crash: nothing destroyed

	second := open(t, srv, dir)
	t.Cleanup(func() { _ = second.Close() })
	hs, err := second.List(ctx)
	if err != nil || len(hs) != 2 {
		t.Fatalf("List after a restart: %d handles, %v; want 2", len(hs), err)
	}
	if err := second.Recover(ctx, keep); err != nil {
		t.Fatalf("recover: %v", err)
	}
	t.Cleanup(func() { _ = second.Destroy(ctx, keep.ID) })
	snap, err := second.Snapshot(ctx, keep.ID)
	if err != nil {
		t.Fatalf("snapshot of a recovered sandbox: %v", err)
	}
	fork, err := second.Fork(ctx, snap.ID)
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	if res := run(t, second, fork.ID, sh("cat /workspace/f", 10*time.Second)); string(res.Stdout) != "kept\n" {
		t.Errorf("the fork of a recovered sandbox's snapshot reads %q, want %q", res.Stdout, "kept\n")
	}
	if err := second.Destroy(ctx, fork.ID); err != nil {
		t.Fatal(err)
	}
	if err := second.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}

	if err := second.Destroy(ctx, gone.ID); err != nil {
		t.Fatalf("destroy a sandbox left by an earlier runtime: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := os.Stat("/proc/" + agent)
		cgs := cgroupsOf(gone.ID)
		n := quotaMounts(t, srv.Pid())
		if err != nil && len(cgs) == 0 && n == mounts-1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after destroying the leftover: its agent %s runs (%v), its cgroups %v are left, %d disk quota mounts (want %d)", agent, err == nil, cgs, n, mounts-1)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := os.Stat(ctrd.SandboxDir(second, gone.ID)); err == nil {
		t.Errorf("the leftover's state directory is still there")
	}
	if err := second.Destroy(ctx, gone.ID); err == nil {
		t.Errorf("destroying the leftover twice succeeded")
	}
}
