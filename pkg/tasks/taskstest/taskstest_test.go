package taskstest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/tasks"
)

func makeTask(t *testing.T, toml, solve, test string) *tasks.Task {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"task.toml":                 toml,
		"instruction.md":            "x\n",
		"environment/Dockerfile":    "FROM debian:bookworm-slim\nWORKDIR /app\nCOPY app/ /app/\n",
		"environment/app/input.txt": "in\n",
		"tests/test.sh":             test,
		"solution/solve.sh":         solve,
	}
	for rel, c := range files {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(c), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	task, err := tasks.Load(dir, "t")
	if err != nil {
		t.Fatal(err)
	}
	return task
}

// TestRunLayout: the solution sees /app and /solution but not /tests; the verifier sees
// /app as the solution left it and /tests; the task's workspace folder is never written.
func TestRunLayout(t *testing.T) {
	if err := Require(); err != nil {
		t.Fatal(err)
	}
	task := makeTask(t, "",
		"#!/bin/bash\nset -e\n[ ! -e /tests ] || { echo tests visible; exit 1; }\ncat /app/input.txt > /app/out.txt\necho solved >> /app/out.txt\n",
		"#!/bin/bash\n[ ! -e /solution ] || echo solution-visible\n[ \"$(pwd)\" = /app ] && grep -q solved /app/out.txt && [ -f /tests/test.sh ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n")
	res, err := Run(context.Background(), task, true)
	if err != nil {
		t.Fatal(err)
	}
	if res.Rewards[tasks.RewardName] != 1 || strings.Contains(res.TestOutput, "solution-visible") {
		t.Errorf("rewards %v, solve %q, test %q", res.Rewards, res.SolveOutput, res.TestOutput)
	}
	if _, err := os.Stat(filepath.Join(task.Environment.Context, "app", "out.txt")); err == nil {
		t.Error("the run wrote into the task's own folder")
	}
}

func TestRunVerifierFailures(t *testing.T) {
	if err := Require("sleep"); err != nil {
		t.Fatal(err)
	}
	silent := makeTask(t, "", "#!/bin/bash\n", "#!/bin/bash\necho nothing written\n")
	if _, err := Run(context.Background(), silent, false); !errors.Is(err, tasks.ErrNoReward) {
		t.Errorf("verifier that writes nothing: %v", err)
	}
	slow := makeTask(t, "[verifier]\ntimeout_sec = 0.5\n", "#!/bin/bash\n", "#!/bin/bash\nsleep 30\necho 1 > /logs/verifier/reward.txt\n")
	if _, err := Run(context.Background(), slow, false); err == nil || !strings.Contains(err.Error(), "timed out") {
		t.Errorf("verifier past its timeout: %v", err)
	}
	garbage := makeTask(t, "", "#!/bin/bash\n", "#!/bin/bash\necho passed > /logs/verifier/reward.txt\n")
	if _, err := Run(context.Background(), garbage, false); err == nil || !strings.Contains(err.Error(), "not one finite number") {
		t.Errorf("verifier that writes words: %v", err)
	}
}
