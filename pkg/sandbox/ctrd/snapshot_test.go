package ctrd_test

import (
	"context"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// TestSnapshotKeepsDeletions checks that a snapshot carries what overlayfs records
// as deletions (whiteouts) and replaced directories (opaque directories), not only
// new files: a fork must not see files the source deleted from the image.
func TestSnapshotKeepsDeletions(t *testing.T) {
	_, rt := start(t)
	ctx := context.Background()
	src := mustCreate(t, rt, sandbox.Spec{})
	res := run(t, rt, src.ID, sh("rm /etc/group && rm -rf /etc && mkdir /etc && echo only > /etc/only && rm /bin/vi && ln -s /bin/busybox /workspace/bb", 10*time.Second))
	if res.ExitCode != 0 {
		t.Fatalf("setup: exit %d stderr %q", res.ExitCode, res.Stderr)
	}
	snap, err := rt.Snapshot(ctx, src.ID)
	if err != nil {
		t.Fatal(err)
	}
	fork, err := rt.Fork(ctx, snap.ID)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Destroy(context.Background(), fork.ID) })
	res = run(t, rt, fork.ID, sh("ls /etc; ls /bin/vi 2>&1 >/dev/null | wc -l; readlink /workspace/bb", 10*time.Second))
	if want := "only\n1\n/bin/busybox\n"; string(res.Stdout) != want {
		t.Fatalf("fork sees %q, want %q", res.Stdout, want)
	}
	// The source goes on untouched by the fork.
	run(t, rt, fork.ID, sh("echo forked > /etc/only", 10*time.Second))
	res = run(t, rt, src.ID, sh("cat /etc/only", 10*time.Second))
	if string(res.Stdout) != "only\n" {
		t.Fatalf("source sees %q after the fork wrote", res.Stdout)
	}
}
