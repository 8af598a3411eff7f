package codefix_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
)

// TestCodefixCommandsMeetStorageFaults: on the process runtime the agent's
// commands meet the profile's storage faults through the FUSE layer: the command sees
// ENOSPC, the step records each fault (target sandbox/shell.exec, detail "<op> <path>:
// <what>"), and a branch meets exactly what its parent meets next.
func TestCodefixCommandsMeetStorageFaults(t *testing.T) {
	ep := resetUnderProfile(t, runtimes.Process, "coin-disk", "name: coin-disk\nfaults:\n"+
		"  - {id: coin, kind: disk_full, probability: 0.5, match: {paths: [\"/notes/*\"], ops: [create]}}\n")
	shell := func(ep env.Episode) (string, []string) {
		t.Helper()
		cmd := "mkdir -p notes; rm -f notes/*; for i in $(seq 1 8); do echo $i > notes/n$i || echo failed $i; done"
		args, _ := json.Marshal(tools.ExecArgs{Command: cmd})
		r, err := ep.Step(env.Action{Tool: tools.ShellExec, Args: args})
		if err != nil {
			t.Fatal(err)
		}
		var obs struct{ Stdout, Stderr string }
		_ = json.Unmarshal(r.Observation, &obs)
		var fired []string
		for _, f := range r.Faults {
			if f.Target == "sandbox/"+tools.ShellExec {
				fired = append(fired, f.FaultId+" "+f.Kind+" "+f.Detail)
			}
		}
		return obs.Stdout + obs.Stderr, fired
	}
	out, fired := shell(ep)
	if len(fired) == 0 || len(fired) == 8 {
		t.Fatalf("a probability-0.5 disk_full fired on %d of 8 creates: %q", len(fired), fired)
	}
	if got := strings.Count(out, "No space left on device"); got != len(fired) {
		t.Errorf("the command met ENOSPC %d times, %d faults recorded:\n%s", got, len(fired), out)
	}
	if !strings.HasPrefix(fired[0], "coin disk_full create /notes/n") || !strings.Contains(fired[0], ": ENOSPC /notes/n") {
		t.Errorf("recorded %q", fired[0])
	}
	br, err := ep.(env.Brancher).Branch(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Close(br) })
	// The same files again: their second creates, which a branch must draw as its
	// parent does (a fresh decider would repeat the first command's faults).
	_, parent := shell(ep)
	_, branch := shell(br)
	if strings.Join(parent, "\n") != strings.Join(branch, "\n") {
		t.Errorf("parent and branch met different faults:\n%q\n%q", parent, branch)
	}
	if strings.Join(parent, "\n") == strings.Join(fired, "\n") {
		t.Errorf("the second creates met exactly the first ones' faults: %q", parent)
	}
	t.Logf("first command: %q; next, parent and branch: %q", fired, parent)
}
