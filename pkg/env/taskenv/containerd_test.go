package taskenv_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/taskenv"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"

	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes/runtimestest"
)

// TestOnContainerd: task episodes run on the containerd runtime as on process, in the
// task's own image, built from its Dockerfile through a local registry (FROM
// debian:bookworm-slim through the registry as the Docker Hub mirror): the oracle
// succeeds and a no-op agent fails, the agent's paths are the task's, and the verifier
// cannot be fooled. The tasks are ones whose images need no apt-get (a build takes
// seconds); `gauntlet tasks check` covers the rest (cmd/gauntlet, docs/tasks.md).
func TestOnContainerd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds task images and runs containerd; -short runs unit tests only")
	}
	c := runtimestest.Config(t, runtimes.Containerd)
	c.Images = runtimestest.Images(t)
	sb := runtimestest.OpenConfig(t, c)
	for _, id := range []string{"codefix/sum", "shell/count-errors", "data/transpose"} {
		t.Run(id, func(t *testing.T) { oracleSucceedsNoopFails(t, sb, id) })
	}
	t.Run("paths", func(t *testing.T) { pathsAreTheTasks(t, sb) })
	t.Run("fooled", func(t *testing.T) { verifierCannotBeFooled(t, sb) })
}

// TestContainerdRootIsTheTasksImage: on containerd the sandbox's root is the task's
// image (Debian, as its Dockerfile says, not the runtime's busybox), /app is the
// image's /app moved into the workspace, and what the agent writes outside the
// workspace does not reach the verifier's fork.
func TestContainerdRootIsTheTasksImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a task image and runs containerd; -short runs unit tests only")
	}
	c := runtimestest.Config(t, runtimes.Containerd)
	c.Images = runtimestest.Images(t)
	sb := runtimestest.OpenConfig(t, c)
	dir := writeTask(t, "#!/bin/bash\n"+
		"test -f /app/marker && test ! -e /usr/local/bin/planted && test -f /workspace/app/kept && cat /etc/debian_version | grep -q '^12' && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n", "10.0")
	if err := os.MkdirAll(filepath.Join(dir, "environment", "app"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "environment", "Dockerfile"), []byte("FROM debian:bookworm-slim\nWORKDIR /app\nCOPY app/ /app/\nRUN touch /app/marker\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "environment", "app", "data.txt"), []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ds, p := own(dir)
	ep, err := taskenv.New().NewEpisode(env.Config{Seed: 1, Params: p, Sandboxes: sb, Datasets: ds})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Close(ep) })
	if _, err := ep.Reset(); err != nil {
		t.Fatal(err)
	}
	res, err := ep.Step(act(tools.ShellExec, map[string]string{"command": "cat /etc/debian_version; ls; readlink /app; touch kept /usr/local/bin/planted && ls /usr/local/bin"}))
	if err != nil {
		t.Fatal(err)
	}
	var obs struct {
		ExitCode int    `json:"exit_code"`
		Stdout   string `json:"stdout"`
	}
	_ = json.Unmarshal(res.Observation, &obs)
	if want := "data.txt\nmarker\n/workspace/app\nplanted\n"; obs.ExitCode != 0 || !strings.HasPrefix(obs.Stdout, "12.") || !strings.HasSuffix(obs.Stdout, want) {
		t.Errorf("in the sandbox: %s; want Debian 12, the image's /app in the workspace and a program planted, ending %q", res.Observation, want)
	}
	res, err = ep.Step(env.Action{Tool: taskenv.ToolSubmit})
	if err != nil {
		t.Fatal(err)
	}
	if v := verdictOf(t, step{res: res}); !v.Pass {
		t.Errorf("verdict %+v", v)
	}
}
