package ctrdlocal_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/childproc"
	"github.com/gauntlet-rl/gauntlet/pkg/ctrdlocal"
	"github.com/gauntlet-rl/gauntlet/pkg/ctrdlocal/ctrdtest"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/ctrd"
)

func TestStartAnswersAndRestarts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local server; -short runs unit tests only")
	}
	srv := ctrdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := srv.Client("gauntlet-test")
	if err != nil {
		t.Fatal(err)
	}
	v, err := c.Version(ctx)
	c.Close()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(v.Version, "1.") && !strings.HasPrefix(v.Version, "2.") {
		t.Fatalf("unexpected containerd version %q", v.Version)
	}
	// The snapshotter gauntlet relies on is loaded; CRI is not.
	c, _ = srv.Client("gauntlet-test")
	defer c.Close()
	resp, err := c.IntrospectionService().Plugins(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var overlay, cri bool
	for _, p := range resp.Plugins {
		if p.Type == "io.containerd.snapshotter.v1" && p.ID == "overlayfs" && p.InitErr == nil {
			overlay = true
		}
		if p.Type == "io.containerd.grpc.v1" && p.ID == "cri" {
			cri = true
		}
	}
	if !overlay || cri {
		t.Fatalf("plugins: overlayfs loaded=%v, cri present=%v; want true, false", overlay, cri)
	}
	pid := srv.Pid()
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if srv.Pid() == pid || srv.Pid() == 0 {
		t.Fatalf("pid after restart = %d, before %d", srv.Pid(), pid)
	}
	if _, err := c.Version(ctx); err != nil {
		t.Fatalf("version after restart: %v", err)
	}
}

func TestStartKillsLeftoverAndRejectsBadOptions(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local server; -short runs unit tests only")
	}
	ctx := context.Background()
	if _, err := ctrdlocal.Start(ctx, ctrdlocal.Options{}); err == nil || !strings.Contains(err.Error(), "Options.Dir") {
		t.Fatalf("empty Dir: err = %v", err)
	}
	long := "/tmp/" + strings.Repeat("x", 120)
	if _, err := ctrdlocal.Start(ctx, ctrdlocal.Options{Dir: long}); err == nil || !strings.Contains(err.Error(), "too long") {
		t.Fatalf("long Dir: err = %v", err)
	}
	if _, err := ctrdlocal.Start(ctx, ctrdlocal.Options{Dir: t.TempDir(), RootTmpfsBytes: -1}); err == nil || !strings.Contains(err.Error(), "RootTmpfsBytes") {
		t.Fatalf("negative tmpfs: err = %v", err)
	}

	dir, err := os.MkdirTemp("", "gctrd")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	first, err := ctrdlocal.Start(ctx, ctrdlocal.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Kill()
	// A second Start on the same Dir, as after a crash, kills the first daemon.
	second, err := ctrdlocal.Start(ctx, ctrdlocal.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer second.Stop(ctx)
	select {
	case <-waitExit(first):
	case <-time.After(10 * time.Second):
		t.Fatal("the first daemon still runs after a second Start on its Dir")
	}
	if _, err := os.Stat(filepath.Join(dir, "containerd.pid")); err != nil {
		t.Fatalf("pid file: %v", err)
	}
}

func waitExit(s *ctrdlocal.Server) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		for s.Pid() != 0 {
			time.Sleep(10 * time.Millisecond)
		}
		close(ch)
	}()
	return ch
}

// TestOCIRuntimesReadOnlyInDaemonNamespace checks that the daemon's mount namespace shows
// crun (and runc) on a read-only bind mount, so crun skips copying itself per call, and
// that the host's mount table is left alone.
func TestOCIRuntimesReadOnlyInDaemonNamespace(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local server; -short runs unit tests only")
	}
	srv := ctrdtest.Start(t)
	mounts := func(pid string) map[string]string { // mount point -> per-mount options
		b, err := os.ReadFile("/proc/" + pid + "/mountinfo")
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 5 {
				out[f[4]] = f[5]
			}
		}
		return out
	}
	daemon, host := mounts(strconv.Itoa(srv.Pid())), mounts("self")
	checked := 0
	for _, name := range []string{"crun", "runc"} {
		p, err := exec.LookPath(name)
		if err != nil {
			continue
		}
		if p, err = filepath.EvalSymlinks(p); err != nil {
			t.Fatal(err)
		}
		checked++
		opts, ok := daemon[p]
		if !ok || !strings.HasPrefix(opts, "ro") {
			t.Errorf("%s in the daemon's mount namespace: mounted=%v options %q, want a read-only bind mount", p, ok, opts)
		}
		if _, ok := host[p]; ok {
			t.Errorf("%s is a mount point in the host's namespace: the launcher must not touch the host's mounts", p)
		}
	}
	if checked == 0 {
		t.Fatal("neither crun nor runc is installed (scripts/deps.sh installs both)")
	}
}

// TestStopEndsShims: a daemon that dies (a crash, or a kill -9 of its owner) leaves its
// shims running, each with its containers; Stop ends them, container processes
// included, so nothing of the daemon survives its owner's cleanup.
func TestStopEndsShims(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local server; -short runs unit tests only")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "gctrd")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	srv, err := ctrdlocal.Start(ctx, ctrdlocal.Options{Dir: dir, RootTmpfsBytes: ctrdtest.RootTmpfsBytes})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = srv.Purge(ctx)
			_ = srv.Stop(ctx)
		}
	}()
	agentBin, err := ctrd.BuildAgent(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	rt, err := ctrd.New(ctx, ctrd.Options{Address: srv.Address(), StateDir: t.TempDir(), AgentBinary: agentBin})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	if _, err := rt.Create(ctx, sandbox.Spec{}); err != nil {
		t.Fatal(err)
	}
	shims := processesWith("containerd-shim", srv.Address())
	var agents []int // the agents the shims run
	for _, pid := range processesWith(ctrd.AgentPath, "") {
		if slices.Contains(shims, parentOf(pid)) {
			agents = append(agents, pid)
		}
	}
	if len(shims) == 0 || len(agents) == 0 {
		t.Fatalf("after a sandbox was created: shims %v for %s running agents %v, want one of each at least", shims, srv.Address(), agents)
	}
	var cgroups []string
	for _, pid := range agents {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if f := strings.SplitN(line, ":", 3); len(f) == 3 && f[1] == "pids" {
				cgroups = append(cgroups, filepath.Join("/sys/fs/cgroup/pids", f[2]))
			}
		}
	}
	if len(cgroups) == 0 && !fileExists("/sys/fs/cgroup/cgroup.controllers") {
		t.Fatal("the agents' pids cgroups were not found")
	}
	if err := srv.Kill(); err != nil { // the daemon dies as with its owner
		t.Fatal(err)
	}
	stopped = true
	if err := srv.Stop(ctx); err != nil {
		t.Errorf("stop: %v", err)
	}
	for _, pid := range append(shims, agents...) {
		if err := childproc.WaitGone(pid, 5*time.Second); err != nil {
			b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
			t.Errorf("after Stop, process %d (%q) still runs", pid, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	for _, cg := range cgroups {
		if fileExists(cg) {
			t.Errorf("after Stop, the cgroup %s of a container is left", cg)
		}
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// processesWith lists the processes whose argv[0] contains prog and whose command line
// contains arg ("" for any).
func processesWith(prog, arg string) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		argv0, _, _ := strings.Cut(string(b), "\x00")
		if strings.Contains(argv0, prog) && strings.Contains(string(b), arg) {
			out = append(out, pid)
		}
	}
	return out
}

// parentOf is pid's parent process id, or 0.
func parentOf(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	st := string(b)
	f := strings.Fields(st[strings.LastIndexByte(st, ')')+1:])
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}
