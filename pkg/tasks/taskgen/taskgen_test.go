package taskgen

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/tasks"
	"github.com/gauntlet-rl/gauntlet/pkg/tasks/taskstest"
)

// TestGenerateValidDistinctReproducible: generated tasks read strictly, are all different,
// and the same seed writes the same tasks (same digests) while another seed does not.
func TestGenerateValidDistinctReproducible(t *testing.T) {
	const n = 30
	digests := func(dir string, seed uint64) []string {
		if _, err := Generate(dir, n, seed); err != nil {
			t.Fatal(err)
		}
		ds, err := tasks.LoadDataset(dir)
		if err != nil {
			t.Fatalf("generated tasks are invalid:\n%v", err)
		}
		if len(ds.Tasks) != n {
			t.Fatalf("%d tasks, want %d", len(ds.Tasks), n)
		}
		var out []string
		for _, task := range ds.Tasks {
			out = append(out, task.Digest)
		}
		return out
	}
	base := t.TempDir()
	a := digests(filepath.Join(base, "a"), 7)
	b := digests(filepath.Join(base, "b"), 7)
	c := digests(filepath.Join(base, "c"), 8)
	seen := map[string]bool{}
	for i := range a {
		if a[i] != b[i] {
			t.Errorf("task %d: same seed, digests %s and %s", i, a[i], b[i])
		}
		if a[i] == c[i] {
			t.Errorf("task %d: seeds 7 and 8 gave the same task", i)
		}
		if seen[a[i]] {
			t.Errorf("task %d repeats another", i)
		}
		seen[a[i]] = true
	}
	if _, err := Generate(filepath.Join(base, "a"), 1, 7); err == nil {
		t.Error("Generate wrote over existing tasks")
	}
	if _, err := Generate(filepath.Join(base, "d"), 0, 7); err == nil {
		t.Error("Generate accepted n = 0")
	}
}

// TestGeneratedOracleAndNoop: for one task of each kind, the oracle passes and doing
// nothing fails, on the host.
func TestGeneratedOracleAndNoop(t *testing.T) {
	if err := taskstest.Require("awk", "grep", "sort", "cmp"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := Generate(dir, 2*len(kinds), 42); err != nil {
		t.Fatal(err)
	}
	ds, err := tasks.LoadDataset(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range ds.Tasks {
		t.Run(task.ID, func(t *testing.T) {
			res, err := taskstest.Run(context.Background(), task, true)
			if err != nil {
				t.Fatal(err)
			}
			if res.Rewards[tasks.RewardName] != 1 {
				t.Errorf("oracle earned %v: %s%s", res.Rewards, res.SolveOutput, res.TestOutput)
			}
			res, err = taskstest.Run(context.Background(), task, false)
			if err != nil {
				t.Fatal(err)
			}
			if res.Rewards[tasks.RewardName] != 0 {
				t.Errorf("no-op earned %v", res.Rewards)
			}
		})
	}
}
