package main

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/tasks"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
	"github.com/gauntlet-rl/gauntlet/workflows"
)

// episodeTasksSQL is, per episode of the runs matching a LIKE pattern, the task it
// played: of the tasks its run pins, the one at its seed modulo their count (how the
// tasks env picks; docs/tasks.md prints this query).
const episodeTasksSQL = `SELECT e.episode_id, r.task_ids[(e.seed %% length(r.task_ids)) + 1] AS task, e.success, e.faults_fired
FROM %[1]s.episodes AS e FINAL
ANY INNER JOIN (SELECT run_id, task_ids FROM %[1]s.runs FINAL WHERE length(task_ids) > 0) AS r USING run_id
WHERE e.run_id LIKE '%[2]s'
ORDER BY e.episode_id`

// TestTasksOnEveryPath: a dataset's tasks through the paths that start episodes, on the
// process runtime: `gauntlet run --tasks` with filters (the runs table records the
// selection, every episode plays one of it, each step once), a filter that selects nothing
// (refused naming its flag and the dataset), and a curriculum through Temporal moving from
// easy to medium tasks, each stage playing only its own.
func TestTasksOnEveryPath(t *testing.T) {
	dataset, err := filepath.Abs("../../datasets/gauntlet")
	if err != nil {
		t.Fatal(err)
	}
	ds, err := tasks.LoadDataset(dataset)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	cfg.Worker.Concurrency = 4
	cfg.NATSPort = freePort(t) // `gauntlet run` connects from outside
	cfg.Sandbox = sandboxConfig(t, runtimes.Process)
	if err := cfg.Tasks.Datasets.Set("gauntlet=" + dataset); err != nil {
		t.Fatal(err)
	}
	s := startStack(t, cfg, modAll)
	if err := writeStack(cfg.DataDir, stack{NATSURL: s.app.natsURL(), ClickHouse: s.app.clickHouseAddr(), Database: cfg.Database,
		Temporal: s.app.temporalAddr(), Datasets: cfg.Tasks.Datasets}); err != nil {
		t.Fatal(err)
	}
	db := cfg.Database
	conn := connect(t, s.app.clickHouseAddr(), db)
	ids := func(f tasks.Filter) []string {
		var out []string
		for _, t := range ds.Select(f) {
			out = append(out, t.ID)
		}
		return out
	}

	// run --tasks, by the dataset's folder.
	out, err := gauntletCLI(t, "run", "--tasks", dataset, "--tasks.tag", "python", "--tasks.difficulty", "easy",
		"--policies", "oracle=1", "--profiles", "baseline=1", "--episodes", "6", "--seed", "3", "--label", t.Name(), "--data-dir", cfg.DataDir)
	if err != nil {
		t.Fatalf("run --tasks: %v\n%s", err, out)
	}
	want := ids(tasks.Filter{Tags: []string{"python"}, Difficulties: []string{"easy"}})
	if !strings.Contains(out, fmt.Sprintf("tasks: %d of 32 of dataset gauntlet (%s), pinned by digest: %s", len(want), dataset, strings.Join(want, ", "))) {
		t.Errorf("run --tasks does not print its selection:\n%s", out)
	}
	runID := queryOne(t, conn, fmt.Sprintf(`SELECT run_id FROM %s.runs FINAL WHERE label = '%s'`, db, t.Name()))
	rec := queryOne(t, conn, fmt.Sprintf(`SELECT concat(env, ' ', task_dataset, ' ', arrayStringConcat(task_ids, ','), ' ', toString(length(task_digests)), ' ', toString(succeeded)) FROM %s.runs FINAL WHERE run_id = '%s'`, db, runID))
	if w := fmt.Sprintf("tasks gauntlet %s %d", strings.Join(want, ","), len(want)); !strings.HasPrefix(rec, w) {
		t.Errorf("the runs row: %q, want %q", rec, w)
	}
	for _, id := range want {
		if d := queryOne(t, conn, fmt.Sprintf(`SELECT task_digests[indexOf(task_ids, '%s')] FROM %s.runs FINAL WHERE run_id = '%s'`, id, db, runID)); d != ds.Task(id).Digest {
			t.Errorf("task %s recorded with digest %s, want %s", id, d, ds.Task(id).Digest)
		}
	}
	_, rows, err := trajectory.Query(context.Background(), conn, fmt.Sprintf(episodeTasksSQL, db, runID))
	if err != nil || len(rows) != 6 {
		t.Fatalf("episodes' tasks: %v %v", rows, err)
	}
	for _, r := range rows {
		if !slices.Contains(want, r[1]) {
			t.Errorf("episode %s played %s, not one of %v", r[0], r[1], want)
		}
		if r[2] != "1" && r[3] == "0" {
			t.Errorf("the oracle failed episode %s (%s) with no fault fired", r[0], r[1])
		}
	}
	if steps := queryOne(t, conn, fmt.Sprintf(`SELECT concat(toString(count()), ' ', toString(uniqExact(episode_id, step))) FROM %s.steps WHERE run_id = '%s'`, db, runID)); steps != "12 12" {
		t.Errorf("steps rows, distinct steps: %s, want 12 12 (solution and submit, each once)", steps)
	}

	// A filter that selects nothing names its flags and the dataset.
	_, err = gauntletCLI(t, "run", "--tasks", "gauntlet", "--tasks.difficulty", "hard", "--data-dir", cfg.DataDir)
	if err == nil || !strings.Contains(err.Error(), "--tasks.difficulty hard: tasks: no task selected") || !strings.Contains(err.Error(), "dataset gauntlet ("+dataset+")") {
		t.Errorf("an empty selection: %v", err)
	}

	// A curriculum from easy to medium shell tasks.
	spec := `
name: tasks-easy-to-medium
seed: 5
stages:
  - name: easy
    tasks: {dataset: gauntlet, tags: [shell], difficulty: [easy]}
    policies: oracle=1
    episodes: {min: 4, max: 8}
    batch: 4
    promotion: {metric: success_rate, threshold: 1, window: 4}
  - name: medium
    tasks: {dataset: gauntlet, glob: ["shell/*"], difficulty: [medium]}
    policies: oracle=1
    episodes: {min: 4, max: 8}
    batch: 4
    promotion: {metric: success_rate, threshold: 1, window: 4}
`
	out, err = gauntletCLI(t, "curriculum", "start", "-f", writeFile(t, "tasks.yaml", spec), "--data-dir", cfg.DataDir)
	if err != nil {
		t.Fatalf("curriculum start: %v\n%s", err, out)
	}
	id := strings.TrimSpace(out)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var p workflows.Progress
	if err := dialTemporal(t, s.app.temporalAddr()).GetWorkflow(ctx, id, "").Get(ctx, &p); err != nil {
		t.Fatalf("curriculum %s: %v", id, err)
	}
	if p.Status != workflows.StatusCompleted || len(p.Reports) != 2 {
		t.Fatalf("curriculum %s: %+v", id, p)
	}
	for i, f := range []tasks.Filter{
		{Tags: []string{"shell"}, Difficulties: []string{"easy"}},
		{Globs: []string{"shell/*"}, Difficulties: []string{"medium"}},
	} {
		r := p.Reports[i]
		// The baseline profile's rare faults may fail an oracle episode: then the stage
		// takes a second batch.
		if r.Outcome != "promoted" || (r.Episodes != 4 && r.Episodes != 8) {
			t.Errorf("stage %s: %+v", r.Name, r)
		}
		want := ids(f)
		stageCounts(t, conn, db, workflows.Progress{Reports: []workflows.StageReport{r}})
		// The runs table's row of a stage's second batch is written (from the run's state
		// in KV) apart from its episodes' rows, and may come after them: wait for it.
		var rows [][]string
		for deadline := time.Now().Add(2 * time.Minute); ; {
			_, rows, err = trajectory.Query(context.Background(), conn, fmt.Sprintf(episodeTasksSQL, db, r.RunPrefix+"%"))
			if err == nil && uint64(len(rows)) == r.Episodes || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if err != nil || uint64(len(rows)) != r.Episodes {
			t.Fatalf("stage %s's episodes' tasks: %v %v", r.Name, rows, err)
		}
		for _, row := range rows {
			if !slices.Contains(want, row[1]) {
				t.Errorf("stage %s: episode %s played %s, not one of %v", r.Name, row[0], row[1], want)
			}
			if row[2] != "1" && row[3] == "0" {
				t.Errorf("stage %s: the oracle failed episode %s (%s) with no fault fired", r.Name, row[0], row[1])
			}
		}
	}
}
