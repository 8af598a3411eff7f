package process_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// TestMemoryHogsFailAsCommands: commands that blow through a small memory limit, one after
// another and several at once, and a workspace filled with files (memory of the sandbox's
// cgroup that no kill gives back), each fail as commands with the OOM noted, never as an
// error of the runtime, and the sandbox runs commands after every one. The process
// runtime has no long-lived agent in the sandbox's cgroup (the runtime that meters and
// cleans up is outside it), so the containerd runtime's defect does not apply; this holds
// it so.
func TestMemoryHogsFailAsCommands(t *testing.T) {
	rt := open(t, t.TempDir())
	ctx := context.Background()
	h, err := rt.Create(ctx, sandbox.Spec{Limits: sandbox.Limits{MemoryBytes: 24 << 20, Pids: 256, DiskBytes: 64 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Destroy(context.Background(), h.ID) })
	sh := func(script string) sandbox.ExecRequest {
		return sandbox.ExecRequest{Argv: []string{"sh", "-c", script}, Timeout: 60 * time.Second}
	}
	alive := func(what string) {
		t.Helper()
		res, err := rt.Exec(ctx, h.ID, sh("echo alive"))
		if err != nil || res.ExitCode != 0 || string(res.Stdout) != "alive\n" {
			t.Fatalf("after %s: %v, exit %d, %q %q", what, err, res.ExitCode, res.Stdout, res.Stderr)
		}
	}
	ws, err := rt.WorkspaceDir(ctx, h.ID)
	if err != nil {
		t.Fatal(err)
	}
	for round := range 3 {
		res, err := rt.Exec(ctx, h.ID, sh("head -c 41943040 /dev/zero > /workspace/fill"))
		if err != nil {
			t.Fatalf("fill round %d: the command turned into an error of the runtime: %v", round, err)
		}
		if res.ExitCode == 0 {
			t.Fatalf("fill round %d: 40 MiB of files fit a 24 MiB limit", round)
		}
		if err := os.Remove(filepath.Join(ws, "fill")); err != nil {
			t.Fatalf("fill round %d: %v", round, err)
		}
		alive("a fill")
	}
	hog := sh(`for i in 1 2 3 4; do (x=$(head -c 41943040 /dev/zero | tr '\0' a); echo ${#x}) & done; wait; x=$(head -c 41943040 /dev/zero | tr '\0' a); echo ${#x}`)
	for round := range 8 {
		res, err := rt.Exec(ctx, h.ID, hog)
		if err != nil {
			t.Fatalf("round %d: the hog turned into an error of the runtime: %v", round, err)
		}
		if res.ExitCode == 0 {
			t.Fatalf("round %d: 40 MiB fit a 24 MiB limit: %q", round, res.Stdout)
		}
		if !slices.ContainsFunc(res.Events, func(e sandbox.Event) bool { return e.Kind == sandbox.EventOOMKill }) {
			t.Fatalf("round %d: no oom_kill event: exit %d, events %v", round, res.ExitCode, res.Events)
		}
		alive("a hog")
	}
}
