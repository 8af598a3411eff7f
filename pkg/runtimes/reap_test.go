package runtimes_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/childproc/childproctest"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes/runtimestest"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/ctrd"
)

// leftovers is what a containerd sandbox leaves on the host: its processes, its cgroup
// directories and the shims of the private daemon.
type leftovers struct {
	pids    []int
	cgroups []string
	shims   []int
}

func (l leftovers) empty() bool { return len(l.pids) == 0 && len(l.cgroups) == 0 && len(l.shims) == 0 }

// sandboxCgroups lists the cgroup directories, in every hierarchy, of sandbox id (the
// runtime names them <state key>-<id> under ctrd.DefaultCgroupParent).
func sandboxCgroups(t *testing.T, id string) []string {
	t.Helper()
	var out []string
	roots, _ := filepath.Glob("/sys/fs/cgroup/*" + ctrd.DefaultCgroupParent)
	if st, err := os.Stat("/sys/fs/cgroup" + ctrd.DefaultCgroupParent); err == nil && st.IsDir() {
		roots = append(roots, "/sys/fs/cgroup"+ctrd.DefaultCgroupParent)
	}
	for _, root := range roots {
		m, _ := filepath.Glob(filepath.Join(root, "*-"+id))
		out = append(out, m...)
	}
	return out
}

// sandboxPids lists the live processes in sandbox id's cgroups.
func sandboxPids(t *testing.T, id string) []int {
	t.Helper()
	seen := map[int]bool{}
	var out []int
	for _, cg := range sandboxCgroups(t, id) {
		b, err := os.ReadFile(filepath.Join(cg, "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && !seen[pid] {
				seen[pid] = true
				out = append(out, pid)
			}
		}
	}
	return out
}

// shimsOf lists the containerd-shim processes serving the daemon at address.
func shimsOf(address string) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if !strings.Contains(filepath.Base(args[0]), "containerd-shim") {
			continue
		}
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "-address" && args[i+1] == address {
				out = append(out, pid)
			}
		}
	}
	return out
}

// alivePids keeps the pids that still run (zombies count as gone).
func alivePids(pids []int) []int {
	var out []int
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			continue
		}
		// "pid (comm) S ...": the state follows the last ')'.
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) && s[i+2] == 'Z' {
			continue
		}
		out = append(out, pid)
	}
	return out
}

// left collects what sandbox ids (whose processes were pids) left, waiting up to 10 s for
// it to go: a killed process takes a moment to be reaped.
func left(t *testing.T, address string, pids []int, ids ...string) leftovers {
	t.Helper()
	var l leftovers
	for deadline := time.Now().Add(10 * time.Second); ; {
		l = leftovers{pids: alivePids(pids), shims: alivePids(shimsOf(address))}
		for _, id := range ids {
			l.pids = append(l.pids, alivePids(sandboxPids(t, id))...)
			l.cgroups = append(l.cgroups, sandboxCgroups(t, id)...)
		}
		if l.empty() || time.Now().After(deadline) {
			return l
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// openPrivate opens a containerd runtime over stateDir with a private daemon.
func openPrivate(t *testing.T, stateDir string) *runtimes.Sandboxes {
	t.Helper()
	c := runtimes.Config{Runtime: runtimes.Containerd, StateDir: stateDir, AgentBinary: runtimestest.AgentBinary(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := runtimes.Open(ctx, c, childproctest.Logger(t))
	if err != nil {
		t.Fatalf("open containerd runtime: %v", err)
	}
	return sb
}

// acquire creates a sandbox and returns its id and the pids its cgroups hold (its agent).
func acquire(t *testing.T, sb *runtimes.Sandboxes) (string, []int) {
	t.Helper()
	ctx := context.Background()
	h, err := sb.Acquire(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	pids := sandboxPids(t, h.ID)
	if len(pids) == 0 || len(sandboxCgroups(t, h.ID)) == 0 {
		t.Fatalf("sandbox %s: cgroups %v hold pids %v, want its agent", h.ID, sandboxCgroups(t, h.ID), pids)
	}
	return h.ID, pids
}

// TestContainerdSandboxesDoNotOutliveGauntlet: after a crash (the private containerd
// killed with the process, the runtime never closed), the next Open reaps the sandboxes
// left behind, processes and cgroups, rather than only logging them as destroyed; a
// graceful Close then leaves nothing running: no sandbox process, no cgroup, no shim.
func TestContainerdSandboxesDoNotOutliveGauntlet(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local server; -short runs unit tests only")
	}
	dir, err := os.MkdirTemp("", "gr22reap")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	address := filepath.Join(dir, "containerd", "containerd.sock")
	ctx := context.Background()
	var ids []string
	t.Cleanup(func() { sweep(t, address, dir, ids) })

	// First run: two sandboxes, then the crash.
	sb1 := openPrivate(t, dir)
	id1, pids1 := acquire(t, sb1)
	id2, pids2 := acquire(t, sb1)
	ids = append(ids, id1, id2)
	b, err := os.ReadFile(filepath.Join(dir, "containerd", "containerd.pid"))
	if err != nil {
		t.Fatal(err)
	}
	daemon, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(daemon, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = sb1.Runtime().Close() // the connection only: a crashed process closes nothing

	// Second run: Open reaps what the first left.
	sb2 := openPrivate(t, dir)
	closed := false
	defer func() {
		if !closed {
			_ = sb2.Close()
		}
	}()
	if l := left(t, "", append(pids1, pids2...), id1, id2); len(l.pids) > 0 || len(l.cgroups) > 0 {
		t.Errorf("after a crash and a new Open: the old sandboxes' processes %v and cgroups %v are left", l.pids, l.cgroups)
	}
	if hs, err := sb2.Runtime().List(ctx); err != nil || len(hs) != 0 {
		var names []string
		for _, h := range hs {
			names = append(names, h.ID)
		}
		t.Errorf("after a new Open: List = %v, %v; want no sandbox", names, err)
	}

	// Graceful stop: a sandbox still out is destroyed, and the daemon's shims end too.
	id3, pids3 := acquire(t, sb2)
	ids = append(ids, id3)
	closed = true
	if err := sb2.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	if l := left(t, address, pids3, id1, id2, id3); !l.empty() {
		t.Errorf("after a graceful Close: processes %v, cgroups %v and shims %v are left", l.pids, l.cgroups, l.shims)
	}
}

// sweep removes by hand whatever a failed run of the test left, so that one failure does
// not leave containers running on the machine: the sandboxes' processes, the daemon's
// shims, the sandboxes' cgroups and the mounts under dir.
func sweep(t *testing.T, address, dir string, ids []string) {
	for _, id := range ids {
		for _, pid := range sandboxPids(t, id) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	for _, pid := range shimsOf(address) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	time.Sleep(200 * time.Millisecond)
	for _, id := range ids {
		for _, cg := range sandboxCgroups(t, id) {
			_ = os.Remove(cg)
		}
	}
	_ = syscall.Unmount(filepath.Join(dir, "containerd", "root"), syscall.MNT_DETACH)
}
