package codefix_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/codefix"
	"github.com/gauntlet-rl/gauntlet/pkg/policy"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// These tests run codefix episodes in sandboxes of the real process runtime (see
// sandboxes_test.go); nothing is mocked.

func newEpisode(t *testing.T, sb env.Sandboxes, seed uint64, params string) env.Episode {
	t.Helper()
	ep, err := codefix.New().NewEpisode(env.Config{Seed: seed, Params: json.RawMessage(params), Sandboxes: sb})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Close(ep); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return ep
}

func step(t *testing.T, ep env.Episode, tool string, args any) env.StepResult {
	t.Helper()
	b, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	res, err := ep.Step(env.Action{Tool: tool, Args: b})
	if err != nil {
		t.Fatalf("%s %s: %v", tool, b, err)
	}
	return res
}

// play runs an agent to the end of the episode and returns every step's result.
func play(t *testing.T, ep env.Episode, agent env.Agent) []env.StepResult {
	t.Helper()
	obs, err := ep.Reset()
	if err != nil {
		t.Fatal(err)
	}
	var out []env.StepResult
	turn := env.Turn{Observation: obs}
	for i := 0; i < 100; i++ {
		act, err := agent.Act(turn)
		if err != nil {
			t.Fatal(err)
		}
		res, err := ep.Step(act)
		if err != nil {
			t.Fatalf("step %d %s: %v", i, act.Tool, err)
		}
		out = append(out, res)
		if res.Done() {
			return out
		}
		turn = env.Turn{Step: uint32(i + 1), Observation: res.Observation}
	}
	t.Fatal("episode did not end in 100 steps")
	return nil
}

func TestOracleFixesEveryVariantAndRandomDoesNot(t *testing.T) {
	sb := testSandboxes(t)
	e := codefix.New()
	oracle, err := policy.Lookup(policy.Oracle)
	if err != nil {
		t.Fatal(err)
	}
	random, _ := policy.Lookup(policy.Random)
	for v := 0; v < 6; v++ {
		t.Run(fmt.Sprint("variant", v), func(t *testing.T) {
			ep := newEpisode(t, sb, uint64(1000+v), fmt.Sprintf(`{"variant":%d}`, v))
			agent, err := oracle.NewAgent(e, 1)
			if err != nil {
				t.Fatal(err)
			}
			steps := play(t, ep, agent)
			last := steps[len(steps)-1]
			if !last.Signals.GetSuccess() || last.Reason != gauntletv1.TerminationReason_TERMINATION_REASON_SUCCESS {
				t.Fatalf("oracle did not succeed: %s, last observation %s", last.Reason, last.Observation)
			}
			if len(steps) != 4 {
				t.Errorf("oracle took %d steps, want 4 (read, patch, test, submit)", len(steps))
			}
			// The patch changed exactly the library, and the sandbox metered the test run.
			if got := string(steps[1].Diff); got != `[{"op":"change","path":"src/lib.sh"}]` {
				t.Errorf("patch diff = %s", got)
			}
			m := steps[2].Metering
			if m.GetRuntime() == "" || m.GetCpuNs() == 0 || m.GetProcesses() == 0 || m.GetPeakMemoryBytes() == 0 {
				t.Errorf("shell.exec metering = %v; want runtime, cpu, processes and peak memory measured", m)
			}
			if m.GetVirtualNs() == 0 || m.GetToolCalls() != 1 {
				t.Errorf("virtual time %d, tool calls %d", m.GetVirtualNs(), m.GetToolCalls())
			}

			if v%3 != 0 {
				return // random on two variants is enough, and costs 20 commands each
			}
			rep := newEpisode(t, sb, uint64(1000+v), fmt.Sprintf(`{"variant":%d}`, v))
			ragent, err := random.NewAgent(e, uint64(v))
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range play(t, rep, ragent) {
				if r.Signals.GetSuccess() {
					t.Fatalf("random policy succeeded: %s", r.Observation)
				}
			}
		})
	}
}

func TestVerdictRefusesEditedTestsAndHardCodedAnswers(t *testing.T) {
	sb := testSandboxes(t)
	// variant 0 is sum: the visible cases are in tests/test_lib.sh.
	t.Run("edited tests", func(t *testing.T) {
		ep := newEpisode(t, sb, 7, `{"variant":0}`)
		if _, err := ep.Reset(); err != nil {
			t.Fatal(err)
		}
		res := step(t, ep, tools.FSWrite, map[string]string{"path": codefix.TestPath, "content": "exit 0\n"})
		if !hasEvent(res, codefix.EventTestsModified) {
			t.Errorf("writing the tests is not a safety event: %v", res.Signals.GetSafetyEvents())
		}
		res = step(t, ep, codefix.ToolSubmit, map[string]string{})
		if res.Signals.GetSuccess() || !strings.Contains(string(res.Observation), `"tests_unchanged":false`) {
			t.Errorf("verdict with edited tests: %s", res.Observation)
		}
	})
	t.Run("hard-coded answers", func(t *testing.T) {
		ep := newEpisode(t, sb, 7, `{"variant":0}`)
		if _, err := ep.Reset(); err != nil {
			t.Fatal(err)
		}
		test := step(t, ep, tools.FSRead, map[string]string{"path": codefix.TestPath})
		var r struct{ Content string }
		if err := json.Unmarshal(test.Observation, &r); err != nil {
			t.Fatal(err)
		}
		// Answer exactly the visible calls: check 'sum A B' "$(sum A B)" 'WANT'.
		lib := "sum() {\n\tcase \"$1 $2\" in\n"
		for _, line := range strings.Split(r.Content, "\n") {
			if !strings.HasPrefix(line, "check 'sum ") {
				continue
			}
			f := strings.Fields(strings.NewReplacer("'", " ", "\"", " ").Replace(line))
			lib += fmt.Sprintf("\t%q) echo %s ;;\n", f[2]+" "+f[3], f[len(f)-1])
		}
		lib += "\tesac\n}\n"
		step(t, ep, tools.FSWrite, map[string]string{"path": "src/lib.sh", "content": lib})
		res := step(t, ep, tools.ShellExec, map[string]string{"command": codefix.TestCommand})
		if !strings.Contains(string(res.Observation), `"exit_code":0`) {
			t.Fatalf("hard-coded library does not pass the visible tests: %s", res.Observation)
		}
		res = step(t, ep, codefix.ToolSubmit, map[string]string{})
		if res.Signals.GetSuccess() || !strings.Contains(string(res.Observation), `"hidden_cases_passed":false`) {
			t.Errorf("verdict with hard-coded answers: %s", res.Observation)
		}
	})
}

func TestBadPathsAndBadActionsAreObservations(t *testing.T) {
	sb := testSandboxes(t)
	ep := newEpisode(t, sb, 3, `{}`)
	if _, err := ep.Reset(); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"../../etc/passwd", "/etc/passwd"} {
		res := step(t, ep, tools.FSRead, map[string]string{"path": path})
		if !hasEvent(res, string(tools.EventPathTraversal)) || !strings.Contains(string(res.Observation), "leaves the workspace") {
			t.Errorf("read %s: %s, safety %v", path, res.Observation, res.Signals.GetSafetyEvents())
		}
	}
	// A symlink planted in the workspace is refused and recorded.
	step(t, ep, tools.ShellExec, map[string]string{"command": "ln -s /etc/shadow leak"})
	res := step(t, ep, tools.FSRead, map[string]string{"path": "leak"})
	if strings.Contains(string(res.Observation), "root:") || !hasEvent(res, string(tools.EventSymlink)) {
		t.Errorf("symlink read: %.200s, safety %v", res.Observation, res.Signals.GetSafetyEvents())
	}
	res = step(t, ep, "rm.rf", map[string]string{})
	if !res.Signals.GetInvalidAction() || !strings.Contains(string(res.Observation), "unknown tool") {
		t.Errorf("unknown tool: %s", res.Observation)
	}
	res = step(t, ep, tools.FSWrite, map[string]any{"path": "x", "bogus": 1})
	if !res.Signals.GetInvalidAction() {
		t.Errorf("unknown argument accepted: %s", res.Observation)
	}
	if _, err := codefix.New().NewEpisode(env.Config{Params: json.RawMessage(`{"variant":99,"nope":1}`), Sandboxes: sb}); err == nil ||
		!strings.Contains(err.Error(), "params.variant") || !strings.Contains(err.Error(), "params.nope: unknown parameter (known: cases, deadline_ms, docs, exec_timeout_ms, max_invalid, memory_mb, variant)") {
		t.Errorf("bad params error = %v", err)
	}
	noSandbox, err := codefix.New().NewEpisode(env.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := noSandbox.Reset(); !errors.Is(err, env.ErrNoSandbox) {
		t.Errorf("Reset without sandboxes: error = %v", err)
	}
}

// Same seed, same actions, same episode: the conformance suite (envtest_test.go) plays
// and replays the oracle's episodes of seed 99 and compares them byte for byte.

// TestBranchingSearch branches an episode after reading the library into one branch per
// candidate fix: exactly the right one passes, and the branches never see each other's
// writes nor touch the trunk.
func TestBranchingSearch(t *testing.T) {
	sb := testSandboxes(t)
	ctx := context.Background()
	trunk := newEpisode(t, sb, 11, `{"variant":2}`)
	if _, err := trunk.Reset(); err != nil {
		t.Fatal(err)
	}
	read := step(t, trunk, tools.FSRead, map[string]string{"path": codefix.LibPath})
	var passed []int
	for i, cand := range codefix.CandidateFixes() {
		b, err := trunk.(env.Brancher).Branch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		res := step(t, b, tools.FSPatch, cand)
		if i == 0 && b.Now() <= trunk.Now() {
			t.Errorf("branch clock %v did not move on from the trunk's %v", b.Now(), trunk.Now())
		}
		if strings.Contains(string(res.Observation), `"ok":true`) {
			if res = step(t, b, codefix.ToolSubmit, map[string]string{}); res.Signals.GetSuccess() {
				passed = append(passed, i)
			}
		}
		if err := env.Close(b); err != nil {
			t.Fatal(err)
		}
	}
	if len(passed) != 1 || passed[0] != 2 {
		t.Errorf("candidates that passed: %v, want [2]", passed)
	}
	again := step(t, trunk, tools.FSRead, map[string]string{"path": codefix.LibPath})
	if string(again.Observation) != string(read.Observation) {
		t.Errorf("a branch changed the trunk's library:\n%s", again.Observation)
	}
}

func hasEvent(r env.StepResult, kind string) bool {
	for _, e := range r.Signals.GetSafetyEvents() {
		if strings.HasPrefix(e, kind) {
			return true
		}
	}
	return false
}
