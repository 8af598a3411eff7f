package ctrd_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// TestMemoryHogsLeaveTheAgentAlive: commands that blow through a small memory limit, one
// after another and several at once, each fail as commands (killed, or an allocation
// refused) with the OOM noted, and the sandbox's agent answers after every one. Before the
// commands ran in a cgroup of their own, the agent shared theirs and died now and then under
// the pressure ("read response: EOF"), which turned the episode into an infra error.
func TestMemoryHogsLeaveTheAgentAlive(t *testing.T) {
	_, rt := start(t)
	h := mustCreate(t, rt, sandbox.Spec{Limits: sandbox.Limits{MemoryBytes: 24 << 20, Pids: 256, DiskBytes: 64 << 20}})
	// Files in the workspace are memory of the sandbox (its writable layer is a tmpfs)
	// that no kill gives back: a command that fills the limit with them leaves nothing
	// for anyone else in the cgroup it writes from.
	ws, err := rt.WorkspaceDir(context.Background(), h.ID)
	if err != nil {
		t.Fatal(err)
	}
	fill := sh("head -c 41943040 /dev/zero > /workspace/fill", 60*time.Second)
	for round := range 5 {
		res, err := rt.Exec(context.Background(), h.ID, fill)
		if err != nil {
			t.Fatalf("fill round %d: the command turned into an infra error: %v", round, err)
		}
		if res.ExitCode == 0 {
			t.Fatalf("fill round %d: 40 MiB of files fit a 24 MiB limit", round)
		}
		if err := os.Remove(filepath.Join(ws, "fill")); err != nil {
			t.Fatalf("fill round %d: %v", round, err)
		}
		alive(t, rt, h.ID)
	}
	// Four shells at once each build a 40 MiB string: any one of them alone is over the
	// limit, so the limit is hit again and again while the agent waits for them.
	hog := sh(`for i in 1 2 3 4; do (x=$(head -c 41943040 /dev/zero | tr '\0' a); echo ${#x}) & done; wait; x=$(head -c 41943040 /dev/zero | tr '\0' a); echo ${#x}`, 60*time.Second)
	for round := range 25 {
		res, err := rt.Exec(context.Background(), h.ID, hog)
		if err != nil {
			t.Fatalf("round %d: the hog turned into an infra error: %v", round, err)
		}
		if res.ExitCode == 0 {
			t.Fatalf("round %d: 40 MiB fit a 24 MiB limit: %q", round, res.Stdout)
		}
		if !hasEvent(res, sandbox.EventOOMKill, "") {
			t.Fatalf("round %d: no oom_kill event: exit %d, events %v", round, res.ExitCode, res.Events)
		}
		alive(t, rt, h.ID)
	}
	st, err := rt.Stats(context.Background(), h.ID)
	if err != nil {
		t.Fatalf("stats after the hogs: %v", err)
	}
	if st.Pids != 0 {
		t.Errorf("processes left after the hogs: %d", st.Pids)
	}
}
