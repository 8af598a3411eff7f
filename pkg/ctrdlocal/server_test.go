package ctrdlocal_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/ctrdlocal"
	"github.com/gauntlet-rl/gauntlet/pkg/ctrdlocal/ctrdtest"
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
