//go:build linux

package process

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

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
	if !collected(rt, vol) {
		t.Errorf("destroyed sandbox's volume %s still there", vol)
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
	if !collected(rt, vol) {
		t.Errorf("volume %s of the destroyed sandbox and its snapshot still there", vol)
	}
}

// collected says gc collected the volume: its folder is gone, or unmounted, empty and
// kept for reuse.
func collected(rt *Runtime, vol string) bool {
	d := rt.volDir(vol)
	if _, err := os.Stat(d); os.IsNotExist(err) {
		return true
	}
	ents, err := os.ReadDir(d)
	rt.mu.Lock()
	_, free := rt.freeVols[vol]
	rt.mu.Unlock()
	return err == nil && len(ents) == 0 && free && !ownTmpfs(d)
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

// TestCPUQuotaWrittenAtFirstExec: a create writes no CPU bandwidth file (the kernel
// checks every cgroup on the host at each such write, so it made create cost grow with
// the count); the first command writes the quota once, and it is in force for it; later
// commands write nothing.
func TestCPUQuotaWrittenAtFirstExec(t *testing.T) {
	rt := openInternal(t)
	ctx := context.Background()
	before := rt.cg.bandwidthWrites.Load()
	h, err := rt.Create(ctx, sandbox.Spec{Limits: sandbox.Limits{CPUMillis: 300}})
	if err != nil {
		t.Fatal(err)
	}
	if n := rt.cg.bandwidthWrites.Load() - before; n != 0 {
		t.Errorf("create wrote CPU bandwidth files %d times, want 0 (cgroup %s)", n, rt.CgroupVersion())
	}
	for i, want := range []int64{1, 0} {
		before = rt.cg.bandwidthWrites.Load()
		res, err := rt.Exec(ctx, h.ID, sandbox.ExecRequest{Argv: []string{"true"}})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec %d: %v %+v", i, err, res)
		}
		if n := rt.cg.bandwidthWrites.Load() - before; n != want {
			t.Errorf("exec %d wrote CPU bandwidth files %d times, want %d", i, n, want)
		}
	}
	b, err := rt.get("test", h.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rt.cg.version == cgroupV2 {
		got, _ := os.ReadFile(filepath.Join(b.cg.dir(""), "cpu.max"))
		if strings.TrimSpace(string(got)) != "30000 100000" {
			t.Errorf("cpu.max = %q, want 30000 100000", got)
		}
	} else if q := readInt(filepath.Join(b.cg.dir("cpu"), "cpu.cfs_quota_us")); q != 30000 {
		t.Errorf("cpu.cfs_quota_us = %d, want 30000", q)
	}
}

// ownMounts counts the runtime's own tmpfs mounts in this process's mount table.
func ownMounts(t *testing.T, dirs ...string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && slices.Contains(dirs, f[4]) && strings.Contains(line, " - tmpfs "+ownFSName+" ") {
			n++
		}
	}
	return n
}

// TestOwnTmpfsFoundAgainAndUnmountedWhenEmpty: the volumes' and the mount points'
// folders live on a tmpfs of the runtime's own; a new runtime over the same state
// directory (a worker restart) finds it again instead of mounting it twice, its
// sandboxes recover on it, and Close or Purge unmounts it once nothing is left.
func TestOwnTmpfsFoundAgainAndUnmountedWhenEmpty(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	rt, err := New(Config{StateDir: dir})
	if err != nil {
		t.Fatalf("process runtime unavailable: %v", err)
	}
	t.Cleanup(func() { // on failure: leave no mount behind
		if rt, err := New(Config{StateDir: dir}); err == nil {
			_ = rt.Purge(ctx)
			rt.Close()
		}
	})
	vol, run := rt.path("vol"), rt.runDir
	if n := ownMounts(t, vol, run); n != 2 {
		t.Fatalf("%d own tmpfs mounts at %s and %s, want 2", n, vol, run)
	}
	h, err := rt.Create(ctx, sandbox.Spec{Workspace: []sandbox.File{{Path: "a", Data: []byte("x")}}})
	if err != nil {
		t.Fatal(err)
	}
	rec := filepath.Join(vol, recordsDir, h.ID+".json")
	if _, err := os.Stat(rec); err != nil {
		t.Fatalf("record not on the tmpfs: %v", err)
	}
	rt.Close() // the sandbox stays: the tmpfs stays
	if n := ownMounts(t, vol, run); n != 2 {
		t.Fatalf("after Close with a sandbox left: %d own tmpfs mounts, want 2", n)
	}
	// A record where a runtime that predates the tmpfs kept it is still found.
	legacy := filepath.Join(dir, "sandboxes", h.ID+".json")
	if data, err := os.ReadFile(rec); err != nil {
		t.Fatal(err)
	} else if err := os.WriteFile(legacy, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(rec); err != nil {
		t.Fatal(err)
	}
	rt2, err := New(Config{StateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer rt2.Close()
	if n := ownMounts(t, vol, run); n != 2 {
		t.Fatalf("after a restart: %d own tmpfs mounts, want 2 (mounted twice?)", n)
	}
	if l, err := rt2.List(ctx); err != nil || len(l) != 1 || l[0].ID != h.ID {
		t.Fatalf("list after a restart: %v %v", l, err)
	}
	if err := rt2.Recover(ctx, h); err != nil {
		t.Fatal(err)
	}
	snap, err := rt2.Snapshot(ctx, h.ID)
	if err != nil {
		t.Fatal(err)
	}
	f, err := rt2.Fork(ctx, snap.ID)
	if err != nil {
		t.Fatal(err)
	}
	res, err := rt2.Exec(ctx, f.ID, sandbox.ExecRequest{Argv: []string{"cat", "a"}})
	if err != nil || string(res.Stdout) != "x" {
		t.Fatalf("fork after a restart: %v %+v", err, res)
	}
	if err := rt2.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(legacy); !os.IsNotExist(err) {
		t.Errorf("the earlier runtime's record outlived its sandbox: %v", err)
	}
	if n := ownMounts(t, vol, run); n != 0 {
		t.Errorf("after Purge: %d own tmpfs mounts, want 0", n)
	}
	// The runtime stays usable after a Purge: the next create mounts them again.
	if _, err := rt2.Create(ctx, sandbox.Spec{}); err != nil {
		t.Fatal(err)
	}
	if n := ownMounts(t, vol, run); n != 2 {
		t.Errorf("create after Purge: %d own tmpfs mounts, want 2", n)
	}
	if err := rt2.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	if n := ownMounts(t, vol, run); n != 0 {
		t.Errorf("after the second Purge: %d own tmpfs mounts, want 0", n)
	}
}

// TestVolumeFolderReused: a destroyed sandbox's volume folder is kept, unmounted, and
// the next create mounts its volume there (removing a folder that was a mount point
// walks every mount while another namespace holds a copy); a second collection of the
// same volume does not offer it twice; Purge removes the kept folders.
func TestVolumeFolderReused(t *testing.T) {
	rt := openInternal(t)
	ctx := context.Background()
	h, err := rt.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	vol := rt.known[h.ID].Volume
	if err := rt.Destroy(ctx, h.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(rt.volDir(vol)); err != nil {
		t.Fatalf("volume folder not kept: %v", err)
	}
	if ownTmpfs(rt.volDir(vol)) {
		t.Fatal("kept volume folder still mounted")
	}
	rt.gc(false, vol) // collected again: must not be offered twice
	a, err := rt.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := rt.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	va, vb := rt.known[a.ID].Volume, rt.known[b.ID].Volume
	if va != vol || vb == vol {
		t.Errorf("volumes %s and %s, want the kept %s once", va, vb, vol)
	}
	res, err := rt.Exec(ctx, a.ID, sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo hi > f && cat f"}})
	if err != nil || string(res.Stdout) != "hi\n" {
		t.Fatalf("exec on a reused volume: %v %+v", err, res)
	}
	if err := rt.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(rt.path("vol")); len(ents) != 0 {
		t.Errorf("after Purge vol holds %d entries", len(ents))
	}
}

// TestWorkspaceMountPointKept: destroy removes no folder that is still a mount point in
// another mount namespace. Every exec's bubblewrap (and any other process that makes a
// mount namespace) copies the host's mounts, sandboxes' workspaces included; removing a
// folder that such a copy still mounts makes the kernel walk every mount of the host's
// namespace (__is_local_mountpoint), which made destroy's wall time grow with the count
// (6.7 ms of a 11.5 ms destroy at 10,000 sandboxes). The workspace's mount point is kept
// with its volume and the next create mounts there again; Purge removes it.
func TestWorkspaceMountPointKept(t *testing.T) {
	rt := openInternal(t)
	ctx := context.Background()
	h, err := rt.Create(ctx, sandbox.Spec{Workspace: []sandbox.File{{Path: "a", Data: []byte("x")}}})
	if err != nil {
		t.Fatal(err)
	}
	// A process in a mount namespace of its own holds a copy of every mount.
	holder := exec.Command("unshare", "--mount", "--propagation", "private", "sleep", "60")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = holder.Process.Kill()
		_ = holder.Wait()
	})
	held := heldMountPoints(t, holder.Process.Pid, rt.runDir)
	if len(held) == 0 {
		t.Fatalf("the other namespace holds no copy of the workspace mount under %s", rt.runDir)
	}
	if err := rt.Destroy(ctx, h.ID); err != nil {
		t.Fatal(err)
	}
	for _, p := range held {
		if fi, err := os.Lstat(p); err != nil || !fi.IsDir() {
			t.Errorf("destroy removed %s, a mount point another namespace still holds (%v)", p, err)
		}
	}
	// The kept mount point serves the next sandbox on that volume.
	h2, err := rt.Create(ctx, sandbox.Spec{Workspace: []sandbox.File{{Path: "b", Data: []byte("y")}}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := rt.Exec(ctx, h2.ID, sandbox.ExecRequest{Argv: []string{"sh", "-c", "ls; cat b"}})
	if err != nil || string(res.Stdout) != "b\ny" {
		t.Fatalf("exec in a sandbox on a kept mount point: %v %+v", err, res)
	}
	if err := rt.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	if ents, err := os.ReadDir(rt.runDir); err == nil && len(ents) != 0 {
		t.Errorf("after Purge the run directory holds %d entries", len(ents))
	}
}

// heldMountPoints lists the mount points under dir in process pid's mount namespace,
// waiting until that namespace exists.
func heldMountPoints(t *testing.T, pid int, dir string) []string {
	t.Helper()
	self, _ := os.Readlink("/proc/self/ns/mnt")
	for range 500 {
		if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid)); err == nil && ns != self {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, f[4])
		}
	}
	return out
}

// TestLayerReferenceCounts: gc reads counts of the references to each layer and volume
// instead of looking through every sandbox's and snapshot's record, which made a destroy
// of a fork or a restored sandbox, and a snapshot's deletion, O(N). The counts match the
// records after every step, a worker restart included, and what the steps leave unused
// is collected.
func TestLayerReferenceCounts(t *testing.T) {
	rt := openInternal(t)
	ctx := context.Background()
	var ids []string
	for i := range 20 {
		h, err := rt.Create(ctx, sandbox.Spec{ID: fmt.Sprintf("sb%02d", i), Workspace: []sandbox.File{{Path: "a", Data: []byte("x")}}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, h.ID)
	}
	checkRefs(t, rt, "after the creates")
	snap, err := rt.Snapshot(ctx, ids[0])
	if err != nil {
		t.Fatal(err)
	}
	fork, err := rt.Fork(ctx, snap.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Restore(ctx, ids[1], snap.ID); err != nil {
		t.Fatal(err)
	}
	checkRefs(t, rt, "after a snapshot, a fork and a restore")
	vol := rt.known[ids[0]].Volume
	for _, step := range []struct {
		name string
		do   func() error
	}{
		{"destroy the fork", func() error { return rt.Destroy(ctx, fork.ID) }},
		{"destroy the restored sandbox", func() error { return rt.Destroy(ctx, ids[1]) }},
		{"delete the snapshot", func() error { return rt.DeleteSnapshot(ctx, snap.ID) }},
		{"destroy its sandbox", func() error { return rt.Destroy(ctx, ids[0]) }},
	} {
		if err := step.do(); err != nil {
			t.Fatal(err)
		}
		checkRefs(t, rt, step.name)
	}
	if !collected(rt, vol) {
		t.Errorf("volume %s of the destroyed sandbox and its snapshot still there", vol)
	}
	// A restart rebuilds the counts from the records on disk.
	snap2, err := rt.Snapshot(ctx, ids[2])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Fork(ctx, snap2.ID); err != nil {
		t.Fatal(err)
	}
	rt.Close()
	rt2, err := New(Config{StateDir: rt.cfg.StateDir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = rt2.Purge(ctx)
		rt2.Close()
	})
	checkRefs(t, rt2, "after a restart")
}

// checkRefs compares gc's reference counts with those counted from the records.
func checkRefs(t *testing.T, rt *Runtime, when string) {
	t.Helper()
	rt.mu.Lock()
	defer rt.mu.Unlock()
	owners, layers := map[string]int{}, map[string]int{}
	for _, rec := range rt.known {
		owners[rec.Volume]++
		for _, l := range rec.Chain {
			layers[l]++
		}
	}
	for _, s := range rt.snapshots {
		for _, l := range s.Chain {
			layers[l]++
		}
	}
	if !maps.Equal(owners, rt.volOwners) || !maps.Equal(layers, rt.layerRefs) {
		t.Errorf("%s: gc's counts: volumes %v, layers %v; the records': %v, %v", when, rt.volOwners, rt.layerRefs, owners, layers)
	}
}

// TestWorkspaceMountedByIDStillServed: a sandbox of a runtime from before the mount
// points named by volume (its workspace mounted at the run directory under its id) is
// recovered, used, snapshotted and destroyed by a new runtime, leaving nothing behind.
func TestWorkspaceMountedByIDStillServed(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	rt, err := New(Config{StateDir: dir})
	if err != nil {
		t.Fatalf("process runtime unavailable: %v", err)
	}
	h, err := rt.Create(ctx, sandbox.Spec{Workspace: []sandbox.File{{Path: "a", Data: []byte("x")}}})
	if err != nil {
		t.Fatal(err)
	}
	// Move the workspace to where an earlier runtime mounted it.
	rec := rt.known[h.ID]
	if err := unmount(rt.workspace(rec)); err != nil {
		t.Fatal(err)
	}
	rec.MountByVolume = false
	if err := rt.mountWorkspaceKeepUpper(rec); err != nil {
		t.Fatal(err)
	}
	if err := rt.save("sandboxes", h.ID, rec); err != nil {
		t.Fatal(err)
	}
	rt.Close()
	rt2, err := New(Config{StateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = rt2.Purge(ctx)
		rt2.Close()
	})
	if err := rt2.Recover(ctx, h); err != nil {
		t.Fatal(err)
	}
	if ws, err := rt2.WorkspaceDir(ctx, h.ID); err != nil || ws != rt2.wsDir(h.ID) {
		t.Fatalf("workspace dir %q, %v; want %s", ws, err, rt2.wsDir(h.ID))
	}
	if _, err := rt2.Exec(ctx, h.ID, sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo y > b"}}); err != nil {
		t.Fatal(err)
	}
	snap, err := rt2.Snapshot(ctx, h.ID)
	if err != nil {
		t.Fatal(err)
	}
	res, err := rt2.Exec(ctx, h.ID, sandbox.ExecRequest{Argv: []string{"cat", "a", "b"}})
	if err != nil || string(res.Stdout) != "xy\n" {
		t.Fatalf("exec after a snapshot: %v %+v", err, res)
	}
	if err := rt2.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	if err := rt2.Destroy(ctx, h.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(rt2.wsDir(h.ID)); !os.IsNotExist(err) {
		t.Errorf("the mount point named by id outlived its sandbox: %v", err)
	}
	if err := rt2.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	if ents, err := os.ReadDir(rt2.runDir); err == nil && len(ents) != 0 {
		t.Errorf("after Purge the run directory holds %d entries", len(ents))
	}
}
