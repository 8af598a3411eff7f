package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env/taskenv"
	"github.com/gauntlet-rl/gauntlet/pkg/tasks"
	"github.com/gauntlet-rl/gauntlet/workflows"
)

// runRequestOf parses a run's flags as `gauntlet run` does, on a stack that plays
// datasets, and builds its request.
func runRequestOf(t *testing.T, datasets map[string]string, args ...string) (*runOpts, string, string, error) {
	t.Helper()
	fs := newFlagSet("run", io.Discard)
	var o runOpts
	o.register(fs, 10)
	if err := parse(fs, args); err != nil {
		t.Fatal(err)
	}
	o.tasks.datasets = func() (map[string]string, error) { return datasets, nil }
	req, err := o.request()
	if err != nil {
		return &o, "", "", err
	}
	return &o, req.Env, req.ParamsJson, nil
}

// TestRunTasksSelects: `run --tasks` with filters makes a run of the tasks env whose
// params pin the selected tasks by id and digest, the dataset named as the stack names
// it whether --tasks gives its name, its folder or NAME=DIR.
func TestRunTasksSelects(t *testing.T) {
	dir, _ := filepath.Abs("../../datasets/gauntlet")
	ds, err := tasks.LoadDataset(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := ds.Select(tasks.Filter{Tags: []string{"python"}, Difficulties: []string{"easy", "medium"}, Globs: []string{"python/*"}})
	stackDatasets := map[string]string{"gauntlet": dir, "other": t.TempDir()}
	for _, given := range []string{"gauntlet", dir, "../../datasets/gauntlet", "gauntlet=" + dir} {
		o, envName, params, err := runRequestOf(t, stackDatasets, "--tasks", given, "--tasks.tag", "python", "--tasks.difficulty", "easy,medium", "--tasks.glob", "python/*", "--params", `{"max_invalid": 3}`,
			"--tasks.canary-rate", "0.02")
		if err != nil {
			t.Fatalf("--tasks %s: %v", given, err)
		}
		if envName != taskenv.Name {
			t.Errorf("--tasks %s: env %s", given, envName)
		}
		var p struct {
			Dataset    string           `json:"dataset"`
			Tags       []string         `json:"tags"`
			Difficulty []string         `json:"difficulty"`
			Glob       []string         `json:"glob"`
			Tasks      []taskenv.Pinned `json:"tasks"`
			MaxInvalid int              `json:"max_invalid"`
			CanaryRate float64          `json:"canary_rate"`
		}
		if err := json.Unmarshal([]byte(params), &p); err != nil {
			t.Fatal(err)
		}
		if p.Dataset != "gauntlet" || !slices.Equal(p.Tags, []string{"python"}) || !slices.Equal(p.Difficulty, []string{"easy", "medium"}) ||
			!slices.Equal(p.Glob, []string{"python/*"}) || p.MaxInvalid != 3 || p.CanaryRate != 0.02 {
			t.Errorf("--tasks %s: params %s", given, params)
		}
		if len(p.Tasks) != len(want) {
			t.Fatalf("--tasks %s: pinned %v, want %d tasks", given, p.Tasks, len(want))
		}
		for i, w := range want {
			if p.Tasks[i] != (taskenv.Pinned{ID: w.ID, Digest: w.Digest}) {
				t.Errorf("--tasks %s: pinned[%d] = %v, want %s %s", given, i, p.Tasks[i], w.ID, w.Digest)
			}
		}
		if s := o.tasks.selection.String(); !strings.HasPrefix(s, "tasks: 6 of 32 of dataset gauntlet ("+dir+"), pinned by digest: python/") {
			t.Errorf("the selection as printed: %s", s)
		}
	}
}

// TestRunTasksRefused: a filter selecting nothing names its flags and the dataset; a
// dataset the stack does not play, filters without --tasks, --params that would change the
// selection and another env are refused before anything is submitted.
func TestRunTasksRefused(t *testing.T) {
	dir, _ := filepath.Abs("../../datasets/gauntlet")
	stackDatasets := map[string]string{"gauntlet": dir}
	elsewhere := t.TempDir()
	pythonOnly := t.TempDir()
	if err := os.CopyFS(filepath.Join(pythonOnly, "python"), os.DirFS(filepath.Join(dir, "python"))); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--tasks", "gauntlet", "--tasks.tag", "python", "--tasks.difficulty", "hard"},
			`--tasks.tag python --tasks.difficulty hard: tasks: no task selected: the filter tags ["python"], difficulty ["hard"] selects none of the 32 tasks of dataset gauntlet (` + dir + `)`},
		{[]string{"--tasks", "gauntlet", "--tasks.glob", "nothing/*"}, `--tasks.glob nothing/*: tasks: no task selected`},
		{[]string{"--tasks", "gauntlet", "--tasks.difficulty", "trivial"}, `difficulty "trivial" is not one of easy, medium, hard`},
		{[]string{"--tasks", "mine"}, "--tasks mine: neither a dataset of the stack nor a folder (the stack's datasets: gauntlet=" + dir + ")"},
		{[]string{"--tasks", elsewhere}, "--tasks " + elsewhere + ": the stack plays no dataset at " + elsewhere},
		{[]string{"--tasks", "x=" + elsewhere}, "--tasks x=" + elsewhere + ": load dataset"},
		{[]string{"--tasks.tag", "python"}, "--tasks.tag python: filters a dataset: give it with --tasks"},
		{[]string{"--tasks", "gauntlet", "--params", `{"task": "codefix/sum"}`}, "--params: task: --tasks and its filters make the selection"},
		{[]string{"--tasks", "gauntlet", "--env", "shop"}, "--env shop: --tasks runs the tasks env"},
		{[]string{"--tasks.canary-rate", "0.1"}, "--tasks.canary-rate: mixes a dataset's canaries in: give it with --tasks"},
		{[]string{"--tasks", "gauntlet", "--tasks.canary-rate", "2"}, "--tasks.canary-rate: 2 is outside 0..1"},
		{[]string{"--tasks", "x=" + pythonOnly, "--tasks.canary-rate", "0.1"}, "--tasks.canary-rate: dataset x (" + pythonOnly + ") has no canary task"},
	} {
		if _, _, _, err := runRequestOf(t, stackDatasets, c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", strings.Join(c.args, " "), err, c.want)
		}
	}
	// Without a stack.json, a name cannot be resolved, and the message says how else.
	var out, errOut bytes.Buffer
	err := runMain(context.Background(), []string{"run", "--tasks", "gauntlet", "--data-dir", filepath.Join(elsewhere, "none")}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "--tasks gauntlet: the stack's datasets are unknown") || !strings.Contains(err.Error(), "NAME=DIR") {
		t.Errorf("no stack: %v", err)
	}
	// A stack.json names its datasets.
	dataDir := t.TempDir()
	if err := writeStack(dataDir, stack{NATSURL: "nats://127.0.0.1:1", Datasets: stackDatasets}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(stackPath(dataDir))
	if err != nil || !strings.Contains(string(b), `"gauntlet": "`+dir+`"`) {
		t.Errorf("stack.json: %s %v", b, err)
	}
	var sf stackFlags
	sf.dataDir = dataDir
	if got, err := sf.datasets(); err != nil || got["gauntlet"] != dir {
		t.Errorf("datasets from stack.json: %v %v", got, err)
	}
}

// TestCurriculumStartPinsStageTasks: `curriculum start` pins a task-set stage's tasks from
// the folder stack.json names, refuses a stage whose filters select nothing, naming it,
// and leaves a stage of a dataset it cannot read to select on the stack.
func TestCurriculumStartPinsStageTasks(t *testing.T) {
	dir, _ := filepath.Abs("../../datasets/gauntlet")
	known := func() (map[string]string, error) { return map[string]string{"gauntlet": dir}, nil }
	spec := func(dataset, difficulty string) workflows.CurriculumSpec {
		s, err := workflows.LoadSpec(strings.NewReader(`
stages:
  - {name: a, tasks: {dataset: ` + dataset + `, tags: [python], difficulty: [` + difficulty + `]}, policies: oracle=1, episodes: {max: 10}, promotion: {metric: success_rate, threshold: 1, window: 10}}
`))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	var stderr bytes.Buffer
	s := spec("gauntlet", "medium")
	if err := pinStageTasks(&s, known, &stderr); err != nil {
		t.Fatal(err)
	}
	ds, _ := tasks.LoadDataset(dir)
	want := ds.Select(tasks.Filter{Tags: []string{"python"}, Difficulties: []string{"medium"}})
	got := s.Stages[0].Tasks.Tasks
	if len(got) != len(want) || got[0].ID != want[0].ID || got[0].Digest != want[0].Digest {
		t.Errorf("pinned %v, want the %d medium python tasks", got, len(want))
	}
	if !strings.Contains(stderr.String(), "stage a: 6 of the 32 tasks of dataset gauntlet") {
		t.Errorf("stderr: %q", stderr.String())
	}
	s = spec("gauntlet", "hard")
	if err := pinStageTasks(&s, known, &stderr); err == nil || !strings.Contains(err.Error(), "stages[0].tasks: tasks: no task selected") {
		t.Errorf("an empty stage: %v", err)
	}
	stderr.Reset()
	s = spec("elsewhere", "easy")
	if err := pinStageTasks(&s, known, &stderr); err != nil || len(s.Stages[0].Tasks.Tasks) != 0 ||
		!strings.Contains(stderr.String(), "stages[0].tasks: dataset elsewhere is not in the stack's stack.json") {
		t.Errorf("a dataset the client cannot read: %v, %v, %q", err, s.Stages[0].Tasks.Tasks, stderr.String())
	}
}
