//go:build linux

package process

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// openPool opens a runtime whose cgroup pool holds size cgroups, and more while at least
// trimBelow sandboxes live (Config.CgroupTrimBelow; negative: never more); it skips
// where the pool cannot work (cgroup v2 refuses to rename a cgroup).
func openPool(t *testing.T, size, trimBelow int) *Runtime {
	t.Helper()
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	rt, err := New(Config{StateDir: t.TempDir(), CgroupPool: size, CgroupTrimBelow: trimBelow, Logger: log})
	if err != nil {
		t.Fatalf("process runtime unavailable: %v", err)
	}
	t.Cleanup(func() {
		_ = rt.Purge(context.Background())
		rt.Close()
	})
	if rt.cg.version == cgroupV2 {
		t.Skip("cgroup v2 refuses rename(2): no cgroup pool")
	}
	return rt
}

// testWriter writes to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// pooled returns the names of the cgroups the runtime keeps.
func pooled(rt *Runtime) []string {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return slices.Clone(rt.cgPool)
}

// cgChildren lists the directories below the runtime's cgroup parent in each hierarchy.
func cgChildren(t *testing.T, rt *Runtime) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, d := range rt.cg.cgroup(rt.cgBase).dirs() {
		ents, err := os.ReadDir(d)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		for _, e := range ents {
			if e.IsDir() {
				out[d] = append(out[d], e.Name())
			}
		}
	}
	return out
}

func shReq(script string) sandbox.ExecRequest {
	return sandbox.ExecRequest{Argv: []string{"sh", "-c", script}, Timeout: 60 * time.Second}
}

func hasEvent(res sandbox.ExecResult, k sandbox.EventKind) bool {
	return slices.ContainsFunc(res.Events, func(e sandbox.Event) bool { return e.Kind == k })
}

// TestReusedCgroupReadsFresh: a destroyed sandbox's cgroup, kept and handed to the next
// create, shows the new sandbox nothing of the old one: no memory in use, no peak, the
// new limits (memory, pids, and the CPU quota once its first command runs), and no
// OOM kill or refused fork of the old sandbox's in its first command's events.
func TestReusedCgroupReadsFresh(t *testing.T) {
	rt := openPool(t, 2, -1)
	ctx := context.Background()
	old, err := rt.Create(ctx, sandbox.Spec{Limits: sandbox.Limits{MemoryBytes: 48 << 20, Pids: 24, CPUMillis: 500}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := rt.Exec(ctx, old.ID, shReq(`for i in $(seq 40); do sleep 1 & done 2>/dev/null; wait`))
	if err != nil || !hasEvent(res, sandbox.EventPidsLimit) {
		t.Fatalf("old sandbox's forks: %v, events %v", err, res.Events)
	}
	res, err = rt.Exec(ctx, old.ID, shReq(`x=$(head -c 100000000 /dev/zero | tr '\0' a); echo ${#x}`))
	if err != nil || !hasEvent(res, sandbox.EventOOMKill) {
		t.Fatalf("old sandbox's hog: %v, events %v", err, res.Events)
	}
	if res.Metering.PeakMemoryBytes < 32<<20 {
		t.Fatalf("old sandbox's hog peaked at %d bytes, want near its 48 MiB limit", res.Metering.PeakMemoryBytes)
	}
	oldDirs := rt.active[old.ID].cg.dirs()
	if err := rt.Destroy(ctx, old.ID); err != nil {
		t.Fatal(err)
	}
	if got := pooled(rt); len(got) != 1 {
		t.Fatalf("pool %v after a destroy, want the old sandbox's cgroup", got)
	}
	for _, d := range oldDirs {
		if exists(d) {
			t.Errorf("old sandbox's cgroup %s still under its name", d)
		}
	}
	h, err := rt.Create(ctx, sandbox.Spec{Limits: sandbox.Limits{MemoryBytes: 96 << 20, Pids: 64, CPUMillis: 300}})
	if err != nil {
		t.Fatal(err)
	}
	if got := pooled(rt); len(got) != 0 {
		t.Fatalf("pool %v after a create, want it taken", got)
	}
	b, err := rt.get("test", h.ID)
	if err != nil {
		t.Fatal(err)
	}
	st, err := rt.Stats(ctx, h.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.MemoryBytes > poolSlack+poolKmemSlack || st.Pids != 0 {
		t.Errorf("new sandbox's stats %+v: memory or processes of the old one", st)
	}
	mem := b.cg.dir("memory")
	for file, want := range map[string]int64{
		"memory.limit_in_bytes": 96 << 20,
		"pids.max":              64,
	} {
		d := mem
		if file == "pids.max" {
			d = b.cg.dir("pids")
		}
		if got := readInt(filepath.Join(d, file)); got != want {
			t.Errorf("%s = %d, want %d", file, got, want)
		}
	}
	if got := readInt(filepath.Join(mem, "memory.max_usage_in_bytes")); got > poolSlack+poolKmemSlack {
		t.Errorf("memory.max_usage_in_bytes = %d: the old sandbox's peak", got)
	}
	// The first command reads a file the host has dropped from its page cache, which
	// charges the cache to this cgroup.
	f := uncachedFile(t)
	res, err = rt.Exec(ctx, h.ID, shReq("cat "+f+" > /dev/null"))
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("new sandbox's first command: %v %+v", err, res)
	}
	if hasEvent(res, sandbox.EventOOMKill) || hasEvent(res, sandbox.EventPidsLimit) {
		t.Errorf("new sandbox's first command reports the old one's events: %v", res.Events)
	}
	if res.Metering.PeakMemoryBytes > 32<<20 {
		t.Errorf("new sandbox's first command peaked at %d bytes: the old one's peak", res.Metering.PeakMemoryBytes)
	}
	if q := readInt(filepath.Join(b.cg.dir("cpu"), "cpu.cfs_quota_us")); q != 30000 {
		t.Errorf("cpu.cfs_quota_us = %d after the first command, want 30000 (the old sandbox's was 50000)", q)
	}
	if m := b.cg.memory(); m < 4<<20 {
		t.Fatalf("reading %s charged %d bytes to the cgroup, want its page cache", f, m)
	}
	// That page cache is given back when the cgroup is kept.
	if err := rt.Destroy(ctx, h.ID); err != nil {
		t.Fatal(err)
	}
	p := pooled(rt)
	if len(p) != 1 {
		t.Fatalf("pool %v, want the cgroup kept again", p)
	}
	kept := rt.cg.cgroup(filepath.Join(rt.cgBase, p[0]))
	kmem := readInt(filepath.Join(kept.dir("memory"), "memory.kmem.usage_in_bytes"))
	if m := kept.memory(); m-kmem > poolSlack {
		t.Errorf("kept cgroup holds %d bytes of memory besides %d of kernel objects", m-kmem, kmem)
	}
}

// uncachedFile returns a host file of 4 to 16 MiB below /usr/share, dropped from the page
// cache, that a sandbox can read.
func uncachedFile(t *testing.T) string {
	t.Helper()
	var found string
	_ = filepath.WalkDir("/usr/share", func(p string, d fs.DirEntry, err error) error {
		if err != nil || found != "" {
			return filepath.SkipDir
		}
		if fi, err := d.Info(); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 == 0 &&
			fi.Mode()&0o004 != 0 && fi.Size() >= 4<<20 && fi.Size() <= 16<<20 {
			found = p
			return filepath.SkipAll
		}
		return nil
	})
	if found == "" {
		t.Skip("no file of 4 to 16 MiB below /usr/share")
	}
	fd, err := unix.Open(found, unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Fadvise(fd, 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	return found
}

// TestDirtyCgroupRemoved: a cgroup whose memory cannot be given back (workspace files
// kept by a snapshot: tmpfs pages, charged to the cgroup, which no reclaim frees without
// swap) is removed, not kept for the next sandbox.
func TestDirtyCgroupRemoved(t *testing.T) {
	rt := openPool(t, 2, -1)
	ctx := context.Background()
	h, err := rt.Create(ctx, sandbox.Spec{Limits: sandbox.Limits{MemoryBytes: 128 << 20, DiskBytes: 64 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := rt.Exec(ctx, h.ID, shReq("head -c 16777216 /dev/zero > /workspace/f"))
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("fill: %v %+v", err, res)
	}
	snap, err := rt.Snapshot(ctx, h.ID)
	if err != nil {
		t.Fatal(err)
	}
	dirs := rt.active[h.ID].cg.dirs()
	if err := rt.Destroy(ctx, h.ID); err != nil {
		t.Fatal(err)
	}
	if got := pooled(rt); len(got) != 0 {
		t.Errorf("pool %v: a cgroup charged with the snapshot's 16 MiB was kept", got)
	}
	for _, d := range dirs {
		if exists(d) {
			t.Errorf("cgroup %s left", d)
		}
	}
	if n := len(cgChildren(t, rt)); n != 0 {
		t.Errorf("cgroups left: %v", cgChildren(t, rt))
	}
	if err := rt.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
}

// TestCgroupPoolBounded: with a negative CgroupTrimBelow, destroys keep at most
// CgroupPool cgroups and remove the rest; creates take the kept ones first; Purge and
// Close remove the pool, and a negative size keeps none.
func TestCgroupPoolBounded(t *testing.T) {
	rt := openPool(t, 2, -1)
	ctx := context.Background()
	var ids []string
	for range 4 {
		h, err := rt.Create(ctx, sandbox.Spec{})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, h.ID)
	}
	for _, id := range ids {
		if err := rt.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if got := pooled(rt); len(got) != 2 {
		t.Fatalf("pool %v after 4 destroys, want 2", got)
	}
	kids := cgChildren(t, rt)
	if len(kids) != len(rt.cg.cgroup(rt.cgBase).dirs()) {
		t.Fatalf("cgroup parents with children: %v", kids)
	}
	for d, names := range kids {
		slices.Sort(names)
		if want := slices.Sorted(slices.Values(pooled(rt))); !slices.Equal(names, want) {
			t.Errorf("%s holds %v, want the pool %v", d, names, want)
		}
	}
	ids = ids[:0]
	for i := range 3 {
		h, err := rt.Create(ctx, sandbox.Spec{})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, h.ID)
		if got, want := len(pooled(rt)), max(1-i, 0); got != want {
			t.Errorf("create %d: pool of %d, want %d", i, got, want)
		}
	}
	for _, id := range ids {
		if err := rt.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := rt.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	if p, kids := pooled(rt), cgChildren(t, rt); len(p) != 0 || len(kids) != 0 {
		t.Errorf("after Purge: pool %v, cgroups %v", p, kids)
	}
	// Close removes the pool.
	h, err := rt.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Destroy(ctx, h.ID); err != nil {
		t.Fatal(err)
	}
	if len(pooled(rt)) != 1 {
		t.Fatal("destroy kept no cgroup")
	}
	rt.Close()
	for _, d := range rt.cg.cgroup(rt.cgBase).dirs() {
		if exists(d) {
			t.Errorf("after Close: %s left", d)
		}
	}

	off, err := New(Config{StateDir: t.TempDir(), CgroupPool: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer off.Close()
	h, err = off.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	if err := off.Destroy(ctx, h.ID); err != nil {
		t.Fatal(err)
	}
	if p, kids := pooled(off), cgChildren(t, off); len(p) != 0 || len(kids) != 0 {
		t.Errorf("pool disabled: pool %v, cgroups %v", p, kids)
	}
}

// TestLeftoverPoolRemoved: a runtime starting over a state directory removes the
// cgroups an earlier one kept (it died without Close); the earlier one, finding its
// kept cgroup gone, makes a new one.
func TestLeftoverPoolRemoved(t *testing.T) {
	rt := openPool(t, 2, -1)
	ctx := context.Background()
	h, err := rt.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Destroy(ctx, h.ID); err != nil {
		t.Fatal(err)
	}
	p := pooled(rt)
	if len(p) != 1 {
		t.Fatalf("pool %v, want 1", p)
	}
	next, err := New(Config{StateDir: rt.cfg.StateDir, CgroupPool: 2})
	if err != nil {
		t.Fatal(err)
	}
	// Not closed before the end: Close unmounts the state directory's tmpfs when empty.
	defer next.Close()
	if kids := cgChildren(t, rt); len(kids) != 0 {
		t.Errorf("a new runtime left the earlier one's pool: %v", kids)
	}
	h, err = rt.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatalf("create when the kept cgroup is gone: %v", err)
	}
	b, err := rt.get("test", h.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !b.cg.exists() || !strings.HasSuffix(b.cg.rel, h.ID) {
		t.Errorf("sandbox's cgroup %s missing", b.cg.rel)
	}
	if err := rt.Destroy(ctx, h.ID); err != nil {
		t.Fatal(err)
	}
}

// poolState reads the pool's size, the live sandboxes' count, the high-water mark and
// whether the trimmer runs, at one instant.
func poolState(rt *Runtime) (kept, live, peak int, trimming bool) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return len(rt.cgPool), len(rt.active), rt.cgPeak, rt.trimDone != nil
}

// waitPool waits until the pool holds want cgroups and the trimmer has stopped.
func waitPool(t *testing.T, rt *Runtime, want int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		kept, live, _, trimming := poolState(rt)
		if kept == want && !trimming {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool of %d with %d live (trimmer running: %v), want %d", kept, live, trimming, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestCgroupPoolKeepsToPeak: while at least CgroupTrimBelow sandboxes live, a destroy
// keeps its cgroup beyond CgroupPool, with kept and live cgroups together never more
// than the most sandboxes that lived at once; once fewer live, the kept cgroups beyond
// CgroupPool are removed in the background, and creates still take kept ones first.
func TestCgroupPoolKeepsToPeak(t *testing.T) {
	rt := openPool(t, 2, 3)
	ctx := context.Background()
	var ids []string
	for range 8 {
		h, err := rt.Create(ctx, sandbox.Spec{})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, h.ID)
	}
	check := func(when string, wantKept, wantLive int) {
		t.Helper()
		kept, live, peak, trimming := poolState(rt)
		if kept != wantKept || live != wantLive {
			t.Errorf("%s: %d kept and %d live, want %d and %d", when, kept, live, wantKept, wantLive)
		}
		if peak != 8 || kept+live > peak {
			t.Errorf("%s: %d kept and %d live, high-water mark %d, want 8 and no more cgroups", when, kept, live, peak)
		}
		if trimming {
			t.Errorf("%s: the trimmer runs with %d live, at least CgroupTrimBelow", when, live)
		}
		for d, names := range cgChildren(t, rt) {
			if len(names) != wantKept+wantLive {
				t.Errorf("%s: %s holds %d cgroups, want %d", when, d, len(names), wantKept+wantLive)
			}
		}
	}
	for i := range 5 {
		if err := rt.Destroy(ctx, ids[i]); err != nil {
			t.Fatal(err)
		}
		check(fmt.Sprintf("destroy %d", i+1), i+1, 7-i)
	}
	ids = ids[5:]
	for i := range 2 {
		h, err := rt.Create(ctx, sandbox.Spec{})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, h.ID)
		check(fmt.Sprintf("create %d", i+1), 4-i, 4+i)
	}
	// 5 live, 3 kept; down to 2 live, the pool is trimmed to CgroupPool.
	for _, id := range ids[:3] {
		if err := rt.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	ids = ids[3:]
	waitPool(t, rt, 2)
	for d, names := range cgChildren(t, rt) {
		if len(names) != 4 {
			t.Errorf("after the trim %s holds %v, want 2 kept and 2 live", d, names)
		}
	}
	h, err := rt.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	if kept, _, _, _ := poolState(rt); kept != 1 {
		t.Errorf("create after the trim: %d kept, want one taken", kept)
	}
	for _, id := range append(ids, h.ID) {
		if err := rt.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	waitPool(t, rt, 2)
}

// TestCgroupPoolCloseRemovesExcess: Close removes every kept cgroup, those beyond
// CgroupPool too, and leaves the live sandboxes' for a later Recover; a Close while the
// trimmer runs waits for it and leaves no kept cgroup either.
func TestCgroupPoolCloseRemovesExcess(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		trimBelow int
		live      int
	}{
		{"excess kept", 2, 2},       // 2 live: no trim before Close
		{"trimmer running", 100, 0}, // trims from the first destroy beyond CgroupPool
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := openPool(t, 1, tc.trimBelow)
			var ids []string
			for range 12 {
				h, err := rt.Create(ctx, sandbox.Spec{})
				if err != nil {
					t.Fatal(err)
				}
				ids = append(ids, h.ID)
			}
			for _, id := range ids[tc.live:] {
				if err := rt.Destroy(ctx, id); err != nil {
					t.Fatal(err)
				}
			}
			kept, _, _, trimming := poolState(rt)
			if tc.live > 0 && kept != 12-tc.live {
				t.Fatalf("%d kept with %d live, want %d", kept, tc.live, 12-tc.live)
			}
			t.Logf("closing with %d kept (trimmer running: %v)", kept, trimming)
			if err := rt.Close(); err != nil {
				t.Fatal(err)
			}
			for d, names := range cgChildren(t, rt) {
				if len(names) != tc.live || slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, poolPrefix) }) {
					t.Errorf("after Close %s holds %v, want the %d live sandboxes' only", d, names, tc.live)
				}
			}
			if tc.live == 0 {
				for _, d := range rt.cg.cgroup(rt.cgBase).dirs() {
					if exists(d) {
						t.Errorf("after Close: %s left", d)
					}
				}
				return
			}
			next, err := New(Config{StateDir: rt.cfg.StateDir, CgroupPool: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer next.Close()
			if err := next.Purge(ctx); err != nil {
				t.Fatal(err)
			}
			if kids := cgChildren(t, next); len(kids) != 0 {
				t.Errorf("after Purge: cgroups %v", kids)
			}
		})
	}
}
