//go:build linux

package process_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/process"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/sandboxtest"
)

// open returns a process runtime over dir, failing the test (never skipping) with the
// reason when the host lacks an isolation feature.
func open(t testing.TB, dir string) *process.Runtime {
	t.Helper()
	rt, err := process.New(process.Config{StateDir: dir})
	if err != nil {
		t.Fatalf("process runtime unavailable: %v", err)
	}
	// Whatever a failed test leaves is removed, so its mounts do not outlive it.
	t.Cleanup(func() {
		if rt, err := process.New(process.Config{StateDir: dir}); err == nil {
			_ = rt.Purge(context.Background())
		}
	})
	return rt
}

func TestConformance(t *testing.T) {
	sandboxtest.Run(t, func(t *testing.T, dir string) sandbox.Runtime { return open(t, dir) },
		sandboxtest.Expect(sandboxtest.Snapshots, sandboxtest.Forks, sandboxtest.WorkspaceDirs, sandboxtest.Streams, sandboxtest.Dials))
}

// TestLongSnapshotChain takes a snapshot after each of 120 changes (an episode snapshotted
// at every step) and restores the first and the last: the chain of layers is not bounded
// by the legacy overlay options page.
func TestLongSnapshotChain(t *testing.T) {
	rt := open(t, t.TempDir())
	ctx := context.Background()
	h, err := rt.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	ws, _ := rt.WorkspaceDir(ctx, h.ID)
	var snaps []string
	for i := range 120 {
		if err := os.WriteFile(filepath.Join(ws, fmt.Sprintf("step%03d", i)), []byte(fmt.Sprint(i)), 0o644); err != nil {
			t.Fatal(err)
		}
		s, err := rt.Snapshot(ctx, h.ID)
		if err != nil {
			t.Fatalf("snapshot %d: %v", i, err)
		}
		snaps = append(snaps, s.ID)
	}
	for _, c := range []struct {
		snap  int
		files string
	}{{0, "1"}, {119, "120"}, {59, "60"}} {
		if err := rt.Restore(ctx, h.ID, snaps[c.snap]); err != nil {
			t.Fatalf("restore %d: %v", c.snap, err)
		}
		res, err := rt.Exec(ctx, h.ID, sandbox.ExecRequest{Argv: []string{"sh", "-c", "ls | wc -l"}})
		if err != nil || strings.TrimSpace(string(res.Stdout)) != c.files {
			t.Fatalf("after restoring snapshot %d: %q %v, want %s files", c.snap, res.Stdout, err, c.files)
		}
	}
}

// TestRecoverAfterHostReboot plays a host reboot: the workspace mount and the cgroup are
// gone but the state files remain. Recover says ErrNotFound; Destroy cleans up.
func TestRecoverAfterHostReboot(t *testing.T) {
	dir := t.TempDir()
	rt := open(t, dir)
	ctx := context.Background()
	h, err := rt.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	ws, _ := rt.WorkspaceDir(ctx, h.ID)
	rt.Close()
	if err := unix.Unmount(ws, 0); err != nil {
		t.Fatalf("unmount: %v", err)
	}
	rt2 := open(t, dir)
	hs, err := rt2.List(ctx)
	if err != nil || len(hs) != 1 {
		t.Fatalf("list: %v %v", hs, err)
	}
	if err := rt2.Recover(ctx, hs[0]); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("recover without its mount: %v, want ErrNotFound", err)
	}
	if err := rt2.Destroy(ctx, h.ID); err != nil {
		t.Fatalf("destroy the remains: %v", err)
	}
	if hs, _ := rt2.List(ctx); len(hs) != 0 {
		t.Fatalf("list after destroy: %v", hs)
	}
}

// TestConcurrentSnapshotsAndCollection snapshots, forks and restores in several sandboxes
// while others destroy sandboxes and delete snapshots (each of which collects unused
// layers): no layer on its way into a chain is collected, and under -race no chain is
// read while it is written.
func TestConcurrentSnapshotsAndCollection(t *testing.T) {
	rt := open(t, t.TempDir())
	ctx := context.Background()
	const workers, rounds = 4, 6
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			errs <- func() error {
				h, err := rt.Create(ctx, sandbox.Spec{})
				if err != nil {
					return err
				}
				defer rt.Destroy(ctx, h.ID)
				ws, err := rt.WorkspaceDir(ctx, h.ID)
				if err != nil {
					return err
				}
				for i := range rounds {
					want := fmt.Sprintf("w%d-r%d", w, i)
					if err := os.WriteFile(filepath.Join(ws, "f"), []byte(want), 0o644); err != nil {
						return err
					}
					s, err := rt.Snapshot(ctx, h.ID)
					if err != nil {
						return fmt.Errorf("snapshot: %w", err)
					}
					f, err := rt.Fork(ctx, s.ID)
					if err != nil {
						return fmt.Errorf("fork: %w", err)
					}
					fws, err := rt.WorkspaceDir(ctx, f.ID)
					if err != nil {
						return err
					}
					got, err := os.ReadFile(filepath.Join(fws, "f"))
					if err != nil || string(got) != want {
						return fmt.Errorf("fork of round %d reads %q, %v; want %q", i, got, err, want)
					}
					if err := rt.Destroy(ctx, f.ID); err != nil {
						return fmt.Errorf("destroy fork: %w", err)
					}
					if err := os.WriteFile(filepath.Join(ws, "f"), []byte("changed"), 0o644); err != nil {
						return err
					}
					if err := rt.Restore(ctx, h.ID, s.ID); err != nil {
						return fmt.Errorf("restore: %w", err)
					}
					if got, err := os.ReadFile(filepath.Join(ws, "f")); err != nil || string(got) != want {
						return fmt.Errorf("restored round %d reads %q, %v; want %q", i, got, err, want)
					}
					if err := rt.DeleteSnapshot(ctx, s.ID); err != nil {
						return fmt.Errorf("delete snapshot: %w", err)
					}
				}
				return nil
			}()
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// A runtime closed with no sandbox left removes its cgroup and mount-point parents
// (every runtime over a throwaway state directory used to leave both behind), and one
// closed with a sandbox kept for Recover keeps them.
func TestCloseRemovesEmptyParents(t *testing.T) {
	ctx := context.Background()
	parents := func(dir string) []string {
		sum := sha256.Sum256([]byte(dir))
		id := hex.EncodeToString(sum[:6])
		out := []string{filepath.Join("/run/gauntlet-sandbox", id)}
		for _, h := range []string{"memory", "pids", "cpu", "cpuacct", ""} { // v1 hierarchies, or v2
			if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", h, "gauntlet")); err == nil {
				out = append(out, filepath.Join("/sys/fs/cgroup", h, "gauntlet", id))
			}
		}
		return out
	}
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }

	dir := t.TempDir()
	rt := open(t, dir)
	h, err := rt.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	made := 0
	for _, p := range parents(dir) {
		if exists(p) {
			made++
		}
	}
	if made < 2 {
		t.Fatalf("expected the run dir and at least one cgroup among %v", parents(dir))
	}
	if err := rt.Destroy(ctx, h.ID); err != nil {
		t.Fatal(err)
	}
	rt.Close()
	for _, p := range parents(dir) {
		if exists(p) {
			t.Errorf("%s is still there after Close", p)
		}
	}

	kept := t.TempDir()
	rt = open(t, kept)
	if _, err := rt.Create(ctx, sandbox.Spec{}); err != nil {
		t.Fatal(err)
	}
	rt.Close()
	if p := parents(kept)[0]; !exists(p) {
		t.Errorf("%s went with a sandbox still in it", p)
	}
}

// TestMeteringCountsManyProcesses runs a command that starts many children at once: each
// is counted, however many there are.
func TestMeteringCountsManyProcesses(t *testing.T) {
	rt := open(t, t.TempDir())
	ctx := context.Background()
	h, err := rt.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 7, 8, 10, 30} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			script := fmt.Sprintf("i=0; while [ $i -lt %d ]; do sleep 0.05 & i=$((i+1)); done; wait", n)
			res, err := rt.Exec(ctx, h.ID, sandbox.ExecRequest{Argv: []string{"sh", "-c", script}})
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("exec: %v exit %d stderr %q", err, res.ExitCode, res.Stderr)
			}
			// sh and its n sleeps.
			if got := res.Metering.Processes; got < int64(n+1) {
				t.Fatalf("processes %d, want at least %d", got, n+1)
			}
		})
	}
}

// TestLinks: a spec's links show workspace folders at the root, in the sandbox and in its
// forks, and the root stays read-only around them.
func TestLinks(t *testing.T) {
	rt := open(t, t.TempDir())
	ctx := context.Background()
	h, err := rt.Create(ctx, sandbox.Spec{
		Links:     map[string]string{"/app": "app", "/logs": "logs"},
		Workspace: []sandbox.File{{Path: "app/hello", Data: []byte("hi\n")}},
	})
	if err != nil {
		t.Fatal(err)
	}
	script := `cat /app/hello && mkdir -p /logs/v && echo x > /logs/v/r && cat /workspace/logs/v/r && cd /app && ls && ! mkdir /elsewhere 2>/dev/null`
	res, err := rt.Exec(ctx, h.ID, sandbox.ExecRequest{Argv: []string{"sh", "-c", script}})
	if err != nil || res.ExitCode != 0 || string(res.Stdout) != "hi\nx\nhello\n" {
		t.Fatalf("exec: %v, exit %d, %q %q", err, res.ExitCode, res.Stdout, res.Stderr)
	}
	s, err := rt.Snapshot(ctx, h.ID)
	if err != nil {
		t.Fatal(err)
	}
	f, err := rt.Fork(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	res, err = rt.Exec(ctx, f.ID, sandbox.ExecRequest{Argv: []string{"cat", "/app/hello", "/logs/v/r"}})
	if err != nil || string(res.Stdout) != "hi\nx\n" {
		t.Fatalf("exec in the fork: %v, %q %q", err, res.Stdout, res.Stderr)
	}
}

// TestImageNeedsAStore: a runtime made without an image store offers the host's root
// only: an image is refused naming the field, and PrepareImage says the store is missing.
func TestImageNeedsAStore(t *testing.T) {
	rt := open(t, t.TempDir())
	ctx := context.Background()
	if _, err := rt.Create(ctx, sandbox.Spec{Image: "127.0.0.1:5000/gauntlet/tasks:ctx-1@sha256:" + strings.Repeat("0", 64)}); !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), "image") {
		t.Errorf("create with an image: %v, want ErrInvalid naming the image", err)
	}
	if _, err := rt.PrepareImage(ctx, sandbox.ImageSource{Image: "debian:bookworm-slim"}); !errors.Is(err, sandbox.ErrUnavailable) {
		t.Errorf("prepare image: %v, want ErrUnavailable", err)
	}
}
