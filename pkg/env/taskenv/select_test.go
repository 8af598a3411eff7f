package taskenv_test

import (
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
	"github.com/gauntlet-rl/gauntlet/pkg/tasks"
	"github.com/gauntlet-rl/gauntlet/pkg/tasks/taskgen"
)

// pickOf is the task an episode of seed with params p plays.
func pickOf(t *testing.T, datasets map[string]string, p json.RawMessage, seed uint64) (string, string, error) {
	t.Helper()
	ep, err := taskenv.New().NewEpisode(env.Config{Seed: seed, Params: p, Datasets: datasets})
	if err != nil {
		return "", "", err
	}
	id, digest := taskenv.TaskOf(ep)
	return id, digest, nil
}

// TestSelectionPicksBySeed: the filters choose the tasks, the seed one of them (seed
// modulo their count, in ID order), on every process alike; pinned tasks are picked the
// same way from the pinned list.
func TestSelectionPicksBySeed(t *testing.T) {
	ds, err := tasks.LoadDataset(dataset)
	if err != nil {
		t.Fatal(err)
	}
	f := tasks.Filter{Tags: []string{"python"}, Difficulties: []string{"easy"}}
	want := ds.Select(f)
	if len(want) < 2 {
		t.Fatalf("the in-repo dataset has %d easy python tasks, want several", len(want))
	}
	sel, err := taskenv.Select("gauntlet", ds, f)
	if err != nil {
		t.Fatal(err)
	}
	if len(sel.Tasks) != len(want) {
		t.Fatalf("pinned %d tasks, want %d", len(sel.Tasks), len(want))
	}
	byFilter := json.RawMessage(`{"dataset": "gauntlet", "tags": ["python"], "difficulty": ["easy"]}`)
	for seed := range uint64(2 * len(want)) {
		w := want[seed%uint64(len(want))]
		for name, p := range map[string]json.RawMessage{"filters": byFilter, "pinned": sel.Params()} {
			id, digest, err := pickOf(t, gauntlet, p, seed)
			if err != nil {
				t.Fatalf("%s, seed %d: %v", name, seed, err)
			}
			if id != w.ID || digest != w.Digest {
				t.Errorf("%s, seed %d: task %s %s, want %s %s", name, seed, id, digest, w.ID, w.Digest)
			}
		}
	}
	// A glob and several difficulties.
	globbed := json.RawMessage(`{"dataset": "gauntlet", "glob": ["codefix/*", "shell/b*"], "difficulty": ["easy", "medium"]}`)
	var seen []string
	for seed := range uint64(20) {
		id, _, err := pickOf(t, gauntlet, globbed, seed)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(id, "codefix/") && id != "shell/backup-tar" {
			t.Errorf("seed %d: %s passes no glob", seed, id)
		}
		if !slices.Contains(seen, id) {
			seen = append(seen, id)
		}
	}
	if len(seen) != 7 {
		t.Errorf("20 seeds over 7 tasks picked %v", seen)
	}
}

// TestSelectionSkipsCanaries: a draw from the dataset, filtered or not, never plays its
// canary, and the other tasks are drawn by the same seeds as without it; a canary named,
// or pinned, is played.
func TestSelectionSkipsCanaries(t *testing.T) {
	ds, err := tasks.LoadDataset(dataset)
	if err != nil {
		t.Fatal(err)
	}
	const canary = "canary/predict-draw"
	if c := ds.Task(canary); c == nil || !c.Config.Metadata.Canary {
		t.Fatalf("%s is no canary of the in-repo dataset", canary)
	}
	honest := ds.Select(tasks.Filter{})
	if len(honest) != len(ds.Tasks)-1 {
		t.Fatalf("a filter without canaries passes %d of %d tasks", len(honest), len(ds.Tasks))
	}
	for name, p := range map[string]json.RawMessage{
		"no filter": json.RawMessage(`{"dataset": "gauntlet"}`),
		"its tag":   json.RawMessage(`{"dataset": "gauntlet", "tags": ["canary"], "glob": ["*"]}`),
	} {
		for seed := range uint64(2 * len(ds.Tasks)) {
			id, _, err := pickOf(t, gauntlet, p, seed)
			if name == "its tag" {
				if !errors.Is(err, taskenv.ErrEmptySelection) {
					t.Fatalf("%s: seed %d: %s, %v; want an empty selection", name, seed, id, err)
				}
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := honest[seed%uint64(len(honest))].ID; id != want {
				t.Errorf("%s, seed %d: %s, want %s", name, seed, id, want)
			}
		}
	}
	c := ds.Task(canary)
	for name, p := range map[string]string{
		"named":  `{"dataset": "gauntlet", "task": "` + canary + `"}`,
		"pinned": `{"dataset": "gauntlet", "tasks": [{"id": "` + canary + `", "digest": "` + c.Digest + `"}]}`,
	} {
		if id, _, err := pickOf(t, gauntlet, json.RawMessage(p), 1); err != nil || id != canary {
			t.Errorf("%s: %s, %v; want %s", name, id, err, canary)
		}
	}
}

// TestSelectionRefused: an empty selection names the dataset and the filter; a pinned
// task that changed, or is gone, is refused; params that name a task and a selection at
// once, bad filters and bad pins name their field.
func TestSelectionRefused(t *testing.T) {
	ds, err := tasks.LoadDataset(dataset)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := taskenv.Select("gauntlet", ds, tasks.Filter{Tags: []string{"python"}, Difficulties: []string{"hard"}}); !errors.Is(err, taskenv.ErrEmptySelection) ||
		!strings.Contains(err.Error(), `the filter tags ["python"], difficulty ["hard"] selects none of the 32 tasks of dataset gauntlet (`+dataset+`)`) {
		t.Errorf("Select of nothing: %v", err)
	}
	if _, err := taskenv.Select("gauntlet", ds, tasks.Filter{Globs: []string{"["}}); err == nil {
		t.Error("a bad glob was accepted")
	}
	digest := ds.Task("codefix/sum").Digest
	zero := "sha256:" + strings.Repeat("0", 64)
	for _, c := range []struct{ params, want string }{
		{`{"dataset": "gauntlet", "difficulty": ["hard"]}`, `params: tasks: no task selected: the filter difficulty ["hard"] selects none of the 32 tasks of dataset gauntlet`},
		{`{"dataset": "gauntlet", "difficulty": ["trivial"]}`, `difficulty "trivial" is not one of easy, medium, hard`},
		{`{"dataset": "gauntlet", "glob": ["["]}`, `glob "["`},
		{`{"dataset": "gauntlet", "tags": [""]}`, `params.tags[0]: empty`},
		{`{"dataset": "gauntlet", "task": "codefix/sum", "tags": ["shell"]}`, `params.task: names one task`},
		{fmt.Sprintf(`{"dataset": "gauntlet", "tasks": [{"id": "codefix/sum", "digest": %q}], "digest": %q}`, digest, digest), `params.digest: with params.tasks`},
		{`{"dataset": "gauntlet", "tasks": [{"id": "codefix/sum", "digest": "sha256:00"}]}`, `params.tasks[0].digest: "sha256:00" is not a task digest`},
		{fmt.Sprintf(`{"dataset": "gauntlet", "tasks": [{"id": "codefix/sum", "digest": %q}, {"id": "codefix/sum", "digest": %q}]}`, digest, digest), `params.tasks[1].id: "codefix/sum" is listed twice`},
		{`{"dataset": "gauntlet", "tasks": [{"digest": "` + zero + `"}]}`, `params.tasks[0].id: required`},
		{`{"dataset": "gauntlet", "tasks": [{"id": "codefix/gone", "digest": "` + zero + `"}]}`, `params.tasks[0]: "codefix/gone" is not a task of dataset gauntlet`},
		{`{"dataset": "gauntlet", "tasks": [{"id": "codefix/sum", "digest": "` + zero + `"}]}`, `params.tasks: task codefix/sum has digest ` + digest + ` now, not ` + zero},
		{fmt.Sprintf(`{"dataset": "gauntlet", "tags": ["python"], "tasks": [{"id": "codefix/sum", "digest": %q}]}`, digest), `params.tasks[0]: "codefix/sum" does not pass the filter tags ["python"]`},
	} {
		if _, _, err := pickOf(t, gauntlet, json.RawMessage(c.params), 1); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("params %s: error %v, want %q", c.params, err, c.want)
		}
	}
}

// TestPinnedTaskChanged: a run pins its tasks by digest; a task edited after the run was
// submitted is refused by its episodes rather than played as if it were the recorded one.
func TestPinnedTaskChanged(t *testing.T) {
	dir := t.TempDir()
	if _, err := taskgen.Generate(dir, 3, 1); err != nil {
		t.Fatal(err)
	}
	ds, err := tasks.LoadDataset(dir)
	if err != nil {
		t.Fatal(err)
	}
	sel, err := taskenv.Select("gen", ds, tasks.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	datasets := map[string]string{"gen": dir}
	edited := sel.Tasks[1]
	if _, _, err := pickOf(t, datasets, sel.Params(), 1); err != nil {
		t.Fatalf("before the edit: %v", err)
	}
	f := filepath.Join(dir, filepath.FromSlash(edited.ID), tasks.InstructionFile)
	if err := os.WriteFile(f, []byte("something else entirely\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := pickOf(t, datasets, sel.Params(), 1); err == nil || !strings.Contains(err.Error(), "task "+edited.ID+" has digest") {
		t.Errorf("the edited task: %v, want it refused", err)
	}
	if id, _, err := pickOf(t, datasets, sel.Params(), 0); err != nil || id != sel.Tasks[0].ID {
		t.Errorf("an unchanged task of the same selection: %s, %v", id, err)
	}
}

// TestCanaryRateMixesCanariesIn: a draw asking for canary_rate plays one of the
// dataset's canaries in about that share of its episodes, whatever its filters, chosen by
// the seed alone (the same seed plays the same task again, pinned or filtered); every
// other episode plays the task it would without canaries. A dataset without canaries, a
// rate outside 0..1 or a named task with a rate are refused naming the field.
func TestCanaryRateMixesCanariesIn(t *testing.T) {
	ds, err := tasks.LoadDataset(dataset)
	if err != nil {
		t.Fatal(err)
	}
	const canary = "canary/predict-draw"
	sel, err := taskenv.Select("gauntlet", ds, tasks.Filter{Tags: []string{"python"}})
	if err != nil {
		t.Fatal(err)
	}
	sel.CanaryRate = 0.25
	for name, p := range map[string]json.RawMessage{
		"filters": json.RawMessage(`{"dataset": "gauntlet", "tags": ["python"], "canary_rate": 0.25}`),
		"pinned":  sel.Params(),
	} {
		without := json.RawMessage(`{"dataset": "gauntlet", "tags": ["python"]}`)
		const n = 120
		canaries := 0
		for seed := range uint64(n) {
			id, _, err := pickOf(t, gauntlet, p, seed)
			if err != nil {
				t.Fatalf("%s, seed %d: %v", name, seed, err)
			}
			if id == canary {
				if again, _, _ := pickOf(t, gauntlet, p, seed); again != id {
					t.Fatalf("%s, seed %d: %s, then %s", name, seed, id, again)
				}
				canaries++
				continue
			}
			if plain, _, _ := pickOf(t, gauntlet, without, seed); plain != id {
				t.Errorf("%s, seed %d: %s, without canaries %s", name, seed, id, plain)
			}
		}
		if canaries < n/4-15 || canaries > n/4+15 { // 3 standard deviations

			t.Errorf("%s: %d canaries in %d episodes at rate 0.25", name, canaries, n)
		}
	}

	noCanary := t.TempDir()
	if err := os.CopyFS(filepath.Join(noCanary, "python"), os.DirFS(filepath.Join(dataset, "python"))); err != nil {
		t.Fatal(err)
	}
	if _, _, err := pickOf(t, map[string]string{"plain": noCanary}, json.RawMessage(`{"dataset": "plain", "canary_rate": 1}`), 1); err == nil ||
		!strings.Contains(err.Error(), "params.canary_rate: dataset plain") || !strings.Contains(err.Error(), "has no canary task") {
		t.Errorf("a rate over a dataset without canaries: %v", err)
	}
	for p, want := range map[string]string{
		`{"dataset": "gauntlet", "canary_rate": 1.5}`:                            "params.canary_rate: 1.5 is outside 0..1",
		`{"dataset": "gauntlet", "canary_rate": -0.1}`:                           "params.canary_rate: -0.1 is outside 0..1",
		`{"dataset": "gauntlet", "task": "python/fizzbuzz", "canary_rate": 0.1}`: "params.canary_rate: mixes canaries into a draw",
	} {
		if _, _, err := pickOf(t, gauntlet, json.RawMessage(p), 1); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v; want %q", p, err, want)
		}
	}
}
