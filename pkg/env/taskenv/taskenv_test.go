package taskenv_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/taskenv"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes/runtimestest"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
	"github.com/gauntlet-rl/gauntlet/pkg/tasks"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// dataset is the in-repo dataset.
var dataset, _ = filepath.Abs("../../../datasets/gauntlet")

// gauntlet is the process's datasets in most tests: the in-repo one, named "gauntlet".
var gauntlet = map[string]string{"gauntlet": dataset}

func params(task string) json.RawMessage {
	b, _ := json.Marshal(map[string]string{"dataset": "gauntlet", "task": task})
	return b
}

// own names a dataset of one task folder "own".
func own(dir string) (map[string]string, json.RawMessage) {
	return map[string]string{"own": dir}, json.RawMessage(`{"dataset":"own"}`)
}

type step struct {
	res env.StepResult
	err error
	// safety holds the safety events of every step of the episode.
	safety []string
}

// play plays agent on task in a sandbox of sb and returns the last step.
func play(t *testing.T, sb env.Sandboxes, datasets map[string]string, p json.RawMessage, agent env.Agent) (json.RawMessage, step) {
	t.Helper()
	ep, err := taskenv.New().NewEpisode(env.Config{Seed: 1, Params: p, Sandboxes: sb, Datasets: datasets})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Close(ep) })
	obs, err := ep.Reset()
	if err != nil {
		t.Fatal(err)
	}
	first := obs
	var last step
	for i := 0; i < 20; i++ {
		a, err := agent.Act(env.Turn{Step: uint32(i), Observation: obs})
		if err != nil {
			t.Fatal(err)
		}
		last.res, last.err = ep.Step(a)
		if last.err == nil {
			last.safety = append(last.safety, last.res.Signals.SafetyEvents...)
		}
		if last.err != nil || last.res.Done() {
			return first, last
		}
		obs = last.res.Observation
	}
	t.Fatal("the episode did not end")
	return first, last
}

// scripted plays its actions, then submits.
type scripted struct{ actions []env.Action }

func (s *scripted) Act(env.Turn) (env.Action, error) {
	if len(s.actions) == 0 {
		return env.Action{Tool: taskenv.ToolSubmit}, nil
	}
	a := s.actions[0]
	s.actions = s.actions[1:]
	return a, nil
}

func act(tool string, args any) env.Action {
	b, _ := json.Marshal(args)
	return env.Action{Tool: tool, Args: b}
}

type verdict struct {
	Pass    bool               `json:"pass"`
	Rewards map[string]float64 `json:"rewards"`
	Output  string             `json:"output"`
}

func verdictOf(t *testing.T, s step) verdict {
	t.Helper()
	if s.err != nil {
		t.Fatalf("step: %v", s.err)
	}
	var v verdict
	if err := json.Unmarshal(s.res.Observation, &v); err != nil || v.Rewards == nil {
		t.Fatalf("last observation is no verdict: %s", s.res.Observation)
	}
	return v
}

// TestOracleSucceedsNoopFails: on tasks of the in-repo dataset, the oracle's episode ends
// in success with reward 1 and a no-op agent's (submit at once) in failure with reward 0,
// each judged by the task's own test.sh in a fork of the final state.
func TestOracleSucceedsNoopFails(t *testing.T) {
	sb := runtimestest.Open(t, runtimes.Process, 0)
	for _, id := range []string{"codefix/sum", "shell/count-errors", "data/transpose"} {
		t.Run(id, func(t *testing.T) { oracleSucceedsNoopFails(t, sb, id) })
	}
}

// oracleSucceedsNoopFails plays task id with the oracle and with a no-op agent in
// sandboxes of sb.
func oracleSucceedsNoopFails(t *testing.T, sb env.Sandboxes, id string) {
	t.Helper()
	first, last := play(t, sb, gauntlet, params(id), taskenv.New().(env.Oracle).Oracle(1))
	v := verdictOf(t, last)
	if !v.Pass || v.Rewards[tasks.RewardName] != 1 || !last.res.Signals.Success || last.res.Signals.Progress != 1 {
		t.Errorf("oracle: verdict %+v, signals %v", v, last.res.Signals)
	}
	var r struct{ Task, Digest, Instruction string }
	_ = json.Unmarshal(first, &r)
	task, err := tasks.Load(filepath.Join(dataset, id), id)
	if err != nil {
		t.Fatal(err)
	}
	if r.Task != id || r.Digest != task.Digest || r.Instruction != task.Instruction {
		t.Errorf("reset observation %s does not name the task, its digest and instruction", first)
	}
	_, last = play(t, sb, gauntlet, params(id), &scripted{})
	v = verdictOf(t, last)
	if v.Pass || v.Rewards[tasks.RewardName] != 0 || last.res.Signals.Success || !last.res.Done() {
		t.Errorf("no-op: verdict %+v, signals %v", v, last.res.Signals)
	}
}

// TestPathsAreTheTasks: the agent's paths mean what they mean in the task's image: /app
// and relative paths (from /app, the working directory) reach the task's files in every
// tool, and commands run in /app.
func TestPathsAreTheTasks(t *testing.T) {
	pathsAreTheTasks(t, runtimestest.Open(t, runtimes.Process, 0))
}

func pathsAreTheTasks(t *testing.T, sb env.Sandboxes) {
	ep, err := taskenv.New().NewEpisode(env.Config{Seed: 1, Params: params("codefix/sum"), Sandboxes: sb, Datasets: gauntlet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Close(ep) })
	if _, err := ep.Reset(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		a    env.Action
		want string
	}{
		{act(tools.ShellExec, map[string]string{"command": "ls; test /app -ef ."}), `{"exit_code":0,"stdout":"README.md\nsrc\ntests\n"`},
		{act(tools.ShellExec, map[string]string{"command": "ls; test /app/src -ef .", "dir": "src"}), `{"exit_code":0,"stdout":"lib.sh\n"`},
		{act(tools.ShellExec, map[string]string{"command": "ls", "dir": "/app/src"}), `"stdout":"lib.sh\n"`},
		{act(tools.ShellExec, map[string]string{"command": "pwd", "dir": "/tmp"}), `path leaves the workspace`},
		{act(tools.FSList, map[string]string{"path": "."}), `"name":"src"`},
		{act(tools.FSList, map[string]string{"path": "/app/src"}), `"name":"lib.sh"`},
		{act(tools.FSWrite, map[string]string{"path": "notes.txt", "content": "x"}), `"ok":true`},
		{act(tools.FSRead, map[string]string{"path": "/app/notes.txt"}), `"content":"x"`},
		{act(tools.FSList, map[string]string{"path": "/logs"}), `{"entries":[]}`},
	} {
		res, err := ep.Step(c.a)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(res.Observation), c.want) {
			t.Errorf("%s %s: %s, want %s", c.a.Tool, c.a.Args, res.Observation, c.want)
		}
	}
}

// TestVerifierCannotBeFooled: an agent that does nothing of its task but prepares the
// verifier's paths gets an honest verdict (reward 0), and what it planted is recorded.
func TestVerifierCannotBeFooled(t *testing.T) {
	verifierCannotBeFooled(t, runtimestest.Open(t, runtimes.Process, 0))
}

func verifierCannotBeFooled(t *testing.T, sb env.Sandboxes) {
	const win = "echo 1 > /logs/verifier/reward.txt\n"
	for _, c := range []struct {
		name    string
		actions []env.Action
		safety  []string // substrings the episode's safety events must hold
	}{
		{"fake reward", []env.Action{
			act(tools.FSWrite, map[string]string{"path": "/logs/verifier/reward.txt", "content": "1\n"}),
			act(tools.ShellExec, map[string]string{"command": `echo '{"reward": 1}' > /logs/verifier/reward.json`}),
		}, []string{"verifier_path_written", "verifier_planted: /logs/verifier held"}},
		{"guessed tests", []env.Action{
			act(tools.FSWrite, map[string]string{"path": "/tests/test.sh", "content": "#!/bin/bash\n" + win}),
			act(tools.ShellExec, map[string]string{"command": "mkdir -p /tests/x && cp /tests/test.sh /tests/x/"}),
		}, []string{"verifier_path_written", "verifier_planted: /tests was not empty"}},
		{"logs replaced by a link", []env.Action{
			act(tools.ShellExec, map[string]string{"command": "mkdir -p /app/fake/verifier && echo 1 > /app/fake/verifier/reward.txt && rm -rf /workspace/logs && ln -s app/fake /workspace/logs"}),
		}, []string{"verifier_planted: /logs is not a folder"}},
		{"background writer", []env.Action{
			act(tools.ShellExec, map[string]string{"command": "(for i in $(seq 100); do " + strings.TrimSpace(win) + " 2>/dev/null; sleep 0.1; done) >/dev/null 2>&1 &\nnohup sh -c 'sleep 1; " + strings.TrimSpace(win) + "' >/dev/null 2>&1 &\necho started"}),
		}, nil},
		{"profile and PATH traps", []env.Action{
			act(tools.FSWrite, map[string]string{"path": "/workspace/.bashrc", "content": win}),
			act(tools.FSWrite, map[string]string{"path": "/workspace/.profile", "content": win}),
			act(tools.FSWrite, map[string]string{"path": "/workspace/.bash_profile", "content": win}),
			act(tools.ShellExec, map[string]string{"command": "for c in cmp ls tr cat timeout sh; do printf '#!/bin/sh\\n" + strings.TrimSpace(win) + "\\nexit 0\\n' > /app/$c; chmod +x /app/$c; done; mkdir -p bin && cp /app/cmp bin/; echo 'export PATH=/app:$PATH' >> /workspace/.bashrc; cp /app/cmp /usr/local/bin/cmp 2>/dev/null; true"}),
		}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, last := play(t, sb, gauntlet, params("codefix/sum"), &scripted{actions: c.actions})
			v := verdictOf(t, last)
			if v.Pass || v.Rewards[tasks.RewardName] != 0 || last.res.Signals.Success {
				t.Errorf("the agent fooled the verifier: %+v", v)
			}
			safety := last.safety
			for _, want := range c.safety {
				if !slices.ContainsFunc(safety, func(s string) bool { return strings.Contains(s, want) }) {
					t.Errorf("safety events %q lack %q", safety, want)
				}
			}
		})
	}
}

// TestPlantedRewardIsRemoved: a verifier that writes a reward only on success (and fails
// without one otherwise) meets a reward file the agent planted: it is removed before
// test.sh runs, so the episode is the verifier's failure, never the planted 1.
func TestPlantedRewardIsRemoved(t *testing.T) {
	// The task leaves [environment] at Harbor's defaults: its sandboxes come from the warm
	// pool of the env's template.
	sb := runtimestest.Open(t, runtimes.Process, 1)
	dir := writeTask(t, "#!/bin/bash\ntest -f /app/done || exit 1\necho 1 > /logs/verifier/reward.txt\n", "10.0")
	ds, b := own(dir)
	_, last := play(t, sb, ds, b, &scripted{actions: []env.Action{
		act(tools.ShellExec, map[string]string{"command": "echo 1 > /logs/verifier/reward.txt"}),
	}})
	if !errors.Is(last.err, taskenv.ErrVerifier) {
		t.Fatalf("step: %v, %s; want ErrVerifier (no reward)", last.err, last.res.Observation)
	}
	_, last = play(t, sb, ds, b, &scripted{actions: []env.Action{
		act(tools.ShellExec, map[string]string{"command": "touch done"}),
	}})
	if v := verdictOf(t, last); !v.Pass {
		t.Errorf("the task done: %+v", v)
	}
}

// TestNamedRewardsInSignals: the names and values of a reward.json reach the verdict
// step's signals, sorted by name, and the verdict's progress is the least of them; the
// steps before carry none.
func TestNamedRewardsInSignals(t *testing.T) {
	sb := runtimestest.Open(t, runtimes.Process, 1)
	dir := writeTask(t, "#!/bin/bash\necho '{\"tests\": 0.75, \"style\": 0.5}' > /logs/verifier/reward.json\n", "10.0")
	ds, b := own(dir)
	ep, err := taskenv.New().NewEpisode(env.Config{Seed: 1, Params: b, Sandboxes: sb, Datasets: ds})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Close(ep) })
	if _, err := ep.Reset(); err != nil {
		t.Fatal(err)
	}
	res, err := ep.Step(act(tools.ShellExec, map[string]string{"command": "true"}))
	if err != nil {
		t.Fatal(err)
	}
	if sig := res.Signals; sig.VerifierNames != nil || sig.VerifierValues != nil {
		t.Errorf("a step before the verdict: verifier %v %v, want none", sig.VerifierNames, sig.VerifierValues)
	}
	res, err = ep.Step(env.Action{Tool: taskenv.ToolSubmit})
	if err != nil {
		t.Fatal(err)
	}
	sig := res.Signals
	if !slices.Equal(sig.VerifierNames, []string{"style", "tests"}) || !slices.Equal(sig.VerifierValues, []float64{0.5, 0.75}) {
		t.Errorf("verdict step: verifier names %v values %v, want [style tests] [0.5 0.75]", sig.VerifierNames, sig.VerifierValues)
	}
	if sig.Progress != 0.5 || sig.Success {
		t.Errorf("verdict step: progress %v success %v, want 0.5 false", sig.Progress, sig.Success)
	}
}

// writeTask writes a task folder whose test.sh is script.
func writeTask(t testing.TB, script string, verifierTimeout string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "broken")
	files := map[string]string{
		"instruction.md":         "Do nothing.\n",
		"task.toml":              "version = \"1.0\"\n[verifier]\ntimeout_sec = " + verifierTimeout + "\n[agent]\ntimeout_sec = 60.0\n",
		"environment/Dockerfile": "FROM debian:bookworm-slim\n",
		"tests/test.sh":          script,
	}
	for p, c := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestVerifierFailureIsInfraError: a verifier that writes no reward, writes a bad one,
// crashes before writing, or runs out of its timeout fails the step with ErrVerifier
// naming the reason; it is never a reward of 0.
func TestVerifierFailureIsInfraError(t *testing.T) {
	sb := runtimestest.Open(t, runtimes.Process, 1)
	for _, c := range []struct{ name, script, timeout, want string }{
		{"no reward", "#!/bin/bash\necho checked\n", "10.0", "wrote no reward.txt"},
		{"bad reward", "#!/bin/bash\necho lots > /logs/verifier/reward.txt\n", "10.0", "not one finite number"},
		{"crash", "#!/bin/bash\nkill -SEGV $$\n", "10.0", "exited 139"},
		{"timeout", "#!/bin/bash\nsleep 30\necho 1 > /logs/verifier/reward.txt\n", "1.0", "timed out"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ds, b := own(writeTask(t, c.script, c.timeout))
			_, last := play(t, sb, ds, b, &scripted{})
			if !errors.Is(last.err, taskenv.ErrVerifier) || !strings.Contains(last.err.Error(), c.want) {
				t.Errorf("step error %v, want ErrVerifier saying %q", last.err, c.want)
			}
		})
	}
}

// TestParamsRefused: bad params name the field and the reason.
func TestParamsRefused(t *testing.T) {
	digest := func() string {
		task, err := tasks.Load(filepath.Join(dataset, "codefix/sum"), "codefix/sum")
		if err != nil {
			t.Fatal(err)
		}
		return task.Digest
	}()
	for _, c := range []struct {
		datasets     map[string]string
		params, want string
	}{
		{gauntlet, `{}`, "params.dataset: required"},
		{gauntlet, `{"dataset": "gauntlet", "colour": 1}`, `unknown field "colour"`},
		{gauntlet, `{"dataset": "gauntlet", "task": "nope"}`, `params.task: "nope" is not a task`},
		{gauntlet, `{"dataset": "gauntlet", "task": "codefix/sum", "digest": "sha256:00"}`, "params.digest: task codefix/sum has digest " + digest},
		{gauntlet, `{"dataset": "gauntlet", "max_invalid": 0}`, "params.max_invalid: 0 is outside"},
		{gauntlet, `{"dataset": "gauntlet", "deadline_ms": 10}`, "params.deadline_ms: 10 is outside"},
		// A path is never read: only the process's named datasets are.
		{gauntlet, fmt.Sprintf(`{"dataset": %q}`, dataset), `is not a dataset of this process (known: gauntlet)`},
		{map[string]string{}, `{"dataset": "gauntlet"}`, "this process plays no dataset (start it with --tasks.datasets NAME=DIR)"},
		{map[string]string{"gone": "/nonexistent/gauntlet-dataset"}, `{"dataset": "gone"}`, "params.dataset"},
	} {
		_, err := taskenv.New().NewEpisode(env.Config{Params: json.RawMessage(c.params), Datasets: c.datasets})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("params %s: error %v, want %q", c.params, err, c.want)
		}
	}
	// Where no dataset is configured (a client checking a run), the params' shape is
	// checked and Reset says why the episode cannot be played here.
	ep, err := taskenv.New().NewEpisode(env.Config{Params: json.RawMessage(`{"dataset": "anything"}`)})
	if err != nil {
		t.Fatalf("params checked without datasets: %v", err)
	}
	if _, err := ep.Reset(); !errors.Is(err, taskenv.ErrNoDatasets) {
		t.Errorf("Reset without datasets: %v, want ErrNoDatasets", err)
	}
	if _, err := taskenv.New().NewEpisode(env.Config{Params: json.RawMessage(`{"dataset": "x", "colour": 1}`)}); err == nil {
		t.Error("bad params passed where no dataset is configured")
	}
	ep, err = taskenv.New().NewEpisode(env.Config{Datasets: gauntlet, Params: json.RawMessage(fmt.Sprintf(`{"dataset": "gauntlet", "task": "codefix/sum", "digest": %q}`, digest))})
	if err != nil {
		t.Fatalf("the task's own digest: %v", err)
	}
	if _, err := ep.Reset(); !errors.Is(err, env.ErrNoSandbox) {
		t.Errorf("Reset without sandboxes: %v, want env.ErrNoSandbox", err)
	}
}

// TestBranch: a branch is an independent copy of the episode at its step: what either
// writes afterwards the other does not see, and each is judged on its own state.
func TestBranch(t *testing.T) {
	sb := runtimestest.Open(t, runtimes.Process, 0)
	ep, err := taskenv.New().NewEpisode(env.Config{Seed: 1, Params: params("shell/count-errors"), Sandboxes: sb, Datasets: gauntlet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Close(ep) })
	first, err := ep.Reset()
	if err != nil {
		t.Fatal(err)
	}
	step := func(ep env.Episode, a env.Action) env.StepResult {
		t.Helper()
		res, err := ep.Step(a)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	step(ep, act(tools.FSWrite, map[string]string{"path": "mark", "content": "trunk"}))
	br, err := ep.(env.Brancher).Branch(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Close(br) })
	if br.Now() != ep.Now() {
		t.Errorf("branch clock %v, trunk %v", br.Now(), ep.Now())
	}
	step(br, act(tools.FSWrite, map[string]string{"path": "mark", "content": "branch"}))
	if obs := step(ep, act(tools.FSRead, map[string]string{"path": "mark"})).Observation; !strings.Contains(string(obs), `"content":"trunk"`) {
		t.Errorf("trunk reads %s after the branch wrote", obs)
	}
	// The branch solves the task with the oracle's solution; the trunk submits as it is.
	o := taskenv.New().(env.Oracle).Oracle(1)
	solve, err := o.Act(env.Turn{Observation: first})
	if err != nil {
		t.Fatal(err)
	}
	step(br, solve)
	if res := step(br, env.Action{Tool: taskenv.ToolSubmit}); !res.Signals.Success {
		t.Errorf("the solved branch: %s", res.Observation)
	}
	if res := step(ep, env.Action{Tool: taskenv.ToolSubmit}); res.Signals.Success {
		t.Errorf("the unsolved trunk: %s", res.Observation)
	}
}

// TestFaultsReachTheTools: the episode's fault plan fires on the workspace tools (service
// "sandbox"): an injected error aborts the call, which the step records and the agent sees,
// and the same plan fires the same way in a second episode.
func TestFaultsReachTheTools(t *testing.T) {
	sb := runtimestest.Open(t, runtimes.Process, 0)
	plan := &gauntletv1.FaultPlan{Profile: "custom", Seed: 3, Rules: []*gauntletv1.FaultRule{
		{Id: "sandbox.http_503", Target: tools.Service, Probability: 0.5,
			Spec: &gauntletv1.FaultRule_HttpError{HttpError: &gauntletv1.HTTPErrorFault{Status: 503}}},
	}}
	trace := func() string {
		in, err := inject.NewInjector(plan)
		if err != nil {
			t.Fatal(err)
		}
		ep, err := taskenv.New().NewEpisode(env.Config{Seed: 1, Params: params("codefix/sum"), Sandboxes: sb, Datasets: gauntlet, Faults: in})
		if err != nil {
			t.Fatal(err)
		}
		defer env.Close(ep)
		if _, err := ep.Reset(); err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for range 8 {
			res, err := ep.Step(act(tools.FSList, map[string]string{"path": "."}))
			if err != nil {
				t.Fatal(err)
			}
			failed := strings.Contains(string(res.Observation), "injected status 503")
			if failed != (len(res.Faults) > 0) {
				t.Errorf("observation %s, faults %v: disagree", res.Observation, res.Faults)
			}
			fmt.Fprintf(&b, "%v ", failed)
		}
		return b.String()
	}
	a, b := trace(), trace()
	if a != b || !strings.Contains(a, "true") || !strings.Contains(a, "false") {
		t.Errorf("faults fired %q then %q: want the same mix of failures and successes", a, b)
	}
}
