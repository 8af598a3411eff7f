//go:build linux

package process

import (
	"context"
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

func openInternal(t *testing.T) *Runtime {
	t.Helper()
	dir := t.TempDir()
	rt, err := New(Config{StateDir: dir})
	if err != nil {
		t.Fatalf("process runtime unavailable: %v", err)
	}
	t.Cleanup(func() {
		_ = rt.Purge(context.Background())
		rt.Close()
	})
	return rt
}

// TestDestroyLooksAtItsOwnVolumeOnly: destroying one of many sandboxes collects the
// layers and volume it leaves unused without reading every other sandbox's volume.
// It did read them all, so a destroy at 3,000 sandboxes took 18 ms and grew with the
// count.
func TestDestroyLooksAtItsOwnVolumeOnly(t *testing.T) {
	rt := openInternal(t)
	ctx := context.Background()
	var ids []string
	for i := range 20 {
		h, err := rt.Create(ctx, sandbox.Spec{ID: fmt.Sprintf("sb%02d", i)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, h.ID)
	}
	snap, err := rt.Snapshot(ctx, ids[0])
	if err != nil {
		t.Fatal(err)
	}
	fork, err := rt.Fork(ctx, snap.ID)
	if err != nil {
		t.Fatal(err)
	}
	before := rt.gcVolumes.Load()
	if err := rt.Destroy(ctx, ids[5]); err != nil {
		t.Fatal(err)
	}
	if n := rt.gcVolumes.Load() - before; n > 1 {
		t.Errorf("destroying one sandbox of 21 looked at %d volumes, want its own only", n)
	}
	vol := rt.known[ids[6]].Volume
	if err := rt.Destroy(ctx, ids[6]); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(rt.volDir(vol)); !os.IsNotExist(err) {
		t.Errorf("destroyed sandbox's volume %s still there (%v)", vol, err)
	}
	// The fork's layers live in the first sandbox's volume: destroying the fork and the
	// snapshot leaves them to that sandbox; destroying it too collects the volume.
	vol = rt.known[ids[0]].Volume
	for _, step := range []struct {
		name string
		do   func() error
		max  int64 // volumes it may look at
	}{
		{"destroy the fork", func() error { return rt.Destroy(ctx, fork.ID) }, 2},
		{"delete the snapshot", func() error { return rt.DeleteSnapshot(ctx, snap.ID) }, 1},
		{"destroy its sandbox", func() error { return rt.Destroy(ctx, ids[0]) }, 1},
	} {
		before := rt.gcVolumes.Load()
		if err := step.do(); err != nil {
			t.Fatal(err)
		}
		if n := rt.gcVolumes.Load() - before; n > step.max {
			t.Errorf("%s: looked at %d volumes, want at most %d (its own and its layers')", step.name, n, step.max)
		}
	}
	if _, err := os.Stat(rt.volDir(vol)); !os.IsNotExist(err) {
		t.Errorf("volume %s of the destroyed sandbox and its snapshot still there (%v)", vol, err)
	}
}

// TestLowerLayersOnTheirOwnMounts: every lower layer of a workspace overlay lies on a
// sandbox volume, not on the state directory's filesystem. Overlayfs's mount checks
// each layer's mount against all of that mount's children (clone_private_mount), and
// every sandbox's volume is a child of the state directory's mount: with the empty
// bottom layer there, a create's cost grew with the number of sandboxes.
func TestLowerLayersOnTheirOwnMounts(t *testing.T) {
	rt := openInternal(t)
	ctx := context.Background()
	h, err := rt.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Snapshot(ctx, h.ID); err != nil {
		t.Fatal(err)
	}
	var state unix.Stat_t
	if err := unix.Stat(rt.cfg.StateDir, &state); err != nil {
		t.Fatal(err)
	}
	for _, l := range rt.lowers(rt.known[h.ID]) {
		var st unix.Stat_t
		if err := unix.Stat(l, &st); err != nil {
			t.Fatal(err)
		}
		if st.Dev == state.Dev {
			t.Errorf("lower layer %s is on the state directory's filesystem", l)
		}
	}
}

// TestCreateWritesCPUBandwidthOnce: a create writes the CPU bandwidth once (the quota),
// not the period a new cgroup has already. The kernel checks every cgroup on the host
// at each such write, so a second one made create cost grow with the count (v1).
func TestCreateWritesCPUBandwidthOnce(t *testing.T) {
	rt := openInternal(t)
	before := rt.cg.bandwidthWrites.Load()
	if _, err := rt.Create(context.Background(), sandbox.Spec{}); err != nil {
		t.Fatal(err)
	}
	if n := rt.cg.bandwidthWrites.Load() - before; n != 1 {
		t.Errorf("create wrote CPU bandwidth files %d times, want 1 (cgroup %s)", n, rt.CgroupVersion())
	}
}
