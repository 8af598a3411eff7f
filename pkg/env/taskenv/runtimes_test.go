package taskenv_test

import (
	"encoding/json"
	"fmt"
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

// TestInTheTasksImage: task episodes run in the task's own image, built from its
// Dockerfile through a local registry (FROM debian:bookworm-slim through the registry as
// the Docker Hub mirror), on containerd (the image is the container's root) and on
// process (the image unpacked under the sandbox's read-only root): the oracle succeeds
// and a no-op agent fails, the agent's paths are the task's, and the verifier cannot be
// fooled. The tasks are ones whose images need no apt-get (a build takes seconds);
// `gauntlet tasks check` covers the rest (cmd/gauntlet, docs/tasks.md).
func TestInTheTasksImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds task images and runs containerd; -short runs unit tests only")
	}
	images := runtimestest.Images(t)
	for _, rt := range []string{runtimes.Containerd, runtimes.Process} {
		t.Run(rt, func(t *testing.T) {
			c := runtimestest.Config(t, rt)
			c.Images = images
			sb := runtimestest.OpenConfig(t, c)
			for _, id := range []string{"codefix/sum", "shell/count-errors", "data/transpose"} {
				t.Run(id, func(t *testing.T) { oracleSucceedsNoopFails(t, sb, id) })
			}
			t.Run("paths", func(t *testing.T) { pathsAreTheTasks(t, sb) })
			t.Run("fooled", func(t *testing.T) { verifierCannotBeFooled(t, sb) })
		})
	}
}

// TestRootIsTheTasksImage: with an image store, on either runtime, the sandbox's root
// is the task's image (Debian, as its Dockerfile says: not containerd's busybox nor the
// process runtime's host /usr), /app is the image's /app (what a RUN step wrote there
// included) in the workspace, the image's ENV holds, and what the agent writes outside the workspace (where it
// can: containerd's root is writable) does not reach the verifier's fork.
func TestRootIsTheTasksImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a task image and runs containerd; -short runs unit tests only")
	}
	images := runtimestest.Images(t)
	for _, rt := range []string{runtimes.Process, runtimes.Containerd} {
		t.Run(rt, func(t *testing.T) {
			c := runtimestest.Config(t, rt)
			c.Images = images
			rootIsTheTasksImage(t, runtimestest.OpenConfig(t, c))
		})
	}
}

func rootIsTheTasksImage(t *testing.T, sb env.Sandboxes) {
	dir := writeTask(t, "#!/bin/bash\n"+
		"test -f /app/marker && test ! -e /usr/local/bin/planted && test -f /workspace/app/kept && cat /etc/debian_version | grep -q '^12' && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n", "10.0")
	if err := os.MkdirAll(filepath.Join(dir, "environment", "app"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "environment", "Dockerfile"), []byte("FROM debian:bookworm-slim\nWORKDIR /app\nENV TASK_VAR=from-image\nCOPY app/ /app/\nRUN touch /app/marker\n"), 0o644); err != nil {
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
	res, err := ep.Step(act(tools.ShellExec, map[string]string{"command": "echo \"var=$TASK_VAR\"; cat /etc/debian_version; ls; readlink /app; touch kept; touch /usr/local/bin/planted 2>/dev/null; true"}))
	if err != nil {
		t.Fatal(err)
	}
	var obs struct {
		ExitCode int    `json:"exit_code"`
		Stdout   string `json:"stdout"`
	}
	_ = json.Unmarshal(res.Observation, &obs)
	variable := "var=from-image\n" // the image's ENV
	if want := "data.txt\nmarker\n/workspace/app\n"; obs.ExitCode != 0 || !strings.HasPrefix(obs.Stdout, variable+"12.") || !strings.HasSuffix(obs.Stdout, want) {
		t.Errorf("in the sandbox: %s; want %q, Debian 12 and the image's /app in the workspace, ending %q", res.Observation, variable, want)
	}
	res, err = ep.Step(env.Action{Tool: taskenv.ToolSubmit})
	if err != nil {
		t.Fatal(err)
	}
	if v := verdictOf(t, step{res: res}); !v.Pass {
		t.Errorf("verdict %+v", v)
	}
}

// TestTaskImagesFromWarmPool: with a warm pool, task episodes on their own image take
// their sandboxes from the pool the runtime keeps for that image, on both runtimes, and
// play as on fresh ones: over rounds of the same sandboxes, reset between episodes, the
// oracle succeeds and a no-op fails.
func TestTaskImagesFromWarmPool(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a task image and runs containerd; -short runs unit tests only")
	}
	images := runtimestest.Images(t)
	for _, rt := range []string{runtimes.Process, runtimes.Containerd} {
		t.Run(rt, func(t *testing.T) {
			c := runtimestest.Config(t, rt)
			c.Images, c.PoolSize = images, 1
			sb := runtimestest.OpenConfig(t, c)
			for round := range 3 {
				t.Run(fmt.Sprint("round ", round), func(t *testing.T) { oracleSucceedsNoopFails(t, sb, "codefix/sum") })
			}
			hs, err := sb.Runtime().List(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			pooled := 0
			for _, h := range hs {
				if strings.HasPrefix(h.Spec.Template, taskenv.Template+"@") {
					pooled++
				}
			}
			if pooled == 0 {
				t.Errorf("no sandbox of the task image's pool template among %d", len(hs))
			}
		})
	}
}
