package datasets

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/tasks"
	"github.com/gauntlet-rl/gauntlet/pkg/tasks/taskstest"
)

// minTasks is how many tasks datasets/gauntlet must hold at least.
const minTasks = 30

var (
	// fromRE: every task builds on the Debian base the local registry serves.
	fromRE = regexp.MustCompile(`(?m)^FROM debian:bookworm(-slim)?\s*$`)
	// copyRE: the workspace the host check mounts at /app is the one the image gets.
	copyRE = regexp.MustCompile(`(?m)^COPY app/ /app/\s*$`)
)

func loadGauntlet(t *testing.T) *tasks.Dataset {
	t.Helper()
	ds, err := tasks.LoadDataset("gauntlet")
	if err != nil {
		t.Fatalf("datasets/gauntlet is not valid:\n%v", err)
	}
	return ds
}

// TestGauntletDatasetValid: every task reads strictly, has what gauntlet's tasks must have
// (a difficulty, tags, a solution, a Dockerfile on the Debian base copying the workspace),
// and the digests are distinct.
func TestGauntletDatasetValid(t *testing.T) {
	ds := loadGauntlet(t)
	if len(ds.Tasks) < minTasks {
		t.Errorf("%d tasks, want at least %d", len(ds.Tasks), minTasks)
	}
	digests := map[string]string{}
	for _, task := range ds.Tasks {
		c := task.Config
		if c.Metadata.Difficulty == "" || len(c.Tags()) == 0 || c.Metadata.Category == "" {
			t.Errorf("%s: difficulty, category and tags are required in this dataset", task.ID)
		}
		if !task.HasSolution {
			t.Errorf("%s: no solution/solve.sh", task.ID)
		}
		if task.Environment.Dockerfile == "" {
			t.Errorf("%s: no Dockerfile", task.ID)
			continue
		}
		df, err := os.ReadFile(task.Environment.Dockerfile)
		if err != nil {
			t.Fatal(err)
		}
		if !fromRE.Match(df) {
			t.Errorf("%s: the Dockerfile does not start FROM debian:bookworm(-slim)", task.ID)
		}
		_, err = os.Stat(filepath.Join(task.Environment.Context, taskstest.WorkspaceDir))
		if hasApp := err == nil; hasApp != copyRE.Match(df) {
			t.Errorf("%s: environment/app exists: %v, but the Dockerfile's COPY app/ /app/: %v", task.ID, hasApp, !hasApp)
		}
		if prev, dup := digests[task.Digest]; dup {
			t.Errorf("%s and %s have the same digest", task.ID, prev)
		}
		digests[task.Digest] = task.ID
	}
}

// TestSmokeManifest: the manifest lists tasks of datasets/gauntlet, which load with the
// same digests as in the folder.
func TestSmokeManifest(t *testing.T) {
	smoke, err := tasks.LoadDataset("smoke.json")
	if err != nil {
		t.Fatal(err)
	}
	ds := loadGauntlet(t)
	if len(smoke.Tasks) != 5 {
		t.Errorf("%d tasks in smoke.json", len(smoke.Tasks))
	}
	for _, task := range smoke.Tasks {
		full := ds.Task(strings.TrimPrefix(task.ID, "gauntlet/"))
		if full == nil || full.Digest != task.Digest {
			t.Errorf("%s: not the task of datasets/gauntlet", task.ID)
		}
	}
}

// TestGauntletOracleAndNoop runs every task on the host: its oracle solution must earn
// every reward component 1, and an agent that does nothing must not. A canary's oracle,
// an honest attempt at the impossible, must fail too.
func TestGauntletOracleAndNoop(t *testing.T) {
	if err := taskstest.Require("python3", "jq", "timeout", "cmp", "sha256sum"); err != nil {
		t.Fatal(err)
	}
	ds := loadGauntlet(t)
	ctx := context.Background()
	for _, task := range ds.Tasks {
		t.Run(task.ID, func(t *testing.T) {
			if len(task.Config.Environment.AllowedHosts) > 0 {
				// The host harness runs scripts with no network at all; tasks check plays
				// this task in a sandbox, its host served on the loopback (TestTasksCheck).
				t.Skipf("reaches %v, which only a sandbox's allow-list can", task.Config.Environment.AllowedHosts)
			}
			res, err := taskstest.Run(ctx, task, true)
			if err != nil {
				t.Fatalf("oracle: %v", err)
			}
			if canary := task.Config.Metadata.Canary; canary && solved(res.Rewards) {
				t.Errorf("the oracle solved a canary: %v\ntest.sh said:\n%s", res.Rewards, res.TestOutput)
			} else if !canary && !solved(res.Rewards) {
				t.Errorf("oracle earned %v\nsolve.sh said:\n%s\ntest.sh said:\n%s", res.Rewards, res.SolveOutput, res.TestOutput)
			}
			res, err = taskstest.Run(ctx, task, false)
			if err != nil {
				t.Fatalf("no-op: %v", err)
			}
			if solved(res.Rewards) {
				t.Errorf("doing nothing earned %v\ntest.sh said:\n%s", res.Rewards, res.TestOutput)
			}
		})
	}
}

// solved is this dataset's success rule: every reward component is 1.
func solved(rewards map[string]float64) bool {
	if len(rewards) == 0 {
		return false
	}
	for _, v := range rewards {
		if v != 1 {
			return false
		}
	}
	return true
}
