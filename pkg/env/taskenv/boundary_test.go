package taskenv_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/taskenv"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes/runtimestest"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
	"github.com/gauntlet-rl/gauntlet/pkg/tasks/taskstest"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// taskFaults is a user-defined profile of the faults codefix's episodes meet at their
// sandbox's boundaries, for a task: storage (a full disk for one file, slow files under
// /app), resources (a throttled CPU, a leaking memory limit) and DNS (the allowed host's
// lookups answered NXDOMAIN half of the time).
const taskFaults = `name: task-faults
faults:
  - {id: full, kind: disk_full, match: {paths: ["/app/notes.txt"]}}
  - {id: slow, kind: io_latency, match: {paths: ["/app/*"]}, params: {mean_ms: 30, jitter_ms: 0}}
  - {id: cpu, kind: cpu_throttle, params: {cpu_fraction: 0.5}}
  - {id: leak, kind: memory_leak, params: {limit_mb: 24, mb_per_min: 1}}
  - {id: nx, kind: dns_nxdomain, probability: 0.5, match: {hosts: [releases.example.test]}}
`

// TestTaskBoundaryFaults: a task episode gets the storage, resource and DNS faults of its
// plan as codefix's do (package boundary), on both runtimes: each fires, on the step that
// met it (the ambient ones on the first), the verdict stays honest (the verifier runs in
// a fork with the sandbox's own limits and no fault: the right answer, written under the
// faults, passes), and the same plan and seed replay to the same steps and faults. The
// task is net/latest-release's, on an image with no package to install (containerd runs
// it on its image; process on the host's root).
func TestTaskBoundaryFaults(t *testing.T) {
	cps, err := plans.CompileCustomProfiles([]*gauntletv1.CustomProfile{{Name: "task-faults", SpecYaml: taskFaults}})
	if err != nil {
		t.Fatal(err)
	}
	plan, err := cps.Plan(7, "task-faults", taskenv.New().Spec().Services)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "release")
	src := filepath.Join(dataset, "net", "latest-release")
	for p, c := range map[string]string{
		"instruction.md":         "",
		"task.toml":              "",
		"tests/test.sh":          "",
		"environment/Dockerfile": "FROM debian:bookworm-slim\nWORKDIR /app\n",
	} {
		if c == "" {
			b, err := os.ReadFile(filepath.Join(src, p))
			if err != nil {
				t.Fatal(err)
			}
			c = string(b)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte(c), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, rt := range []string{runtimes.Process, runtimes.Containerd} {
		t.Run(rt, func(t *testing.T) {
			c := runtimestest.Config(t, rt)
			if rt == runtimes.Containerd {
				if testing.Short() {
					t.Skip("builds a task image and runs containerd; -short runs unit tests only")
				}
				c.Images = runtimestest.Images(t)
			}
			runBoundaryFaults(t, runtimestest.OpenConfig(t, c), plan, dir)
		})
	}
}

// runBoundaryFaults plays the task at dir under plan twice on sb.
func runBoundaryFaults(t *testing.T, sb env.Sandboxes, plan *gauntletv1.FaultPlan, dir string) {
	const (
		answer = `printf '2.10.1\n' > /app/VERSION; printf 'c0ffee00d15ea5e5ba5eba11facade0ddba11cafe0b0e5c0de5eed5ca1ab1e5\n' > /app/SHA256; echo written`
		// One process grows to 40 MiB (dd's block buffer), so the OOM killer's victim is
		// always dd and the shell that reports its death always survives: with several
		// big processes which one dies, and so what the observation says, varies.
		alloc  = `dd if=/dev/zero of=/dev/null bs=41943040 count=1 status=none && echo allocated`
		lookup = `for i in 1 2 3 4 5 6 7 8; do getent hosts ` + taskstest.ReleasesHost + ` >/dev/null; echo rc=$?; done`
	)
	actions := []env.Action{
		act(tools.FSWrite, map[string]string{"path": "notes.txt", "content": "plan\n"}),
		act(tools.ShellExec, map[string]string{"command": alloc}),
		act(tools.ShellExec, map[string]string{"command": lookup}),
		act(tools.ShellExec, map[string]string{"command": answer}),
		act(tools.FSRead, map[string]string{"path": "VERSION"}),
		{Tool: taskenv.ToolSubmit},
	}
	play := func() []env.StepResult {
		in, err := inject.NewInjector(plan)
		if err != nil {
			t.Fatal(err)
		}
		ds, p := own(dir)
		ep, err := taskenv.New().NewEpisode(env.Config{Seed: 1, Params: p, Sandboxes: sb, Datasets: ds, Faults: in})
		if err != nil {
			t.Fatal(err)
		}
		defer env.Close(ep)
		if _, err := ep.Reset(); err != nil {
			t.Fatal(err)
		}
		var out []env.StepResult
		for i, a := range actions {
			res, err := ep.Step(a)
			if err != nil {
				t.Fatalf("step %d (%s): %v", i, a.Tool, err)
			}
			out = append(out, res)
		}
		return out
	}
	steps := play()
	obs := func(i int) string { return string(steps[i].Observation) }
	kinds := func(i int) map[string]int {
		m := map[string]int{}
		for _, f := range steps[i].Faults {
			m[f.Kind]++
		}
		return m
	}

	// Storage: the agent's file tool meets the full disk, with the kernel's error, and
	// its commands' writes under /app the slow disk.
	if !strings.Contains(obs(0), "no space left on device") || kinds(0)["disk_full"] != 1 {
		t.Errorf("disk_full: %s, faults %v", obs(0), steps[0].Faults)
	}
	if k := kinds(3); k["io_latency"] == 0 || !strings.Contains(obs(3), "written") {
		t.Errorf("io_latency on the command's writes under /app: %s, faults %v", obs(3), steps[3].Faults)
	}
	// Resources: recorded on the first step; a 40 MiB allocation the task's own limit
	// allows is killed under the leak's 24 MiB.
	if k := kinds(0); k["cpu_throttle"] != 1 || k["memory_leak"] != 1 || steps[0].Faults[0].Kind != "cpu_throttle" {
		t.Errorf("ambient faults: %v, want cpu_throttle and memory_leak first on the first step", steps[0].Faults)
	}
	if strings.Contains(obs(1), "allocated") || !strings.Contains(obs(1), `"exit_code":137`) {
		t.Errorf("memory_leak: a 40 MiB allocation fit under 24 MiB: %s", obs(1))
	}
	// DNS: some lookups of the allowed host fail (getent asks for IPv6 and IPv4
	// addresses: a command fails when both are refused), each refusal recorded on the
	// egress service, naming the host.
	if n := kinds(2)["dns_nxdomain"]; n == 0 || strings.Count(obs(2), "rc=0") == 0 || strings.Count(obs(2), "rc=2") == 0 {
		t.Errorf("dns_nxdomain: %s, faults %v: want some of the eight lookups failed, each recorded", obs(2), steps[2].Faults)
	}
	for _, f := range steps[2].Faults {
		if f.Kind == "dns_nxdomain" && (f.Target != taskenv.EgressService || !strings.Contains(f.Detail, taskstest.ReleasesHost)) {
			t.Errorf("dns fault recorded as %v", f)
		}
	}
	// The verdict: the right answer, written under the faults, passes.
	last := steps[len(steps)-1]
	if v := verdictOf(t, step{res: last}); !v.Pass || !last.Signals.Success {
		t.Errorf("verdict under faults: %s", last.Observation)
	}

	// Replay: the same plan and seed, the same steps and faults.
	again := play()
	rec := func(s []env.StepResult) []string {
		var out []string
		for i, r := range s {
			out = append(out, fmt.Sprintf("step %d obs %s virtual %d", i, r.Observation, r.Metering.VirtualNs))
			for _, f := range r.Faults {
				out = append(out, fmt.Sprintf("step %d %s %s %s %s @%d", i, f.FaultId, f.Kind, f.Target, f.Detail, f.AtVirtualNs))
			}
		}
		return out
	}
	if a, b := rec(steps), rec(again); !slices.Equal(a, b) {
		t.Errorf("replay differs:\n%s\n---\n%s", strings.Join(a, "\n"), strings.Join(b, "\n"))
	}
}
