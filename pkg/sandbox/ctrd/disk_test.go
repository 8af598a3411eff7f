package ctrd_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// TestDiskLimitEnforced: a sandbox writing far past its disk limit (2 GB into a 128 MiB
// one, as found) is stopped with ENOSPC at the limit, anywhere in its writable layer,
// gets a disk_full event, and harms no other sandbox: a bystander still writes, a new
// sandbox still starts and snapshots of the full one still work.
func TestDiskLimitEnforced(t *testing.T) {
	_, rt := start(t)
	ctx := context.Background()
	const limit = 128 << 20
	// Memory well above the disk limit, so that the memory limit cannot be what stops it.
	h := mustCreate(t, rt, sandbox.Spec{Limits: sandbox.Limits{DiskBytes: limit, MemoryBytes: 1 << 30}})
	bystander := mustCreate(t, rt, sandbox.Spec{Limits: sandbox.Limits{DiskBytes: limit}})

	res := run(t, rt, h.ID, sh("dd if=/dev/zero of=/workspace/big bs=1M count=1990", 2*time.Minute))
	if res.ExitCode == 0 || !strings.Contains(string(res.Stderr), "No space left on device") {
		t.Errorf("dd of 1990 MiB under a 128 MiB disk limit: exit %d stderr %q, want ENOSPC", res.ExitCode, res.Stderr)
	}
	if !hasEvent(res, sandbox.EventDiskFull, "") {
		t.Errorf("dd past the disk limit: events %v, want %s", res.Events, sandbox.EventDiskFull)
	}
	size := func(path string) int64 {
		t.Helper()
		res := run(t, rt, h.ID, sh("stat -c %s "+path, 10*time.Second))
		var n int64
		fmt.Sscan(string(res.Stdout), &n)
		return n
	}
	if n := size("/workspace/big"); n > limit || n < limit/2 {
		t.Errorf("the sandbox wrote %d bytes under a %d-byte disk limit", n, limit)
	}
	// The limit covers the whole writable layer, not only /workspace.
	res = run(t, rt, h.ID, sh("dd if=/dev/zero of=/tmp/more bs=1M count=16", time.Minute))
	if res.ExitCode == 0 {
		t.Errorf("writing 16 MiB to /tmp of a full sandbox succeeded")
	}

	// Others are unharmed: the bystander writes, a new sandbox starts, the full one
	// snapshots and forks.
	res = run(t, rt, bystander.ID, sh("dd if=/dev/zero of=/workspace/f bs=1M count=64 && echo ok", time.Minute))
	if res.ExitCode != 0 || hasEvent(res, sandbox.EventDiskFull, "") {
		t.Errorf("bystander writing 64 MiB: exit %d stderr %q events %v", res.ExitCode, res.Stderr, res.Events)
	}
	mustCreate(t, rt, sandbox.Spec{})
	snap, err := rt.Snapshot(ctx, h.ID)
	if err != nil {
		t.Fatalf("snapshot of the full sandbox: %v", err)
	}
	defer rt.DeleteSnapshot(ctx, snap.ID)
	fork, err := rt.Fork(ctx, snap.ID)
	if err != nil {
		t.Fatalf("fork of the full sandbox: %v", err)
	}
	defer rt.Destroy(ctx, fork.ID)
	res = run(t, rt, fork.ID, sh("stat -c %s /workspace/big", 10*time.Second))
	var n int64
	fmt.Sscan(string(res.Stdout), &n)
	if n != size("/workspace/big") {
		t.Errorf("the fork's /workspace/big has %d bytes, the source's %d", n, size("/workspace/big"))
	}

	// Freeing space makes it writable again, without an event.
	res = run(t, rt, h.ID, sh("rm /workspace/big && dd if=/dev/zero of=/workspace/small bs=1M count=8 && echo ok", time.Minute))
	if res.ExitCode != 0 || hasEvent(res, sandbox.EventDiskFull, "") {
		t.Errorf("after rm: exit %d stderr %q events %v", res.ExitCode, res.Stderr, res.Events)
	}
}
