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
)

// TestPrivateContainerdIsRestarted: the private containerd of a containerd runtime, killed
// with SIGKILL, is restarted by the Sandboxes' supervisor; Ready names it meanwhile, and
// the runtime answers again on the restarted daemon.
func TestPrivateContainerdIsRestarted(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local server; -short runs unit tests only")
	}
	dir := t.TempDir()
	c := runtimes.Config{Runtime: runtimes.Containerd, StateDir: dir, AgentBinary: runtimestest.AgentBinary(t)}
	ctx := context.Background()
	sb, err := runtimes.Open(ctx, c, childproctest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := sb.Close(); err != nil {
			t.Error(err)
		}
	}()
	sup := sb.Supervisor()
	if sup == nil {
		t.Fatal("a private containerd without a supervisor")
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- sup.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-ran; err != nil {
			t.Error(err)
		}
	}()
	if err := sb.Ready(); err != nil {
		t.Fatalf("Ready of a fresh runtime: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "containerd", "containerd.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	await := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("not within a minute: %s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	await("Ready names the dead containerd", func() bool {
		err := sb.Ready()
		return err != nil && strings.Contains(err.Error(), "containerd exited unexpectedly")
	})
	await("Ready once containerd is back", func() bool { return sb.Ready() == nil })
	if _, err := sb.Runtime().List(ctx); err != nil {
		t.Fatalf("List on the restarted containerd: %v", err)
	}
	if sup.Restarts() != 1 {
		t.Errorf("Restarts() = %d, want 1", sup.Restarts())
	}
}
