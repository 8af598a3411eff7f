package main

import (
	"bytes"
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes/runtimestest"
	"github.com/gauntlet-rl/gauntlet/pkg/tasks/taskstest"
)

// writeFiles writes path: content under dir; ".sh" files are executable.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for rel, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if strings.HasSuffix(rel, ".sh") {
			mode = 0o755
		}
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
}

func runTasksCmd(args ...string) (string, string, error) {
	var out, errOut bytes.Buffer
	err := runMain(context.Background(), append([]string{"tasks"}, args...), &out, &errOut)
	return out.String(), errOut.String(), err
}

// TestTasksValidateListsEveryProblem: validate exits with an error and names every problem
// of every broken task, and still counts the good ones.
func TestTasksValidateListsEveryProblem(t *testing.T) {
	root := t.TempDir()
	if out, _, err := runTasksCmd("generate", "--n", "3", "--seed", "5", root); err != nil {
		t.Fatalf("generate: %v %s", err, out)
	}
	writeFiles(t, root, map[string]string{
		"broken-a/task.toml":              "[agent]\ntimeout_sec = -1\n[verifier]\nretries = 3\n",
		"broken-a/instruction.md":         "do it\n",
		"broken-a/environment/Dockerfile": "FROM debian:bookworm-slim\n",
		"nested/broken-b/task.toml":       "[metadata]\ndifficulty = \"impossible\"\n",
		"nested/broken-b/tests/test.sh":   "#!/bin/bash\n",
	})
	out, _, err := runTasksCmd("validate", root)
	if err == nil {
		t.Fatalf("validate passed a broken dataset:\n%s", out)
	}
	for _, want := range []string{
		"BAD broken-a:", "agent.timeout_sec", "verifier.retries: unknown key", "tests/test.sh: missing",
		"BAD nested/broken-b:", "metadata.difficulty", "instruction.md: missing", "environment: missing",
		"3 tasks valid, 2 invalid",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("validate output lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(err.Error(), "2 invalid") {
		t.Errorf("error %v", err)
	}

	out, _, err = runTasksCmd("validate", filepath.Join(root, "gen-000000-sum"))
	if err != nil || !strings.Contains(out, "1 tasks valid, 0 invalid") {
		t.Errorf("validate of one good task: %v\n%s", err, out)
	}
}

func TestTasksLsAndDescribe(t *testing.T) {
	root := t.TempDir()
	if _, _, err := runTasksCmd("generate", "--n", "6", root); err != nil {
		t.Fatal(err)
	}
	out, _, err := runTasksCmd("ls", root, "--tag", "sum", "--difficulty", "easy")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "gen-000000-sum") || strings.Contains(out, "gen-000003-sum") || !strings.Contains(out, "1 of 6 tasks") {
		t.Errorf("ls --tag sum --difficulty easy:\n%s", out)
	}
	out, _, err = runTasksCmd("ls", "--glob", "gen-00000[45]-*", "--json", root)
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 2 || !strings.Contains(lines[0], `"id":"gen-000004-count"`) {
		t.Errorf("ls --glob --json:\n%s", out)
	}
	if _, _, err := runTasksCmd("ls", root, "--difficulty", "nightmare"); err == nil {
		t.Error("ls accepted an unknown difficulty")
	}

	out, _, err = runTasksCmd("describe", filepath.Join(root, "gen-000004-count"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"digest:", "sha256:", "difficulty:", "medium", "timeouts:", "agent 2m0s, verifier 30s", "metadata.seed:", "Generated task 4"} {
		if !strings.Contains(out, want) {
			t.Errorf("describe lacks %q:\n%s", want, out)
		}
	}
	if _, _, err := runTasksCmd("describe", root); err == nil {
		t.Error("describe of a folder that is no task succeeded")
	}
}

// TestTasksCheck: tasks check plays tasks of the in-repo dataset through the episode
// runner on the process runtime and passes them (oracle succeeds, no-op fails); a task
// whose tests pass without the work, or whose solution does not solve it, fails the
// command and is named. A canary passes when its oracle fails, and a canary its oracle
// solves fails the command.
func TestTasksCheck(t *testing.T) {
	// The host net/latest-release allows, served on the loopback and reached by name
	// through the runtime's host map.
	remote := httptest.NewServer(taskstest.ReleasesHandler())
	t.Cleanup(remote.Close)
	out, errOut, err := runTasksCmd("check", "--data-dir", t.TempDir(), "--glob", "codefix/sum", "--glob", "data/status-summary", "--glob", "python/fix-median", "--glob", "canary/*",
		"--glob", "net/*", "--sandbox.hosts", taskstest.ReleasesHost+"="+remote.Listener.Addr().String(), "../../datasets/gauntlet")
	if err != nil {
		t.Fatalf("check: %v\n%s%s", err, out, errOut)
	}
	for _, want := range []string{"ok   codefix/sum  oracle {\"reward\":1}  no-op {\"reward\":0}", "ok   data/status-summary", "ok   python/fix-median",
		"ok   canary/predict-draw  oracle {\"reward\":0}  no-op {\"reward\":0}  (canary: the oracle must fail)",
		"ok   net/latest-release  oracle {\"reward\":1}  no-op {\"reward\":0}", "5 of 5 tasks pass"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	root := t.TempDir()
	task := func(test, solve string) map[string]string {
		return map[string]string{
			"task.toml":      "version = \"1.0\"\n[verifier]\ntimeout_sec = 10.0\n[agent]\ntimeout_sec = 10.0\n",
			"instruction.md": "Write done.txt in /app.\n", "environment/Dockerfile": "FROM debian:bookworm-slim\nWORKDIR /app\n",
			"tests/test.sh": test, "solution/solve.sh": solve,
		}
	}
	files := map[string]string{}
	for name, fs := range map[string]map[string]string{
		"good":      task("#!/bin/bash\n[ -f /app/done.txt ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n", "#!/bin/bash\ntouch done.txt\n"),
		"lenient":   task("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n", "#!/bin/bash\ntouch done.txt\n"),
		"unsolved":  task("#!/bin/bash\n[ -f /app/done.txt ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n", "#!/bin/bash\ntrue\n"),
		"no-reward": task("#!/bin/bash\nexit 3\n", "#!/bin/bash\ntrue\n"),
		"solvable-canary": func() map[string]string {
			fs := task("#!/bin/bash\n[ -f /app/done.txt ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n", "#!/bin/bash\ntouch done.txt\n")
			fs["task.toml"] += "[metadata]\ncanary = true\n"
			return fs
		}(),
	} {
		for p, c := range fs {
			files[name+"/"+p] = c
		}
	}
	writeFiles(t, root, files)
	out, _, err = runTasksCmd("check", "--data-dir", t.TempDir(), root)
	if err == nil || !strings.Contains(err.Error(), "4 of 5 tasks fail") {
		t.Fatalf("check of a dataset with broken tasks: %v\n%s", err, out)
	}
	for _, want := range []string{
		"ok   good", "FAIL lenient\n  a no-op agent succeeds", "FAIL unsolved\n  oracle did not succeed",
		"FAIL no-reward\n  oracle: step 1 of no-reward-oracle: tasks: verifier failed: task no-reward: the verifier wrote no reward.txt or reward.json (test.sh exited 3)\n",
		"FAIL solvable-canary\n  the oracle passes a canary", "1 of 5 tasks pass",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestTasksCheckOnContainerd: tasks check on the containerd runtime, each task in its
// own image built from its Dockerfile through a local registry, passes a representative
// part of the in-repo dataset: a codefix bug, a shell task, a data task, a Python task
// whose image installs python3 with apt-get, and the task that reaches an allowed host
// (served on the loopback by runtimestest.Config).
// The whole dataset, checked by hand, is in docs/benchmarks.md (its 10 apt-get builds
// take minutes).
func TestTasksCheckOnContainerd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds task images and runs containerd; -short runs unit tests only")
	}
	c := runtimestest.Config(t, runtimes.Containerd)
	im := runtimestest.Images(t)
	ids := []string{"codefix/sum", "shell/count-errors", "data/transpose", "python/fix-median", "net/latest-release"}
	args := []string{"check", "--data-dir", t.TempDir(), "--sandbox.runtime", runtimes.Containerd, "--sandbox.pool-size", "0", "--sandbox.hosts", c.Hosts.String(),
		"--sandbox.state-dir", c.StateDir, "--sandbox.containerd", c.Containerd, "--sandbox.agent", c.AgentBinary,
		"--images.registry", im.Registry, "--images.docker-hub-mirror", im.DockerHubMirror, "--images.cache-dir", im.CacheDir}
	for _, id := range ids {
		args = append(args, "--glob", id)
	}
	out, errOut, err := runTasksCmd(append(args, "../../datasets/gauntlet")...)
	if err != nil {
		t.Fatalf("check: %v\n%s%s", err, out, errOut)
	}
	for _, id := range ids {
		if want := "ok   " + id + "  oracle {\"reward\":1}  no-op {\"reward\":0}"; !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if want := "5 of 5 tasks pass (oracle succeeds, no-op fails) on the containerd runtime"; !strings.Contains(out, want) {
		t.Errorf("output lacks %q:\n%s", want, out)
	}
}
