package ctrd_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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

// TestCommandsRunInTheirOwnCgroup: on a cgroup v1 host a sandbox's commands run in a
// child cgroup that carries its limits, while the agent stays in the sandbox's cgroup
// with a reserve above them; a limit update changes both, and a restored or forked
// sandbox, or one whose commands run as another user, has the same shape.
func TestCommandsRunInTheirOwnCgroup(t *testing.T) {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		t.Skip("cgroup v2 host: the commands share the sandbox's cgroup (see cmdcgroup.go)")
	}
	_, rt := start(t)
	ctx := context.Background()
	limits := sandbox.Limits{MemoryBytes: 64 << 20, Pids: 100, CPUMillis: 500}
	h := mustCreate(t, rt, sandbox.Spec{Limits: limits})
	// shape checks where the command and the agent sit and the limits in force.
	shape := func(id string, l sandbox.Limits) {
		t.Helper()
		res := run(t, rt, id, sh("grep ':memory:' /proc/self/cgroup; grep ':memory:' /proc/1/cgroup", 10*time.Second))
		lines := strings.Fields(string(res.Stdout))
		if res.ExitCode != 0 || len(lines) != 2 {
			t.Fatalf("cgroups of a command and of the agent: exit %d %q %q", res.ExitCode, res.Stdout, res.Stderr)
		}
		cmd := strings.TrimPrefix(lines[0][strings.Index(lines[0], ":memory:"):], ":memory:")
		ag := strings.TrimPrefix(lines[1][strings.Index(lines[1], ":memory:"):], ":memory:")
		if cmd != ag+"/cmds" {
			t.Fatalf("the command runs in %s, the agent in %s: want the command in %s/cmds", cmd, ag, ag)
		}
		read := func(ctl, dir, name string) int64 {
			t.Helper()
			b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", ctl, dir, name))
			if err != nil {
				t.Fatal(err)
			}
			n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			return n
		}
		if got := read("memory", cmd, "memory.limit_in_bytes"); got != l.MemoryBytes {
			t.Errorf("commands' memory limit %d, want %d", got, l.MemoryBytes)
		}
		if got := read("memory", ag, "memory.limit_in_bytes"); got <= l.MemoryBytes {
			t.Errorf("the sandbox's memory limit %d leaves the agent nothing above the commands' %d", got, l.MemoryBytes)
		}
		if got := read("pids", cmd, "pids.max"); got != l.Pids+1 { // the agent's spawner thread is one
			t.Errorf("commands' pids.max %d, want %d", got, l.Pids+1)
		}
		if got := read("cpu", cmd, "cpu.cfs_quota_us"); got != l.CPUMillis*100 {
			t.Errorf("commands' CPU quota %d, want %d", got, l.CPUMillis*100)
		}
	}
	shape(h.ID, limits)
	// A sandbox whose commands run as a user of their own: its agent runs as that user
	// too, and moves its spawner thread through the files the runtime opened.
	u := mustCreate(t, rt, sandbox.Spec{User: "1000:1000", Limits: limits})
	shape(u.ID, limits)

	// A fault's update reaches the commands' cgroup, lowering and raising.
	lower := sandbox.Limits{MemoryBytes: 24 << 20, Pids: 50, CPUMillis: 100}
	if err := rt.UpdateLimits(ctx, h.ID, lower); err != nil {
		t.Fatal(err)
	}
	shape(h.ID, lower)
	higher := sandbox.Limits{MemoryBytes: 128 << 20, Pids: 200, CPUMillis: 1000}
	if err := rt.UpdateLimits(ctx, h.ID, higher); err != nil {
		t.Fatal(err)
	}
	shape(h.ID, higher)

	snap, err := rt.Snapshot(ctx, h.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Restore(ctx, h.ID, snap.ID); err != nil {
		t.Fatal(err)
	}
	shape(h.ID, higher)
	f, err := rt.Fork(ctx, snap.ID)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Destroy(context.Background(), f.ID) })
	shape(f.ID, f.Spec.Limits)
}
