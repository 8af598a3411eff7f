package codefix_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/codefix"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/policy"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes/runtimestest"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// badDisk is a user-defined profile of storage and resource faults for a sandboxed env.
const badDisk = `name: bad-disk
faults:
  - {id: full, kind: disk_full, match: {paths: ["/notes.txt"]}}
  - {id: short, kind: short_write, match: {paths: ["/scratch/*"]}, params: {keep_fraction: 0.5}}
  - {id: slow, kind: io_latency, params: {mean_ms: 40, jitter_ms: 10}}
  - {id: ro, kind: read_only, probability: 0.5, match: {paths: ["/src/*"], ops: [write]}}
  - {id: cpu, kind: cpu_throttle, params: {cpu_fraction: 0.5}}
  - {id: leak, kind: memory_leak, params: {limit_mb: 24, mb_per_min: 1}}
  - {id: busy, kind: http_error, probability: 0.2, params: {status: 503, retry_after_ms: 1000}}
`

// TestCodefixUnderBoundaryFaults: a codefix episode whose plan comes from a
// profile of storage and resource faults, on both real runtimes. The agent's fs tools meet
// the storage faults with the kernel's errors, its commands run under the throttled CPU
// and the leaking memory limit (an allocation the env's own 128 MiB would allow is killed
// at the leak's 24 MiB), every fault is on its step (the ambient ones on the first), the
// oracle still fixes the bug by retrying what failed, and both runtimes meet exactly the
// same faults.
func TestCodefixUnderBoundaryFaults(t *testing.T) {
	cps, err := plans.CompileCustomProfiles([]*gauntletv1.CustomProfile{{Name: "bad-disk", SpecYaml: badDisk}})
	if err != nil {
		t.Fatal(err)
	}
	plan, err := cps.Plan(11, "bad-disk", codefix.New().Spec().Services)
	if err != nil {
		t.Fatal(err)
	}
	oracle, err := policy.Lookup(policy.Oracle)
	if err != nil {
		t.Fatal(err)
	}
	var records [][]string
	for _, rt := range []string{runtimes.Process, runtimes.Containerd} {
		t.Run(rt, func(t *testing.T) {
			sb := runtimestest.Open(t, rt, 1)
			in, err := inject.NewInjector(plan)
			if err != nil {
				t.Fatal(err)
			}
			ep, err := codefix.New().NewEpisode(env.Config{Seed: 3, Params: json.RawMessage(`{"variant":0}`), Sandboxes: sb, Faults: in})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := env.Close(ep); err != nil {
					t.Errorf("close: %v", err)
				}
			})
			if _, err := ep.Reset(); err != nil {
				t.Fatal(err)
			}
			var rec []string
			var steps []env.StepResult
			do := func(tool string, args any) env.StepResult {
				t.Helper()
				b, _ := json.Marshal(args)
				res, err := ep.Step(env.Action{Tool: tool, Args: b})
				if err != nil {
					t.Fatalf("%s: %v", tool, err)
				}
				steps = append(steps, res)
				return res
			}
			// The agent's own actions first: notes on a full disk, a scratch file that
			// is written short, a command that needs 40 MiB.
			r := do(tools.FSWrite, map[string]string{"path": "notes.txt", "content": "plan: read lib\n"})
			if !strings.Contains(string(r.Observation), "fs.write: create notes.txt: no space left on device") && !strings.Contains(string(r.Observation), "injected status 503") {
				t.Fatalf("fs.write on a full disk: %s", r.Observation)
			}
			r = do(tools.FSWrite, map[string]string{"path": "scratch/a.txt", "content": "12345678"})
			if !strings.Contains(string(r.Observation), "fs.write: write scratch/a.txt: short write") && !strings.Contains(string(r.Observation), "injected status 503") {
				t.Fatalf("short write: %s", r.Observation)
			}
			r = do(tools.ShellExec, map[string]string{"command": `x=$(head -c 41943040 /dev/zero | tr '\0' a); echo ${#x}`})
			var sh struct {
				ExitCode int    `json:"exit_code"`
				Stdout   string `json:"stdout"`
			}
			_ = json.Unmarshal(r.Observation, &sh)
			if sh.Stdout == "41943040\n" {
				t.Fatalf("a 40 MiB allocation fit under the 24 MiB leak limit: %s", r.Observation)
			}
			rec = append(rec, fmt.Sprintf("alloc failed: %v", sh.ExitCode != 0 || strings.Contains(string(r.Observation), "503")))
			// Then the oracle fixes the bug through the same faults.
			agent, err := oracle.NewAgent(codefix.New(), 3)
			if err != nil {
				t.Fatal(err)
			}
			turn := env.Turn{Observation: json.RawMessage(`{}`)}
			for i := 0; i < 20 && !r.Done(); i++ {
				a, err := agent.Act(turn)
				if err != nil {
					t.Fatal(err)
				}
				r = do(a.Tool, a.Args)
				turn = env.Turn{Step: uint32(len(steps)), Observation: r.Observation}
			}
			if !r.Done() || !r.Signals.Success {
				t.Fatalf("the oracle did not fix the bug under storage faults: %s", r.Observation)
			}
			kinds, shell := map[string]int{}, map[string]int{}
			for i, s := range steps {
				for _, f := range s.Faults {
					if f.Target == "sandbox/"+tools.ShellExec {
						// The commands' own faults depend on the programs' syscalls
						// (dash and coreutils on process, busybox on containerd).
						shell[f.Kind]++
						continue
					}
					kinds[f.Kind]++
					rec = append(rec, fmt.Sprintf("step %d %s %s %s %s @%d", i, f.FaultId, f.Kind, f.Target, f.Detail, f.AtVirtualNs))
				}
				rec = append(rec, fmt.Sprintf("step %d virtual %d", i, s.Metering.VirtualNs))
				if s.Metering.Runtime != rt {
					t.Errorf("step %d metered by %q", i, s.Metering.Runtime)
				}
			}
			for _, k := range []string{"disk_full", "short_write", "io_latency", "cpu_throttle", "memory_leak"} {
				if kinds[k] == 0 {
					t.Errorf("no %s recorded on any step: %v", k, kinds)
				}
			}
			if shell[catalogue.KindIOLatency] == 0 {
				t.Errorf("%s: storage faults on commands %v; want io_latency", rt, shell)
			}
			first := steps[0].Faults
			if len(first) < 2 || first[0].Kind != "cpu_throttle" || first[1].Kind != "memory_leak" {
				t.Errorf("the first step does not start with the ambient faults: %v", first)
			}
			t.Logf("%s: %d steps, faults by kind %v, on commands %v\n%s", rt, len(steps), kinds, shell, strings.Join(rec, "\n"))
			records = append(records, rec)
		})
	}
	if len(records) == 2 && !slices.Equal(records[0], records[1]) {
		t.Errorf("process and containerd met different faults:\n%s\n---\n%s", strings.Join(records[0], "\n"), strings.Join(records[1], "\n"))
	}
}

// TestCodefixClockSkew: under clock_skew the agent's commands read a wall clock an
// hour ahead on the process runtime (libfaketime over the host's /usr), while gauntlet's
// own commands and the host keep the real one; containerd's static busybox cannot be
// skewed that way, and the record of the episode says the fault was not applied.
func TestCodefixClockSkew(t *testing.T) {
	const spec = "name: skewed\nfaults:\n  - {id: skew, kind: clock_skew, params: {offset_ms: 3600000, drift_ppm: 50}}\n"
	for _, rt := range []string{runtimes.Process, runtimes.Containerd} {
		t.Run(rt, func(t *testing.T) {
			ep := resetUnderProfile(t, rt, "skewed", spec)
			res := step(t, ep, tools.ShellExec, map[string]string{"command": "date +%s"})
			host := time.Now().Unix()
			var sh struct {
				Stdout string `json:"stdout"`
			}
			if err := json.Unmarshal(res.Observation, &sh); err != nil {
				t.Fatal(err)
			}
			got, err := strconv.ParseInt(strings.TrimSpace(sh.Stdout), 10, 64)
			if err != nil {
				t.Fatalf("date: %s", res.Observation)
			}
			if len(res.Faults) != 1 || res.Faults[0].Kind != "clock_skew" {
				t.Fatalf("first step's faults: %v", res.Faults)
			}
			detail := res.Faults[0].Detail
			skew := got - host
			t.Logf("%s: sandbox clock - host clock = %d s; recorded %q", rt, skew, detail)
			switch rt {
			case runtimes.Process:
				if skew < 3600-60 || skew > 3600+60 || strings.Contains(detail, "not applied") {
					t.Fatalf("process: the agent's clock is %d s off the host's, want about 3600 (detail %q)", skew, detail)
				}
			default:
				if skew < -60 || skew > 60 || !strings.Contains(detail, "not applied") {
					t.Fatalf("%s: clock %d s off, detail %q: want the real clock and the fault recorded as not applied", rt, skew, detail)
				}
			}
		})
	}
}

// TestCodefixMemoryLeakOverSteps: memory_leak shrinks the sandbox's memory limit with
// the episode's virtual time, step by step: the same 24 MiB allocation fits at step 0
// (64 MiB) and is killed at step 1 (the leak of 6000 MiB a minute has taken the limit to
// its 16 MiB floor after the first command's 500 virtual ms), on both runtimes.
func TestCodefixMemoryLeakOverSteps(t *testing.T) {
	const spec = "name: leaky\nfaults:\n  - {id: leak, kind: memory_leak, params: {limit_mb: 64, mb_per_min: 6000}}\n"
	for _, rt := range []string{runtimes.Process, runtimes.Containerd} {
		t.Run(rt, func(t *testing.T) {
			ep := resetUnderProfile(t, rt, "leaky", spec)
			alloc := `x=$(head -c 25165824 /dev/zero | tr '\0' a); echo ${#x}`
			var outs []string
			for i := 0; i < 2; i++ {
				res := step(t, ep, tools.ShellExec, map[string]string{"command": alloc})
				var sh struct {
					ExitCode int    `json:"exit_code"`
					Stdout   string `json:"stdout"`
				}
				if err := json.Unmarshal(res.Observation, &sh); err != nil {
					t.Fatal(err)
				}
				outs = append(outs, fmt.Sprintf("step %d: exit %d %q (limits %v)", i, sh.ExitCode, sh.Stdout, res.Signals.Limits))
			}
			t.Logf("%s:\n%s", rt, strings.Join(outs, "\n"))
			if !strings.Contains(outs[0], `exit 0 "25165824\n"`) || strings.Contains(outs[1], "exit 0") || !strings.Contains(outs[1], "oom_kill") {
				t.Fatalf("want the allocation to fit at step 0 and be OOM-killed at step 1:\n%s", strings.Join(outs, "\n"))
			}
		})
	}
}

// resetUnderProfile starts a codefix episode (seed 3) on runtime rt under the one-profile
// YAML spec named name (plan seed 4), reset and closed when the test ends.
func resetUnderProfile(t *testing.T, rt, name, spec string) env.Episode {
	t.Helper()
	cps, err := plans.CompileCustomProfiles([]*gauntletv1.CustomProfile{{Name: name, SpecYaml: spec}})
	if err != nil {
		t.Fatal(err)
	}
	plan, err := cps.Plan(4, name, codefix.New().Spec().Services)
	if err != nil {
		t.Fatal(err)
	}
	in, err := inject.NewInjector(plan)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := codefix.New().NewEpisode(env.Config{Seed: 3, Sandboxes: runtimestest.Open(t, rt, 0), Faults: in})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Close(ep) })
	if _, err := ep.Reset(); err != nil {
		t.Fatal(err)
	}
	return ep
}
